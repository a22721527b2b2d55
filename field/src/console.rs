//! The console socket: one request per connection, a line of JSON,
//! answered by a line of JSON.
//!
//! The server side binds the socket with mode 0660 and hands each parsed
//! request to the agent's answer; the client side (`ctl`) sends one request
//! and gives back the answer, or says on standard error why there is none.
//! The server keeps at most [`Limits::max_connections`] connections open
//! (one more is closed at once) and closes one that sends no request, or
//! takes no answer, for [`Limits::idle`] ([`crate::listen`]; 8 and 60 s
//! by default, `console_max_connections` and `console_socket_idle_s`).

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::config::ConfigError;
use crate::listen::{Bounded, Gate};
pub use crate::listen::{Limits, ListenStats};

/// Longest request line accepted.
pub const MAX_REQUEST: usize = 4096;

/// How long `ctl` waits for the answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a program's answer to one console request may take (on the
/// socket and on the serial console) before the request is answered
/// with [`unanswered_text`] and its slot freed: a flash log or a loop
/// that hangs must not hold every console slot, nor the serial line.
/// Under [`ANSWER_TIMEOUT`], so `ctl` prints the reason.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(12);

/// What a request that got no answer within [`ANSWER_LIMIT`] is told.
pub fn unanswered_text() -> String {
    format!(
        "no answer within {} s: the program may be stuck (its flash log, its loop; see its log); \
         whether a change asked for was made is not known: look with status",
        ANSWER_LIMIT.as_secs()
    )
}

/// Binds the console socket at `path`, replacing a stale one; `who` names
/// the program in errors ("agent", "controller").
///
/// A file in the way that is not a socket is left alone (an error), and so
/// is a socket another `who` answers on.
pub fn bind(path: &Path, who: &str) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("a file that is not a socket is in the way; the {who} does not remove it"),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("another {who} answers on this socket"),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// The gate of the console socket `listener`: `limits`, counted in
/// `stats`.
fn gate(listener: &UnixListener, limits: Limits, stats: ListenStats) -> Arc<Gate> {
    let path = listener.local_addr().ok();
    let name = match path.as_ref().and_then(|a| a.as_pathname()) {
        Some(path) => format!("console socket {}", path.display()),
        None => "console socket".into(),
    };
    Gate::new(name, "console_max_connections", limits, stats)
}

/// Answers connections until the task is dropped, at most
/// `limits.max_connections` at once (counted in `stats`): reads one line
/// (at most [`MAX_REQUEST`] bytes), parses it as an `R` and writes
/// `answer`'s value as one line; a line that cannot be read or parsed is
/// answered with `{"error": …}`.
pub async fn serve<R, F, Fut>(listener: UnixListener, limits: Limits, stats: ListenStats, answer: F)
where
    R: DeserializeOwned + Send + 'static,
    F: Fn(R) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Value> + Send + 'static,
{
    serve_callers(listener, limits, stats, move |req: R, _: Caller| {
        answer(req)
    })
    .await
}

/// Who asked on the console socket: the peer's user id as the kernel
/// reports it (`None`: the platform does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The peer process's user id.
    pub uid: Option<u32>,
}

impl Caller {
    /// The caller as an operator name for the flash log: `uid-<n>`, or
    /// `unknown`.
    pub fn operator(&self) -> String {
        match self.uid {
            Some(uid) => format!("uid-{uid}"),
            None => "unknown".into(),
        }
    }
}

/// As [`serve`], giving `answer` the [`Caller`] of each request.
pub async fn serve_callers<R, F, Fut>(
    listener: UnixListener,
    limits: Limits,
    stats: ListenStats,
    answer: F,
) where
    R: DeserializeOwned + Send + 'static,
    F: Fn(R, Caller) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Value> + Send + 'static,
{
    let gate = gate(&listener, limits, stats);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: wait, not spin.
                tracing::warn!("console socket: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let caller = Caller {
            uid: stream.peer_cred().ok().map(|c| c.uid()),
        };
        // Over the cap: closed at once, unread.
        let Some(slot) = gate.admit(&caller.operator()) else {
            continue;
        };
        let conn = slot.bound(stream, caller.operator());
        tokio::spawn(answer_one(conn, caller, answer.clone()));
    }
}

/// One connection: its request read, answered and the answer written.
/// The time `answer` takes is not idle time; a connection that idled
/// out before its request gets no answer.
async fn answer_one<R, F, Fut>(conn: Bounded<UnixStream>, caller: Caller, answer: F)
where
    R: DeserializeOwned,
    F: Fn(R, Caller) -> Fut,
    Fut: Future<Output = Value>,
{
    let mut conn = tokio::io::BufReader::new(conn);
    let mut line = String::new();
    let value = match (&mut conn)
        .take(MAX_REQUEST as u64)
        .read_line(&mut line)
        .await
    {
        Err(e) => json!({ "error": format!("reading the request: {e}") }),
        Ok(0) if conn.get_ref().idled_out() => return,
        Ok(_) => match serde_json::from_str::<R>(line.trim()) {
            Err(e) => json!({ "error": format!("bad request {:?}: {e}", line.trim()) }),
            Ok(req) => match tokio::time::timeout(ANSWER_LIMIT, answer(req, caller)).await {
                Ok(value) => value,
                Err(_) => json!({ "error": unanswered_text() }),
            },
        },
    };
    let mut text = value.to_string();
    text.push('\n');
    let _ = conn.write_all(text.as_bytes()).await;
}

/// As [`serve`], answering each request with `answer(ctx, req)` on a
/// clone of the agent's context `ctx`.
pub async fn serve_with<C, R, F, Fut>(
    listener: UnixListener,
    limits: Limits,
    stats: ListenStats,
    ctx: C,
    answer: F,
) where
    C: Clone + Send + Sync + 'static,
    R: DeserializeOwned + Send + 'static,
    F: Fn(C, R) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Value> + Send + 'static,
{
    serve(listener, limits, stats, move |req: R| {
        answer(ctx.clone(), req)
    })
    .await
}

/// Who `ctl` asks, for its messages.
#[derive(Debug, Clone, Copy)]
pub struct Peer<'a> {
    /// The running program in words: "agent", "controller".
    pub who: &'a str,
    /// Its command: "node-agent".
    pub program: &'a str,
    /// Its console socket when neither the flag nor a configuration file
    /// names one.
    pub default_socket: fn() -> PathBuf,
}

/// The flags of every agent's `ctl`: which agent to ask, and how to print
/// its answer.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CtlArgs {
    /// The agent's console socket; default: as `run` would choose it, or
    /// as the configuration file says.
    #[arg(long, visible_alias = "socket")]
    pub console: Option<PathBuf>,
    /// Configuration file, to find the console socket.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON for scripts.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `ctl events`'s own flag.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EventsArgs {
    /// Only since: 30s, 10m, 2h, 1d, or ms since the epoch.
    #[arg(long)]
    pub since: Option<String>,
}

impl EventsArgs {
    /// `--since` as ms since the epoch, `now_ms` being now.
    pub fn since_ms(&self, now_ms: u64) -> Result<Option<u64>, String> {
        self.since
            .as_deref()
            .map(|s| crate::time::parse_since(s, now_ms))
            .transpose()
    }
}

/// One `ctl` command: the socket (`--console`, else the configuration
/// file's `console`, else the peer's default), the request `request`
/// builds, then the question to the peer. An error before anything is
/// asked is printed as `<program>: <error>` with exit status 2.
pub fn ctl_command<R: Serialize>(
    args: &CtlArgs,
    peer: &Peer,
    request: impl FnOnce() -> Result<R, String>,
    render: impl FnOnce(&R, &Value) -> String,
) -> ExitCode {
    let socket = match &args.console {
        Some(p) => Ok(p.clone()),
        None => console_of(args.config.as_deref(), peer.default_socket).map_err(|e| e.to_string()),
    };
    match socket.and_then(|path| request().map(|req| (path, req))) {
        Ok((path, req)) => ExitCode::from(ctl(&path, &req, args.json, peer, |v| render(&req, v))),
        Err(e) => {
            eprintln!("{}: {e}", peer.program);
            ExitCode::from(2)
        }
    }
}

/// Asks the peer at `path` and prints its answer (`render`ed, or as JSON):
/// the exit status, 0 when it answered, 1 when it answered with an error
/// or refused what was asked (`"ok": false`), 2 when it could not be
/// asked.
pub fn ctl<R: Serialize>(
    path: &Path,
    req: &R,
    json: bool,
    peer: &Peer,
    render: impl FnOnce(&Value) -> String,
) -> u8 {
    let value = match ask(path, req, peer) {
        Ok(v) => v,
        Err(status) => return status,
    };
    if let Some(e) = value.get("error") {
        eprintln!("the {} says: {}", peer.who, crate::render::text(e));
        return 1;
    }
    print_answer(&value, json, render);
    if value["ok"] == false {
        1
    } else {
        0
    }
}

/// The console socket an agent's configuration file names (`console`;
/// nothing else in it is read or checked, so a user who may not read the
/// rest can still ask), else `default()`.
pub fn console_of(
    config: Option<&Path>,
    default: impl FnOnce() -> PathBuf,
) -> Result<PathBuf, ConfigError> {
    #[derive(serde::Deserialize)]
    struct Only {
        console: Option<PathBuf>,
    }
    let Some(p) = config else {
        return Ok(default());
    };
    let text = crate::config::read(p)?;
    let only: Only = crate::config::parse(Some(p), &text)?;
    Ok(only.console.unwrap_or_else(default))
}

/// The client side: sends `req` as one line to the peer at `path` and
/// reads its answer. Says why on standard error and gives the exit status
/// (2) when the peer cannot be reached or its answer is not JSON.
pub fn ask(path: &Path, req: &impl Serialize, peer: &Peer) -> Result<Value, u8> {
    let mut stream = match std::os::unix::net::UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "cannot reach the {} at {}: {e} (is {} running? give its socket with --console)",
                peer.who,
                path.display(),
                peer.program
            );
            return Err(2);
        }
    };
    let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
    let mut line = serde_json::to_string(req).expect("requests serialise");
    line.push('\n');
    let closed = |e: &std::io::Error| {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        matches!(e.kind(), BrokenPipe | ConnectionReset)
    };
    // A read timeout is `WouldBlock` on Unix sockets, `TimedOut` elsewhere.
    let timed_out = |e: &std::io::Error| {
        use std::io::ErrorKind::{TimedOut, WouldBlock};
        matches!(e.kind(), WouldBlock | TimedOut)
    };
    let unanswered = || {
        eprintln!(
            "the {} closed the connection without an answer: it keeps at most \
             console_max_connections connections open at once (8 by default); try again, \
             or see its log",
            peer.who
        );
        Err(2)
    };
    match stream.write_all(line.as_bytes()) {
        Err(e) if closed(&e) => return unanswered(),
        Err(e) => {
            eprintln!("sending the request: {e}");
            return Err(2);
        }
        Ok(()) => {}
    }
    let mut answer = String::new();
    match BufReader::new(stream).read_line(&mut answer) {
        Ok(0) => return unanswered(),
        Err(e) if closed(&e) => return unanswered(),
        Err(e) if timed_out(&e) => {
            eprintln!(
                "the {} did not answer within {} s: it may be stuck or very busy; see its log",
                peer.who,
                ANSWER_TIMEOUT.as_secs()
            );
            return Err(2);
        }
        Err(e) => {
            eprintln!("reading the answer: {e}");
            return Err(2);
        }
        Ok(_) => {}
    }
    match serde_json::from_str(answer.trim()) {
        Ok(v) => Ok(v),
        Err(e) => {
            eprintln!("the {}'s answer is not JSON ({e}): {answer}", peer.who);
            Err(2)
        }
    }
}

/// Prints an answer on standard output: as one line of JSON with `json`,
/// else as `render` gives it for people.
pub fn print_answer(value: &Value, json: bool, render: impl FnOnce(&Value) -> String) {
    let text = if json {
        format!("{value}\n")
    } else {
        render(value)
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_in_the_way_of_the_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        std::fs::write(&path, b"precious").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt.block_on(async { bind(&path, "agent") }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a file that is not a socket is in the way; the agent does not remove it"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn one_line_asked_one_line_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("x.sock");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt.block_on(async { bind(&path, "agent") }).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
        let stats = ListenStats::default();
        rt.spawn(serve(
            listener,
            Limits::CONSOLE,
            stats,
            |req: Value| async move { json!({ "echo": req }) },
        ));
        let peer = Peer {
            who: "agent",
            program: "node-agent",
            default_socket: || PathBuf::from("/nonexistent.sock"),
        };
        let v = ask(&path, &json!({"cmd": "status"}), &peer).unwrap();
        assert_eq!(v, json!({"echo": {"cmd": "status"}}));
        // A second bind finds the first answering.
        let e = rt.block_on(async { bind(&path, "agent") }).unwrap_err();
        assert_eq!(e.to_string(), "another agent answers on this socket");
        drop(rt);
        // Nobody answers any more: the stale socket is replaced.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async { bind(&path, "agent") }).unwrap();
        assert_eq!(
            ask(&dir.path().join("none.sock"), &json!({}), &peer),
            Err(2)
        );
    }

    const PEER: Peer<'static> = Peer {
        who: "agent",
        program: "node-agent",
        default_socket: || PathBuf::from("/nonexistent.sock"),
    };

    /// An echoing console on a fresh socket with `limits`, in `rt`.
    fn echo_console(
        rt: &tokio::runtime::Runtime,
        dir: &Path,
        limits: Limits,
    ) -> (PathBuf, ListenStats) {
        let path = dir.join("x.sock");
        let listener = rt.block_on(async { bind(&path, "agent") }).unwrap();
        let stats = ListenStats::default();
        rt.spawn(serve(
            listener,
            limits,
            stats.clone(),
            |req: Value| async move { json!({ "echo": req }) },
        ));
        (path, stats)
    }

    /// A client connected to `path` that has sent nothing yet, its reads
    /// given up after 10 s.
    fn silent_client(path: &Path) -> std::os::unix::net::UnixStream {
        let s = std::os::unix::net::UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// What the server sends on `s` until it closes.
    fn read_to_close(mut s: std::os::unix::net::UnixStream) -> std::io::Result<String> {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut s, &mut text).map(|_| text)
    }

    #[test]
    fn one_connection_over_the_cap_is_closed_at_once_while_the_first_still_answers() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = Limits {
            max_connections: 2,
            idle: Duration::from_secs(60),
        };
        let (path, stats) = echo_console(&rt, dir.path(), limits);
        let mut first = silent_client(&path);
        let _second = silent_client(&path);
        let third = silent_client(&path);
        assert_eq!(
            read_to_close(third).expect("closed, not left waiting"),
            "",
            "the connection over the cap is closed unanswered"
        );
        assert_eq!((stats.refused(), stats.open()), (1, 2));
        // `ctl` over the cap: exit status 2, not a wait.
        assert_eq!(ask(&path, &json!({"cmd": "status"}), &PEER), Err(2));
        assert_eq!(stats.refused(), 2);
        // The first, opened before, still answers.
        first.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
        let answer = read_to_close(first).unwrap();
        assert_eq!(answer, "{\"echo\":{\"cmd\":\"status\"}}\n");
        // Its slot is free again: the next one is answered.
        let v = ask(&path, &json!({"cmd": "gpus"}), &PEER).unwrap();
        assert_eq!(v, json!({"echo": {"cmd": "gpus"}}));
        assert_eq!(stats.refused(), 2);
    }

    #[test]
    fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let limits = Limits {
            max_connections: 1,
            idle: Duration::from_millis(300),
        };
        let (path, stats) = echo_console(&rt, dir.path(), limits);
        let idle = silent_client(&path);
        let started = std::time::Instant::now();
        assert_eq!(read_to_close(idle).expect("closed by the agent"), "");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(stats.idle_closed(), 1);
        // Its slot (the only one) is free again.
        let v = ask(&path, &json!({"cmd": "caps"}), &PEER).unwrap();
        assert_eq!(v, json!({"echo": {"cmd": "caps"}}));
        assert_eq!((stats.idle_closed(), stats.refused()), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_never_comes_frees_its_slot_after_the_answer_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let listener = bind(&path, "agent").unwrap();
        let limits = Limits {
            max_connections: 1,
            idle: Duration::from_secs(60),
        };
        let stats = ListenStats::default();
        // A flash log that hangs: no answer ever.
        let never = |_: Value| std::future::pending::<Value>();
        tokio::spawn(serve(listener, limits, stats.clone(), never));
        let started = tokio::time::Instant::now();
        let mut conn = tokio::net::UnixStream::connect(&path).await.unwrap();
        conn.write_all(b"{\"cmd\":\"events\"}\n").await.unwrap();
        let mut answer = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut answer)
            .await
            .unwrap();
        assert_eq!(started.elapsed(), ANSWER_LIMIT);
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["error"], unanswered_text());
        // Its slot is free: the next request is taken, not refused.
        drop(conn);
        let mut next = tokio::net::UnixStream::connect(&path).await.unwrap();
        next.write_all(b"{}\n").await.unwrap();
        answer.clear();
        tokio::io::AsyncReadExt::read_to_string(&mut next, &mut answer)
            .await
            .unwrap();
        assert!(answer.contains("no answer within 12 s"), "{answer}");
        assert_eq!(stats.refused(), 0);
    }
}

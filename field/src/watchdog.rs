//! The process watchdog of both agents: systemd's notify protocol, so the
//! service manager knows when an agent is ready and restarts it when its
//! loop hangs.
//!
//! The protocol is one datagram per notice on the Unix socket named by
//! `NOTIFY_SOCKET`: `READY=1`, `WATCHDOG=1`, `STOPPING=1`, `STATUS=…`.
//! A [`Notifier`] holds what the environment says (the socket, the
//! watchdog timeout) and sends them; without `NOTIFY_SOCKET` every send
//! does nothing. Parsing takes explicit values ([`Notifier::from_values`]),
//! so it is tested without touching the process's environment.
//!
//! What to send is decided by [`Heartbeat`], which only looks at how many
//! passes of its loop the agent has completed (the controller's control
//! steps, the host agent's sampling rounds) and when: `READY=1` after the
//! first pass, then `WATCHDOG=1` at each check if passes were completed
//! since the last ping, or if the last pass is not yet late (a loop whose
//! period is longer than the ping interval: a 30 s sampling period under
//! a 10 s `WatchdogSec`). A loop that is alive but hung (a pass that never
//! ends, a wedged runtime) stops the pings once it is late, and systemd
//! kills and restarts the process. [`watch_progress`] is the task that
//! runs it on a watch channel the loop updates; each agent says what its
//! loop is called ([`Progress`]) and where the count is.
//!
//! Glossary:
//! - *notify socket*: the datagram socket the service manager listens on
//!   (`NOTIFY_SOCKET`); a path, or `@name` for a Linux abstract socket.
//! - *watchdog timeout*: `WATCHDOG_USEC`, set by systemd from the unit's
//!   `WatchdogSec=`: the longest it waits between two pings.
//! - *pass*: one completed turn of the agent's loop (a control step, a
//!   sampling round); the count only grows.
//! - *ping*: a `WATCHDOG=1` notice; sent every half timeout while passes
//!   complete.
//! - *late*: no new pass for the loop's period and its slack (the shorter
//!   of the period and the ping interval) since one was last seen.
//! - *stall*: a check that finds no pass completed since the last ping,
//!   with the loop late.

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

/// Why the environment's notify settings are refused, or a notice failed.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `WATCHDOG_USEC` is not a positive whole number of microseconds.
    #[error("WATCHDOG_USEC={value:?}: {reason}")]
    WatchdogUsec {
        /// The value as found.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `WATCHDOG_PID` is not a process id.
    #[error("WATCHDOG_PID={value:?}: not a process id")]
    WatchdogPid {
        /// The value as found.
        value: String,
    },
    /// `NOTIFY_SOCKET` names no socket this process can send to.
    #[error("NOTIFY_SOCKET={value:?}: {reason}")]
    Socket {
        /// The value as found.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A notice could not be sent.
    #[error("sending {notice} to the notify socket {socket}: {source}")]
    Send {
        /// The notice (`READY=1`, …).
        notice: String,
        /// The socket, as `NOTIFY_SOCKET` names it.
        socket: NotifySocket,
        /// Why.
        source: io::Error,
    },
}

/// The service manager's notify socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifySocket {
    /// A socket file.
    Path(PathBuf),
    /// A Linux abstract socket: the name without the leading `@`.
    Abstract(Vec<u8>),
}

impl fmt::Display for NotifySocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotifySocket::Path(p) => write!(f, "{}", p.display()),
            NotifySocket::Abstract(name) => write!(f, "@{}", String::from_utf8_lossy(name)),
        }
    }
}

impl NotifySocket {
    /// The socket `NOTIFY_SOCKET` names: an absolute path, or `@name`
    /// (Linux only). `None` when it is empty.
    pub fn parse(value: &OsStr) -> Result<Option<Self>, NotifyError> {
        let bytes = value.as_bytes();
        let refuse = |reason: &str| NotifyError::Socket {
            value: value.to_string_lossy().into_owned(),
            reason: reason.into(),
        };
        let socket = match bytes.first() {
            None => return Ok(None),
            Some(b'@') if bytes.len() == 1 => {
                return Err(refuse("an abstract name without a name"))
            }
            Some(b'@') => NotifySocket::Abstract(bytes[1..].to_vec()),
            Some(b'/') => NotifySocket::Path(PathBuf::from(value)),
            Some(_) => return Err(refuse("neither an absolute path nor an abstract name (@…)")),
        };
        // An address the kernel would refuse (too long, a NUL in a path, an
        // abstract name off Linux) is refused now, not at the first notice.
        socket
            .address()
            .map_err(|e| refuse(&e.to_string()))
            .map(|_| Some(socket))
    }

    /// The socket's address.
    fn address(&self) -> io::Result<SocketAddr> {
        match self {
            NotifySocket::Path(p) => SocketAddr::from_pathname(p),
            #[cfg(target_os = "linux")]
            NotifySocket::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)
            }
            #[cfg(not(target_os = "linux"))]
            NotifySocket::Abstract(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract socket names exist on Linux only",
            )),
        }
    }
}

/// The watchdog timeout `WATCHDOG_USEC` gives, in whole microseconds.
pub fn parse_watchdog_usec(value: &OsStr) -> Result<Duration, NotifyError> {
    let refuse = |reason| NotifyError::WatchdogUsec {
        value: value.to_string_lossy().into_owned(),
        reason,
    };
    let text = value
        .to_str()
        .ok_or_else(|| refuse("not a whole number of microseconds"))?;
    let usec: u64 = text
        .parse()
        .map_err(|_| refuse("not a whole number of microseconds"))?;
    if usec == 0 {
        return Err(refuse("zero: no time to ping in"));
    }
    Ok(Duration::from_micros(usec))
}

/// The process id `WATCHDOG_PID` gives.
pub fn parse_watchdog_pid(value: &OsStr) -> Result<u32, NotifyError> {
    value
        .to_str()
        .and_then(|t| t.parse().ok())
        .filter(|&pid| pid > 0)
        .ok_or_else(|| NotifyError::WatchdogPid {
            value: value.to_string_lossy().into_owned(),
        })
}

/// What an agent's loop is called, for its log lines, its `STATUS=` and
/// the description of what the watchdog will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The program, as its log lines begin: `cooling-ctrl`.
    pub program: &'static str,
    /// The loop: `control loop`.
    pub loop_name: &'static str,
    /// One pass of it: `control step`.
    pub pass: &'static str,
    /// The count of passes, in one word: `step`.
    pub count: &'static str,
}

/// What the service manager asked of this process, and the means to tell
/// it: the notify socket (none: every notice is a no-op) and the watchdog
/// timeout (none: no pings expected).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notifier {
    socket: Option<NotifySocket>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier that sends nothing (not under a service manager).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// From the process's environment: `NOTIFY_SOCKET`, `WATCHDOG_USEC`
    /// and `WATCHDOG_PID`, as [`Notifier::from_values`].
    pub fn from_env() -> Result<Self, NotifyError> {
        let var = |name| std::env::var_os(name);
        Self::from_values(
            var("NOTIFY_SOCKET").as_deref(),
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        )
    }

    /// From the values of `NOTIFY_SOCKET`, `WATCHDOG_USEC` and
    /// `WATCHDOG_PID` (each `None` when unset) for the process `our_pid`.
    /// The watchdog is honoured when `WATCHDOG_PID` is unset or is
    /// `our_pid` (it is meant for another process otherwise). A value that
    /// is set but malformed is an error, even where it would not be used.
    pub fn from_values(
        notify_socket: Option<&OsStr>,
        watchdog_usec: Option<&OsStr>,
        watchdog_pid: Option<&OsStr>,
        our_pid: u32,
    ) -> Result<Self, NotifyError> {
        let socket = match notify_socket {
            Some(v) => NotifySocket::parse(v)?,
            None => None,
        };
        let timeout = watchdog_usec.map(parse_watchdog_usec).transpose()?;
        let pid = watchdog_pid.map(parse_watchdog_pid).transpose()?;
        let ours = pid.is_none_or(|p| p == our_pid);
        Ok(Self {
            socket,
            watchdog: timeout.filter(|_| ours),
        })
    }

    /// A notifier on `socket`, with the watchdog timeout `watchdog`.
    pub fn new(socket: NotifySocket, watchdog: Option<Duration>) -> Self {
        Self {
            socket: Some(socket),
            watchdog,
        }
    }

    /// The notify socket, if any.
    pub fn socket(&self) -> Option<&NotifySocket> {
        self.socket.as_ref()
    }

    /// The watchdog timeout, when pings are expected and can be sent.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.socket.as_ref().and(self.watchdog)
    }

    /// How often to check and ping: half the watchdog timeout, when pings
    /// are expected and can be sent.
    pub fn ping_interval(&self) -> Option<Duration> {
        self.watchdog_timeout().map(|t| t / 2)
    }

    /// Sends `READY=1`: start-up is complete.
    pub fn ready(&self) -> Result<(), NotifyError> {
        self.notify("READY=1")
    }

    /// Sends `WATCHDOG=1`: the keep-alive ping.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.notify("WATCHDOG=1")
    }

    /// Sends `STOPPING=1`: shutdown has begun.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.notify("STOPPING=1")
    }

    /// Sends `STATUS=text`, the line `systemctl status` shows. Line breaks
    /// in `text` become spaces (each line of a notice is an assignment).
    pub fn status(&self, text: &str) -> Result<(), NotifyError> {
        let line: String = text
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        self.notify(&format!("STATUS={line}"))
    }

    /// Sends `state` (one or more `KEY=value` lines) as one datagram; does
    /// nothing without a notify socket. Never waits: a socket that cannot
    /// take the datagram now is an error.
    pub fn notify(&self, state: &str) -> Result<(), NotifyError> {
        let Some(socket) = &self.socket else {
            return Ok(());
        };
        let failed = |source| NotifyError::Send {
            notice: state.into(),
            socket: socket.clone(),
            source,
        };
        let addr = socket.address().map_err(failed)?;
        let sender = UnixDatagram::unbound().map_err(failed)?;
        sender.set_nonblocking(true).map_err(failed)?;
        let sent = sender
            .send_to_addr(state.as_bytes(), &addr)
            .map_err(failed)?;
        if sent != state.len() {
            return Err(failed(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("{sent} of {} bytes sent", state.len()),
            )));
        }
        Ok(())
    }

    /// What this notifier will do, in one sentence for the log; `what` is
    /// the agent's loop and `period` its period.
    pub fn describe(&self, what: &Progress, period: Duration) -> String {
        let pass = what.pass;
        match (&self.socket, self.ping_interval()) {
            (None, _) => "no NOTIFY_SOCKET: no readiness or watchdog notices".into(),
            (Some(s), None) => format!(
                "notify socket {s}: READY=1 after the first {pass}, STOPPING=1 at shutdown; \
                 no watchdog (WATCHDOG_USEC unset or for another process)"
            ),
            (Some(s), Some(every)) => format!(
                "notify socket {s}: READY=1 after the first {pass}, then WATCHDOG=1 every {} ms \
                 while {pass}s complete (timeout {} ms, {} period {} ms: a hung loop is \
                 restarted within {} ms), STOPPING=1 at shutdown",
                every.as_millis(),
                self.watchdog.unwrap_or_default().as_millis(),
                what.loop_name,
                period.as_millis(),
                self.hung_for_at_most(period).map_or(0, |d| d.as_millis())
            ),
        }
    }

    /// The longest a hung loop of `period` runs before the service
    /// manager kills it, from its last pass: up to a ping interval until
    /// a check sees that pass, the checks that still ping within the
    /// period's grace ([`Heartbeat::grace`]), then the timeout. `None`
    /// without a watchdog.
    pub fn hung_for_at_most(&self, period: Duration) -> Option<Duration> {
        let (timeout, every) = (self.watchdog_timeout()?, self.ping_interval()?);
        let between = Heartbeat::grace(period, every).as_nanos() / every.as_nanos().max(1);
        let between = every.saturating_mul(u32::try_from(between).unwrap_or(u32::MAX));
        Some(every.saturating_add(between).saturating_add(timeout))
    }
}

/// Logs what the watchdog will do.
pub fn announce(notifier: &Notifier, what: &Progress, period: Duration) {
    let program = what.program;
    tracing::info!("{program}: watchdog: {}", notifier.describe(what, period));
}

/// Whether a ping is due: only when passes were completed since the last
/// ping (at `last_pinged` passes).
pub fn should_ping(last_pinged: u64, passes_now: u64) -> bool {
    passes_now > last_pinged
}

/// What a check of the pass count calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// No pass completed yet: nothing to send.
    Starting,
    /// The first pass completed: `READY=1`, and a ping.
    Ready,
    /// Passes completed since the last ping: a ping.
    Alive,
    /// Passes completed again after a stall: a ping.
    Resumed,
    /// No pass since the last ping, but the loop is not late (its period
    /// is longer than the checks'): a ping.
    Between,
    /// The first check without a pass since the last ping: no ping.
    Stalled,
    /// Another check without a pass: no ping.
    StillStalled,
}

impl Beat {
    /// Whether this beat sends `WATCHDOG=1` (when a watchdog is expected).
    pub fn pings(self) -> bool {
        matches!(
            self,
            Beat::Ready | Beat::Alive | Beat::Resumed | Beat::Between
        )
    }
}

/// The watchdog's decisions, from the number of completed passes at each
/// check and the check's time; no clock and no socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The pass count at the last ping; `None` before `READY=1`.
    last_pinged: Option<u64>,
    /// Whether the last check found the loop late.
    stalled: bool,
    /// When a new pass was last seen (a check's time).
    seen_at: Duration,
    /// How long after that the loop is late.
    grace: Duration,
}

impl Heartbeat {
    /// Before the first pass, for a loop with a pass every `period`
    /// checked every `every`.
    pub fn new(period: Duration, every: Duration) -> Self {
        Self {
            last_pinged: None,
            stalled: false,
            seen_at: Duration::ZERO,
            grace: Self::grace(period, every),
        }
    }

    /// How long after a pass was seen a loop of `period`, checked every
    /// `every`, is late: a period and the shorter of the period and
    /// `every` (a pass may end a whole round after its tick). With a
    /// period under half of `every`, the grace is shorter than the time
    /// between two checks: every check must find a new pass, as it always
    /// does for a loop that turns.
    pub fn grace(period: Duration, every: Duration) -> Duration {
        period + period.min(every)
    }

    /// Checks `passes`, the number of passes completed so far, at `now`
    /// (any clock that only goes forward), and records a ping when the
    /// beat calls for one.
    pub fn check(&mut self, passes: u64, now: Duration) -> Beat {
        let Some(last) = self.last_pinged else {
            if passes == 0 {
                return Beat::Starting;
            }
            self.last_pinged = Some(passes);
            self.seen_at = now;
            return Beat::Ready;
        };
        if should_ping(last, passes) {
            self.last_pinged = Some(passes);
            self.seen_at = now;
            let beat = if self.stalled {
                Beat::Resumed
            } else {
                Beat::Alive
            };
            self.stalled = false;
            return beat;
        }
        if now.saturating_sub(self.seen_at) <= self.grace {
            return Beat::Between;
        }
        let beat = if self.stalled {
            Beat::StillStalled
        } else {
            Beat::Stalled
        };
        self.stalled = true;
        beat
    }

    /// How long after a pass was seen the loop is late ([`Self::grace`]).
    pub fn late_after(&self) -> Duration {
        self.grace
    }

    /// The pass count at the last ping; `None` before `READY=1`.
    pub fn last_pinged(&self) -> Option<u64> {
        self.last_pinged
    }
}

/// The watchdog task: waits for the first completed pass on `progress`
/// (`passes` reads the count from its value) and sends `READY=1`, then,
/// when a watchdog is expected, checks the count every ping interval and
/// pings only if it advanced or the loop (a pass every `period`) is not
/// yet late. Returns when the sender of `progress` is
/// gone, or after `READY=1` without a watchdog. `STOPPING=1` is the
/// caller's, at shutdown. Send failures are logged (once until a send
/// succeeds again), never fatal.
pub async fn watch_progress<T>(
    notifier: Notifier,
    mut progress: watch::Receiver<T>,
    passes: fn(&T) -> u64,
    what: Progress,
    period: Duration,
) {
    let every = notifier.ping_interval().unwrap_or(period);
    let mut heartbeat = Heartbeat::new(period, every);
    let start = tokio::time::Instant::now();
    let mut log = SendLog::new(what.program);
    loop {
        let n = passes(&progress.borrow_and_update());
        if heartbeat.check(n, start.elapsed()) == Beat::Ready {
            log.outcome(notifier.ready());
            if notifier.ping_interval().is_some() {
                log.outcome(notifier.watchdog());
            }
            break;
        }
        if progress.changed().await.is_err() {
            return;
        }
    }
    let Some(every) = notifier.ping_interval() else {
        return;
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if progress.has_changed().is_err() {
            return;
        }
        let n = passes(&progress.borrow());
        let beat = heartbeat.check(n, start.elapsed());
        say_beat(&notifier, &mut log, &what, beat, n, heartbeat.late_after());
        if beat.pings() {
            log.outcome(notifier.watchdog());
        }
    }
}

/// The signals that stop a program cleanly, caught at its start before
/// anything that takes time: SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the
/// terminal of a foreground run closed; there is no reload), whose
/// default action would end it without its clean stop.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Catches them now.
    pub fn catch() -> Result<Self, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let catch = |kind: SignalKind, name: &str| signal(kind).map_err(|e| format!("{name}: {e}"));
        Ok(Self {
            term: catch(SignalKind::terminate(), "SIGTERM")?,
            int: catch(SignalKind::interrupt(), "SIGINT")?,
            hup: catch(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    /// The first of them to come, by name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// Waits for one of the `signals` that stop the program, then ends the
/// watchdog task (`watching`) and sends `STOPPING=1`: no stall warnings
/// while the program winds down, and the service manager hears of the
/// stop before it takes time. `program` names it in a warning.
pub async fn stopped(
    mut signals: StopSignals,
    notifier: Notifier,
    watching: tokio::task::AbortHandle,
    program: &'static str,
) {
    if signals.recv().await == "SIGHUP" {
        tracing::warn!("{program}: SIGHUP: a clean stop (there is no reload)");
    }
    watching.abort();
    if let Err(e) = notifier.stopping() {
        tracing::warn!("{program}: watchdog: {e}");
    }
}

/// Logs a stall and a recovery, and shows them in `STATUS=`.
fn say_beat(
    notifier: &Notifier,
    log: &mut SendLog,
    what: &Progress,
    beat: Beat,
    n: u64,
    late_after: Duration,
) {
    let (program, count) = (what.program, what.count);
    match beat {
        Beat::Stalled => {
            tracing::warn!(
                "{program}: watchdog: no {} completed for over {} ms (still at {count} {n}); \
                 pings withheld, systemd restarts {program} if it lasts",
                what.pass,
                late_after.as_millis()
            );
            log.outcome(notifier.status(&format!(
                "{} stalled at {count} {n}; watchdog pings withheld",
                what.loop_name
            )));
        }
        Beat::Resumed => {
            tracing::info!(
                "{program}: watchdog: {}s complete again ({count} {n})",
                what.pass
            );
            log.outcome(notifier.status("running"));
        }
        _ => {}
    }
}

/// Logs the first failed notice of a run of failures, and the recovery.
struct SendLog {
    program: &'static str,
    failing: bool,
}

impl SendLog {
    fn new(program: &'static str) -> Self {
        Self {
            program,
            failing: false,
        }
    }

    fn outcome(&mut self, result: Result<(), NotifyError>) {
        let program = self.program;
        match result {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!("{program}: watchdog: the notify socket takes notices again");
            }
            Ok(()) => {}
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!("{program}: watchdog: {e}");
            }
            Err(_) => {}
        }
    }
}

/// A notify socket to listen on, as the service manager does: a datagram
/// socket bound at a path, and the notices it receives. For tests, and
/// for tools that run an agent under watch.
#[derive(Debug)]
pub struct NotifyListener {
    socket: UnixDatagram,
    path: PathBuf,
}

impl NotifyListener {
    /// Binds a datagram socket at `path` (which must not exist).
    pub fn bind(path: &Path) -> io::Result<Self> {
        Ok(Self {
            socket: UnixDatagram::bind(path)?,
            path: path.to_path_buf(),
        })
    }

    /// Where it listens: the value for `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A notifier that sends here, with the watchdog timeout `watchdog`.
    pub fn notifier(&self, watchdog: Option<Duration>) -> Notifier {
        Notifier::new(NotifySocket::Path(self.path.clone()), watchdog)
    }

    /// The next notice received within `within`, if any (blocking).
    pub fn next(&self, within: Duration) -> io::Result<Option<String>> {
        self.socket
            .set_read_timeout(Some(within.max(Duration::from_micros(1))))?;
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => Ok(Some(String::from_utf8_lossy(&buf[..n]).into_owned())),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP: Progress = Progress {
        program: "agent",
        loop_name: "main loop",
        pass: "round",
        count: "round",
    };

    fn values(
        socket: Option<&str>,
        usec: Option<&str>,
        pid: Option<&str>,
    ) -> Result<Notifier, NotifyError> {
        Notifier::from_values(
            socket.map(OsStr::new),
            usec.map(OsStr::new),
            pid.map(OsStr::new),
            4242,
        )
    }

    /// A listener bound in a fresh temporary folder.
    fn listener() -> (tempfile::TempDir, NotifyListener) {
        let dir = tempfile::tempdir().unwrap();
        let l = NotifyListener::bind(&dir.path().join("notify")).unwrap();
        (dir, l)
    }

    fn recv(l: &NotifyListener) -> String {
        l.next(Duration::from_secs(5)).unwrap().expect("a notice")
    }

    #[test]
    fn no_notify_socket_is_a_no_op() {
        let n = values(None, Some("10000000"), None).unwrap();
        assert_eq!(n.socket(), None);
        assert_eq!(n.ping_interval(), None);
        n.ready().unwrap();
        n.watchdog().unwrap();
        n.stopping().unwrap();
        n.status("x").unwrap();
        assert_eq!(values(Some(""), None, None).unwrap(), Notifier::disabled());
    }

    #[test]
    fn the_environment_is_parsed() {
        let n = values(Some("/run/systemd/notify"), Some("10000000"), None).unwrap();
        assert_eq!(
            n.socket(),
            Some(&NotifySocket::Path("/run/systemd/notify".into()))
        );
        assert_eq!(n.watchdog_timeout(), Some(Duration::from_secs(10)));
        assert_eq!(n.ping_interval(), Some(Duration::from_secs(5)));
        let n = values(Some("@/org/freedesktop/systemd1/notify"), None, None).unwrap();
        assert_eq!(
            n.socket(),
            Some(&NotifySocket::Abstract(
                b"/org/freedesktop/systemd1/notify".to_vec()
            ))
        );
        assert_eq!(n.ping_interval(), None);
        assert_eq!(
            n.socket().unwrap().to_string(),
            "@/org/freedesktop/systemd1/notify"
        );
    }

    #[test]
    fn the_watchdog_is_honoured_only_for_our_pid() {
        let ours = values(Some("/n"), Some("2000000"), Some("4242")).unwrap();
        assert_eq!(ours.ping_interval(), Some(Duration::from_secs(1)));
        let theirs = values(Some("/n"), Some("2000000"), Some("17")).unwrap();
        assert_eq!(theirs.ping_interval(), None);
        assert!(theirs.socket().is_some());
    }

    #[test]
    fn bad_values_are_clear_errors() {
        for (usec, says) in [
            (
                "ten",
                "WATCHDOG_USEC=\"ten\": not a whole number of microseconds",
            ),
            (
                "-5",
                "WATCHDOG_USEC=\"-5\": not a whole number of microseconds",
            ),
            (
                "1.5",
                "WATCHDOG_USEC=\"1.5\": not a whole number of microseconds",
            ),
            ("", "WATCHDOG_USEC=\"\": not a whole number of microseconds"),
            ("0", "WATCHDOG_USEC=\"0\": zero: no time to ping in"),
            (
                "99999999999999999999",
                "WATCHDOG_USEC=\"99999999999999999999\": not a whole number of microseconds",
            ),
        ] {
            let e = values(Some("/n"), Some(usec), None).unwrap_err();
            assert_eq!(e.to_string(), says);
        }
        let e = values(Some("/n"), Some("1000"), Some("me")).unwrap_err();
        assert_eq!(e.to_string(), "WATCHDOG_PID=\"me\": not a process id");
        let e = values(Some("run/notify"), None, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "NOTIFY_SOCKET=\"run/notify\": neither an absolute path nor an abstract name (@…)"
        );
        let e = values(Some("@"), None, None).unwrap_err();
        assert!(e.to_string().starts_with("NOTIFY_SOCKET=\"@\""), "{e}");
        let long = format!("/{}", "x".repeat(200));
        let e = values(Some(&long), None, None).unwrap_err();
        assert!(e.to_string().starts_with("NOTIFY_SOCKET="), "{e}");
    }

    #[test]
    fn notices_arrive_as_exact_datagrams() {
        let (_dir, l) = listener();
        let n = l.notifier(None);
        n.ready().unwrap();
        n.watchdog().unwrap();
        n.status("cooling\nCDU 1").unwrap();
        n.stopping().unwrap();
        assert_eq!(recv(&l), "READY=1");
        assert_eq!(recv(&l), "WATCHDOG=1");
        assert_eq!(recv(&l), "STATUS=cooling CDU 1");
        assert_eq!(recv(&l), "STOPPING=1");
        assert_eq!(l.next(Duration::from_millis(50)).unwrap(), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_abstract_socket_takes_notices() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("loopwarden-field-watchdog-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = values(Some(&format!("@{name}")), None, None).unwrap();
        n.ready().unwrap();
        let mut buf = [0u8; 64];
        let got = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"READY=1");
    }

    #[test]
    fn a_send_failure_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nobody-listens");
        let n = Notifier::new(NotifySocket::Path(path.clone()), None);
        let says = n.ready().unwrap_err().to_string();
        assert!(
            says.starts_with(&format!(
                "sending READY=1 to the notify socket {}: ",
                path.display()
            )),
            "{says}"
        );
    }

    #[test]
    fn the_ping_waits_for_a_new_pass() {
        assert!(!should_ping(7, 7));
        assert!(should_ping(7, 8));
        assert!(!should_ping(7, 3));
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// A loop's period under the checks' of the tasks tested here.
    const FAST: Duration = Duration::from_millis(50);

    #[test]
    fn heartbeat_readies_after_the_first_pass_and_pings_only_on_progress() {
        // A pass a second, checked every 5 s.
        let mut h = Heartbeat::new(SECOND, 5 * SECOND);
        let at = |check: u32| check * 5 * SECOND;
        assert_eq!(h.check(0, at(0)), Beat::Starting);
        assert_eq!(h.check(0, at(1)), Beat::Starting);
        assert_eq!(h.check(1, at(2)), Beat::Ready);
        assert_eq!(h.check(6, at(3)), Beat::Alive);
        assert_eq!(h.last_pinged(), Some(6));
        // A hung loop: the count stays, no ping goes out, however long.
        assert_eq!(h.check(6, at(4)), Beat::Stalled);
        for i in 5..15 {
            let beat = h.check(6, at(i));
            assert_eq!(beat, Beat::StillStalled);
            assert!(!beat.pings());
        }
        assert_eq!(h.last_pinged(), Some(6));
        assert_eq!(h.check(7, at(15)), Beat::Resumed);
        assert_eq!(h.check(9, at(16)), Beat::Alive);
        assert_eq!(h.last_pinged(), Some(9));
    }

    #[test]
    fn heartbeat_of_a_fast_loop_never_pings_without_progress() {
        // A period under the checks': from any history, a check at the
        // count of the last ping never pings.
        let mut h = Heartbeat::new(SECOND, 5 * SECOND);
        let mut passes = 0;
        for i in 0..200u64 {
            passes += (i * 7919) % 3; // 0, 1 or 2 new passes per check
            let before = h.last_pinged();
            let beat = h.check(passes, 5 * SECOND * i as u32);
            let advanced = before.is_none_or(|b| passes > b) && passes > 0;
            assert_eq!(beat.pings(), advanced, "check {i}: {beat:?}");
        }
    }

    #[test]
    fn a_slow_loop_is_pinged_between_its_passes_and_stopped_once_late() {
        // A 30 s sampling period under WatchdogSec=10: checks every 5 s.
        let (period, every) = (30 * SECOND, 5 * SECOND);
        let mut h = Heartbeat::new(period, every);
        assert_eq!(h.late_after(), 35 * SECOND);
        assert_eq!(h.check(1, Duration::ZERO), Beat::Ready);
        // A healthy loop: a pass every 30 s, each up to 4 s late; every
        // check pings, so pings are never more than 5 s apart.
        let mut passes = 1;
        for check in 1..=60u32 {
            let now = check * every;
            if check % 6 == 0 {
                passes += 1;
            }
            let beat = h.check(passes, now);
            assert!(beat.pings(), "check at {now:?}: {beat:?}");
        }
        // It hangs after the pass seen at 300 s: pings go on while the
        // next pass could still come, then stop.
        let pinged: Vec<bool> = (61..=70u32)
            .map(|check| h.check(passes, check * every).pings())
            .collect();
        assert_eq!(
            pinged,
            [true, true, true, true, true, true, true, false, false, false],
            "late 35 s after the last pass was seen"
        );
        let n = Notifier::new(NotifySocket::Path("/n".into()), Some(10 * SECOND));
        assert_eq!(n.hung_for_at_most(period), Some(50 * SECOND));
        assert_eq!(n.hung_for_at_most(SECOND), Some(15 * SECOND));
        assert_eq!(n.hung_for_at_most(5 * SECOND / 2), Some(20 * SECOND));
        assert_eq!(Notifier::disabled().hung_for_at_most(period), None);
    }

    #[test]
    fn the_log_line_says_what_will_happen() {
        let period = Duration::from_secs(1);
        assert_eq!(
            Notifier::disabled().describe(&LOOP, period),
            "no NOTIFY_SOCKET: no readiness or watchdog notices"
        );
        let n = Notifier::new(
            NotifySocket::Path("/n".into()),
            Some(Duration::from_secs(10)),
        );
        assert_eq!(
            n.describe(&LOOP, period),
            "notify socket /n: READY=1 after the first round, then WATCHDOG=1 every 5000 ms \
             while rounds complete (timeout 10000 ms, main loop period 1000 ms: a hung loop \
             is restarted within 15000 ms), STOPPING=1 at shutdown"
        );
        let n = Notifier::new(NotifySocket::Path("/n".into()), None);
        assert!(n.describe(&LOOP, period).contains("no watchdog"));
    }

    /// The next notice within `within`, read off the runtime's threads.
    async fn next(l: &std::sync::Arc<NotifyListener>, within: Duration) -> Option<String> {
        let l = l.clone();
        tokio::task::spawn_blocking(move || l.next(within).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_task_readies_then_pings_only_while_passes_complete() {
        let (_dir, l) = listener();
        // A 400 ms timeout: a check every 200 ms.
        let n = l.notifier(Some(Duration::from_millis(400)));
        let l = std::sync::Arc::new(l);
        let (tx, rx) = watch::channel(0u64);
        let task = tokio::spawn(watch_progress(n, rx, |c| *c, LOOP, FAST));
        // Nothing before the first pass.
        assert_eq!(next(&l, Duration::from_millis(500)).await, None);
        tx.send_replace(1);
        let long = Duration::from_secs(5);
        assert_eq!(next(&l, long).await.as_deref(), Some("READY=1"));
        assert_eq!(next(&l, long).await.as_deref(), Some("WATCHDOG=1"));
        // The loop hangs: one STATUS, then silence, however long.
        assert_eq!(
            next(&l, long).await.as_deref(),
            Some("STATUS=main loop stalled at round 1; watchdog pings withheld")
        );
        assert_eq!(next(&l, Duration::from_millis(900)).await, None);
        // It turns again: pings resume.
        tx.send_replace(2);
        assert_eq!(next(&l, long).await.as_deref(), Some("STATUS=running"));
        assert_eq!(next(&l, long).await.as_deref(), Some("WATCHDOG=1"));
        drop(tx);
        tokio::time::timeout(long, task)
            .await
            .expect("the task ends with the loop")
            .unwrap();
    }

    #[tokio::test]
    async fn without_a_watchdog_only_ready_is_sent() {
        let (_dir, l) = listener();
        let (tx, rx) = watch::channel(0u64);
        let task = tokio::spawn(watch_progress(l.notifier(None), rx, |c| *c, LOOP, FAST));
        tx.send_replace(3);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends after READY=1")
            .unwrap();
        assert_eq!(recv(&l), "READY=1");
        assert_eq!(l.next(Duration::from_millis(200)).unwrap(), None);
    }
}

//! The serial console: a line shell on the agent's serial port, for the
//! field engineer who reaches a controller through it when the network is
//! the problem (`screen /dev/ttyUSB0 115200`).
//!
//! It answers the same commands as `ctl`, with the same answers and
//! tables (the agent's own [`SerialAgent::run`]), plus `help`, `login`,
//! `logout`. The decisions are in the pure [`session`] (with the
//! [`line`](mod@line) editor); this module only moves bytes: it opens the port
//! (8N1, no flow control), feeds what comes to the session with the
//! steady time, writes what it says, asks the agent, checks passwords off
//! the runtime ([`password`]), and hands [`record`]s to the flash log.
//! The port is opened again 5 s after it fails; the session then ends as
//! "line lost". The port is read while an answer is written: Ctrl-C there
//! drops the rest of it (`^C (output cut)`); other keys typed meanwhile
//! wait their turn (at most [`TYPED_AHEAD_MAX`] bytes). A Ctrl-C read
//! before a command started (with its Enter key, or during its echo)
//! cuts the command: it is not run, and that is said. The answer of a
//! state-changing command is never cut: the command ran, and a Ctrl-C
//! typed meanwhile is read after the answer, at the prompt.
//!
//! One session state and one steady clock serve every opening of the
//! port: [`serve`] starts the clock once, and the session's times (the
//! login lock, the idle deadline) count from it. Reopening the port
//! neither lifts a login lock nor resets the count of refused logins
//! behind it.
//!
//! Glossary:
//! - *port*: the serial device (`/dev/ttyS1`), or any byte stream in tests.
//! - *operator*: the name a serial login acts under in the agent's
//!   events: `serial-<device name>`.

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

pub mod line;
pub mod password;
/// The records the console leaves in the flash log (in the bus crate, so
/// `lwbus flash` reads them as the consoles do).
pub use loopwarden_bus::console_record as record;
pub mod request;
pub mod session;

use crate::console::{unanswered_text, ANSWER_LIMIT};
use loopwarden_store::recorder::AuditBy;
use password::Checked;
use record::Record;
use session::{Effect, Session, Settings, Spec};

/// The serial console as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialConsole {
    /// The serial device.
    pub port: PathBuf,
    /// Its speed, 8N1.
    pub baud: u32,
    /// The Argon2id hash of the password (a PHC string); `None`:
    /// state-changing commands are refused.
    pub password_hash: Option<String>,
    /// A session nobody types in is closed after this.
    pub idle: Duration,
}

/// What the agent's command answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// For people, as `ctl` prints it.
    pub text: String,
    /// It did what was asked.
    pub ok: bool,
}

impl Answer {
    /// An answer of the console socket (`v`) as `ctl` would print it:
    /// `render`ed, or `error: …`; not ok when it says `"ok": false`.
    pub fn of(v: &Value, render: impl FnOnce(&Value) -> String) -> Answer {
        if let Some(e) = v.get("error") {
            return Answer {
                text: format!("error: {}", crate::render::text(e)),
                ok: false,
            };
        }
        Answer {
            text: render(v),
            ok: v["ok"] != false,
        }
    }

    /// A command that could not be asked: `why`, not ok.
    pub fn refused(why: impl Into<String>) -> Answer {
        Answer {
            text: why.into(),
            ok: false,
        }
    }

    /// A command line carried out as `ctl` does it: its request
    /// (`parsed`; refused with why when the line is not one) `answer`ed
    /// as the console socket answers it, and the answer `render`ed.
    pub async fn asked<R, F>(
        parsed: Result<R, String>,
        answer: impl FnOnce(R) -> F,
        render: impl FnOnce(&R, &Value) -> String,
    ) -> Answer
    where
        R: Clone,
        F: Future<Output = Value>,
    {
        let req = match parsed {
            Ok(r) => r,
            Err(why) => return Answer::refused(why),
        };
        let v = answer(req.clone()).await;
        Answer::of(&v, |v| render(&req, v))
    }
}

/// Who an agent is, for its serial console's banner and prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The program, for the banner and for hints: "cooling-ctrl".
    pub program: &'static str,
    /// Its version.
    pub version: &'static str,
    /// What it looks after, in a word: "CDU", "host".
    pub role: &'static str,
    /// Which one: the prompt's name ("cdu-1").
    pub name: String,
    /// Its site.
    pub site: String,
}

impl Identity {
    /// The banner's line: "Loopwarden cooling-ctrl 0.1.0, CDU cdu-1 of
    /// site hall-1".
    pub fn banner(&self) -> String {
        format!(
            "Loopwarden {} {}, {} {} of site {}",
            self.program, self.version, self.role, self.name, self.site
        )
    }
}

/// What an agent gives its serial console.
pub trait SerialAgent: Send + Sync + 'static {
    /// Who this is, for the banner and the prompt.
    fn identity(&self) -> Identity;
    /// The commands besides the built-in ones.
    fn commands(&self) -> &'static [Spec];
    /// Carries out `words` (a command of [`commands`](Self::commands),
    /// the login already checked) for `operator`.
    fn run(&self, words: &[String], operator: &str) -> impl Future<Output = Answer> + Send;
}

/// The journal that writes each record to the agent's flash event log
/// through its `recorder`, stamped with the time it is handed over, as
/// an audit record: a storm of XIDs that fills the flash queue drops its
/// own events first; records are dropped only past
/// [`AUDIT_ROOM`](loopwarden_store::recorder::AUDIT_ROOM) more jobs,
/// never into the room kept for critical events, and those of someone
/// not logged in past [`ANYONE_ROOM`](loopwarden_store::recorder::ANYONE_ROOM)
/// (who caused a record is the session's login when it was made:
/// [`Effect::Record`]).
/// A record it does not take is said as an error, with its JSON (which
/// names its port): the first of a burst whole, the rest counted.
pub fn flash_journal(
    recorder: loopwarden_store::recorder::Recorder,
) -> impl Fn(Record, AuditBy) + Send + Sync {
    let kind = record::CONSOLE_RECORD;
    journal(
        move |by, body| recorder.append_kept(loopwarden_bus::now_ms(), kind, body, by),
        |line| tracing::error!("{line}"),
    )
}

/// The journal that hands each record's body to `keep` (the flash log),
/// with who caused it,
/// and says through `say` what it did not take: the first record of a
/// burst whole, with a count each 1,000th; the burst's count when one is
/// taken again.
fn journal(
    keep: impl Fn(AuditBy, Vec<u8>) -> bool + Send + Sync,
    say: impl Fn(String) + Send + Sync,
) -> impl Fn(Record, AuditBy) + Send + Sync {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Records not taken in a row.
    let lost = AtomicU64::new(0);
    move |r, by| {
        let body = r.encode();
        if keep(by, body.clone()) {
            let n = lost.swap(0, Ordering::Relaxed);
            if n > 1 {
                say(format!(
                    "serial console {}: {n} audit records in a row were not kept in the flash \
                     event log (its queue full; the first said above); records are kept again",
                    r.port
                ));
            }
        } else {
            let n = lost.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 || n % 1000 == 0 {
                say(format!(
                    "serial console {}: an audit record not kept in the flash event log \
                     (its queue full; {n} in a row): {}",
                    r.port,
                    String::from_utf8_lossy(&body)
                ));
            }
        }
    }
}

/// Serves `agent`'s serial console, when one is configured, until the
/// task is aborted, its records in the flash log through `recorder`;
/// says in the log where, at what speed, and `offers` (what it takes).
pub fn start<A: SerialAgent>(
    serial: Option<SerialConsole>,
    agent: A,
    recorder: loopwarden_store::recorder::Recorder,
    offers: &str,
) -> Option<tokio::task::JoinHandle<()>> {
    let serial = serial?;
    tracing::info!(
        "{}: serial console on {} at {} baud, {offers}",
        agent.identity().program,
        serial.port.display(),
        serial.baud
    );
    let journal = flash_journal(recorder);
    Some(tokio::spawn(serve(serial, Arc::new(agent), journal)))
}

/// The operator a login on `port` acts as: `serial-<device name>`, in the
/// characters of a protocol name, at most 32.
pub fn operator_name(port: &std::path::Path) -> String {
    let dev: String = port
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(25)
        .collect();
    if dev.is_empty() {
        "serial".into()
    } else {
        format!("serial-{dev}")
    }
}

/// How long the port may take no byte of a write before the line counts
/// as lost (a terminal that holds the line with flow control, a pty
/// nobody reads); a slow line that keeps taking bytes is not lost.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes `bytes` to `port`; each part of the bytes taken is timed by
/// [`stalled_after`] on its own.
///
/// There is no flush: a write hands the bytes to the kernel's line
/// buffer, which sends them on its own, and a serial port's flush waits
/// for the line to drain (`tcdrain`), blocking the thread the agent's
/// loops run on for as long as the line takes (seconds at 9600 baud). A
/// line that stops taking bytes shows as a write that stays pending.
/// `port` must therefore be unbuffered, as a serial port is.
async fn write_moving<W: AsyncWrite + Unpin>(
    port: &mut W,
    mut bytes: &[u8],
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let n = stalled_after(WRITE_TIMEOUT, async { port.write(bytes).await }).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
    }
    Ok(())
}

/// `step`, or an error when it took longer than `limit`: nothing
/// written for that long, the line counts as lost (a terminal that holds
/// it with flow control, a pty nobody reads).
async fn stalled_after<T>(
    limit: Duration,
    step: impl Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    match tokio::time::timeout(limit, step).await {
        Ok(r) => r,
        Err(_) => Err(stalled(limit)),
    }
}

/// Most bytes typed while an answer is written that are kept for after
/// it; more are dropped (a Ctrl-C among them still cuts the answer).
pub const TYPED_AHEAD_MAX: usize = 1024;

/// Ctrl-C: typed while an answer is written, it cuts the answer.
const CTRL_C: u8 = 0x03;

/// How long after a failure the port is opened again.
const REOPEN_AFTER: Duration = Duration::from_secs(5);

/// Serves the console on its port until the task is dropped: opens it,
/// runs the session over it, and opens it again after a failure.
/// `journal` takes each record for the flash log. The session and its
/// clock (`epoch`) are made once, here, and outlive every opening of the
/// port: a login lock set before the line was lost still holds after.
pub async fn serve<A, J>(console: SerialConsole, agent: Arc<A>, journal: J)
where
    A: SerialAgent,
    J: Fn(Record, AuditBy) + Send + Sync,
{
    if let Some(hash) = console.password_hash.clone() {
        let timed = tokio::task::spawn_blocking(move || {
            password::check_speed(&hash, password::VERIFY_LIMIT)
        });
        if let Ok(Err(e)) = timed.await {
            tracing::error!(
                "serial console {}: console_password_hash: {e} (logins may run out of time)",
                console.port.display()
            );
        }
    }
    let mut session = new_session(&console, agent.as_ref());
    let mut checks = password::Checker::default();
    let epoch = Instant::now();
    let mut said = None;
    loop {
        match open(&console) {
            Ok(port) => {
                said = None;
                let agent = agent.as_ref();
                let held = (&mut session, &mut checks);
                let e = run(port, held, epoch, &console, agent, &journal).await;
                tracing::warn!(
                    "serial console {}: line lost: {e}; opening it again in {} s",
                    console.port.display(),
                    REOPEN_AFTER.as_secs()
                );
            }
            Err(e) => {
                let text = e.to_string();
                if said.as_ref() != Some(&text) {
                    tracing::error!(
                        "serial console {}: cannot open: {text}; trying every {} s",
                        console.port.display(),
                        REOPEN_AFTER.as_secs()
                    );
                    said = Some(text);
                }
            }
        }
        tokio::time::sleep(REOPEN_AFTER).await;
    }
}

/// The session of `console` for `agent`.
pub fn new_session<A: SerialAgent>(console: &SerialConsole, agent: &A) -> Session {
    let identity = agent.identity();
    let settings = Settings {
        port: console.port.display().to_string(),
        banner: identity.banner(),
        program: identity.program.into(),
        name: identity.name,
        idle_ms: console.idle.as_millis() as u64,
        password: console.password_hash.is_some(),
    };
    Session::new(settings, agent.commands())
}

/// Opens the serial device: 8 data bits, no parity, 1 stop bit, no flow
/// control.
pub fn open(console: &SerialConsole) -> std::io::Result<tokio_serial::SerialStream> {
    let path = console.port.to_string_lossy();
    let builder = tokio_serial::new(path, console.baud)
        .data_bits(tokio_serial::DataBits::Eight)
        .parity(tokio_serial::Parity::None)
        .stop_bits(tokio_serial::StopBits::One)
        .flow_control(tokio_serial::FlowControl::None);
    tokio_serial::SerialStream::open(&builder).map_err(std::io::Error::from)
}

/// Runs `session` over `port` until the line fails; gives why. The
/// session's end (if one was open) is recorded as "line lost". `epoch`
/// is the session's clock's zero: the same for every opening of the port
/// (the session's login lock and idle deadline are times on that clock).
/// The session and its password checks (one in flight at a time) are
/// held for every opening of the port.
pub async fn run<S, A, J>(
    port: S,
    (session, checks): (&mut Session, &mut password::Checker),
    epoch: Instant,
    console: &SerialConsole,
    agent: &A,
    journal: &J,
) -> std::io::Error
where
    S: AsyncRead + AsyncWrite + Unpin,
    A: SerialAgent,
    J: Fn(Record, AuditBy),
{
    let (reader, writer) = tokio::io::split(port);
    let mut shell = Shell {
        reader,
        writer,
        typed: Vec::new(),
        epoch,
        console,
        operator: operator_name(&console.port),
        agent,
        journal,
        checks,
    };
    let e = shell.serve(session).await;
    for effect in session.line_lost() {
        if let Effect::Record(what, by) = effect {
            shell.record(what, by);
        }
    }
    e
}

/// The moving parts of one opened port.
struct Shell<'a, S, A, J> {
    reader: tokio::io::ReadHalf<S>,
    writer: tokio::io::WriteHalf<S>,
    /// Read and not yet fed to the session: typed while it was busy or
    /// while an answer was written.
    typed: Vec<u8>,
    /// The session's clock's zero (not this opening's).
    epoch: Instant,
    console: &'a SerialConsole,
    operator: String,
    agent: &'a A,
    journal: &'a J,
    /// The password checks, one in flight at a time.
    checks: &'a mut password::Checker,
}

impl<S, A, J> Shell<'_, S, A, J>
where
    S: AsyncRead + AsyncWrite + Unpin,
    A: SerialAgent,
    J: Fn(Record, AuditBy),
{
    /// Steady ms on the session's clock.
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    async fn serve(&mut self, session: &mut Session) -> std::io::Error {
        if let Err(e) = self.carry_out(session, vec![session.greeting()]).await {
            return e;
        }
        let mut buf = [0u8; 256];
        loop {
            let result = if !self.typed.is_empty() {
                self.feed(session).await
            } else {
                let read = match session.idle_deadline() {
                    Some(ms) => {
                        let at = self.epoch + Duration::from_millis(ms);
                        tokio::time::timeout_at(at, self.reader.read(&mut buf)).await
                    }
                    None => Ok(self.reader.read(&mut buf).await),
                };
                match read {
                    Err(_idle) => {
                        let effects = session.tick(self.now());
                        self.carry_out(session, effects).await
                    }
                    Ok(Ok(0)) => return std::io::ErrorKind::UnexpectedEof.into(),
                    Ok(Ok(n)) => {
                        self.typed.extend_from_slice(&buf[..n]);
                        Ok(())
                    }
                    Ok(Err(e)) => return e,
                }
            };
            if let Err(e) = result {
                return e;
            }
        }
    }

    /// Feeds what was typed to the session, carrying out what each part
    /// says (more may be typed, or cut, meanwhile).
    async fn feed(&mut self, session: &mut Session) -> std::io::Result<()> {
        while !self.typed.is_empty() {
            let step = session.input(self.now(), &self.typed);
            self.typed.drain(..step.consumed);
            let stuck = step.consumed == 0 && step.effects.is_empty();
            self.carry_out(session, step.effects).await?;
            if stuck {
                break;
            }
        }
        Ok(())
    }

    /// Carries out `effects` in order, and those their answers bring.
    async fn carry_out(
        &mut self,
        session: &mut Session,
        effects: Vec<Effect>,
    ) -> std::io::Result<()> {
        let mut queue = VecDeque::from(effects);
        while let Some(effect) = queue.pop_front() {
            match effect {
                Effect::Write(bytes) => {
                    if self.write(&bytes).await? == Written::Cut {
                        // What was still to be written goes with it, and
                        // a command not started yet (what a command that
                        // ran did is said all the same: WriteWhole).
                        let run = queue.iter().any(|e| matches!(e, Effect::Run { .. }));
                        queue.retain(|e| !matches!(e, Effect::Write(_) | Effect::Run { .. }));
                        let cut = if run {
                            session.not_run(self.now())
                        } else {
                            vec![session.cut()]
                        };
                        self.carry_out_cut(cut).await?;
                    }
                    session.shown(self.now());
                }
                Effect::WriteWhole(bytes) => {
                    // Not cut: what a state change did is always said.
                    write_moving(&mut self.writer, &bytes).await?;
                    session.shown(self.now());
                }
                Effect::Record(what, by) => self.record(what, by),
                Effect::Run { .. } if self.ctrl_c_typed() => {
                    // Ctrl-C came with the Enter key (a paste, a console
                    // server batching keys): the command is not started.
                    queue.retain(|e| !matches!(e, Effect::Write(_)));
                    let cut = session.not_run(self.now());
                    self.carry_out_cut(cut).await?;
                    session.shown(self.now());
                }
                Effect::Run { words } => {
                    let run = self.agent.run(&words, &self.operator);
                    let (text, ok) = match tokio::time::timeout(ANSWER_LIMIT, run).await {
                        Ok(answer) => (answer.text, answer.ok),
                        Err(_) => (unanswered_text(), false),
                    };
                    queue.extend(session.answered(self.now(), &text, ok));
                }
                Effect::Verify(password) => {
                    let effects = match self.verify(password).await {
                        Checked::Match => session.verified(self.now(), true),
                        Checked::Mismatch => session.verified(self.now(), false),
                        Checked::NotChecked(why) => session.not_checked(self.now(), &why),
                    };
                    queue.extend(effects);
                }
            }
        }
        Ok(())
    }

    /// Writes `bytes` as fast as the line takes them: a long answer at a
    /// slow baud rate takes as long as it takes, and the line counts as
    /// lost only when no byte went out for [`WRITE_TIMEOUT`]. The port is
    /// read meanwhile: a Ctrl-C stops the write ([`Written::Cut`]; it and
    /// what was typed before it are dropped), other keys are kept for
    /// after it.
    async fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<Written> {
        let mut buf = [0u8; 256];
        let mut stalled_at = Instant::now() + WRITE_TIMEOUT;
        while !bytes.is_empty() {
            let step = tokio::select! {
                read = self.reader.read(&mut buf) => WriteStep::Read(read?),
                wrote = tokio::time::timeout_at(stalled_at, self.writer.write(bytes)) => {
                    WriteStep::Wrote(wrote.unwrap_or_else(|_| Err(stalled(WRITE_TIMEOUT))))
                }
            };
            match step {
                WriteStep::Read(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                WriteStep::Read(n) => {
                    if self.typed_ahead(&buf[..n]) {
                        return Ok(Written::Cut);
                    }
                }
                WriteStep::Wrote(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
                WriteStep::Wrote(Ok(n)) => {
                    bytes = &bytes[n..];
                    stalled_at = Instant::now() + WRITE_TIMEOUT;
                }
                WriteStep::Wrote(Err(e)) => return Err(e),
            }
        }
        Ok(Written::Whole)
    }

    /// Writes and records what a cut says, the write not cut again.
    async fn carry_out_cut(&mut self, effects: Vec<Effect>) -> std::io::Result<()> {
        for effect in effects {
            match effect {
                Effect::Write(bytes) | Effect::WriteWhole(bytes) => {
                    write_moving(&mut self.writer, &bytes).await?
                }
                Effect::Record(what, by) => self.record(what, by),
                Effect::Run { .. } | Effect::Verify(_) => {}
            }
        }
        Ok(())
    }

    /// Whether a Ctrl-C was typed and not yet fed to the session: it and
    /// everything typed before it are dropped.
    fn ctrl_c_typed(&mut self) -> bool {
        match self.typed.iter().rposition(|&b| b == CTRL_C) {
            Some(i) => {
                self.typed.drain(..=i);
                true
            }
            None => false,
        }
    }

    /// Keeps `bytes`, typed while an answer was written, for after it (at
    /// most [`TYPED_AHEAD_MAX`]); true when a Ctrl-C is among them: it and
    /// everything typed before it are dropped.
    fn typed_ahead(&mut self, bytes: &[u8]) -> bool {
        let (cut, rest) = match bytes.iter().rposition(|&b| b == CTRL_C) {
            Some(i) => (true, &bytes[i + 1..]),
            None => (false, bytes),
        };
        if cut {
            self.typed.clear();
        }
        let room = TYPED_AHEAD_MAX.saturating_sub(self.typed.len());
        self.typed.extend_from_slice(&rest[..rest.len().min(room)]);
        cut
    }

    /// Checks `password` against the configured hash, off the runtime,
    /// within [`password::VERIFY_LIMIT`], one check at a time: a check
    /// that fails, takes longer or finds one still running logs nobody
    /// in, said in the log and on the console.
    async fn verify(&mut self, password: String) -> Checked {
        let Some(hash) = &self.console.password_hash else {
            return Checked::Mismatch;
        };
        let checked = self
            .checks
            .check(password::VERIFY_LIMIT, hash, &password)
            .await;
        if let Checked::NotChecked(why) = &checked {
            tracing::error!(
                "serial console {}: {why}; the login is not checked (not counted as a wrong password)",
                self.console.port.display()
            );
        }
        checked
    }

    fn record(&self, what: record::What, by: AuditBy) {
        (self.journal)(
            Record {
                port: self.console.port.display().to_string(),
                what,
            },
            by,
        );
    }
}

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Whole,
    /// Ctrl-C was typed before its end: the rest was dropped.
    Cut,
}

/// What came first while writing: bytes read, or some written.
enum WriteStep {
    Read(usize),
    Wrote(std::io::Result<usize>),
}

/// The error of a line that took no byte for `limit`.
fn stalled(limit: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("nothing written in {} s", limit.as_secs()),
    )
}

#[cfg(test)]
mod tests;

//! The serial console's session: what a line typed does, the login, the
//! idle timeout; a pure state machine. Bytes and times (ms of a steady
//! clock) come in; [`Effect`]s come out, for the shell to carry out:
//! bytes to write, a command for the agent, a password to check, a record
//! for the flash log with who caused it (the session's login when it was
//! made, not the command's outcome). No I/O, no clock, no hashing here.
//!
//! Built in: `help`, `login`, `logout` (also `exit`, `quit`). Every other
//! command is the agent's ([`Spec`]); one that changes state is refused
//! unless the session is logged in, and always when no password hash is
//! configured (fail closed). A refused login locks `login` for 2 s, then
//! 4, 8 … up to 64 s while refusals follow each other. `login` always
//! takes the next line hidden, and a password typed while login is locked
//! or with no password hash configured is refused unchecked: a password
//! typed after `login` never shows on the line. The times are one
//! clock's for the session's whole life: the shell keeps the session and
//! its clock across every opening of the port, so a lost line neither
//! lifts the lock nor resets the refusals.
//!
//! Glossary:
//! - *session*: from the first line typed to `logout`, the idle timeout
//!   or the line lost; the port stays open between sessions.
//! - *busy*: the session waits for the shell (a command's answer, a
//!   password's check) and takes no input meanwhile.
//! - *idle*: nothing typed, and nothing answered or written, for the idle
//!   time (logged in: at most [`LOGIN_IDLE_MAX_MS`], whatever the
//!   configured idle time says, since a pulled cable is not seen on a
//!   UART or behind a console server); the clock counts from the last key kept, the last answer or
//!   the end of the last write, whichever came last (a key typed hidden,
//!   a password's, counts). A session closed idle at the password prompt
//!   takes the rest of that line hidden and drops it, so no part of a
//!   password is ever shown or read as a command.

use super::line::{Edit, LineEditor};
use super::record::{CloseReason, What};
use loopwarden_store::recorder::AuditBy;

/// One of the agent's commands, for `help` and for the login check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The command word.
    pub name: &'static str,
    /// Its arguments, as `help` shows them (`RACK`, `[--since T]`).
    pub args: &'static str,
    /// What it does, in a few words.
    pub summary: &'static str,
    /// It changes the agent's state: it needs a login.
    pub changes_state: bool,
}

impl Spec {
    /// How the command `name` of `commands` is typed, for a line that
    /// names it with the wrong arguments (or names none of them).
    pub fn usage(commands: &[Spec], name: &str) -> String {
        match commands.iter().find(|c| c.name == name) {
            Some(c) if c.args.is_empty() => format!("usage: {} (no arguments)", c.name),
            Some(c) => format!("usage: {} {}", c.name, c.args),
            None => format!("unknown command {name:?}"),
        }
    }
}

/// What the session is told once.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The serial port, for records and the banner.
    pub port: String,
    /// The agent's identity line(s) for the banner.
    pub banner: String,
    /// The prompt's name (the host or CDU).
    pub name: String,
    /// The agent's program, for the hint on making a password hash.
    pub program: String,
    /// Idle time before a session is closed, ms.
    pub idle_ms: u64,
    /// A password hash is configured.
    pub password: bool,
}

/// What the shell is to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write these bytes to the port; a Ctrl-C typed meanwhile cuts
    /// them.
    Write(Vec<u8>),
    /// Write these bytes to the port whole, whatever is typed meanwhile:
    /// the answer of a state-changing command, which a Ctrl-C typed
    /// while it ran came too late to stop.
    WriteWhole(Vec<u8>),
    /// Ask the agent; answer with [`Session::answered`].
    Run {
        /// The words typed.
        words: Vec<String>,
    },
    /// Check this password; answer with [`Session::verified`].
    Verify(String),
    /// Put this in the flash log, caused by whom: an operator for what
    /// a logged-in session did (its command answered `ok: false` or not
    /// run included), anyone at the port for what a session not logged
    /// in did (opened, a login refused, a command refused, closed).
    Record(What, AuditBy),
}

/// Where the login stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Login {
    Out,
    /// `login` typed: the next line is the password.
    Password,
    In,
}

/// What the session waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Busy {
    /// The agent's answer to this line; it changes state.
    Run { line: String, changes_state: bool },
    /// A password's check.
    Verify,
}

/// Longest a logged-in session may sit idle, ms, whatever the
/// configured idle time: a cable pulled from a built-in UART or a console
/// server's port gives no error, so the next person to plug in would
/// otherwise find the login open.
pub const LOGIN_IDLE_MAX_MS: u64 = 300_000;

/// Longest lock after refused logins, ms.
const LOCK_MAX_MS: u64 = 64_000;

/// How long `login` stays locked after `refused` refusals in a row:
/// 2 s, doubling, at most `LOCK_MAX_MS`.
pub fn lock_ms(refused: u32) -> u64 {
    let doublings = refused.saturating_sub(1).min(6);
    (2_000u64 << doublings).min(LOCK_MAX_MS)
}

/// A serial console's state.
#[derive(Debug, Clone)]
pub struct Session {
    editor: LineEditor,
    settings: Settings,
    commands: &'static [Spec],
    open: bool,
    login: Login,
    busy: Option<Busy>,
    last_ms: u64,
    refused: u32,
    locked_until_ms: u64,
    /// A session closed at the password prompt: the rest of that line is
    /// taken hidden and dropped, never echoed nor read as a command.
    dropping: bool,
}

/// What [`Session::input`] did with the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Bytes taken; the rest waits until the session is no longer busy.
    pub consumed: usize,
    /// What to do.
    pub effects: Vec<Effect>,
}

/// `text` with each `\n` as `\r\n`, as a raw serial line needs.
pub fn crlf(text: &str) -> Vec<u8> {
    text.replace("\r\n", "\n")
        .replace('\n', "\r\n")
        .into_bytes()
}

impl Session {
    /// A port just opened, no session yet.
    pub fn new(settings: Settings, commands: &'static [Spec]) -> Self {
        Session {
            editor: LineEditor::new(),
            settings,
            commands,
            open: false,
            login: Login::Out,
            busy: None,
            last_ms: 0,
            refused: 0,
            locked_until_ms: 0,
            dropping: false,
        }
    }

    /// The banner and prompt, shown when the port opens and after each
    /// session.
    pub fn greeting(&self) -> Effect {
        let s = &self.settings;
        let text = format!(
            "\n{}\nserial console on {}; type help for the commands\n",
            s.banner.trim_end(),
            s.port
        );
        let mut bytes = crlf(&text);
        bytes.extend(self.prompt());
        Effect::Write(bytes)
    }

    fn prompt(&self) -> Vec<u8> {
        let mark = if self.login == Login::In { '#' } else { '>' };
        format!("{}{mark} ", self.settings.name).into_bytes()
    }

    fn say(&self, text: &str) -> Effect {
        Effect::Write(self.said(text))
    }

    /// `text` on lines of its own, then the prompt.
    fn said(&self, text: &str) -> Vec<u8> {
        let mut bytes = crlf(text);
        if !text.ends_with('\n') {
            bytes.extend_from_slice(b"\r\n");
        }
        bytes.extend(self.prompt());
        bytes
    }

    /// Whether a session is open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether the session is logged in.
    pub fn logged_in(&self) -> bool {
        self.login == Login::In
    }

    /// When an open session that nobody types in is closed (ms); none
    /// while it is busy. One closed at the password prompt keeps the rest
    /// of that line hidden, and drops it.
    pub fn idle_deadline(&self) -> Option<u64> {
        (self.open && self.busy.is_none()).then(|| self.last_ms + self.idle_ms())
    }

    /// The idle time now, ms: the configured one, and logged in at most
    /// [`LOGIN_IDLE_MAX_MS`].
    fn idle_ms(&self) -> u64 {
        match self.login {
            Login::In => self.settings.idle_ms.min(LOGIN_IDLE_MAX_MS),
            _ => self.settings.idle_ms,
        }
    }

    /// What the session said was written out by `now`: the idle time
    /// counts from here, not from the key that asked for it (a long
    /// answer on a slow line takes its time).
    pub fn shown(&mut self, now: u64) {
        if self.open {
            self.last_ms = self.last_ms.max(now);
        }
    }

    /// Takes `bytes` typed at `now`, up to the first line that needs the
    /// shell.
    pub fn input(&mut self, now: u64, bytes: &[u8]) -> Step {
        let mut effects = Vec::new();
        if self.busy.is_some() {
            return Step {
                consumed: 0,
                effects,
            };
        }
        let mut echo = Vec::new();
        for (i, &b) in bytes.iter().enumerate() {
            let before = echo.len();
            let edit = self.editor.feed(b, &mut echo);
            // A key kept is activity, a hidden one (a password) too.
            let hidden = self.login == Login::Password;
            if echo.len() > before || edit.is_some() || hidden {
                self.last_ms = now;
            }
            let Some(edit) = edit else { continue };
            effects.push(Effect::Write(std::mem::take(&mut echo)));
            self.on_edit(now, edit, &mut effects);
            if self.busy.is_some() {
                return Step {
                    consumed: i + 1,
                    effects,
                };
            }
        }
        if !echo.is_empty() {
            effects.push(Effect::Write(echo));
        }
        Step {
            consumed: bytes.len(),
            effects,
        }
    }

    fn on_edit(&mut self, now: u64, edit: Edit, out: &mut Vec<Effect>) {
        if std::mem::take(&mut self.dropping) {
            // The rest of a password whose session closed: dropped.
            self.editor.set_hidden(false);
            out.push(Effect::Write(self.prompt()));
            return;
        }
        if !self.open {
            self.open = true;
            out.push(Effect::Record(What::SessionOpened, self.by()));
        }
        match edit {
            Edit::Cancelled => {
                self.cancel_password();
                out.push(Effect::Write(self.prompt()));
            }
            Edit::TooLong => {
                self.cancel_password();
                out.push(self.say(&format!(
                    "line too long (over {} characters), discarded",
                    super::line::MAX_LINE
                )));
            }
            Edit::Line(line) if self.login == Login::Password => self.password(now, line, out),
            Edit::Line(line) => self.command(&line, out),
        }
    }

    fn cancel_password(&mut self) {
        if self.login == Login::Password {
            self.login = Login::Out;
            self.editor.set_hidden(false);
        }
    }

    /// The line typed at the password prompt at `now`: checked, or
    /// refused unchecked while login is locked or no hash is configured.
    fn password(&mut self, now: u64, password: String, out: &mut Vec<Effect>) {
        self.editor.set_hidden(false);
        self.login = Login::Out;
        if password.is_empty() {
            out.push(self.say("login cancelled"));
        } else if !self.settings.password {
            out.push(self.say(&format!(
                "login refused: no console password is configured: set console_password_hash \
                 (make it with `{} console-password`)",
                self.settings.program
            )));
        } else if now < self.locked_until_ms {
            let wait_s = (self.locked_until_ms - now).div_ceil(1000);
            out.push(self.say(&format!(
                "login refused: wait {wait_s} s ({} refused in a row); the password was not \
                 checked",
                self.refused
            )));
        } else {
            self.busy = Some(Busy::Verify);
            out.push(Effect::Verify(password));
        }
    }

    fn command(&mut self, line: &str, out: &mut Vec<Effect>) {
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        let Some(first) = words.first() else {
            out.push(Effect::Write(self.prompt()));
            return;
        };
        match first.to_ascii_lowercase().as_str() {
            "help" | "?" => out.push(self.say(&self.help())),
            "login" => self.login(out),
            "logout" | "exit" | "quit" => self.close(CloseReason::Logout, out),
            name => match self.commands.iter().find(|c| c.name == name) {
                None => out.push(self.say(&format!(
                    "unknown command {:?}: type help for the commands",
                    truncate(first, 20)
                ))),
                Some(spec) => self.agent_command(spec, line, words, out),
            },
        }
    }

    fn agent_command(
        &mut self,
        spec: &Spec,
        line: &str,
        words: Vec<String>,
        out: &mut Vec<Effect>,
    ) {
        let refusal = match (spec.changes_state, self.settings.password, self.login) {
            (false, _, _) | (true, true, Login::In) => None,
            (true, false, _) => Some(format!(
                "{} changes state, and no console password is configured: state-changing \
                 commands are refused on the serial console until console_password_hash is set \
                 (make it with `{} console-password`)",
                spec.name, self.settings.program
            )),
            (true, true, _) => Some(format!("{} changes state: log in first (login)", spec.name)),
        };
        if let Some(why) = refusal {
            let by = self.by();
            out.push(Effect::Record(
                What::Command {
                    line: line.to_string(),
                    ok: false,
                    result: format!("refused: {why}"),
                },
                by,
            ));
            out.push(self.say(&format!("refused: {why}")));
            return;
        }
        self.busy = Some(Busy::Run {
            line: line.to_string(),
            changes_state: spec.changes_state,
        });
        out.push(Effect::Run { words });
    }

    /// `login`: the password prompt, its line hidden, whether or not a
    /// password could be accepted now ([`password`](Self::password)
    /// refuses it then): the line after `login` is never echoed.
    fn login(&mut self, out: &mut Vec<Effect>) {
        if self.login == Login::In {
            out.push(self.say("already logged in"));
        } else {
            self.login = Login::Password;
            self.editor.set_hidden(true);
            out.push(Effect::Write(b"password: ".to_vec()));
        }
    }

    fn help(&self) -> String {
        let login = if self.commands.iter().any(|c| c.changes_state) {
            "ask for the password (commands marked * need it)"
        } else {
            "ask for the password (no command here needs it)"
        };
        let mut rows: Vec<(String, &str)> = vec![
            ("help".into(), "this list"),
            ("login".into(), login),
            ("logout, exit, quit".into(), "end the session"),
        ];
        for c in self.commands {
            let name = match (c.args.is_empty(), c.changes_state) {
                (true, false) => c.name.to_string(),
                (true, true) => format!("{} *", c.name),
                (false, false) => format!("{} {}", c.name, c.args),
                (false, true) => format!("{} {} *", c.name, c.args),
            };
            rows.push((name, c.summary));
        }
        let w = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        let mut text = String::from("commands:\n");
        for (n, s) in rows {
            text.push_str(&format!("  {n:<w$}  {s}\n"));
        }
        text
    }

    /// Ends the session for `why`: its record, a word, and the greeting.
    fn close(&mut self, why: CloseReason, out: &mut Vec<Effect>) {
        let logged_in = self.login == Login::In;
        out.push(Effect::Record(
            What::SessionClosed { why, logged_in },
            self.by(),
        ));
        let idle_s = self.idle_ms() / 1000;
        let word = match (why, logged_in) {
            (CloseReason::Idle, true) => format!("logged out after {idle_s} s idle"),
            (CloseReason::Idle, false) => format!("session closed after {idle_s} s idle"),
            (_, true) => "logged out".into(),
            (_, false) => "session closed".into(),
        };
        self.reset();
        out.push(Effect::Write(crlf(&format!("{word}\n"))));
        out.push(self.greeting());
    }

    /// Ends the session's state; one ended at the password prompt (idle,
    /// or the line lost) takes what is typed next, the rest of the
    /// password, hidden and drops it.
    fn reset(&mut self) {
        self.dropping |= self.login == Login::Password;
        self.open = false;
        self.login = Login::Out;
        self.busy = None;
        self.editor.restart();
        self.editor.set_hidden(self.dropping);
    }

    /// The agent answered the command with `text` at `now`; `ok`: it did
    /// what was asked. The idle time counts from `now`. The answer of a
    /// state-changing command is written whole ([`Effect::WriteWhole`]):
    /// it says what was done, and a Ctrl-C typed while it ran stopped
    /// nothing.
    pub fn answered(&mut self, now: u64, text: &str, ok: bool) -> Vec<Effect> {
        let Some(Busy::Run {
            line,
            changes_state,
        }) = self.busy.take()
        else {
            return Vec::new();
        };
        self.last_ms = self.last_ms.max(now);
        let mut out = Vec::new();
        if changes_state {
            out.push(Effect::Record(
                What::Command {
                    line,
                    ok,
                    result: text.trim().to_string(),
                },
                self.by(),
            ));
            out.push(Effect::WriteWhole(self.said(text)));
        } else {
            out.push(self.say(text));
        }
        out
    }

    /// The password was checked at `now`: `ok` when it matched.
    pub fn verified(&mut self, now: u64, ok: bool) -> Vec<Effect> {
        if self.busy.take() != Some(Busy::Verify) {
            return Vec::new();
        }
        self.last_ms = now;
        if ok {
            self.refused = 0;
            self.login = Login::In;
            let text = if self.commands.iter().any(|c| c.changes_state) {
                format!(
                    "logged in: state-changing commands are allowed until logout or {} s idle",
                    self.idle_ms() / 1000
                )
            } else {
                "logged in: this console offers no state-changing commands".into()
            };
            return vec![
                Effect::Record(What::LoginAccepted, self.by()),
                self.say(&text),
            ];
        }
        self.refused = self.refused.saturating_add(1);
        let lock = lock_ms(self.refused);
        self.locked_until_ms = now + lock;
        let text = format!(
            "login refused ({} in a row); the next try in {} s",
            self.refused,
            lock / 1000
        );
        vec![
            Effect::Record(
                What::LoginRefused {
                    in_a_row: self.refused,
                },
                self.by(),
            ),
            self.say(&text),
        ]
    }

    /// The password's check at `now` did not say whether it matched
    /// (`why`: it took too long, failed, or an earlier one still runs):
    /// not logged in, and not counted as a wrong password (no lock).
    pub fn not_checked(&mut self, now: u64, why: &str) -> Vec<Effect> {
        if self.busy.take() != Some(Busy::Verify) {
            return Vec::new();
        }
        self.last_ms = now;
        vec![self.say(&format!(
            "login not checked: {why}; not counted as a wrong password, try again later"
        ))]
    }

    /// The clock at `now`: closes a session idle too long.
    pub fn tick(&mut self, now: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.idle_deadline().is_some_and(|d| now >= d) {
            out.push(Effect::Write(b"\r\n".to_vec()));
            self.close(CloseReason::Idle, &mut out);
        }
        out
    }

    /// Ctrl-C came while the shell was writing: the rest of that write is
    /// dropped, and so is the line typed so far, as Ctrl-C does at the
    /// prompt (a password prompt is left). What to write instead.
    pub fn cut(&mut self) -> Effect {
        self.cancel_password();
        self.editor.restart();
        self.editor.set_hidden(self.dropping);
        let mut bytes = b"\r\n^C (output cut)\r\n".to_vec();
        bytes.extend(self.prompt());
        Effect::Write(bytes)
    }

    /// Ctrl-C came before the command waited for started (with its Enter
    /// key, or while its echo was written): it is not run, kept as not
    /// run when it changes state, and said; the line typed so far is
    /// dropped, as [`Session::cut`] does.
    pub fn not_run(&mut self, now: u64) -> Vec<Effect> {
        let Some(Busy::Run {
            line,
            changes_state,
        }) = self.busy.take()
        else {
            return vec![self.cut()];
        };
        self.last_ms = self.last_ms.max(now);
        self.cancel_password();
        self.editor.restart();
        self.editor.set_hidden(self.dropping);
        let mut out = Vec::new();
        let said = format!("^C: {} not run", truncate(&line, 40));
        if changes_state {
            out.push(Effect::Record(
                What::Command {
                    line,
                    ok: false,
                    result: "not run: Ctrl-C came before it started".into(),
                },
                self.by(),
            ));
        }
        let mut bytes = format!("\r\n{said}\r\n").into_bytes();
        bytes.extend(self.prompt());
        out.push(Effect::Write(bytes));
        out
    }

    /// The port failed: the session (if any) ends; its record.
    pub fn line_lost(&mut self) -> Vec<Effect> {
        let was = self.open.then(|| {
            Effect::Record(
                What::SessionClosed {
                    why: CloseReason::LineLost,
                    logged_in: self.login == Login::In,
                },
                self.by(),
            )
        });
        self.reset();
        was.into_iter().collect()
    }
}

impl Session {
    /// Who causes a record now: an operator while logged in, anyone at
    /// the port otherwise.
    fn by(&self) -> AuditBy {
        match self.login {
            Login::In => AuditBy::Operator,
            Login::Out | Login::Password => AuditBy::Anyone,
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

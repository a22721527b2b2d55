//! Fuzz targets of the serial console, run for a time budget (see
//! `tests/fuzz/harness.rs`): what a field engineer, line noise or anyone
//! with the cable types at it.
//!
//! - `serial_line`: the [`LineEditor`] on mutated typing (commands, arrow
//!   and function keys, lone and endless escape sequences, backspace,
//!   Ctrl-U, Ctrl-C, CR/LF mixes, 8-bit noise, lines past [`MAX_LINE`]),
//!   echoed or hidden. Besides never panicking, what the terminal shows
//!   (the echo, as a terminal draws it) is what a finished line holds, a
//!   line is printable ASCII of at most [`MAX_LINE`], and a hidden line
//!   echoes nothing but its end.
//! - `serial_session`: the [`Session`] on mutated scripts of typing, clock
//!   ticks, the agent's answers, password checks and a lost line, with
//!   and without a password. It must keep its invariants: no
//!   state-changing command runs unless logged in, a login only follows an
//!   accepted password, a password is never echoed, a busy session takes
//!   no input, a command or check asked is the step's last effect, and an
//!   idle session is closed by the tick after its deadline.

#[path = "../../tests/fuzz/harness.rs"]
mod harness;

use harness::{fuzz, mutate_bytes, Hex, Rng};
use loopwarden_field::serial::line::{Edit, LineEditor, MAX_LINE};
use loopwarden_field::serial::record::What;
use loopwarden_field::serial::session::{Effect, Session, Settings, Spec};

/// Pieces of typing the mutators insert: keys, sequences and lines.
const PIECES: &[&[u8]] = &[
    b"login\r",
    b"logout\r",
    b"help\r",
    b"status\r",
    b"clear-leak 3\r",
    b"CLEAR-LEAK 1\r\n",
    b"events --since 10\r",
    b"s3cret\r",
    b"\x1b[A",
    b"\x1bOP",
    b"\x1b[15~",
    b"\x1b[1;5;2;4;6;8;1;1;1;1;1;1;1;1;1;1;1;1",
    b"\x1b",
    b"\x03",
    b"\x15",
    b"\x08",
    b"\x7f",
    b"\r\n",
    b"\n\r",
    b"\r",
    b"\xff\xfe\x00\x07\t",
];

/// `bytes` with one to four pieces of [`PIECES`] (or a long run of one
/// letter) inserted, and byte mutations.
fn mutate_typing(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.between(1, 4) {
        let at = rng.below(bytes.len() + 1);
        let piece: Vec<u8> = if rng.one_in(6) {
            vec![b'x'; rng.between(MAX_LINE - 2, MAX_LINE + 2)]
        } else {
            rng.pick(PIECES).to_vec()
        };
        bytes.splice(at..at, piece);
    }
    if rng.one_in(2) {
        let others: Vec<Vec<u8>> = PIECES.iter().map(|p| p.to_vec()).collect();
        mutate_bytes(rng, bytes, &others, 4096);
    }
}

/// Typing, echoed or hidden.
#[derive(Debug, Clone)]
struct Typing {
    hidden: bool,
    bytes: Hex,
}

/// What a terminal shows of the line being typed, drawn from the echo.
#[derive(Debug, Default)]
struct Terminal {
    line: Vec<u8>,
}

impl Terminal {
    /// Draws the echo of one byte that finished nothing: one printable
    /// character, or erasures (`BS SP BS` each).
    fn draw(&mut self, echo: &[u8]) -> Result<(), String> {
        match echo {
            [] => Ok(()),
            [c] if (0x20..=0x7E).contains(c) => {
                self.line.push(*c);
                Ok(())
            }
            _ if echo.len() % 3 == 0 && echo.chunks(3).all(|c| c == b"\x08 \x08") => {
                let n = echo.len() / 3;
                if n > self.line.len() {
                    return Err(format!("{n} erased of a shown line of {}", self.line.len()));
                }
                self.line.truncate(self.line.len() - n);
                Ok(())
            }
            _ => Err(format!(
                "unexpected echo {:?}",
                String::from_utf8_lossy(echo)
            )),
        }
    }
}

fn check_typing(t: &Typing) -> Result<(), String> {
    let mut editor = LineEditor::new();
    editor.set_hidden(t.hidden);
    let mut term = Terminal::default();
    for (i, &b) in t.bytes.0.iter().enumerate() {
        let mut echo = Vec::new();
        let edit = editor.feed(b, &mut echo);
        check_edit(t.hidden, &mut term, edit, &echo).map_err(|e| format!("byte {i}: {e}"))?;
        if term.line.len() > MAX_LINE {
            return Err(format!("byte {i}: {} characters shown", term.line.len()));
        }
    }
    Ok(())
}

/// One byte's edit and echo against what the terminal shows.
fn check_edit(
    hidden: bool,
    term: &mut Terminal,
    edit: Option<Edit>,
    echo: &[u8],
) -> Result<(), String> {
    let shown = std::mem::take(&mut term.line);
    match edit {
        None if hidden && !echo.is_empty() => Err(format!("hidden, echoes {echo:?}")),
        None => {
            term.line = shown;
            term.draw(echo)
        }
        Some(Edit::Cancelled) if echo == b"^C\r\n" => Ok(()),
        Some(Edit::TooLong) if echo == b"\r\n" => Ok(()),
        Some(Edit::Line(line)) if echo == b"\r\n" => {
            if line.len() > MAX_LINE || !line.bytes().all(|c| (0x20..=0x7E).contains(&c)) {
                return Err(format!("line {line:?}"));
            }
            if !hidden && line.as_bytes() != shown {
                return Err(format!(
                    "runs {line:?}, shows {:?}",
                    String::from_utf8_lossy(&shown)
                ));
            }
            Ok(())
        }
        Some(e) => Err(format!("{e:?} echoes {echo:?}")),
    }
}

#[test]
fn serial_line() {
    let mut seeds: Vec<Typing> = PIECES
        .iter()
        .map(|p| Typing {
            hidden: false,
            bytes: Hex(p.to_vec()),
        })
        .collect();
    seeds.push(Typing {
        hidden: true,
        bytes: Hex(b"s3cret\x08t\r".to_vec()),
    });
    fuzz(
        "serial_line",
        &seeds,
        |rng, seeds| {
            let mut bytes = rng.pick(seeds).bytes.0.clone();
            mutate_typing(rng, &mut bytes);
            Typing {
                hidden: rng.one_in(4),
                bytes: Hex(bytes),
            }
        },
        check_typing,
    );
}

// ---- the session ----

const COMMANDS: &[Spec] = &[
    Spec {
        name: "status",
        args: "",
        summary: "the thing at a glance",
        changes_state: false,
    },
    Spec {
        name: "events",
        args: "[--since T]",
        summary: "recent events",
        changes_state: false,
    },
    Spec {
        name: "clear-leak",
        args: "RACK",
        summary: "reopen a rack",
        changes_state: true,
    },
];

/// Idle time before a session closes.
const IDLE_MS: u64 = 300_000;

/// One thing that happens to the session.
#[derive(Debug, Clone)]
enum Op {
    /// Bytes typed `after_ms` after the last op.
    Type { after_ms: u64, bytes: Hex },
    /// The clock, `after_ms` later.
    Tick { after_ms: u64 },
    /// The agent's answer (to a command asked or not).
    Answer { ok: bool },
    /// The password's check (asked or not).
    Verified { ok: bool },
    /// The port failed.
    LineLost,
}

/// A script of ops, with or without a password configured.
#[derive(Debug, Clone)]
struct Script {
    password: bool,
    ops: Vec<Op>,
}

fn settings(password: bool) -> Settings {
    Settings {
        port: "/dev/ttyS1".into(),
        banner: "Loopwarden fuzz-agent, unit u1".into(),
        name: "u1".into(),
        program: "fuzz-agent".into(),
        idle_ms: IDLE_MS,
        password,
    }
}

/// What the check knows of the session it drives.
#[derive(Debug, Default)]
struct Model {
    password: bool,
    now: u64,
    /// Typed bytes the session has not taken yet (it was busy).
    waiting: Vec<u8>,
    /// A command is asked of the agent.
    asked_run: bool,
    /// A password is to be checked.
    asked_verify: bool,
    /// A password was accepted and no session closed since.
    accepted: bool,
    /// The writes since the last `password: ` prompt, if one is open.
    since_prompt: Option<Vec<Vec<u8>>>,
}

fn check_script(script: &Script) -> Result<(), String> {
    let mut session = Session::new(settings(script.password), COMMANDS);
    let mut m = Model {
        password: script.password,
        ..Model::default()
    };
    for (i, op) in script.ops.iter().enumerate() {
        apply(&mut session, &mut m, op).map_err(|e| format!("op {i} ({op:?}): {e}"))?;
    }
    Ok(())
}

fn apply(session: &mut Session, m: &mut Model, op: &Op) -> Result<(), String> {
    match op {
        Op::Type { after_ms, bytes } => {
            m.now += after_ms;
            m.waiting.extend_from_slice(&bytes.0);
            feed(session, m)
        }
        Op::Tick { after_ms } => {
            m.now += after_ms;
            let deadline = session.idle_deadline();
            let effects = session.tick(m.now);
            observe(session, m, &effects, false)?;
            if deadline.is_some_and(|d| m.now >= d) && (session.is_open() || session.logged_in()) {
                return Err("idle past its deadline and still open".into());
            }
            Ok(())
        }
        // The shell answers only what was asked: no answer while a
        // password is checked, no check while a command runs.
        Op::Answer { .. } | Op::Verified { .. } if m.asked_verify && m.asked_run => {
            Err("a command and a check asked at once".into())
        }
        Op::Answer { .. } if m.asked_verify => Ok(()),
        Op::Verified { .. } if m.asked_run => Ok(()),
        Op::Answer { ok } => {
            let asked = std::mem::take(&mut m.asked_run);
            let effects = session.answered(m.now, "done", *ok);
            unasked(asked, &effects)?;
            observe(session, m, &effects, false)?;
            feed(session, m)
        }
        Op::Verified { ok } => {
            let asked = std::mem::take(&mut m.asked_verify);
            m.accepted |= asked && *ok;
            let effects = session.verified(m.now, *ok);
            unasked(asked, &effects)?;
            observe(session, m, &effects, false)?;
            feed(session, m)
        }
        Op::LineLost => {
            let effects = session.line_lost();
            *m = Model {
                password: m.password,
                now: m.now,
                ..Model::default()
            };
            observe(session, m, &effects, false)
        }
    }
}

/// An answer or a check nobody asked for does nothing.
fn unasked(asked: bool, effects: &[Effect]) -> Result<(), String> {
    match (asked, effects) {
        (false, [_, ..]) => Err(format!("not asked, yet {effects:?}")),
        _ => Ok(()),
    }
}

/// Gives the session what is typed and waiting, unless it is busy.
fn feed(session: &mut Session, m: &mut Model) -> Result<(), String> {
    let busy = m.asked_run || m.asked_verify;
    let bytes = std::mem::take(&mut m.waiting);
    let step = session.input(m.now, &bytes);
    if busy && (step.consumed > 0 || !step.effects.is_empty()) {
        return Err(format!("busy, yet took {} bytes", step.consumed));
    }
    let rest = bytes
        .get(step.consumed..)
        .ok_or_else(|| format!("took {} bytes of {}", step.consumed, bytes.len()))?;
    m.waiting = rest.to_vec();
    observe(session, m, &step.effects, true)?;
    let asked = m.asked_run || m.asked_verify;
    if !m.waiting.is_empty() && !asked {
        return Err(format!(
            "left {} bytes without asking anything",
            m.waiting.len()
        ));
    }
    Ok(())
}

/// Checks a call's effects and what they say of the session.
fn observe(
    session: &Session,
    m: &mut Model,
    effects: &[Effect],
    input: bool,
) -> Result<(), String> {
    for (i, e) in effects.iter().enumerate() {
        let last = i + 1 == effects.len();
        match e {
            Effect::Write(b) if b == b"password: " => m.since_prompt = Some(Vec::new()),
            Effect::Write(b) | Effect::WriteWhole(b) => {
                m.since_prompt.iter_mut().for_each(|w| w.push(b.clone()))
            }
            Effect::Run { words } if input && last => ran(session, m, words)?,
            Effect::Verify(p) if input && last => verify(m, p)?,
            Effect::Run { .. } | Effect::Verify(_) => {
                return Err(format!("{e:?} not as the last effect of a step of input"))
            }
            Effect::Record(What::SessionClosed { .. }, _) => m.accepted = false,
            Effect::Record(..) => {}
        }
    }
    if session.logged_in() && !m.accepted {
        return Err("logged in without an accepted password".into());
    }
    Ok(())
}

/// A command asked of the agent: known, and logged in if it changes state.
fn ran(session: &Session, m: &mut Model, words: &[String]) -> Result<(), String> {
    let first = words.first().map(|w| w.to_ascii_lowercase());
    let spec = COMMANDS
        .iter()
        .find(|c| first.as_deref() == Some(c.name))
        .ok_or_else(|| format!("runs {words:?}, not a command"))?;
    if spec.changes_state && !(m.password && m.accepted && session.logged_in()) {
        return Err(format!("runs {words:?} without a login"));
    }
    m.asked_run = true;
    Ok(())
}

/// A password to check: one is configured, it was asked for, and nothing
/// of it was echoed.
fn verify(m: &mut Model, password: &str) -> Result<(), String> {
    if !m.password {
        return Err("checks a password, none configured".into());
    }
    if password.is_empty() || password.len() > MAX_LINE {
        return Err(format!(
            "checks a password of {} characters",
            password.len()
        ));
    }
    match m.since_prompt.take() {
        Some(w) if w.iter().all(|w| w == b"\r\n") => {}
        other => return Err(format!("checks a password after {other:?}")),
    }
    m.asked_verify = true;
    Ok(())
}

fn typed(after_ms: u64, bytes: &[u8]) -> Op {
    Op::Type {
        after_ms,
        bytes: Hex(bytes.to_vec()),
    }
}

/// Scripts of a day at the console: a login and a command, refused
/// logins and the lock, no password, noise, a lost line.
fn scripts() -> Vec<Script> {
    use Op::{Answer, LineLost, Tick, Verified};
    let yes = |password, ops| Script { password, ops };
    vec![
        yes(
            true,
            vec![
                typed(0, b"help\r"),
                typed(500, b"login\r"),
                typed(900, b"s3cret\r"),
                Verified { ok: true },
                typed(1_000, b"clear-leak 3\r"),
                Answer { ok: true },
                typed(2_000, b"logout\r"),
            ],
        ),
        yes(
            true,
            vec![
                typed(0, b"clear-leak 3\r"),
                typed(100, b"login\rwrong\r"),
                Verified { ok: false },
                typed(100, b"login\r"),
                Tick { after_ms: 2_000 },
                typed(1, b"login\rs3cret\r"),
                Verified { ok: true },
                Tick { after_ms: IDLE_MS },
                typed(1, b"clear-leak 1\r"),
            ],
        ),
        yes(
            false,
            vec![
                typed(0, b"status\r"),
                Answer { ok: true },
                typed(10, b"clear-leak 3\r"),
                typed(10, b"login\r"),
                typed(10, b"events --since 10\r"),
                Answer { ok: false },
            ],
        ),
        yes(
            true,
            vec![
                typed(0, b"\x1b[Ast\x1b[15~atus\r\x7f\x03"),
                Answer { ok: true },
                typed(0, &[b'x'; MAX_LINE + 1]),
                typed(0, b"\r"),
                LineLost,
                typed(5, b"status\r"),
            ],
        ),
        yes(
            true,
            vec![
                typed(0, b"login\rs3cret\rclear-leak 2\rstatus\r"),
                Verified { ok: true },
                Answer { ok: true },
                Answer { ok: true },
            ],
        ),
    ]
}

/// A gap between ops: around the lock's steps and the idle deadline.
fn gap(rng: &mut Rng) -> u64 {
    const GAPS: [u64; 10] = [
        0,
        1,
        999,
        1_999,
        2_000,
        4_001,
        64_000,
        IDLE_MS - 1,
        IDLE_MS,
        IDLE_MS + 1,
    ];
    if rng.one_in(3) {
        rng.next_u64() % 10_000
    } else {
        *rng.pick(&GAPS)
    }
}

fn random_op(rng: &mut Rng) -> Op {
    match rng.below(8) {
        0..=2 => {
            let piece = *rng.pick(PIECES);
            typed(gap(rng), piece)
        }
        3 => Op::Tick { after_ms: gap(rng) },
        4 => Op::Answer { ok: rng.one_in(2) },
        5 | 6 => Op::Verified { ok: rng.one_in(2) },
        _ => Op::LineLost,
    }
}

fn mutate_script(rng: &mut Rng, seeds: &[Script]) -> Script {
    let mut s = rng.pick(seeds).clone();
    for _ in 0..rng.between(1, 4) {
        let n = s.ops.len();
        match rng.below(8) {
            0..=2 if n > 0 => {
                if let Op::Type { bytes, .. } = &mut s.ops[rng.below(n)] {
                    mutate_typing(rng, &mut bytes.0);
                }
            }
            3 if n > 0 => {
                s.ops.remove(rng.below(n));
            }
            4 if n > 0 => {
                let op = s.ops[rng.below(n)].clone();
                s.ops.insert(rng.below(n + 1), op);
            }
            5 if n > 0 => match &mut s.ops[rng.below(n)] {
                Op::Type { after_ms, .. } | Op::Tick { after_ms } => *after_ms = gap(rng),
                _ => {}
            },
            6 if rng.one_in(4) => s.password = !s.password,
            _ => s.ops.insert(rng.below(n + 1), random_op(rng)),
        }
    }
    s.ops.truncate(64);
    s
}

#[test]
fn serial_session() {
    fuzz("serial_session", &scripts(), mutate_script, check_script);
}

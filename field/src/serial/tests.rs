//! The session as a pure machine (times passed in), and the shell over an
//! in-memory byte stream in paused time.

use std::path::Path;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use super::record::{CloseReason, What};
use super::session::{lock_ms, Effect, Session, Settings, Spec};
use super::*;
use loopwarden_store::recorder::AuditBy;

const COMMANDS: &[Spec] = &[
    Spec {
        name: "status",
        args: "",
        summary: "the thing at a glance",
        changes_state: false,
    },
    Spec {
        name: "clear-leak",
        args: "RACK",
        summary: "reopen a rack",
        changes_state: true,
    },
];

fn settings(password: bool) -> Settings {
    Settings {
        port: "/dev/ttyS1".into(),
        banner: "Loopwarden test-agent, unit u1".into(),
        name: "u1".into(),
        program: "test-agent".into(),
        idle_ms: 300_000,
        password,
    }
}

/// What the session wrote, and the rest of its effects.
fn split(effects: Vec<Effect>) -> (String, Vec<Effect>) {
    let mut text = Vec::new();
    let mut rest = Vec::new();
    for e in effects {
        match e {
            Effect::Write(b) | Effect::WriteWhole(b) => text.extend(b),
            other => rest.push(other),
        }
    }
    (String::from_utf8(text).unwrap(), rest)
}

/// Types `bytes` at `now` (all taken).
fn type_in(s: &mut Session, now: u64, bytes: &[u8]) -> (String, Vec<Effect>) {
    let step = s.input(now, bytes);
    assert_eq!(step.consumed, bytes.len());
    split(step.effects)
}

#[test]
fn help_a_table_command_and_an_unknown_one() {
    let mut s = Session::new(settings(true), COMMANDS);
    let (text, _) = split(vec![s.greeting()]);
    assert!(
        text.contains("Loopwarden test-agent, unit u1\r\n"),
        "{text:?}"
    );
    assert!(
        text.ends_with("type help for the commands\r\nu1> "),
        "{text:?}"
    );
    let (text, rest) = type_in(&mut s, 0, b"help\r");
    assert_eq!(rest, [Effect::Record(What::SessionOpened, AuditBy::Anyone)]);
    assert!(text.starts_with("help\r\ncommands:\r\n"), "{text:?}");
    assert!(text.contains("  clear-leak RACK *"), "{text:?}");
    assert!(text.contains("(commands marked * need it)"), "{text:?}");
    assert!(text.contains("  status  "), "{text:?}");
    let (text, rest) = type_in(&mut s, 1, b"frobnicate now\r");
    assert!(rest.is_empty());
    assert_eq!(
        text,
        "frobnicate now\r\nunknown command \"frobnicate\": type help for the commands\r\nu1> "
    );
    // A command of the agent's, with the rest of the input held back
    // until it is answered.
    let step = s.input(2, b"STATUS\rhelp\r");
    assert_eq!(step.consumed, 7);
    let (_, rest) = split(step.effects);
    assert_eq!(
        rest,
        [Effect::Run {
            words: vec!["STATUS".into()]
        }]
    );
    assert_eq!(s.input(3, b"help\r").consumed, 0, "busy");
    let (text, rest) = split(s.answered(4, "all well\n", true));
    assert!(rest.is_empty(), "a read-only command is not recorded");
    assert_eq!(text, "all well\r\nu1> ");
}

/// A check that did not say (it took too long, or an earlier one still
/// runs) is said on the console, and is not a wrong password: no lock,
/// and the refusals in a row do not grow.
#[test]
fn a_password_check_that_did_not_end_is_said_and_not_counted_as_refused() {
    let mut s = Session::new(settings(true), COMMANDS);
    type_in(&mut s, 0, b"login\r");
    type_in(&mut s, 10, b"wrong\r");
    s.verified(100, false);
    type_in(&mut s, 2_100, b"login\r");
    let (_, rest) = type_in(&mut s, 2_200, b"slow\r");
    assert_eq!(rest, [Effect::Verify("slow".into())]);
    let (text, rest) = split(s.not_checked(12_200, "the password check took over 10 s"));
    assert!(rest.is_empty(), "{rest:?}");
    assert!(
        text.starts_with("login not checked: the password check took over 10 s; not counted"),
        "{text:?}"
    );
    // No lock: the next try is checked at once, and a wrong one is the
    // second in a row, not the third.
    type_in(&mut s, 12_300, b"login\r");
    let (_, rest) = type_in(&mut s, 12_400, b"wrong\r");
    assert_eq!(rest, [Effect::Verify("wrong".into())]);
    let (text, _) = split(s.verified(12_500, false));
    assert!(text.starts_with("login refused (2 in a row)"), "{text:?}");
}

#[test]
fn a_state_change_needs_a_login_and_a_wrong_password_locks_login() {
    let mut s = Session::new(settings(true), COMMANDS);
    let (text, rest) = type_in(&mut s, 0, b"clear-leak 2\r");
    assert!(text.contains("refused: clear-leak changes state: log in first"));
    assert!(matches!(
        &rest[1],
        Effect::Record(What::Command { ok: false, line, .. }, _) if line == "clear-leak 2"
    ));
    // The password is not echoed.
    let (text, _) = type_in(&mut s, 10, b"login\r");
    assert_eq!(text, "login\r\npassword: ");
    let step = s.input(20, b"wrong\r");
    let (text, rest) = split(step.effects);
    assert_eq!(text, "\r\n");
    assert_eq!(rest, [Effect::Verify("wrong".into())]);
    let (text, rest) = split(s.verified(100, false));
    assert_eq!(
        rest,
        [Effect::Record(
            What::LoginRefused { in_a_row: 1 },
            AuditBy::Anyone
        )]
    );
    assert!(text.starts_with("login refused (1 in a row); the next try in 2 s"));
    // Locked for 2 s: the password is taken hidden and refused unchecked.
    let (text, _) = type_in(&mut s, 1_500, b"login\r");
    assert_eq!(text, "login\r\npassword: ");
    let (text, rest) = type_in(&mut s, 1_600, b"right\r");
    assert!(
        text.starts_with("\r\nlogin refused: wait 1 s (1 refused in a row)"),
        "{text:?}"
    );
    assert!(rest.is_empty(), "not checked, not counted: {rest:?}");
    let (text, _) = type_in(&mut s, 2_100, b"login\r");
    assert!(text.ends_with("password: "));
    let step = s.input(2_200, b"right\r");
    assert_eq!(split(step.effects).1, [Effect::Verify("right".into())]);
    let (text, rest) = split(s.verified(2_300, true));
    assert_eq!(
        rest,
        [Effect::Record(What::LoginAccepted, AuditBy::Operator)]
    );
    assert!(text.ends_with("u1# "), "{text:?}");
    let step = s.input(2_400, b"clear-leak 2\r");
    assert_eq!(
        split(step.effects).1,
        [Effect::Run {
            words: vec!["clear-leak".into(), "2".into()]
        }]
    );
    // Recorded, and said whole (no Ctrl-C cuts what a state change did).
    assert_eq!(
        s.answered(2_450, "rack 2: leak cleared", true),
        [
            Effect::Record(
                What::Command {
                    line: "clear-leak 2".into(),
                    ok: true,
                    result: "rack 2: leak cleared".into()
                },
                AuditBy::Operator
            ),
            Effect::WriteWhole(b"rack 2: leak cleared\r\nu1# ".to_vec())
        ]
    );
    let (text, rest) = type_in(&mut s, 2_500, b"logout\r");
    assert_eq!(
        rest,
        [Effect::Record(
            What::SessionClosed {
                why: CloseReason::Logout,
                logged_in: true
            },
            AuditBy::Operator
        )]
    );
    assert!(text.contains("logged out\r\n"), "{text:?}");
    assert!(text.ends_with("u1> "));
}

#[test]
fn a_logout_ended_with_cr_lf_opens_no_session_after_it() {
    // Lines may end with CR, LF or both: the LF after `logout`'s CR ends
    // that line, not an empty one that opens a session nobody typed.
    let mut s = Session::new(settings(true), COMMANDS);
    let (_, rest) = type_in(&mut s, 0, b"help\r\n");
    assert_eq!(rest, [Effect::Record(What::SessionOpened, AuditBy::Anyone)]);
    let (text, rest) = type_in(&mut s, 1, b"logout\r\n");
    assert_eq!(
        rest,
        [Effect::Record(
            What::SessionClosed {
                why: CloseReason::Logout,
                logged_in: false
            },
            AuditBy::Anyone
        )]
    );
    assert!(text.ends_with("u1> "), "{text:?}");
    assert!(!s.is_open());
    // The next line typed opens one.
    let (_, rest) = type_in(&mut s, 2, b"help\r\n");
    assert_eq!(rest, [Effect::Record(What::SessionOpened, AuditBy::Anyone)]);
}

#[test]
fn refusals_in_a_row_lock_login_longer() {
    assert_eq!(
        [1, 2, 3, 6, 7, 8, 1000].map(lock_ms),
        [2_000, 4_000, 8_000, 64_000, 64_000, 64_000, 64_000]
    );
}

#[test]
fn without_a_password_hash_state_changes_are_refused_and_say_how_to_allow_them() {
    let mut s = Session::new(settings(false), COMMANDS);
    let (text, rest) = type_in(&mut s, 0, b"clear-leak 1\r");
    assert!(
        text.contains("no console password is configured")
            && text.contains("`test-agent console-password`"),
        "{text:?}"
    );
    assert!(matches!(
        &rest[1],
        Effect::Record(What::Command { ok: false, .. }, _)
    ));
    let (text, _) = type_in(&mut s, 0, b"login\r");
    assert_eq!(text, "login\r\npassword: ");
    let (text, rest) = type_in(&mut s, 0, b"s3cret-pass\r");
    assert!(text.contains("set console_password_hash"), "{text:?}");
    assert!(!text.contains("s3cret"), "{text:?}");
    assert!(rest.is_empty(), "nothing to check it against: {rest:?}");
}

#[test]
fn an_idle_session_is_closed_and_a_logged_in_one_says_it_logged_out() {
    let mut s = Session::new(settings(true), COMMANDS);
    assert_eq!(s.idle_deadline(), None, "no session yet");
    type_in(&mut s, 1_000, b"login\r");
    s.input(1_000, b"pw\r");
    s.verified(2_000, true);
    assert_eq!(s.idle_deadline(), Some(302_000));
    // Noise is no activity; a kept character is.
    type_in(&mut s, 100_000, b"\x00\x1b[A");
    assert_eq!(s.idle_deadline(), Some(302_000));
    type_in(&mut s, 100_000, b"s");
    assert_eq!(s.idle_deadline(), Some(400_000));
    assert!(s.tick(399_999).is_empty());
    let (text, rest) = split(s.tick(400_000));
    assert_eq!(
        rest,
        [Effect::Record(
            What::SessionClosed {
                why: CloseReason::Idle,
                logged_in: true
            },
            AuditBy::Operator
        )]
    );
    assert!(text.contains("logged out after 300 s idle"), "{text:?}");
    assert!(!s.logged_in() && !s.is_open());
    // The half-typed line went with the session.
    let (_, rest) = type_in(&mut s, 500_000, b"tatus\r");
    assert!(matches!(
        rest[0],
        Effect::Record(What::SessionOpened, AuditBy::Anyone)
    ));
    assert!(rest.get(1).is_none());
}

#[test]
fn a_login_ends_after_300_s_idle_whatever_the_session_idle_time() {
    // A pulled cable is not seen on a UART or behind a console server:
    // the next person at the port must not find the login still open.
    let mut s = Session::new(
        Settings {
            idle_ms: 86_400_000,
            ..settings(true)
        },
        COMMANDS,
    );
    type_in(&mut s, 0, b"login\r");
    s.input(0, b"pw\r");
    let (text, _) = split(s.verified(1_000, true));
    assert!(text.contains("until logout or 300 s idle"), "{text:?}");
    assert_eq!(s.idle_deadline(), Some(301_000));
    assert!(s.tick(300_999).is_empty());
    let (text, rest) = split(s.tick(301_000));
    assert_eq!(
        rest,
        [Effect::Record(
            What::SessionClosed {
                why: CloseReason::Idle,
                logged_in: true
            },
            AuditBy::Operator
        )]
    );
    assert!(text.contains("logged out after 300 s idle"), "{text:?}");
    assert!(!s.logged_in());
    // Not logged in, the session keeps the configured idle time.
    type_in(&mut s, 400_000, b"status\r");
    s.answered(400_000, "all well", true);
    assert_eq!(s.idle_deadline(), Some(86_800_000));
}

#[test]
fn the_password_after_a_refused_login_is_never_echoed() {
    let mut s = Session::new(settings(true), COMMANDS);
    type_in(&mut s, 0, b"login\r");
    s.input(10, b"wrong\r");
    s.verified(100, false);
    // Typed ahead while login is locked: hidden, refused, not checked.
    let (text, rest) = type_in(&mut s, 500, b"login\rs3cret-pass\r");
    assert!(!text.contains("s3cret"), "{text:?}");
    assert!(
        text.contains("login refused: wait 2 s (1 refused in a row)"),
        "{text:?}"
    );
    assert!(rest.is_empty(), "{rest:?}");
    assert!(text.ends_with("u1> "), "{text:?}");
    // The next line shows again.
    let (text, _) = type_in(&mut s, 600, b"help\r");
    assert!(text.starts_with("help\r\ncommands:"), "{text:?}");
}

#[test]
fn a_session_closed_idle_at_the_password_prompt_drops_the_rest_of_it_hidden() {
    let mut s = Session::new(settings(true), COMMANDS);
    type_in(&mut s, 0, b"login\r");
    let (text, _) = type_in(&mut s, 100_000, b"s3cr");
    assert_eq!(text, "");
    // Left at the prompt: closed idle, as any session.
    assert_eq!(s.idle_deadline(), Some(400_000));
    let (text, _) = split(s.tick(400_000));
    assert!(text.contains("session closed after 300 s idle"), "{text}");
    // The rest of the password, typed after: never shown, never a
    // command, never checked.
    let (text, rest) = type_in(&mut s, 500_000, b"et-pass\r");
    assert!(
        !text.contains("et-pass") && !text.contains("unknown"),
        "{text:?}"
    );
    assert!(rest.is_empty(), "{rest:?}");
    let (text, _) = type_in(&mut s, 501_000, b"status\r");
    assert!(text.contains("status"), "echoed again: {text:?}");
    s.answered(502_000, "all well", true);
    // Closed idle at the prompt, then the line lost and found again: the
    // rest of the password still hidden and dropped.
    type_in(&mut s, 600_000, b"login\r");
    s.tick(900_000);
    s.line_lost();
    let (text, rest) = type_in(&mut s, 950_000, b"tail-of-it\r");
    assert!(!text.contains("tail-of-it"), "{text:?}");
    assert!(rest.is_empty(), "{rest:?}");
    // The line lost at the prompt itself, alike.
    type_in(&mut s, 960_000, b"login\r");
    s.line_lost();
    let (text, rest) = type_in(&mut s, 970_000, b"more-of-it\r");
    assert!(!text.contains("more-of-it") && rest.is_empty(), "{text:?}");
}

#[test]
fn idle_counts_from_the_answer_and_from_the_end_of_its_write() {
    let mut s = Session::new(settings(true), COMMANDS);
    s.shown(50);
    assert_eq!(s.idle_deadline(), None, "no session yet");
    let step = s.input(0, b"status\r");
    assert_eq!(step.consumed, 7);
    // The agent took 400 s to answer: the session is not idle at once.
    s.answered(400_000, "all well", true);
    assert_eq!(s.idle_deadline(), Some(700_000));
    assert!(s.tick(400_001).is_empty());
    // Its write on a slow line ended 50 s later.
    s.shown(450_000);
    assert_eq!(s.idle_deadline(), Some(750_000));
    assert!(s.tick(749_999).is_empty());
    let (text, _) = split(s.tick(750_000));
    assert!(text.contains("session closed after 300 s idle"), "{text:?}");
}

#[test]
fn a_long_line_is_discarded_and_said() {
    let mut s = Session::new(settings(true), COMMANDS);
    let long = [vec![b'a'; 500], b"\r".to_vec()].concat();
    let (text, rest) = type_in(&mut s, 0, &long);
    assert!(text.contains("line too long (over 200 characters), discarded"));
    assert_eq!(rest, [Effect::Record(What::SessionOpened, AuditBy::Anyone)]);
}

#[test]
fn a_lost_line_ends_the_open_session_only() {
    let mut s = Session::new(settings(true), COMMANDS);
    assert!(s.line_lost().is_empty());
    type_in(&mut s, 0, b"\r");
    assert_eq!(
        s.line_lost(),
        [Effect::Record(
            What::SessionClosed {
                why: CloseReason::LineLost,
                logged_in: false
            },
            AuditBy::Anyone
        )]
    );
}

proptest! {
    /// Whatever a line sends: no panic, the session never stuck busy, and
    /// the output bounded by the input (an echo of a few bytes per byte,
    /// the erasing of a whole line, and per line at most the help text
    /// and a greeting).
    #[test]
    fn random_bytes_never_panic_and_the_output_is_bounded(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..40),
        answers_ok in any::<bool>(),
    ) {
        let mut s = Session::new(settings(true), COMMANDS);
        let per_line = 2_000;
        let mut now = 0;
        for chunk in chunks {
            let mut rest: &[u8] = &chunk;
            let lines = chunk.iter().filter(|&&b| b == b'\r' || b == b'\n' || b == 3).count();
            let mut written = 0;
            while !rest.is_empty() {
                let step = s.input(now, rest);
                rest = &rest[step.consumed..];
                let mut effects = step.effects;
                while let Some(e) = effects.pop() {
                    match e {
                        Effect::Write(b) | Effect::WriteWhole(b) => written += b.len(),
                        Effect::Run { .. } => effects.extend(s.answered(now, "ok", answers_ok)),
                        Effect::Verify(pw) => effects.extend(s.verified(now, pw.len() % 2 == 0)),
                        Effect::Record(..) => {}
                    }
                }
            }
            let erase = 3 * super::line::MAX_LINE;
            prop_assert!(written <= 4 * chunk.len() + erase + per_line * lines,
                "{written} bytes for {} in, {lines} lines", chunk.len());
            now += 1_000;
            for e in s.tick(now) {
                if let Effect::Write(b) = e {
                    prop_assert!(b.len() <= per_line);
                }
            }
        }
    }
}

// ------------------------------------------------------------ the shell

/// An agent whose `status` answers a table and whose `clear-leak` says
/// what it did for whom.
struct TestAgent;

impl SerialAgent for TestAgent {
    fn identity(&self) -> Identity {
        Identity {
            program: "test-agent",
            version: "0.0.0",
            role: "unit",
            name: "u1".into(),
            site: "lab".into(),
        }
    }
    fn commands(&self) -> &'static [Spec] {
        COMMANDS
    }
    async fn run(&self, words: &[String], operator: &str) -> Answer {
        match words[0].as_str() {
            "status" => Answer::of(&serde_json::json!({"a": 1}), |v| {
                crate::render::table(&["A"], &[vec![crate::render::text(&v["a"])]])
            }),
            _ => Answer {
                text: format!("{} done by {operator}", words.join(" ")),
                ok: true,
            },
        }
    }
}

/// Reads from `end` until `want` appears (in paused time the reads wait
/// for the shell, not for a clock); everything read.
async fn until(end: &mut tokio::io::DuplexStream, want: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&seen).contains(want) {
        let n = end.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before {want:?}: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(seen).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_shell_runs_a_session_logs_it_and_closes_it_when_idle() {
    let hash = password::hash("right password").unwrap();
    let console = SerialConsole {
        port: "/dev/ttyS1".into(),
        baud: 115_200,
        password_hash: Some(hash),
        idle: Duration::from_secs(60),
    };
    let (agent_end, mut engineer) = tokio::io::duplex(4096);
    let records = Arc::new(Mutex::new(Vec::new()));
    let kept = records.clone();
    let task = tokio::spawn(async move {
        let mut session = new_session(&console, &TestAgent);
        let journal = move |r: Record, _| kept.lock().unwrap().push(r.what);
        let epoch = Instant::now();
        run(
            agent_end,
            (&mut session, &mut password::Checker::default()),
            epoch,
            &console,
            &TestAgent,
            &journal,
        )
        .await
    });
    until(&mut engineer, "u1> ").await;
    engineer.write_all(b"status\r").await.unwrap();
    let text = until(&mut engineer, "u1> ").await;
    assert_eq!(text, "status\r\nA\r\n1\r\nu1> ");
    engineer.write_all(b"login\r").await.unwrap();
    until(&mut engineer, "password: ").await;
    engineer.write_all(b"right password\r\n").await.unwrap();
    until(&mut engineer, "u1# ").await;
    engineer.write_all(b"clear-leak 3\r").await.unwrap();
    let text = until(&mut engineer, "u1# ").await;
    assert!(
        text.contains("clear-leak 3 done by serial-ttyS1\r\n"),
        "{text:?}"
    );
    // Sixty seconds of nothing: logged out.
    let text = until(&mut engineer, "u1> ").await;
    assert!(text.contains("logged out after 60 s idle"), "{text:?}");
    drop(engineer);
    let e = task.await.unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    let records = records.lock().unwrap().clone();
    assert_eq!(
        records,
        [
            What::SessionOpened,
            What::LoginAccepted,
            What::Command {
                line: "clear-leak 3".into(),
                ok: true,
                result: "clear-leak 3 done by serial-ttyS1".into()
            },
            What::SessionClosed {
                why: CloseReason::Idle,
                logged_in: true
            },
        ]
    );
}

/// Types a wrong password at the login prompt of `engineer`'s port and
/// gives the refusal's text.
async fn refused_login(engineer: &mut tokio::io::DuplexStream) -> String {
    engineer.write_all(b"login\r").await.unwrap();
    until(engineer, "password: ").await;
    engineer.write_all(b"wrong password\r").await.unwrap();
    until(engineer, "u1> ").await
}

#[tokio::test(start_paused = true)]
async fn reopening_the_port_neither_lifts_the_login_lock_nor_forgets_the_refusals() {
    let console = SerialConsole {
        port: "/dev/ttyS1".into(),
        baud: 115_200,
        password_hash: Some(password::hash("right password").unwrap()),
        idle: Duration::from_secs(300),
    };
    let journal = |_: Record, _| {};
    let mut session = new_session(&console, &TestAgent);
    let mut checks = password::Checker::default();
    // The console's clock, started long before the port opens.
    let epoch = Instant::now();
    tokio::time::sleep(Duration::from_secs(100)).await;
    let (agent_end, mut engineer) = tokio::io::duplex(4096);
    let first = async {
        until(&mut engineer, "u1> ").await;
        let text = refused_login(&mut engineer).await;
        assert!(
            text.contains("login refused (1 in a row); the next try in 2 s"),
            "{text:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        refused_login(&mut engineer).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let text = refused_login(&mut engineer).await;
        assert!(
            text.contains("(3 in a row); the next try in 8 s"),
            "{text:?}"
        );
        // The line is lost 1 s into the 8 s lock.
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(engineer);
    };
    let line = run(
        agent_end,
        (&mut session, &mut checks),
        epoch,
        &console,
        &TestAgent,
        &journal,
    );
    let (e, ()) = tokio::join!(line, first);
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    // Opened again 5 s later: 2 s of the lock are left, and the count
    // goes on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (agent_end, mut engineer) = tokio::io::duplex(4096);
    let second = async {
        until(&mut engineer, "u1> ").await;
        engineer.write_all(b"login\r").await.unwrap();
        until(&mut engineer, "password: ").await;
        engineer.write_all(b"right password\r").await.unwrap();
        let text = until(&mut engineer, "u1> ").await;
        assert!(
            text.contains("login refused: wait 2 s (3 refused in a row)"),
            "{text:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let text = refused_login(&mut engineer).await;
        assert!(
            text.contains("(4 in a row); the next try in 16 s"),
            "{text:?}"
        );
        drop(engineer);
    };
    let line = run(
        agent_end,
        (&mut session, &mut checks),
        epoch,
        &console,
        &TestAgent,
        &journal,
    );
    let (e, ()) = tokio::join!(line, second);
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
}

#[test]
fn operators_are_named_after_the_device() {
    assert_eq!(operator_name(Path::new("/dev/ttyS1")), "serial-ttyS1");
    assert_eq!(operator_name(Path::new("/dev/ttyUSB0")), "serial-ttyUSB0");
    assert_eq!(operator_name(Path::new("/")), "serial");
    let long = operator_name(Path::new(
        "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0",
    ));
    assert!(long.len() <= 32, "{long}");
}

#[test]
fn the_banner_names_the_program_its_version_what_it_runs_and_the_site() {
    assert_eq!(
        TestAgent.identity().banner(),
        "Loopwarden test-agent 0.0.0, unit u1 of site lab"
    );
}

#[tokio::test]
async fn a_command_line_is_refused_answered_or_an_error_as_ctl_prints_it() {
    let render = |req: &u8, v: &Value| format!("{req}: {}", v["a"]);
    let refused = Answer::asked(
        Err::<u8, _>("usage: x".into()),
        |_| async { serde_json::json!({}) },
        render,
    )
    .await;
    assert_eq!(refused, Answer::refused("usage: x"));
    let answered = Answer::asked(
        Ok(7u8),
        |r| async move { serde_json::json!({ "a": r * 2 }) },
        render,
    )
    .await;
    let want = Answer {
        text: "7: 14".into(),
        ok: true,
    };
    assert_eq!(answered, want);
    let failed = Answer::asked(
        Ok(1u8),
        |_| async { serde_json::json!({"error": "no such rack"}) },
        render,
    )
    .await;
    let want = Answer {
        text: "error: no such rack".into(),
        ok: false,
    };
    assert_eq!(failed, want);
}

mod slow_line;
mod unkept;

//! An audit record the flash log did not take is said, with its JSON and
//! its port: the first of a burst whole, the burst's count when records
//! are kept again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::super::record::{Record, What};
use super::super::*;
use super::{settings, type_in, COMMANDS};
use loopwarden_store::recorder::AuditBy;

fn refused(n: usize) -> Record {
    Record {
        port: "/dev/ttyS1".into(),
        what: What::Command {
            line: format!("clear-leak {n}"),
            ok: false,
            result: "log in first".into(),
        },
    }
}

#[test]
fn a_record_the_flash_log_does_not_take_is_said_with_its_json_and_port() {
    // Records 1 to 4 of 0..6 are not taken.
    let handed = Arc::new(AtomicUsize::new(0));
    let said = Arc::new(Mutex::new(Vec::<String>::new()));
    let j = {
        let (handed, said) = (handed.clone(), said.clone());
        journal(
            move |_, _body| !(1..=4).contains(&handed.fetch_add(1, Ordering::Relaxed)),
            move |line| said.lock().unwrap().push(line),
        )
    };
    for n in 0..6 {
        j(refused(n), AuditBy::Anyone);
    }
    assert_eq!(handed.load(Ordering::Relaxed), 6);
    let said = said.lock().unwrap();
    assert_eq!(said.len(), 2, "{said:?}");
    let first = String::from_utf8(refused(1).encode()).unwrap();
    assert!(said[0].contains("/dev/ttyS1"), "{}", said[0]);
    assert!(said[0].contains(&first), "the record whole: {}", said[0]);
    assert!(
        said[1].contains("4 audit records"),
        "the burst counted: {}",
        said[1]
    );
}

#[test]
fn one_record_not_taken_is_said_once() {
    let handed = AtomicUsize::new(0);
    let said = Arc::new(Mutex::new(Vec::<String>::new()));
    let j = {
        let said = said.clone();
        journal(
            move |_, _body| handed.fetch_add(1, Ordering::Relaxed) != 1,
            move |line| said.lock().unwrap().push(line),
        )
    };
    for n in 0..4 {
        j(refused(n), AuditBy::Anyone);
    }
    assert_eq!(said.lock().unwrap().len(), 1);
}

/// Who caused each record goes to the flash log with it, so that a flood
/// of records anyone at the port can cause cannot push out a logged-in
/// operator's.
#[test]
fn records_go_to_the_journal_with_who_caused_them() {
    let by = Arc::new(Mutex::new(Vec::new()));
    let j = {
        let by = by.clone();
        journal(
            move |who, _body| {
                by.lock().unwrap().push(who);
                true
            },
            |_| {},
        )
    };
    j(refused(0), AuditBy::Anyone);
    j(refused(1), AuditBy::Operator);
    assert_eq!(*by.lock().unwrap(), [AuditBy::Anyone, AuditBy::Operator]);
}

/// The records a session's effects carry, with who caused them.
fn records(effects: Vec<Effect>) -> Vec<(What, AuditBy)> {
    effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::Record(what, by) => Some((what, by)),
            _ => None,
        })
        .collect()
}

/// Who caused a record is the session's login when it was made, not
/// whether the command did what was asked: a logged-in operator's
/// state-changing command answered not ok (or not answered in time: it
/// may well have taken effect) or stopped by Ctrl-C is the operator's;
/// what a session not logged in does is anyone's.
#[test]
fn a_logged_in_operators_command_not_ok_is_the_operators_and_a_refused_one_anyones() {
    use super::super::record::CloseReason;
    use AuditBy::{Anyone, Operator};
    let mut s = Session::new(settings(true), COMMANDS);
    let (_, rest) = type_in(&mut s, 0, b"clear-leak 3\r");
    let refused = records(rest);
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0], (What::SessionOpened, Anyone));
    assert!(
        matches!(&refused[1], (What::Command { ok: false, .. }, Anyone)),
        "{refused:?}"
    );
    type_in(&mut s, 10, b"login\r");
    type_in(&mut s, 20, b"wrong\r");
    let wrong = records(s.verified(30, false));
    assert!(matches!(wrong[..], [(What::LoginRefused { .. }, Anyone)]));
    type_in(&mut s, 2_100, b"login\r");
    type_in(&mut s, 2_200, b"right\r");
    assert_eq!(
        records(s.verified(2_300, true)),
        [(What::LoginAccepted, Operator)]
    );
    type_in(&mut s, 2_400, b"clear-leak 3\r");
    let unanswered = records(s.answered(2_500, "no answer in time", false));
    assert!(
        matches!(
            &unanswered[..],
            [(What::Command { ok: false, .. }, Operator)]
        ),
        "{unanswered:?}"
    );
    type_in(&mut s, 2_600, b"clear-leak 4\r");
    let not_run = records(s.not_run(2_700));
    assert!(
        matches!(&not_run[..], [(What::Command { ok: false, .. }, Operator)]),
        "{not_run:?}"
    );
    let (_, rest) = type_in(&mut s, 2_800, b"logout\r");
    assert_eq!(
        records(rest),
        [(
            What::SessionClosed {
                why: CloseReason::Logout,
                logged_in: true
            },
            Operator
        )]
    );
    type_in(&mut s, 2_900, b"status\r");
    assert_eq!(
        records(s.line_lost()),
        [(
            What::SessionClosed {
                why: CloseReason::LineLost,
                logged_in: false
            },
            Anyone
        )]
    );
}

//! An audit record the flash log did not take is said, with its JSON and
//! its port: the first of a burst whole, the burst's count when records
//! are kept again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::super::record::{Record, What};
use super::super::*;

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
        j(refused(n));
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
        j(refused(n));
    }
    assert_eq!(said.lock().unwrap().len(), 1);
}

/// Records anyone at the port can cause go to the flash log as such,
/// so that a flood of them cannot push out a logged-in operator's.
#[test]
fn records_of_someone_not_logged_in_are_handed_over_as_anyones() {
    use super::super::record::CloseReason;
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
    let record = |what| Record {
        port: "/dev/ttyS1".into(),
        what,
    };
    let closed = |logged_in| What::SessionClosed {
        why: CloseReason::Logout,
        logged_in,
    };
    j(record(What::SessionOpened));
    j(record(What::LoginRefused { in_a_row: 1 }));
    j(refused(0));
    j(record(closed(false)));
    j(record(What::LoginAccepted));
    j(record(What::Command {
        line: "clear-leak 3".into(),
        ok: true,
        result: "leak on rack 3 cleared".into(),
    }));
    j(record(closed(true)));
    use loopwarden_store::recorder::AuditBy::{Anyone, Operator};
    let by = by.lock().unwrap();
    assert_eq!(
        *by,
        [Anyone, Anyone, Anyone, Anyone, Operator, Operator, Operator]
    );
}

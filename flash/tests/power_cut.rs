//! Power cuts at a random byte, thousands of times: the log, the outbox
//! and the config store (where the cooling controller keeps its latched
//! state) are re-opened after each cut and checked against a simple model.
//!
//! The model's rules, for a cut during operation `k`:
//! - every record or entry whose write completed before `k` is present and
//!   intact, unless the store says it dropped it (a wrap marker, a drop
//!   count) or an acknowledgement completed before `k` removed it;
//! - the record or entry being written during `k` is present and intact,
//!   or absent; nothing else appears;
//! - sequence numbers never go backwards, and the store stays writable.
//!
//! `LOOPWARDEN_POWER_CUT_CASES` sets the number of random sequences
//! (default 10,000 for each store).

use std::collections::BTreeMap;

use futures::executor::block_on;
use loopwarden_flash::log::WRAPPED;
use loopwarden_flash::outbox::OutboxLayout;
use loopwarden_flash::{
    Class, ConfigStore, Entry, EventLog, Outbox, SimFlash, StoreError, Wrapped,
};
use loopwarden_protocol::TimestampMs;
use proptest::prelude::*;

type Flash = SimFlash<4, 256>;
const LOG_SECTORS: usize = 4;

fn cases() -> u32 {
    std::env::var("LOOPWARDEN_POWER_CUT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

#[derive(Debug, Clone)]
enum LogOp {
    Append { len: usize, fill: u8 },
    Reopen,
}

fn log_op() -> impl Strategy<Value = LogOp> {
    prop_oneof![
        9 => (0usize..70, any::<u8>()).prop_map(|(len, fill)| LogOp::Append { len, fill }),
        1 => Just(LogOp::Reopen),
    ]
}

fn is_cut<E: std::fmt::Debug>(e: &StoreError<E>) -> bool {
    matches!(e, StoreError::Flash(_))
}

fn check_log(ops: Vec<LogOp>, cut_after: u64) -> Result<(), TestCaseError> {
    block_on(async {
        let range = 0..(LOG_SECTORS * 256) as u32;
        let mut flash = Flash::new(LOG_SECTORS);
        flash.cut_power_after(cut_after);
        let mut completed: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut in_flight: Option<Vec<u8>> = None;
        let mut last_seq: Option<u32> = None;
        let mut log = match EventLog::open(flash, range.clone()).await {
            Ok(l) => Some(l),
            Err(e) => {
                prop_assert!(is_cut(&e), "{e}");
                None
            }
        };
        // Run until the power goes (or the ops end).
        if let Some(mut l) = log.take() {
            let mut cut = false;
            for (i, op) in ops.iter().enumerate() {
                match op {
                    LogOp::Append { len, fill } => {
                        let body = vec![*fill; *len];
                        match l.append(TimestampMs(i as u64), 3, &body).await {
                            Ok(seq) => {
                                prop_assert!(
                                    last_seq.is_none_or(|s| seq > s),
                                    "seq went back: {seq} after {last_seq:?}"
                                );
                                last_seq = Some(seq);
                                completed.insert(seq, body);
                            }
                            Err(e) => {
                                prop_assert!(is_cut(&e), "{e}");
                                in_flight = Some(body);
                                cut = true;
                            }
                        }
                    }
                    LogOp::Reopen => {
                        let flash = l.into_flash();
                        match EventLog::open(flash, range.clone()).await {
                            Ok(reopened) => {
                                prop_assert!(last_seq.is_none_or(|s| reopened.next_seq() > s));
                                l = reopened;
                            }
                            Err(e) => {
                                prop_assert!(is_cut(&e), "{e}");
                                return check_log_after(
                                    None, completed, in_flight, last_seq, range,
                                )
                                .await;
                            }
                        }
                    }
                }
                if cut {
                    break;
                }
            }
            return check_log_after(Some(l), completed, in_flight, last_seq, range).await;
        }
        Ok(())
    })
}

async fn check_log_after(
    log: Option<EventLog<Flash>>,
    completed: BTreeMap<u32, Vec<u8>>,
    in_flight: Option<Vec<u8>>,
    last_seq: Option<u32>,
    range: std::ops::Range<u32>,
) -> Result<(), TestCaseError> {
    let Some(log) = log else { return Ok(()) };
    let mut flash = log.into_flash();
    flash.restore_power();
    let mut log = EventLog::open(flash, range)
        .await
        .map_err(|e| TestCaseError::fail(format!("re-open after the cut: {e}")))?;
    let mut seen: Vec<(u32, u8, Vec<u8>)> = Vec::new();
    log.for_each(|r| seen.push((r.seq, r.kind, r.body.to_vec())))
        .await
        .unwrap();
    // A cut leaves no gap in the numbers (the record it cut gives its
    // number to the next): a gap is damage, not a cut.
    prop_assert_eq!(log.damaged(), None);
    // Nothing that was never written; everything intact; order by seq.
    prop_assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "out of order: {:?}",
        seen.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    let mut markers = 0;
    for (seq, kind, body) in &seen {
        if *kind == WRAPPED {
            let w = Wrapped::decode(body);
            prop_assert!(
                w.is_some_and(|w| w.lost > 0 && w.first_seq <= w.last_seq),
                "bad marker {body:?}"
            );
            markers += 1;
            continue;
        }
        match completed.get(seq) {
            Some(b) => prop_assert_eq!(b, body, "record {} damaged", seq),
            None => prop_assert!(
                in_flight.as_ref() == Some(body) && last_seq.is_none_or(|s| *seq > s),
                "record {} was never written",
                seq
            ),
        }
    }
    // Completed records are there, or lost to a wrap that says so (only the
    // oldest go; the one unmarked window is a cut during a wrapping append).
    let oldest_data = seen.iter().filter(|s| s.1 != WRAPPED).map(|s| s.0).min();
    for seq in completed.keys() {
        if seen.iter().any(|s| s.0 == *seq) {
            continue;
        }
        prop_assert!(
            oldest_data.is_none_or(|o| *seq < o),
            "record {seq} lost but newer ones kept"
        );
        prop_assert!(
            markers > 0 || in_flight.is_some(),
            "record {seq} lost without a wrap marker"
        );
    }
    // Numbers never go back, and the log stays writable.
    prop_assert!(last_seq.is_none_or(|s| log.next_seq() > s));
    let next = log.append(TimestampMs(u64::MAX), 3, b"after the cut").await;
    prop_assert!(
        next.is_ok(),
        "not writable after the cut: {:?}",
        next.err().map(|e| e.to_string())
    );
    Ok(())
}

#[derive(Debug, Clone)]
enum BoxOp {
    Push { class: u8, len: usize, fill: u8 },
    Ack { pick: usize },
    Reopen,
}

fn box_op() -> impl Strategy<Value = BoxOp> {
    prop_oneof![
        6 => (0u8..3, 0usize..60, any::<u8>()).prop_map(|(class, len, fill)| BoxOp::Push { class, len, fill }),
        3 => any::<usize>().prop_map(|pick| BoxOp::Ack { pick }),
        1 => Just(BoxOp::Reopen),
    ]
}

fn layout() -> OutboxLayout {
    OutboxLayout {
        telemetry: 0..512,
        normal: 512..1024,
        critical: 1024..1536,
    }
}

fn class_of(c: u8) -> Class {
    [Class::Telemetry, Class::Normal, Class::Critical][c as usize % 3]
}

const TOPIC: &str = "dc/v2/s/host/h1/event";

/// What the model expects of one entry.
#[derive(Debug, Clone, PartialEq)]
struct Expect {
    class: Class,
    payload: Vec<u8>,
    /// May be missing after the cut (in flight, or dropped or acknowledged
    /// by the operation the power cut).
    optional: bool,
}

fn check_outbox(ops: Vec<BoxOp>, cut_after: u64) -> Result<(), TestCaseError> {
    block_on(async {
        let mut flash = Flash::new(6);
        flash.cut_power_after(cut_after);
        let mut model: BTreeMap<u32, Expect> = BTreeMap::new();
        let mut next_seq = 0u32;
        let Ok(mut outbox) = Outbox::open(flash, layout()).await else {
            return Ok(());
        };
        'ops: for op in &ops {
            match op {
                BoxOp::Push { class, len, fill } => {
                    let class = class_of(*class);
                    let payload = vec![*fill; *len];
                    let seq = next_seq;
                    next_seq += 1;
                    let entry = Entry {
                        seq,
                        class,
                        topic: TOPIC,
                        payload: &payload,
                    };
                    match outbox.push(&entry).await {
                        Ok(d) => {
                            prop_assert!(class != Class::Critical || d.count == 0);
                            // The oldest of its class went.
                            let victims: Vec<u32> = model
                                .iter()
                                .filter(|(_, e)| e.class == class)
                                .map(|(s, _)| *s)
                                .take(d.count as usize)
                                .collect();
                            for v in victims {
                                model.remove(&v);
                            }
                            model.insert(
                                seq,
                                Expect {
                                    class,
                                    payload,
                                    optional: false,
                                },
                            );
                        }
                        Err(StoreError::Full) => prop_assert_eq!(class, Class::Critical),
                        Err(e) => {
                            prop_assert!(is_cut(&e), "{e}");
                            // Anything of its class may have been dropped to make room.
                            for e in model.values_mut().filter(|e| e.class == class) {
                                e.optional = true;
                            }
                            model.insert(
                                seq,
                                Expect {
                                    class,
                                    payload,
                                    optional: true,
                                },
                            );
                            break 'ops;
                        }
                    }
                }
                BoxOp::Ack { pick } => {
                    let present: Vec<u32> = model.keys().copied().collect();
                    if present.is_empty() {
                        continue;
                    }
                    let seq = present[pick % present.len()];
                    match outbox.ack(seq).await {
                        Ok(found) => {
                            prop_assert!(found, "entry {} not found to acknowledge", seq);
                            model.remove(&seq);
                        }
                        Err(e) => {
                            prop_assert!(is_cut(&e), "{e}");
                            model.get_mut(&seq).unwrap().optional = true;
                            break 'ops;
                        }
                    }
                }
                BoxOp::Reopen => {
                    let flash = outbox.into_flash();
                    match Outbox::open(flash, layout()).await {
                        Ok(o) => outbox = o,
                        Err(e) => {
                            prop_assert!(is_cut(&e), "{e}");
                            return Ok(());
                        }
                    }
                }
            }
        }
        let mut flash = outbox.into_flash();
        flash.restore_power();
        let mut outbox = Outbox::open(flash, layout())
            .await
            .map_err(|e| TestCaseError::fail(format!("re-open after the cut: {e}")))?;
        let mut seen: Vec<(u32, Class, Vec<u8>)> = Vec::new();
        outbox
            .for_each(|e| seen.push((e.seq, e.class, e.payload.to_vec())))
            .await
            .unwrap();
        prop_assert!(
            seen.windows(2).all(|w| w[0].0 < w[1].0),
            "not in sequence order"
        );
        for (seq, class, payload) in &seen {
            let Some(e) = model.get(seq) else {
                return Err(TestCaseError::fail(format!(
                    "entry {seq} appeared but was never written or was acknowledged"
                )));
            };
            prop_assert_eq!(e.class, *class);
            prop_assert_eq!(&e.payload, payload, "entry {} damaged", seq);
        }
        for (seq, e) in &model {
            prop_assert!(
                e.optional || seen.iter().any(|s| s.0 == *seq),
                "entry {} ({:?}) lost",
                seq,
                e.class
            );
        }
        let after = Entry {
            seq: next_seq + 1,
            class: Class::Normal,
            topic: TOPIC,
            payload: b"after",
        };
        prop_assert!(
            outbox.push(&after).await.is_ok(),
            "not writable after the cut"
        );
        Ok(())
    })
}

/// Writes `values` in turn under one key with the power cut after
/// `cut_after` bytes, then reopens: the key holds the last value whose
/// write completed, or the one being written; and the store takes a new
/// value.
fn check_config(values: Vec<[u8; 16]>, cut_after: u64) -> Result<(), TestCaseError> {
    block_on(async {
        let mut flash = Flash::new(4);
        flash.cut_power_after(cut_after);
        let Ok(mut store) = ConfigStore::open(flash, 0..1024) else {
            return Ok(());
        };
        let mut done: Option<[u8; 16]> = None;
        let mut in_flight = None;
        for v in &values {
            match store.set("cdu.latched", v).await {
                Ok(()) => done = Some(*v),
                Err(e) if is_cut(&e) => {
                    in_flight = Some(*v);
                    break;
                }
                Err(e) => return Err(TestCaseError::fail(format!("set: {e:?}"))),
            }
        }
        let mut flash = store.into_flash();
        flash.restore_power();
        let mut store = ConfigStore::open(flash, 0..1024)
            .map_err(|e| TestCaseError::fail(format!("reopen: {e:?}")))?;
        let mut out = [0u8; 64];
        let got = store
            .get("cdu.latched", &mut out)
            .await
            .map_err(|e| TestCaseError::fail(format!("get: {e:?}")))?
            .map(|n| out[..n].to_vec());
        let ok = got.as_deref() == done.as_ref().map(|d| &d[..])
            || (in_flight.is_some() && got.as_deref() == in_flight.as_ref().map(|d| &d[..]));
        prop_assert!(
            ok,
            "after the cut: {got:?}; completed {done:?}, in flight {in_flight:?}"
        );
        prop_assert!(
            store.set("cdu.latched", &[7u8; 16]).await.is_ok(),
            "not writable after the cut"
        );
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_config_store_survives_power_cuts(
        values in proptest::collection::vec(any::<[u8; 16]>(), 1..40),
        cut_after in 0u64..4000,
    ) {
        check_config(values, cut_after)?;
    }

    #[test]
    fn log_survives_power_cuts(ops in proptest::collection::vec(log_op(), 1..60), cut_after in 0u64..6000) {
        check_log(ops, cut_after)?;
    }

    #[test]
    fn outbox_survives_power_cuts(ops in proptest::collection::vec(box_op(), 1..60), cut_after in 0u64..5000) {
        check_outbox(ops, cut_after)?;
    }
}

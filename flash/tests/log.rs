//! The event log: order, sequence numbers across restarts, wrap markers.

use futures::executor::block_on;
use loopwarden_flash::log::WRAPPED;
use loopwarden_flash::{EventLog, SimFlash, Wrapped};
use loopwarden_protocol::TimestampMs;

type Flash = SimFlash<4, 1024>;

async fn records(log: &mut EventLog<Flash>) -> Vec<(u32, u8, Vec<u8>)> {
    let mut out = Vec::new();
    log.for_each(|r| out.push((r.seq, r.kind, r.body.to_vec())))
        .await
        .unwrap();
    out
}

#[test]
fn appends_in_order_and_numbers_survive_a_restart() {
    block_on(async {
        let mut log = EventLog::open(Flash::new(4), 0..4096).await.unwrap();
        assert_eq!(log.next_seq(), 0);
        for i in 0..5u8 {
            assert_eq!(
                log.append(TimestampMs(1000 + i as u64), 3, &[i; 10])
                    .await
                    .unwrap(),
                i as u32
            );
        }
        let flash = log.into_flash();
        let mut log = EventLog::open(flash, 0..4096).await.unwrap();
        assert_eq!(log.next_seq(), 5, "numbering goes on after a restart");
        assert_eq!(log.append(TimestampMs(2000), 3, b"after").await.unwrap(), 5);
        let got = records(&mut log).await;
        assert_eq!(got.len(), 6);
        assert_eq!(
            got.iter().map(|r| r.0).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        assert_eq!(got[5].2, b"after");
        assert_eq!(log.damaged(), None, "no record missing");
    });
}

#[test]
fn a_full_log_recycles_its_oldest_records_and_says_how_many() {
    block_on(async {
        let mut log = EventLog::open(Flash::new(3), 0..3 * 1024).await.unwrap();
        for i in 0..200u32 {
            log.append(TimestampMs(i as u64), 3, &i.to_le_bytes().repeat(8))
                .await
                .unwrap();
        }
        let got = records(&mut log).await;
        let markers: Vec<Wrapped> = got
            .iter()
            .filter(|r| r.1 == WRAPPED)
            .map(|r| Wrapped::decode(&r.2).unwrap())
            .collect();
        assert!(
            !markers.is_empty(),
            "no wrap marker after 200 records in 3 KiB"
        );
        // Every sequence number is either still there or accounted for by a
        // marker still in the log or lost with one (only the newest markers
        // survive, so check what they say is consistent).
        // Only the oldest go: no gap in the numbers.
        assert_eq!(log.damaged(), None);
        let seqs: Vec<u32> = got.iter().map(|r| r.0).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        for m in &markers {
            assert_eq!(m.lost, m.last_seq - m.first_seq + 1, "{m:?}");
        }
        // The newest data records are intact.
        let last = got.iter().rev().find(|r| r.1 == 3).unwrap();
        assert_eq!(last.2, 199u32.to_le_bytes().repeat(8));
        // The marker right before the surviving records accounts for the gap.
        let first_data = got.iter().find(|r| r.1 == 3).unwrap().0;
        let newest_marker = markers.last().unwrap();
        assert!(newest_marker.last_seq < first_data || markers.len() > 1);
    });
}

#[test]
fn too_large_a_body_is_refused() {
    block_on(async {
        let mut log = EventLog::open(Flash::new(2), 0..2048).await.unwrap();
        let body = vec![0u8; 4000];
        assert!(log.append(TimestampMs(0), 3, &body).await.is_err());
        assert_eq!(
            log.append(TimestampMs(0), 3, b"ok").await.unwrap(),
            0,
            "still writable"
        );
    });
}

#[test]
fn a_damaged_record_is_skipped_never_returned_and_the_log_stays_writable() {
    block_on(async {
        let mut log = EventLog::open(Flash::new(4), 0..4096).await.unwrap();
        for i in 0..6u8 {
            log.append(TimestampMs(i as u64), 3, &[0xA0 | i; 32])
                .await
                .unwrap();
        }
        let mut flash = log.into_flash();
        // Clear some bits in the middle of the third record's body (a NOR
        // bit can only go 1 -> 0 by itself): find it by its fill byte.
        let bytes = flash.bytes_mut();
        let at = bytes
            .windows(32)
            .position(|w| w.iter().all(|b| *b == 0xA2))
            .unwrap();
        bytes[at + 10] &= 0x0F;
        let mut log = EventLog::open(flash, 0..4096).await.unwrap();
        let got = records(&mut log).await;
        let bodies: Vec<u8> = got.iter().map(|r| r.2[0]).collect();
        assert!(
            !bodies.contains(&0xA2),
            "a damaged record was returned as data: {bodies:x?}"
        );
        assert!(
            got.iter().all(|r| r.2.iter().all(|b| *b == r.2[0])),
            "damaged bytes returned"
        );
        assert_eq!(bodies, [0xA0, 0xA1, 0xA3, 0xA4, 0xA5]);
        // Not silently: the gap in the numbers says which record went.
        let damaged = log.damaged().expect("the damaged record is said");
        assert_eq!(
            (damaged.records, damaged.first_seq, damaged.last_seq),
            (1, 2, 2)
        );
        assert_eq!(damaged.to_string(), "record #2 is damaged and unreadable");
        assert_eq!(
            log.append(TimestampMs(9), 3, b"still writable")
                .await
                .unwrap(),
            6
        );
    });
}

/// After the log wrapped, every sector is closed but the one being
/// written; damage to that one (zeroed, or garbage) made all of them read
/// closed and the store refused the whole log. The damaged sector alone
/// is erased, said, and the other sectors' records read.
#[test]
fn a_damaged_sector_loses_only_its_own_records() {
    for damage in [0x00u8, 0x5A] {
        block_on(async {
            // Three sectors of 1 KiB: 15 records of 53 bytes fill one.
            let mut log = EventLog::open(Flash::new(3), 0..3072).await.unwrap();
            for i in 0..70u32 {
                log.append(TimestampMs(u64::from(i)), 3, &i.to_le_bytes().repeat(10))
                    .await
                    .unwrap();
            }
            assert!(log.wraps() > 0, "the log wrapped");
            let before = records(&mut log).await;
            let mut flash = log.into_flash();
            let bytes = flash.bytes_mut();
            let newest = 69u32.to_le_bytes().repeat(10);
            let at = bytes.windows(40).position(|w| w == newest).unwrap();
            let sector = at / 1024 * 1024;
            let lost: Vec<u32> = before
                .iter()
                .filter(|r| {
                    let body = r.2.as_slice();
                    let hit = bytes.windows(body.len()).position(|w| w == body);
                    hit.is_some_and(|p| p / 1024 * 1024 == sector)
                })
                .map(|r| r.0)
                .collect();
            assert!(!lost.is_empty() && lost.len() < before.len());
            bytes[sector..sector + 1024].fill(damage);
            let mut log = EventLog::open(flash, 0..3072)
                .await
                .expect("the log opens without its damaged sector");
            assert_eq!(log.salvaged(), Some(sector as u32), "damage {damage:#x}");
            let got = records(&mut log).await;
            let kept: Vec<_> = before.iter().filter(|r| !lost.contains(&r.0)).collect();
            assert_eq!(got.iter().collect::<Vec<_>>(), kept, "damage {damage:#x}");
            // Writable again, and what it writes reads after a restart.
            let seq = log.append(TimestampMs(99), 3, b"after").await.unwrap();
            let mut log = EventLog::open(log.into_flash(), 0..3072).await.unwrap();
            assert_eq!(log.salvaged(), None, "nothing left to erase");
            let got = records(&mut log).await;
            assert_eq!(got.last().unwrap(), &(seq, 3, b"after".to_vec()));
        });
    }
}

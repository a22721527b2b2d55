//! The outbox: kept until acknowledged, resent in order, and when full the
//! cheapest entries go first, never a critical one.

use futures::executor::block_on;
use loopwarden_flash::outbox::OutboxLayout;
use loopwarden_flash::{Class, ConfigStore, Entry, Outbox, SimFlash, StoreError};
use loopwarden_protocol::{
    samples, CoolingStep, Event, GpuIndex, HealthState, Ident, Message, MessageKind, Pump,
    RackIndex, ReasonCode,
};

type Flash = SimFlash<4, 1024>;

/// Two sectors per class.
fn layout() -> OutboxLayout {
    OutboxLayout {
        telemetry: 0..2048,
        normal: 2048..4096,
        critical: 4096..6144,
    }
}

fn entry(seq: u32, class: Class, payload: &[u8]) -> Entry<'_> {
    Entry {
        seq,
        class,
        topic: "dc/v2/s/host/h1/event",
        payload,
    }
}

async fn seqs(o: &mut Outbox<Flash>) -> Vec<(u32, Class)> {
    let mut v = Vec::new();
    o.for_each(|e| v.push((e.seq, e.class))).await.unwrap();
    v
}

#[test]
fn entries_stay_until_acknowledged_and_survive_a_restart() {
    block_on(async {
        let mut o = Outbox::open(Flash::new(6), layout()).await.unwrap();
        for seq in 10..15 {
            let class = if seq == 11 {
                Class::Critical
            } else {
                Class::Normal
            };
            o.push(&entry(seq, class, &[seq as u8; 40])).await.unwrap();
        }
        assert!(o.ack(12).await.unwrap());
        assert!(!o.ack(12).await.unwrap(), "acknowledged once only");
        let mut o = Outbox::open(o.into_flash(), layout()).await.unwrap();
        assert_eq!(
            seqs(&mut o).await.iter().map(|e| e.0).collect::<Vec<_>>(),
            [10, 11, 13, 14],
            "in order across classes, without the acknowledged one"
        );
        let mut payloads = Vec::new();
        o.for_each(|e| payloads.push(e.payload.to_vec()))
            .await
            .unwrap();
        assert_eq!(payloads[2], vec![13u8; 40]);
    });
}

#[test]
fn a_flood_of_cheap_entries_never_crowds_out_a_critical_one() {
    block_on(async {
        let mut o = Outbox::open(Flash::new(6), layout()).await.unwrap();
        let body = [7u8; 150];
        o.push(&entry(0, Class::Critical, &body)).await.unwrap();
        o.push(&entry(1, Class::Normal, &body)).await.unwrap();
        // A long outage: 500 telemetry-class entries pile up.
        let mut dropped = 0;
        for seq in 2..502 {
            let d = o.push(&entry(seq, Class::Telemetry, &body)).await.unwrap();
            if d.count > 0 {
                assert_eq!(d.worst, Some(Class::Telemetry));
            }
            dropped += d.count;
        }
        assert!(
            dropped > 400,
            "the telemetry part should have recycled, dropped {dropped}"
        );
        let left = seqs(&mut o).await;
        assert_eq!(left[0], (0, Class::Critical), "{left:?}");
        assert_eq!(left[1], (1, Class::Normal), "{left:?}");
        assert_eq!(left.last().unwrap().0, 501, "the newest telemetry is kept");
        assert!(
            left.windows(2).all(|w| w[0].0 < w[1].0),
            "in sequence order"
        );
        // The critical part refuses rather than drops.
        let mut seq = 1000;
        let refused = loop {
            match o.push(&entry(seq, Class::Critical, &body)).await {
                Ok(d) => assert_eq!(d.count, 0, "a critical push dropped something"),
                Err(StoreError::Full) => break true,
                Err(e) => panic!("{e}"),
            }
            seq += 1;
            if seq > 1100 {
                break false;
            }
        };
        assert!(refused, "critical part never filled");
        let critical: Vec<u32> = seqs(&mut o)
            .await
            .iter()
            .filter(|e| e.1 == Class::Critical)
            .map(|e| e.0)
            .collect();
        assert_eq!(critical[0], 0);
        assert_eq!(
            critical.len() as u32,
            1 + (seq - 1000),
            "every critical entry accepted is kept"
        );
    });
}

#[test]
fn classes_follow_what_must_never_be_lost() {
    let gpu = GpuIndex::new(1).unwrap();
    let quarantine = Message::Event(Event::HealthChanged {
        gpu,
        from: HealthState::Healthy,
        to: HealthState::Quarantined,
        reason: ReasonCode::xid(79).unwrap(),
    });
    assert_eq!(Class::of(&quarantine), Class::Critical);
    assert_eq!(
        Class::of(&Message::Event(Event::Xid { gpu, xid: 13 })),
        Class::Normal
    );
    assert_eq!(
        Class::of(&samples::message(MessageKind::HostHealth)),
        Class::Critical
    );
    // The loop's faults a person must act on, and a person's acts on it,
    // are never dropped; a sensor's faults, which can repeat through an
    // outage, are.
    let rack = RackIndex::new(2).unwrap();
    for critical in [
        Event::IsolationFailed { rack, active: true },
        Event::PumpSeized {
            pump: Pump::A,
            lag_started: true,
        },
        Event::OperatorCleared {
            rack: Some(rack),
            pump: None,
            operator: Ident::new("uid-0").unwrap(),
        },
        Event::CoolingAction {
            step: CoolingStep::PowerDown,
            ok: true,
            exit_code: Some(0),
        },
    ] {
        assert_eq!(
            Class::of(&Message::Event(critical.clone())),
            Class::Critical,
            "{critical:?}"
        );
    }
    assert_eq!(
        Class::of(&Message::Event(Event::LeakSensing { rack, lost: true })),
        Class::Normal
    );
    assert_eq!(
        Class::of(&samples::message(MessageKind::Online)),
        Class::Telemetry
    );
    assert_eq!(
        Class::of(&samples::message(MessageKind::Ack)),
        Class::Normal
    );
}

#[test]
fn config_keeps_values_and_sequence_reservations_only_rise() {
    block_on(async {
        let mut c = ConfigStore::open(Flash::new(2), 0..2048).unwrap();
        let mut out = [0u8; 16];
        assert_eq!(c.get("guard.max_c", &mut out).await.unwrap(), None);
        c.set("guard.max_c", b"85").await.unwrap();
        c.set("guard.max_c", b"83").await.unwrap();
        assert_eq!(c.get("guard.max_c", &mut out).await.unwrap(), Some(2));
        assert_eq!(&out[..2], b"83");
        assert_eq!(c.reserve_seq(1000).await.unwrap(), 0);
        assert_eq!(c.reserve_seq(1000).await.unwrap(), 1000);
        let mut c = ConfigStore::open(c.into_flash(), 0..2048).unwrap();
        assert_eq!(
            c.reserve_seq(1000).await.unwrap(),
            2000,
            "a restart never reuses a block"
        );
        c.remove("guard.max_c").await.unwrap();
        assert_eq!(c.get("guard.max_c", &mut out).await.unwrap(), None);
        assert!(
            c.set(&"k".repeat(40), b"x").await.is_err(),
            "key too long is refused"
        );
        // Many updates wrap the store without losing the latest values.
        for i in 0..500u32 {
            c.set("counter", &i.to_le_bytes()).await.unwrap();
        }
        assert_eq!(c.get("counter", &mut out).await.unwrap(), Some(4));
        assert_eq!(u32::from_le_bytes(out[..4].try_into().unwrap()), 499);
        assert_eq!(c.reserve_seq(1000).await.unwrap(), 3000);
    });
}

/// A floor within a block of the top: the reservation says the numbers
/// are used up, naming the floor and what to do, not a bad value; the
/// floor stays where it was, and a block that fits is still given.
#[test]
fn a_reservation_past_the_last_number_says_the_numbers_are_used_up() {
    block_on(async {
        let mut c = ConfigStore::open(Flash::new(2), 0..2048).unwrap();
        let floor = u32::MAX - 5;
        c.raise_seq_floor(floor).await.unwrap();
        let e = c.reserve_seq(10).await.unwrap_err();
        assert!(
            matches!(e, StoreError::SeqExhausted { floor: f, block: 10 } if f == floor),
            "{e:?}"
        );
        let said = e.to_string();
        assert!(
            said.starts_with("sequence numbers used up: the floor kept is 4294967290")
                && said.contains("a new numbering")
                && !said.contains("unexpected size"),
            "{said}"
        );
        assert_eq!(c.reserve_seq(5).await.unwrap(), floor, "5 still fit");
    });
}

/// Fills the telemetry part until it recycled; returns the outbox and the
/// number of the newest telemetry entry.
async fn telemetry_recycled() -> (Outbox<Flash>, u32) {
    let mut o = Outbox::open(Flash::new(6), layout()).await.unwrap();
    o.push(&entry(0, Class::Critical, &[0xC0; 60]))
        .await
        .unwrap();
    o.push(&entry(1, Class::Normal, &[0xB0; 60])).await.unwrap();
    let mut seq = 2u32;
    let mut dropped = 0;
    while dropped == 0 || seq < 60 {
        let body = seq.to_le_bytes().repeat(15);
        dropped += o
            .push(&entry(seq, Class::Telemetry, &body))
            .await
            .unwrap()
            .count;
        seq += 1;
    }
    (o, seq - 1)
}

/// The telemetry part's sector being written damaged (zeroed) after the
/// part recycled: both of its sectors read closed and the store refuses
/// the part. That sector alone is erased, said, and the critical and
/// normal entries, and the telemetry part's other sector, still read.
#[test]
fn a_damaged_telemetry_sector_loses_no_critical_entry() {
    block_on(async {
        let (o, newest) = telemetry_recycled().await;
        let mut flash = o.into_flash();
        let bytes = flash.bytes_mut();
        let body = newest.to_le_bytes().repeat(15);
        let at = bytes.windows(60).position(|w| w == body).unwrap();
        let sector = at / 1024 * 1024;
        assert!(sector < 2048, "in the telemetry part");
        bytes[sector..sector + 1024].fill(0);
        let mut o = Outbox::open(flash, layout())
            .await
            .expect("the outbox opens without the damaged sector");
        assert_eq!(
            o.salvaged().collect::<Vec<_>>(),
            [(Class::Telemetry, sector as u32)]
        );
        assert_eq!(o.unreadable().count(), 0);
        let left = seqs(&mut o).await;
        assert_eq!(left[..2], [(0, Class::Critical), (1, Class::Normal)]);
        assert!(left.len() > 2, "the other telemetry sector reads: {left:?}");
        assert!(o.push(&entry(500, Class::Telemetry, b"t")).await.is_ok());
    });
}

/// A part in which nothing reads (both telemetry sectors zeroed): it is
/// said unreadable and left as it is, and the other parts keep working.
#[test]
fn an_unreadable_part_leaves_the_others_working() {
    block_on(async {
        let (o, _) = telemetry_recycled().await;
        let mut flash = o.into_flash();
        flash.bytes_mut()[..2048].fill(0);
        let mut o = Outbox::open(flash, layout())
            .await
            .expect("the outbox opens without its telemetry part");
        let bad: Vec<Class> = o.unreadable().map(|(class, _)| class).collect();
        assert_eq!(bad, [Class::Telemetry]);
        assert_eq!(o.salvaged().count(), 0, "nothing erased");
        assert_eq!(
            seqs(&mut o).await,
            [(0, Class::Critical), (1, Class::Normal)]
        );
        assert!(o.ack(1).await.unwrap(), "acknowledged past the bad part");
        o.push(&entry(600, Class::Critical, b"c")).await.unwrap();
        assert!(o.push(&entry(601, Class::Telemetry, b"t")).await.is_err());
        let mut flash = o.into_flash();
        assert!(
            flash.bytes_mut()[..2048].iter().all(|b| *b == 0),
            "left as it was"
        );
    });
}

//! What was learned kept in the NOR stand-in and restored by a new
//! controller on the same flash, as after a restart; the NOR's writes
//! counted; the trace replayed to the same figures.

extern crate std;

use std::boxed::Box;
use std::cell::Cell;
use std::rc::Rc;
use std::string::{String, ToString};
use std::vec::Vec;

use cooling_core::estimate::record::{HostIds, PARTS};
use cooling_core::{CoreConfig, Learned};
use cooling_decide::learned::{LearnedKeeper, LEARNED_EVERY_MS};
use cooling_decide::{Decider, LatchRecord, Traced};
use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use loopwarden_link::trace::Trace;
use loopwarden_link::{Deframer, Fed, Up};

use super::*;
use crate::board::nor::{NorError, RamNor};
use crate::cdu::map_limits;
use crate::clears::ClearGate;
use crate::outbound::{FrameBuffers, FramedPort, MAX_FRAME};

/// The config store's sectors, as on the board.
const STORE: core::ops::Range<u32> = 0..8 * 4096;

/// The NOR stand-in, its writes and erases counted.
struct Counted<'a> {
    nor: RamNor<'a>,
    writes: Rc<Cell<u32>>,
}

impl ErrorType for Counted<'_> {
    type Error = NorError;
}

impl ReadNorFlash for Counted<'_> {
    const READ_SIZE: usize = 1;
    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), NorError> {
        self.nor.read(offset, bytes).await
    }
    fn capacity(&self) -> usize {
        self.nor.capacity()
    }
}

impl NorFlash for Counted<'_> {
    const WRITE_SIZE: usize = <RamNor<'static> as NorFlash>::WRITE_SIZE;
    const ERASE_SIZE: usize = <RamNor<'static> as NorFlash>::ERASE_SIZE;
    async fn erase(&mut self, from: u32, to: u32) -> Result<(), NorError> {
        self.writes.set(self.writes.get() + 1);
        self.nor.erase(from, to).await
    }
    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), NorError> {
        self.writes.set(self.writes.get() + 1);
        self.nor.write(offset, bytes).await
    }
}

impl MultiwriteNorFlash for Counted<'_> {}

/// A board: the config store on the counted NOR, the ports, and how
/// many more parts the step's time allows.
struct Board<'a> {
    store: ConfigStore<Counted<'a>>,
    trace: FramedPort<{ 64 * 1024 }>,
    bufs: Box<FrameBuffers>,
    wire: Vec<u8>,
    ups: Vec<Up>,
    lines: Vec<String>,
    time_for: usize,
    /// A key whose read fails, and one whose write fails.
    unreadable: Option<&'static str>,
    unwritable: Option<&'static str>,
}

impl<'a> Board<'a> {
    fn on(mem: &'a mut [u8], writes: &Rc<Cell<u32>>) -> Box<Self> {
        let nor = Counted {
            nor: RamNor::new(mem),
            writes: writes.clone(),
        };
        Box::new(Self {
            store: ConfigStore::open(nor, STORE).unwrap(),
            trace: FramedPort::new(),
            bufs: Box::new(FrameBuffers::new()),
            wire: Vec::new(),
            ups: Vec::new(),
            lines: Vec::new(),
            time_for: usize::MAX,
            unreadable: None,
            unwritable: None,
        })
    }

    fn said(&self, words: &str) -> bool {
        self.lines.iter().any(|l| l.contains(words))
    }
}

/// Why the test board's flash failed.
#[derive(Debug)]
enum Failed {
    Store(StoreError<NorError>),
    Told,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::Store(e) => e.fmt(f),
            Failed::Told => f.write_str("the test's flash failed"),
        }
    }
}

impl LearnedFlash for Board<'_> {
    type Error = Failed;
    fn read_learned(
        &mut self,
        key: &str,
        out: &mut [u8; MAX_LEN],
    ) -> Result<Option<usize>, Failed> {
        if self.unreadable == Some(key) {
            return Err(Failed::Told);
        }
        read_part(&mut self.store, key, out).map_err(Failed::Store)
    }
    fn write_learned(&mut self, key: &str, bytes: &[u8]) -> Result<(), Failed> {
        if self.unwritable == Some(key) {
            return Err(Failed::Told);
        }
        write_part(&mut self.store, key, bytes).map_err(Failed::Store)
    }
    fn time_for_learned(&mut self) -> bool {
        let left = self.time_for > 0;
        self.time_for = self.time_for.saturating_sub(1);
        left
    }
}

impl Ports for Board<'_> {
    fn up(&mut self, up: &Up) -> bool {
        self.ups.push(up.clone());
        true
    }
    fn trace(&mut self, t: &Trace) {
        assert_eq!(self.trace.send(t, &mut self.bufs), Ok(true));
        self.wire
            .extend(core::iter::from_fn(|| self.trace.queue.pop()));
    }
    fn say(&mut self, line: fmt::Arguments<'_>) {
        self.lines.push(line.to_string());
    }
    fn insn_mark(&mut self) -> u32 {
        0
    }
    fn insn_since(&mut self, _: u32) -> u32 {
        1_000
    }
    fn stack_peak(&mut self) -> u32 {
        4_096
    }
    fn keep_clear(&mut self, _: &crate::clears::Taken) -> bool {
        true
    }
}

fn decider() -> Box<Decider> {
    let none: Result<Option<LatchRecord>, &str> = Ok(None);
    Box::new(Decider::new(CoreConfig::default(), map_limits(), &none).unwrap())
}

/// Figures learned of the reference hall: its loop, its facility and
/// three of its hosts.
fn figures() -> Learned {
    let mut l = Learned::new(&CoreConfig::default());
    for (h, f) in [(0, 1.25), (9, 0.85), (15, 1.6)] {
        l.hosts[h].value = f;
        l.hosts[h].var = 0.01;
        l.hosts[h].fed_s = 7_200.0;
        l.hosts[h].trust = 0.6;
    }
    l.flow.value *= 0.93;
    l.flow.fed_s = 86_400.0;
    l.flow.trust = 0.8;
    l.approach.value += 0.7;
    l.facility.theta = [0.5, 1.1, -0.2, 3.0];
    l.facility.taken = 1_234;
    l.facility_trust = [0.4, 0.5, 0.1, 0.9];
    l
}

/// `l` as it reads back from its parts (a host's minutes fed and trust
/// are kept coarser than they are held).
fn through_parts(l: &Learned) -> Learned {
    let mut out = Learned::new(&CoreConfig::default());
    let mut buf = [0; MAX_LEN];
    for part in 0..PARTS {
        let n = l.encode_part(part, &mut buf).unwrap();
        out.decode_part(part, &buf[..n]).unwrap();
    }
    out
}

/// The learned figures of a decider given, from its start, every input
/// in `wire` (the trace's frames).
fn replayed(wire: &[u8]) -> Learned {
    let mut d = decider();
    let mut deframer = Box::new(Deframer::<MAX_FRAME>::default());
    for b in wire {
        if let Fed::Frame(f) = deframer.push(*b) {
            if let Trace::Input(t) = f.message::<Trace>().unwrap() {
                d.apply(&t);
            }
        }
    }
    d.core().learned()
}

/// A controller of a decider that learned `l`, kept at `now_ms` on a
/// fresh flash `mem`; NOR writes counted in `writes`.
fn kept_once(mem: &mut [u8], writes: &Rc<Cell<u32>>, l: &Learned) -> Option<Tally> {
    let mut d = decider();
    d.core_mut().restore_learned(l).unwrap();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(mem, writes);
    assert_eq!(restore(&mut c, &mut *b), Restored::default());
    assert!(b.said("learned: none in flash"), "{:?}", b.lines);
    assert_eq!(keep(&mut c, &mut *b, LEARNED_EVERY_MS - 1), None, "not due");
    keep(&mut c, &mut *b, LEARNED_EVERY_MS)
}

#[test]
fn what_was_learned_is_kept_and_a_new_controller_on_the_same_flash_restores_it() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let l = figures();
    let t = kept_once(&mut mem, &writes, &l);
    assert_eq!(
        t,
        Some(Tally {
            written: PARTS as u8,
            failed: 0
        })
    );
    assert!(writes.get() > 0);

    // The restart: a new decider, keeper and controller on the same flash.
    let mut d = decider();
    assert_ne!(
        d.core().learned(),
        through_parts(&l),
        "starts as configured"
    );
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(&mut mem, &writes);
    let r = restore(&mut c, &mut *b);
    assert_eq!(
        r,
        Restored {
            restored: PARTS as u8,
            refused: 0
        }
    );
    assert!(
        b.said("learned: 17 of 17 parts restored from flash, 0 refused"),
        "{:?}",
        b.lines
    );
    assert_eq!(c.decider().core().learned(), through_parts(&l));
    // The trace restores the same figures on another machine.
    assert_eq!(replayed(&b.wire), through_parts(&l));

    // Nothing changed since: the next keep writes nothing to the NOR.
    let before = writes.get();
    let t = keep(&mut c, &mut *b, LEARNED_EVERY_MS);
    assert_eq!(t, Some(Tally::default()));
    assert_eq!(writes.get(), before, "no NOR write for unchanged parts");
}

#[test]
fn an_unchanged_part_is_not_written_again_and_a_changed_one_alone_is() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let mut d = decider();
    d.core_mut().restore_learned(&figures()).unwrap();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(&mut mem, &writes);
    restore(&mut c, &mut *b);
    keep(&mut c, &mut *b, LEARNED_EVERY_MS).unwrap();
    let after_first = writes.get();
    assert_eq!(
        keep(&mut c, &mut *b, 2 * LEARNED_EVERY_MS),
        Some(Tally::default())
    );
    assert_eq!(
        writes.get(),
        after_first,
        "nothing changed, nothing written"
    );
    // Host 20 (part 3) learns; only its part is written.
    let mut l = c.decider().core().learned();
    l.hosts[20].value = 1.1;
    l.hosts[20].fed_s = 600.0;
    drop(c);
    d.core_mut().restore_learned(&l).unwrap();
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let t = keep(&mut c, &mut *b, 3 * LEARNED_EVERY_MS);
    assert_eq!(
        t,
        Some(Tally {
            written: 1,
            failed: 0
        })
    );
    let one_part = writes.get() - after_first;
    assert!(
        (1..=4).contains(&one_part),
        "{one_part} NOR writes for a part"
    );
    assert!(
        b.said("learned: 1 parts kept in flash, 0 not (of 17; the rest unchanged)"),
        "{:?}",
        b.lines
    );
}

#[test]
fn a_corrupted_part_is_refused_with_its_key_and_the_others_restored() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let l = figures();
    kept_once(&mut mem, &writes, &l).unwrap();
    // Part 2 (hosts 8..16) damaged: a version no firmware wrote.
    let mut b = Board::on(&mut mem, &writes);
    write_part(&mut b.store, LEARNED_KEYS[2], &[9u8; 93]).unwrap();
    // Part 1 (hosts 0..8) cannot be read.
    b.unreadable = Some(LEARNED_KEYS[1]);
    let mut d = decider();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let r = restore(&mut c, &mut *b);
    assert_eq!(
        r,
        Restored {
            restored: PARTS as u8 - 2,
            refused: 2
        }
    );
    assert!(
        b.said(
            "learned: cdu.learned.2 refused (a learned record of version 9, not 2): \
             that part starts as configured"
        ),
        "{:?}",
        b.lines
    );
    assert!(
        b.said("learned: cdu.learned.1 refused (unreadable in flash: the test's flash failed)"),
        "{:?}",
        b.lines
    );
    assert!(b
        .ups
        .iter()
        .any(|u| matches!(u, Up::Said { error: true, words } if words.contains("cdu.learned.2"))));
    // Parts 1 and 2 as configured; the rest as kept.
    let mut want = through_parts(&l);
    let configured = Learned::new(&CoreConfig::default());
    want.hosts[..16].copy_from_slice(&configured.hosts[..16]);
    let got = c.decider().core().learned();
    assert_eq!(got, want);
    assert_eq!(got.hosts[15].value, 1.0, "host 15 (part 2) as configured");
    assert_eq!(got.flow, through_parts(&l).flow, "part 0 restored");
    assert_eq!(replayed(&b.wire), want, "the trace refuses it alike");

    // The next keep repairs the damaged part and the unread one: nothing
    // was known of part 1, so it is written; part 2's bytes differ.
    b.unreadable = None;
    let t = keep(&mut c, &mut *b, LEARNED_EVERY_MS);
    assert_eq!(
        t,
        Some(Tally {
            written: 2,
            failed: 0
        })
    );
}

#[test]
fn parts_kept_for_another_host_count_are_refused_and_the_rest_restored() {
    // Kept by an image built for 12 hosts; restored by one of 16 (the
    // reference hall): the hosts are known by their index only.
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let mut twelve = figures();
    twelve.ids = HostIds::indices(12);
    let mut b = Board::on(&mut mem, &writes);
    let mut buf = [0; MAX_LEN];
    for (part, key) in LEARNED_KEYS.iter().enumerate() {
        let n = twelve.encode_part(part, &mut buf).unwrap();
        write_part(&mut b.store, key, &buf[..n]).unwrap();
    }
    let mut d = decider();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let r = restore(&mut c, &mut *b);
    assert_eq!(
        r,
        Restored {
            restored: PARTS as u8 - 2,
            refused: 2
        }
    );
    assert!(
        b.said(
            "learned: cdu.learned.0 refused (learned on a loop of 12 hosts, not the 16 configured)"
        ),
        "{:?}",
        b.lines
    );
    assert!(
        b.said("learned: cdu.learned.2 refused (learned on other hosts than those configured as hosts 8 to 15"),
        "{:?}",
        b.lines
    );
    // Part 0 and hosts 8 to 15 as configured; hosts 0 to 7 as kept.
    let mut want = through_parts(&figures());
    let configured = Learned::new(&CoreConfig::default());
    want.hosts[8..16].copy_from_slice(&configured.hosts[8..16]);
    (want.flow, want.approach) = (configured.flow, configured.approach);
    (want.facility, want.facility_trust) = (configured.facility, configured.facility_trust);
    assert_eq!(c.decider().core().learned(), want);
    assert_eq!(replayed(&b.wire), want, "the trace refuses them alike");
}

#[test]
fn a_keep_writes_only_while_the_steps_time_allows_and_goes_on_at_the_next_step() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let mut d = decider();
    d.core_mut().restore_learned(&figures()).unwrap();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(&mut mem, &writes);
    restore(&mut c, &mut *b);
    b.time_for = 5;
    assert_eq!(keep(&mut c, &mut *b, LEARNED_EVERY_MS), None);
    b.time_for = 0;
    let before = writes.get();
    assert_eq!(keep(&mut c, &mut *b, LEARNED_EVERY_MS + 1_000), None);
    assert_eq!(writes.get(), before, "no time, no write");
    b.time_for = usize::MAX;
    let t = keep(&mut c, &mut *b, LEARNED_EVERY_MS + 2_000);
    assert_eq!(
        t,
        Some(Tally {
            written: PARTS as u8,
            failed: 0
        }),
        "five parts in the first step, the rest in the third"
    );
}

#[test]
fn a_part_the_flash_did_not_take_is_said_and_written_at_the_next_keep() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    let mut d = decider();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(&mut mem, &writes);
    restore(&mut c, &mut *b);
    b.unwritable = Some(LEARNED_KEYS[0]);
    let t = keep(&mut c, &mut *b, LEARNED_EVERY_MS);
    assert_eq!(
        t,
        Some(Tally {
            written: PARTS as u8 - 1,
            failed: 1
        })
    );
    assert!(
        b.said(
            "learned: cdu.learned.0 not kept in flash: the test's flash failed; \
             written again at the next keep"
        ),
        "{:?}",
        b.lines
    );
    b.unwritable = None;
    let t = keep(&mut c, &mut *b, 2 * LEARNED_EVERY_MS);
    assert_eq!(
        t,
        Some(Tally {
            written: 1,
            failed: 0
        })
    );
}

#[test]
fn a_restored_part_is_traced_as_its_bytes() {
    let mut mem = std::vec![0xFFu8; 8 * 4096];
    let writes = Rc::new(Cell::new(0));
    kept_once(&mut mem, &writes, &figures()).unwrap();
    let mut d = decider();
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let mut b = Board::on(&mut mem, &writes);
    restore(&mut c, &mut *b);
    let mut deframer = Box::new(Deframer::<MAX_FRAME>::default());
    let parts: Vec<u8> = (b.wire.iter())
        .filter_map(|x| match deframer.push(*x) {
            Fed::Frame(f) => match f.message::<Trace>().unwrap() {
                Trace::Input(Traced::LearnedPart { part, bytes }) => {
                    let mut want = [0; MAX_LEN];
                    let n = figures().encode_part(part.into(), &mut want).unwrap();
                    assert_eq!(bytes.as_slice(), &want[..n]);
                    Some(part)
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(parts, (0..PARTS as u8).collect::<Vec<_>>());
}

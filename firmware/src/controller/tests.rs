//! The controller against a scripted CDU and gateway, its trace replayed
//! through `loopwarden_link::trace::Replayer` as the host would.

extern crate std;

use std::boxed::Box;
use std::string::{String, ToString};
use std::vec::Vec;

use cooling_core::CoreConfig;
use cooling_decide::{CduMeasurements, Decider, LatchRecord, Opening, Outcome, Plan, Setting};
use loopwarden_link::frame::{encode, OVERHEAD};
use loopwarden_link::trace::{Replayer, Trace};
use loopwarden_link::{ClearAction, Deframer, Down, Fed, Up, MAX_MESSAGE};
use loopwarden_protocol::message::{Event, Pump};
use loopwarden_protocol::units::TimestampMs;

use super::*;
use crate::cdu::map_limits;
use crate::clears::tests::{ring, signed, NOW, SEED};
use crate::outbound::{FrameBuffers, FramedPort};

mod clears;
mod facility;
mod read_back;
mod resend;
mod said;
mod status;

/// The ports as the board has them: the trace in frames on a wire.
struct Fake {
    trace: FramedPort<{ 64 * 1024 }>,
    buf: Box<FrameBuffers>,
    wire: Vec<u8>,
    ups: Vec<Up>,
    lines: Vec<String>,
    /// The gateway's queue is full.
    full: bool,
    /// The gateway's queue takes no lease for this host.
    no_lease_for: Option<u16>,
    /// The clears whose number went into flash.
    kept: Vec<crate::clears::Taken>,
    /// The flash keeps no clear's number.
    unkeepable: bool,
    /// The gateway's next frame number.
    seq: u32,
    /// The gateway's queue as the board has it, when a test wants its
    /// size to bind (never drained but by the test).
    gateway: Option<Box<FramedPort<{ crate::outbound::GATEWAY_QUEUE }>>>,
}

impl Fake {
    fn new() -> Box<Self> {
        Box::new(Self {
            trace: FramedPort::new(),
            buf: Box::new(FrameBuffers::new()),
            wire: Vec::new(),
            ups: Vec::new(),
            lines: Vec::new(),
            full: false,
            no_lease_for: None,
            kept: Vec::new(),
            unkeepable: false,
            seq: 0,
            gateway: None,
        })
    }

    fn said(&self, words: &str) -> bool {
        self.lines.iter().any(|l| l.contains(words))
    }
}

impl Ports for Fake {
    fn up(&mut self, up: &Up) -> bool {
        let refused = match up {
            Up::Lease { host, .. } => self.no_lease_for == Some(*host),
            _ => false,
        };
        let queued = match &mut self.gateway {
            Some(g) => g.send(up, &mut self.buf) == Ok(true),
            None => true,
        };
        let taken = !self.full && !refused && queued;
        if taken {
            self.ups.push(up.clone());
        }
        taken
    }
    fn trace(&mut self, t: &Trace) {
        assert_eq!(self.trace.send(t, &mut self.buf), Ok(true));
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
    fn keep_clear(&mut self, t: &crate::clears::Taken) -> bool {
        if !self.unkeepable {
            self.kept.push(*t);
        }
        !self.unkeepable
    }
}

fn decider(read: &Result<Option<LatchRecord>, &str>) -> Box<Decider> {
    Box::new(Decider::new(CoreConfig::default(), map_limits(), read).unwrap())
}

/// A healthy CDU whose valves read closed where they were last written
/// closed (`open`), with the leak inputs `leaks`.
fn cdu(open: u16, leaks: u16) -> CduMeasurements {
    CduMeasurements {
        supply_c: Some(30.0),
        return_c: Some(38.0),
        flow_lpm: Some(192.0),
        facility_supply_c: Some(27.0),
        pumps_running: [Some(true), Some(false)],
        leaks: Some(leaks),
        diff_pressure_kpa: Some(100.0),
        valves_closed: Some(!open & 0b1111),
        pump_faults: [Some(false); 2],
        it_w: Some(80_000.0),
        cooling_w: Some(4_000.0),
        facility_w: Some(88_000.0),
        outdoor_c: Some(15.0),
    }
}

/// `f` run against a controller booted on the fake ports: a decider
/// started with no latched record, no clear gate.
fn booted<T>(f: impl FnOnce(&mut Controller<'_>, &mut Fake) -> T) -> T {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    f(&mut c, p)
}

/// One step as the board runs it, every write taken.
fn step(c: &mut Controller<'_>, p: &mut Fake, m: Option<CduMeasurements>, s: u64) -> Plan {
    c.step(p, m, s * 1000);
    if c.to_keep(p).is_some() {
        c.kept(p, true);
    }
    let plan = c.plan(p);
    c.written(p, Outcome::whole(&plan, true));
    c.report(p, s * 1000, true);
    plan
}

fn bytes_of(d: &Down, seq: u32) -> Vec<u8> {
    let mut scratch = std::vec![0u8; MAX_MESSAGE + OVERHEAD];
    let mut out = std::vec![0u8; crate::outbound::MAX_FRAME];
    let n = encode(d, seq, &mut scratch, &mut out).unwrap();
    out[..n].to_vec()
}

/// `d` from the gateway at `now_ms`; the clears taken, their number kept.
fn hear(c: &mut Controller<'_>, p: &mut Fake, d: &Down, now_ms: u64) -> Vec<crate::clears::Taken> {
    let seq = p.seq;
    p.seq = p.seq.wrapping_add(1);
    hear_numbered(c, p, d, seq, now_ms)
}

/// `d` from the gateway in frame `seq` at `now_ms`; the clears taken.
fn hear_numbered(
    c: &mut Controller<'_>,
    p: &mut Fake,
    d: &Down,
    seq: u32,
    now_ms: u64,
) -> Vec<crate::clears::Taken> {
    let before = p.kept.len();
    for b in bytes_of(d, seq) {
        c.on_byte(p, b, now_ms);
    }
    p.kept[before..].to_vec()
}

fn replay(wire: &[u8]) -> Replayer {
    let mut r = Replayer::new(CoreConfig::default(), map_limits()).unwrap();
    let mut d = Box::new(Deframer::<{ crate::outbound::MAX_FRAME }>::default());
    for b in wire {
        if let Fed::Frame(f) = d.push(*b) {
            r.hear(&f.message::<Trace>().unwrap());
        }
    }
    r
}

fn hello() -> Hello {
    Hello {
        boot: 1,
        reset: loopwarden_link::ResetCause::PowerOn,
        firmware: heapless::String::try_from("test").unwrap(),
        restored: false,
    }
}

/// The layout of the figures the tests' controllers run.
fn layout() -> loopwarden_link::CduLayout {
    (&CoreConfig::default().layout).into()
}

fn alive(s: u64) -> Down {
    Down::Alive {
        unix_ms: NOW + s * 1000,
        bus: true,
        layout: layout(),
    }
}

fn valves(p: &Plan) -> u16 {
    p.value(Setting::Valves).unwrap_or(-1.0) as u16
}

#[test]
fn a_run_with_the_gateways_messages_and_a_leak_replays_with_every_digest_matching() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(Some("cdu1"), ring()), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let mut open = 0b1111;
    for s in 0..40u64 {
        let now = s * 1000;
        hear(&mut c, p, &alive(s), now);
        if s == 3 {
            let limits = Down::Limits {
                ceiling_c: 38.0,
                offset_k: -1.0,
            };
            hear(&mut c, p, &limits, now);
            hear(&mut c, p, &Down::FacilityTarget(26.0), now);
            hear(&mut c, p, &Down::Outdoor(12.5), now);
        }
        let telemetry = loopwarden_protocol::samples::host_telemetry(8);
        let host = Down::Host {
            index: (s % 16) as u16,
            stamped: TimestampMs(NOW + now),
            telemetry,
        };
        hear(&mut c, p, &host, now);
        let leaks = if (20..25).contains(&s) { 0b0100 } else { 0 };
        let plan = step(&mut c, p, Some(cdu(open, leaks)), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
        if s >= 20 {
            assert_eq!(
                valves(&plan) & 0b0100,
                0,
                "rack 2's valve stays shut at {s}"
            );
        }
    }
    assert_eq!(c.decider().core().limits(), (38.0, -1.0));
    assert_eq!(c.link.bad, 0);
    assert!(p
        .ups
        .iter()
        .any(|u| matches!(u, Up::Event(Event::Leak { .. }))));
    assert!(
        p.ups.iter().any(|u| matches!(u, Up::Lease { host: 8, .. })),
        "rack 2's hosts capped"
    );
    let statuses = p.ups.iter().filter(|u| matches!(u, Up::Status(_))).count();
    assert_eq!(statuses, 40);
    let r = replay(&p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
    assert_eq!(r.boots, 1);
    assert_eq!(r.compared, 80, "a step's and a plan's digest each step");
    assert!(r.inputs > 40 * 5, "{}", r.inputs);
}

#[test]
fn an_unreadable_record_relatches_from_the_valves_the_cdu_reports_closed_and_replays() {
    let read: Result<Option<LatchRecord>, &str> = Err("cdu.latched: unreadable in flash");
    let mut d = decider(&read);
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::of(&read));
    assert!(p.said("cdu.latched: unreadable in flash; the record is kept as it is"));
    let silent = step(&mut c, p, None, 0);
    assert_eq!(
        silent.value(Setting::Valves),
        None,
        "no valve written before the relatch"
    );
    // Rack 1's valve reads closed: latched, the others reopened.
    let plan = step(&mut c, p, Some(cdu(0b1101, 0)), 1);
    assert_eq!(valves(&plan), 0b1101);
    assert_eq!(c.decider().core().leaks_latched(), 0b0010);
    let r = replay(&p.wire);
    assert!(
        r.all_match() && r.compared == 4,
        "{:?} {}",
        r.first_mismatch,
        r.compared
    );
}

/// The generation item beside the record that could not be believed
/// holds 7: the relatch's record is generation 8 (a cut before its
/// generation then leaves it one ahead, believed), and the replayer,
/// told so by the trace, agrees.
#[test]
fn after_an_unreadable_record_the_relatchs_record_goes_above_the_generation_written() {
    let read: Result<Option<LatchRecord>, &str> = Err("cdu.latched: damaged");
    let mut d = decider(&read);
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::of(&read));
    c.continue_above(p, Some(7));
    c.step(p, Some(cdu(0b1101, 0)), 0);
    let r = c.to_keep(p).expect("the relatch's record");
    assert_eq!((r.generation, r.latched.leaks), (8, 0b0010));
    c.kept(p, true);
    let plan = c.plan(p);
    c.written(p, Outcome::whole(&plan, true));
    let r = replay(&p.wire);
    assert!(r.all_match() && r.compared > 0, "{:?}", r.first_mismatch);
}

#[test]
fn a_bad_frame_is_counted_and_never_acted_on() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    let limits = Down::Limits {
        ceiling_c: 35.0,
        offset_k: 0.0,
    };
    let before = c.decider().core().limits();
    let mut bytes = bytes_of(&limits, 7);
    bytes[4] ^= 0x10;
    for b in bytes {
        c.on_byte(p, b, 0);
    }
    assert_eq!((c.link.bad, c.link.frames), (1, 0));
    assert_eq!(c.decider().core().limits(), before);
    assert!(c.link.last_bad.is_some());
    assert!(p.lines.is_empty(), "counted, not said: {:?}", p.lines);
    hear(&mut c, p, &limits, 0);
    assert_eq!(c.decider().core().limits().0, 35.0);
    assert_eq!((c.link.bad, c.link.frames), (1, 1));
    // A host report before the gateway's layout (and the wall clock, with
    // it in its `Alive`) is known is set aside.
    let host = Down::Host {
        index: 0,
        stamped: TimestampMs(NOW),
        telemetry: loopwarden_protocol::samples::host_telemetry(4),
    };
    hear(&mut c, p, &host, 0);
    assert_eq!(c.link.hosts_unmapped, 1);
    assert!(c.decider().hosts()[0].is_none());
}

#[test]
fn a_repeated_frame_is_not_acted_on_again_and_a_restarted_gateway_is_heard() {
    booted(|c, p| {
        let outdoor = |p: &Fake| {
            (p.ups.iter().rev())
                .find_map(|u| match u {
                    Up::Status(s) => Some(s.outdoor_c),
                    _ => None,
                })
                .flatten()
        };
        // No outdoor sensor on the CDU: the BMS's value while it is fresh.
        let no_sensor = || {
            let mut m = cdu(0b1111, 0);
            m.outdoor_c = None;
            Some(m)
        };
        hear_numbered(c, p, &alive(0), 9, 0);
        hear_numbered(c, p, &Down::Outdoor(12.5), 10, 0);
        step(c, p, no_sensor(), 1);
        assert_eq!(outdoor(p), Some(12.5));
        // The same frame again at 290 s: not taken, so the value is stale
        // 300 s after it came, not 300 s after its repeat.
        hear_numbered(c, p, &Down::Outdoor(12.5), 10, 290_000);
        assert_eq!((c.link.repeats, c.link.frames), (1, 2));
        assert!(!p.said("came again"), "counted, not said: {:?}", p.lines);
        step(c, p, no_sensor(), 301);
        assert_eq!(outdoor(p), None, "the repeat did not make it new");
        // A gap, then the gateway started again: its frames are acted on.
        hear_numbered(c, p, &alive(302), 14, 302_000);
        assert_eq!((c.link.gaps, c.link.lost), (1, 3));
        hear_numbered(c, p, &alive(303), 0, 303_000);
        hear_numbered(c, p, &Down::Outdoor(14.0), 1, 303_000);
        assert!(p.said("link: the gateway started again (its frames numbered from 0 again)"));
        step(c, p, no_sensor(), 304);
        assert_eq!(outdoor(p), Some(14.0));
        // Started again after one frame: the same number, other bytes. No
        // status goes until its `Alive` says its layout.
        hear_numbered(c, p, &Down::Outdoor(16.0), 1, 305_000);
        hear_numbered(c, p, &alive(305), 2, 305_000);
        step(c, p, no_sensor(), 305);
        assert_eq!(outdoor(p), Some(16.0));
        assert_eq!(c.link.restarts, 2);
        assert_eq!((c.link.frames, c.link.repeats, c.link.bad), (7, 1, 0));
    });
}

#[test]
fn a_gateway_of_another_layout_gets_no_status_or_lease_and_hands_down_no_host_report() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    c.set_digest(0x1a2b_3c4d);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let other = loopwarden_link::CduLayout {
        racks: 6,
        hosts_per_rack: 3,
        gpus_per_host: 4,
    };
    let alive_as = |s: u64, layout| Down::Alive {
        unix_ms: NOW + s * 1000,
        bus: true,
        layout,
    };
    let errors = |p: &Fake| -> Vec<String> {
        (p.ups.iter())
            .filter_map(|u| match u {
                Up::Said { error: true, words } => Some(words.to_string()),
                _ => None,
            })
            .collect()
    };
    let counted = |p: &Fake, from: usize| {
        let n = |f: fn(&Up) -> bool| p.ups[from..].iter().filter(|u| f(u)).count();
        (
            n(|u| matches!(u, Up::Status(_))),
            n(|u| matches!(u, Up::Lease { .. })),
            n(|u| matches!(u, Up::Event(_))),
        )
    };
    hear(&mut c, p, &alive_as(0, other), 0);
    assert!(!c.layouts_agree());
    assert_eq!(
        errors(p),
        ["layout differs: mine 4x4x8 (figures 0x1a2b3c4d), yours 6x3x4: no host report, status or lease"]
    );
    assert!(
        p.said("lay out 4 racks of 4 hosts of 8 GPUs, the gateway's configuration 6 racks of 3 hosts of 4 GPUs"),
        "{:?}",
        p.lines
    );
    // Its host 5 is another host here: not taken.
    let host = Down::Host {
        index: 5,
        stamped: TimestampMs(NOW),
        telemetry: loopwarden_protocol::samples::host_telemetry(8),
    };
    hear(&mut c, p, &host, 0);
    assert_eq!(c.link.hosts_unmapped, 1);
    assert!(c.decider().hosts()[5].is_none());
    // The CDU is still run: rack 0 leaks and is shut; its event goes up,
    // no status and no lease for its hosts.
    let before = p.ups.len();
    for s in 0..3 {
        hear(&mut c, p, &alive_as(s, other), s * 1000);
        step(&mut c, p, Some(cdu(0b1111, 0)), s);
    }
    let plan = step(&mut c, p, Some(cdu(0b1111, 0b0001)), 3);
    assert_eq!(valves(&plan) & 1, 0, "rack 0 shut");
    let (statuses, leases, events) = counted(p, before);
    assert_eq!((statuses, leases), (0, 0));
    assert!(events > 0);
    assert_eq!(c.link.withheld, 4);
    assert_eq!(errors(p).len(), 1, "said again a minute on, not each Alive");
    hear(&mut c, p, &alive_as(61, other), 61_000);
    assert_eq!(errors(p).len(), 2);
    // The gateway laid out as this controller: the status goes up, and
    // the leases held back with it.
    hear(&mut c, p, &alive(62), 62_000);
    assert!(c.layouts_agree());
    assert!(p.said("layout: the gateway's is this controller's again"));
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 62);
    let (statuses, leases, _) = counted(p, before);
    assert_eq!((statuses, leases), (1, 4), "rack 0's four hosts' leases");
}

/// A gateway line that never stops: garbage (a bad frame every few
/// bytes) with an overrun of its ring now and then, for `bytes` bytes
/// before it falls quiet.
struct Babbling {
    bytes: usize,
    read: usize,
}

impl embedded_hal_nb::serial::ErrorType for Babbling {
    type Error = embedded_hal_nb::serial::ErrorKind;
}

impl embedded_hal_nb::serial::Read<u8> for Babbling {
    fn read(&mut self) -> embedded_hal_nb::nb::Result<u8, Self::Error> {
        use embedded_hal_nb::{nb, serial::ErrorKind};
        if self.read == self.bytes {
            return Err(nb::Error::WouldBlock);
        }
        self.read += 1;
        match self.read % 1000 {
            0 => Err(nb::Error::Other(ErrorKind::Overrun)),
            n if n % 3 == 0 => Ok(0),
            n => Ok(n as u8 | 1),
        }
    }
}

#[test]
fn a_babbling_gateway_line_is_read_a_bounded_share_at_a_time_and_said_once_a_step() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    let mut line = Babbling {
        bytes: 10 * HEAR_MAX_BYTES,
        read: 0,
    };
    let taken = c.hear(p, &mut line, 0);
    assert_eq!(taken, HEAR_MAX_BYTES, "one call takes its share and ends");
    assert!(line.read < 2 * HEAR_MAX_BYTES, "{}", line.read);
    assert!(
        c.link.bad > 1_000,
        "every bad frame counted: {}",
        c.link.bad
    );
    assert!(c.link.overruns >= 8, "{}", c.link.overruns);
    assert!(p.lines.is_empty(), "no line each: {:?}", p.lines.first());
    // What is left is taken by the next calls, and a quiet line ends one.
    while c.hear(p, &mut line, 0) == HEAR_MAX_BYTES {}
    assert_eq!(line.read, line.bytes);
    assert_eq!(c.hear(p, &mut line, 0), 0);
    assert_eq!(c.link.frames, 0);
}

#[test]
fn a_lease_the_gateway_could_not_take_is_due_again() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    hear(&mut c, p, &alive(0), 0);
    let leases = |p: &Fake| {
        (p.ups.iter())
            .filter(|u| matches!(u, Up::Lease { lift: false, .. }))
            .count()
    };
    for s in 0..3 {
        step(&mut c, p, Some(cdu(0b1111, 0)), s);
    }
    assert_eq!(leases(p), 0, "no cap, no lease");
    p.full = true;
    step(&mut c, p, Some(cdu(0b1111, 0b0001)), 3);
    assert_eq!(leases(p), 0);
    p.full = false;
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 4);
    let hosts: Vec<u16> = (p.ups.iter())
        .filter_map(|u| match u {
            Up::Lease { host, .. } => Some(*host),
            _ => None,
        })
        .collect();
    assert_eq!(hosts, [0, 1, 2, 3], "rack 0's hosts, each at its first cap");
    assert!(p.said("lease: capping host 0 at"));
}

#[test]
fn a_lease_not_queued_holds_back_no_other_host_s_and_goes_at_the_next_step() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    hear(&mut c, p, &alive(0), 0);
    let leased = |p: &Fake, from: usize| -> Vec<u16> {
        (p.ups[from..].iter())
            .filter_map(|u| match u {
                Up::Lease { host, .. } => Some(*host),
                _ => None,
            })
            .collect()
    };
    for s in 0..3 {
        step(&mut c, p, Some(cdu(0b1111, 0)), s);
    }
    p.no_lease_for = Some(1);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 3);
    assert_eq!(leased(p, before), [0, 2, 3], "host 1's lease is not queued");
    p.no_lease_for = None;
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 4);
    assert_eq!(leased(p, before), [1], "due again, the others sent");
}

#[test]
fn a_step_capping_every_host_of_a_large_cdu_queues_its_events_and_status_before_its_leases() {
    // 120 hosts: 15 racks of 8 (a layout of 16 racks trips the core's
    // check of its unprotected racks).
    let mut cfg = CoreConfig::default();
    cfg.layout.racks = 15;
    cfg.layout.hosts_per_rack = 8;
    let mut d = Box::new(Decider::new::<&str>(cfg, map_limits(), &Ok(None)).unwrap());
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    let wide = Down::Alive {
        unix_ms: NOW,
        bus: true,
        layout: (&cfg.layout).into(),
    };
    hear(&mut c, p, &wide, 0);
    p.gateway = Some(Box::new(FramedPort::new()));
    let every = 0x7FFF;
    // Every rack's valve reads as written: open, then shut.
    let read = |open: u16, leaks: u16| {
        let mut m = cdu(0, leaks);
        m.valves_closed = Some(!open);
        Some(m)
    };
    for s in 0..3 {
        step(&mut c, p, read(every, 0), s);
    }
    let drain = |p: &mut Fake| while p.gateway.as_mut().unwrap().queue.pop().is_some() {};
    drain(p);
    let before = p.ups.len();
    // Every rack leaks: every host capped in one step.
    step(&mut c, p, read(every, every), 3);
    let sent = &p.ups[before..];
    let leaks = (sent.iter())
        .filter(|u| matches!(u, Up::Event(Event::Leak { .. })))
        .count();
    let leases = (sent.iter())
        .filter(|u| matches!(u, Up::Lease { .. }))
        .count();
    assert_eq!(leaks, 15, "every rack's leak event queued");
    assert!(
        sent.iter().any(|u| matches!(u, Up::Status(_))),
        "the status queued"
    );
    assert!(
        (1..120).contains(&leases),
        "the queue held some leases, not all: {leases}"
    );
    assert_eq!(c.link.up_dropped, 0, "nothing but leases went unqueued");
    // The rest go when the queue has room again.
    drain(p);
    let before = p.ups.len();
    step(&mut c, p, read(0, every), 4);
    let more = (p.ups[before..].iter())
        .filter(|u| matches!(u, Up::Lease { lift: false, .. }))
        .count();
    assert!(more >= 120 - leases, "{more} more leases");
}

#[test]
fn with_its_gateway_dead_a_leak_is_isolated_a_tripped_pump_handed_over_and_every_step_beats() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    // The gateway never speaks and its line takes nothing.
    p.full = true;
    c.boot(p, hello(), Opening::Nothing);
    let (mut open, mut b_on, mut beats) = (0b1111u16, false, Vec::new());
    let mut handed_over_at = None;
    for s in 0..45u64 {
        let leaks = if s >= 20 { 0b0100 } else { 0 };
        let mut m = cdu(open, leaks);
        if s >= 30 {
            m.pumps_running = [Some(false), Some(b_on)];
            m.pump_faults = [Some(true), Some(false)];
        }
        let plan = step(&mut c, p, Some(m), s);
        open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
        let run = plan.value(Setting::PumpsRun).unwrap_or(0.0) as u16;
        b_on = run & 0b10 != 0;
        if b_on && s >= 30 && handed_over_at.is_none() {
            handed_over_at = Some(s);
        }
        beats.push(
            plan.value(Setting::Heartbeat)
                .expect("a heartbeat every step"),
        );
        if s >= 20 {
            assert_eq!(valves(&plan) & 0b0100, 0, "rack 2's valve shut at {s}");
        }
    }
    assert!(
        handed_over_at.is_some_and(|s| s <= 32),
        "pump B runs within two steps of A's trip: {handed_over_at:?}"
    );
    assert!(
        beats.windows(2).all(|w| w[0] != w[1]),
        "the heartbeat changes every step"
    );
    assert!(p.ups.is_empty(), "nothing reached the dead gateway");
    assert!(c.decider().core().leaks_latched() & 0b0100 != 0);
}

/// A flash that refuses the latched record: the gateway hears it once at
/// the first failure (an error) and once when a record goes in again,
/// not at every step.
#[test]
fn a_latched_record_not_kept_is_said_to_the_gateway_once_and_again_when_kept() {
    booted(|c, p| {
        let said = |p: &Fake| -> Vec<(bool, String)> {
            (p.ups.iter())
                .filter_map(|u| match u {
                    Up::Said { error, words } => Some((*error, words.to_string())),
                    _ => None,
                })
                .collect()
        };
        let before = said(p).len();
        for ok in [false, false, false, true, true] {
            c.kept(p, ok);
        }
        assert_eq!(
            said(p)[before..],
            [
                (true, super::LATCH_NOT_KEPT.to_string()),
                (false, super::LATCH_KEPT_AGAIN.to_string())
            ]
        );
    });
}

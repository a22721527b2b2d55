//! A CDU that never answers the read-back after it took none of a
//! step's writes (the controller started while its link was down, or the
//! CDU restarted): its settings are reported not taken (the mode
//! degraded, the write failure counted and logged) until one is read back
//! held, but each is still taken on its echo where the decision path
//! acts on it: the lead pump's trip is judged and hands over to the lag,
//! and the valve word the CDU echoed is the one recorded.
use super::*;
use crate::decide::{Decider, StepIn};
use crate::modbus::{CduError, ReadBack};
use cooling_core::CoreConfig;
use loopwarden_protocol::message::{Event, Pump};

/// A CDU that refuses every write of its first step (exception 4, a
/// device failure; the setpoint its last), echoes every write after, and
/// answers no read-back (or refuses it with exception 1: `not_served`).
#[derive(Default)]
struct NeverReadBack {
    setpoint_refused: bool,
    not_served: bool,
}

impl CduPort for NeverReadBack {
    async fn read(&mut self) -> Result<CduMeasurements, CduError> {
        Ok(CduMeasurements::default())
    }
    async fn write_setting(&mut self, w: &Write) -> Result<(), CduError> {
        if self.setpoint_refused {
            return Ok(());
        }
        self.setpoint_refused = w.setting == Setting::Setpoint;
        Err(CduError::Refused {
            op: format!("write {}", w.setting.register()),
            code: 4,
            meaning: crate::modbus::exception_meaning(4),
        })
    }
    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let op = "read back holding 0-20".to_string();
        let e = match self.not_served {
            false => CduError::NoAnswer { op, after_ms: 500 },
            true => CduError::Refused {
                op,
                code: 1,
                meaning: crate::modbus::exception_meaning(1),
            },
        };
        ReadBack {
            unread: vec![(written.iter().map(|w| w.setting).collect(), e)],
            ..ReadBack::default()
        }
    }
    fn limits(&self) -> MapLimits {
        MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: None,
            positions: true,
        }
    }
    fn pump_fault_bits(&self) -> [bool; 2] {
        [true; 2]
    }
}

/// What the CDU reads: lead pump A running (or not, `a_runs`), every
/// valve open but those of `closed`.
pub(super) fn measured(a_runs: bool, closed: u16) -> CduMeasurements {
    CduMeasurements {
        supply_c: Some(30.0),
        return_c: Some(38.0),
        flow_lpm: Some(192.0),
        facility_supply_c: Some(27.0),
        pumps_running: [Some(a_runs), Some(false)],
        leaks: Some(0),
        diff_pressure_kpa: Some(100.0),
        valves_closed: Some(closed),
        pump_faults: [Some(false); 2],
        it_w: Some(80_000.0),
        cooling_w: None,
        facility_w: Some(88_000.0),
        outdoor_c: Some(20.0),
    }
}

pub(super) fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(f)
}

/// One control step at second `s` as the shell runs it: the decision,
/// its plan written through `d`, what went in heard back.
pub(super) fn step<P: CduPort>(
    decider: &mut Decider,
    d: &mut Devices<P>,
    s: u64,
    m: &CduMeasurements,
) -> (cooling_core::Commands, Outcome) {
    let inp = StepIn {
        now_ms: s * 1000,
        board: BoardRead::Absent,
        ambient_c: Some(20.0),
    };
    let c = decider.step(Some(m), &inp);
    if decider.to_keep().is_some() {
        decider.kept(true);
    }
    let plan = decider.plan(&c, m.valves_closed);
    let o = run(d.write(&plan, &mut ShellStats::default()));
    decider.written(&o);
    (c, o)
}

/// A decider on `cdu`'s map, and the devices on `cdu`.
pub(super) fn started<P: CduPort>(cdu: P) -> (Decider, Devices<P>) {
    let fresh: Result<Option<crate::decide::LatchRecord>, &str> = Ok(None);
    let decider = Decider::new(CoreConfig::default(), cdu.limits(), &fresh).unwrap();
    (decider, Devices::new(cdu, None))
}

/// Every setting refused at the first step, then echoed but never read
/// back: reported not taken (not `all`, the failure said), yet each taken
/// on its echo (the pumps, the setpoint, the speed, the valves). The lead
/// pump's contactor then reads open: the trip is judged and the lag
/// started.
#[test]
fn a_lead_trip_on_a_cdu_that_never_answers_the_read_back_starts_the_lag() {
    let (mut decider, mut d) = started(NeverReadBack::default());
    let mut s = 0;
    let (_, first) = step(&mut decider, &mut d, s, &measured(true, 0));
    assert!(!first.taken().pumps && !first.taken().all);
    for _ in 0..10 {
        s += 1;
        let (_, o) = step(&mut decider, &mut d, s, &measured(true, 0));
        let t = o.taken();
        assert!(t.pumps && t.setpoint && t.speed && t.valves, "{s}: {o:?}");
        assert!(!t.all, "{s}: not read back held since: {o:?}");
    }
    let said = d.write_error.0.as_deref().unwrap_or_default();
    assert!(said.contains("not read back since"), "{said}");
    let mut events = Vec::new();
    for _ in 0..10 {
        s += 1;
        let (c, _) = step(&mut decider, &mut d, s, &measured(false, 0));
        events.extend(c.events.iter().cloned());
        assert!(c.pump_on != [false; 2], "{s}: both pumps told to stop");
    }
    let trip = Event::PumpTrip {
        pump: Pump::A,
        lag_started: true,
    };
    assert!(events.contains(&trip), "{events:?}");
}

/// The same CDU: a leak's valve close the CDU echoes is the valve word
/// recorded, though no read-back reads it held.
#[test]
fn a_valve_close_echoed_but_never_read_back_is_the_word_taken() {
    let (mut decider, mut d) = started(NeverReadBack::default());
    for s in 0..3 {
        step(&mut decider, &mut d, s, &measured(true, 0));
    }
    let mut wet = measured(true, 0);
    wet.leaks = Some(0b0100);
    let (c, o) = step(&mut decider, &mut d, 3, &wet);
    assert_eq!(c.valves_open & 0b0100, 0, "rack 2 told to close");
    assert!(o.taken().valves && !o.taken().all, "{o:?}");
    assert_eq!(decider.valves_taken(), Some(c.valves_open));
}

/// A CDU that serves no read-back at all (exception 1) after its writes
/// were refused: their echo is taken, and reported taken, from the step
/// they go in.
#[test]
fn a_cdu_that_serves_no_read_back_has_its_echoes_taken_after_a_refusal() {
    let cdu = NeverReadBack {
        not_served: true,
        ..NeverReadBack::default()
    };
    let (mut decider, mut d) = started(cdu);
    let all: Vec<bool> = (0..3)
        .map(|s| step(&mut decider, &mut d, s, &measured(true, 0)).1)
        .map(|o| o.taken().all)
        .collect();
    assert_eq!(all, [false, true, true]);
    assert!(d.write_error.0.is_none(), "{:?}", d.write_error.0);
}

/// A CDU that echoes every write and reads back what it holds, but never
/// runs a handover: once the lead pump is written to B, the read-back
/// reads it (and the pumps to run) holding A's, and every read-back after
/// that goes unanswered.
/// With `speed_unanswered`, the pump speed's write goes unanswered once
/// that read-back was made (so no read-back is asked on those steps).
#[derive(Default)]
struct IgnoresHandover {
    lead_b: bool,
    refuted: bool,
    speed_unanswered: bool,
}

impl CduPort for IgnoresHandover {
    async fn read(&mut self) -> Result<CduMeasurements, CduError> {
        Ok(CduMeasurements::default())
    }
    async fn write_setting(&mut self, w: &Write) -> Result<(), CduError> {
        if w.setting == Setting::LeadPump {
            self.lead_b |= w.value != 0.0;
        }
        if self.refuted && self.speed_unanswered && w.setting == Setting::PumpSpeed {
            let op = format!("write {}", w.setting.register());
            return Err(CduError::NoAnswer { op, after_ms: 500 });
        }
        Ok(())
    }
    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        if !self.lead_b {
            return ReadBack::default();
        }
        let pumps = |w: &&Write| matches!(w.setting, Setting::LeadPump | Setting::PumpsRun);
        let settings: Vec<Setting> = written.iter().filter(pumps).map(|w| w.setting).collect();
        if !self.refuted && !settings.is_empty() {
            self.refuted = true;
            let e = CduError::BadAnswer {
                op: "write lead_pump at holding 2".into(),
                detail: "holding 2 reads back word 0".into(),
            };
            return ReadBack {
                not_held: vec![(settings, e)],
                ..ReadBack::default()
            };
        }
        let op = "read back holding 0-20".to_string();
        let e = CduError::NoAnswer { op, after_ms: 500 };
        ReadBack {
            unread: vec![(written.iter().map(|w| w.setting).collect(), e)],
            ..ReadBack::default()
        }
    }
    fn limits(&self) -> MapLimits {
        NeverReadBack::default().limits()
    }
    fn pump_fault_bits(&self) -> [bool; 2] {
        [true; 2]
    }
}

/// Lead pump A trips; the CDU echoes "B to run and lead" but runs
/// neither, a read-back reads that, and no read-back answers after it.
/// The pumps stay not taken over the unanswered read-backs, so B, never
/// started, is not judged tripped (both pumps out of service), and the
/// heartbeat stays held back: the CDU falls back to its own control.
/// Alike when a later write goes unanswered, so no read-back is asked.
#[test]
fn a_handover_read_back_not_held_is_not_taken_over_read_backs_that_fail() {
    handover_not_held(false);
    handover_not_held(true);
}

fn handover_not_held(speed_unanswered: bool) {
    let cdu = IgnoresHandover {
        speed_unanswered,
        ..IgnoresHandover::default()
    };
    let (mut decider, mut d) = started(cdu);
    for s in 0..3 {
        step(&mut decider, &mut d, s, &measured(true, 0));
    }
    let mut events = Vec::new();
    let mut refuted_steps = 0;
    for s in 3..30 {
        let (c, o) = step(&mut decider, &mut d, s, &measured(false, 0));
        events.extend(c.events.iter().cloned());
        if d.cdu.refuted {
            refuted_steps += 1;
            assert!(!o.taken().pumps, "{s}: pumps taken on their echo: {o:?}");
        }
    }
    assert!(refuted_steps > 10, "the handover was read back not held");
    let a = Event::PumpTrip {
        pump: Pump::A,
        lag_started: true,
    };
    assert!(events.contains(&a), "{events:?}");
    let b_tripped = |e: &Event| matches!(e, Event::PumpTrip { pump: Pump::B, .. });
    assert!(!events.iter().any(b_tripped), "{events:?}");
    let said = d.write_error.0.as_deref().unwrap_or_default();
    let first = if speed_unanswered {
        "no answer"
    } else {
        "last read back not held"
    };
    assert!(said.contains(first), "{said}");
}

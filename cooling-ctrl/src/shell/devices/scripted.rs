//! The scripted CDU the devices' tests run against, and how they drive
//! it. One port ([`Scripted`]) answers as its script ([`Script`]) says;
//! what a script leaves out is a CDU that reads nothing, echoes every
//! write, holds what it echoes, has both pump fault bits and every
//! setting in its map ([`limits`]). The read-back answers the scripts
//! share: a setting held at another value ([`not_held`]), a read-back
//! refused ([`refused`]) or unanswered ([`unanswered`]).
//!
//! Glossary: a *script* is a test CDU's behaviour, one method per call
//! of the port; a *step* is one control step as the shell runs it
//! ([`step`]).
use super::*;
use crate::decide::{Decider, StepIn};
use crate::modbus::{CduError, ReadBack};
use cooling_core::CoreConfig;

/// What a scripted CDU answers to each call of the port. Left out, a
/// call answers as a CDU that reads nothing and holds every write.
pub(super) trait Script {
    fn read(&mut self) -> Result<CduMeasurements, CduError> {
        Ok(CduMeasurements::default())
    }
    fn read_gaps(&self) -> &[CduError] {
        &[]
    }
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        let _ = w;
        Ok(())
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let _ = written;
        ReadBack::default()
    }
    fn pump_fault_bits(&self) -> [bool; 2] {
        [true; 2]
    }
}

/// A CDU port that answers as the script `S` says; the script's fields
/// are reached through it (`d.cdu.field`).
pub(super) struct Scripted<S>(pub S);

impl<S> std::ops::Deref for Scripted<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.0
    }
}

impl<S> std::ops::DerefMut for Scripted<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.0
    }
}

impl<S: Script> CduPort for Scripted<S> {
    async fn read(&mut self) -> Result<CduMeasurements, CduError> {
        self.0.read()
    }
    fn read_gaps(&self) -> &[CduError] {
        self.0.read_gaps()
    }
    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        self.0.read_back(written)
    }
    async fn write_setting(&mut self, w: &Write) -> Result<(), CduError> {
        self.0.write(w)
    }
    fn limits(&self) -> MapLimits {
        limits()
    }
    fn pump_fault_bits(&self) -> [bool; 2] {
        self.0.pump_fault_bits()
    }
}

/// The map of every scripted CDU: every setting, no ranges, valve
/// positions.
pub(super) fn limits() -> MapLimits {
    MapLimits {
        mapped: [true; 6],
        setpoint_c: None,
        speed_pct: None,
        positions: true,
    }
}

/// A read-back that finds `settings` held at another value: the write of
/// `register` at holding `at`, which reads back `held`.
pub(super) fn not_held(settings: Vec<Setting>, register: &str, at: u16, held: &str) -> ReadBack {
    let e = CduError::BadAnswer {
        op: format!("write {register} at holding {at}"),
        detail: format!("holding {at} reads back {held}"),
    };
    ReadBack {
        not_held: vec![(settings, e)],
        ..ReadBack::default()
    }
}

/// The valve word read back as 0 (every valve shut), not as written.
pub(super) fn valves_not_held() -> ReadBack {
    not_held(vec![Setting::Valves], "valves_open", 3, "value 0")
}

/// A read-back of every setting of `written` that fails with `e`.
pub(super) fn unread(written: &[Write], e: CduError) -> ReadBack {
    ReadBack {
        unread: vec![(written.iter().map(|w| w.setting).collect(), e)],
        ..ReadBack::default()
    }
}

/// A read-back of `written` (`op`) the CDU refuses with exception `code`.
pub(super) fn refused(written: &[Write], op: &str, code: u8) -> ReadBack {
    let e = CduError::Refused {
        op: op.into(),
        code,
        meaning: crate::modbus::exception_meaning(code),
    };
    unread(written, e)
}

/// A read-back of `written` (`op`) the CDU does not answer in 500 ms.
pub(super) fn unanswered(written: &[Write], op: &str) -> ReadBack {
    let e = CduError::NoAnswer {
        op: op.into(),
        after_ms: 500,
    };
    unread(written, e)
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

/// `f` run to its end on a runtime of its own.
pub(super) fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(f)
}

/// A plan of every setting, each at 1.
pub(super) fn every_setting() -> Plan {
    let mut plan = Plan::default();
    for setting in Setting::ORDER {
        let w = Write {
            setting,
            value: 1.0,
        };
        plan.writes.push(w).unwrap();
    }
    plan
}

/// Whether the heartbeat of `o` was written and went in.
pub(super) fn beat(o: &Outcome) -> bool {
    (o.tried.iter()).any(|(s, r)| *s == Setting::Heartbeat && r.is_ok())
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
    let o = run(d.write(&plan, s * 1000, &mut ShellStats::default()));
    decider.written(&o);
    (c, o)
}

/// A decider on `cdu`'s map, and the devices on `cdu`.
pub(super) fn started<P: CduPort>(cdu: P) -> (Decider, Devices<P>) {
    let fresh: Result<Option<crate::decide::LatchRecord>, &str> = Ok(None);
    let decider = Decider::new(CoreConfig::default(), cdu.limits(), &fresh).unwrap();
    (decider, Devices::new(cdu, None))
}

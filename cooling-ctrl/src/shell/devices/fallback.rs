//! A CDU whose own fallback writes its values into the command
//! registers once its watchdog sees no heartbeat: the controller, its
//! heartbeat held back, writes its safety settings again each step and
//! reads them back; once they read held the heartbeat goes out again, the
//! CDU leaves its fallback, and the mode reads normal.
use super::scripted::{beat, measured, not_held, run, started, step, Script, Scripted};
use super::*;
use crate::modbus::{CduError, ReadBack};
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

/// The CDU's own fallback's pumps to run: both.
const FALLBACK_PUMPS: f64 = 3.0;

/// A CDU with a watchdog of `watchdog` steps: the steps since the last
/// heartbeat written, and whether it runs its own fallback (from its
/// watchdog's end to the next heartbeat), writing its pumps to run into
/// the register at each of its cycles (each read). While `ignores`, it
/// echoes the pumps to run but holds none.
struct Fallback {
    watchdog: u32,
    since_beat: u32,
    fallback: bool,
    ignores: bool,
    pumps_run: f64,
}

impl Script for Fallback {
    fn read(&mut self) -> Result<CduMeasurements, CduError> {
        self.since_beat += 1;
        self.fallback |= self.since_beat > self.watchdog;
        if self.fallback {
            self.pumps_run = FALLBACK_PUMPS;
        }
        Ok(CduMeasurements::default())
    }
    fn write(&mut self, w: &Write) -> Result<(), CduError> {
        match w.setting {
            Setting::Heartbeat => {
                self.since_beat = 0;
                self.fallback = false;
            }
            Setting::PumpsRun if self.ignores => self.pumps_run = 0.0,
            Setting::PumpsRun => self.pumps_run = w.value,
            _ => {}
        }
        Ok(())
    }
    fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let pumps = written.iter().find(|w| w.setting == Setting::PumpsRun);
        match pumps {
            Some(w) if w.value != self.pumps_run => {
                let held = format!("value {}", self.pumps_run);
                not_held(vec![Setting::PumpsRun], "pumps_run", 1, &held)
            }
            _ => ReadBack::default(),
        }
    }
}

/// The CDU ignores the pumps to run for 3 steps: the heartbeat is held
/// back, its watchdog runs out and its fallback writes both pumps into
/// the register. Once it takes writes again, the controller's pumps to
/// run, written again, read back held: the heartbeat goes out, the CDU
/// leaves its fallback, and the mode reads normal again.
#[test]
fn a_cdu_whose_fallback_overwrites_the_pumps_gets_its_heartbeat_back() {
    let cdu = Scripted(Fallback {
        watchdog: 3,
        since_beat: 0,
        fallback: false,
        ignores: false,
        pumps_run: 1.0,
    });
    let (mut decider, mut d) = started(cdu);
    let mut trace = Vec::new();
    for s in 0..40 {
        d.cdu.ignores = (10..16).contains(&s);
        run(d.read_cdu(&mut ShellStats::default()));
        let (c, o) = step(&mut decider, &mut d, s, &measured(true, 0));
        let beat = beat(&o);
        let pumps = (o.tried.iter()).find(|(s, _)| *s == Setting::PumpsRun);
        trace.push((s, beat, d.cdu.fallback, c.mode, c.reason, pumps.cloned()));
    }
    let fell_back = trace.iter().any(|t| t.2);
    assert!(fell_back, "the CDU's watchdog ran out: {trace:?}");
    let last = &trace[trace.len() - 1];
    assert!(
        last.1 && !last.2,
        "heartbeat back, fallback left: {trace:?}"
    );
    assert_eq!(
        (last.3, last.4),
        (CduMode::Normal, ReasonCode::OK),
        "{trace:?}"
    );
}

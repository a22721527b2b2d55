//! A CDU that answers the read-back, finds a safety setting not held,
//! then refuses every read-back after with exception 1 or 2: the setting
//! stays not held (the heartbeat held back, the pumps not taken) until a
//! read-back reads it held, and what is said names the refusal.
use super::never_read_back::{measured, started, step};
use super::*;
use crate::modbus::{CduError, ReadBack};
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;

/// A CDU that echoes every write; its read-back reads the pumps to run
/// not held while `unheld`, and is refused with exception `refuses`
/// (1 or 2) once set.
struct RefusesLater {
    unheld: bool,
    refuses: Option<u8>,
}

impl CduPort for RefusesLater {
    async fn read(&mut self) -> Result<CduMeasurements, CduError> {
        Ok(CduMeasurements::default())
    }
    async fn write_setting(&mut self, _: &Write) -> Result<(), CduError> {
        Ok(())
    }
    async fn read_back(&mut self, written: &[Write]) -> ReadBack {
        let settings: Vec<Setting> = written.iter().map(|w| w.setting).collect();
        if let Some(code) = self.refuses {
            let e = CduError::Refused {
                op: "read back holding 0-2".into(),
                code,
                meaning: crate::modbus::exception_meaning(code),
            };
            return ReadBack {
                unread: vec![(settings, e)],
                ..ReadBack::default()
            };
        }
        if !self.unheld || !settings.contains(&Setting::PumpsRun) {
            return ReadBack::default();
        }
        let e = CduError::BadAnswer {
            op: "write pumps_run at holding 1".into(),
            detail: "holding 1 reads back value 0".into(),
        };
        ReadBack {
            not_held: vec![(vec![Setting::PumpsRun], e)],
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

/// The pumps to run read back not held at step 12; from step 13 every
/// read-back is refused (exception 1, then 2): the heartbeat stays held
/// back, the pumps not taken, the mode `heartbeat-held`, and the write
/// failure said names the refused read-back.
#[test]
fn a_setting_not_held_stays_not_held_over_read_backs_refused_by_exception() {
    for code in [1, 2] {
        let cdu = RefusesLater {
            unheld: false,
            refuses: None,
        };
        let (mut decider, mut d) = started(cdu);
        for s in 0..30 {
            d.cdu.unheld = s == 12;
            d.cdu.refuses = (s >= 13).then_some(code);
            let (c, o) = step(&mut decider, &mut d, s, &measured(true, 0));
            if s < 13 {
                continue;
            }
            let beat = (o.tried.iter()).any(|(s, r)| *s == Setting::Heartbeat && r.is_ok());
            assert!(!beat, "{code}: step {s}: the heartbeat written: {o:?}");
            assert!(!o.taken().pumps, "{code}: step {s}: pumps taken: {o:?}");
            assert_eq!(
                (c.mode, c.reason),
                (CduMode::Degraded, ReasonCode::HEARTBEAT_HELD),
                "{code}: step {s}"
            );
        }
        let said = d.write_error.0.as_deref().unwrap_or_default();
        assert!(said.contains("refuses the read-back"), "{code}: {said}");
        // What `ctl status` says of the heartbeat held back names the
        // refused read-back.
        let plan = decider.plan_last(Some(0)).expect("stepped");
        let mut stats = ShellStats::default();
        super::never_read_back::run(d.write(&plan, &mut stats));
        let held = stats.heartbeat_held.unwrap_or_default();
        assert!(
            held.contains("pumps_run") && held.contains(&format!("exception {code}")),
            "{code}: {held}"
        );
    }
}

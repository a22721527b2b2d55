//! The figures of a run besides the plant's own accounts (`docs/plant-model.md`
//! §8.3): what the controller declared (caps, failsafe, lost leak
//! sensing, lying valve inputs), what became of leaking racks (seconds
//! pumped, valves reopened), pump switchovers and restarts. One tally
//! for every way a scenario is played: the fast runner ([`crate::sim`],
//! one second a step) and the real-time hall ([`crate::hall`], steps of
//! any length), so `simulate` and `play` report the same figures the same
//! way. Time is passed in.
//!
//! Glossary:
//! - *declared*: what the controller says of itself and the hall (its
//!   decision in the runner, its commands in the real shell).

use crate::plant::Totals;
use crate::sim::{ratio, Summary};

/// What the controller declared for a stretch of time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declared {
    /// Hosts it asks a cap of.
    pub caps: usize,
    /// It is in failsafe.
    pub failsafe: bool,
    /// Per rack: leak sensing reported lost.
    pub sensing_lost: Vec<bool>,
    /// Per rack: its valve position input reported not believed.
    pub feedback_alarms: Vec<bool>,
}

/// The running figures.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    cap_host_s: f64,
    failsafe_s: f64,
    leak_pumped_s: f64,
    /// Per rack: its valve was closed while it leaked.
    closed_for_leak: Vec<bool>,
    valve_reopened: u32,
    lead: Option<usize>,
    switchovers: u32,
    sensing_lost: Vec<bool>,
    sensing_alarms: u32,
    feedback: Vec<bool>,
    feedback_alarms: u32,
    restarts: u32,
}

/// Counts the racks newly set in `now` against `was`, and keeps `now`.
fn newly(was: &mut [bool], now: &[bool]) -> u32 {
    let mut n = 0;
    for (r, w) in was.iter_mut().enumerate() {
        let on = now.get(r).copied().unwrap_or(false);
        n += u32::from(on && !*w);
        *w = on;
    }
    n
}

impl Tally {
    /// A tally for a hall of `racks` racks whose CDU starts on lead pump
    /// `lead`.
    pub fn new(racks: usize, lead: usize) -> Self {
        Self {
            lead: Some(lead),
            closed_for_leak: vec![false; racks],
            sensing_lost: vec![false; racks],
            feedback: vec![false; racks],
            ..Default::default()
        }
    }

    /// The controller declared `d` for the next `dt` seconds.
    pub fn declared(&mut self, d: &Declared, dt: f64) {
        self.cap_host_s += d.caps as f64 * dt;
        if d.failsafe {
            self.failsafe_s += dt;
        }
        self.sensing_alarms += newly(&mut self.sensing_lost, &d.sensing_lost);
        self.feedback_alarms += newly(&mut self.feedback, &d.feedback_alarms);
    }

    /// The CDU runs lead pump `lead` (`None`: both or neither).
    pub fn lead(&mut self, lead: Option<usize>) {
        if let Some(l) = lead {
            self.switchovers += u32::from(self.lead.is_some_and(|was| was != l));
            self.lead = Some(l);
        }
    }

    /// The controller's process stopped to start again.
    pub fn restarted(&mut self) {
        self.restarts += 1;
    }

    /// An operator cleared the leak latched on `rack`: a valve closed for
    /// its leak that opens from now on was reopened by an operator's
    /// word, not unattended.
    pub fn cleared(&mut self, rack: usize) {
        if let Some(closed) = self.closed_for_leak.get_mut(rack) {
            *closed = false;
        }
    }

    /// After `dt` seconds of the plant: per rack, it leaks and its valve
    /// is really open, and whether water moved.
    pub fn account(&mut self, leaking: &[bool], valves_open: &[bool], flowing: bool, dt: f64) {
        for (r, closed) in self.closed_for_leak.iter_mut().enumerate() {
            let (leak, open) = (leaking[r], valves_open[r]);
            if leak && open && flowing {
                self.leak_pumped_s += dt;
            }
            if leak && !open {
                *closed = true;
            } else if open && std::mem::take(closed) {
                self.valve_reopened += 1;
            }
        }
    }

    /// The summary of a run of `duration_s` named `scenario` under
    /// `controller`, with the plant's `totals` and the scenario's `leaks`.
    pub fn summary(
        &self,
        scenario: &str,
        controller: &str,
        duration_s: u64,
        t: &Totals,
        leaks: u32,
    ) -> Summary {
        let it_kwh = t.it_j / 3.6e6;
        let facility_kwh = t.facility_j / 3.6e6;
        let work_gpu_h = t.work_gpu_s / 3600.0;
        Summary {
            scenario: scenario.to_string(),
            controller: controller.to_string(),
            duration_s,
            it_kwh,
            facility_kwh,
            pue: ratio(facility_kwh, it_kwh),
            work_gpu_h,
            kwh_per_work_gpu_h: ratio(facility_kwh, work_gpu_h),
            max_gpu_temp_c: t.max_gpu_c,
            gpu_s_above_max_operating: t.gpu_s_above_max_operating.round() as u64,
            slowdown_episodes: t.slowdown_episodes,
            shutdowns: t.shutdowns,
            cap_requests: self.cap_host_s.round() as u64,
            failsafe_s: self.failsafe_s.round() as u64,
            leaks,
            leak_pumped_s: self.leak_pumped_s.round() as u64,
            pump_switchovers: self.switchovers,
            valve_reopened_unattended: self.valve_reopened,
            leak_sensing_alarms: self.sensing_alarms,
            valve_feedback_alarms: self.feedback_alarms,
            controller_restarts: self.restarts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_of_any_length_count_the_same_seconds() {
        let mut whole = Tally::new(2, 0);
        let mut quarters = Tally::new(2, 0);
        let d = Declared {
            caps: 3,
            failsafe: true,
            sensing_lost: vec![false, true],
            feedback_alarms: vec![],
        };
        for _ in 0..4 {
            whole.declared(&d, 1.0);
            whole.account(&[true, false], &[true, true], true, 1.0);
        }
        for _ in 0..16 {
            quarters.declared(&d, 0.25);
            quarters.account(&[true, false], &[true, true], true, 0.25);
        }
        let t = Totals::default();
        let (a, b) = (
            whole.summary("s", "c", 4, &t, 1),
            quarters.summary("s", "c", 4, &t, 1),
        );
        assert_eq!(a, b);
        assert_eq!((a.cap_requests, a.failsafe_s, a.leak_pumped_s), (12, 4, 4));
        assert_eq!(a.leak_sensing_alarms, 1);
        // A valve closed for a leak that opens again is counted once.
        let mut t2 = Tally::new(1, 0);
        t2.account(&[true], &[false], true, 1.0);
        t2.account(&[false], &[true], true, 1.0);
        t2.account(&[false], &[true], true, 1.0);
        assert_eq!(t2.summary("s", "c", 3, &t, 1).valve_reopened_unattended, 1);
        // One an operator cleared first is not.
        let mut t3 = Tally::new(2, 0);
        t3.account(&[true, true], &[false, false], true, 1.0);
        t3.account(&[false, false], &[false, false], true, 1.0);
        t3.cleared(0);
        t3.account(&[false, false], &[true, true], true, 1.0);
        assert_eq!(
            t3.summary("s", "c", 3, &t, 2).valve_reopened_unattended,
            1,
            "rack 1 only"
        );
        t2.lead(Some(0));
        t2.lead(None);
        t2.lead(Some(1));
        assert_eq!(t2.summary("s", "c", 3, &t, 1).pump_switchovers, 1);
    }
}

//! Hosts follow their agents (`docs/plant-model.md` §2.6): what the
//! simulated hosts do with their GPUs when a node
//! agent quarantines one or the controller tells a host its cooling is
//! lost.
//!
//! - A GPU its node agent quarantines has its job drained [`DRAIN_S`]
//!   seconds later: from then its demand is 0 (it stays powered, idle).
//! - A host told that its cooling is lost drains within [`DRAIN_S`] and
//!   then powers its GPUs down (P = 0, no work). Until then its jobs run
//!   (under whatever cap the controller asked for).
//! - A host told that its cooling is back powers its GPUs up again at once
//!   and its jobs resume: the operator restarts them.
//! - In the one-command hall the hosts follow their real agents instead:
//!   a host powers down when its agent says it ran its power-down
//!   ([`HostFollow::power_down`], after the agent's own grace period) and
//!   up when its agent says cooling is back.
//!
//! GPU-time lost this way is lost work, not a shutdown.
//!
//! Pure: times are passed in, in seconds of the caller's clock.
//!
//! Glossary:
//! - *drained*: the GPU's job is gone; demand 0.
//! - *powered down*: the host switched the GPU off; P = 0.

/// How long a host takes to drain a job, s.
pub const DRAIN_S: f64 = 30.0;

/// A rounding allowance on times, s (clocks that add up fractional steps).
const EPS_S: f64 = 1e-6;

/// What the hosts of a hall have been told, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct HostFollow {
    gpus_per_host: usize,
    /// Per GPU: quarantined since, s.
    quarantined: Vec<Option<f64>>,
    /// Per host: when its GPUs power down (told its cooling is lost, plus
    /// [`DRAIN_S`]; or when its agent powered them down), s.
    cooling_lost: Vec<Option<f64>>,
}

impl HostFollow {
    /// `hosts` hosts of `gpus_per_host` GPUs each; GPU `i` is on host
    /// `i / gpus_per_host`. Nothing quarantined, cooling everywhere.
    pub fn new(hosts: usize, gpus_per_host: usize) -> Self {
        Self {
            gpus_per_host: gpus_per_host.max(1),
            quarantined: vec![None; hosts * gpus_per_host],
            cooling_lost: vec![None; hosts],
        }
    }

    /// An agent quarantined GPU `gpu` at `t`: its job is drained from
    /// `t + DRAIN_S`. A second call keeps the first time.
    pub fn quarantine(&mut self, gpu: usize, t: f64) {
        if let Some(q) = self.quarantined.get_mut(gpu) {
            q.get_or_insert(t);
        }
    }

    /// The agent released GPU `gpu`: it takes work again at once.
    pub fn release(&mut self, gpu: usize) {
        if let Some(q) = self.quarantined.get_mut(gpu) {
            *q = None;
        }
    }

    /// Host `host` was told at `t` that its cooling is lost: it drains and
    /// powers its GPUs down at `t + DRAIN_S`. Telling it again keeps the
    /// first time.
    pub fn cooling_lost(&mut self, host: usize, t: f64) {
        if let Some(c) = self.cooling_lost.get_mut(host) {
            c.get_or_insert(t + DRAIN_S);
        }
    }

    /// Host `host`'s agent powered its GPUs down at `t`: from then they
    /// draw nothing and do no work (an earlier time already set stands).
    pub fn power_down(&mut self, host: usize, t: f64) {
        if let Some(c) = self.cooling_lost.get_mut(host) {
            *c = Some(c.map_or(t, |at| at.min(t)));
        }
    }

    /// Host `host` was told its cooling is back: its GPUs are powered and
    /// its jobs resume at once (the operator restarts them).
    pub fn cooling_restored(&mut self, host: usize) {
        if let Some(c) = self.cooling_lost.get_mut(host) {
            *c = None;
        }
    }

    /// Whether host `host` has been told its cooling is lost.
    pub fn is_cooling_lost(&self, host: usize) -> bool {
        self.cooling_lost.get(host).is_some_and(Option::is_some)
    }

    fn due(since: Option<f64>, t: f64) -> bool {
        since.is_some_and(|s| t + EPS_S >= s + DRAIN_S)
    }

    /// Whether GPU `gpu` is powered down at `t`.
    pub fn powered_down(&self, gpu: usize, t: f64) -> bool {
        let host = gpu / self.gpus_per_host;
        self.cooling_lost
            .get(host)
            .copied()
            .flatten()
            .is_some_and(|at| t + EPS_S >= at)
    }

    /// Whether GPU `gpu`'s job is drained at `t` (quarantined, or its host
    /// powered down).
    pub fn drained(&self, gpu: usize, t: f64) -> bool {
        Self::due(self.quarantined.get(gpu).copied().flatten(), t) || self.powered_down(gpu, t)
    }

    /// Applies what the hosts do at `t` to the scenario's `demand` (per
    /// GPU; drained GPUs get 0) and returns the per-GPU powered-down flags
    /// for the plant.
    pub fn apply(&self, t: f64, demand: &mut [f64]) -> Vec<bool> {
        for (i, u) in demand.iter_mut().enumerate() {
            if self.drained(i, t) {
                *u = 0.0;
            }
        }
        (0..demand.len()).map(|i| self.powered_down(i, t)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plant::{Actuation, Conditions, Plant, SiteConfig};

    #[test]
    fn a_quarantined_gpu_is_drained_exactly_from_30_s_later() {
        let mut f = HostFollow::new(2, 4);
        f.quarantine(5, 100.0);
        f.quarantine(5, 120.0); // told again: the first time stands
        let at = |t: f64| {
            let mut d = vec![0.8; 8];
            let down = f.apply(t, &mut d);
            (d, down)
        };
        let (d, down) = at(129.0);
        assert_eq!(d[5], 0.8, "still running 29 s after");
        assert!(down.iter().all(|x| !x));
        let (d, down) = at(130.0);
        assert_eq!(d[5], 0.0, "drained at 30 s");
        assert_eq!(d.iter().filter(|&&u| u == 0.0).count(), 1, "only that one");
        assert!(down.iter().all(|x| !x), "drained, still powered");
        // A clock of tenths of a second gets there too.
        let t = (0..300).fold(100.0, |t, _| t + 0.1);
        assert!(f.drained(5, t));
        f.release(5);
        assert!(!f.drained(5, 500.0), "released: takes work again");
    }

    #[test]
    fn a_host_told_its_cooling_is_lost_powers_down_30_s_later_and_up_when_told() {
        let mut f = HostFollow::new(2, 4);
        f.cooling_lost(1, 50.0);
        f.cooling_lost(1, 60.0);
        assert!(f.is_cooling_lost(1) && !f.is_cooling_lost(0));
        let mut d = vec![0.9; 8];
        let down = f.apply(79.0, &mut d);
        assert_eq!(d, vec![0.9; 8], "draining: jobs still run");
        assert!(down.iter().all(|x| !x));
        let down = f.apply(80.0, &mut d);
        assert_eq!(&d[..4], &[0.9; 4], "host 0 untouched");
        assert_eq!(&d[4..], &[0.0; 4]);
        assert_eq!(down, [[false; 4], [true; 4]].concat());
        f.cooling_restored(1);
        let mut d = vec![0.9; 8];
        let down = f.apply(81.0, &mut d);
        assert_eq!(d, vec![0.9; 8], "jobs restarted");
        assert!(down.iter().all(|x| !x));
    }

    #[test]
    fn a_host_whose_agent_powered_down_is_down_at_once_until_cooling_is_back() {
        let mut f = HostFollow::new(2, 2);
        f.power_down(0, 40.0);
        assert!(!f.powered_down(0, 39.0), "not before");
        assert!(f.powered_down(0, 40.0) && f.powered_down(1, 40.0));
        assert!(!f.powered_down(2, 40.0), "the other host runs");
        f.cooling_lost(0, 100.0);
        assert!(f.powered_down(0, 41.0), "being told again keeps it down");
        f.cooling_restored(0);
        assert!(!f.powered_down(0, 42.0));
    }

    #[test]
    fn powered_down_gpus_draw_nothing_do_no_work_and_are_not_shutdowns() {
        let site = SiteConfig {
            racks: 2,
            hosts_per_rack: 1,
            gpus_per_host: 4,
            ..SiteConfig::default()
        };
        let mut p = Plant::new(site, 40.0);
        let n = p.gpus().len();
        let mut act = Actuation {
            setpoint_c: 40.0,
            pump_speed: 1.0,
            pump_on: [true, false],
            valves: vec![true; 2],
            caps: vec![None; n],
            powered_down: Vec::new(),
        };
        let mut f = HostFollow::new(2, 4);
        let mut hot = 0.0f64;
        for t in 0..900 {
            let t = f64::from(t);
            if t == 100.0 {
                // A leak: rack 1's valve closes, its host is capped to the
                // minimum and told its cooling is lost.
                f.cooling_lost(1, t);
                act.valves = vec![true, false];
                act.caps[4..].fill(Some(200.0));
            }
            let mut cond = Conditions {
                ambient_c: 20.0,
                demand: vec![1.0; n],
                pump_tripped: [false; 2],
                plate_factor: Vec::new(),
                chiller_tripped: false,
                dry_cooler_fraction: 1.0,
            };
            act.powered_down = f.apply(t, &mut cond.demand);
            p.step(1.0, &act, &cond);
            if t == 129.0 {
                assert!(p.gpus()[4..]
                    .iter()
                    .all(|g| !g.powered_down && g.power > 0.0));
                hot = p.gpus()[4].t_j;
            }
            if t >= 130.0 {
                for g in &p.gpus()[4..] {
                    assert!(g.powered_down && !g.shut_down);
                    assert_eq!((g.power, g.work, g.slowdown), (0.0, 0.0, false));
                }
            }
        }
        let g = p.gpus()[4];
        assert!(
            g.t_j <= hot + 1e-9,
            "relaxes, never heats: {hot} -> {}",
            g.t_j
        );
        let t = p.totals();
        assert_eq!((t.shutdowns, t.slowdown_episodes), (0, 0));
        assert_eq!(t.powered_down_gpu_s, 4.0 * (900.0 - 130.0));
        assert!(
            p.gpus()[..4].iter().all(|g| g.work > 0.9),
            "host 0 works on"
        );
    }
}

//! Coordination: power caps for the hosts when the water cannot carry
//! their heat.
//!
//! The water answers in minutes, a GPU's power limit in a second. When a
//! host's hottest GPU is near the cap target, or would pass it at its
//! present power on the coolant to come, the host is asked to cap every
//! GPU at the power its thermal margin allows:
//! `cap = (cap_target − coolant_ahead) / R_host`, where `R_host` is what the
//! host's reports say its hottest GPU's resistance to the coolant is (°C
//! per W per GPU) and `coolant_ahead` is the coolant temperature now plus
//! its rise above the setpoint over the next 30 s (about a GPU's thermal
//! time constant: a cap acts within a second, so looking further ahead
//! caps early and costs work the margins did not require). A cap falls at
//! once, rises at most 2 W per GPU per second, and is lifted when the host
//! could run at its full limit for `cap_release_ms`. A host with no fresh
//! report keeps its cap at its last figure (fail closed: nothing says it
//! may draw more). A rack whose cooling is lost (a latched leak) has its
//! hosts capped to their minimum.
//!
//! Glossary:
//! - *coolant ahead*: the coolant temperature the caps are sized for.
//! - *capacity cap*: a cap for lack of cooling (not for a leak).

use super::config::CoreConfig;
use super::view::{Seen, Tick};
use super::{HostCap, HostReport, MAX_HOSTS};
use loopwarden_protocol::ReasonCode;

/// Seconds ahead the coolant's rise is projected.
const HORIZON_S: f32 = 30.0;
/// Fastest rise of a cap, W per GPU per second.
const RISE_W_PER_S: f32 = 2.0;
/// A host within this of the cap target is judged, K.
const WATCH_K: f32 = 2.0;

/// The caps in force and what they were sized from.
#[derive(Debug, Clone)]
pub struct Coordinator {
    caps: [Option<f32>; MAX_HOSTS],
    free_since: [Option<u64>; MAX_HOSTS],
    excess_prev: Option<f32>,
    excess_rate: f32,
    coolant: Option<f32>,
}

impl Default for Coordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl Coordinator {
    /// No cap in force.
    pub const fn new() -> Self {
        Self {
            caps: [None; MAX_HOSTS],
            free_since: [None; MAX_HOSTS],
            excess_prev: None,
            excess_rate: 0.0,
            coolant: None,
        }
    }
}

impl Coordinator {
    /// The coolant temperature the caps were last sized for.
    pub fn coolant_c(&self) -> Option<f32> {
        self.coolant
    }

    /// The capacity cap on host `h`, W per GPU.
    pub fn cap(&self, h: usize) -> Option<f32> {
        self.caps.get(h).copied().flatten()
    }

    /// The coordination layer's part of step `t`: fills `out` with the
    /// caps per host, sized for the trusted `supply` (else the supply the
    /// GPUs imply), the setpoint commanded and the hosts' learned thermal
    /// `factor`; true when a capacity cap is in force.
    pub(crate) fn caps(
        &mut self,
        t: &Tick<'_>,
        seen: &Seen,
        supply: Option<f32>,
        setpoint_c: f32,
        factor: &dyn Fn(usize) -> f32,
        out: &mut [Option<HostCap>; MAX_HOSTS],
    ) -> bool {
        self.step(
            &t.cfg,
            t.now,
            t.dt,
            supply.or(seen.gpu_implied_supply),
            setpoint_c,
            seen.r_now,
            &|h| t.fresh(h),
            factor,
            t.cooling_lost,
            out,
        )
    }

    /// One step: fills `out` with the caps per host; true when a capacity
    /// cap is in force.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        cfg: &CoreConfig,
        now_ms: u64,
        dt_s: f32,
        coolant_c: Option<f32>,
        setpoint_c: f32,
        r_model: f32,
        fresh: &dyn Fn(usize) -> Option<HostReport>,
        factor: &dyn Fn(usize) -> f32,
        leaks_latched: u16,
        out: &mut [Option<HostCap>; MAX_HOSTS],
    ) -> bool {
        let g = &cfg.gpu;
        let lay = cfg.layout;
        // How fast the coolant climbs above what was asked of it.
        if let Some(c) = coolant_c {
            let excess = (c - setpoint_c).max(0.0);
            if let (Some(prev), true) = (self.excess_prev, dt_s > 0.0) {
                let rate = (excess - prev) / dt_s;
                self.excess_rate += (rate - self.excess_rate) * (dt_s / 30.0).min(1.0);
            }
            self.excess_prev = Some(excess);
        }
        self.coolant = coolant_c;
        let ahead = coolant_c.map(|c| c + self.excess_rate.max(0.0) * HORIZON_S);
        let mut any = false;
        for (h, slot) in out.iter_mut().enumerate().take(lay.hosts()) {
            let rack = lay.rack_of(h);
            if rack < 16 && leaks_latched & (1 << rack) != 0 {
                *slot = Some(HostCap {
                    watts: g.min_cap_w,
                    reason: ReasonCode::COOLING_LOST,
                });
                self.caps[h] = None;
                self.free_since[h] = None;
                continue;
            }
            // Nothing new to size from leaves a cap in force as it is (the
            // host lets it lapse only if it hears nothing). A host not
            // heard is not known free: its free time starts again.
            let report = fresh(h);
            if report.is_none() {
                self.free_since[h] = None;
            }
            if let (Some(r), Some(ahead), Some(coolant)) = (report, ahead, coolant_c) {
                self.resize(cfg, h, now_ms, dt_s, &r, coolant, ahead, r_model, factor(h));
            }
            if let Some(c) = self.caps[h] {
                *slot = Some(HostCap {
                    watts: c,
                    reason: ReasonCode::CAPACITY_SHORT,
                });
                any = true;
            }
        }
        any
    }

    /// Sizes host `h`'s capacity cap from its report `r`.
    #[allow(clippy::too_many_arguments)]
    fn resize(
        &mut self,
        cfg: &CoreConfig,
        h: usize,
        now_ms: u64,
        dt_s: f32,
        r: &HostReport,
        coolant: f32,
        ahead: f32,
        r_model: f32,
        factor: f32,
    ) {
        let g = &cfg.gpu;
        let target = cfg.margins.cap_target_c;
        let p = r.gpu_power_w / r.gpus.max(1) as f32;
        // The host's own resistance, from its reports when it draws
        // enough power to tell, else the model's times its learned factor.
        let r_host = if p > 150.0 {
            ((r.hottest_c - coolant) / p).max(0.5 * r_model)
        } else {
            r_model * factor.max(1.0)
        };
        let allowed = (target - ahead) / r_host;
        if !allowed.is_finite() {
            return;
        }
        let allowed = allowed.clamp(g.min_cap_w, g.tdp_w);
        let at_limit = r.hottest_c + (ahead - coolant) > target;
        let near = r.hottest_c > target - WATCH_K;
        match self.caps[h] {
            None => {
                if near && (at_limit || allowed < p - 5.0) && allowed < g.tdp_w {
                    self.caps[h] = Some(allowed);
                    self.free_since[h] = None;
                }
            }
            Some(cur) => {
                if allowed >= g.tdp_w && r.hottest_c < target - 1.0 {
                    let since = *self.free_since[h].get_or_insert(now_ms);
                    if now_ms.saturating_sub(since) >= cfg.timing.cap_release_ms {
                        self.caps[h] = None;
                        self.free_since[h] = None;
                    } else {
                        self.caps[h] = Some((cur + RISE_W_PER_S * dt_s).min(g.tdp_w));
                    }
                } else {
                    self.free_since[h] = None;
                    let next = if allowed < cur {
                        allowed
                    } else {
                        (cur + RISE_W_PER_S * dt_s).min(allowed)
                    };
                    self.caps[h] = Some(next);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(hot: f32, per_gpu_w: f32) -> HostReport {
        HostReport {
            gpus: 8,
            hottest_c: hot,
            gpu_power_w: 8.0 * per_gpu_w,
            limit_w: 700.0,
            slowdown: false,
            at_ms: 0,
        }
    }

    /// Steps one host at `hot` °C and `per_gpu_w` on `coolant` for
    /// `secs` seconds; returns its cap.
    #[allow(clippy::too_many_arguments)]
    fn run(
        c: &mut Coordinator,
        cfg: &CoreConfig,
        from_s: u64,
        secs: u64,
        hot: f32,
        per_gpu_w: f32,
        coolant: f32,
        leaks: u16,
    ) -> Option<HostCap> {
        let mut out = [None; MAX_HOSTS];
        for s in from_s..from_s + secs {
            out = [None; MAX_HOSTS];
            let r = report(hot, per_gpu_w);
            c.step(
                cfg,
                s * 1000,
                1.0,
                Some(coolant),
                coolant,
                0.045,
                &|h| (h == 0).then_some(r),
                &|_| 1.0,
                leaks,
                &mut out,
            );
        }
        out[0]
    }

    #[test]
    fn a_host_at_its_limit_is_capped_to_what_its_margin_allows() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        // 86 °C on 55 °C coolant at 680 W a GPU: R = 31/680 K/W.
        let cap = run(&mut c, &cfg, 0, 1, 86.0, 680.0, 55.0, 0).expect("capped");
        let want = (cfg.margins.cap_target_c - 55.0) / (31.0 / 680.0);
        assert!((cap.watts - want).abs() < 1.0, "{cap:?} vs {want}");
        assert_eq!(cap.reason, ReasonCode::CAPACITY_SHORT);
        // A cool host is left alone.
        let mut c = Coordinator::default();
        assert_eq!(run(&mut c, &cfg, 0, 30, 70.0, 680.0, 40.0, 0), None);
    }

    #[test]
    fn a_cap_is_lifted_only_after_capacity_has_been_back_for_the_release_time() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        assert!(run(&mut c, &cfg, 0, 1, 86.0, 680.0, 55.0, 0).is_some());
        // Cooler water: it could run at full power now.
        let release = cfg.timing.cap_release_ms / 1000;
        assert!(run(&mut c, &cfg, 1, release - 1, 60.0, 500.0, 35.0, 0).is_some());
        assert_eq!(run(&mut c, &cfg, release, 2, 60.0, 500.0, 35.0, 0), None);
    }

    #[test]
    fn the_hosts_of_a_leaking_rack_get_the_minimum_cap() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        let cap = run(&mut c, &cfg, 0, 1, 50.0, 300.0, 30.0, 0b1).expect("capped");
        assert_eq!(cap.watts, cfg.gpu.min_cap_w);
        assert_eq!(cap.reason, ReasonCode::COOLING_LOST);
    }

    /// Steps `c` from `from_s` for `secs` seconds with no fresh report from
    /// any host, on the racks with leaks `leaks`; returns host 0's cap and
    /// whether a capacity cap was in force at the last step.
    fn silent(
        c: &mut Coordinator,
        cfg: &CoreConfig,
        from_s: u64,
        secs: u64,
        leaks: u16,
    ) -> (Option<HostCap>, bool) {
        let (mut out, mut any) = ([None; MAX_HOSTS], false);
        for s in from_s..from_s + secs {
            out = [None; MAX_HOSTS];
            any = c.step(
                cfg,
                s * 1000,
                1.0,
                Some(55.0),
                55.0,
                0.045,
                &|_| None,
                &|_| 1.0,
                leaks,
                &mut out,
            );
        }
        (out[0], any)
    }

    /// A host free for 30 s, then silent for ten minutes, is not lifted at
    /// its first free report back: its free time starts again.
    #[test]
    fn a_silent_stretch_restarts_a_hosts_free_time() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        let first = run(&mut c, &cfg, 0, 1, 86.0, 680.0, 55.0, 0).expect("capped");
        assert!(run(&mut c, &cfg, 1, 30, 60.0, 400.0, 55.0, 0).is_some());
        silent(&mut c, &cfg, 31, 600, 0);
        let back = run(&mut c, &cfg, 631, 1, 60.0, 400.0, 55.0, 0);
        assert!(back.is_some(), "lifted on one report: {first:?}");
    }

    /// A host that falls silent keeps its capacity cap at its last figure
    /// (fail closed: nothing says it may draw more), renewed and counted,
    /// and is sized from its reports again once they return.
    #[test]
    fn a_capacity_cap_on_a_host_that_falls_silent_is_held() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        let first = run(&mut c, &cfg, 0, 1, 86.0, 680.0, 55.0, 0).expect("capped");
        let (cap, any) = silent(&mut c, &cfg, 1, 600, 0);
        assert_eq!(cap.map(|c| c.watts), Some(first.watts));
        assert!(any, "still a capacity cap");
        // Back, far from the cap target: the cap rises from its reports.
        let back = run(&mut c, &cfg, 601, 30, 60.0, 400.0, 55.0, 0);
        assert!(back.is_none_or(|b| b.watts > first.watts), "{back:?}");
    }

    #[test]
    fn a_silent_host_on_a_rack_whose_cooling_is_lost_keeps_its_minimum_cap() {
        let cfg = CoreConfig::default();
        let mut c = Coordinator::default();
        let (cap, any) = silent(&mut c, &cfg, 0, 600, 0b1);
        let cap = cap.expect("the minimum cap stands");
        assert_eq!(cap.watts, cfg.gpu.min_cap_w);
        assert_eq!(cap.reason, ReasonCode::COOLING_LOST);
        assert!(!any, "no capacity cap");
    }
}

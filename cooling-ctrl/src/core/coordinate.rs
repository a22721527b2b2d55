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
//! its rise above the setpoint over the next two minutes. A cap falls at
//! once, rises at most 2 W per GPU per second, and is lifted when the host
//! could run at its full limit for `cap_release_ms`. A rack whose cooling
//! is lost (a latched leak) has its hosts capped to their minimum.
//!
//! Glossary:
//! - *coolant ahead*: the coolant temperature the caps are sized for.
//! - *capacity cap*: a cap for lack of cooling (not for a leak).

use super::config::CoreConfig;
use super::{HostCap, HostReport, MAX_HOSTS};
use loopwarden_protocol::ReasonCode;

/// Seconds ahead the coolant's rise is projected.
const HORIZON_S: f32 = 120.0;
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
        offsets: &[f32; MAX_HOSTS],
        leaks_latched: u16,
        out: &mut [Option<HostCap>; MAX_HOSTS],
    ) -> bool {
        let g = &cfg.gpu;
        let lay = cfg.layout;
        let target = cfg.margins.cap_target_c;
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
        for h in 0..lay.hosts() {
            let rack = lay.rack_of(h);
            if rack < 16 && leaks_latched & (1 << rack) != 0 {
                out[h] = Some(HostCap {
                    watts: g.min_cap_w,
                    reason: ReasonCode::COOLING_LOST,
                });
                self.caps[h] = None;
                self.free_since[h] = None;
                continue;
            }
            let (Some(r), Some(ahead), Some(coolant)) = (fresh(h), ahead, coolant_c) else {
                // Nothing new to size from: a cap in force stays (the host
                // lets it lapse if it hears nothing).
                if let Some(c) = self.caps[h] {
                    out[h] = Some(HostCap {
                        watts: c,
                        reason: ReasonCode::CAPACITY_SHORT,
                    });
                    any = true;
                }
                continue;
            };
            let p = r.gpu_power_w / r.gpus.max(1) as f32;
            // The host's own resistance, from its reports when it draws
            // enough power to tell, else the model's with its offset.
            let r_host = if p > 150.0 {
                ((r.hottest_c - coolant) / p).max(0.5 * r_model)
            } else {
                r_model + offsets[h].max(0.0) / g.tdp_w
            };
            let allowed = (target - ahead) / r_host;
            if !allowed.is_finite() {
                if let Some(c) = self.caps[h] {
                    out[h] = Some(HostCap {
                        watts: c,
                        reason: ReasonCode::CAPACITY_SHORT,
                    });
                    any = true;
                }
                continue;
            }
            let allowed = allowed.clamp(g.min_cap_w, g.tdp_w);
            let at_limit = r.hottest_c + (ahead - coolant) > target - 0.5;
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
            if let Some(c) = self.caps[h] {
                out[h] = Some(HostCap {
                    watts: c,
                    reason: ReasonCode::CAPACITY_SHORT,
                });
                any = true;
            }
        }
        any
    }
}

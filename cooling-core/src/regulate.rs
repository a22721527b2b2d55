//! Regulation: the second layer. From the mode's targets (the boot or
//! failsafe setpoint, or the optimiser's proposal) to what the CDU is
//! told, through three PI loops ([`Pi`]: anti-windup, output limits):
//! - the *margin loop* lowers the setpoint while the hottest GPU runs above
//!   the plan ceiling (it only gives back while the supply sits well above
//!   its setpoint: then the water is short, not the setpoint);
//! - the *supply loop* trims the setpoint the CDU is given so the measured
//!   supply meets the target;
//! - the *flow loop* trims the pump speed to the flow asked for.
//!
//! Then the CDU's bounds, then the slews: warming and slowing slowly
//! ([`slew`]), cooling and speeding up at once.
//!
//! Glossary:
//! - *target*: the setpoint and speed the mode and the margin loop ask for.
//! - *trim*: what the supply and flow loops add to the target while
//!   tracking closely (a big error is capacity, not an offset).
//! - *last good setpoint*: the target of the last step in normal or
//!   degraded mode; failsafe runs no warmer.

use loopwarden_protocol::message::CduMode;

use super::config::CoreConfig;
use super::optimise::Proposal;
use super::pid::{slew, Pi};
use super::sensors::Trusted;
use super::view::{Seen, Tick};

/// The loops and what they last commanded.
#[derive(Debug, Clone)]
pub struct Regulator {
    setpoint_c: f32,
    speed: f32,
    last_good_setpoint_c: f32,
    margin: Pi,
    supply_trim: Pi,
    flow_trim: Pi,
}

impl Regulator {
    /// Booting: `boot_setpoint_c` at full speed, the loops at rest.
    pub const fn new(boot_setpoint_c: f32) -> Self {
        Self {
            setpoint_c: boot_setpoint_c,
            speed: 1.0,
            last_good_setpoint_c: boot_setpoint_c,
            margin: Pi::new(0.5, 0.01, 0.0, 20.0),
            supply_trim: Pi::new(0.0, 0.005, -2.0, 2.0),
            flow_trim: Pi::new(0.0, 0.002, -0.1, 0.1),
        }
    }

    /// The setpoint last commanded, °C.
    pub fn setpoint_c(&self) -> f32 {
        self.setpoint_c
    }

    /// The pump speed last commanded, fraction of full.
    pub fn speed(&self) -> f32 {
        self.speed
    }

    /// Setpoint taken off by the margin loop, K; the supply loop's
    /// setpoint trim, K; the flow loop's speed trim, fraction.
    pub fn trims(&self) -> (f32, f32, f32) {
        (
            self.margin.integral(),
            self.supply_trim.integral(),
            self.flow_trim.integral(),
        )
    }

    /// Step `t` in `mode` towards the optimiser's `prop`, on the readings
    /// `trusted`, what the step has `seen` and whether a pump is `running`;
    /// true when the pump speed moved enough to be a transient.
    pub fn step(
        &mut self,
        t: &Tick<'_>,
        mode: CduMode,
        prop: &Proposal,
        trusted: &Trusted,
        seen: &Seen,
        running: bool,
    ) -> bool {
        let (cfg, dt) = (&t.cfg, t.dt);
        let (target_sp, target_speed) = self.targets(cfg, mode, prop, trusted.supply, seen, dt);
        if matches!(mode, CduMode::Normal | CduMode::Degraded) {
            self.last_good_setpoint_c = target_sp;
        }
        // Supply and flow loops trim what the CDU is told, while tracking
        // closely (a big error is capacity, not an offset).
        let mut sp_cmd = target_sp;
        if let (Some(s), false) = (trusted.supply, trusted.estimated.supply) {
            let e = target_sp - s;
            let e = if e.abs() < 1.5 && !seen.transient {
                e
            } else {
                0.0
            };
            sp_cmd += self.supply_trim.step(e, dt);
        }
        let mut speed_cmd = target_speed;
        if let (Some(f), true, false) = (trusted.flow, running, trusted.estimated.flow) {
            let want = cfg.cdu.design_lpm_per_gpu * cfg.layout.gpus() as f32 * target_speed;
            let e = (want - f) / (cfg.cdu.design_lpm_per_gpu * cfg.layout.gpus() as f32);
            let e = if e.abs() < 0.1 && !seen.transient {
                e
            } else {
                0.0
            };
            speed_cmd += self.flow_trim.step(e, dt);
        }
        self.bound_and_slew(cfg, sp_cmd, speed_cmd, dt)
    }

    /// The setpoint and speed the mode asks for, the setpoint less what
    /// the margin loop takes off (from the hottest GPU `seen`, on the
    /// trusted `supply`).
    fn targets(
        &mut self,
        cfg: &CoreConfig,
        mode: CduMode,
        prop: &Proposal,
        supply: Option<f32>,
        seen: &Seen,
        dt: f32,
    ) -> (f32, f32) {
        let (mut target_sp, mut target_speed) = match mode {
            CduMode::Boot => (cfg.margins.boot_setpoint_c, 1.0),
            CduMode::Failsafe => (
                self.last_good_setpoint_c
                    .min(cfg.margins.failsafe_setpoint_c),
                1.0,
            ),
            _ => (prop.setpoint_c, prop.speed),
        };
        if mode != CduMode::Boot {
            // The GPUs' own word: hotter than planned takes water off.
            // While the supply sits well above its setpoint the water is
            // short, not the setpoint: the loop may only give back then.
            let capacity = supply.is_some_and(|s| s > self.setpoint_c + 1.5);
            match seen.hottest {
                Some(h) => {
                    let e = h - cfg.margins.plan_ceiling_c;
                    let m = self.margin.step(if capacity { e.min(0.0) } else { e }, dt);
                    target_sp -= m;
                    if h > cfg.margins.cap_target_c {
                        target_speed = 1.0;
                    }
                }
                None => {
                    // No GPU speaks: hold what was learned, forget slowly.
                    self.margin.step(-0.2, dt);
                    target_sp -= self.margin.integral();
                }
            }
        }
        (target_sp, target_speed)
    }

    /// The CDU's bounds, then the slews: warming and slowing slowly, the
    /// rest at once. True when the speed moved enough to be a transient.
    fn bound_and_slew(&mut self, cfg: &CoreConfig, sp_cmd: f32, speed_cmd: f32, dt: f32) -> bool {
        let sp_cmd = sp_cmd.clamp(cfg.cdu.min_setpoint_c, cfg.cdu.max_setpoint_c);
        let speed_cmd = speed_cmd.clamp(cfg.cdu.min_speed, 1.0);
        let new_sp = slew(
            self.setpoint_c,
            sp_cmd,
            cfg.margins.setpoint_rise_k_per_min / 60.0,
            f32::MAX,
            dt,
        );
        let new_speed = slew(
            self.speed,
            speed_cmd,
            f32::MAX,
            cfg.margins.speed_fall_per_s,
            dt,
        );
        let moved = (new_speed - self.speed).abs() > 0.02;
        self.setpoint_c = new_sp;
        self.speed = new_speed;
        moved
    }
}

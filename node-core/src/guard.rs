//! The thermal guard: the host's own power cap on a GPU that runs hot.
//!
//! It needs no bus and no controller: when a GPU reaches `engage` it caps
//! it a step below what it draws, and keeps stepping down every sample
//! while the GPU stays at or above `engage`; once the GPU is back at or
//! below `release` it raises the cap a step per sample until the cap
//! reaches the GPU's maximum, and then lifts it. Between the two
//! temperatures it holds, so it never oscillates on noise. A GPU that
//! reports no power steps down from its maximum, a step per sample, as
//! if it drew that much. Pure: a temperature and a power in, a cap out.
//!
//! Glossary:
//! - *engage*: the temperature at which the guard starts capping (by
//!   default 2 K under the GPU's max operating temperature).
//! - *release*: the temperature at or under which it starts lifting.
//! - *step*: how many watts it moves the cap per sample.

use loopwarden_protocol::{Watts, WholeCelsius};

use crate::caps::GpuRange;

/// The guard's settings (the `[guard]` table of the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardSettings {
    /// Start capping at or above this temperature.
    pub engage: WholeCelsius,
    /// Start lifting at or below this temperature.
    pub release: WholeCelsius,
    /// Watts per sample.
    pub step: Watts,
}

/// The guard of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThermalGuard {
    cap: Option<Watts>,
}

impl ThermalGuard {
    /// The cap in force, if any.
    pub fn cap(&self) -> Option<Watts> {
        self.cap
    }

    /// Takes one sample (`temp`, `power` drawn) and returns the cap.
    pub fn update(
        &mut self,
        settings: &GuardSettings,
        range: GpuRange,
        temp: WholeCelsius,
        power: Watts,
    ) -> Option<Watts> {
        let step = settings.step.0.max(1);
        if temp >= settings.engage {
            // A GPU that reports no power (0 W, not supported) steps down
            // from its maximum, not from nothing.
            let drawn = if power.0 == 0 { range.max } else { power };
            let from = self.cap.unwrap_or(drawn).min(drawn.max(range.min));
            self.cap = Some(Watts(from.0.saturating_sub(step).max(range.min.0)));
        } else if temp <= settings.release {
            if let Some(c) = self.cap {
                let up = c.0.saturating_add(step);
                self.cap = (up < range.max.0).then_some(Watts(up));
            }
        }
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: GuardSettings = GuardSettings {
        engage: WholeCelsius(85),
        release: WholeCelsius(80),
        step: Watts(25),
    };
    const R: GpuRange = GpuRange {
        min: Watts(200),
        max: Watts(700),
    };

    #[test]
    fn steps_down_while_hot_holds_between_and_lifts_when_cool() {
        let mut g = ThermalGuard::default();
        assert_eq!(g.update(&S, R, WholeCelsius(84), Watts(690)), None);
        assert_eq!(
            g.update(&S, R, WholeCelsius(85), Watts(690)),
            Some(Watts(665))
        );
        assert_eq!(
            g.update(&S, R, WholeCelsius(86), Watts(665)),
            Some(Watts(640))
        );
        // Between release and engage: hold.
        assert_eq!(
            g.update(&S, R, WholeCelsius(82), Watts(640)),
            Some(Watts(640))
        );
        assert_eq!(
            g.update(&S, R, WholeCelsius(80), Watts(600)),
            Some(Watts(665))
        );
        assert_eq!(
            g.update(&S, R, WholeCelsius(70), Watts(600)),
            Some(Watts(690))
        );
        assert_eq!(
            g.update(&S, R, WholeCelsius(70), Watts(600)),
            None,
            "lifted at the maximum"
        );
    }

    #[test]
    fn a_gpu_without_a_power_reading_steps_down_from_its_maximum() {
        let mut g = ThermalGuard::default();
        assert_eq!(
            g.update(&S, R, WholeCelsius(90), Watts(0)),
            Some(Watts(675))
        );
    }

    #[test]
    fn never_below_the_minimum() {
        let mut g = ThermalGuard::default();
        for _ in 0..100 {
            g.update(&S, R, WholeCelsius(95), Watts(150));
        }
        assert_eq!(g.cap(), Some(Watts(200)));
    }
}

//! A PI loop with anti-windup and output limits, and a slew limiter.
//!
//! Glossary:
//! - *anti-windup*: the integral is clamped to the output's limits, so a
//!   long error against a limit cannot store more than the output can use
//!   and the loop answers at once when the error turns.
//! - *slew limit*: the fastest an output may change, per second.

/// A PI controller: `out = kp·e + ∫ki·e dt`, clamped to `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pi {
    /// Proportional gain.
    pub kp: f32,
    /// Integral gain, per second.
    pub ki: f32,
    /// Lowest output.
    pub min: f32,
    /// Highest output.
    pub max: f32,
    integral: f32,
}

impl Pi {
    /// A loop with these gains and limits, its integral at zero.
    pub const fn new(kp: f32, ki: f32, min: f32, max: f32) -> Self {
        Self {
            kp,
            ki,
            min,
            max,
            integral: 0.0,
        }
    }

    /// The integral term now.
    pub fn integral(&self) -> f32 {
        self.integral
    }

    /// Forgets the integral.
    pub fn reset(&mut self) {
        self.integral = 0.0;
    }

    /// One step with error `e` over `dt_s`.
    pub fn step(&mut self, e: f32, dt_s: f32) -> f32 {
        // The integral is kept within the output's limits (integrator
        // clamping): it never holds more than the output can use.
        self.integral = (self.integral + self.ki * e * dt_s).clamp(self.min, self.max);
        (self.kp * e + self.integral).clamp(self.min, self.max)
    }
}

/// Moves `from` towards `to` by at most `up_per_s` upwards and
/// `down_per_s` downwards over `dt_s`.
pub fn slew(from: f32, to: f32, up_per_s: f32, down_per_s: f32, dt_s: f32) -> f32 {
    if to > from {
        to.min(from + up_per_s * dt_s)
    } else {
        to.max(from - down_per_s * dt_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_integral_does_not_wind_up_against_a_limit() {
        let mut pi = Pi::new(0.5, 0.1, 0.0, 10.0);
        for _ in 0..1000 {
            pi.step(5.0, 1.0);
        }
        assert!(pi.integral() <= 10.0);
        // The error turns: the output leaves the limit within a few steps,
        // not after unwinding a thousand steps of integral.
        let mut steps = 0;
        while pi.step(-2.0, 1.0) >= 10.0 {
            steps += 1;
            assert!(steps < 5);
        }
    }

    #[test]
    fn the_output_stays_within_its_limits() {
        let mut pi = Pi::new(2.0, 1.0, -3.0, 3.0);
        for e in [100.0, -100.0, 0.5, -0.5, 1e9, -1e9] {
            let o = pi.step(e, 1.0);
            assert!((-3.0..=3.0).contains(&o), "{o}");
        }
    }

    #[test]
    fn slew_limits_each_direction_separately() {
        assert_eq!(slew(20.0, 30.0, 0.1, 10.0, 1.0), 20.1);
        assert_eq!(slew(30.0, 20.0, 0.1, 10.0, 1.0), 20.0);
        assert_eq!(slew(30.0, 29.0, 0.1, 0.5, 1.0), 29.5);
    }
}

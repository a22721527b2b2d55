//! Rounding as `std`'s `f64::round` rounds (half away from zero), which
//! `core` lacks: the settings and leases round the same on a
//! microcontroller as on Linux.
//!
//! Glossary:
//! - *integral*: a float of 2^52 or more is a whole number already.

/// 2^52: from here on every `f64` is whole.
const INTEGRAL: f64 = 4_503_599_627_370_496.0;

/// `x` rounded to the nearest whole number, halves away from zero; NaN,
/// the infinities and whole numbers as they are; the sign kept (−0.3
/// rounds to −0).
pub fn round(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() || a >= INTEGRAL {
        return x;
    }
    // Exact: `a` is below 2^52, so its whole part fits a u64 and the
    // fraction is exactly `a - whole`.
    let whole = a as u64 as f64;
    let r = if a - whole >= 0.5 { whole + 1.0 } else { whole };
    r.copysign(x)
}

/// `x` rounded as [`round`] rounds (exact: an `f32` is an `f64`, and a
/// whole number below 2^24, or an `f32` at or past it, is an `f32`).
pub fn round_f32(x: f32) -> f32 {
    round(f64::from(x)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_as_std_rounds() {
        let odd = [
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            0.499_999_999_999_999_94,
            -0.3,
            -0.0,
            1e300,
            INTEGRAL - 0.5,
            INTEGRAL + 1.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let random = (0..20_000).map(|_| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            f64::from_bits(seed)
        });
        let scaled = (-40_000..40_000).map(|i| f64::from(i) * 0.0125);
        for x in odd.into_iter().chain(random).chain(scaled) {
            let want = x.round();
            if want.is_nan() {
                // A NaN stays a NaN (its payload is not a number's).
                assert!(round(x).is_nan());
                continue;
            }
            assert_eq!(round(x).to_bits(), want.to_bits(), "{x:e}");
        }
        assert!(round(f64::NAN).is_nan());
        for x in [2.5f32, -7.5, 699.49, 1e20, 0.5, -0.2] {
            assert_eq!(round_f32(x).to_bits(), x.round().to_bits(), "{x}");
        }
    }
}

//! The pumps' running flags read as what they are: 0 stopped, 1 running.
//! Any other value (a CDU's "not available" 0xFFFF, a status enum's 2 for
//! a fault) says neither: it reads `None`, which the decision path takes
//! as not running (fail closed: the lead's trip is judged, the lag pump
//! starts, no flow is estimated from a pump that may not run). Each such
//! value is said once, naming the register and the value, and its end
//! said. The fault flags are not read this way: any value but 0 there is
//! a fault shown, which fails closed already.
//!
//! Glossary:
//! - *odd flag*: a running flag that reads neither 0 nor 1.
use super::*;

/// The running flags, pump A's and pump B's.
const FLAGS: [&str; 2] = [PUMP_A, PUMP_B];

/// What running flag value `v` says: `Some(false)` for 0, `Some(true)`
/// for 1, `None` for anything else or no value.
pub(super) fn running(v: Option<f64>) -> Option<bool> {
    match v {
        Some(0.0) => Some(false),
        Some(1.0) => Some(true),
        _ => None,
    }
}

impl ModbusCdu {
    /// The pumps' running flags from the values read (`read`, pump A's
    /// then B's): an odd flag reads `None`, said when it begins or its
    /// value changes, and its end said.
    pub(super) fn running_flags(&mut self, read: [Option<f64>; 2]) -> [Option<bool>; 2] {
        let mut out = [None; 2];
        for (i, v) in read.into_iter().enumerate() {
            out[i] = running(v);
            let odd = v.filter(|_| out[i].is_none());
            if odd == self.odd_flags[i] {
                continue;
            }
            let name = FLAGS[i];
            let at = self.map.get(name).map_or(0, |r| r.address);
            let what = self.op(format_args!("{name} at input {at}"));
            match (odd, v) {
                (Some(odd), _) => tracing::warn!(
                    "CDU: {what} reads {odd}, neither 0 (stopped) nor 1 (running): \
                     read as no value, taken as not running"
                ),
                (None, Some(v)) => tracing::info!("CDU: {what} reads {v} again"),
                (None, None) => {}
            }
            self.odd_flags[i] = odd;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_0_and_1_are_running_flags() {
        assert_eq!(running(Some(0.0)), Some(false));
        assert_eq!(running(Some(1.0)), Some(true));
        for odd in [2.0, 65_535.0, -1.0, 0.5] {
            assert_eq!(running(Some(odd)), None, "{odd}");
        }
        assert_eq!(running(None), None);
    }
}

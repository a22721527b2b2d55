//! The pumps' running flags read as what they are: 0 stopped, 1 running.
//! Any other value (a CDU's "not available" 0xFFFF, a status enum's 2 for
//! a fault) says neither. Read as no value it would be taken as not
//! running, and a healthy lead judged tripped, the lag started and both
//! latched out of service, so such a read fails as a whole, as a read
//! that lost a running flag does (`reads.rs`): what else it read is not
//! used that step, and if it lasts the sensor timeout's failsafe
//! follows. Its error names the register and the value. The fault flags
//! are not read this way: any value but 0 there is a fault shown, which
//! fails closed already.
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
    /// then B's; `None`: not mapped). An odd flag fails the read whole
    /// (its gaps not reported apart), naming the register and the value.
    pub(super) fn running_flags(
        &mut self,
        read: [Option<f64>; 2],
    ) -> Result<[Option<bool>; 2], CduError> {
        let mut out = [None; 2];
        for (i, v) in read.into_iter().enumerate() {
            out[i] = running(v);
            let Some(odd) = v.filter(|_| out[i].is_none()) else {
                continue;
            };
            let name = FLAGS[i];
            let at = self.map.get(name).map_or(0, |r| r.address);
            self.gaps.clear();
            return Err(CduError::BadAnswer {
                op: self.op(format_args!("read {name} at input {at}")),
                detail: format!(
                    "{name} reads {odd}, neither 0 (stopped) nor 1 (running): the whole read \
                     fails, since a pump's running flag read as no value would be taken as \
                     the pump stopped"
                ),
            });
        }
        Ok(out)
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

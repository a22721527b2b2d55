//! An operator's clear of a latched leak, checked before the core takes
//! it: a clear of a rack that has no latched leak (a rack numbered from 1
//! by mistake, say) is refused, naming the racks that have one, and so is
//! every clear while the latched leaks are not known (a pending relatch),
//! so that no clear is logged that did nothing, or that the relatch then
//! undoes.
use super::*;
use cooling_core::safety::NOT_LATCHED;
use cooling_core::LeakInputs;

/// The racks of `mask` (bit n = rack n) by number, for an answer.
fn rack_list(mask: u16) -> String {
    let racks: Vec<String> = (0..16)
        .filter(|r| mask & (1 << r) != 0)
        .map(|r: u16| r.to_string())
        .collect();
    if racks.is_empty() {
        "none".into()
    } else {
        racks.join(", ")
    }
}

/// Clears rack `rack`'s latched leak in `d`, with the leak inputs as
/// this step read them (`leaks`): the answer to the operator. The
/// decision path refuses while its relatch is pending, and the core when
/// the rack has no latched leak (neither latched nor its isolation
/// failed: the answer names those that have one) or an input reads it
/// wet or its sensing is lost.
pub(super) fn clear_leak(
    d: &mut Decider,
    rack: usize,
    leaks: &LeakInputs,
) -> Result<String, String> {
    let latched = d.core().leaks_latched() | d.core().isolation_failed();
    match d.clear_leak(rack, leaks) {
        Ok(()) => Ok(format!(
            "rack {rack}: leak cleared, its valve reopens at the next step"
        )),
        Err(NOT_LATCHED) => Err(format!(
            "rack {rack} has no latched leak; latched: {} (racks are numbered from 0)",
            rack_list(latched)
        )),
        Err(e) => Err(format!("rack {rack}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Decider {
        let limits = MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: None,
            positions: false,
        };
        let none: Result<Option<LatchRecord>, &str> = Ok(None);
        Decider::new(CoreConfig::default(), limits, &none).unwrap()
    }

    /// Steps `d` once with the CDU's leak register reading `leaks`.
    fn step(d: &mut Decider, at_s: u64, leaks: u16) {
        let read = CduMeasurements {
            leaks: Some(leaks),
            ..CduMeasurements::default()
        };
        let input = StepIn {
            now_ms: at_s * 1000,
            board: BoardRead::Absent,
            ambient_c: Some(20.0),
        };
        d.step(Some(&read), &input);
        if d.to_keep().is_some() {
            d.kept(true);
        }
    }

    #[test]
    fn a_clear_of_a_rack_with_no_latched_leak_is_refused_naming_those_latched() {
        let mut d = fresh();
        let dry = LeakInputs {
            cdu: Some(0),
            ..LeakInputs::DRY
        };
        let e = clear_leak(&mut d, 1, &dry).unwrap_err();
        assert!(
            e.contains("rack 1 has no latched leak; latched: none"),
            "{e}"
        );
        // Rack 2 leaks, then reads dry: a clear of rack 3 (counted from
        // 1) is refused and rack 2 stays latched; rack 2's is taken.
        step(&mut d, 0, 0);
        step(&mut d, 1, 0b0100);
        step(&mut d, 2, 0);
        assert_eq!(d.core().leaks_latched(), 0b0100);
        let e = clear_leak(&mut d, 3, &dry).unwrap_err();
        assert!(e.contains("rack 3 has no latched leak; latched: 2"), "{e}");
        assert_eq!(d.core().leaks_latched(), 0b0100);
        let e = clear_leak(&mut d, 40, &dry).unwrap_err();
        assert!(e.contains("rack 40: no such rack"), "{e}");
        let done = clear_leak(&mut d, 2, &dry).unwrap();
        assert!(done.contains("rack 2: leak cleared"), "{done}");
        assert_eq!(d.core().leaks_latched(), 0);
    }

    #[test]
    fn a_clear_while_the_relatch_is_pending_is_refused() {
        let limits = MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: None,
            positions: true,
        };
        let damaged: Result<Option<LatchRecord>, &str> = Err("a damaged page");
        let mut d = Decider::new(CoreConfig::default(), limits, &damaged).unwrap();
        assert!(d.relatch_pending());
        let e = clear_leak(&mut d, 0, &LeakInputs::DRY).unwrap_err();
        assert!(e.contains("the latched leaks are unknown"), "{e}");
    }
}

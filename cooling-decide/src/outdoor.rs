//! Where the controller's outdoor temperature comes from. It is a
//! measurement, never a configured value: the CDU's own sensor (the dry
//! cooler's, `outdoor_temp` in its register map) when it reads
//! plausibly; else the value the building management system last wrote
//! to the northbound `outdoor_temp` register, while that is fresh; else
//! none. With none the core plans with the site's fallback
//! (`design_ambient_c`, the config's `ambient_c`) and raises its alarm.
//!
//! Glossary:
//! - *plausible*: a number from [`PLAUSIBLE_C`]'s −50 to 60 °C. A lost
//!   sensor reads outside it (the simulated CDU shows 0x8000, −327.68 °C).
//! - *fresh*: a BMS value the shell took less than [`BMS_FRESH`] ago, so
//!   that a BMS that stops writing does not leave a stale value in force.

use core::ops::RangeInclusive;
use core::time::Duration;

/// The outdoor temperatures believed, °C.
pub const PLAUSIBLE_C: RangeInclusive<f64> = -50.0..=60.0;

/// How long a value the BMS wrote stays in force without a new write.
pub const BMS_FRESH: Duration = Duration::from_secs(300);

/// Which source gave the outdoor temperature of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutdoorSource {
    /// The CDU's `outdoor_temp` register.
    Cdu,
    /// A fresh write of the BMS.
    Bms,
}

/// The outdoor temperature's two sources, between steps: the BMS's last
/// write and when the shell took it (the CDU's register is read anew
/// every step).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutdoorSources {
    /// The BMS's last value, °C, and when it was taken, ms (shell clock).
    bms: Option<(f32, u64)>,
}

/// A reading if it is a plausible outdoor temperature.
pub fn plausible_outdoor(c: f64) -> Option<f32> {
    PLAUSIBLE_C.contains(&c).then_some(c as f32)
}

/// What the CDU's outdoor sensor gives a step: its `reading` if
/// plausible (`None`: the CDU did not answer, or its map lacks it).
fn cdu_outdoor(reading: Option<f64>) -> Option<f32> {
    reading.and_then(plausible_outdoor)
}

impl OutdoorSources {
    /// No BMS value yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The BMS wrote `celsius` (the server bounds it to the map's range),
    /// taken at `now_ms`.
    pub fn bms_wrote(&mut self, celsius: f32, now_ms: u64) {
        self.bms = plausible_outdoor(f64::from(celsius)).map(|c| (c, now_ms));
    }

    /// The BMS's value while it is fresh at `now_ms`.
    pub fn bms_fresh(&self, now_ms: u64) -> Option<f32> {
        let fresh_ms = BMS_FRESH.as_millis() as u64;
        self.bms
            .filter(|(_, at)| now_ms.saturating_sub(*at) < fresh_ms)
            .map(|(c, _)| c)
    }

    /// The outdoor temperature at `now_ms` and where it came from: the
    /// CDU's reading (`cdu`: `None` when the CDU did not answer or its map
    /// lacks the register) if plausible, else the BMS's while fresh.
    pub fn pick(&self, cdu: Option<f64>, now_ms: u64) -> Option<(f32, OutdoorSource)> {
        cdu_outdoor(cdu)
            .map(|c| (c, OutdoorSource::Cdu))
            .or_else(|| self.bms_fresh(now_ms).map(|c| (c, OutdoorSource::Bms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    #[test]
    fn the_cdu_first_then_a_fresh_bms_write_then_none() {
        let mut o = OutdoorSources::new();
        // Nothing from anyone.
        assert_eq!(o.pick(None, 0), None);
        // The CDU's sensor reads: it is the one.
        assert_eq!(o.pick(Some(-7.25), 0), Some((-7.25, OutdoorSource::Cdu)));
        // The BMS writes; a plausible CDU reading still comes first.
        o.bms_wrote(18.5, 10 * S);
        assert_eq!(o.pick(Some(21.0), 11 * S), Some((21.0, OutdoorSource::Cdu)));
        // The CDU's sensor lost (0x8000 at 0.01), implausible, not a number,
        // silent or absent from its map: the BMS's value while fresh.
        for cdu in [
            Some(-327.68),
            Some(75.0),
            Some(-50.01),
            Some(f64::NAN),
            None,
        ] {
            assert_eq!(
                o.pick(cdu, 11 * S),
                Some((18.5, OutdoorSource::Bms)),
                "{cdu:?}"
            );
        }
        // The range's ends are air.
        assert_eq!(o.pick(Some(-50.0), 11 * S).unwrap().1, OutdoorSource::Cdu);
        assert_eq!(o.pick(Some(60.0), 11 * S).unwrap().1, OutdoorSource::Cdu);
        // Fresh for 300 s after the write, then ignored.
        assert_eq!(o.bms_fresh(310 * S - 1), Some(18.5));
        assert_eq!(o.pick(Some(-327.68), 310 * S - 1).unwrap().0, 18.5);
        assert_eq!(o.pick(Some(-327.68), 310 * S), None, "stale");
        assert_eq!(o.pick(None, 3_600 * S), None);
        // A new write is fresh again, from when it was taken.
        o.bms_wrote(19.0, 400 * S);
        assert_eq!(o.pick(None, 650 * S), Some((19.0, OutdoorSource::Bms)));
        assert_eq!(o.pick(None, 700 * S), None);
    }

    #[test]
    fn the_cdus_reading_counts_only_when_it_is_plausible() {
        assert_eq!(cdu_outdoor(Some(12.5)), Some(12.5));
        assert_eq!(cdu_outdoor(Some(-327.68)), None);
        assert_eq!(cdu_outdoor(None), None);
    }
}

//! A CDU's offer to the hall's facility coordinator on its way out: as
//! the bus carries it ([`offer_msg`], [`offer_of`]), when it has moved
//! enough to be said again ([`offer_moved`]), and when a controller that
//! says it on its own (the firmware, to its gateway) says it again
//! ([`OfferWatch`]). The Linux controller (`cooling-ctrl run`) publishes
//! its state again by the same rule, and both carry the same message, so
//! a hall's coordinator hears a CDU alike whichever runs it.
//!
//! Glossary:
//! - *offer*: what a CDU can accept of the hall's facility water and what
//!   warmer water would cost it ([`cooling_core::facility::Offer`]), made
//!   at the end of each of the optimiser's searches in a hall of several
//!   CDUs.
//! - *moved*: an offer whose accept moved [`REPUBLISH_ACCEPT_K`] or more,
//!   or whose heat moved more than [`REPUBLISH_HEAT`] of what was said,
//!   or an offer made or withdrawn.

use cooling_core::facility::{Offer, OfferPoint, OFFER_POINTS};
use loopwarden_protocol::message::{FacilityOffer, OfferStep};
use loopwarden_protocol::units::{Celsius, Watts};

use crate::float::round_f32;

/// An offer whose accept moved this far is said again, K.
pub const REPUBLISH_ACCEPT_K: f32 = 0.25;

/// An offer whose heat moved more than this share of the heat last said
/// is said again.
pub const REPUBLISH_HEAT: f32 = 0.05;

/// An offer that has not moved is said again this often, ms: `run`'s
/// retained state, which carries it, is republished at least this often,
/// and the coordinator leaves out an offer it has not heard for two
/// minutes.
pub const OFFER_AGAIN_MS: u64 = 60_000;

/// Whether offer `now` has moved from `said`, the offer last said
/// (`None`: none was, or none is made now).
pub fn offer_moved(said: Option<&Offer>, now: Option<&Offer>) -> bool {
    match (said, now) {
        (Some(a), Some(b)) => {
            let accept_k = (a.accept_c - b.accept_c).abs();
            // The heat as the bus carries it: a milliwatt at the least.
            let heat_w = (a.heat_w - b.heat_w).abs();
            // Caps offered or withdrawn (a search, a failsafe) at once.
            accept_k >= REPUBLISH_ACCEPT_K
                || heat_w > REPUBLISH_HEAT * a.heat_w.max(1e-3)
                || a.points != b.points
        }
        (a, b) => a.is_some() != b.is_some(),
    }
}

/// When a controller that says its offer by itself says it: when it has
/// moved from the offer last said, and again every [`OFFER_AGAIN_MS`]
/// while one is made. Nothing is said while no offer is made and none
/// was said (a hall of one CDU).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OfferWatch {
    /// The offer last said, and when (ms of the controller's clock).
    said: Option<(Option<Offer>, u64)>,
}

impl OfferWatch {
    /// Nothing said yet.
    pub const fn new() -> Self {
        Self { said: None }
    }

    /// Whether offer `now` is to be said at `now_ms`.
    pub fn due(&self, now: Option<&Offer>, now_ms: u64) -> bool {
        let Some((said, at_ms)) = &self.said else {
            return now.is_some();
        };
        offer_moved(said.as_ref(), now)
            || (now.is_some() && now_ms.saturating_sub(*at_ms) >= OFFER_AGAIN_MS)
    }

    /// Offer `offer` was said at `now_ms`.
    pub fn said(&mut self, offer: Option<Offer>, now_ms: u64) {
        self.said = Some((offer, now_ms));
    }
}

/// A temperature for the bus (saturating at its range).
pub fn celsius(c: f32) -> Celsius {
    Celsius::new(f64::from(c)).unwrap_or(if c > 0.0 { Celsius::MAX } else { Celsius::MIN })
}

/// Power for the bus, W (negative reads 0).
pub fn watts(w: f32) -> Watts {
    Watts::from_milliwatts((w.max(0.0) * 1000.0).min(u32::MAX as f32) as u32)
}

/// A work rate in hundredths of a GPU.
fn centi(work: f32) -> u32 {
    round_f32(work.max(0.0) * 100.0).min(u32::MAX as f32) as u32
}

/// An offer as the bus carries it.
pub fn offer_msg(o: &Offer) -> FacilityOffer {
    let mut capped = heapless::Vec::new();
    for p in o.capped.iter().take(usize::from(o.points)) {
        let step = OfferStep {
            water: celsius(p.water_c),
            work_lost_centigpus: centi(p.work_lost),
            power_saved: watts(p.power_saved_w),
        };
        // As many steps as the core's points: the bus holds as many.
        let _ = capped.push(step);
    }
    FacilityOffer {
        accept: celsius(o.accept_c),
        heat: watts(o.heat_w),
        at_water: celsius(o.at_water_c),
        heat_per_k: watts(o.heat_per_k_w),
        work_centigpus: centi(o.work),
        capped,
    }
}

/// An offer as the bus carried it.
pub fn offer_of(m: &FacilityOffer) -> Offer {
    let mut o = Offer {
        heat_w: m.heat.milliwatts() as f32 / 1000.0,
        work: m.work_centigpus as f32 / 100.0,
        at_water_c: m.at_water.value() as f32,
        heat_per_k_w: m.heat_per_k.milliwatts() as f32 / 1000.0,
        accept_c: m.accept.value() as f32,
        ..Offer::default()
    };
    for (i, step) in m.capped.iter().take(OFFER_POINTS).enumerate() {
        o.capped[i] = OfferPoint {
            water_c: step.water.value() as f32,
            work_lost: step.work_lost_centigpus as f32 / 100.0,
            power_saved_w: step.power_saved.milliwatts() as f32 / 1000.0,
        };
        o.points = i as u8 + 1;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(accept_c: f32, heat_w: f32) -> Offer {
        Offer::uncapped(accept_c, heat_w, 128.0, 200.0)
    }

    #[test]
    fn an_offer_crosses_the_bus_within_its_units() {
        let mut o = offer(31.25, 120_000.0);
        o.capped[0] = OfferPoint {
            water_c: 32.25,
            work_lost: 0.37,
            power_saved_w: 410.0,
        };
        o.points = 1;
        let back = offer_of(&offer_msg(&o));
        assert_eq!(back.points, 1);
        assert!((back.accept_c - 31.25).abs() < 0.005);
        assert!((back.heat_w - o.heat_w).abs() < 1.0);
        assert!((back.capped[0].work_lost - 0.37).abs() < 0.005);
        assert!((back.capped[0].power_saved_w - 410.0).abs() < 1.0);
    }

    #[test]
    fn an_offer_moves_by_a_quarter_kelvin_of_accept_or_five_percent_of_heat() {
        let said = offer(31.0, 100_000.0);
        let moved = |now: Offer| offer_moved(Some(&said), Some(&now));
        assert!(!moved(offer(31.2, 104_000.0)));
        assert!(moved(offer(31.25, 100_000.0)));
        assert!(moved(offer(30.75, 100_000.0)));
        assert!(moved(offer(31.0, 105_500.0)));
        assert!(moved(offer(31.0, 94_500.0)));
        assert!(offer_moved(None, Some(&said)), "a first offer");
        assert!(offer_moved(Some(&said), None), "an offer withdrawn");
        assert!(!offer_moved(None, None));
    }

    #[test]
    fn a_watch_says_an_offer_when_it_moves_and_again_each_minute_never_a_missing_one() {
        let mut w = OfferWatch::new();
        assert!(!w.due(None, 0), "no offer in a hall of one CDU");
        let o = offer(31.0, 100_000.0);
        assert!(w.due(Some(&o), 1_000), "the first");
        w.said(Some(o), 1_000);
        assert!(!w.due(Some(&o), 2_000));
        assert!(!w.due(Some(&offer(31.1, 101_000.0)), 30_000), "not moved");
        assert!(w.due(Some(&offer(31.5, 100_000.0)), 30_000), "moved");
        assert!(w.due(Some(&o), 1_000 + OFFER_AGAIN_MS), "a minute on");
        assert!(w.due(None, 2_000), "withdrawn");
        w.said(None, 2_000);
        assert!(
            !w.due(None, 2_000 + 10 * OFFER_AGAIN_MS),
            "none is not repeated"
        );
    }
}

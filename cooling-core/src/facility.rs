//! The facility water of a hall of several CDUs: what each CDU offers the
//! hall ([`Offer`], computed by [`crate::optimise::offer`] from the plant
//! as its estimator believes it) and the facility coordinator's choice of
//! one facility water temperature and chiller staging for all of them
//! ([`coordinate`]).
//!
//! A CDU's offer says how warm the shared facility water may be before
//! its hottest GPU would pass the plan ceiling at full demand with its
//! pumps at full speed (`accept_c`), and what warmer water would cost it:
//! the work its caps on the hosts that run hot would take, and the power
//! they would save, at a few temperatures above. The coordinator judges
//! every facility water temperature on the same model the optimiser
//! uses, for the whole hall: IT power (with the GPUs' leakage at warmer
//! water), the dry cooler's fans and the chiller at the outdoor
//! temperature, per unit of work. Colder water than the warmest every
//! CDU accepts costs chiller power for all of them; warmer water costs
//! the work of a few capped hosts. A plan that caps must cost
//! [`CAP_PLAN_MARGIN`] less per unit of work than the best plan that
//! does not (and the same margin back), as in the optimiser.
//!
//! Glossary:
//! - *facility water*: the water from the dry coolers and the chiller
//!   plant to every CDU's heat exchanger.
//! - *accept*: the warmest facility water a CDU holds every GPU at the
//!   plan ceiling with, uncapped.
//! - *stage*: one chiller of the plant (one CDU's share of its capacity);
//!   the plan stages what its chosen water needs, and one more where the
//!   dry cooler runs near its limit.

use crate::config::CoreConfig;
use crate::model;
use crate::optimise::CAP_PLAN_MARGIN;

/// Capped points an offer holds.
pub const OFFER_POINTS: usize = 4;

/// How far above its `accept_c` a CDU says what caps would cost, K.
pub const OFFER_STEPS_K: [f32; OFFER_POINTS] = [1.0, 2.0, 3.0, 5.0];

/// The facility water temperatures the coordinator tries are this far
/// apart, K.
pub const WATER_STEP_K: f32 = 0.25;

/// A water this little above an offer's accept or one of its capped
/// points is held as at that point, K: the bus carries an offer's
/// temperatures to a hundredth of a degree, and float rounding leaves a
/// CDU's walk up the grid a hair off the coordinator's, so a CDU's accept
/// may read just below the grid water it stands for.
pub const HELD_WITHIN_K: f32 = 0.01;

/// The chiller is staged for this share of the heat above what the dry
/// cooler takes at the planned water.
pub const STAGE_MARGIN: f32 = 0.1;

/// What warmer water than a CDU's accept costs it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OfferPoint {
    /// Facility water, °C.
    pub water_c: f32,
    /// Work its caps take there (GPUs at full work).
    pub work_lost: f32,
    /// IT power those caps save, W.
    pub power_saved_w: f32,
}

/// What a CDU offers the facility coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Offer {
    /// Heat it puts into the facility water at `at_water_c`, W.
    pub heat_w: f32,
    /// Its work rate there.
    pub work: f32,
    /// The facility water its heat and work are figured at, °C.
    pub at_water_c: f32,
    /// Heat added by each K of warmer facility water (leakage), W/K.
    pub heat_per_k_w: f32,
    /// The warmest facility water it holds every GPU at the plan ceiling
    /// with, uncapped, °C.
    pub accept_c: f32,
    /// Warmer water with caps on its hosts that run hot, in rising order;
    /// the first `points` are used. Water warmer than the last is more
    /// than caps hold.
    pub capped: [OfferPoint; OFFER_POINTS],
    /// Points used.
    pub points: u8,
}

impl Offer {
    /// An offer with no capped point: `heat_w` and `work` at its accept
    /// (`accept_c`), `heat_per_k_w` more heat each kelvin warmer.
    pub const fn uncapped(accept_c: f32, heat_w: f32, work: f32, heat_per_k_w: f32) -> Self {
        Self {
            heat_w,
            work,
            at_water_c: accept_c,
            heat_per_k_w,
            accept_c,
            capped: [OfferPoint {
                water_c: 0.0,
                work_lost: 0.0,
                power_saved_w: 0.0,
            }; OFFER_POINTS],
            points: 0,
        }
    }

    /// The work lost and power saved at facility water `water_c`:
    /// `(0, 0)` up to its accept, along its capped points above it
    /// (linearly between them); `None` above the last. Each point holds
    /// [`HELD_WITHIN_K`] above it.
    pub fn cost_at(&self, water_c: f32) -> Option<(f32, f32)> {
        if water_c <= self.accept_c + HELD_WITHIN_K {
            return Some((0.0, 0.0));
        }
        let mut prev = OfferPoint {
            water_c: self.accept_c,
            ..OfferPoint::default()
        };
        for p in self.capped.iter().take(self.points as usize) {
            if water_c <= p.water_c + HELD_WITHIN_K {
                let span = (p.water_c - prev.water_c).max(1e-3);
                let k = ((water_c - prev.water_c) / span).min(1.0);
                let lerp = |a: f32, b: f32| a + (b - a) * k;
                return Some((
                    lerp(prev.work_lost, p.work_lost),
                    lerp(prev.power_saved_w, p.power_saved_w),
                ));
            }
            prev = *p;
        }
        None
    }
}

/// The coordinator's choice for the hall.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FacilityPlan {
    /// Facility water supply target, °C.
    pub water_c: f32,
    /// Chiller stages to run.
    pub chiller_stages: u8,
    /// CDUs the plan expects to cap hosts, bit n = the n-th offer.
    pub capping: u64,
    /// Predicted facility power per work of the plan.
    pub cost: f32,
    /// The same of the best plan of the other kind (with caps when this
    /// has none, without when it has); `None`: none held.
    pub other_cost: Option<f32>,
}

/// A sum over the hall's CDUs of one figure, in whole millionths of it
/// (each figure truncated, below zero or NaN as none, the sum saturating
/// near 1.8·10¹³): the same in any order of the offers, where a float
/// sum's rounding could tip a near tie to another water, and finite
/// whatever a broken estimator offers.
#[derive(Debug, Clone, Copy, Default)]
struct HallSum(u64);

impl HallSum {
    fn add(&mut self, x: f32) {
        self.0 = self.0.saturating_add((f64::from(x) * 1e6) as u64);
    }

    fn total(self) -> f32 {
        (self.0 as f64 * 1e-6) as f32
    }
}

impl FromIterator<f32> for HallSum {
    fn from_iter<I: IntoIterator<Item = f32>>(figures: I) -> Self {
        let mut sum = Self::default();
        figures.into_iter().for_each(|x| sum.add(x));
        sum
    }
}

/// One facility water temperature judged for the hall.
#[derive(Debug, Clone, Copy)]
struct Judged {
    water_c: f32,
    cost: f32,
    short: bool,
    capping: u64,
}

/// The hall at facility water `water_c`: its cost per work, whether the
/// plant is short there, and which CDUs cap; `None` where some CDU's caps
/// cannot hold the ceiling.
fn judge(hall: &CoreConfig, offers: &[Offer], ambient_c: f32, water_c: f32) -> Option<Judged> {
    let (mut heat, mut work, mut capping) = (HallSum::default(), HallSum::default(), 0u64);
    for (i, o) in offers.iter().enumerate() {
        let (lost, saved) = o.cost_at(water_c)?;
        heat.add(o.heat_w + o.heat_per_k_w * (water_c - o.at_water_c) - saved);
        work.add(o.work - lost);
        if lost > 0.0 {
            capping |= 1u64.checked_shl(i as u32).unwrap_or(0);
        }
    }
    let (heat, work) = (heat.total(), work.total());
    let f = &hall.facility;
    let rej = model::rejection_at(hall, water_c, ambient_c, heat);
    // All IT heat goes into the liquid: the IT power is the heat.
    let facility =
        heat * (1.0 + f.distribution_loss) + rej.fans_w + rej.chiller_w + f.pumps_w + f.fixed_w;
    Some(Judged {
        water_c,
        cost: if work > 1e-3 {
            facility / work
        } else {
            facility
        },
        short: rej.short_w > 1.0,
        capping,
    })
}

/// Whether `a` is a better plan than `b` of the same kind: not short
/// before short; short, the warmer; else the cheaper, and of equal cost
/// the warmer.
fn better(a: &Judged, b: &Judged) -> bool {
    if a.short != b.short {
        return !a.short;
    }
    if a.short {
        return a.water_c > b.water_c;
    }
    if (a.cost - b.cost).abs() <= 1e-6 * b.cost.abs() {
        a.water_c > b.water_c
    } else {
        a.cost < b.cost
    }
}

/// The facility water and chiller staging for `offers` on the plant of
/// `hall` (its facility figures the whole hall's, its CDU range each
/// CDU's), outdoors at `ambient_c`, with `stages` chillers in the plant;
/// `capping_now`: the plan in force asks some CDU to cap (the margin
/// holds either way). `None` without offers.
pub fn coordinate(
    hall: &CoreConfig,
    offers: &[Offer],
    ambient_c: f32,
    stages: u8,
    capping_now: bool,
) -> Option<FacilityPlan> {
    if offers.is_empty() {
        return None;
    }
    let lo = hall.cdu.min_setpoint_c - hall.cdu.approach_k;
    let hi = hall.cdu.max_setpoint_c - hall.cdu.approach_k;
    let steps = ((hi - lo) / WATER_STEP_K + 1e-3) as usize;
    // The best plan without caps, and with.
    let mut best: [Option<Judged>; 2] = [None, None];
    for k in 0..=steps {
        let water = (lo + WATER_STEP_K * k as f32).min(hi);
        let Some(j) = judge(hall, offers, ambient_c, water) else {
            continue;
        };
        let slot = &mut best[usize::from(j.capping != 0)];
        if slot.as_ref().is_none_or(|b| better(&j, b)) {
            *slot = Some(j);
        }
    }
    let (chosen, other) = match best {
        [Some(plain), Some(capped)] => {
            let capped_wins = !capped.short
                && (plain.short
                    || if capping_now {
                        capped.cost * (1.0 - CAP_PLAN_MARGIN) <= plain.cost
                    } else {
                        capped.cost < plain.cost * (1.0 - CAP_PLAN_MARGIN)
                    });
            if capped_wins {
                (capped, Some(plain))
            } else {
                (plain, Some(capped))
            }
        }
        [Some(j), None] | [None, Some(j)] => (j, None),
        [None, None] => {
            // No water holds every CDU: the coldest, where caps do most.
            let water = lo;
            let heat = offers.iter().map(|o| o.heat_w).collect::<HallSum>();
            let work = offers.iter().map(|o| o.work).collect::<HallSum>();
            let j = Judged {
                water_c: water,
                cost: heat.total() / work.total().max(1e-3),
                short: true,
                capping: 0,
            };
            (j, None)
        }
    };
    let heat = offers
        .iter()
        .map(|o| o.heat_w + o.heat_per_k_w * (chosen.water_c - o.at_water_c))
        .collect::<HallSum>()
        .total();
    Some(FacilityPlan {
        water_c: chosen.water_c,
        chiller_stages: stages_for(hall, chosen.water_c, ambient_c, heat, stages),
        capping: chosen.capping,
        cost: chosen.cost,
        other_cost: other.filter(|o| !o.short).map(|o| o.cost),
    })
}

/// Chiller stages for `heat_w` at facility water `water_c`: what the dry
/// cooler leaves at full fans, and [`STAGE_MARGIN`] of the heat more, in
/// stages of the plant's `stages`.
pub fn stages_for(hall: &CoreConfig, water_c: f32, ambient_c: f32, heat_w: f32, stages: u8) -> u8 {
    let f = &hall.facility;
    let t_fwr = water_c + heat_w / (f.water_kg_per_s * f.water_cp_j_per_kg_k).max(1.0);
    let dc_max = f.dry_cooler_ua_w_per_k * (t_fwr - ambient_c - f.pinch_k).max(0.0);
    let left = heat_w * (1.0 + STAGE_MARGIN) - dc_max;
    if left <= 0.0 || stages == 0 {
        return 0;
    }
    let per_stage = (f.chiller_max_w / f32::from(stages)).max(1.0);
    let q = left / per_stage;
    let whole = q as u32;
    let n = if (whole as f32) < q { whole + 1 } else { whole };
    n.min(u32::from(stages)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hall of `n` CDUs of the default figures.
    fn hall(n: f32) -> CoreConfig {
        let mut c = CoreConfig::default();
        let f = &mut c.facility;
        f.water_kg_per_s *= n;
        f.dry_cooler_ua_w_per_k *= n;
        f.fan_max_w *= n;
        f.chiller_max_w *= n;
        f.pumps_w *= n;
        f.fixed_w *= n;
        c
    }

    fn offer(accept_c: f32, points: &[(f32, f32, f32)]) -> Offer {
        let mut o = Offer {
            heat_w: 120_000.0,
            work: 128.0,
            at_water_c: accept_c,
            heat_per_k_w: 300.0,
            accept_c,
            ..Offer::default()
        };
        for (i, (dk, lost, saved)) in points.iter().enumerate() {
            o.capped[i] = OfferPoint {
                water_c: accept_c + dk,
                work_lost: *lost,
                power_saved_w: *saved,
            };
        }
        o.points = points.len() as u8;
        o
    }

    #[test]
    fn the_cost_of_warmer_water_runs_along_the_points_and_ends_after_the_last() {
        let o = offer(30.0, &[(1.0, 1.0, 500.0), (2.0, 3.0, 1500.0)]);
        assert_eq!(o.cost_at(29.0), Some((0.0, 0.0)));
        assert_eq!(o.cost_at(30.5), Some((0.5, 250.0)));
        assert_eq!(o.cost_at(31.5), Some((2.0, 1000.0)));
        assert_eq!(o.cost_at(32.5), None);
    }

    #[test]
    fn on_a_warm_day_the_water_is_the_warmest_every_cdu_accepts() {
        // Nothing offered for caps: no CDU can be left above its accept.
        let offers = [offer(34.0, &[]), offer(34.0, &[]), offer(28.0, &[])];
        let p = coordinate(&hall(3.0), &offers, 24.0, 3, false).expect("a plan");
        assert!((p.water_c - 28.0).abs() < 1e-3, "{p:?}");
        assert_eq!(p.capping, 0);
        assert!(
            p.chiller_stages >= 1,
            "the chiller trims at 28 °C on a 24 °C day: {p:?}"
        );
    }

    #[test]
    fn a_few_cheap_caps_on_the_hot_cdu_buy_warmer_water_for_the_hall() {
        // The hot CDU gives up a little work for 5 K of warmer water.
        let cheap = [
            (1.0, 0.1, 80.0),
            (2.0, 0.2, 160.0),
            (3.0, 0.3, 240.0),
            (5.0, 0.5, 400.0),
        ];
        let offers = [offer(34.0, &[]), offer(34.0, &[]), offer(29.0, &cheap)];
        let p = coordinate(&hall(3.0), &offers, 24.0, 3, false).expect("a plan");
        assert!(p.water_c > 29.5, "{p:?}");
        assert_eq!(p.capping, 0b100, "{p:?}");
        assert!(p.other_cost.is_some_and(|o| o > p.cost), "{p:?}");
    }

    #[test]
    fn caps_that_cost_more_work_than_the_chiller_saves_are_refused() {
        // Half the hot CDU's work for 1 K: never worth it.
        let dear = [(1.0, 64.0, 30_000.0)];
        let offers = [offer(34.0, &[]), offer(29.0, &dear)];
        let p = coordinate(&hall(2.0), &offers, 24.0, 2, false).expect("a plan");
        assert!((p.water_c - 29.0).abs() < 1e-3, "{p:?}");
        assert_eq!(p.capping, 0);
    }

    #[test]
    fn a_cold_night_needs_no_chiller_and_does_not_run_warmer_than_it_pays() {
        let offers = [offer(38.0, &[]), offer(38.0, &[])];
        let p = coordinate(&hall(2.0), &offers, 0.0, 2, false).expect("a plan");
        assert_eq!(p.chiller_stages, 0, "{p:?}");
        // Leakage grows with the water and the dry cooler is free: the
        // coldest water the CDU range allows.
        assert!(p.water_c < 20.0, "{p:?}");
    }

    #[test]
    fn no_offers_no_plan() {
        assert_eq!(coordinate(&hall(1.0), &[], 20.0, 1, false), None);
    }
}

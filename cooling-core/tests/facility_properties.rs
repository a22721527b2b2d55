//! Properties of the hall's facility water coordination
//! (`cooling_core::facility::coordinate`) over random halls of 1 to 16
//! CDUs, CDU ranges (site figures in tenths, or any) and outdoor
//! temperatures, with offers of any accept, heat, leakage and capped
//! points, degenerate ones included (no heat, no work, equal accepts, no
//! capped points, accepts outside the range), and offers a broken
//! estimator could make (NaN, infinite or huge figures):
//!
//! - the planned water lies on the coordinator's grid within the CDUs'
//!   range, never warmer than any counted CDU takes with its caps (its
//!   last capped point, else its accept, within [`HELD_WITHIN_K`]), and
//!   is the cheapest such water by the hall's cost (judged apart below);
//!   where no water is a candidate, the documented fallback, the coldest
//!   of the range. It may be colder than every accept: on a cold night
//!   the leakage of warmer water costs more than the dry cooler saves, so
//!   the rules ask for no floor at the coldest accept;
//! - an offer holds the grid waters it names, as its CDU walked to them
//!   and as the bus carries them;
//! - a plan that caps is chosen over the best that caps none only when
//!   it is [`CAP_PLAN_MARGIN`] cheaper, and one that caps while the plan
//!   in force caps is left only for a plan that is that much cheaper;
//! - the same offers in another order give the same plan; a CDU whose
//!   accept moves warmer never makes a plan without caps colder;
//! - whatever the offers, no panic, no NaN or infinity in the plan,
//!   chiller stages from 0 to the plant's count, and every stage for heat
//!   past any figure.
//!
//! Which offers are counted (heard in the last two minutes) and when a
//! plan is no longer followed (not renewed for five minutes) are decided
//! outside this crate's pure functions: the former by the controller's
//! coordinator (`cooling-ctrl`), the latter inside the core's step; they
//! are not driven here.
//!
//! Glossary:
//! - *grid*: the waters the coordinator tries, the range's coldest and
//!   every [`WATER_STEP_K`] above it up to the warmest.
//! - *candidate*: a grid water every offer holds (by its accept or its
//!   caps).
//! - *plain*: a candidate at which no CDU caps.

use cooling_core::facility::{coordinate, FacilityPlan, Offer, OfferPoint, OFFER_POINTS};
use cooling_core::facility::{HELD_WITHIN_K, OFFER_STEPS_K, WATER_STEP_K};
use cooling_core::model;
use cooling_core::optimise::CAP_PLAN_MARGIN;
use cooling_core::CoreConfig;
use loopwarden_protocol::units::Celsius;
use proptest::prelude::*;

/// The hall: its CDUs' range, its plant and the weather.
#[derive(Debug, Clone, Copy)]
struct Hall {
    cdus: u8,
    min_setpoint_c: f32,
    max_setpoint_c: f32,
    approach_k: f32,
    ambient_c: f32,
    capping_now: bool,
}

impl Hall {
    /// The whole plant's figures, as the controller's coordinator builds
    /// them.
    fn config(&self) -> CoreConfig {
        let mut c = CoreConfig::default();
        c.cdu.min_setpoint_c = self.min_setpoint_c;
        c.cdu.max_setpoint_c = self.max_setpoint_c;
        c.cdu.approach_k = self.approach_k;
        c.facility.cdus = self.cdus;
        c.facility = c.facility.whole();
        c
    }

    /// The grid of waters tried, °C, as the coordinator spaces it.
    fn grid(&self) -> Vec<f32> {
        let c = self.config();
        let lo = c.cdu.min_setpoint_c - c.cdu.approach_k;
        let hi = c.cdu.max_setpoint_c - c.cdu.approach_k;
        let steps = ((hi - lo) / WATER_STEP_K + 1e-3) as usize;
        (0..=steps)
            .map(|k| (lo + WATER_STEP_K * k as f32).min(hi))
            .collect()
    }

    fn plan(&self, offers: &[Offer]) -> Option<FacilityPlan> {
        let stages = self.cdus;
        coordinate(
            &self.config(),
            offers,
            self.ambient_c,
            stages,
            self.capping_now,
        )
    }
}

/// A figure from `lo` to `hi` (proptest's own float ranges can trip a
/// debug assertion of its sampler, so the figure is an integer's).
fn between(lo: f32, hi: f32) -> impl Strategy<Value = f32> {
    const N: u32 = 1 << 20;
    (0..=N).prop_map(move |k| lo + (hi - lo) * (k as f32 / N as f32))
}

/// A figure in tenths, from `lo` to `hi` tenths, as site figures give
/// them.
fn tenths(lo: u32, hi: u32) -> impl Strategy<Value = f32> {
    (lo..=hi).prop_map(|t| t as f32 / 10.0)
}

fn hall() -> impl Strategy<Value = Hall> {
    (
        1u8..=16,
        prop_oneof![2 => Just(17.0f32), 1 => tenths(120, 240), 1 => between(12.0, 24.0)],
        prop_oneof![2 => Just(45.0f32), 1 => tenths(300, 500), 1 => between(30.0, 50.0)],
        prop_oneof![2 => Just(3.0f32), 1 => tenths(5, 50), 1 => between(0.5, 5.0)],
        between(-30.0, 50.0),
        any::<bool>(),
    )
        .prop_map(
            |(cdus, min_c, max_c, approach_k, ambient_c, capping_now)| Hall {
                cdus,
                min_setpoint_c: min_c,
                // The config refuses a range whose warmest is not above its
                // coldest.
                max_setpoint_c: max_c.max(min_c + 1.0),
                approach_k,
                ambient_c,
                capping_now,
            },
        )
}

/// An accept: on the default grid, anywhere, or one of a few that halls
/// share.
fn accept_c() -> impl Strategy<Value = f32> {
    prop_oneof![
        2 => (-8i32..130).prop_map(|k| 14.0 + WATER_STEP_K * k as f32),
        2 => between(5.0, 55.0),
        1 => prop::sample::select(vec![28.0f32, 30.0, 34.0]),
    ]
}

/// Capped points above `accept`: the optimiser's steps or any rising
/// ones, with the work lost and the power saved never falling along
/// them (warmer water needs more caps); `positive`: every point loses
/// work.
fn points(accept: f32, positive: bool) -> impl Strategy<Value = Vec<OfferPoint>> {
    let lost_min = if positive { 0.01f32 } else { 0.0 };
    let steps = prop_oneof![
        Just(OFFER_STEPS_K.to_vec()),
        prop::collection::vec(between(0.01, 3.0), OFFER_POINTS).prop_map(|d| {
            d.iter()
                .scan(0.0, |k, d| {
                    *k += d;
                    Some(*k)
                })
                .collect()
        }),
    ];
    (
        0..=OFFER_POINTS,
        steps,
        prop::collection::vec(
            (between(lost_min, 20.0), between(0.0, 20_000.0)),
            OFFER_POINTS,
        ),
    )
        .prop_map(move |(n, steps, rises)| {
            let (mut lost, mut saved) = (0.0, 0.0);
            steps
                .iter()
                .zip(rises)
                .take(n)
                .map(|(dk, (dl, ds))| {
                    lost += dl;
                    saved += ds;
                    OfferPoint {
                        water_c: accept + dk,
                        work_lost: lost,
                        power_saved_w: saved,
                    }
                })
                .collect()
        })
}

/// An offer a working estimator could make; `positive`: its capped
/// points all lose work.
fn offer(positive: bool) -> impl Strategy<Value = Offer> {
    accept_c().prop_flat_map(move |accept| {
        (
            prop_oneof![1 => Just(0.0f32), 6 => between(1_000.0, 400_000.0)],
            prop_oneof![1 => Just(0.0f32), 6 => between(1.0, 256.0)],
            prop_oneof![4 => Just(accept), 1 => between(10.0, 50.0)],
            prop_oneof![1 => Just(0.0f32), 4 => between(0.0, 3_000.0)],
            points(accept, positive),
        )
            .prop_map(move |(heat_w, work, at_water_c, heat_per_k_w, pts)| {
                let mut o = Offer {
                    heat_w,
                    work,
                    at_water_c,
                    heat_per_k_w,
                    accept_c: accept,
                    ..Offer::default()
                };
                o.capped[..pts.len()].copy_from_slice(&pts);
                o.points = pts.len() as u8;
                o
            })
    })
}

fn offers(positive: bool) -> impl Strategy<Value = Vec<Offer>> {
    prop::collection::vec(offer(positive), 1..=16)
}

/// A figure a broken estimator could give.
fn broken() -> impl Strategy<Value = f32> {
    prop::sample::select(vec![
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        1e30,
        -1.0,
    ])
}

/// An offer with some figures broken: those the high byte of `which`
/// names, each to one of two broken values (by its low byte).
fn broken_offer() -> impl Strategy<Value = Offer> {
    (offer(false), any::<u16>(), broken(), broken()).prop_map(|(mut o, which, a, b)| {
        let pick = |bit: u16| if which & (1 << bit) != 0 { a } else { b };
        let mut figures = [
            &mut o.heat_w,
            &mut o.work,
            &mut o.at_water_c,
            &mut o.heat_per_k_w,
            &mut o.accept_c,
            &mut o.capped[0].water_c,
            &mut o.capped[0].work_lost,
            &mut o.capped[0].power_saved_w,
        ];
        for (i, f) in figures.iter_mut().enumerate() {
            if which & (1 << (i + 8)) != 0 {
                **f = pick(i as u16);
            }
        }
        o
    })
}

/// A temperature as the bus carries it: in hundredths of a degree
/// (`Celsius`, as `cooling_decide::facility::offer_of` reads an offer).
fn on_the_bus_c(c: f32) -> f32 {
    Celsius::new(f64::from(c)).map_or(c, |t| t.value() as f32)
}

/// How the hall fares at one water, judged apart from the coordinator's
/// code on the model it documents: IT heat with each CDU's leakage, less
/// what caps save; the dry cooler's fans and the chiller at the outdoor
/// temperature; per unit of the work the caps leave.
#[derive(Debug, Clone, Copy)]
struct Judged {
    water_c: f32,
    cost: f32,
    short: bool,
    caps: bool,
}

fn judge(hall: &Hall, offers: &[Offer], water_c: f32) -> Option<Judged> {
    let cfg = hall.config();
    let (mut heat, mut work, mut caps) = (0.0f32, 0.0f32, false);
    for o in offers {
        let (lost, saved) = o.cost_at(water_c)?;
        heat += (o.heat_w + o.heat_per_k_w * (water_c - o.at_water_c) - saved).max(0.0);
        work += (o.work - lost).max(0.0);
        caps |= lost > 0.0;
    }
    let f = &cfg.facility;
    let rej = model::rejection_at(&cfg, water_c, hall.ambient_c, heat);
    let power =
        heat * (1.0 + f.distribution_loss) + rej.fans_w + rej.chiller_w + f.pumps_w + f.fixed_w;
    Some(Judged {
        water_c,
        cost: if work > 1e-3 { power / work } else { power },
        short: rej.short_w > 1.0,
        caps,
    })
}

/// Every candidate of the grid, judged.
fn candidates(hall: &Hall, offers: &[Offer]) -> Vec<Judged> {
    hall.grid()
        .into_iter()
        .filter_map(|w| judge(hall, offers, w))
        .collect()
}

/// The warmest water `o` holds: its last capped point, else its accept.
fn warmest_held_c(o: &Offer) -> f32 {
    o.capped
        .iter()
        .take(usize::from(o.points))
        .map(|p| p.water_c)
        .fold(o.accept_c, f32::max)
}

/// `a` is at most `b`, but for `slack` of it.
fn at_most(a: f32, b: f32, slack: f32) -> bool {
    a <= b + slack * b.abs().max(1.0)
}

/// What the coordinator's choice may cost above the cheapest water of its
/// kind, as a share. It holds costs within a millionth of each other
/// equal and takes the warmer; walking up the grid such ties chain (each
/// water a millionth dearer than the one it replaced), so the water
/// chosen may cost a millionth per grid step more than the cheapest: a
/// case its rules leave open, far below what a meter tells apart, found
/// here on a cold night where the fans' saving and the leakage nearly
/// cancel.
fn tie_slack(hall: &Hall) -> f32 {
    1e-6 * (hall.grid().len() as f32 + 10.0)
}

/// A plan any offers may make: finite figures, a water on the grid,
/// stages within the plant, capping bits only for offers given.
fn check_sound(hall: &Hall, offers: &[Offer], p: &FacilityPlan) -> Result<(), TestCaseError> {
    prop_assert!(p.water_c.is_finite(), "water {p:?}");
    prop_assert!(p.cost.is_finite(), "cost {p:?}");
    prop_assert!(p.other_cost.is_none_or(f32::is_finite), "other {p:?}");
    prop_assert!(p.chiller_stages <= hall.cdus, "stages {p:?}");
    prop_assert_eq!(p.capping >> offers.len(), 0, "capping {:?}", p);
    let grid = hall.grid();
    prop_assert!(grid.contains(&p.water_c), "{} off the grid", p.water_c);
    Ok(())
}

/// The choice among the candidates of working offers: no warmer than
/// any CDU holds, the cheapest of its kind, caps only by the margin, and
/// the fallback only where no water is a candidate.
fn check_choice(hall: &Hall, offers: &[Offer], p: &FacilityPlan) -> Result<(), TestCaseError> {
    let all = candidates(hall, offers);
    let Some(chosen) = all.iter().find(|j| j.water_c == p.water_c) else {
        // No water holds every CDU: the documented fallback.
        prop_assert!(all.is_empty(), "{p:?} is no candidate of {all:?}");
        prop_assert_eq!(p.water_c, hall.grid()[0], "not the coldest");
        prop_assert_eq!(p.capping, 0);
        return Ok(());
    };
    for o in offers {
        let held_c = warmest_held_c(o) + HELD_WITHIN_K;
        prop_assert!(p.water_c <= held_c, "{p:?} above {o:?}");
    }
    prop_assert_eq!(chosen.caps, p.capping != 0, "{:?} judged {:?}", p, chosen);
    prop_assert!(!chosen.short || all.iter().all(|j| j.short), "short {p:?}");
    let best = |caps: bool| {
        all.iter()
            .filter(|j| j.caps == caps && !j.short)
            .map(|j| j.cost)
            .reduce(f32::min)
    };
    let (plain, capped) = (best(false), best(true));
    let slack = tie_slack(hall);
    if !chosen.short {
        let kind_best = if chosen.caps { capped } else { plain };
        prop_assert!(
            kind_best.is_some_and(|b| at_most(chosen.cost, b, slack)),
            "{p:?} dearer than {kind_best:?} of its kind"
        );
    }
    // The margin: caps come only 3 % cheaper than the best plan without,
    // and (the plan in force capping) go only for one 3 % cheaper.
    let m = CAP_PLAN_MARGIN;
    if let (Some(plain), Some(capped), false) = (plain, capped, chosen.short) {
        if chosen.caps && !hall.capping_now {
            prop_assert!(at_most(capped, plain * (1.0 - m), slack), "{p:?}: {plain}");
        }
        if !chosen.caps && hall.capping_now {
            prop_assert!(at_most(plain, capped * (1.0 - m), slack), "{p:?}: {capped}");
        }
        // And cheap caps are not missed (a clear margin past the rule).
        if !hall.capping_now && capped < plain * (1.0 - m) * (1.0 - slack) {
            prop_assert!(chosen.caps, "{p:?} missed caps at {capped} < {plain}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8192))]

    #[test]
    fn the_plan_is_the_cheapest_water_every_counted_cdu_holds(
        hall in hall(),
        offers in offers(false),
    ) {
        let p = hall.plan(&offers).expect("offers make a plan");
        check_sound(&hall, &offers, &p)?;
        check_choice(&hall, &offers, &p)?;
    }

    #[test]
    fn no_offers_no_plan(hall in hall()) {
        prop_assert_eq!(hall.plan(&[]), None);
    }

    #[test]
    fn the_same_offers_in_another_order_give_the_same_plan(
        hall in hall(),
        (offers, order) in offers(false).prop_flat_map(|v| {
            let idx: Vec<usize> = (0..v.len()).collect();
            (Just(v), Just(idx).prop_shuffle())
        }),
    ) {
        let p = hall.plan(&offers).expect("a plan");
        let shuffled: Vec<Offer> = order.iter().map(|&i| offers[i]).collect();
        let q = hall.plan(&shuffled).expect("a plan");
        prop_assert_eq!(p.water_c, q.water_c, "{:?} then {:?}", p, q);
        prop_assert_eq!(p.chiller_stages, q.chiller_stages);
        // Bit n of the shuffled plan is offer order[n].
        let back = order
            .iter()
            .enumerate()
            .filter(|(n, _)| q.capping & (1 << n) != 0)
            .fold(0u64, |m, (_, &i)| m | 1 << i);
        prop_assert_eq!(p.capping, back);
    }

    /// A CDU's offer names grid waters: its accept is the last water of
    /// its optimiser's walk up the grid from the coldest (a step at a
    /// time), its capped points 1, 2, 3 and 5 K above. As it made them
    /// (the coordinator's own offer) or as the bus carries them (to a
    /// hundredth of a degree), each holds the coordinator's grid water it
    /// stands for, at its cost, and the water a step above the last does
    /// not hold.
    #[test]
    fn an_offer_holds_the_grid_waters_it_names_as_made_and_as_the_bus_carries_it(
        hall in hall(),
        k in 0usize..200,
        bus in any::<bool>(),
        points in 0..=OFFER_POINTS,
        lost in between(0.01, 20.0),
        saved in between(0.0, 20_000.0),
    ) {
        let grid = hall.grid();
        let hi = grid[grid.len() - 1];
        let k = k.min(grid.len() - 1);
        let mut accept = grid[0];
        for _ in 0..k {
            accept += WATER_STEP_K;
        }
        let carried = |c: f32| if bus { on_the_bus_c(c) } else { c };
        let mut o = Offer::uncapped(carried(accept), 100_000.0, 128.0, 0.0);
        let mut named = vec![(k, 0.0, 0.0)];
        for (i, dk) in OFFER_STEPS_K.iter().enumerate().take(points) {
            let w = accept + dk;
            if w > hi + 1e-3 {
                break;
            }
            let n = i as f32 + 1.0;
            o.capped[i] = OfferPoint {
                water_c: carried(w),
                work_lost: lost * n,
                power_saved_w: saved * n,
            };
            o.points = i as u8 + 1;
            named.push((k + (dk / WATER_STEP_K) as usize, lost * n, saved * n));
        }
        for &(at, lost, saved) in &named {
            let cost = o.cost_at(grid[at]);
            prop_assert!(cost.is_some(), "{} not held by {:?}", grid[at], o);
            let (l, s) = cost.unwrap_or_default();
            prop_assert!((l - lost).abs() <= 0.01 * lost.max(1.0), "{l} for {lost}");
            prop_assert!((s - saved).abs() <= 0.01 * saved.max(1.0), "{s} for {saved}");
        }
        let past = named[named.len() - 1].0 + 1;
        if let Some(&w) = grid.get(past) {
            prop_assert_eq!(o.cost_at(w), None, "{} held by {:?}", w, o);
        }
    }

    /// One CDU's accept and capped points move warmer together, its heat
    /// and leakage as they were (every capped point here loses work, so
    /// any water above an accept caps). With no capped points anywhere
    /// that only adds warmer candidates at unchanged costs, so the water
    /// cannot get colder. Nor can a plan without caps: every plain
    /// candidate keeps its cost, and a capped one is warmer than some
    /// CDU's accept, none of which moved down. A plan with caps can, as
    /// the documented costs say: the warmer accept adds plain candidates,
    /// and the caps may no longer be 3 % cheaper than the best of them (a
    /// plain plan at colder water); or the moved CDU's caps no longer save
    /// the power they saved at the planned water, and a colder capped
    /// water is now the cheaper (found: 14.25 °C giving way to 14.0 °C on
    /// a mild day).
    #[test]
    fn a_cdu_that_accepts_warmer_water_never_makes_the_water_colder(
        hall in hall(),
        offers in offers(true),
        which in any::<prop::sample::Index>(),
        warmer_k in prop_oneof![Just(WATER_STEP_K), between(0.0, 10.0)],
        uncapped in any::<bool>(),
    ) {
        let mut offers = offers;
        if uncapped {
            offers.iter_mut().for_each(|o| o.points = 0);
        }
        let before = hall.plan(&offers).expect("a plan");
        let i = which.index(offers.len());
        let o = &mut offers[i];
        o.accept_c += warmer_k;
        for p in o.capped.iter_mut() {
            p.water_c += warmer_k;
        }
        let after = hall.plan(&offers).expect("a plan");
        if before.capping == 0 {
            prop_assert!(after.water_c >= before.water_c, "{before:?} then {after:?}");
        }
    }

    /// A broken estimator's heat past any figure is the most heat, not
    /// none: the plan stages every chiller of the plant.
    #[test]
    fn heat_past_any_figure_stages_every_chiller(
        hall in hall(),
        offers in offers(false),
        which in any::<prop::sample::Index>(),
        heat_w in prop::sample::select(vec![f32::INFINITY, f32::MAX, 1e30]),
    ) {
        let mut offers = offers;
        let i = which.index(offers.len());
        offers[i].heat_w = heat_w;
        let p = hall.plan(&offers).expect("a plan");
        prop_assert_eq!(p.chiller_stages, hall.cdus, "{:?}", p);
    }

    #[test]
    fn broken_offers_make_no_nan_no_infinity_and_no_panic(
        hall in hall(),
        good in prop::collection::vec(offer(false), 0..8),
        bad in prop::collection::vec(broken_offer(), 1..8),
        stages in 0u8..=16,
    ) {
        let mut offers = good;
        offers.extend(bad);
        let p = coordinate(&hall.config(), &offers, hall.ambient_c, stages, hall.capping_now)
            .expect("offers make a plan");
        let hall = Hall { cdus: stages, ..hall };
        check_sound(&hall, &offers, &p)?;
        // Every offer whose waters are figures still bounds the water,
        // but for the fallback where no water holds every CDU.
        if !candidates(&hall, &offers).is_empty() {
            for o in offers.iter().filter(|o| warmest_held_c(o).is_finite()) {
                let held_c = warmest_held_c(o) + HELD_WITHIN_K;
                prop_assert!(p.water_c <= held_c, "{p:?} above {o:?}");
            }
        }
    }
}

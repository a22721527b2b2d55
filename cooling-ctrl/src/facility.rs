//! The facility coordinator: the role one controller of a hall of several
//! CDUs takes (`[facility] coordinator = true`), that sets the facility
//! water and the chiller staging for the whole hall from what every
//! controller offers ([`cooling_core::facility`]). It re-plans every
//! [`REPLAN_EVERY_MS`] (and at once when a CDU offers for the first time)
//! from the freshest offer of each CDU. A CDU the coordinator stops
//! hearing is never planned out of the hall, which would warm the water
//! past what it takes and leave its heat out of the chillers' count: once
//! its offer is older than [`OFFER_STALE_MS`] it stands in the plan with
//! its last accept and heat and no caps (none may be asked of a
//! controller not heard), and a CDU never heard since the coordinator
//! started stands in at the coldest water, with the heat of the others'
//! average ([`Standing`]); each change is news for the log
//! ([`Coordinator::take_news`]). Without any offer the coordinator says
//! nothing (the BMS holds its own fixed water).
//!
//! Glossary:
//! - *offer*: what one CDU can accept and what warmer water would cost
//!   it, published retained by its controller.
//! - *plan*: the coordinator's facility water target and chiller stages,
//!   published retained in its state, which the BMS reads in the JSON
//!   tree.

use cooling_core::facility::{self, FacilityPlan, Offer};
use cooling_core::CoreConfig;
use cooling_decide::facility::celsius;
use loopwarden_protocol::message as msg;
use loopwarden_protocol::Ident;

/// An offer as the bus carries it, and back: the decision path's, which
/// the firmware sends its gateway.
pub use cooling_decide::facility::{offer_msg, offer_of};

/// How often the coordinator plans again, ms.
pub const REPLAN_EVERY_MS: u64 = 10_000;

/// An offer not renewed for this long is left out, ms (a controller
/// offers after each search, about every 15 s).
pub const OFFER_STALE_MS: u64 = 120_000;

/// How a CDU's offer stands in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Renewed within [`OFFER_STALE_MS`].
    Fresh,
    /// Not renewed for longer: its last accept and heat, no caps.
    Stale,
    /// Not heard since the coordinator started: the coldest water.
    Never,
}

/// The coordinator's state: the offers heard and the plan in force.
#[derive(Debug, Clone)]
pub struct Coordinator {
    /// The hall: the facility figures the whole plant's, the CDU range
    /// each CDU's.
    hall: CoreConfig,
    /// Chiller stages in the plant.
    stages: u8,
    /// The freshest offer of each CDU and until when it is fresh, ms
    /// ([`OFFER_STALE_MS`] from when it was made).
    offers: Vec<Option<(Offer, u64)>>,
    plan: Option<FacilityPlan>,
    planned_at: Option<u64>,
    /// Offers the plan in force was made from.
    planned_from: usize,
    /// How each CDU's offer stood in the last plan (`None`: before the
    /// first).
    standing: Vec<Option<Standing>>,
    /// Changes of standing not yet taken ([`Coordinator::take_news`]).
    news: Vec<(usize, Standing)>,
    /// The coordinator's own CDU, if it is one of the hall's: until its
    /// own first offer (its first search) it stands nowhere, not at the
    /// coldest water, for at most [`OFFER_STALE_MS`] from the first plan.
    own: Option<usize>,
    /// When the first plan was asked for, ms: a CDU not heard yet is news
    /// only [`REPLAN_EVERY_MS`] on (the others' retained offers come
    /// within a second of the start).
    first_ms: Option<u64>,
}

impl Coordinator {
    /// A coordinator for the hall of `one`'s CDU figures and its share of
    /// the facility plant (`one.facility.cdus` shares), planning for
    /// `named` CDUs (those whose offers it hears, `facility_cdus`), of
    /// which `own` is its own CDU, if any.
    pub fn new(one: &CoreConfig, named: usize, own: Option<usize>) -> Self {
        let mut hall = *one;
        hall.facility = one.facility.whole();
        let cdus = named.max(1);
        Self {
            hall,
            stages: one.facility.cdus.max(1),
            offers: vec![None; cdus],
            plan: None,
            planned_at: None,
            planned_from: 0,
            standing: vec![None; cdus],
            news: Vec::new(),
            own,
            first_ms: None,
        }
    }

    /// CDU `cdu` (0-based) offered `offer`, heard at `now_ms` in a state
    /// `age_ms` old (a dead controller's retained state, delivered again
    /// at a connection, is as old as it is, not new): it is fresh for what
    /// is left of [`OFFER_STALE_MS`]. An index past the hall's CDUs is
    /// refused.
    pub fn hear(
        &mut self,
        cdu: usize,
        offer: Offer,
        now_ms: u64,
        age_ms: u64,
    ) -> Result<(), String> {
        let n = self.offers.len();
        let slot = self
            .offers
            .get_mut(cdu)
            .ok_or_else(|| format!("an offer from CDU {cdu}: the hall has CDUs 0 to {}", n - 1))?;
        let left = OFFER_STALE_MS.saturating_sub(age_ms);
        *slot = Some((offer, now_ms.saturating_add(left)));
        Ok(())
    }

    /// The plan in force (`None`: none yet).
    pub fn current(&self) -> Option<FacilityPlan> {
        self.plan
    }

    /// Offers the plan in force was made from.
    pub fn planned_from(&self) -> usize {
        self.planned_from
    }

    /// The coldest facility water the CDUs' range allows, °C: what a BMS
    /// holds before any plan.
    pub fn coldest_c(&self) -> f32 {
        self.hall.cdu.min_setpoint_c - self.hall.cdu.approach_k
    }

    /// The plan at `now_ms` with the outdoor air at `ambient_c`: a new one
    /// every [`REPLAN_EVERY_MS`] (at once at a CDU's first offer), from
    /// every CDU's offer or its stand-in ([`Standing`]); `None` while no
    /// CDU offers.
    pub fn plan(&mut self, now_ms: u64, ambient_c: f32) -> Option<FacilityPlan> {
        let fresh = self
            .standings(now_ms)
            .filter(|s| *s == Standing::Fresh)
            .count();
        // A plan at once when there is none or a CDU's first offer came;
        // else every period.
        let due = self.plan.is_none()
            || fresh > self.planned_from
            || self
                .planned_at
                .is_none_or(|at| now_ms.saturating_sub(at) >= REPLAN_EVERY_MS);
        if due {
            let capping_now = self.plan.is_some_and(|p| p.capping != 0);
            let offers = self.offers_at(now_ms);
            self.planned_from = fresh;
            self.plan =
                facility::coordinate(&self.hall, &offers, ambient_c, self.stages, capping_now);
            self.planned_at = Some(now_ms);
        }
        self.plan
    }

    /// How each CDU's offer stands at `now_ms`.
    fn standings(&self, now_ms: u64) -> impl Iterator<Item = Standing> + '_ {
        self.offers.iter().map(move |o| match o {
            None => Standing::Never,
            Some((_, until)) if now_ms < *until => Standing::Fresh,
            Some(_) => Standing::Stale,
        })
    }

    /// The offers to plan at `now_ms` with, one for each CDU ([`Standing`]),
    /// each change of standing kept as news; none while no CDU offered.
    fn offers_at(&mut self, now_ms: u64) -> Vec<Offer> {
        let heard: Vec<Offer> = self.offers.iter().flatten().map(|(o, _)| *o).collect();
        if heard.is_empty() {
            return Vec::new();
        }
        let mean = |f: fn(&Offer) -> f32| heard.iter().map(f).sum::<f32>() / heard.len() as f32;
        let never = Offer::uncapped(
            self.coldest_c(),
            mean(|o| o.heat_w),
            0.0,
            mean(|o| o.heat_per_k_w),
        );
        let first = *self.first_ms.get_or_insert(now_ms);
        let settled = now_ms.saturating_sub(first) >= REPLAN_EVERY_MS;
        let own_overdue = now_ms.saturating_sub(first) >= OFFER_STALE_MS;
        let standings: Vec<Standing> = self.standings(now_ms).collect();
        let mut offers = Vec::with_capacity(self.offers.len());
        for (i, (slot, standing)) in self.offers.iter().zip(&standings).enumerate() {
            match (slot, standing) {
                (Some((o, _)), Standing::Fresh) => offers.push(*o),
                (Some((o, _)), _) => offers.push(Offer { points: 0, ..*o }),
                // Its own CDU, before its first search: nothing to stand
                // in; one that made none in an offer's life (failsafe
                // from the start) stands at the coldest water as any.
                (None, _) if self.own == Some(i) && !own_overdue => continue,
                (None, _) => offers.push(never),
            }
            // Not heard yet at the start is no news until the others'
            // retained offers had time to come.
            if *standing == Standing::Never && !settled {
                continue;
            }
            if self.standing[i] != Some(*standing) {
                self.news.push((i, *standing));
                self.standing[i] = Some(*standing);
            }
        }
        offers
    }

    /// The CDUs whose offer changed standing in a plan since the last
    /// call, with the new standing, for the log.
    pub fn take_news(&mut self) -> Vec<(usize, Standing)> {
        std::mem::take(&mut self.news)
    }
}

/// What the log says of CDU `name` whose offer now stands as `s`.
pub fn standing_text(name: &str, s: Standing) -> String {
    match s {
        Standing::Fresh => format!("{name}'s offer heard: planned with it"),
        Standing::Stale => format!(
            "{name}'s offer not renewed for {} s: planning the water within its last accept, no caps asked of it, its last heat counted",
            OFFER_STALE_MS / 1000
        ),
        Standing::Never => format!(
            "{name} not heard since this coordinator started: planning the coldest water"
        ),
    }
}

/// This controller's part in a hall of several CDUs (`[facility]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FacilityRole {
    /// The CDU whose plan every CDU follows: the hall's coordinator.
    pub coordinator: Ident,
    /// The hall's CDUs, in order (the coordinator hears their offers).
    pub cdus: Vec<Ident>,
}

/// A plan as the bus carries it, made from `offers` offers.
pub fn plan_msg(p: &FacilityPlan, offers: usize) -> msg::FacilityPlan {
    msg::FacilityPlan {
        water: celsius(p.water_c),
        chiller_stages: p.chiller_stages,
        offers: offers.min(255) as u8,
        capping: p.capping.count_ones().min(255) as u8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(accept_c: f32) -> Offer {
        Offer::uncapped(accept_c, 120_000.0, 128.0, 200.0)
    }

    #[test]
    fn plans_from_fresh_offers_every_ten_seconds_and_forgets_stale_ones() {
        let mut one = CoreConfig::default();
        one.facility.cdus = 2;
        let mut c = Coordinator::new(&one, 2, None);
        assert_eq!(c.plan(0, 24.0), None, "no offer, no plan");
        c.hear(0, offer(34.0), 1_000, 0).expect("CDU 0");
        c.hear(1, offer(27.0), 1_000, 0).expect("CDU 1");
        assert!(c.hear(2, offer(30.0), 1_000, 0).is_err(), "a third CDU");
        // Without a plan, the first offers make one at once.
        let p = c.plan(1_500, 24.0).expect("a plan");
        assert!((p.water_c - 27.0).abs() < 1e-3, "{p:?}");
        // Then every ten seconds (or at a CDU's first offer): a warmer
        // offer waits for the next plan.
        c.hear(1, offer(33.0), 2_000, 0).expect("CDU 1");
        assert_eq!(c.plan(5_000, 24.0), Some(p));
        assert!(c.plan(11_500, 24.0).expect("a plan").water_c > 30.0);
        // CDU 1 falls silent: its offer goes stale, and it stands in the
        // plan with its last accept: the water stays within it.
        c.hear(0, offer(34.0), 125_000, 0).expect("CDU 0");
        let p = c.plan(130_000, 24.0).expect("a plan");
        assert!(p.water_c <= 33.0 + 1e-3, "{p:?}");
        assert_eq!(c.planned_from(), 1, "one fresh offer");
        assert!(c.take_news().contains(&(1, Standing::Stale)));
    }

    /// A stale CDU's heat still counts in the chillers staged, and a CDU
    /// never heard holds the water at the coldest.
    #[test]
    fn a_cdu_not_heard_is_never_planned_out_of_the_hall() {
        let mut one = CoreConfig::default();
        one.facility.cdus = 4;
        let mut all = Coordinator::new(&one, 4, None);
        let mut stale = Coordinator::new(&one, 4, None);
        for i in 0..4 {
            all.hear(i, offer(30.0), 200_000, 0).expect("a CDU");
            stale
                .hear(i, offer(30.0), if i == 3 { 0 } else { 200_000 }, 0)
                .expect("a CDU");
        }
        let (a, s) = (
            all.plan(201_000, 30.0).unwrap(),
            stale.plan(201_000, 30.0).unwrap(),
        );
        assert_eq!(s.chiller_stages, a.chiller_stages, "{a:?} {s:?}");
        assert!((s.water_c - a.water_c).abs() < 1e-3, "{a:?} {s:?}");
        let mut three = Coordinator::new(&one, 4, None);
        for i in 0..3 {
            three.hear(i, offer(34.0), 1_000, 0).expect("a CDU");
        }
        let p = three.plan(2_000, 24.0).expect("a plan");
        assert!((p.water_c - three.coldest_c()).abs() < 1e-3, "{p:?}");
        // Not heard at the start is news only once the others' retained
        // offers had time to come.
        let news = three.take_news();
        assert!(
            !news.contains(&(3, Standing::Never)) && news.contains(&(0, Standing::Fresh)),
            "{news:?}"
        );
        three.plan(12_500, 24.0).expect("a plan");
        assert_eq!(three.take_news(), [(3, Standing::Never)]);
        three.hear(3, offer(34.0), 13_000, 0).expect("CDU 3");
        assert!(three.plan(13_000, 24.0).expect("a plan").water_c > 30.0);
        assert_eq!(three.take_news(), [(3, Standing::Fresh)]);
        // The coordinator's own CDU before its first search stands
        // nowhere: the others' water, not the coldest.
        let mut own = Coordinator::new(&one, 4, Some(0));
        for i in 1..4 {
            own.hear(i, offer(34.0), 1_000, 0).expect("a CDU");
        }
        assert!(own.plan(2_000, 24.0).expect("a plan").water_c > 30.0);
    }

    /// A dead CDU's retained offer, delivered again when the coordinator
    /// connects, is as old as it is: no caps are counted from it for a
    /// fresh offer's life.
    #[test]
    fn an_old_offer_delivered_again_is_fresh_only_for_what_is_left_of_its_life() {
        let mut one = CoreConfig::default();
        one.facility.cdus = 2;
        let mut c = Coordinator::new(&one, 2, None);
        c.hear(0, offer(30.0), 1_000, 0).expect("CDU 0");
        c.hear(1, offer(30.0), 1_000, 100_000)
            .expect("CDU 1, 100 s old");
        c.plan(1_000, 24.0).expect("a plan");
        assert_eq!(c.planned_from(), 2, "both fresh yet");
        c.plan(21_000, 24.0).expect("a plan");
        assert_eq!(c.planned_from(), 1, "CDU 1 made its offer 120 s ago");
        assert!(c.take_news().contains(&(1, Standing::Stale)));
        c.hear(1, offer(30.0), 30_000, 200_000)
            .expect("CDU 1, 200 s old");
        c.plan(31_000, 24.0).expect("a plan");
        assert_eq!(c.planned_from(), 1, "stale at once");
    }

    /// The coordinator's own CDU that never searches (failsafe from the
    /// start) is not left out of the hall for good.
    #[test]
    fn its_own_cdu_that_never_offers_stands_at_the_coldest_water_after_an_offers_life() {
        let mut one = CoreConfig::default();
        one.facility.cdus = 4;
        let mut own = Coordinator::new(&one, 4, Some(0));
        for t in [1_000, 60_000, 110_000, 125_000] {
            for i in 1..4 {
                own.hear(i, offer(34.0), t, 0).expect("a CDU");
            }
            let p = own.plan(t, 24.0).expect("a plan");
            if t < 121_000 {
                assert!(p.water_c > 30.0, "{t}: {p:?}");
            } else {
                assert!((p.water_c - own.coldest_c()).abs() < 1e-3, "{p:?}");
            }
        }
        assert!(own.take_news().contains(&(0, Standing::Never)));
    }
}

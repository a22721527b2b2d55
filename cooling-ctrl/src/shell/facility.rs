//! The shell's part in a hall of several CDUs on one facility water loop
//! (`[facility]` in the config): it publishes this CDU's offer in its
//! retained state, follows the plan the hall's coordinator publishes in
//! its own, and, on the coordinator's controller, hears every CDU's offer
//! and plans ([`crate::facility::Coordinator`]).
//!
//! The part itself ([`FacilityLink`]) is pure: it is told what was heard
//! and what this CDU offers, and says what to publish and which water to
//! follow. The shell feeds it its core's offer and follows in its core;
//! the gateway (`crate::gateway`) feeds it the offer its microcontroller
//! sends and sends the water down, so both take part in the hall alike.
//!
//! The coordinator's own offer and plan never leave the process to come
//! back: it hears its offer at each step and follows its own plan at once.
//!
//! Glossary:
//! - *offer*, *plan*: see [`cooling_core::facility`].

use cooling_core::facility::Offer;
use cooling_core::FACILITY_TARGET_STALE_MS;
use cooling_decide::facility::{offer_moved, offer_of};
use loopwarden_bus::{now_ms, Inbound};
use loopwarden_protocol::message::{CduState, FacilityState};
use loopwarden_protocol::topic::Family;
use loopwarden_protocol::{Ident, Message, Role};

use super::{FacilityStatus, Shell, ShellError};
use crate::facility::{offer_msg, plan_msg, standing_text, Coordinator, FacilityRole, Standing};
use crate::modbus::CduPort;

/// This controller's part in the hall (see the module note).
#[derive(Debug, Clone)]
pub struct FacilityLink {
    role: FacilityRole,
    /// This CDU.
    me: Ident,
    /// Present on the coordinator's controller.
    coordinator: Option<Coordinator>,
    /// The facility state last published.
    sent: Option<FacilityState>,
    /// The plan last followed, °C of facility water, when it was heard
    /// (ms of the caller's clock), and how old it was then, ms.
    following: Option<(f32, u64, u64)>,
    /// The CDUs other than the coordinator heard publishing a plan (each
    /// said once: two configurations that disagree on the coordinator).
    other_planners: Vec<Ident>,
}

impl FacilityLink {
    /// The link of CDU `me` in `role`, on the hall of `core`'s figures.
    pub fn new(role: FacilityRole, me: &Ident, core: &cooling_core::CoreConfig) -> Self {
        let own = role.cdus.iter().position(|c| c == me);
        let coordinator =
            (&role.coordinator == me).then(|| Coordinator::new(core, role.cdus.len(), own));
        Self {
            role,
            me: me.clone(),
            coordinator,
            sent: None,
            following: None,
            other_planners: Vec::new(),
        }
    }

    /// This controller plans the hall.
    pub fn coordinates(&self) -> bool {
        self.coordinator.is_some()
    }

    /// The plan last followed, °C of facility water, and its age at
    /// `now`, ms.
    pub fn following(&self, now: u64) -> Option<(f32, u64)> {
        self.following
            .map(|(w, heard, age)| (w, now.saturating_sub(heard).saturating_add(age)))
    }

    /// What the console and `/metrics` show at `now`, with this CDU's
    /// `offer`.
    pub fn status(&self, now: u64, offer: Option<Offer>) -> FacilityStatus {
        FacilityStatus {
            coordinator: self.role.coordinator.to_string(),
            coordinates: self.coordinator.is_some(),
            offer,
            // A plan the core dropped as stale is not shown as followed.
            following: self
                .following(now)
                .filter(|(_, age)| *age < FACILITY_TARGET_STALE_MS),
            plan: self
                .coordinator
                .as_ref()
                .and_then(|c| c.current().map(|p| (p, c.planned_from()))),
        }
    }

    /// CDU `from`'s retained state `st`, heard at `now` and `age_ms` old
    /// ([`hall_state`]): on the coordinator, its offer is heard; the
    /// coordinator's plan is the water to follow, returned.
    pub fn hear(&mut self, from: &Ident, st: &CduState, now: u64, age_ms: u64) -> Option<f32> {
        let facility = st.facility.as_ref()?;
        if let (Some(co), Some(offer)) = (self.coordinator.as_mut(), &facility.offer) {
            match self.role.cdus.iter().position(|c| c == from) {
                Some(i) => {
                    if let Err(e) = co.hear(i, offer_of(offer), now, age_ms) {
                        tracing::warn!("cooling facility: the offer of {from}: {e}");
                    }
                }
                None => tracing::warn!(
                    "cooling facility: an offer from {from}, which is not among the hall's CDUs (facility_cdus)"
                ),
            }
        }
        if facility.plan.is_some() && from != &self.role.coordinator {
            if !self.other_planners.contains(from) {
                tracing::warn!(
                    "cooling facility: {from} publishes a facility plan, but this controller follows {}'s \
                     (facility_coordinator): two configurations disagree on the hall's coordinator; its plan is not followed",
                    self.role.coordinator
                );
                self.other_planners.push(from.clone());
            }
            return None;
        }
        let plan = facility.plan.as_ref()?;
        let water = plan.water.value() as f32;
        self.following = Some((water, now, age_ms));
        Some(water)
    }

    /// The facility part of a state at `now`, with this CDU's `offer` and
    /// the outdoor air at `ambient_c` (the coordinator plans with it):
    /// the state, whether it moved enough to publish, and on the
    /// coordinator the water of its own plan, to follow at once.
    pub fn state(
        &mut self,
        offer: Option<Offer>,
        ambient_c: f32,
        now: u64,
    ) -> (FacilityState, bool, Option<f32>) {
        let mut plan = None;
        let mut follow = None;
        if let Some(co) = self.coordinator.as_mut() {
            let me = self.role.cdus.iter().position(|c| c == &self.me);
            if let (Some(o), Some(i)) = (offer, me) {
                if let Err(e) = co.hear(i, o, now, 0) {
                    tracing::warn!("cooling facility: its own offer: {e}");
                }
            }
            if let Some(p) = co.plan(now, ambient_c) {
                self.following = Some((p.water_c, now, 0));
                follow = Some(p.water_c);
                plan = Some(plan_msg(&p, co.planned_from()));
            }
            for (i, standing) in co.take_news() {
                let name = self.role.cdus.get(i).map_or("?", |c| c.as_str());
                let text = standing_text(name, standing);
                match standing {
                    Standing::Fresh => tracing::info!("cooling facility: {text}"),
                    _ => tracing::warn!("cooling facility: {text}"),
                }
            }
        }
        let state = FacilityState {
            offer: offer.as_ref().map(offer_msg),
            plan,
        };
        let due = moved(self.sent.as_ref(), &state);
        (state, due, follow)
    }

    /// The facility state `s` was published.
    pub fn sent(&mut self, s: FacilityState) {
        self.sent = Some(s);
    }
}

/// Whether `now` differs enough from `sent` to be published again: a new
/// plan, or an offer moved by the decision path's rule
/// ([`cooling_decide::facility::offer_moved`], the one the firmware says
/// its offer by).
fn moved(sent: Option<&FacilityState>, now: &FacilityState) -> bool {
    let Some(sent) = sent else {
        return true;
    };
    let was = sent.offer.as_ref().map(offer_of);
    let is = now.offer.as_ref().map(offer_of);
    sent.plan != now.plan || offer_moved(was.as_ref(), is.as_ref())
}

/// Another CDU's retained state in `msg`, who sent it, and how old it is
/// by its stamp, ms, less [`CLOCKS_APART_MS`] (0 for a stamp ahead of
/// `wall_ms`, Unix ms, or within that of it): a CDU's
/// state on its own `health` topic, not `me`'s, stamped within
/// [`FACILITY_TARGET_STALE_MS`] of `wall_ms`. An older one (a silent
/// controller's retained state, delivered again at every connection, or
/// clocks that far apart) is neither a plan to follow nor an offer to
/// hear: said, and dropped. One younger is taken as as old as it is, so
/// a dead controller's state delivered again is never news.
pub fn hall_state<'a>(
    msg: &'a Inbound,
    me: &Ident,
    wall_ms: u64,
) -> Option<(&'a Ident, &'a CduState, u64)> {
    let (Message::CduState(st), Family::Health) = (&msg.frame.message, msg.topic.family) else {
        return None;
    };
    let sender_ok = msg.frame.sender.role == Role::Cdu && msg.frame.sender.id == msg.topic.node;
    if !sender_ok || &msg.topic.node == me {
        return None;
    }
    // Either way: a stamp far ahead is a clock apart, and would keep a
    // dead coordinator's retained plan in force long after it stopped.
    let apart_ms = wall_ms.abs_diff(msg.frame.time.0);
    if apart_ms > FACILITY_TARGET_STALE_MS && st.facility.is_some() {
        let (how, s) = if msg.frame.time.0 > wall_ms {
            ("ahead of this clock", apart_ms / 1000)
        } else {
            ("old", apart_ms / 1000)
        };
        tracing::warn!(
            "cooling facility: the state of {} is {s} s {how} (a silent controller's retained state, or clocks apart): its offer and plan are not taken",
            msg.topic.node,
        );
        return None;
    }
    let age_ms = wall_ms
        .saturating_sub(msg.frame.time.0)
        .saturating_sub(CLOCKS_APART_MS);
    Some((&msg.topic.node, st, age_ms))
}

/// How far two controllers' clocks may be apart without a state's age
/// counting against it, ms: a state is taken as this much younger than
/// its stamp says, so a live CDU's offer (said at least every minute) is
/// never stale between two on clocks this far apart.
pub const CLOCKS_APART_MS: u64 = 30_000;

/// The subscription to every CDU's state of `site` (the coordinator's
/// plan, the other CDUs' offers).
pub fn hall_subscription(site: &Ident) -> Result<String, ShellError> {
    loopwarden_protocol::topic::filter::family(site, Role::Cdu, Family::Health)
        .map(|f| f.to_string())
        .map_err(|e| ShellError::Bus(format!("the CDU health filter: {e:?}")))
}

impl<P: CduPort> Shell<P> {
    /// Another CDU's retained state: the coordinator's plan is followed;
    /// on the coordinator, each hall CDU's offer is heard.
    pub(super) fn on_cdu_state(&mut self, msg: &Inbound) {
        let wall_ms = now_ms().0;
        let Some((from, st, age_ms)) = hall_state(msg, &self.cfg.cdu, wall_ms) else {
            return;
        };
        let now = self.now_ms();
        let Some(link) = self.facility.as_mut() else {
            return;
        };
        if let Some(water) = link.hear(from, st, now, age_ms) {
            self.decider
                .core_mut()
                .facility_target_aged(water, now, age_ms);
        }
    }

    /// The facility part of this step's state: this CDU's offer, and on
    /// the coordinator the plan (followed here at once); `None` outside a
    /// hall of several CDUs. The flag says it moved enough to publish.
    pub(super) fn facility_state(&mut self, now: u64) -> (Option<FacilityState>, bool) {
        let offer = self.decider.core().offer();
        // The core's outdoor temperature: the sensor's, else its design
        // day (colder water for the hall, never warmer, on a guess).
        let (ambient, _) = self.decider.core().outdoor();
        let Some(link) = self.facility.as_mut() else {
            return (None, false);
        };
        let (state, due, follow) = link.state(offer, ambient, now);
        if let Some(water) = follow {
            self.decider.core_mut().facility_target(water, now);
        }
        (Some(state), due)
    }

    /// The facility state was published.
    pub(super) fn facility_sent(&mut self, state: Option<FacilityState>) {
        if let (Some(link), Some(s)) = (self.facility.as_mut(), state) {
            link.sent(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_decide::facility::REPUBLISH_ACCEPT_K;
    use loopwarden_protocol::message::FacilityPlan;

    fn id(s: &str) -> Ident {
        Ident::new(s).expect("an ident")
    }

    fn offer(accept_c: f32) -> Offer {
        Offer::uncapped(accept_c, 120_000.0, 128.0, 200.0)
    }

    fn link(me: &str) -> FacilityLink {
        let mut core = cooling_core::CoreConfig::default();
        core.facility.cdus = 2;
        let role = FacilityRole {
            coordinator: id("cdu-1"),
            cdus: vec![id("cdu-1"), id("cdu-2")],
        };
        FacilityLink::new(role, &id(me), &core)
    }

    fn state_of(facility: FacilityState) -> CduState {
        let Message::CduState(mut st) =
            loopwarden_protocol::samples::message(loopwarden_protocol::MessageKind::CduState)
        else {
            unreachable!("a sample state")
        };
        st.facility = Some(facility);
        st
    }

    /// `st` as CDU `from` publishes it on its health topic, stamped `time`.
    fn inbound(from: &str, st: CduState, time: u64) -> Inbound {
        let sender = loopwarden_protocol::NodeId::new(Role::Cdu, from).expect("a node");
        Inbound {
            topic: loopwarden_protocol::topic::Topic::new(
                &id("hall-1"),
                Role::Cdu,
                &id(from),
                Family::Health,
            ),
            frame: loopwarden_protocol::Frame {
                sender,
                seq: 1,
                time: loopwarden_protocol::TimestampMs(time),
                message: Message::CduState(st),
            },
        }
    }

    #[test]
    fn a_hall_state_older_than_a_plans_life_is_not_taken() {
        let st = state_of(FacilityState {
            offer: None,
            plan: None,
        });
        let wall = 1_800_000_000_000;
        let fresh = inbound("cdu-1", st.clone(), wall - FACILITY_TARGET_STALE_MS);
        assert!(hall_state(&fresh, &id("cdu-2"), wall).is_some());
        let ahead = inbound("cdu-1", st.clone(), wall + 60_000);
        assert!(
            hall_state(&ahead, &id("cdu-2"), wall).is_some(),
            "clock ahead"
        );
        // A stamp further ahead than a plan's life: clocks apart, and a
        // dead coordinator's retained plan would stay in force.
        let far = inbound("cdu-1", st.clone(), wall + FACILITY_TARGET_STALE_MS + 1);
        assert!(hall_state(&far, &id("cdu-2"), wall).is_none(), "far ahead");
        let (_, _, age) = hall_state(&fresh, &id("cdu-2"), wall).expect("taken");
        assert_eq!(
            age,
            FACILITY_TARGET_STALE_MS - CLOCKS_APART_MS,
            "as old as its stamp, clocks apart allowed for"
        );
        let (_, _, age) = hall_state(&ahead, &id("cdu-2"), wall).expect("taken");
        assert_eq!(age, 0, "ahead: no age");
        let old = inbound("cdu-1", st.clone(), wall - FACILITY_TARGET_STALE_MS - 1);
        assert!(hall_state(&old, &id("cdu-2"), wall).is_none());
        assert!(hall_state(&fresh, &id("cdu-1"), wall).is_none(), "its own");
    }

    #[test]
    fn a_state_is_due_when_its_offer_moves_by_the_decision_paths_rule() {
        let mut l = link("cdu-2");
        let (s, due, follow) = l.state(Some(offer(31.0)), 20.0, 0);
        assert!(due && follow.is_none(), "the first, and no plan of its own");
        l.sent(s);
        let (_, due, _) = l.state(Some(offer(31.2)), 20.0, 1_000);
        assert!(!due, "0.2 K");
        let (_, due, _) = l.state(Some(offer(31.0 + REPUBLISH_ACCEPT_K)), 20.0, 2_000);
        assert!(due, "a quarter kelvin");
    }

    #[test]
    fn the_coordinators_plan_is_followed_and_another_cdus_is_not() {
        let mut l = link("cdu-2");
        let plan = FacilityPlan {
            water: cooling_decide::facility::celsius(29.5),
            chiller_stages: 1,
            offers: 2,
            capping: 0,
        };
        let planned = state_of(FacilityState {
            offer: None,
            plan: Some(plan),
        });
        assert_eq!(
            l.hear(&id("cdu-9"), &planned, 5, 0),
            None,
            "not the coordinator"
        );
        assert_eq!(l.hear(&id("cdu-9"), &planned, 6, 0), None);
        assert_eq!(l.other_planners, [id("cdu-9")], "said once");
        assert_eq!(l.hear(&id("cdu-1"), &planned, 7, 0), Some(29.5));
        assert_eq!(l.following(7), Some((29.5, 0)));
        // Shown while the core follows it; not once it dropped it.
        assert_eq!(l.status(60_007, None).following, Some((29.5, 60_000)));
        let stale = 7 + FACILITY_TARGET_STALE_MS;
        assert_eq!(l.status(stale, None).following, None);
        // A dead coordinator's retained plan, delivered again 290 s after
        // it was made, stands the 10 s left of its life, not 5 minutes.
        let late = stale + 1_000;
        assert_eq!(l.hear(&id("cdu-1"), &planned, late, 290_000), Some(29.5));
        assert_eq!(
            l.status(late + 9_999, None).following,
            Some((29.5, 299_999))
        );
        assert_eq!(l.status(late + 10_000, None).following, None);
    }

    #[test]
    fn the_coordinator_plans_from_its_own_offer_and_another_cdus_and_follows_its_plan() {
        let mut l = link("cdu-1");
        assert!(l.coordinates());
        let theirs = state_of(FacilityState {
            offer: Some(offer_msg(&offer(30.0))),
            plan: None,
        });
        assert_eq!(l.hear(&id("cdu-2"), &theirs, 0, 0), None);
        let (s, due, follow) = l.state(Some(offer(34.0)), 20.0, 100);
        let plan = s.plan.expect("a plan from both offers");
        assert_eq!(plan.offers, 2);
        assert!(due);
        assert_eq!(follow, Some(plan.water.value() as f32));
    }
}

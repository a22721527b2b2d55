//! The shell's part in a hall of several CDUs on one facility water loop
//! (`[facility]` in the config): it publishes this CDU's offer in its
//! retained state, follows the plan the hall's coordinator publishes in
//! its own, and, on the coordinator's controller, hears every CDU's offer
//! and plans ([`crate::facility::Coordinator`]).
//!
//! The coordinator's own offer and plan never leave the process to come
//! back: it hears its offer at each step and follows its own plan at once.
//!
//! Glossary:
//! - *offer*, *plan*: see [`cooling_core::facility`].

use loopwarden_bus::Inbound;
use loopwarden_protocol::message::{CduState, FacilityState};
use loopwarden_protocol::topic::Family;
use loopwarden_protocol::{Message, Role};

use super::{FacilityStatus, Shell};
use crate::facility::{offer_msg, offer_of, plan_msg, Coordinator, FacilityRole};
use crate::modbus::CduPort;

/// An offer whose accept moved this far is published again, K.
pub const REPUBLISH_ACCEPT_K: f32 = 0.25;

/// An offer whose heat moved this share is published again.
pub const REPUBLISH_HEAT: f32 = 0.05;

/// This controller's part in the hall, as the shell keeps it.
#[derive(Debug, Clone)]
pub struct FacilityLink {
    role: FacilityRole,
    /// Present on the coordinator's controller.
    coordinator: Option<Coordinator>,
    /// The facility state last published.
    sent: Option<FacilityState>,
    /// The plan last followed, °C of facility water, and when, shell ms.
    pub(super) following: Option<(f32, u64)>,
}

impl FacilityLink {
    /// The link of CDU `me` in `role`, on the hall of `core`'s figures.
    pub fn new(
        role: FacilityRole,
        me: &loopwarden_protocol::Ident,
        core: &cooling_core::CoreConfig,
    ) -> Self {
        let coordinator = (&role.coordinator == me).then(|| Coordinator::new(core));
        Self {
            role,
            coordinator,
            sent: None,
            following: None,
        }
    }

    /// What the console and `/metrics` show at `now` (shell ms), with
    /// this CDU's `offer`.
    pub fn status(&self, now: u64, offer: Option<cooling_core::facility::Offer>) -> FacilityStatus {
        FacilityStatus {
            coordinator: self.role.coordinator.to_string(),
            coordinates: self.coordinator.is_some(),
            offer,
            following: self.following.map(|(w, at)| (w, now.saturating_sub(at))),
            plan: self
                .coordinator
                .as_ref()
                .and_then(|c| c.current().map(|p| (p, c.planned_from()))),
        }
    }
}

/// Whether `now` differs enough from `sent` to be published again.
fn moved(sent: Option<&FacilityState>, now: &FacilityState) -> bool {
    let Some(sent) = sent else {
        return true;
    };
    if sent.plan != now.plan {
        return true;
    }
    match (&sent.offer, &now.offer) {
        (Some(a), Some(b)) => {
            let k = (a.accept.value() - b.accept.value()).abs() as f32;
            let (ha, hb) = (a.heat.milliwatts() as f32, b.heat.milliwatts() as f32);
            k >= REPUBLISH_ACCEPT_K || (ha - hb).abs() > REPUBLISH_HEAT * ha.max(1.0)
        }
        (a, b) => a.is_some() != b.is_some(),
    }
}

impl<P: CduPort> Shell<P> {
    /// Another CDU's retained state: the coordinator's plan is followed;
    /// on the coordinator, each hall CDU's offer is heard.
    pub(super) fn on_cdu_state(&mut self, msg: &Inbound) {
        let (Message::CduState(st), Family::Health) = (&msg.frame.message, msg.topic.family) else {
            return;
        };
        let sender_ok = msg.frame.sender.role == Role::Cdu && msg.frame.sender.id == msg.topic.node;
        let now = self.now_ms();
        let Some(link) = self.facility.as_mut() else {
            return;
        };
        if !sender_ok || msg.topic.node == self.cfg.cdu {
            return;
        }
        let from = &msg.topic.node;
        if let (true, Some(plan)) = (from == &link.role.coordinator, plan_of(st)) {
            let water = plan.water.value() as f32;
            self.decider.core_mut().facility_target(water, now);
            link.following = Some((water, now));
        }
        if let (Some(co), Some(offer)) = (link.coordinator.as_mut(), offer_in(st)) {
            match link.role.cdus.iter().position(|c| c == from) {
                Some(i) => {
                    if let Err(e) = co.hear(i, offer_of(offer), now) {
                        tracing::warn!("cooling shell: the offer of {from}: {e}");
                    }
                }
                None => tracing::warn!(
                    "cooling shell: an offer from {from}, which is not among the hall's CDUs ([facility] cdus)"
                ),
            }
        }
    }

    /// The facility part of this step's state: this CDU's offer, and on
    /// the coordinator the plan (followed here at once); `None` outside a
    /// hall of several CDUs. The flag says it moved enough to publish.
    pub(super) fn facility_state(&mut self, now: u64) -> (Option<FacilityState>, bool) {
        let me = self.cfg.cdu.clone();
        let offer = self.decider.core().offer();
        // The core's outdoor temperature: the sensor's, else its design
        // day (colder water for the hall, never warmer, on a guess).
        let (ambient, _) = self.decider.core().outdoor();
        let Some(link) = self.facility.as_mut() else {
            return (None, false);
        };
        let mut plan = None;
        if let Some(co) = link.coordinator.as_mut() {
            if let (Some(o), Some(i)) = (offer, link.role.cdus.iter().position(|c| c == &me)) {
                if let Err(e) = co.hear(i, o, now) {
                    tracing::warn!("cooling shell: its own offer: {e}");
                }
            }
            if let Some(p) = co.plan(now, ambient) {
                self.decider.core_mut().facility_target(p.water_c, now);
                link.following = Some((p.water_c, now));
                plan = Some(plan_msg(&p, co.planned_from()));
            }
        }
        let state = FacilityState {
            offer: offer.as_ref().map(offer_msg),
            plan,
        };
        let due = moved(link.sent.as_ref(), &state);
        (Some(state), due)
    }

    /// The facility state was published.
    pub(super) fn facility_sent(&mut self, state: Option<FacilityState>) {
        if let (Some(link), Some(s)) = (self.facility.as_mut(), state) {
            link.sent = Some(s);
        }
    }
}

fn plan_of(st: &CduState) -> Option<&loopwarden_protocol::message::FacilityPlan> {
    st.facility.as_ref().and_then(|f| f.plan.as_ref())
}

fn offer_in(st: &CduState) -> Option<&loopwarden_protocol::message::FacilityOffer> {
    st.facility.as_ref().and_then(|f| f.offer.as_ref())
}

//! The gateway's part in a hall of several CDUs on one facility water
//! loop (`facility_coordinator` in the config), as `run` takes it: the
//! same part (the shell's `FacilityLink`) is fed the offer the MCU
//! sends ([`Up::Offer`](loopwarden_link::Up::Offer)) instead of a core's,
//! and the water to follow goes down to the MCU as
//! [`Down::FacilityTarget`](loopwarden_link::Down::FacilityTarget)
//! instead of into a core. No I/O and no clock.
//!
//! - The offer goes in the CDU's retained state, as `run` publishes it,
//!   and the state is published again when it moved by `run`'s rule. A
//!   silent MCU's state offers nothing (its offer goes stale at the
//!   coordinator, as a stopped `run`'s does); a restarted MCU offers
//!   nothing until it sends an offer again (after its first search).
//! - The coordinator's plan, heard on the bus, is followed: its water
//!   goes down when it differs from the last sent, or when the last went
//!   [`RENEW_EVERY_MS`] ago (the core drops a target not renewed for
//!   [`cooling_core::FACILITY_TARGET_STALE_MS`] from when it comes; it is renewed only
//!   when the plan is heard again), and again when the MCU starts again
//!   (it forgets it; the gateway outlives it), and when its line opens
//!   again (nothing goes down a closed line). A plan goes down only
//!   while it is at most [`SENT_AGE_MAX_MS`] old, so the MCU holds it at
//!   most that much longer than `run` would.
//! - When this CDU is the hall's coordinator, the gateway plans as `run`
//!   does ([`crate::facility::Coordinator`], pure), from the offers heard
//!   and its MCU's, with the outdoor temperature of the MCU's last status
//!   (else the design day), publishes the plan in its state and sends
//!   its water down by the same rule.
//!
//! Glossary:
//! - *steady ms*: the gateway's monotonic clock, ms since it started.

use cooling_core::facility::Offer;
use cooling_core::CoreConfig;
use loopwarden_protocol::message::{CduState, FacilityOffer, FacilityState};
use loopwarden_protocol::Ident;

use crate::facility::{offer_of, FacilityRole};
use crate::shell::FacilityLink;

/// The water the MCU follows goes down again at most this often while
/// the plan is heard unchanged, ms.
pub const RENEW_EVERY_MS: u64 = 60_000;

/// A plan older than this when heard is not sent down, ms: a coordinator
/// publishes its state at least every minute
/// ([`cooling_decide::facility::OFFER_AGAIN_MS`]), so a live one's plan is
/// younger, clocks a minute apart allowed for.
pub const SENT_AGE_MAX_MS: u64 = 2 * cooling_decide::facility::OFFER_AGAIN_MS;

/// The gateway's part in the hall (see the module note).
#[derive(Debug, Clone)]
pub struct HallPart {
    link: FacilityLink,
    /// The MCU's offer, as it last sent it.
    offer: Option<Offer>,
    /// The outdoor temperature the coordinator plans with when the MCU
    /// measures none, °C.
    design_ambient_c: f32,
    /// The water last sent down, °C, and when, steady ms.
    down: Option<(f32, u64)>,
    /// The plan followed may go down: not one heard older than
    /// [`SENT_AGE_MAX_MS`].
    sendable: bool,
}

impl HallPart {
    /// The part of CDU `me` in `role`, on the hall of `core`'s figures.
    pub fn new(role: FacilityRole, me: &Ident, core: &CoreConfig) -> Self {
        Self {
            link: FacilityLink::new(role, me, core),
            offer: None,
            design_ambient_c: core.margins.design_ambient_c,
            down: None,
            sendable: false,
        }
    }

    /// This gateway plans the hall.
    pub fn coordinates(&self) -> bool {
        self.link.coordinates()
    }

    /// The MCU sent its offer (`None`: it no longer offers).
    pub fn offered(&mut self, offer: Option<&FacilityOffer>) {
        self.offer = offer.map(offer_of);
    }

    /// The MCU started again at `now_ms`: it offers nothing until it says
    /// so, and the water it followed, °C, goes down again if the plan is
    /// still in force.
    pub fn restarted(&mut self, now_ms: u64) -> Option<f32> {
        self.offer = None;
        self.in_force(now_ms)
    }

    /// The water followed, °C, to go down again at `now_ms` (the MCU
    /// started, or its line opened again: what was heard while it was
    /// closed was not sent), if the plan is still in force.
    pub fn in_force(&mut self, now_ms: u64) -> Option<f32> {
        let (water_c, age_ms) = self.link.following(now_ms)?;
        // The MCU holds what it is sent a plan's whole life from when it
        // comes: a plan older than a live coordinator's ever is does not
        // go down again.
        if !self.sendable || age_ms > SENT_AGE_MAX_MS {
            // The MCU has none now: the plan goes down when next heard.
            self.down = None;
            return None;
        }
        Some(self.send(water_c, now_ms))
    }

    /// CDU `from`'s retained state `st`, heard at `now_ms` and `age_ms`
    /// old: the water to send down, °C, when the coordinator's plan is due
    /// to go. The MCU holds what it is sent a plan's whole life from when
    /// it comes, so a plan older than [`SENT_AGE_MAX_MS`] (a dead
    /// coordinator's retained plan, delivered again) is not sent down.
    pub fn heard(&mut self, from: &Ident, st: &CduState, now_ms: u64, age_ms: u64) -> Option<f32> {
        let water_c = self.link.hear(from, st, now_ms, age_ms)?;
        self.sendable = age_ms <= SENT_AGE_MAX_MS;
        if !self.sendable {
            tracing::info!(
                "cooling gateway: {from}'s plan is {} s old (a retained plan delivered again): not sent down; the next the coordinator publishes is",
                age_ms / 1000
            );
            return None;
        }
        self.follow(water_c, now_ms)
    }

    /// The facility part of a state at `now_ms`: the MCU's offer while it
    /// `speaks`, and on the coordinator its plan, made with the outdoor
    /// temperature the MCU measured (`outdoor_c`). Says whether it moved
    /// enough to publish, and the water of this gateway's own plan when
    /// it is due to go down.
    pub fn state(
        &mut self,
        speaks: bool,
        outdoor_c: Option<f32>,
        now_ms: u64,
    ) -> (FacilityState, bool, Option<f32>) {
        let offer = self.offer.filter(|_| speaks);
        let ambient_c = outdoor_c.unwrap_or(self.design_ambient_c);
        let (state, moved, water_c) = self.link.state(offer, ambient_c, now_ms);
        if water_c.is_some() {
            self.sendable = true;
        }
        let down = water_c.and_then(|w| self.follow(w, now_ms));
        (state, moved, down)
    }

    /// The facility state `s` was published.
    pub fn sent(&mut self, s: FacilityState) {
        self.link.sent(s);
    }

    /// The water last handed out to go down did not reach the MCU's line:
    /// it is due again at the next state heard or made, not in a minute.
    pub fn not_sent(&mut self) {
        self.down = None;
    }

    /// Water `water_c` heard or planned at `now_ms`: down when it differs
    /// from the last sent, or that went [`RENEW_EVERY_MS`] ago.
    fn follow(&mut self, water_c: f32, now_ms: u64) -> Option<f32> {
        let due = self.down.is_none_or(|(was_c, at_ms)| {
            was_c != water_c || now_ms.saturating_sub(at_ms) >= RENEW_EVERY_MS
        });
        due.then(|| self.send(water_c, now_ms))
    }

    fn send(&mut self, water_c: f32, now_ms: u64) -> f32 {
        self.down = Some((water_c, now_ms));
        water_c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facility::offer_msg;
    use cooling_core::FACILITY_TARGET_STALE_MS;
    use cooling_decide::facility::celsius;
    use loopwarden_protocol::message::FacilityPlan;
    use loopwarden_protocol::{samples, Message, MessageKind};

    fn id(s: &str) -> Ident {
        Ident::new(s).expect("an ident")
    }

    fn part(me: &str) -> HallPart {
        let mut core = CoreConfig::default();
        core.facility.cdus = 2;
        let role = FacilityRole {
            coordinator: id("cdu-1"),
            cdus: vec![id("cdu-1"), id("cdu-2")],
        };
        HallPart::new(role, &id(me), &core)
    }

    fn state_of(facility: FacilityState) -> CduState {
        let Message::CduState(mut st) = samples::message(MessageKind::CduState) else {
            unreachable!("a sample state")
        };
        st.facility = Some(facility);
        st
    }

    fn planned(water_c: f32) -> CduState {
        state_of(FacilityState {
            offer: None,
            plan: Some(FacilityPlan {
                water: celsius(water_c),
                chiller_stages: 1,
                offers: 2,
                capping: 0,
            }),
        })
    }

    fn offer(accept_c: f32) -> FacilityOffer {
        offer_msg(&Offer::uncapped(accept_c, 120_000.0, 128.0, 200.0))
    }

    #[test]
    fn the_coordinators_water_goes_down_when_it_changes_each_minute_and_after_a_restart() {
        let mut h = part("cdu-2");
        let c = id("cdu-1");
        assert_eq!(h.heard(&c, &planned(29.0), 0, 0), Some(29.0));
        assert_eq!(h.heard(&c, &planned(29.0), 10_000, 0), None, "unchanged");
        assert_eq!(h.heard(&c, &planned(30.5), 20_000, 0), Some(30.5));
        assert_eq!(
            h.heard(&c, &planned(30.5), 20_000 + RENEW_EVERY_MS, 0),
            Some(30.5),
            "renewed"
        );
        assert_eq!(h.heard(&id("cdu-9"), &planned(20.0), 90_000, 0), None);
        assert_eq!(h.restarted(90_000), Some(30.5), "the MCU forgot it");
        // A plan not heard for five minutes is not sent again.
        assert_eq!(h.restarted(80_000 + FACILITY_TARGET_STALE_MS + 1), None);
        // A dead coordinator's retained plan, delivered again long after
        // it was made, does not go down (the MCU would hold it its whole
        // life from now), and is not sent again at a restart past its own.
        let mut h = part("cdu-2");
        let old = SENT_AGE_MAX_MS + 1;
        assert_eq!(h.heard(&c, &planned(31.0), 0, old), None);
        assert_eq!(h.restarted(500), None, "never sent, not sent at a restart");
        assert_eq!(
            h.heard(&c, &planned(31.0), 1_000, SENT_AGE_MAX_MS),
            Some(31.0)
        );
        let end = 1_000 + 1;
        assert_eq!(h.restarted(end - 1), Some(31.0), "as old as may go down");
        assert_eq!(h.restarted(end), None, "older: not again");
        // Heard again, young: it goes down (the MCU has none).
        assert_eq!(h.heard(&c, &planned(31.0), end + 1, 0), Some(31.0));
    }

    #[test]
    fn water_that_did_not_reach_the_line_goes_down_again_at_the_next_word() {
        let mut h = part("cdu-2");
        let c = id("cdu-1");
        assert_eq!(h.heard(&c, &planned(29.0), 0, 0), Some(29.0));
        h.not_sent();
        assert_eq!(h.heard(&c, &planned(29.0), 1_000, 0), Some(29.0), "again");
        assert_eq!(h.heard(&c, &planned(29.0), 2_000, 0), None, "it went");
    }

    #[test]
    fn the_mcus_offer_is_in_the_state_while_it_speaks_and_not_after_its_restart() {
        let mut h = part("cdu-2");
        let (s, moved, down) = h.state(true, Some(14.0), 0);
        assert_eq!((&s.offer, moved, down), (&None, true, None));
        h.sent(s);
        h.offered(Some(&offer(31.0)));
        let (s, moved, _) = h.state(true, Some(14.0), 1_000);
        assert_eq!(s.offer, Some(offer(31.0)), "the MCU's, as it sent it");
        assert!(moved, "a first offer publishes the state");
        h.sent(s);
        let (s, moved, _) = h.state(false, None, 2_000);
        assert_eq!((&s.offer, moved), (&None, true), "silent: withdrawn");
        let (s, _, _) = h.state(true, None, 3_000);
        assert!(s.offer.is_some(), "it speaks again");
        h.restarted(4_000);
        assert_eq!(h.state(true, None, 5_000).0.offer, None, "restarted");
    }

    #[test]
    fn the_coordinating_gateway_plans_from_its_mcus_offer_and_another_and_sends_its_water_down() {
        let mut h = part("cdu-1");
        assert!(h.coordinates());
        let theirs = state_of(FacilityState {
            offer: Some(offer(30.0)),
            plan: None,
        });
        assert_eq!(h.heard(&id("cdu-2"), &theirs, 0, 0), None);
        h.offered(Some(&offer(34.0)));
        let (s, moved, down) = h.state(true, Some(14.0), 100);
        let plan = s.plan.expect("a plan");
        assert_eq!(plan.offers, 2);
        assert!(moved);
        assert_eq!(down, Some(plan.water.value() as f32));
        let (_, _, down) = h.state(true, Some(14.0), 1_100);
        assert_eq!(down, None, "the same water a second later");
    }
}

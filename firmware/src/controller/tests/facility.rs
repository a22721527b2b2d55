//! The controller in a hall of several CDUs: its core's offer goes to the
//! gateway when it moves (and again each minute), never every step; the
//! hall's facility target from the gateway reaches the decision path.

use cooling_decide::facility::{offer_moved, offer_of, OFFER_AGAIN_MS};
use loopwarden_protocol::message::FacilityOffer;

use super::*;

/// The reference CDU as one of a hall of `cdus`.
fn hall(cdus: u8) -> CoreConfig {
    let mut cfg = CoreConfig::default();
    cfg.facility.cdus = cdus;
    cfg
}

fn decider_of(cfg: CoreConfig) -> Box<Decider> {
    Box::new(Decider::new::<&str>(cfg, map_limits(), &Ok(None)).unwrap())
}

fn replay_of(cfg: CoreConfig, wire: &[u8]) -> Replayer {
    let mut r = Replayer::new(cfg, map_limits()).unwrap();
    let mut d = Box::new(Deframer::<{ crate::outbound::MAX_FRAME }>::default());
    for b in wire {
        if let Fed::Frame(f) = d.push(*b) {
            r.hear(&f.message::<Trace>().unwrap());
        }
    }
    r
}

/// `steps` steps of a healthy CDU from step `from`; the offers sent, with
/// the step each went at.
fn run(
    c: &mut Controller<'_>,
    p: &mut Fake,
    from: u64,
    steps: u64,
) -> Vec<(u64, Option<FacilityOffer>)> {
    run_at(c, p, from, steps, |_| 80_000.0)
}

/// As [`run`], the IT load at step `s` `it_w(s)`.
fn run_at(
    c: &mut Controller<'_>,
    p: &mut Fake,
    from: u64,
    steps: u64,
    it_w: impl Fn(u64) -> f64,
) -> Vec<(u64, Option<FacilityOffer>)> {
    let mut offers = Vec::new();
    for s in from..from + steps {
        hear(c, p, &alive(s), s * 1000);
        let before = p.ups.len();
        let m = CduMeasurements {
            it_w: Some(it_w(s)),
            ..cdu(0b1111, 0)
        };
        step(c, p, Some(m), s);
        for u in &p.ups[before..] {
            if let Up::Offer(o) = u {
                offers.push((s, o.clone()));
            }
        }
    }
    offers
}

#[test]
fn the_offer_goes_up_when_it_moves_and_each_minute_not_every_step() {
    // A search every 20 s: an offer each time, said only when it moved
    // or a minute on.
    let mut cfg = hall(4);
    cfg.timing.optimise_every_ms = 20_000;
    let mut d = decider_of(cfg);
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    // The IT load rises by a quarter at step 100: the heat offered moves.
    let offers = run_at(&mut c, p, 0, 200, |s| {
        if s < 100 {
            80_000.0
        } else {
            100_000.0
        }
    });
    let (first, made) = offers
        .first()
        .cloned()
        .expect("an offer after the first search");
    let made = made.expect("an offer, not a withdrawal");
    assert!(first < 60, "the first search ended at step {first}");
    assert!(
        offers.len() < 200 / 10,
        "{} offers in 200 steps: {:?}",
        offers.len(),
        offers.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    // Each after the first moved by the rule, or came a minute on; both
    // happen.
    let (mut moved, mut again) = (0, 0);
    for w in offers.windows(2) {
        let ((was_s, was), (s, now)) = (&w[0], &w[1]);
        let (was, now) = (was.as_ref().map(offer_of), now.as_ref().map(offer_of));
        let minute = (s - was_s) * 1000 >= OFFER_AGAIN_MS;
        if offer_moved(was.as_ref(), now.as_ref()) && !minute {
            moved += 1;
        } else {
            assert!(
                minute,
                "step {s}: {now:?} after {was:?} at {was_s}, unmoved"
            );
            again += 1;
        }
    }
    let at: Vec<u64> = offers.iter().map(|(s, _)| *s).collect();
    assert!(moved >= 1, "the load's rise said at once: {at:?}");
    assert!(
        again >= 1,
        "an unmoved offer said again a minute on: {at:?}"
    );
    // What went up is the core's offer as the bus carries it.
    let now = c.decider().core().offer().expect("the core offers");
    let (_, last) = offers.last().unwrap();
    let last = offer_of(last.as_ref().unwrap());
    assert!(!offer_moved(Some(&last), Some(&now)), "{last:?} {now:?}");
    assert!(made.accept.value() > 20.0 && made.heat.0 > 0, "{made:?}");
    let r = replay_of(cfg, &p.wire);
    assert!(r.all_match(), "{:?}", r.first_mismatch);
}

#[test]
fn an_offer_the_gateways_line_did_not_take_goes_at_the_next_step_and_one_cdu_offers_nothing() {
    let mut d = decider_of(hall(4));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    p.full = true;
    let mut s = 0;
    while c.decider().core().offer().is_none() {
        assert!(s < 60, "no search ended in 60 steps");
        step(&mut c, p, Some(cdu(0b1111, 0)), s);
        s += 1;
    }
    assert!(c.link.up_dropped > 0);
    p.full = false;
    let offers = run(&mut c, p, s, 1);
    assert!(matches!(offers[..], [(_, Some(_))]), "{offers:?}");

    // A hall of one CDU: no offer, ever.
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    assert_eq!(run(&mut c, p, 0, 80), []);
}

#[test]
fn the_halls_facility_target_from_the_gateway_reaches_the_decision_path() {
    let cfg = hall(4);
    // The coordinator's water: warm, so the searches plan above it.
    let water_c = 36.0;
    let floor_c = water_c + cfg.cdu.approach_k;
    let mut proposals = Vec::new();
    for target in [false, true] {
        let mut d = decider_of(cfg);
        let mut k = Box::new(LearnedKeeper::new());
        let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
        let p = &mut *Fake::new();
        c.boot(p, hello(), Opening::Nothing);
        if target {
            hear(&mut c, p, &Down::FacilityTarget(water_c), 0);
        }
        run(&mut c, p, 0, 80);
        proposals.push(c.decider().core().loops().proposal.setpoint_c);
        let traced = |t: &Trace| matches!(t, Trace::Input(Traced::FacilityTarget { water_c: w, now_ms: 0 }) if *w == water_c);
        let r = replay_of(cfg, &p.wire);
        assert!(r.all_match(), "{:?}", r.first_mismatch);
        let frames = frames_of(&p.wire);
        assert_eq!(frames.iter().any(traced), target, "traced for the replay");
    }
    let (own, following) = (proposals[0], proposals[1]);
    assert!(
        own < floor_c,
        "without a target it plans below {floor_c}: {own}"
    );
    assert!(
        following >= floor_c,
        "with it, at {floor_c} or above: {following}"
    );
}

/// Every record of the trace on `wire`.
fn frames_of(wire: &[u8]) -> Vec<Trace> {
    let mut d = Box::new(Deframer::<{ crate::outbound::MAX_FRAME }>::default());
    wire.iter()
        .filter_map(|b| match d.push(*b) {
            Fed::Frame(f) => Some(f.message::<Trace>().unwrap()),
            _ => None,
        })
        .collect()
}

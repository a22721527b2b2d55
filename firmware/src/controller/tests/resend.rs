//! Leases the gateway may have missed: sent again when it is back.

use super::*;

fn leased(p: &Fake, from: usize, host: u16) -> bool {
    (p.ups[from..].iter())
        .any(|u| matches!(u, Up::Lease { host: h, lift: false, .. } if *h == host))
}

/// Steps 0 to 3 with the gateway's `Alive` each second, host 0 capped at
/// step 3 (rack 0 leaks), then the gateway silent through the steps up
/// to `until` (not included).
fn capped_then_silent(c: &mut Controller<'_>, p: &mut Fake, until: u64) {
    for s in 0..3 {
        hear(c, p, &alive(s), s * 1000);
        step(c, p, Some(cdu(0b1111, 0)), s);
    }
    hear(c, p, &alive(3), 3_000);
    let before = p.ups.len();
    step(c, p, Some(cdu(0b1110, 0b0001)), 3);
    assert!(leased(p, before, 0), "host 0 capped");
    for s in 4..until {
        step(c, p, Some(cdu(0b1110, 0b0001)), s);
    }
}

/// A host capped, the gateway silent 5 steps, then a restarted gateway's
/// `Alive` (frame 0): the cap goes again at the next step, not at its
/// renewal.
#[test]
fn a_cap_in_force_goes_again_when_a_restarted_gateway_speaks() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    capped_then_silent(&mut c, p, 9);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 9);
    assert!(!leased(p, before, 0), "not due by itself yet");
    hear_numbered(&mut c, p, &alive(10), 0, 10_000);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 10);
    assert!(leased(p, before, 0), "the cap in force goes again");
    // Once: the next step sends it no more.
    hear_numbered(&mut c, p, &alive(11), 1, 11_000);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 11);
    assert!(!leased(p, before, 0));
}

/// A restarted gateway whose first frame is not an `Alive`: no status
/// or lease goes up until its `Alive` says its layout.
#[test]
fn a_restarted_gateway_gets_no_status_until_its_alive_says_its_layout() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    hear_numbered(&mut c, p, &alive(0), 7, 0);
    step(&mut c, p, Some(cdu(0b1111, 0)), 1);
    let statuses = |p: &Fake, from: usize| {
        (p.ups[from..].iter())
            .filter(|u| matches!(u, Up::Status(_)))
            .count()
    };
    assert_eq!(statuses(p, 0), 1);
    hear_numbered(&mut c, p, &Down::Outdoor(12.0), 0, 1_500);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1111, 0)), 2);
    assert_eq!(statuses(p, before), 0, "its layout is not known yet");
    hear_numbered(&mut c, p, &alive(2), 1, 2_500);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1111, 0)), 3);
    assert_eq!(statuses(p, before), 1);
}

/// A host capped, the gateway silent 5 s (a pulled cable, no restart:
/// its frames' numbers go on), then the BMS's outdoor temperature first
/// and its `Alive` half a second later: the gateway is back all the
/// same, and the cap goes again at the next step.
#[test]
fn a_cap_in_force_goes_again_when_another_frame_comes_first_after_a_silence() {
    let mut d = decider(&Ok(None));
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    capped_then_silent(&mut c, p, 8);
    hear(&mut c, p, &Down::Outdoor(12.0), 8_000);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 8);
    assert!(!leased(p, before, 0), "not due before its Alive");
    hear(&mut c, p, &alive(8), 8_500);
    let before = p.ups.len();
    step(&mut c, p, Some(cdu(0b1110, 0b0001)), 9);
    assert!(leased(p, before, 0), "the cap in force goes again");
    assert_eq!(c.link.restarts, 0, "no restart: a silence alone");
}

//! The status the gateway shows: the valves the CDU took.

use cooling_decide::MapLimits;

use super::*;

/// One step whose latched record does not go into flash, every write of
/// its plan taken by the CDU.
fn step_unkept(c: &mut Controller<'_>, p: &mut Fake, m: CduMeasurements, s: u64) -> Plan {
    c.step(p, Some(m), s * 1000);
    if c.to_keep(p).is_some() {
        c.kept(p, false);
    }
    let plan = c.plan(p);
    c.written(p, Outcome::whole(&plan, true));
    c.report(p, s * 1000, true);
    plan
}

fn last_status(p: &Fake) -> &Status {
    p.ups
        .iter()
        .rev()
        .find_map(|u| match u {
            Up::Status(s) => Some(s),
            _ => None,
        })
        .expect("a status went up")
}

#[test]
fn a_close_never_written_is_not_in_the_status_though_every_write_went_in() {
    // A map without valve positions: the CDU's readings say nothing of
    // the valves, and the latched record must be in flash before any
    // valve is written.
    let limits = MapLimits {
        positions: false,
        ..map_limits()
    };
    let mut d =
        Box::new(Decider::new(CoreConfig::default(), limits, &Ok::<_, &str>(None)).unwrap());
    let mut k = Box::new(LearnedKeeper::new());
    let mut c = Controller::new(&mut d, ClearGate::new(None, &[]), &mut k);
    let p = &mut *Fake::new();
    c.boot(p, hello(), Opening::Nothing);
    let no_positions = |leaks| CduMeasurements {
        valves_closed: None,
        ..cdu(0b1111, leaks)
    };
    for s in 0..3u64 {
        hear(&mut c, p, &alive(s), s * 1000);
        step_unkept(&mut c, p, no_positions(0b0100), s);
    }
    assert_eq!(
        c.commands().map(|c| c.valves_open),
        Some(0b1011),
        "rack 2 commanded shut"
    );
    assert_eq!(c.decider().core().leaks_latched(), 0b0100);
    let s = last_status(p);
    assert!(s.writes_ok, "every write of the plan went in");
    assert_eq!(
        s.racks.valves_open, 0b1111,
        "no close reached the CDU: every valve as it last took them (open)"
    );
}

#[test]
fn a_close_the_cdu_took_is_in_the_status() {
    booted(|c, p| {
        let mut open = 0b1111;
        for s in 0..3u64 {
            hear(c, p, &alive(s), s * 1000);
            let plan = step(c, p, Some(cdu(open, 0b0100)), s);
            open = plan.value(Setting::Valves).map_or(open, |v| v as u16);
        }
        assert_eq!(open, 0b1011);
        assert_eq!(last_status(p).racks.valves_open, 0b1011);
    });
}

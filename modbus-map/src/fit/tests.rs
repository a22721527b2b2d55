use std::string::ToString;
use std::vec::Vec;

use super::*;
use crate::MapFile;

/// A register of `kind` named `name` in `unit`; a holding one's range
/// `min` to `max`.
fn reg(
    name: &'static str,
    kind: Kind,
    unit: &'static str,
    range: (f64, f64),
) -> Register<&'static str> {
    let holding = kind == Kind::Holding;
    Register {
        name,
        kind,
        address: 0,
        ty: crate::Type::U16,
        scale: 1.0,
        unit,
        min: holding.then_some(range.0),
        max: holding.then_some(range.1),
        description: "",
    }
}

/// Every register the controllers read or write, in its unit, each
/// setting's range wide.
fn fitting() -> Vec<Register<&'static str>> {
    let input = READINGS.map(|(n, u)| reg(n, Kind::Input, u, (0.0, 0.0)));
    let holding = SETTINGS.map(|(n, u)| reg(n, Kind::Holding, u, (0.0, 65535.0)));
    input.into_iter().chain(holding).collect()
}

/// `fitting()` with the register named `name` put through `edit`.
fn with(name: &str, edit: impl Fn(&mut Register<&'static str>)) -> Vec<Register<&'static str>> {
    let mut regs = fitting();
    edit(
        regs.iter_mut()
            .find(|r| r.name == name)
            .expect("a known name"),
    );
    regs
}

fn refused(regs: &[Register<&'static str>], racks: Option<u8>) -> std::string::String {
    check_fit(regs, racks).expect_err("refused").to_string()
}

#[test]
fn every_register_known_of_its_kind_and_unit_fits_any_racks_or_none() {
    assert_eq!(check_fit(&fitting(), None), Ok(()));
    for racks in 1..=16 {
        assert_eq!(check_fit(&fitting(), Some(racks)), Ok(()));
    }
    // The needed settings and readings alone fit too:
    // the rest are read when there.
    let needed: Vec<_> = fitting()
        .into_iter()
        .filter(|r| {
            NEEDED
                .iter()
                .chain(&NEEDED_READINGS)
                .any(|(n, _)| *n == r.name)
        })
        .collect();
    assert_eq!(check_fit(&needed, Some(4)), Ok(()));
}

#[test]
fn the_valve_words_range_is_judged_against_the_racks_once_they_are_known() {
    let narrow = with("valves_open", |r| r.max = Some(255.0));
    assert_eq!(check_fit(&narrow, None), Ok(()), "racks not known yet");
    assert_eq!(check_fit(&narrow, Some(8)), Ok(()));
    assert_eq!(
        refused(&narrow, Some(10)),
        "valves_open: its range 0 to 255 must hold 0 to 1023 (every valve of 10 racks, bit n = rack n)"
    );
    assert_eq!(every_valve(1), 1.0);
    assert_eq!(every_valve(16), 65535.0);
    assert!(range_holds(0.0, 3.0, 3.0));
    assert!(!range_holds(1.0, 3.0, 3.0), "all stopped left out");
    assert!(!range_holds(0.0, f64::NAN, 3.0));
}

#[test]
fn the_pumps_lead_speed_and_heartbeat_ranges_are_judged_without_the_racks() {
    let pumps = with("pumps_run", |r| r.max = Some(1.0));
    assert!(refused(&pumps, None).starts_with("pumps_run: its range 0 to 1 must hold 0 to 3"));
    let lead = with("lead_pump", |r| r.min = Some(1.0));
    assert!(refused(&lead, None).starts_with("lead_pump: its range 1 to 65535 must hold 0 to 1"));
    let speed = with("pump_speed", |r| (r.min, r.max) = (Some(30.0), Some(80.0)));
    assert!(refused(&speed, None)
        .starts_with("pump_speed: its range 30 to 80 must hold 30 to 100 (full speed"));
    let still = with("heartbeat", |r| (r.min, r.max) = (Some(7.0), Some(7.5)));
    assert!(refused(&still, None)
        .starts_with("heartbeat: its range 7 to 7.5 holds fewer than two whole values"));
}

#[test]
fn a_name_kind_or_unit_the_controllers_do_not_take_is_refused() {
    let typo = with("heartbeat", |r| r.name = "hearbeat");
    assert_eq!(
        refused(&typo, None),
        "register \"hearbeat\" is not one the controller reads or writes (did you mean \"heartbeat\"?)"
    );
    let far = with("heartbeat", |r| r.name = "watchdog_word");
    assert_eq!(
        refused(&far, None),
        "register \"watchdog_word\" is not one the controller reads or writes"
    );
    let mut missing = fitting();
    missing.retain(|r| r.name != "pumps_run");
    assert!(refused(&missing, None).starts_with("pumps_run: the map lacks it"));
    let input = with("valves_open", |r| {
        (r.kind, r.min, r.max) = (Kind::Input, None, None)
    });
    assert_eq!(
        refused(&input, None),
        "valves_open: the controller needs it as a holding register, the map has it as input"
    );
    let kw = with("it_power", |r| r.unit = "kW");
    assert_eq!(
        refused(&kw, None),
        "it_power: the map gives its unit as \"kW\", the controller takes it in \"W\" and converts nothing"
    );
    let none = with("flow", |r| r.unit = "");
    assert!(refused(&none, None).contains("its unit as none (\"\": bits or a count)"));
}

#[test]
fn a_map_without_a_pumps_running_flag_is_refused_naming_it() {
    for (name, pump) in [("pump_a_running", 'A'), ("pump_b_running", 'B')] {
        let mut missing = fitting();
        missing.retain(|r| r.name != name);
        for racks in [None, Some(4)] {
            assert_eq!(
                refused(&missing, racks),
                format!(
                    "{name}: the map lacks it; the controller needs it as an input register, \
                     pump {pump}'s running feedback: without it the pump reads as stopped \
                     while it runs, and is taken for tripped and taken out of service"
                )
            );
        }
    }
    // Of the other kind it is refused as such.
    let holding = with("pump_a_running", |r| r.kind = Kind::Holding);
    assert_eq!(
        refused(&holding, None),
        "pump_a_running: the controller needs it as an input register, the map has it as holding"
    );
}

#[test]
fn a_map_without_the_setpoint_or_the_pump_speed_is_refused_naming_it() {
    for (name, what) in [
        ("supply_setpoint", "supply temperature"),
        ("pump_speed", "pumps' speed"),
    ] {
        let mut missing = fitting();
        missing.retain(|r| r.name != name);
        for racks in [None, Some(4)] {
            let e = check_fit(&missing, racks).expect_err("refused");
            assert!(
                matches!(e, UnfitMap::Missing { name: n, .. } if n == name),
                "{e:?}"
            );
            let e = e.to_string();
            assert!(
                e.starts_with(&format!(
                    "{name}: the map lacks it; the controller needs it as a holding register: it sets the {what}"
                )) && e.contains("the CDU never got"),
                "{e}"
            );
        }
    }
}

#[test]
fn a_misspelt_name_is_told_the_nearest_known_name() {
    // pump_a_running is two letters off, pump_b_running one: the nearer.
    let typo = with("pump_b_running", |r| r.name = "pump_b_runing");
    assert_eq!(
        refused(&typo, None),
        "register \"pump_b_runing\" is not one the controller reads or writes \
         (did you mean \"pump_b_running\"?)"
    );
    let typo = with("pump_a_running", |r| r.name = "pump_a_runing");
    assert!(refused(&typo, None).ends_with("(did you mean \"pump_a_running\"?)"));
}

#[test]
fn a_name_two_letters_off_is_near() {
    assert_eq!(edits("heartbeat", "hearbeat"), 1);
    assert_eq!(edits("valves_open", "valve_opne"), 3);
    assert_eq!(edits("", "abc"), 3);
    assert_eq!(edits("pumps_run", "pumps_run"), 0);
    assert_eq!(unit_text("°C"), "\"°C\"");
}

#[test]
fn a_serial_unit_id_addresses_one_device() {
    for id in [1, 17, 247] {
        assert_eq!(check_serial_unit_id(id), Ok(()));
    }
    let broadcast = check_serial_unit_id(0).unwrap_err().to_string();
    assert!(
        broadcast.starts_with(
            "unit_id 0: on a serial line the CDU needs an address of its own, 1 to 247"
        ) && broadcast.contains("broadcast"),
        "{broadcast}"
    );
    for id in [248, 255] {
        let e = check_serial_unit_id(id).unwrap_err().to_string();
        assert!(e.contains("reserved"), "{e}");
    }
}

/// The shipped simulated CDU's map file, as it is.
const SIM_MAP: &str = include_str!("../../../boards/cdus/sim-cdu.toml");

/// The simulated CDU's map with the register named `name` cut from its
/// text (its `[[register]]` table, up to the next).
fn sim_map_without(name: &str) -> MapFile {
    let at = SIM_MAP
        .find(&format!("[[register]]\nname = \"{name}\"\n"))
        .unwrap_or_else(|| panic!("{name} in boards/cdus/sim-cdu.toml"));
    let end = SIM_MAP[at + 1..]
        .find("[[register]]")
        .map_or(SIM_MAP.len(), |n| at + 1 + n);
    let text = format!("{}{}", &SIM_MAP[..at], &SIM_MAP[end..]);
    let file: MapFile = toml::from_str(&text).expect("the map reads without it");
    assert!(file.register.iter().all(|r| r.name != name), "{name} cut");
    file
}

#[test]
fn a_map_without_the_supply_the_return_or_the_flow_is_refused_naming_it() {
    let whole: MapFile = toml::from_str(SIM_MAP).expect("the shipped map reads");
    assert_eq!(whole.check(), Ok(()));
    for racks in [None, Some(1), Some(16)] {
        assert_eq!(check_fit(&whole.register, racks), Ok(()));
    }
    for (name, what) in [
        ("supply_temp", "the secondary supply temperature"),
        ("return_temp", "the secondary return temperature"),
        ("flow", "the secondary flow"),
    ] {
        let cut = sim_map_without(name);
        // The map's own check passes: only the fit refuses it.
        assert_eq!(cut.check(), Ok(()), "{name}");
        for racks in [None, Some(4)] {
            let e = check_fit(&cut.register, racks).expect_err("refused");
            assert!(
                matches!(e, UnfitMap::MissingReading { name: n, .. } if n == name),
                "{name}: {e:?}"
            );
            let e = e.to_string();
            let head = format!(
                "{name}: the map lacks it; the controller needs it as an input register, {what}"
            );
            assert!(e.starts_with(&head) && e.contains("lost for good"), "{e}");
        }
    }
}

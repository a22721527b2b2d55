//! The controller's shell on a real mosquitto and the simulated CDU (the
//! rig: `shell_cdu`) closes a leaking rack's valve on the step whose
//! reads first saw the leak (judged by step number, not by time), from
//! the CDU's leak input or a rope on the board, whatever else the CDU
//! refuses; and after a latched record it cannot read, writes no valve
//! until it has read the valve positions, and relatches from them.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

// The shared rigs' parts other files use.
#[allow(dead_code)]
mod shell_cdu;
#[allow(dead_code)]
mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::journal::{ControllerFlash, LatchRecord};
use loopwarden_protocol::message::RackCooling;
use loopwarden_protocol::{Family, Message};
use loopwarden_system_tests::Mosquitto;
use shell_cdu::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_closes_its_racks_valve_on_the_step_it_is_seen_and_the_state_says_so() {
    let Some(mut rig) = Rig::start().await else {
        return;
    };
    let (probe, mut rx) = rig.probe("probe3", &[cdu_topic(Family::Health)]).await;
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);

    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap(); // rack 2
    closes_on_the_step_seen(&mut rig, 2, 11.0).await;
    let st = first(
        &mut rx,
        Duration::from_secs(3),
        "a state with rack 2 lost",
        |m| match &m.frame.message {
            Message::CduState(st) if st.racks.iter().any(|r| r.cooling == RackCooling::Lost) => {
                Some(st.clone())
            }
            _ => None,
        },
    )
    .await;
    let lost: Vec<u8> = st
        .racks
        .iter()
        .filter(|r| r.cooling == RackCooling::Lost)
        .map(|r| r.rack.get())
        .collect();
    assert_eq!(lost, vec![2]);
    // Its hosts are capped to their minimum, for the leak.
    let s = rig
        .wait_stats("the leaking rack's hosts capped", |s| {
            (8..12).all(|h| s.caps[h].is_some())
        })
        .await;
    assert!((8..12).all(|h| s.caps[h] == Some(200.0)));
    assert!(s
        .last
        .as_ref()
        .is_some_and(|c| c.cooling_lost == 4 && c.beacon));
    let _ = probe.shutdown(Duration::from_secs(1)).await;
    rig.stop().await;
}

#[tokio::test]
async fn a_leak_rope_on_the_board_closes_its_valve_and_the_beacon_lights() {
    use loopwarden_boards::pins::{BoardPins, PinMap};
    use loopwarden_twin::pins::SimLines;
    let map = PinMap::sim_controller();
    let lines = SimLines::new();
    for r in &map.ropes {
        lines.assert(&r.leak, false);
        lines.assert(&r.fault, false);
    }
    let pins = BoardPins::new(&map, |l| lines.input(l), |l| lines.output(l));
    let Some(mut rig) = Rig::start_full(CoreConfig::default(), Some(Box::new(pins))).await else {
        return;
    };
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    // The healthy relay gets one edge per step.
    let level = lines.asserted(&map.controller_healthy);
    let steps = rig.shell.stats.borrow().steps;
    rig.wait_stats("one more step", |s| s.steps > steps).await;
    assert_ne!(
        lines.asserted(&map.controller_healthy),
        level,
        "the relay is pulsed"
    );
    assert!(!lines.asserted(&map.alarm_beacon), "no alarm yet");
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), 15.0);
    // Rack 1's rope gets wet: the CDU's own leak register says nothing.
    lines.assert(&map.rope(1).unwrap().leak, true);
    closes_on_the_step_seen(&mut rig, 1, 13.0).await;
    rig.wait_stats("the beacon commanded", |s| {
        s.last.as_ref().is_some_and(|c| c.beacon)
    })
    .await;
    tokio::time::sleep(PERIOD).await;
    assert!(lines.asserted(&map.alarm_beacon), "the beacon is lit");
    rig.stop().await;
}

#[tokio::test]
async fn an_unreadable_latched_record_latches_the_racks_whose_valves_read_closed() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    {
        // A record no controller writes (version 9).
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
        futures::executor::block_on(
            stores
                .store
                .set(cooling_ctrl::journal::LATCHED_KEY, &[9u8; 16]),
        )
        .expect("written");
    }
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    let e = flash.latched.clone().unwrap_err();
    assert!(e.contains("version 9"), "{e}");
    // The CDU kept rack 2's valve shut while the controller was away.
    let mut rig = Rig::start_prepared(broker, CoreConfig::default(), None, Some(flash), |cdu| {
        cdu.set_measurement("valves_closed", 4.0).unwrap();
    })
    .await;
    let s = rig
        .wait_stats("rack 2 latched", |s| {
            s.status.as_ref().is_some_and(|st| st.leaks_latched == 4)
        })
        .await;
    assert_eq!(s.last.map(|c| c.valves_open), Some(0b1011));
    tokio::time::sleep(PERIOD * 3).await;
    assert_eq!(
        rig.cdu.setting("valves_open").unwrap(),
        11.0,
        "it stays shut"
    );
    rig.stop().await;
    // The record written anew has the mark beside it: should both of its
    // items be lost later, a restart reads it as lost, not as none.
    let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
    let mut b = [0u8; 4];
    let mark = stores
        .store
        .get(cooling_ctrl::journal::LATCH_KEPT_KEY, &mut b);
    assert!(
        futures::executor::block_on(mark).unwrap().is_some(),
        "the mark that a record was kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setpoint_below_the_maps_range_is_held_to_it_and_a_leaking_racks_valve_still_closes() {
    // A site whose 12 °C dew point allows 14 °C water; the CDU's map
    // takes no less than 17 °C.
    let mut core = CoreConfig::default();
    core.cdu.min_setpoint_c = 14.0;
    core.margins.boot_setpoint_c = 14.0;
    let Some(mut rig) = Rig::start_with(core).await else {
        return;
    };
    rig.wait_stats("the shell running", |s| s.cdu_reads >= 2)
        .await;
    valves_become(&rig.cdu, 15.0, Duration::from_secs(10)).await;
    let setpoint = rig.cdu.setting("supply_setpoint").unwrap();
    assert!((17.0..=45.0).contains(&setpoint), "{setpoint}");
    rig.cdu.set_measurement("leak_inputs", 4.0).unwrap(); // rack 2
    closes_on_the_step_seen(&mut rig, 2, 11.0).await;
    let s = rig.wait_stats("steps", |s| s.steps >= 4).await;
    assert_eq!(s.cdu_write_errors, 0, "nothing refused: {:?}", s.cdu_error);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_setpoint_holds_back_neither_the_valves_nor_the_heartbeat() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    // The CDU's own range is narrower than its map says: every setpoint
    // the controller asks is refused with exception 3.
    let cdu = loopwarden_system_tests::steady_sim_cdu_on(sim_map_edited(|t| {
        t.replace("min = 17.0", "min = 44.0")
    }));
    let mut rig = Rig::start_cdu(broker, CoreConfig::default(), None, None, None, cdu, None).await;
    rig.wait_stats("a refused write", |s| s.cdu_write_errors >= 2)
        .await;
    valves_become(&rig.cdu, 15.0, Duration::from_secs(10)).await;
    let beat = rig.cdu.setting("heartbeat").unwrap();
    let steps = rig.shell.stats.borrow().steps;
    rig.wait_stats("two more steps", |s| s.steps >= steps + 2)
        .await;
    assert_ne!(
        rig.cdu.setting("heartbeat").unwrap(),
        beat,
        "the heartbeat goes on"
    );
    assert_eq!(
        rig.cdu.setting("supply_setpoint").unwrap(),
        0.0,
        "the setpoint never went in"
    );
    rig.cdu.set_measurement("leak_inputs", 2.0).unwrap(); // rack 1
    closes_on_the_step_seen(&mut rig, 1, 13.0).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_record_is_not_overwritten_while_the_cdu_is_silent() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = unreadable_flash(&path);
    let cdu = sim_cdu();
    let mut rig = Rig::start_cdu(
        broker,
        CoreConfig::default(),
        None,
        Some(flash),
        None,
        cdu,
        Some(Duration::from_secs(30)),
    )
    .await;
    rig.wait_stats("steps with the CDU silent", |s| {
        s.steps >= 3 && s.cdu_read_errors >= 3
    })
    .await;
    rig.stop().await;
    let again = ControllerFlash::open(Some(&path)).expect("the flash file");
    let e = again.latched.clone().unwrap_err();
    assert!(e.contains("version 9"), "still the unreadable record: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_valve_is_written_after_an_unreadable_record_until_the_positions_are_read() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flash = unreadable_flash(&dir.path().join("cdu.flash"));
    // Every read fails (the CDU lacks a register its map has), every
    // write goes in; rack 2's valve was shut for a leak.
    let served = sim_map_edited(|t| {
        let cut = t.find("[[register]]\nname = \"outdoor_temp\"").unwrap();
        let end = cut + t[cut..].find("\n\n").unwrap() + 2;
        format!("{}{}", &t[..cut], &t[end..])
    });
    let cdu = loopwarden_system_tests::steady_sim_cdu_on(served);
    cdu.write_setting("valves_open", 11.0).unwrap();
    let mut rig = Rig::start_cdu(
        broker,
        CoreConfig::default(),
        None,
        Some(flash),
        None,
        cdu,
        None,
    )
    .await;
    rig.wait_stats("steps with every read failing", |s| {
        s.steps >= 5 && s.cdu_read_errors >= 5
    })
    .await;
    assert_eq!(
        rig.cdu.setting("valves_open").unwrap(),
        11.0,
        "rack 2's valve stays shut"
    );
    rig.stop().await;
}

/// After a record it could not read, the relatch's record goes above the
/// generation the flash held beside it: a power cut between that record
/// and its generation then leaves it one ahead, and the next start reads
/// the relatched record, not a damaged one (a relatch again, losing what
/// it held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_relatch_the_record_goes_above_the_generation_the_flash_held() {
    use cooling_ctrl::journal::{LATCHED_GEN_KEY, LATCHED_KEY};
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let gen = |g: u32| g.to_le_bytes();
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
        let store = &mut stores.store;
        futures::executor::block_on(store.set(LATCHED_KEY, &[9u8; 16])).expect("written");
        futures::executor::block_on(store.set(LATCHED_GEN_KEY, &gen(7))).expect("written");
    }
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    assert!(flash.latched.is_err());
    assert_eq!(flash.relatch_floor, Some(7));
    let mut rig = Rig::start_prepared(broker, CoreConfig::default(), None, Some(flash), |cdu| {
        cdu.set_measurement("valves_closed", 4.0).unwrap();
    })
    .await;
    rig.wait_stats("rack 2 relatched and kept", |s| {
        !s.relatch_pending && s.status.as_ref().is_some_and(|st| st.leaks_latched == 4)
    })
    .await;
    rig.stop().await;
    let relatched = ControllerFlash::open(Some(&path))
        .expect("the flash file after the relatch")
        .latched
        .expect("the relatch's record")
        .expect("a record");
    assert_eq!(relatched.latched.leaks, 4);
    assert!(
        relatched.generation > 7,
        "generation {} is not above the 7 the flash held",
        relatched.generation
    );
    // Power cut after the relatch's first record, before its generation:
    // the generation item still holds 7.
    let first = LatchRecord {
        generation: 8,
        ..relatched
    };
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("the flash file");
        let store = &mut stores.store;
        let [(k0, v0), _] = first.items();
        futures::executor::block_on(store.set(k0, &v0)).expect("written");
        futures::executor::block_on(store.set(LATCHED_GEN_KEY, &gen(7))).expect("written");
    }
    let after_cut = ControllerFlash::open(Some(&path)).expect("the flash file after the cut");
    assert_eq!(after_cut.latched, Ok(Some(first)), "the relatched record");
    assert_eq!(after_cut.relatch_floor, None);
}

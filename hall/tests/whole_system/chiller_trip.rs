//! The whole system through a real mosquitto: at 44 °C outdoors under
//! full load the trim chiller trips; the hall's coolant warms past what
//! the GPUs can take at full power, the controller sends cap leases, the
//! four real node agents apply them and acknowledge a limit in force below
//! the TDP, no GPU shuts down; after the chiller is back the controller
//! lifts every cap and the agents' telemetry shows the TDP again.
//!
//! Timings: the hall runs at `SPEED` = 10 simulated seconds per wall
//! second, while the controller (1 s period) and the agents keep their
//! real-time periods, and the controller lifts a cap only after
//! `cap_release_ms` with capacity back, cut here to `CAP_RELEASE_MS` (20 s
//! of wall time) from the core's 60 s, so the run need not wait out a
//! full minute (nothing else changes). The site's facility is scaled down
//! to its four hosts (dry cooler 2.5 kW/K, water loop 0.375 MJ/K), so
//! without the chiller the water climbs towards ambient + 2 K + 27 kW /
//! 2.5 kW/K, past what the GPUs take at full power, with a time constant
//! of 150 simulated seconds (15 s of wall time). The run lasts
//! `DURATION_S / SPEED` = 140 s of wall time: the trip from 15 s to 75 s,
//! then 65 s for the water to cool, the 20 s release and the lifts to be
//! acknowledged and shown in telemetry. In a run (two tests beside it, as
//! under `cargo test`) the caps came 40 s of wall time into the trip and
//! the last was lifted 27 s after it ended. With the water climbing ten
//! times faster per wall second than a real loop's, the controller may
//! judge its supply sensor drifting and run in failsafe during the trip:
//! it still caps. The assertions are on what happened, never on
//! how fast.
//!
//! All of it over TLS: mosquitto runs with the certificates, keys and ACL
//! of `lwbus pki init` (each host, the controller and the observer with a
//! certificate of its own, the hosts with the keyring, the controller
//! signing with its own Ed25519 key).
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

use std::time::Instant;

use loopwarden_hall::play::{play_with, PlayConfig, PlayOptions};
use loopwarden_twin::scenario::Scenario;

const SPEED: f64 = 10.0;
const TRIP_AT_S: u64 = 150;
const TRIP_UNTIL_S: u64 = 750;
const DURATION_S: u64 = 1400;
const CAP_RELEASE_MS: u64 = 20_000;
const TDP_W: f64 = 700.0;

fn scenario() -> String {
    format!(
        r#"
format = "plant-scenario/1"
description = "44 °C outdoors, full load, the trim chiller trips for 600 s"
duration_s = {DURATION_S}
seed = 11
[site]
racks = 2
hosts_per_rack = 2
[site.facility]
dry_cooler_ua_w_per_k = 2500.0
heat_capacity_j_per_k = 375000.0
[ambient]
points = [[0, 44.0], [{DURATION_S}, 44.0]]
[load]
all = [[0, 1.0], [{DURATION_S}, 1.0]]
[[fault]]
at_s = {TRIP_AT_S}
until_s = {TRIP_UNTIL_S}
kind = "chiller_trip"
"#
    )
}

use loopwarden_system_tests::PkiBroker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chiller_trip_caps_the_hosts_through_real_agents_and_the_caps_lift_after() {
    let Some(broker) = PkiBroker::start(
        "hall-1",
        ["r0h0,r0h1,r1h0,r1h1", "cdu1", "ops1", "hall-run"],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::from_toml(&scenario(), "chiller_trip.toml").unwrap();
    let began = Instant::now();
    let out = play_with(
        PlayConfig {
            speed: SPEED,
            broker: Some(format!("127.0.0.1:{}", broker.port()).parse().unwrap()),
            pki: Some(broker.dir().to_path_buf()),
            ..PlayConfig::headless(scenario, "chiller trip", dir.path())
        },
        PlayOptions {
            cap_release_ms: Some(CAP_RELEASE_MS),
            ..PlayOptions::default()
        },
    )
    .await
    .expect("the run completes");
    let wall = began.elapsed();
    let hosts: Vec<String> = ["r0h0", "r0h1", "r1h0", "r1h1"].map(String::from).to_vec();
    let c = &out.caps;
    let st = c
        .last
        .clone()
        .expect("the controller reported its counters");
    eprintln!(
        "wall {:.0} s; hottest GPU {:.1} °C; shutdowns {}; quarantined {:?}; racks lost {:?}",
        wall.as_secs_f64(),
        out.max_gpu_c,
        out.gpu_shutdowns,
        out.quarantined,
        out.racks_lost
    );
    eprintln!(
        "leases {} lifts {} acks {} (ok {}, refused {} {:?}); peak capped {} (telemetry {}); \
         acked capped {:?}; capped at end {:?}; acked capped at end {:?}; limits at end {:?}",
        st.leases_sent,
        st.lifts_sent,
        st.acks,
        st.acks_ok,
        st.acks_refused,
        st.last_refusal,
        c.peak_hosts_capped,
        out.peak_hosts_capped_telemetry,
        c.hosts_acked_capped,
        c.capped_at_end,
        c.acked_capped_at_end,
        out.limits_at_end
    );
    for e in &c.episodes {
        eprintln!("episode {e:?}");
    }
    for e in &out.events {
        eprintln!("event {e}");
        // The live view shows these lines: sentences, never debug text.
        assert!(
            !e.contains('{') && !e.contains('}') && !e.contains("Some("),
            "debug text in the live view's event {e:?}"
        );
    }

    // Everyone was there.
    assert_eq!(
        out.hosts_heard.iter().cloned().collect::<Vec<_>>(),
        hosts,
        "telemetry from every host"
    );
    // During the trip: leases sent, and real agents acknowledged a cap in
    // force below the TDP.
    assert!(st.leases_sent > 0, "no cap lease sent");
    let first = c.episodes.first().expect("a cap episode");
    assert!(
        first.start_t_s >= TRIP_AT_S as f64 && first.start_t_s <= TRIP_UNTIL_S as f64 + 60.0,
        "the first caps came at t = {:.0} s, not with the trip",
        first.start_t_s
    );
    assert!(
        !c.hosts_acked_capped.is_empty(),
        "no agent acknowledged a cap in force"
    );
    assert!(
        c.hosts_acked_capped.iter().all(|h| hosts.contains(h)),
        "{:?}",
        c.hosts_acked_capped
    );
    assert_eq!(st.acks_refused, 0, "{:?}", st.last_refusal);
    assert!(
        out.peak_hosts_capped_telemetry > 0,
        "no telemetry showed a cap"
    );
    // No GPU of the hall shut down.
    assert_eq!(out.gpu_shutdowns, 0, "hottest {:.1} °C", out.max_gpu_c);
    // After the chiller came back: every cap lifted, in the controller's
    // commands, in the agents' acks and in their telemetry.
    assert!(st.lifts_sent > 0, "no cap lifted");
    assert!(c.capped_at_end.is_empty(), "{:?}", c.capped_at_end);
    assert!(
        c.acked_capped_at_end.is_empty(),
        "{:?}",
        c.acked_capped_at_end
    );
    let last = c.episodes.last().expect("a cap episode");
    assert!(last.end_wall_s.is_some(), "the last episode did not end");
    assert_eq!(
        out.limits_at_end.len(),
        hosts.len(),
        "{:?}",
        out.limits_at_end
    );
    for (h, w) in &out.limits_at_end {
        assert!(*w >= TDP_W - 1.0, "{h} still limited to {w} W");
    }
}

//! Latency from a capacity shortfall to caps acknowledged by every host,
//! on loopback, with the whole system running.
//!
//! `cargo bench -p loopwarden-hall --bench cap_latency` plays the default
//! hall (4 racks of 4 hosts, 16 real node agents on their own threads, the
//! real controller on the simulated CDU over Modbus TCP) through a
//! mosquitto on a free loopback port (the embedded broker when mosquitto
//! is not installed, or with `CAP_LATENCY_BROKER=embedded`), at 44 °C
//! outdoors under full load, with `CAP_LATENCY_TRIPS` (default 4) short
//! chiller trips. Each trip is a shortfall episode: the controller caps
//! the hosts, the agents apply and acknowledge; after the trip the caps
//! lift (the controller's `cap_release_ms` is shortened to 10 s here so
//! that episodes follow each other quickly; nothing else changes).
//!
//! The times come from the controller's own counters (`ShellStats`,
//! replaced after every step and every ack), stamped when the run sees
//! them change:
//! - *episode*: from the step whose commands first hold a cap to the
//!   moment acks with a cap in force have come from all 16 hosts (what an
//!   operator sees; includes the steps the controller takes to cap the
//!   last host, as hosts reach their limit a step or two apart);
//! - *decision*: from that step to the step whose commands cap all 16;
//! - *per host*: from the step that first capped a host to its first ack
//!   with a cap in force (lease on the bus, agent, ack on the bus).
//!
//! It prints p50, p99 and max of each, and how many samples. The target
//! (docs/benchmarks.md) is judged per host: the episode holds one control
//! period whenever the 16 hosts' reports, sent within milliseconds of each
//! other, straddle the controller's step, which the phase decides.

use loopwarden_bus::BrokerAddr;
use loopwarden_hall::play::{play_with, PlayConfig, PlayOptions};
use loopwarden_twin::scenario::Scenario;

const SPEED: f64 = 10.0;
/// Simulated seconds before the first trip.
const WARM_S: u64 = 600;
/// A trip, simulated seconds.
const TRIP_S: u64 = 400;
/// From the end of a trip to the next, simulated seconds.
const GAP_S: u64 = 400;

fn scenario(trips: u64) -> String {
    let duration = WARM_S + trips * (TRIP_S + GAP_S);
    let mut s = format!(
        r#"
format = "plant-scenario/1"
description = "44 °C outdoors, full load, {trips} chiller trips of {TRIP_S} s"
duration_s = {duration}
seed = 5
[site.facility]
heat_capacity_j_per_k = 1000000.0
[ambient]
points = [[0, 44.0], [{duration}, 44.0]]
[load]
all = [[0, 1.0], [{duration}, 1.0]]
"#
    );
    for i in 0..trips {
        let at = WARM_S + i * (TRIP_S + GAP_S);
        s.push_str(&format!(
            "[[fault]]\nat_s = {at}\nuntil_s = {}\nkind = \"chiller_trip\"\n",
            at + TRIP_S
        ));
    }
    s
}

use loopwarden_system_tests::Mosquitto;

/// Nearest-rank percentile of sorted `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[i.clamp(1, v.len()) - 1]
}

fn line(what: &str, mut v: Vec<f64>) {
    if v.is_empty() {
        println!("{what:<10} no samples");
        return;
    }
    v.sort_by(f64::total_cmp);
    println!(
        "{what:<10} n = {:>3}   p50 {:>7.1} ms   p99 {:>7.1} ms   max {:>7.1} ms",
        v.len(),
        1000.0 * pct(&v, 50.0),
        1000.0 * pct(&v, 99.0),
        1000.0 * v[v.len() - 1]
    );
}

fn main() {
    let trips: u64 = std::env::var("CAP_LATENCY_TRIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(1);
    let embedded = std::env::var("CAP_LATENCY_BROKER").is_ok_and(|v| v == "embedded");
    let mosquitto = if embedded { None } else { Mosquitto::start() };
    let broker = mosquitto.as_ref().map(|m| BrokerAddr {
        host: "127.0.0.1".into(),
        port: m.port(),
    });
    let scenario = Scenario::from_toml(&scenario(trips), "cap_latency.toml").expect("scenario");
    let hosts = scenario.site.racks * scenario.site.hosts_per_rack;
    println!(
        "cap latency: {hosts} hosts, {trips} chiller trips, speed {SPEED}, broker {}; \
         about {:.0} s of wall time",
        if broker.is_some() {
            "mosquitto"
        } else {
            "embedded"
        },
        scenario.duration_s as f64 / SPEED
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let out = rt
        .block_on(play_with(
            PlayConfig {
                scenario,
                name: "cap latency".into(),
                out: dir.path().to_path_buf(),
                speed: SPEED,
                duration_s: None,
                headless: true,
                broker,
                pki: None,
                agent_config: None,
                clear_leaks: Vec::new(),
            },
            PlayOptions {
                cap_release_ms: Some(10_000),
                ..Default::default()
            },
        ))
        .expect("the run completes");
    let eps = &out.caps.episodes;
    let mut episode = Vec::new();
    let mut decision = Vec::new();
    let mut per_host = Vec::new();
    for (i, e) in eps.iter().enumerate() {
        println!(
            "episode {i}: t = {:.0} s, {} hosts capped, all capped after {}, all acked after {}",
            e.start_t_s,
            e.hosts_capped,
            e.all_capped_after_s
                .map_or("-".into(), |s| format!("{:.0} ms", 1000.0 * s)),
            e.all_acked_after_s
                .map_or("-".into(), |s| format!("{:.0} ms", 1000.0 * s)),
        );
        episode.extend(e.all_acked_after_s);
        decision.extend(e.all_capped_after_s);
        per_host.extend(e.host_ack_s.iter().map(|(_, s)| *s));
    }
    println!(
        "{} episodes, {} with all {hosts} hosts acked; GPU shutdowns {}; hottest {:.1} °C",
        eps.len(),
        episode.len(),
        out.gpu_shutdowns,
        out.max_gpu_c
    );
    line("episode", episode);
    line("decision", decision);
    line("per host", per_host);
}

//! Both agents' `/metrics`, scraped by a real Prometheus (2.42, Debian's
//! package) every second and asked in PromQL through its HTTP API, the
//! way a site's Grafana asks it.
//!
//! One rig: the embedded broker; a node agent for host h07 on 8 simulated
//! H200s; the cooling controller in charge of the simulated CDU (served
//! on Modbus TCP, h07 among its hosts), both in this process, each with
//! `metrics_listen` on a free loopback port. Prometheus scrapes both. The
//! DCGM series must be what a DCGM dashboard asks for (one per GPU, with
//! dcgm-exporter's labels and plausible values), the `loopwarden_*`
//! series what the agents know, and the two must join on `gpu` and
//! `Hostname`. One scrape of each agent goes through `promtool check
//! metrics`: it must parse, and the only naming-rule problems allowed
//! are those of dcgm-exporter's own names (upper case, `modelName`,
//! counters without `_total`), kept on purpose.
//!
//! Skipped when prometheus is not installed, except under CI (`CI=true`).
//!
//! Glossary:
//! - *rig*: the broker, both agents and their stop signals.

use std::net::SocketAddr;
use std::time::Duration;

use loopwarden_system_tests::prometheus::{http_get, promtool_check, Prometheus, Series};

mod agents_rig;
use agents_rig::{Rig, CDU, GPUS, HOST};

const SITE: &str = "hall-t";

/// The value of the one series of `answer`.
fn one(answer: &[Series], what: &str) -> f64 {
    assert_eq!(answer.len(), 1, "{what}: {answer:#?}");
    answer[0].value
}

/// The DCGM series a DCGM dashboard reads: one per GPU, dcgm-exporter's
/// labels, plausible values; and they join with `loopwarden_*`.
fn dcgm_series_per_gpu(p: &Prometheus) {
    let wait = Duration::from_secs(20);
    let temps = p.query_until(
        &format!("DCGM_FI_DEV_GPU_TEMP{{Hostname=\"{HOST}\"}}"),
        wait,
        |s| s.len() == GPUS,
    );
    let mut gpus: Vec<String> = temps.iter().map(|s| s.label("gpu").to_string()).collect();
    gpus.sort();
    assert_eq!(gpus, (0..GPUS).map(|i| i.to_string()).collect::<Vec<_>>());
    for s in &temps {
        assert!((20.0..=95.0).contains(&s.value), "{s:?}");
        assert!(s.label("UUID").starts_with("GPU-"), "{s:?}");
        assert_eq!(
            s.label("device"),
            format!("nvidia{}", s.label("gpu")),
            "{s:?}"
        );
        assert!(!s.label("modelName").is_empty(), "{s:?}");
        assert_eq!(s.label("job"), "node-agent", "{s:?}");
    }
    let power = p.query(&format!("DCGM_FI_DEV_POWER_USAGE{{Hostname=\"{HOST}\"}}"));
    assert_eq!(power.len(), GPUS, "{power:#?}");
    assert!(
        power.iter().all(|s| s.value > 50.0 && s.value <= 700.0),
        "{power:#?}"
    );
    let limits = p.query("DCGM_FI_DEV_POWER_MGMT_LIMIT");
    assert!(limits.iter().all(|s| s.value == 700.0), "{limits:#?}");
    let sm = p.query("avg(DCGM_FI_DEV_SM_CLOCK)");
    assert!(one(&sm, "SM clock") > 500.0, "{sm:#?}");
    // As a dashboard joins DCGM with this agent's own series.
    let joined = p.query(&format!(
        "DCGM_FI_DEV_GPU_TEMP * on(gpu, Hostname) group_left loopwarden_gpu_responsive{{Hostname=\"{HOST}\"}}"
    ));
    assert_eq!(joined.len(), GPUS, "{joined:#?}");
}

/// What the agent knows of itself and its GPUs.
fn loopwarden_agent_series(p: &Prometheus) {
    let wait = Duration::from_secs(20);
    let healthy = p.query_until(
        &format!("loopwarden_gpu_health_state{{Hostname=\"{HOST}\",state=\"healthy\"}} == 1"),
        wait,
        |s| s.len() == GPUS,
    );
    assert!(healthy.iter().all(|s| s.label("UUID").starts_with("GPU-")));
    let states = p.query(&format!(
        "sum(loopwarden_gpu_health_state{{Hostname=\"{HOST}\"}})"
    ));
    assert_eq!(one(&states, "one state per GPU"), GPUS as f64);
    assert_eq!(one(&p.query("loopwarden_leases_active"), "leases"), 0.0);
    assert_eq!(one(&p.query("loopwarden_xid_watch_up"), "XID watch"), 1.0);
    assert_eq!(
        one(
            &p.query("loopwarden_xid_queue_dropped_total"),
            "XIDs dropped"
        ),
        0.0
    );
    assert_eq!(
        one(
            &p.query("loopwarden_bus_connected{job=\"node-agent\"}"),
            "bus"
        ),
        1.0
    );
    // Samples keep coming (every 0.5 s) between scrapes.
    p.query_until(
        &format!("increase(loopwarden_samples_total{{Hostname=\"{HOST}\"}}[5s]) > 0"),
        wait,
        |s| s.len() == 1,
    );
    let jitter = p.query("loopwarden_sampling_jitter_seconds{stat=\"p99\"}");
    assert!(one(&jitter, "jitter") < 0.5, "{jitter:#?}");
}

/// What the controller knows of the loop, its racks and its hosts.
fn loopwarden_cdu_series(p: &Prometheus) {
    let wait = Duration::from_secs(20);
    let c = format!("cdu=\"{CDU}\"");
    let modes = p.query_until(&format!("loopwarden_cdu_mode{{{c}}} == 1"), wait, |s| {
        s.len() == 1
    });
    assert!(
        ["boot", "normal", "degraded"].contains(&modes[0].label("mode")),
        "{modes:#?}"
    );
    let supply = p.query(&format!("loopwarden_cdu_supply_temperature_celsius{{{c}}}"));
    assert!((one(&supply, "supply") - 40.0).abs() < 0.1, "{supply:#?}");
    let flow = p.query(&format!("loopwarden_cdu_flow_litres_per_minute{{{c}}}"));
    assert!((one(&flow, "flow") - 192.0).abs() < 0.5, "{flow:#?}");
    let pue = p.query(&format!("loopwarden_cdu_pue{{{c}}}"));
    assert!((one(&pue, "PUE") - 1.125).abs() < 0.001, "{pue:#?}");
    let setpoint = p.query(&format!("loopwarden_cdu_supply_setpoint_celsius{{{c}}}"));
    assert!(
        (15.0..=45.0).contains(&one(&setpoint, "setpoint")),
        "{setpoint:#?}"
    );
    let racks = p.query(&format!("loopwarden_cdu_rack_cooling_lost{{{c}}}"));
    assert_eq!(racks.len(), 4, "{racks:#?}");
    assert!(racks.iter().all(|s| s.value == 0.0), "{racks:#?}");
    assert_eq!(one(&p.query("loopwarden_cdu_modbus_up"), "Modbus"), 1.0);
    // The agent's telemetry reached the controller over the bus.
    p.query_until(
        &format!("loopwarden_cdu_host_last_report_timestamp_seconds{{{c},host=\"{HOST}\"}}"),
        wait,
        |s| s.len() == 1,
    );
    // What it learned: a ratio, a confidence and a trust per facility
    // figure, each host's thermal factor, and the CDU's outdoor sensor
    // read (not the fallback).
    for family in ["ratio", "confidence", "trust"] {
        let figures = p.query(&format!("loopwarden_estimate_{family}{{{c}}}"));
        let mut names: Vec<&str> = figures.iter().map(|s| s.label("figure")).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["chiller_cop", "dry_cooler_ua", "pump_power"],
            "{figures:#?}"
        );
    }
    let factor = p.query(&format!(
        "loopwarden_host_thermal_factor{{{c},host=\"{HOST}\"}}"
    ));
    assert!(
        (0.3..=4.0).contains(&one(&factor, "thermal factor")),
        "{factor:#?}"
    );
    let fallback = p.query(&format!("loopwarden_outdoor_fallback{{{c}}}"));
    assert_eq!(one(&fallback, "outdoor fallback"), 0.0, "{fallback:#?}");
}

/// One scrape of `addr`: it parses for promtool, and every naming-rule
/// problem is on a DCGM family.
fn promtool_accepts(addr: SocketAddr) {
    let (code, text) = http_get(addr, "/metrics").expect("a scrape");
    assert_eq!(code, 200, "{text}");
    let Some(checked) = promtool_check(&text) else {
        return;
    };
    let problems = checked.unwrap_or_else(|e| panic!("{e}\n{text}"));
    let ours: Vec<&String> = problems
        .iter()
        .filter(|p| !p.starts_with("DCGM_FI_DEV_"))
        .collect();
    assert!(ours.is_empty(), "promtool on {addr}: {ours:#?}");
}

#[test]
fn prometheus_scrapes_both_agents_and_answers_promql() {
    let rig = Rig::start(SITE);
    let targets = [
        ("node-agent", rig.agent_metrics),
        ("cooling-ctrl", rig.cdu_metrics),
    ];
    let Some(p) = Prometheus::start(&targets) else {
        return;
    };
    p.wait_targets_up(targets.len(), Duration::from_secs(30));
    dcgm_series_per_gpu(&p);
    loopwarden_agent_series(&p);
    loopwarden_cdu_series(&p);
    promtool_accepts(rig.agent_metrics);
    promtool_accepts(rig.cdu_metrics);
    let (code, _) = http_get(rig.agent_metrics, "/").expect("an answer");
    assert_eq!(code, 404);
}

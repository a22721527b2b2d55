//! The agent's power limits and its NVML call counts end to end on its
//! production NVML path (`SystemNvml` over `nvml-wrapper`, against the
//! fake `libnvidia-ml.so.1` of `tests/fake_nvml/lib.rs`, run by
//! `system/fake_library.rs`): a cap NVML takes only within constraints
//! read after its refusal is the agent's own over a stop and a restart,
//! and every call of the start and of the XID watch is counted on
//! `/metrics`.
//!
//! Skipped when `rustc` or mosquitto is missing, except under CI
//! (`CI=true`), where a missing tool fails.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

#[path = "system/fake_library.rs"]
#[allow(dead_code)]
mod fake_library;

use std::time::{Duration, Instant};

use fake_library::*;
use loopwarden_protocol::AckCode;
use rig::Rig;

/// GPU 0's limit constraints cannot be read at the start (the board's
/// 200 W minimum stands in), and NVML takes no less than 250 W: a 200 W
/// cap is refused, the constraints are read then, and 250 W is set. A
/// SIGTERM with the lease in force, well before the cap's retry, leaves
/// it on; the restart finds 250 W a limit the agent left, not an
/// administrator's.
#[test]
fn a_cap_set_within_constraints_read_late_is_the_agents_over_a_sigterm_and_a_restart() {
    let Some(lib) = fake_library() else {
        return;
    };
    let Some(rig) = Rig::start("h66") else {
        return;
    };
    let constraints = "nvmlDeviceGetPowerManagementLimitConstraints";
    let settings = format!("{HOST_GPUS}0 min_mw 250000\n0 fail {constraints} 999\n");
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &settings);
    let flash = format!("flash = \"{}\"\n", rig.flash().display());
    let config = host_config(&rig, &flash);
    let mut acks = rig.subscribe(&["ack"]);
    let mut agent = RealAgent::start(&rig, &fake, &config);
    // Described with the constraints unread; they answer from now on.
    fake.control(&format!("0 fail {constraints} 0"));
    let began = Instant::now();
    let _ = rig.ack(&mut acks, &lease(1, 1, &[(gpu(0), 200)], 600_000));
    let sets = fake.sets_until(Duration::from_secs(10), |s| s.contains(&(0, 250_000)));
    assert!(sets.contains(&(0, 250_000)), "{sets:?}");
    assert_eq!(fake.limits(), [250_000, 500_000]);

    agent.terminate();
    assert!(
        began.elapsed() < Duration::from_secs(25),
        "stopped after the cap's retry: the test proves nothing"
    );
    let again = RealAgent::start(&rig, &fake, &config);
    std::thread::sleep(Duration::from_secs(2));
    let log = again.log_text();
    assert!(!log.contains("set outside the agent"), "{log}");
    assert_eq!(fake.limits(), [250_000, 500_000], "the cap stays");
}

/// GPU 0's limit constraints cannot be read at the start (the board's
/// 200 W minimum stands in); NVML takes no less than 250 W. A 200 W
/// cap is refused, the constraints are read then and 250 W is set: the
/// node learns the GPU's range, the lease is acked clamped to 250 W,
/// and neither its renewal nor the retry sets it again.
#[test]
fn a_minimum_read_after_a_refusal_clamps_the_lease_and_no_write_is_retried() {
    let Some(lib) = fake_library() else {
        return;
    };
    let Some(rig) = Rig::start("h68") else {
        return;
    };
    let constraints = "nvmlDeviceGetPowerManagementLimitConstraints";
    let settings = format!("{HOST_GPUS}0 min_mw 250000\n0 fail {constraints} 999\n");
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &settings);
    let config = host_config(&rig, "");
    let mut acks = rig.subscribe(&["ack"]);
    let _agent = RealAgent::start(&rig, &fake, &config);
    fake.control(&format!("0 fail {constraints} 0"));
    let ack = rig.ack(&mut acks, &lease(1, 1, &[(gpu(0), 200)], 600_000));
    let detail = ack.detail.as_str().to_string();
    assert_eq!(ack.code, AckCode::Clamped, "{detail}");
    assert!(
        detail.contains("GPU 0: 200 W is below its minimum 250 W"),
        "{detail}"
    );
    assert_eq!(fake.limits(), [250_000, 500_000]);
    let sets = fake.sets();
    // A renewal retries at once every target not in force.
    let ack = rig.ack(&mut acks, &lease(2, 1, &[(gpu(0), 200)], 600_000));
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fake.sets(), sets, "written again");
}

/// The description's calls and the XID watch's registrations are counted
/// on `/metrics` with the samples' calls (a busy GPU System Processor
/// slows them first).
#[test]
fn the_starts_and_the_xid_watchs_calls_are_on_metrics() {
    let Some((rig, fake)) = two_gpu_host("h67") else {
        return;
    };
    let metrics: std::net::SocketAddr =
        ([127, 0, 0, 1], loopwarden_system_tests::free_port()).into();
    let config = host_config(&rig, &format!("metrics_listen = \"{metrics}\"\n"));
    let _agent = RealAgent::start(&rig, &fake, &config);
    let calls = [
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlEventSetCreate",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlDeviceRegisterEvents",
    ];
    let counted = |body: &str, call: &str| {
        body.lines().any(|l| {
            l.starts_with("loopwarden_nvml_calls_total{") && l.contains(&format!("call=\"{call}\""))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (code, body) = loopwarden_system_tests::prometheus::http_get(metrics, "/metrics")
            .expect("GET /metrics");
        assert_eq!(code, 200, "{body}");
        if calls.iter().all(|c| counted(&body, c)) || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for call in calls {
        assert!(counted(&body, call), "{call} not counted:\n{body}");
    }
}

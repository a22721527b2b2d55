//! The agent's XID watch end to end on its production NVML path
//! (`SystemNvml` over `nvml-wrapper`, against the fake
//! `libnvidia-ml.so.1` of `tests/fake_nvml/lib.rs`, run by
//! `system/fake_library.rs`): an XID through the event set, a restart of
//! the XID watch that cannot register every GPU (reported down, naming
//! the GPU, never taken for running).
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

use loopwarden_protocol::{HealthState, Message};

use fake_library::*;
use rig::{frame, Rig};

#[test]
fn an_xid_79_from_the_event_set_quarantines_its_gpu() {
    let Some((rig, fake)) = two_gpu_host("h63") else {
        return;
    };
    let config = host_config(&rig, "");
    let mut health = rig.subscribe(&["health"]);
    let agent = RealAgent::start(&rig, &fake, &config);
    // Both GPUs are on the event set before the driver reports the XID.
    registered_for_xids(&fake, &agent, 2);
    fake.control("xid 1 79");

    health_until(&mut health, &agent, "GPU 1 not quarantined", |h| {
        h.gpus
            .get(1)
            .is_some_and(|g| g.state == HealthState::Quarantined)
    });
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert_eq!(h.gpus[1].state, HealthState::Quarantined);
    assert!(h.gpus[1].evidence.as_str().contains("XID 79"), "{h:?}");
    assert_eq!(h.gpus[0].state, HealthState::Healthy);
    // The event named its GPU by handle; the agent asked NVML its index.
    assert!(count(&fake.calls(), "nvmlDeviceGetIndex", 1) >= 1);
}

/// Waits until every one of `gpus` GPUs was registered for XID events.
/// Waits up to 10 s for a health frame that `done` accepts; fails with
/// `what` and the agent's log when none comes.
fn health_until(
    health: &mut loopwarden_system_tests::Subscriber,
    agent: &RealAgent,
    what: &str,
    done: impl Fn(&loopwarden_protocol::HostHealth) -> bool,
) {
    let ok = |f: &loopwarden_protocol::Frame| match &f.message {
        Message::HostHealth(h) => done(h),
        _ => false,
    };
    let seen = health.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(|f| ok(&f))
    });
    assert!(
        seen.last().and_then(frame).is_some_and(|f| ok(&f)),
        "{what}:\n{}",
        agent.log_text()
    );
}

fn registered_for_xids(fake: &FakeNvml, agent: &RealAgent, gpus: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..gpus).any(|g| count(&fake.calls(), "nvmlDeviceRegisterEvents", g) == 0) {
        assert!(
            Instant::now() < deadline,
            "no registration:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to `within` until the agent's log has a line holding every one
/// of `parts`; that line.
fn log_line(agent: &RealAgent, within: Duration, parts: &[&str]) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = agent.log_text();
        if let Some(l) = text.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no line with {parts:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ctl status`'s `xids.watch_down_since`, once it is `down` (a number)
/// or not (null), within 10 s.
fn watch_down_since(rig: &Rig, agent: &RealAgent, down: bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = rig.console().ctl(&["status"]).expect("ctl status");
        let since = status["xids"]["watch_down_since"].clone();
        if since.is_u64() == down {
            return since;
        }
        assert!(
            Instant::now() < deadline,
            "watch_down_since {since}, not {}:\n{}",
            if down { "a time" } else { "null" },
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restart_that_registers_no_gpu_keeps_the_xid_watch_down_and_retries() {
    let Some((rig, fake)) = two_gpu_host("h65") else {
        return;
    };
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    registered_for_xids(&fake, &agent, 2);

    // A driver hiccup: the event wait fails, and no GPU's event types can
    // be read when the watch restarts.
    fake.control("* fail nvmlDeviceGetSupportedEventTypes 999");
    fake.control("wait_fails 999");
    // The watch is not taken for running over an empty set: it is retried
    // (a third event set), and stays down meanwhile.
    let sets = |calls: &[Call]| {
        calls
            .iter()
            .filter(|c| c.name == "nvmlEventSetCreate")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while sets(&fake.calls()) < 3 {
        assert!(
            Instant::now() < deadline,
            "the watch was not retried:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let line = log_line(
        &agent,
        Duration::from_secs(10),
        &[
            "the XID watch is down (no GPU could be registered",
            "GPU 0 (",
            "GPU 1 (",
        ],
    );
    assert!(
        line.contains("an internal driver error"),
        "NVML's answer: {line}"
    );
    watch_down_since(&rig, &agent, true);
    assert!(
        !agent.log_text().contains("the XID watch runs again"),
        "{}",
        agent.log_text()
    );
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert!(h.monitoring.xid_watch_down_since.is_some(), "{h:?}");

    // The driver answers again: a later retry registers both GPUs.
    fake.control("* fail nvmlDeviceGetSupportedEventTypes 0");
    log_line(
        &agent,
        Duration::from_secs(40),
        &["the XID watch runs again"],
    );
    watch_down_since(&rig, &agent, false);
}

#[test]
fn a_start_that_registers_no_gpu_reports_the_xid_watch_down_and_retries() {
    let Some(lib) = fake_library() else {
        return;
    };
    let Some(rig) = Rig::start("h67") else {
        return;
    };
    let refusing = format!("{HOST_GPUS}* fail nvmlDeviceGetSupportedEventTypes 999\n");
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &refusing);
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    // Each GPU's refusal is said at the start, and the watch is down,
    // naming both, instead of waiting on an empty event set.
    for g in 0..2 {
        log_line(
            &agent,
            Duration::from_secs(10),
            &[&format!("GPU {g}: XID events cannot be registered")],
        );
    }
    log_line(
        &agent,
        Duration::from_secs(10),
        &["the XID watch is down (", "GPU 0 (", "GPU 1 ("],
    );
    watch_down_since(&rig, &agent, true);
    // It is retried: a second event set.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fake
        .calls()
        .iter()
        .filter(|c| c.name == "nvmlEventSetCreate")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the watch was not retried:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_restart_that_leaves_a_gpu_out_keeps_the_xid_watch_down_naming_it() {
    let Some((rig, fake)) = two_gpu_host("h66") else {
        return;
    };
    let config = host_config(&rig, "");
    let mut health = rig.subscribe(&["health"]);
    let agent = RealAgent::start(&rig, &fake, &config);
    registered_for_xids(&fake, &agent, 2);

    // The event wait fails; at the restart, GPU 1's event types cannot be
    // read, GPU 0 registers.
    fake.control("1 fail nvmlDeviceGetSupportedEventTypes 999");
    fake.control("wait_fails 999");
    let line = log_line(
        &agent,
        Duration::from_secs(20),
        &["the XID watch is down (", "GPU 1 ("],
    );
    assert!(line.contains("not registered for XID events"), "{line}");
    assert!(
        line.contains("an internal driver error"),
        "NVML's answer: {line}"
    );
    assert!(!line.contains("GPU 0"), "{line}");
    watch_down_since(&rig, &agent, true);
    assert!(
        !agent.log_text().contains("the XID watch runs again"),
        "{}",
        agent.log_text()
    );

    // The watch still runs for GPU 0: its XID 79 quarantines it.
    fake.control("xid 0 79");
    health_until(&mut health, &agent, "GPU 0 not quarantined", |h| {
        h.gpus
            .first()
            .is_some_and(|g| g.state == HealthState::Quarantined)
    });
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert!(h.monitoring.xid_watch_down_since.is_some(), "{h:?}");
}

/// GPU 0 and GPU 1 each queue an XID 79 on the event set, then the wait
/// answers NVML_ERROR_GPU_IS_LOST for the whole set (one GPU fell off
/// the bus): the XIDs queued on it are read out all the same, and both
/// GPUs are quarantined.
#[test]
fn xids_queued_on_a_set_whose_wait_fails_are_still_delivered() {
    let Some((rig, fake)) = two_gpu_host("h68") else {
        return;
    };
    let config = host_config(&rig, "");
    let mut health = rig.subscribe(&["health"]);
    let agent = RealAgent::start(&rig, &fake, &config);
    registered_for_xids(&fake, &agent, 2);
    // Applied at one call: both queued, then the wait fails (15 is
    // NVML_ERROR_GPU_IS_LOST).
    fake.control_at_once(&["xid 0 79", "xid 1 79", "wait_fails 15"]);

    health_until(&mut health, &agent, "not both quarantined", |h| {
        h.gpus.len() == 2 && h.gpus.iter().all(|g| g.state == HealthState::Quarantined)
    });
}

//! The whole agent against a real mosquitto: `node-agent run --twin-gpus 8`
//! as a process, commands sent with `mosquitto_pub`, everything it says
//! read with `mosquitto_sub`, its console asked with `node-agent ctl`.
//!
//! Some tests run the agent in this process instead, over twin GPUs they
//! inject faults into or GPUs of their own, on a clock they step.
//!
//! Each test starts its broker, directory and agents with the fixture in
//! `system/rig.rs` ([`rig::Rig`]), which stops them when dropped.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.
//!
//! Faults of the GPUs (XIDs, a hung GPU, a limit refused) are tested in
//! `system_faults.rs`.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::time::{Duration, Instant};

use loopwarden_protocol::{
    AckCode, Event, Frame, GpuIndex, GpuSelector, HealthState, Message, NodeId, Role, TimestampMs,
    Watts,
};
use loopwarden_system_tests::{Seen, Subscriber};
use node_agent::config::Overrides;

use rig::{frame, lease, limits, now, Console, Rig, SITE};

fn gpu(i: u8) -> GpuSelector {
    GpuSelector::Gpu(GpuIndex::new(i).expect("index"))
}

/// The limits the console reports.
fn console_limits(agent: &Console) -> Vec<u64> {
    let caps = agent.ctl(&["caps"]).expect("ctl caps");
    caps["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["limit"].as_u64().expect("limit"))
        .collect()
}

/// Waits until telemetry shows every GPU at `limit` (what the twin GPUs
/// enforce, read through the agent's own sampling).
fn telemetry_limits_become(sub: &mut Subscriber, want: &[u32]) {
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(|f| match f.message {
            Message::HostTelemetry(t) => {
                t.gpus.iter().map(|g| g.power_limit.0).collect::<Vec<_>>() == want
            }
            _ => false,
        })
    });
    assert!(
        seen.last()
            .and_then(frame)
            .is_some_and(|f| matches!(f.message, Message::HostTelemetry(_))),
        "telemetry never showed limits {want:?}"
    );
}

#[test]
fn leases_are_applied_acknowledged_refused_and_lifted() {
    let Some(rig) = Rig::start("h1") else {
        return;
    };
    let mut sub = rig.subscribe(&["+"]);
    let mut agent = rig.spawn();

    // Telemetry of all 8 GPUs, and retained health.
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(
            |f| matches!(f.message, Message::HostTelemetry(ref t) if t.gpus.len() == 8),
        )
    });
    assert!(!seen.is_empty(), "no telemetry");
    let health = rig.retained_health().expect("retained health");
    match health.message {
        Message::HostHealth(h) => {
            assert_eq!(h.gpus.len(), 8);
            assert!(h.gpus.iter().all(|g| g.state == HealthState::Healthy));
        }
        other => panic!("health topic carries {other:?}"),
    }

    // A lease on every GPU: applied, read back, acknowledged.
    let first = lease(100, 1, &[(GpuSelector::All, 450)], 4_000);
    let ack = rig.ack(&mut sub, &first);
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    assert_eq!(limits(&ack), vec![450; 8]);
    telemetry_limits_become(&mut sub, &[450; 8]);
    assert_eq!(console_limits(&agent), vec![450; 8]);

    // Refused, each with its reason, and nothing changes.
    let ack = rig.ack(&mut sub, &lease(101, 2, &[(gpu(12), 300)], 4_000));
    assert_eq!(ack.code, AckCode::UnknownGpu);
    assert!(
        ack.detail.as_str().contains("no GPU 12"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(limits(&ack), vec![450; 8]);

    assert_eq!(
        rig.ack(&mut sub, &lease(102, 3, &[], 4_000)).code,
        AckCode::Malformed
    );

    // Stamped 2 minutes behind, before this agent started (its state in
    // memory: no floor of cdu-a kept): a replay, though above the floor of
    // what it took since.
    let mut behind = lease(103, 4, &[(gpu(0), 300)], 60_000);
    behind.time = TimestampMs(now().0 - 120_000);
    assert_eq!(rig.ack(&mut sub, &behind).code, AckCode::Replayed);

    let mut forged = lease(104, 7, &[(gpu(0), 300)], 4_000);
    forged
        .sign(
            &rig.cmd_topic(),
            1,
            &loopwarden_protocol::auth::SigningKey::from_bytes(&[9; 32]),
        )
        .expect("signs");
    assert_eq!(rig.ack(&mut sub, &forged).code, AckCode::Unauthenticated);

    // A replay of the first lease (the frame itself: one numbered as low
    // but stamped after the latest taken is its sender's, taken).
    assert_eq!(rig.ack(&mut sub, &first).code, AckCode::Replayed);

    // Bytes that are no frame at all: no ack is possible (no sender, no
    // seq to answer), the agent counts and drops them.
    rig.publish(&rig.topic("cmd"), b"not a frame", false);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        console_limits(&agent),
        vec![450; 8],
        "refused commands changed a limit"
    );

    // Below the minimum on one GPU: taken, clamped, said.
    let ack = rig.ack(&mut sub, &lease(105, 6, &[(gpu(6), 150)], 2_000));
    assert_eq!(ack.code, AckCode::Clamped);
    assert_eq!(ack.in_force[6].limit, Watts(200));

    // Expiry lifts the caps: 6 at 2 s, the rest at 4 s.
    let events = sub.collect_until(Duration::from_secs(10), |s| lifted(s) >= 8);
    assert_eq!(lifted(&events), 8, "every GPU's cap lifts at expiry");
    let lifts = lift_masks(&events);
    // GPU 6's lease and the others' end apart: one event for each set of
    // GPUs lifted together, never one per GPU.
    assert_eq!(lifts.iter().fold(0, |a, m| a | m), 0xFF, "{lifts:x?}");
    assert!(lifts.len() <= 2 && lifted(&events) == 8, "{lifts:x?}");
    telemetry_limits_become(&mut sub, &[700; 8]);
    let caps = agent.ctl(&["caps"]).expect("ctl caps");
    assert_eq!(caps["leases"].as_array().map(Vec::len), Some(0));

    // The console's other answers.
    let status = agent.ctl(&["status"]).expect("ctl status");
    assert_eq!(status["gpus"], 8);
    assert_eq!(status["connected"], true);
    assert!(status["samples"].as_u64().unwrap_or(0) > 5);
    let gpus = agent.ctl(&["gpus"]).expect("ctl gpus");
    assert_eq!(gpus["gpus"].as_array().map(Vec::len), Some(8));
    let events = agent.ctl(&["events"]).expect("ctl events");
    // The two leases taken and the four changes they made: all eight at
    // 450 W, GPU 6 clamped to 200 W and back to 450 W, all eight lifted.
    let logged = events["events"].as_array().cloned().unwrap_or_default();
    assert!(logged.len() >= 6, "{events}");
    assert!(
        logged
            .iter()
            .any(|e| e["event"]["caps_applied"]["gpus"] == 255
                && e["event"]["caps_applied"]["limit"] == 700),
        "{events}"
    );
    let text = agent.ctl_text(&["events"]);
    assert!(text.contains("GPUs 0-7 uncapped (limit 700 W)"), "{text}");
    assert!(text.contains("all GPUs to 450 W for 4 s (from "), "{text}");
    for args in [&["status"][..], &["gpus"], &["caps"], &["why", "3"]] {
        agent.ctl_text(args);
    }
    assert!(agent.ctl(&["why", "3"]).is_some());
    assert!(
        agent.ctl(&["why", "12"]).is_none(),
        "no GPU 12: an error, exit status 1"
    );

    // Longer than the host takes (10 minutes by default): the 49 days a
    // u32 of milliseconds allows. Taken for the host's longest, and said.
    let lease_then_stop = lease(106, 7, &[(gpu(2), 333)], u32::MAX);
    let ack = rig.ack(&mut sub, &lease_then_stop);
    assert_eq!(ack.code, AckCode::Clamped, "{}", ack.detail.as_str());
    assert!(
        ack.detail
            .as_str()
            .contains("shortened from 4294967295 to 600000 ms"),
        "{}",
        ack.detail.as_str()
    );

    // A clean stop: exit 0, and the bus learns the agent left.
    let status = agent.terminate();
    assert!(status.success(), "exit status {status}");
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.last()
            .and_then(frame)
            .is_some_and(|f| matches!(f.message, Message::Online(ref o) if !o.online))
    });
    assert!(
        !seen.iter().filter_map(frame).any(|f| matches!(
            f.message,
            Message::Event(Event::CapsApplied {
                limit: Watts(700),
                ..
            })
        )),
        "a lease in force at the stop keeps its cap on GPU 2 for the next start"
    );
}

/// The GPU masks of the `caps_applied` events among `seen` that put GPUs
/// back to the default, 700 W, uncapped.
fn lift_masks(seen: &[Seen]) -> Vec<u16> {
    seen.iter()
        .filter_map(frame)
        .filter_map(|f| match f.message {
            Message::Event(Event::CapsApplied {
                gpus,
                limit: Watts(700),
                source: None,
            }) => Some(gpus),
            _ => None,
        })
        .collect()
}

/// GPUs put back to the default among `seen`.
fn lifted(seen: &[Seen]) -> u32 {
    lift_masks(seen).iter().map(|m| m.count_ones()).sum()
}

#[test]
fn after_a_crash_only_valid_leases_are_applied_again() {
    let Some(rig) = Rig::start("h2") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    let mut agent = rig.spawn_on_flash();
    assert_eq!(
        rig.ack(&mut sub, &lease(10, 1, &[(gpu(0), 400)], 60_000))
            .code,
        AckCode::Ok
    );
    let second = lease(11, 2, &[(gpu(1), 300)], 1_500);
    assert_eq!(rig.ack(&mut sub, &second).code, AckCode::Ok);
    agent.crash();
    // Lease 2 expires while the agent is down.
    std::thread::sleep(Duration::from_millis(2_000));
    let agent = rig.spawn_on_flash();
    let l = console_limits(&agent);
    assert_eq!(l[0], 400, "the valid lease is in force again");
    assert_eq!(l[1], 700, "the expired one is not");
    let caps = agent.ctl(&["caps"]).expect("ctl caps");
    assert_eq!(caps["gpus"][0]["source"], "cooling");
    assert_eq!(caps["leases"].as_array().map(Vec::len), Some(1));
    // Its replay counter survived too.
    // A seq below it never sent, stamped before it: at or below the floor
    // kept, and refused as such (without it, only the start floor would
    // refuse it, saying so).
    let mut older = lease(9, 2, &[(gpu(1), 300)], 60_000);
    older.time = TimestampMs(second.time.0 - 1_000);
    let again = rig.ack(&mut sub, &older);
    assert_eq!(again.code, AckCode::Replayed, "{}", again.detail.as_str());
    assert!(
        again
            .detail
            .as_str()
            .contains("is not above seq 11 or stamp"),
        "refused by the floor kept: {}",
        again.detail.as_str()
    );
}

#[test]
fn a_wall_clock_step_changes_no_verdict_and_moves_the_stamps() {
    // PCIe replays far above the limit on GPU 1 from the start: the rule
    // needs them sustained for two minutes, so in these 12 s no verdict
    // may come, whatever the wall clock does. A window measured on the
    // wall clock would complete at the step of two hours forward.
    let Some(rig) = Rig::start("h8") else {
        return;
    };
    let mut sub = rig.subscribe(&["event", "telemetry"]);
    let clock = node_agent::clock::Stepped::new();
    let agent = rig.agent(4).clock(clock.clone()).start();
    let control = agent.control();
    let replays = |secs: u64| {
        let end = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < end {
            control
                .inject(node_agent::sim_gpus::TwinFault::PcieReplay { gpu: 1, count: 50 })
                .expect("inject");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // A cap lease of a minute on GPU 0, taken before the steps: it must
    // hold through both (a lease lapses on steady time).
    let mut acks = rig.subscribe(&["ack"]);
    let capped = lease(1, 1, &[(gpu(0), 400)], 60_000);
    assert_eq!(rig.ack(&mut acks, &capped).code, AckCode::Ok);
    replays(4);
    clock.step(2 * 3_600_000);
    replays(4);
    clock.step(-4 * 3_600_000);
    replays(4);
    let seen = sub.collect_until(Duration::from_secs(1), |_| false);
    agent.stop();
    let frames: Vec<Frame> = seen.iter().filter_map(frame).collect();
    let changes: Vec<_> = frames
        .iter()
        .filter_map(|f| match &f.message {
            Message::Event(e @ Event::HealthChanged { .. }) => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert!(
        changes.is_empty(),
        "a clock step changed a verdict: {changes:?}"
    );
    // Stamps are on the wall clock: some telemetry two hours ahead, some
    // two hours behind.
    let real = now().0 as i64;
    let offsets: Vec<i64> = frames
        .iter()
        .filter(|f| matches!(f.message, Message::HostTelemetry(_)))
        .map(|f| (f.time.0 as i64 - real) / 3_600_000)
        .collect();
    assert!(offsets.contains(&0), "stamps before the step: {offsets:?}");
    assert!(
        offsets.contains(&1) || offsets.contains(&2),
        "after +2 h: {offsets:?}"
    );
    assert!(
        offsets.contains(&-1) || offsets.contains(&-2),
        "after -2 h: {offsets:?}"
    );
    let limits: Vec<u32> = frames
        .iter()
        .filter_map(|f| match &f.message {
            Message::HostTelemetry(t) => Some(t.gpus[0].power_limit.0),
            _ => None,
        })
        .collect();
    assert_eq!(
        limits.last(),
        Some(&400),
        "the lease held through both steps: {limits:?}"
    );
    assert!(
        limits.iter().skip_while(|l| **l != 400).all(|l| *l == 400),
        "once in force, never lifted: {limits:?}"
    );
}

/// The CDU's state with rack 2 lost or every rack normal, as `cdu-a`
/// publishes it (retained) on its health topic.
fn publish_cdu_state(rig: &Rig, rack2_lost: bool) {
    let state = rig::cdu_state(rack2_lost);
    let mut f = Frame {
        sender: NodeId::new(Role::Cdu, "cdu-a").expect("ident"),
        seq: if rack2_lost { 1 } else { 2 },
        time: now(),
        message: Message::CduState(state),
    };
    // Signed as the twin's controllers sign, with the demonstration key
    // the agent's demo keyring holds.
    let topic = loopwarden_protocol::Topic::new(
        &loopwarden_protocol::Ident::new(SITE).expect("ident"),
        Role::Cdu,
        &loopwarden_protocol::Ident::new("cdu-a").expect("ident"),
        loopwarden_protocol::Family::Health,
    );
    f.sign(&topic, 1, &loopwarden_protocol::samples::demo_signing_key())
        .expect("signs");
    let mut buf = [0u8; 2048];
    let n = f.encode(&mut buf).expect("encodes");
    rig.publish(&format!("dc/v2/{SITE}/cdu/cdu-a/health"), &buf[..n], true);
}

#[test]
fn a_rack_without_cooling_drains_powers_down_after_the_grace_and_undoes_it() {
    let Some(rig) = Rig::start("h6") else {
        return;
    };
    let mut sub = rig.subscribe(&["event"]);
    // Each command appends its step to the log: the order is the proof.
    let (flags, log) = rig.noted_cooling_steps(2, 2);
    let agent = rig.agent(2).flags(flags).flash().start();
    std::thread::sleep(Duration::from_millis(800));
    let lost_at = Instant::now();
    publish_cdu_state(&rig, true);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |want: &str, secs: u64| {
        let end = Instant::now() + Duration::from_secs(secs);
        while !read().contains(want) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(read().contains(want), "{want:?} not run: log {:?}", read());
    };
    wait_for("drain h6 2", 5);
    assert!(
        !read().contains("power_down"),
        "powered down before the grace"
    );
    wait_for("power_down h6 2", 6);
    let grace = lost_at.elapsed();
    assert!(
        grace >= Duration::from_secs(2),
        "powered down after {grace:?}"
    );
    publish_cdu_state(&rig, false);
    wait_for("resume h6 2", 5);
    assert_eq!(
        read().lines().collect::<Vec<_>>(),
        [
            "drain h6 2",
            "power_down h6 2",
            "power_up h6 2",
            "resume h6 2"
        ],
        "each step once, in order"
    );
    let seen = sub.collect_until(Duration::from_secs(5), |s| {
        s.iter()
            .filter_map(frame)
            .filter(|f| matches!(f.message, Message::Event(Event::CoolingAction { .. })))
            .count()
            >= 4
    });
    let steps: Vec<_> = seen
        .iter()
        .filter_map(frame)
        .filter_map(|f| match f.message {
            Message::Event(Event::CoolingAction { step, ok, .. }) => Some((step, ok)),
            _ => None,
        })
        .collect();
    use loopwarden_protocol::CoolingStep::*;
    assert_eq!(
        steps,
        [
            (Drain, true),
            (PowerDown, true),
            (PowerUp, true),
            (Resume, true)
        ]
    );
    agent.stop();
}

/// The highest limit any of `gpus` twin GPUs had, polled every 2 ms from
/// a thread of its own until [`LimitWatch::highest`].
struct LimitWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u32>,
}

impl LimitWatch {
    fn start(control: &node_agent::sim_gpus::TwinControl, gpus: usize) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (control, flag) = (control.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut highest = 0;
            while !flag.load(Ordering::SeqCst) {
                let now = control.with_host(|h| (0..gpus).map(|i| h.limit(i).0).max());
                highest = highest.max(now.unwrap_or(0));
                std::thread::sleep(Duration::from_millis(2));
            }
            highest
        });
        Self { stop, thread }
    }

    fn highest(self) -> u32 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the watch ran")
    }
}

#[test]
fn an_administrators_500_w_is_never_raised_and_is_back_after_a_clean_stop() {
    let Some(rig) = Rig::start("h10") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack", "telemetry"]);
    // `nvidia-smi -pl 500` on GPUs whose default is 700 W.
    let agent = rig
        .agent(2)
        .flags(Overrides {
            twin_admin_limit_w: Some(500),
            ..Default::default()
        })
        .start();
    agent.ctl_within(&["caps"], Duration::from_secs(20), "no console");
    let control = agent.control().clone();
    let watch = LimitWatch::start(&control, 2);
    let caps = agent.ctl(&["caps"]).expect("ctl caps");
    assert_eq!(caps["gpus"][0]["ceiling"], 500);
    let above = rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 600)], 2_000));
    assert_eq!(
        limits(&above),
        [500, 500],
        "a cap above the site's limit raises nothing"
    );
    let below = rig.ack(&mut sub, &lease(2, 2, &[(GpuSelector::All, 300)], 2_000));
    assert_eq!(limits(&below), [300, 300]);
    // Both lapse: back to the administrator's limit, not the default.
    telemetry_limits_become(&mut sub, &[500, 500]);
    agent.stop();
    assert_eq!(watch.highest(), 500, "never above 500 W");
    control.with_host(|h| {
        assert_eq!(
            [h.limit(0), h.limit(1)],
            [Watts(500); 2],
            "500 W after the stop"
        );
    });
}

#[test]
fn a_cdu_lease_held_over_a_stop_and_a_restart_keeps_the_gpus_capped_the_whole_time() {
    let Some(rig) = Rig::start("h11") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    let first = rig.agent(2).flash().start();
    first.ctl_within(&["caps"], Duration::from_secs(20), "no console");
    let control = first.control().clone();
    // The CDU's minimum caps for a rack whose cooling is lost.
    let ack = rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 200)], 60_000));
    assert_eq!(limits(&ack), [200, 200]);
    let watch = LimitWatch::start(&control, 2);
    // `systemctl restart`: a clean stop, then a new process on the same
    // GPUs and flash.
    first.stop();
    let second = rig
        .agent(2)
        .flash()
        .twin(node_agent::sim_gpus::TwinSource::again(&control))
        .start();
    let caps = second.ctl_within(&["caps"], Duration::from_secs(20), "no console");
    assert_eq!(caps["leases"].as_array().map(Vec::len), Some(1), "{caps}");
    assert_eq!(
        caps["gpus"][0]["ceiling"], 700,
        "the cap it found is its own (kept in flash), not the site's limit: {caps}"
    );
    // A few rounds of the new process.
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(console_limits(&second), [200, 200]);
    assert_eq!(watch.highest(), 200, "capped the whole time");
}

#[test]
fn a_command_sent_again_after_a_restart_that_kept_no_floor_is_a_replay() {
    let Some(rig) = Rig::start("h12") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    // State in memory only: no replay floor survives the restart.
    let mut agent = rig.spawn();
    let taken = lease(10, 1, &[(gpu(0), 400)], 60_000);
    assert_eq!(rig.ack(&mut sub, &taken).code, AckCode::Ok);
    agent.crash();
    let agent = rig.spawn();
    // The same frame, captured and sent again while still fresh: signed
    // before this start, so a replay; the GPU stays uncapped.
    let again = rig.ack(&mut sub, &taken);
    assert_eq!(again.code, AckCode::Replayed, "{}", again.detail.as_str());
    assert!(
        again
            .detail
            .as_str()
            .contains("signed before this host's start"),
        "{}",
        again.detail.as_str()
    );
    assert_eq!(console_limits(&agent)[0], 700);
    // Its sender's next command, stamped after the start, is taken.
    let next = lease(11, 1, &[(gpu(0), 450)], 60_000);
    assert_eq!(rig.ack(&mut sub, &next).code, AckCode::Ok);
    assert_eq!(console_limits(&agent)[0], 450);
}

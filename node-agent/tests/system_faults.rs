//! The whole agent against a real mosquitto, its GPUs at fault: a fatal
//! XID, its quarantine and an operator's release, a hung GPU, a GPU that
//! refuses every limit or is identified late, and an XID storm. The
//! fixture is `system/rig.rs`, as for `system.rs`.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::time::{Duration, Instant};

use loopwarden_protocol::{
    AckCode, CommandAuth, Event, Frame, GpuIndex, GpuSelector, HealthState, Message, NodeId,
    ReasonCode, Role, Watts,
};
use loopwarden_system_tests::{Seen, Subscriber};
use node_agent::config::Overrides;
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource};

use rig::{frame, lease, limits, now, Rig, SITE};

fn release(seq: u32, gpu: u8, note: &str) -> Frame {
    let f = Frame {
        sender: NodeId::new(Role::Operator, "jdoe").expect("ident"),
        seq,
        time: now(),
        message: Message::QuarantineRelease(loopwarden_protocol::QuarantineRelease {
            gpu: GpuIndex::new(gpu).expect("index"),
            operator: loopwarden_protocol::Ident::new("jdoe").expect("ident"),
            note: loopwarden_protocol::Text::new(note).expect("note"),
            auth: CommandAuth::default(),
        }),
    };
    // Unsigned: `Rig::send` signs it for the host it goes to.
    f
}

#[test]
fn a_fatal_xid_quarantines_runs_the_action_and_only_an_operator_releases() {
    let Some(rig) = Rig::start("h4") else {
        return;
    };
    let mut sub = Subscriber::start(
        rig.port,
        &[
            &rig.topic("event"),
            &rig.topic("ack"),
            &format!("dc/v2/{SITE}/json/host/{}/event", rig.host),
        ],
    )
    .expect("mosquitto_sub");
    let drained = rig.dir.path().join("drained");
    // On flash, so that the quarantine outlives a restart.
    let quarantining = || {
        rig.agent(2)
            .flags(Overrides {
                quarantine_actions: vec![format!("touch {}-{{gpu}}", drained.display())],
                ..Default::default()
            })
            .flash()
    };
    let agent = quarantining().start();
    std::thread::sleep(Duration::from_millis(1_000));
    agent
        .control()
        .inject(node_agent::sim_gpus::TwinFault::Xid { gpu: 1, xid: 79 })
        .expect("inject");
    assert!(
        agent
            .control()
            .inject(node_agent::sim_gpus::TwinFault::Xid { gpu: 5, xid: 79 })
            .is_err(),
        "the twin has no GPU 5"
    );
    // The XID, the state change and the action's outcome, as frames; the
    // XID also in JSON.
    let events = |s: &[Seen]| -> Vec<Event> {
        s.iter()
            .filter(|s| !s.topic.contains("/json/"))
            .filter_map(frame)
            .filter_map(|f| match f.message {
                Message::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    };
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        events(s)
            .iter()
            .any(|e| matches!(e, Event::QuarantineAction { .. }))
    });
    let ev = events(&seen);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Xid { gpu, xid: 79 } if gpu.get() == 1)),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::HealthChanged { gpu, to: HealthState::Quarantined, reason, .. }
                if gpu.get() == 1 && *reason == ReasonCode::xid(79).expect("xid")
        )),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::QuarantineAction { gpu, ok: true, exit_code: Some(0) } if gpu.get() == 1
        )),
        "{ev:?}"
    );
    assert!(
        drained.with_file_name("drained-1").exists(),
        "the action ran with {{gpu}} = 1"
    );
    let json = seen
        .iter()
        .filter(|s| s.topic.contains("/json/"))
        .filter_map(|s| serde_json::from_slice::<serde_json::Value>(&s.payload).ok())
        .find(|v| v["body"].get("xid").is_some())
        .expect("the XID's JSON mirror");
    assert_eq!(json["body"]["xid"]["xid"], 79);
    assert_eq!(json["body"]["xid"]["gpu"], 1);

    // The retained health says so, with the evidence.
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert_eq!(h.gpus[1].state, HealthState::Quarantined);
    assert!(
        h.gpus[1].evidence.as_str().contains("XID 79"),
        "{}",
        h.gpus[1].evidence.as_str()
    );
    assert_eq!(h.gpus[0].state, HealthState::Healthy);

    // A restart keeps the quarantine (from flash) and, its action known
    // done, does not run it again (`again_at_start` is off by default:
    // an action may cancel jobs or file a ticket).
    agent.stop();
    std::fs::remove_file(drained.with_file_name("drained-1")).expect("remove marker");
    let agent = quarantining().start();
    let why = agent.ctl_within(
        &["why", "1"],
        Duration::from_secs(10),
        "the restarted agent never answered",
    );
    assert_eq!(why["health"], "quarantined", "{why}");
    assert_eq!(why["reason"], "xid-79", "{why}");
    // The start's runs are spawned before the agent answers; a `touch`
    // ends within milliseconds.
    std::thread::sleep(Duration::from_millis(1_000));
    assert!(
        !drained.with_file_name("drained-1").exists(),
        "the action known done ran again at the start"
    );
    let ran_again = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !drained.with_file_name("drained-1").exists() && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        drained.with_file_name("drained-1").exists()
    };

    // A start at which GPU 1 cannot say its UUID (a driver still
    // loading): degraded, not healthy; once it says it, the quarantine
    // kept for it applies again and its action runs again.
    agent.stop();
    let agent = quarantining().source(late_identity(1)).start();
    let why = agent.ctl_within(&["why", "1"], Duration::from_secs(10), "never answered");
    assert_ne!(why["health"], "healthy", "{why}");
    let ran = ran_again();
    let why = agent.ctl(&["why", "1"]).expect("ctl why");
    assert_eq!(why["health"], "quarantined", "{why}");
    assert_eq!(why["reason"], "xid-79", "{why}");
    assert!(ran, "the action ran again once the GPU was identified");
    agent.stop();
    let agent = quarantining().start();
    let why = agent.ctl_within(&["why", "1"], Duration::from_secs(10), "never answered");
    assert_eq!(why["health"], "quarantined", "kept under its UUID: {why}");

    // Releasing a healthy GPU is refused; the quarantined one is released.
    let ack = rig.ack(&mut sub, &release(1, 0, "checked"));
    assert_eq!(ack.code, AckCode::NotQuarantined);
    let ack = rig.ack(&mut sub, &release(2, 1, "reseated; field diag passed"));
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    // The release is in the event log (its events went out before the ack).
    let log = agent.ctl(&["events"]).expect("ctl events");
    let released = log["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|e| e["event"]["quarantine_released"]["operator"] == "jdoe");
    assert!(released, "{log}");
    let why = agent.ctl(&["why", "1"]).expect("ctl why");
    assert_eq!(why["health"], "healthy", "{why}");
    assert_eq!(why["reason"], "operator-release", "{why}");
    let Some(Message::HostHealth(h)) = rig.retained_health().map(|f| f.message) else {
        panic!("no retained health");
    };
    assert_eq!(h.gpus[1].state, HealthState::Healthy);
    assert_eq!(h.gpus[1].reason, ReasonCode::OPERATOR_RELEASE);
    agent.stop();
}

#[test]
fn a_hung_gpu_does_not_stall_the_others() {
    // In process: the twin's fault injection needs its handle.
    let Some(rig) = Rig::start("h3") else {
        return;
    };
    let mut sub = rig.subscribe(&["telemetry"]);
    // A host of five GPUs of which NVML finds four.
    let agent = rig
        .agent(4)
        .flags(Overrides {
            expected_gpus: Some(5),
            ..Default::default()
        })
        .start();
    let control = agent.control();
    // Let it run, then hang GPU 2.
    let _ = sub.collect_until(Duration::from_secs(10), |s| s.len() >= 3);
    let status = agent.ctl(&["status"]).expect("ctl status");
    assert_eq!(
        (&status["gpus_expected"], &status["gpus_missing"]),
        (&serde_json::json!(5), &serde_json::json!(1)),
        "{status}"
    );
    control
        .inject(node_agent::sim_gpus::TwinFault::Hang { gpu: 2, on: true })
        .expect("inject");
    let start = Instant::now();
    let seen = sub.collect_until(Duration::from_secs(10), |s| s.len() >= 10);
    let took = start.elapsed();
    let frames: Vec<_> = seen.iter().filter_map(frame).collect();
    assert_eq!(frames.len(), 10, "telemetry kept coming");
    // 10 periods of 200 ms: far below what a stalled loop would take.
    assert!(took < Duration::from_secs(5), "10 samples took {took:?}");
    let last = match &frames[9].message {
        Message::HostTelemetry(t) => t.clone(),
        other => panic!("{other:?}"),
    };
    use loopwarden_protocol::GpuFlags;
    for g in &last.gpus {
        let responsive = g.flags.contains(GpuFlags::RESPONSIVE);
        assert_eq!(
            responsive,
            g.gpu.get() != 2,
            "GPU {}: responsive {responsive}",
            g.gpu.get()
        );
    }
    control
        .inject(node_agent::sim_gpus::TwinFault::Hang { gpu: 2, on: false })
        .expect("inject");
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.last().and_then(frame).is_some_and(|f| match f.message {
            Message::HostTelemetry(t) => t
                .gpus
                .iter()
                .all(|g| g.flags.contains(GpuFlags::RESPONSIVE)),
            _ => false,
        })
    });
    assert!(!seen.is_empty(), "GPU 2 answers again");
    agent.stop();
}

/// Twin GPUs, each wrapped by `.1` (given its index): a fault of the real
/// thing the twin does not play.
struct Wrapped<F>(node_agent::sim_gpus::TwinSource, F);

impl<F> GpuSource for Wrapped<F>
where
    F: Fn(usize, Box<dyn GpuDevice>) -> Box<dyn GpuDevice> + Send + 'static,
{
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let devices = self.0.devices()?.into_iter().enumerate();
        Ok(devices.map(|(i, d)| (self.1)(i, d)).collect())
    }
    fn watch_xids(
        &mut self,
        sink: node_agent::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.0.watch_xids(sink)
    }
}

/// Twin GPUs of which GPU `late` fails its first description, as a GPU
/// whose driver is still loading at the start.
fn late_identity(late: usize) -> impl GpuSource + Send {
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let twin = node_agent::sim_gpus::TwinSource::new(&board, 2, 3);
    Wrapped(twin, move |i, d| {
        Box::new(LateGpu(d, i == late)) as Box<dyn GpuDevice>
    })
}

/// A GPU whose first description fails when `.1`.
struct LateGpu(Box<dyn GpuDevice>, bool);

impl GpuDevice for LateGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        if std::mem::replace(&mut self.1, false) {
            return Err(GpuError::Timeout);
        }
        self.0.describe()
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.0.sample()
    }
    fn set_power_limit(&mut self, w: Watts) -> Result<(), GpuError> {
        self.0.set_power_limit(w)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.0.power_limit()
    }
}

/// Twin GPUs that answer everything but refuse every limit (an agent not
/// run as root).
fn refusing() -> impl GpuSource + Send {
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let twin = node_agent::sim_gpus::TwinSource::new(&board, 2, 3);
    Wrapped(twin, |_, d| Box::new(RefusingGpu(d)) as Box<dyn GpuDevice>)
}

/// A GPU that refuses every limit.
struct RefusingGpu(Box<dyn GpuDevice>);

impl GpuDevice for RefusingGpu {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        self.0.describe()
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.0.sample()
    }
    fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
        Err(GpuError::NoPermission)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.0.power_limit()
    }
}

#[test]
fn a_limit_the_gpu_refuses_is_acknowledged_as_failed_and_said_once() {
    let Some(rig) = Rig::start("h5") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack", "event"]);
    let agent = rig
        .agent(2)
        .source(refusing())
        .flags(Overrides {
            period_ms: Some(100),
            ..Default::default()
        })
        .start();
    std::thread::sleep(Duration::from_millis(500));
    let ack = rig.ack(&mut sub, &lease(1, 1, &[(GpuSelector::All, 400)], 60_000));
    assert_eq!(ack.code, AckCode::Failed);
    assert!(
        ack.detail.as_str().contains("permission"),
        "{}",
        ack.detail.as_str()
    );
    assert_eq!(limits(&ack), vec![700, 700], "the limits read back stand");
    // 2 s of samples at 100 ms: the refused limit is not retried every
    // sample, and no event claims a cap that is not in force.
    let seen = sub.collect_until(Duration::from_secs(2), |_| false);
    let caps = seen
        .iter()
        .filter_map(frame)
        .filter(|f| {
            matches!(
                f.message,
                Message::Event(Event::CapApplied { .. } | Event::CapsApplied { .. })
            )
        })
        .count();
    assert_eq!(caps, 0, "caps_applied events for a cap never applied");
    agent.stop();
}

/// A storm of benign XIDs (20,000 in about 2 s, applications' errors
/// that change no health) with one XID 79 in the middle of it: the GPU
/// of the XID 79 is quarantined, no other GPU changes health, and the
/// agent's XID queue stays within its capacity, dropping what it cannot
/// hold. No time limit is asserted beyond a generous wait: the figures
/// are `benches/xid_storm.rs`'s.
#[test]
fn an_xid_storm_does_not_delay_a_fatal_xid() {
    use node_agent::sim_gpus::TwinFault;
    let Some(rig) = Rig::start("h9") else {
        return;
    };
    let (gpus, fatal_gpu) = (8u8, 5u8);
    let mut sub = rig.subscribe(&["health"]);
    let agent = rig.agent(gpus as usize).flash().start();
    let control = agent.control().clone();
    let status = agent.ctl_within(
        &["status"],
        Duration::from_secs(20),
        "the agent never answered",
    );
    let capacity = status["xids"]["capacity"].as_u64().expect("xids.capacity");
    // On the bus, every GPU healthy.
    let health = |s: &Seen| match frame(s).map(|f| f.message) {
        Some(Message::HostHealth(h)) => Some(h),
        _ => None,
    };
    let first = sub
        .collect_until(Duration::from_secs(20), |s| {
            s.iter().any(|s| health(s).is_some())
        })
        .iter()
        .find_map(health)
        .expect("the agent's health");
    assert!(first.gpus.iter().all(|g| g.state == HealthState::Healthy));

    // 100 batches of 200 benign XIDs, one every 20 ms, round-robin over
    // the GPUs; XID 79 after the 50th batch.
    let storm = std::thread::spawn(move || {
        let start = Instant::now();
        let mut n = 0u32;
        for batch in 0..100u32 {
            if let Some(wait) =
                (start + Duration::from_millis(20) * batch).checked_duration_since(Instant::now())
            {
                std::thread::sleep(wait);
            }
            for _ in 0..200 {
                let xid = [13, 31, 43, 45][(n / gpus as u32 % 4) as usize];
                control
                    .inject(TwinFault::Xid {
                        gpu: (n % gpus as u32) as u8,
                        xid,
                    })
                    .expect("inject");
                n += 1;
            }
            if batch == 49 {
                control
                    .inject(TwinFault::Xid {
                        gpu: fatal_gpu,
                        xid: 79,
                    })
                    .expect("inject");
            }
        }
        n
    });
    // The queue, as the console shows it while the storm runs.
    let mut most_queued = 0;
    while !storm.is_finished() {
        if let Some(v) = agent.ctl(&["status"]) {
            let queued = v["xids"]["queued"].as_u64().expect("xids.queued");
            assert!(queued <= capacity, "{queued} queued, capacity {capacity}");
            most_queued = most_queued.max(queued);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let injected = storm.join().expect("the storm");
    assert_eq!(injected, 20_000);

    // The quarantine comes out, and no other GPU changed meanwhile.
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter()
            .filter_map(health)
            .any(|h| h.gpus[fatal_gpu as usize].state == HealthState::Quarantined)
    });
    let frames: Vec<_> = seen.iter().filter_map(health).collect();
    let status = agent.ctl(&["status"]).expect("ctl status");
    assert!(
        frames
            .iter()
            .any(|h| h.gpus[fatal_gpu as usize].state == HealthState::Quarantined),
        "GPU {fatal_gpu} not quarantined on the bus within 10 s of the storm's end: \
         {frames:?}; the agent says {} (bus: {})",
        status["health"],
        status["bus"]
    );
    for h in &frames {
        for g in h.gpus.iter().filter(|g| g.gpu.get() != fatal_gpu) {
            assert_eq!(g.state, HealthState::Healthy, "GPU {}: {h:?}", g.gpu.get());
        }
    }
    assert_eq!(status["health"]["quarantined"], 1, "{status}");
    assert_eq!(status["health"]["healthy"], gpus as u64 - 1, "{status}");
    let dropped = status["xids"]["dropped"].as_u64().expect("xids.dropped");
    let queued = status["xids"]["queued"].as_u64().expect("xids.queued");
    assert!(queued <= capacity, "{queued} queued, capacity {capacity}");
    assert!(
        dropped > 0 || most_queued <= capacity,
        "the queue neither dropped nor stayed within {capacity}: {status}"
    );
    let why = agent
        .ctl(&["why", &fatal_gpu.to_string()])
        .expect("ctl why");
    assert_eq!(why["health"], "quarantined", "{why}");
    assert_eq!(why["reason"], "xid-79", "{why}");
    agent.stop();
}

//! The NVML layer of the agent, tested without a GPU: a GPU whose NVML
//! call hangs times out alone and answers once released, a slow answer
//! is not a missed one, a driver stall blames no GPU, and XID events reach
//! the agent with a watch said down until it runs. The fake is
//! `fake_nvml_api/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_protocol::WholeCelsius;
use node_agent::gpu::{GpuError, GpuSource, XidEvent, XidReport};
use node_agent::nvml::{NvmlFailure, NvmlGpu, NvmlSource};
use node_agent::worker::{Answer, Worker};
use NvmlFailure::NotSupported;

mod fake_nvml_api;
use fake_nvml_api::{
    eventually, failed, fi, now_ok, nvml, Answers, FakeNvml, OpenOnDrop, GET_TEMPERATURE,
};

// --- 5. A hanging call ------------------------------------------------------

/// One sample through `worker`, and how long it took.
async fn timed_sample(worker: &Worker, deadline: Duration) -> (Answer, Duration) {
    let start = Instant::now();
    let result = worker.sample(deadline).await;
    (result, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_gpu_times_out_alone_and_answers_once_released() {
    const DEADLINE: Duration = Duration::from_millis(100);
    /// Far under the hang (which lasts until released, at most SAFETY).
    const BOUND: Duration = Duration::from_secs(2);

    let mut hanging = Answers::healthy();
    hanging.temperature = Ok(70);
    hanging.temperature_hangs = true;
    let fake = FakeNvml::new(vec![Answers::healthy(), hanging, Answers::healthy()]);
    fake.set_gate(true);
    let release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let workers: Vec<Worker> = (0..3u8)
        .map(|i| {
            let device = NvmlGpu::new(api.clone(), u32::from(i));
            Worker::spawn(i, Box::new(device)).expect("worker thread")
        })
        .collect();
    assert_eq!(workers[1].index(), 1);

    // Round 1: GPU 1 hangs in NVML past its deadline: not answered yet,
    // not a miss; 0 and 2 answer.
    let ((r0, _), (r1, t1), (r2, _)) = tokio::join!(
        timed_sample(&workers[0], DEADLINE),
        timed_sample(&workers[1], DEADLINE),
        timed_sample(&workers[2], DEADLINE),
    );
    assert_eq!(now_ok(r0).temp, WholeCelsius(61));
    assert_eq!(now_ok(r2).temp, WholeCelsius(61));
    assert!(matches!(r1, Answer::Pending), "{r1:?}");
    assert!(
        t1 >= DEADLINE,
        "GPU 1 gave up after {t1:?}, before its deadline"
    );
    assert!(t1 < BOUND, "GPU 1 took {t1:?} to give up");

    // Round 2, straight after, still stuck: no answer within a whole round
    // is a miss, at once, without a second NVML call queued behind the
    // first; 0 and 2 still answer.
    assert!(workers[1].is_stuck(DEADLINE));
    assert!(!workers[0].is_stuck(DEADLINE));
    let ((r0, _), (r1, t1), (r2, _)) = tokio::join!(
        timed_sample(&workers[0], DEADLINE),
        timed_sample(&workers[1], DEADLINE),
        timed_sample(&workers[2], DEADLINE),
    );
    now_ok(r0);
    now_ok(r2);
    assert!(matches!(r1, Answer::Now(Err(GpuError::Timeout))), "{r1:?}");
    assert!(t1 < DEADLINE, "a stuck GPU must fail at once, took {t1:?}");
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 1);
    assert_eq!(fake.calls(0, GET_TEMPERATURE), 2);

    // Released: the stuck call returns; its answer is the next round's,
    // without a new call; the round after asks again.
    drop(release);
    assert!(eventually(BOUND, || !workers[1].is_stuck(DEADLINE)));
    match workers[1].sample(DEADLINE).await {
        Answer::Late(Ok(s)) => assert_eq!(s.temp, WholeCelsius(70)),
        other => panic!("the late answer: {other:?}"),
    }
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 1);
    assert_eq!(
        now_ok(workers[1].sample(DEADLINE).await).temp,
        WholeCelsius(70)
    );
    assert_eq!(fake.calls(1, GET_TEMPERATURE), 2);
    assert_eq!(workers[1].call_times().late, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_is_not_a_missed_one() {
    // A busy GSP: GPU 0's calls take longer than the deadline but less
    // than a period. Every answer is used, a round later; none is a miss.
    const DEADLINE: Duration = Duration::from_millis(50);
    let mut slow = Answers::healthy();
    slow.temperature_hangs = true;
    let fake = FakeNvml::new(vec![slow]);
    let _release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let w = Worker::spawn(0, Box::new(NvmlGpu::new(api, 0))).expect("worker thread");
    let mut samples = 0;
    for round in 0..6 {
        fake.set_gate(true);
        let a = w.sample(DEADLINE).await;
        // The GPU answers 100 ms after it was asked, inside the period.
        tokio::time::sleep(Duration::from_millis(100)).await;
        fake.set_gate(false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        match a {
            Answer::Pending if round % 2 == 0 => {}
            Answer::Late(Ok(_)) if round % 2 == 1 => samples += 1,
            other => panic!("round {round}: {other:?}"),
        }
    }
    assert_eq!(samples, 3, "every slow answer used");
    assert_eq!(w.call_times().late, 3);
    assert!(w.call_times().max_us >= 100_000, "{:?}", w.call_times());
}

/// One sampling round as the agent runs it: every worker sampled at once,
/// each answer or miss fed to `engine` in index order at one time.
async fn round_into(
    workers: &[Worker],
    engine: &mut node_core::health::HealthEngine,
    t_ms: u64,
) -> Vec<node_core::health::Output> {
    let deadline = Duration::from_millis(50);
    let results = futures::future::join_all(workers.iter().map(|w| w.sample(deadline))).await;
    let now = loopwarden_protocol::TimestampMs(t_ms);
    let mut outs = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        outs.extend(match r {
            Answer::Now(Ok(s)) | Answer::Late(Ok(s)) => {
                engine.sample(now, i as u8, &node_agent::shell::observation(&s))
            }
            Answer::Now(Err(_)) | Answer::Late(Err(_)) => engine.missed(now, i as u8),
            Answer::Pending => Vec::new(),
        });
    }
    outs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_stall_of_six_rounds_quarantines_no_gpu_and_one_left_hung_is() {
    use loopwarden_protocol::HealthState;
    use node_core::health::{HealthEngine, Limits, Output, Policy};

    let mut hanging = Answers::healthy();
    hanging.temperature_hangs = true;
    // No errors, flags or link counters: nothing but the stall to judge.
    hanging.ecc_total.insert((false, true), Ok(0));
    hanging.fields = [(fi::MEMORY_TEMP, Ok(70))].into_iter().collect();
    let fake = FakeNvml::new(vec![hanging.clone(); 4]);
    let _release = OpenOnDrop(fake.clone());
    let api = Arc::new(fake.clone());
    let workers: Vec<Worker> = (0..4u8)
        .map(|i| Worker::spawn(i, Box::new(NvmlGpu::new(api.clone(), u32::from(i)))).unwrap())
        .collect();
    let limits = Limits {
        max_operating_c: 87.0,
    };
    let mut engine = HealthEngine::new(
        4,
        limits,
        Policy::default(),
        loopwarden_protocol::TimestampMs(0),
    );
    let mut outs = Vec::new();
    // A round with every GPU answering, then six with every call hung.
    outs.extend(round_into(&workers, &mut engine, 1_000).await);
    fake.set_gate(true);
    for r in 2..8 {
        outs.extend(round_into(&workers, &mut engine, r * 1_000).await);
    }
    let state = |e: &HealthEngine, g: u8| e.status(g).unwrap().state;
    assert!(
        (0..4).all(|g| state(&engine, g) == HealthState::Healthy),
        "{outs:?}"
    );
    assert!(engine.stalled_since().is_some(), "a host stall: {outs:?}");
    // The driver comes back for GPUs 0, 1 and 3; GPU 2 stays hung.
    for g in [0, 1, 3] {
        fake.set(g, |a| a.temperature_hangs = false);
    }
    fake.set_gate(false);
    assert!(eventually(Duration::from_secs(5), || {
        workers
            .iter()
            .all(|w| !w.is_stuck(Duration::from_millis(50)))
    }));
    fake.set_gate(true);
    for r in 8..13 {
        outs.extend(round_into(&workers, &mut engine, r * 1_000).await);
    }
    assert_eq!(engine.stalled_since(), None);
    assert!(outs
        .iter()
        .any(|o| matches!(o, Output::HostStallEnded { .. })));
    assert_eq!(state(&engine, 2), HealthState::Quarantined, "{outs:?}");
    for g in [0, 1, 3] {
        assert_eq!(state(&engine, g), HealthState::Healthy);
    }
}

// --- 6. XID events ----------------------------------------------------------

#[test]
fn xid_events_reach_the_agent_and_refused_gpus_are_reported() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NotSupported);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing, Answers::healthy()]);
    fake.state().xids = vec![(0, 79), (2, 48), (0, 94)];

    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    assert_eq!(
        refused,
        vec![(1, nvml("nvmlDeviceRegisterEvents", NotSupported))]
    );
    assert_eq!(fake.state().watched, vec![0, 1, 2]);

    let timeout = Duration::from_secs(2);
    let received: Vec<XidEvent> = (0..4)
        .map(|_| events.recv_timeout(timeout).expect("an XID report"))
        .collect();
    // GPU 1's XIDs are not seen: the watch is said down, naming it,
    // and the other GPUs' XIDs still come.
    match &received[0] {
        XidEvent::WatchDown(why) => assert!(why.contains("GPU 1"), "{why}"),
        other => panic!("expected the watch down first, got {other:?}"),
    }
    assert_eq!(
        received[1..],
        vec![
            XidEvent::Xid(XidReport { gpu: 0, xid: 79 }),
            XidEvent::Xid(XidReport { gpu: 2, xid: 48 }),
            XidEvent::Xid(XidReport { gpu: 0, xid: 94 }),
        ]
    );
    assert!(
        !fake.state().watch_ended,
        "the watch runs until the source goes"
    );

    // Dropping the source stops the watch; its thread ends, and nothing
    // more arrives.
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
    assert_eq!(events.recv_timeout(Duration::from_millis(100)), None);
}

#[test]
fn a_watch_that_ends_is_said_and_restarted_with_backoff() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    source.watch_xids(sink).expect("the XID watch starts");
    // The driver goes away: the wait ends, and restarts fail for a while.
    fake.state().watch_fails = Some(NvmlFailure::Other("driver reloading".into()));
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("driver reloading"), "{why}"),
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The first restart comes after 1 s and fails too: said again.
    assert!(matches!(
        events.recv_timeout(timeout),
        Some(XidEvent::WatchDown(_))
    ));
    // The driver is back: the next restart (2 s later) registers again.
    fake.state().watch_fails = None;
    assert_eq!(events.recv_timeout(timeout), Some(XidEvent::WatchUp));
    assert!(fake.state().watch_starts >= 3);
    fake.state().xids = vec![];
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn a_gpu_count_that_fails_at_the_start_is_said_down_and_retried() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    fake.state().count_fails = Some(NvmlFailure::Other("driver not ready".into()));
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the watch runs, said down");
    assert_eq!(refused, vec![]);
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => {
            assert!(why.contains("nvmlDeviceGetCount"), "{why}");
            assert!(why.contains("driver not ready"), "{why}");
        }
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The driver is ready: a restart counts the GPUs and registers them
    // (a restart before this line is said down again).
    fake.state().count_fails = None;
    let next = (0..3).find_map(|_| match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(_)) => None,
        other => Some(other),
    });
    assert_eq!(next, Some(Some(XidEvent::WatchUp)));
    assert_eq!(fake.state().watched, vec![0, 1]);
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn registration_answers_slower_than_the_wait_are_said_down_then_up() {
    let fake = FakeNvml::new(vec![Answers::healthy(); 2]);
    fake.state().registration_hangs = true;
    fake.state().xids = vec![(1, 79)];
    fake.set_gate(true);
    let mut source = NvmlSource::new(fake.clone()).first_answers_wait(Duration::ZERO);
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the watch runs, said down");
    assert_eq!(refused, vec![]);
    match events.try_recv() {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("did not come"), "{why}"),
        other => panic!("expected the watch down at once, got {other:?}"),
    }
    // The answers come: every GPU registered, the watch is up.
    fake.set_gate(false);
    let timeout = Duration::from_secs(5);
    assert_eq!(events.recv_timeout(timeout), Some(XidEvent::WatchUp));
    assert_eq!(
        events.recv_timeout(timeout),
        Some(XidEvent::Xid(XidReport { gpu: 1, xid: 79 }))
    );
    assert_eq!(
        fake.state().watch_starts,
        1,
        "the first start, not a restart"
    );
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

#[test]
fn a_gpu_refused_for_a_reason_that_may_pass_is_asked_again_until_the_watch_is_up() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NvmlFailure::Other("Unknown Error".into()));
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    let unknown = failed("nvmlDeviceRegisterEvents", "Unknown Error");
    assert_eq!(refused, vec![(1, unknown)]);
    let timeout = Duration::from_secs(5);
    match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(why)) => assert!(why.contains("GPU 1"), "{why}"),
        other => panic!("expected the watch down, got {other:?}"),
    }
    // The GPU System Processor is ready: the wait ends after the backoff
    // (1 s) and a new start registers GPU 1 (a start before this line is
    // said down again).
    fake.set(1, |a| a.xid_registration = Ok(()));
    fake.state().xids = vec![(1, 79)];
    let up = (0..4).find_map(|_| match events.recv_timeout(timeout) {
        Some(XidEvent::WatchDown(_) | XidEvent::Xid(_)) => None,
        other => Some(other),
    });
    assert_eq!(up, Some(Some(XidEvent::WatchUp)));
    assert!(fake.state().watch_starts >= 2, "the watch started again");
    // GPU 1's XIDs are seen now.
    let xid = XidEvent::Xid(XidReport { gpu: 1, xid: 79 });
    assert_eq!(events.recv_timeout(timeout), Some(xid));
    // Every GPU registered: the watch runs on, and is not started again.
    let starts = fake.state().watch_starts;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.state().watch_starts, starts);
    drop(source);
    assert!(eventually(timeout, || fake.state().watch_ended));
}

/// A GPU refused alike at every retry (one fallen off the bus) is asked
/// again, but the watch is said down once, not at every retry: the event
/// log keeps the incident, not a line a minute.
#[test]
fn a_gpu_refused_alike_at_each_retry_is_said_down_once() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NvmlFailure::GpuLost);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    source.watch_xids(sink).expect("the XID watch starts");
    assert!(matches!(
        events.recv_timeout(Duration::from_secs(5)),
        Some(XidEvent::WatchDown(_))
    ));
    // Retries after 1 s and 2 s more: asked again, nothing said again.
    assert!(eventually(Duration::from_secs(10), || fake
        .state()
        .watch_starts
        >= 3));
    assert_eq!(events.recv_timeout(Duration::from_millis(200)), None);
    drop(source);
    assert!(eventually(Duration::from_secs(5), || fake
        .state()
        .watch_ended));
}

#[test]
fn a_gpu_that_does_not_support_xid_events_is_not_asked_again() {
    let mut refusing = Answers::healthy();
    refusing.xid_registration = Err(NotSupported);
    let fake = FakeNvml::new(vec![Answers::healthy(), refusing]);
    let mut source = NvmlSource::new(fake.clone());
    let (sink, events) = node_agent::xid_queue::xid_queue(64);
    let refused = source.watch_xids(sink).expect("the XID watch starts");
    assert_eq!(
        refused,
        vec![(1, nvml("nvmlDeviceRegisterEvents", NotSupported))]
    );
    assert!(matches!(
        events.recv_timeout(Duration::from_secs(5)),
        Some(XidEvent::WatchDown(_))
    ));
    // Past the first backoff (1 s): still the first start, nothing said.
    assert_eq!(events.recv_timeout(Duration::from_millis(1500)), None);
    assert_eq!(fake.state().watch_starts, 1);
    drop(source);
    assert!(eventually(Duration::from_secs(5), || fake
        .state()
        .watch_ended));
}

//! A thread per GPU, so a GPU call that hangs stalls nothing else.
//!
//! NVML calls block, and on a sick GPU some never return. Each GPU's
//! device lives on its own OS thread; the agent sends it one request at a
//! time and waits at most a deadline. A call that misses the deadline is
//! reported as [`GpuError::Timeout`]; while that call is still running,
//! new requests for the same GPU fail at once instead of queueing behind it
//! (a queued limit would otherwise be applied late, when nobody waits).
//! The other GPUs' threads are untouched, so they keep being sampled on
//! time.
//!
//! A slow sample is not a missed one ([`Worker::sample`]): a sample that
//! answers after the deadline is kept and handed over at the next round
//! ([`Answer::Late`]), and only a call still running when the next round
//! begins (no answer within a whole sampling period) is a miss.
//!
//! A device that answers from memory ([`GpuDevice::answers_in_memory`],
//! the simulated hall's GPUs) gets no thread: its calls run on the
//! caller's thread, and each is timed against the same deadline. An
//! answer that took longer than the deadline counts as one that came after
//! it: a sample is kept for the next round, anything else is a timeout.
//! Such a call cannot be abandoned while it runs, which is why only
//! devices that cannot hang may say they answer from memory; NVML keeps
//! its threads.
//!
//! A reprobe ([`Worker::reprobe`]) is never lost: asked while a call still
//! runs (a GPU not back yet when a host stall ends), it is kept and done
//! before the GPU's next call.
//!
//! Glossary:
//! - *deadline*: the longest the agent waits for one GPU call.
//! - *busy*: a worker with a call in progress, marked by the caller before
//!   the call is handed over and cleared by the worker when it is done.
//! - *late answer*: a sample that came after its deadline, kept for the
//!   next round.
//! - *inline*: a worker without a thread, for a device that answers from
//!   memory.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_protocol::Watts;
use tokio::sync::oneshot;

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample};

enum Request {
    Describe,
    Sample,
    SetLimit(Watts),
    ReadLimit,
    Reprobe,
}

enum Reply {
    Info(Result<GpuInfo, GpuError>),
    Sample(Result<GpuSample, GpuError>),
    Done(Result<(), GpuError>),
    Limit(Result<Watts, GpuError>),
}

struct Job {
    request: Request,
    reply: oneshot::Sender<Reply>,
}

/// A sample's answer in one round.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Answered within the deadline (a sample or an error).
    Now(Result<GpuSample, GpuError>),
    /// The answer of the previous round's call, which came after its
    /// deadline; no new call is made this round.
    Late(Result<GpuSample, GpuError>),
    /// Asked now; no answer within the deadline yet (it will be `Late`).
    Pending,
}

/// How long a GPU's calls take (the sampling calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTimes {
    /// The last sample call, µs.
    pub last_us: u64,
    /// The longest sample call since start, µs.
    pub max_us: u64,
    /// Samples that answered after their deadline.
    pub late: u64,
}

/// What the thread and the caller share.
#[derive(Default)]
struct Shared {
    /// When the call in progress was handed over; `None` when idle.
    busy_since: Option<Instant>,
    /// A sample that answered after its caller stopped waiting.
    late: Option<Result<GpuSample, GpuError>>,
    times: CallTimes,
    /// A reprobe asked while a call ran: done before the next call.
    reprobe: bool,
}

/// Where a worker's calls run.
enum Runner {
    /// The thread that owns the device.
    Thread(std::sync::mpsc::Sender<Job>),
    /// The caller's thread (a device that answers from memory).
    Inline(Mutex<Box<dyn GpuDevice>>),
}

/// The worker of one GPU.
pub struct Worker {
    index: u8,
    runner: Runner,
    shared: Arc<Mutex<Shared>>,
}

/// Clears the busy mark however a call ends: with its answer handed over
/// ([`Done::finish`]), or alone when the call panicked.
struct Done(Option<Arc<Mutex<Shared>>>);

impl Done {
    fn new(shared: Arc<Mutex<Shared>>) -> Self {
        Self(Some(shared))
    }

    /// Hands `reply` over ([`deliver`]) and clears the busy mark under the
    /// same lock. Whoever finds the worker idle therefore also finds a late
    /// sample already kept: no round can start a new call in between, be
    /// answered, and be handed the older late sample at the next round
    /// (counters going backwards, which the health engine reads as a reset).
    fn finish(mut self, to: oneshot::Sender<Reply>, reply: Reply, took_us: u64) {
        let Some(shared) = self.0.take() else { return };
        let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
        deliver(&mut s, to, reply, took_us);
        s.busy_since = None;
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            if let Ok(mut s) = shared.lock() {
                s.busy_since = None;
            }
        }
    }
}

/// Runs `request` on `device`.
fn execute(device: &mut dyn GpuDevice, request: Request) -> Reply {
    match request {
        Request::Describe => Reply::Info(device.describe()),
        Request::Sample => Reply::Sample(device.sample()),
        Request::SetLimit(w) => Reply::Done(device.set_power_limit(w)),
        Request::ReadLimit => Reply::Limit(device.power_limit()),
        Request::Reprobe => {
            device.reprobe();
            Reply::Done(Ok(()))
        }
    }
}

impl Worker {
    /// The worker of `device`: inline when the device answers from memory,
    /// else on a thread of its own.
    pub fn start(index: u8, device: Box<dyn GpuDevice>) -> std::io::Result<Self> {
        if device.answers_in_memory() {
            Ok(Self::inline(index, device))
        } else {
            Self::spawn(index, device)
        }
    }

    /// A worker without a thread: `device`'s calls run on the caller's
    /// thread, timed against the deadline.
    pub fn inline(index: u8, device: Box<dyn GpuDevice>) -> Self {
        Self {
            index,
            runner: Runner::Inline(Mutex::new(device)),
            shared: Arc::new(Mutex::new(Shared::default())),
        }
    }

    /// Whether its calls run on the caller's thread.
    pub fn is_inline(&self) -> bool {
        matches!(self.runner, Runner::Inline(_))
    }

    /// Starts the thread that owns `device`.
    pub fn spawn(index: u8, mut device: Box<dyn GpuDevice>) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mine = shared.clone();
        std::thread::Builder::new()
            .name(format!("gpu-{index}"))
            .spawn(move || {
                for job in rx {
                    let done = Done::new(mine.clone());
                    let began = Instant::now();
                    reprobe_if_asked(&mine, &mut *device);
                    let reply = execute(&mut *device, job.request);
                    let took = began.elapsed().as_micros() as u64;
                    // Idle as the answer goes out, so a caller answered
                    // now can call again at once.
                    done.finish(job.reply, reply, took);
                }
            })?;
        Ok(Self {
            index,
            runner: Runner::Thread(jobs),
            shared,
        })
    }

    /// The GPU's index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// Whether a call has been in progress for longer than `deadline`.
    pub fn is_stuck(&self, deadline: Duration) -> bool {
        self.shared
            .lock()
            .expect("worker state")
            .busy_since
            .is_some_and(|t| t.elapsed() > deadline)
    }

    /// How long its sample calls take.
    pub fn call_times(&self) -> CallTimes {
        self.shared.lock().expect("worker state").times
    }

    async fn call(&self, request: Request, deadline: Duration) -> Result<Reply, GpuError> {
        {
            let mut s = self.shared.lock().expect("worker state");
            if s.busy_since.is_some() {
                // The last call missed its deadline and is still running.
                return Err(GpuError::Timeout);
            }
            s.busy_since = Some(Instant::now());
        }
        let jobs = match &self.runner {
            Runner::Thread(jobs) => jobs,
            Runner::Inline(device) => return self.call_inline(device, request, deadline),
        };
        let (tx, rx) = oneshot::channel();
        if jobs.send(Job { request, reply: tx }).is_err() {
            self.shared.lock().expect("worker state").busy_since = None;
            return Err(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread has ended".into(),
            });
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread ended during the call".into(),
            }),
            Err(_) => Err(GpuError::Timeout),
        }
    }

    /// Runs `request` here and now, and judges its answer by how long it
    /// took: within `deadline` it is answered, else it came after the
    /// deadline (a sample is kept for the next round). A panic of the
    /// device is a failed call, as a thread that ended would be.
    fn call_inline(
        &self,
        device: &Mutex<Box<dyn GpuDevice>>,
        request: Request,
        deadline: Duration,
    ) -> Result<Reply, GpuError> {
        let done = Done::new(self.shared.clone());
        let began = Instant::now();
        let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut d = device.lock().unwrap_or_else(|p| p.into_inner());
            reprobe_if_asked(&self.shared, &mut **d);
            execute(&mut **d, request)
        }));
        let took = began.elapsed();
        let Ok(reply) = reply else {
            drop(done);
            return Err(GpuError::Failed {
                what: "GPU worker",
                detail: "the device panicked during the call".into(),
            });
        };
        let (tx, rx) = oneshot::channel();
        // Past the deadline the caller stopped waiting: no receiver.
        let rx = (took <= deadline).then_some(rx);
        done.finish(tx, reply, took.as_micros() as u64);
        match rx {
            None => Err(GpuError::Timeout),
            Some(mut rx) => rx.try_recv().map_err(|_| GpuError::Failed {
                what: "GPU worker",
                detail: "no answer from an inline call".into(),
            }),
        }
    }

    /// The GPU's identity and power range.
    pub async fn describe(&self, deadline: Duration) -> Result<GpuInfo, GpuError> {
        match self.call(Request::Describe, deadline).await? {
            Reply::Info(r) => r,
            _ => unreachable!("a describe request gets an info reply"),
        }
    }

    /// One round's sample: a late answer of the last round if there is
    /// one (no new call then), else a new call, answered within `deadline`
    /// or `Pending`. A call still running from the last round is a miss
    /// (`Now(Err(Timeout))`): no answer within a whole period.
    pub async fn sample(&self, deadline: Duration) -> Answer {
        {
            let mut s = self.shared.lock().expect("worker state");
            if let Some(late) = s.late.take() {
                return Answer::Late(late);
            }
            if s.busy_since.is_some() {
                // Still running since the last round: no answer within a
                // whole period.
                return Answer::Now(Err(GpuError::Timeout));
            }
        }
        match self.call(Request::Sample, deadline).await {
            Ok(Reply::Sample(r)) => Answer::Now(r),
            Ok(_) => unreachable!("a sample request gets a sample reply"),
            Err(GpuError::Timeout) => Answer::Pending,
            Err(e) => Answer::Now(Err(e)),
        }
    }

    /// Sets the power limit.
    pub async fn set_limit(&self, limit: Watts, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::SetLimit(limit), deadline).await? {
            Reply::Done(r) => r,
            _ => unreachable!("a set request gets a done reply"),
        }
    }

    /// Reads the power limit back.
    pub async fn read_limit(&self, deadline: Duration) -> Result<Watts, GpuError> {
        match self.call(Request::ReadLimit, deadline).await? {
            Reply::Limit(r) => r,
            _ => unreachable!("a read request gets a limit reply"),
        }
    }

    /// Has the device ask again what answered "not supported"
    /// ([`GpuDevice::reprobe`]): now, or, while a call still runs (or past
    /// `deadline`), before its next call. It is never lost.
    pub async fn reprobe(&self, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::Reprobe, deadline).await {
            Ok(Reply::Done(r)) => r,
            Ok(_) => unreachable!("a reprobe request gets a done reply"),
            Err(GpuError::Timeout) => {
                self.shared.lock().expect("worker state").reprobe = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Does the reprobe asked while a call ran, if one was.
fn reprobe_if_asked(shared: &Mutex<Shared>, device: &mut dyn GpuDevice) {
    let asked = shared
        .lock()
        .map(|mut s| std::mem::take(&mut s.reprobe))
        .unwrap_or(false);
    if asked {
        device.reprobe();
    }
}

/// Hands `reply` to the caller, or keeps a sample whose caller stopped
/// waiting as the late answer; records how long a sample call took.
fn deliver(s: &mut Shared, to: oneshot::Sender<Reply>, reply: Reply, took_us: u64) {
    if matches!(reply, Reply::Sample(_)) {
        s.times.last_us = took_us;
        s.times.max_us = s.times.max_us.max(took_us);
    }
    // The caller may have given up; a sample is then kept for the next
    // round, anything else dropped (nobody waits for it).
    if let Err(Reply::Sample(r)) = to.send(reply) {
        s.times.late += 1;
        s.late = Some(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that answers from memory, each call taking `delay`.
    struct Slow {
        delay: Arc<Mutex<Duration>>,
        limit: Watts,
    }

    impl GpuDevice for Slow {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            Ok(GpuInfo {
                name: "slow".into(),
                uuid: "GPU-slow".into(),
                default_limit: Watts(700),
                min_limit: Watts(200),
                max_limit: Watts(700),
            })
        }
        fn sample(&mut self) -> Result<GpuSample, GpuError> {
            std::thread::sleep(*self.delay.lock().unwrap());
            Ok(GpuSample {
                power_limit: self.limit,
                ..GpuSample::default()
            })
        }
        fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
            std::thread::sleep(*self.delay.lock().unwrap());
            self.limit = limit;
            Ok(())
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Ok(self.limit)
        }
        fn answers_in_memory(&self) -> bool {
            true
        }
    }

    fn slow(delay_ms: u64) -> (Worker, Arc<Mutex<Duration>>) {
        let delay = Arc::new(Mutex::new(Duration::from_millis(delay_ms)));
        let d = Slow {
            delay: delay.clone(),
            limit: Watts(700),
        };
        let w = Worker::start(3, Box::new(d)).unwrap();
        (w, delay)
    }

    #[tokio::test]
    async fn a_device_that_answers_from_memory_gets_no_thread() {
        let (w, _) = slow(0);
        assert!(w.is_inline());
        let d = Duration::from_millis(100);
        assert_eq!(w.describe(d).await.unwrap().uuid, "GPU-slow");
        w.set_limit(Watts(400), d).await.unwrap();
        assert_eq!(w.read_limit(d).await.unwrap(), Watts(400));
        match w.sample(d).await {
            Answer::Now(Ok(s)) => assert_eq!(s.power_limit, Watts(400)),
            other => panic!("{other:?}"),
        }
        assert!(!w.is_stuck(Duration::ZERO));
        assert_eq!(w.call_times().late, 0);
    }

    #[tokio::test]
    async fn an_inline_answer_after_the_deadline_counts_as_late() {
        let (w, delay) = slow(30);
        let d = Duration::from_millis(5);
        // A sample past its deadline is pending now and handed over at the
        // next round, with no new call made then.
        assert!(matches!(w.sample(d).await, Answer::Pending));
        *delay.lock().unwrap() = Duration::ZERO;
        assert!(matches!(w.sample(d).await, Answer::Late(Ok(_))));
        assert!(matches!(w.sample(d).await, Answer::Now(Ok(_))));
        assert_eq!(w.call_times().late, 1);
        assert!(w.call_times().max_us >= 30_000);
        // A set past its deadline is a timeout (it took effect, as a
        // thread's late set does).
        *delay.lock().unwrap() = Duration::from_millis(30);
        assert_eq!(w.set_limit(Watts(300), d).await, Err(GpuError::Timeout));
        assert_eq!(
            w.read_limit(Duration::from_secs(1)).await.unwrap(),
            Watts(300)
        );
    }

    #[tokio::test]
    async fn a_device_that_may_block_keeps_its_thread() {
        struct Blocking;
        impl GpuDevice for Blocking {
            fn describe(&mut self) -> Result<GpuInfo, GpuError> {
                Err(GpuError::NotSupported)
            }
            fn sample(&mut self) -> Result<GpuSample, GpuError> {
                std::thread::sleep(Duration::from_millis(200));
                Ok(GpuSample::default())
            }
            fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
                Ok(())
            }
            fn power_limit(&mut self) -> Result<Watts, GpuError> {
                Ok(Watts(700))
            }
        }
        let w = Worker::start(0, Box::new(Blocking)).unwrap();
        assert!(!w.is_inline());
        let began = Instant::now();
        assert!(matches!(
            w.sample(Duration::from_millis(10)).await,
            Answer::Pending
        ));
        assert!(began.elapsed() < Duration::from_millis(150), "not waited");
        assert!(w.is_stuck(Duration::from_millis(5)));
    }
}

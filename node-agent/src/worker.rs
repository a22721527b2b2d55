//! A thread per GPU, so a GPU call that hangs stalls nothing else.
//!
//! NVML calls block, and on a sick GPU some never return. Each GPU's
//! device lives on its own OS thread; the agent sends it one request at a
//! time and waits at most a deadline. A call that misses the deadline is
//! reported as [`GpuError::Timeout`] ("did not answer"). A limit, describe
//! or reprobe request that finds the GPU still busy (a late sample, or a
//! call past its deadline) waits for it to end, then runs, all within its
//! own deadline counted from when it was asked; if the GPU is still busy
//! at that deadline the request is never made (nothing is queued to be
//! applied when nobody waits) and its error says the GPU was still busy
//! with a late sample or with an earlier call. The other GPUs' threads are
//! untouched, so they keep being sampled on time.
//!
//! A slow sample is not a missed one ([`Worker::sample`]): a sample that
//! answers after the deadline is kept and handed over at the next round
//! ([`Answer::Late`]), and only a call still running when the next round
//! begins (no answer within a whole sampling period) is a miss: a sample
//! never waits for its turn.
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
//! A panic in a device call (device code, an overflow) fails that call
//! alone: its caller is answered with an error that names the panic
//! ("the GPU's worker panicked: ..."), logged at error level once per
//! distinct message, and the worker, thread or inline, takes the next
//! call as before.
//!
//! A reprobe ([`Worker::reprobe`]) is never lost: asked while a call still
//! runs past the reprobe's deadline (a GPU not back yet when a host stall
//! ends), it is kept and done before the GPU's next call.
//!
//! Glossary:
//! - *deadline*: the longest the agent waits for one GPU call.
//! - *busy*: a worker with a call in progress, marked by the caller before
//!   the call is handed over and cleared by the worker when it is done,
//!   under the same lock as the answer (a late sample) is kept.
//! - *late answer*: a sample that came after its deadline, kept for the
//!   next round with when it came ([`Worker::sample_dated`]).
//! - *inline*: a worker without a thread, for a device that answers from
//!   memory.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_protocol::Watts;
use tokio::sync::{oneshot, Notify};

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

/// Which reply a request gets.
#[derive(Clone, Copy)]
enum ReplyKind {
    Info,
    Sample,
    Done,
    Limit,
}

impl Request {
    fn kind(&self) -> ReplyKind {
        match self {
            Request::Describe => ReplyKind::Info,
            Request::Sample => ReplyKind::Sample,
            Request::SetLimit(_) | Request::Reprobe => ReplyKind::Done,
            Request::ReadLimit => ReplyKind::Limit,
        }
    }
}

impl Reply {
    /// The reply of a `kind` of request that failed with `e`.
    fn failed(kind: ReplyKind, e: GpuError) -> Self {
        match kind {
            ReplyKind::Info => Reply::Info(Err(e)),
            ReplyKind::Sample => Reply::Sample(Err(e)),
            ReplyKind::Done => Reply::Done(Err(e)),
            ReplyKind::Limit => Reply::Limit(Err(e)),
        }
    }
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
    /// Sample calls that ended since the start (in time or late): none,
    /// and `last_us` and `max_us` are not known (read them through
    /// [`CallTimes::known_last_us`] and [`CallTimes::known_max_us`]).
    pub ended: u64,
    /// How long the call in flight (a sample, a limit call, a reprobe) has
    /// run so far, µs; 0 when the GPU is idle. A call that hangs shows
    /// here long before it ends (`last_us` is only known at its end).
    pub running_us: u64,
}

impl CallTimes {
    /// The last sample call, µs, once a sample call ended; `None` before:
    /// not known, never a 0 that reads as the fastest. The one rule for
    /// every reader (`ctl status`, `/metrics`).
    pub fn known_last_us(&self) -> Option<u64> {
        (self.ended > 0).then_some(self.last_us)
    }

    /// The longest sample call since the start, µs, once a sample call
    /// ended; `None` before, as [`CallTimes::known_last_us`].
    pub fn known_max_us(&self) -> Option<u64> {
        (self.ended > 0).then_some(self.max_us)
    }
}

/// The call in progress.
#[derive(Debug, Clone, Copy)]
struct Busy {
    /// When it was handed over.
    since: Instant,
    /// Whether it is a sample (else a describe, a limit or a reprobe).
    sample: bool,
}

impl Busy {
    /// Why a call that waited for this one was never made: its words, as
    /// the caller's error.
    fn error(self) -> GpuError {
        let what = if self.sample {
            "a late sample"
        } else {
            "an earlier call that did not answer"
        };
        GpuError::Failed {
            what: "GPU call",
            detail: format!(
                "not made before its deadline: the GPU was still busy with {what} (asked {} ms before)",
                self.since.elapsed().as_millis()
            ),
        }
    }
}

/// Why a call gave no answer.
enum CallError {
    /// Not made: the GPU was still busy with another call at the deadline.
    Busy(Busy),
    /// Made, but not answered before its deadline.
    NoAnswer,
    /// The worker could not take it.
    Failed(GpuError),
}

impl From<CallError> for GpuError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Busy(b) => b.error(),
            CallError::NoAnswer => GpuError::Timeout,
            CallError::Failed(e) => e,
        }
    }
}

/// What the thread and the caller share.
#[derive(Default)]
struct Shared {
    /// The call in progress; `None` when idle.
    busy: Option<Busy>,
    /// A sample that answered after its caller stopped waiting, and when
    /// it answered.
    late: Option<(Result<GpuSample, GpuError>, Instant)>,
    times: CallTimes,
    /// A reprobe asked while a call ran: done before the next call.
    reprobe: bool,
    /// The last panic of the device logged, so a repeat is not.
    last_panic: Option<String>,
}

/// [`Shared`], and the signal that the worker has become idle.
#[derive(Default)]
struct State {
    shared: Mutex<Shared>,
    /// Woken each time the busy mark is cleared.
    idle: Notify,
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clears the busy mark and wakes the calls waiting for their turn.
    fn set_idle(&self, mut s: std::sync::MutexGuard<'_, Shared>) {
        s.busy = None;
        drop(s);
        self.idle.notify_waiters();
    }
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
    state: Arc<State>,
}

/// Clears the busy mark however a call ends: with its answer handed over
/// ([`Done::finish`]), or alone when the call panicked.
struct Done(Option<Arc<State>>);

impl Done {
    fn new(state: Arc<State>) -> Self {
        Self(Some(state))
    }

    /// Hands `reply` over ([`deliver`]) and clears the busy mark under the
    /// same lock. Whoever finds the worker idle therefore also finds a late
    /// sample already kept: no round can start a new call in between, be
    /// answered, and be handed the older late sample at the next round
    /// (counters going backwards, which the health engine reads as a reset).
    fn finish(mut self, to: oneshot::Sender<Reply>, reply: Reply, took_us: u64) {
        let Some(state) = self.0.take() else { return };
        let mut s = state.lock();
        deliver(&mut s, to, reply, took_us);
        state.set_idle(s);
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.set_idle(state.lock());
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

/// Does the reprobe asked while a call ran, if one was, then runs
/// `request` on `device`; a panic of either is that call's failure
/// ([`Reply::failed`]), logged, and the worker goes on with the next call.
/// A reprobe that panicked is asked again before the next call: never
/// lost.
fn execute_guarded(
    index: u8,
    state: &State,
    device: &mut dyn GpuDevice,
    request: Request,
) -> Reply {
    let kind = request.kind();
    let is_reprobe = matches!(request, Request::Reprobe);
    // Whether a reprobe is under way, so a panic leaves it asked.
    let reprobing = std::cell::Cell::new(false);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reprobe_if_asked(&state.shared, device, &reprobing);
        reprobing.set(is_reprobe);
        let reply = execute(device, request);
        reprobing.set(false);
        reply
    }));
    run.unwrap_or_else(|payload| {
        let message = panic_message(&*payload);
        let mut s = state.lock();
        if reprobing.get() {
            s.reprobe = true;
        }
        if s.last_panic.as_deref() != Some(message.as_str()) {
            tracing::error!(
                gpu = index,
                "the GPU's worker panicked: {message}; the call failed and the worker goes on \
                 (a repeat of this message is not logged again)"
            );
            s.last_panic = Some(message.clone());
        }
        drop(s);
        Reply::failed(
            kind,
            GpuError::Failed {
                what: "GPU worker",
                detail: format!("the GPU's worker panicked: {message}"),
            },
        )
    })
}

/// The words of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
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
            state: Arc::default(),
        }
    }

    /// Whether its calls run on the caller's thread.
    pub fn is_inline(&self) -> bool {
        matches!(self.runner, Runner::Inline(_))
    }

    /// Starts the thread that owns `device`.
    pub fn spawn(index: u8, mut device: Box<dyn GpuDevice>) -> std::io::Result<Self> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let state = Arc::<State>::default();
        let mine = state.clone();
        std::thread::Builder::new()
            .name(format!("gpu-{index}"))
            .spawn(move || {
                for job in rx {
                    let done = Done::new(mine.clone());
                    let began = Instant::now();
                    let reply = execute_guarded(index, &mine, &mut *device, job.request);
                    let took = began.elapsed().as_micros() as u64;
                    // Idle as the answer goes out, so a caller answered
                    // now can call again at once.
                    done.finish(job.reply, reply, took);
                }
            })?;
        Ok(Self {
            index,
            runner: Runner::Thread(jobs),
            state,
        })
    }

    /// The GPU's index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// Whether a call has been in progress for longer than `deadline`.
    pub fn is_stuck(&self, deadline: Duration) -> bool {
        self.state
            .lock()
            .busy
            .is_some_and(|b| b.since.elapsed() > deadline)
    }

    /// How long its sample calls take, and the call in flight so far.
    pub fn call_times(&self) -> CallTimes {
        let s = self.state.lock();
        CallTimes {
            running_us: s.busy.map_or(0, |b| b.since.elapsed().as_micros() as u64),
            ..s.times
        }
    }

    /// Makes `request` once the worker is idle, and waits for its answer:
    /// the wait for its turn and the call together within `deadline`,
    /// counted from now.
    async fn call(&self, request: Request, deadline: Duration) -> Result<Reply, CallError> {
        let until = tokio::time::Instant::now() + deadline;
        self.take_turn(until).await?;
        self.run(request, until).await
    }

    /// Marks the worker busy with a call that is not a sample, once it is
    /// idle: at once, or when the call in progress (a late sample, or a
    /// call past its deadline) ends, if that is before `until`. A call that
    /// waits for its turn is made only while its caller still waits, never
    /// queued to be made when nobody does.
    async fn take_turn(&self, until: tokio::time::Instant) -> Result<(), CallError> {
        loop {
            let idle = self.state.idle.notified();
            tokio::pin!(idle);
            // Registered before the mark is read: a clearing in between
            // still wakes it.
            idle.as_mut().enable();
            let busy = {
                let mut s = self.state.lock();
                match s.busy {
                    Some(b) => b,
                    None => {
                        s.busy = Some(Busy {
                            since: Instant::now(),
                            sample: false,
                        });
                        return Ok(());
                    }
                }
            };
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return Err(CallError::Busy(busy));
            }
        }
    }

    /// Makes `request` on a worker already marked busy with it, and waits
    /// for its answer until `until`.
    async fn run(&self, request: Request, until: tokio::time::Instant) -> Result<Reply, CallError> {
        let jobs = match &self.runner {
            Runner::Thread(jobs) => jobs,
            Runner::Inline(device) => {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                return self.call_inline(device, request, left);
            }
        };
        let (tx, rx) = oneshot::channel();
        if jobs.send(Job { request, reply: tx }).is_err() {
            self.state.set_idle(self.state.lock());
            return Err(CallError::Failed(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread has ended".into(),
            }));
        }
        match tokio::time::timeout_at(until, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(CallError::Failed(GpuError::Failed {
                what: "GPU worker",
                detail: "the worker thread ended during the call".into(),
            })),
            Err(_) => Err(CallError::NoAnswer),
        }
    }

    /// Runs `request` here and now, and judges its answer by how long it
    /// took: within `deadline` it is answered, else it came after the
    /// deadline (a sample is kept for the next round). A panic of the
    /// device is that call's failure, as on a thread.
    fn call_inline(
        &self,
        device: &Mutex<Box<dyn GpuDevice>>,
        request: Request,
        deadline: Duration,
    ) -> Result<Reply, CallError> {
        let done = Done::new(self.state.clone());
        let began = Instant::now();
        let reply = {
            let mut d = device.lock().unwrap_or_else(|p| p.into_inner());
            execute_guarded(self.index, &self.state, &mut **d, request)
        };
        let took = began.elapsed();
        let (tx, rx) = oneshot::channel();
        // Past the deadline the caller stopped waiting: no receiver.
        let rx = (took <= deadline).then_some(rx);
        done.finish(tx, reply, took.as_micros() as u64);
        match rx {
            None => Err(CallError::NoAnswer),
            Some(mut rx) => rx.try_recv().map_err(|_| {
                CallError::Failed(GpuError::Failed {
                    what: "GPU worker",
                    detail: "no answer from an inline call".into(),
                })
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
        self.sample_dated(deadline).await.0
    }

    /// [`Worker::sample`], with when its answer came from the GPU: a late
    /// answer came up to a period before it is handed over, and its values
    /// are that old (now for the others).
    pub async fn sample_dated(&self, deadline: Duration) -> (Answer, Instant) {
        let until = tokio::time::Instant::now() + deadline;
        {
            let mut s = self.state.lock();
            if let Some((late, answered)) = s.late.take() {
                return (Answer::Late(late), answered);
            }
            if s.busy.is_some() {
                // Still running since the last round (or a limit call
                // past its deadline): no answer within a whole period.
                return (Answer::Now(Err(GpuError::Timeout)), Instant::now());
            }
            s.busy = Some(Busy {
                since: Instant::now(),
                sample: true,
            });
        }
        let answer = match self.run(Request::Sample, until).await {
            Ok(Reply::Sample(r)) => Answer::Now(r),
            Ok(_) => unreachable!("a sample request gets a sample reply"),
            Err(CallError::NoAnswer) => Answer::Pending,
            Err(e) => Answer::Now(Err(e.into())),
        };
        (answer, Instant::now())
    }

    /// Sets the power limit (after a call in progress, within `deadline`).
    pub async fn set_limit(&self, limit: Watts, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::SetLimit(limit), deadline).await? {
            Reply::Done(r) => r,
            _ => unreachable!("a set request gets a done reply"),
        }
    }

    /// Reads the power limit back (after a call in progress, within
    /// `deadline`).
    pub async fn read_limit(&self, deadline: Duration) -> Result<Watts, GpuError> {
        match self.call(Request::ReadLimit, deadline).await? {
            Reply::Limit(r) => r,
            _ => unreachable!("a read request gets a limit reply"),
        }
    }

    /// Has the device ask again what answered "not supported"
    /// ([`GpuDevice::reprobe`]): now (once a call in progress has ended),
    /// or, if the GPU is still busy at `deadline` or the reprobe itself
    /// answers after it, before its next call. It is never lost.
    pub async fn reprobe(&self, deadline: Duration) -> Result<(), GpuError> {
        match self.call(Request::Reprobe, deadline).await {
            Ok(Reply::Done(r)) => r,
            Ok(_) => unreachable!("a reprobe request gets a done reply"),
            Err(CallError::Busy(_) | CallError::NoAnswer) => {
                self.state.lock().reprobe = true;
                Ok(())
            }
            Err(CallError::Failed(e)) => Err(e),
        }
    }
}

/// Does the reprobe asked while a call ran, if one was; `reprobing` is set
/// while it runs.
fn reprobe_if_asked(
    shared: &Mutex<Shared>,
    device: &mut dyn GpuDevice,
    reprobing: &std::cell::Cell<bool>,
) {
    let asked = shared
        .lock()
        .map(|mut s| std::mem::take(&mut s.reprobe))
        .unwrap_or(false);
    if asked {
        reprobing.set(true);
        device.reprobe();
        reprobing.set(false);
    }
}

/// Hands `reply` to the caller, or keeps a sample whose caller stopped
/// waiting as the late answer; records how long a sample call took.
fn deliver(s: &mut Shared, to: oneshot::Sender<Reply>, reply: Reply, took_us: u64) {
    if matches!(reply, Reply::Sample(_)) {
        s.times.last_us = took_us;
        s.times.max_us = s.times.max_us.max(took_us);
        s.times.ended += 1;
    }
    // The caller may have given up; a sample is then kept for the next
    // round, anything else dropped (nobody waits for it).
    if let Err(Reply::Sample(r)) = to.send(reply) {
        s.times.late += 1;
        s.late = Some((r, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last and the longest sample call are known only once one ended:
    /// before, none (never a 0 that reads as the fastest GPU); the call in
    /// flight does not make them known.
    #[test]
    fn call_times_are_known_only_once_a_sample_call_ended() {
        let mut c = CallTimes {
            running_us: 5_000,
            ..CallTimes::default()
        };
        assert_eq!((c.known_last_us(), c.known_max_us()), (None, None));
        c.last_us = 0;
        c.max_us = 0;
        c.ended = 1;
        assert_eq!((c.known_last_us(), c.known_max_us()), (Some(0), Some(0)));
        c.last_us = 400;
        c.max_us = 900;
        c.ended = 7;
        assert_eq!(
            (c.known_last_us(), c.known_max_us()),
            (Some(400), Some(900))
        );
    }

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
                persistence: Some(true),
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
        // A deadline no stall of a loaded machine reaches: every call here
        // answers now.
        let d = Duration::from_secs(10);
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
        // The short deadline only for the calls meant to be late (the
        // device takes 30 ms, and a stall only makes them later); the
        // others get one no stall reaches.
        let short = Duration::from_millis(5);
        let long = Duration::from_secs(10);
        // A sample past its deadline is pending now and handed over at the
        // next round, with no new call made then.
        assert!(matches!(w.sample(short).await, Answer::Pending));
        *delay.lock().unwrap() = Duration::ZERO;
        // Handed over 300 ms after it answered: its values are that old.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (late, answered) = w.sample_dated(long).await;
        assert!(matches!(late, Answer::Late(Ok(_))), "{late:?}");
        assert!(answered.elapsed() >= Duration::from_millis(300));
        // A new call's answer is dated when it came, not when the late one
        // did.
        let asked = Instant::now();
        let (now, answered) = w.sample_dated(long).await;
        assert!(matches!(now, Answer::Now(Ok(_))), "{now:?}");
        assert!(
            answered >= asked,
            "a new answer dated {:?} before it was asked for",
            asked - answered
        );
        assert_eq!(w.call_times().late, 1);
        assert!(w.call_times().max_us >= 30_000);
        // A set past its deadline is a timeout (it took effect, as a
        // thread's late set does).
        *delay.lock().unwrap() = Duration::from_millis(30);
        assert_eq!(w.set_limit(Watts(300), short).await, Err(GpuError::Timeout));
        assert_eq!(
            w.read_limit(Duration::from_secs(1)).await.unwrap(),
            Watts(300)
        );
    }

    #[tokio::test]
    async fn a_device_that_may_block_keeps_its_thread() {
        /// Its sample blocks until the test lets it answer.
        struct Blocking(std::sync::mpsc::Receiver<()>);
        impl GpuDevice for Blocking {
            fn describe(&mut self) -> Result<GpuInfo, GpuError> {
                Err(GpuError::NotSupported)
            }
            fn sample(&mut self) -> Result<GpuSample, GpuError> {
                let _ = self.0.recv();
                Ok(GpuSample::default())
            }
            fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
                Ok(())
            }
            fn power_limit(&mut self) -> Result<Watts, GpuError> {
                Ok(Watts(700))
            }
        }
        let (go, blocked) = std::sync::mpsc::channel();
        let w = Worker::start(0, Box::new(Blocking(blocked))).unwrap();
        assert!(!w.is_inline());
        // Pending while the device still blocks (it answers only when let
        // go below): the round did not wait for it.
        let sample =
            tokio::time::timeout(Duration::from_secs(10), w.sample(Duration::from_millis(10)))
                .await;
        assert!(
            matches!(sample, Ok(Answer::Pending)),
            "{sample:?} (Err: waited for the blocked device)"
        );
        assert!(w.is_stuck(Duration::from_millis(5)));
        // The call in flight shows its age while it hangs.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let running = w.call_times().running_us;
        assert!(running >= 100_000, "{running} µs");
        assert_eq!(w.call_times().last_us, 0, "not ended");
        go.send(()).unwrap();
    }

    /// A device on a thread whose samples wait for the test to let each
    /// one answer; its limit calls answer at once, or, once `hang_sets` is
    /// set, sets never answer.
    struct Gated {
        go: std::sync::mpsc::Receiver<()>,
        limit: Watts,
        sets: Arc<Mutex<u32>>,
        hang_sets: Arc<Mutex<bool>>,
    }

    impl GpuDevice for Gated {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            Err(GpuError::NotSupported)
        }
        fn sample(&mut self) -> Result<GpuSample, GpuError> {
            let _ = self.go.recv();
            Ok(GpuSample {
                power_limit: self.limit,
                ..GpuSample::default()
            })
        }
        fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
            *self.sets.lock().unwrap() += 1;
            if *self.hang_sets.lock().unwrap() {
                let _ = self.go.recv();
            }
            self.limit = limit;
            Ok(())
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Ok(self.limit)
        }
    }

    struct GatedWorker {
        w: Worker,
        go: std::sync::mpsc::Sender<()>,
        sets: Arc<Mutex<u32>>,
        hang_sets: Arc<Mutex<bool>>,
    }

    fn gated() -> GatedWorker {
        let (go, rx) = std::sync::mpsc::channel();
        let sets = Arc::new(Mutex::new(0));
        let hang_sets = Arc::new(Mutex::new(false));
        let d = Gated {
            go: rx,
            limit: Watts(700),
            sets: sets.clone(),
            hang_sets: hang_sets.clone(),
        };
        let w = Worker::start(1, Box::new(d)).unwrap();
        assert!(!w.is_inline());
        GatedWorker {
            w,
            go,
            sets,
            hang_sets,
        }
    }

    #[tokio::test]
    async fn a_limit_asked_during_a_late_sample_waits_for_it_and_is_set() {
        let g = gated();
        let short = Duration::from_millis(5);
        let long = Duration::from_secs(30);
        // The round's sample is late: still running when the round ends.
        assert!(matches!(g.w.sample(short).await, Answer::Pending));
        // A lease's cap arrives meanwhile: it waits for its turn...
        let mut set = Box::pin(g.w.set_limit(Watts(300), long));
        let first = futures::FutureExt::now_or_never(&mut set);
        assert!(first.is_none(), "answered at once: {first:?}");
        assert_eq!(*g.sets.lock().unwrap(), 0);
        // ...and is set once the late sample has answered.
        g.go.send(()).unwrap();
        assert_eq!(set.await, Ok(()));
        assert_eq!(*g.sets.lock().unwrap(), 1);
        assert_eq!(g.w.read_limit(long).await, Ok(Watts(300)));
        // The late sample is the next round's answer, then new calls.
        match g.w.sample(long).await {
            Answer::Late(Ok(s)) => assert_eq!(s.power_limit, Watts(700)),
            other => panic!("{other:?}"),
        }
        g.go.send(()).unwrap();
        match g.w.sample(long).await {
            Answer::Now(Ok(s)) => assert_eq!(s.power_limit, Watts(300)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_call_never_made_says_the_gpu_was_busy_and_one_made_did_not_answer() {
        let g = gated();
        let short = Duration::from_millis(5);
        assert!(matches!(g.w.sample(short).await, Answer::Pending));
        // Still busy with the late sample at the set's deadline: not made.
        let e = g.w.set_limit(Watts(300), short).await.unwrap_err();
        assert!(
            e.to_string().contains("still busy with a late sample"),
            "{e}"
        );
        assert_eq!(*g.sets.lock().unwrap(), 0);
        g.go.send(()).unwrap();
        // (A read waits for the late sample to be kept.)
        assert_eq!(
            g.w.read_limit(Duration::from_secs(30)).await,
            Ok(Watts(700))
        );
        assert!(matches!(g.w.sample(short).await, Answer::Late(Ok(_))));
        // A set made that hangs did not answer; a read behind it is not
        // made, and says so.
        *g.hang_sets.lock().unwrap() = true;
        let e = g.w.set_limit(Watts(300), short).await.unwrap_err();
        assert_eq!(e, GpuError::Timeout);
        assert_eq!(e.to_string(), "did not answer before its deadline");
        let e = g.w.read_limit(short).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("still busy with an earlier call that did not answer"),
            "{e}"
        );
        // A reprobe asked then is kept, not lost.
        assert_eq!(g.w.reprobe(short).await, Ok(()));
        assert!(g.w.state.lock().reprobe);
        g.go.send(()).unwrap();
    }

    /// A device on a thread whose first sample panics and whose later
    /// ones answer.
    struct PanicsOnce {
        samples: u32,
    }

    impl GpuDevice for PanicsOnce {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            Err(GpuError::NotSupported)
        }
        fn sample(&mut self) -> Result<GpuSample, GpuError> {
            self.samples += 1;
            if self.samples == 1 {
                panic!("attempt to add with overflow");
            }
            Ok(GpuSample::default())
        }
        fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
            Ok(())
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Ok(Watts(700))
        }
    }

    #[tokio::test]
    async fn a_panic_fails_that_call_alone_and_the_thread_goes_on() {
        let w = Worker::start(2, Box::new(PanicsOnce { samples: 0 })).unwrap();
        assert!(!w.is_inline());
        let long = Duration::from_secs(30);
        match w.sample(long).await {
            Answer::Now(Err(e)) => assert_eq!(
                e.to_string(),
                GpuError::Failed {
                    what: "GPU worker",
                    detail: "the GPU's worker panicked: attempt to add with overflow".into(),
                }
                .to_string()
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.sample(long).await, Answer::Now(Ok(_))));
        assert_eq!(w.read_limit(long).await, Ok(Watts(700)));
        assert!(!w.is_stuck(Duration::ZERO));
    }

    /// A device whose first reprobe panics; it counts its reprobes.
    struct ReprobePanicsOnce {
        reprobes: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl GpuDevice for ReprobePanicsOnce {
        fn describe(&mut self) -> Result<GpuInfo, GpuError> {
            Err(GpuError::NotSupported)
        }
        fn sample(&mut self) -> Result<GpuSample, GpuError> {
            Ok(GpuSample::default())
        }
        fn set_power_limit(&mut self, _: Watts) -> Result<(), GpuError> {
            Ok(())
        }
        fn power_limit(&mut self) -> Result<Watts, GpuError> {
            Ok(Watts(700))
        }
        fn reprobe(&mut self) {
            let n = self
                .reprobes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n == 0 {
                panic!("reprobe failed");
            }
        }
    }

    /// A reprobe that panics fails its call and is done again before the
    /// next one: never lost.
    #[tokio::test]
    async fn a_reprobe_that_panics_is_asked_again_before_the_next_call() {
        let reprobes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let w = Worker::start(
            1,
            Box::new(ReprobePanicsOnce {
                reprobes: reprobes.clone(),
            }),
        )
        .unwrap();
        let long = Duration::from_secs(30);
        let e = w.reprobe(long).await.unwrap_err();
        assert!(e.to_string().contains("reprobe failed"), "{e}");
        assert!(w.state.lock().reprobe, "left asked");
        assert!(matches!(w.sample(long).await, Answer::Now(Ok(_))));
        assert_eq!(reprobes.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(!w.state.lock().reprobe);
    }

    #[tokio::test]
    async fn an_inline_panic_fails_that_call_alone() {
        struct InMemory(PanicsOnce);
        impl GpuDevice for InMemory {
            fn describe(&mut self) -> Result<GpuInfo, GpuError> {
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
            fn answers_in_memory(&self) -> bool {
                true
            }
        }
        let w = Worker::start(2, Box::new(InMemory(PanicsOnce { samples: 0 }))).unwrap();
        assert!(w.is_inline());
        let long = Duration::from_secs(30);
        match w.sample(long).await {
            Answer::Now(Err(e)) => assert!(
                e.to_string()
                    .contains("the GPU's worker panicked: attempt to add with overflow"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.sample(long).await, Answer::Now(Ok(_))));
    }
}

//! The XID watch's thread ([`keep_watching`]: its restarts, with backoff,
//! and the retry of a GPU refused for a reason that may pass, on a timer
//! of its own, [`WaitEnd`]), and what one start of it found, kept apart
//! from NVML so it can be tested alone: which GPUs the event set took ([`Registrations`]:
//! the watch is up only when it took every GPU, and a GPU it refused is
//! named with NVML's answer), how the GPUs are put on one event set when
//! a refused registration releases it ([`register_all`]), the first
//! start's answers handed to the source's caller ([`FirstStart`]), and
//! the events its wait could not read ([`Unread`]: said in the log, at
//! most once a minute).
//!
//! Glossary:
//! - *refused*: a GPU whose handle, supported event types or registration
//!   failed; its XIDs are not seen. Refused for a reason that *may pass*:
//!   anything but "not supported" (an unknown error, a timeout of a busy
//!   GPU System Processor, a lost GPU); such a GPU is asked again.
//! - *released*: NVML freed the event set (a failed
//!   `nvmlDeviceRegisterEvents` does, in `nvml-wrapper`), with every GPU
//!   registered on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Deliver, NvmlApi, NvmlFailure, NvmlResult, WATCH_RETRY_FIRST, WATCH_RETRY_MAX};
use crate::gpu::{XidEvent, XidReport};

/// The registration answers of one start of the watch.
#[derive(Debug)]
pub(super) struct Registrations {
    /// GPUs asked.
    expected: usize,
    /// Answers so far.
    answered: usize,
    /// The GPUs refused, with why.
    refused: Vec<(u32, NvmlFailure)>,
}

impl Registrations {
    /// A start that registers `expected` GPUs.
    pub(super) fn new(expected: usize) -> Self {
        Self {
            expected,
            answered: 0,
            refused: Vec::new(),
        }
    }

    /// Records `gpu`'s answer. Once every GPU has answered: `Ok` when the
    /// set took them all (the watch is up), else why it is down, naming
    /// each GPU refused and NVML's answer.
    pub(super) fn answer(
        &mut self,
        gpu: u32,
        r: Result<(), NvmlFailure>,
    ) -> Option<Result<(), String>> {
        self.answered += 1;
        if let Err(e) = r {
            self.refused.push((gpu, e));
        }
        if self.answered != self.expected {
            return None;
        }
        Some(match self.refused() {
            None => Ok(()),
            Some(names) if self.refused.len() == self.expected => Err(format!(
                "no GPU could be registered for XID events: {names}"
            )),
            Some(names) => Err(format!(
                "not registered for XID events, so their XIDs are not seen: {names}; \
                 the other GPUs are watched"
            )),
        })
    }

    /// Whether a GPU was refused for a reason that may pass: anything but
    /// "not supported", which is the GPU's own and stays. Such a GPU is
    /// asked again.
    pub(super) fn passing(&self) -> bool {
        let passes = |(_, e): &(u32, NvmlFailure)| *e != NvmlFailure::NotSupported;
        self.refused.iter().any(passes)
    }

    /// The GPUs refused so far, each with NVML's answer (`GPU 1 (…), …`);
    /// `None` when none was.
    pub(super) fn refused(&self) -> Option<String> {
        if self.refused.is_empty() {
            return None;
        }
        let each: Vec<String> = self
            .refused
            .iter()
            .map(|(gpu, e)| format!("GPU {gpu} ({e:?})"))
            .collect();
        Some(each.join(", "))
    }
}

/// NVML's event sets, as [`register_all`] uses them.
pub(super) trait EventSets {
    /// An event set.
    type Set;
    /// `nvmlEventSetCreate`.
    fn create(&self) -> NvmlResult<Self::Set>;
    /// Registers `gpu` for critical XIDs on `set`: the set back, or NVML's
    /// answer with the set back unless NVML released it.
    fn register(
        &self,
        gpu: u32,
        set: Self::Set,
    ) -> Result<Self::Set, (Option<Self::Set>, NvmlFailure)>;
}

/// Puts every GPU of `gpus` it can on one event set, telling `registered`
/// each GPU's answer. A refusal that released the set leaves that GPU out:
/// a new set is made, the GPUs taken so far are registered on it again,
/// and the rest are asked. Fails when no set can be made, when a GPU taken
/// before is refused on the new set, or when no GPU was taken (a set with
/// no GPU would wait for nothing, and never say so).
pub(super) fn register_all<E: EventSets>(
    api: &E,
    gpus: &[u32],
    registered: &mut dyn FnMut(u32, NvmlResult<()>),
) -> NvmlResult<E::Set> {
    let mut set = api.create()?;
    let mut taken = Vec::new();
    for &gpu in gpus {
        match api.register(gpu, set) {
            Ok(kept) => {
                set = kept;
                taken.push(gpu);
                registered(gpu, Ok(()));
            }
            Err((Some(kept), e)) => {
                set = kept;
                registered(gpu, Err(e));
            }
            Err((None, e)) => {
                registered(gpu, Err(e));
                set = register_again(api, &taken)?;
            }
        }
    }
    if taken.is_empty() && !gpus.is_empty() {
        return Err(NvmlFailure::Other(
            "no GPU could be registered for XID events".into(),
        ));
    }
    Ok(set)
}

/// A new event set with `taken` on it, after NVML released the one they
/// were on.
fn register_again<E: EventSets>(api: &E, taken: &[u32]) -> NvmlResult<E::Set> {
    let mut set = api.create()?;
    for &gpu in taken {
        set = api.register(gpu, set).map_err(|(_, e)| {
            NvmlFailure::Other(format!(
                "NVML released the XID event set after a refused registration, and GPU \
                 {gpu}, registered before, was refused on a new one ({e:?})"
            ))
        })?;
    }
    Ok(set)
}

/// The first start's registration answers, handed from the watch thread
/// to the source's `watch_xids`, which waits for them a while and goes on
/// without them past that (saying the watch down, so that a late "up"
/// comes after it).
#[derive(Debug, Default)]
pub(super) struct FirstStart {
    state: Mutex<First>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct First {
    /// The GPUs refused so far, with NVML's answer.
    refused: Vec<(u32, NvmlFailure)>,
    /// Every GPU answered, or the first watch ended before.
    over: bool,
    /// The caller stopped waiting before that.
    abandoned: bool,
}

impl FirstStart {
    fn lock(&self) -> std::sync::MutexGuard<'_, First> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `gpu`'s registration answer.
    pub(super) fn answer(&self, gpu: u32, r: &NvmlResult<()>) {
        if let Err(e) = r {
            self.lock().refused.push((gpu, e.clone()));
        }
    }

    /// The first start is over: every GPU answered, or its watch ended.
    /// Returns whether the caller had stopped waiting before (and said
    /// the watch down): then the watch thread says what comes next.
    pub(super) fn over(&self) -> bool {
        let mut s = self.lock();
        s.over = true;
        self.changed.notify_all();
        s.abandoned
    }

    /// Waits at most `limit` for the first start to be over: the GPUs it
    /// refused. Past `limit`, runs `gave_up` (which says the watch down)
    /// before the watch thread can see that the caller went on, and
    /// returns `None`.
    pub(super) fn wait(
        &self,
        limit: Duration,
        gave_up: impl FnOnce(),
    ) -> Option<Vec<(u32, NvmlFailure)>> {
        let s = self.lock();
        let (mut s, _) = self
            .changed
            .wait_timeout_while(s, limit, |s| !s.over)
            .unwrap_or_else(|e| e.into_inner());
        if s.over {
            return Some(std::mem::take(&mut s.refused));
        }
        gave_up();
        s.abandoned = true;
        None
    }
}

/// The shortest time between two lines about unreadable events.
pub(super) const UNREAD_SAID_EVERY: Duration = Duration::from_secs(60);

/// Events of the XID wait that could not be read (no GPU index, no XID
/// value): each is dropped, and counted; the first is said at once, the
/// others at most once every [`UNREAD_SAID_EVERY`], with their count.
#[derive(Debug, Default)]
pub(super) struct Unread {
    /// Since this watch started.
    total: u64,
    /// Since the last line.
    unsaid: u64,
    /// When the last line was said.
    said: Option<Instant>,
}

impl Unread {
    /// One more event dropped at `now`, for `why`; the line to log, when
    /// one is due.
    pub(super) fn dropped(&mut self, now: Instant, why: &str) -> Option<String> {
        self.total += 1;
        self.unsaid += 1;
        if self
            .said
            .is_some_and(|t| now.saturating_duration_since(t) < UNREAD_SAID_EVERY)
        {
            return None;
        }
        let line = format!(
            "NVML XID watch: an event could not be read ({why}), dropped; {} dropped since \
             the last such line, {} since the watch started",
            self.unsaid, self.total
        );
        self.said = Some(now);
        self.unsaid = 0;
        Some(line)
    }
}

/// How a start of the watch ended, when `stop` did not end it.
#[derive(Debug)]
enum Ended {
    /// Its wait failed or returned: why, and whether the start said the
    /// watch down already.
    Failed(String, bool),
    /// Its wait was ended to ask again the GPUs it refused for a reason
    /// that may pass (named, with NVML's answers).
    Retry(String),
}

/// Runs the XID watch until `stop`, restarting it with backoff whenever it
/// ends: each end is sent as [`XidEvent::WatchDown`]. A restart that
/// registered every GPU is sent as [`XidEvent::WatchUp`]; one that left a
/// GPU out (its handle, its event types or its registration failed) as
/// [`XidEvent::WatchDown`] naming each GPU left out and NVML's answer,
/// while the wait goes on for the GPUs registered. A GPU left out for any
/// reason but "not supported" is asked again: the wait ends after the
/// backoff and the watch restarts at once, until a start registers every
/// GPU (a GPU that does not support XID events keeps the watch down until
/// the wait ends otherwise). The first start's answers go to `first`; a
/// first start that registers every GPU after its caller stopped waiting
/// (and said the watch down) is sent as `WatchUp` too.
pub(super) fn keep_watching<A: NvmlApi>(
    api: &A,
    out: Deliver<'_>,
    first: &FirstStart,
    stop: &AtomicBool,
) {
    let mut wait = WATCH_RETRY_FIRST;
    let mut restarts = 0u32;
    // The watch down as last said: a retry refused alike says nothing new.
    let mut said = None;
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let start = (restarts == 0).then_some(first);
        match watch_once(api, out, start, stop, wait, &mut said) {
            None => return,
            // The backoff was spent waiting on the GPUs registered.
            Some(Ended::Retry(names)) => {
                tracing::debug!("NVML XID watch: registering again, for {names}");
            }
            Some(Ended::Failed(why, said_down)) => {
                tracing::error!("NVML XID watch ended ({why}); restarting it in {wait:?}");
                // A start that already said the watch is down (a GPU
                // refused) is not said again.
                if !said_down && out.sink.send(XidEvent::WatchDown(why)).is_err() {
                    return;
                }
                said = None;
                // A watch that ran for a while earns a quick restart.
                if began.elapsed() > WATCH_RETRY_MAX {
                    wait = WATCH_RETRY_FIRST;
                }
                sleep_unless(stop, wait);
            }
        }
        wait = (wait * 2).min(WATCH_RETRY_MAX);
        restarts += 1;
    }
}

/// One start of the XID watch, over the GPUs NVML counts now, until it
/// ends; `None` when `stop` ended it. `first`: this is the first start,
/// whose answers go there too. A GPU refused for a reason that may pass
/// ends the wait `retry_in` after the answers ([`WaitEnd`]).
fn watch_once<A: NvmlApi>(
    api: &A,
    out: Deliver<'_>,
    first: Option<&FirstStart>,
    stop: &AtomicBool,
    retry_in: Duration,
    said: &mut Option<String>,
) -> Option<Ended> {
    let gpus: Result<Vec<u32>, String> = match api.device_count() {
        Ok(0) => Err("NVML counts no GPU".into()),
        Ok(n) => Ok((0..n.min(loopwarden_protocol::MAX_GPUS as u32)).collect()),
        Err(e) => Err(format!("nvmlDeviceGetCount failed: {e:?}")),
    };
    let mut answers = Registrations::new(gpus.as_ref().map_or(0, Vec::len));
    let end = WaitEnd::default();
    // This start already said the watch is down.
    let mut said_down = false;
    let mut registered = |gpu: u32, r: NvmlResult<()>| {
        if let Some(f) = first {
            f.answer(gpu, &r);
        }
        if let Some(all) = answers.answer(gpu, r) {
            if answers.passing() {
                end.retry_at(Instant::now() + retry_in);
            }
            said_down |= say_answers(out.sink, first, all, said);
        }
    };
    let outcome = match &gpus {
        Ok(gpus) => end
            .wait_with(stop, |flag| {
                api.watch_xids(
                    gpus,
                    &mut registered,
                    &mut |gpu, xid| out.xid(gpu, xid),
                    flag,
                )
            })
            .map_err(|e| format!("{e:?}")),
        Err(why) => Err(why.clone()),
    };
    // A first start that ended before every GPU answered is over too.
    if let Some(f) = first {
        f.over();
    }
    if stop.load(Ordering::Relaxed) {
        return None;
    }
    match (outcome, answers.refused()) {
        (Ok(()), Some(names)) if end.retry_due(Instant::now()) => Some(Ended::Retry(names)),
        (outcome, names) => {
            let mut why = outcome
                .err()
                .unwrap_or_else(|| "the event wait returned".into());
            if let Some(names) = names {
                why.push_str(&format!("; not registered: {names}"));
            }
            Some(Ended::Failed(why, said_down))
        }
    }
}

/// Says what a start's registration answers found, `all` (every GPU
/// answered): the watch up, or down and why, unless `said` (the watch
/// down as last said, kept here) says it already: a GPU refused again
/// alike at each retry is said once, not every minute. Returns whether
/// the watch is down. `first`: the first start, whose caller took the
/// watch as up where it waited for the answers.
fn say_answers(
    sink: &crate::xid_queue::XidSink,
    first: Option<&FirstStart>,
    all: Result<(), String>,
    said: &mut Option<String>,
) -> bool {
    // `Some(false)`: the first start, its caller took the watch as up.
    let late = first.map(FirstStart::over);
    match all {
        Ok(()) if late == Some(false) => {
            *said = None;
            false
        }
        Ok(()) => {
            *said = None;
            let _ = sink.send(XidEvent::WatchUp);
            false
        }
        Err(why) if said.as_deref() == Some(why.as_str()) => true,
        Err(why) => {
            *said = Some(why.clone());
            let how = if first.is_some() {
                "started"
            } else {
                "restarted"
            };
            tracing::error!("NVML XID watch {how}, {why}");
            let _ = sink.send(XidEvent::WatchDown(why));
            true
        }
    }
}

impl Deliver<'_> {
    /// An XID of `gpu`: to the queue, and its slow counters (retired
    /// pages, remapped rows) are read at its next sample.
    fn xid(&self, gpu: u32, xid: u64) {
        if let Some(n) = self.nudges.get(gpu as usize) {
            n.store(true, Ordering::Relaxed);
        }
        let report = XidReport {
            gpu: gpu as u8,
            xid: xid.min(u16::MAX as u64) as u16,
        };
        let _ = self.sink.send(XidEvent::Xid(report));
    }
}

/// Sleeps `d`, or less if `stop` is set meanwhile.
fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How often [`WaitEnd`] looks at the agent's stop and at the time.
const WAIT_END_EVERY: Duration = Duration::from_millis(50);

/// The flag one start's wait ends on: set once the agent stops, or once
/// the retry of the GPUs it refused is due. NVML's wait only looks at a
/// flag; a thread of its own sets this one.
#[derive(Debug, Default)]
struct WaitEnd {
    flag: AtomicBool,
    /// When the GPUs refused are to be asked again.
    retry: Mutex<Option<Instant>>,
    /// The wait is over: the thread setting the flag ends.
    over: AtomicBool,
}

impl WaitEnd {
    /// The GPUs refused are to be asked again at `at`.
    fn retry_at(&self, at: Instant) {
        *self.retry.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// Whether a retry was asked for and is due at `now`.
    fn retry_due(&self, now: Instant) -> bool {
        let retry = *self.retry.lock().unwrap_or_else(|e| e.into_inner());
        retry.is_some_and(|at| now >= at)
    }

    /// Runs `wait` on this flag, set by a thread of its own when `stop` is
    /// or the retry is due. Where that thread cannot start, `wait` runs on
    /// `stop` itself (said): the GPUs refused wait for the next end.
    fn wait_with<T>(&self, stop: &AtomicBool, wait: impl FnOnce(&AtomicBool) -> T) -> T {
        std::thread::scope(|s| {
            let follow = std::thread::Builder::new()
                .name("nvml-xid-end".into())
                .spawn_scoped(s, || self.follow(stop));
            let flag = match follow {
                Ok(_) => &self.flag,
                Err(e) => {
                    tracing::error!(
                        "NVML XID watch: its timer thread did not start ({e}); a GPU refused \
                         is asked again only when the wait ends otherwise"
                    );
                    stop
                }
            };
            let out = wait(flag);
            self.over.store(true, Ordering::Relaxed);
            out
        })
    }

    /// Sets the flag when `stop` is set or the retry is due; returns then,
    /// or once the wait is over.
    fn follow(&self, stop: &AtomicBool) {
        while !self.over.load(Ordering::Relaxed) {
            if stop.load(Ordering::Relaxed) || self.retry_due(Instant::now()) {
                self.flag.store(true, Ordering::Relaxed);
                return;
            }
            std::thread::sleep(WAIT_END_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_is_up_only_when_every_gpu_was_registered() {
        let mut r = Registrations::new(2);
        assert_eq!(r.answer(0, Ok(())), None);
        assert_eq!(r.answer(1, Ok(())), Some(Ok(())));

        let mut r = Registrations::new(3);
        assert_eq!(r.answer(0, Ok(())), None);
        assert_eq!(r.answer(1, Err(NvmlFailure::NotSupported)), None);
        let Some(Err(why)) = r.answer(2, Ok(())) else {
            panic!("one GPU refused: the watch is down");
        };
        assert!(why.contains("GPU 1 (NotSupported)"), "{why}");
        assert!(!why.contains("GPU 0") && !why.contains("GPU 2"), "{why}");
        assert!(why.contains("other GPUs are watched"), "{why}");
    }

    #[test]
    fn a_start_that_registered_no_gpu_says_so_naming_each() {
        let mut r = Registrations::new(2);
        assert_eq!(r.answer(0, Err(NvmlFailure::GpuLost)), None);
        let unknown = NvmlFailure::Other("Unknown Error".into());
        let Some(Err(why)) = r.answer(1, Err(unknown)) else {
            panic!("no GPU registered: the watch is down");
        };
        assert!(why.starts_with("no GPU could be registered"), "{why}");
        assert!(why.contains("GPU 0 (GpuLost)"), "{why}");
        assert!(why.contains("GPU 1 (Other(\"Unknown Error\"))"), "{why}");
        assert!(!why.contains("watched"), "{why}");
    }

    #[test]
    fn only_a_refusal_other_than_not_supported_is_asked_again() {
        let mut r = Registrations::new(3);
        r.answer(0, Ok(()));
        r.answer(1, Err(NvmlFailure::NotSupported));
        assert!(!r.passing(), "not supported is the GPU's own");
        r.answer(2, Err(NvmlFailure::Timeout));
        assert!(r.passing(), "a busy GPU System Processor may answer later");
    }

    #[test]
    fn a_wait_ends_once_its_retry_is_due_or_at_stop() {
        let t0 = Instant::now();
        let end = WaitEnd::default();
        assert!(!end.retry_due(t0 + Duration::from_secs(3600)), "none asked");
        end.retry_at(t0 + Duration::from_secs(2));
        assert!(!end.retry_due(t0 + Duration::from_secs(1)));
        assert!(end.retry_due(t0 + Duration::from_secs(2)));

        // The wait is ended by its flag: at the retry, or at stop.
        let stop = AtomicBool::new(false);
        let end = WaitEnd::default();
        end.retry_at(Instant::now());
        assert!(flag_set(&end, &stop), "the retry ended the wait");
        let stop = AtomicBool::new(true);
        assert!(flag_set(&WaitEnd::default(), &stop), "stop ended the wait");
    }

    /// Waits (30 s at most) on `end`'s flag: whether it was set.
    fn flag_set(end: &WaitEnd, stop: &AtomicBool) -> bool {
        end.wait_with(stop, |flag| {
            let limit = Instant::now() + Duration::from_secs(30);
            while !flag.load(Ordering::Relaxed) && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(5));
            }
            flag.load(Ordering::Relaxed)
        })
    }

    #[test]
    fn refusals_before_the_set_failed_are_named() {
        let mut r = Registrations::new(3);
        assert_eq!(r.refused(), None);
        r.answer(0, Ok(()));
        r.answer(1, Err(NvmlFailure::NoPermission));
        assert_eq!(r.refused().as_deref(), Some("GPU 1 (NoPermission)"));
    }

    /// Event sets as NVML keeps them: each set's GPUs, by set number; a
    /// refused registration releases its set (as `nvml-wrapper` does),
    /// so the GPUs on it are no longer watched.
    #[derive(Default)]
    struct FakeSets {
        sets: std::cell::RefCell<Vec<Option<Vec<u32>>>>,
        /// GPUs whose registration is refused, with the answer.
        refusing: Vec<(u32, NvmlFailure)>,
        /// GPUs refused only once registered before (a GPU lost meanwhile).
        refusing_again: Vec<u32>,
    }

    impl EventSets for FakeSets {
        type Set = usize;
        fn create(&self) -> NvmlResult<usize> {
            let mut sets = self.sets.borrow_mut();
            sets.push(Some(Vec::new()));
            Ok(sets.len() - 1)
        }
        fn register(&self, gpu: u32, set: usize) -> Result<usize, (Option<usize>, NvmlFailure)> {
            let mut sets = self.sets.borrow_mut();
            let on = sets[set]
                .as_mut()
                .expect("a set NVML released is never used");
            let again = self.refusing_again.contains(&gpu) && set > 0;
            let refused = self.refusing.iter().find(|(g, _)| *g == gpu);
            if let Some(e) = refused
                .map(|(_, e)| e.clone())
                .or(again.then_some(NvmlFailure::GpuLost))
            {
                sets[set] = None;
                return Err((None, e));
            }
            on.push(gpu);
            Ok(set)
        }
    }

    /// Registers `gpus` on `fake`: the GPUs on the set returned (or why
    /// none), and each answer.
    fn register(fake: &FakeSets, gpus: &[u32]) -> (NvmlResult<Vec<u32>>, Vec<(u32, bool)>) {
        let mut answers = Vec::new();
        let set = register_all(fake, gpus, &mut |gpu, r| answers.push((gpu, r.is_ok())));
        let on = set.map(|s| fake.sets.borrow()[s].clone().expect("a live set"));
        (on, answers)
    }

    #[test]
    fn a_refusal_that_releases_the_set_leaves_only_that_gpu_out() {
        let fake = FakeSets {
            refusing: vec![(1, NvmlFailure::Other("Unknown Error".into()))],
            ..FakeSets::default()
        };
        let (on, answers) = register(&fake, &[0, 1, 2, 3]);
        assert_eq!(on, Ok(vec![0, 2, 3]), "GPU 0 taken again, 2 and 3 asked");
        let answers_expected = vec![(0, true), (1, false), (2, true), (3, true)];
        assert_eq!(answers, answers_expected);

        // Refused first and last: the others are watched.
        let fake = FakeSets {
            refusing: vec![(0, NvmlFailure::GpuLost), (3, NvmlFailure::NoPermission)],
            ..FakeSets::default()
        };
        assert_eq!(register(&fake, &[0, 1, 2, 3]).0, Ok(vec![1, 2]));
    }

    #[test]
    fn no_set_when_no_gpu_is_taken_or_a_gpu_taken_is_refused_on_the_new_set() {
        let fake = FakeSets {
            refusing: vec![(0, NvmlFailure::GpuLost), (1, NvmlFailure::GpuLost)],
            ..FakeSets::default()
        };
        let (on, answers) = register(&fake, &[0, 1]);
        assert!(
            matches!(&on, Err(NvmlFailure::Other(w)) if w.starts_with("no GPU")),
            "{on:?}"
        );
        assert_eq!(answers, vec![(0, false), (1, false)]);

        let fake = FakeSets {
            refusing: vec![(1, NvmlFailure::GpuLost)],
            refusing_again: vec![0],
            ..FakeSets::default()
        };
        let (on, answers) = register(&fake, &[0, 1, 2]);
        let Err(NvmlFailure::Other(why)) = on else {
            panic!("GPU 0 lost meanwhile: {on:?}");
        };
        assert!(why.contains("GPU 0, registered before"), "{why}");
        assert_eq!(answers, vec![(0, true), (1, false)], "GPU 2 is not asked");
    }

    #[test]
    fn the_first_answers_reach_a_caller_that_waits() {
        let first = FirstStart::default();
        first.answer(0, &Ok(()));
        first.answer(1, &Err(NvmlFailure::NotSupported));
        assert!(!first.over(), "the caller waits: it takes the answers");
        let refused = first.wait(Duration::from_secs(5), || panic!("not given up"));
        assert_eq!(refused, Some(vec![(1, NvmlFailure::NotSupported)]));
    }

    #[test]
    fn a_caller_that_gave_up_says_so_and_the_late_end_is_told() {
        let first = FirstStart::default();
        let mut said = false;
        assert_eq!(first.wait(Duration::ZERO, || said = true), None);
        assert!(said, "the caller said the watch down");
        first.answer(0, &Ok(()));
        assert!(first.over(), "the watch thread says it up itself");
    }

    #[test]
    fn unreadable_events_are_said_at_once_then_once_a_minute_with_their_count() {
        let t0 = Instant::now();
        let mut u = Unread::default();
        let first = u.dropped(t0, "no GPU index").expect("the first is said");
        assert!(first.contains("(no GPU index)"), "{first}");
        assert!(first.contains("1 dropped since the last"), "{first}");
        for s in 1..60 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(u.dropped(at, "no XID value"), None, "{s} s");
        }
        let next = u
            .dropped(t0 + UNREAD_SAID_EVERY, "no XID value")
            .expect("a minute later");
        assert!(next.contains("60 dropped since the last"), "{next}");
        assert!(next.contains("61 since the watch started"), "{next}");
    }
}

//! What one start of the XID watch found, kept apart from NVML so it can
//! be tested alone: which GPUs the event set took ([`Registrations`]:
//! the watch is up only when it took every GPU, and a GPU it refused is
//! named with NVML's answer), and the events its wait could not read
//! ([`Unread`]: said in the log, at most once a minute).
//!
//! Glossary:
//! - *refused*: a GPU whose handle, supported event types or registration
//!   failed; its XIDs are not seen.

use std::time::{Duration, Instant};

use super::NvmlFailure;

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
    fn refusals_before_the_set_failed_are_named() {
        let mut r = Registrations::new(3);
        assert_eq!(r.refused(), None);
        r.answer(0, Ok(()));
        r.answer(1, Err(NvmlFailure::NoPermission));
        assert_eq!(r.refused().as_deref(), Some("GPU 1 (NoPermission)"));
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

//! The process watchdog of `node-agent run`: systemd's notify protocol,
//! so the service manager knows when the agent is ready and restarts it
//! when its sampling loop hangs.
//!
//! The protocol, the [`Notifier`] and the heartbeat that decides what to
//! send are the agents' shared ones (`loopwarden_field::watchdog`); here
//! they watch the number of sampling rounds the loop has completed
//! ([`Timing::samples`](crate::console::Timing) in the snapshot the loop
//! publishes for the console after every step): `READY=1` after the first
//! round (the GPUs found, the flash open, the bus started, the console
//! bound, every GPU sampled once), then `WATCHDOG=1` at each check if
//! rounds were completed since the last ping, or the next round is not
//! yet late (a sampling period longer than the checks', up to 60 s under
//! a 10 s `WatchdogSec`). A GPU that hangs costs a round one deadline and
//! does not stop the pings; a loop that no longer turns (a wedged
//! runtime, a round that never ends) does once it is late, and systemd
//! kills and restarts the agent. Frames, XIDs and action outcomes also
//! publish snapshots but complete no round: they never count as progress.
//!
//! Glossary:
//! - *round*: one completed sampling round, the pass the watchdog counts.
//! - *ping*: a `WATCHDOG=1` notice; sent every half timeout while rounds
//!   complete.

use std::time::Duration;

use tokio::sync::watch;

pub use loopwarden_field::watchdog::{announce, stopped, Notifier, NotifyError, Progress};

use crate::console::Snapshot;

/// The agent's loop, as its log lines and `STATUS=` name it.
pub const SAMPLING_LOOP: Progress = Progress {
    program: "node-agent",
    loop_name: "sampling loop",
    pass: "sampling round",
    count: "round",
};

/// The sampling rounds completed as of `snapshot`; 0 before the first
/// snapshot.
pub fn rounds(snapshot: &Option<Snapshot>) -> u64 {
    snapshot.as_ref().map_or(0, |s| s.timing.samples)
}

/// The watchdog task on the console's snapshots: `READY=1` after the
/// first completed sampling round, then, when a watchdog is expected, a
/// ping every half timeout while rounds of `period` complete (see
/// `loopwarden_field::watchdog::watch_progress`). Returns when
/// the agent drops its snapshot sender, or after `READY=1` without a
/// watchdog. `STOPPING=1` is the caller's, at shutdown.
pub async fn watch_rounds(
    notifier: Notifier,
    snapshots: watch::Receiver<Option<Snapshot>>,
    period: Duration,
) {
    loopwarden_field::watchdog::watch_progress(notifier, snapshots, rounds, SAMPLING_LOOP, period)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::{snapshot_channel, Timing};
    use loopwarden_field::watchdog::NotifyListener;
    use std::sync::Arc;
    use std::time::Duration;

    /// A snapshot after `samples` sampling rounds, the rest empty.
    fn after(samples: u64) -> Option<Snapshot> {
        Some(Snapshot {
            timing: Timing {
                samples,
                ..Timing::default()
            },
            ..Snapshot::default()
        })
    }

    /// A fake service manager: a notify socket bound in a fresh
    /// temporary folder.
    fn manager() -> (tempfile::TempDir, Arc<NotifyListener>) {
        let dir = tempfile::tempdir().unwrap();
        let l = NotifyListener::bind(&dir.path().join("notify")).unwrap();
        (dir, Arc::new(l))
    }

    /// The next notice within `within`, read off the runtime's threads.
    async fn next(l: &Arc<NotifyListener>, within: Duration) -> Option<String> {
        let l = l.clone();
        tokio::task::spawn_blocking(move || l.next(within).unwrap())
            .await
            .unwrap()
    }

    const LONG: Duration = Duration::from_secs(5);

    /// The sampling period of the loops played here, under the checks'.
    const FAST: Duration = Duration::from_millis(50);

    #[test]
    fn rounds_are_read_from_the_snapshot() {
        assert_eq!(rounds(&None), 0);
        assert_eq!(rounds(&after(0)), 0);
        assert_eq!(rounds(&after(42)), 42);
    }

    #[tokio::test]
    async fn ready_after_the_first_round_then_pings_while_rounds_complete() {
        let (_dir, l) = manager();
        // A 2 s timeout: a check every second.
        let n = l.notifier(Some(Duration::from_secs(2)));
        let (tx, rx) = snapshot_channel();
        let task = tokio::spawn(watch_rounds(n, rx, FAST));
        // Started but not sampled yet (the first snapshot comes before
        // the first round): nothing.
        tx.send_replace(after(0));
        assert_eq!(next(&l, Duration::from_millis(500)).await, None);
        // The loop samples every 50 ms from now on, far more often than
        // the watchdog checks.
        let sampler = tokio::spawn(async move {
            for samples in 1.. {
                tx.send_replace(after(samples));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        assert_eq!(next(&l, LONG).await.as_deref(), Some("READY=1"));
        for _ in 0..4 {
            assert_eq!(next(&l, LONG).await.as_deref(), Some("WATCHDOG=1"));
        }
        // The agent stops: its snapshot sender goes, and so does the task.
        sampler.abort();
        tokio::time::timeout(LONG, task)
            .await
            .expect("the task ends with the agent")
            .unwrap();
    }

    #[tokio::test]
    async fn a_stalled_loop_gets_no_pings() {
        let (_dir, l) = manager();
        let n = l.notifier(Some(Duration::from_millis(400)));
        let (tx, rx) = snapshot_channel();
        let task = tokio::spawn(watch_rounds(n, rx, FAST));
        tx.send_replace(after(3));
        assert_eq!(next(&l, LONG).await.as_deref(), Some("READY=1"));
        assert_eq!(next(&l, LONG).await.as_deref(), Some("WATCHDOG=1"));
        // The loop still publishes snapshots (a frame, an XID) but
        // completes no round: one STATUS, then silence, however long.
        tx.send_replace(after(3));
        assert_eq!(
            next(&l, LONG).await.as_deref(),
            Some("STATUS=sampling loop stalled at round 3; watchdog pings withheld")
        );
        for _ in 0..3 {
            tx.send_replace(after(3));
            assert_eq!(next(&l, Duration::from_millis(400)).await, None);
        }
        // It samples again: pings resume.
        tx.send_replace(after(4));
        assert_eq!(next(&l, LONG).await.as_deref(), Some("STATUS=running"));
        assert_eq!(next(&l, LONG).await.as_deref(), Some("WATCHDOG=1"));
        task.abort();
    }

    #[tokio::test]
    async fn a_period_longer_than_the_timeout_is_pinged_between_rounds() {
        // A 3 s period under a 400 ms timeout (a check every 200 ms),
        // rounds 2 s apart: the pings go on while the rounds come, however
        // far apart; once a round is late, they stop. (A round is late
        // 3.2 s, a period and a check, after the watchdog saw the one
        // before: 1.2 s more than the rounds here take, which no delay
        // of this test's sampler reaches.)
        let (_dir, l) = manager();
        let n = l.notifier(Some(Duration::from_millis(400)));
        let (tx, rx) = snapshot_channel();
        let period = Duration::from_secs(3);
        let apart = Duration::from_secs(2);
        let task = tokio::spawn(watch_rounds(n, rx, period));
        tx.send_replace(after(1));
        assert_eq!(next(&l, LONG).await.as_deref(), Some("READY=1"));
        let sampler = tokio::spawn(async move {
            for samples in 2..=3 {
                tokio::time::sleep(apart).await;
                tx.send_replace(after(samples));
            }
            tx
        });
        // Two rounds, 4 s: every notice a ping, none 1.5 s apart (a ping
        // only at each round would leave 2 s gaps).
        let started = std::time::Instant::now();
        while started.elapsed() < 2 * apart {
            let ping = next(&l, Duration::from_millis(1500)).await;
            assert_eq!(
                ping.as_deref(),
                Some("WATCHDOG=1"),
                "{:?}",
                started.elapsed()
            );
        }
        // No round after the third: late 3.2 s (a period and a check)
        // after it was seen, then silence.
        let _tx = sampler.await.unwrap();
        let stalled = "STATUS=sampling loop stalled at round 3; watchdog pings withheld";
        loop {
            match next(&l, LONG).await.as_deref() {
                Some("WATCHDOG=1") => continue,
                said => {
                    assert_eq!(said, Some(stalled));
                    break;
                }
            }
        }
        assert_eq!(next(&l, Duration::from_millis(800)).await, None);
        task.abort();
    }

    #[tokio::test]
    async fn an_agent_that_never_samples_is_never_ready() {
        let (_dir, l) = manager();
        let n = l.notifier(Some(Duration::from_millis(400)));
        let (tx, rx) = snapshot_channel();
        let task = tokio::spawn(watch_rounds(n, rx, FAST));
        tx.send_replace(after(0));
        assert_eq!(next(&l, Duration::from_millis(1200)).await, None);
        drop(tx);
        tokio::time::timeout(LONG, task)
            .await
            .expect("the task ends with the agent")
            .unwrap();
        assert_eq!(next(&l, Duration::from_millis(100)).await, None);
    }

    #[test]
    fn the_log_line_names_the_sampling_loop() {
        let dir = tempfile::tempdir().unwrap();
        let l = NotifyListener::bind(&dir.path().join("notify")).unwrap();
        let says = l
            .notifier(Some(Duration::from_secs(10)))
            .describe(&SAMPLING_LOOP, Duration::from_secs(1));
        assert!(
            says.contains("READY=1 after the first sampling round"),
            "{says}"
        );
        assert!(says.contains("while sampling rounds complete"), "{says}");
    }
}

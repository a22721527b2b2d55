//! The process watchdog of `cooling-ctrl run`: systemd's notify protocol,
//! so the service manager knows when the controller is ready and restarts
//! it when its control loop hangs.
//!
//! The protocol, the [`Notifier`] and the [`Heartbeat`] that decides what
//! to send are the agents' shared ones (`loopwarden_field::watchdog`);
//! here they watch the number of control steps the shell has completed
//! (`ShellStats::steps`): `READY=1` after the first step, then
//! `WATCHDOG=1` at each check if steps were completed since the last ping
//! or the next step is not yet late. A loop that is alive but hung (a step that never ends, a wedged
//! runtime) stops the pings, and systemd kills and restarts the process.
//! [`watch_steps`] is the task that runs it on the stats channel; the
//! binary spawns it.
//!
//! Glossary:
//! - *step*: one completed control step of the shell, the pass the
//!   watchdog counts.
//! - *ping*: a `WATCHDOG=1` notice; sent every half timeout while steps
//!   complete.

use tokio::sync::watch;

pub use loopwarden_field::watchdog::{
    announce, should_ping, stopped, Beat, Heartbeat, Notifier, NotifyError, NotifySocket, Progress,
};

use crate::shell::ShellStats;

/// The controller's loop, as its log lines and `STATUS=` name it.
pub const CONTROL_LOOP: Progress = Progress {
    program: "cooling-ctrl",
    loop_name: "control loop",
    pass: "control step",
    count: "step",
};

/// The watchdog task on the shell's stats: `READY=1` after the first
/// completed control step, then, when a watchdog is expected, a ping every
/// half timeout while steps of `period` complete (see
/// `loopwarden_field::watchdog::watch_progress`). Returns when the stats
/// sender is gone, or after `READY=1` without a watchdog. `STOPPING=1` is
/// the caller's, at shutdown.
pub async fn watch_steps(
    notifier: Notifier,
    stats: watch::Receiver<ShellStats>,
    period: std::time::Duration,
) {
    loopwarden_field::watchdog::watch_progress(notifier, stats, |s| s.steps, CONTROL_LOOP, period)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;

    /// A datagram socket bound in a fresh temporary folder, and the
    /// notifier that sends to it.
    fn listener(watchdog: Option<Duration>) -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (dir, rx, Notifier::new(NotifySocket::Path(path), watchdog))
    }

    fn recv(rx: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = rx.recv(&mut buf).expect("a datagram");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    /// The next datagram within `within`, if any.
    fn recv_within(rx: &UnixDatagram, within: Duration) -> Option<String> {
        rx.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 256];
        let got = rx.recv(&mut buf).ok();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        got.map(|n| String::from_utf8(buf[..n].to_vec()).unwrap())
    }

    #[test]
    fn the_log_line_says_what_will_happen() {
        assert_eq!(
            Notifier::disabled().describe(&CONTROL_LOOP, Duration::from_secs(1)),
            "no NOTIFY_SOCKET: no readiness or watchdog notices"
        );
        let n = Notifier::new(
            NotifySocket::Path("/n".into()),
            Some(Duration::from_secs(10)),
        );
        let says = n.describe(&CONTROL_LOOP, Duration::from_secs(1));
        assert!(says.contains("WATCHDOG=1 every 5000 ms"), "{says}");
        assert!(
            says.contains("READY=1 after the first control step"),
            "{says}"
        );
        assert!(says.contains("control loop period 1000 ms"), "{says}");
    }

    #[tokio::test]
    async fn the_task_pings_only_while_steps_complete() {
        // A 400 ms timeout: a check every 200 ms.
        let (_dir, rx, n) = listener(Some(Duration::from_millis(400)));
        let (tx, stats) = crate::shell::stats_channel();
        let task = tokio::spawn(watch_steps(n, stats, Duration::from_millis(50)));
        let rx = std::sync::Arc::new(rx);
        let get = |within: Duration| {
            let rx = rx.clone();
            tokio::task::spawn_blocking(move || recv_within(&rx, within))
        };
        // Nothing before the first step.
        assert_eq!(get(Duration::from_millis(500)).await.unwrap(), None);
        tx.send_modify(|s| s.steps = 1);
        assert_eq!(
            get(Duration::from_secs(5)).await.unwrap().as_deref(),
            Some("READY=1")
        );
        assert_eq!(
            get(Duration::from_secs(5)).await.unwrap().as_deref(),
            Some("WATCHDOG=1")
        );
        // The loop hangs: one STATUS, then silence.
        let status = get(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            status.as_deref(),
            Some("STATUS=control loop stalled at step 1; watchdog pings withheld")
        );
        assert_eq!(get(Duration::from_millis(700)).await.unwrap(), None);
        // It steps again: pings resume.
        tx.send_modify(|s| s.steps = 2);
        assert_eq!(
            get(Duration::from_secs(5)).await.unwrap().as_deref(),
            Some("STATUS=running")
        );
        assert_eq!(
            get(Duration::from_secs(5)).await.unwrap().as_deref(),
            Some("WATCHDOG=1")
        );
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends with the shell")
            .unwrap();
    }

    #[tokio::test]
    async fn ready_is_sent_at_the_first_step_not_at_a_check() {
        // A one-hour timeout: the first check is half an hour away, so
        // READY=1 (and the ping that comes with it) within a minute was
        // sent at the step, however slow the machine.
        let (_dir, rx, n) = listener(Some(Duration::from_secs(3600)));
        let (tx, stats) = crate::shell::stats_channel();
        let task = tokio::spawn(watch_steps(n, stats, Duration::from_millis(50)));
        tx.send_modify(|s| s.steps = 1);
        let rx = std::sync::Arc::new(rx);
        let get = || {
            let rx = rx.clone();
            tokio::task::spawn_blocking(move || recv_within(&rx, Duration::from_secs(60)))
        };
        for said in ["READY=1", "WATCHDOG=1"] {
            assert_eq!(
                get().await.unwrap().as_deref(),
                Some(said),
                "not sent at the first step"
            );
        }
        task.abort();
    }

    #[tokio::test]
    async fn without_a_watchdog_only_ready_is_sent() {
        let (_dir, rx, n) = listener(None);
        let (tx, stats) = crate::shell::stats_channel();
        let task = tokio::spawn(watch_steps(n, stats, Duration::from_millis(50)));
        tx.send_modify(|s| s.steps = 1);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends after READY=1")
            .unwrap();
        assert_eq!(recv(&rx), "READY=1");
        assert_eq!(recv_within(&rx, Duration::from_millis(200)), None);
    }
}

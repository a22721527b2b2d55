//! One agent lifecycle, the same for `node-agent run` and `cooling-ctrl
//! run`: the process starts and stops here, and each agent supplies only
//! its own parts (its configuration, its loop and what it counts, its
//! console's answers).
//!
//! In order:
//! 1. [`run`]: logging to standard error; the agent's configuration (an
//!    error exits 2, with the message); the watchdog's notify socket from
//!    the environment (a malformed one is a configuration error too, exit
//!    2); the runtime the agent asks for ([`Threads`]); then the agent. It
//!    exits 0 when the agent stopped at a signal, 1 with the error when it
//!    failed.
//! 2. [`Supervision::start`]: SIGTERM caught before anything that takes
//!    time; the loop announced to the service manager; the watchdog task
//!    (`READY=1` after the first completed pass, `WATCHDOG=1` only while
//!    passes complete); the future that completes at ctrl-c or SIGTERM
//!    (and sends `STOPPING=1` then). [`Supervision::finish`] ends it, and
//!    says `STOPPING=1` for a loop that ended by a failure.
//! 3. [`Readers`]: what answers people while the agent runs (the console
//!    socket, the serial console, `/metrics`), started together and
//!    stopped together, the console's socket removed at the stop.
//!
//! Glossary:
//! - *pass*: one completed round of the agent's loop (a sampling round, a
//!   control step); the watchdog pings only while passes complete.
//! - *reader*: a task that only reads what the loop publishes; it never
//!   asks the loop.

use std::fmt::Display;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::watchdog::{announce, stopped, watch_progress, Notifier, Progress};

/// Why an agent did not start: what to print (after the program's name)
/// and the exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    /// 2: the configuration; 1: anything else.
    pub status: u8,
    /// What was wrong, in words.
    pub message: String,
}

impl StartError {
    /// The configuration is wrong (exit 2).
    pub fn config(message: impl Display) -> Self {
        Self {
            status: 2,
            message: message.to_string(),
        }
    }

    /// Something the agent needs is missing or failed (exit 1).
    pub fn failed(message: impl Display) -> Self {
        Self {
            status: 1,
            message: message.to_string(),
        }
    }
}

/// The threads an agent's runtime runs its tasks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Every task on the thread that runs the agent: for an agent whose
    /// tasks wake a few times a period, so no wake-up crosses threads.
    Current,
    /// This many worker threads.
    Workers(usize),
}

/// Runs an agent's process (see the module note) on a runtime of two
/// workers: `start` loads what the agent needs before its runtime (its
/// configuration, its devices); `serve` runs it until a signal or a
/// failure.
pub fn run<C, E, Fut>(
    program: &'static str,
    start: impl FnOnce() -> Result<C, StartError>,
    serve: impl FnOnce(C, Notifier) -> Fut,
) -> ExitCode
where
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    run_on(program, Threads::Workers(2), start, serve)
}

/// As [`run`], on the runtime `threads` says.
pub fn run_on<C, E, Fut>(
    program: &'static str,
    threads: Threads,
    start: impl FnOnce() -> Result<C, StartError>,
    serve: impl FnOnce(C, Notifier) -> Fut,
) -> ExitCode
where
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    loopwarden_bus::init_agent_logging();
    let started = start().and_then(|c| {
        // Read before anything starts: a malformed WATCHDOG_USEC is a
        // configuration error, as a bad file is.
        let notifier = Notifier::from_env().map_err(StartError::config)?;
        Ok((c, notifier))
    });
    let (config, notifier) = match started {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{program}: {}", e.message);
            return ExitCode::from(e.status);
        }
    };
    let mut builder = match threads {
        Threads::Current => tokio::runtime::Builder::new_current_thread(),
        Threads::Workers(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.max(1));
            b
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{program}: the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(config, notifier)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::from(1)
        }
    }
}

/// The watchdog and the stop around an agent's loop.
#[derive(Debug)]
pub struct Supervision {
    notifier: Notifier,
    watchdog: JoinHandle<()>,
    program: &'static str,
}

impl Supervision {
    /// Catches SIGTERM, SIGINT and SIGHUP, announces the loop `what` (a
    /// pass every `period`) and watches `progress`, whose passes `passes`
    /// counts. Returns the supervision and the future that completes at
    /// the first of those signals, having ended the watchdog and sent
    /// `STOPPING=1`.
    pub fn start<T>(
        notifier: Notifier,
        what: Progress,
        period: Duration,
        progress: watch::Receiver<T>,
        passes: fn(&T) -> u64,
    ) -> Result<(Self, impl Future<Output = ()>), String>
    where
        T: Send + Sync + 'static,
    {
        let signals = crate::watchdog::StopSignals::catch()?;
        announce(&notifier, &what, period);
        let watchdog = tokio::spawn(watch_progress(
            notifier.clone(),
            progress,
            passes,
            what,
            period,
        ));
        // Passes end at the signal, while the agent winds down.
        let stop = stopped(
            signals,
            notifier.clone(),
            watchdog.abort_handle(),
            what.program,
        );
        let supervision = Self {
            notifier,
            watchdog,
            program: what.program,
        };
        Ok((supervision, stop))
    }

    /// The loop ended: the watchdog stops. A loop ended by a failure, not
    /// a signal, says `STOPPING=1` now (at a signal it was said then).
    pub fn finish(self, failed: bool) {
        self.watchdog.abort();
        if failed {
            if let Err(e) = self.notifier.stopping() {
                tracing::warn!("{}: watchdog: {e}", self.program);
            }
        }
    }
}

/// What answers people while an agent runs: the console socket's server
/// and, when configured, the serial console and `/metrics`.
#[derive(Debug)]
pub struct Readers {
    socket: PathBuf,
    tasks: Vec<JoinHandle<()>>,
}

impl Readers {
    /// The readers started: the console served on `socket` (already
    /// bound), and the others the agent started.
    pub fn new(
        socket: PathBuf,
        console: JoinHandle<()>,
        others: impl IntoIterator<Item = Option<JoinHandle<()>>>,
    ) -> Self {
        let mut tasks = vec![console];
        tasks.extend(others.into_iter().flatten());
        Self { socket, tasks }
    }

    /// Stops every reader and removes the console socket.
    pub fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_errors_carry_their_exit_status() {
        assert_eq!(StartError::config("bad line 3").status, 2);
        assert_eq!(StartError::failed("no NVML").status, 1);
        assert_eq!(StartError::config("bad line 3").message, "bad line 3");
    }

    #[tokio::test]
    async fn stopped_readers_end_and_leave_no_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let listener = crate::console::bind(&path, "agent").unwrap();
        let console = tokio::spawn(async move {
            let _keep = listener;
            std::future::pending::<()>().await
        });
        let metrics = tokio::spawn(std::future::pending::<()>());
        let watch_metrics = metrics.abort_handle();
        let readers = Readers::new(path.clone(), console, [Some(metrics), None]);
        assert!(path.exists());
        readers.stop();
        tokio::task::yield_now().await;
        assert!(!path.exists(), "the socket is removed");
        assert!(watch_metrics.is_finished(), "every reader ends");
    }
}

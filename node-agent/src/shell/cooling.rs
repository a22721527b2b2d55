//! Cooling loss in the shell: the node decides (`node_core::cooling_loss`)
//! from the CDU's word about this host's rack; the steps it hands out run
//! here as the configured commands, one after another on one task (a
//! drain ends before the power-down starts), each outcome logged to flash
//! and published as a `cooling_action` event. The phase is kept in flash.

use std::time::Duration;

use loopwarden_flash::ConfigStore;
use loopwarden_protocol::{CoolingStep, Event, TimestampMs};
use loopwarden_store::agent_flash::Flash;
use loopwarden_store::recorder::Recorder;
use tokio::sync::mpsc;

use super::Agent;
use crate::actions;
use crate::config::CoolingLossActions;
use node_core::cooling_loss::Phase;

/// The config-store key of the cooling-loss phase.
const PHASE_KEY: &str = "cooling_loss";
/// Steps waiting for the runner (a loss has at most four).
const QUEUE: usize = 16;

/// One step for the runner: its commands, already expanded.
pub(crate) struct Job {
    step: CoolingStep,
    argvs: Vec<Vec<String>>,
    timeout: Duration,
}

/// Starts the runner; returns where to send steps and where their
/// outcomes come back.
pub(crate) fn start_runner() -> (
    mpsc::Sender<Job>,
    mpsc::Receiver<(CoolingStep, actions::Outcome)>,
) {
    let (jobs_tx, mut jobs_rx) = mpsc::channel::<Job>(QUEUE);
    let (done_tx, done_rx) = mpsc::channel(QUEUE * 4);
    tokio::spawn(async move {
        while let Some(job) = jobs_rx.recv().await {
            for argv in &job.argvs {
                let outcome = actions::run(argv, job.timeout).await;
                if done_tx.send((job.step, outcome)).await.is_err() {
                    return;
                }
            }
        }
    });
    (jobs_tx, done_rx)
}

/// The commands of `step`.
fn commands(c: &CoolingLossActions, step: CoolingStep) -> &[Vec<String>] {
    match step {
        CoolingStep::Drain => &c.drain,
        CoolingStep::PowerDown => &c.power_down,
        CoolingStep::PowerUp => &c.power_up,
        CoolingStep::Resume => &c.resume,
    }
}

/// The phase as kept in flash: a tag and the wall-clock stamp.
fn encode(phase: Phase) -> [u8; 9] {
    let (tag, since) = match phase {
        Phase::Cooled => (0u8, 0u64),
        Phase::Draining { since } => (1, since),
        Phase::PoweredDown { since } => (2, since),
    };
    let mut b = [0u8; 9];
    b[0] = tag;
    b[1..].copy_from_slice(&since.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Phase> {
    let since = u64::from_le_bytes(b.get(1..9)?.try_into().ok()?);
    match b.first()? {
        0 => Some(Phase::Cooled),
        1 => Some(Phase::Draining { since }),
        2 => Some(Phase::PoweredDown { since }),
        _ => None,
    }
}

/// The phase kept from before a restart: cooled when none was kept, or
/// when it cannot be read (said; a rack still without cooling is drained
/// again at the CDU's next word).
pub(super) async fn restore(store: &mut ConfigStore<Flash>) -> Phase {
    let mut buf = [0u8; 16];
    let unreadable = |why: String| {
        tracing::error!("cooling-loss phase in flash unreadable ({why}): taken as cooled");
        Phase::Cooled
    };
    let phase = match store.get(PHASE_KEY, &mut buf).await {
        Ok(Some(n)) => decode(&buf[..n]).unwrap_or_else(|| unreadable(format!("{n} bytes"))),
        Ok(None) => Phase::Cooled,
        Err(e) => unreadable(format!("{e:?}")),
    };
    if phase != Phase::Cooled {
        tracing::warn!("a cooling loss from before the restart: {phase}; waiting for the CDU");
    }
    phase
}

/// Keeps the phase in flash (written off the loop).
pub(super) fn keep(recorder: &Recorder, phase: Phase) {
    recorder.set(PHASE_KEY.to_string(), encode(phase).to_vec());
}

impl Agent {
    /// Hands a cooling-loss step's configured commands to the runner.
    pub(super) fn run_cooling(&mut self, step: CoolingStep, reason: &str) {
        let rack = self.config.rack.map_or(String::new(), |r| r.to_string());
        let cmds = commands(&self.config.cooling_loss, step);
        if cmds.is_empty() {
            tracing::warn!("rack {rack}: cooling-loss {step}: no command configured");
            return;
        }
        tracing::warn!(
            "rack {rack}: cooling-loss {step}: running {} commands",
            cmds.len()
        );
        let cdu = self.config.cdu.as_ref().map_or("", |c| c.as_str());
        let vars: [(&str, &str); 5] = [
            ("{host}", self.config.host.as_str()),
            ("{site}", self.config.site.as_str()),
            ("{cdu}", cdu),
            ("{rack}", &rack),
            ("{reason}", reason),
        ];
        let job = Job {
            step,
            argvs: cmds
                .iter()
                .map(|a| actions::expand_with(a, &vars))
                .collect(),
            timeout: self.config.cooling_loss.timeout,
        };
        if let Err(e) = self.cooling_jobs.try_send(job) {
            tracing::error!(
                "rack {rack}: cooling-loss {step} not run: the runner's queue refused it ({e})"
            );
        }
    }

    /// A cooling-loss command ended: logged to flash and published.
    pub(super) async fn on_cooling_action(&mut self, step: CoolingStep, o: actions::Outcome) {
        if o.ok {
            tracing::info!("cooling-loss {step}: {} done", o.program);
        } else {
            tracing::error!("cooling-loss {step}: {} failed: {}", o.program, o.detail);
        }
        let ev = Event::CoolingAction {
            step,
            ok: o.ok,
            exit_code: o.exit_code,
        };
        let now: TimestampMs = self.clock.wall();
        self.emit(ev, now).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_flash_bytes() {
        for p in [
            Phase::Cooled,
            Phase::Draining {
                since: 1_764_000_000_123,
            },
            Phase::PoweredDown { since: 7 },
        ] {
            assert_eq!(decode(&encode(p)), Some(p));
        }
        assert_eq!(decode(&[9, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[1, 2]), None);
    }
}

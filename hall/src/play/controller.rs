//! The cooling controller of a play, as a process on a CDU runs: the real
//! shell (`cooling_ctrl::shell::run_with`) on Modbus to the simulated CDU,
//! on the board's simulated pins, with its flash in a file. The
//! scenario's `controller_restart` stops it at its simulated second and
//! starts it again on the same flash file once its downtime has passed,
//! as systemd would; a `latch_corrupt` before it damages the newest
//! latched record in that file first (`cooling_ctrl::journal::damage_record`).
//! Between runs the CDU keeps its last settings, or falls back on its own.
//!
//! Glossary:
//! - *run*: one life of the controller's process, from its start to its
//!   stop or restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::shell::{BusOptions, OperatorRequest, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::pins::PinMap;
use loopwarden_twin::hall::Hall;
use loopwarden_twin::pins::SimLines;
use loopwarden_twin::scenario::{FaultKind, Scenario};
use tokio::sync::{mpsc, watch};

use super::{stopped, PlayError};

/// A `controller_restart` of the scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Restart {
    /// When the process stops, simulated s.
    pub(crate) at_s: f64,
    /// How long it stays down, simulated s.
    pub(crate) down_s: f64,
    /// A `latch_corrupt` came since the last restart: the newest latched
    /// record is damaged before it starts again.
    pub(crate) damage: bool,
}

/// The scenario's restarts, in time order.
pub(crate) fn restarts_of(sc: &Scenario) -> Vec<Restart> {
    let mut v: Vec<Restart> = sc
        .faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::ControllerRestart(down) => Some(Restart {
                at_s: f.at_s as f64,
                down_s: down,
                damage: false,
            }),
            _ => None,
        })
        .collect();
    v.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let mut since = f64::NEG_INFINITY;
    for r in v.iter_mut() {
        r.damage = sc.faults.iter().any(|f| {
            f.kind == FaultKind::LatchCorrupt
                && (f.at_s as f64) > since
                && (f.at_s as f64) <= r.at_s
        });
        since = r.at_s;
    }
    v
}

/// `path`, with whatever an earlier run left there removed: every run
/// starts from a fresh controller.
pub(crate) fn fresh_file(path: &Path) -> Result<PathBuf, PlayError> {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::debug!("{}: the last run's flash replaced", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(PlayError::Start(format!("{}: {e}", path.display()))),
    }
    Ok(path.to_path_buf())
}

/// Everything a run of the controller is started from.
pub(crate) struct ControllerRuns {
    pub(crate) cfg: ShellConfig,
    pub(crate) map: RegisterMap,
    pub(crate) link: Link,
    pub(crate) pins: PinMap,
    pub(crate) lines: SimLines,
    pub(crate) stats: watch::Sender<ShellStats>,
    /// The operators' requests, handed to each run in turn.
    pub(crate) operator: Option<Arc<tokio::sync::Mutex<mpsc::Receiver<OperatorRequest>>>>,
    pub(crate) flash: Option<PathBuf>,
    pub(crate) hall: Arc<Mutex<Hall>>,
    pub(crate) restarts: Vec<Restart>,
}

impl ControllerRuns {
    /// Runs the controller until the play stops, restarting it as the
    /// scenario says.
    pub(crate) async fn run(self, stop: watch::Receiver<bool>) {
        for i in 0..=self.restarts.len() {
            let due = self.restarts.get(i).copied();
            if let Err(e) = self.one_run(due.map(|r| r.at_s), stop.clone()).await {
                tracing::error!("cooling controller: {e}");
                return;
            }
            let Some(r) = due.filter(|_| !*stop.borrow()) else {
                return;
            };
            // A stopped process declares nothing: its last commands are
            // not asked while it is down.
            self.stats.send_modify(|s| s.last = None);
            self.hall.lock().expect("hall lock").controller_restarted();
            tracing::info!(
                "t={:.0}s cooling controller stopped for a restart ({} s down)",
                r.at_s,
                r.down_s
            );
            if r.damage {
                self.damage_latch().await;
            }
            if !self.until(r.at_s + r.down_s, &stop).await {
                return;
            }
        }
    }

    /// One run, until the play stops or the hall reaches `until_s`.
    async fn one_run(
        &self,
        until_s: Option<f64>,
        stop: watch::Receiver<bool>,
    ) -> Result<(), String> {
        let flash =
            ControllerFlash::open(self.flash.as_deref()).map_err(|e| format!("flash: {e}"))?;
        let lines = &self.lines;
        let board = loopwarden_boards::pins::BoardPins::new(
            &self.pins,
            |l| lines.input(l),
            |l| lines.output(l),
        );
        let (operator, relay) = self.operator_relay();
        let opts = ShellOptions {
            stats: Some(self.stats.clone()),
            board: Some(Box::new(board)),
            operator,
            bus: BusOptions {
                flash: Some(flash),
                // The twin's: operators and facility systems of the
                // demonstration key may ask for resends.
                readers: cooling_ctrl::config::demo_readers(),
                ..Default::default()
            },
            ..Default::default()
        };
        let port = ModbusCdu::new(self.map.clone(), self.link.clone())
            .with_timeout(Duration::from_millis(500));
        let hall = self.hall.clone();
        let stop_here = stop.clone();
        let shutdown = async move {
            tokio::select! {
                _ = stopped(stop_here) => {}
                _ = reaches(hall, until_s) => {}
            }
        };
        let r = cooling_ctrl::shell::run_with(self.cfg.clone(), opts, port, shutdown).await;
        if let Some(h) = relay {
            h.abort();
        }
        r.map_err(|e| e.to_string())
    }

    /// A receiver of the operators' requests for one run, and the task
    /// that relays them to it.
    fn operator_relay(
        &self,
    ) -> (
        Option<mpsc::Receiver<OperatorRequest>>,
        Option<tokio::task::JoinHandle<()>>,
    ) {
        let Some(all) = self.operator.clone() else {
            return (None, None);
        };
        let (tx, rx) = mpsc::channel(4);
        let relay = tokio::spawn(async move {
            let mut all = all.lock().await;
            while let Some(req) = all.recv().await {
                if tx.send(req).await.is_err() {
                    return;
                }
            }
        });
        (Some(rx), Some(relay))
    }

    /// Damages the newest latched record in the flash file, as a
    /// `latch_corrupt` says.
    async fn damage_latch(&self) {
        let Some(path) = self.flash.as_deref() else {
            tracing::warn!("latch_corrupt: the controller has no flash file to damage");
            return;
        };
        match damage_file(path).await {
            Ok(()) => tracing::info!("latch_corrupt: the newest latched record damaged"),
            Err(e) => tracing::warn!("latch_corrupt: {e}"),
        }
    }

    /// Waits until the hall reaches `t_s`; false when the play stopped
    /// first.
    async fn until(&self, t_s: f64, stop: &watch::Receiver<bool>) -> bool {
        tokio::select! {
            _ = stopped(stop.clone()) => false,
            _ = reaches(self.hall.clone(), Some(t_s)) => true,
        }
    }
}

/// Completes when the hall's clock reaches `t_s` (never for `None`).
async fn reaches(hall: Arc<Mutex<Hall>>, t_s: Option<f64>) {
    let Some(t_s) = t_s else {
        return std::future::pending().await;
    };
    while hall.lock().expect("hall lock").time_s() < t_s {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Damages the newest latched record in the flash file at `path`.
async fn damage_file(path: &Path) -> Result<(), String> {
    let record = {
        let mut stores = loopwarden_store::agent_flash::open(Some(path))?;
        cooling_ctrl::journal::load_latched(&mut stores.store)
            .await?
            .ok_or("no latched record in the flash")?
    };
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !cooling_ctrl::journal::damage_record(&mut bytes, &record) {
        return Err("the newest latched record is not in the flash file".into());
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latch_corrupt_damages_the_record_at_the_next_restart_only() {
        let sc = Scenario::from_toml(
            "format = \"plant-scenario/1\"\ndescription = \"r\"\nduration_s = 100\nseed = 1\n\
             [ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.5]]\n\
             [[fault]]\nat_s = 50\nkind = \"controller_restart\"\nvalue = 3.0\n\
             [[fault]]\nat_s = 10\nkind = \"controller_restart\"\n\
             [[fault]]\nat_s = 10\nkind = \"latch_corrupt\"\n",
            "r.toml",
        )
        .unwrap();
        let r = restarts_of(&sc);
        assert_eq!(
            r,
            vec![
                Restart {
                    at_s: 10.0,
                    down_s: 5.0,
                    damage: true
                },
                Restart {
                    at_s: 50.0,
                    down_s: 3.0,
                    damage: false
                },
            ]
        );
    }
}

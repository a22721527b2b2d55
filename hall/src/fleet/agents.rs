//! The fleet's host agents: one real node agent per host, as tasks on
//! the shared runtime (or, `--isolated-agents`, each on a thread of its
//! own), each with its config (console socket and flash file under the
//! run's folder) and its bus handed over once it runs.

use std::time::{Duration, Instant};

use loopwarden_bus::{AckedLedger, Bus, MetricsSnapshot};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::Family;
use node_agent::gpu::GpuSource;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{
    isolated, layout, start_err, Brokers, CduLayout, CduPart, FleetError, CONNECT_LIMIT_S,
};
use crate::play::stopped;

/// The host agents, as tasks on the shared runtime.
pub(super) struct Agents {
    stop: watch::Sender<bool>,
    tasks: Vec<(String, JoinHandle<()>)>,
    /// Each agent's bus, and the outbox frames its broker acknowledged.
    buses: Vec<(Bus, AckedLedger)>,
    /// The halls' XID watches, kept while the agents run.
    _watches: Vec<node_agent::hall_gpus::HallXidWatch>,
}

impl Agents {
    /// Starts one agent per host on `rt` and waits until every one is
    /// connected to the broker.
    pub(super) async fn start(
        layouts: &[CduLayout],
        cdus: &[CduPart],
        broker: &Brokers,
        out: &std::path::Path,
        rt: &tokio::runtime::Handle,
        (isolated, flash): (bool, bool),
    ) -> Result<Self, FleetError> {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut waiting = Vec::new();
        let mut watches = Vec::new();
        for (l, part) in layouts.iter().zip(cdus) {
            let watch =
                node_agent::hall_gpus::HallXidWatch::start(part.sim.hall.clone(), "hall-xid")
                    .map_err(|e| FleetError::Start(format!("{}: XID watch: {e}", l.name)))?;
            for (h, id) in l.host_ids.iter().enumerate() {
                let config = agent_config(&broker.site, &broker.value, l, h, out, flash)?;
                let source: Box<dyn GpuSource + Send> = if isolated {
                    let own = node_agent::hall_gpus::HallSource::new(part.sim.hall.clone(), h);
                    Box::new(isolated::Threaded(own))
                } else {
                    Box::new(watch.source(h))
                };
                let (task, rx) = spawn_agent(id, config, source, &stop_rx, rt, isolated)?;
                tasks.push((id.clone(), task));
                waiting.push((id.clone(), rx));
            }
            watches.push(watch);
        }
        let mut buses = Vec::new();
        for (id, rx) in waiting {
            let bus = tokio::time::timeout(Duration::from_secs(CONNECT_LIMIT_S), rx)
                .await
                .map_err(|_| FleetError::Start(format!("agent {id} did not start")))?
                .map_err(|_| FleetError::Start(format!("agent {id} ended at its start")))?;
            // Every event the broker acknowledges is one the observer
            // must receive.
            let ledger = bus.keep_acked_ledger();
            buses.push((bus, ledger));
        }
        let agents = Self {
            stop,
            tasks,
            buses,
            _watches: watches,
        };
        agents.connected().await?;
        // An agent that fails at its start hands no bus (its console bound
        // and its recorder started first), seen above; one that ended
        // since it handed its bus over (a panic) is not left out either.
        let ended = finished(&agents.tasks);
        if !ended.is_empty() {
            return Err(FleetError::Start(format!(
                "agents ended at their start: {} (see the log above)",
                ended.join(" ")
            )));
        }
        Ok(agents)
    }

    /// Waits until every agent's bus is connected.
    async fn connected(&self) -> Result<(), FleetError> {
        let until = Instant::now() + Duration::from_secs(CONNECT_LIMIT_S);
        loop {
            let down = self.buses.iter().filter(|(b, _)| !b.is_connected()).count();
            if down == 0 {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(FleetError::Start(format!(
                    "{down} agents not connected after {CONNECT_LIMIT_S} s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Tells every agent to stop, waits for them (at most a minute), and
    /// returns each one's bus counters and acknowledged outbox frames,
    /// and the agents that ended before they were told to stop or whose
    /// task failed (panicked): their figures cover only part of the run.
    pub(super) async fn stop(self) -> (Vec<Stopped>, Vec<String>) {
        let mut ended = finished(&self.tasks);
        let _ = self.stop.send(true);
        let until = Instant::now() + Duration::from_secs(60);
        let mut ids = Vec::new();
        for (id, t) in self.tasks {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, t).await {
                Err(_) => tracing::error!("agent {id} did not stop within a minute"),
                Ok(Err(e)) => {
                    tracing::error!("agent {id}: {e}");
                    if !ended.contains(&id) {
                        ended.push(id.clone());
                    }
                }
                Ok(Ok(())) => {}
            }
            ids.push(id);
        }
        let stopped = ids
            .into_iter()
            .zip(self.buses)
            .map(|(id, (b, mut ledger))| (id, b.metrics(), ledger.take()))
            .collect();
        (stopped, ended)
    }
}

/// An agent's id, bus counters and acknowledged outbox frames at its stop.
pub(super) type Stopped = (String, MetricsSnapshot, Vec<(u32, Family)>);

/// The names of the tasks that have ended.
pub(super) fn finished<T>(tasks: &[(String, JoinHandle<T>)]) -> Vec<String> {
    tasks
        .iter()
        .filter(|(_, t)| t.is_finished())
        .map(|(id, _)| id.clone())
        .collect()
}

/// Starts agent `id` on `rt` (or, `isolated`, on a thread and runtime of
/// its own); its task, and where its bus will be handed over.
fn spawn_agent(
    id: &str,
    config: node_agent::config::Config,
    source: Box<dyn GpuSource + Send>,
    stop_rx: &watch::Receiver<bool>,
    rt: &tokio::runtime::Handle,
    isolated: bool,
) -> Result<(JoinHandle<()>, tokio::sync::oneshot::Receiver<Bus>), FleetError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let hooks = node_agent::shell::RunHooks {
        bus: Some(tx),
        ..Default::default()
    };
    let rx_stop = stop_rx.clone();
    let name = id.to_string();
    let agent = async move {
        let run = node_agent::shell::run_hooked(config, source, hooks, stopped(rx_stop));
        if let Err(e) = run.await {
            tracing::error!("agent {name}: {e}");
        }
    };
    let task = if isolated {
        isolated::spawn(id, agent).map_err(start_err)?
    } else {
        rt.spawn(agent)
    };
    Ok((task, rx))
}

/// Host `h` of CDU `l`'s agent config: the run's site and brokers, its
/// console socket and (with `flash`) its flash file under `out`, twin
/// GPUs.
fn agent_config(
    site: &str,
    brokers: &str,
    l: &CduLayout,
    h: usize,
    out: &std::path::Path,
    flash: bool,
) -> Result<node_agent::config::Config, FleetError> {
    let id = &l.host_ids[h];
    let dir = out.join(id);
    std::fs::create_dir_all(&dir)
        .map_err(|e| FleetError::Start(format!("{}: {e}", dir.display())))?;
    let flags = |broker: &str| node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(site.into()),
            broker: Some(broker.into()),
            flash: flash.then(|| dir.join("flash.bin")),
            console: Some(dir.join("console.sock")),
            ..Default::default()
        },
        host: Some(id.clone()),
        twin_gpus: Some(layout::GPUS_PER_HOST as u8),
        cdu: Some(l.name.clone()),
        rack: Some((h / l.hosts_per_rack) as u8),
        ..Default::default()
    };
    let first = brokers.split(',').next().unwrap_or(brokers);
    node_agent::config::load(None, &flags(brokers))
        .or_else(|e| {
            if first == brokers {
                return Err(e);
            }
            tracing::warn!("agent broker {brokers}: {e}; using the first, {first}");
            node_agent::config::load(None, &flags(first))
        })
        .map_err(|e| FleetError::Start(format!("agent {id}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ended_is_named_and_one_still_running_is_not() {
        let (_hold, mut held) = watch::channel(false);
        let tasks = vec![
            ("c1r0h0".to_string(), tokio::spawn(async {})),
            (
                "c1r0h1".to_string(),
                tokio::spawn(async move {
                    let _ = held.changed().await;
                }),
            ),
        ];
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(finished(&tasks), vec!["c1r0h0".to_string()]);
    }
}

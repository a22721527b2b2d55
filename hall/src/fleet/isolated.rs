//! Agents as on hosts of their own, for comparison with the shared
//! runtime (`--isolated-agents`): each on its own thread (`agent-<id>`)
//! and current-thread runtime, each GPU on a worker thread of its own
//! (the hall's GPUs are wrapped so that they do not say they answer from
//! memory), and an XID watch thread per agent. This is how `play` runs
//! its agents.

use std::future::Future;

use loopwarden_protocol::Watts;
use node_agent::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource};
use node_agent::hall_gpus::HallSource;
use node_agent::xid_queue::XidSink;
use tokio::task::JoinHandle;

/// A hall source whose GPUs each get a worker thread.
pub struct Threaded(pub HallSource);

/// A GPU that does not say it answers from memory.
struct OnThread(Box<dyn GpuDevice>);

impl GpuDevice for OnThread {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        self.0.describe()
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        self.0.sample()
    }
    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        self.0.set_power_limit(limit)
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        self.0.power_limit()
    }
}

impl GpuSource for Threaded {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        Ok(self
            .0
            .devices()?
            .into_iter()
            .map(|d| Box::new(OnThread(d)) as Box<dyn GpuDevice>)
            .collect())
    }
    fn watch_xids(&mut self, sink: XidSink) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.0.watch_xids(sink)
    }
}

/// Runs `agent` on a thread of its own with a current-thread runtime; a
/// handle that ends with it.
pub fn spawn(
    id: &str,
    agent: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("agent-{id}"))
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(agent),
                Err(e) => tracing::error!("agent runtime: {e}"),
            }
            let _ = tx.send(());
        })?;
    Ok(tokio::spawn(async move {
        let _ = rx.await;
    }))
}

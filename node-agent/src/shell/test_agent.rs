//! Tests only: an [`Agent`] built as `run_agent` builds it
//! ([`Agent::new`]), on two twin GPUs, its flash in memory and its bus on
//! a broker nobody listens on, with the recorder given (a test may hold
//! its flash thread), so its glue can be driven one call at a time.

use std::sync::Arc;

use loopwarden_store::recorder::Recorder;
use tokio::sync::mpsc;

use super::{cooling, startup, Agent, Parts, Resender, Steady};
use crate::clock::SystemClock;
use crate::gpu::GpuSource;

/// The agent on two twin GPUs, writing the flash through `recorder`; to
/// be built and driven on a Tokio runtime (its bus task runs there).
pub(super) async fn agent(recorder: Recorder) -> Agent {
    let flags = crate::config::Overrides {
        common: loopwarden_field::common::CommonFlags {
            site: Some("test".into()),
            broker: Some("127.0.0.1:9".into()),
            ..Default::default()
        },
        host: Some("h1".into()),
        twin_gpus: Some(2),
        ..Default::default()
    };
    let config = crate::config::load(None, &flags).expect("config");
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let mut source: Box<dyn GpuSource + Send> =
        Box::new(crate::sim_gpus::TwinSource::new(&board, 2, 1));
    let (workers, gpus) = startup::gpus(&config, &mut source).await.expect("GPUs");
    let xids = startup::watch_xids(&mut source).expect("XIDs");
    let clock = Steady::new(Arc::new(SystemClock::new()));
    let node = startup::node(&config, &gpus, clock.wall());
    let outbox = loopwarden_store::agent_flash::open(None)
        .expect("flash")
        .outbox;
    let parts = startup::start_bus(&config, 1, outbox, gpus.len()).expect("bus");
    let bus = parts.bus;
    let resender = Resender::start(bus.clone(), recorder.clone(), Vec::new());
    Agent::new(Parts {
        config,
        bus,
        workers,
        gpus,
        node,
        recorder,
        resender,
        actions: mpsc::channel(1).0,
        xid_stats: xids.stats_reader(),
        first_seq: 1,
        snapshots: crate::console::snapshot_channel().0,
        clock,
        cooling: cooling::start_runner().0,
        stale_indexes: Vec::new(),
    })
}

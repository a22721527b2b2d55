//! What the live-agent benches share: a private mosquitto, an agent in
//! this process over twin GPUs with a flash file (in
//! `LOOPWARDEN_BENCH_DIR`, else the system's temporary folder), and a
//! `mosquitto_sub` on the host's `health` topic.
//!
//! Glossary:
//! - *bench agent*: that agent, on a runtime and thread of its own, as on
//!   its own host; stopped with [`BenchAgent::stop`].

// Each bench compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use loopwarden_system_tests::{Mosquitto, Subscriber};
use node_agent::sim_gpus::TwinControl;

/// The site and host of the bench agent.
pub const SITE: &str = "bench";
/// The host of the bench agent.
pub const HOST: &str = "h01";

/// An agent over twin GPUs on a private broker, and a subscriber to its
/// health.
pub struct BenchAgent {
    /// The broker's port.
    pub port: u16,
    /// The subscriber on the host's `health` topic.
    pub sub: Subscriber,
    /// The twin's fault injection.
    pub control: TwinControl,
    /// The agent's console socket.
    pub socket: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    _dir: tempfile::TempDir,
    _broker: Mosquitto,
}

impl BenchAgent {
    /// Starts everything; `None` (said) when mosquitto is not installed.
    pub fn start(gpus: u8) -> Option<BenchAgent> {
        let Some(broker) = Mosquitto::start() else {
            println!("mosquitto is not installed: nothing measured");
            return None;
        };
        let port = broker.port();
        let dir = match std::env::var_os("LOOPWARDEN_BENCH_DIR") {
            Some(d) => tempfile::tempdir_in(d),
            None => tempfile::tempdir(),
        }
        .expect("temp dir");
        let topic = format!("dc/v2/{SITE}/host/{HOST}/health");
        let sub = Subscriber::start(port, &[&topic]).expect("mosquitto_sub");
        let socket = dir.path().join("agent.sock");
        let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
        let twin = node_agent::sim_gpus::TwinSource::new(&board, gpus as usize, 1);
        let control = twin.control();
        let flags = node_agent::config::Overrides {
            common: loopwarden_field::common::CommonFlags {
                site: Some(SITE.into()),
                broker: Some(format!("127.0.0.1:{port}")),
                flash: Some(dir.path().join("agent.flash")),
                console: Some(socket.clone()),
                ..Default::default()
            },
            host: Some(HOST.into()),
            twin_gpus: Some(gpus),
            ..Default::default()
        };
        let config = node_agent::config::load(None, &flags).expect("config");
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let run = node_agent::shell::run(config, Box::new(twin), async {
                let _ = stop_rx.await;
            });
            if let Err(e) = rt.block_on(run) {
                eprintln!("the agent stopped: {e}");
            }
        });
        Some(BenchAgent {
            port,
            sub,
            control,
            socket,
            stop,
            thread,
            _dir: dir,
            _broker: broker,
        })
    }

    /// Stops the agent and waits for it.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

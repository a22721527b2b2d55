//! Both agents in this process with their `/metrics`, for the tests that
//! read what they export (`prometheus.rs`, `grafana.rs`): the embedded
//! broker, a node agent for host h07 on 8 simulated H200s, and cdu-1 in
//! charge of the simulated CDU with h07 its first host, wired as
//! `node-agent run` and `cooling-ctrl run` wire them.

// Each test file uses its own part of the rig.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::metrics::CduMetrics;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::shell::{self, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::message::{GpuCap, GpuSelector};
use loopwarden_protocol::{samples, Ident, Watts};
use loopwarden_system_tests::{free_port, serve_sim_cdu, steady_sim_cdu, wait_listening};
use tokio::sync::{oneshot, watch};

pub const HOST: &str = "h07";
pub const CDU: &str = "cdu-1";
pub const GPUS: usize = 8;

pub fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// The broker, both agents, and what stops them.
pub struct Rig {
    rt: tokio::runtime::Runtime,
    /// The simulated CDU's own runtime.
    _cdu_rt: Option<tokio::runtime::Runtime>,
    broker: EmbeddedBroker,
    dir: tempfile::TempDir,
    site: String,
    pub agent_metrics: SocketAddr,
    pub cdu_metrics: SocketAddr,
    /// The controller's console context (its counters, for a render with
    /// a host capped).
    cdu_ctx: Option<cooling_ctrl::console::Context>,
    layout: cooling_core::config::Layout,
    stops: Vec<oneshot::Sender<()>>,
}

impl Rig {
    /// Both agents of `site`, their `/metrics` listening.
    pub fn start(site: &str) -> Rig {
        let mut rig = Rig {
            rt: tokio::runtime::Runtime::new().expect("a runtime"),
            _cdu_rt: None,
            broker: EmbeddedBroker::start("127.0.0.1:0".parse().unwrap()).expect("a broker"),
            dir: tempfile::tempdir().expect("a temporary directory"),
            site: site.to_string(),
            agent_metrics: ([127, 0, 0, 1], free_port()).into(),
            cdu_metrics: ([127, 0, 0, 1], free_port()).into(),
            cdu_ctx: None,
            layout: CoreConfig::default().layout,
            stops: Vec::new(),
        };
        rig.start_agent();
        rig.start_controller();
        for addr in [rig.agent_metrics, rig.cdu_metrics] {
            assert!(
                wait_listening(addr, Duration::from_secs(10)),
                "/metrics on {addr}"
            );
        }
        rig
    }

    fn stopped(&mut self) -> impl std::future::Future<Output = ()> {
        let (tx, rx) = oneshot::channel::<()>();
        self.stops.push(tx);
        async {
            let _ = rx.await;
        }
    }

    /// Host h07 on 8 twin H200s, on the rig's broker, cooled by cdu-1.
    fn start_agent(&mut self) {
        let flags = node_agent::config::Overrides {
            common: CommonFlags {
                site: Some(self.site.clone()),
                broker: Some(self.broker.addr().to_string()),
                console: Some(self.dir.path().join("agent.sock")),
                ..Default::default()
            },
            host: Some(HOST.into()),
            twin_gpus: Some(GPUS as u8),
            cdu: Some(CDU.into()),
            period_ms: Some(500),
            metrics_listen: Some(self.agent_metrics.to_string()),
            ..Default::default()
        };
        let config = node_agent::config::load(None, &flags).expect("the agent's config");
        let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
        let source = Box::new(node_agent::sim_gpus::TwinSource::new(&board, GPUS, 11));
        let stop = self.stopped();
        self.rt.spawn(async move {
            if let Err(e) = node_agent::shell::run(config, source, stop).await {
                panic!("the node agent stopped: {e}");
            }
        });
    }

    /// cdu-1 in charge of the simulated CDU, h07 its first host, with its
    /// `/metrics` wired as `cooling-ctrl run` wires it.
    fn start_controller(&mut self) {
        let broker: loopwarden_bus::BrokerAddr = self
            .broker
            .addr()
            .to_string()
            .parse()
            .expect("a broker address");
        let mut cfg = ShellConfig::new(id(&self.site), id(CDU), broker, CoreConfig::default());
        cfg.period = Duration::from_millis(500);
        cfg.hosts = vec![id(HOST)];
        cfg.key = Some(samples::demo_signing_key());
        let flash = ControllerFlash::open(None).expect("a flash in memory");
        let (stats_tx, stats_rx) = shell::stats_channel();
        let ctx = console_context(&cfg, stats_rx, flash.recorder.clone());
        self.cdu_ctx = Some(ctx.clone());
        self.layout = cfg.core.layout;
        let (cdu_rt, modbus) = serve_sim_cdu(&steady_sim_cdu());
        self._cdu_rt = Some(cdu_rt);
        let addr = self.cdu_metrics;
        let stop = self.stopped();
        self.rt.block_on(async move {
            let port = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(modbus.into()))
                .with_timeout(Duration::from_millis(300));
            let metrics = CduMetrics::new(Arc::new(ctx), &cfg.core.layout);
            cooling_ctrl::metrics::start(Some(addr), metrics)
                .await
                .expect("the controller's /metrics");
            let opts = ShellOptions {
                stats: Some(stats_tx),
                bus: shell::BusOptions {
                    flash: Some(flash),
                    readers: cooling_ctrl::config::demo_readers(),
                    ..Default::default()
                },
                ..Default::default()
            };
            tokio::spawn(shell::run_with(cfg, opts, port, stop));
        });
    }

    /// The controller's metrics from its last counters with `HOST`
    /// capped at 500 W and acknowledging it.
    pub fn cdu_metrics_capped(&self) -> String {
        let ctx = self.cdu_ctx.as_ref().expect("started");
        let mut st: ShellStats = ctx.stats.borrow().clone();
        st.caps = vec![Some(500.0)];
        st.in_force.insert(
            HOST.to_string(),
            vec![GpuCap {
                gpus: GpuSelector::All,
                limit: Watts(500),
            }],
        );
        let (_tx, rx) = watch::channel(st);
        let mut capped = ctx.clone();
        capped.stats = rx;
        CduMetrics::new(Arc::new(capped), &self.layout).render()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stops.clear();
        // Give both a moment to leave the bus cleanly.
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The console context `cooling-ctrl run` builds, for `cfg`.
fn console_context(
    cfg: &ShellConfig,
    stats: watch::Receiver<ShellStats>,
    recorder: cooling_ctrl::journal::Recorder,
) -> cooling_ctrl::console::Context {
    cooling_ctrl::console::Context {
        site: cfg.site.to_string(),
        cdu: cfg.cdu.to_string(),
        hosts: cfg.hosts.iter().map(|h| h.to_string()).collect(),
        hosts_per_rack: usize::from(cfg.core.layout.hosts_per_rack),
        link: "the simulated CDU on Modbus TCP".into(),
        map_model: "sim-cdu".into(),
        broker: cfg.broker.to_string(),
        period: cfg.period,
        lease: cfg.lease,
        demo_key: true,
        started: loopwarden_bus::now_ms(),
        stats,
        recorder,
        operator: None,
        protection_off: Vec::new(),
    }
}

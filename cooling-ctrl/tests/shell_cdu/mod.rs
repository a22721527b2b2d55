//! The rig of the tests of the controller's shell against a real
//! mosquitto (`shell`, `shell_leases`, `shell_leaks`): a broker on a free
//! loopback port, the simulated CDU served on Modbus TCP with registers a
//! test sets, the shell started on both, and a probe on the bus.
//!
//! The CDU's Modbus timeout is long ([`MODBUS_TIMEOUT`]): no stall of a
//! loaded machine reaches it, so only a CDU made silent on purpose
//! ([`Rig::start_cdu`]) fails a read. What happens on which step is read
//! from the shell's stats by step number, never from the time it took.

use std::time::{Duration, Instant};

use cooling_core::CoreConfig;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::northbound::{self, NorthboundWrite};
use cooling_ctrl::shell::{self, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::{Bus, BusConfig, Inbound};
use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::message::HostTelemetry;
use loopwarden_protocol::units::{Watts, WholeCelsius};
use loopwarden_protocol::{samples, Family, Ident, NodeId, Role, Topic};
use loopwarden_system_tests::Mosquitto;
use loopwarden_twin::sim_cdu::SimCdu;
use tokio::sync::mpsc;

pub use crate::shell_rig::{id, Running};

pub const SITE: &str = "hall-t";
pub const CDU: &str = "cdu-1";
pub const KEY_ID: u8 = 3;
const SEED: [u8; 32] = *b"shell test sign key, 32 bytes..!";

pub fn key() -> SigningKey {
    SigningKey::from_bytes(&SEED)
}
pub const PERIOD: Duration = Duration::from_millis(200);

/// The CDU's Modbus timeout: far beyond any stall of a loaded machine.
pub const MODBUS_TIMEOUT: Duration = Duration::from_secs(5);

/// The Modbus timeout against a CDU silent on purpose: short, so steps
/// that wait it out come often.
pub const SILENT_TIMEOUT: Duration = Duration::from_millis(300);

// ---- the rig: broker, simulated CDU, shell, and a probe on the bus.

pub fn host_ids() -> Vec<Ident> {
    (0..16).map(|i| id(&format!("h{i:02}"))).collect()
}

/// A CDU at full flow whose supply sits well above the boot setpoint.
pub use loopwarden_system_tests::steady_sim_cdu as sim_cdu;

pub struct Rig {
    pub broker: Mosquitto,
    pub cdu: SimCdu,
    pub shell: Running,
}

impl Rig {
    pub async fn start() -> Option<Rig> {
        Self::start_with(CoreConfig::default()).await
    }

    pub async fn start_with(core: CoreConfig) -> Option<Rig> {
        Self::start_full(core, None).await
    }

    pub async fn start_full(
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
    ) -> Option<Rig> {
        let broker = Mosquitto::start()?;
        Some(Self::start_on(broker, core, board, None).await)
    }

    /// The shell on `broker`, with the controller's flash when given.
    pub async fn start_on(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
    ) -> Rig {
        Self::start_prepared(broker, core, board, flash, |_| {}).await
    }

    /// As [`Rig::start_on`], the CDU's registers set by `prepare` first.
    pub async fn start_prepared(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        prepare: impl FnOnce(&SimCdu),
    ) -> Rig {
        Self::start_linked(broker, core, board, flash, prepare, None).await
    }

    /// As [`Rig::start_prepared`], with the northbound server's link.
    pub async fn start_linked(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        prepare: impl FnOnce(&SimCdu),
        northbound: Option<shell::NorthboundLink>,
    ) -> Rig {
        let cdu = sim_cdu();
        prepare(&cdu);
        Self::start_cdu(broker, core, board, flash, northbound, cdu, None).await
    }

    /// The shell on `broker` driving `cdu`. With `silent`, the CDU
    /// answers nothing for that long (connections are taken, requests
    /// not answered) and the shell's Modbus timeout is [`SILENT_TIMEOUT`];
    /// without, it answers from the start and the timeout is
    /// [`MODBUS_TIMEOUT`].
    pub async fn start_cdu(
        broker: Mosquitto,
        core: CoreConfig,
        board: Option<Box<dyn shell::BoardIo>>,
        flash: Option<ControllerFlash>,
        northbound: Option<shell::NorthboundLink>,
        cdu: SimCdu,
        silent: Option<Duration>,
    ) -> Rig {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = cdu.clone();
        tokio::spawn(async move {
            tokio::time::sleep(silent.unwrap_or_default()).await;
            served.serve(listener).await
        });
        let port = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr.into()))
            .with_timeout(silent.map_or(MODBUS_TIMEOUT, |_| SILENT_TIMEOUT));
        let mut cfg = ShellConfig::new(id(SITE), id(CDU), broker.addr(), core);
        cfg.period = PERIOD;
        cfg.hosts = host_ids();
        cfg.key_id = KEY_ID;
        cfg.key = Some(key());
        let opts = ShellOptions {
            bus: shell::BusOptions {
                flash,
                ..Default::default()
            },
            board,
            northbound,
            ..Default::default()
        };
        Rig {
            broker,
            cdu,
            shell: Running::start(cfg, opts, port),
        }
    }

    /// A bus client (an operator node) subscribed to `filters`.
    pub async fn probe(&self, name: &str, filters: &[String]) -> (Bus, mpsc::Receiver<Inbound>) {
        let node = NodeId::new(Role::Operator, name).expect("an ident");
        let mut config = BusConfig::new(self.broker.addr(), id(SITE), node);
        config.subscriptions = filters.to_vec();
        config.inbound_capacity = 1024;
        let (bus, rx, _task) = Bus::start(config);
        assert!(
            bus.wait_connected(Duration::from_secs(5)).await,
            "the probe reaches mosquitto"
        );
        (bus, rx)
    }

    /// Waits for the shell's stats to satisfy `f`: at most 15 s (a step
    /// against a silent CDU waits out a read and its writes, each up to
    /// [`SILENT_TIMEOUT`], and a loaded machine stretches that).
    pub async fn wait_stats(
        &mut self,
        what: &str,
        f: impl FnMut(&ShellStats) -> bool,
    ) -> ShellStats {
        self.shell.wait(Duration::from_secs(15), what, f).await
    }

    pub async fn stop(self) {
        self.stop_keeping_broker().await;
    }

    /// Stops the shell; the broker goes on.
    pub async fn stop_keeping_broker(self) -> Mosquitto {
        self.shell.stop().await;
        self.broker
    }
}

pub fn cdu_topic(family: Family) -> String {
    Topic::new(&id(SITE), Role::Cdu, &id(CDU), family).to_string()
}

/// The first message on `rx` for which `f` says something, within `within`.
pub async fn first<T>(
    rx: &mut mpsc::Receiver<Inbound>,
    within: Duration,
    what: &str,
    mut f: impl FnMut(&Inbound) -> Option<T>,
) -> T {
    let found = tokio::time::timeout(within, async {
        while let Some(m) = rx.recv().await {
            if let Some(t) = f(&m) {
                return Some(t);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(t)) => t,
        _ => panic!("{what}: not seen within {within:?}"),
    }
}

/// An 8-GPU host at 650 W per GPU whose hottest GPU is at `hottest` °C.
pub fn hot_host(hottest: u8) -> HostTelemetry {
    let mut t = samples::host_telemetry(8);
    for (i, g) in t.gpus.iter_mut().enumerate() {
        g.temp = WholeCelsius(if i == 3 { hottest } else { hottest - 4 });
        g.power = Watts(650);
        g.power_limit = Watts(700);
    }
    t
}

/// A northbound link: its snapshots, and the BMS's side of its writes.
pub fn bms_link() -> (
    shell::NorthboundLink,
    tokio::sync::watch::Receiver<northbound::NorthboundSnapshot>,
    mpsc::Sender<Vec<NorthboundWrite>>,
) {
    let (snapshots, snap_rx) = northbound::snapshot_channel();
    let (bms, writes) = mpsc::channel(4);
    let link = shell::NorthboundLink {
        snapshots,
        writes: Some(writes),
    };
    (link, snap_rx, bms)
}

/// The simulated CDU's register map with `edit` applied to its TOML.
pub fn sim_map_edited(edit: impl FnOnce(&str) -> String) -> RegisterMap {
    let text = edit(include_str!("../../../boards/cdus/sim-cdu.toml"));
    RegisterMap::from_toml(&text, "sim-cdu.toml, edited").expect("the edited map")
}

/// Waits until the CDU's `valves_open` reads `want`, for at most `within`.
pub async fn valves_become(cdu: &SimCdu, want: f64, within: Duration) {
    let t0 = Instant::now();
    while cdu.setting("valves_open").unwrap() != want {
        assert!(
            t0.elapsed() < within,
            "valves_open {} after {:?}, {want} wanted",
            cdu.setting("valves_open").unwrap(),
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A flash file whose latched record no controller can read (version 9).
pub fn unreadable_flash(path: &std::path::Path) -> ControllerFlash {
    {
        let mut stores = loopwarden_store::agent_flash::open(Some(path)).expect("the flash file");
        futures::executor::block_on(
            stores
                .store
                .set(cooling_ctrl::journal::LATCHED_KEY, &[9u8; 16]),
        )
        .expect("written");
    }
    let flash = ControllerFlash::open(Some(path)).expect("the flash file again");
    assert!(flash.latched.is_err());
    flash
}

/// Waits (at most 10 s) for the valve of the leaking rack `rack` to be
/// closed by a valve word the CDU took, then checks that word was written
/// on the step whose reads first saw the rack wet (docs/safety.md: the
/// valve is told to close on that step), however long the steps took,
/// and that the CDU's valve word reads `open` (bit n = rack n open).
pub async fn closes_on_the_step_seen(rig: &mut Rig, rack: usize, open: f64) {
    let what = format!("rack {rack}'s leak seen and its valve closed");
    let s = rig
        .shell
        .wait(Duration::from_secs(10), &what, |s| {
            let steps = &s.leak_steps;
            steps.seen[rack].is_some() && steps.closed[rack].is_some()
        })
        .await;
    let (seen, closed) = (s.leak_steps.seen[rack], s.leak_steps.closed[rack]);
    assert_eq!(
        closed, seen,
        "rack {rack}'s valve closed on step {closed:?}, its leak first seen on step {seen:?}"
    );
    assert_eq!(rig.cdu.setting("valves_open").unwrap(), open);
}

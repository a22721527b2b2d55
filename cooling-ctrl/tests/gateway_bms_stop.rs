//! The gateway (`cooling-ctrl gateway`) and the BMS's limits, in
//! process, on a real mosquitto, with a microcontroller's line that
//! takes everything and says nothing:
//! - a write the northbound server could hand on while the gateway
//!   stops is kept in flash before it stops; once it stops taking them,
//!   the channel is closed, and the server refuses a write (exception 4)
//!   rather than answer it as taken and lose it (as `run`,
//!   `northbound_shutdown.rs`);
//! - the limits kept in flash go down when the line opens, without the
//!   closed line before it being said as one that refuses them.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::gateway::{self, link::LinkAddr, GatewayOptions, GatewayStats};
use cooling_ctrl::journal::{BmsKeeping, ControllerFlash};
use cooling_ctrl::northbound::{self, NorthboundWrite};
use cooling_ctrl::shell::{self, ShellConfig};
use loopwarden_protocol::Ident;
use loopwarden_system_tests::Mosquitto;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// A microcontroller's line on a free loopback port that takes whatever
/// comes down and says nothing; its address for the gateway.
async fn quiet_mcu() -> LinkAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut line, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                while matches!(line.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    LinkAddr::Tcp(addr.to_string())
}

/// A gateway running on a task of its own.
struct Gateway {
    stats: watch::Receiver<GatewayStats>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), shell::ShellError>>,
}

impl Gateway {
    /// The gateway of CDU `cdu-1` on `broker`, its flash `flash`, the
    /// BMS's writes from `writes`, its line to a quiet microcontroller.
    async fn start(
        broker: &Mosquitto,
        flash: ControllerFlash,
        writes: mpsc::Receiver<Vec<NorthboundWrite>>,
    ) -> Gateway {
        let cfg = ShellConfig::new(
            id("hall-g"),
            id("cdu-1"),
            broker.addr(),
            CoreConfig::default(),
        );
        let (snapshots, _) = northbound::snapshot_channel();
        let (stats_tx, stats) = gateway::stats_channel();
        let opts = GatewayOptions {
            stats: Some(stats_tx),
            bus: shell::BusOptions {
                flash: Some(flash),
                ..Default::default()
            },
            northbound: Some(shell::NorthboundLink {
                snapshots,
                writes: Some(writes),
            }),
            ..GatewayOptions::new(quiet_mcu().await)
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(gateway::run(cfg, opts, async {
            let _ = stopped.await;
        }));
        Gateway { stats, stop, task }
    }

    /// Waits up to 15 s for the stats `f` holds for; panics with `what`.
    async fn wait(&mut self, what: &str, f: impl FnMut(&GatewayStats) -> bool) -> GatewayStats {
        tokio::time::timeout(Duration::from_secs(15), self.stats.wait_for(f))
            .await
            .unwrap_or_else(|_| panic!("{what}: not within 15 s"))
            .expect("the gateway reports")
            .clone()
    }

    /// Tells it to stop and waits for it (up to 15 s).
    async fn stop(self) -> GatewayStats {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("the gateway stopped")
            .unwrap()
            .expect("the gateway ran");
        let last = self.stats.borrow().clone();
        last
    }
}

/// A BMS that writes a new setpoint ceiling every millisecond on `bms`
/// until the channel closes: the last ceiling the channel took, °C.
async fn write_until_closed(bms: mpsc::Sender<Vec<NorthboundWrite>>) -> Option<f32> {
    let mut last = None;
    for k in 0u32.. {
        let celsius = 25.0 + (k % 200) as f32 * 0.05;
        match bms.try_send(vec![NorthboundWrite::SetpointCeiling { celsius }]) {
            Ok(()) => last = Some(celsius),
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Closed(_)) => return last,
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    last
}

/// A BMS writes the ceiling on while the gateway is told to stop: every
/// write the channel took is kept before the gateway leaves the bus and
/// stops (a BMS writes a limit once, when it changes); after that the
/// channel is closed, though the gateway still takes up to 6 s to leave
/// the bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bms_write_while_the_gateway_stops_is_kept_or_refused() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file");
    let (bms, writes) = mpsc::channel(4);
    let mut gw = Gateway::start(&broker, flash, writes).await;
    gw.wait("the line open", |s| s.link_open).await;
    let writer = tokio::spawn(write_until_closed(bms));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stopping = tokio::spawn(gw.stop());
    let last = tokio::time::timeout(Duration::from_secs(15), writer)
        .await
        .expect("the channel closed once the gateway stopped taking writes")
        .unwrap()
        .expect("a write taken before the stop");
    stopping.await.unwrap();

    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    assert_eq!(
        flash.bms_limits,
        Ok(Some((last, 0.0))),
        "the last write the channel took is kept"
    );
}

/// What the log says, as text.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The gateway starts with the BMS's limits in flash, before its line
/// to the microcontroller is open: they go down once it opens, and the
/// log does not say a line that refuses them (nor that it takes them
/// again), nor are the limits counted unsent.
#[tokio::test]
async fn limits_restored_at_the_start_go_down_when_the_line_opens_unsaid() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cdu.flash");
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file");
    let mut keeping = BmsKeeping::after(flash.bms_limits_gen);
    keeping.changed((31.5, -1.0));
    keeping.offer(&flash.recorder);
    flash.recorder.flush().await;
    drop(flash);
    let flash = ControllerFlash::open(Some(&path)).expect("the flash file again");
    assert_eq!(flash.bms_limits, Ok(Some((31.5, -1.0))), "kept");

    // The gateway's loop and its tasks run on this thread: its log is
    // read here.
    let log = Log::default();
    let to = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || to.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let (_bms, writes) = mpsc::channel(4);
    let mut gw = Gateway::start(&broker, flash, writes).await;
    gw.wait("the limits down the opened line", |s| {
        s.link_open && s.bms_forwarded >= 1
    })
    .await;
    // Two more seconds of the line open.
    let ticks = gw.stats.borrow().ticks;
    gw.wait("two seconds", |s| s.ticks >= ticks + 2).await;
    let last = gw.stop().await;
    let said = log.text();
    assert!(
        said.contains("the BMS's limits restored from flash"),
        "{said}"
    );
    for not in ["were not handed", "takes the BMS's messages again"] {
        assert!(!said.contains(not), "{not:?} said:\n{said}");
    }
    assert_eq!(last.bms_forwarded, 1, "once when the line opened");
    // The gateway's first `Alive` may go before the line opens (a frame
    // not written: the line was down); nothing of the BMS's is counted.
    let unsent = last.link.frames_unsent;
    assert!(
        unsent <= 1,
        "{unsent} frames unsent: at most the first Alive"
    );
}

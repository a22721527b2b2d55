//! The broker `lwbus pki init` configures (mosquitto, TLS, client
//! certificates, the ACL), run as written, against what could knock an
//! agent off it: a publish larger than any frame or JSON mirror, retained
//! or live, on a topic a facility reader may write (a host's `resend`).
//!
//! A missing mosquitto skips the tests outside CI (`CI=true`: a failure).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_bus::pki::{init, InitArgs};
use loopwarden_bus::tls::{Tls, TlsFiles};
use loopwarden_bus::{BrokerAddr, Bus, BusConfig, MetricsSnapshot};
use loopwarden_protocol::{Ident, NodeId, Role};

const SITE: &str = "lab";
const RESEND: &str = "dc/v2/lab/host/h01/resend";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The generated broker, running; killed when dropped.
struct Broker {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Broker {
    /// Writes a site's PKI and starts mosquitto on its `mosquitto.conf`,
    /// or `None` when mosquitto is not installed (outside CI).
    fn start() -> Option<Broker> {
        let bin = [
            "/usr/sbin/mosquitto",
            "/usr/bin/mosquitto",
            "/sbin/mosquitto",
        ]
        .into_iter()
        .find(|p| Path::new(p).is_file());
        let Some(bin) = bin else {
            assert!(
                !in_ci(),
                "mosquitto not installed; CI=true, so this is a failure"
            );
            eprintln!("SKIP: mosquitto not installed");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let split = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
        init(&InitArgs {
            site: SITE.into(),
            hosts: split("h01"),
            cdus: split("cdu1"),
            operators: split("ops1"),
            readers: split("bms1"),
            out: dir.path().to_path_buf(),
            broker_port: port,
        })
        .expect("lwbus pki init");
        let log = std::fs::File::create(dir.path().join("mosquitto.log")).expect("a log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(dir.path().join("mosquitto.conf"))
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("mosquitto starts");
        let broker = Broker { child, port, dir };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "no broker:\n{}", broker.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(broker)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Host h01's bus over TLS, with `subscriptions` besides its own.
    fn host(&self, subscriptions: &[&str]) -> Bus {
        let tls = Tls::load(TlsFiles::of_identity(self.dir.path(), "h01")).expect("h01's TLS");
        let addr = BrokerAddr {
            host: "127.0.0.1".into(),
            port: self.port,
        };
        let site = Ident::new(SITE).expect("a site");
        let mut cfg = BusConfig::new(addr, site, NodeId::new(Role::Host, "h01").expect("h01"));
        cfg.tls = Some(tls);
        cfg.subscriptions = subscriptions.iter().map(|s| s.to_string()).collect();
        let (bus, _inbound, _task) = Bus::start(cfg);
        bus
    }

    /// `mosquitto_pub` as the facility reader bms1: `payload` on `topic`,
    /// QoS 1. Whether it succeeded.
    fn publish_as_reader(&self, topic: &str, payload: &[u8], retain: bool) -> bool {
        let file = self.dir.path().join("payload.bin");
        std::fs::write(&file, payload).expect("the payload file");
        let d = self.dir.path();
        let mut cmd = Command::new("mosquitto_pub");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q", "1"])
            .arg("--cafile")
            .arg(d.join("ca.crt"))
            .arg("--cert")
            .arg(d.join("bms1.crt"))
            .arg("--key")
            .arg(d.join("bms1.key"))
            .args(["-t", topic, "-f"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if retain {
            cmd.arg("-r");
        }
        cmd.status().expect("mosquitto_pub runs").success()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bus's counters once `done` holds of them (at most 10 s).
async fn once(bus: &Bus, done: impl Fn(&MetricsSnapshot) -> bool) -> MetricsSnapshot {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = bus.metrics();
        if done(&m) || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_publish_is_refused_by_the_broker_and_the_agent_stays_connected() {
    let Some(b) = Broker::start() else { return };
    let big = vec![0x55u8; 70_000];
    // Retained before the host connects: without the broker's limit it
    // reaches the host on every connection and drops it again each time.
    b.publish_as_reader(RESEND, &big, true);
    let host = b.host(&[]);
    assert!(
        host.wait_connected(Duration::from_secs(10)).await,
        "h01 connects\n{}",
        b.log()
    );
    // And once more while it is connected.
    b.publish_as_reader(RESEND, &big, false);
    // A small message after both: once the host has it, it has had (or
    // never will have) the large ones.
    assert!(b.publish_as_reader(RESEND, b"x", false), "{}", b.log());
    let m = once(&host, |m| m.rejected_malformed >= 1).await;
    assert_eq!(m.rejected_malformed, 1, "the small one arrived: {m}");
    assert_eq!(m.connection_errors, 0, "h01 was knocked off: {m}");
    assert!(host.is_connected());
}

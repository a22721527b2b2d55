//! `lwbus watch --sign-key` repairs the frames it missed, against a real
//! mosquitto and a real host agent.
//!
//! A node agent for h01 (twin GPUs, a keyring that lets the reader bms1
//! ask for resends and the operator ops1 lease) runs in this process.
//! Two `lwbus watch` processes reach the broker through a proxy: one with
//! bms1's sign key, one with the key of bms2, whom the keyring does not
//! know. The proxy is cut; meanwhile ops1 leases h01's GPUs (straight to
//! the broker), and h01 logs and publishes the caps it applied as an
//! event neither watch hears. Once the proxy is back, bms1's watch asks
//! h01 for the numbers it missed and prints the event once, marked
//! ` (resent)`; bms2's says once that h01 refuses it.
//!
//! `lwbus` is another package's program: the test runs the one built
//! beside this test (`cargo build -p loopwarden-bus --bin lwbus`, or a
//! workspace build); missing, it is a skip outside CI and a failure in CI.
//!
//! Glossary:
//! - *watch*: an `lwbus watch` process, its lines read as they come.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use loopwarden_bus::keys::{keyring_toml, SignKey};
use loopwarden_bus::{now_ms, Bus, BusConfig, Inbound};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::{
    CapLease, CapSource, CommandAuth, DurationMs, Event, Family, Frame, GpuCap, GpuSelector, Ident,
    Message, NodeId, ReasonCode, Role, Topic, Watts,
};
use loopwarden_system_tests::twin_agent::run_twin_agent;
use loopwarden_system_tests::{lwbus, CutProxy, Mosquitto};

const SITE: &str = "wr";

fn ident(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// A watch process, killed when dropped.
struct Watch {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
    /// Lines of standard output so far.
    seen: Vec<String>,
    /// Lines of standard error so far.
    said: Vec<String>,
}

fn lines(from: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

impl Watch {
    fn start(lwbus: &Path, port: u16, more: &[&str]) -> Watch {
        let mut child = Command::new(lwbus)
            .args(["watch", "--broker", &format!("127.0.0.1:{port}")])
            .args(["--site", SITE])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start lwbus watch");
        let out = lines(child.stdout.take().expect("its output"));
        let err = lines(child.stderr.take().expect("its errors"));
        Watch {
            child,
            out,
            err,
            seen: Vec::new(),
            said: Vec::new(),
        }
    }

    /// Waits up to `timeout` for a line of its output (`err`: of its
    /// errors) that `want` holds for.
    fn wait(&mut self, err: bool, timeout: Duration, want: impl Fn(&str) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let (rx, kept) = match err {
            true => (&self.err, &mut self.said),
            false => (&self.out, &mut self.seen),
        };
        if kept.iter().any(|l| want(l)) {
            return true;
        }
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = rx.recv_timeout(left) else {
                return false;
            };
            let found = want(&line);
            kept.push(line);
            if found {
                return true;
            }
        }
        false
    }

    fn dump(&self) -> String {
        format!(
            "output:\n{}\nerrors:\n{}",
            self.seen.join("\n"),
            self.said.join("\n")
        )
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key(role: Role, name: &str, seed: u8) -> SignKey {
    SignKey {
        node: NodeId::new(role, name).expect("a node"),
        key_id: 1,
        key: SigningKey::from_bytes(&[seed; 32]),
    }
}

/// Writes `key` as its sign key file (mode 600) in `dir`.
fn write_key(dir: &Path, key: &SignKey) -> PathBuf {
    let path = dir.join(format!("{}.sign.key", key.node.id));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("a sign key file");
    std::io::Write::write_all(&mut f, key.to_toml().as_bytes()).expect("the key written");
    path
}

fn signer(key: &SignKey, may: May) -> Signer {
    Signer {
        role: key.node.role,
        name: Some(key.node.id.clone()),
        key_id: key.key_id,
        key: key.key.verifying_key(),
        may,
    }
}

/// h01's keyring: ops1 may lease, bms1 may ask for resends.
fn write_keyring(dir: &Path, ops1: &SignKey, bms1: &SignKey) -> PathBuf {
    let lease = May {
        lease: true,
        release: false,
        resend: false,
    };
    let resend = May {
        lease: false,
        release: false,
        resend: true,
    };
    let text = keyring_toml(&ident(SITE), &[signer(ops1, lease), signer(bms1, resend)]);
    let path = dir.join("keyring.toml");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .expect("the keyring file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("the keyring written");
    path
}

/// The h01 agent on two twin GPUs with `keyring`, on a thread of its
/// own; stopped when the sender is dropped.
fn start_h01(port: u16, dir: &Path, keyring: PathBuf) -> tokio::sync::oneshot::Sender<()> {
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(format!("127.0.0.1:{port}")),
            console: Some(dir.join("h01.sock")),
            ..Default::default()
        },
        host: Some("h01".into()),
        twin_gpus: Some(2),
        keyring: Some(keyring),
        period_ms: Some(200),
        ..Default::default()
    };
    run_twin_agent(&flags, 2, 7)
}

fn topic(family: Family) -> Topic {
    Topic::new(&ident(SITE), Role::Host, &ident("h01"), family)
}

/// ops1's lease of every GPU of h01 at 400 W for a minute, signed.
fn lease(ops1: &SignKey, seq: u32) -> Frame {
    let mut f = Frame {
        sender: ops1.node.clone(),
        seq,
        time: now_ms(),
        message: Message::CapLease(CapLease {
            lease: seq,
            source: CapSource::Operator,
            reason: ReasonCode::CAPACITY_SHORT,
            caps: [GpuCap {
                gpus: GpuSelector::All,
                limit: Watts(400),
            }]
            .into_iter()
            .collect(),
            duration: DurationMs(60_000),
            auth: CommandAuth::default(),
        }),
    };
    f.sign(&topic(Family::Cmd), ops1.key_id, &ops1.key)
        .expect("a lease signs");
    f
}

/// Leases h01's GPUs as ops1, straight to the broker, and returns the
/// number of the event h01 publishes for the caps it applied.
fn lease_and_hear_the_event(rt: &tokio::runtime::Runtime, port: u16, ops1: &SignKey) -> u32 {
    let addr: loopwarden_bus::BrokerAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    let mut cfg = BusConfig::new(addr, ident(SITE), ops1.node.clone());
    cfg.subscriptions = vec![topic(Family::Event).to_string()];
    let _runtime = rt.enter();
    let (bus, mut events, _task) = Bus::start(cfg);
    rt.block_on(async {
        assert!(bus.wait_connected(Duration::from_secs(10)).await);
        // The subscription is live once the broker answered the connection.
        tokio::time::sleep(Duration::from_millis(300)).await;
        bus.publish_frame(&topic(Family::Cmd), &lease(ops1, 1))
            .expect("the lease goes");
        let caps = tokio::time::timeout(Duration::from_secs(15), async {
            while let Some(Inbound { frame, .. }) = events.recv().await {
                if matches!(frame.message, Message::Event(Event::CapsApplied { .. })) {
                    return frame.seq;
                }
            }
            panic!("the bus stopped");
        });
        let seq = caps.await.expect("h01 applies the lease and says so");
        let _ = bus.shutdown(Duration::from_secs(2)).await;
        seq
    })
}

#[test]
fn a_watch_asks_for_the_events_it_missed_and_prints_them_once_marked_resent() {
    let Some(lwbus) = lwbus() else { return };
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (ops1, bms1, bms2) = (
        key(Role::Operator, "ops1", 1),
        key(Role::Facility, "bms1", 2),
        key(Role::Facility, "bms2", 3),
    );
    let keyring = write_keyring(dir.path(), &ops1, &bms1);
    let _h01 = start_h01(broker.port(), dir.path(), keyring);
    let proxy = CutProxy::start(([127, 0, 0, 1], broker.port()).into());
    let bms1_key = write_key(dir.path(), &bms1).display().to_string();
    let bms2_key = write_key(dir.path(), &bms2).display().to_string();
    let mut reader = Watch::start(&lwbus, proxy.addr().port, &["--sign-key", &bms1_key]);
    let mut stranger = Watch::start(&lwbus, proxy.addr().port, &["--sign-key", &bms2_key]);
    for w in [&mut reader, &mut stranger] {
        let telemetry = |l: &str| l.contains(" host/h01/telemetry ");
        assert!(
            w.wait(false, Duration::from_secs(20), telemetry),
            "h01's telemetry\n{}",
            w.dump()
        );
    }

    proxy.cut();
    std::thread::sleep(Duration::from_millis(500));
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let missed = lease_and_hear_the_event(&rt, broker.port(), &ops1);
    std::thread::sleep(Duration::from_millis(300));
    proxy.restore();

    let repaired = |l: &str| {
        l.contains(" host/h01/event ")
            && l.contains(&format!(" seq {missed} "))
            && l.ends_with(" (resent)")
    };
    assert!(
        reader.wait(false, Duration::from_secs(30), repaired),
        "event {missed} resent to bms1\n{}",
        reader.dump()
    );
    let refused = |l: &str| l.contains("host/h01 refuses this reader's resend requests");
    assert!(
        stranger.wait(true, Duration::from_secs(30), refused),
        "h01 refuses bms2\n{}",
        stranger.dump()
    );
    // Long enough for a second request's answer, were one asked.
    reader.wait(false, Duration::from_secs(4), |_| false);
    let shown = reader
        .seen
        .iter()
        .filter(|l| l.contains(&format!(" seq {missed} ")) && l.contains(" host/h01/event "));
    assert_eq!(shown.count(), 1, "printed once\n{}", reader.dump());
    assert!(!reader.said.iter().any(|l| refused(l)), "{}", reader.dump());
    stranger.wait(true, Duration::from_secs(1), |_| false);
    assert_eq!(
        stranger.said.iter().filter(|l| refused(l)).count(),
        1,
        "said once\n{}",
        stranger.dump()
    );
}

#[test]
fn without_a_key_a_watch_says_gaps_stay_open_and_a_cdus_key_is_refused() {
    let Some(lwbus) = lwbus() else { return };
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let mut plain = Watch::start(&lwbus, broker.port(), &[]);
    let note = |l: &str| l.contains("gaps are not repaired without --sign-key");
    assert!(
        plain.wait(true, Duration::from_secs(10), note),
        "{}",
        plain.dump()
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let cdu1 = write_key(dir.path(), &key(Role::Cdu, "cdu1", 4));
    let out = Command::new(&lwbus)
        .args(["watch", "--broker", &format!("127.0.0.1:{}", broker.port())])
        .arg("--sign-key")
        .arg(&cdu1)
        .output()
        .expect("lwbus runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the key of cdu/cdu1, a cdu"), "{err}");
    assert!(err.contains("a reader's (facility/NAME)"), "{err}");
}

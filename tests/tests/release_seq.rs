//! Two `lwbus release` runs by one operator at once, against a real
//! mosquitto and a real host agent: each gets a number of its own, so
//! each reads its own ack, and a run that says `released` (exit 0) has
//! put its GPU back in service.
//!
//! A node agent for h01 (two twin GPUs, a keyring that lets the operator
//! ops1 release) runs in this process. XID 79 on both GPUs quarantines
//! them; two `lwbus release` processes with ops1's sign key release GPU 0
//! and GPU 1 in the same second. The sign key is a group's (0640) in a
//! directory the operator cannot write; the runs keep their numbers in
//! the operator's state directory (`XDG_STATE_HOME`), not beside it.
//!
//! `lwbus` is another package's program: the test runs the one built
//! beside this test (`cargo build -p loopwarden-bus --bin lwbus`, or a
//! workspace build); missing, it is a skip outside CI and a failure in CI.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use loopwarden_bus::keys::{keyring_toml, SignKey};
use loopwarden_bus::{Bus, BusConfig, Inbound};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::{Family, HealthState, Ident, Message, NodeId, Role, Topic};
use loopwarden_system_tests::{lwbus, Mosquitto};
use node_agent::sim_gpus::{TwinControl, TwinFault, TwinSource};

const SITE: &str = "rs";

fn ident(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

/// Writes `text` to a new file `name` in `dir` with `mode`.
fn write_new(dir: &Path, name: &str, mode: u32, text: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .expect("a new file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("written");
    path
}

/// h01's agent on two twin GPUs, ops1 in its keyring with the right to
/// release; it stops when the sender is dropped.
fn start_h01(
    port: u16,
    dir: &Path,
    ops1: &SignKey,
) -> (tokio::sync::oneshot::Sender<()>, TwinControl) {
    let release = May {
        lease: false,
        release: true,
        resend: false,
    };
    let signer = Signer {
        role: Role::Operator,
        name: Some(ops1.node.id.clone()),
        key_id: ops1.key_id,
        key: ops1.key.verifying_key(),
        may: release,
    };
    let keyring = keyring_toml(&ident(SITE), &[signer]);
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(format!("127.0.0.1:{port}")),
            console: Some(dir.join("h01.sock")),
            ..Default::default()
        },
        host: Some("h01".into()),
        twin_gpus: Some(2),
        keyring: Some(write_new(dir, "keyring.toml", 0o644, &keyring)),
        period_ms: Some(200),
        ..Default::default()
    };
    let config = node_agent::config::load(None, &flags).expect("the agent's config");
    let board = loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("board");
    let source = TwinSource::new(&board, 2, 11);
    let control = source.control();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("a runtime");
        rt.block_on(node_agent::shell::run(config, Box::new(source), async {
            let _ = rx.await;
        }))
    });
    (tx, control)
}

/// Waits up to `timeout` for h01's health to give GPU 0 and GPU 1
/// `want`; the last states heard.
fn wait_health(
    rt: &tokio::runtime::Runtime,
    health: &mut tokio::sync::mpsc::Receiver<Inbound>,
    last: &mut [Option<HealthState>; 2],
    timeout: Duration,
    want: impl Fn(&[Option<HealthState>; 2]) -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    rt.block_on(async {
        while !want(last) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            let Ok(Some(m)) = tokio::time::timeout(left, health.recv()).await else {
                return false;
            };
            if let Message::HostHealth(h) = m.frame.message {
                for g in &h.gpus {
                    if let Some(s) = last.get_mut(g.gpu.get() as usize) {
                        *s = Some(g.state);
                    }
                }
            }
        }
        true
    })
}

#[test]
fn two_releases_at_once_each_read_their_own_ack_and_exit_0_only_when_done() {
    let Some(lwbus) = lwbus() else { return };
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ops1 = SignKey {
        node: NodeId::new(Role::Operator, "ops1").expect("a node"),
        key_id: 1,
        key: SigningKey::from_bytes(&[5; 32]),
    };
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).expect("a key directory");
    let key_file = write_new(&keys, "ops1.sign.key", 0o640, &ops1.to_toml());
    let read_only = |mode| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    read_only(0o550);
    let state = dir.path().join("state");
    let (_h01, twin) = start_h01(broker.port(), dir.path(), &ops1);

    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let addr: loopwarden_bus::BrokerAddr = format!("127.0.0.1:{}", broker.port())
        .parse()
        .expect("an address");
    let mut cfg = BusConfig::new(
        addr,
        ident(SITE),
        NodeId::new(Role::Operator, "t1").unwrap(),
    );
    let health_topic = Topic::new(&ident(SITE), Role::Host, &ident("h01"), Family::Health);
    cfg.subscriptions = vec![health_topic.to_string()];
    let (_bus, mut health, _task) = {
        let _in = rt.enter();
        Bus::start(cfg)
    };
    let mut last = [None; 2];
    let both = |s: HealthState| move |l: &[Option<HealthState>; 2]| l.iter().all(|g| *g == Some(s));
    assert!(
        wait_health(
            &rt,
            &mut health,
            &mut last,
            Duration::from_secs(20),
            both(HealthState::Healthy)
        ),
        "h01 says its GPUs are healthy: {last:?}"
    );
    for gpu in [0, 1] {
        twin.inject(TwinFault::Xid { gpu, xid: 79 })
            .expect("an XID injected");
    }
    assert!(
        wait_health(
            &rt,
            &mut health,
            &mut last,
            Duration::from_secs(20),
            both(HealthState::Quarantined)
        ),
        "XID 79 quarantines both: {last:?}"
    );

    let runs: Vec<_> = [0, 1]
        .map(|gpu| {
            Command::new(&lwbus)
                .args([
                    "release",
                    "--broker",
                    &format!("127.0.0.1:{}", broker.port()),
                ])
                .args(["--site", SITE, "--host", "h01", "--gpu", &gpu.to_string()])
                .args(["--note", "reseated and tested"])
                .arg("--sign-key")
                .arg(&key_file)
                .env("XDG_STATE_HOME", &state)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("lwbus release starts")
        })
        .into_iter()
        .map(|c| c.wait_with_output().expect("lwbus release ends"))
        .collect();
    let said = |o: &std::process::Output| {
        format!(
            "exit {:?}\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let released: Vec<bool> = runs.iter().map(|o| o.status.success()).collect();
    wait_health(&rt, &mut health, &mut last, Duration::from_secs(5), |l| {
        (0..2).all(|g| !released[g] || l[g] == Some(HealthState::Healthy))
    });
    for (gpu, run) in runs.iter().enumerate() {
        // Success means the GPU is back in service, and nothing else.
        if run.status.success() {
            assert_eq!(
                last[gpu],
                Some(HealthState::Healthy),
                "GPU {gpu}'s run said released:\n{}",
                said(run)
            );
            let out = String::from_utf8_lossy(&run.stdout);
            assert_eq!(out.trim(), format!("GPU {gpu} of h01 released"));
        }
        // One after the other, both are taken.
        assert!(run.status.success(), "GPU {gpu}:\n{}", said(run));
    }
    let kept = state.join("loopwarden/release-operator-ops1-k1.seq");
    let seq = std::fs::read_to_string(&kept).expect("kept");
    assert_eq!(seq.len(), 11, "{seq:?}");
    read_only(0o700);
    let beside: Vec<_> = std::fs::read_dir(&keys)
        .expect("the key directory")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(beside, ["ops1.sign.key"], "nothing written beside the key");
}

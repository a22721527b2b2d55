//! Forged and out-of-bounds cap leases against a real host agent over TLS.
//!
//! The site is written by `lwbus pki init` (hosts h01 under cdu1 and h02
//! under cdu2, operator ops1, reader bms1) and served by mosquitto with its
//! certificates and ACL. A node agent for h01 (twin GPUs, its own
//! certificate, the site's keyring) runs in this process. Each lease is
//! built here, encoded, and published with `mosquitto_pub -f` under
//! ops1's certificate, the one identity the ACL lets command any host: so
//! what is tested is the host's own check, the layer behind the ACL (a
//! stolen operator laptop without the operator's sign key, a leaked
//! controller key). The acks are read back over TLS as the reader bms1.
//!
//! Glossary:
//! - *attempt*: one lease frame published and the ack that answers it.

use std::time::Duration;

use loopwarden_bus::keys::read_sign_key;
use loopwarden_bus::tls::{Tls, TlsFiles};
use loopwarden_bus::{now_ms, Bus, BusConfig, Inbound};
use loopwarden_field::common::CommonFlags;
use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::{
    Ack, AckCode, CapLease, CapSource, CommandAuth, DurationMs, Family, Frame, GpuCap, GpuSelector,
    Ident, Message, NodeId, ReasonCode, Role, TimestampMs, Topic, Watts,
};
use loopwarden_system_tests::twin_agent::run_twin_agent;
use loopwarden_system_tests::PkiBroker;
use tokio::sync::mpsc;

const SITE: &str = "lab";

fn ident(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

fn h01_cmd() -> Topic {
    Topic::new(&ident(SITE), Role::Host, &ident("h01"), Family::Cmd)
}

/// A lease of every GPU at 400 W from `sender`, stamped `time`, for `ms`.
fn lease(sender: NodeId, seq: u32, time: TimestampMs, ms: u32) -> Frame {
    Frame {
        sender,
        seq,
        time,
        message: Message::CapLease(CapLease {
            lease: seq,
            source: CapSource::Cooling,
            reason: ReasonCode::CAPACITY_SHORT,
            caps: [GpuCap {
                gpus: GpuSelector::All,
                limit: Watts(400),
            }]
            .into_iter()
            .collect(),
            duration: DurationMs(ms),
            auth: CommandAuth::default(),
        }),
    }
}

fn signed(mut f: Frame, key_id: u8, key: &SigningKey) -> Frame {
    f.sign(&h01_cmd(), key_id, key).expect("a lease signs");
    f
}

/// The h01 agent on twin GPUs with its certificate and the keyring, on
/// a thread of its own; stopped when the sender is dropped.
fn start_h01(b: &PkiBroker) -> tokio::sync::oneshot::Sender<()> {
    let d = b.dir();
    let flags = node_agent::config::Overrides {
        common: CommonFlags {
            site: Some(SITE.into()),
            broker: Some(format!("127.0.0.1:{}", b.port())),
            console: Some(d.join("h01.sock")),
            tls_ca: Some(d.join("ca.crt")),
            tls_cert: Some(d.join("h01.crt")),
            tls_key: Some(d.join("h01.key")),
            ..Default::default()
        },
        host: Some("h01".into()),
        twin_gpus: Some(2),
        cdu: Some("cdu1".into()),
        keyring: Some(d.join("keyring.toml")),
        period_ms: Some(200),
        ..Default::default()
    };
    run_twin_agent(&flags, 2, 7)
}

/// The reader bms1 on h01's acks, over TLS.
async fn ack_reader(b: &PkiBroker) -> (Bus, mpsc::Receiver<Inbound>) {
    let tls = Tls::load(TlsFiles::of_identity(b.dir(), "bms1")).expect("bms1's TLS identity");
    let addr: loopwarden_bus::BrokerAddr = format!("127.0.0.1:{}", b.port())
        .parse()
        .expect("an address");
    let mut cfg = BusConfig::new(
        addr,
        ident(SITE),
        NodeId::new(Role::Facility, "bms1").unwrap(),
    );
    cfg.tls = Some(tls);
    cfg.subscriptions =
        vec![Topic::new(&ident(SITE), Role::Host, &ident("h01"), Family::Ack).to_string()];
    let (bus, inbound, _task) = Bus::start(cfg);
    assert!(
        bus.wait_connected(Duration::from_secs(10)).await,
        "bms1 connects over TLS\n{}",
        b.log()
    );
    (bus, inbound)
}

/// Publishes `frame` on h01's cmd topic with `mosquitto_pub -f` as ops1.
fn publish(b: &PkiBroker, frame: &Frame) {
    let bytes = frame.to_vec().expect("a frame encodes");
    let file = b
        .dir()
        .join(format!("lease-{}-{}.bin", frame.sender.id, frame.seq));
    std::fs::write(&file, bytes).expect("the frame file");
    let mut cmd = b
        .client("mosquitto_pub", Some("ops1"))
        .expect("mosquitto_pub");
    cmd.args(["-q", "1", "-t", &h01_cmd().to_string(), "-f"])
        .arg(&file);
    let out = cmd.output().expect("mosquitto_pub runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Publishes `frame` and returns h01's ack to it.
async fn attempt(b: &PkiBroker, acks: &mut mpsc::Receiver<Inbound>, frame: &Frame) -> Ack {
    publish(b, frame);
    let wait = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(m) = acks.recv().await {
            if let Message::Ack(a) = m.frame.message {
                if a.correlation.from == frame.sender && a.correlation.seq == frame.seq {
                    return a;
                }
            }
        }
        panic!("the ack stream ended");
    });
    wait.await.unwrap_or_else(|_| {
        panic!(
            "no ack from h01 to {}/{} seq {}\n{}",
            frame.sender.role.as_str(),
            frame.sender.id,
            frame.seq,
            b.log()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h01_refuses_forged_foreign_replayed_expired_and_too_long_leases() {
    let Some(b) = PkiBroker::start(SITE, ["h01@cdu1,h02@cdu2", "cdu1,cdu2", "ops1", "bms1"]) else {
        return;
    };
    let (_reader, mut acks) = ack_reader(&b).await;
    let _h01 = start_h01(&b);
    let cdu1 = read_sign_key(&b.dir().join("cdu1.sign.key")).expect("cdu1's key");
    let cdu2 = read_sign_key(&b.dir().join("cdu2.sign.key")).expect("cdu2's key");
    let stranger = SigningKey::from_bytes(&[0x42; 32]);
    let now = now_ms();
    let minute: u32 = 60_000;

    // h01's own controller, fresh and within the cap: taken. The agent
    // may still be connecting, or have started after the stamp (with no
    // floor kept, what was signed before its start is a replay): the
    // first attempt is repeated (new seq).
    let mut taken = None;
    for seq in 10..20 {
        let f = signed(
            lease(cdu1.node.clone(), seq, now_ms(), minute),
            1,
            &cdu1.key,
        );
        let sent = tokio::time::timeout(Duration::from_secs(3), attempt(&b, &mut acks, &f));
        match sent.await {
            Ok(a) if a.code == AckCode::Replayed => {}
            Ok(a) => {
                taken = Some((f, a));
                break;
            }
            Err(_) => {}
        }
    }
    let (good, ack) = taken.expect("h01 answers its controller");
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());

    let cases: Vec<(&str, Frame, AckCode)> = vec![
        (
            "signed by a key not in the keyring, under the controller's name",
            signed(lease(cdu1.node.clone(), 30, now, minute), 1, &stranger),
            AckCode::Unauthenticated,
        ),
        (
            "signed by a host's key, as that host",
            signed(
                lease(NodeId::new(Role::Host, "h02").unwrap(), 1, now, minute),
                1,
                &stranger,
            ),
            AckCode::Unauthenticated,
        ),
        (
            "signed by another CDU's controller, for a host it does not cool",
            signed(lease(cdu2.node.clone(), 1, now, minute), 1, &cdu2.key),
            AckCode::Forbidden,
        ),
        // Stamped as the one taken (after the start): refused by the
        // floor that lease raised, not by the start floor.
        (
            "another lease under the seq of the one taken",
            signed(
                lease(cdu1.node.clone(), good.seq, good.time, 2 * minute),
                1,
                &cdu1.key,
            ),
            AckCode::Replayed,
        ),
        // Delivered again (at least once): answered as it was, a copy.
        ("the lease taken, again", good.clone(), AckCode::Ok),
        (
            "stamped 10 minutes ago",
            signed(
                lease(
                    cdu1.node.clone(),
                    31,
                    TimestampMs(now.0 - 10 * u64::from(minute)),
                    minute,
                ),
                1,
                &cdu1.key,
            ),
            AckCode::Expired,
        ),
        // Not refused: taken for the host's longest, and said.
        (
            "longer than the host's 10-minute cap",
            signed(
                lease(cdu1.node.clone(), 32, now_ms(), 11 * minute),
                1,
                &cdu1.key,
            ),
            AckCode::Clamped,
        ),
    ];
    let floor = format!("is not above seq {} or stamp {}", good.seq, good.time.0);
    for (what, frame, code) in cases {
        let ack = attempt(&b, &mut acks, &frame).await;
        assert_eq!(ack.code, code, "{what}: {}", ack.detail.as_str());
        assert!(!ack.detail.as_str().is_empty(), "{what}: the ack says why");
        if code == AckCode::Replayed {
            assert!(
                ack.detail.as_str().contains(&floor),
                "{what}: refused by the floor of the lease taken: {}",
                ack.detail.as_str()
            );
        }
    }
}

//! An attacker on the bus against a host: forged CDU states, and commands
//! replayed across a restart.
//!
//! A CDU state with a rack's cooling `lost` makes that rack's hosts drain
//! and power down. The host under test (rack 2, cooled by `cdu-a`) runs
//! with a site keyring that holds `cdu-a`'s and `cdu-b`'s public keys, and
//! a drain action that writes to a log. A broker that lets anything
//! through (plain mosquitto, no ACL) carries an attacker's states to it:
//! one sent in a host's name, one unsigned, one signed with another CDU's
//! key, one signed by `cdu-b` for its own topic and copied to `cdu-a`'s,
//! and one signed by `cdu-b` in its own name. None makes the host drain.
//! Then `cdu-a`'s own signed state does, within the same wait: the test
//! would see a drain if there were one.
//!
//! A signed command the host refused is sent again after the agent was
//! killed and started again: it is refused as `replayed`, because the
//! host kept its sender's last sequence number in flash (it would
//! otherwise be judged afresh for as long as its stamp is fresh).
//!
//! An older signed state of the host's own CDU sent again after the agent
//! restarted (a "cooled" that would end the rack's cooling loss) is
//! refused as a replay: the host kept the last state it took in flash.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::time::{Duration, Instant};

use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::{
    AckCode, Family, Frame, GpuSelector, Ident, Message, NodeId, Role, Topic,
};
use node_agent::config::Overrides;

use rig::{now, Rig, SITE};

fn ident(s: &str) -> Ident {
    Ident::new(s).expect("ident")
}

/// `cdu`'s `health` topic, where its state is retained.
fn state_topic(cdu: &str) -> Topic {
    Topic::new(&ident(SITE), Role::Cdu, &ident(cdu), Family::Health)
}

/// A state with rack 2's cooling lost, sent as `sender` with `seq`.
fn rack2_lost(sender: NodeId, seq: u32) -> Frame {
    Frame {
        sender,
        seq,
        time: now(),
        message: Message::CduState(rig::cdu_state(true)),
    }
}

fn cdu_signer(name: &str, key: &SigningKey) -> Signer {
    Signer {
        role: Role::Cdu,
        name: Some(ident(name)),
        key_id: 1,
        key: key.verifying_key(),
        may: May {
            lease: true,
            release: false,
            resend: false,
        },
    }
}

#[test]
fn a_cdu_state_in_a_hosts_name_unsigned_or_signed_by_another_cdu_changes_nothing() {
    let Some(rig) = Rig::start("h31") else {
        return;
    };
    let (key_a, key_b) = (
        SigningKey::from_bytes(&[0xa1; 32]),
        SigningKey::from_bytes(&[0xb2; 32]),
    );
    let ring = rig.dir.path().join("keyring.toml");
    let signers = [cdu_signer("cdu-a", &key_a), cdu_signer("cdu-b", &key_b)];
    std::fs::write(
        &ring,
        loopwarden_bus::keys::keyring_toml(&ident(SITE), &signers),
    )
    .expect("keyring");
    let (flags, log) = rig.noted_cooling_steps(2, 60);
    let flags = Overrides {
        keyring: Some(ring),
        ..flags
    };
    let agent = rig.agent(2).flags(flags).flash().start();
    std::thread::sleep(Duration::from_millis(800));

    let a_topic = state_topic("cdu-a");
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("node");
    let cdu_b = NodeId::new(Role::Cdu, "cdu-b").expect("node");
    let in_a_hosts_name = rack2_lost(NodeId::new(Role::Host, "h30").expect("node"), 10);
    let unsigned = rack2_lost(cdu_a.clone(), 11);
    let mut with_bs_key = rack2_lost(cdu_a.clone(), 12);
    with_bs_key.sign(&a_topic, 1, &key_b).expect("signs");
    let mut bs_own_copied = rack2_lost(cdu_b.clone(), 13);
    bs_own_copied
        .sign(&state_topic("cdu-b"), 1, &key_b)
        .expect("signs");
    let mut b_in_its_name = rack2_lost(cdu_b, 14);
    b_in_its_name.sign(&a_topic, 1, &key_b).expect("signs");
    let publish = |f: &Frame| {
        let bytes = f.to_vec().expect("encodes");
        rig.publish(&a_topic.build().expect("topic"), &bytes, true);
    };
    for forged in [
        &in_a_hosts_name,
        &unsigned,
        &with_bs_key,
        &bs_own_copied,
        &b_in_its_name,
    ] {
        publish(forged);
    }
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait = Instant::now() + Duration::from_secs(3);
    while Instant::now() < wait && read().is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(), "", "a forged state made the host act");

    // The host's own controller, signing with its key: the host drains,
    // as fast as the wait above allowed the forgeries.
    let mut real = rack2_lost(cdu_a, 15);
    real.sign(&a_topic, 1, &key_a).expect("signs");
    publish(&real);
    let wait = Instant::now() + Duration::from_secs(3);
    while Instant::now() < wait && !read().contains("drain h31 2") {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(read(), "drain h31 2\n", "cdu-a's own state is acted on");
    agent.stop();
}

#[test]
fn a_refused_command_sent_again_after_a_restart_is_refused_as_replayed() {
    let Some(rig) = Rig::start("h32") else {
        return;
    };
    let mut sub = rig.subscribe(&["ack"]);
    let mut agent = rig.spawn_on_flash();
    // No time at all: malformed, refused after its seq counted.
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("node");
    let mut no_time = rig::lease_from(cdu_a, 700, 1, &[(GpuSelector::All, 400)], 0);
    no_time
        .sign(
            &rig.cmd_topic(),
            1,
            &loopwarden_protocol::samples::demo_signing_key(),
        )
        .expect("signs");
    let ack = rig.ack(&mut sub, &no_time);
    assert_eq!(ack.code, AckCode::Malformed, "{}", ack.detail.as_str());
    agent.crash();
    let _agent = rig.spawn_on_flash();
    // The outbox may send the first ack again after the restart: the
    // answer to the copy is an ack of its seq that is not that one (and
    // none comes if the copy is judged afresh, refused as malformed again).
    rig.send(&no_time);
    let answer = |s: &loopwarden_system_tests::Seen| {
        rig::frame(s).and_then(|f| match f.message {
            Message::Ack(a) if a.correlation.seq == 700 && a.code != AckCode::Malformed => Some(a),
            _ => None,
        })
    };
    let seen = sub.collect_until(Duration::from_secs(10), |s| {
        s.iter().any(|x| answer(x).is_some())
    });
    let ack = seen.iter().find_map(answer).expect("the copy is answered");
    assert_eq!(ack.code, AckCode::Replayed, "{}", ack.detail.as_str());
    // By the floor kept (without it, only the start floor would refuse
    // it, saying so).
    assert!(
        ack.detail.as_str().contains("is not above seq 700"),
        "refused by the floor kept: {}",
        ack.detail.as_str()
    );
}

#[test]
fn an_older_cdu_state_sent_again_after_a_restart_does_not_end_a_cooling_loss() {
    let Some(rig) = Rig::start("h33") else {
        return;
    };
    let key_a = SigningKey::from_bytes(&[0xa1; 32]);
    let ring = rig.dir.path().join("keyring.toml");
    std::fs::write(
        &ring,
        loopwarden_bus::keys::keyring_toml(&ident(SITE), &[cdu_signer("cdu-a", &key_a)]),
    )
    .expect("keyring");
    let (flags, log) = rig.noted_cooling_steps(2, 600);
    let flags = Overrides {
        keyring: Some(ring),
        ..flags
    };
    let a_topic = state_topic("cdu-a");
    let cdu_a = NodeId::new(Role::Cdu, "cdu-a").expect("node");
    let state = |seq: u32, lost: bool| {
        let mut f = Frame {
            message: Message::CduState(rig::cdu_state(lost)),
            ..rack2_lost(cdu_a.clone(), seq)
        };
        f.sign(&a_topic, 1, &key_a).expect("signs");
        f
    };
    let publish = |f: &Frame| {
        let bytes = f.to_vec().expect("encodes");
        rig.publish(&a_topic.build().expect("topic"), &bytes, true);
    };
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let until = |want: &str| {
        let wait = Instant::now() + Duration::from_secs(5);
        while Instant::now() < wait && !read().ends_with(want) {
            std::thread::sleep(Duration::from_millis(50));
        }
        read()
    };
    let agent = rig.agent(2).flags(flags.clone()).flash().start();
    std::thread::sleep(Duration::from_millis(800));
    // Lost, cooled, lost again: the host drains, resumes, drains.
    let cooled = state(21, false);
    for (f, step) in [
        (state(20, true), "drain h33 2\n"),
        (cooled.clone(), "resume h33 2\n"),
        (state(22, true), "drain h33 2\n"),
    ] {
        publish(&f);
        until(step);
    }
    let before = read();
    assert_eq!(before.lines().count(), 3, "{before}");
    agent.stop();

    // While the agent is down, the "cooled" of seq 21 is sent again
    // (retained, so it is the first state the agent meets at its start),
    // within its stamp's 5 minutes: older than the last state taken (22).
    publish(&cooled);
    let agent = rig.agent(2).flags(flags.clone()).flash().start();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(read(), before, "a replayed state ended the loss");
    // The controller's own next "cooled" does, within the same wait.
    publish(&state(23, false));
    assert!(
        until("resume h33 2\n").ends_with("resume h33 2\n"),
        "{}",
        read()
    );
    agent.stop();
}

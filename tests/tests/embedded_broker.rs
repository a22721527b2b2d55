//! The zero-install default broker (rumqttd inside the process) talks to
//! clients nobody here wrote: `mosquitto_sub` reads our retained frames
//! byte-exact, `mosquitto_pub` delivers a command to the bus shell, and a
//! damaged frame is refused with a typed error and counted, never a crash.

use std::time::Duration;

use loopwarden_bus::embedded::EmbeddedBroker;
use loopwarden_bus::{now_ms, Bus, BusConfig};
use loopwarden_protocol::{samples, Family, Ident, MessageKind, NodeId, Role};
use loopwarden_system_tests::{free_port, publish_raw, require_tool, retained};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_broker_serves_third_party_clients() {
    if require_tool("mosquitto_sub").is_none() || require_tool("mosquitto_pub").is_none() {
        return;
    }
    // Its own port: rumqttd cannot be stopped, it lives until the test process ends.
    let broker = EmbeddedBroker::start(([127, 0, 0, 1], free_port()).into()).unwrap();
    let port = broker.addr().port();
    let config = BusConfig::new(
        broker.broker_addr(),
        Ident::new("t-emb").unwrap(),
        NodeId::new(Role::Host, "h01").unwrap(),
    );
    let (bus, mut inbound, _task) = Bus::start(config);
    assert!(bus.wait_connected(Duration::from_secs(10)).await);

    let health = bus
        .publish(samples::message(MessageKind::HostHealth), now_ms())
        .unwrap();
    // Retained once the broker has it: poll rather than guess a delay.
    let mut late = Vec::new();
    for _ in 0..20 {
        late = retained(
            port,
            &["dc/v2/t-emb/host/h01/health"],
            Duration::from_secs(1),
        )
        .unwrap();
        if !late.is_empty() {
            break;
        }
    }
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0].payload, health.to_vec().unwrap());

    // A command from a third-party client reaches the shell and decodes.
    let cmd = samples::frame(MessageKind::QuarantineRelease);
    let cmd_topic = "dc/v2/t-emb/host/h01/cmd";
    publish_raw(port, cmd_topic, &cmd.to_vec().unwrap(), false).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), inbound.recv())
        .await
        .expect("command delivered")
        .unwrap();
    assert_eq!(got.topic.family, Family::Cmd);
    assert_eq!(got.frame, cmd);

    // A damaged command is refused and counted; the shell keeps running.
    let mut bad = cmd.to_vec().unwrap();
    bad[10] ^= 0x40;
    publish_raw(port, cmd_topic, &bad, false).unwrap();
    publish_raw(port, cmd_topic, b"not a frame at all", false).unwrap();
    for _ in 0..50 {
        if bus.metrics().rejected_bad_crc >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(bus.metrics().rejected_bad_crc, 2, "{}", bus.metrics());
    publish_raw(port, cmd_topic, &cmd.to_vec().unwrap(), false).unwrap();
    let again = tokio::time::timeout(Duration::from_secs(10), inbound.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.frame, cmd, "still serving after bad input");
}

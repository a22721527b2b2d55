//! The controller given the nodes of a broker cluster (two mosquittos on
//! free loopback ports, standing in for two nodes): when its node dies it
//! keeps its control steps running and reconnects to the other node,
//! where its retained state is found afterwards.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::modbus::{Link, ModbusCdu};
use cooling_ctrl::shell::{self, ShellConfig, ShellOptions, ShellStats};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_bus::Brokers;
use loopwarden_protocol::Ident;
use loopwarden_system_tests::{retained, steady_sim_cdu, Mosquitto};
use tokio::sync::{oneshot, watch};

const SITE: &str = "hall-o";

fn id(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

async fn wait(
    stats: &mut watch::Receiver<ShellStats>,
    within: Duration,
    what: &str,
    f: impl FnMut(&ShellStats) -> bool,
) -> ShellStats {
    let got = tokio::time::timeout(within, stats.wait_for(f))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|s| s.clone());
    match got {
        Some(s) => s,
        None => panic!(
            "{what}: not within {within:?}; steps {}",
            stats.borrow().steps
        ),
    }
}

/// The controller's retained state on the broker at `port`, if any.
async fn state_on(port: u16) -> bool {
    let seen = tokio::task::spawn_blocking(move || {
        retained(
            port,
            &[&format!("dc/v2/{SITE}/cdu/cdu-1/health")],
            Duration::from_secs(1),
        )
    })
    .await
    .expect("mosquitto_sub runs")
    .expect("mosquitto_sub is installed");
    !seen.is_empty()
}

/// Its retained state shows on the broker at `port` within 10 s.
async fn eventually(port: u16) -> bool {
    for _ in 0..40 {
        if state_on(port).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_its_node_dies_the_controller_keeps_control_and_moves_to_the_next() {
    let Some(mut first) = Mosquitto::start() else {
        return;
    };
    let Some(second) = Mosquitto::start() else {
        return;
    };
    let sim = steady_sim_cdu();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(sim.serve(listener));
    let port = ModbusCdu::new(RegisterMap::sim_cdu(), Link::Tcp(addr))
        .with_timeout(Duration::from_millis(300));
    let brokers = Brokers::new(vec![first.addr(), second.addr()]).expect("two");
    let mut cfg = ShellConfig::new(id(SITE), id("cdu-1"), brokers, CoreConfig::default());
    cfg.period = Duration::from_millis(100);
    let (tx, mut stats) = shell::stats_channel();
    let opts = ShellOptions {
        stats: Some(tx),
        ..Default::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(shell::run_with(cfg, opts, port, async {
        let _ = stopped.await;
    }));

    wait(
        &mut stats,
        Duration::from_secs(10),
        "a state published",
        |s| s.states_published > 0,
    )
    .await;
    assert!(
        eventually(first.port()).await,
        "its state on the first node"
    );
    assert!(!state_on(second.port()).await, "nothing on the second yet");

    first.stop();
    let steps = stats.borrow().steps;
    // A new connection announces the retained state at once.
    assert!(
        eventually(second.port()).await,
        "its retained state on the second node after the failover"
    );
    let after = wait(
        &mut stats,
        Duration::from_secs(10),
        "control steps go on, connected again",
        |s| s.steps > steps + 20 && s.status.as_ref().is_some_and(|st| st.bus_connected),
    )
    .await;
    assert!(after.steps > steps + 20);

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(8), task)
        .await
        .expect("stops")
        .expect("no panic")
        .expect("clean stop");
}

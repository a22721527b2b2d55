//! The controller given the nodes of a broker cluster (two mosquittos on
//! free loopback ports, standing in for two nodes): when its node dies it
//! keeps its control steps running and reconnects to the other node,
//! where its retained state is found afterwards.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`).

mod shell_rig;

use std::time::Duration;

use cooling_core::CoreConfig;
use cooling_ctrl::shell::{ShellConfig, ShellOptions};
use loopwarden_bus::Brokers;
use loopwarden_system_tests::Mosquitto;
use shell_rig::{id, retained_now, sim_cdu, Running};

const SITE: &str = "hall-o";

/// The controller's retained state on the broker at `port`, if any.
async fn state_on(port: u16) -> bool {
    let filter = format!("dc/v2/{SITE}/cdu/cdu-1/health");
    !retained_now(port, filter, Duration::from_secs(1))
        .await
        .is_empty()
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
    let port = sim_cdu().await;
    let brokers = Brokers::new(vec![first.addr(), second.addr()]).expect("two");
    let mut cfg = ShellConfig::new(id(SITE), id("cdu-1"), brokers, CoreConfig::default());
    cfg.period = Duration::from_millis(100);
    let mut shell = Running::start(cfg, ShellOptions::default(), port);

    shell
        .wait(Duration::from_secs(10), "a state published", |s| {
            s.states_published > 0
        })
        .await;
    assert!(
        eventually(first.port()).await,
        "its state on the first node"
    );
    assert!(!state_on(second.port()).await, "nothing on the second yet");

    first.stop();
    let steps = shell.stats.borrow().steps;
    // A new connection announces the retained state at once.
    assert!(
        eventually(second.port()).await,
        "its retained state on the second node after the failover"
    );
    let after = shell
        .wait(
            Duration::from_secs(10),
            "control steps go on, connected again",
            |s| s.steps > steps + 20 && s.status.as_ref().is_some_and(|st| st.bus_connected),
        )
        .await;
    assert!(after.steps > steps + 20);

    shell.stop().await;
}

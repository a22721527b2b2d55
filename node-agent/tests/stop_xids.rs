//! The clean stop and the XIDs the driver reports while it waits for the
//! site actions: NVML does not report an XID again, so one left in the
//! queue at the exit would leave a failing GPU in service after the
//! restart. Each is decided during the stop, and a quarantine so decided
//! is kept in flash.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

use std::path::Path;
use std::time::{Duration, Instant};

use node_agent::config::Overrides;
use node_agent::sim_gpus::TwinFault;

use rig::Rig;

/// Waits until the file at `log` holds `want`. Fails after `secs`.
fn wait_for(log: &Path, want: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(want)
    {
        assert!(
            Instant::now() < deadline,
            "{want:?} not in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM while GPU 1's quarantine action runs (3 s): the stop waits
/// for it, GPU 0 reports XID 79 meanwhile. After the restart GPU 0 is
/// quarantined, from flash.
#[test]
fn an_xid_reported_while_the_stop_waits_is_decided_and_kept() {
    let Some(rig) = Rig::start("s1") else {
        return;
    };
    let log = rig.dir.path().join("actions.log");
    let slow = rig.script(
        "slow.sh",
        &format!(
            "echo \"started $1\" >> {l}\nsleep 3\necho \"done $1\" >> {l}",
            l = log.display()
        ),
    );
    let quarantining = || {
        rig.agent(2)
            .flags(Overrides {
                quarantine_actions: vec![format!("{} {{gpu}}", slow.display())],
                ..Default::default()
            })
            .flash()
    };
    let agent = quarantining().start();
    std::thread::sleep(Duration::from_millis(1_000));
    let control = agent.control().clone();
    let xid = |gpu| control.inject(TwinFault::Xid { gpu, xid: 79 });
    xid(1).expect("inject");
    wait_for(&log, "started 1", 5);
    let stopping = std::thread::spawn(move || agent.stop());
    // The stop waits for GPU 1's action (about 3 s more).
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !stopping.is_finished(),
        "the stop did not wait for the action"
    );
    xid(0).expect("inject");
    stopping.join().expect("the agent stopped cleanly");
    wait_for(&log, "done 1", 1);

    let agent = quarantining().start();
    let why = agent.ctl_within(
        &["why", "0"],
        Duration::from_secs(10),
        "the restarted agent never answered",
    );
    assert_eq!(why["health"], "quarantined", "{why}");
    assert_eq!(why["reason"], "xid-79", "{why}");
}

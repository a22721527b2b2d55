//! A leak in the twin's rack, end to end: the controller isolates the
//! rack and says it lost cooling; that rack's node agent drains its node
//! in a real Slurm through `loopwarden-slurm` (`sinfo -R` shows the
//! reason), powers it down after its grace period, and when an operator
//! has cleared the leak, powers it up and resumes it. The other rack's
//! agent does nothing. A node an operator drained before the leak stays
//! drained, with the operator's reason, through the loss and the resume.
//!
//! Skipped outside CI when Slurm or munge is not installed (`.ci/run`
//! installs them); under `CI=true` a missing tool fails.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_hall::play::{play, PlayConfig};
use loopwarden_system_tests::slurm::Slurm;
use loopwarden_twin::scenario::Scenario;

/// Two racks of one host; rack 0 leaks from 40 s to 100 s, an operator
/// clears the latch at 120 s.
const LEAK: &str = r#"
format = "plant-scenario/1"
description = "rack 0 leaks for a minute; an operator clears the leak"
duration_s = 200
seed = 11
[site]
racks = 2
hosts_per_rack = 1
[ambient]
points = [[0, 24.0], [200, 24.0]]
[load]
all = [[0, 0.8], [200, 0.8]]
[[fault]]
at_s = 40
until_s = 100
kind = "leak"
target = "0"
"#;

/// Simulated seconds per wall second.
const SPEED: f64 = 4.0;
/// The agents' grace between the drain and the power-down, s.
const GRACE_S: u64 = 4;

/// The agents' config: Slurm through `loopwarden-slurm` (as
/// docs/node-agent.md section 3.6 shows) for the drain and the resume,
/// and a script that notes the power steps.
fn agent_config(dir: &Path, slurm: &Slurm) -> std::path::PathBuf {
    let note = dir.join("note.sh");
    let log = dir.join("power.log");
    std::fs::write(
        &note,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&note, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let conf = format!("SLURM_CONF={}", slurm.conf().display());
    let wrapper = super::slurm_wrapper::wrapper();
    let slurm_cmd = |rest: &str| format!(r#"["env", "{conf}", "{}", {rest}]"#, wrapper.display());
    let text = format!(
        "[cooling_loss]\n\
         drain = [{}]\n\
         resume = [{}]\n\
         power_down = [[\"{n}\", \"power_down\", \"{{host}}\"]]\n\
         power_up = [[\"{n}\", \"power_up\", \"{{host}}\"]]\n\
         grace_s = {GRACE_S}\n",
        slurm_cmd(r#""drain", "{host}", "cooling", "{reason}""#),
        slurm_cmd(r#""resume", "{host}", "cooling""#),
        n = note.display(),
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaking_rack_is_drained_in_slurm_powered_down_and_resumed() {
    let Some(slurm) = Slurm::start(&["r0h0"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), &slurm);
    let slurm = Arc::new(slurm);
    // What sinfo -R showed during the run.
    let seen: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (slurm, seen, done) = (slurm.clone(), seen.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                for row in slurm.drained() {
                    let mut s = seen.lock().unwrap();
                    if !s.contains(&row) {
                        s.push(row);
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let started = Instant::now();
    let out = play(PlayConfig {
        speed: SPEED,
        agent_config: Some(config),
        clear_leaks: vec![(120, 0)],
        ..PlayConfig::headless(
            Scenario::from_toml(LEAK, "leak.toml").unwrap(),
            "leak",
            &dir.path().join("run"),
        )
    })
    .await
    .expect("the run completes");
    done.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    let took = started.elapsed();

    let summary = out.summary.as_ref().expect("the run's summary");
    assert_eq!(
        summary.valve_reopened_unattended, 0,
        "rack 0's valve reopened on the operator's clear, not unattended"
    );
    assert!(
        out.racks_lost.contains(&0),
        "rack 0 declared lost: {:?}",
        out.events
    );
    let seen = seen.lock().unwrap().clone();
    let drained: Vec<_> = seen.iter().filter(|(n, _, _)| n == "r0h0").collect();
    assert!(
        drained
            .iter()
            .any(|(_, state, reason)| state.starts_with("drain")
                && reason.starts_with(
                    "loopwarden:cooling: cooling-lost: rack 0 of cdu1 lost cooling at"
                )),
        "sinfo -R never showed r0h0 drained for the cooling loss: {seen:?}\n{}",
        slurm.log_tails()
    );
    let power = std::fs::read_to_string(dir.path().join("power.log")).unwrap_or_default();
    assert_eq!(
        power.lines().collect::<Vec<_>>(),
        ["power_down r0h0", "power_up r0h0"],
        "only the leaking rack's host, once each, in order; events {:?}",
        out.events
    );
    assert_eq!(
        out.hosts_powered_down.iter().cloned().collect::<Vec<_>>(),
        ["r0h0"],
        "the simulated host followed its agent"
    );
    // The grace: the power-down came at least GRACE_S after the drain.
    let at = |what: &str| {
        out.events
            .iter()
            .find(|e| e.contains(what))
            .and_then(|e| e.strip_prefix("t=")?.split('s').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {what:?} in {:?}", out.events))
    };
    let (drain, down) = (
        at("r0h0: cooling-loss drain command"),
        at("r0h0: cooling-loss power-down command"),
    );
    assert!(
        down - drain >= (GRACE_S as f64 - 1.0) * SPEED,
        "powered down {:.0} simulated s after the drain",
        down - drain
    );
    assert!(out
        .events
        .iter()
        .any(|e| e.contains("r0h0: cooling-loss resume command ran")));
    // Resumed: back in service, no reason left.
    slurm
        .wait_state("r0h0", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("r0h0 not idle after the resume: {s}; {}", slurm.reasons()));
    assert!(slurm.drained().iter().all(|(n, _, _)| n != "r0h0"));
    assert!(took < Duration::from_secs(120), "took {took:?}");
}

/// Without agents' cooling-loss commands: the operator's clear at 120 s
/// is what reopens rack 0's valve, so the reopening is not unattended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valve_reopened_on_an_operators_clear_is_not_counted_unattended() {
    let dir = tempfile::tempdir().unwrap();
    let out = play(PlayConfig {
        speed: SPEED,
        clear_leaks: vec![(120, 0)],
        ..PlayConfig::headless(
            Scenario::from_toml(LEAK, "leak.toml").unwrap(),
            "leak",
            &dir.path().join("run"),
        )
    })
    .await
    .expect("the run completes");
    assert!(
        out.racks_lost.contains(&0),
        "rack 0 isolated: {:?}",
        out.events
    );
    let summary = out.summary.as_ref().expect("the run's summary");
    assert_eq!(summary.leaks, 1);
    assert_eq!(
        summary.valve_reopened_unattended, 0,
        "events: {:?}",
        out.events
    );
}

/// An operator drained r0h0 for a bad DIMM before the leak: the agent's
/// cooling-loss drain and its resume after the leak is cleared leave that
/// drain, and its reason, as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_drain_outlives_a_cooling_loss_and_its_resume() {
    let Some(slurm) = Slurm::start(&["r0h0"]) else {
        return;
    };
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=r0h0",
        "State=DRAIN",
        "Reason=RMA DIMM #1234",
    ]);
    assert!(ok, "the operator's drain: {said}");
    let dir = tempfile::tempdir().unwrap();
    let config = agent_config(dir.path(), &slurm);
    let out = play(PlayConfig {
        speed: SPEED,
        agent_config: Some(config),
        clear_leaks: vec![(120, 0)],
        ..PlayConfig::headless(
            Scenario::from_toml(LEAK, "leak.toml").unwrap(),
            "leak",
            &dir.path().join("run"),
        )
    })
    .await
    .expect("the run completes");
    assert!(out.racks_lost.contains(&0), "{:?}", out.events);
    for step in ["drain", "resume"] {
        let ran = format!("r0h0: cooling-loss {step} command ran");
        assert!(
            out.events.iter().any(|e| e.contains(&ran)),
            "no {ran:?} in {:?}",
            out.events
        );
    }
    let drained = slurm.drained();
    assert!(
        drained.iter().any(|(n, state, reason)| n == "r0h0"
            && state.starts_with("drain")
            && reason == "RMA DIMM #1234"),
        "r0h0 not drained for its DIMM any more: {drained:?}\n{}",
        slurm.log_tails()
    );
}

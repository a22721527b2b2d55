//! A node taken out of service in a real Slurm, as a node agent's site
//! actions do it: `scontrol update NodeName=… State=DRAIN Reason=…` run as
//! an argument vector (no shell) with the harness's environment, checked
//! with `sinfo -R`, then `State=RESUME`.
//!
//! Glossary:
//! - *drain*: Slurm starts no new job on the node; `sinfo -R` lists it
//!   with its reason until it is resumed.
//! - *resume*: the node takes jobs again (`idle`) and leaves `sinfo -R`.

use std::process::Command;
use std::time::Duration;

use loopwarden_system_tests::slurm::Slurm;

const NODE: &str = "r0h0";
const REASON: &str = "xid-79: fell off the bus";

/// Runs `scontrol ARGS` as a site action would: the program and its
/// arguments, one argument per `{…}` substitution, with the cluster's
/// environment. Panics with what it printed when it fails.
fn action(slurm: &Slurm, args: &[&str]) {
    let out = Command::new("scontrol")
        .args(args)
        .envs(slurm.env())
        .output()
        .expect("run scontrol");
    assert!(
        out.status.success(),
        "scontrol {args:?} failed ({}): {}{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        slurm.log_tails()
    );
}

#[test]
fn a_drained_node_shows_its_reason_until_resumed() {
    let Some(slurm) = Slurm::start(&[NODE]) else {
        return;
    };
    assert_eq!(slurm.state(NODE), "idle", "{}", slurm.reasons());
    assert!(slurm.drained().is_empty(), "{}", slurm.reasons());

    let node_arg = format!("NodeName={NODE}");
    let reason_arg = format!("Reason={REASON}");
    action(&slurm, &["update", &node_arg, "State=DRAIN", &reason_arg]);
    let drained = slurm.drained();
    assert_eq!(
        drained.len(),
        1,
        "sinfo -R lists one node:\n{}",
        slurm.reasons()
    );
    let (node, state, reason) = &drained[0];
    assert_eq!(node, NODE);
    assert_eq!(reason, REASON, "the reason comes back whole");
    assert!(
        state == "drained" || state == "draining",
        "a drain state, not {state:?}"
    );
    assert!(
        slurm.reasons().contains(NODE),
        "the plain sinfo -R names {NODE}:\n{}",
        slurm.reasons()
    );

    action(&slurm, &["update", &node_arg, "State=RESUME"]);
    if let Err(last) = slurm.wait_state(NODE, "idle", Duration::from_secs(10)) {
        panic!(
            "{NODE} is {last:?}, not idle, 10 s after State=RESUME\n{}",
            slurm.log_tails()
        );
    }
    assert!(
        slurm.drained().is_empty(),
        "sinfo -R lists nothing after the resume:\n{}",
        slurm.reasons()
    );
}

#[test]
fn a_node_without_slurmd_can_be_drained_too() {
    let Some(slurm) = Slurm::start(&["r1h0", "r1h1"]) else {
        return;
    };
    let (ok, text) = slurm.scontrol(&[
        "update",
        "NodeName=r1h1",
        "State=DRAIN",
        "Reason=no slurmd here",
    ]);
    assert!(ok, "scontrol drain r1h1: {text}");
    let drained = slurm.drained();
    assert_eq!(
        drained,
        [("r1h1".into(), "drained".into(), "no slurmd here".into())],
        "only r1h1 is listed:\n{}",
        slurm.reasons()
    );
    assert_eq!(slurm.state("r1h0"), "idle", "r1h0 is untouched");
}

//! `deploy/slurm/loopwarden-slurm`, the wrapper the documented Slurm
//! actions call, against a real Slurm: it undoes only the agent's own
//! drain for the tag it is given, never a person's, and never runs the
//! text of a reason.
//!
//! Skipped outside CI when Slurm or munge is not installed (`.ci/run`
//! installs them); under `CI=true` a missing tool fails.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use loopwarden_system_tests::slurm::Slurm;

/// The wrapper as shipped.
pub fn wrapper() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm/loopwarden-slurm")
}

/// The wrapper with `args` against `slurm`, with `shims` (a directory of
/// stand-ins for Slurm's clients) first in its PATH when given.
fn wrapper_cmd(slurm: &Slurm, shims: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = Command::new(wrapper());
    cmd.args(args).envs(slurm.env());
    if let Some(dir) = shims {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    cmd
}

/// Runs the wrapper with `args` against `slurm`: its exit status and what
/// it printed (stdout then stderr).
fn run(slurm: &Slurm, args: &[&str]) -> (i32, String) {
    run_with(slurm, None, args)
}

/// [`run`] with `shims` first in the PATH.
fn run_with(slurm: &Slurm, shims: Option<&Path>, args: &[&str]) -> (i32, String) {
    let out = wrapper_cmd(slurm, shims, args)
        .output()
        .unwrap_or_else(|e| panic!("run {} {args:?}: {e}", wrapper().display()));
    said(&out)
}

/// A finished wrapper's exit status and what it printed.
fn said(out: &Output) -> (i32, String) {
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), said)
}

/// Makes `dir/sinfo` the shell script `body`, in which `$real` is the
/// real `sinfo` (as the PATH finds it): with `dir` first in the PATH it
/// stands in for it.
fn sinfo_shim(dir: &Path, body: &str) {
    shim(dir, "sinfo", body);
}

/// Makes `dir/TOOL` the shell script `body`, in which `$real` is the real
/// `tool` (as the PATH finds it).
fn shim(dir: &Path, tool: &str, body: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .unwrap_or_else(|e| panic!("sh -c 'command -v {tool}': {e}"));
    let real = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(!real.is_empty(), "no {tool} in the PATH");
    let file = dir.join(tool);
    std::fs::write(&file, format!("#!/bin/sh\nreal='{real}'\n{body}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The node's state and reason as `sinfo -R` lists them, if it lists it.
fn reason(slurm: &Slurm, node: &str) -> Option<(String, String)> {
    slurm
        .drained()
        .into_iter()
        .find(|(n, _, _)| n == node)
        .map(|(_, state, reason)| (state, reason))
}

/// `node` is listed drained with `want` as its reason.
fn assert_drained(slurm: &Slurm, node: &str, want: &str, after: &str) {
    match reason(slurm, node) {
        Some((state, reason)) if state.starts_with("drain") && reason == want => {}
        other => panic!("after {after}: {node} is {other:?}, not drained for {want:?}"),
    }
}

#[test]
fn the_slurm_wrapper_lifts_only_the_drain_of_its_own_tag() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    let cooling = "loopwarden:cooling: cooling-lost: rack 2 of cdu-a lost cooling";
    let gpu3 = "loopwarden:gpu3: xid-79: XID 79 (GPU has fallen off the bus)";
    let (code, said) = run(
        &slurm,
        &[
            "drain",
            "h07",
            "cooling",
            "cooling-lost: rack 2 of cdu-a lost cooling",
        ],
    );
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", cooling, "the cooling drain");
    // A quarantine while the rack has no cooling: both are named.
    let xid = "xid-79: XID 79 (GPU has fallen off the bus)";
    let (code, said) = run(&slurm, &["drain", "h07", "gpu3", xid]);
    assert_eq!(code, 0, "{said}");
    let both = format!("{cooling} | {gpu3}");
    assert_drained(&slurm, "h07", &both, "the quarantine's drain");
    // The same drain again changes nothing.
    let (code, said) = run(&slurm, &["drain", "h07", "gpu3", xid]);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", &both, "the quarantine's drain again");
    // Cooling back: the quarantine's drain stays.
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", gpu3, "the cooling resume");
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("not drained for cooling"), "{said}");
    assert_drained(&slurm, "h07", gpu3, "a second cooling resume");
    // The last of the agent's drains lifted: back in service.
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the resume: {s}; {}", slurm.reasons()));
    // Nothing left to undo: exit 0 (scontrol would refuse RESUME on an
    // idle node, exit 1), and the node as it was.
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("is not drained"), "{said}");
    assert_eq!(reason(&slurm, "h07"), None);
}

#[test]
fn the_slurm_wrapper_adds_its_part_to_a_persons_drain_and_resumes_never_over_it() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // A reason that reads like a state is not taken for one.
    let rma = "RMA DIMM #1234 State=IDLE";
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DRAIN",
        &format!("Reason={rma}"),
    ]);
    assert!(ok, "{said}");
    // A quarantine on a node a person drained: its part is added, the
    // person's kept whole, so that the GPU stays out once they resume.
    let (code, said) = run(&slurm, &["drain", "h07", "gpu3", "xid-79"]);
    assert_eq!(code, 0, "{said}");
    let both = format!("{rma} | loopwarden:gpu3: xid-79");
    assert_drained(&slurm, "h07", &both, "the quarantine's drain");
    // A resume for a tag not there changes nothing.
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("not drained for cooling"), "{said}");
    assert_drained(&slurm, "h07", &both, "the cooling resume");
    // The quarantine's resume takes its part off, and leaves the node
    // drained with the person's reason alone.
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("left drained"), "{said}");
    assert_drained(&slurm, "h07", rma, "the quarantine's resume");
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("drained by someone else"), "{said}");
    assert_drained(&slurm, "h07", rma, "a second resume");
}

#[test]
fn the_slurm_wrapper_keeps_a_persons_down_and_its_reason() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // Slurm's own reason for a DOWN node is Slurm's to lift: replaced.
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DOWN",
        "Reason=Not responding",
    ]);
    assert!(ok, "{said}");
    let (code, said) = run(&slurm, &["drain", "h07", "gpu1", "xid-79"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(
        &slurm,
        "h07",
        "loopwarden:gpu1: xid-79",
        "a drain of a node Slurm set down",
    );
    let (code, said) = run(&slurm, &["resume", "h07", "gpu1"]);
    assert_eq!(code, 0, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the resume: {s}; {}", slurm.reasons()));
    // A person's DOWN: their reason is kept, and the node stays down.
    let (ok, said) = slurm.scontrol(&["update", "NodeName=h07", "State=DOWN", "Reason=RMA"]);
    assert!(ok, "{said}");
    let (code, said) = run(&slurm, &["drain", "h07", "cooling", "cooling-lost"]);
    assert_eq!(code, 0, "{said}");
    let listed = reason(&slurm, "h07");
    assert!(
        matches!(&listed, Some((_, r)) if r == "RMA | loopwarden:cooling: cooling-lost"),
        "after the cooling drain: {listed:?}"
    );
    // The cooling resume leaves it down, with the person's reason (and
    // the DRAIN flag the drain added: Slurm lifts it only with the DOWN).
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    let listed = reason(&slurm, "h07");
    let state = scontrol_state(&slurm, "h07");
    assert!(
        matches!(&listed, Some((_, r)) if r == "RMA") && state.starts_with("DOWN"),
        "after the cooling resume: {state}, {listed:?}; {said}"
    );
}

/// The node's `State=` as `scontrol show node` gives it (`DOWN+DRAIN`).
fn scontrol_state(slurm: &Slurm, node: &str) -> String {
    let (ok, shown) = slurm.scontrol(&["show", "node", "-o", node]);
    assert!(ok, "scontrol show node {node}: {shown}");
    shown
        .split_whitespace()
        .find_map(|w| w.strip_prefix("State="))
        .unwrap_or_else(|| panic!("no State= in {shown}"))
        .to_string()
}

#[test]
fn the_slurm_wrapper_never_runs_a_reason_and_refuses_bad_usage() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("ran");
    let text = format!(
        "$(touch {m}) `touch {m}`; touch {m} | x",
        m = mark.display()
    );
    let (code, said) = run(&slurm, &["drain", "h07", "gpu1", &text]);
    assert_eq!(code, 0, "{said}");
    // A '|' would end the agent's part of the reason: written '/'.
    let shown = format!("loopwarden:gpu1: {}", text.replace('|', "/"));
    assert_drained(&slurm, "h07", &shown, "the drain");
    let (code, said) = run(&slurm, &["resume", "h07", "gpu1"]);
    assert_eq!(code, 0, "{said}");
    assert!(!mark.exists(), "the reason's text was run");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the resume: {s}; {}", slurm.reasons()));
    for args in [
        &["drain", "h07", "cooling"][..],
        &["drain", "h07", "a tag", "why"],
        &["drain", "h07", "", "why"],
        &["resume", "h07"],
        &["undrain", "h07", "cooling"],
    ] {
        let (code, said) = run(&slurm, args);
        assert_eq!(code, 2, "{args:?}: {said}");
        assert!(said.starts_with("usage: loopwarden-slurm"), "{said}");
    }
    // A node Slurm does not know: the drain is tried anyway and fails,
    // the resume is not tried; both say so, exit 1.
    let (code, said) = run(&slurm, &["drain", "h99", "cooling", "x"]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("scontrol update NodeName=h99"), "{said}");
    assert!(!said.contains("drained for"), "{said}");
    let (code, said) = run(&slurm, &["resume", "h99", "cooling"]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("not resumed"), "{said}");
}

#[test]
fn the_slurm_wrappers_on_one_node_run_one_at_a_time() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // A slow sinfo: without a lock, both would read the node before
    // either writes, and the second write would drop the first's part.
    let shims = tempfile::tempdir().unwrap();
    sinfo_shim(shims.path(), r#"sleep 1; exec "$real" "$@""#);
    let started: Vec<_> = [("cooling", "cooling-lost"), ("gpu3", "xid-79")]
        .into_iter()
        .map(|(tag, why)| {
            wrapper_cmd(&slurm, Some(shims.path()), &["drain", "h07", tag, why])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start the wrapper")
        })
        .collect();
    for child in started {
        let (code, said) = said(&child.wait_with_output().unwrap());
        assert_eq!(code, 0, "{said}");
    }
    let listed = reason(&slurm, "h07").map(|(_, r)| r).unwrap_or_default();
    let mut parts: Vec<_> = listed.split(" | ").collect();
    parts.sort_unstable();
    assert_eq!(
        parts,
        [
            "loopwarden:cooling: cooling-lost",
            "loopwarden:gpu3: xid-79"
        ],
        "{listed:?}"
    );
}

/// Drains h07 for a person (`RMA DIMM #1234`), runs `drain h07 gpu3 x`
/// and `resume h07 gpu3` with `sinfo` the shim `body`, and asserts both
/// exit 1 saying `want` and leave the person's reason as it was.
fn assert_unread_reason_left(slurm: &Slurm, body: &str, want: &str) {
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DRAIN",
        "Reason=RMA DIMM #1234",
    ]);
    assert!(ok, "{said}");
    let shims = tempfile::tempdir().unwrap();
    sinfo_shim(shims.path(), body);
    for args in [
        &["drain", "h07", "gpu3", "x"][..],
        &["resume", "h07", "gpu3"],
    ] {
        let (code, said) = run_with(slurm, Some(shims.path()), args);
        assert_eq!(code, 1, "{args:?}: {said}");
        assert!(said.contains(want), "{args:?}: {said}");
        assert_drained(slurm, "h07", "RMA DIMM #1234", &format!("{args:?}"));
    }
}

#[test]
fn the_slurm_wrapper_writes_no_reason_it_could_not_read() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    let failing = r#"echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1"#;
    // A node in service needs no reason read: drained all the same.
    let shims = tempfile::tempdir().unwrap();
    sinfo_shim(shims.path(), failing);
    let (code, said) = run_with(&slurm, Some(shims.path()), &["drain", "h07", "gpu1", "x"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(
        &slurm,
        "h07",
        "loopwarden:gpu1: x",
        "a drain with sinfo failing",
    );
    let (code, said) = run(&slurm, &["resume", "h07", "gpu1"]);
    assert_eq!(code, 0, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the resume: {s}; {}", slurm.reasons()));
    // A drained node's reason it cannot read is not overwritten.
    assert_unread_reason_left(&slurm, failing, "Unable to contact slurm controller");
}

#[test]
fn the_slurm_wrapper_reads_a_node_of_a_hidden_partition_and_no_listing_as_no_reason() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // sinfo as for a node only in a hidden partition: listed with -a
    // alone.
    let shims = tempfile::tempdir().unwrap();
    sinfo_shim(
        shims.path(),
        r#"for a; do [ "$a" = -a ] && exec "$real" "$@"; done; exit 0"#,
    );
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DRAIN",
        "Reason=RMA DIMM #1234",
    ]);
    assert!(ok, "{said}");
    let (code, said) = run_with(&slurm, Some(shims.path()), &["drain", "h07", "gpu3", "x"]);
    assert_eq!(code, 0, "{said}");
    let both = "RMA DIMM #1234 | loopwarden:gpu3: x";
    assert_drained(&slurm, "h07", both, "a drain in a hidden partition");
    // A node sinfo does not list at all (SINFO_PARTITION set, ...): its
    // reason is unknown, not "".
    assert_unread_reason_left(&slurm, "exit 0", "listed no h07");
}

#[test]
fn the_slurm_wrapper_says_a_reason_as_it_is() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // Backslashes an echo would take for escapes (`\c` ends its output).
    let rma = r"RMA \t DIMM \n #1234 \c end";
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DRAIN",
        &format!("Reason={rma}"),
    ]);
    assert!(ok, "{said}");
    let both = format!("{rma} | loopwarden:gpu3: x");
    let (code, said) = run(&slurm, &["drain", "h07", "gpu3", "x"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("drained ({both})")), "{said}");
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains(&format!("by someone else: {rma}\n")),
        "{said}"
    );
    let (code, said) = run(&slurm, &["resume", "h07", "gpu3"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains(&format!("({rma}): left drained")), "{said}");
}

/// The part `loopwarden-slurm` writes for a reason it could not read.
const UNREAD: &str = "reason before this drain unread (loopwarden-slurm)";

#[test]
fn the_slurm_wrapper_marks_a_drain_made_blind_and_no_resume_lifts_it() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    let (ok, said) = slurm.scontrol(&[
        "update",
        "NodeName=h07",
        "State=DRAIN",
        "Reason=RMA DIMM #1234",
    ]);
    assert!(ok, "{said}");
    // slurmctld too busy to show the node, not to update it: the drain is
    // made (out of service is the safe side) over a reason it could not
    // read, marked so, and fails so that the agent tries again.
    let shims = tempfile::tempdir().unwrap();
    shim(
        shims.path(),
        "scontrol",
        r#"[ "$1" = show ] && { echo "slurm_load_node error: Socket timed out on send/recv operation" >&2; exit 1; }; exec "$real" "$@""#,
    );
    let blind = format!("{UNREAD} | loopwarden:cooling: cooling-lost");
    let drain = ["drain", "h07", "cooling", "cooling-lost"];
    let (code, said) = run_with(&slurm, Some(shims.path()), &drain);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("Socket timed out"), "{said}");
    assert!(said.contains("its reason before unread"), "{said}");
    assert_drained(&slurm, "h07", &blind, "the drain made blind");
    // The agent's retry, Slurm answering: the mark is kept.
    let (code, said) = run(&slurm, &drain);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", &blind, "the drain tried again");
    // The cooling back: the node stays out until a person looks (it may
    // have been the RMA'd node it was).
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("left drained by someone else"), "{said}");
    assert_drained(&slurm, "h07", UNREAD, "the cooling resume");
    // A node in service drained blind, then a quarantine's drain and
    // resume: the mark outlives them too.
    let (ok, said) = slurm.scontrol(&["update", "NodeName=h07", "State=RESUME"]);
    assert!(ok, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the person's resume: {s}"));
    let (code, said) = run_with(&slurm, Some(shims.path()), &["drain", "h07", "gpu2", "x"]);
    assert_eq!(code, 1, "{said}");
    assert_drained(
        &slurm,
        "h07",
        &format!("{UNREAD} | loopwarden:gpu2: x"),
        "a blind quarantine",
    );
    let (code, said) = run(&slurm, &["resume", "h07", "gpu2"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", UNREAD, "the quarantine's resume");
}

#[test]
fn the_slurm_wrapper_claims_no_blind_drain_that_slurm_refused() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    // slurmctld answering neither the show nor the update: nothing is
    // written, and nothing is said drained.
    let shims = tempfile::tempdir().unwrap();
    shim(
        shims.path(),
        "scontrol",
        r#"echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1"#,
    );
    let drain = ["drain", "h07", "gpu2", "x"];
    let (code, said) = run_with(&slurm, Some(shims.path()), &drain);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("scontrol update NodeName=h07"), "{said}");
    assert!(!said.contains("drained for"), "{said}");
    assert_eq!(reason(&slurm, "h07"), None);
}

#[test]
fn the_slurm_wrappers_remedy_for_a_blind_drain_lifts_the_mark_alone() {
    let Some(slurm) = Slurm::start(&["h07"]) else {
        return;
    };
    let shims = tempfile::tempdir().unwrap();
    shim(
        shims.path(),
        "scontrol",
        r#"[ "$1" = show ] && { echo "slurm_load_node error: Socket timed out on send/recv operation" >&2; exit 1; }; exec "$real" "$@""#,
    );
    let (code, said) = run_with(&slurm, Some(shims.path()), &["drain", "h07", "gpu2", "x"]);
    assert_eq!(code, 1, "{said}");
    // The remedy it names lifts the mark, not the quarantine's drain.
    assert!(said.contains("loopwarden-slurm clear-unread h07"), "{said}");
    let (code, said) = run(&slurm, &["clear-unread", "h07"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", "loopwarden:gpu2: x", "the mark's clearing");
    // Nothing of it left: nothing done.
    let (code, said) = run(&slurm, &["clear-unread", "h07"]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("no mark"), "{said}");
    assert_drained(&slurm, "h07", "loopwarden:gpu2: x", "a second clearing");
    // The mark alone left: the node goes back into service.
    let (code, said) = run(&slurm, &["resume", "h07", "gpu2"]);
    assert_eq!(code, 0, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the resume: {s}; {}", slurm.reasons()));
    let (code, said) = run_with(
        &slurm,
        Some(shims.path()),
        &["drain", "h07", "cooling", "y"],
    );
    assert_eq!(code, 1, "{said}");
    let (code, said) = run(&slurm, &["resume", "h07", "cooling"]);
    assert_eq!(code, 0, "{said}");
    assert_drained(&slurm, "h07", UNREAD, "the cooling resume");
    let (code, said) = run(&slurm, &["clear-unread", "h07"]);
    assert_eq!(code, 0, "{said}");
    slurm
        .wait_state("h07", "idle", Duration::from_secs(10))
        .unwrap_or_else(|s| panic!("h07 not idle after the clearing: {s}; {}", slurm.reasons()));
}

//! The site actions through crashes and faults: a GPU's quarantine
//! actions and a rack's cooling-loss steps when the agent is killed in
//! the middle, when a command hangs, fails or cannot start, when the agent
//! is stopped while one runs, and in a storm of fatal XIDs on every GPU.
//!
//! The agent runs in a process of its own (the test binary run again at
//! [`agent_process`], `rig::twin_process`), so a test can inject XIDs into
//! its twin GPUs and kill it with SIGKILL. Each command is a script that
//! appends a line to `actions.log`: the lines are the proof of what ran,
//! and in which order.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

#[path = "actions/common.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use loopwarden_protocol::CoolingStep;

use common::*;
use rig::twin_process::twin_process_main;
use rig::Rig;

/// The test [`Rig::spawn_twin_process`] runs as the agent.
const ENTRY: &str = "agent_process";

/// Not a test: the agent of the tests below, in a process of its own.
#[test]
#[ignore = "the agent process of the tests of this file, started by them"]
fn agent_process() {
    twin_process_main();
}

/// An agent killed while its quarantine action ran (the quarantine kept
/// in flash, the action's outcome not known) runs the action again after
/// its restart; once that one ended well, the next start knows it done
/// and runs nothing (`again_at_start` off: an action may cancel jobs).
#[test]
fn a_quarantine_cut_by_a_crash_runs_its_actions_again_after_the_restart() {
    let Some(rig) = Rig::start("f1") else {
        return;
    };
    let log = actions_log(&rig);
    let hangs = noting(&rig, "hang.sh", "started", "exec sleep 20");
    let notes = noting(&rig, "note.sh", "ran", "");
    let action = |script: &Path| {
        flags(&[
            "--quarantine-action",
            &format!("{} {{gpu}}", script.display()),
        ])
    };
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &action(&hangs));
    agent.xids(&[(1, 79)]);
    wait_for(&log, "started 1", 5);
    // A quarantine is in flash before it is published (the shell waits
    // for it): seen, the crash comes after the keep.
    events_until(&mut sub, 5, |ev| quarantined(ev, 1));
    agent.crash();

    let mut agent = rig.spawn_twin_process(ENTRY, 2, &action(&notes));
    wait_for(&log, "ran 1", 5);
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    // Its outcome is kept before it is published: the start after a
    // crash now knows it done.
    agent.crash();
    let agent = rig.spawn_twin_process(ENTRY, 2, &action(&notes));
    let text = said_within(&agent, KNOWN_DONE_LEFT, 1, 5);
    assert!(text.contains(KNOWN_DONE_LEFT), "{text}");
    // Said before the start's runs are spawned: nothing more runs.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&log), ["started 1", "ran 1"], "once done, not again");
    // Said of the second start alone (the log holds every start's).
    let not_done = agent
        .log_text()
        .matches("not known to have ended well")
        .count();
    assert_eq!(not_done, 1, "{text}");
}

/// What the start says of a GPU whose quarantine's actions are known
/// done, left as they are (`again_at_start` off).
const KNOWN_DONE_LEFT: &str =
    "GPU 1: quarantined still at this start, its actions known done: not run again";

/// `agent`'s log once it holds `said` `n` times, or after `secs` s.
fn said_within(agent: &rig::twin_process::TwinProcess, said: &str, n: usize, secs: u64) -> String {
    let end = Instant::now() + Duration::from_secs(secs);
    while agent.log_text().matches(said).count() < n && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.log_text()
}

/// A quarantine whose actions ended well runs them again at a start
/// while the GPU stays quarantined only with `again_at_start` (a site
/// whose actions are all harmless run again, a drain: the scheduler may
/// have put the node back in service since, by a reboot with
/// `nextstate=RESUME` or an operator's RESUME); without it, nothing runs
/// (a `scancel` would kill the node's jobs at every restart). The log
/// says which.
#[test]
fn a_gpu_still_quarantined_at_a_start_has_its_actions_run_again_only_when_asked() {
    let Some(rig) = Rig::start("fc") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let f = flags(&[
        "--quarantine-action",
        &format!("{} gpu-{{gpu}}", notes.display()),
    ]);
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(1, 79)]);
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    let (status, _) = agent.terminate(Duration::from_secs(12));
    assert!(status.success(), "{status}");
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let text = said_within(&agent, KNOWN_DONE_LEFT, 1, 5);
    assert!(text.contains(KNOWN_DONE_LEFT), "{text}");
    let ev = events_until(&mut sub, 1, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [], "run again unasked");
    let (status, _) = agent.terminate(Duration::from_secs(12));
    assert!(status.success(), "{status}");
    let mut again = f.clone();
    again.push("--quarantine-again-at-start".into());
    let agent = rig.spawn_twin_process(ENTRY, 2, &again);
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    assert_eq!(lines(&log), ["ran gpu-1"; 2], "run again at the start");
    let text = agent.log_text();
    assert!(
        text.contains("GPU 1: quarantined still at this start (its actions ended well before it; again_at_start"),
        "{text}"
    );
}

/// An agent on twin GPUs whose cooling step `hanging` (`drain` or
/// `power_down`) hangs, killed while that step runs after the CDU said
/// the rack lost cooling: its actions' log, and the script that notes a
/// step ran.
fn crashed_in_step(rig: &Rig, hanging: &str) -> (PathBuf, PathBuf) {
    let log = actions_log(rig);
    let hangs = noting(rig, "hang.sh", "started", "exec sleep 20");
    let notes = noting(rig, "note.sh", "ran", "");
    let (drain, power_down) = if hanging == "drain" {
        (&hangs, &notes)
    } else {
        (&notes, &hangs)
    };
    let mut agent =
        rig.spawn_twin_process(ENTRY, 2, &cooling_flags(drain, power_down, &notes, &notes));
    rig.publish_cdu_state(true, 1);
    wait_for(&log, &format!("started {hanging} {} 2", rig.host), 5);
    // The phase is kept before the step's command starts; the recorder
    // writes it within milliseconds.
    std::thread::sleep(Duration::from_millis(500));
    agent.crash();
    (log, notes)
}

/// A drain whose scheduler hangs does not hold the power-down back past
/// its grace: the drain is cut (its command killed) when the power-down is
/// decided, and runs again after it.
#[test]
fn a_hanging_drain_is_cut_when_the_power_down_is_decided() {
    let Some(rig) = Rig::start("f7") else {
        return;
    };
    let log = actions_log(&rig);
    // The drain hangs far longer than the bound below: a power-down that
    // waited for it comes a minute late, whatever the machine's load.
    let hangs = noting(&rig, "hang.sh", "started", "exec sleep 60");
    let notes = noting(&rig, "note.sh", "ran", "");
    let mut f = cooling_flags(&hangs, &notes, &notes, &notes);
    let grace = f.iter().position(|a| a == "--cooling-grace-s").unwrap() + 1;
    f[grace] = "1".into();
    let mut sub = rig.subscribe(&["event"]);
    let _agent = rig.spawn_twin_process(ENTRY, 2, &f);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "started drain f7 2", 5);
    let began = Instant::now();
    wait_for(&log, "ran power_down f7 2", 40);
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
    let ev = events_until(&mut sub, 5, |ev| cooling_outcomes(ev).len() >= 2);
    assert_eq!(
        cooling_outcomes(&ev),
        [
            (CoolingStep::Drain, false, None),
            (CoolingStep::PowerDown, true, Some(0))
        ]
    );
    let end = Instant::now() + Duration::from_secs(5);
    while lines(&log).len() < 3 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        lines(&log),
        [
            "started drain f7 2",
            "ran power_down f7 2",
            "started drain f7 2"
        ]
    );
}

/// An agent killed while its drain ran, with the power-down decided and
/// kept in flash behind it but not started (a grace of 0 decides both
/// together): after the restart the drain runs again, and once the CDU
/// says again that the rack has no cooling the power-down runs; once it
/// says cooling is back, the power-up and the resume. The CDU's retained
/// state is forgotten before the restart, so its word after it comes once
/// the drain ran (a word before would cut the drain, as it cuts any drain
/// still running when the power-down is decided).
#[test]
fn a_cooling_loss_cut_by_a_crash_runs_its_steps_after_the_restart() {
    let Some(rig) = Rig::start("f2") else {
        return;
    };
    let (log, notes) = crashed_in_step(&rig, "drain");
    rig.forget_cdu_state();

    let _agent = rig.spawn_twin_process(ENTRY, 2, &cooling_flags(&notes, &notes, &notes, &notes));
    wait_for(&log, "ran drain f2 2", 5);
    rig.publish_cdu_state(true, 2);
    wait_for(&log, "ran power_down f2 2", 5);
    rig.publish_cdu_state(false, 3);
    wait_for(&log, "ran resume f2 2", 5);
    assert_eq!(
        lines(&log),
        [
            "started drain f2 2",
            "ran drain f2 2",
            "ran power_down f2 2",
            "ran power_up f2 2",
            "ran resume f2 2"
        ]
    );
}

/// A cooling-loss resume takes the whole node back into service in the
/// scheduler (`scontrol ... State=RESUME` clears every drain), its
/// quarantined GPU with it: once the resume ended, that GPU's quarantine
/// actions run again, so the sick GPU gets no work.
#[test]
fn a_gpu_quarantined_through_a_cooling_loss_is_taken_out_again_after_the_resume() {
    let Some(rig) = Rig::start("fa") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let quarantine = noting(&rig, "quarantine.sh", "quarantine", "");
    let mut with_quarantine = cooling_flags(&notes, &notes, &notes, &notes);
    with_quarantine.extend(flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", quarantine.display()),
    ]));
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &with_quarantine);
    agent.xids(&[(1, 79)]);
    wait_for(&log, "quarantine 1", 5);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down fa 2", 5);
    rig.publish_cdu_state(false, 2);
    wait_for(&log, "ran resume fa 2", 5);
    let end = Instant::now() + Duration::from_secs(5);
    while lines(&log).last().is_some_and(|l| l != "quarantine 1") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        lines(&log),
        [
            "quarantine 1",
            "ran drain fa 2",
            "ran power_down fa 2",
            "ran power_up fa 2",
            "ran resume fa 2",
            "quarantine 1"
        ]
    );
}

/// A GPU quarantined, its drain done; the rack loses cooling and gets it
/// back; the resume lifts every drain, and the quarantine's actions run
/// again, but the agent is killed while they do (this second run hangs):
/// the quarantine is no longer known done, so the restart runs them a
/// third time (the node is not left in service with a sick GPU).
#[test]
fn a_quarantine_rerun_after_a_resume_cut_by_a_crash_runs_again_at_the_restart() {
    let Some(rig) = Rig::start("fb") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let once = rig.dir.path().join("quarantined-once");
    let then = format!(
        "if [ -e {0} ]; then exec sleep 20; fi; touch {0}",
        once.display()
    );
    let quarantine = noting(&rig, "quarantine.sh", "quarantine", &then);
    let mut with_quarantine = cooling_flags(&notes, &notes, &notes, &notes);
    with_quarantine.extend(flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", quarantine.display()),
    ]));
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &with_quarantine);
    agent.xids(&[(1, 79)]);
    wait_for(&log, "quarantine 1", 5);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down fb 2", 5);
    rig.publish_cdu_state(false, 2);
    wait_for(&log, "ran resume fb 2\nquarantine 1", 5);
    std::thread::sleep(Duration::from_millis(500));
    agent.crash();

    let _agent = rig.spawn_twin_process(ENTRY, 2, &with_quarantine);
    let end = Instant::now() + Duration::from_secs(5);
    let runs = || lines(&log).iter().filter(|l| *l == "quarantine 1").count();
    while runs() < 3 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        runs(),
        3,
        "not run again after the restart:\n{}",
        read(&log)
    );
}

/// An agent killed while its power-down ran: when the CDU says cooling is
/// back before the restart, the power-down is not run again (a host-off
/// command must not switch a host off again at every start); the power-up
/// and the resume run.
#[test]
fn a_power_down_cut_by_a_crash_is_not_run_again_once_cooling_is_back() {
    let Some(rig) = Rig::start("f3") else {
        return;
    };
    let (log, notes) = crashed_in_step(&rig, "power_down");
    rig.publish_cdu_state(false, 2);

    let started = Instant::now();
    let _agent = rig.spawn_twin_process(ENTRY, 2, &cooling_flags(&notes, &notes, &notes, &notes));
    wait_for(&log, "ran resume f3 2", 5);
    // Past the wait for the CDU's word, had it not come.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
    assert_eq!(
        lines(&log),
        [
            "ran drain f3 2",
            "started power_down f3 2",
            "ran power_up f3 2",
            "ran resume f3 2"
        ]
    );
}

/// An agent killed while its power-down ran, started again with no word
/// from the CDU (its state gone from the broker): the power-down runs
/// again once the wait for the CDU's word is over (5 s with no grace):
/// silence is not cooling.
#[test]
fn a_power_down_cut_by_a_crash_runs_again_when_the_cdu_says_nothing() {
    let Some(rig) = Rig::start("f8") else {
        return;
    };
    let (log, notes) = crashed_in_step(&rig, "power_down");
    // The CDU's retained state is cleared: nothing comes at the start.
    rig.publish(&format!("dc/v2/{}/cdu/cdu-a/health", rig::SITE), b"", true);

    let started = Instant::now();
    let _agent = rig.spawn_twin_process(ENTRY, 2, &cooling_flags(&notes, &notes, &notes, &notes));
    wait_for(&log, "ran power_down f8 2", 9);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(5), "ran after {waited:?}");
    assert_eq!(
        lines(&log),
        [
            "ran drain f8 2",
            "started power_down f8 2",
            "ran power_down f8 2"
        ]
    );
}

/// Quarantine actions that fail (exit 3), hang past their timeout, or
/// cannot start: each is published as a failed `quarantine_action` and
/// logged as an error, and not retried before the first wait (10 s) is
/// over (`actions_again.rs` follows the runs again); at the next start
/// the failed ones run again (a failure is never read as done).
#[test]
fn quarantine_actions_that_fail_hang_or_cannot_start_are_reported_and_run_again_at_the_start() {
    let Some(rig) = Rig::start("f4") else {
        return;
    };
    let log = actions_log(&rig);
    let fails = noting(&rig, "fail.sh", "failed", "echo nope >&2; exit 3");
    let hangs = noting(&rig, "hang.sh", "started", "exec sleep 20");
    let notes = noting(&rig, "note.sh", "ran", "");
    let three = |a: &Path, b: &Path, c: &str| {
        flags(&[
            "--quarantine-timeout-s",
            "1",
            "--quarantine-action",
            &format!("{} {{gpu}}", a.display()),
            "--quarantine-action",
            &format!("{} {{gpu}}", b.display()),
            "--quarantine-action",
            &format!("{c} {{gpu}}"),
        ])
    };
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &three(&fails, &hangs, "/nonexistent/drain"));
    agent.xids(&[(0, 79)]);
    let ev = events_until(&mut sub, 8, |ev| quarantine_outcomes(ev, 0).len() >= 3);
    let mut outcomes = quarantine_outcomes(&ev, 0);
    outcomes.sort();
    assert_eq!(outcomes, [(false, None), (false, None), (false, Some(3))]);
    let text = agent.log_text();
    for said in [
        "GPU 0: quarantine action",
        "failed: exit 3: nope",
        "failed: killed after 1 s",
        "failed: cannot start",
    ] {
        assert!(text.contains(said), "{said:?} not logged:\n{text}");
    }
    // Not retried before the wait after the failure (10 s).
    let more = events_until(&mut sub, 2, |ev| !quarantine_outcomes(ev, 0).is_empty());
    assert_eq!(quarantine_outcomes(&more, 0), [], "retried");
    // Counted, the last named, and the GPU's `why` says to drain it by hand.
    let status = status_once(&agent, 3, |a| a["quarantine"]["failed"] == 3);
    let a = &status["site_actions"];
    assert_eq!(
        (&a["quarantine"]["ok"], &a["quarantine"]["failed"]),
        (&serde_json::json!(0), &serde_json::json!(3)),
        "{status}"
    );
    assert_eq!(a["last_failure"]["what"], "quarantine of GPU 0", "{status}");
    let why = agent.ctl_text(&["why", "0"]);
    assert!(
        why.contains("note       a quarantine action ") && why.contains("drain the GPU by hand"),
        "{why}"
    );
    let (status, _) = agent.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}");

    // At the next start every action of the quarantine runs again.
    let agent = rig.spawn_twin_process(
        ENTRY,
        2,
        &three(&notes, &notes, notes.to_str().expect("path")),
    );
    let ev = events_until(&mut sub, 5, |ev| quarantine_outcomes(ev, 0).len() >= 3);
    assert_eq!(quarantine_outcomes(&ev, 0), [(true, Some(0)); 3]);
    let status = status_once(&agent, 3, |a| a["quarantine"]["ok"] == 3);
    assert_eq!(status["site_actions"]["quarantine"]["ok"], 3, "{status}");
    assert!(status["site_actions"]["last_failure"].is_null(), "{status}");
    assert!(!agent.ctl_text(&["why", "0"]).contains("quarantine action"));
    assert_eq!(
        lines(&log).iter().filter(|l| *l == "ran 0").count(),
        3,
        "{}",
        read(&log)
    );
}

/// Cooling-loss steps that fail, hang or cannot start: each is published
/// as a failed `cooling_action` and logged, and the later steps still run
/// in order.
#[test]
fn cooling_steps_that_fail_hang_or_cannot_start_are_reported_and_the_next_steps_still_run() {
    let Some(rig) = Rig::start("f5") else {
        return;
    };
    let log = actions_log(&rig);
    let fails = noting(&rig, "fail.sh", "failed", "echo nope >&2; exit 3");
    let hangs = noting(&rig, "hang.sh", "started", "exec sleep 20");
    let notes = noting(&rig, "note.sh", "ran", "");
    let mut f = cooling_flags(&fails, &hangs, Path::new("/nonexistent/power-up"), &notes);
    f.extend(flags(&["--cooling-timeout-s", "1"]));
    let mut sub = rig.subscribe(&["event"]);
    let agent = rig.spawn_twin_process(ENTRY, 2, &f);
    rig.publish_cdu_state(true, 1);
    let ev = events_until(&mut sub, 6, |ev| cooling_outcomes(ev).len() >= 2);
    assert_eq!(
        cooling_outcomes(&ev),
        [
            (CoolingStep::Drain, false, Some(3)),
            (CoolingStep::PowerDown, false, None)
        ]
    );
    rig.publish_cdu_state(false, 2);
    let ev = events_until(&mut sub, 6, |ev| cooling_outcomes(ev).len() >= 2);
    assert_eq!(
        cooling_outcomes(&ev),
        [
            (CoolingStep::PowerUp, false, None),
            (CoolingStep::Resume, true, Some(0))
        ]
    );
    let status = status_once(&agent, 3, |a| a["cooling_loss"]["ok"] == 1);
    let a = &status["site_actions"];
    assert_eq!(
        (&a["cooling_loss"]["ok"], &a["cooling_loss"]["failed"]),
        (&serde_json::json!(1), &serde_json::json!(3)),
        "{status}"
    );
    assert_eq!(
        a["last_failure"]["what"], "cooling-loss power-up",
        "{status}"
    );
    let text = agent.log_text();
    for said in [
        "cooling-loss drain: ",
        "failed: exit 3: nope",
        "failed: killed after 1 s",
        "failed: cannot start",
    ] {
        assert!(text.contains(said), "{said:?} not logged:\n{text}");
    }
    assert_eq!(
        lines(&log),
        [
            "failed drain f5 2",
            "started power_down f5 2",
            "ran resume f5 2"
        ]
    );
}

/// A clean stop (SIGTERM) while a quarantine action and a cooling-loss
/// step run: the stop waits for both, publishes their outcomes, runs the
/// step decided behind the running one, and ends well within systemd's
/// `TimeoutStopSec`; the next start runs none of them again but the
/// power-down, the rack still without cooling.
#[test]
fn a_clean_stop_waits_for_the_running_actions_and_keeps_their_outcomes() {
    let Some(rig) = Rig::start("f6") else {
        return;
    };
    let log = actions_log(&rig);
    let slow = noting(
        &rig,
        "slow.sh",
        "started",
        &format!("sleep 2; echo \"done $*\" >> {}", log.display()),
    );
    let notes = noting(&rig, "note.sh", "ran", "");
    let mut f = cooling_flags(&slow, &notes, &notes, &notes);
    f.extend(flags(&[
        "--quarantine-action",
        &format!("{} gpu-{{gpu}}", slow.display()),
    ]));
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(1, 79)]);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "started gpu-1", 5);
    wait_for(&log, "started drain f6 2", 5);
    let (status, took) = agent.terminate(Duration::from_secs(12));
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(8), "the stop took {took:?}");
    let text = read(&log);
    for ran in ["done gpu-1", "done drain f6 2", "ran power_down f6 2"] {
        assert!(
            text.contains(ran),
            "{ran:?} not run before the exit:\n{text}"
        );
    }
    let ev = events_until(&mut sub, 5, |ev| {
        !quarantine_outcomes(ev, 1).is_empty() && cooling_outcomes(ev).len() >= 2
    });
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    assert_eq!(
        cooling_outcomes(&ev),
        [
            (CoolingStep::Drain, true, Some(0)),
            (CoolingStep::PowerDown, true, Some(0))
        ]
    );
    // The next start knows them done: it runs again the power-down alone
    // (the host runs again in the phase "powered down" with the CDU still
    // saying the rack has no cooling, so it is powered down again, once),
    // not the drain nor the actions of the GPU still quarantined.
    let before = read(&log);
    let agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let want = ["ran power_down f6 2"];
    let again = || {
        let mut new: Vec<String> = read(&log)[before.len()..]
            .lines()
            .map(String::from)
            .collect();
        new.sort();
        new
    };
    let end = Instant::now() + Duration::from_secs(8);
    while again() != want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(again(), want, "run again at the start");
    let text = agent.log_text();
    assert!(
        text.contains("GPU 1: quarantined still at this start"),
        "{text}"
    );
}

/// In a storm the console's `events` does not wait behind the flash
/// writes queued (each synced; here slowed to 20 ms, as on a busy disk):
/// it answers with what is in flash and says how many writes were still
/// queued, in its JSON and as a person reads it.
#[test]
fn ctl_events_answers_ahead_of_a_storms_flash_writes() {
    let Some(rig) = Rig::start("f9") else {
        return;
    };
    let mut agent =
        rig.spawn_twin_process_with(ENTRY, 8, &[], &[("LOOPWARDEN_FAULT_FLASH_SYNC_MS", "20")]);
    // Application faults: each an event (logged, stored in the outbox,
    // its frame number logged), no quarantine. Seconds of writes.
    let storm: Vec<(u8, u16)> = (0..400u32).map(|i| ((i % 8) as u8, 31)).collect();
    agent.xids(&storm);
    // A read asked while 64 writes or fewer wait goes behind them (and
    // says those queued since): asked again until one goes ahead of more.
    // Were reads never to go ahead, each would wait the storm out (seconds
    // of 20 ms writes) and none would come back in time.
    let end = Instant::now() + Duration::from_secs(20);
    let queued = loop {
        let v = agent.ctl(&["events"]);
        let queued = v.as_ref().and_then(|v| v["queued_for_flash"].as_u64());
        match queued {
            Some(n) if n > 64 => break n,
            _ => {
                assert!(Instant::now() < end, "no answer ahead of the storm: {v:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert!(queued > 64, "answered ahead of {queued} writes");
    let text = agent.ctl_text(&["events"]);
    assert!(
        text.contains("writes were still queued for the flash"),
        "{text}"
    );
}

/// A storm of fatal XIDs on seven GPUs, with the eighth GPU's one fatal
/// XID in the middle of it: every GPU is quarantined and its action runs
/// exactly once, with its outcome in the event log; the bounded XID queue
/// overflows, and says so in the log. (The outcomes reach the bus behind
/// the storm's thousands of `xid` events, in the outbox's order: later
/// than this test waits.)
#[test]
fn an_xid_storm_over_eight_gpus_runs_every_gpus_action_once() {
    let Some(rig) = Rig::start("f7") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let mut agent = rig.spawn_twin_process(
        ENTRY,
        8,
        &flags(&[
            "--quarantine-action",
            &format!("{} {{gpu}}", notes.display()),
        ]),
    );
    // Fewer than the recorder's 4096 jobs, more than the queue's 1024.
    let storm: Vec<(u8, u16)> = (0..1_500u32)
        .map(|i| ((i % 7) as u8, [79, 48, 95][(i / 7 % 3) as usize]))
        .collect();
    let mut xids = storm.clone();
    xids.push((7, 79));
    xids.extend(storm);
    agent.xids(&xids);
    let want: Vec<String> = (0..8).map(|g| format!("ran {g}")).collect();
    // The console answers ahead of the storm's flash writes (each
    // synced) with what is in flash so far: the outcomes are there once
    // their turn came, on a machine busy with other I/O late, so it is
    // asked again until a generous deadline.
    let end = Instant::now() + Duration::from_secs(60);
    let outcomes = loop {
        let Some(logged) = agent.ctl(&["events"]) else {
            assert!(Instant::now() < end, "ctl events: no answer in 60 s");
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let outcomes: Vec<(u64, bool)> = logged["events"]
            .as_array()
            .expect("events")
            .iter()
            .filter_map(|e| {
                let a = &e["event"]["quarantine_action"];
                Some((a["gpu"].as_u64()?, a["ok"].as_bool()?))
            })
            .collect();
        if outcomes.len() >= 8 || Instant::now() > end {
            break outcomes;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut ran = lines(&log);
    ran.sort();
    assert_eq!(ran, want, "each GPU's action once");
    let mut outcomes = outcomes;
    outcomes.sort();
    assert_eq!(outcomes, (0..8).map(|g| (g, true)).collect::<Vec<_>>());
    let status = agent.ctl(&["status"]).expect("ctl status");
    let dropped = status["xids"]["dropped"].as_u64().expect("xids.dropped");
    assert!(
        dropped > 0,
        "the storm did not overflow the queue: {status}"
    );
    let text = agent.log_text();
    assert!(
        text.contains("XIDs dropped by the full XID queue"),
        "{dropped} dropped, not said:\n{text}"
    );
}

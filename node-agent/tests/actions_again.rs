//! The site actions that did not end well, run again: a cooling-loss
//! resume kept from before a restart (at most once, at the next start);
//! a quarantine's actions and a cooling-loss drain that failed (while the
//! agent runs, after a wait that doubles with each failure).
//!
//! The agent runs in a process of its own (the test binary run again at
//! [`agent_process`], `rig::twin_process`), so a test can kill it with
//! SIGKILL and start it again on the same flash. Each command is a script
//! that appends a line to `actions.log`: the lines are the proof of what
//! ran, and in which order.
//!
//! Skipped when mosquitto is not installed, except under CI (`CI=true`),
//! where a missing tool fails the test.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

#[path = "actions/common.rs"]
mod common;

use std::time::{Duration, Instant};

use loopwarden_protocol::{
    AckCode, CommandAuth, CoolingStep, Frame, GpuIndex, Ident, Message, NodeId, QuarantineRelease,
    Role, Text,
};

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

/// A resume that fails (Slurm refuses `State=RESUME` on a node already
/// back in service: the agent was killed just after `scontrol` resumed
/// it) is kept pending, and runs again at the next start, once: failing
/// then too, it is said, naming what to check, and dropped, so a start
/// weeks later does not resume a node an operator drained since.
#[test]
fn a_resume_that_fails_again_at_the_start_is_dropped_not_run_at_every_start() {
    let Some(rig) = Rig::start("g1") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let refused = "echo 'slurm_update error: Invalid node state specified' >&2; exit 1";
    let resume = noting(&rig, "resume.sh", "resumed", refused);
    let f = cooling_flags(&notes, &notes, &notes, &resume);
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down g1 2", 5);
    rig.publish_cdu_state(false, 2);
    let failed = (CoolingStep::Resume, false, Some(1));
    let ev = events_until(&mut sub, 5, |ev| cooling_outcomes(ev).contains(&failed));
    assert!(cooling_outcomes(&ev).contains(&failed), "{ev:?}");
    let (status, _) = agent.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}");

    // The next start: run again, once, and dropped.
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let ev = events_until(&mut sub, 5, |ev| !cooling_outcomes(ev).is_empty());
    assert_eq!(cooling_outcomes(&ev), [failed]);
    let said = "not run again";
    let end = Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains(said) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = agent.log_text();
    assert!(
        text.contains(said) && text.contains("resume it by hand"),
        "the dropped resume is not said:\n{text}"
    );
    let (status, _) = agent.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}");

    // The start after it runs nothing.
    let _agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let more = events_until(&mut sub, 3, |ev| !cooling_outcomes(ev).is_empty());
    assert_eq!(cooling_outcomes(&more), [], "run again");
    let resumes = lines(&log)
        .iter()
        .filter(|l| l.starts_with("resumed"))
        .count();
    assert_eq!(resumes, 2, "{}", read(&log));
}

/// A resume kept pending with the power-up before it, in one record (the
/// power-up failed, or the agent was killed while it ran), is still the
/// resume's last try at the next start: refused again, it is dropped, and
/// the start after it does not run it a third time.
#[test]
fn a_resume_kept_behind_a_failed_power_up_runs_again_once_not_at_every_start() {
    let Some(rig) = Rig::start("g5") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let power_up = noting(&rig, "power_up.sh", "ran", "exit 1");
    let refused = "echo 'slurm_update error: Invalid node state specified' >&2; exit 1";
    let resume = noting(&rig, "resume.sh", "resumed", refused);
    let f = cooling_flags(&notes, &notes, &power_up, &resume);
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down g5 2", 5);
    rig.publish_cdu_state(false, 2);
    let failed = (CoolingStep::Resume, false, Some(1));
    let ev = events_until(&mut sub, 5, |ev| cooling_outcomes(ev).contains(&failed));
    assert!(cooling_outcomes(&ev).contains(&failed), "{ev:?}");
    let (status, _) = agent.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    for _ in 0..2 {
        let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
        events_until(&mut sub, 3, |ev| cooling_outcomes(ev).len() >= 2);
        let (status, _) = agent.terminate(Duration::from_secs(10));
        assert!(status.success(), "{status}");
    }
    let resumes = lines(&log)
        .iter()
        .filter(|l| l.starts_with("resumed"))
        .count();
    assert_eq!(resumes, 2, "{}", read(&log));
}

/// A quarantine action `<script> <gpu>` that notes in the actions' log
/// as it starts how many of its copies run at once for that GPU
/// (`quarantine start <gpu> <n>`), takes `slow0` seconds for GPU 0 and 1 s
/// for any other, and notes its end (`quarantine end <gpu>`).
fn counting(rig: &Rig, slow0: u32) -> std::path::PathBuf {
    let dir = rig.dir.path();
    let (dir, log) = (dir.display(), actions_log(rig));
    let log = log.display();
    let (lock, now) = (
        format!("{dir}/running.$1.lock"),
        format!("{dir}/running.$1"),
    );
    rig.script(
        "slow.sh",
        &format!(
            "( flock 9; n=$(( $(cat {now} 2>/dev/null || echo 0) + 1 )); echo $n > {now}; echo \"quarantine start $1 $n\" >> {log} ) 9>{lock}\n\
             if [ \"$1\" = 0 ]; then sleep {slow0}; else sleep 1; fi\n\
             ( flock 9; echo $(( $(cat {now}) - 1 )) > {now}; echo \"quarantine end $1\" >> {log} ) 9>{lock}"
        ),
    )
}

/// A GPU's quarantine actions run one run at a time, and different GPUs'
/// runs at the same time: GPU 1 quarantined while GPU 0's slow action
/// runs starts its actions at once, not behind GPU 0's (its drain would
/// wait up to the actions' timeouts, the node schedulable meanwhile); a
/// cooling-loss resume that ends while they run (each runs again after
/// it) never runs two copies for one GPU at once (a site's drain wrapper
/// that reads and writes the node's reason would lose a part): a run in
/// flight when the resume ended runs again once it ended.
#[test]
fn quarantine_actions_run_one_at_a_time_per_gpu_and_gpus_at_once() {
    let Some(rig) = Rig::start("g6") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let slow = counting(&rig, 6);
    let mut f = cooling_flags(&notes, &notes, &notes, &notes);
    f.extend(flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", slow.display()),
    ]));
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(0, 79)]);
    wait_for(&log, "quarantine start 0", 5);
    agent.xids(&[(1, 79)]);
    wait_for(&log, "quarantine start 1", 10);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down g6 2", 5);
    rig.publish_cdu_state(false, 2);
    let ev = events_until(&mut sub, 40, |ev| {
        quarantine_outcomes(ev, 0).len() >= 2 && quarantine_outcomes(ev, 1).len() >= 2
    });
    let text = read(&log);
    let starts: Vec<_> = lines(&log)
        .into_iter()
        .filter(|l| l.starts_with("quarantine start"))
        .collect();
    assert!(
        starts.iter().all(|l| l.ends_with(" 1")),
        "two at once for one GPU:\n{text}"
    );
    assert_eq!(quarantine_outcomes(&ev, 0), [(true, Some(0)); 2], "{text}");
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0)); 2], "{text}");
    // GPU 1's first run started while GPU 0's first (6 s) still ran.
    let at = |l: &str| runs_at(&text, l);
    assert!(
        at("quarantine start 1") < at("quarantine end 0"),
        "GPU 1's actions waited for GPU 0's:\n{text}"
    );
}

/// A GPU released and quarantined anew while its earlier quarantine's
/// actions run: the new quarantine's run waits for them, said once in the
/// log, and starts once they ended, never beside them.
#[test]
fn a_gpus_new_quarantine_waits_for_its_earlier_quarantines_run() {
    let Some(rig) = Rig::start("g8") else {
        return;
    };
    let log = actions_log(&rig);
    let slow = counting(&rig, 4);
    let f = flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", slow.display()),
    ]);
    let mut sub = rig.subscribe(&["event", "ack"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(0, 79)]);
    wait_for(&log, "quarantine start 0 1", 5);
    let release = Frame {
        sender: NodeId::new(Role::Operator, "jdoe").expect("ident"),
        seq: 1,
        time: rig::now(),
        message: Message::QuarantineRelease(QuarantineRelease {
            gpu: GpuIndex::new(0).expect("index"),
            operator: Ident::new("jdoe").expect("ident"),
            note: Text::new("reseated").expect("note"),
            auth: CommandAuth::default(),
        }),
    };
    let ack = rig.ack(&mut sub, &release);
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    agent.xids(&[(0, 79)]);
    let ev = events_until(&mut sub, 20, |ev| quarantine_outcomes(ev, 0).len() >= 2);
    let text = read(&log);
    assert_eq!(quarantine_outcomes(&ev, 0), [(true, Some(0)); 2], "{text}");
    assert_eq!(
        lines(&log),
        [
            "quarantine start 0 1",
            "quarantine end 0",
            "quarantine start 0 1",
            "quarantine end 0"
        ],
        "two at once for one GPU"
    );
    let said = "the actions of its earlier quarantine are running";
    let agent_log = agent.log_text();
    assert_eq!(agent_log.matches(said).count(), 1, "{agent_log}");
}

/// A quarantine run that began before a cooling-loss resume was handed
/// out, and ended well before the resume ended, is not known done: the
/// resume lifts its drain. An agent killed then runs the quarantine's
/// actions again at its next start, not only after the resume.
#[test]
fn a_quarantine_run_begun_before_a_resume_is_not_kept_done() {
    let Some(rig) = Rig::start("g7") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let resume = noting(&rig, "resume.sh", "resumed", "sleep 6");
    let slow = counting(&rig, 3);
    let mut f = cooling_flags(&notes, &notes, &notes, &resume);
    f.extend(flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", slow.display()),
    ]));
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(0, 79)]);
    wait_for(&log, "quarantine start 0 1", 5);
    rig.publish_cdu_state(true, 1);
    wait_for(&log, "ran power_down g7 2", 5);
    rig.publish_cdu_state(false, 2);
    wait_for(&log, "resumed resume g7 2", 5);
    let ev = events_until(&mut sub, 10, |ev| !quarantine_outcomes(ev, 0).is_empty());
    assert_eq!(
        quarantine_outcomes(&ev, 0),
        [(true, Some(0))],
        "{}",
        read(&log)
    );
    let resumed = cooling_outcomes(&ev)
        .iter()
        .any(|o| o.0 == CoolingStep::Resume);
    assert!(!resumed, "the resume ended first: {ev:?}");
    agent.crash();
    let agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let said = "quarantined before the restart, its actions not known to have ended well";
    let end = Instant::now() + Duration::from_secs(4);
    while !agent.log_text().contains(said) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(agent.log_text().contains(said), "{}", agent.log_text());
}

/// The line of `text` that starts with `start`.
fn runs_at(text: &str, start: &str) -> Option<usize> {
    text.lines().position(|l| l.starts_with(start))
}

/// A script that fails (exit 1) its first two runs, then ends well; each
/// run noted as `<word> <its arguments>` in the actions' log.
fn failing_twice(rig: &Rig, name: &str, word: &str) -> std::path::PathBuf {
    let count = rig.dir.path().join(format!("{name}.runs"));
    let then = format!(
        "echo x >> {0}; if [ \"$(wc -l < {0})\" -le 2 ]; then echo 'slurm_update error: Unable to contact slurm controller' >&2; exit 1; fi",
        count.display()
    );
    noting(rig, name, word, &then)
}

/// A quarantine action that fails (the scheduler's controller failing
/// over) runs again while the agent runs, 10 s after the first failure,
/// 20 s after the second: the third run ends well, and the quarantine is
/// done, each outcome published.
#[test]
fn a_failed_quarantine_action_runs_again_after_a_backoff_until_it_ends_well() {
    let Some(rig) = Rig::start("g2") else {
        return;
    };
    let log = actions_log(&rig);
    let drain = failing_twice(&rig, "drain.sh", "quarantine");
    let f = flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", drain.display()),
    ]);
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(0, 79)]);
    let started = Instant::now();
    let ev = events_until(&mut sub, 60, |ev| quarantine_outcomes(ev, 0).len() >= 3);
    assert_eq!(
        quarantine_outcomes(&ev, 0),
        [(false, Some(1)), (false, Some(1)), (true, Some(0))]
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(30), "no backoff: {took:?}");
    assert_eq!(lines(&log), ["quarantine 0"; 3]);
    let text = agent.log_text();
    assert!(text.contains("its actions run again in 10 s"), "{text}");
    assert!(text.contains("its actions run again in 20 s"), "{text}");
    // Its retry ended well: `ctl status` shows no failure left.
    let status = status_once(&agent, 3, |a| a["last_failure"].is_null());
    assert!(status["site_actions"]["last_failure"].is_null(), "{status}");
    // Done: not run again, here nor at the next start (which says so).
    let more = events_until(&mut sub, 2, |ev| !quarantine_outcomes(ev, 0).is_empty());
    assert_eq!(quarantine_outcomes(&more, 0), []);
    agent.crash();
    let agent = rig.spawn_twin_process(ENTRY, 2, &f);
    let said = "GPU 0: quarantined still at this start, its actions known done: not run again";
    let end = Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains(said) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(agent.log_text().contains(said), "{}", agent.log_text());
    // Said before the start's runs are spawned: nothing more runs.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(lines(&log), ["quarantine 0"; 3], "done, not run again");
}

/// A cooling-loss drain that fails runs again while the agent runs, with
/// the same backoff, until it ends well; the power-down after the grace
/// is not held back by it.
#[test]
fn a_failed_cooling_drain_runs_again_after_a_backoff_until_it_ends_well() {
    let Some(rig) = Rig::start("g3") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let drain = failing_twice(&rig, "drain.sh", "ran");
    let mut f = cooling_flags(&drain, &notes, &notes, &notes);
    let grace = f.iter().position(|a| a == "--cooling-grace-s").unwrap() + 1;
    f[grace] = "600".into();
    let mut sub = rig.subscribe(&["event"]);
    let agent = rig.spawn_twin_process(ENTRY, 2, &f);
    rig.publish_cdu_state(true, 1);
    let started = Instant::now();
    let ev = events_until(&mut sub, 60, |ev| cooling_outcomes(ev).len() >= 3);
    let drained = |ok, code| (CoolingStep::Drain, ok, Some(code));
    assert_eq!(
        cooling_outcomes(&ev),
        [drained(false, 1), drained(false, 1), drained(true, 0)]
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(30), "no backoff: {took:?}");
    assert_eq!(lines(&log), ["ran drain g3 2"; 3]);
    let text = agent.log_text();
    assert!(text.contains("run again in 20 s"), "{text}");
    let status = status_once(&agent, 3, |a| a["last_failure"].is_null());
    assert!(status["site_actions"]["last_failure"].is_null(), "{status}");
}

/// A quarantine whose action failed, its GPU released by an operator
/// before the wait is over: the action does not run again, and its
/// failure is shown no more (`ctl status`).
#[test]
fn a_failed_quarantine_action_of_a_gpu_released_meanwhile_does_not_run_again() {
    let Some(rig) = Rig::start("g4") else {
        return;
    };
    let log = actions_log(&rig);
    let fails = noting(&rig, "fail.sh", "quarantine", "exit 1");
    let f = flags(&[
        "--quarantine-action",
        &format!("{} {{gpu}}", fails.display()),
    ]);
    let mut sub = rig.subscribe(&["event", "ack"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &f);
    agent.xids(&[(0, 79)]);
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 0).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 0), [(false, Some(1))]);
    let release = Frame {
        sender: NodeId::new(Role::Operator, "jdoe").expect("ident"),
        seq: 1,
        time: rig::now(),
        message: Message::QuarantineRelease(QuarantineRelease {
            gpu: GpuIndex::new(0).expect("index"),
            operator: Ident::new("jdoe").expect("ident"),
            note: Text::new("reseated").expect("note"),
            auth: CommandAuth::default(),
        }),
    };
    let ack = rig.ack(&mut sub, &release);
    assert_eq!(ack.code, AckCode::Ok, "{}", ack.detail.as_str());
    // Past the first wait (10 s).
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(lines(&log), ["quarantine 0"], "run again after the release");
    let text = agent.log_text();
    assert!(text.contains("released or quarantined anew"), "{text}");
    let status = status_once(&agent, 3, |a| a["last_failure"].is_null());
    assert!(status["site_actions"]["last_failure"].is_null(), "{status}");
}

/// A quarantine's actions known done, run again at a start
/// (`again_at_start`) and failing there (the scheduler's controller not
/// up yet), are known done no more: the next start says they are not
/// known to have ended well and runs them, `again_at_start` or not.
#[test]
fn a_run_again_at_the_start_that_fails_is_not_known_done_at_the_next() {
    let Some(rig) = Rig::start("g9") else {
        return;
    };
    let log = actions_log(&rig);
    let notes = noting(&rig, "note.sh", "ran", "");
    let fails = noting(&rig, "fail.sh", "failed", "exit 1");
    let action = |script: &std::path::Path, again: bool| {
        let mut f = flags(&[
            "--quarantine-action",
            &format!("{} {{gpu}}", script.display()),
        ]);
        if again {
            f.push("--quarantine-again-at-start".into());
        }
        f
    };
    let mut sub = rig.subscribe(&["event"]);
    let mut agent = rig.spawn_twin_process(ENTRY, 2, &action(&notes, false));
    agent.xids(&[(1, 79)]);
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    let (status, _) = agent.terminate(Duration::from_secs(12));
    assert!(status.success(), "{status}");

    let mut agent = rig.spawn_twin_process(ENTRY, 2, &action(&fails, true));
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(false, Some(1))]);
    let said = "known done no more";
    let end = Instant::now() + Duration::from_secs(5);
    while !agent.log_text().contains(said) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.crash();

    let agent = rig.spawn_twin_process(ENTRY, 2, &action(&notes, false));
    let ev = events_until(&mut sub, 5, |ev| !quarantine_outcomes(ev, 1).is_empty());
    assert_eq!(quarantine_outcomes(&ev, 1), [(true, Some(0))]);
    assert_eq!(lines(&log), ["ran 1", "failed 1", "ran 1"]);
    let text = agent.log_text();
    assert!(
        text.contains(
            "GPU 1: quarantined before the restart, its actions not known to have ended well"
        ),
        "{text}"
    );
}

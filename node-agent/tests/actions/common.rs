//! What the tests of the site actions share: scripts that note what ran
//! in `actions.log`, the cooling-loss flags, and the events they wait for.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use loopwarden_protocol::{CoolingStep, Event, HealthState, Message};
use loopwarden_system_tests::{Seen, Subscriber};

use super::rig::{self, frame, Rig};

/// Owned flags from words.
pub fn flags(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The log of the actions' scripts, and a script `name` that appends
/// `<word> <its arguments>` to it, then runs `then` (a shell line).
pub fn noting(rig: &Rig, name: &str, word: &str, then: &str) -> PathBuf {
    let log = actions_log(rig);
    rig.script(
        name,
        &format!("echo \"{word} $*\" >> {}\n{then}", log.display()),
    )
}

pub fn actions_log(rig: &Rig) -> PathBuf {
    rig.dir.path().join("actions.log")
}

/// `ctl status` once its site actions show `done` (the console's snapshot
/// follows the loop's next round, behind the outcome's event), or as it
/// is after `secs`.
pub fn status_once(
    console: &rig::Console,
    secs: u64,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let status = console.ctl(&["status"]).expect("ctl status");
        if done(&status["site_actions"]) || Instant::now() >= deadline {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits until the log holds `want`; returns it. Fails after `secs`.
pub fn wait_for(log: &Path, want: &str, secs: u64) -> String {
    let end = Instant::now() + Duration::from_secs(secs);
    while !read(log).contains(want) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = read(log);
    assert!(text.contains(want), "{want:?} not in the log:\n{text}");
    text
}

/// The events among `seen`.
pub fn events(seen: &[Seen]) -> Vec<Event> {
    seen.iter()
        .filter_map(frame)
        .filter_map(|f| match f.message {
            Message::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

/// Collects events on `sub` until `done` holds of them, for `secs` at
/// most; returns them.
pub fn events_until(
    sub: &mut Subscriber,
    secs: u64,
    done: impl Fn(&[Event]) -> bool,
) -> Vec<Event> {
    events(&sub.collect_until(Duration::from_secs(secs), |s| done(&events(s))))
}

/// The `quarantine_action` outcomes of GPU `gpu` among `ev`.
pub fn quarantine_outcomes(ev: &[Event], gpu: u8) -> Vec<(bool, Option<i32>)> {
    ev.iter()
        .filter_map(|e| match e {
            Event::QuarantineAction {
                gpu: g,
                ok,
                exit_code,
            } if g.get() == gpu => Some((*ok, *exit_code)),
            _ => None,
        })
        .collect()
}

/// The `cooling_action` outcomes among `ev`.
pub fn cooling_outcomes(ev: &[Event]) -> Vec<(CoolingStep, bool, Option<i32>)> {
    ev.iter()
        .filter_map(|e| match e {
            Event::CoolingAction {
                step,
                ok,
                exit_code,
            } => Some((*step, *ok, *exit_code)),
            _ => None,
        })
        .collect()
}

pub fn quarantined(ev: &[Event], gpu: u8) -> bool {
    ev.iter().any(|e| {
        matches!(e, Event::HealthChanged { gpu: g, to: HealthState::Quarantined, .. }
            if g.get() == gpu)
    })
}

/// The lines of the log.
pub fn lines(log: &Path) -> Vec<String> {
    read(log).lines().map(String::from).collect()
}

/// The cooling-loss flags of rack 2 with no grace: `drain` runs the
/// script `drain`, and so on.
pub fn cooling_flags(
    drain: &Path,
    power_down: &Path,
    power_up: &Path,
    resume: &Path,
) -> Vec<String> {
    let step = |s: &Path, name: &str| format!("{} {name} {{host}} {{rack}}", s.display());
    flags(&[
        "--rack",
        "2",
        "--cooling-grace-s",
        "0",
        "--cooling-drain",
        &step(drain, "drain"),
        "--cooling-power-down",
        &step(power_down, "power_down"),
        "--cooling-power-up",
        &step(power_up, "power_up"),
        "--cooling-resume",
        &step(resume, "resume"),
    ])
}

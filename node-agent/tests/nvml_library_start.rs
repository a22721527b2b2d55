//! What the agent's start refuses and says about the GPUs it finds, on
//! its production NVML path (`SystemNvml` over `nvml-wrapper`, against the
//! fake `libnvidia-ml.so.1` of `tests/fake_nvml/lib.rs`, run by
//! `system/fake_library.rs`): a GPU whose driver does not keep it
//! initialized between clients (persistence mode off) stops the start
//! unless `persistence = "not_required"` is written; a `site_limit_w`
//! below the lowest limit NVML takes is said as an error, and NVML's
//! highest limit above the board's `max_cap_w` as a warning.
//!
//! Skipped when `rustc` or mosquitto is missing, except under CI
//! (`CI=true`), where a missing tool fails.

#[path = "system/rig.rs"]
#[allow(dead_code)]
mod rig;

#[path = "system/fake_library.rs"]
#[allow(dead_code)]
mod fake_library;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fake_library::*;
use rig::Rig;

/// `node-agent run --config CONFIG` on `fake`, which must end within
/// 20 s: its exit status and what it logged.
fn refused_start(rig: &Rig, fake: &FakeNvml, config: &Path) -> (std::process::ExitStatus, String) {
    let (stderr, log) = rig.agent_log();
    let mut child = fake
        .agent(&["run", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start node-agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the agent started:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The fake's two GPUs with GPU 1's persistence mode as `line` sets it.
fn host_with(host: &'static str, line: &str) -> Option<(Rig, FakeNvml)> {
    let lib = fake_library()?;
    let rig = Rig::start(host)?;
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &format!("{HOST_GPUS}{line}\n"));
    Some((rig, fake))
}

/// Persistence mode off on GPU 1: the start is refused, saying what
/// happens to the caps at a restart, how to fix it and the opt-out; no
/// limit is set.
#[test]
fn a_gpu_without_persistence_mode_is_refused_at_start_naming_the_opt_out() {
    let Some((rig, fake)) = host_with("h70", "1 persistence 0") else {
        return;
    };
    let config = host_config(&rig, "");
    let (status, log) = refused_start(&rig, &fake, &config);
    assert!(!status.success(), "{status}:\n{log}");
    for said in [
        "GPU 1: persistence mode is off",
        "revert to the default",
        "nvidia-persistenced",
        "nvidia-smi -pm 1",
        "persistence = \"not_required\"",
    ] {
        assert!(log.contains(said), "{said:?} not said:\n{log}");
    }
    assert!(!log.contains("GPU 0: persistence mode is off"), "{log}");
    assert_eq!(fake.sets(), [], "nothing set");
}

/// With the opt-out written the agent starts, and says it: the opt-out
/// and the GPU it takes.
#[test]
fn with_the_opt_out_a_gpu_without_persistence_mode_is_taken_and_said() {
    let Some((rig, fake)) = host_with("h71", "1 persistence 0") else {
        return;
    };
    let config = host_config(&rig, "persistence = \"not_required\"\n");
    let agent = RealAgent::start(&rig, &fake, &config);
    let log = agent.log_text();
    assert!(
        log.contains("protection switched off on purpose: persistence = \"not_required\""),
        "{log}"
    );
    assert!(log.contains("GPU 1: persistence mode is off"), "{log}");
    assert!(!log.contains("GPU 0: persistence mode is off"), "{log}");
}

/// Persistence mode on: not a word of it. A GPU that cannot say its mode
/// ("not supported") is said once and taken.
#[test]
fn persistent_gpus_start_without_a_word_and_an_unknown_mode_is_said_once() {
    let call = "nvmlDeviceGetPersistenceMode";
    let Some((rig, fake)) = host_with("h72", &format!("1 unsupported {call}")) else {
        return;
    };
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log_text();
    assert!(!log.contains("persistence mode is off"), "{log}");
    assert!(!log.contains("protection switched off"), "{log}");
    assert!(!log.contains("site_limit_w"), "{log}");
    assert!(!log.contains("max_cap_w"), "{log}");
    let unknown = format!("GPU 1: {call} failed (NVML_ERROR_NOT_SUPPORTED)");
    assert_eq!(log.matches(&unknown).count(), 1, "{log}");
    assert!(!log.contains(&format!("GPU 0: {call}")), "{log}");
    assert_eq!(count(&fake.calls(), call, 0), 1, "read once, at the start");
}

/// NVML takes no limit below 300 W, the board's minimum is 200 W: a
/// `site_limit_w` of 250 W passes the configuration's check, but cannot
/// be set. The start says so as an error per GPU, naming both figures
/// and the ceiling instead, and no limit below 300 W is asked.
#[test]
fn a_site_limit_below_nvmls_minimum_is_said_with_the_ceiling_instead() {
    let Some((rig, fake)) = host_with("h73", "* min_mw 300000") else {
        return;
    };
    let config = host_config(&rig, "site_limit_w = 250\n");
    let agent = RealAgent::start(&rig, &fake, &config);
    std::thread::sleep(Duration::from_secs(1));
    let log = agent.log_text();
    for gpu in 0..2 {
        let said = format!(
            "GPU {gpu}: site_limit_w = 250 W is below its lowest settable power limit, 300 W"
        );
        let line = log.lines().find(|l| l.contains(&said));
        let line = line.unwrap_or_else(|| panic!("{said:?} not said:\n{log}"));
        assert!(line.contains("ERROR"), "{line}");
        assert!(line.contains("its ceiling is 300 W"), "{line}");
    }
    let sets = fake.sets();
    assert!(sets.iter().all(|&(_, mw)| mw >= 300_000), "{sets:?}");
}

/// A B200 host left at the default board (the H200-SXM, up to 700 W):
/// NVML's constraints reach 1000 W. The start says it, naming both, as a
/// warning, and runs.
#[test]
fn nvmls_maximum_above_the_boards_is_said_as_a_warning() {
    let Some((rig, fake)) = host_with("h74", "* max_mw 1000000") else {
        return;
    };
    let config = host_config(&rig, "");
    let agent = RealAgent::start(&rig, &fake, &config);
    let log = agent.log_text();
    for gpu in 0..2 {
        let said = format!(
            "GPU {gpu} (NVIDIA H200): NVML's limit constraints go up to 1000 W, above the \
             board's max_cap_w, 700 W (board = H200-SXM)"
        );
        let line = log.lines().find(|l| l.contains(&said));
        let line = line.unwrap_or_else(|| panic!("{said:?} not said:\n{log}"));
        assert!(line.contains("WARN"), "{line}");
    }
}

//! What the agent's start says about the GPUs it finds, on
//! its production NVML path (`SystemNvml` over `nvml-wrapper`, against the
//! fake `libnvidia-ml.so.1` of `tests/fake_nvml/lib.rs`, run by
//! `system/fake_library.rs`): a GPU whose driver does not keep it
//! initialized between clients (persistence mode off) is said as an
//! error at every start and shown as a protection that is off (the
//! console, `/metrics`), unless `persistence = "not_required"` is written
//! (then said as the other opt-outs); the agent starts either way (a
//! refused start would leave the host with no agent at all), as it does
//! with an action's program not found (said and shown the same); a `site_limit_w`
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

use std::net::SocketAddr;
use std::time::Duration;

use fake_library::*;
use rig::Rig;

/// The fake's two GPUs with GPU 1's persistence mode as `line` sets it.
fn host_with(host: &'static str, line: &str) -> Option<(Rig, FakeNvml)> {
    let lib = fake_library()?;
    let rig = Rig::start(host)?;
    let fake = FakeNvml::new(lib, rig.dir.path(), 2, &format!("{HOST_GPUS}{line}\n"));
    Some((rig, fake))
}

/// `/metrics` of an agent listening on `metrics`: its
/// `loopwarden_protection_off` lines.
fn protection_off_lines(metrics: SocketAddr) -> Vec<String> {
    let (code, body) =
        loopwarden_system_tests::prometheus::http_get(metrics, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| l.starts_with("loopwarden_protection_off{"))
        .map(str::to_string)
        .collect()
}

/// A port for `/metrics`, and the configuration's line that asks for it.
fn metrics_port() -> (SocketAddr, String) {
    let metrics: SocketAddr = ([127, 0, 0, 1], loopwarden_system_tests::free_port()).into();
    (metrics, format!("metrics_listen = \"{metrics}\"\n"))
}

/// The console's `PROTECTION OFF` rows.
fn protection_off_rows(rig: &Rig) -> Vec<String> {
    let status = rig.console().ctl_text(&["status"]);
    status
        .lines()
        .filter(|l| l.starts_with("PROTECTION OFF"))
        .map(str::to_string)
        .collect()
}

/// Persistence mode off on GPU 1, no opt-out: the agent starts and serves
/// its console (a refused start would leave the host with no agent at
/// all, restarted for ever), says as an error what happens to the caps at
/// its stop and how to fix it, and shows it as a protection that is off,
/// not on purpose: the console's PROTECTION OFF row and
/// `loopwarden_protection_off{key="persistence"}`.
#[test]
fn a_gpu_without_persistence_mode_starts_said_as_an_error_and_shown_as_a_protection_off() {
    let Some((rig, fake)) = host_with("h70", "1 persistence 0") else {
        return;
    };
    let (metrics, line) = metrics_port();
    let config = host_config(&rig, &line);
    let agent = RealAgent::start(&rig, &fake, &config);
    let log = agent.log_text();
    let said = log
        .lines()
        .find(|l| l.contains("GPU 1: persistence mode is off"));
    let said = said.unwrap_or_else(|| panic!("not said:\n{log}"));
    assert!(said.contains("ERROR"), "{said}");
    for what in [
        "revert to the default",
        "nvidia-persistenced",
        "nvidia-smi -pm 1",
        "persistence = \"not_required\"",
    ] {
        assert!(said.contains(what), "{what:?} not said:\n{said}");
    }
    assert!(!log.contains("GPU 0: persistence mode is off"), "{log}");
    assert!(!log.contains("protection switched off on purpose"), "{log}");
    let rows = protection_off_rows(&rig);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].contains("persistence mode is off on GPU 1")
            && rows[0].contains("not on purpose")
            && rows[0].contains("nvidia-persistenced"),
        "{rows:?}"
    );
    let lines = protection_off_lines(metrics);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("key=\"persistence\"") && lines[0].ends_with(" 1"),
        "{lines:?}"
    );
}

/// With the opt-out written the agent starts, and says it as the other
/// opt-outs: the opt-out in the log, on the console and on `/metrics`,
/// and the GPU it takes.
#[test]
fn with_the_opt_out_a_gpu_without_persistence_mode_is_taken_and_said() {
    let Some((rig, fake)) = host_with("h71", "1 persistence 0") else {
        return;
    };
    let (metrics, line) = metrics_port();
    let config = host_config(&rig, &format!("{line}persistence = \"not_required\"\n"));
    let agent = RealAgent::start(&rig, &fake, &config);
    let log = agent.log_text();
    assert!(
        log.contains("protection switched off on purpose: persistence = \"not_required\""),
        "{log}"
    );
    assert!(log.contains("GPU 1: persistence mode is off"), "{log}");
    assert!(!log.contains("GPU 0: persistence mode is off"), "{log}");
    let rows = protection_off_rows(&rig);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].contains("persistence = \"not_required\"") && !rows[0].contains("not on purpose"),
        "{rows:?}"
    );
    let lines = protection_off_lines(metrics);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("key=\"persistence\""), "{lines:?}");
}

/// Persistence mode on: not a word of it, no protection off. A GPU that
/// cannot say its mode ("not supported") is said once and taken.
#[test]
fn persistent_gpus_start_without_a_word_and_an_unknown_mode_is_said_once() {
    let call = "nvmlDeviceGetPersistenceMode";
    let Some((rig, fake)) = host_with("h72", &format!("1 unsupported {call}")) else {
        return;
    };
    let (metrics, line) = metrics_port();
    let config = host_config(&rig, &line);
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
    assert_eq!(protection_off_rows(&rig), Vec::<String>::new());
    assert_eq!(protection_off_lines(metrics), Vec::<String>::new());
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

/// A power-down program not there at start (on a file system not mounted
/// yet at boot): the agent starts (a refused start would leave the host
/// with no thermal guard, no caps, no health), says it as an error naming
/// the key, the line, the program and the PATH, and shows it as a
/// protection off: a PROTECTION OFF row and
/// `loopwarden_protection_off{key="cooling_loss.power_down"}`.
#[test]
fn an_action_program_not_found_starts_shown_as_a_protection_off() {
    let Some((rig, fake)) = host_with("h75", "") else {
        return;
    };
    let (metrics, line) = metrics_port();
    let config = host_config(&rig, &line);
    let text = std::fs::read_to_string(&config).expect("config");
    let program = "/nfs-not-mounted/ipmitool";
    let text = text.replace(
        "power_down = [[\"/bin/true\"]]",
        &format!("power_down = [[{program:?}]]"),
    );
    std::fs::write(&config, text).expect("config");
    let agent = RealAgent::start(&rig, &fake, &config);
    let log = agent.log_text();
    let said = format!("[cooling_loss] power_down: program \"{program}\" cannot be read");
    let line = log.lines().find(|l| l.contains(&said));
    let line = line.unwrap_or_else(|| panic!("{said:?} not said:\n{log}"));
    assert!(
        line.contains("ERROR") && line.contains("agent.toml line "),
        "{line}"
    );
    let rows = protection_off_rows(&rig);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].contains(&said), "{rows:?}");
    let lines = protection_off_lines(metrics);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("key=\"cooling_loss.power_down\""),
        "{lines:?}"
    );
}

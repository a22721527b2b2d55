//! `loopwarden-hall fleet`, small and fast: 40 real host agents on 2 real
//! cooling controllers (each with its simulated CDU on Modbus TCP and its
//! hall) through the embedded broker, 60 s of real time. Eight GPUs fail
//! (XID 79) between 3 s and 50 s; both CDUs' pumps fail at 5 s, and at
//! 40 °C outdoors under full load their GPUs reach the cap target about
//! 30 s later.
//!
//! What must hold: every field of the JSON object is there; nothing the
//! clients published is missing at the independent subscriber (no
//! message, no QoS 1 message, no sequence number); every injected XID was
//! heard as a quarantine; every capped host acknowledged its cap. The
//! latencies are printed, not asserted: timing targets belong to
//! `docs/scale.md`, not to a shared test machine.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// The fleets of this file run one at a time: each is many threads and
/// sockets on the same cores, and one beside the 40-host fleet could make
/// it lose frames that it asserts are never lost.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Waits for the fleet before it to end (a test that failed still lets
/// the next one run).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_small_fleet_loses_nothing_quarantines_every_xid_and_acks_every_cap() {
    let _one = one_at_a_time();
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .args([
            "fleet",
            "--hosts",
            "40",
            "--cdus",
            "2",
            "--duration",
            "60",
            "--xids",
            "8",
            "--shortfall-at",
            "5",
            "--ambient-c",
            "40",
            "--json",
        ])
        .output()
        .expect("loopwarden-hall runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "colour codes in a log that is no terminal: {stderr}"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let r: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    for field in [
        "frames_published",
        "frames_received",
        "qos1_events_lost",
        "events_repaired",
        "events_lost_after_repair",
        "quarantine_p50_ms",
        "quarantine_p99_ms",
        "caps_acked_p50_ms",
        "caps_acked_p99_ms",
        "agent_cpu_cores",
        "agent_rss_mib_per_host",
        "hosts",
        "cdus",
        "duration_s",
        "broker",
        "quarantines",
        "hosts_capped",
    ] {
        assert!(r.get(field).is_some(), "{field} missing");
    }
    let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} is no number"));
    assert_eq!((n("hosts"), n("cdus"), n("duration_s")), (40.0, 2.0, 60.0));
    assert_eq!(n("ambient_c"), 40.0);
    assert!(n("frames_published") > 40.0 * 60.0, "every agent published");
    assert_eq!(
        n("frames_received"),
        n("frames_published"),
        "a message lost"
    );
    assert_eq!(n("frames_lost"), 0.0);
    assert_eq!(n("qos1_not_received"), 0.0);
    assert!(n("events_acked") > 0.0, "the caps and XIDs made events");
    assert_eq!(n("qos1_events_lost"), 0.0, "an acknowledged event lost");
    assert_eq!(n("events_lost_after_repair"), 0.0);
    assert_eq!(n("seq_gaps"), 0.0, "a sender's sequence has a gap");
    assert_eq!(n("xids_injected"), 8.0, "every planned failure happened");
    assert_eq!(n("quarantines"), 8.0, "every injected XID quarantined");
    assert!(n("quarantine_p99_ms") >= n("quarantine_p50_ms"));
    assert!(n("hosts_capped") >= 1.0, "the shortfall capped hosts");
    // hosts_capped is every host a command capped, hosts_caps_acked those
    // of them that acknowledged; the silent ones are named.
    assert_eq!(
        r["hosts_caps_never_acked"],
        serde_json::json!([]),
        "a capped host never acknowledged its cap"
    );
    assert_eq!(
        n("hosts_caps_acked"),
        n("hosts_capped"),
        "every capped host acknowledged its cap"
    );
    assert_eq!(
        r["cap_watchers_lost"],
        serde_json::json!([]),
        "a cap watcher lost"
    );
    assert!(n("caps_acked_p50_ms") > 0.0);
    assert!(n("agent_cpu_cores") > 0.0 && n("agent_rss_mib_per_host") > 0.0);
}

#[test]
fn a_fleet_the_controllers_cannot_hold_is_refused() {
    let _one = one_at_a_time();
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .args(["fleet", "--hosts", "1000", "--cdus", "4", "--duration", "1"])
        .output()
        .expect("loopwarden-hall runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("250 hosts on a CDU") && err.contains("--cdus 8"),
        "{err}"
    );
}

/// A fresh folder for `--out`, named after `test`, removed first.
fn out_dir(test: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("fleet-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn small_fleet(out: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .args(["fleet", "--hosts", "2", "--cdus", "1", "--duration", "3"])
        .arg("--out")
        .arg(out)
        .output()
        .expect("loopwarden-hall runs")
}

#[test]
fn a_second_run_into_the_same_out_folder_is_refused_naming_it() {
    let _one = one_at_a_time();
    let out = out_dir("again");
    let first = small_fleet(&out);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    // The progress line a procedure waits for, at the default log level.
    assert!(
        stderr.contains("fleet: every agent connected in "),
        "{stderr}"
    );
    assert!(
        out.join("c1r0h0/flash.bin").exists(),
        "the first run's flash"
    );
    let second = small_fleet(&out);
    let err = String::from_utf8_lossy(&second.stderr);
    let _ = std::fs::remove_dir_all(&out);
    assert!(!second.status.success(), "{err}");
    assert!(
        err.contains(&format!("--out {}", out.display())) && err.contains("flash"),
        "{err}"
    );
}

#[test]
fn an_agent_whose_console_socket_cannot_be_bound_fails_the_run_naming_it() {
    let _one = one_at_a_time();
    // A Unix socket's path holds at most 107 bytes: `<out>/c1r0h0/console.sock`
    // under a 100-character folder is longer.
    let base = out_dir("long");
    let mut out = base.clone();
    while out.as_os_str().len() < 100 {
        out.push(
            "x".repeat(100 - out.as_os_str().len())
                .chars()
                .take(20)
                .collect::<String>(),
        );
    }
    let run = Command::new(env!("CARGO_BIN_EXE_loopwarden-hall"))
        .args(["fleet", "--hosts", "2", "--cdus", "1", "--duration", "5"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("loopwarden-hall runs");
    let _ = std::fs::remove_dir_all(&base);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(
        err.contains("agent c1r0h") && err.contains("console socket"),
        "{err}"
    );
}

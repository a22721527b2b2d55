//! The client side of the console: answers rendered as aligned tables for
//! people, one function per request (`--json` prints the answer as-is).

use std::fmt::Write as _;

use loopwarden_field::render::{
    events_table, fill, fill_each, key_values, resends, rows_of, table, text as s,
};
use loopwarden_protocol::TimestampMs;
use serde_json::Value;

use node_core::health::fmt_time;

use super::Request;

/// Renders an answer for people.
pub fn render(req: &Request, v: &Value) -> String {
    match req {
        Request::Status => status(v),
        Request::Gpus => gpus(v),
        Request::Caps => caps(v),
        Request::Events { .. } => events_table(v),
        Request::Why { .. } => why(v),
    }
}

fn status(v: &Value) -> String {
    let mut rows = stale_row(v);
    rows.extend(status_rows(v));
    rows.extend(warning_rows(v));
    key_values(&rows)
}

/// The rows every status shows, in the order a field engineer reads them.
fn status_rows(v: &Value) -> Vec<(&'static str, String)> {
    [
        ("host", fill(v, "{host} (site {site})")),
        ("software", s(&v["software"])),
        (
            "GPUs",
            fill(v, "{gpus} from {gpu_source}, {responsive} responsive"),
        ),
        ("unresponsive", s(&v["unresponsive"])),
        ("bus", bus_line(v)),
        ("resends", resends(&v["resend"])),
        (
            "uptime",
            format!("{:.0} s", v["uptime_s"].as_f64().unwrap_or(0.0)),
        ),
        (
            "sampling",
            format!(
                "{}; last took {}",
                fill(v, "every {period_ms} ms, {samples} samples"),
                unit(&v["sample_ms"]["last"], " ms")
            ),
        ),
        ("jitter", jitter_line(&v["jitter_ms"])),
        (
            "health",
            fill(
                &v["health"],
                "{healthy} healthy, {degraded} degraded, {quarantined} quarantined",
            ),
        ),
        ("leases", s(&v["leases"])),
        (
            "actions",
            fill(
                &v["site_actions"],
                "quarantine {quarantine.ok} ok, {quarantine.failed} failed; cooling loss {cooling_loss.ok} ok, {cooling_loss.failed} failed",
            ),
        ),
        (
            "XIDs",
            format!(
                "watch {}; {} queued, {} dropped in storms",
                match v["xids"]["watch_down_since"].as_u64() {
                    Some(t) => format!("DOWN since {}", fmt_time(TimestampMs(t))),
                    None => "running".into(),
                },
                s(&v["xids"]["queued"]),
                s(&v["xids"]["dropped"])
            ),
        ),
        ("GPU calls", calls_line(&v["sample_calls"])),
        ("flash", s(&v["flash"])),
    ]
    .to_vec()
}

/// How late the sampling tick ran (`jitter_ms`), each figure `-` before
/// the first round.
fn jitter_line(j: &Value) -> String {
    let [last, p50, p99, max] = ["last", "p50", "p99", "max"].map(|k| unit(&j[k], " ms"));
    format!(
        "last {last}, p50 {p50}, p99 {p99}, max {max} (last {} ticks)",
        s(&j["window"])
    )
}

/// The GPUs' sample call times (`sample_calls`): the slowest last and
/// the longest `-` while a GPU never answered, and those GPUs named.
fn calls_line(c: &Value) -> String {
    let mut line = format!(
        "slowest last {}, longest {}, {}",
        unit(&c["slowest_last_ms"], " ms"),
        unit(&c["longest_ms"], " ms"),
        fill(c, "{late} answers late; in flight {running_ms} ms"),
    );
    if let Some(never @ [_, ..]) = c["never_answered"].as_array().map(Vec::as_slice) {
        let gpus: Vec<String> = never.iter().map(s).collect();
        let _ = write!(line, "; never answered: GPU {}", gpus.join(", "));
    }
    line
}

/// First of all, when the loop has not run a round for too long: what
/// the status shows is that old.
fn stale_row(v: &Value) -> Vec<(&'static str, String)> {
    let r = &v["last_round"];
    if r["stale"].as_bool() != Some(true) {
        return Vec::new();
    }
    let age = match r["age_s"].as_f64() {
        Some(a) => format!("no sampling round for {a:.0} s"),
        None => "no sampling round since the start".into(),
    };
    vec![(
        "STALE",
        format!(
            "{age} (expected every {} ms): the agent's loop is stuck; \
             what this shows is from its last round (restart the agent)",
            s(&v["period_ms"])
        ),
    )]
}

/// The rows shown only when something needs a person's eye, in capitals.
fn warning_rows(v: &Value) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if v["cooling_loss"]["phase"] == "unknown" {
        rows.push((
            "COOLING",
            "UNKNOWN: the phase kept before the restart could not be read back; \
             nothing runs until the CDU's word on the rack"
                .into(),
        ));
    }
    if let Some(since) = v["cooling_loss"]["since"].as_u64() {
        rows.push((
            "COOLING",
            format!(
                "rack lost cooling: {} since {}",
                s(&v["cooling_loss"]["phase"]).replace('_', " "),
                fmt_time(TimestampMs(since))
            ),
        ));
    }
    if v["config_lost"].is_object() {
        rows.push(("CONFIG LOST", config_lost_line(&v["config_lost"])));
    }
    for stale in v["stale_indexes"].as_array().into_iter().flatten() {
        rows.push(("STALE INDEX", stale_index_line(stale)));
    }
    if let Some(n @ 1..) = v["gpus_missing"].as_u64() {
        rows.push((
            "MISSING",
            format!(
                "{n} of the {} GPUs expected not found at the start (expected_gpus): see the log",
                s(&v["gpus_expected"])
            ),
        ));
    }
    let failed = &v["site_actions"]["last_failure"];
    if let Some(at) = failed["at"].as_u64() {
        rows.push((
            "FAILED",
            format!(
                "{}: {} at {}: {}",
                s(&failed["what"]),
                s(&failed["program"]),
                fmt_time(TimestampMs(at)),
                s(&failed["detail"])
            ),
        ));
    }
    if let Some(n @ 1..) = v["flash_refused"].as_u64() {
        let last = match v["flash_refused_at"].as_u64() {
            Some(t) => format!(", the last at {}", fmt_time(TimestampMs(t))),
            None => String::new(),
        };
        rows.push((
            "FLASH",
            format!(
                "{n} config values not kept{last}: a restart may forget quarantines, caps, \
                 the cooling phase (the flash is full, worn or failing: see the log)"
            ),
        ));
    }
    if let Some(stuck @ [_, ..]) = v["sample_calls"]["stuck"].as_array().map(Vec::as_slice) {
        let gpus: Vec<String> = stuck
            .iter()
            .map(|g| {
                let s_ = g["running_ms"].as_f64().unwrap_or(0.0) / 1000.0;
                format!("GPU {} for {s_:.1} s", s(&g["gpu"]))
            })
            .collect();
        rows.push((
            "STUCK",
            format!(
                "a GPU call running past the {} ms deadline: {} (the driver does not answer)",
                s(&v["sample_calls"]["deadline_ms"]),
                gpus.join(", ")
            ),
        ));
    }
    if let Some(t) = v["stalled_since"].as_u64() {
        rows.push((
            "STALLED",
            format!(
                "every GPU silent together since {}: a driver or host stall",
                fmt_time(TimestampMs(t))
            ),
        ));
    }
    if v["demo_key"].as_bool() == Some(true) {
        rows.push((
            "WARNING",
            "commands are checked against the public demonstration key".into(),
        ));
    }
    for off in v["protection_off"].as_array().into_iter().flatten() {
        rows.push(("PROTECTION OFF", s(&off["said"])));
    }
    rows
}

/// A GPU's stale indexes: what its quarantine actions left under them.
fn stale_index_line(stale: &Value) -> String {
    let gpu = s(&stale["gpu"]);
    let was: Vec<String> = (stale["was"].as_array().into_iter().flatten())
        .map(s)
        .collect();
    let tags: Vec<String> = was.iter().map(|w| format!("gpu{w}")).collect();
    // One command per tag: `loopwarden-slurm resume` takes one.
    let resumes: Vec<String> = (tags.iter())
        .map(|t| format!("loopwarden-slurm resume NODE {t}"))
        .collect();
    format!(
        "GPU {gpu}: its quarantine actions ran as GPU {} before the GPUs were numbered otherwise: what they left there (a drain tagged {}) may still stand: undo it by hand ({}); shown until GPU {gpu} is released",
        was.join(", "),
        tags.join(", "),
        resumes.join("; ")
    )
}

/// The config store found lost at this start, its lost mark standing
/// (`config_lost`): what its clear waits for, or why it stays for the
/// run; till it clears, every restart reads the store as lost.
fn config_lost_line(c: &Value) -> String {
    let list =
        |k: &str| -> Vec<String> { (c[k].as_array().into_iter().flatten()).map(s).collect() };
    let gpus = |g: &[String]| match g {
        [one] => format!("GPU {one}"),
        _ => format!("GPUs {}", g.join(", ")),
    };
    let restart = "every restart reads the store as lost (quarantines taken from the event log, \
                   every other GPU degraded, kept-state-unreadable)";
    let not_kept = list("not_kept");
    if let Some(why) = c["stays"].as_str() {
        return format!("its lost mark stays for this run ({why}): {restart}; see the log");
    }
    if !not_kept.is_empty() {
        return format!(
            "its lost mark stays for this run: the records of {} not kept (handed to the flash when it said its UUID, or its health state taken back): {restart}; see the log",
            gpus(&not_kept)
        );
    }
    if c["clearing"].as_bool() == Some(true) {
        return "all taken back is kept: its lost mark is being cleared".into();
    }
    let mut waits = Vec::new();
    match &list("waiting_for")[..] {
        [] => {}
        [one] => waits.push(format!("GPU {one} to say its UUID")),
        many => waits.push(format!("{} to say their UUIDs", gpus(many))),
    }
    if c["phase_unknown"].as_bool() == Some(true) {
        waits.push("the CDU's word on the cooling-loss phase".into());
    }
    if c["phase_not_kept"].as_bool() == Some(true) {
        waits.push(
            "the cooling-loss phase to be kept in flash (decided by the CDU's word, not handed \
             to the flash: kept at its next change; see the log)"
                .into(),
        );
    }
    if waits.is_empty() {
        waits.push("its clear to start (all it waited for is kept)".into());
    }
    format!(
        "its lost mark waits for {}: until it clears, {restart}",
        waits.join(" and ")
    )
}

fn gpus(v: &Value) -> String {
    let rows = rows_of(&v["gpus"], |g| {
        vec![
            s(&g["gpu"]),
            if g["responsive"].as_bool() == Some(true) {
                "yes".into()
            } else {
                format!("NO ({} missed)", s(&g["missed"]))
            },
            age(&g["sample_age_s"]),
            s(&g["health"]),
            unit(&g["temp"], "C"),
            unit(&g["mem_temp"], "C"),
            format!(
                "{} / {}",
                unit(&g["power"], "W"),
                unit(&g["power_limit"], "W")
            ),
            s(&g["sm_clock"]),
            unit(&g["util"], "%"),
            s(&g["throttle"]),
            format!(
                "{}/{}",
                s(&g["ecc"]["sbe_volatile"]),
                s(&g["ecc"]["dbe_volatile"])
            ),
            s(&g["unsupported"]),
            call_times(&g["call_ms"]),
            s(&g["late_answers"]),
        ]
    });
    table(
        &[
            "GPU",
            "RESPONSIVE",
            "AGE",
            "HEALTH",
            "TEMP",
            "HBM",
            "POWER / LIMIT",
            "SM MHZ",
            "UTIL",
            "THROTTLE",
            "ECC SBE/DBE",
            "UNSUPPORTED",
            "CALL LAST/MAX",
            "LATE",
        ],
        &rows,
    )
}

/// A GPU's last and longest sample call (`call_ms`), ms to a tenth, or
/// `-` before one ended; a call running past the deadline is said, with
/// how long it has run (`running 184.0 s`).
fn call_times(c: &Value) -> String {
    let ended = match (c["last"].as_f64(), c["max"].as_f64()) {
        (Some(last), Some(max)) => Some(format!("{last:.1}/{max:.1} ms")),
        _ => None,
    };
    let running = c["running"].as_f64().filter(|_| c["stuck"] == true);
    match (ended, running) {
        (Some(t), Some(ms)) => format!("{t}, running {:.1} s", ms / 1000.0),
        (None, Some(ms)) => format!("running {:.1} s", ms / 1000.0),
        (Some(t), None) => t,
        (None, None) => "-".into(),
    }
}

/// A sample's age in seconds, to a tenth, or `-` before the first.
fn age(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |s| format!("{s:.1}s"))
}

/// `v` with its unit, or `-` when not known (null).
fn unit(v: &Value, unit: &str) -> String {
    if v.is_null() {
        "-".into()
    } else {
        format!("{}{unit}", s(v))
    }
}

fn caps(v: &Value) -> String {
    let gpus = rows_of(&v["gpus"], |g| {
        vec![
            s(&g["gpu"]),
            format!("{} W", s(&g["limit"])),
            set_by(&g["limit"], &g["source"]),
            format!("{}-{} W", s(&g["min"]), s(&g["max"])),
            unit(&g["ceiling"], " W"),
            unit(&g["default"], " W"),
            s(&g["guard"]),
        ]
    });
    let mut out = table(
        &[
            "GPU", "LIMIT", "SET BY", "RANGE", "CEILING", "DEFAULT", "GUARD",
        ],
        &gpus,
    );
    let leases = rows_of(&v["leases"], |l| {
        vec![
            s(&l["from"]),
            s(&l["lease"]),
            s(&l["source"]),
            format!("{:.1} s", l["expires_in_s"].as_f64().unwrap_or(0.0)),
            fill_each(&l["caps"], "{gpu}:{limit}W"),
        ]
    });
    out.push('\n');
    if leases.is_empty() {
        out.push_str("no lease in force\n");
    } else {
        out.push_str(&table(
            &["LEASE FROM", "ID", "SOURCE", "EXPIRES IN", "CAPS"],
            &leases,
        ));
    }
    out
}

/// Who set a GPU's `limit`: its `source`, `uncapped` when none; a limit
/// not read back (null) is never shown as uncapped.
fn set_by(limit: &Value, source: &Value) -> String {
    match (limit.is_null(), source.is_null()) {
        (false, true) => "uncapped".into(),
        (false, false) => s(source),
        (true, true) => "not confirmed".into(),
        (true, false) => format!("not confirmed, asked by {}", s(source)),
    }
}

fn why(v: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "GPU {} ({})", s(&v["gpu"]), s(&v["uuid"]));
    let _ = writeln!(
        out,
        "health     {} ({}) for {:.0} s",
        s(&v["health"]),
        s(&v["reason"]),
        v["since_s"].as_f64().unwrap_or(0.0)
    );
    let evidence = s(&v["evidence"]);
    if !evidence.is_empty() {
        let _ = writeln!(out, "evidence   {evidence}");
    }
    if v["limit"].is_null() {
        let asked = if v["cap_source"].is_null() {
            String::new()
        } else {
            format!(" (asked by {})", s(&v["cap_source"]))
        };
        let _ = writeln!(out, "limit      not confirmed, the read-back failed{asked}");
    } else {
        let _ = writeln!(
            out,
            "limit      {} W ({})",
            s(&v["limit"]),
            set_by(&v["limit"], &v["cap_source"])
        );
    }
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "note       {}", s(n));
    }
    for x in v["recent_xids"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "xid        {} {} ({}), {:.0} s ago: {}; {}",
            s(&x["xid"]),
            s(&x["name"]),
            s(&x["cause"]),
            x["ago_s"].as_f64().unwrap_or(0.0),
            s(&x["meaning"]),
            s(&x["action"])
        );
    }
    out
}

/// `connected, 11 published, 0 received, 0 dropped, 1 connects`, and how
/// many telemetry frames found the bus offline when any did.
fn bus_line(v: &Value) -> String {
    let b = &v["bus"];
    let mut line = format!(
        "{}, {} published, {} received, {} dropped, {} connects",
        if v["connected"].as_bool() == Some(true) {
            "connected"
        } else {
            "NOT CONNECTED"
        },
        s(&b["published"]),
        s(&b["received"]),
        s(&b["dropped"]),
        s(&b["connects"])
    );
    if let Some(n) = b["not_sent_offline"].as_u64().filter(|n| *n > 0) {
        line.push_str(&format!("; {n} telemetry frames not sent while offline"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_counts_the_site_actions_and_names_the_last_failure() {
        let v = json!({
            "site_actions": {
                "quarantine": {"ok": 2, "failed": 1},
                "cooling_loss": {"ok": 0, "failed": 0},
                "last_failure": {"at": 1_700_000_000_000u64, "what": "quarantine of GPU 3",
                    "program": "scontrol", "detail": "exit status 1: Invalid node name"},
            },
        });
        let text = render(&Request::Status, &v);
        let row = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
                .to_string()
        };
        assert!(
            row("actions ").ends_with("quarantine 2 ok, 1 failed; cooling loss 0 ok, 0 failed"),
            "{text}"
        );
        let failed = row("FAILED ");
        assert!(
            failed.contains("quarantine of GPU 3: scontrol at ")
                && failed.ends_with("exit status 1: Invalid node name"),
            "{failed}"
        );
        let none = json!({"site_actions": {"last_failure": null}});
        assert!(!render(&Request::Status, &none).contains("FAILED"));
    }

    #[test]
    fn status_warns_when_the_flash_refused_to_keep_config_values() {
        let v = json!({"flash_refused": 2, "flash_refused_at": 1_700_000_000_000u64});
        let text = render(&Request::Status, &v);
        let row = text
            .lines()
            .find(|l| l.starts_with("FLASH "))
            .unwrap_or_else(|| panic!("no FLASH row in\n{text}"));
        assert!(
            row.contains("2 config values not kept, the last at ")
                && row.contains("a restart may forget quarantines, caps, the cooling phase"),
            "{row}"
        );
        for kept in [json!({"flash_refused": 0}), json!({})] {
            assert!(!render(&Request::Status, &kept).contains("FLASH"));
        }
    }

    /// A config store found lost whose lost mark stands: a row names what
    /// its clear still waits for (a GPU to say its UUID, the CDU's word),
    /// or why it stays for the run; none once it is cleared.
    #[test]
    fn status_names_what_a_lost_config_stores_mark_waits_for() {
        let row = |v: &Value| {
            let text = render(&Request::Status, v);
            (text.lines())
                .find(|l| l.starts_with("CONFIG LOST "))
                .unwrap_or_else(|| panic!("no CONFIG LOST row in\n{text}"))
                .to_string()
        };
        let gpu = row(&json!({"config_lost": {"waiting_for": [1]}}));
        assert!(
            gpu.contains("waits for GPU 1 to say its UUID")
                && gpu.contains("every restart reads the store as lost"),
            "{gpu}"
        );
        let both = row(&json!({"config_lost": {"waiting_for": [1, 3], "phase_unknown": true}}));
        assert!(
            both.contains("GPUs 1, 3 to say their UUIDs")
                && both.contains("the CDU's word on the cooling-loss phase"),
            "{both}"
        );
        let stays = row(&json!({"config_lost": {"not_kept": [2]}}));
        assert!(
            stays.contains("stays for this run") && stays.contains("GPU 2"),
            "{stays}"
        );
        let phase = row(&json!({"config_lost": {"phase_not_kept": true}}));
        assert!(
            phase.contains("waits for the cooling-loss phase to be kept in flash"),
            "{phase}"
        );
        let ready = row(&json!({"config_lost": {"waiting_for": [], "phase_unknown": false}}));
        assert!(ready.contains("waits for its clear to start"), "{ready}");
        for cleared in [json!({"config_lost": null}), json!({})] {
            assert!(!render(&Request::Status, &cleared).contains("CONFIG LOST"));
        }
    }

    #[test]
    fn status_names_each_stale_index_a_renumbering_left() {
        let v = json!({"stale_indexes": [{"gpu": 1, "was": [2]}]});
        let text = render(&Request::Status, &v);
        let row = (text.lines())
            .find(|l| l.starts_with("STALE INDEX "))
            .unwrap_or_else(|| panic!("no STALE INDEX row in\n{text}"));
        assert!(
            row.contains("GPU 1: its quarantine actions ran as GPU 2")
                && row.contains("loopwarden-slurm resume NODE gpu2")
                && row.contains("until GPU 1 is released"),
            "{row}"
        );
        let none = render(&Request::Status, &json!({"stale_indexes": []}));
        assert!(!none.contains("STALE INDEX"), "{none}");
    }

    /// `loopwarden-slurm resume` takes one tag: two stale indexes are
    /// two commands, each runnable as shown.
    #[test]
    fn status_gives_one_resume_command_per_stale_index() {
        let v = json!({"stale_indexes": [{"gpu": 0, "was": [1, 2]}]});
        let text = render(&Request::Status, &v);
        let row = (text.lines())
            .find(|l| l.starts_with("STALE INDEX "))
            .unwrap_or_else(|| panic!("no STALE INDEX row in\n{text}"));
        assert!(
            row.contains("loopwarden-slurm resume NODE gpu1; loopwarden-slurm resume NODE gpu2")
                && !row.contains("gpu1 gpu2"),
            "{row}"
        );
    }

    #[test]
    fn status_names_a_gpu_whose_call_hangs() {
        let v = json!({"sample_calls": {"deadline_ms": 500, "running_ms": 184_000.0,
            "stuck": [{"gpu": 3, "running_ms": 184_000.0}]}});
        let text = render(&Request::Status, &v);
        let row = text
            .lines()
            .find(|l| l.starts_with("STUCK "))
            .unwrap_or_else(|| panic!("no STUCK row in\n{text}"));
        assert!(
            row.ends_with(
                "a GPU call running past the 500 ms deadline: GPU 3 for 184.0 s (the driver does not answer)"
            ),
            "{row}"
        );
        let fine = json!({"sample_calls": {"deadline_ms": 500, "stuck": []}});
        assert!(!render(&Request::Status, &fine).contains("STUCK"));
    }

    #[test]
    fn a_stale_status_says_so_first() {
        let v = json!({"host": "h07", "period_ms": 1000,
            "last_round": {"age_s": 42.4, "stale_after_s": 2.25, "stale": true}});
        let text = render(&Request::Status, &v);
        assert!(
            text.lines().next().is_some_and(|l| l.starts_with("STALE ")
                && l.contains("no sampling round for 42 s (expected every 1000 ms): the agent's loop is stuck")),
            "{text}"
        );
        let fresh = json!({"last_round": {"age_s": 0.4, "stale_after_s": 2.25, "stale": false}});
        assert!(!render(&Request::Status, &fresh).contains("STALE"));
    }

    #[test]
    fn status_says_when_gpus_expected_are_missing() {
        let v = json!({"gpus_expected": 8, "gpus_missing": 1});
        let text = render(&Request::Status, &v);
        assert!(
            text.lines().any(|l| l.starts_with("MISSING ")
                && l.ends_with(
                    "1 of the 8 GPUs expected not found at the start (expected_gpus): see the log"
                )),
            "{text}"
        );
        for whole in [json!({"gpus_expected": 8, "gpus_missing": 0}), json!({})] {
            assert!(!render(&Request::Status, &whole).contains("MISSING"));
        }
    }

    #[test]
    fn status_has_a_row_of_resends() {
        let v = json!({
            "connected": true,
            "bus": {"published": 11, "received": 2, "dropped": 0, "connects": 1},
            "resend": {"served": 3, "refused": 1, "withheld": 4, "frames": 12},
        });
        let text = render(&Request::Status, &v);
        let row = text
            .lines()
            .find(|l| l.starts_with("resends "))
            .unwrap_or_else(|| panic!("no resends row in\n{text}"));
        assert!(
            row.ends_with("3 served (12 frames), 1 refused, 4 withheld"),
            "{row}"
        );
    }

    /// A limit not read back is never rendered as uncapped.
    #[test]
    fn a_limit_not_read_back_is_not_confirmed_not_uncapped() {
        let v = json!({"gpus": [
            {"gpu": 0, "limit": null, "source": "cooling", "min": 200, "max": 700, "default": 700, "guard": null},
            {"gpu": 1, "limit": null, "source": null, "min": 200, "max": 700, "default": 700, "guard": null},
            {"gpu": 2, "limit": 700, "source": null, "min": 200, "max": 700, "default": 700, "guard": null},
        ], "leases": []});
        let t = caps(&v);
        let rows: Vec<&str> = t.lines().collect();
        assert!(rows[1].contains("not confirmed, asked by cooling"), "{t}");
        assert!(
            rows[2].contains("not confirmed") && !rows[2].contains("uncapped"),
            "{t}"
        );
        assert!(rows[3].contains("uncapped"), "{t}");
        let w = why(
            &json!({"gpu": 0, "uuid": "GPU-1", "health": "healthy", "reason": "ok",
            "since_s": 1.0, "evidence": "", "limit": null, "cap_source": "cooling", "notes": []}),
        );
        assert!(
            w.contains("limit      not confirmed, the read-back failed (asked by cooling)\n"),
            "{w}"
        );
        assert!(!w.contains("uncapped"), "{w}");
    }

    /// The ceiling (the limit put back when no cap is in force) is a
    /// column of its own, beside NVML's default it may differ from.
    #[test]
    fn caps_show_each_gpus_ceiling() {
        let v = json!({"gpus": [
            {"gpu": 0, "limit": 450, "source": "cooling", "min": 200, "max": 700,
             "ceiling": 500, "default": 700, "guard": null},
        ], "leases": []});
        let t = caps(&v);
        let rows: Vec<Vec<&str>> = t
            .lines()
            .take(2)
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        let col = |name: &str| rows[0].iter().position(|&h| h == name);
        let ceiling = col("CEILING").unwrap_or_else(|| panic!("no CEILING column in\n{t}"));
        assert_eq!(rows[1][ceiling], "500 W", "{t}");
        assert_eq!(rows[1][col("DEFAULT").expect("DEFAULT")], "700 W", "{t}");
    }

    /// A value not known (no sample yet, a group not supported) reads
    /// `-`, never a 0 or a unit alone.
    #[test]
    fn gpus_render_nulls_as_dashes() {
        let v = json!({"gpus": [{"gpu": 0, "responsive": false, "missed": 0, "health": "healthy",
            "temp": null, "mem_temp": null, "power": null, "power_limit": null, "sm_clock": null,
            "util": null, "throttle": null, "ecc": {"sbe_volatile": null, "dbe_volatile": null},
            "unsupported": null, "sample_age_s": null}]});
        let t = gpus(&v);
        let row = t.lines().nth(1).expect("a row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "0", "NO", "(0", "missed)", "-", "healthy", "-", "-", "-", "/", "-", "-", "-", "-",
                "-/-", "-", "-", "-"
            ],
            "{t}"
        );
    }

    /// Each GPU's own sample-call times and late answers are in its row
    /// (`status` has only the slowest GPU's).
    #[test]
    fn gpus_show_each_gpus_call_times_and_late_answers() {
        let gpu = |n: u64, last: f64, max: f64, late: u64| {
            json!({"gpu": n, "responsive": true, "health": "healthy",
                "call_ms": {"last": last, "max": max, "running": 0.0}, "late_answers": late})
        };
        let v = json!({"gpus": [gpu(0, 0.377, 2.514, 0), gpu(1, 183.25, 912.0, 7)]});
        let t = gpus(&v);
        let rows: Vec<Vec<&str>> = t
            .lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        let col = |name: &str| {
            rows[0]
                .iter()
                .position(|&h| h == name)
                .unwrap_or_else(|| panic!("no {name} column in\n{t}"))
        };
        let (call, late) = (col("CALL LAST/MAX"), col("LATE"));
        assert_eq!(rows[1][call], "0.4/2.5 ms", "{t}");
        assert_eq!(rows[1][late], "0", "{t}");
        assert_eq!(rows[2][call], "183.2/912.0 ms", "{t}");
        assert_eq!(rows[2][late], "7", "{t}");
    }

    /// Each protection switched off on purpose has a row of its own.
    #[test]
    fn status_has_a_row_per_protection_switched_off() {
        let v = json!({"protection_off": [
            {"key": "commands", "said": "commands = \"none\": this host takes no command (no cap, no release)"},
            {"key": "volatile_state", "said": "volatile_state = true: no flash file"},
        ]});
        let t = status(&v);
        assert!(
            t.contains("PROTECTION OFF  commands = \"none\": this host takes no command (no cap, no release)\n"),
            "{t}"
        );
        assert!(
            t.contains("PROTECTION OFF  volatile_state = true: no flash file\n"),
            "{t}"
        );
        assert!(!status(&json!({"protection_off": []})).contains("PROTECTION OFF"));
    }

    /// A cooling-loss phase not read back is said, not shown as cooled.
    #[test]
    fn status_says_an_unknown_cooling_phase() {
        let v = json!({"cooling_loss": {"phase": "unknown", "since": null}});
        assert!(
            status(&v).contains("UNKNOWN: the phase kept"),
            "{}",
            status(&v)
        );
        let v = json!({"cooling_loss": {"phase": "cooled", "since": null}});
        assert!(!status(&v).contains("COOLING"));
    }
}

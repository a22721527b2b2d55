//! Rendering for people: each answer as aligned tables or key-value
//! lines, one function per request behind [`render`].

use std::string::{String, ToString};
use std::vec::Vec;
use std::{format, vec};

use loopwarden_field::render::{
    events_table, fill, fill_each, key_values, resends, rows_of, table, text as s,
};
use serde_json::Value;

use super::{round, Request};

/// A number with a unit, or `-`.
fn u(v: &Value, unit: &str) -> String {
    match v.as_f64() {
        Some(x) => format!("{}{unit}", round(x, 2)),
        None => "-".into(),
    }
}

/// Renders an answer for people.
pub fn render(req: &Request, v: &Value) -> String {
    match req {
        Request::ClearLeak { .. } | Request::ClearPump { .. } => operator(v),
        Request::Status => status(v),
        Request::Sensors => sensors(v),
        Request::Loops => loops(v),
        Request::Events { .. } => events_table(v),
        Request::Caps => caps(v),
    }
}

/// An operator request's outcome (`done`, `refused`, else the error), as
/// `run` and a gateway answer it.
pub fn operator(v: &Value) -> String {
    if let Some(done) = v["done"].as_str() {
        format!("{done}\n")
    } else if let Some(why) = v["refused"].as_str() {
        format!("refused: {why}\n")
    } else {
        format!("error: {}\n", v["error"].as_str().unwrap_or("unknown"))
    }
}

/// `status`: the CDU at a glance, one line per concern.
fn status(v: &Value) -> String {
    let mut rows = plant_rows(v);
    rows.extend(link_rows(v));
    for off in v["protection_off"].as_array().into_iter().flatten() {
        rows.push(("PROTECTION OFF", s(&off["said"])));
    }
    if let Some(why) = v["heartbeat_held"].as_str() {
        // After a start the why says when the heartbeat goes out; a
        // setting found not held keeps it back until read held.
        let then = if why.contains("since the start") {
            ""
        } else {
            "; it runs on its own control after its heartbeat timeout until a read-back \
             reads it held"
        };
        rows.push(("HEARTBEAT HELD", format!("not written: {why}{then}")));
    }
    if v["demo_key"].as_bool() == Some(true) {
        rows.push((
            "WARNING",
            "leases are signed with the public demonstration key".into(),
        ));
    }
    key_values(&rows)
}

/// The pumps in one line: each running or not, the lead, a trip.
fn pumps_line(v: &Value) -> String {
    v["pumps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let mut t = format!(
                        "{} {}",
                        s(&p["pump"]),
                        match p["running"].as_bool() {
                            Some(true) => "running",
                            Some(false) => "stopped",
                            None => "unknown",
                        }
                    );
                    if p["lead"].as_bool() == Some(true) {
                        t.push_str(" (lead)");
                    }
                    if p["failed"].as_bool() == Some(true) {
                        t.push_str(" TRIPPED");
                    }
                    t
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The reading `key` of `status` in `unit`, its sensor's fault said
/// beside it (`31 °C (STUCK)`, `- (LOST)`).
fn sensor(v: &Value, key: &str, unit: &str) -> String {
    let figure = u(&v[key], unit);
    match v["sensor_faults"][key].as_str() {
        Some(fault) => format!("{figure} ({})", fault.to_uppercase()),
        None => figure,
    }
}

/// The setpoint and pump speed as written to the CDU, and what the core
/// asks where that differs (the map's range held it).
fn setpoint_line(v: &Value) -> String {
    let with_asked = |key: &str, asked: &str, unit: &str| {
        let written = u(&v[key], unit);
        match (v[key].as_f64(), v[asked].as_f64()) {
            (Some(w), Some(a)) if (w - a).abs() < 0.05 => written,
            (_, Some(_)) => format!("{written} (asked {})", u(&v[asked], unit)),
            _ => written,
        }
    };
    format!(
        "{}, pumps at {}",
        with_asked("setpoint_c", "setpoint_asked_c", " °C"),
        with_asked("pump_speed_pct", "pump_speed_asked_pct", " %")
    )
}

/// `status` rows about the plant: mode, temperatures, flow, pumps, power,
/// hosts, leaks and valves.
fn plant_rows(v: &Value) -> Vec<(&'static str, String)> {
    let pumps = pumps_line(v);
    vec![
        ("cdu", fill(v, "{cdu} (site {site})")),
        ("last step", last_step(v)),
        (
            "mode",
            match v["mode"].is_null() {
                true => UNKNOWN_NO_STEP.into(),
                false => format!(
                    "{} ({}) for {:.0} s",
                    s(&v["mode"]),
                    s(&v["reason"]),
                    v["for_s"].as_f64().unwrap_or(0.0)
                ),
            },
        ),
        ("setpoint", setpoint_line(v)),
        (
            "supply/return",
            format!(
                "{} / {}",
                sensor(v, "supply_c", " °C"),
                sensor(v, "return_c", " °C")
            ),
        ),
        ("flow", sensor(v, "flow_lpm", " L/min")),
        ("facility water", sensor(v, "facility_supply_c", " °C")),
        ("pumps", pumps),
        (
            "power",
            format!(
                "IT {}, facility {}, PUE {}",
                u(&v["it_w"], " W"),
                u(&v["facility_w"], " W"),
                s(&v["pue"])
            ),
        ),
        (
            "hosts",
            fill(
                v,
                "{hosts_heard} heard of {hosts}, {capped_hosts} capped, {host_reports_refused} reports not believed",
            ),
        ),
        (
            "leaks latched",
            match (s(&v["leaks_latched"]).as_str(), v["relatch_pending"] == true) {
                (_, true) => {
                    "UNKNOWN: the latched record is unreadable; no valve is written until \
                     the CDU's valve positions are read, then those closed are latched"
                        .into()
                }
                _ if v["leaks_latched"].is_null() => UNKNOWN_NO_STEP.into(),
                ("-", false) => "none".into(),
                (r, false) => format!("racks {r}"),
            },
        ),
        ("leak sensing", leak_sensing(v)),
        (
            "isolation",
            match s(&v["isolation_failed"]).as_str() {
                _ if v["isolation_failed"].is_null() => UNKNOWN_NO_STEP.into(),
                "-" => "ok".into(),
                r => format!("FAILED on racks {r}: pumps stopped, every host capped"),
            },
        ),
        ("valves open", valves_line(v)),
    ]
}

/// The racks' leak sensing: lost where a fault or an unread input leaves
/// a leak unseen, else supervised; and the racks no rope watches.
fn leak_sensing(v: &Value) -> String {
    let mut line = match s(&v["leak_sensing_lost"]).as_str() {
        _ if v["leak_sensing_lost"].is_null() => return UNKNOWN_NO_STEP.into(),
        "-" => "supervised".to_string(),
        r => format!("LOST on racks {r}: a leak there would not be seen"),
    };
    let unprotected = s(&v["leak_unprotected"]);
    if v["leak_ropes"] == false {
        line.push_str("; no board pins: no rope is read, the CDU's leak register only");
    } else if unprotected != "-" {
        line.push_str(&format!(
            "; unprotected: racks {unprotected} (no rope, the CDU's leak register only)"
        ));
    }
    line
}

/// A row the controller knows nothing of before its first step.
const UNKNOWN_NO_STEP: &str = "UNKNOWN (no control step yet)";

/// How old the answer is: the last control step's age, STALE past the
/// loop's grace, or none yet.
fn last_step(v: &Value) -> String {
    let Some(age) = v["last_step_s"].as_f64() else {
        return "no control step yet: nothing below is known".into();
    };
    if v["stale"].as_bool() == Some(true) {
        format!(
            "STALE: {age:.1} s ago (due every {} ms): the control loop is not stepping; \
             every figure below is as of then",
            s(&v["period_ms"])
        )
    } else {
        format!("{age:.1} s ago")
    }
}

/// The valves open as the CDU has them (its positions, else what it last
/// took), and each rack where the command differs: a close that did not
/// go in is not shown as done.
fn valves_line(v: &Value) -> String {
    let list = |x: &Value| -> Option<Vec<u64>> {
        x.as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
    };
    let open = list(&v["valves_open"]);
    let commanded = list(&v["valves_commanded_open"]);
    let mut line = match &open {
        None => "UNKNOWN: no valve position read and no valve write taken yet".to_string(),
        Some(o) if o.is_empty() => "none".into(),
        Some(_) => format!("racks {}", s(&v["valves_open"])),
    };
    let mut notes = Vec::new();
    if let (Some(open), Some(commanded)) = (&open, &commanded) {
        for r in 0..16u64 {
            match (open.contains(&r), commanded.contains(&r)) {
                (true, false) => notes.push(format!("rack {r} commanded shut, NOT TAKEN")),
                (false, true) => notes.push(format!("rack {r} commanded open, not taken")),
                _ => {}
            }
        }
    } else if open.is_none() && commanded.is_some() {
        notes.push(format!(
            "commanded open: {}",
            s(&v["valves_commanded_open"])
        ));
    }
    if v["relatch_pending"] == true {
        notes.push("no valve is written until the relatch".into());
    }
    if !notes.is_empty() {
        line.push_str(&format!(" ({})", notes.join("; ")));
    }
    line
}

/// `status` rows about the links and the program: the CDU link, the bus,
/// the resends of logged events, the leases, the uptime and the flash.
fn link_rows(v: &Value) -> Vec<(&'static str, String)> {
    let cdu = &v["cdu_link"];
    vec![
        (
            "CDU link",
            format!(
                "{} ({}): {}",
                s(&cdu["link"]),
                s(&cdu["map"]),
                if cdu["answering"].as_bool() == Some(true) {
                    "answering".to_string()
                } else {
                    format!("NOT ANSWERING: {}", s(&cdu["last_error"]))
                }
            ),
        ),
        (
            "CDU counts",
            fill(
                cdu,
                "{reads} reads, {read_errors} failed, {write_errors} writes failed",
            ),
        ),
        (
            "bus",
            format!(
                "{} {}, {} published, {} refused",
                s(&v["bus"]["broker"]),
                if v["bus"]["connected"].as_bool() == Some(true) {
                    "connected"
                } else {
                    "NOT CONNECTED"
                },
                s(&v["bus"]["published"]),
                s(&v["bus"]["publish_errors"])
            ),
        ),
        ("resends", resends(&v["resend"])),
        (
            "leases",
            fill(
                v,
                "{leases_sent} sent, {lifts_sent} lifts, {acks} acks ({acks_refused} refused, {acks_shortened} shortened)",
            ),
        ),
        (
            "running",
            format!(
                "{:.0} s, {} steps every {} ms",
                v["uptime_s"].as_f64().unwrap_or(0.0),
                s(&v["steps"]),
                s(&v["period_ms"])
            ),
        ),
        ("flash", s(&v["flash"])),
    ]
}

/// A sensor's state: its fault, else a reading outside any plausible
/// value not yet confirmed as a fault, else no reading, else ok.
fn sensor_state(x: &Value) -> String {
    if !x["fault"].is_null() {
        s(&x["fault"]).to_uppercase()
    } else if x["implausible"].as_bool() == Some(true) {
        "IMPLAUSIBLE (unconfirmed)".into()
    } else if x["raw"].is_null() {
        "NO READING".into()
    } else {
        "ok".into()
    }
}

/// `sensors`: one row per sensor.
fn sensors(v: &Value) -> String {
    let rows = rows_of(&v["sensors"], |x| {
        vec![
            s(&x["sensor"]),
            match (x["reading"].as_f64(), x["raw"].as_f64()) {
                (Some(r), _) => format!("{} {}", round(r, 2), s(&x["unit"])),
                // Not shown as a figure, the CDU's value beside it.
                (None, Some(raw)) => format!("- (raw {})", round(raw, 2)),
                (None, None) => "-".into(),
            },
            sensor_state(x),
            if x["required"].as_bool() == Some(true) {
                "yes".into()
            } else {
                "no".into()
            },
        ]
    });
    if rows.is_empty() {
        return "no control step yet\n".into();
    }
    table(&["SENSOR", "READING", "FAULT", "REQUIRED"], &rows)
}

/// `loops`: the setpoint in force, the optimiser and the trims, the plan
/// ceiling and the outdoor temperature in force, the plan's choice in a
/// line, then what the core has learned: the plant's figures and each
/// host's thermal factor.
fn loops(v: &Value) -> String {
    if v.get("proposal").is_none() {
        return "no control step yet\n".into();
    }
    let p = &v["proposal"];
    let mut out = key_values(&[
        (
            "in force",
            format!(
                "setpoint {}, pumps {}",
                u(&v["setpoint_c"], " °C"),
                u(&v["pump_speed_pct"], " %")
            ),
        ),
        (
            "optimiser",
            format!(
                "setpoint {}, pumps {}, facility {}, work {}{}",
                u(&p["setpoint_c"], " °C"),
                u(&p["speed_pct"], " %"),
                u(&p["facility_w"], " W"),
                s(&p["work"]),
                if p["feasible"].as_bool() == Some(false) {
                    " (NOT FEASIBLE: least bad)"
                } else {
                    ""
                }
            ),
        ),
        ("margin trim", u(&v["margin_k"], " K")),
        ("supply trim", u(&v["supply_trim_k"], " K")),
        ("flow trim", u(&v["flow_trim_pct"], " %")),
        ("caps sized for", u(&v["coolant_c"], " °C")),
        (
            "rejection",
            if v["rejection_short"].as_bool() == Some(true) {
                "SHORT: the supply cannot be held".into()
            } else {
                "enough".into()
            },
        ),
        ("plan ceiling", plan_ceiling(v)),
        ("outdoor", outdoor(&v["outdoor"])),
    ]);
    out.push_str(&plan_line(&v["plan"]));
    if let Some(line) = facility_line(&v["facility"]) {
        out.push('\n');
        out.push_str(&line);
    }
    out.push_str("\n\n");
    let learned = &v["learned"];
    let figures = rows_of(&learned["figures"], |x| {
        let unit = x["unit"].as_str().unwrap_or("");
        let ratio = match (x["estimated"].as_f64(), x["configured"].as_f64()) {
            (Some(e), Some(c)) if x["figure"] != "fixed_loads" && c.abs() > 1e-9 => {
                format!(" (×{:.2})", e / c)
            }
            _ => String::new(),
        };
        vec![
            s(&x["name"]),
            figure(&x["configured"], unit),
            format!("{}{ratio}", figure(&x["estimated"], unit)),
            figure(&x["used"], unit),
            share(&x["confidence"]),
            share(&x["trust"]),
        ]
    });
    out.push_str(&table(
        &[
            "FIGURE",
            "CONFIGURED",
            "ESTIMATED",
            "USED NOW",
            "CONFIDENCE",
            "TRUST",
        ],
        &figures,
    ));
    out.push('\n');
    let hosts = rows_of(&learned["hosts"], |h| {
        vec![
            s(&h["host"]),
            figure(&h["factor"], ""),
            figure(&h["used"], ""),
            share(&h["confidence"]),
            share(&h["trust"]),
            match h["learned_s"].as_f64() {
                Some(t) if t > 0.0 => format!("{:.0} min", t / 60.0),
                _ => "never".into(),
            },
        ]
    });
    if hosts.is_empty() {
        out.push_str("no hosts configured\n");
    } else {
        out.push_str(&table(
            &[
                "HOST",
                "THERMAL FACTOR",
                "USED NOW",
                "CONFIDENCE",
                "TRUST",
                "LEARNED FOR",
            ],
            &hosts,
        ));
    }
    out
}

/// A figure with its unit, to about three significant digits.
fn figure(v: &Value, unit: &str) -> String {
    let Some(x) = v.as_f64() else {
        return "-".into();
    };
    let n = if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    };
    if unit.is_empty() {
        n
    } else {
        format!("{n} {unit}")
    }
}

/// A share 0 to 1 as whole percent.
fn share(v: &Value) -> String {
    match v.as_f64() {
        Some(x) => format!("{:.0} %", x * 100.0),
        None => "-".into(),
    }
}

/// The plan ceiling in force against the configured one.
fn plan_ceiling(v: &Value) -> String {
    let (Some(now), Some(cfg)) = (
        v["plan_ceiling_c"].as_f64(),
        v["plan_ceiling_configured_c"].as_f64(),
    ) else {
        return "-".into();
    };
    let why = if now > cfg + 0.005 {
        format!(
            "configured {} °C, raised as the hosts are trusted",
            round(cfg, 2)
        )
    } else if now < cfg - 0.005 {
        format!("configured {} °C, tightened by the BMS", round(cfg, 2))
    } else {
        "as configured".into()
    };
    format!("{} °C ({why})", round(now, 2))
}

/// The outdoor temperature planned with and where it comes from.
fn outdoor(o: &Value) -> String {
    let c = u(&o["c"], " °C");
    match o["source"].as_str() {
        Some("fallback") => format!("fallback {c} — no outdoor sensor reads: alarm"),
        Some("cdu") => format!("{c}, measured (the CDU's sensor)"),
        Some("bms") => format!("{c}, measured (the BMS's write)"),
        _ => format!("{c}, the last reading (no sensor reads now: the fallback after 60 s)"),
    }
}

/// The plan's choice in one line: caps or colder water, and at what
/// cost per unit of work, or the plant short and caps following from it.
fn plan_line(p: &Value) -> String {
    let hosts = |n: u64| {
        if n == 1 {
            "1 host".to_string()
        } else {
            format!("{n} hosts")
        }
    };
    let capped = p["capped_hosts"].as_u64().unwrap_or(0);
    let Some(cost) = p["kwh_per_work_gpu_h"].as_f64() else {
        return "plan: no GPU work to plan for".into();
    };
    let other = p["other_kwh_per_work_gpu_h"].as_f64();
    if p["short"].as_bool() == Some(true) {
        let (supply, setpoint) = (
            p["supply_c"].as_f64().unwrap_or(0.0),
            p["setpoint_c"].as_f64().unwrap_or(0.0),
        );
        let caps = if capped > 0 {
            format!("the caps on {} follow from it", hosts(capped))
        } else {
            "no host needs a cap there".into()
        };
        return format!(
            "plan: the plant is short: the supply settles at {supply:.1} °C, {:.1} K above the setpoint {setpoint:.1} °C; {caps} ({cost:.3} kWh per work-GPU-h)",
            supply - setpoint
        );
    }
    match (capped > 0, other) {
        (true, Some(y)) => format!(
            "plan: cap {} rather than cool the whole CDU for them ({cost:.3} kWh per work-GPU-h against {y:.3} with colder water)",
            hosts(capped)
        ),
        (true, None) => format!(
            "plan: cap {} ({cost:.3} kWh per work-GPU-h; colder water alone does not hold them under the ceiling)",
            hosts(capped)
        ),
        (false, Some(y)) => format!(
            "plan: colder water rather than caps ({cost:.3} kWh per work-GPU-h against {y:.3} with caps)"
        ),
        (false, None) => format!(
            "plan: the water alone holds every GPU under the ceiling ({cost:.3} kWh per work-GPU-h)"
        ),
    }
}

/// This CDU's part in its hall's facility water, in a line or two; `None`
/// outside a hall of several CDUs.
fn facility_line(v: &Value) -> Option<String> {
    if v.is_null() {
        return None;
    }
    let coordinator = v["coordinator"].as_str().unwrap_or("?");
    let offer = match (v["accept_c"].as_f64(), v["heat_kw"].as_f64()) {
        (Some(a), Some(h)) => format!("accepts facility water up to {a:.1} °C ({h:.0} kW of heat)"),
        _ => "has no offer yet (its first search has not finished)".into(),
    };
    let water = match (v["water_c"].as_f64(), v["heard_s_ago"].as_u64()) {
        (Some(w), Some(ago)) => {
            format!("the hall's water {w:.1} °C by {coordinator}'s plan ({ago} s ago)")
        }
        _ => format!("no plan heard from {coordinator}: its setpoint sets its water"),
    };
    let mut line = format!("facility: this CDU {offer}; {water}");
    let p = &v["plan"];
    if !p.is_null() {
        let capping = p["capping"].as_u64().unwrap_or(0);
        line.push_str(&format!(
            "\nfacility plan (coordinating): water {:.1} °C, {} chiller stages, from {} offers, {capping} {} capping",
            p["water_c"].as_f64().unwrap_or(0.0),
            p["chiller_stages"].as_u64().unwrap_or(0),
            p["offers"].as_u64().unwrap_or(0),
            if capping == 1 { "CDU" } else { "CDUs" }
        ));
    } else if v["coordinates"].as_bool() == Some(true) {
        line.push_str("\nfacility plan (coordinating): none yet (no offer heard)");
    }
    Some(line)
}

/// `caps`: one row per host.
fn caps(v: &Value) -> String {
    let rows = rows_of(&v["hosts"], |h| {
        let ack = &h["last_ack"];
        vec![
            s(&h["host"]),
            s(&h["rack"]),
            match h["asked_w"].as_f64() {
                Some(w) => format!("{w} W"),
                None => "uncapped".into(),
            },
            s(&h["reason"]),
            u(&h["sent_w"], " W"),
            match h["heard_s"].as_f64() {
                Some(t) => format!("{t:.1} s ago"),
                None => "never".into(),
            },
            if ack.is_null() {
                "-".into()
            } else {
                format!(
                    "{} {:.1} s ago",
                    s(&ack["code"]),
                    ack["ago_s"].as_f64().unwrap_or(0.0)
                )
            },
            match fill_each(&h["in_force"], "{gpus}:{limit_w}W") {
                t if t.is_empty() => "-".into(),
                t => t,
            },
        ]
    });
    if rows.is_empty() {
        return "no hosts configured\n".into();
    }
    table(
        &[
            "HOST",
            "RACK",
            "CAP ASKED",
            "REASON",
            "SENT",
            "HEARD",
            "LAST ACK",
            "IN FORCE",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_has_a_row_of_resends() {
        let v = json!({
            "bus": {"broker": "127.0.0.1:1883", "connected": true, "published": 9, "publish_errors": 0},
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

    #[test]
    fn a_pending_relatch_says_the_latches_unknown_and_the_valves_not_written() {
        let v = json!({
            "leaks_latched": [],
            "valves_open": null,
            "valves_commanded_open": [0, 1, 2, 3],
            "relatch_pending": true,
        });
        assert!(row(&v, "leaks latched").contains("UNKNOWN"));
        let valves = row(&v, "valves open");
        assert!(valves.contains("UNKNOWN"), "{valves}");
        assert!(
            valves.ends_with("(commanded open: 0,1,2,3; no valve is written until the relatch)"),
            "{valves}"
        );
        let v = json!({
            "leaks_latched": [2],
            "valves_open": [0, 1, 3],
            "valves_commanded_open": [0, 1, 3],
            "relatch_pending": false,
        });
        assert!(row(&v, "leaks latched").ends_with("racks 2"));
        assert!(row(&v, "valves open").ends_with("racks 0,1,3"));
    }

    #[test]
    fn a_heartbeat_held_back_is_a_row_saying_why_and_none_otherwise() {
        let v = json!({"heartbeat_held": "the CDU does not hold a safety setting it echoed \
                                          (valves_open: holding 3 reads back value 0)"});
        let held = row(&v, "HEARTBEAT HELD");
        assert!(
            held.contains("not written: the CDU does not hold a safety setting it echoed")
                && held.contains("(valves_open: holding 3 reads back value 0)")
                && held.contains("its own control"),
            "{held}"
        );
        // After a start: why the read-back has not proved it, and when
        // the heartbeat goes out.
        let v = json!({"heartbeat_held": "the safety settings not read back held since the \
                                          start (read back first): refused: exception 2; \
                                          written on the writes' echo 10 s after the start \
                                          unless a read-back finds one not held"});
        let held = row(&v, "HEARTBEAT HELD");
        assert!(
            held.contains("HEARTBEAT HELD  not written: the safety settings not read back held")
                && held.contains("refused: exception 2")
                && held.ends_with("unless a read-back finds one not held"),
            "{held}"
        );
        let text = render(&Request::Status, &json!({"heartbeat_held": null}));
        assert!(!text.contains("HEARTBEAT"), "{text}");
    }

    /// The status's row named `name` in `v` rendered.
    fn row(v: &Value, name: &str) -> String {
        let text = render(&Request::Status, v);
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
            .to_string()
    }

    #[test]
    fn a_valve_shows_as_the_cdu_took_it_and_a_close_not_taken_is_said() {
        // Rack 2 leaks: commanded shut, but the CDU did not take the close.
        let v = json!({
            "valves_open": [0, 1, 2, 3],
            "valves_commanded_open": [0, 1, 3],
        });
        let valves = row(&v, "valves open");
        assert!(
            valves.ends_with("racks 0,1,2,3 (rack 2 commanded shut, NOT TAKEN)"),
            "{valves}"
        );
        // The reverse: a reopen not taken.
        let v = json!({"valves_open": [0, 1], "valves_commanded_open": [0, 1, 3]});
        assert!(row(&v, "valves open").ends_with("racks 0,1 (rack 3 commanded open, not taken)"));
        let v = json!({"valves_open": [], "valves_commanded_open": []});
        assert!(row(&v, "valves open").ends_with("none"));
    }
}

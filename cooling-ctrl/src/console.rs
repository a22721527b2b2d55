//! The field engineer's console: `cooling-ctrl ctl …` against the running
//! controller over a local Unix socket.
//!
//! One request per connection: a line of JSON (`{"cmd":"status"}`),
//! answered by a line of JSON. `cooling-ctrl ctl` prints it as aligned
//! tables, or as-is with `--json` for scripts. The socket is created with
//! mode 0660: whoever may read it may see the CDU's state; nothing on it
//! changes anything. Answers come from what the shell published after its
//! last step ([`ShellStats`]) and from the event log; the control loop is
//! never asked or waited for.
//!
//! Glossary:
//! - *request*: `status`, `sensors`, `loops`, `events` (with `since`, ms
//!   since the epoch) or `caps`.

use std::fmt::Write as _;
use std::path::Path;
use std::string::{String, ToString};
use std::sync::Arc;
use std::time::Duration;
use std::vec;
use std::vec::Vec;
use std::{eprintln, format};

use loopwarden_bus::now_ms;
use loopwarden_field as field;
use loopwarden_field::console::Peer;
use loopwarden_field::render::{events_table, table, text as s};
pub use loopwarden_field::time::parse_since;
use loopwarden_protocol::TimestampMs;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::journal::{self, Recorder};
use crate::shell::{OperatorAction, OperatorRequest, ShellStats};

/// A console request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The CDU at a glance.
    Status,
    /// Every supervised sensor.
    Sensors,
    /// The optimiser and the trims.
    Loops,
    /// The event log.
    Events {
        /// Only events at or after this time (ms since the epoch).
        #[serde(default)]
        since: Option<u64>,
    },
    /// The caps per host.
    Caps,
    /// Reopen a rack whose leak is latched (its rope must read dry).
    ClearLeak {
        /// The rack.
        rack: usize,
    },
    /// Put a tripped pump (`A` or `B`) back in service.
    ClearPump {
        /// The pump.
        pump: String,
    },
}

/// What the console answers from.
#[derive(Debug, Clone)]
pub struct Context {
    /// Site.
    pub site: String,
    /// This CDU.
    pub cdu: String,
    /// Host ids, rack-major.
    pub hosts: Vec<String>,
    /// Hosts per rack.
    pub hosts_per_rack: usize,
    /// The CDU link, in words.
    pub link: String,
    /// The register map's model.
    pub map_model: String,
    /// The broker, in words.
    pub broker: String,
    /// Control period.
    pub period: Duration,
    /// Lease duration.
    pub lease: Duration,
    /// Leases are signed with the public demonstration key.
    pub demo_key: bool,
    /// When the controller started.
    pub started: TimestampMs,
    /// The shell's stats.
    pub stats: watch::Receiver<ShellStats>,
    /// The event log.
    pub recorder: Recorder,
    /// Where operators' requests go; `None`: the console is read-only.
    pub operator: Option<tokio::sync::mpsc::Sender<OperatorRequest>>,
}

/// Binds the console socket, replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    field::console::bind(path, "controller")
}

/// Answers connections until the task is dropped.
pub async fn serve(listener: UnixListener, ctx: Arc<Context>) {
    field::console::serve(listener, move |req: Request| {
        let ctx = ctx.clone();
        async move { answer(&ctx, req).await }
    })
    .await
}

fn secs_ago(now: TimestampMs, t: TimestampMs) -> f64 {
    now.0.saturating_sub(t.0) as f64 / 1000.0
}

fn racks(mask: u16) -> Vec<usize> {
    (0..16).filter(|i| mask & (1 << i) != 0).collect()
}

fn round(x: f64, digits: i32) -> f64 {
    let k = 10f64.powi(digits);
    (x * k).round() / k
}

/// Answers one request.
pub async fn answer(ctx: &Context, req: Request) -> Value {
    let now = now_ms();
    let stats = ctx.stats.borrow().clone();
    match req {
        Request::Status => status(ctx, &stats, now),
        Request::Sensors => sensors(&stats),
        Request::Loops => loops(&stats),
        Request::Caps => caps(ctx, &stats, now),
        Request::ClearLeak { rack } => operate(ctx, OperatorAction::ClearLeak { rack }).await,
        Request::ClearPump { pump } => {
            let pump = match pump.as_str() {
                "A" | "a" => loopwarden_protocol::message::Pump::A,
                "B" | "b" => loopwarden_protocol::message::Pump::B,
                other => return json!({ "error": format!("no pump {other:?}: A or B") }),
            };
            operate(ctx, OperatorAction::ClearPumpTrip { pump }).await
        }
        Request::Events { since } => {
            let since = since.unwrap_or(0);
            match ctx.recorder.read().await {
                Ok(entries) => json!({
                    "events": entries
                        .iter()
                        .filter(|e| e.time.0 >= since)
                        .map(journal::describe)
                        .collect::<Vec<_>>(),
                }),
                Err(e) => json!({ "error": format!("reading the event log: {e}") }),
            }
        }
    }
}

/// Hands an operator's request to the control loop and waits for its
/// answer (at most 5 s).
async fn operate(ctx: &Context, action: OperatorAction) -> Value {
    let Some(tx) = &ctx.operator else {
        return json!({ "error": "this controller takes no operator requests" });
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    if tx.send(OperatorRequest { action, reply }).await.is_err() {
        return json!({ "error": "the control loop has stopped" });
    }
    match tokio::time::timeout(Duration::from_secs(5), answer).await {
        Ok(Ok(Ok(done))) => json!({ "ok": true, "done": done }),
        Ok(Ok(Err(why))) => json!({ "ok": false, "refused": why }),
        Ok(Err(_)) => json!({ "error": "the control loop dropped the request" }),
        Err(_) => json!({ "error": "the control loop did not answer within 5 s" }),
    }
}

fn status(ctx: &Context, st: &ShellStats, now: TimestampMs) -> Value {
    let snap = st.status.as_ref();
    let r = snap.and_then(|s| s.readings);
    let c = st.last.as_ref();
    let pue = r.and_then(|r| match (r.it_w, r.facility_w) {
        (Some(it), Some(f)) if it > 0.0 => Some(round(f / it, 3)),
        _ => None,
    });
    let heard_within = ctx.period.as_millis() as u64 * 5 + 5_000;
    let heard = st
        .heard
        .iter()
        .take(ctx.hosts.len())
        .filter(|h| h.is_some_and(|t| now.0.saturating_sub(t.0) <= heard_within))
        .count();
    let pumps: Vec<Value> = (0..2)
        .map(|i| {
            json!({
                "pump": if i == 0 { "A" } else { "B" },
                "running": r.and_then(|r| r.pumps_running[i]),
                "on": c.map(|c| c.pump_on[i]),
                "lead": c.map(|c| c.lead as usize == i),
                "failed": snap.map(|s| s.pumps_failed[i]),
            })
        })
        .collect();
    json!({
        "site": ctx.site,
        "cdu": ctx.cdu,
        "software": env!("CARGO_PKG_VERSION"),
        "uptime_s": secs_ago(now, ctx.started),
        "period_ms": ctx.period.as_millis() as u64,
        "steps": st.steps,
        "mode": snap.map(|s| s.mode),
        "reason": snap.map(|s| s.reason),
        "since_ms": snap.map(|s| s.since.0),
        "for_s": snap.map(|s| secs_ago(now, s.since)),
        "setpoint_c": c.map(|c| round(f64::from(c.setpoint_c), 2)),
        "pump_speed_pct": c.map(|c| round(f64::from(c.pump_speed) * 100.0, 1)),
        "supply_c": r.and_then(|r| r.supply_c),
        "return_c": r.and_then(|r| r.return_c),
        "flow_lpm": r.and_then(|r| r.flow_lpm),
        "facility_supply_c": r.and_then(|r| r.facility_supply_c),
        "pumps": pumps,
        "it_w": r.and_then(|r| r.it_w),
        "facility_w": r.and_then(|r| r.facility_w),
        "pue": pue,
        "hosts": ctx.hosts.len(),
        "hosts_heard": heard,
        "leaks_latched": snap.map(|s| racks(s.leaks_latched)).unwrap_or_default(),
        "leaks_now": snap.map(|s| racks(s.leaks_now)).unwrap_or_default(),
        "valves_open": c.map(|c| racks(c.valves_open)).unwrap_or_default(),
        "capped_hosts": st.caps.iter().filter(|c| c.is_some()).count(),
        "cdu_link": {
            "link": ctx.link,
            "map": ctx.map_model,
            "answering": st.cdu_reads > 0 && st.cdu_error.is_none(),
            "last_error": st.cdu_error,
            "last_read_s": snap.and_then(|s| s.last_read).map(|t| secs_ago(now, t)),
            "reads": st.cdu_reads,
            "read_errors": st.cdu_read_errors,
            "write_errors": st.cdu_write_errors,
        },
        "bus": {
            "broker": ctx.broker,
            "connected": snap.map(|s| s.bus_connected),
            "published": st.telemetry_published + st.states_published + st.events_published,
            "publish_errors": st.publish_errors,
        },
        "leases_sent": st.leases_sent,
        "lifts_sent": st.lifts_sent,
        "acks": st.acks,
        "acks_refused": st.acks_refused,
        "events_dropped": snap.map(|s| s.events_dropped),
        "flash": ctx.recorder.path().map_or("memory (not kept)".to_string(), |p| p.display().to_string()),
        "demo_key": ctx.demo_key,
    })
}

fn sensors(st: &ShellStats) -> Value {
    let Some(snap) = &st.status else {
        return json!({ "sensors": [], "note": "no control step yet" });
    };
    let list: Vec<Value> = snap
        .sensors
        .iter()
        .map(|s| {
            json!({
                "sensor": s.which.sensor(),
                "reading": s.reading,
                "unit": if s.which == cooling_core::sensors::Which::Flow { "L/min" } else { "°C" },
                "fault": s.fault,
                "required": s.which.required(),
            })
        })
        .collect();
    json!({ "sensors": list })
}

fn loops(st: &ShellStats) -> Value {
    let Some(snap) = &st.status else {
        return json!({ "note": "no control step yet" });
    };
    let l = &snap.loops;
    let p = &l.proposal;
    let f = |x: f32, d: i32| round(f64::from(x), d);
    json!({
        "proposal": {
            "setpoint_c": f(p.setpoint_c, 2),
            "speed_pct": f(p.speed * 100.0, 1),
            "facility_w": f(p.facility_w, 0),
            "work": f(p.work, 3),
            "feasible": p.feasible,
        },
        "margin_k": f(l.margin_k, 3),
        "supply_trim_k": f(l.supply_trim_k, 3),
        "flow_trim_pct": f(l.flow_trim * 100.0, 2),
        "coolant_c": l.coolant_c.map(|c| f(c, 2)),
        "rejection_short": l.rejection_short,
        "setpoint_c": st.last.as_ref().map(|c| f(c.setpoint_c, 2)),
        "pump_speed_pct": st.last.as_ref().map(|c| f(c.pump_speed * 100.0, 1)),
    })
}

fn caps(ctx: &Context, st: &ShellStats, now: TimestampMs) -> Value {
    let hosts: Vec<Value> = ctx
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let asked = st
                .last
                .as_ref()
                .and_then(|c| c.caps.get(i).copied().flatten());
            let ack = st.last_ack.get(h);
            json!({
                "host": h,
                "index": i,
                "rack": i / ctx.hosts_per_rack.max(1),
                "asked_w": asked.map(|c| c.watts.round()),
                "reason": asked.map(|c| c.reason),
                "sent_w": st.caps.get(i).copied().flatten().map(f32::round),
                "heard_s": st.heard.get(i).copied().flatten().map(|t| secs_ago(now, t)),
                "last_ack": ack.map(|a| json!({
                    "code": a.code,
                    "detail": a.detail,
                    "seq": a.seq,
                    "ago_s": secs_ago(now, a.at),
                })),
                "in_force": st.in_force.get(h).map(|caps| caps.iter().map(|c| json!({
                    "gpus": c.gpus,
                    "limit_w": c.limit.0,
                })).collect::<Vec<_>>()),
            })
        })
        .collect();
    json!({
        "hosts": hosts,
        "lease_s": ctx.lease.as_secs_f64(),
        "leases_sent": st.leases_sent,
        "lifts_sent": st.lifts_sent,
        "last_refusal": st.last_refusal.as_ref().map(|(h, code, detail)| json!({
            "host": h, "code": code, "detail": detail,
        })),
    })
}

/// The client side: sends `req` to the controller at `path` and prints
/// the answer (tables, or JSON with `json_out`). Returns the exit status.
pub fn ctl(path: &Path, req: &Request, json_out: bool) -> i32 {
    let peer = Peer {
        who: "controller",
        program: "cooling-ctrl",
        flag: "--socket",
    };
    let value = match field::console::ask(path, req, &peer) {
        Ok(v) => v,
        Err(status) => return i32::from(status),
    };
    if let Some(e) = value.get("error") {
        eprintln!("the controller says: {}", s(e));
        return 1;
    }
    field::console::print_answer(&value, json_out, |v| render(req, v));
    // A refused operator request is a failure for scripts.
    if value["ok"] == false {
        1
    } else {
        0
    }
}

/// A number with a unit, or `-`.
fn u(v: &Value, unit: &str) -> String {
    match v.as_f64() {
        Some(x) => format!("{}{unit}", round(x, 2)),
        None => "-".into(),
    }
}

fn key_values(rows: &[(&str, String)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<w$}  {v}");
    }
    out
}

/// Renders an answer for people.
pub fn render(req: &Request, v: &Value) -> String {
    match req {
        Request::ClearLeak { .. } | Request::ClearPump { .. } => {
            if let Some(done) = v["done"].as_str() {
                format!("{done}\n")
            } else if let Some(why) = v["refused"].as_str() {
                format!("refused: {why}\n")
            } else {
                format!("error: {}\n", v["error"].as_str().unwrap_or("unknown"))
            }
        }
        Request::Status => {
            let pumps = v["pumps"]
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
                .unwrap_or_default();
            let cdu = &v["cdu_link"];
            let mut rows = vec![
                ("cdu", format!("{} (site {})", s(&v["cdu"]), s(&v["site"]))),
                (
                    "mode",
                    format!(
                        "{} ({}) for {:.0} s",
                        s(&v["mode"]),
                        s(&v["reason"]),
                        v["for_s"].as_f64().unwrap_or(0.0)
                    ),
                ),
                (
                    "setpoint",
                    format!(
                        "{}, pumps at {}",
                        u(&v["setpoint_c"], " °C"),
                        u(&v["pump_speed_pct"], " %")
                    ),
                ),
                (
                    "supply/return",
                    format!(
                        "{} / {}",
                        u(&v["supply_c"], " °C"),
                        u(&v["return_c"], " °C")
                    ),
                ),
                ("flow", u(&v["flow_lpm"], " L/min")),
                ("facility water", u(&v["facility_supply_c"], " °C")),
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
                    format!(
                        "{} heard of {}, {} capped",
                        s(&v["hosts_heard"]),
                        s(&v["hosts"]),
                        s(&v["capped_hosts"])
                    ),
                ),
                (
                    "leaks latched",
                    match s(&v["leaks_latched"]).as_str() {
                        "-" => "none".into(),
                        r => format!("racks {r}"),
                    },
                ),
                ("valves open", s(&v["valves_open"])),
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
                    format!(
                        "{} reads, {} failed, {} writes failed",
                        s(&cdu["reads"]),
                        s(&cdu["read_errors"]),
                        s(&cdu["write_errors"])
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
                (
                    "leases",
                    format!(
                        "{} sent, {} lifts, {} acks ({} refused)",
                        s(&v["leases_sent"]),
                        s(&v["lifts_sent"]),
                        s(&v["acks"]),
                        s(&v["acks_refused"])
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
            ];
            if v["demo_key"].as_bool() == Some(true) {
                rows.push((
                    "WARNING",
                    "leases are signed with the public demonstration key".into(),
                ));
            }
            key_values(&rows)
        }
        Request::Sensors => {
            let rows: Vec<Vec<String>> = v["sensors"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            vec![
                                s(&x["sensor"]),
                                match x["reading"].as_f64() {
                                    Some(r) => format!("{} {}", round(r, 2), s(&x["unit"])),
                                    None => "-".into(),
                                },
                                if x["fault"].is_null() {
                                    "ok".into()
                                } else {
                                    s(&x["fault"]).to_uppercase()
                                },
                                if x["required"].as_bool() == Some(true) {
                                    "yes".into()
                                } else {
                                    "no".into()
                                },
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            if rows.is_empty() {
                return "no control step yet\n".into();
            }
            table(&["SENSOR", "READING", "FAULT", "REQUIRED"], &rows)
        }
        Request::Loops => {
            if v.get("proposal").is_none() {
                return "no control step yet\n".into();
            }
            let p = &v["proposal"];
            key_values(&[
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
            ])
        }
        Request::Events { .. } => events_table(v, describe_event),
        Request::Caps => {
            let rows: Vec<Vec<String>> = v["hosts"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|h| {
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
                                h["in_force"]
                                    .as_array()
                                    .map(|c| {
                                        c.iter()
                                            .map(|c| {
                                                format!("{}:{}W", s(&c["gpus"]), s(&c["limit_w"]))
                                            })
                                            .collect::<Vec<_>>()
                                            .join(" ")
                                    })
                                    .filter(|t| !t.is_empty())
                                    .unwrap_or_else(|| "-".into()),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
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
    }
}

fn describe_event(e: &Value) -> String {
    let Some((name, body)) = e.as_object().and_then(|o| o.iter().next()) else {
        return s(e);
    };
    match name.as_str() {
        "lease_sent" => format!(
            "cap {} W to {} ({}, seq {})",
            s(&body["limit_w"]),
            s(&body["host"]),
            s(&body["reason"]),
            s(&body["seq"])
        ),
        "lift_sent" => format!(
            "cap lifted on {} (seq {})",
            s(&body["host"]),
            s(&body["seq"])
        ),
        "wrapped" => format!(
            "{} older records recycled (#{} to #{})",
            s(&body["lost"]),
            s(&body["first_seq"]),
            s(&body["last_seq"])
        ),
        "cdu_mode_changed" => format!(
            "mode {} -> {} ({})",
            s(&body["from"]),
            s(&body["to"]),
            s(&body["reason"])
        ),
        _ => format!("{name} {body}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_line_of_json() {
        let r = Request::Events { since: Some(5) };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":"events","since":5}"#
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"sensors"}"#).unwrap(),
            Request::Sensors
        );
    }

    #[test]
    fn a_file_in_the_way_of_the_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.sock");
        std::fs::write(&path, b"precious").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt.block_on(async { bind(&path) }).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }
}

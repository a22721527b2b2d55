//! The field engineer's console: `node-agent ctl …` against the running
//! agent over a local Unix socket.
//!
//! One request per connection: a line of JSON (`{"cmd":"gpus"}`), answered
//! by a line of JSON. `node-agent ctl` prints it as aligned tables, or
//! as-is with `--json` for scripts. The socket is created with mode 0660:
//! whoever may read it may see the host's state; nothing on it changes
//! anything.
//!
//! Glossary:
//! - *request*: `status`, `gpus`, `caps`, `events` (with `since`, ms since
//!   the epoch) or `why` (with `gpu`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use loopwarden_bus::now_ms;
use loopwarden_field as field;
use loopwarden_field::console::Peer;
use loopwarden_field::render::{events_table, table, text as s};
pub use loopwarden_field::time::parse_since;
use loopwarden_protocol::{Frame, HealthState, Message, MessageKind, TimestampMs};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

use crate::shell::Agent;

/// A console request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The agent at a glance.
    Status,
    /// Every GPU's last sample.
    Gpus,
    /// Limits in force and the leases behind them.
    Caps,
    /// The event log from flash.
    Events {
        /// Only events at or after this time (ms since the epoch).
        #[serde(default)]
        since: Option<u64>,
    },
    /// Everything the agent knows about one GPU's state.
    Why {
        /// The GPU.
        gpu: u8,
    },
}

/// Binds the console socket, replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    field::console::bind(path, "agent")
}

type Asks = mpsc::Sender<(Request, oneshot::Sender<Value>)>;

/// Answers connections until the agent stops.
pub async fn serve(listener: UnixListener, asks: Asks) {
    field::console::serve(listener, move |req: Request| {
        let asks = asks.clone();
        async move {
            let (tx, rx) = oneshot::channel();
            if asks.send((req, tx)).await.is_err() {
                json!({ "error": "the agent is stopping" })
            } else {
                match tokio::time::timeout(Duration::from_secs(10), rx).await {
                    Ok(Ok(v)) => v,
                    _ => json!({ "error": "the agent did not answer in 10 s" }),
                }
            }
        }
    })
    .await
}

fn ms_ago(now: TimestampMs, t: TimestampMs) -> f64 {
    now.0.saturating_sub(t.0) as f64 / 1000.0
}

impl Agent {
    /// Answers one console request from the loop's state.
    pub(crate) async fn answer(&mut self, req: Request) -> Value {
        let now = now_ms();
        match req {
            Request::Status => self.status(now),
            Request::Gpus => json!({ "gpus": self.gpus_view() }),
            Request::Caps => self.caps_view(now),
            Request::Events { since } => self.events_view(since.unwrap_or(0)).await,
            Request::Why { gpu } => self.why(now, gpu).await,
        }
    }

    fn status(&self, now: TimestampMs) -> Value {
        let t = &self.timing;
        let m = self.bus.metrics();
        json!({
            "site": self.config.site.as_str(),
            "host": self.config.host.as_str(),
            "software": env!("CARGO_PKG_VERSION"),
            "gpu_source": match self.config.gpus {
                crate::config::GpuSourceKind::Nvml => "nvml".to_string(),
                crate::config::GpuSourceKind::Twin(n) => format!("twin ({n})"),
            },
            "gpus": self.gpus.len(),
            "responsive": self.gpus.iter().filter(|g| g.responsive).count(),
            "unresponsive": self.gpus.iter().enumerate().filter(|(_, g)| g.unresponsive_reported).map(|(i, _)| i).collect::<Vec<_>>(),
            "connected": self.bus.is_connected(),
            "uptime_s": ms_ago(now, self.started),
            "period_ms": self.config.period.as_millis() as u64,
            "samples": t.samples,
            "jitter_ms": {
                "last": t.last_jitter_us as f64 / 1000.0,
                "p50": t.jitter_percentile(50.0) as f64 / 1000.0,
                "p99": t.jitter_percentile(99.0) as f64 / 1000.0,
                "max": t.max_jitter_us as f64 / 1000.0,
                "window": t.jitter_us.len(),
            },
            "sample_ms": { "last": t.last_sample_us as f64 / 1000.0, "max": t.max_sample_us as f64 / 1000.0 },
            "bus": {
                "published": m.published,
                "acked": m.acked,
                "received": m.received,
                "dropped": m.dropped(),
                "connects": m.connects,
                "outbox_refused": m.outbox_refused,
                "dropped_outbox": m.dropped_outbox,
                "delivery_mismatch": m.delivery_mismatch,
                "waiting_for_outbox": self.recorder.waiting().0,
                "dropped_waiting": self.recorder.waiting().1,
            },
            "leases": self.core.leases().len(),
            "health": {
                "healthy": self.count_health(HealthState::Healthy),
                "degraded": self.count_health(HealthState::Degraded),
                "quarantined": self.count_health(HealthState::Quarantined),
            },
            "flash": self.flash_path.clone().unwrap_or_else(|| "memory (not kept)".into()),
            "demo_key": self.config.demo_key,
        })
    }

    fn count_health(&self, state: HealthState) -> usize {
        (0..self.gpus.len())
            .filter(|&i| {
                self.health
                    .status(i as u8)
                    .is_some_and(|h| h.state == state)
            })
            .count()
    }

    fn gpus_view(&self) -> Vec<Value> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let s = g.last.unwrap_or_default();
                json!({
                    "gpu": i,
                    "name": g.info.name,
                    "uuid": g.info.uuid,
                    "responsive": g.responsive,
                    "missed": g.missed,
                    "health": self.health.status(i as u8).map(|h| h.state),
                    "reason": self.health.status(i as u8).map(|h| h.reason),
                    "temp": s.temp.0,
                    "mem_temp": s.mem_temp.0,
                    "power": s.power.0,
                    "power_limit": s.power_limit.0,
                    "sm_clock": s.sm_clock.0,
                    "mem_clock": s.mem_clock.0,
                    "util": s.util.get(),
                    "throttle": s.throttle,
                    "ecc": s.ecc,
                    "repair": s.repair,
                    "pcie_replay": s.pcie_replay,
                    "nvlink": s.nvlink,
                    "flags": s.flags,
                    "unsupported": s.unsupported,
                })
            })
            .collect()
    }

    fn caps_view(&self, now: TimestampMs) -> Value {
        let gpus: Vec<Value> = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                json!({
                    "gpu": i,
                    "limit": g.applied.map(|w| w.0),
                    "source": g.source,
                    "min": g.range.min.0,
                    "max": g.range.max.0,
                    "default": g.info.default_limit.0,
                    "guard": g.guard.cap().map(|w| w.0),
                })
            })
            .collect();
        let leases: Vec<Value> = self
            .core
            .leases()
            .into_iter()
            .map(|l| {
                json!({
                    "from": format!("{}/{}", l.from.role.as_str(), l.from.id.as_str()),
                    "lease": l.lease,
                    "source": l.source,
                    "expires_in_s": now.until(l.expires) as f64 / 1000.0,
                    "caps": l.caps.iter().map(|(g, w)| json!({"gpu": g.get(), "limit": w.0})).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({ "gpus": gpus, "leases": leases })
    }

    async fn events_view(&mut self, since: u64) -> Value {
        let entries = match self.recorder.read().await {
            Ok(e) => e,
            Err(e) => return json!({ "error": format!("reading the event log: {e}") }),
        };
        let mut events = Vec::new();
        for r in entries.iter().filter(|r| r.time.0 >= since) {
            let command = |f: &Frame, name: &str| {
                json!({ name: {
                    "from": format!("{}/{}", f.sender.role.as_str(), f.sender.id.as_str()),
                    "seq": f.seq,
                    "body": match &f.message {
                        Message::CapLease(l) => serde_json::to_value(l).unwrap_or(Value::Null),
                        Message::QuarantineRelease(q) => serde_json::to_value(q).unwrap_or(Value::Null),
                        _ => Value::Null,
                    },
                }})
            };
            let what = if r.kind == MessageKind::Event as u8 {
                match Message::decode_body(MessageKind::Event, &r.body) {
                    Ok(Message::Event(e)) => serde_json::to_value(e).unwrap_or(Value::Null),
                    _ => json!("undecodable event"),
                }
            } else if r.kind == MessageKind::CapLease as u8 {
                match Frame::decode(&r.body) {
                    Ok(f) => command(&f, "lease_taken"),
                    Err(e) => json!(format!("undecodable lease: {e}")),
                }
            } else if r.kind == MessageKind::QuarantineRelease as u8 {
                match Frame::decode(&r.body) {
                    Ok(f) => command(&f, "release_taken"),
                    Err(e) => json!(format!("undecodable release: {e}")),
                }
            } else {
                json!(format!("record of kind {}", r.kind))
            };
            events.push(json!({ "seq": r.seq, "time_ms": r.time.0, "event": what }));
        }
        json!({ "events": events })
    }

    async fn why(&mut self, now: TimestampMs, gpu: u8) -> Value {
        let Some(g) = self.gpus.get(gpu as usize) else {
            return json!({ "error": format!("no GPU {gpu}: this host has {}", self.gpus.len()) });
        };
        let s = g.last.unwrap_or_default();
        let h = self.health.status(gpu).expect("one status per GPU").clone();
        let mut notes = Vec::new();
        if !g.responsive {
            notes.push(format!(
                "missed its last {} samples: {}",
                g.missed,
                g.last_error.as_deref().unwrap_or("no answer")
            ));
        }
        if let Some(src) = g.source {
            notes.push(format!(
                "power capped to {} W by {}",
                g.applied.map_or(0, |w| w.0),
                serde_json::to_value(src)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default()
            ));
        }
        if !s.unsupported.is_empty() {
            notes.push(format!(
                "not supported by this GPU: {}",
                serde_json::to_value(s.unsupported).unwrap_or(Value::Null)
            ));
        }
        let xids: Vec<Value> = g
            .xids
            .iter()
            .map(|(t, x)| {
                let entry = loopwarden_protocol::xid::lookup(*x);
                json!({
                    "xid": x,
                    "ago_s": ms_ago(now, *t),
                    "cause": entry.map(|e| format!("{:?}", e.cause)),
                    "name": entry.map(|e| e.mnemonic),
                })
            })
            .collect();
        json!({
            "gpu": gpu,
            "uuid": g.info.uuid,
            "health": h.state,
            "reason": h.reason,
            "since_s": ms_ago(now, h.since),
            "evidence": h.evidence,
            "responsive": g.responsive,
            "limit": g.applied.map(|w| w.0),
            "cap_source": g.source,
            "notes": notes,
            "recent_xids": xids,
        })
    }
}

/// The client side: sends `req` to the agent at `path` and prints the
/// answer (tables, or JSON with `json`). Returns the exit status.
pub fn ctl(path: &Path, req: &Request, json_out: bool) -> i32 {
    let peer = Peer {
        who: "agent",
        program: "node-agent",
        flag: "--console",
    };
    let value = match field::console::ask(path, req, &peer) {
        Ok(v) => v,
        Err(status) => return i32::from(status),
    };
    if let Some(err) = value.get("error").and_then(Value::as_str) {
        eprintln!("error: {err}");
        return 1;
    }
    field::console::print_answer(&value, json_out, |v| render(req, v));
    0
}

/// Renders an answer for people.
pub fn render(req: &Request, v: &Value) -> String {
    match req {
        Request::Status => {
            let mut out = String::new();
            let j = &v["jitter_ms"];
            let rows = [
                (
                    "host",
                    format!("{} (site {})", s(&v["host"]), s(&v["site"])),
                ),
                ("software", s(&v["software"])),
                (
                    "GPUs",
                    format!(
                        "{} from {}, {} responsive",
                        s(&v["gpus"]),
                        s(&v["gpu_source"]),
                        s(&v["responsive"])
                    ),
                ),
                ("unresponsive", s(&v["unresponsive"])),
                (
                    "bus",
                    format!(
                        "{}, {} published, {} received, {} dropped, {} connects",
                        if v["connected"].as_bool() == Some(true) {
                            "connected"
                        } else {
                            "NOT CONNECTED"
                        },
                        s(&v["bus"]["published"]),
                        s(&v["bus"]["received"]),
                        s(&v["bus"]["dropped"]),
                        s(&v["bus"]["connects"])
                    ),
                ),
                (
                    "uptime",
                    format!("{:.0} s", v["uptime_s"].as_f64().unwrap_or(0.0)),
                ),
                (
                    "sampling",
                    format!(
                        "every {} ms, {} samples; last took {} ms",
                        s(&v["period_ms"]),
                        s(&v["samples"]),
                        s(&v["sample_ms"]["last"])
                    ),
                ),
                (
                    "jitter",
                    format!(
                        "last {} ms, p50 {} ms, p99 {} ms, max {} ms (last {} ticks)",
                        s(&j["last"]),
                        s(&j["p50"]),
                        s(&j["p99"]),
                        s(&j["max"]),
                        s(&j["window"])
                    ),
                ),
                (
                    "health",
                    format!(
                        "{} healthy, {} degraded, {} quarantined",
                        s(&v["health"]["healthy"]),
                        s(&v["health"]["degraded"]),
                        s(&v["health"]["quarantined"])
                    ),
                ),
                ("leases", s(&v["leases"])),
                ("flash", s(&v["flash"])),
            ];
            for (k, val) in rows {
                let _ = writeln!(out, "{k:<13} {val}");
            }
            if v["demo_key"].as_bool() == Some(true) {
                out.push_str(
                    "WARNING       commands are checked against the public demonstration key\n",
                );
            }
            out
        }
        Request::Gpus => {
            let rows: Vec<Vec<String>> = v["gpus"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|g| {
                            vec![
                                s(&g["gpu"]),
                                if g["responsive"].as_bool() == Some(true) {
                                    "yes".into()
                                } else {
                                    format!("NO ({} missed)", s(&g["missed"]))
                                },
                                s(&g["health"]),
                                format!("{}C", s(&g["temp"])),
                                format!("{}C", s(&g["mem_temp"])),
                                format!("{}W / {}W", s(&g["power"]), s(&g["power_limit"])),
                                format!("{}", s(&g["sm_clock"])),
                                format!("{}%", s(&g["util"])),
                                s(&g["throttle"]),
                                format!(
                                    "{}/{}",
                                    s(&g["ecc"]["sbe_volatile"]),
                                    s(&g["ecc"]["dbe_volatile"])
                                ),
                                s(&g["unsupported"]),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            table(
                &[
                    "GPU",
                    "RESPONSIVE",
                    "HEALTH",
                    "TEMP",
                    "HBM",
                    "POWER / LIMIT",
                    "SM MHZ",
                    "UTIL",
                    "THROTTLE",
                    "ECC SBE/DBE",
                    "UNSUPPORTED",
                ],
                &rows,
            )
        }
        Request::Caps => {
            let gpus: Vec<Vec<String>> = v["gpus"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|g| {
                            vec![
                                s(&g["gpu"]),
                                format!("{} W", s(&g["limit"])),
                                if g["source"].is_null() {
                                    "uncapped".into()
                                } else {
                                    s(&g["source"])
                                },
                                format!("{}-{} W", s(&g["min"]), s(&g["max"])),
                                format!("{} W", s(&g["default"])),
                                s(&g["guard"]),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            let mut out = table(
                &["GPU", "LIMIT", "SET BY", "RANGE", "DEFAULT", "GUARD"],
                &gpus,
            );
            let leases: Vec<Vec<String>> = v["leases"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|l| {
                            vec![
                                s(&l["from"]),
                                s(&l["lease"]),
                                s(&l["source"]),
                                format!("{:.1} s", l["expires_in_s"].as_f64().unwrap_or(0.0)),
                                l["caps"]
                                    .as_array()
                                    .map(|c| {
                                        c.iter()
                                            .map(|c| {
                                                format!("{}:{}W", s(&c["gpu"]), s(&c["limit"]))
                                            })
                                            .collect::<Vec<_>>()
                                            .join(" ")
                                    })
                                    .unwrap_or_default(),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
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
        Request::Events { .. } => events_table(v, describe_event),
        Request::Why { .. } => {
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
            let _ = writeln!(
                out,
                "limit      {} W ({})",
                s(&v["limit"]),
                if v["cap_source"].is_null() {
                    "uncapped".into()
                } else {
                    s(&v["cap_source"])
                }
            );
            for n in v["notes"].as_array().into_iter().flatten() {
                let _ = writeln!(out, "note       {}", s(n));
            }
            for x in v["recent_xids"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "xid        {} {} ({}), {:.0} s ago",
                    s(&x["xid"]),
                    s(&x["name"]),
                    s(&x["cause"]),
                    x["ago_s"].as_f64().unwrap_or(0.0)
                );
            }
            out
        }
    }
}

fn describe_event(e: &Value) -> String {
    let Some((name, body)) = e.as_object().and_then(|o| o.iter().next()) else {
        return s(e);
    };
    match name.as_str() {
        "xid" => format!("GPU {}: XID {}", s(&body["gpu"]), s(&body["xid"])),
        "cap_applied" => format!(
            "GPU {}: limit {} W ({})",
            s(&body["gpu"]),
            s(&body["limit"]),
            if body["source"].is_null() {
                "uncapped".into()
            } else {
                s(&body["source"])
            }
        ),
        "release_taken" => format!(
            "release from {} (seq {}): {}",
            s(&body["from"]),
            s(&body["seq"]),
            body["body"]
        ),
        "lease_taken" => format!(
            "lease from {} (seq {}): {}",
            s(&body["from"]),
            s(&body["seq"]),
            body["body"]
        ),
        _ => format!("{name} {body}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_in_the_way_of_the_socket_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        std::fs::write(&path, b"precious").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let e = rt.block_on(async { bind(&path) }).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }

    #[test]
    fn requests_are_one_line_of_json() {
        let r = Request::Events { since: Some(5) };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, r#"{"cmd":"events","since":5}"#);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"why","gpu":3}"#).unwrap(),
            Request::Why { gpu: 3 }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"events"}"#).unwrap(),
            Request::Events { since: None }
        );
    }
}

//! The answers: the JSON for each request, built from what the shell
//! published after its last step ([`ShellStats`]) and from the event log;
//! operator requests are handed to the control loop.

use std::format;
use std::string::ToString;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_bus::now_ms;
use loopwarden_field::console::Caller;
use loopwarden_field::serial::record::CONSOLE_RECORD;
use loopwarden_field::watchdog::Heartbeat;
use loopwarden_protocol::{Ident, TimestampMs};
use serde_json::{json, Value};

use super::{round, Context, Request};
use cooling_core::sensors::Which;

use crate::decide::outdoor::OutdoorSource;
use crate::journal;
use crate::shell::{OperatorAction, OperatorRequest, RequestOutcome, ResendCounts, ShellStats};

fn secs_ago(now: TimestampMs, t: TimestampMs) -> f64 {
    now.0.saturating_sub(t.0) as f64 / 1000.0
}

fn racks(mask: u16) -> Vec<usize> {
    (0..16).filter(|i| mask & (1 << i) != 0).collect()
}

/// Answers one request from `caller`.
pub async fn answer(ctx: &Context, req: Request, caller: Caller) -> Value {
    answer_as(ctx, req, &caller.operator()).await
}

/// Answers one request; an operator's request in the name of `operator`
/// (`uid-1000`, `serial-ttyS1`).
pub async fn answer_as(ctx: &Context, req: Request, operator: &str) -> Value {
    let now = now_ms();
    let stats = ctx.stats.borrow().clone();
    match req {
        Request::Status => status(ctx, &stats, now),
        Request::Sensors => sensors(&stats),
        Request::Loops => loops(&ctx.hosts, &stats),
        Request::Caps => caps(ctx, &stats, now),
        Request::ClearLeak { rack } => {
            operate(ctx, OperatorAction::ClearLeak { rack }, operator).await
        }
        Request::ClearPump { pump } => {
            let pump = match pump.as_str() {
                "A" | "a" => loopwarden_protocol::message::Pump::A,
                "B" | "b" => loopwarden_protocol::message::Pump::B,
                other => return json!({ "error": format!("no pump {other:?}: A or B") }),
            };
            operate(ctx, OperatorAction::ClearPumpTrip { pump }, operator).await
        }
        Request::Events { since } => {
            let since = since.unwrap_or(0);
            match ctx.recorder.read().await {
                Ok(read) => json!({
                    "events": read
                        .entries
                        .iter()
                        .filter(|e| e.time.0 >= since)
                        // An event's frame number is bookkeeping for
                        // resends, not an event of its own.
                        .filter(|e| e.kind != loopwarden_store::resend::PUBLISHED)
                        .map(|e| match e.kind {
                            CONSOLE_RECORD => loopwarden_field::serial::record::entry(e.seq, e.time.0, &e.body),
                            _ => journal::describe(e),
                        })
                        .collect::<Vec<_>>(),
                    "queued_for_flash": read.queued,
                }),
                Err(e) => json!({ "error": format!("reading the event log: {e}") }),
            }
        }
    }
}

/// Hands an operator's request from `operator` to the control loop and
/// waits for its answer (at most 5 s).
async fn operate(ctx: &Context, action: OperatorAction, operator: &str) -> Value {
    let Some(tx) = &ctx.operator else {
        return json!({ "error": "this controller takes no operator requests" });
    };
    let Ok(operator) = Ident::new(operator) else {
        return json!({ "error": "the caller cannot be named in the log" });
    };
    let (req, pending) = OperatorRequest::new(action, operator);
    if tx.send(req).await.is_err() {
        return json!({ "error": "the control loop has stopped" });
    }
    match pending.outcome(Duration::from_secs(5)).await {
        RequestOutcome::Answered(Ok(done)) => json!({ "ok": true, "done": done }),
        RequestOutcome::Answered(Err(why)) => json!({ "ok": false, "refused": why }),
        RequestOutcome::Dropped => json!({ "error": "the control loop dropped the request" }),
        RequestOutcome::Withdrawn => json!({
            "error": "the control loop did not take the request within 5 s: it is withdrawn and will not be carried out; check `ctl status`, then ask again"
        }),
    }
}

fn status(ctx: &Context, st: &ShellStats, now: TimestampMs) -> Value {
    let snap = st.status.as_ref();
    let r = snap.and_then(|s| s.readings);
    // A lost or implausible reading is no figure, as on the bus.
    let shown = |w: Which| {
        snap.and_then(|s| s.sensors.iter().find(|x| x.which == w))
            .and_then(|x| x.shown())
    };
    let pue = r.and_then(|r| match (r.it_w, r.facility_w) {
        (Some(it), Some(f)) if it > 0.0 => Some(round(f / it, 3)),
        _ => None,
    });
    let mut v = json!({
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
        // As written to the CDU and taken (held to its map's range); what
        // the core asks beside it.
        "setpoint_c": st.setpoint_written_c.map(|v| round(v, 2)),
        "pump_speed_pct": st.speed_written_pct.map(|v| round(v, 1)),
        "supply_c": shown(Which::Supply),
        "return_c": shown(Which::Return),
        "flow_lpm": shown(Which::Flow),
        "facility_supply_c": shown(Which::FacilitySupply),
        "pumps": pumps(st),
        "it_w": r.and_then(|r| r.it_w),
        "facility_w": r.and_then(|r| r.facility_w),
        "pue": pue,
        "hosts": ctx.hosts.len(),
        "hosts_heard": hosts_heard(ctx, st, now),
        "host_reports_refused": st.host_reports_refused,
        "host_reports_partial": st.host_gpus_left_out,
        // Before the first step: null (unknown), never an empty list.
        "leaks_latched": snap.map(|s| racks(s.leaks_latched)),
        "leak_sensing_lost": snap.map(|s| racks(s.sensing_lost)),
        "isolation_failed": snap.map(|s| racks(s.isolation_failed)),
        "leaks_now": snap.map(|s| racks(s.leaks_now)),
        "capped_hosts": st.hosts_capped(now),
        "cdu_link": cdu_link(ctx, st, now),
        "bus": {
            "broker": ctx.broker,
            "connected": snap.map(|s| s.bus_connected),
            "published": st.telemetry_published + st.states_published + st.events_published,
            "publish_errors": st.publish_errors,
        },
        "resend": snap.map(|s| resend_view(s.resend)),
        "leases_sent": st.leases_sent,
        "lifts_sent": st.lifts_sent,
        "acks": st.acks,
        "acks_refused": st.acks_refused,
        "acks_shortened": st.acks_shortened,
        "events_dropped": snap.map(|s| s.events_dropped),
        "flash_queue_dropped": ctx.recorder.dropped(),
        "flash": ctx.recorder.path().map_or("memory (not kept)".to_string(), |p| p.display().to_string()),
        "demo_key": ctx.demo_key,
    });
    // Past the macro's recursion limit: added after.
    add_safety_and_age(&mut v, ctx, st, now);
    v
}

/// Hosts heard from within five periods and 5 s.
fn hosts_heard(ctx: &Context, st: &ShellStats, now: TimestampMs) -> usize {
    let heard_within = ctx.period.as_millis() as u64 * 5 + 5_000;
    (st.heard.iter())
        .take(ctx.hosts.len())
        .filter(|h| h.is_some_and(|t| now.0.saturating_sub(t.0) <= heard_within))
        .count()
}

/// Each pump as read, commanded and latched.
fn pumps(st: &ShellStats) -> Vec<Value> {
    let snap = st.status.as_ref();
    let (r, c) = (snap.and_then(|s| s.readings), st.last.as_ref());
    (0..2)
        .map(|i| {
            json!({
                "pump": if i == 0 { "A" } else { "B" },
                "running": r.and_then(|r| r.pumps_running[i]),
                "on": c.map(|c| c.pump_on[i]),
                "lead": c.map(|c| c.lead as usize == i),
                "failed": snap.map(|s| s.pumps_failed[i]),
            })
        })
        .collect()
}

/// The link to the CDU: what it is and how it answers.
fn cdu_link(ctx: &Context, st: &ShellStats, now: TimestampMs) -> Value {
    let snap = st.status.as_ref();
    json!({
        "link": ctx.link,
        "map": ctx.map_model,
        "answering": st.cdu_reads > 0 && st.cdu_error.is_none(),
        "last_error": st.cdu_error,
        "last_read_s": snap.and_then(|s| s.last_read).map(|t| secs_ago(now, t)),
        "reads": st.cdu_reads,
        "read_errors": st.cdu_read_errors,
        "write_errors": st.cdu_write_errors,
    })
}

/// What `status` adds past the `json!` macro's recursion limit: the
/// leak sensing, the protections off, the valves, what the core asked,
/// and how old it all is.
fn add_safety_and_age(v: &mut Value, ctx: &Context, st: &ShellStats, now: TimestampMs) {
    let snap = st.status.as_ref();
    let c = st.last.as_ref();
    v["board_errors"] = json!(st.board_errors);
    v["setpoint_asked_c"] = json!(c.map(|c| round(f64::from(c.setpoint_c), 2)));
    v["pump_speed_asked_pct"] = json!(c.map(|c| round(f64::from(c.pump_speed) * 100.0, 1)));
    v["relatch_pending"] = json!(st.relatch_pending);
    v["heartbeat_held"] = json!(st.heartbeat_held);
    // Read wet by an input that has not answered since: not known dry.
    v["leaks_unheard"] = json!(snap.map(|s| racks(s.leaks_unheard)));
    // Racks no rope watches: declared so, or every rack without board pins.
    v["leak_unprotected"] = json!(snap.map(|s| racks(s.unprotected)));
    v["leak_ropes"] = json!(snap.map(|s| s.ropes));
    // How old all of this is: the last step's age, stale past the loop's
    // grace (`null` before the first step).
    let grace = Heartbeat::grace(ctx.period, ctx.period);
    let age_ms = snap.map(|s| now.0.saturating_sub(s.at.0));
    v["last_step_s"] = json!(age_ms.map(|ms| ms as f64 / 1000.0));
    v["stale"] = json!(age_ms.map(|ms| ms > grace.as_millis() as u64));
    v["stale_after_s"] = json!(grace.as_secs_f64());
    if snap.is_none() {
        v["note"] = json!("no control step yet");
    }
    // Each supervised sensor's fault, by the key of its reading: a stuck,
    // drifting or implausible sensor's figure is not to be trusted.
    v["sensor_faults"] = sensor_faults(snap);
    v["protection_off"] = json!(ctx
        .protection_off
        .iter()
        .map(|said| json!({ "key": protection_key(said), "said": said }))
        .collect::<Vec<_>>());
    // The valves as the CDU has them (`null`: unknown), and as commanded.
    v["valves_open"] = json!(snap.and_then(|s| s.valves_open).map(racks));
    v["valves_commanded_open"] = json!(c.map(|c| racks(c.valves_open)));
}

/// The fault each supervised sensor stands under now, by the key of its
/// reading in `status` (`supply_c`, ...); a sensor without one (or
/// cleared) is not listed.
fn sensor_faults(snap: Option<&crate::shell::Snapshot>) -> Value {
    let mut faults = serde_json::Map::new();
    for sensor in snap.into_iter().flat_map(|s| s.sensors.iter()) {
        if let (true, Some(f)) = (sensor.faulted(), sensor.fault) {
            let key = match sensor.which {
                Which::Supply => "supply_c",
                Which::Return => "return_c",
                Which::Flow => "flow_lpm",
                Which::FacilitySupply => "facility_supply_c",
            };
            faults.insert(key.into(), json!(f));
        }
    }
    Value::Object(faults)
}

/// The setting an opt-out line names (`rope_fault_active_high = true:
/// ...` names `rope_fault_active_high`).
pub(crate) fn protection_key(said: &str) -> &str {
    said.split([' ', '=', ':']).next().unwrap_or(said)
}

/// Readers' requests to resend logged events, by outcome, and the frames
/// resent.
fn resend_view(r: ResendCounts) -> Value {
    json!(r)
}

fn sensors(st: &ShellStats) -> Value {
    let Some(snap) = &st.status else {
        return json!({ "sensors": [], "note": "no control step yet" });
    };
    let list: Vec<Value> = snap
        .sensors
        .iter()
        .map(|s| {
            // The reading as a figure to show (as `status`, the bus and
            // `/metrics`), and the CDU's raw value beside it.
            json!({
                "sensor": s.which.sensor(),
                "reading": s.shown(),
                "raw": s.reading,
                "implausible": s.reading.is_some_and(|x| !s.which.plausible(x)),
                "unit": if s.which == Which::Flow { "L/min" } else { "°C" },
                "fault": s.fault,
                "required": s.which.required(),
            })
        })
        .collect();
    json!({ "sensors": list })
}

/// The optimiser, the trims, what the core has learned (each figure
/// configured, estimated and used, each of the configured `hosts`' thermal
/// factor), the plan ceiling and the outdoor temperature in force, and
/// the plan's choice.
pub(super) fn loops(hosts: &[String], st: &ShellStats) -> Value {
    let Some(snap) = &st.status else {
        return json!({ "note": "no control step yet" });
    };
    let l = &snap.loops;
    let p = &l.proposal;
    let f = |x: f32, d: i32| round(f64::from(x), d);
    let e = &snap.estimates;
    let figures: Vec<Value> = e
        .figures()
        .iter()
        .map(|x| {
            json!({
                "figure": x.key,
                "name": x.name,
                "unit": x.unit,
                "configured": f(x.configured, 4),
                "estimated": f(x.estimated, 4),
                "used": f(x.used, 4),
                "confidence": f(x.confidence, 3),
                "trust": f(x.trust, 3),
            })
        })
        .collect();
    let host_rows: Vec<Value> = hosts
        .iter()
        .enumerate()
        .take(e.configured.layout.hosts())
        .map(|(i, h)| {
            let x = e.host(i);
            json!({
                "host": h,
                "factor": f(x.factor, 4),
                "used": f(x.used, 4),
                "confidence": f(x.confidence, 3),
                "trust": f(x.trust, 3),
                "learned_s": f(x.learned_s, 0),
            })
        })
        .collect();
    // Facility W per unit of work (one GPU at full demand) is kWh per
    // work-GPU-hour once divided by 1000.
    let per_work_gpu_h = |w: f32| f(w / 1000.0, 4);
    let cost = (p.work > 1e-3).then(|| per_work_gpu_h(p.facility_w / p.work));
    let facility = snap.facility.as_ref().map(|fs| {
        json!({
            "coordinator": fs.coordinator,
            "coordinates": fs.coordinates,
            "accept_c": fs.offer.map(|o| f(o.accept_c, 2)),
            "heat_kw": fs.offer.map(|o| f(o.heat_w / 1000.0, 1)),
            "water_c": fs.following.map(|(w, _)| f(w, 2)),
            "heard_s_ago": fs.following.map(|(_, ms)| ms / 1000),
            "plan": fs.plan.map(|(pl, offers)| json!({
                "water_c": f(pl.water_c, 2),
                "chiller_stages": pl.chiller_stages,
                "offers": offers,
                "capping": pl.capping.count_ones(),
            })),
        })
    });
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
        "plan": {
            "setpoint_c": f(p.setpoint_c, 2),
            "supply_c": f(p.supply_c, 2),
            "short": p.supply_c - p.setpoint_c > PLANT_SHORT_K,
            "capped_hosts": p.capped_hosts,
            "kwh_per_work_gpu_h": cost,
            "other_kwh_per_work_gpu_h": p.other_cost.filter(|_| cost.is_some()).map(per_work_gpu_h),
        },
        "learned": {
            "figures": figures,
            "hosts": host_rows,
        },
        "facility": facility,
        "plan_ceiling_c": f(e.plan_ceiling_c(), 2),
        "plan_ceiling_configured_c": f(e.configured.margins.plan_ceiling_c, 2),
        "outdoor": {
            "c": f(e.outdoor_c, 2),
            "fallback": e.outdoor_fallback,
            "source": match (e.outdoor_fallback, snap.outdoor_source) {
                (true, _) => "fallback",
                (false, Some(OutdoorSource::Cdu)) => "cdu",
                (false, Some(OutdoorSource::Bms)) => "bms",
                (false, None) => "last reading",
            },
        },
    })
}

/// The plan's supply this far above its setpoint: the plant cannot hold
/// it, K.
pub const PLANT_SHORT_K: f32 = 0.5;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::render;
    use crate::shell::{SensorStatus, Snapshot};
    use cooling_core::{Core, CoreConfig};

    /// The stats after a step of a fresh core whose sensors read as
    /// `sensors`.
    fn stepped(sensors: [SensorStatus; 4]) -> ShellStats {
        let core = Core::new(CoreConfig::default()).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.sensors = sensors;
        ShellStats {
            status: Some(snap),
            ..Default::default()
        }
    }

    /// The row named `name` of `status` rendered from `v`.
    fn status_row(v: &Value, name: &str) -> String {
        let text = render::render(&Request::Status, v);
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
            .to_string()
    }

    #[test]
    fn a_faulted_sensor_is_marked_protections_off_have_rows_and_the_setpoint_is_as_written() {
        use loopwarden_protocol::message::SensorFault;
        let mut ctx = (*crate::console::test_context(ShellStats::default())).clone();
        ctx.protection_off = vec!["rope_fault_active_high = true: a cut line reads healthy".into()];
        let core = Core::new(CoreConfig::default()).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.sensors[0] = SensorStatus {
            which: Which::Supply,
            reading: Some(31.0),
            fault: Some(SensorFault::Stuck),
        };
        snap.sensors[1] = SensorStatus {
            which: Which::Return,
            reading: Some(38.0),
            fault: Some(SensorFault::Cleared),
        };
        let mut asked = cooling_core::Commands::UNSET;
        asked.setpoint_c = 32.0;
        asked.pump_speed = 1.0;
        let st = ShellStats {
            status: Some(snap),
            last: Some(asked),
            setpoint_written_c: Some(32.0),
            speed_written_pct: Some(90.0),
            ..Default::default()
        };
        let v = status(&ctx, &st, TimestampMs(0));
        assert_eq!(v["sensor_faults"], json!({"supply_c": "stuck"}), "{v:#}");
        let row = status_row(&v, "supply/return");
        assert!(row.ends_with("31 °C (STUCK) / 38 °C"), "{row}");
        let row = status_row(&v, "PROTECTION OFF");
        assert!(
            row.ends_with("rope_fault_active_high = true: a cut line reads healthy"),
            "{row}"
        );
        assert_eq!(v["protection_off"][0]["key"], "rope_fault_active_high");
        let row = status_row(&v, "setpoint");
        assert!(row.ends_with("32 °C, pumps at 90 % (asked 100 %)"), "{row}");
        // Every protection on: no row.
        let ctx = crate::console::test_context(ShellStats::default());
        let text = render::render(&Request::Status, &status(&ctx, &st, TimestampMs(0)));
        assert!(!text.contains("PROTECTION OFF"), "{text}");
    }

    #[test]
    fn before_the_first_step_the_leaks_sensing_and_isolation_are_unknown() {
        let ctx = crate::console::test_context(ShellStats::default());
        let v = status(&ctx, &ctx.stats.borrow().clone(), TimestampMs(5_000));
        assert_eq!(v["note"], "no control step yet", "{v:#}");
        for key in ["leaks_latched", "leak_sensing_lost", "isolation_failed"] {
            assert!(v[key].is_null(), "{key}: {v:#}");
        }
        for name in ["mode", "leaks latched", "leak sensing", "isolation"] {
            let row = status_row(&v, name);
            assert!(row.contains("UNKNOWN (no control step yet)"), "{row}");
        }
        assert!(status_row(&v, "last step").contains("no control step yet"));
        // After a step, the same rows say what the core holds.
        let core = Core::new(CoreConfig::default()).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.at = TimestampMs(4_500);
        let st = ShellStats {
            status: Some(snap),
            ..Default::default()
        };
        let v = status(&ctx, &st, TimestampMs(5_000));
        assert!(status_row(&v, "leaks latched").ends_with("none"));
        assert!(status_row(&v, "leak sensing").ends_with("supervised"));
        assert!(status_row(&v, "isolation").ends_with("ok"));
    }

    #[test]
    fn racks_without_a_rope_are_said_in_the_leak_sensing_row() {
        let ctx = crate::console::test_context(ShellStats::default());
        let mut cfg = CoreConfig::default();
        cfg.layout.unprotected = 0b1000;
        let core = Core::new(cfg).unwrap();
        let stats = |ropes: bool| ShellStats {
            status: Some(Snapshot {
                ropes,
                ..Snapshot::of_core(&core)
            }),
            ..Default::default()
        };
        let v = status(&ctx, &stats(true), TimestampMs(0));
        assert_eq!(v["leak_unprotected"], json!([3]), "{v:#}");
        let row = status_row(&v, "leak sensing");
        assert!(
            row.ends_with(
                "supervised; unprotected: racks 3 (no rope, the CDU's leak register only)"
            ),
            "{row}"
        );
        let v = status(&ctx, &stats(false), TimestampMs(0));
        let row = status_row(&v, "leak sensing");
        assert!(row.contains("no board pins"), "{row}");
        // Every rack roped: supervised, and nothing more.
        let core = Core::new(CoreConfig::default()).unwrap();
        let st = ShellStats {
            status: Some(Snapshot::of_core(&core)),
            ..Default::default()
        };
        let v = status(&ctx, &st, TimestampMs(0));
        assert!(status_row(&v, "leak sensing").ends_with("supervised"));
    }

    #[test]
    fn the_last_steps_age_is_shown_and_stale_past_the_loops_grace() {
        let ctx = crate::console::test_context(ShellStats::default());
        let core = Core::new(CoreConfig::default()).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.at = TimestampMs(10_000);
        let st = ShellStats {
            status: Some(snap),
            ..Default::default()
        };
        // A 1 s period: late past 2 s.
        let v = status(&ctx, &st, TimestampMs(10_400));
        assert_eq!(v["last_step_s"], 0.4, "{v:#}");
        assert_eq!(v["stale"], false, "{v:#}");
        assert!(status_row(&v, "last step").ends_with("0.4 s ago"));
        let v = status(&ctx, &st, TimestampMs(12_000));
        assert_eq!(v["stale"], false, "{v:#}");
        let v = status(&ctx, &st, TimestampMs(12_001));
        assert_eq!(v["stale"], true, "{v:#}");
        let row = status_row(&v, "last step");
        assert!(row.contains("STALE: 2.0 s ago"), "{row}");
    }

    #[test]
    fn an_implausible_reading_before_its_fault_is_not_shown_as_ok() {
        let sensor = |which, reading: Option<f64>| SensorStatus {
            which,
            reading,
            fault: None,
        };
        let st = stepped([
            // A broken 4-20 mA loop: 0 °C, its fault not yet confirmed.
            sensor(Which::Supply, Some(-327.68)),
            sensor(Which::Return, Some(38.0)),
            sensor(Which::Flow, Some(170.0)),
            sensor(Which::FacilitySupply, None),
        ]);
        let v = sensors(&st);
        assert!(v["sensors"][0]["reading"].is_null(), "{v:#}");
        assert_eq!(v["sensors"][0]["raw"], -327.68, "{v:#}");
        assert_eq!(v["sensors"][1]["reading"], 38.0, "{v:#}");
        let text = render::render(&Request::Sensors, &v);
        let row = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
                .to_string()
        };
        let supply = row("supply_temp");
        assert!(supply.contains("IMPLAUSIBLE (unconfirmed)"), "{supply}");
        assert!(supply.contains("- (raw -327.68)"), "{supply}");
        assert!(!supply.contains(" ok "), "{supply}");
        assert!(row("return_temp").contains("38 °C"), "{text}");
        assert!(row("return_temp").contains(" ok "), "{text}");
        assert!(row("facility").contains("NO READING"), "{text}");
    }
}

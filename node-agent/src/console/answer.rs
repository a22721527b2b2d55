//! The agent side of the console: each request answered as JSON from the
//! loop's last [`Snapshot`], the bus's counters and the event log.

use std::time::Duration;

use loopwarden_bus::now_ms;
use loopwarden_field::serial::record::CONSOLE_RECORD;
use loopwarden_protocol::{Frame, HealthState, Message, MessageKind, TimestampMs};
use serde_json::{json, Value};

use super::snapshot::{Context, Snapshot};
use super::Request;
use crate::config::GpuSourceKind;

fn ms_ago(now: TimestampMs, t: TimestampMs) -> f64 {
    now.0.saturating_sub(t.0) as f64 / 1000.0
}

/// Answers one console request, at most 10 s after it came, once the loop
/// has published its first snapshot.
pub async fn answer(ctx: &Context, req: Request) -> Value {
    match tokio::time::timeout(Duration::from_secs(10), answer_now(ctx, req)).await {
        Ok(v) => v,
        Err(_) => json!({ "error": "the agent did not answer in 10 s" }),
    }
}

async fn answer_now(ctx: &Context, req: Request) -> Value {
    let mut rx = ctx.snapshot.clone();
    let snap = match rx.wait_for(Option::is_some).await {
        Ok(s) => s.clone().expect("waited for a snapshot"),
        Err(_) => return json!({ "error": "the agent is stopping" }),
    };
    let now = now_ms();
    match req {
        Request::Status => status(ctx, &snap, now),
        Request::Gpus => json!({ "gpus": gpus_view(&snap) }),
        Request::Caps => caps_view(&snap, now),
        Request::Events { since } => events_view(ctx, since.unwrap_or(0)).await,
        Request::Why { gpu } => why(&snap, now, gpu),
    }
}

fn status(ctx: &Context, snap: &Snapshot, now: TimestampMs) -> Value {
    let t = &snap.timing;
    let m = ctx.bus.metrics();
    json!({
        "site": ctx.site.as_str(),
        "host": ctx.host.as_str(),
        "software": env!("CARGO_PKG_VERSION"),
        "gpu_source": match ctx.gpu_source {
            GpuSourceKind::Nvml => "nvml".to_string(),
            GpuSourceKind::Twin(n) => format!("twin ({n})"),
        },
        "gpus": snap.gpus.len(),
        "responsive": snap.gpus.iter().filter(|g| g.responsive).count(),
        "unresponsive": snap.gpus.iter().enumerate().filter(|(_, g)| g.unresponsive_reported).map(|(i, _)| i).collect::<Vec<_>>(),
        "connected": ctx.bus.is_connected(),
        "uptime_s": ms_ago(now, ctx.started),
        "period_ms": ctx.period.as_millis() as u64,
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
            // Renewed frames (telemetry) found the bus offline: the next
            // sample replaces them. The first sample of a start usually
            // comes before the first connection.
            "not_sent_offline": m.dropped_offline,
            "dropped": m.dropped() - m.dropped_offline,
            "connects": m.connects,
            "outbox_refused": m.outbox_refused,
            "outbox_failed": m.outbox_failed,
            "dropped_outbox": m.dropped_outbox,
            "delivery_mismatch": m.delivery_mismatch,
            "waiting_for_outbox": ctx.recorder.waiting().0,
            "dropped_waiting": ctx.recorder.waiting().1,
            "dropped_flash_queue": ctx.recorder.dropped(),
            "acks_withheld": snap.acks_withheld,
        },
        "resend": resend_view(ctx),
        "leases": snap.leases.len(),
        "site_actions": actions_view(&snap.actions),
        "gpus_expected": ctx.expected_gpus,
        "gpus_missing": ctx.gpus_missing(snap.gpus.len()),
        "xids": {
            "queued": snap.xids_queued,
            "dropped": snap.xids_dropped,
            "capacity": crate::xid_queue::XID_QUEUE_CAPACITY,
            "watch_down_since": snap.xid_watch_down.map(|t| t.0),
        },
        "stalled_since": snap.stalled_since.map(|t| t.0),
        "cooling_loss": cooling_view(snap),
        "sample_calls": {
            "slowest_last_ms": snap.gpus.iter().map(|g| g.calls.last_us).max().unwrap_or(0) as f64 / 1000.0,
            "longest_ms": snap.gpus.iter().map(|g| g.calls.max_us).max().unwrap_or(0) as f64 / 1000.0,
            "late": snap.gpus.iter().map(|g| g.calls.late).sum::<u64>(),
        },
        "health": {
            "healthy": count_health(snap, HealthState::Healthy),
            "degraded": count_health(snap, HealthState::Degraded),
            "quarantined": count_health(snap, HealthState::Quarantined),
        },
        "flash": ctx.flash_path.clone().unwrap_or_else(|| "memory (not kept)".into()),
        "demo_key": ctx.demo_key,
    })
}

/// The site's commands run, and the last that failed.
fn actions_view(a: &crate::console::SiteActions) -> Value {
    json!({
        "quarantine": { "ok": a.quarantine_ok, "failed": a.quarantine_failed },
        "cooling_loss": { "ok": a.cooling_ok, "failed": a.cooling_failed },
        "last_failure": a.last_failure.as_ref().map(|f| json!({
            "at": f.at.0,
            "what": f.what,
            "program": f.program,
            "detail": f.detail,
        })),
    })
}

/// Readers' requests to resend logged events, by outcome, and the frames
/// resent.
fn resend_view(ctx: &Context) -> Value {
    json!(ctx.resends())
}

/// The cooling-loss phase, its time as a wall-clock stamp.
fn cooling_view(snap: &Snapshot) -> Value {
    use node_core::cooling_loss::Phase;
    let wall = |t: u64| t.saturating_add_signed(snap.wall_offset_ms);
    match snap.cooling {
        Phase::Cooled => json!({"phase": "cooled", "since": null}),
        Phase::Draining { since } => json!({"phase": "draining", "since": wall(since)}),
        Phase::PoweredDown { since } => json!({"phase": "powered_down", "since": wall(since)}),
    }
}

fn count_health(snap: &Snapshot, state: HealthState) -> usize {
    snap.gpus
        .iter()
        .filter(|g| g.health.as_ref().is_some_and(|h| h.state == state))
        .count()
}

fn gpus_view(snap: &Snapshot) -> Vec<Value> {
    snap.gpus
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
                "health": g.health.as_ref().map(|h| h.state),
                "reason": g.health.as_ref().map(|h| h.reason),
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
                "call_ms": {
                    "last": g.calls.last_us as f64 / 1000.0,
                    "max": g.calls.max_us as f64 / 1000.0,
                },
                "late_answers": g.calls.late,
                "nvlink_links_read": s.nvlink_links.read,
            })
        })
        .collect()
}

fn caps_view(snap: &Snapshot, now: TimestampMs) -> Value {
    let gpus: Vec<Value> = snap
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
                "ceiling": g.ceiling.0,
                "default": g.info.default_limit.0,
                "guard": g.guard_cap.map(|w| w.0),
            })
        })
        .collect();
    let leases: Vec<Value> = snap
        .leases
        .iter()
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

async fn events_view(ctx: &Context, since: u64) -> Value {
    let read = match ctx.recorder.read().await {
        Ok(r) => r,
        Err(e) => return json!({ "error": format!("reading the event log: {e}") }),
    };
    let mut events = Vec::new();
    for r in read.entries.iter().filter(|r| r.time.0 >= since) {
        if r.kind == loopwarden_store::resend::PUBLISHED {
            continue; // an event's frame number: bookkeeping for resends
        }
        if r.kind == CONSOLE_RECORD {
            events.push(loopwarden_field::serial::record::entry(
                r.seq, r.time.0, &r.body,
            ));
            continue;
        }
        let (what, text) = if r.kind == MessageKind::Event as u8 {
            match Message::decode_body(MessageKind::Event, &r.body) {
                Ok(Message::Event(e)) => (
                    serde_json::to_value(&e).unwrap_or(Value::Null),
                    e.to_string(),
                ),
                _ => (json!("undecodable event"), "undecodable event".into()),
            }
        } else if r.kind == MessageKind::CapLease as u8
            || r.kind == MessageKind::QuarantineRelease as u8
        {
            match Frame::decode(&r.body) {
                Ok(f) => command(&f),
                Err(e) => (
                    json!(format!("undecodable command: {e}")),
                    format!("undecodable command: {e}"),
                ),
            }
        } else {
            let what = format!("record of kind {}", r.kind);
            (json!(what), what)
        };
        events.push(json!({ "seq": r.seq, "time_ms": r.time.0, "event": what, "text": text }));
    }
    json!({ "events": events, "queued_for_flash": read.queued })
}

/// A command kept in the event log: as `{name: {from, seq, body}}` (the
/// body without its signature) and as a sentence.
fn command(f: &Frame) -> (Value, String) {
    let from = format!("{}/{}", f.sender.role.as_str(), f.sender.id.as_str());
    let (name, mut body, text) = match &f.message {
        Message::CapLease(l) => ("lease_taken", serde_json::to_value(l), l.to_string()),
        Message::QuarantineRelease(q) => ("release_taken", serde_json::to_value(q), q.to_string()),
        other => (
            "command_taken",
            Ok(Value::Null),
            other.kind().name().to_string(),
        ),
    };
    if let Ok(Value::Object(o)) = &mut body {
        o.remove("auth");
    }
    let json = json!({ name: { "from": from, "seq": f.seq, "body": body.unwrap_or(Value::Null) }});
    (json, format!("{text} (from {from}, seq {})", f.seq))
}

fn why(snap: &Snapshot, now: TimestampMs, gpu: u8) -> Value {
    let Some(g) = snap.gpus.get(gpu as usize) else {
        return json!({ "error": format!("no GPU {gpu}: this host has {}", snap.gpus.len()) });
    };
    let s = g.last.unwrap_or_default();
    let h = g.health.clone().expect("one status per GPU");
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
    // Said while the GPU is quarantined: once released, nothing runs
    // again for it, and there is nothing to drain.
    if let (Some(failed), HealthState::Quarantined) = (&g.action_failed, h.state) {
        notes.push(format!(
            "a quarantine action {failed}: the scheduler may not know; drain the GPU by hand (the actions run again at the next start)"
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
                "cause": entry.map(|e| e.cause.to_string()),
                "name": entry.map(|e| e.mnemonic),
                "meaning": entry.map(|e| e.meaning),
                "action": entry.map(|e| e.action.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::snapshot::test_view;

    /// A failed quarantine action is noted in `why` while the GPU is
    /// quarantined; once it is released nothing runs again and nothing is
    /// to be drained, so the note goes.
    #[test]
    fn a_failed_action_is_noted_only_while_the_gpu_is_quarantined() {
        let mut g = test_view();
        g.action_failed = Some("/usr/bin/scontrol failed: exit 1: Invalid node name".into());
        let note = |g: &crate::console::GpuView| {
            let snap = Snapshot {
                gpus: vec![g.clone()],
                ..Snapshot::default()
            };
            why(&snap, TimestampMs(1_700_000_100_000), 0)["notes"].to_string()
        };
        if let Some(h) = g.health.as_mut() {
            h.state = HealthState::Quarantined;
        }
        assert!(note(&g).contains("drain the GPU by hand"), "{}", note(&g));
        for state in [HealthState::Healthy, HealthState::Degraded] {
            if let Some(h) = g.health.as_mut() {
                h.state = state;
            }
            assert!(!note(&g).contains("quarantine action"), "{}", note(&g));
        }
    }
}

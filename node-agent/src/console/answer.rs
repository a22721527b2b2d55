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
use crate::gpu::GpuSample;

fn ms_ago(now: TimestampMs, t: TimestampMs) -> f64 {
    now.0.saturating_sub(t.0) as f64 / 1000.0
}

/// Answers one console request, at most 10 s after it came, once the loop
/// has published its first snapshot; before that, that the agent is
/// still starting.
pub async fn answer(ctx: &Context, req: Request) -> Value {
    match tokio::time::timeout(Duration::from_secs(10), answer_now(ctx, req)).await {
        Ok(v) => v,
        Err(_) => {
            let sampled = ctx.snapshot.borrow().is_some();
            unanswered(sampled, ctx.started, now_ms())
        }
    }
}

/// The error of a request not answered in 10 s, at `now`: the agent
/// started at `started` is still starting while its loop has published
/// no snapshot (`sampled` false: its start waits, as on a held quarantine
/// or the GPUs' first limits), else it did not answer.
fn unanswered(sampled: bool, started: TimestampMs, now: TimestampMs) -> Value {
    if sampled {
        return json!({ "error": "the agent did not answer in 10 s" });
    }
    json!({ "error": format!(
        "the agent is still starting ({:.0} s since start): no sampling round yet",
        ms_ago(now, started)
    ) })
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
        Request::Gpus => json!({ "gpus": gpus_view(&snap, now) }),
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
        "last_round": round_view(snap, ctx.period, ms_ago(now, ctx.started)),
        "samples": t.samples,
        "jitter_ms": jitter_view(t),
        "sample_ms": round_ms_view(t),
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
        "sample_calls": sample_calls_view(snap),
        "health": {
            "healthy": count_health(snap, HealthState::Healthy),
            "degraded": count_health(snap, HealthState::Degraded),
            "quarantined": count_health(snap, HealthState::Quarantined),
        },
        "flash": ctx.flash_path.clone().unwrap_or_else(|| "memory (not kept)".into()),
        // Config values (quarantines, limits, the cooling phase, replay
        // floors) the flash refused to keep: a restart may forget them.
        "flash_refused": ctx.recorder.refused().max(snap.flash_refused),
        "flash_refused_at": snap.flash_refused_at.map(|t| t.0),
        "config_lost": snap.config_lost.as_ref().map(|c| json!({
            "waiting_for": c.waiting_for,
            "phase_unknown": c.phase_unknown,
            "phase_not_kept": c.phase_not_kept,
            "not_kept": c.not_kept,
            "stays": c.stays,
            "clearing": c.clearing,
        })),
        "stale_indexes": snap.stale_indexes.iter()
            .map(|(gpu, was)| json!({"gpu": gpu, "was": was}))
            .collect::<Vec<_>>(),
        "demo_key": ctx.demo_key,
        "protection_off": protection_off_view(&ctx.protection_off),
    })
}

/// How late the sampling tick ran, ms: the last, the window's p50 and
/// p99, the most since the start; null before the first round (not
/// measured, never a 0 that reads as a punctual loop).
fn jitter_view(t: &super::Timing) -> Value {
    let ran = t.samples > 0;
    let ms = |us: u64| ran.then_some(us as f64 / 1000.0);
    let window = |p: f64| (!t.jitter_us.is_empty()).then(|| t.jitter_percentile(p) as f64 / 1000.0);
    json!({
        "last": ms(t.last_jitter_us),
        "p50": window(50.0),
        "p99": window(99.0),
        "max": ms(t.max_jitter_us),
        "window": t.jitter_us.len(),
    })
}

/// How long a sampling round took, ms: the last and the longest; null
/// before the first round.
fn round_ms_view(t: &super::Timing) -> Value {
    let ms = |us: u64| (t.samples > 0).then_some(us as f64 / 1000.0);
    json!({ "last": ms(t.last_sample_us), "max": ms(t.max_sample_us) })
}

/// How old the last sampling round is (`age_s`, null before the first),
/// and whether that is past two periods and a deadline (`stale`): the
/// loop is stuck, and what the console shows is that old. Before the
/// first round, `uptime_s` past that is stale too.
fn round_view(snap: &Snapshot, period: Duration, uptime_s: f64) -> Value {
    let after = 2.0 * period.as_secs_f64() + snap.deadline.as_secs_f64();
    let age = snap.timing.last_round_at.map(|t| t.elapsed().as_secs_f64());
    json!({
        "age_s": age,
        "stale_after_s": after,
        "stale": age.unwrap_or(uptime_s) > after,
    })
}

/// How long the GPUs' calls take: the slowest last sample call, the
/// longest since the start, the late answers, and each call in flight past
/// the deadline (`stuck`: a GPU whose driver does not answer shows here
/// while its call hangs, long before it ends). The slowest and the longest
/// are null while a GPU has had no sample call end since the start
/// (`never_answered` names them): its time is not known, and may be the
/// slowest, so no 0 reads as the fastest.
fn sample_calls_view(snap: &Snapshot) -> Value {
    let ms = |us: u64| us as f64 / 1000.0;
    let deadline_us = snap.deadline.as_micros() as u64;
    let never: Vec<usize> = (snap.gpus.iter().enumerate())
        .filter(|(_, g)| g.calls.known_last_us().is_none())
        .map(|(i, _)| i)
        .collect();
    // Known only when every GPU's is (and there is a GPU).
    let slowest = |us: fn(&crate::worker::CallTimes) -> Option<u64>| {
        let all: Option<Vec<u64>> = snap.gpus.iter().map(|g| us(&g.calls)).collect();
        all.and_then(|all| all.into_iter().max()).map(ms)
    };
    let stuck: Vec<Value> = snap
        .gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.calls.running_us > deadline_us)
        .map(|(i, g)| json!({ "gpu": i, "running_ms": ms(g.calls.running_us) }))
        .collect();
    json!({
        "slowest_last_ms": slowest(|c| c.known_last_us()),
        "longest_ms": slowest(|c| c.known_max_us()),
        "never_answered": never,
        "late": snap.gpus.iter().map(|g| g.calls.late).sum::<u64>(),
        "running_ms": ms(snap.gpus.iter().map(|g| g.calls.running_us).max().unwrap_or(0)),
        "deadline_ms": snap.deadline.as_millis() as u64,
        "stuck": stuck,
    })
}

/// The protections switched off on purpose, as `{key, said}`.
fn protection_off_view(off: &[crate::config::OptOut]) -> Value {
    off.iter()
        .map(|o| json!({ "key": o.key, "said": o.said }))
        .collect()
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
        _ if snap.cooling_unknown => json!({"phase": "unknown", "since": null}),
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

/// Every GPU with its last sample's fields: a field is null when the GPU
/// has not answered a sample yet, or its group is not supported by the
/// GPU, never a 0 that would read as a value.
fn gpus_view(snap: &Snapshot, now: TimestampMs) -> Vec<Value> {
    use loopwarden_protocol::Unsupported as U;
    snap.gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let s = g.last.as_ref();
            // The field `f` of the sample, if there is one and it knows
            // the group `group` (`U::empty()`: every GPU reports it).
            let field = |group: U, f: &dyn Fn(&GpuSample) -> Value| {
                s.filter(|s| s.unsupported.bits() & group.bits() == 0)
                    .map_or(Value::Null, f)
            };
            json!({
                "gpu": i,
                "name": g.info.name,
                "uuid": g.info.uuid,
                "responsive": g.responsive,
                "missed": g.missed,
                // How old the values below are: a GPU whose call hangs
                // keeps its last ones until it is found unresponsive.
                "sample_age_s": g.sampled_at.map(|t| ms_ago(now, t)),
                "health": g.health.as_ref().map(|h| h.state),
                "reason": g.health.as_ref().map(|h| h.reason),
                "temp": field(U::empty(), &|s| json!(s.temp.0)),
                "mem_temp": field(U::MEM_TEMP, &|s| json!(s.mem_temp.0)),
                "power": field(U::POWER, &|s| json!(s.power.0)),
                // 0 W: not known (no GPU is limited to 0 W).
                "power_limit": field(U::empty(), &|s| {
                    json!((s.power_limit.0 > 0).then_some(s.power_limit.0))
                }),
                "sm_clock": field(U::CLOCKS, &|s| json!(s.sm_clock.0)),
                "mem_clock": field(U::CLOCKS, &|s| json!(s.mem_clock.0)),
                "util": field(U::UTIL, &|s| json!(s.util.get())),
                "throttle": field(U::THROTTLE, &|s| json!(s.throttle)),
                "ecc": {
                    "sbe_volatile": field(U::ECC, &|s| json!(s.ecc.sbe_volatile)),
                    "dbe_volatile": field(U::ECC, &|s| json!(s.ecc.dbe_volatile)),
                    "sbe_aggregate": field(U::ECC_AGGREGATE, &|s| json!(s.ecc.sbe_aggregate)),
                    "dbe_aggregate": field(U::ECC_AGGREGATE, &|s| json!(s.ecc.dbe_aggregate)),
                },
                "repair": {
                    "retired_sbe": field(U::RETIRED, &|s| json!(s.repair.retired_sbe)),
                    "retired_dbe": field(U::RETIRED, &|s| json!(s.repair.retired_dbe)),
                    "remap_correctable": field(U::REMAP, &|s| json!(s.repair.remap_correctable)),
                    "remap_uncorrectable": field(U::REMAP, &|s| json!(s.repair.remap_uncorrectable)),
                },
                "pcie_replay": field(U::PCIE, &|s| json!(s.pcie_replay)),
                "nvlink": field(U::NVLINK, &|s| json!(s.nvlink)),
                "flags": field(U::empty(), &|s| json!(s.flags)),
                "unsupported": field(U::empty(), &|s| json!(s.unsupported)),
                "call_ms": call_ms(&g.calls, snap.deadline),
                "late_answers": g.calls.late,
                "nvlink_links_read": field(U::NVLINK, &|s| json!(s.nvlink_links.read)),
            })
        })
        .collect()
}

/// A GPU's sample call times, ms: the last and the longest null until a
/// call ended (never a 0 that reads as the fastest), the call in flight
/// null when idle, and whether it has run past the deadline.
fn call_ms(c: &crate::worker::CallTimes, deadline: Duration) -> Value {
    let ms = |us: u64| us as f64 / 1000.0;
    json!({
        "last": c.known_last_us().map(ms),
        "max": c.known_max_us().map(ms),
        "running": (c.running_us > 0).then_some(c.running_us as f64 / 1000.0),
        "stuck": c.running_us > deadline.as_micros() as u64,
    })
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
                // null where NVML did not give it (the board's stands in).
                "default": (g.info.default_limit != crate::nvml::UNREAD_LIMIT)
                    .then_some(g.info.default_limit.0),
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
    let events: Vec<Value> = (read.entries.iter())
        .filter(|r| r.time.0 >= since)
        .filter_map(entry_view)
        .collect();
    json!({ "events": events, "queued_for_flash": read.queued })
}

/// One event-log record as `ctl events` shows it: `{seq, time_ms, event,
/// text}`; `None` for the resender's bookkeeping (an event's frame
/// number).
fn entry_view(r: &loopwarden_store::recorder::Entry) -> Option<Value> {
    if r.kind == loopwarden_store::resend::PUBLISHED {
        return None;
    }
    if r.kind == CONSOLE_RECORD {
        return Some(loopwarden_field::serial::record::entry(
            r.seq, r.time.0, &r.body,
        ));
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
    } else if r.kind == loopwarden_flash::log::WRAPPED {
        match loopwarden_flash::Wrapped::decode(&r.body) {
            Some(w) => (
                json!({ "wrapped": {
                    "lost": w.lost, "first_seq": w.first_seq, "last_seq": w.last_seq,
                }}),
                w.to_string(),
            ),
            None => (
                json!("undecodable wrap marker"),
                "undecodable wrap marker".into(),
            ),
        }
    } else {
        let what = format!("record of kind {}", r.kind);
        (json!(what), what)
    };
    Some(json!({ "seq": r.seq, "time_ms": r.time.0, "event": what, "text": text }))
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
    let by = g.source.map(|src| {
        serde_json::to_value(src)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    });
    match (g.applied, by) {
        (Some(w), Some(by)) => notes.push(format!("power capped to {} W by {by}", w.0)),
        (Some(_), None) => {}
        (None, Some(by)) => notes.push(format!(
            "power limit not confirmed: the read-back failed (the cap was asked by {by}); the GPU may hold the cap asked or the limit before it"
        )),
        (None, None) => notes.push(
            "power limit not confirmed: the read-back failed; the GPU may hold the limit asked or the one before it".to_string(),
        ),
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
        "limit_confirmed": g.applied.is_some(),
        "cap_source": g.source,
        "notes": notes,
        "recent_xids": xids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::snapshot::test_view;

    /// A request before the loop's first snapshot says the agent is
    /// still starting, and since when; after it, that it did not answer.
    #[test]
    fn a_request_before_the_first_sampling_round_says_the_agent_is_starting() {
        let started = TimestampMs(1_800_000_000_000);
        let v = unanswered(false, started, TimestampMs(started.0 + 42_400));
        assert_eq!(
            v["error"], "the agent is still starting (42 s since start): no sampling round yet",
            "{v}"
        );
        let v = unanswered(true, started, TimestampMs(started.0 + 42_400));
        assert_eq!(v["error"], "the agent did not answer in 10 s", "{v}");
    }

    /// A GPU never sampled shows no value as a live one: every sample
    /// field is null; an unsupported group is null, the others are read.
    /// The log's marker of records recycled for room says so, with the
    /// numbers lost, not "record of kind 240".
    #[test]
    fn a_wrap_marker_says_how_many_records_were_recycled() {
        let w = loopwarden_flash::Wrapped {
            lost: 15,
            first_seq: 30,
            last_seq: 44,
        };
        let mut body = Vec::new();
        for n in [w.lost, w.first_seq, w.last_seq] {
            body.extend_from_slice(&n.to_le_bytes());
        }
        let entry = loopwarden_store::recorder::Entry {
            seq: 45,
            time: TimestampMs(1_800_000_000_000),
            kind: loopwarden_flash::log::WRAPPED,
            body,
        };
        let v = entry_view(&entry).expect("shown");
        let text = v["text"].as_str().unwrap();
        assert!(
            text.contains("recycled") && text.contains("#30 to #44"),
            "{v}"
        );
        assert!(!text.contains("record of kind"), "{v}");
        assert_eq!(
            v["event"]["wrapped"],
            json!({"lost": 15, "first_seq": 30, "last_seq": 44}),
            "{v}"
        );
        // A marker cut short is said undecodable, not taken for another.
        let short = loopwarden_store::recorder::Entry {
            body: vec![1, 2, 3],
            ..entry
        };
        let v = entry_view(&short).expect("shown");
        assert_eq!(v["text"], "undecodable wrap marker", "{v}");
    }

    #[test]
    fn gpus_show_null_for_no_sample_and_for_unsupported_groups() {
        let mut g = test_view();
        g.last = None;
        g.sampled_at = None;
        let snap = Snapshot {
            gpus: vec![g],
            ..Snapshot::default()
        };
        let v = &gpus_view(&snap, TimestampMs(1_700_000_002_500))[0];
        assert!(v["temp"].is_null(), "{v}");
        for f in [
            "power",
            "power_limit",
            "mem_temp",
            "sm_clock",
            "util",
            "throttle",
            "pcie_replay",
            "nvlink",
            "flags",
            "unsupported",
        ] {
            assert!(v[f].is_null(), "{f}: {v}");
        }
        assert!(v["ecc"]["sbe_volatile"].is_null(), "{v}");
        assert!(v["repair"]["retired_dbe"].is_null(), "{v}");
        assert!(v["sample_age_s"].is_null(), "{v}");
        let snap = Snapshot {
            gpus: vec![test_view()],
            ..Snapshot::default()
        };
        let v = &gpus_view(&snap, TimestampMs(1_700_000_002_500))[0];
        assert_eq!(v["temp"], 71, "{v}");
        assert_eq!(v["power"], 650, "{v}");
        assert_eq!(v["ecc"]["sbe_volatile"], 0, "{v}");
        // NVLink and HBM temperature are not supported by this GPU.
        assert!(v["nvlink"].is_null() && v["mem_temp"].is_null(), "{v}");
        assert!(v["nvlink_links_read"].is_null(), "{v}");
        // Its values are dated: got 2.5 s before the question.
        assert_eq!(v["sample_age_s"], 2.5, "{v}");
    }

    /// A refusal of the flash is dated to the step that first saw it, and
    /// keeps that date until another comes.
    #[test]
    fn a_flash_refusal_is_dated_to_the_step_that_saw_it() {
        let mut snap = Snapshot::default();
        assert_eq!(snap.flash_refused_since(0, TimestampMs(5)), None);
        snap.flash_refused_at = snap.flash_refused_since(1, TimestampMs(10));
        snap.flash_refused = 1;
        assert_eq!(snap.flash_refused_at, Some(TimestampMs(10)));
        assert_eq!(
            snap.flash_refused_since(1, TimestampMs(20)),
            Some(TimestampMs(10))
        );
        assert_eq!(
            snap.flash_refused_since(3, TimestampMs(30)),
            Some(TimestampMs(30))
        );
    }

    /// A loop that has not run a round for more than two periods and a
    /// deadline is stale, and says how old its last round is.
    #[test]
    fn a_loop_without_a_round_for_two_periods_is_stale() {
        let ago = |s: u64| std::time::Instant::now().checked_sub(Duration::from_secs(s));
        let snap = |last: Option<std::time::Instant>| Snapshot {
            timing: crate::console::Timing {
                last_round_at: last,
                ..Default::default()
            },
            deadline: Duration::from_millis(250),
            ..Snapshot::default()
        };
        let period = Duration::from_secs(1);
        let v = round_view(&snap(ago(30)), period, 100.0);
        assert_eq!(v["stale"], true, "{v}");
        assert!(v["age_s"].as_f64().unwrap() >= 30.0, "{v}");
        assert_eq!(v["stale_after_s"], 2.25, "{v}");
        let v = round_view(&snap(ago(1)), period, 100.0);
        assert_eq!(v["stale"], false, "{v}");
        // No round yet: stale once the agent has run that long without one.
        assert_eq!(round_view(&snap(None), period, 1.0)["stale"], false);
        let v = round_view(&snap(None), period, 10.0);
        assert!(v["stale"] == true && v["age_s"].is_null(), "{v}");
    }

    /// A GPU whose call hangs shows in the status as stuck, with how long
    /// its call has run, while the others' calls end in time.
    #[test]
    fn a_call_running_past_the_deadline_is_stuck() {
        let mut hung = test_view();
        hung.calls.last_us = 400;
        hung.calls.ended = 1;
        hung.calls.running_us = 184_000_000;
        let mut fine = test_view();
        fine.calls.ended = 1;
        fine.calls.running_us = 300;
        let snap = Snapshot {
            gpus: vec![fine, hung],
            deadline: Duration::from_millis(500),
            ..Snapshot::default()
        };
        let v = sample_calls_view(&snap);
        assert_eq!(v["slowest_last_ms"], 0.4, "{v}");
        assert_eq!(v["running_ms"], 184_000.0, "{v}");
        assert_eq!(
            v["stuck"],
            json!([{"gpu": 1, "running_ms": 184_000.0}]),
            "{v}"
        );
        let snap = Snapshot {
            gpus: vec![test_view()],
            deadline: Duration::from_millis(500),
            ..Snapshot::default()
        };
        assert_eq!(sample_calls_view(&snap)["stuck"], json!([]));
    }

    /// Before the first sampling round (a loop stuck in it: the status is
    /// stale), the round's time and the tick's jitter are not known: `-`,
    /// not 0 ms; after it, they are the round's.
    #[test]
    fn status_shows_no_round_time_or_jitter_before_the_first_round() {
        let mut t = crate::console::Timing::default();
        let render = |t: &crate::console::Timing| {
            let v = json!({ "jitter_ms": jitter_view(t), "sample_ms": round_ms_view(t), "samples": t.samples });
            (
                v.clone(),
                crate::console::render::render(&Request::Status, &v),
            )
        };
        let (v, text) = render(&t);
        for k in ["last", "max"] {
            assert!(v["sample_ms"][k].is_null(), "{v}");
        }
        for k in ["last", "p50", "p99", "max"] {
            assert!(v["jitter_ms"][k].is_null(), "{v}");
        }
        let row = |text: &str, name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} row in\n{text}"))
                .to_string()
        };
        assert!(
            row(&text, "sampling ").ends_with("0 samples; last took -"),
            "{text}"
        );
        assert!(
            row(&text, "jitter ").ends_with("last -, p50 -, p99 -, max - (last 0 ticks)"),
            "{text}"
        );
        t.samples = 1;
        t.last_sample_us = 983;
        t.max_sample_us = 983;
        t.last_jitter_us = 1285;
        t.max_jitter_us = 1285;
        t.jitter_us.push_back(1285);
        let (_, text) = render(&t);
        assert!(
            row(&text, "sampling ").ends_with("1 samples; last took 0.983 ms"),
            "{text}"
        );
        assert!(
            row(&text, "jitter ").ends_with(
                "last 1.285 ms, p50 1.285 ms, p99 1.285 ms, max 1.285 ms (last 1 ticks)"
            ),
            "{text}"
        );
    }

    /// `ctl status` never shows a GPU whose first sample call never ended
    /// as the fastest: while one GPU has not answered since the start, the
    /// slowest last call and the longest are not known (`-`, not 0 ms) and
    /// the GPU is named; once it answered, the times are the GPUs' again.
    #[test]
    fn status_shows_no_call_time_while_a_gpu_never_answered() {
        let mut hung = test_view();
        hung.calls = crate::worker::CallTimes {
            running_us: 184_000_000,
            ..Default::default()
        };
        let mut fine = test_view();
        fine.calls = crate::worker::CallTimes {
            last_us: 400,
            max_us: 900,
            ended: 5,
            ..Default::default()
        };
        let snap = |gpus: Vec<crate::console::GpuView>| Snapshot {
            gpus,
            deadline: Duration::from_millis(500),
            ..Snapshot::default()
        };
        let v = sample_calls_view(&snap(vec![fine.clone(), hung.clone()]));
        assert!(
            v["slowest_last_ms"].is_null() && v["longest_ms"].is_null(),
            "{v}"
        );
        assert_eq!(v["never_answered"], json!([1]), "{v}");
        let text = crate::console::render::render(&Request::Status, &json!({ "sample_calls": v }));
        let row = text
            .lines()
            .find(|l| l.starts_with("GPU calls "))
            .unwrap_or_else(|| panic!("no GPU calls row in\n{text}"));
        assert!(
            row.contains("slowest last -, longest -,") && row.contains("never answered: GPU 1"),
            "{row}"
        );
        assert!(
            !row.contains("last 0") && !row.contains("longest 0"),
            "{row}"
        );
        // Before any GPU answered (the start): not known either.
        let v = sample_calls_view(&snap(vec![hung.clone(), hung.clone()]));
        assert!(v["slowest_last_ms"].is_null(), "{v}");
        assert_eq!(v["never_answered"], json!([0, 1]), "{v}");
        // It answered: its time counts, and nothing is said of it.
        hung.calls = crate::worker::CallTimes {
            last_us: 184_000_000,
            max_us: 184_000_000,
            ended: 1,
            ..Default::default()
        };
        let v = sample_calls_view(&snap(vec![fine, hung]));
        assert_eq!(v["slowest_last_ms"], 184_000.0, "{v}");
        assert_eq!(v["longest_ms"], 184_000.0, "{v}");
        assert_eq!(v["never_answered"], json!([]), "{v}");
        let text = crate::console::render::render(&Request::Status, &json!({ "sample_calls": v }));
        assert!(
            text.contains("slowest last 184000.0 ms, longest 184000.0 ms,")
                && !text.contains("never answered"),
            "{text}"
        );
    }

    /// `ctl gpus` never shows a GPU whose first call hangs as the
    /// fastest: its call times are not known (`-`, not `0.0/0.0`) until a
    /// call ended, and its call running past the deadline is shown, with
    /// how long it has run.
    #[test]
    fn gpus_show_a_call_running_past_the_deadline_and_no_time_before_one_ended() {
        let mut hung = test_view();
        hung.calls = crate::worker::CallTimes {
            running_us: 184_000_000,
            ..Default::default()
        };
        let snap = Snapshot {
            gpus: vec![hung, test_view()],
            deadline: Duration::from_millis(500),
            ..Snapshot::default()
        };
        let v = json!({ "gpus": gpus_view(&snap, TimestampMs(1_700_000_002_500)) });
        assert!(v["gpus"][0]["call_ms"]["last"].is_null(), "{v}");
        let text = crate::console::render::render(&Request::Gpus, &v);
        let rows: Vec<&str> = text.lines().collect();
        assert!(!text.contains("0.0/0.0"), "{text}");
        assert!(rows[1].contains("running 184.0 s"), "{text}");
        assert!(!rows[2].contains("running"), "{text}");
    }

    /// A limit whose read-back failed is said to be not confirmed, with
    /// who asked; never a cap of 0 W.
    #[test]
    fn why_says_a_limit_not_read_back_is_not_confirmed_and_who_asked() {
        let mut g = test_view();
        let snap = |g: &crate::console::GpuView| Snapshot {
            gpus: vec![g.clone()],
            ..Snapshot::default()
        };
        let now = TimestampMs(1_700_000_100_000);
        let v = why(&snap(&g), now, 0);
        assert!(
            v["notes"]
                .to_string()
                .contains("power capped to 500 W by cooling"),
            "{v}"
        );
        assert_eq!(v["limit_confirmed"], true);
        g.applied = None;
        let v = why(&snap(&g), now, 0);
        let notes = v["notes"].to_string();
        assert!(!notes.contains("capped to"), "{notes}");
        assert!(
            notes.contains(
                "power limit not confirmed: the read-back failed (the cap was asked by cooling)"
            ),
            "{notes}"
        );
        assert!(v["limit"].is_null(), "{v}");
        assert_eq!(v["limit_confirmed"], false);
    }

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

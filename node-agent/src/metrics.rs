//! The host agent's Prometheus metrics (`metrics_listen`): the GPU fields
//! it shares with dcgm-exporter under DCGM's names ([`dcgm`]), and its own
//! as `loopwarden_*`: each GPU's health, cap and responsiveness, the
//! leases, the sampling loop's timing, the XID watch and queue, the bus,
//! the flash recorder and the resends of logged events.
//!
//! Rendered from the console's [`Context`] and the loop's last
//! [`Snapshot`], copied out of its watch channel
//! first: a scrape never reaches into the loop, and holds nothing the loop
//! waits for. `docs/node-agent.md` ("Metrics") lists every metric.
//!
//! Labels: every series has `Hostname` (the agent's host id); a GPU's
//! DCGM series have dcgm-exporter's `gpu` (index), `UUID`, `device`
//! (`nvidia<index>`) and `modelName` besides, its `loopwarden_gpu_*`
//! series `gpu` and `UUID`.
//!
//! Glossary:
//! - *state set*: one series per possible state, 1 for the state held and
//!   0 for the others (`loopwarden_gpu_health_state{state="degraded"}`).

use std::net::SocketAddr;

use loopwarden_bus::prometheus::{
    self, with_labels, write_bus, write_recorder, Exposition, Metric,
};
use loopwarden_field::listen::bind_retrying;
use loopwarden_protocol::{CapSource, HealthState};
use tokio::task::JoinHandle;

use crate::config::GpuSourceKind;
use crate::console::{Context, GpuView, Snapshot};

pub mod dcgm;

const INFO: Metric = Metric::gauge(
    "loopwarden_agent_info",
    "Always 1; the labels say the agent's site, software version and GPU source.",
);
const PROTECTION_OFF: Metric = Metric::gauge(
    "loopwarden_protection_off",
    "1 for each protection switched off on purpose in the configuration, or found off at start (persistence mode off on a real GPU, not opted out); key names the setting (commands, cooling, cooling_loss.actions, cooling_loss.grace_s, volatile_state, persistence, quarantine.reported_only). Absent while every protection is on.",
);
const STARTED: Metric = Metric::gauge(
    "loopwarden_agent_start_time_seconds",
    "When the agent started, seconds since the Unix epoch.",
);
const SAMPLES: Metric = Metric::counter(
    "loopwarden_samples_total",
    "Sampling rounds run since the agent started.",
);
const JITTER: Metric = Metric::gauge(
    "loopwarden_sampling_jitter_seconds",
    "How late sampling ticks ran against their schedule, seconds: stat=last (the last tick), p50 and p99 (over the last 600 ticks), max (since the start). Absent before the first round.",
);
const LAST_ROUND: Metric = Metric::gauge(
    "loopwarden_last_round_timestamp_seconds",
    "When the last sampling round ended, seconds since the Unix epoch: time() minus this is the age of every other value here; past two periods, the agent's loop is stuck. Absent before the first round.",
);
const ROUND: Metric = Metric::gauge(
    "loopwarden_sampling_round_seconds",
    "How long a sampling round of every GPU took, seconds: stat=last or max (since the start). Absent before the first round.",
);
const STALLED: Metric = Metric::gauge(
    "loopwarden_host_stalled",
    "1 while every GPU of the host is silent together (a driver or host stall), else 0.",
);
const XID_WATCH_UP: Metric = Metric::gauge(
    "loopwarden_xid_watch_up",
    "1 while the driver's XID watch runs, 0 while it is down (XIDs are then not seen).",
);
const XID_QUEUED: Metric = Metric::gauge(
    "loopwarden_xid_queue_depth",
    "XID events waiting in the bounded queue between the driver's watch and the loop.",
);
const XID_DROPPED: Metric = Metric::counter(
    "loopwarden_xid_queue_dropped_total",
    "XID events the bounded queue dropped in storms since the agent started.",
);
const ACKS_WITHHELD: Metric = Metric::counter(
    "loopwarden_acks_withheld_total",
    "Acks to refused commands not sent, over a sender's rate (10 in a row, then one a second): a flood on the host's cmd topic.",
);
const COOLING: Metric = Metric::gauge(
    "loopwarden_cooling_loss_phase",
    "Where the host is in a cooling loss, as a state set: 1 for its phase (unknown, cooled, draining, powered_down), 0 for the others; unknown: the phase kept before a restart could not be read back and the CDU has not said since.",
);
const CALL: Metric = Metric::gauge(
    "loopwarden_gpu_sample_call_seconds",
    "How long the GPU's sample call took: stat last, or max since the start, both absent until a sample call ended (a GPU that never answered); stat running: how long the call in flight (a sample or a limit call) has run so far, 0 when idle (above deadline_ms: the GPU does not answer).",
);
const LATE: Metric = Metric::counter(
    "loopwarden_gpu_late_answers_total",
    "Samples that answered after the deadline and were used a round later.",
);
const ACTIONS: Metric = Metric::counter(
    "loopwarden_site_actions_total",
    "The site's commands the agent ran since it started, by kind (quarantine, cooling_loss) and result (ok, failed: an exit status other than 0, a timeout, or a program that could not start).",
);
const ACTION_FAILED_AT: Metric = Metric::gauge(
    "loopwarden_site_action_last_failure_timestamp_seconds",
    "When the last of the site's commands that failed ended, seconds since the Unix epoch. Absent while none failed since the start, or once a later run of the one that failed ended well.",
);
const MISSING: Metric = Metric::gauge(
    "loopwarden_gpus_missing",
    "GPUs of expected_gpus not found at the start (failed the driver's probe, or off the bus since before it loaded). Absent when expected_gpus is not set.",
);
const FLASH_REFUSED: Metric = Metric::counter(
    "loopwarden_flash_config_refused_total",
    "Config values (replay floors, limits, health states, the cooling-loss phase) the flash refused to keep: full, worn or an I/O error. Each is logged at error; above 0, a restart may forget what they held.",
);
const CONFIG_LOST: Metric = Metric::gauge(
    "loopwarden_config_store_lost",
    "1 for each thing the lost mark of a config store found lost at this start still waits for, by waiting_for: gpu_uuid (with gpu: a GPU whose UUID was unknown at the start, not said since), cooling_phase (the CDU's word, or the phase it decided not yet handed to the flash), gpu_record (with gpu: its records not kept, its limits when it said its UUID or its health state: the mark stays for this run), this_run (what the start took back not kept: the mark stays for this run), clear (all kept, the clear under way). A single series without waiting_for, 0, when the store was found intact or its mark is cleared. Till it clears every restart reads the store as lost.",
);
const LEASES: Metric = Metric::gauge(
    "loopwarden_leases_active",
    "Power-cap leases held now (from the cooling controller, a facility budget or an operator).",
);
const HEALTH: Metric = Metric::gauge(
    "loopwarden_gpu_health_state",
    "The GPU's health as a state set: 1 for the state it is in (healthy, degraded, quarantined), 0 for the others.",
);
const REASON: Metric = Metric::gauge(
    "loopwarden_gpu_health_reason_code",
    "The reason code of the GPU's health state (0 ok, 1-999 an XID, 1000 and up a rule; docs/health.md).",
);
const SINCE: Metric = Metric::gauge(
    "loopwarden_gpu_health_changed_timestamp_seconds",
    "When the GPU entered its health state, seconds since the Unix epoch.",
);
const RESPONSIVE: Metric = Metric::gauge(
    "loopwarden_gpu_responsive",
    "1 when the GPU answered its last sample within the deadline, else 0.",
);
const SAMPLED: Metric = Metric::gauge(
    "loopwarden_gpu_last_sample_timestamp_seconds",
    "When the agent last got a sample from the GPU, seconds since the Unix epoch; its fields in the DCGM series are that sample's (time() minus this is their age). Absent before the first.",
);
const MISSED: Metric = Metric::gauge(
    "loopwarden_gpu_missed_samples",
    "Samples the GPU has missed in a row (0 when it answers).",
);
const CAP: Metric = Metric::gauge(
    "loopwarden_gpu_cap_watts",
    "The power cap in force on the GPU, read back after setting it, watts; source says who set it. Absent while the GPU runs uncapped, at its ceiling, and while its limit is not confirmed (loopwarden_gpu_cap_confirmed 0).",
);
const CAP_CONFIRMED: Metric = Metric::gauge(
    "loopwarden_gpu_cap_confirmed",
    "1 when the GPU's power limit was read back after the agent's last set (or at start), 0 while it is not confirmed (the read-back failed: the GPU may hold the cap asked or the limit before it); who asked for the cap is loopwarden_gpu_cap_unconfirmed_asked.",
);
const CAP_ASKED: Metric = Metric::gauge(
    "loopwarden_gpu_cap_unconfirmed_asked",
    "1 while the GPU's limit is not confirmed (loopwarden_gpu_cap_confirmed 0) and a cap was asked, source naming who asked. Absent while confirmed, or when no cap was asked.",
);
const NVML_CALL: Metric = Metric::gauge(
    "loopwarden_nvml_call_seconds",
    "What an NVML call took since the agent started, seconds: stat=mean or max; call is NVML's name for it.",
);
const NVML_CALLS: Metric = Metric::counter(
    "loopwarden_nvml_calls_total",
    "NVML calls made since the agent started, by NVML's name (every GPU together).",
);
const NVML_FAILURES: Metric = Metric::counter(
    "loopwarden_nvml_call_failures_total",
    "NVML calls that failed since the agent started, by NVML's name and the kind of failure (error=not_supported, no_permission, gpu_lost, timeout, invalid_argument, other).",
);
const GUARD: Metric = Metric::gauge(
    "loopwarden_gpu_thermal_guard_cap_watts",
    "The cap the host's own thermal guard asks for, watts. Absent while the guard does not cap.",
);

/// The `/metrics` text for the agent behind `ctx`, as of its last step.
pub fn render(ctx: &Context) -> String {
    // A copy, so the channel is not held while the text is written.
    let snap = ctx.snapshot.borrow().clone();
    let mut out = Exposition::new();
    let host = [("Hostname", ctx.host.as_str())];
    agent(&mut out, ctx, &host);
    if let Some(s) = &snap {
        loop_state(&mut out, s, &host);
        let watched = s.xid_watch_down.is_none();
        for (i, g) in s.gpus.iter().enumerate() {
            gpu(&mut out, &ctx.host, i, g, watched);
        }
        if let Some(n) = ctx.gpus_missing(s.gpus.len()) {
            out.sample(&MISSING, &host, n as f64);
        }
    }
    if let Some(costs) = &ctx.nvml_costs {
        nvml_calls(&mut out, costs, &host);
    }
    write_bus(&mut out, &ctx.bus.metrics(), ctx.bus.is_connected(), &host);
    write_recorder(&mut out, &ctx.recorder, &host);
    out.sample(&FLASH_REFUSED, &host, ctx.recorder.refused() as f64);
    loopwarden_bus::prometheus::write_resend(&mut out, ctx.resends(), &host);
    loopwarden_field::listen::write_metrics(&mut out, "console", &ctx.console_stats, &host);
    out.finish()
}

/// What each NVML call has cost, every GPU together.
fn nvml_calls(out: &mut Exposition, costs: &crate::nvml::CallCosts, host: &[(&str, &str)]) {
    for (call, c) in costs.snapshot() {
        let labels = with_labels(host, &[("call", call)]);
        out.sample(&NVML_CALLS, &labels, c.calls as f64);
        let mean = c.total.as_secs_f64() / c.calls.max(1) as f64;
        for (stat, v) in [("mean", mean), ("max", c.max.as_secs_f64())] {
            out.sample(&NVML_CALL, &with_labels(&labels, &[("stat", stat)]), v);
        }
    }
    for (call, kind, n) in costs.failures() {
        let labels = with_labels(host, &[("call", call), ("error", kind)]);
        out.sample(&NVML_FAILURES, &labels, n as f64);
    }
}

/// What the agent is and since when.
fn agent(out: &mut Exposition, ctx: &Context, host: &[(&str, &str)]) {
    let source = match ctx.gpu_source {
        GpuSourceKind::Nvml => "nvml".to_string(),
        GpuSourceKind::Twin(n) => format!("twin-{n}"),
    };
    let mut info = host.to_vec();
    info.extend([
        ("site", ctx.site.as_str()),
        ("version", env!("CARGO_PKG_VERSION")),
        ("gpu_source", source.as_str()),
    ]);
    out.sample(&INFO, &info, 1.0);
    out.sample(&STARTED, host, ctx.started.0 as f64 / 1000.0);
    protection_off(out, &ctx.protection_off, host);
}

/// One series per protection switched off on purpose.
fn protection_off(out: &mut Exposition, off: &[crate::config::OptOut], host: &[(&str, &str)]) {
    for o in off {
        out.sample(&PROTECTION_OFF, &with_labels(host, &[("key", o.key)]), 1.0);
    }
}

/// The loop's timing, the XID watch and queue, the leases.
fn loop_state(out: &mut Exposition, s: &Snapshot, host: &[(&str, &str)]) {
    let t = &s.timing;
    out.sample(&SAMPLES, host, t.samples as f64);
    let us = |v: u64| v as f64 / 1e6;
    // Not measured before the first round: absent, never a 0.
    if t.samples > 0 {
        for (stat, v) in [
            ("last", t.last_jitter_us),
            ("p50", t.jitter_percentile(50.0)),
            ("p99", t.jitter_percentile(99.0)),
            ("max", t.max_jitter_us),
        ] {
            out.sample(&JITTER, &with_labels(host, &[("stat", stat)]), us(v));
        }
        for (stat, v) in [("last", t.last_sample_us), ("max", t.max_sample_us)] {
            out.sample(&ROUND, &with_labels(host, &[("stat", stat)]), us(v));
        }
    }
    if let Some(at) = t.last_round_at {
        let wall_ms = loopwarden_bus::now_ms().0 as f64 - at.elapsed().as_secs_f64() * 1e3;
        out.sample(&LAST_ROUND, host, wall_ms / 1e3);
    }
    out.flag(&STALLED, host, s.stalled_since.is_some());
    out.flag(&XID_WATCH_UP, host, s.xid_watch_down.is_none());
    out.sample(&XID_QUEUED, host, s.xids_queued as f64);
    out.sample(&XID_DROPPED, host, s.xids_dropped as f64);
    out.sample(&ACKS_WITHHELD, host, s.acks_withheld as f64);
    out.sample(&LEASES, host, s.leases.len() as f64);
    site_actions(out, &s.actions, host);
    config_lost(out, s.config_lost.as_ref(), host);
    use node_core::cooling_loss::Phase;
    let known = !s.cooling_unknown;
    for (name, on) in [
        ("unknown", !known),
        ("cooled", known && matches!(s.cooling, Phase::Cooled)),
        ("draining", matches!(s.cooling, Phase::Draining { .. })),
        (
            "powered_down",
            matches!(s.cooling, Phase::PoweredDown { .. }),
        ),
    ] {
        out.flag(&COOLING, &with_labels(host, &[("phase", name)]), on);
    }
}

/// What the lost mark of a config store found lost still waits for: one
/// series per thing, or one 0 when there is none.
fn config_lost(
    out: &mut Exposition,
    lost: Option<&crate::console::snapshot::ConfigLost>,
    host: &[(&str, &str)],
) {
    let Some(c) = lost else {
        out.sample(&CONFIG_LOST, host, 0.0);
        return;
    };
    let mut waits: Vec<(&str, Option<u8>)> = Vec::new();
    waits.extend(c.waiting_for.iter().map(|&g| ("gpu_uuid", Some(g))));
    let phase = c.phase_unknown || c.phase_not_kept;
    waits.extend(phase.then_some(("cooling_phase", None)));
    waits.extend(c.not_kept.iter().map(|&g| ("gpu_record", Some(g))));
    waits.extend(c.stays.is_some().then_some(("this_run", None)));
    waits.extend(c.clearing.then_some(("clear", None)));
    for (what, gpu) in waits {
        let gpu = gpu.map(|g| g.to_string());
        let mut labels = with_labels(host, &[("waiting_for", what)]);
        if let Some(g) = &gpu {
            labels = with_labels(&labels, &[("gpu", g.as_str())]);
        }
        out.sample(&CONFIG_LOST, &labels, 1.0);
    }
}

/// The site's commands run, by kind and result, and when one last failed.
fn site_actions(out: &mut Exposition, a: &crate::console::SiteActions, host: &[(&str, &str)]) {
    for (kind, result, n) in [
        ("quarantine", "ok", a.quarantine_ok),
        ("quarantine", "failed", a.quarantine_failed),
        ("cooling_loss", "ok", a.cooling_ok),
        ("cooling_loss", "failed", a.cooling_failed),
    ] {
        let labels = with_labels(host, &[("kind", kind), ("result", result)]);
        out.sample(&ACTIONS, &labels, n as f64);
    }
    if let Some(f) = &a.last_failure {
        out.sample(&ACTION_FAILED_AT, host, f.at.0 as f64 / 1000.0);
    }
}

/// GPU `i` of `host`: its DCGM fields and its `loopwarden_gpu_*` series;
/// `xids_watched`: whether the driver's XID watch is up.
fn gpu(out: &mut Exposition, host: &str, i: usize, g: &GpuView, xids_watched: bool) {
    let index = i.to_string();
    let device = format!("nvidia{i}");
    let dcgm_labels = [
        ("gpu", index.as_str()),
        ("UUID", g.info.uuid.as_str()),
        ("device", device.as_str()),
        ("modelName", g.info.name.as_str()),
        ("Hostname", host),
    ];
    dcgm::write(out, g, xids_watched, &dcgm_labels);
    // Enough to join with the DCGM series (on gpu and Hostname), and all
    // snake_case or upper case, as Prometheus's naming rules ask.
    let labels = [
        ("gpu", index.as_str()),
        ("UUID", g.info.uuid.as_str()),
        ("Hostname", host),
    ];
    if let Some(h) = &g.health {
        for state in [
            HealthState::Healthy,
            HealthState::Degraded,
            HealthState::Quarantined,
        ] {
            let l = with_labels(&labels, &[("state", health_name(state))]);
            out.flag(&HEALTH, &l, h.state == state);
        }
        out.sample(&REASON, &labels, h.reason.0.into());
        out.sample(&SINCE, &labels, h.since.0 as f64 / 1000.0);
    }
    out.flag(&RESPONSIVE, &labels, g.responsive);
    if let Some(t) = g.sampled_at {
        out.sample(&SAMPLED, &labels, t.0 as f64 / 1000.0);
    }
    out.sample(&MISSED, &labels, g.missed.into());
    // The last and the longest only once a sample call ended: before,
    // they are not known (never a 0 that reads as the fastest GPU).
    for (stat, us) in [
        ("last", g.calls.known_last_us()),
        ("max", g.calls.known_max_us()),
        ("running", Some(g.calls.running_us)),
    ] {
        if let Some(us) = us {
            let l = with_labels(&labels, &[("stat", stat)]);
            out.sample(&CALL, &l, us as f64 / 1e6);
        }
    }
    out.sample(&LATE, &labels, g.calls.late as f64);
    match (g.applied, g.source) {
        (Some(limit), source) => {
            out.flag(&CAP_CONFIRMED, &labels, true);
            if let Some(source) = source {
                let l = with_labels(&labels, &[("source", source_name(source))]);
                out.sample(&CAP, &l, limit.0.into());
            }
        }
        // Not confirmed: no watts shown as if in force; who asked, if
        // anyone, in a series of its own, so the unconfirmed series stays
        // one (an asker that changes starts no new one).
        (None, source) => {
            out.flag(&CAP_CONFIRMED, &labels, false);
            if let Some(source) = source {
                let l = with_labels(&labels, &[("source", source_name(source))]);
                out.sample(&CAP_ASKED, &l, 1.0);
            }
        }
    }
    if let Some(cap) = g.guard_cap {
        out.sample(&GUARD, &labels, cap.0.into());
    }
}

/// A health state as the bus's JSON names it.
fn health_name(s: HealthState) -> &'static str {
    match s {
        HealthState::Healthy => "healthy",
        HealthState::Degraded => "degraded",
        HealthState::Quarantined => "quarantined",
    }
}

/// A cap source as the bus's JSON names it.
fn source_name(s: CapSource) -> &'static str {
    match s {
        CapSource::ThermalGuard => "thermal_guard",
        CapSource::Cooling => "cooling",
        CapSource::FacilityBudget => "facility_budget",
        CapSource::Operator => "operator",
    }
}

/// Serves `/metrics` on `addr`, when given one, for the agent behind
/// `ctx`; the task runs until aborted. An address that cannot be bound is
/// logged and tried again in the background
/// (`loopwarden_field::listen::bind_retrying`).
pub fn start(addr: Option<SocketAddr>, ctx: Context) -> Option<JoinHandle<()>> {
    let addr = addr?;
    let stats = loopwarden_field::listen::ListenStats::default();
    Some(bind_retrying("metrics listener", addr, stats, move |l| {
        let at = l.local_addr().unwrap_or(addr);
        tracing::info!("metrics: serving http://{at}/metrics");
        prometheus::serve(l, move || render(&ctx))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::{ActionKind, ResendCounts};
    use loopwarden_protocol::{EccCounts, TimestampMs, Unsupported, Watts};
    use std::time::Duration;

    fn view() -> GpuView {
        crate::console::snapshot::test_view()
    }

    fn text(g: &GpuView) -> String {
        watched_text(g, true)
    }

    /// GPU `g`'s series, its XIDs `watched` or not (the watch down).
    fn watched_text(g: &GpuView, watched: bool) -> String {
        let mut out = Exposition::new();
        gpu(&mut out, "h07", 3, g, watched);
        out.finish()
    }

    #[test]
    fn a_gpu_has_dcgms_names_and_labels_and_only_what_it_supports() {
        let t = text(&view());
        let dcgm =
            r#"{gpu="3",UUID="GPU-1234",device="nvidia3",modelName="NVIDIA H200",Hostname="h07"}"#;
        for line in [
            format!("DCGM_FI_DEV_GPU_TEMP{dcgm} 71\n"),
            format!("DCGM_FI_DEV_POWER_USAGE{dcgm} 650\n"),
            format!("DCGM_FI_DEV_POWER_MGMT_LIMIT{dcgm} 500\n"),
            format!("DCGM_FI_DEV_ENFORCED_POWER_LIMIT{dcgm} 500\n"),
            format!("DCGM_FI_DEV_CLOCKS_EVENT_REASONS{dcgm} 4\n"),
            format!("DCGM_FI_DEV_XID_ERRORS{dcgm} 48\n"),
            "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n".to_string(),
        ] {
            assert!(t.contains(&line), "{line} in\n{t}");
        }
        // Not supported, or not measured (no energy reported): absent.
        for absent in ["NVLINK", "DCGM_FI_DEV_MEMORY_TEMP", "ENERGY"] {
            assert!(!t.contains(absent), "{absent} in\n{t}");
        }
    }

    /// The last round is dated, so frozen values show their age.
    #[test]
    fn the_last_round_is_dated_and_absent_before_the_first() {
        let mut snap = Snapshot::default();
        let host = [("Hostname", "h07")];
        let write = |snap: &Snapshot| {
            let mut out = Exposition::new();
            loop_state(&mut out, snap, &host);
            out.finish()
        };
        assert!(!write(&snap).contains("loopwarden_last_round_timestamp_seconds{"));
        snap.timing.last_round_at = std::time::Instant::now().checked_sub(Duration::from_secs(60));
        let t = write(&snap);
        let line = t
            .lines()
            .find(|l| l.starts_with("loopwarden_last_round_timestamp_seconds{"))
            .unwrap_or_else(|| panic!("no last round in\n{t}"));
        let at: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        let age = loopwarden_bus::now_ms().0 as f64 / 1e3 - at;
        assert!((60.0..65.0).contains(&age), "{line}: {age} s old");
    }

    /// Before the first round the round's time and the tick's jitter are
    /// not known: absent, never a 0 that reads as a punctual loop.
    #[test]
    fn no_round_time_or_jitter_before_the_first_round() {
        let host = [("Hostname", "h07")];
        let write = |snap: &Snapshot| {
            let mut out = Exposition::new();
            loop_state(&mut out, snap, &host);
            out.finish()
        };
        let mut snap = Snapshot::default();
        let t = write(&snap);
        for family in [
            "loopwarden_sampling_round_seconds{",
            "loopwarden_sampling_jitter_seconds{",
        ] {
            assert!(!t.contains(family), "{family} in\n{t}");
        }
        assert!(
            t.contains("loopwarden_samples_total{Hostname=\"h07\"} 0\n"),
            "{t}"
        );
        snap.timing.samples = 1;
        snap.timing.last_sample_us = 2_000;
        snap.timing.jitter_us.push_back(1_000);
        let t = write(&snap);
        for line in [
            "loopwarden_sampling_round_seconds{Hostname=\"h07\",stat=\"last\"} 0.002\n",
            "loopwarden_sampling_jitter_seconds{Hostname=\"h07\",stat=\"p99\"} 0.001\n",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
    }

    /// A hung call shows by how long it has run, while the last call's
    /// time stays that of the last one that ended.
    #[test]
    fn a_call_in_flight_has_a_running_series() {
        let mut g = view();
        g.calls.last_us = 400;
        g.calls.ended = 1;
        g.calls.running_us = 184_000_000;
        let t = text(&g);
        let labels = r#"{gpu="3",UUID="GPU-1234",Hostname="h07""#;
        for line in [
            format!("loopwarden_gpu_sample_call_seconds{labels},stat=\"running\"}} 184\n"),
            format!("loopwarden_gpu_sample_call_seconds{labels},stat=\"last\"}} 0.0004\n"),
        ] {
            assert!(t.contains(&line), "{line} in\n{t}");
        }
    }

    /// A GPU whose sample call never ended since the start has no last
    /// or longest call time (absent, never a 0 that reads as the fastest
    /// GPU); its call in flight shows how long it has run.
    #[test]
    fn a_gpu_that_never_answered_has_no_call_time() {
        let mut g = view();
        g.calls = crate::worker::CallTimes {
            running_us: 184_000_000,
            ..Default::default()
        };
        let t = text(&g);
        let labels = r#"{gpu="3",UUID="GPU-1234",Hostname="h07""#;
        let running =
            format!("loopwarden_gpu_sample_call_seconds{labels},stat=\"running\"}} 184\n");
        assert!(t.contains(&running), "{running} in\n{t}");
        for stat in ["last", "max"] {
            let series = format!("loopwarden_gpu_sample_call_seconds{labels},stat=\"{stat}\"}}");
            assert!(!t.contains(&series), "{series} in\n{t}");
        }
    }

    /// Each ECC group hides only its own series: a GPU lacking the
    /// aggregate counts still exports its volatile ones, and the other way.
    #[test]
    fn each_ecc_group_hides_only_its_own_series() {
        let dcgm =
            r#"{gpu="3",UUID="GPU-1234",device="nvidia3",modelName="NVIDIA H200",Hostname="h07"}"#;
        let volatile = [
            format!("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{dcgm} 7\n"),
            format!("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{dcgm} 1\n"),
        ];
        let aggregate = [
            format!("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{dcgm} 40\n"),
            format!("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{dcgm} 2\n"),
        ];
        let cases = [
            (Unsupported::ECC_AGGREGATE, &volatile, &aggregate),
            (Unsupported::ECC, &aggregate, &volatile),
        ];
        for (unsupported, present, absent) in cases {
            let mut g = view();
            let s = g.last.as_mut().expect("a sample");
            s.unsupported = unsupported;
            s.ecc = EccCounts {
                sbe_volatile: 7,
                dbe_volatile: 1,
                sbe_aggregate: 40,
                dbe_aggregate: 2,
            };
            let t = text(&g);
            for line in present {
                assert!(t.contains(line.as_str()), "{unsupported:?}: {line} in\n{t}");
            }
            for line in absent {
                let name = line.split('{').next().unwrap_or_default();
                assert!(!t.contains(name), "{unsupported:?}: {name} in\n{t}");
            }
        }
    }

    #[test]
    fn health_is_a_state_set_and_the_cap_names_its_source() {
        let t = text(&view());
        let l = r#"gpu="3",UUID="GPU-1234",Hostname="h07""#;
        for line in [
            format!("loopwarden_gpu_health_state{{{l},state=\"healthy\"}} 0\n"),
            format!("loopwarden_gpu_health_state{{{l},state=\"degraded\"}} 1\n"),
            format!("loopwarden_gpu_health_state{{{l},state=\"quarantined\"}} 0\n"),
            format!("loopwarden_gpu_health_reason_code{{{l}}} 1001\n"),
            format!("loopwarden_gpu_health_changed_timestamp_seconds{{{l}}} 1700000000\n"),
            format!("loopwarden_gpu_cap_watts{{{l},source=\"cooling\"}} 500\n"),
            format!("loopwarden_gpu_responsive{{{l}}} 1\n"),
        ] {
            assert!(t.contains(&line), "{line} in\n{t}");
        }
        assert!(!t.contains("thermal_guard_cap"), "{t}");
    }

    /// A limit whose read-back failed is not shown as uncapped: no watts,
    /// and `loopwarden_gpu_cap_confirmed` 0 with who asked.
    #[test]
    fn a_cap_not_confirmed_says_so_and_is_not_read_as_uncapped() {
        let l = r#"gpu="3",UUID="GPU-1234",Hostname="h07""#;
        let t = text(&view());
        assert!(
            t.contains(&format!("loopwarden_gpu_cap_confirmed{{{l}}} 1\n")),
            "{t}"
        );
        assert!(!t.contains("loopwarden_gpu_cap_unconfirmed_asked{"), "{t}");
        let mut g = view();
        g.applied = None;
        let t = text(&g);
        // One unconfirmed series whoever asks (an alert on it held for a
        // minute is not restarted by another asker); who asked beside it.
        for (source, name) in [
            (CapSource::Cooling, "cooling"),
            (CapSource::Operator, "operator"),
        ] {
            g.source = Some(source);
            let t = text(&g);
            for line in [
                format!("loopwarden_gpu_cap_confirmed{{{l}}} 0\n"),
                format!("loopwarden_gpu_cap_unconfirmed_asked{{{l},source=\"{name}\"}} 1\n"),
            ] {
                assert!(t.contains(&line), "{line} in\n{t}");
            }
        }
        g.source = None;
        let none = text(&g);
        assert!(none.contains(&format!("loopwarden_gpu_cap_confirmed{{{l}}} 0\n")));
        assert!(
            !none.contains("loopwarden_gpu_cap_unconfirmed_asked{"),
            "{none}"
        );
        assert!(!t.contains("loopwarden_gpu_cap_watts{"), "{t}");
        assert!(!t.contains("DCGM_FI_DEV_POWER_MGMT_LIMIT{"), "{t}");
        // Uncapped, at the ceiling: confirmed, no cap.
        let mut g = view();
        g.source = None;
        let t = text(&g);
        assert!(
            t.contains(&format!("loopwarden_gpu_cap_confirmed{{{l}}} 1\n")),
            "{t}"
        );
        assert!(!t.contains("loopwarden_gpu_cap_watts{"), "{t}");
    }

    /// Each protection switched off is a series of its own, as long as
    /// the agent runs; none is written while every protection is on.
    #[test]
    fn each_protection_switched_off_is_a_series() {
        let host = [("Hostname", "h07")];
        let off = [
            crate::config::OptOut {
                key: "commands",
                said: "commands = \"none\": ...".into(),
            },
            crate::config::OptOut {
                key: "volatile_state",
                said: "volatile_state = true: ...".into(),
            },
        ];
        let mut out = Exposition::new();
        protection_off(&mut out, &off, &host);
        let t = out.finish();
        for line in [
            "# TYPE loopwarden_protection_off gauge\n",
            "loopwarden_protection_off{Hostname=\"h07\",key=\"commands\"} 1\n",
            "loopwarden_protection_off{Hostname=\"h07\",key=\"volatile_state\"} 1\n",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
        let mut out = Exposition::new();
        protection_off(&mut out, &[], &host);
        assert!(!out.finish().contains("loopwarden_protection_off"));
    }

    /// A cooling-loss phase that could not be read back is unknown, not
    /// cooled, until the CDU says.
    #[test]
    fn an_unknown_cooling_phase_is_exported_as_unknown_not_cooled() {
        let host = [("Hostname", "h07")];
        let phase = |snap: &Snapshot, name: &str| {
            let mut out = Exposition::new();
            loop_state(&mut out, snap, &host);
            let line =
                format!("loopwarden_cooling_loss_phase{{Hostname=\"h07\",phase=\"{name}\"}} ");
            let text = out.finish();
            let at = text
                .find(&line)
                .unwrap_or_else(|| panic!("{line} in\n{text}"));
            text[at + line.len()..].starts_with('1')
        };
        let mut snap = Snapshot::default();
        assert!(phase(&snap, "cooled") && !phase(&snap, "unknown"));
        snap.cooling_unknown = true;
        assert!(phase(&snap, "unknown") && !phase(&snap, "cooled"));
    }

    /// A config store found lost: one series per thing its lost mark
    /// waits for, naming the GPU; a single 0 when there is none.
    #[test]
    fn a_lost_config_stores_mark_names_what_it_waits_for() {
        let host = [("Hostname", "h07")];
        let text = |snap: &Snapshot| {
            let mut out = Exposition::new();
            loop_state(&mut out, snap, &host);
            out.finish()
        };
        let mut snap = Snapshot::default();
        let intact = text(&snap);
        assert!(
            intact.contains("loopwarden_config_store_lost{Hostname=\"h07\"} 0"),
            "{intact}"
        );
        snap.config_lost = Some(crate::console::snapshot::ConfigLost {
            waiting_for: vec![1],
            phase_unknown: true,
            ..Default::default()
        });
        let lost = text(&snap);
        for line in [
            "loopwarden_config_store_lost{Hostname=\"h07\",waiting_for=\"gpu_uuid\",gpu=\"1\"} 1",
            "loopwarden_config_store_lost{Hostname=\"h07\",waiting_for=\"cooling_phase\"} 1",
        ] {
            assert!(lost.contains(line), "{line} in\n{lost}");
        }
        assert!(!lost.contains("loopwarden_config_store_lost{Hostname=\"h07\"} 0"));
    }

    /// Every family the agent writes is in `docs/node-agent.md`, section 9.
    #[test]
    fn every_metric_is_documented() {
        let snap = Snapshot {
            gpus: vec![view()],
            actions: failed_once(),
            timing: crate::console::Timing {
                last_round_at: Some(std::time::Instant::now()),
                samples: 1,
                ..Default::default()
            },
            ..Snapshot::default()
        };
        let mut out = Exposition::new();
        let host = [("Hostname", "h07")];
        loop_state(&mut out, &snap, &host);
        let mut g = view();
        g.guard_cap = Some(Watts(600));
        gpu(&mut out, "h07", 0, &g, true);
        write_bus(&mut out, &Default::default(), true, &host);
        let costs = crate::nvml::CallCosts::default();
        let us = std::time::Duration::from_micros;
        costs.record("nvmlDeviceGetTemperature", us(30), None);
        costs.record("nvmlDeviceGetTemperature", us(50), Some("gpu_lost"));
        nvml_calls(&mut out, &costs, &host);
        loopwarden_bus::prometheus::write_resend(&mut out, ResendCounts::default(), &host);
        let text = out.finish();
        assert!(
            text.contains(r#"loopwarden_nvml_calls_total{Hostname="h07",call="nvmlDeviceGetTemperature"} 2"#)
                && text.contains(r#"loopwarden_nvml_call_seconds{Hostname="h07",call="nvmlDeviceGetTemperature",stat="max"} 0.00005"#)
                && text.contains(r#"loopwarden_nvml_call_failures_total{Hostname="h07",call="nvmlDeviceGetTemperature",error="gpu_lost"} 1"#),
            "{text}"
        );
        let mut names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        names.extend([INFO.name, STARTED.name, PROTECTION_OFF.name, CAP_ASKED.name]);
        names.extend(dcgm::names());
        names.extend([
            MISSING.name,
            FLASH_REFUSED.name,
            "loopwarden_flash_queue_dropped_total",
            "loopwarden_outbox_waiting_frames",
            "loopwarden_outbox_waiting_dropped_total",
        ]);
        let doc = include_str!("../../docs/node-agent.md");
        let section = &doc[doc.find("## 9. Metrics").expect("section 9")..];
        for name in names {
            assert!(
                section.contains(&format!("| `{name}` |")),
                "{name} not in docs/node-agent.md §9"
            );
        }
    }

    /// Site actions where one quarantine action ended well and one failed.
    fn failed_once() -> crate::console::SiteActions {
        let mut a = crate::console::SiteActions::default();
        let failure = || crate::console::ActionFailure {
            at: TimestampMs(1_700_000_000_500),
            what: "quarantine of GPU 3".into(),
            program: "scontrol".into(),
            detail: "exit 1: Invalid node name".into(),
        };
        a.count(ActionKind::Quarantine, true, failure);
        a.count(ActionKind::Quarantine, false, failure);
        a
    }

    #[test]
    fn site_actions_are_counted_by_kind_and_result_with_the_last_failure() {
        let host = [("Hostname", "h07")];
        let mut out = Exposition::new();
        site_actions(&mut out, &failed_once(), &host);
        let t = out.finish();
        for line in [
            "# TYPE loopwarden_site_actions_total counter\n",
            "loopwarden_site_actions_total{Hostname=\"h07\",kind=\"quarantine\",result=\"ok\"} 1\n",
            "loopwarden_site_actions_total{Hostname=\"h07\",kind=\"quarantine\",result=\"failed\"} 1\n",
            "loopwarden_site_actions_total{Hostname=\"h07\",kind=\"cooling_loss\",result=\"failed\"} 0\n",
            "loopwarden_site_action_last_failure_timestamp_seconds{Hostname=\"h07\"} 1700000000.5\n",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
        // None failed: the counters at 0 (so an alert's rate has a start),
        // and no time of a failure.
        let mut out = Exposition::new();
        site_actions(&mut out, &Default::default(), &host);
        let t = out.finish();
        assert!(
            t.contains("kind=\"quarantine\",result=\"failed\"} 0\n"),
            "{t}"
        );
        assert!(!t.contains("last_failure"), "{t}");
    }

    #[test]
    fn resends_are_counted_by_outcome_with_the_frames_resent() {
        let mut out = Exposition::new();
        let counts = ResendCounts {
            served: 3,
            refused: 2,
            withheld: 7,
            frames: 41,
        };
        loopwarden_bus::prometheus::write_resend(&mut out, counts, &[("Hostname", "h07")]);
        let t = out.finish();
        for line in [
            "# TYPE loopwarden_resend_requests_total counter\n",
            "# TYPE loopwarden_resend_frames_total counter\n",
            "loopwarden_resend_requests_total{Hostname=\"h07\",outcome=\"served\"} 3\n",
            "loopwarden_resend_requests_total{Hostname=\"h07\",outcome=\"refused\"} 2\n",
            "loopwarden_resend_requests_total{Hostname=\"h07\",outcome=\"withheld\"} 7\n",
            "loopwarden_resend_frames_total{Hostname=\"h07\"} 41\n",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
        for name in ["requests", "frames"] {
            let help = format!("# HELP loopwarden_resend_{name}_total ");
            assert!(t.contains(&help), "{help} in\n{t}");
        }
    }

    /// A GPU that did not answer has none of its sample's DCGM series
    /// (no stale value shown as live); its limits and last XID, which do
    /// not come from the samples, stay.
    #[test]
    fn a_gpu_that_did_not_answer_has_no_dcgm_series_of_its_sample() {
        let mut g = view();
        g.responsive = false;
        g.missed = 4;
        let t = text(&g);
        for sampled in [
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "DCGM_FI_DEV_ECC_",
            "DCGM_FI_DEV_SM_CLOCK",
        ] {
            assert!(!t.contains(sampled), "{sampled} in\n{t}");
        }
        let dcgm =
            r#"{gpu="3",UUID="GPU-1234",device="nvidia3",modelName="NVIDIA H200",Hostname="h07"}"#;
        for line in [
            format!("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN{dcgm} 200\n"),
            format!("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX{dcgm} 700\n"),
            format!("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF{dcgm} 700\n"),
        ] {
            assert!(t.contains(&line), "{line} in\n{t}");
        }
        assert!(
            t.contains(r#"loopwarden_gpu_responsive{gpu="3",UUID="GPU-1234",Hostname="h07"} 0"#)
        );
        assert!(t.contains(
            r#"loopwarden_gpu_missed_samples{gpu="3",UUID="GPU-1234",Hostname="h07"} 4"#
        ));
        // When its last sample came, so its age is known.
        let when = r#"loopwarden_gpu_last_sample_timestamp_seconds{gpu="3",UUID="GPU-1234",Hostname="h07"} 1700000000"#;
        assert!(t.contains(when), "{t}");
        g.sampled_at = None;
        assert!(!text(&g).contains("loopwarden_gpu_last_sample_timestamp_seconds{"));
    }

    /// XID 79 (fallen off the bus) comes as the GPU stops answering: its
    /// series is written then, from the XID stream.
    #[test]
    fn an_xid_of_a_gpu_that_does_not_answer_is_exported() {
        let mut g = view();
        g.responsive = false;
        g.missed = 3;
        g.xids = vec![(TimestampMs(1_700_000_000_000), 79)];
        let t = text(&g);
        let dcgm =
            r#"{gpu="3",UUID="GPU-1234",device="nvidia3",modelName="NVIDIA H200",Hostname="h07"}"#;
        let line = format!("DCGM_FI_DEV_XID_ERRORS{dcgm} 79\n");
        assert!(t.contains(&line), "{line} in\n{t}");
        // Never sampled at all: the XID still shows.
        g.last = None;
        assert!(text(&g).contains(&line), "{}", text(&g));
        assert!(text(&g).contains("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX{"));
    }

    /// While the XID watch is down (it did not start, or a GPU's
    /// registration was refused) no XID is seen: a GPU's XID series is
    /// left out, never a 0 that reads as "no XID"; an XID seen before
    /// the watch went down still shows.
    #[test]
    fn no_xid_series_reads_0_while_xids_are_not_watched() {
        let mut g = view();
        g.xids.clear();
        let name = "DCGM_FI_DEV_XID_ERRORS{";
        let zero = r#"DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-1234",device="nvidia3",modelName="NVIDIA H200",Hostname="h07"} 0"#;
        assert!(watched_text(&g, true).contains(zero), "watched, none seen");
        let t = watched_text(&g, false);
        assert!(!t.contains(name), "{name} in\n{t}");
        g.xids = vec![(TimestampMs(1_700_000_000_000), 79)];
        let t = watched_text(&g, false);
        assert!(
            t.contains(r#"modelName="NVIDIA H200",Hostname="h07"} 79"#),
            "{t}"
        );
    }

    /// The limit set standing in for an enforced limit that did not
    /// answer is never shown as the one the driver enforces.
    #[test]
    fn the_enforced_limit_is_absent_while_its_read_fails() {
        let mut g = view();
        let name = "DCGM_FI_DEV_ENFORCED_POWER_LIMIT{";
        assert!(text(&g).contains(name));
        g.last.as_mut().expect("a sample").enforced_unread = true;
        let t = text(&g);
        assert!(!t.contains(name), "{name} in\n{t}");
        assert!(t.contains("DCGM_FI_DEV_POWER_MGMT_LIMIT{"), "{t}");
    }

    /// A GPU whose description failed at start has no limit NVML gave
    /// (the board's figures guard it): none shown as the GPU's.
    #[test]
    fn the_limits_of_a_gpu_never_described_are_not_exported_as_its_own() {
        let mut g = view();
        g.info.uuid = "unknown".into();
        g.info.default_limit = crate::nvml::UNREAD_LIMIT;
        g.info.min_limit = crate::nvml::UNREAD_LIMIT;
        g.info.max_limit = crate::nvml::UNREAD_LIMIT;
        g.responsive = false;
        let t = text(&g);
        for field in ["MIN", "MAX", "DEF"] {
            let name = format!("DCGM_FI_DEV_POWER_MGMT_LIMIT_{field}{{");
            assert!(!t.contains(&name), "{name} in\n{t}");
        }
    }
}

//! The controller's Prometheus metrics (`metrics_listen`), all
//! `loopwarden_cdu_*` but for what both agents share (`loopwarden_bus_*`,
//! `loopwarden_flash_queue_dropped_total`, `loopwarden_outbox_*`,
//! `loopwarden_resend_*`): the mode, the setpoint and pump speed, the
//! loop's temperatures, flow and meters, the pumps, each sensor's fault,
//! each rack's cooling, valve and leak state, the caps sent and in force
//! per host, and the shell's counters. What the controller has learned
//! of its hall has series of its own (`loopwarden_estimate_*{figure}`,
//! `loopwarden_host_thermal_factor{host}`, `loopwarden_outdoor_fallback`),
//! from the same figures as `ctl loops` (`crate::estimates`).
//!
//! Rendered from the console's [`Context`] and the shell's last
//! [`ShellStats`], copied out of its watch channel first: a scrape never
//! reaches into the control loop. `docs/cooling.md` ("Metrics") lists
//! every metric. Every series has the label `cdu`; per-rack series have
//! `rack`, per-host series `host` and `rack`, per-pump series `pump`.
//! A reading the CDU did not give this step is absent, not zero.
//!
//! Glossary:
//! - *state set*: one series per possible state, 1 for the state held and
//!   0 for the others (`loopwarden_cdu_mode{mode="failsafe"}`).
//! - *in force*: the lowest limit a host's last ack reported for its GPUs.

use std::net::SocketAddr;
use std::string::{String, ToString};
use std::sync::Arc;

use cooling_core::config::Layout;
use cooling_core::sensors::Which;
use cooling_core::Commands;
use loopwarden_bus::prometheus::{
    self, with_labels, write_bus, write_recorder, BindError, Exposition, Metric,
};
use loopwarden_field::listen::{bind_retrying, write_metrics, ListenStats};
use loopwarden_protocol::message::CduMode;
use tokio::task::JoinHandle;

use crate::console::Context;
use crate::estimates::FACILITY_RATIOS;
use crate::shell::{ShellStats, Snapshot};

mod names;
use names::*;

/// What `/metrics` is rendered from: the console's context and the
/// racks of the loop.
#[derive(Debug, Clone)]
pub struct CduMetrics {
    ctx: Arc<Context>,
    racks: usize,
    unprotected: u16,
    /// The listeners whose refusals and idle closes are shown, by name.
    listeners: Vec<(&'static str, ListenStats)>,
}

impl CduMetrics {
    /// Metrics of the controller behind `ctx`, for a loop laid out as
    /// `layout`.
    pub fn new(ctx: Arc<Context>, layout: &Layout) -> Self {
        Self {
            ctx,
            racks: usize::from(layout.racks).min(16),
            unprotected: layout.unprotected,
            listeners: Vec::new(),
        }
    }

    /// These metrics with the listener `name`'s counts
    /// (`loopwarden_listener_*{listener="<name>"}`).
    pub fn listener(mut self, name: &'static str, stats: ListenStats) -> Self {
        self.listeners.push((name, stats));
        self
    }

    /// The `/metrics` text, as of the shell's last step.
    pub fn render(&self) -> String {
        // A copy, so the channel is not held while the text is written.
        let st = self.ctx.stats.borrow().clone();
        let mut out = Exposition::new();
        let cdu = [("cdu", self.ctx.cdu.as_str())];
        info(&mut out, &self.ctx, &cdu);
        counters(&mut out, &st, &cdu);
        if let Some(snap) = &st.status {
            mode(&mut out, snap, &st, &cdu);
            loop_readings(&mut out, snap, &cdu);
            pumps(&mut out, snap, st.last.as_ref(), &cdu);
            // How old every series below is.
            out.sample(&LAST_STEP, &cdu, snap.at.0 as f64 / 1000.0);
            out.flag(&RELATCH_PENDING, &cdu, st.relatch_pending);
            out.flag(&HEARTBEAT_HELD, &cdu, st.heartbeat_held.is_some());
            self.racks(&mut out, snap, st.last.as_ref(), st.relatch_pending, &cdu);
            write_bus(&mut out, &snap.bus, snap.bus_connected, &cdu);
            loopwarden_bus::prometheus::write_resend(&mut out, snap.resend, &cdu);
            self.estimates(&mut out, snap, &cdu);
        }
        self.hosts(&mut out, &st, &cdu);
        write_recorder(&mut out, &self.ctx.recorder, &cdu);
        for (name, stats) in &self.listeners {
            write_metrics(&mut out, name, stats, &cdu);
        }
        out.finish()
    }

    /// Each rack's valve, cooling, leak and leak sensing; its latched leak
    /// and failed isolation only while they are known (`relatch`: the
    /// latched record is unreadable and the racks are not yet relatched,
    /// so they are not).
    fn racks(
        &self,
        out: &mut Exposition,
        s: &Snapshot,
        c: Option<&Commands>,
        relatch: bool,
        cdu: &[(&str, &str)],
    ) {
        for r in 0..self.racks {
            let rack = r.to_string();
            let l = with_labels(cdu, &[("rack", rack.as_str())]);
            let bit = |mask: u16| mask & (1 << r) != 0;
            if let Some(open) = s.valves_open {
                out.flag(&RACK_VALVE_OPEN, &l, bit(open));
            }
            if let Some(c) = c {
                out.flag(&RACK_COOLING_LOST, &l, bit(c.cooling_lost));
            }
            // Wet as an input that answered reads it; dry only when one
            // that answered covers it and none gone silent last read it
            // wet: else neither wet nor dry is known, and no series.
            if bit(s.leaks_now) || (bit(s.leaks_heard) && !bit(s.leaks_unheard)) {
                out.flag(&RACK_LEAK, &l, bit(s.leaks_now));
            }
            if !relatch {
                out.flag(&RACK_LEAK_LATCHED, &l, bit(s.leaks_latched));
                out.flag(&RACK_ISOLATION_FAILED, &l, bit(s.isolation_failed));
            }
            let sensing = if bit(self.unprotected) {
                "unprotected"
            } else if bit(s.sensing_lost) {
                "lost"
            } else {
                "supervised"
            };
            for state in ["supervised", "lost", "unprotected"] {
                let ls = with_labels(&l, &[("state", state)]);
                out.flag(&RACK_LEAK_SENSING, &ls, state == sensing);
            }
        }
    }

    /// What the core has learned: the facility figures' ratios,
    /// confidences and trusts, each host's thermal factor, and whether
    /// the outdoor temperature is the fallback.
    fn estimates(&self, out: &mut Exposition, s: &Snapshot, cdu: &[(&str, &str)]) {
        let e = &s.estimates;
        let figures = e.figures();
        for (key, i) in FACILITY_RATIOS {
            let f = &figures[i];
            let l = with_labels(cdu, &[("figure", key)]);
            out.sample(&ESTIMATE_RATIO, &l, f64::from(f.ratio()));
            out.sample(&ESTIMATE_CONFIDENCE, &l, f64::from(f.confidence));
            out.sample(&ESTIMATE_TRUST, &l, f64::from(f.trust));
        }
        let per_rack = self.ctx.hosts_per_rack.max(1);
        let hosts = e.configured.layout.hosts();
        for (i, host) in self.ctx.hosts.iter().enumerate().take(hosts) {
            let rack = (i / per_rack).to_string();
            let l = with_labels(cdu, &[("host", host.as_str()), ("rack", rack.as_str())]);
            out.sample(&HOST_THERMAL_FACTOR, &l, f64::from(e.host(i).factor));
        }
        out.flag(&OUTDOOR_FALLBACK, cdu, e.outdoor_fallback);
        if let Some(f) = &s.facility {
            if let Some(o) = f.offer {
                out.sample(&FACILITY_ACCEPT, cdu, f64::from(o.accept_c));
            }
            if let Some((w, _)) = f.following {
                out.sample(&FACILITY_WATER_TARGET, cdu, f64::from(w));
            }
            if let Some((p, _)) = f.plan {
                out.sample(&FACILITY_CHILLER_STAGES, cdu, f64::from(p.chiller_stages));
            }
        }
    }

    /// Each host's cap sent, limit in force and last report.
    fn hosts(&self, out: &mut Exposition, st: &ShellStats, cdu: &[(&str, &str)]) {
        let per_rack = self.ctx.hosts_per_rack.max(1);
        for (i, host) in self.ctx.hosts.iter().enumerate() {
            let rack = (i / per_rack).to_string();
            let l = with_labels(cdu, &[("host", host.as_str()), ("rack", rack.as_str())]);
            if let Some(w) = st.caps.get(i).copied().flatten() {
                out.sample(&HOST_CAP, &l, f64::from(w.round()));
            }
            let in_force = st
                .in_force
                .get(host)
                .and_then(|caps| caps.iter().map(|c| c.limit.0).min());
            if let Some(w) = in_force {
                out.sample(&HOST_IN_FORCE, &l, f64::from(w));
            }
            if let Some(t) = st.heard.get(i).copied().flatten() {
                out.sample(&HOST_HEARD, &l, t.0 as f64 / 1000.0);
            }
        }
        let capped = st.hosts_capped(loopwarden_bus::now_ms());
        out.sample(&HOSTS_CAPPED, cdu, capped as f64);
    }
}

/// Serves `/metrics` on `addr`, when given one; the task runs until
/// aborted. Binding fails at once, naming the address (for a rig that
/// wants the port bound before it goes on; `run` uses [`start_retrying`]).
pub async fn start(
    addr: Option<SocketAddr>,
    metrics: CduMetrics,
) -> Result<Option<JoinHandle<()>>, BindError> {
    prometheus::start(addr, move || metrics.render()).await
}

/// Serves `/metrics` on `addr`, when given one; the task runs until
/// aborted. An address that cannot be bound is logged and tried again in
/// the background, counted in `stats` (`listen::bind_retrying`): the
/// controller runs on without `/metrics` meanwhile.
pub fn start_retrying(
    addr: Option<SocketAddr>,
    metrics: CduMetrics,
    stats: ListenStats,
) -> Option<JoinHandle<()>> {
    let addr = addr?;
    Some(bind_retrying("metrics listener", addr, stats, move |l| {
        let at = l.local_addr().unwrap_or(addr);
        tracing::info!("metrics: serving http://{at}/metrics");
        prometheus::serve(l, move || metrics.render())
    }))
}

/// What the controller is and since when.
fn info(out: &mut Exposition, ctx: &Context, cdu: &[(&str, &str)]) {
    let l = with_labels(
        cdu,
        &[
            ("site", ctx.site.as_str()),
            ("version", env!("CARGO_PKG_VERSION")),
            ("register_map", ctx.map_model.as_str()),
        ],
    );
    out.sample(&INFO, &l, 1.0);
    out.sample(&STARTED, cdu, ctx.started.0 as f64 / 1000.0);
    for said in &ctx.protection_off {
        let key = crate::console::protection_key(said);
        out.sample(&PROTECTION_OFF, &with_labels(cdu, &[("key", key)]), 1.0);
    }
}

/// The shell's counters.
fn counters(out: &mut Exposition, st: &ShellStats, cdu: &[(&str, &str)]) {
    let plain = [
        (&STEPS, st.steps),
        (&STEPS_LATE, st.steps_late),
        (&MODBUS_READS, st.cdu_reads),
        (&MODBUS_READ_ERRORS, st.cdu_read_errors),
        (&MODBUS_WRITE_ERRORS, st.cdu_write_errors),
        (&SETTINGS_LIMITED, st.settings_limited),
        (&LATCH_WRITE_ERRORS, st.latch_write_errors),
        (&HOST_REPORTS, st.host_reports),
        (&HOST_REPORTS_REFUSED, st.host_reports_refused),
        (&HOST_GPUS_LEFT_OUT, st.host_gpus_left_out),
        (&LEASES_SENT, st.leases_sent),
        (&LIFTS_SENT, st.lifts_sent),
        (&ACKS_FOREIGN, st.acks_foreign),
        (&PUBLISH_ERRORS, st.publish_errors),
    ];
    for (metric, v) in plain {
        out.sample(metric, cdu, v as f64);
    }
    out.flag(&MODBUS_UP, cdu, st.cdu_reads > 0 && st.cdu_error.is_none());
    for (result, v) in [
        ("ok", st.acks_ok),
        ("shortened", st.acks_shortened),
        ("refused", st.acks_refused),
    ] {
        out.sample(&ACKS, &with_labels(cdu, &[("result", result)]), v as f64);
    }
    for (kind, v) in [
        ("telemetry", st.telemetry_published),
        ("state", st.states_published),
        ("event", st.events_published),
    ] {
        out.sample(&PUBLISHED, &with_labels(cdu, &[("kind", kind)]), v as f64);
    }
}

/// The mode, its reason, the setpoint and speed as written to the CDU
/// and taken, the alarms.
fn mode(out: &mut Exposition, s: &Snapshot, st: &ShellStats, cdu: &[(&str, &str)]) {
    for m in [
        CduMode::Boot,
        CduMode::Normal,
        CduMode::Degraded,
        CduMode::Failsafe,
    ] {
        out.flag(
            &MODE,
            &with_labels(cdu, &[("mode", mode_name(m))]),
            s.mode == m,
        );
    }
    out.sample(&MODE_REASON, cdu, s.reason.0.into());
    out.sample(&MODE_SINCE, cdu, s.since.0 as f64 / 1000.0);
    out.sample(&EVENTS_DROPPED, cdu, s.events_dropped.into());
    out.flag(&REJECTION_SHORT, cdu, s.loops.rejection_short);
    if let Some(v) = st.setpoint_written_c {
        out.sample(&SETPOINT, cdu, v);
    }
    if let Some(pct) = st.speed_written_pct {
        out.sample(&PUMP_SPEED, cdu, pct / 100.0);
    }
    if let Some(c) = &st.last {
        out.flag(&BEACON, cdu, c.beacon);
    }
}

/// The loop's readings this step and each sensor's fault.
fn loop_readings(out: &mut Exposition, s: &Snapshot, cdu: &[(&str, &str)]) {
    for sensor in &s.sensors {
        let l = with_labels(cdu, &[("sensor", sensor_name(sensor.which))]);
        out.flag(&SENSOR_FAULT, &l, sensor.faulted());
        // A lost or implausible reading is no figure (as on the bus).
        if let Some(v) = sensor.shown() {
            out.sample(sensor_metric(sensor.which), cdu, v);
        }
    }
    let Some(r) = s.readings else {
        return;
    };
    if let Some(kpa) = r.diff_pressure_kpa {
        out.sample(&DIFF_PRESSURE, cdu, kpa * 1000.0);
    }
    for (meter, v) in [
        ("it", r.it_w),
        ("cooling", r.cooling_w),
        ("facility", r.facility_w),
    ] {
        if let Some(v) = v {
            out.sample(&POWER, &with_labels(cdu, &[("meter", meter)]), v);
        }
    }
    if let (Some(it), Some(f)) = (r.it_w, r.facility_w) {
        if it > 0.0 {
            out.sample(&PUE, cdu, f / it);
        }
    }
}

/// Each pump: running (its feedback), commanded on, lead, failed.
fn pumps(out: &mut Exposition, s: &Snapshot, c: Option<&Commands>, cdu: &[(&str, &str)]) {
    for (i, pump) in ["A", "B"].into_iter().enumerate() {
        let l = with_labels(cdu, &[("pump", pump)]);
        if let Some(running) = s.readings.and_then(|r| r.pumps_running[i]) {
            out.flag(&PUMP_RUNNING, &l, running);
        }
        if let Some(c) = c {
            out.flag(&PUMP_ON, &l, c.pump_on[i]);
            out.flag(&PUMP_LEAD, &l, c.lead as usize == i);
        }
        out.flag(&PUMP_FAILED, &l, s.pumps_failed[i]);
    }
}

/// A mode as the bus's JSON names it.
fn mode_name(m: CduMode) -> &'static str {
    match m {
        CduMode::Boot => "boot",
        CduMode::Normal => "normal",
        CduMode::Degraded => "degraded",
        CduMode::Failsafe => "failsafe",
    }
}

/// A supervised sensor's name in `sensor` labels.
fn sensor_metric(w: Which) -> &'static Metric {
    match w {
        Which::Supply => &SUPPLY,
        Which::Return => &RETURN,
        Which::Flow => &FLOW,
        Which::FacilitySupply => &FACILITY_SUPPLY,
    }
}

fn sensor_name(w: Which) -> &'static str {
    match w {
        Which::Supply => "supply",
        Which::Return => "return",
        Which::Flow => "flow",
        Which::FacilitySupply => "facility_supply",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::ResendCounts;

    /// Every `loopwarden_cdu_*` metric is in `docs/cooling.md`, "Metrics".
    #[test]
    fn every_metric_is_documented() {
        let doc = include_str!("../../docs/cooling.md");
        let section = &doc[doc.find("## Metrics").expect("a Metrics section")..];
        for m in names::ALL {
            assert!(
                section.contains(&format!("| `{}` |", m.name)),
                "{} not in docs/cooling.md, Metrics",
                m.name
            );
        }
        // Shared with the node agent: in its table, named here.
        let agent = include_str!("../../docs/node-agent.md");
        let table = &agent[agent.find("## 9. Metrics").expect("section 9")..];
        for m in names::RESEND {
            assert!(
                table.contains(&format!("| `{}` |", m.name)),
                "{} not in docs/node-agent.md §9",
                m.name
            );
            assert!(
                section.contains(&format!("`{}`", m.name)),
                "{} not named in docs/cooling.md, Metrics",
                m.name
            );
        }
    }

    /// The console's context of controller `cdu-1` whose shell last
    /// published `st`.
    fn context(st: ShellStats) -> Arc<Context> {
        crate::console::test_context(st)
    }

    #[test]
    fn resends_are_counted_by_outcome_with_the_frames_resent() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.resend = ResendCounts {
            served: 3,
            refused: 2,
            withheld: 7,
            frames: 41,
        };
        let ctx = context(ShellStats {
            status: Some(snap),
            ..Default::default()
        });
        let text = CduMetrics::new(ctx, &cfg.layout).render();
        let cdu = r#"cdu="cdu-1""#;
        for (outcome, want) in [("served", 3.0), ("refused", 2.0), ("withheld", 7.0)] {
            let series =
                format!(r#"loopwarden_resend_requests_total{{{cdu},outcome="{outcome}"}}"#);
            assert_eq!(value(&text, &series), want, "{series}");
        }
        assert_eq!(
            value(&text, &format!("loopwarden_resend_frames_total{{{cdu}}}")),
            41.0
        );
        for m in names::RESEND {
            assert!(
                text.contains(&format!("# HELP {} ", m.name))
                    && text.contains(&format!("# TYPE {} counter", m.name)),
                "{}:\n{text}",
                m.name
            );
        }
    }

    #[test]
    fn a_lost_or_implausible_reading_is_no_series_and_any_fault_is_flagged() {
        use crate::shell::SensorStatus;
        use cooling_core::{Core, CoreConfig};
        use loopwarden_protocol::message::SensorFault;
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let mut snap = Snapshot::of_core(&core);
        let sensor = |which, reading, fault| SensorStatus {
            which,
            reading: Some(reading),
            fault,
        };
        snap.sensors = [
            // A CDU's "no value", before its fault is confirmed.
            sensor(Which::Supply, -327.68, None),
            sensor(Which::Return, 38.0, Some(SensorFault::Lost)),
            sensor(Which::Flow, 170.0, Some(SensorFault::Stuck)),
            sensor(Which::FacilitySupply, 27.0, None),
        ];
        snap.readings = Some(cooling_decide::CduMeasurements {
            supply_c: Some(-327.68),
            return_c: Some(38.0),
            flow_lpm: Some(170.0),
            facility_supply_c: Some(27.0),
            ..Default::default()
        });
        let ctx = context(ShellStats {
            status: Some(snap),
            ..Default::default()
        });
        let text = CduMetrics::new(ctx, &cfg.layout).render();
        let cdu = r#"cdu="cdu-1""#;
        for m in [&SUPPLY, &RETURN] {
            assert!(
                !text.contains(&format!("{}{{{cdu}}}", m.name)),
                "{}:\n{text}",
                m.name
            );
        }
        // Stuck is believed no longer, but its reading is still the CDU's.
        assert_eq!(value(&text, &format!("{}{{{cdu}}}", FLOW.name)), 170.0);
        assert_eq!(
            value(&text, &format!("{}{{{cdu}}}", FACILITY_SUPPLY.name)),
            27.0
        );
        for (sensor, want) in [("supply", 0.0), ("return", 1.0), ("flow", 1.0)] {
            let series = format!(r#"{}{{{cdu},sensor="{sensor}"}}"#, SENSOR_FAULT.name);
            assert_eq!(value(&text, &series), want, "{series}");
        }
    }

    #[test]
    fn a_pending_relatch_leaves_the_latches_out_and_says_so() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let text = |relatch_pending: bool| {
            let ctx = context(ShellStats {
                status: Some(Snapshot::of_core(&core)),
                relatch_pending,
                ..Default::default()
            });
            CduMetrics::new(ctx, &cfg.layout).render()
        };
        let rack = r#"{cdu="cdu-1",rack="0"}"#;
        let pending = text(true);
        assert_eq!(
            value(&pending, r#"loopwarden_cdu_relatch_pending{cdu="cdu-1"}"#),
            1.0
        );
        for m in [&RACK_LEAK_LATCHED, &RACK_ISOLATION_FAILED] {
            assert!(
                !pending.contains(&format!("{}{{", m.name)),
                "{} while the latches are unknown:\n{pending}",
                m.name
            );
        }
        let known = text(false);
        assert_eq!(
            value(&known, r#"loopwarden_cdu_relatch_pending{cdu="cdu-1"}"#),
            0.0
        );
        assert_eq!(
            value(&known, &format!("{}{rack}", RACK_LEAK_LATCHED.name)),
            0.0
        );
        assert_eq!(
            value(&known, &format!("{}{rack}", RACK_ISOLATION_FAILED.name)),
            0.0
        );
    }

    #[test]
    fn a_heartbeat_held_back_is_a_series_of_1_and_0_once_written_again() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let text = |heartbeat_held: Option<String>| {
            let ctx = context(ShellStats {
                status: Some(Snapshot::of_core(&core)),
                heartbeat_held,
                ..Default::default()
            });
            CduMetrics::new(ctx, &cfg.layout).render()
        };
        let series = r#"loopwarden_cdu_heartbeat_held{cdu="cdu-1"}"#;
        let held = text(Some("valves_open: holding 3 reads back value 0".into()));
        assert_eq!(value(&held, series), 1.0);
        assert_eq!(value(&text(None), series), 0.0);
    }

    #[test]
    fn a_valve_is_as_the_cdu_has_it_not_as_commanded_and_absent_unknown() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let text = |valves_open: Option<u16>| {
            let mut snap = Snapshot::of_core(&core);
            snap.valves_open = valves_open;
            let mut last = Commands::UNSET;
            // Rack 2 leaks: commanded shut.
            last.valves_open = 0b1011;
            let ctx = context(ShellStats {
                status: Some(snap),
                last: Some(last),
                ..Default::default()
            });
            CduMetrics::new(ctx, &cfg.layout).render()
        };
        let open = |r: usize| format!(r#"{}{{cdu="cdu-1",rack="{r}"}}"#, RACK_VALVE_OPEN.name);
        // The CDU did not take the close: rack 2 is still open.
        let t = text(Some(0b1111));
        for r in 0..4 {
            assert_eq!(value(&t, &open(r)), 1.0, "rack {r}");
        }
        let t = text(None);
        // Neither read nor taken: no series, not a guess.
        assert!(!t.contains(&format!("{}{{", RACK_VALVE_OPEN.name)), "{t}");
    }

    #[test]
    fn the_last_steps_time_is_a_series() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.at = loopwarden_protocol::TimestampMs(1_700_000_123_456);
        let ctx = context(ShellStats {
            status: Some(snap),
            ..Default::default()
        });
        let text = CduMetrics::new(ctx, &cfg.layout).render();
        let series = format!(r#"{}{{cdu="cdu-1"}}"#, LAST_STEP.name);
        assert_eq!(value(&text, &series), 1_700_000_123.456);
        // None before the first step.
        let text = CduMetrics::new(context(ShellStats::default()), &cfg.layout).render();
        assert!(!text.contains(&format!("{} ", LAST_STEP.name)), "{text}");
    }

    #[test]
    fn a_wet_rack_whose_input_went_silent_is_no_series_not_dry() {
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let core = Core::new(cfg).unwrap();
        let mut snap = Snapshot::of_core(&core);
        // Rack 1 reads wet; rack 2 read wet and its input is silent now.
        snap.leaks_now = 0b0010;
        snap.leaks_unheard = 0b0100;
        let ctx = context(ShellStats {
            status: Some(snap),
            ..Default::default()
        });
        let text = CduMetrics::new(ctx, &cfg.layout).render();
        let leak = |r: usize| format!(r#"{}{{cdu="cdu-1",rack="{r}"}}"#, RACK_LEAK.name);
        assert_eq!(value(&text, &leak(0)), 0.0);
        assert_eq!(value(&text, &leak(1)), 1.0);
        assert!(!text.contains(&leak(2)), "{text}");
        assert_eq!(value(&text, &leak(3)), 0.0);
    }

    #[test]
    fn a_rack_no_leak_input_answered_for_is_no_series_not_dry() {
        use cooling_core::{Core, CoreConfig};
        let mut cfg = CoreConfig::default();
        let text = |cfg: &CoreConfig, heard: u16, now: u16| {
            let core = Core::new(*cfg).unwrap();
            let mut snap = Snapshot::of_core(&core);
            snap.leaks_heard = heard;
            snap.leaks_now = now;
            let ctx = context(ShellStats {
                status: Some(snap),
                ..Default::default()
            });
            CduMetrics::new(ctx, &cfg.layout).render()
        };
        let leak = |r: usize| format!(r#"{}{{cdu="cdu-1",rack="{r}"}}"#, RACK_LEAK.name);
        // No board pins, the CDU silent: no rack's leak is known.
        let core = Core::new(cfg).unwrap();
        let mut snap = Snapshot::of_core(&core);
        snap.ropes = false;
        snap.readings = None;
        snap.leaks_heard = 0;
        let ctx = context(ShellStats {
            status: Some(snap),
            ..Default::default()
        });
        let t = CduMetrics::new(ctx, &cfg.layout).render();
        assert!(!t.contains(&format!("{}{{", RACK_LEAK.name)), "{t}");
        // Ropes on racks 0, 1, 3 read dry, rack 2 unprotected, the CDU
        // silent: rack 2 has no series.
        cfg.layout.unprotected = 0b0100;
        let t = text(&cfg, 0b1011, 0);
        for r in [0, 1, 3] {
            assert_eq!(value(&t, &leak(r)), 0.0, "rack {r}");
        }
        assert!(!t.contains(&leak(2)), "{t}");
        // A rope reads wet: wet.
        let t = text(&cfg, 0b1011, 0b0001);
        assert_eq!(value(&t, &leak(0)), 1.0);
    }

    #[test]
    fn the_setpoint_and_speed_are_as_written_to_the_cdu_not_as_asked() {
        use crate::decide::{Decider, MapLimits, Outcome};
        use cooling_core::{Core, CoreConfig};
        let cfg = CoreConfig::default();
        let limits = MapLimits {
            mapped: [true; 6],
            setpoint_c: None,
            speed_pct: Some((30.0, 90.0)),
            positions: false,
        };
        let none: Result<Option<crate::journal::LatchRecord>, &str> = Ok(None);
        let mut d = Decider::new(cfg, limits, &none).unwrap();
        let mut c = Commands::UNSET;
        c.pump_speed = 1.0;
        c.setpoint_c = 32.0;
        let plan = d.plan(&c, None);
        let mut st = ShellStats {
            status: Some(Snapshot::of_core(&Core::new(cfg).unwrap())),
            last: Some(c.clone()),
            ..Default::default()
        };
        let text = |st: &ShellStats| CduMetrics::new(context(st.clone()), &cfg.layout).render();
        // Nothing taken yet: no series.
        let t = text(&st);
        assert!(!t.contains(&format!("{}{{", PUMP_SPEED.name)), "{t}");
        st.took(&plan, &Outcome::whole(&plan, true));
        let t = text(&st);
        let speed = format!(r#"{}{{cdu="cdu-1"}}"#, PUMP_SPEED.name);
        assert!((value(&t, &speed) - 0.9).abs() < 1e-9, "{t}");
        let setpoint = format!(r#"{}{{cdu="cdu-1"}}"#, SETPOINT.name);
        assert_eq!(value(&t, &setpoint), 32.0);
        // A write the CDU refused leaves the last it took.
        c.pump_speed = 0.5;
        let plan = d.plan(&c, None);
        st.took(&plan, &Outcome::whole(&plan, false));
        assert!((value(&text(&st), &speed) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn each_protection_switched_off_is_a_series_while_it_is_off() {
        let cfg = cooling_core::CoreConfig::default();
        let mut ctx = (*context(ShellStats::default())).clone();
        let t = CduMetrics::new(Arc::new(ctx.clone()), &cfg.layout).render();
        assert!(!t.contains(PROTECTION_OFF.name), "{t}");
        ctx.protection_off = vec![
            "rope_fault_active_high = true: a cut line reads healthy".into(),
            "volatile_latch = true: no flash file".into(),
        ];
        let t = CduMetrics::new(Arc::new(ctx), &cfg.layout).render();
        for key in ["rope_fault_active_high", "volatile_latch"] {
            let series = format!(r#"{}{{cdu="cdu-1",key="{key}"}}"#, PROTECTION_OFF.name);
            assert_eq!(value(&t, &series), 1.0);
        }
    }

    /// The value of the series `series` (name and labels, as written) in
    /// `text`.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
            .parse()
            .unwrap()
    }

    #[test]
    fn the_learned_figures_each_hosts_factor_and_the_outdoor_fallback_are_series() {
        use cooling_core::estimate::Scalar;
        use cooling_core::{Core, CoreConfig, Learned};
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let mut l = Learned::new(&cfg);
        l.hosts[5] = Scalar {
            value: 1.42,
            var: 0.0,
            fed_s: 3600.0,
            trust: 0.6,
        };
        l.facility.theta = [0.65f32.ln(), 0.0, 0.05f32.ln_1p(), 0.0];
        l.facility_trust = [0.5, 0.0, 0.25, 0.0];
        core.restore_learned(&l).unwrap();
        let ctx = context(ShellStats {
            status: Some(Snapshot::of_core(&core)),
            ..Default::default()
        });
        // The listeners given, each with its own series.
        let console = ListenStats::default();
        let northbound = ListenStats::default();
        let text = CduMetrics::new(ctx, &cfg.layout)
            .listener("console", console)
            .listener("northbound", northbound)
            .render();
        for listener in ["console", "northbound"] {
            let series = format!(r#"{{cdu="cdu-1",listener="{listener}"}}"#);
            for name in [
                "loopwarden_listener_connections",
                "loopwarden_listener_refused_total",
                "loopwarden_listener_idle_closed_total",
            ] {
                assert_eq!(value(&text, &format!("{name}{series}")), 0.0);
            }
        }
        for m in names::ESTIMATES {
            assert!(
                text.contains(&format!("# HELP {} ", m.name))
                    && text.contains(&format!("# TYPE {} gauge", m.name)),
                "{}:\n{text}",
                m.name
            );
        }
        let near = |series: &str, want: f64| {
            let got = value(&text, series);
            assert!((got - want).abs() < 1e-4, "{series} {got}, not {want}");
        };
        let ua = r#"{cdu="cdu-1",figure="dry_cooler_ua"}"#;
        near(&format!("loopwarden_estimate_ratio{ua}"), 0.65);
        near(&format!("loopwarden_estimate_trust{ua}"), 0.5);
        near(&format!("loopwarden_estimate_confidence{ua}"), 0.0);
        let pump = r#"{cdu="cdu-1",figure="pump_power"}"#;
        near(&format!("loopwarden_estimate_ratio{pump}"), 1.05);
        near(&format!("loopwarden_estimate_trust{pump}"), 0.25);
        let cop = r#"{cdu="cdu-1",figure="chiller_cop"}"#;
        near(&format!("loopwarden_estimate_ratio{cop}"), 1.0);
        near(
            r#"loopwarden_host_thermal_factor{cdu="cdu-1",host="r1h1",rack="1"}"#,
            1.42,
        );
        near(
            r#"loopwarden_host_thermal_factor{cdu="cdu-1",host="r3h3",rack="3"}"#,
            1.0,
        );
        // A core that has read no outdoor temperature plans with the
        // fallback.
        near(r#"loopwarden_outdoor_fallback{cdu="cdu-1"}"#, 1.0);
    }

    #[test]
    fn names_are_unique_and_counters_end_in_total() {
        use loopwarden_bus::prometheus::MetricKind;
        let all: Vec<&loopwarden_bus::prometheus::Metric> = names::ALL
            .iter()
            .chain(names::ESTIMATES)
            .chain(names::FACILITY)
            .chain(names::RESEND)
            .collect();
        let mut n: Vec<&str> = all.iter().map(|m| m.name).collect();
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), all.len());
        for m in all {
            let total = m.name.ends_with("_total");
            assert_eq!(total, m.kind == MetricKind::Counter, "{}", m.name);
        }
    }
}

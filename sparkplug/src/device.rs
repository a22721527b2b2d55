//! What a Loopwarden node looks like as a Sparkplug device: the latest
//! messages heard from it (its *view*) and the metrics they make.
//!
//! A host's metrics are its GPUs' temperatures, power, power limit (the
//! cap in force; null for the agent's 0 W, a limit NVML could not read;
//! a power or limit past any GPU's, [`GPU_POWER_MAX_W`], is null and left
//! out of the host's power),
//! utilisation and health; a CDU's are its loop's
//! temperatures, setpoint, flow, pumps, meters, leak, racks without leak
//! sensing, and mode; `leak` is null, not false, when no rack reads wet
//! but some rack's leak sensing is lost or no state says it reads, and
//! a host's `xid_watch_down` says its agent cannot see XIDs; the loop's
//! metrics and
//! `leak` are null while the CDU's latest state says its controller is
//! silent and no telemetry came after it. A GPU that did
//! not answer in time repeats its last good sample: its measurements are
//! null and the host's power and hottest die leave it out (a power sum
//! past the metric's u32 is null). Every metric of
//! a device is in every birth of it, with a null value until a message
//! gives it one, so the set changes only when a host's GPUs do (then the
//! device is born again). Names carry their unit (`_c`, `_w`, `_pct`,
//! `_lpm`, `_kpa`) and births carry it again as `engUnit`.
//!
//! Glossary:
//! - *view*: the latest telemetry, health or state, and software version,
//!   of one node, each with the time it was measured (a CDU's telemetry
//!   only until a state says its controller is silent).
//! - *frame time*: the sender's clock, used as the metric's timestamp when
//!   it reads as a Unix time (a sender without a real-time clock counts
//!   from its boot; then the bridge's receive time is used).

use loopwarden_protocol::{
    CduState, CduTelemetry, GpuFlags, GpuTelemetry, HealthState, HostHealth, HostTelemetry,
    LeakSensing, Message, RackCooling, ReasonCode, Unsupported,
};

use crate::payload::{DataType, Point, Value};

/// 2000-01-01 in ms since the Unix epoch: an earlier frame time is a
/// count since boot, not a date.
const PLAUSIBLE_UNIX_MS: u64 = 946_684_800_000;

/// The timestamp for a value a frame of `frame_time` carried, received at
/// `now`.
pub fn measured_at(frame_time: u64, now: u64) -> u64 {
    if frame_time >= PLAUSIBLE_UNIX_MS {
        frame_time
    } else {
        now
    }
}

/// A message and when it was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed<T> {
    /// The message.
    pub message: T,
    /// When, ms since the Unix epoch.
    pub time: u64,
}

/// The latest of what a node said.
// One per node of the site, kept in place: a host's view is larger than a
// CDU's, and boxing it would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum View {
    /// A GPU host.
    Host {
        /// Its latest telemetry.
        telemetry: Option<Timed<HostTelemetry>>,
        /// Its latest health.
        health: Option<Timed<HostHealth>>,
        /// Its software version, from `online`.
        software: Option<Timed<String>>,
    },
    /// A CDU's cooling controller.
    Cdu {
        /// Its latest telemetry.
        telemetry: Option<Timed<CduTelemetry>>,
        /// Its latest state.
        state: Option<Timed<CduState>>,
        /// Its software version, from `online`.
        software: Option<Timed<String>>,
    },
}

impl View {
    /// An empty view of a host.
    pub fn host() -> Self {
        View::Host {
            telemetry: None,
            health: None,
            software: None,
        }
    }

    /// An empty view of a CDU.
    pub fn cdu() -> Self {
        View::Cdu {
            telemetry: None,
            state: None,
            software: None,
        }
    }

    /// Whether it holds a measurement (telemetry, health or state): a
    /// device is born only then.
    pub fn has_data(&self) -> bool {
        match self {
            View::Host {
                telemetry, health, ..
            } => telemetry.is_some() || health.is_some(),
            View::Cdu {
                telemetry, state, ..
            } => telemetry.is_some() || state.is_some(),
        }
    }

    /// Its software version, from its `online`, said at `time`.
    pub fn set_software(&mut self, version: String, time: u64) {
        let (View::Host { software, .. } | View::Cdu { software, .. }) = self;
        *software = Some(Timed {
            message: version,
            time,
        });
    }

    /// Keeps `message`, measured at `time`, as the latest of its kind;
    /// `false`, keeping nothing, when it is no measurement of this kind
    /// of node. A CDU state that says its controller is silent
    /// (`controller-silent`: a firmware CDU's gateway no longer hears its
    /// microcontroller, and sends no telemetry) drops the telemetry heard
    /// before it: nothing measures the loop now, so the loop's metrics
    /// and `leak` are null until the next telemetry.
    pub fn record(&mut self, message: Message, time: u64) -> bool {
        match (message, self) {
            (Message::HostTelemetry(t), View::Host { telemetry, .. }) => {
                *telemetry = Some(Timed { message: t, time })
            }
            (Message::HostHealth(h), View::Host { health, .. }) => {
                *health = Some(Timed { message: h, time })
            }
            (Message::CduTelemetry(t), View::Cdu { telemetry, .. }) => {
                *telemetry = Some(Timed { message: t, time })
            }
            (
                Message::CduState(s),
                View::Cdu {
                    telemetry, state, ..
                },
            ) => {
                if s.reason == ReasonCode::CONTROLLER_SILENT {
                    *telemetry = None;
                }
                *state = Some(Timed { message: s, time })
            }
            _ => return false,
        }
        true
    }

    /// Every metric of the device, in birth order; `now` stamps the
    /// metrics no message has given a value yet.
    pub fn metrics(&self, now: u64) -> Vec<Point> {
        match self {
            View::Host {
                telemetry,
                health,
                software,
            } => host_metrics(telemetry.as_ref(), health.as_ref(), software.as_ref(), now),
            View::Cdu {
                telemetry,
                state,
                software,
            } => cdu_metrics(telemetry.as_ref(), state.as_ref(), software.as_ref(), now),
        }
    }
}

/// Builds the points of one message: each value with its name, type and
/// unit, all stamped with the message's time (or `now` when absent).
struct Points<'a> {
    out: &'a mut Vec<Point>,
    time: u64,
}

impl Points<'_> {
    fn add(
        &mut self,
        name: String,
        datatype: DataType,
        unit: Option<&'static str>,
        value: Option<Value>,
    ) {
        self.out.push(Point {
            name,
            datatype,
            value,
            unit,
            time: self.time,
        });
    }
}

fn stamp<T>(m: Option<&Timed<T>>, now: u64) -> u64 {
    m.map_or(now, |m| m.time)
}

fn software_point(out: &mut Vec<Point>, software: Option<&Timed<String>>, now: u64) {
    let mut p = Points {
        out,
        time: stamp(software, now),
    };
    let v = software.map(|s| Value::String(s.message.clone()));
    p.add("properties/software".into(), DataType::String, None, v);
}

/// The GPU indices a host's telemetry and health name, ascending.
fn gpu_indices(t: Option<&HostTelemetry>, h: Option<&HostHealth>) -> Vec<u8> {
    let mut all: Vec<u8> = t
        .into_iter()
        .flat_map(|t| t.gpus.iter().map(|g| g.gpu.get()))
        .chain(
            h.into_iter()
                .flat_map(|h| h.gpus.iter().map(|g| g.gpu.get())),
        )
        .collect();
    all.sort_unstable();
    all.dedup();
    all
}

fn host_metrics(
    telemetry: Option<&Timed<HostTelemetry>>,
    health: Option<&Timed<HostHealth>>,
    software: Option<&Timed<String>>,
    now: u64,
) -> Vec<Point> {
    let mut out = Vec::new();
    software_point(&mut out, software, now);
    let gpus = gpu_indices(telemetry.map(|t| &t.message), health.map(|h| &h.message));
    host_telemetry_points(&mut out, telemetry, &gpus, now);
    host_health_points(&mut out, health, &gpus, now);
    out
}

/// The most power a GPU's sample may say it draws or is limited to, W:
/// far past any GPU (the largest boards draw a few kW), so a figure above
/// it is malformed: published null, and left out of the host's power.
pub const GPU_POWER_MAX_W: u32 = 100_000;

/// A power figure a GPU can have: not past [`GPU_POWER_MAX_W`].
fn possible(w: u32) -> bool {
    w <= GPU_POWER_MAX_W
}

/// The GPU figures of a host's sample past [`GPU_POWER_MAX_W`] (a power
/// the agent could not read is not one): each GPU's index, the field and
/// its figure, for the log.
pub fn gpu_fields_past_any(t: &HostTelemetry) -> Vec<(u8, &'static str, u32)> {
    let mut bad = Vec::new();
    for g in &t.gpus {
        let power = (!g.unsupported.contains(Unsupported::POWER)).then_some(g.power.0);
        for (field, w) in [("power", power), ("power_limit", Some(g.power_limit.0))] {
            match w {
                Some(w) if !possible(w) => bad.push((g.gpu.get(), field, w)),
                _ => {}
            }
        }
    }
    bad
}

/// The GPUs of a sample that answered in time: a GPU that did not
/// repeats its last good values, which are not current.
fn responsive(t: &HostTelemetry) -> impl Iterator<Item = &GpuTelemetry> {
    t.gpus
        .iter()
        .filter(|g| g.flags.contains(GpuFlags::RESPONSIVE))
}

/// The host's power (the responsive GPUs that report it) and hottest die
/// (the responsive GPUs); each `None` when no GPU counts, the power also
/// when the sum does not fit its u32 metric.
fn host_figures(t: &HostTelemetry) -> (Option<u32>, Option<u8>) {
    let power: Vec<u64> = responsive(t)
        .filter(|g| !g.unsupported.contains(Unsupported::POWER) && possible(g.power.0))
        .map(|g| u64::from(g.power.0))
        .collect();
    // Summed wide (at most 16 GPUs): a sum past the metric's u32 is
    // unknown, never a wrong figure or a panic.
    let power = (!power.is_empty())
        .then(|| u32::try_from(power.iter().sum::<u64>()).ok())
        .flatten();
    (power, responsive(t).map(|g| g.temp.0).max())
}

fn host_telemetry_points(
    out: &mut Vec<Point>,
    telemetry: Option<&Timed<HostTelemetry>>,
    gpus: &[u8],
    now: u64,
) {
    let t = telemetry.map(|t| &t.message);
    let mut p = Points {
        out,
        time: stamp(telemetry, now),
    };
    let (power, hottest) = t.map_or((None, None), host_figures);
    p.add(
        "power_w".into(),
        DataType::UInt32,
        Some("W"),
        power.map(Value::UInt32),
    );
    p.add(
        "hottest_gpu_c".into(),
        DataType::UInt8,
        Some("°C"),
        hottest.map(Value::UInt8),
    );
    for &i in gpus {
        let g = t.and_then(|t| t.gpus.iter().find(|g| g.gpu.get() == i));
        // Measured values only from a GPU that answered in time.
        let live = g.filter(|g| g.flags.contains(GpuFlags::RESPONSIVE));
        let has = |field: Unsupported| live.filter(|g| !g.unsupported.contains(field));
        let name = |m: &str| format!("gpu/{i}/{m}");
        let temp = live.map(|g| Value::UInt8(g.temp.0));
        p.add(name("temp_c"), DataType::UInt8, Some("°C"), temp);
        let mem = has(Unsupported::MEM_TEMP).map(|g| Value::UInt8(g.mem_temp.0));
        p.add(name("mem_temp_c"), DataType::UInt8, Some("°C"), mem);
        let power = has(Unsupported::POWER)
            .filter(|g| possible(g.power.0))
            .map(|g| Value::UInt32(g.power.0));
        p.add(name("power_w"), DataType::UInt32, Some("W"), power);
        // The agent sends 0 W when NVML answers neither limit call: unknown.
        let limit = live
            .filter(|g| g.power_limit.0 > 0 && possible(g.power_limit.0))
            .map(|g| Value::UInt32(g.power_limit.0));
        p.add(name("power_limit_w"), DataType::UInt32, Some("W"), limit);
        let util = has(Unsupported::UTIL).map(|g| Value::UInt8(g.util.get()));
        p.add(name("util_pct"), DataType::UInt8, Some("%"), util);
        let responsive = g.map(|g| Value::Boolean(g.flags.contains(GpuFlags::RESPONSIVE)));
        p.add(name("responsive"), DataType::Boolean, None, responsive);
    }
}

fn host_health_points(
    out: &mut Vec<Point>,
    health: Option<&Timed<HostHealth>>,
    gpus: &[u8],
    now: u64,
) {
    let h = health.map(|h| &h.message);
    let mut p = Points {
        out,
        time: stamp(health, now),
    };
    let quarantined = h.map(|h| {
        let n = h
            .gpus
            .iter()
            .filter(|g| g.state == HealthState::Quarantined)
            .count();
        Value::UInt8(n as u8)
    });
    p.add(
        "gpus_quarantined".into(),
        DataType::UInt8,
        None,
        quarantined,
    );
    let stalled = h.map(|h| Value::Boolean(h.monitoring.stalled_since.is_some()));
    p.add(
        "monitoring_stalled".into(),
        DataType::Boolean,
        None,
        stalled,
    );
    // The agent's XID watch is down: a GPU's XIDs are not seen, so its
    // health may read healthy while it is not.
    let xid_down = h.map(|h| Value::Boolean(h.monitoring.xid_watch_down_since.is_some()));
    p.add("xid_watch_down".into(), DataType::Boolean, None, xid_down);
    for &i in gpus {
        let g = h.and_then(|h| h.gpus.iter().find(|g| g.gpu.get() == i));
        let name = |m: &str| format!("gpu/{i}/{m}");
        let state = g.map(|g| Value::String(health_name(g.state).into()));
        p.add(name("health"), DataType::String, None, state);
        let reason = g.map(|g| Value::String(g.reason.to_string()));
        p.add(name("health_reason"), DataType::String, None, reason);
        let q = g.map(|g| Value::Boolean(g.state == HealthState::Quarantined));
        p.add(name("quarantined"), DataType::Boolean, None, q);
    }
}

fn health_name(s: HealthState) -> &'static str {
    match s {
        HealthState::Healthy => "healthy",
        HealthState::Degraded => "degraded",
        HealthState::Quarantined => "quarantined",
    }
}

fn cdu_metrics(
    telemetry: Option<&Timed<CduTelemetry>>,
    state: Option<&Timed<CduState>>,
    software: Option<&Timed<String>>,
    now: u64,
) -> Vec<Point> {
    let mut out = Vec::new();
    software_point(&mut out, software, now);
    cdu_telemetry_points(&mut out, telemetry, now);
    leak_point(&mut out, telemetry, state, now);
    cdu_state_points(&mut out, state, now);
    out
}

fn celsius(c: loopwarden_protocol::Celsius) -> Value {
    Value::Double(c.value())
}

fn cdu_telemetry_points(out: &mut Vec<Point>, telemetry: Option<&Timed<CduTelemetry>>, now: u64) {
    let t = telemetry.map(|t| &t.message);
    let mut p = Points {
        out,
        time: stamp(telemetry, now),
    };
    let c = Some("°C");
    p.add(
        "supply_temp_c".into(),
        DataType::Double,
        c,
        t.and_then(|t| t.supply).map(celsius),
    );
    p.add(
        "return_temp_c".into(),
        DataType::Double,
        c,
        t.and_then(|t| t.return_temp).map(celsius),
    );
    p.add(
        "setpoint_c".into(),
        DataType::Double,
        c,
        t.map(|t| celsius(t.setpoint)),
    );
    let flow = t.and_then(|t| t.flow).map(|f| Value::Double(f.value()));
    p.add("flow_lpm".into(), DataType::Double, Some("L/min"), flow);
    let dp = t
        .and_then(|t| t.diff_pressure)
        .map(|d| Value::Double(d.value()));
    p.add(
        "diff_pressure_kpa".into(),
        DataType::Double,
        Some("kPa"),
        dp,
    );
    let fs = t.and_then(|t| t.facility_supply).map(celsius);
    p.add("facility_supply_temp_c".into(), DataType::Double, c, fs);
    p.add(
        "outdoor_temp_c".into(),
        DataType::Double,
        c,
        t.and_then(|t| t.ambient).map(celsius),
    );
    let level = t.and_then(|t| t.reservoir).map(|r| Value::UInt8(r.get()));
    p.add("reservoir_pct".into(), DataType::UInt8, Some("%"), level);
    for (pump, status) in [
        ("pump_a", t.map(|t| t.pump_a)),
        ("pump_b", t.map(|t| t.pump_b)),
    ] {
        let running = status.map(|s| Value::Boolean(s.running));
        p.add(format!("{pump}/running"), DataType::Boolean, None, running);
        let command = status.map(|s| Value::UInt8(s.command.get()));
        p.add(
            format!("{pump}/command_pct"),
            DataType::UInt8,
            Some("%"),
            command,
        );
        let speed = status
            .and_then(|s| s.feedback)
            .map(|f| Value::UInt8(f.get()));
        p.add(
            format!("{pump}/speed_pct"),
            DataType::UInt8,
            Some("%"),
            speed,
        );
    }
    let watts = |w: Option<loopwarden_protocol::Watts>| w.map(|w| Value::UInt32(w.0));
    p.add(
        "it_power_w".into(),
        DataType::UInt32,
        Some("W"),
        watts(t.and_then(|t| t.it_power)),
    );
    let cooling = watts(t.and_then(|t| t.cooling_power));
    p.add(
        "cooling_power_w".into(),
        DataType::UInt32,
        Some("W"),
        cooling,
    );
    let facility = watts(t.and_then(|t| t.facility_power));
    p.add(
        "facility_power_w".into(),
        DataType::UInt32,
        Some("W"),
        facility,
    );
    let pue = t.and_then(|t| t.pue).map(|p| Value::Double(p.value()));
    p.add("pue".into(), DataType::Double, None, pue);
}

/// The racks whose leak sensing is lost: a leak there would not be seen.
fn leak_sensing_lost(s: &CduState) -> usize {
    s.racks
        .iter()
        .filter(|r| r.sensing == LeakSensing::Lost)
        .count()
}

/// `leak`: true when a rack's leak input is active; false only when none
/// is and a state says no rack's sensing is lost (a lost rope reads
/// dry); else null: dry racks with no state heard are not known dry.
fn leak_point(
    out: &mut Vec<Point>,
    telemetry: Option<&Timed<CduTelemetry>>,
    state: Option<&Timed<CduState>>,
    now: u64,
) {
    let wet = telemetry.map(|t| t.message.racks.iter().any(|r| r.leak));
    let sensing_reads = state.is_some_and(|s| leak_sensing_lost(&s.message) == 0);
    let leak = match wet {
        Some(true) => Some(Value::Boolean(true)),
        Some(false) if sensing_reads => Some(Value::Boolean(false)),
        _ => None,
    };
    let mut p = Points {
        out,
        time: stamp(telemetry, now),
    };
    p.add("leak".into(), DataType::Boolean, None, leak);
}

fn cdu_state_points(out: &mut Vec<Point>, state: Option<&Timed<CduState>>, now: u64) {
    let s = state.map(|s| &s.message);
    let mut p = Points {
        out,
        time: stamp(state, now),
    };
    let mode = s.map(|s| Value::String(mode_name(s.mode).into()));
    p.add("mode".into(), DataType::String, None, mode);
    let reason = s.map(|s| Value::String(s.reason.to_string()));
    p.add("mode_reason".into(), DataType::String, None, reason);
    let lost = s.map(|s| {
        let n = s
            .racks
            .iter()
            .filter(|r| r.cooling == RackCooling::Lost)
            .count();
        Value::UInt8(n as u8)
    });
    p.add("racks_cooling_lost".into(), DataType::UInt8, None, lost);
    let blind = s.map(|s| Value::UInt8(leak_sensing_lost(s) as u8));
    p.add(
        "racks_leak_sensing_lost".into(),
        DataType::UInt8,
        None,
        blind,
    );
    let per_gpu = s
        .and_then(|s| s.flow_per_gpu)
        .map(|f| Value::Double(f.value()));
    p.add(
        "flow_per_gpu_lpm".into(),
        DataType::Double,
        Some("L/min"),
        per_gpu,
    );
    let water = s
        .and_then(|s| s.facility.as_ref())
        .and_then(|f| f.plan)
        .map(|plan| celsius(plan.water));
    p.add(
        "facility_water_target_c".into(),
        DataType::Double,
        Some("°C"),
        water,
    );
}

fn mode_name(m: loopwarden_protocol::CduMode) -> &'static str {
    use loopwarden_protocol::CduMode;
    match m {
        CduMode::Boot => "boot",
        CduMode::Normal => "normal",
        CduMode::Degraded => "degraded",
        CduMode::Failsafe => "failsafe",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, Message, MessageKind, Watts, WholeCelsius};

    fn value(points: &[Point], name: &str) -> Option<Value> {
        points
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
            .value
            .clone()
    }

    fn sample_host() -> View {
        let (Message::HostTelemetry(t), Message::HostHealth(h)) = (
            samples::message(MessageKind::HostTelemetry),
            samples::message(MessageKind::HostHealth),
        ) else {
            unreachable!("the samples are of their kinds")
        };
        View::Host {
            telemetry: Some(Timed {
                message: t,
                time: 5,
            }),
            health: Some(Timed {
                message: h,
                time: 4,
            }),
            software: None,
        }
    }

    #[test]
    fn a_host_has_every_gpus_metrics_from_its_telemetry_and_health() {
        let m = sample_host().metrics(9);
        assert_eq!(m.len(), 6 + 9 * 8, "6 host metrics and 9 per GPU");
        assert_eq!(value(&m, "xid_watch_down"), Some(Value::Boolean(false)));
        assert_eq!(value(&m, "power_w"), Some(Value::UInt32(5324)));
        assert_eq!(value(&m, "gpu/0/temp_c"), Some(Value::UInt8(61)));
        assert_eq!(value(&m, "gpu/6/power_limit_w"), Some(Value::UInt32(700)));
        assert_eq!(value(&m, "gpu/3/quarantined"), Some(Value::Boolean(true)));
        assert_eq!(
            value(&m, "gpu/3/health_reason"),
            Some(Value::String("xid-79".into()))
        );
        assert_eq!(
            value(&m, "gpu/5/health"),
            Some(Value::String("degraded".into()))
        );
        assert_eq!(value(&m, "gpus_quarantined"), Some(Value::UInt8(1)));
        assert_eq!(value(&m, "properties/software"), None);
        let temp = m.iter().find(|p| p.name == "gpu/0/temp_c").unwrap();
        assert_eq!((temp.time, temp.unit), (5, Some("°C")));
        let health = m.iter().find(|p| p.name == "gpu/0/health").unwrap();
        assert_eq!(health.time, 4, "stamped with the health frame's time");
    }

    #[test]
    fn an_unsupported_gpu_field_is_null_not_zero() {
        let mut view = sample_host();
        if let View::Host {
            telemetry: Some(t), ..
        } = &mut view
        {
            t.message.gpus[2].unsupported = Unsupported::MEM_TEMP | Unsupported::POWER;
        }
        let m = view.metrics(9);
        assert_eq!(value(&m, "gpu/2/mem_temp_c"), None);
        assert_eq!(value(&m, "gpu/2/power_w"), None);
        assert_eq!(value(&m, "gpu/2/temp_c"), Some(Value::UInt8(63)));
    }

    #[test]
    fn a_power_limit_the_agent_could_not_read_is_null_not_0_w() {
        let mut view = sample_host();
        let View::Host {
            telemetry: Some(t), ..
        } = &mut view
        else {
            unreachable!("the sample host has telemetry")
        };
        // The agent sends 0 W when NVML answers neither limit call.
        t.message.gpus[1].power_limit = Watts(0);
        let m = view.metrics(9);
        assert_eq!(value(&m, "gpu/1/power_limit_w"), None);
        assert_eq!(value(&m, "gpu/6/power_limit_w"), Some(Value::UInt32(700)));
    }

    #[test]
    fn an_unresponsive_gpus_repeated_values_are_null_and_left_out_of_the_host() {
        let mut view = sample_host();
        let View::Host {
            telemetry: Some(t), ..
        } = &mut view
        else {
            unreachable!("the sample host has telemetry")
        };
        let gpus = &mut t.message.gpus;
        let (hot_power, others) = (gpus[4].power.0, 5324 - gpus[4].power.0);
        gpus[4].temp = WholeCelsius(95);
        gpus[4].flags = gpus[4].flags.with(GpuFlags::RESPONSIVE, false);
        let m = view.metrics(9);
        for metric in [
            "temp_c",
            "mem_temp_c",
            "power_w",
            "power_limit_w",
            "util_pct",
        ] {
            assert_eq!(value(&m, &format!("gpu/4/{metric}")), None, "{metric}");
        }
        assert_eq!(value(&m, "gpu/4/responsive"), Some(Value::Boolean(false)));
        assert_eq!(value(&m, "gpu/0/temp_c"), Some(Value::UInt8(61)));
        assert!(hot_power > 0, "the sample's GPU 4 draws power");
        assert_eq!(value(&m, "power_w"), Some(Value::UInt32(others)));
        assert_ne!(value(&m, "hottest_gpu_c"), Some(Value::UInt8(95)));
        // No GPU answered: the host's figures are unknown, not 0.
        let View::Host {
            telemetry: Some(t), ..
        } = &mut view
        else {
            unreachable!("the sample host has telemetry")
        };
        for g in t.message.gpus.iter_mut() {
            g.flags = g.flags.with(GpuFlags::RESPONSIVE, false);
        }
        let m = view.metrics(9);
        assert_eq!(value(&m, "power_w"), None);
        assert_eq!(value(&m, "hottest_gpu_c"), None);
    }

    #[test]
    fn a_gpu_power_past_any_gpus_is_null_and_left_out_of_the_host() {
        let mut view = sample_host();
        let View::Host {
            telemetry: Some(t), ..
        } = &mut view
        else {
            unreachable!("the sample host has telemetry")
        };
        for g in t.message.gpus.iter_mut() {
            g.flags = g.flags.with(GpuFlags::RESPONSIVE, true);
            g.unsupported = Unsupported::empty();
        }
        let gpus = &mut t.message.gpus;
        let others: u32 = gpus[1..].iter().map(|g| g.power.0).sum();
        gpus[0].power = Watts(1 << 31);
        gpus[0].power_limit = Watts(GPU_POWER_MAX_W + 1);
        let bad = gpu_fields_past_any(&t.message);
        assert_eq!(
            bad,
            [
                (0, "power", 1 << 31),
                (0, "power_limit", GPU_POWER_MAX_W + 1)
            ]
        );
        let m = view.metrics(9);
        assert_eq!(value(&m, "gpu/0/power_w"), None, "malformed: unknown");
        assert_eq!(value(&m, "gpu/0/power_limit_w"), None);
        assert_eq!(value(&m, "power_w"), Some(Value::UInt32(others)));
        assert!(
            value(&m, "gpu/0/temp_c").is_some(),
            "its other figures stand"
        );
    }

    #[test]
    fn a_cdu_has_its_loop_and_mode_and_a_lost_sensor_is_null() {
        let (Message::CduTelemetry(mut t), Message::CduState(s)) = (
            samples::message(MessageKind::CduTelemetry),
            samples::message(MessageKind::CduState),
        ) else {
            unreachable!("the samples are of their kinds")
        };
        t.return_temp = None;
        let view = View::Cdu {
            telemetry: Some(Timed {
                message: t,
                time: 1,
            }),
            state: Some(Timed {
                message: s,
                time: 2,
            }),
            software: Some(Timed {
                message: "0.1.0".into(),
                time: 3,
            }),
        };
        let m = view.metrics(9);
        assert_eq!(value(&m, "supply_temp_c"), Some(Value::Double(32.05)));
        assert_eq!(value(&m, "return_temp_c"), None);
        assert_eq!(value(&m, "flow_lpm"), Some(Value::Double(172.8)));
        assert_eq!(value(&m, "pump_a/speed_pct"), Some(Value::UInt8(59)));
        assert_eq!(value(&m, "pump_b/speed_pct"), None);
        assert_eq!(value(&m, "facility_power_w"), Some(Value::UInt32(117_550)));
        assert_eq!(value(&m, "mode"), Some(Value::String("degraded".into())));
        assert_eq!(value(&m, "racks_cooling_lost"), Some(Value::UInt8(1)));
        assert_eq!(
            value(&m, "facility_water_target_c"),
            Some(Value::Double(29.0))
        );
        assert_eq!(
            value(&m, "properties/software"),
            Some(Value::String("0.1.0".into()))
        );
        let empty = View::cdu().metrics(9);
        let names = |v: &[Point]| v.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        assert_eq!(
            names(&empty),
            names(&m),
            "the set does not depend on what was heard"
        );
        assert!(empty.iter().all(|p| p.value.is_none() && p.time == 9));
    }

    #[test]
    fn a_cdu_whose_leak_sensing_is_lost_does_not_read_dry() {
        let (Message::CduTelemetry(t), Message::CduState(s)) = (
            samples::message(MessageKind::CduTelemetry),
            samples::message(MessageKind::CduState),
        ) else {
            unreachable!("the samples are of their kinds")
        };
        let view = |t: &CduTelemetry, s: &CduState| View::Cdu {
            telemetry: Some(Timed {
                message: t.clone(),
                time: 1,
            }),
            state: Some(Timed {
                message: s.clone(),
                time: 2,
            }),
            software: None,
        };
        let m = view(&t, &s).metrics(9);
        assert_eq!(value(&m, "leak"), Some(Value::Boolean(false)));
        assert_eq!(value(&m, "racks_leak_sensing_lost"), Some(Value::UInt8(0)));
        let mut blind = s.clone();
        blind.racks[1].sensing = LeakSensing::Lost;
        let m = view(&t, &blind).metrics(9);
        assert_eq!(value(&m, "leak"), None, "dry racks, one of them unseen");
        assert_eq!(value(&m, "racks_leak_sensing_lost"), Some(Value::UInt8(1)));
        let mut wet = t.clone();
        wet.racks[0].leak = true;
        let m = view(&wet, &blind).metrics(9);
        assert_eq!(
            value(&m, "leak"),
            Some(Value::Boolean(true)),
            "a leak is seen"
        );
        let mut unprotected = s.clone();
        unprotected.racks[1].sensing = LeakSensing::Unprotected;
        let m = view(&t, &unprotected).metrics(9);
        assert_eq!(
            value(&m, "leak"),
            Some(Value::Boolean(false)),
            "declared so"
        );
    }

    #[test]
    fn dry_racks_without_a_state_do_not_read_dry() {
        let Message::CduTelemetry(t) = samples::message(MessageKind::CduTelemetry) else {
            unreachable!("the sample is CDU telemetry")
        };
        assert!(t.racks.iter().all(|r| !r.leak), "the sample is dry");
        let mut view = View::cdu();
        assert!(view.record(Message::CduTelemetry(t.clone()), 1));
        let m = view.metrics(9);
        assert_eq!(value(&m, "leak"), None, "no state: sensing unknown");
        let mut wet = t;
        wet.racks[0].leak = true;
        assert!(view.record(Message::CduTelemetry(wet), 2));
        let m = view.metrics(9);
        assert_eq!(value(&m, "leak"), Some(Value::Boolean(true)));
    }

    #[test]
    fn a_host_whose_xid_watch_is_down_says_so() {
        let mut view = sample_host();
        if let View::Host {
            health: Some(h), ..
        } = &mut view
        {
            h.message.monitoring.xid_watch_down_since = Some(loopwarden_protocol::TimestampMs(3));
        }
        let m = view.metrics(9);
        assert_eq!(value(&m, "xid_watch_down"), Some(Value::Boolean(true)));
        assert_eq!(value(&View::host().metrics(9), "xid_watch_down"), None);
    }

    #[test]
    fn a_time_since_boot_is_replaced_by_the_receive_time() {
        assert_eq!(measured_at(1_795_953_600_000, 7), 1_795_953_600_000);
        assert_eq!(
            measured_at(86_400_000, 1_795_953_600_000),
            1_795_953_600_000
        );
    }
}

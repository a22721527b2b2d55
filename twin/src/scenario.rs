//! Plant scenarios (`plant-scenario/1`): what happens to the hall over a
//! run: outdoor temperature, workload, faults.
//!
//! A scenario is TOML (`docs/plant-model.md` §8). It is read whole and
//! checked before anything runs: an unknown key, a curve out of order or
//! out of range, a fault of an unknown kind or with a target the site does
//! not have is refused with the field and the reason.
//!
//! Glossary:
//! - *curve*: `[[t_s, value], …]`, piecewise linear in time, held flat
//!   before its first and after its last point.
//! - *fault*: something that breaks at `at_s` and, if `until_s` is given,
//!   is cleared then.
//! - *sensor fault*: what the faults in force do to one sensor together
//!   ([`SensorFault`]), by one rule for `simulate` and the live hall.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::plant::SiteConfig;

/// A piecewise linear function of time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Curve(pub Vec<[f64; 2]>);

impl Curve {
    /// The value at `t` seconds.
    pub fn at(&self, t: f64) -> f64 {
        let p = &self.0;
        match p.iter().position(|[pt, _]| *pt > t) {
            None => p.last().map_or(0.0, |[_, v]| *v),
            Some(0) => p[0][1],
            Some(i) => {
                let ([t0, v0], [t1, v1]) = (p[i - 1], p[i]);
                v0 + (v1 - v0) * (t - t0) / (t1 - t0)
            }
        }
    }

    fn check(&self, what: &str, lo: f64, hi: f64) -> Result<(), String> {
        if self.0.is_empty() {
            return Err(format!("{what}: no points"));
        }
        for (i, [t, v]) in self.0.iter().enumerate() {
            if !t.is_finite() || *t < 0.0 {
                return Err(format!(
                    "{what}: point {i} at t = {t} s: time must be 0 or more"
                ));
            }
            if !(lo..=hi).contains(v) {
                return Err(format!("{what}: point {i} = {v} is outside {lo} to {hi}"));
            }
        }
        if let Some(w) = self.0.windows(2).position(|w| w[1][0] <= w[0][0]) {
            return Err(format!(
                "{what}: point {} at t = {} s does not come after t = {} s",
                w + 1,
                self.0[w + 1][0],
                self.0[w][0]
            ));
        }
        Ok(())
    }
}

/// The scenario file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    description: String,
    duration_s: u64,
    seed: u64,
    #[serde(default)]
    site: Option<toml::Value>,
    #[serde(default)]
    truth: Option<toml::Value>,
    ambient: Ambient,
    load: BTreeMap<String, Curve>,
    #[serde(default)]
    fault: Vec<FaultFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ambient {
    points: Curve,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultFile {
    at_s: u64,
    until_s: Option<u64>,
    kind: String,
    #[serde(default)]
    target: String,
    /// Absent: 0 for a kind that ignores it or defaults it; a kind whose
    /// value is its whole meaning refuses to do without one.
    value: Option<f64>,
    /// In a hall of several CDUs: the CDU a fault of one CDU acts on.
    #[serde(default)]
    cdu: Option<usize>,
}

/// A sensor of the CDU a fault can falsify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SensorName {
    /// Secondary supply temperature.
    SupplyTemp,
    /// Secondary return temperature.
    ReturnTemp,
    /// Secondary flow.
    Flow,
    /// Loop differential pressure.
    DiffPressure,
    /// Facility water supply temperature.
    FacilitySupplyTemp,
    /// Outdoor dry-bulb temperature: the dry cooler's sensor, as the CDU
    /// reports it (the controller never reads the scenario's ambient).
    OutdoorTemp,
}

impl SensorName {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "supply_temp" => Self::SupplyTemp,
            "return_temp" => Self::ReturnTemp,
            "flow" => Self::Flow,
            "diff_pressure" => Self::DiffPressure,
            "facility_supply_temp" => Self::FacilitySupplyTemp,
            "outdoor_temp" => Self::OutdoorTemp,
            _ => return None,
        })
    }
}

/// What breaks.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The trim chiller stops.
    ChillerTrip,
    /// A pump stops (0 = A, 1 = B).
    PumpTrip(usize),
    /// The dry cooler keeps this share of its UA.
    DryCoolerDegraded(f64),
    /// A rack leaks.
    Leak(usize),
    /// A sensor keeps its last value.
    SensorStuck(SensorName),
    /// A sensor drifts by this many units per minute.
    SensorDrift(SensorName, f64),
    /// A sensor stops answering.
    SensorLost(SensorName),
    /// The MQTT broker is unreachable.
    BusOutage,
    /// The CDU does not answer on Modbus.
    ModbusOutage,
    /// A rack's valve no longer moves.
    ValveStuck(usize),
    /// A GPU falls off the bus (XID 79): rack, host, GPU.
    GpuFail(usize, usize, usize),
    /// A pump's contactor stays closed and reports running, but the pump
    /// moves no water (0 = A, 1 = B).
    PumpSeized(usize),
    /// The controller's process stops for this many seconds and starts
    /// again from its flash.
    ControllerRestart(f64),
    /// A rack's leak rope cable breaks: the rope reads dry and its
    /// supervision line reports the break.
    RopeCut(usize),
    /// Reading the controller board's input lines fails.
    BoardIoFault,
    /// The CDU answers reads but refuses every write (local mode).
    CduWriteRefused,
    /// A rack's cold-plate resistance rises linearly from 1x at the
    /// fault's start to this factor at its `until_s`, then stays.
    ColdPlateFouling(usize, f64),
    /// A rack's valve position input reports this (true: closed) whatever
    /// the valve does.
    ValveFeedbackStuck(usize, bool),
    /// At the next controller restart, the newest latched-state record in
    /// the controller's flash is damaged; older records are intact.
    LatchCorrupt,
}

/// What the faults in force do to one sensor, by one rule for every
/// runner (`docs/plant-model.md` §8): a lost sensor is lost whatever else
/// acts on it, a stuck one stays stuck whatever drifts, and of several
/// drifts the first in the file counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SensorFault {
    /// No fault: it reads the truth.
    None,
    /// It reads nothing.
    Lost,
    /// It keeps the reading it had when it stuck.
    Stuck,
    /// It drifts by this many units per minute.
    Drift(f64),
}

impl SensorFault {
    /// What the faults of `active` (in file order) do to sensor `name`.
    pub fn of<'a>(active: impl IntoIterator<Item = &'a FaultKind>, name: SensorName) -> Self {
        let mut out = Self::None;
        for f in active {
            match f {
                FaultKind::SensorLost(n) if *n == name => return Self::Lost,
                FaultKind::SensorStuck(n) if *n == name => out = Self::Stuck,
                FaultKind::SensorDrift(n, rate) if *n == name && out == Self::None => {
                    out = Self::Drift(*rate)
                }
                _ => {}
            }
        }
        out
    }
}

/// A fault and when it acts.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// From, s.
    pub at_s: u64,
    /// Until, s (`None`: to the end).
    pub until_s: Option<u64>,
    /// What.
    pub kind: FaultKind,
    /// The CDU a fault of one CDU acts on (a hall of several CDUs; racks
    /// are numbered across the hall, so a rack's fault names its CDU by
    /// its rack). `None` in a hall of one CDU and for the facility's
    /// faults.
    pub cdu: Option<usize>,
}

/// What a fault acts on in a hall of several CDUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// The facility loop or the bus: every CDU.
    Hall,
    /// One CDU's equipment.
    Cdu,
    /// One rack (numbered across the hall).
    Rack(usize),
}

impl FaultKind {
    fn reach(&self) -> Reach {
        match self {
            Self::ChillerTrip | Self::DryCoolerDegraded(_) | Self::BusOutage => Reach::Hall,
            Self::Leak(r)
            | Self::ValveStuck(r)
            | Self::RopeCut(r)
            | Self::GpuFail(r, _, _)
            | Self::ValveFeedbackStuck(r, _)
            | Self::ColdPlateFouling(r, _) => Reach::Rack(*r),
            _ => Reach::Cdu,
        }
    }

    /// The same fault with its rack `r` as `r - first` (the racks of one
    /// CDU numbered from 0).
    fn rack_from(&self, first: usize) -> Self {
        match self.clone() {
            Self::Leak(r) => Self::Leak(r - first),
            Self::ValveStuck(r) => Self::ValveStuck(r - first),
            Self::RopeCut(r) => Self::RopeCut(r - first),
            Self::GpuFail(r, h, g) => Self::GpuFail(r - first, h, g),
            Self::ColdPlateFouling(r, v) => Self::ColdPlateFouling(r - first, v),
            Self::ValveFeedbackStuck(r, v) => Self::ValveFeedbackStuck(r - first, v),
            other => other,
        }
    }
}

impl Fault {
    /// Whether it acts at `t` seconds. Fouling, once begun, stays: its
    /// `until_s` is when it reaches its factor.
    pub fn active(&self, t: f64) -> bool {
        let lasts = matches!(self.kind, FaultKind::ColdPlateFouling(..));
        t >= self.at_s as f64 && (lasts || self.until_s.is_none_or(|u| t < u as f64))
    }

    /// A fouling fault's factor at `t` seconds (1 before it begins).
    fn fouling_at(&self, t: f64, factor: f64) -> f64 {
        let start = self.at_s as f64;
        let share = match self.until_s {
            Some(u) if t < u as f64 => ((t - start) / (u as f64 - start)).clamp(0.0, 1.0),
            _ if t >= start => 1.0,
            _ => 0.0,
        };
        1.0 + (factor - 1.0) * share
    }
}

/// A checked scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// One line.
    pub description: String,
    /// Length, s.
    pub duration_s: u64,
    /// Seed of the noise.
    pub seed: u64,
    /// The hall as its configuration says (what a controller is given).
    pub site: SiteConfig,
    /// The hall as it is (`[site]` overlaid with `[truth]`): what the
    /// plant and the oracle run on.
    pub truth: SiteConfig,
    /// Per rack: its cold plates' resistance as a multiple of the model's,
    /// as built (`[truth.rack_plate_factor]`; 1 where not given).
    pub plate_factor: Vec<f64>,
    /// Outdoor dry-bulb, °C.
    pub ambient: Curve,
    /// Demand of every rack.
    pub load_all: Curve,
    /// Demand of single racks, by index.
    pub load_racks: BTreeMap<usize, Curve>,
    /// Faults, in file order.
    pub faults: Vec<Fault>,
}

impl Scenario {
    /// Reads and checks a scenario; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            match line {
                Some(l) => format!("{origin} line {l}: {}", e.message()),
                None => format!("{origin}: {}", e.message()),
            }
        })?;
        let err = |m: String| format!("{origin}: {m}");
        if file.format != "plant-scenario/1" {
            return Err(err(format!(
                "format = {:?}, expected \"plant-scenario/1\"",
                file.format
            )));
        }
        if file.duration_s == 0 {
            return Err(err("duration_s must be above 0".into()));
        }
        let (truth, plate_factor) = truth_of(file.site.clone(), file.truth).map_err(err)?;
        let site = site_of(file.site).map_err(err)?;
        for (what, a, b) in [
            ("racks", site.racks, truth.racks),
            ("hosts_per_rack", site.hosts_per_rack, truth.hosts_per_rack),
            ("gpus_per_host", site.gpus_per_host, truth.gpus_per_host),
        ] {
            if a != b {
                return Err(err(format!("[truth]: {what} is the hall's layout, not a figure the site can get wrong ({a} in [site], {b} in [truth])")));
            }
        }
        if site.cdus != truth.cdus {
            return Err(err(format!("[truth]: cdus is the hall's layout, not a figure the site can get wrong ({} in [site], {} in [truth])", site.cdus, truth.cdus)));
        }
        if !(1..=64).contains(&site.cdus) {
            return Err(err(format!("[site] cdus = {}: from 1 to 64", site.cdus)));
        }
        let racks = hall_racks(&site);
        if let Some(r) = plate_factor.keys().find(|r| **r >= racks) {
            return Err(err(format!(
                "[truth.rack_plate_factor] {r:?}: a rack from 0 to {}",
                racks - 1
            )));
        }
        let plate_factor = (0..racks)
            .map(|r| plate_factor.get(&r).copied().unwrap_or(1.0))
            .collect();
        file.ambient
            .points
            .check("[ambient] points", -60.0, 60.0)
            .map_err(err)?;
        let (load_all, load_racks) = loads_of(file.load, &site).map_err(err)?;
        let faults = file
            .fault
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let named = |m: String| err(format!("fault {} ({}): {m}", i + 1, f.kind));
                if f.at_s >= file.duration_s {
                    return Err(named(format!(
                        "at_s = {} is not before duration_s = {}: it would never act in the run",
                        f.at_s, file.duration_s
                    )));
                }
                fault_of(f, &site).map_err(named)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            description: file.description,
            duration_s: file.duration_s,
            seed: file.seed,
            site,
            truth,
            plate_factor,
            ambient: file.ambient.points,
            load_all,
            load_racks,
            faults,
        })
    }

    /// Reads and checks a scenario file.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// The demand of `rack` at `t` seconds.
    pub fn demand(&self, rack: usize, t: f64) -> f64 {
        self.load_racks.get(&rack).unwrap_or(&self.load_all).at(t)
    }

    /// What the plant is subjected to at `t` seconds: the outdoor air, each
    /// GPU's demand (none for a GPU in `failed`), and the equipment faults.
    pub fn conditions(&self, t: f64, failed: &[bool]) -> crate::plant::Conditions {
        let per_rack = self.site.hosts_per_rack * self.site.gpus_per_host;
        let active: Vec<&FaultKind> = self.active(t).collect();
        crate::plant::Conditions {
            ambient_c: self.ambient.at(t),
            demand: failed
                .iter()
                .enumerate()
                .map(|(i, &f)| if f { 0.0 } else { self.demand(i / per_rack, t) })
                .collect(),
            pump_tripped: [0, 1].map(|i| {
                active.contains(&&FaultKind::PumpTrip(i))
                    || active.contains(&&FaultKind::PumpSeized(i))
            }),
            plate_factor: (0..self.site.racks)
                .map(|r| {
                    self.faults
                        .iter()
                        .filter_map(|f| match f.kind {
                            FaultKind::ColdPlateFouling(rack, v) if rack == r => {
                                Some(f.fouling_at(t, v))
                            }
                            _ => None,
                        })
                        .product::<f64>()
                        * self.plate_factor.get(r).copied().unwrap_or(1.0)
                })
                .collect(),
            chiller_tripped: active.contains(&&FaultKind::ChillerTrip),
            dry_cooler_fraction: active
                .iter()
                .find_map(|f| match f {
                    FaultKind::DryCoolerDegraded(v) => Some(*v),
                    _ => None,
                })
                .unwrap_or(1.0),
        }
    }

    /// Leaks that have begun before `t` seconds (`leaks` in the summary:
    /// `simulate` counts them at its end, `duration_s`, the live hall at
    /// the time it has played to).
    pub fn leaks_before(&self, t: f64) -> u32 {
        self.faults
            .iter()
            .filter(|f| matches!(f.kind, FaultKind::Leak(_)) && (f.at_s as f64) < t)
            .count() as u32
    }

    /// The faults acting at `t` seconds.
    pub fn active(&self, t: f64) -> impl Iterator<Item = &FaultKind> {
        self.faults
            .iter()
            .filter(move |f| f.active(t))
            .map(|f| &f.kind)
    }

    /// CDU `c` of a hall of several CDUs as a scenario of its own: its
    /// racks numbered from 0 with their loads and plates, its own faults
    /// and the facility's. The site keeps `cdus` (the CDU's controller
    /// knows its facility water is shared); its figures are one CDU's.
    pub fn cdu_view(&self, c: usize) -> Scenario {
        let racks = self.site.racks;
        let first = c * racks;
        let mine = first..first + racks;
        let faults = self
            .faults
            .iter()
            .filter(|f| match f.kind.reach() {
                Reach::Hall => true,
                Reach::Cdu => f.cdu.unwrap_or(0) == c,
                Reach::Rack(r) => mine.contains(&r),
            })
            .map(|f| Fault {
                kind: f.kind.rack_from(first),
                cdu: None,
                ..f.clone()
            })
            .collect();
        Scenario {
            plate_factor: (0..racks)
                .map(|r| self.plate_factor.get(first + r).copied().unwrap_or(1.0))
                .collect(),
            load_racks: self
                .load_racks
                .iter()
                .filter(|(r, _)| mine.contains(r))
                .map(|(r, curve)| (r - first, curve.clone()))
                .collect(),
            faults,
            ..self.clone()
        }
    }
}

/// Whether `error`, from [`Scenario::load`], refuses a scenario written
/// for a later model of the hall: a fault kind this twin does not model
/// yet. Tests over the public scenarios skip such a
/// scenario and say so; any other refusal fails them.
pub fn is_later_model(error: &str) -> bool {
    error.contains("unknown kind")
}

/// `[site]` overlaid with `[truth]` (every field `[truth]` gives replaces
/// the configured one, table by table), checked, and the per-rack
/// cold-plate factors of `[truth.rack_plate_factor]`.
fn truth_of(
    site: Option<toml::Value>,
    truth: Option<toml::Value>,
) -> Result<(SiteConfig, BTreeMap<usize, f64>), String> {
    let Some(toml::Value::Table(mut truth)) = truth else {
        if truth.is_some() {
            return Err("[truth] must be a table".into());
        }
        return Ok((site_of(site)?, BTreeMap::new()));
    };
    let mut factors = BTreeMap::new();
    if let Some(t) = truth.remove("rack_plate_factor") {
        let t: BTreeMap<String, f64> = t
            .try_into()
            .map_err(|e: toml::de::Error| format!("[truth.rack_plate_factor]: {}", e.message()))?;
        for (k, v) in t {
            let rack: usize = k
                .parse()
                .map_err(|_| format!("[truth.rack_plate_factor] {k:?}: a rack number"))?;
            if !(v.is_finite() && (0.5..=20.0).contains(&v)) {
                return Err(format!(
                    "[truth.rack_plate_factor] {k:?} = {v}: a factor from 0.5 to 20"
                ));
            }
            factors.insert(rack, v);
        }
    }
    let mut merged = match site {
        Some(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    overlay(&mut merged, truth);
    let site = site_of(Some(toml::Value::Table(merged)))
        .map_err(|e| e.replacen("[site]", "[truth]", 1))?;
    Ok((site, factors))
}

/// Puts every field of `top` into `base`, merging tables.
fn overlay(base: &mut toml::Table, top: toml::Table) {
    for (k, v) in top {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(t)) => overlay(b, t),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// The `[site]` table (the default site when there is none), checked.
fn site_of(table: Option<toml::Value>) -> Result<SiteConfig, String> {
    let site: SiteConfig = match table {
        Some(v) => v
            .try_into()
            .map_err(|e: toml::de::Error| format!("[site]: {}", e.message()))?,
        None => SiteConfig::default(),
    };
    if site.racks == 0 || site.hosts_per_rack == 0 || site.gpus_per_host == 0 {
        return Err("[site]: racks, hosts_per_rack and gpus_per_host must be above 0".into());
    }
    Ok(site)
}

/// The `[load]` curves, checked: the one of every rack (`all`) and those
/// of single racks.
fn loads_of(
    load: BTreeMap<String, Curve>,
    site: &SiteConfig,
) -> Result<(Curve, BTreeMap<usize, Curve>), String> {
    let mut load_all = None;
    let mut load_racks = BTreeMap::new();
    for (key, curve) in load {
        curve.check(&format!("[load] {key}"), 0.0, 1.0)?;
        if key == "all" {
            load_all = Some(curve);
        } else {
            let rack: usize = key
                .parse()
                .ok()
                .filter(|r| *r < hall_racks(site))
                .ok_or_else(|| {
                    format!(
                        "[load] {key:?}: \"all\" or a rack from 0 to {}",
                        hall_racks(site) - 1
                    )
                })?;
            load_racks.insert(rack, curve);
        }
    }
    let load_all = load_all.ok_or_else(|| "[load] needs \"all\"".to_string())?;
    Ok((load_all, load_racks))
}

/// One `[[fault]]`, checked against the site; the error names the field
/// and the reason (the caller names the fault).
fn fault_of(f: &FaultFile, site: &SiteConfig) -> Result<Fault, String> {
    if f.until_s.is_some_and(|u| u <= f.at_s) {
        return Err(format!("until_s must come after at_s = {}", f.at_s));
    }
    let racks = hall_racks(site);
    let rack = || {
        f.target
            .parse::<usize>()
            .ok()
            .filter(|r| *r < racks)
            .ok_or_else(|| format!("target {:?}: a rack from 0 to {}", f.target, racks - 1))
    };
    // A kind that takes no value ignores it; one with a default has it.
    let value = f.value.unwrap_or(0.0);
    let needed = |what: &str| {
        f.value
            .ok_or_else(|| format!("value: missing; a {} needs {what}", f.kind))
    };
    let sensor = || {
        SensorName::parse(&f.target).ok_or_else(|| {
            format!(
                "target {:?}: supply_temp, return_temp, flow, diff_pressure, facility_supply_temp or outdoor_temp",
                f.target
            )
        })
    };
    let kind = match f.kind.as_str() {
        "chiller_trip" => FaultKind::ChillerTrip,
        "pump_trip" => FaultKind::PumpTrip(pump_of(&f.target)?),
        "dry_cooler_degraded" => {
            let v = needed("the share of UA left, 0 to 1")?;
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("value {v}: the share of UA left, 0 to 1"));
            }
            FaultKind::DryCoolerDegraded(v)
        }
        "leak" => FaultKind::Leak(rack()?),
        "sensor_stuck" => FaultKind::SensorStuck(sensor()?),
        "sensor_drift" => {
            let rate = needed("its drift in K (or L/min, or kPa) per minute")?;
            if !rate.is_finite() {
                return Err(format!(
                    "value {rate}: its drift per minute, a finite number"
                ));
            }
            FaultKind::SensorDrift(sensor()?, rate)
        }
        "sensor_lost" => FaultKind::SensorLost(sensor()?),
        "bus_outage" => FaultKind::BusOutage,
        "modbus_outage" => FaultKind::ModbusOutage,
        "valve_stuck" => FaultKind::ValveStuck(rack()?),
        "gpu_fail" => gpu_fail_of(&f.target, site)?,
        "pump_seized" => FaultKind::PumpSeized(pump_of(&f.target)?),
        "controller_restart" => {
            let down = if value == 0.0 { 5.0 } else { value };
            if !(down > 0.0 && down <= 3600.0) {
                return Err(format!("value {value}: seconds down, above 0 and at most 3600"));
            }
            FaultKind::ControllerRestart(down)
        }
        "rope_cut" => FaultKind::RopeCut(rack()?),
        "board_io_fault" => FaultKind::BoardIoFault,
        "cdu_write_refused" => FaultKind::CduWriteRefused,
        "valve_feedback_stuck" => {
            let closed = if value == 1.0 {
                true
            } else if value == 0.0 {
                false
            } else {
                return Err(format!("value {value}: 1 (reads closed) or 0 (reads open)"));
            };
            FaultKind::ValveFeedbackStuck(rack()?, closed)
        }
        "latch_corrupt" => FaultKind::LatchCorrupt,
        "cold_plate_fouling" => {
            let v = needed("the factor reached, 1 to 20")?;
            if !(1.0..=20.0).contains(&v) {
                return Err(format!("value {v}: the factor reached, 1 to 20"));
            }
            FaultKind::ColdPlateFouling(rack()?, v)
        }
        other => {
            return Err(format!(
                "unknown kind {other:?}; known: chiller_trip, pump_trip, dry_cooler_degraded, leak, sensor_stuck, sensor_drift, sensor_lost, bus_outage, modbus_outage, valve_stuck, gpu_fail, pump_seized, controller_restart, rope_cut, board_io_fault, cdu_write_refused, cold_plate_fouling, valve_feedback_stuck, latch_corrupt"
            ))
        }
    };
    let cdu = match (kind.reach(), f.cdu, site.cdus) {
        (Reach::Cdu, None, n) if n > 1 => {
            return Err(format!("cdu: which of the {n} CDUs, 0 to {}", n - 1))
        }
        (Reach::Cdu, Some(c), n) if c >= n => {
            return Err(format!("cdu = {c}: a CDU from 0 to {}", n - 1))
        }
        (Reach::Cdu, c, n) if n > 1 => c,
        (Reach::Cdu, _, _) => None,
        (_, Some(_), _) => {
            return Err(
                "cdu: only a fault of one CDU's equipment names its CDU (a rack's CDU is its rack's; the facility's faults act on every CDU)".into(),
            )
        }
        _ => None,
    };
    Ok(Fault {
        at_s: f.at_s,
        until_s: f.until_s,
        kind,
        cdu,
    })
}

/// Racks in the whole hall (every CDU's, numbered across it).
fn hall_racks(site: &SiteConfig) -> usize {
    site.racks * site.cdus.max(1)
}

/// A pump target: A (0) or B (1).
fn pump_of(target: &str) -> Result<usize, String> {
    match target {
        "A" => Ok(0),
        "B" => Ok(1),
        other => Err(format!("target {other:?}: pump A or B")),
    }
}

/// A `gpu_fail` target, `rack.host.gpu`, checked against the site: three
/// whole numbers and nothing else (a part that is not one refuses it).
fn gpu_fail_of(target: &str, site: &SiteConfig) -> Result<FaultKind, String> {
    let parts: Vec<Option<usize>> = target.split('.').map(|p| p.parse().ok()).collect();
    match parts[..] {
        [Some(r), Some(h), Some(g)]
            if r < hall_racks(site) && h < site.hosts_per_rack && g < site.gpus_per_host =>
        {
            Ok(FaultKind::GpuFail(r, h, g))
        }
        _ => Err(format!(
            "target {:?}: \"rack.host.gpu\" within {} racks, {} hosts, {} GPUs",
            target,
            hall_racks(site),
            site.hosts_per_rack,
            site.gpus_per_host
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEATWAVE: &str = r#"
format = "plant-scenario/1"
description = "heat wave, chiller trips at the peak"
duration_s = 7200
seed = 3

[site]
racks = 2

[ambient]
points = [[0, 41.0], [2700, 45.0], [7200, 41.5]]

[load]
all = [[0, 1.0], [7200, 1.0]]
"1" = [[0, 0.0], [1800, 1.0]]

[[fault]]
at_s = 1800
until_s = 3600
kind = "chiller_trip"

[[fault]]
at_s = 900
kind = "sensor_drift"
target = "return_temp"
value = 0.5

[[fault]]
at_s = 100
kind = "gpu_fail"
target = "1.3.7"
"#;

    #[test]
    fn a_scenario_reads_with_its_curves_overrides_and_faults() {
        let s = Scenario::from_toml(HEATWAVE, "heatwave.toml").expect("valid");
        assert_eq!(s.site.racks, 2);
        assert_eq!(s.ambient.at(0.0), 41.0);
        assert!(
            (s.ambient.at(1350.0) - 43.0).abs() < 1e-9,
            "halfway to the peak"
        );
        assert_eq!(s.ambient.at(99_999.0), 41.5, "flat after the last point");
        assert_eq!(s.demand(0, 900.0), 1.0);
        assert_eq!(s.demand(1, 900.0), 0.5, "rack 1's own curve");
        let at = |t: f64| s.active(t).cloned().collect::<Vec<_>>();
        assert_eq!(at(50.0), vec![]);
        assert_eq!(
            at(2000.0),
            vec![
                FaultKind::ChillerTrip,
                FaultKind::SensorDrift(SensorName::ReturnTemp, 0.5),
                FaultKind::GpuFail(1, 3, 7)
            ]
        );
        assert!(
            !at(3600.0).contains(&FaultKind::ChillerTrip),
            "cleared at until_s"
        );
    }

    #[test]
    fn mistakes_are_refused_with_the_field_and_the_reason() {
        let bad = |from: &str, to: &str| {
            Scenario::from_toml(&HEATWAVE.replace(from, to), "s.toml").expect_err("refused")
        };
        assert!(bad("plant-scenario/1", "plant-scenario/2").contains("format"));
        assert!(bad("seed = 3", "seed = 3\nsede = 4").contains("sede"));
        let e = bad("[[0, 41.0], [2700, 45.0]", "[[0, 41.0], [0, 45.0]");
        assert!(
            e.contains("[ambient] points") && e.contains("does not come after"),
            "{e}"
        );
        assert!(bad("[[0, 1.0], [7200, 1.0]]", "[[0, 1.5]]").contains("outside 0 to 1"));
        assert!(bad("\"1\" = ", "\"5\" = ").contains("a rack from 0 to 1"));
        assert!(bad("kind = \"chiller_trip\"", "kind = \"chiller_trp\"").contains("unknown kind"));
        assert!(bad("until_s = 3600", "until_s = 1000").contains("after at_s"));
        assert!(bad("target = \"1.3.7\"", "target = \"1.4.7\"").contains("rack.host.gpu"));
        for target in ["r1.1.3.7", "1.3.7.x", "1..3.7", "1.3.-7", "1.3"] {
            let e = bad("target = \"1.3.7\"", &format!("target = \"{target}\""));
            assert!(
                e.contains("rack.host.gpu") && e.contains(target),
                "{target}: {e}"
            );
        }
        let e = bad("target = \"return_temp\"", "target = \"humidity\"");
        assert!(
            e.contains("supply_temp") && e.contains("outdoor_temp"),
            "every sensor named: {e}"
        );
        for rate in ["inf", "-inf", "nan"] {
            let e = bad("value = 0.5", &format!("value = {rate}"));
            assert!(
                e.contains("sensor_drift") && e.contains("a finite number"),
                "{e}"
            );
        }
        let e = bad("at_s = 1800\nuntil_s = 3600", "at_s = 7200\nuntil_s = 9000");
        assert!(
            e.contains("fault 1 (chiller_trip)")
                && e.contains("at_s = 7200")
                && e.contains("duration_s = 7200"),
            "{e}"
        );
        let e = bad("at_s = 100\n", "at_s = 9999\n");
        assert!(
            e.contains("fault 3 (gpu_fail)") && e.contains("at_s = 9999"),
            "{e}"
        );
        let e = bad("racks = 2", "rakcs = 2");
        assert!(e.contains("[site]") && e.contains("rakcs"), "{e}");
    }

    #[test]
    fn a_kind_whose_value_is_its_meaning_is_refused_without_one() {
        let with = |fault: &str| {
            Scenario::from_toml(
                &format!("{HEATWAVE}\n[[fault]]\nat_s = 10\n{fault}"),
                "s.toml",
            )
        };
        for fault in [
            "kind = \"sensor_drift\"\ntarget = \"supply_temp\"",
            "kind = \"dry_cooler_degraded\"",
            "kind = \"cold_plate_fouling\"\ntarget = \"0\"",
        ] {
            let e = with(fault).expect_err(fault);
            let kind = fault.split('"').nth(1).unwrap();
            assert!(
                e.contains(&format!("fault 4 ({kind})")) && e.contains("value: missing"),
                "{e}"
            );
        }
        // Fields a kind ignores are taken as the template writes them, on
        // any kind; a kind with a default keeps it.
        let s = with(
            "until_s = 20\nkind = \"chiller_trip\"\ntarget = \"\"\nvalue = 0.0\n\
             [[fault]]\nat_s = 30\nkind = \"controller_restart\"\n\
             [[fault]]\nat_s = 40\nkind = \"valve_feedback_stuck\"\ntarget = \"1\"\n\
             [[fault]]\nat_s = 50\nkind = \"sensor_drift\"\ntarget = \"flow\"\nvalue = 0.0\n",
        )
        .expect("valid");
        let kinds: Vec<_> = s.faults[3..].iter().map(|f| f.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                FaultKind::ChillerTrip,
                FaultKind::ControllerRestart(5.0),
                FaultKind::ValveFeedbackStuck(1, false),
                FaultKind::SensorDrift(SensorName::Flow, 0.0),
            ]
        );
    }

    #[test]
    fn the_outdoor_sensor_is_a_target_of_every_sensor_fault() {
        let faults = "[[fault]]\nat_s = 10\nuntil_s = 20\nkind = \"sensor_stuck\"\ntarget = \"outdoor_temp\"\n\
                      [[fault]]\nat_s = 30\nkind = \"sensor_drift\"\ntarget = \"outdoor_temp\"\nvalue = -0.5\n\
                      [[fault]]\nat_s = 40\nkind = \"sensor_lost\"\ntarget = \"outdoor_temp\"\n";
        let s = Scenario::from_toml(&format!("{HEATWAVE}{faults}"), "s.toml").expect("valid");
        let outdoor: Vec<FaultKind> = s.faults[3..].iter().map(|f| f.kind.clone()).collect();
        assert_eq!(
            outdoor,
            vec![
                FaultKind::SensorStuck(SensorName::OutdoorTemp),
                FaultKind::SensorDrift(SensorName::OutdoorTemp, -0.5),
                FaultKind::SensorLost(SensorName::OutdoorTemp),
            ]
        );
        assert_eq!(s.faults[3].until_s, Some(20));
    }

    /// Every public scenario the repository keeps (`tests/goldens/plant/`)
    /// reads.
    #[test]
    fn the_public_scenarios_read() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/goldens/plant");
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("public scenarios at {}: {e}", dir.display()));
        let mut read = 0;
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "toml") {
                match Scenario::load(&e.path()) {
                    Ok(_) => read += 1,
                    Err(m) if is_later_model(&m) => eprintln!("SKIP (later model): {m}"),
                    Err(m) => panic!("{m}"),
                }
            }
        }
        assert!(read > 0);
    }

    #[test]
    fn a_hall_of_several_cdus_numbers_racks_across_it_and_names_each_faults_cdu() {
        let text = r#"
format = "plant-scenario/1"
description = "two CDUs"
duration_s = 600
seed = 1
[site]
cdus = 2
racks = 2
[ambient]
points = [[0, 20.0]]
[load]
all = [[0, 0.5]]
"3" = [[0, 1.0]]
[truth.rack_plate_factor]
"2" = 1.5
[[fault]]
at_s = 10
kind = "leak"
target = "3"
[[fault]]
at_s = 20
kind = "pump_trip"
target = "A"
cdu = 0
[[fault]]
at_s = 30
kind = "chiller_trip"
"#;
        let s = Scenario::from_toml(text, "t").expect("reads");
        assert_eq!(s.site.cdus, 2);
        let (a, b) = (s.cdu_view(0), s.cdu_view(1));
        // CDU 1's racks 2 and 3 are its 0 and 1.
        assert_eq!(b.plate_factor, vec![1.5, 1.0]);
        assert_eq!(a.plate_factor, vec![1.0, 1.0]);
        assert_eq!(b.demand(1, 0.0), 1.0);
        assert_eq!(a.demand(1, 0.0), 0.5);
        let kinds = |v: &Scenario| v.faults.iter().map(|f| f.kind.clone()).collect::<Vec<_>>();
        assert_eq!(
            kinds(&a),
            vec![FaultKind::PumpTrip(0), FaultKind::ChillerTrip]
        );
        assert_eq!(kinds(&b), vec![FaultKind::Leak(1), FaultKind::ChillerTrip]);

        let refused =
            |extra: &str| Scenario::from_toml(&format!("{text}{extra}"), "t").expect_err("refused");
        let e = refused("[[fault]]\nat_s = 1\nkind = \"sensor_lost\"\ntarget = \"flow\"\n");
        assert!(e.contains("which of the 2 CDUs"), "{e}");
        let e = refused("[[fault]]\nat_s = 1\nkind = \"modbus_outage\"\ncdu = 2\n");
        assert!(e.contains("cdu = 2: a CDU from 0 to 1"), "{e}");
        let e = refused("[[fault]]\nat_s = 1\nkind = \"leak\"\ntarget = \"1\"\ncdu = 1\n");
        assert!(e.contains("only a fault of one CDU"), "{e}");
        let e = refused("[[fault]]\nat_s = 1\nkind = \"leak\"\ntarget = \"4\"\n");
        assert!(e.contains("a rack from 0 to 3"), "{e}");
        let e = Scenario::from_toml(&text.replace("cdus = 2", "cdus = 0"), "t").expect_err("0");
        assert!(e.contains("cdus = 0"), "{e}");
    }

    #[test]
    fn truth_overlays_the_site_for_the_plant_and_leaves_the_configuration_alone() {
        let base =
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 60\nseed = 1\n\
                    [site]\nracks = 2\n[site.gpu]\ntdp_w = 700.0\n\
                    [ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.5]]\n";
        let s = Scenario::from_toml(
            &format!(
                "{base}[truth]\ngpu = {{ r_jc = 0.03 }}\nfacility = {{ dry_cooler_ua_w_per_k = 8400.0 }}\n\
                 [truth.rack_plate_factor]\n\"1\" = 1.5\n"
            ),
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            (s.truth.gpu.r_jc, s.site.gpu.r_jc),
            (0.03, SiteConfig::default().gpu.r_jc)
        );
        assert_eq!(
            s.truth.gpu.tdp_w, 700.0,
            "what [truth] does not give is the site's"
        );
        assert_eq!(s.truth.facility.dry_cooler_ua_w_per_k, 8400.0);
        assert_eq!(s.truth.racks, 2);
        assert_eq!(s.plate_factor, vec![1.0, 1.5]);
        assert_eq!(s.conditions(0.0, &[false; 64]).plate_factor, vec![1.0, 1.5]);
        // Without [truth] the plant is the configuration.
        let plain = Scenario::from_toml(base, "t.toml").unwrap();
        assert_eq!(plain.truth, plain.site);
        // The layout is not a figure a site gets wrong; a rack must exist.
        let e = Scenario::from_toml(&format!("{base}[truth]\nracks = 3\n"), "t.toml").unwrap_err();
        assert!(e.contains("racks is the hall's layout"), "{e}");
        let e = Scenario::from_toml(
            &format!("{base}[truth.rack_plate_factor]\n\"5\" = 1.2\n"),
            "t.toml",
        )
        .unwrap_err();
        assert!(e.contains("a rack from 0 to 1"), "{e}");
        let e = Scenario::from_toml(&format!("{base}[truth]\ngpu = {{ rjc = 1 }}\n"), "t.toml")
            .unwrap_err();
        assert!(e.contains("[truth]") && e.contains("rjc"), "{e}");
    }
}

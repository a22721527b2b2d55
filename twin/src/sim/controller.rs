//! What a controller in charge of the twin's CDU sees and answers, and
//! the trait every controller implements: the hosts' reports
//! ([`HostReport`], as their agents publish them), the CDU's readings with
//! the scenario's sensor faults ([`Readings`]), and the controller's
//! [`Decision`]. The plant itself stays hidden behind them.
//!
//! Glossary:
//! - *position input*: the valve's limit switch, read as the CDU reports
//!   it ([`feedback_stuck`] says when a fault holds it).

use crate::plant::{Conditions, GpuState, Plant};
use crate::scenario::FaultKind;

/// What the hosts' agents report over the bus about one host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostReport {
    /// Global host index: `rack * hosts_per_rack + host in rack`.
    pub host: usize,
    /// Its rack.
    pub rack: usize,
    /// GPUs that still run (not shut down, not failed, not powered down).
    pub gpus: usize,
    /// Hottest running GPU, °C (NaN when none runs; `f64::max` skips it).
    pub hottest_c: f64,
    /// Sum of its GPUs' power, W.
    pub gpu_power_w: f64,
    /// Highest power limit in force over its running GPUs, W (0 when none
    /// runs).
    pub limit_w: f64,
    /// Any of its GPUs in HW slowdown.
    pub slowdown: bool,
    /// Its coldest running GPU (index on the host) and its °C.
    pub coldest: Option<(usize, f64)>,
    /// Its running GPU that draws most (index on the host) and its W.
    pub most_drawn: Option<(usize, f64)>,
}

/// The running GPU of `gpus` (index, GPU) with the greatest `key`.
fn extreme(gpus: &[GpuState], key: impl Fn(&GpuState) -> f64) -> Option<(usize, &GpuState)> {
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| !g.shut_down && !g.powered_down)
        .max_by(|a, b| key(a.1).total_cmp(&key(b.1)))
}

/// What every host reports about itself, in global host order.
pub fn host_reports(plant: &Plant) -> Vec<HostReport> {
    let site = plant.site();
    let per_host = site.gpus_per_host;
    plant
        .gpus()
        .chunks(per_host)
        .enumerate()
        .map(|(host, gpus)| {
            let running = || gpus.iter().filter(|g| !g.shut_down && !g.powered_down);
            HostReport {
                host,
                rack: host / site.hosts_per_rack,
                gpus: running().count(),
                hottest_c: running().map(|g| g.t_j).fold(f64::NAN, f64::max),
                gpu_power_w: gpus.iter().map(|g| g.power).sum(),
                limit_w: running().map(|g| g.limit).fold(0.0, f64::max),
                slowdown: running().any(|g| g.slowdown),
                coldest: extreme(gpus, |g| -g.t_j).map(|(i, g)| (i, g.t_j)),
                most_drawn: extreme(gpus, |g| g.power).map(|(i, g)| (i, g.power)),
            }
        })
        .collect()
}

/// What rack `r`'s valve position input is stuck at among the `active`
/// faults (true: closed), if it is.
pub fn feedback_stuck(active: &[FaultKind], r: usize) -> Option<bool> {
    active.iter().find_map(|f| match f {
        FaultKind::ValveFeedbackStuck(k, closed) if *k == r => Some(*closed),
        _ => None,
    })
}

/// What the controller reads each second.
#[derive(Debug, Clone, PartialEq)]
pub struct Readings {
    /// Simulated time, s.
    pub t_s: f64,
    /// The CDU answers on Modbus (false during a `modbus_outage`).
    pub modbus_ok: bool,
    /// Supply temperature, °C (`None`: the sensor is lost, or Modbus is).
    pub supply_c: Option<f64>,
    /// Return temperature, °C.
    pub return_c: Option<f64>,
    /// Secondary flow, L/min.
    pub flow_lpm: Option<f64>,
    /// Facility water supply, °C.
    pub facility_supply_c: Option<f64>,
    /// Outdoor air, °C, as the CDU's outdoor sensor (`outdoor_temp`)
    /// reads it, with the scenario's sensor faults (`None`: the sensor is
    /// lost); during a Modbus outage, the last value read. The scenario's
    /// true ambient is the plant's, never a reading.
    pub ambient_c: Option<f64>,
    /// Loop differential pressure, kPa.
    pub diff_pressure_kpa: Option<f64>,
    /// Per rack: its valve reads closed (position feedback: a stuck valve
    /// reads open, a stuck position input reads what it is stuck at);
    /// `None` while Modbus is out.
    pub valves_closed: Option<Vec<bool>>,
    /// Per rack: the CDU's own leak input (its leak register, read over
    /// Modbus: it sees the rack's leak on its own line, which the board's
    /// failing inputs do not touch; a cut rope reads dry on both); `None`
    /// while Modbus is out.
    pub cdu_leaks: Option<Vec<bool>>,
    /// Leak input per rack (board pins: read during a Modbus outage too; a
    /// cut rope reads dry).
    pub leaks: Vec<bool>,
    /// Per rack: the rope's supervision line reports a fault (cut).
    pub rope_faults: Vec<bool>,
    /// The board's input lines were read (`false` during a
    /// `board_io_fault`: `leaks` and `rope_faults` then say nothing).
    pub board_ok: bool,
    /// Pumps running (contactor feedback: commanded on and not tripped; a
    /// seized pump reads running); during a Modbus outage, the last values
    /// read.
    pub pumps_running: [bool; 2],
    /// Pumps reporting a fault (a tripped pump's drive); during a Modbus
    /// outage, the last values read.
    pub pump_faults: [bool; 2],
    /// The CDU took the controller's last writes (`false`: Modbus was out
    /// or the CDU refused them).
    pub writes_ok: bool,
    /// What the hosts' agents report, one per host (empty: the bus is out).
    pub hosts: Vec<HostReport>,
    /// Hottest running GPU over the host reports, °C (`None`: no reports).
    pub hottest_gpu_c: Option<f64>,
    /// IT power meter, W (during a Modbus outage, the last value read).
    pub it_w: f64,
    /// Facility power meter, W (likewise).
    pub facility_w: f64,
}

/// What the controller decides each second. Missing entries of the lists
/// mean: valve open, no cap, cooling not lost.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Supply setpoint, °C.
    pub setpoint_c: f64,
    /// Pump speed, fraction.
    pub pump_speed: f64,
    /// Pumps commanded on.
    pub pump_on: [bool; 2],
    /// Per rack: valve open.
    pub valves: Vec<bool>,
    /// Per global host index: power cap per GPU asked of that host, W.
    pub host_caps: Vec<Option<f64>>,
    /// Per rack: its hosts are told their cooling is lost (they drain and
    /// power their GPUs down 30 s later; told otherwise, they power up).
    pub rack_cooling_lost: Vec<bool>,
    /// The controller is in failsafe (counted into `failsafe_s`).
    pub failsafe: bool,
    /// The controller wrote the CDU's heartbeat register (a CDU that has
    /// heard one falls back on its own when they stop).
    pub heartbeat: bool,
    /// Per rack: the controller reports its leak sensing lost (missing
    /// entries: not reported).
    pub leak_sensing_lost: Vec<bool>,
    /// The valves are not written this step: the CDU keeps them as they
    /// are (a controller that cannot yet say which to open).
    pub hold_valves: bool,
    /// Per rack: the controller reports its valve position input not
    /// believed (missing entries: not reported).
    pub valve_feedback_alarms: Vec<bool>,
}

/// A controller in charge of the CDU.
pub trait Controller {
    /// Its name in the summary.
    fn name(&self) -> &str;
    /// Shown the true plant state and this second's conditions before
    /// [`Controller::step`]; only the `oracle` reference uses it.
    fn observe(&mut self, _plant: &Plant, _cond: &Conditions) {}
    /// One second's decision.
    fn step(&mut self, r: &Readings) -> Decision;
    /// The controller's process started again after a `controller_restart`:
    /// what it held in memory is lost, what it wrote to its flash is not.
    /// The references hold nothing worth losing.
    fn restart(&mut self) {}
    /// A `latch_corrupt` fault: the newest latched-state record in the
    /// controller's flash is damaged, before [`Controller::restart`].
    fn damage_latch(&mut self) {}
    /// What it offers the facility coordinator of a hall of several CDUs
    /// (the twin passes it on unread; `None`: nothing).
    fn facility_offer(&self) -> Option<&dyn std::any::Any> {
        None
    }
    /// The facility coordinator set the facility water to `water_c` at
    /// `t_s` (heard over the bus).
    fn hear_facility_target(&mut self, _water_c: f64, _t_s: f64) {}
}

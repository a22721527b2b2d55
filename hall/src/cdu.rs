//! `loopwarden-hall cdu`: the simulated CDU on its own, for a controller,
//! `mbpoll` or a BMS to talk to. It serves the simulated CDU's registers
//! on Modbus TCP or on a serial device (Modbus RTU), with the twin's hall
//! of a scenario stepped in real time (or faster) behind them, so what a
//! client writes (setpoint, pump speed, pumps, valves) changes the
//! temperatures and the flow it reads, as in `loopwarden-hall play`.
//! There is no controller, no broker and no host agent here.
//!
//! It prints where it serves, the register map and the unit id, then a
//! status line every few seconds, and stops when told (Ctrl-C, SIGTERM).
//! Past the scenario's end its last conditions hold (load, weather, the
//! faults still in force). With `--record FILE` it also writes every
//! client write, every scenario fault as it begins and ends, and every
//! change of its own state (fallback, pumps, valves) to FILE as it
//! happens ([`crate::recorded`], in the format of [`crate::record`]).
//!
//! Glossary:
//! - *status line*: the CDU as a client sees it, one line: simulated time,
//!   setpoint, supply, return, flow, pumps, and whether it runs on its own
//!   fallback (no controller heartbeat) or in local mode.
//! - *speed*: simulated seconds per wall-clock second.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use loopwarden_boards::modbus_map::{RegisterMap, WordOrder};
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim_cdu::SimCdu;

use crate::record::{Record, RecordError};
use crate::recorded::Started;
use crate::sim_side::{at_speed, Listen, Pace, SimError, SimSide};

/// The shipped map's file, as the banner names it.
pub const MAP_FILE: &str = "boards/cdus/sim-cdu.toml";

/// What to serve and how.
#[derive(Debug, Clone)]
pub struct CduConfig {
    /// The scenario behind the registers.
    pub scenario: Scenario,
    /// Its name in the banner.
    pub name: String,
    /// Where to serve.
    pub listen: Listen,
    /// The unit id to answer (default: the map's).
    pub unit: Option<u8>,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// Wall time between two status lines.
    pub status_every: Duration,
    /// Where to write the record of writes, faults and the CDU's state
    /// changes (`crate::record`), if anywhere.
    pub record: Option<PathBuf>,
}

/// Why it stopped other than when told.
#[derive(Debug, thiserror::Error)]
pub enum CduError {
    /// A setting out of its range.
    #[error("{0}")]
    Config(String),
    /// The CDU could not start.
    #[error("{0}")]
    Start(#[from] SimError),
    /// The record could not be written.
    #[error("{0}")]
    Record(#[from] RecordError),
    /// The Modbus server stopped.
    #[error("{link}: the Modbus server stopped: {why}")]
    Served {
        /// Where it served.
        link: String,
        /// Why.
        why: String,
    },
}

/// The CDU as a client reads it, for the status line: the registers'
/// values (a register that cannot be read shows NaN).
#[derive(Debug, Clone, PartialEq)]
pub struct CduView {
    /// Simulated time, s.
    pub t_s: f64,
    /// Supply setpoint written, °C.
    pub setpoint_c: f64,
    /// Pump speed written, %.
    pub pump_speed_pct: f64,
    /// Supply temperature, °C.
    pub supply_c: f64,
    /// Return temperature, °C.
    pub return_c: f64,
    /// Flow, L/min.
    pub flow_lpm: f64,
    /// Pump A and B running (contactor feedback).
    pub pumps_running: [bool; 2],
    /// On its own fallback: the controller's heartbeat stopped.
    pub fallback: bool,
    /// In local mode: writes refused.
    pub local: bool,
}

impl CduView {
    /// Reads `cdu`'s registers at simulated time `t_s`.
    pub fn read(cdu: &SimCdu, t_s: f64, fallback: bool) -> Self {
        let setting = |n: &str| cdu.setting(n).unwrap_or(f64::NAN);
        let measured = |n: &str| cdu.measurement(n).unwrap_or(f64::NAN);
        Self {
            t_s,
            setpoint_c: setting("supply_setpoint"),
            pump_speed_pct: setting("pump_speed"),
            supply_c: measured("supply_temp"),
            return_c: measured("return_temp"),
            flow_lpm: measured("flow"),
            pumps_running: [
                measured("pump_a_running") != 0.0,
                measured("pump_b_running") != 0.0,
            ],
            fallback,
            local: cdu.local(),
        }
    }
}

/// One status line.
pub fn status_line(v: &CduView) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    let mut s = format!(
        "t={:>6.0} s  setpoint {:.2} °C  supply {:.2} °C  return {:.2} °C  flow {:.0} L/min  \
         pumps A {} B {} at {:.0} %",
        v.t_s,
        v.setpoint_c,
        v.supply_c,
        v.return_c,
        v.flow_lpm,
        on(v.pumps_running[0]),
        on(v.pumps_running[1]),
        v.pump_speed_pct
    );
    if v.fallback {
        s.push_str("  FALLBACK: no controller heartbeat, on its own safe setpoint at full speed");
    }
    if v.local {
        s.push_str("  LOCAL: writes refused");
    }
    s
}

/// The banner: where it serves, the map, the unit id, the scenario.
pub fn banner(cfg: &CduConfig, sim: &SimSide) -> Vec<String> {
    let map = sim.cdu().map();
    let unit = map.unit_id;
    let served = match &cfg.listen {
        Listen::Tcp(_) => format!(
            "simulated CDU: serving {} (unit id {unit}; over TCP every unit id is answered)",
            sim.link()
        ),
        Listen::Rtu { turnaround, .. } => format!(
            "simulated CDU: serving {} (unit id {unit}; other unit ids get no answer; \
             answers {} ms after each request)",
            sim.link(),
            turnaround.as_millis()
        ),
    };
    let mut lines = vec![
        served,
        format!(
            "register map: {MAP_FILE} ({}, 32-bit values {})",
            map.model,
            match map.word_order {
                WordOrder::HighFirst => "high word first",
                WordOrder::LowFirst => "low word first",
            }
        ),
        format!(
            "scenario: {} ({} s: {}), {}x real time; its last conditions hold after its end",
            cfg.name, cfg.scenario.duration_s, cfg.scenario.description, cfg.speed
        ),
    ];
    if let Some(path) = &cfg.record {
        lines.push(format!(
            "record: {} (JSON lines: writes, scenario faults, the CDU's state changes)",
            path.display()
        ));
    }
    lines
}

/// The shipped map, answering `unit` if given (1 to 247).
pub fn map_for(unit: Option<u8>) -> Result<RegisterMap, CduError> {
    let mut map = RegisterMap::sim_cdu();
    if let Some(u) = unit {
        if !(1..=247).contains(&u) {
            return Err(CduError::Config(format!(
                "--unit {u}: a unit id is 1 to 247"
            )));
        }
        map.unit_id = u;
    }
    Ok(map)
}

/// Serves until `stop` completes (then `Ok`) or the server fails; writes
/// the banner and the status lines to `out`.
pub async fn serve(
    cfg: CduConfig,
    stop: impl Future<Output = ()>,
    out: &mut impl Write,
) -> Result<(), CduError> {
    if !(cfg.speed > 0.0 && cfg.speed <= 100.0) {
        return Err(CduError::Config(format!(
            "--speed {}: between 0 and 100",
            cfg.speed
        )));
    }
    let mut sim = start(&cfg).await?;
    for l in banner(&cfg, &sim) {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
    tokio::pin!(stop);
    let mut pace = Pace::new(cfg.speed, Instant::now());
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut next_status = Instant::now();
    loop {
        tokio::select! {
            () = &mut stop => break,
            ended = &mut sim.served => {
                let why = match ended {
                    Ok(Ok(())) => "it ended".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => e.to_string(),
                };
                return Err(CduError::Served { link: sim.link().to_string(), why });
            }
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        let view = step(&sim, &mut pace, now)?;
        if now >= next_status {
            next_status = now + cfg.status_every;
            let _ = writeln!(out, "{}", status_line(&view));
            let _ = out.flush();
        }
    }
    // No new connection; a write a connection still makes after the
    // record's last line is not recorded.
    sim.served.abort();
    let _ = (&mut sim.served).await;
    if let Some(w) = sim.watch() {
        let _held = sim.cdu().hold_writes();
        let h = sim.hall().lock().expect("hall lock");
        let mut w = w.lock().expect("record lock");
        w.stopped(h.time_s(), Instant::now());
        if let Some(e) = w.take_failure() {
            return Err(e.into());
        }
    }
    let _ = writeln!(out, "simulated CDU: stopped");
    let _ = out.flush();
    Ok(())
}

/// The simulated side of `cfg`, recorded if it says where.
async fn start(cfg: &CduConfig) -> Result<SimSide, CduError> {
    let map = map_for(cfg.unit)?;
    let sc = at_speed(&cfg.scenario, cfg.speed);
    Ok(match &cfg.record {
        None => SimSide::start_on(&sc, map, &cfg.listen).await?,
        Some(path) => {
            let record = Record::create(path)?;
            let started = Started {
                scenario: cfg.name.clone(),
                speed: cfg.speed,
            };
            SimSide::start_recorded(&sc, map, &cfg.listen, record, started).await?
        }
    })
}

/// Steps the hall to `now`, records what the step did (if the CDU keeps a
/// record) and reads the CDU as a client would. A client's write waits
/// for all of it: it is done between two steps, so a step reads one set
/// of settings, and a recorded write the time of the step before it.
fn step(sim: &SimSide, pace: &mut Pace, now: Instant) -> Result<CduView, CduError> {
    let _held = sim.cdu().hold_writes();
    let mut h = sim.hall().lock().expect("hall lock");
    let from_s = h.time_s();
    if let Err(e) = h.step(pace.step_s(now)) {
        tracing::warn!("hall: {e}");
    }
    if let Some(w) = sim.watch() {
        let mut w = w.lock().expect("record lock");
        w.stepped(from_s, &h, Instant::now());
        if let Some(e) = w.take_failure() {
            return Err(e.into());
        }
    }
    Ok(CduView::read(sim.cdu(), h.time_s(), h.in_fallback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> CduView {
        CduView {
            t_s: 125.4,
            setpoint_c: 25.0,
            pump_speed_pct: 80.0,
            supply_c: 24.87,
            return_c: 31.2,
            flow_lpm: 153.6,
            pumps_running: [true, false],
            fallback: false,
            local: false,
        }
    }

    #[test]
    fn the_status_line_says_what_a_client_reads() {
        assert_eq!(
            status_line(&view()),
            "t=   125 s  setpoint 25.00 °C  supply 24.87 °C  return 31.20 °C  flow 154 L/min  \
             pumps A on B off at 80 %"
        );
        let v = CduView {
            fallback: true,
            local: true,
            ..view()
        };
        let line = status_line(&v);
        assert!(line.ends_with(
            "  FALLBACK: no controller heartbeat, on its own safe setpoint at full speed  \
             LOCAL: writes refused"
        ));
    }

    #[test]
    fn a_unit_id_is_one_to_247() {
        assert_eq!(map_for(None).unwrap().unit_id, 1);
        assert_eq!(map_for(Some(17)).unwrap().unit_id, 17);
        for bad in [0, 248, 255] {
            let e = map_for(Some(bad)).unwrap_err().to_string();
            assert_eq!(e, format!("--unit {bad}: a unit id is 1 to 247"));
        }
    }

    #[test]
    fn the_view_reads_what_the_registers_hold() {
        let cdu = SimCdu::new(
            RegisterMap::sim_cdu(),
            &[("supply_setpoint", 27.5), ("pump_speed", 60.0)],
        )
        .unwrap();
        cdu.set_measurement("supply_temp", 27.9).unwrap();
        cdu.set_measurement("pump_b_running", 1.0).unwrap();
        let v = CduView::read(&cdu, 3.0, true);
        // Values as the registers hold them: 0.01 °C and 0.1 % steps.
        assert!((v.setpoint_c - 27.5).abs() < 1e-9);
        assert!((v.pump_speed_pct - 60.0).abs() < 1e-9);
        assert!((v.supply_c - 27.9).abs() < 1e-9);
        assert_eq!(v.pumps_running, [false, true]);
        assert!(v.fallback && !v.local);
    }
}

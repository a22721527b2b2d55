//! The simulated side of a run, shared by `loopwarden-hall play`, `fleet`
//! and `cdu`: the simulated CDU serving its registers on Modbus (TCP, or
//! RTU on a serial device), the twin's hall behind them, the controller
//! board's simulated lines, and the pace at which the hall is stepped in
//! real time. With `cdu --record` the CDU's client writes go to its
//! record as they are done ([`crate::recorded`]).
//!
//! Glossary:
//! - *speed*: simulated seconds per wall-clock second.
//! - *pace*: turns the wall-clock time between two steps into the
//!   simulated seconds to step.
//! - *listen*: where the simulated CDU serves: a TCP address, or a serial
//!   device and its baud rate.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cooling_ctrl::modbus::{Link, SerialLine};
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::pins::PinMap;
use loopwarden_twin::hall::Hall;
use loopwarden_twin::pins::SimLines;
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim_cdu::{RtuLine, SimCdu};
use tokio::task::JoinHandle;

use crate::record::{Record, RecordError};
use crate::recorded::{record_writes, Started, Watch};

/// The CDU's Modbus server.
type Served = JoinHandle<std::io::Result<()>>;

/// Where the simulated CDU serves Modbus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// Modbus TCP on this address (port 0: any free port).
    Tcp(SocketAddr),
    /// Modbus RTU on this serial device, 8N1 at `baud`.
    Rtu {
        /// The device, e.g. `/dev/ttyUSB0` or a pseudo-terminal.
        path: String,
        /// Baud rate.
        baud: u32,
        /// How long each answer waits after its request.
        turnaround: std::time::Duration,
    },
}

/// Why the simulated side did not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The TCP address could not be listened on.
    #[error("Modbus TCP {addr}: cannot listen: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The serial device could not be opened.
    #[error("Modbus RTU {path}: cannot open the serial device: {source}")]
    Device {
        /// The device.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The CDU's registers refused its initial settings.
    #[error("simulated CDU: {0}")]
    Registers(#[from] loopwarden_boards::modbus_map::ValueError),
    /// The record's first line could not be written.
    #[error("{0}")]
    Record(#[from] RecordError),
}

/// The settings the simulated CDU starts with, as a CDU at rest: 18 °C,
/// pumps at full speed, pump A running.
const AT_REST: [(&str, f64); 3] = [
    ("supply_setpoint", 18.0),
    ("pump_speed", 100.0),
    ("pumps_run", 1.0),
];

/// The simulated side: the CDU on Modbus, the hall behind it and the
/// controller board's lines.
pub struct SimSide {
    /// The CDU's register map.
    pub(crate) map: RegisterMap,
    pub(crate) cdu: SimCdu,
    /// Where the CDU serves, as a controller reaches it.
    link: Link,
    /// The CDU's Modbus server.
    pub(crate) served: Served,
    pub(crate) lines: SimLines,
    pub(crate) pins: PinMap,
    pub(crate) hall: Arc<Mutex<Hall>>,
    /// The record, when the CDU keeps one.
    watch: Option<Arc<Mutex<Watch>>>,
}

impl SimSide {
    /// The simulated CDU of the shipped map on a free loopback port, with
    /// the hall of `sc`.
    pub(crate) async fn start(sc: &Scenario) -> Result<Self, SimError> {
        let loopback = Listen::Tcp(SocketAddr::from(([127, 0, 0, 1], 0)));
        Self::start_on(sc, RegisterMap::sim_cdu(), &loopback).await
    }

    /// The simulated CDU serving `map` where `listen` says, with the hall
    /// of `sc` behind it. Fails at once when the address cannot be
    /// listened on or the device cannot be opened.
    pub async fn start_on(
        sc: &Scenario,
        map: RegisterMap,
        listen: &Listen,
    ) -> Result<Self, SimError> {
        Self::start_with(sc, map, listen, None).await
    }

    /// As [`SimSide::start_on`], every write, scenario fault and change of
    /// the CDU's state written to `record` ([`crate::recorded`]); the
    /// record's first line says `started` and the state the CDU starts in.
    pub async fn start_recorded(
        sc: &Scenario,
        map: RegisterMap,
        listen: &Listen,
        record: Record,
        started: Started,
    ) -> Result<Self, SimError> {
        Self::start_with(sc, map, listen, Some((record, started))).await
    }

    async fn start_with(
        sc: &Scenario,
        map: RegisterMap,
        listen: &Listen,
        record: Option<(Record, Started)>,
    ) -> Result<Self, SimError> {
        let cdu = SimCdu::new(map.clone(), &AT_REST)?;
        // The controller board's lines: the hall drives the leak ropes, a
        // controller reads them and drives the relay and the beacon,
        // through embedded-hal pins.
        let lines = SimLines::new();
        let pins = PinMap::sim_controller();
        let hall = Arc::new(Mutex::new(Hall::new(
            sc.clone(),
            cdu.clone(),
            lines.clone(),
            pins.clone(),
        )));
        let (link, bound) = bind(listen).await?;
        // The record starts once the address is bound or the device
        // opened, before the first client can write.
        let watch = match record {
            Some((record, started)) => Some(watch(&hall, &cdu, sc, &link, record, started)?),
            None => None,
        };
        let served = match bound {
            Bound::Tcp(listener) => tokio::spawn(cdu.clone().serve(listener)),
            Bound::Rtu(line) => tokio::spawn(cdu.clone().serve_rtu_on(line)),
        };
        Ok(Self {
            map,
            cdu,
            link,
            served,
            lines,
            pins,
            hall,
            watch,
        })
    }

    /// How a controller reaches the CDU (the port actually bound).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The simulated CDU's registers.
    pub fn cdu(&self) -> &SimCdu {
        &self.cdu
    }

    /// The hall behind them.
    pub fn hall(&self) -> &Arc<Mutex<Hall>> {
        &self.hall
    }

    /// The record, when the CDU keeps one (lock the hall first, then it).
    pub fn watch(&self) -> Option<&Arc<Mutex<Watch>>> {
        self.watch.as_ref()
    }
}

/// Where the CDU is to serve, bound or opened.
enum Bound {
    /// Modbus TCP: the listener.
    Tcp(tokio::net::TcpListener),
    /// Modbus RTU: the serial line.
    Rtu(RtuLine),
}

/// Binds the address or opens the device `listen` says: how a controller
/// reaches it, and where to serve.
async fn bind(listen: &Listen) -> Result<(Link, Bound), SimError> {
    match listen {
        Listen::Tcp(addr) => {
            let listen_err = |source| SimError::Listen {
                addr: *addr,
                source,
            };
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(listen_err)?;
            let link = Link::Tcp(listener.local_addr().map_err(listen_err)?.into());
            Ok((link, Bound::Tcp(listener)))
        }
        Listen::Rtu {
            path,
            baud,
            turnaround,
        } => {
            let line = RtuLine::open(path, *baud)
                .map_err(|source| SimError::Device {
                    path: path.clone(),
                    source,
                })?
                .answering_after(*turnaround);
            let mut serial = SerialLine::new(path.clone());
            serial.baud = *baud;
            Ok((Link::Rtu(serial), Bound::Rtu(line)))
        }
    }
}

/// The record of `hall` (playing `sc`) and `cdu`, serving on `link`: its
/// first line written, every client write recorded from now on.
fn watch(
    hall: &Mutex<Hall>,
    cdu: &SimCdu,
    sc: &Scenario,
    link: &Link,
    record: Record,
    started: Started,
) -> Result<Arc<Mutex<Watch>>, SimError> {
    let w = Watch::start(
        record,
        Instant::now(),
        &hall.lock().expect("hall lock"),
        cdu.map(),
        sc.faults.clone(),
        started,
        link.to_string(),
    )?;
    let w = Arc::new(Mutex::new(w));
    record_writes(cdu, &w);
    Ok(w)
}

/// `sc` as played at `speed`: the CDU watches its controller's heartbeat
/// in real seconds, so at S times real time its timeout is S times as many
/// simulated seconds (never shorter than configured).
pub fn at_speed(sc: &Scenario, speed: f64) -> Scenario {
    let mut sc = sc.clone();
    sc.truth.secondary.heartbeat_timeout_s *= speed.max(1.0);
    sc
}

/// The hall's pace: simulated seconds to step for the wall-clock time
/// since the last step.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    speed: f64,
    last: Instant,
}

impl Pace {
    /// At `speed`, starting at `now`.
    pub fn new(speed: f64, now: Instant) -> Self {
        Self { speed, last: now }
    }

    /// The simulated seconds from the last step to `now` (0 for a `now`
    /// before it).
    pub fn step_s(&mut self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.last).as_secs_f64() * self.speed;
        self.last = self.last.max(now);
        dt
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_pace_scales_wall_time_and_never_runs_backwards() {
        let t0 = Instant::now();
        let mut p = Pace::new(10.0, t0);
        assert!((p.step_s(t0 + Duration::from_millis(250)) - 2.5).abs() < 1e-9);
        assert!((p.step_s(t0 + Duration::from_millis(750)) - 5.0).abs() < 1e-9);
        // A time before the last step steps nothing and keeps the last.
        assert_eq!(p.step_s(t0), 0.0);
        assert!((p.step_s(t0 + Duration::from_secs(1)) - 2.5).abs() < 1e-9);
    }

    #[test]
    fn the_heartbeat_timeout_stretches_with_the_speed_only_upwards() {
        let sc = Scenario::from_toml(include_str!("../scenarios/demo.toml"), "demo.toml")
            .expect("the demo scenario");
        let base = sc.truth.secondary.heartbeat_timeout_s;
        let fast = at_speed(&sc, 20.0).truth.secondary.heartbeat_timeout_s;
        assert!((fast - 20.0 * base).abs() < 1e-9);
        let slow = at_speed(&sc, 0.5).truth.secondary.heartbeat_timeout_s;
        assert!((slow - base).abs() < 1e-9);
    }
}

//! The simulated CDU's record (`loopwarden-hall cdu --record FILE`): what
//! the CDU was told and what happened to it, one JSON object a line, each
//! line written whole and flushed before the next fact, so a reader (the
//! firmware's QEMU test) can follow the file while the CDU runs and the
//! file stays whole up to its last line if the process is killed.
//!
//! Every line starts with `sim_ms` and `wall_ms`, then `kind`:
//! - `start`: the CDU's state when it began serving (pumps running,
//!   valves open, fallback), the scenario, its speed and where it serves;
//! - `write`: one register a client wrote, its value as the map decodes
//!   it, `ok` and, for a refused write, the Modbus exception;
//! - `fault_begins` / `fault_ends`: a scenario fault, with its kind and
//!   parameters as the scenario file writes them;
//! - `fallback`, `pump`, `valve`: the CDU's own state changing as the
//!   plant moves (not as written);
//! - `stop`: the CDU stopped as told; a record without it was cut short.
//!
//! This module formats the lines and writes them; what a fact is and when
//! it happened is decided by whoever hands it over ([`crate::recorded`]).
//!
//! Glossary:
//! - *fact*: one line of the record.
//! - *sim_ms*: scenario time, ms, as the hall had reached it.
//! - *wall_ms*: ms since the CDU started serving, on a monotonic clock.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use loopwarden_twin::scenario::{Fault, FaultKind, SensorName};
use serde::Serialize;

/// One fact of the record.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fact {
    /// The CDU began serving, in this state.
    Start {
        /// The scenario's name.
        scenario: String,
        /// Simulated seconds per wall second.
        speed: f64,
        /// Where it serves (`Modbus TCP 127.0.0.1:5020`, …).
        serving: String,
        /// Pump A and B running.
        pumps_running: [bool; 2],
        /// Per rack: its valve open.
        valves_open: Vec<bool>,
        /// On its own fallback.
        fallback: bool,
    },
    /// A client wrote one register (or words where the map has none).
    Write {
        /// The register's name; `null` where the map has no register
        /// starting at `address`.
        register: Option<String>,
        /// Its first address.
        address: u16,
        /// The value written, as the map decodes it (scaled), whether or
        /// not it was in range; `null` where no register was written.
        value: Option<serde_json::Number>,
        /// The raw words, where no register was written.
        #[serde(skip_serializing_if = "Option::is_none")]
        words: Option<Vec<u16>>,
        /// The write was done.
        ok: bool,
        /// Why it was refused: the Modbus exception.
        #[serde(skip_serializing_if = "Option::is_none")]
        exception: Option<String>,
        /// Its code (3: illegal data value, …).
        #[serde(skip_serializing_if = "Option::is_none")]
        exception_code: Option<u8>,
    },
    /// A scenario fault took effect.
    FaultBegins(FaultFact),
    /// A scenario fault was cleared.
    FaultEnds(FaultFact),
    /// The CDU fell back to its own safe setpoint (`on`) or came back to
    /// its controller's settings.
    Fallback {
        /// On its fallback now.
        on: bool,
    },
    /// A pump started or stopped.
    Pump {
        /// `A` or `B`.
        pump: String,
        /// Running now.
        running: bool,
    },
    /// A rack's valve opened or closed.
    Valve {
        /// The rack.
        rack: usize,
        /// Open now.
        open: bool,
    },
    /// The CDU stopped as told.
    Stop,
}

/// A scenario fault as its file writes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultFact {
    /// Its `kind` (`leak`, `pump_trip`, …).
    pub fault: &'static str,
    /// Its `target`, where its kind takes one (`"3"`, `"A"`, `"flow"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Its `value`, where its kind takes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// When it begins, scenario s.
    pub at_s: u64,
    /// When it is cleared, scenario s (`null`: never).
    pub until_s: Option<u64>,
    /// The CDU it acts on, in a hall of several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cdu: Option<usize>,
}

impl FaultFact {
    /// `f` as its scenario file writes it.
    pub fn of(f: &Fault) -> Self {
        let (fault, target, value) = fault_fields(&f.kind);
        Self {
            fault,
            target,
            value,
            at_s: f.at_s,
            until_s: f.until_s,
            cdu: f.cdu,
        }
    }
}

/// A fault kind's `kind`, `target` and `value` fields.
fn fault_fields(k: &FaultKind) -> (&'static str, Option<String>, Option<f64>) {
    let pump = |p: &usize| Some(if *p == 0 { "A" } else { "B" }.to_string());
    let rack = |r: &usize| Some(r.to_string());
    let sensor = |s: &SensorName| Some(sensor_name(*s).to_string());
    match k {
        FaultKind::ChillerTrip => ("chiller_trip", None, None),
        FaultKind::PumpTrip(p) => ("pump_trip", pump(p), None),
        FaultKind::DryCoolerDegraded(v) => ("dry_cooler_degraded", None, Some(*v)),
        FaultKind::Leak(r) => ("leak", rack(r), None),
        FaultKind::SensorStuck(s) => ("sensor_stuck", sensor(s), None),
        FaultKind::SensorDrift(s, v) => ("sensor_drift", sensor(s), Some(*v)),
        FaultKind::SensorLost(s) => ("sensor_lost", sensor(s), None),
        FaultKind::BusOutage => ("bus_outage", None, None),
        FaultKind::ModbusOutage => ("modbus_outage", None, None),
        FaultKind::ValveStuck(r) => ("valve_stuck", rack(r), None),
        FaultKind::GpuFail(r, h, g) => ("gpu_fail", Some(format!("{r}.{h}.{g}")), None),
        FaultKind::PumpSeized(p) => ("pump_seized", pump(p), None),
        FaultKind::ControllerRestart(down_s) => ("controller_restart", None, Some(*down_s)),
        FaultKind::RopeCut(r) => ("rope_cut", rack(r), None),
        FaultKind::BoardIoFault => ("board_io_fault", None, None),
        FaultKind::CduWriteRefused => ("cdu_write_refused", None, None),
        FaultKind::ColdPlateFouling(r, v) => ("cold_plate_fouling", rack(r), Some(*v)),
        FaultKind::ValveFeedbackStuck(r, closed) => (
            "valve_feedback_stuck",
            rack(r),
            Some(f64::from(u8::from(*closed))),
        ),
        FaultKind::LatchCorrupt => ("latch_corrupt", None, None),
    }
}

/// A sensor's name in a scenario file.
fn sensor_name(s: SensorName) -> &'static str {
    match s {
        SensorName::SupplyTemp => "supply_temp",
        SensorName::ReturnTemp => "return_temp",
        SensorName::Flow => "flow",
        SensorName::DiffPressure => "diff_pressure",
        SensorName::FacilitySupplyTemp => "facility_supply_temp",
        SensorName::OutdoorTemp => "outdoor_temp",
    }
}

/// `v` as JSON: a whole number without a fraction (`13`, not `13.0`).
pub fn number(v: f64) -> Option<serde_json::Number> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        Some((v as i64).into())
    } else {
        serde_json::Number::from_f64(v)
    }
}

/// One line of the record, newline included.
pub fn line(sim_s: f64, wall: Duration, fact: &Fact) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        sim_ms: u64,
        wall_ms: u64,
        #[serde(flatten)]
        fact: &'a Fact,
    }
    let l = Line {
        sim_ms: (sim_s * 1000.0).round().max(0.0) as u64,
        wall_ms: wall.as_millis() as u64,
        fact,
    };
    // A fact holds no map with non-string keys and no non-finite number.
    let mut s = serde_json::to_string(&l).expect("a fact is JSON");
    s.push('\n');
    s
}

/// The record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be made.
    #[error("--record {path}: cannot create it: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line could not be written.
    #[error("--record {path}: cannot write to it: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The record's file.
#[derive(Debug)]
pub struct Record {
    file: File,
    path: PathBuf,
}

impl Record {
    /// Creates `path` (emptied if it exists).
    pub fn create(path: &Path) -> Result<Self, RecordError> {
        let file = File::create(path).map_err(|source| RecordError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Writes `fact` at scenario time `sim_s`, `wall` after the CDU began
    /// serving: the whole line at once, then flushed.
    pub fn write(&mut self, sim_s: f64, wall: Duration, fact: &Fact) -> Result<(), RecordError> {
        let l = line(sim_s, wall, fact);
        self.file
            .write_all(l.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|source| RecordError::Write {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_reads_as_the_brief_says_and_a_refusal_carries_its_exception() {
        let ok = Fact::Write {
            register: Some("valves_open".into()),
            address: 3,
            value: number(13.0),
            words: None,
            ok: true,
            exception: None,
            exception_code: None,
        };
        assert_eq!(
            line(360.0, Duration::from_micros(2_512_900), &ok),
            "{\"sim_ms\":360000,\"wall_ms\":2512,\"kind\":\"write\",\"register\":\"valves_open\",\
             \"address\":3,\"value\":13,\"ok\":true}\n"
        );
        let refused = Fact::Write {
            register: Some("supply_setpoint".into()),
            address: 0,
            value: number(99.0),
            words: None,
            ok: false,
            exception: Some("Illegal data value".into()),
            exception_code: Some(3),
        };
        assert_eq!(
            line(0.0004, Duration::ZERO, &refused),
            "{\"sim_ms\":0,\"wall_ms\":0,\"kind\":\"write\",\"register\":\"supply_setpoint\",\
             \"address\":0,\"value\":99,\"ok\":false,\"exception\":\"Illegal data value\",\
             \"exception_code\":3}\n"
        );
        let nowhere = Fact::Write {
            register: None,
            address: 40,
            value: None,
            words: Some(vec![1, 2]),
            ok: false,
            exception: Some("Illegal data address".into()),
            exception_code: Some(2),
        };
        let l = line(1.0, Duration::from_millis(5), &nowhere);
        assert!(
            l.contains(
                "\"register\":null,\"address\":40,\"value\":null,\"words\":[1,2],\"ok\":false"
            ),
            "{l}"
        );
    }

    #[test]
    fn a_fault_carries_its_kind_and_parameters_as_the_scenario_writes_them() {
        let fact = |kind, until_s| {
            FaultFact::of(&Fault {
                at_s: 20,
                until_s,
                kind,
                cdu: None,
            })
        };
        let leak = Fact::FaultBegins(fact(FaultKind::Leak(1), None));
        assert_eq!(
            line(25.0, Duration::from_millis(500), &leak),
            "{\"sim_ms\":25000,\"wall_ms\":500,\"kind\":\"fault_begins\",\"fault\":\"leak\",\
             \"target\":\"1\",\"at_s\":20,\"until_s\":null}\n"
        );
        let trip = Fact::FaultEnds(fact(FaultKind::PumpTrip(0), Some(90)));
        assert!(
            line(90.0, Duration::ZERO, &trip)
                .contains("\"kind\":\"fault_ends\",\"fault\":\"pump_trip\",\"target\":\"A\",\"at_s\":20,\"until_s\":90}"),
        );
        let drift = fact(FaultKind::SensorDrift(SensorName::Flow, -0.5), None);
        assert_eq!(
            (drift.target.as_deref(), drift.value),
            (Some("flow"), Some(-0.5))
        );
        let gpu = fact(FaultKind::GpuFail(0, 1, 5), None);
        assert_eq!(gpu.target.as_deref(), Some("0.1.5"));
        let stuck = fact(FaultKind::ValveFeedbackStuck(2, true), None);
        assert_eq!(
            (stuck.fault, stuck.value),
            ("valve_feedback_stuck", Some(1.0))
        );
    }

    #[test]
    fn every_fault_kind_reads_back_from_the_scenario_file_it_writes() {
        // Each kind written as a scenario's [[fault]] from its fields is
        // read back as the same kind.
        let kinds = [
            FaultKind::ChillerTrip,
            FaultKind::PumpTrip(1),
            FaultKind::DryCoolerDegraded(0.4),
            FaultKind::Leak(3),
            FaultKind::SensorStuck(SensorName::SupplyTemp),
            FaultKind::SensorDrift(SensorName::ReturnTemp, 0.2),
            FaultKind::SensorLost(SensorName::OutdoorTemp),
            FaultKind::BusOutage,
            FaultKind::ModbusOutage,
            FaultKind::ValveStuck(0),
            FaultKind::GpuFail(2, 1, 7),
            FaultKind::PumpSeized(0),
            FaultKind::ControllerRestart(12.0),
            FaultKind::RopeCut(2),
            FaultKind::BoardIoFault,
            FaultKind::CduWriteRefused,
            FaultKind::ColdPlateFouling(1, 3.0),
            FaultKind::ValveFeedbackStuck(3, false),
            FaultKind::LatchCorrupt,
        ];
        for kind in kinds {
            let (name, target, value) = fault_fields(&kind);
            let mut toml = format!(
                "format = \"plant-scenario/1\"\ndescription = \"d\"\nduration_s = 100\nseed = 1\n\
                 [ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.5]]\n\
                 [[fault]]\nat_s = 10\nuntil_s = 20\nkind = \"{name}\"\n"
            );
            if let Some(t) = target {
                toml.push_str(&format!("target = \"{t}\"\n"));
            }
            if let Some(v) = value {
                toml.push_str(&format!("value = {v:?}\n"));
            }
            let sc = loopwarden_twin::scenario::Scenario::from_toml(&toml, "t.toml")
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(sc.faults[0].kind, kind, "{name}");
        }
    }

    #[test]
    fn each_line_is_on_disk_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.jsonl");
        let mut r = Record::create(&path).unwrap();
        r.write(0.0, Duration::ZERO, &Fact::Fallback { on: true })
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"sim_ms\":0,\"wall_ms\":0,\"kind\":\"fallback\",\"on\":true}\n"
        );
        r.write(
            1.5,
            Duration::from_millis(30),
            &Fact::Pump {
                pump: "B".into(),
                running: true,
            },
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.lines().nth(1),
            Some("{\"sim_ms\":1500,\"wall_ms\":30,\"kind\":\"pump\",\"pump\":\"B\",\"running\":true}")
        );
        let e = Record::create(&dir.path().join("no/such/dir.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--record ") && e.contains("cannot create it: "),
            "{e}"
        );
    }
}

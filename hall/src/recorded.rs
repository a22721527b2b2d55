//! The simulated CDU served with a record of what it was told and what
//! happened to it (`loopwarden-hall cdu --record`, the format in
//! [`crate::record`]).
//!
//! Nothing is sampled. Every write reaches the CDU's registers through
//! [`RecordedCdu`], which records it as it is done or refused; and a write
//! is done under the hall's lock, between two of its steps, so a step
//! reads exactly the settings recorded before it. After each step
//! [`Watch::stepped`] records the scenario faults the step began or
//! ended and what changed in the CDU as the step left it: its fallback,
//! its pumps, its valves. A fact's `sim_ms` is the hall's time when it
//! happened: a write's is the time of the step before it (the plant
//! meets it in the step after), a fault's and a state change's the end
//! of the step that played it, when it shows in the registers.
//!
//! The Modbus serving repeats the simulated CDU's own (`SimCdu::serve`
//! and `serve_rtu_on`, which serve the twin's registers only) with the
//! recording register file in its place: the same dispatch
//! (`loopwarden_boards::modbus_server::answer`), the same unit id rules
//! over RTU (its own answered, broadcasts done unanswered, others
//! ignored).
//!
//! Glossary:
//! - *plant state*: the pumps running (contactor closed and the drive
//!   not tripped), the valves open (as commanded, or stuck open) and the
//!   fallback, as the hall played them in its last step.
//! - *watch*: the record and what it last recorded of the plant state
//!   and the faults.

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_boards::modbus_map::{Kind, RegisterMap, ValueError};
use loopwarden_boards::modbus_server::{answer, RegisterFile};
use loopwarden_twin::hall::Hall;
use loopwarden_twin::scenario::{Fault, FaultKind};
use loopwarden_twin::sim_cdu::{fallback, SimCdu};
use tokio_modbus::server::tcp::{accept_tcp_connection, Server};
use tokio_modbus::{ExceptionCode, Request, Response, SlaveRequest};
use tokio_serial::SerialPort as _;

use crate::record::{number, Fact, FaultFact, Record, RecordError};
use crate::sim_side::SimError;

/// The CDU as the hall played it in its last step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlantState {
    /// Pump A and B running.
    pub pumps_running: [bool; 2],
    /// Per rack: its valve open.
    pub valves_open: Vec<bool>,
    /// On its own fallback.
    pub fallback: bool,
}

impl PlantState {
    /// What the hall played in its last step, from the settings it read
    /// (unchanged since: writes wait for the hall's lock) and the faults
    /// `active` in that step.
    pub fn of(hall: &Hall, cdu: &SimCdu, active: &[&FaultKind]) -> Result<Self, ValueError> {
        let site = hall.plant().site();
        let run = cdu.setting("pumps_run")? as u32;
        let lead = (cdu.setting("lead_pump")? as usize).min(1);
        let valves = cdu.setting("valves_open")? as u32;
        let mut pump_on = [run & 1 != 0, run & 2 != 0];
        let on_fallback = hall.in_fallback();
        if on_fallback {
            pump_on = fallback(&site.secondary, pump_on, lead).2;
        }
        let has = |k: FaultKind| active.contains(&&k);
        Ok(Self {
            pumps_running: [0, 1].map(|i| pump_on[i] && !has(FaultKind::PumpTrip(i))),
            valves_open: (0..site.racks)
                .map(|r| valves & (1 << r) != 0 || has(FaultKind::ValveStuck(r)))
                .collect(),
            fallback: on_fallback,
        })
    }

    /// What changed from `self` to `next`: the fallback, then the pumps,
    /// then the valves rack by rack.
    pub fn changes(&self, next: &Self) -> Vec<Fact> {
        let mut facts = Vec::new();
        if self.fallback != next.fallback {
            facts.push(Fact::Fallback { on: next.fallback });
        }
        for (i, name) in ["A", "B"].into_iter().enumerate() {
            if self.pumps_running[i] != next.pumps_running[i] {
                facts.push(Fact::Pump {
                    pump: name.to_string(),
                    running: next.pumps_running[i],
                });
            }
        }
        for (rack, (was, now)) in self.valves_open.iter().zip(&next.valves_open).enumerate() {
            if was != now {
                facts.push(Fact::Valve { rack, open: *now });
            }
        }
        facts
    }
}

/// One register (or the words past the map's registers) a write touched.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The register starting at `address`, if the map has one whose
    /// words the write holds whole.
    pub register: Option<String>,
    /// Its first address.
    pub address: u16,
    /// The value as the map decodes the words (scaled).
    pub value: Option<f64>,
    /// The words from `address` on, where no register was.
    pub words: Vec<u16>,
}

/// The registers a write of `words` from `addr` touches, in order, as the
/// CDU reads them: from the first address with no register of its own
/// (or a register written in part) to the end, the words alone.
pub fn written(map: &RegisterMap, addr: u16, words: &[u16]) -> Vec<Written> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let address = (u32::from(addr) + i as u32).min(u32::from(u16::MAX)) as u16;
        let reg = map
            .at(Kind::Holding, address)
            .filter(|r| i + usize::from(r.ty.words()) <= words.len());
        let Some(r) = reg else {
            out.push(Written {
                register: None,
                address,
                value: None,
                words: words[i..].to_vec(),
            });
            break;
        };
        let n = usize::from(r.ty.words());
        out.push(Written {
            register: Some(r.name.clone()),
            address,
            value: map.decode(&r.name, &words[i..i + n]).ok(),
            words: Vec::new(),
        });
        i += n;
    }
    if out.is_empty() {
        out.push(Written {
            register: None,
            address: addr,
            value: None,
            words: Vec::new(),
        });
    }
    out
}

/// The record and what it last recorded.
#[derive(Debug)]
pub struct Watch {
    record: Record,
    /// When the CDU began serving.
    t0: Instant,
    map: RegisterMap,
    faults: Vec<Fault>,
    /// Per fault: in effect at the last step.
    in_effect: Vec<bool>,
    state: PlantState,
    /// The first line that could not be written.
    failed: Option<RecordError>,
}

/// What the start line says besides the CDU's state.
#[derive(Debug, Clone)]
pub struct Started {
    /// The scenario's name.
    pub scenario: String,
    /// Simulated seconds per wall second.
    pub speed: f64,
}

impl Watch {
    /// Starts the record of `hall` (playing `faults`) and its CDU, which
    /// begins serving at `t0` on `serving`: its first line, the state they
    /// start in.
    pub fn start(
        record: Record,
        t0: Instant,
        hall: &Hall,
        cdu: &SimCdu,
        faults: Vec<Fault>,
        started: Started,
        serving: String,
    ) -> Result<Self, SimError> {
        let t_s = hall.time_s();
        // Before the first step nothing is played: the CDU at rest, no
        // fault in effect.
        let state = PlantState::of(hall, cdu, &[])?;
        let mut w = Self {
            record,
            t0,
            map: cdu.map().clone(),
            in_effect: vec![false; faults.len()],
            faults,
            state: state.clone(),
            failed: None,
        };
        let first = Fact::Start {
            scenario: started.scenario,
            speed: started.speed,
            serving,
            pumps_running: state.pumps_running,
            valves_open: state.valves_open,
            fallback: state.fallback,
        };
        w.record.write(t_s, Duration::ZERO, &first)?;
        Ok(w)
    }

    /// Records `fact` at scenario time `t_s` and wall time `now`; after a
    /// line fails, writes nothing more and keeps the failure.
    fn put(&mut self, t_s: f64, now: Instant, fact: &Fact) {
        if self.failed.is_some() {
            return;
        }
        let wall = now.saturating_duration_since(self.t0);
        if let Err(e) = self.record.write(t_s, wall, fact) {
            self.failed = Some(e);
        }
    }

    /// A client's write of `words` from `addr`, done (`Ok`) or refused,
    /// at scenario time `t_s` and wall time `now`: one line per register.
    pub fn wrote(
        &mut self,
        t_s: f64,
        now: Instant,
        addr: u16,
        words: &[u16],
        result: Result<(), ExceptionCode>,
    ) {
        for w in written(&self.map, addr, words) {
            let fact = Fact::Write {
                register: w.register,
                address: w.address,
                value: w.value.and_then(number),
                words: (!w.words.is_empty()).then_some(w.words),
                ok: result.is_ok(),
                exception: result.err().map(|e| e.to_string()),
                exception_code: result.err().map(u8::from),
            };
            self.put(t_s, now, &fact);
        }
    }

    /// The hall just stepped from scenario time `from_s` (to its time
    /// now), done at wall time `now`: the faults it began or ended, then
    /// what changed in the CDU.
    pub fn stepped(&mut self, from_s: f64, hall: &Hall, cdu: &SimCdu, now: Instant) {
        let t_s = hall.time_s();
        let mut facts = Vec::new();
        for (i, f) in self.faults.iter().enumerate() {
            let acts = f.active(from_s);
            if acts != self.in_effect[i] {
                self.in_effect[i] = acts;
                let fact = FaultFact::of(f);
                facts.push(if acts {
                    Fact::FaultBegins(fact)
                } else {
                    Fact::FaultEnds(fact)
                });
            }
        }
        let active: Vec<&FaultKind> = self
            .faults
            .iter()
            .filter(|f| f.active(from_s))
            .map(|f| &f.kind)
            .collect();
        match PlantState::of(hall, cdu, &active) {
            Ok(next) => {
                facts.extend(self.state.changes(&next));
                self.state = next;
            }
            Err(e) => tracing::warn!("record: the CDU's settings: {e}"),
        }
        for fact in &facts {
            self.put(t_s, now, fact);
        }
    }

    /// The CDU stopped as told at wall time `now`: the last line.
    pub fn stopped(&mut self, t_s: f64, now: Instant) {
        self.put(t_s, now, &Fact::Stop);
    }

    /// Why the record stopped, once (then `None`).
    pub fn take_failure(&mut self) -> Option<RecordError> {
        self.failed.take()
    }
}

/// The simulated CDU's registers, every write recorded (clone it freely:
/// one CDU, one hall, one record).
#[derive(Clone)]
pub struct RecordedCdu {
    cdu: SimCdu,
    hall: Arc<Mutex<Hall>>,
    watch: Arc<Mutex<Watch>>,
}

impl RecordedCdu {
    /// `cdu`'s registers, `hall` behind them, recorded in `watch`.
    pub fn new(cdu: SimCdu, hall: Arc<Mutex<Hall>>, watch: Arc<Mutex<Watch>>) -> Self {
        Self { cdu, hall, watch }
    }

    /// Serves Modbus TCP on `listener` until the task is dropped, as
    /// `SimCdu::serve` does.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        let server = Server::new(listener);
        let on_connected = |stream, socket_addr: SocketAddr| {
            let cdu = self.clone();
            async move {
                accept_tcp_connection(stream, socket_addr, move |_| Ok(Some(Service(cdu.clone()))))
            }
        };
        let on_error = |e| tracing::warn!("simulated CDU: Modbus connection failed: {e}");
        server.serve(&on_connected, on_error).await
    }

    /// Serves Modbus RTU on `line` until the task is dropped or the line
    /// fails, answering its map's unit id only, as `SimCdu::serve_rtu_on`
    /// does.
    pub async fn serve_rtu_on(self, line: tokio_serial::SerialStream) -> std::io::Result<()> {
        tokio_modbus::server::rtu::Server::new(line)
            .serve_forever(RtuService(self))
            .await
    }
}

/// Opens the serial device `path` at `baud`, 8N1, and discards whatever
/// arrived before, as the simulated CDU's own line does. Needs a tokio
/// runtime.
pub fn open_rtu(path: &str, baud: u32) -> std::io::Result<tokio_serial::SerialStream> {
    let port = tokio_serial::SerialStream::open(&tokio_serial::new(path, baud))?;
    port.clear(tokio_serial::ClearBuffer::All)?;
    Ok(port)
}

impl RegisterFile for RecordedCdu {
    fn read_registers(&self, kind: Kind, addr: u16, count: u16) -> Result<Vec<u16>, ExceptionCode> {
        self.cdu.read_registers(kind, addr, count)
    }

    fn write_registers(&self, addr: u16, words: &[u16]) -> Result<(), ExceptionCode> {
        // Between two steps: the next one reads what is recorded here.
        let hall = self.hall.lock().expect("hall lock");
        let result = self.cdu.write_registers(addr, words);
        let now = Instant::now();
        self.watch
            .lock()
            .expect("record lock")
            .wrote(hall.time_s(), now, addr, words, result);
        result
    }
}

/// One TCP connection's service.
struct Service(RecordedCdu);

impl tokio_modbus::server::Service for Service {
    type Request = Request<'static>;
    type Response = Response;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Response, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(answer(&self.0, req))
    }
}

/// The RTU service: answers its own unit id only; broadcast writes are
/// done unanswered.
struct RtuService(RecordedCdu);

impl tokio_modbus::server::Service for RtuService {
    type Request = SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Ready<Result<Option<Response>, ExceptionCode>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        ready(match req.slave {
            0 => match req.request {
                Request::WriteSingleRegister(..) | Request::WriteMultipleRegisters(..) => {
                    let _ = answer(&self.0, req.request);
                    Ok(None)
                }
                _ => Ok(None),
            },
            id if id == self.0.cdu.map().unit_id => answer(&self.0, req.request).map(Some),
            _ => Ok(None),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_boards::pins::PinMap;
    use loopwarden_twin::pins::SimLines;
    use loopwarden_twin::scenario::Scenario;

    /// A two-rack hall playing `faults` (TOML `[[fault]]` tables), its
    /// heartbeat timeout 2 s, the CDU at rest with both valves open.
    fn hall(faults: &str) -> (Hall, SimCdu, Scenario) {
        let text = format!(
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 3600\nseed = 1\n\
             [site]\nracks = 2\n[truth.loop]\nheartbeat_timeout_s = 2.0\n\
             [ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.8]]\n{faults}"
        );
        let sc = Scenario::from_toml(&text, "t.toml").unwrap();
        let cdu = SimCdu::new(
            RegisterMap::sim_cdu(),
            &[
                ("supply_setpoint", 30.0),
                ("pump_speed", 100.0),
                ("valves_open", 3.0),
                ("pumps_run", 1.0),
            ],
        )
        .unwrap();
        let h = Hall::new(
            sc.clone(),
            cdu.clone(),
            SimLines::new(),
            PinMap::sim_controller(),
        );
        (h, cdu, sc)
    }

    fn words(cdu: &SimCdu, name: &str, v: f64) -> Vec<u16> {
        cdu.map().encode(name, v).unwrap()
    }

    #[test]
    fn a_write_reads_as_the_registers_it_touches() {
        let map = RegisterMap::sim_cdu();
        let w = written(&map, 3, &[13]);
        assert_eq!(
            w,
            vec![Written {
                register: Some("valves_open".into()),
                address: 3,
                value: Some(13.0),
                words: vec![],
            }]
        );
        // Setpoint and speed in one write; out of range still decodes.
        let w = written(&map, 0, &[9900, 800]);
        let got: Vec<_> = w.iter().map(|w| (w.register.as_deref(), w.value)).collect();
        assert_eq!(
            got,
            vec![
                (Some("supply_setpoint"), Some(99.0)),
                (Some("pump_speed"), Some(80.0))
            ]
        );
        // Past the last holding register: the words from there.
        let w = written(&map, 5, &[7, 1, 2]);
        assert_eq!(w[0].register.as_deref(), Some("heartbeat"));
        assert_eq!(
            w[1],
            Written {
                register: None,
                address: 6,
                value: None,
                words: vec![1, 2],
            }
        );
        assert_eq!(written(&map, 2, &[])[0].address, 2);
        // A 32-bit register written in part is words, not a value.
        let wide = RegisterMap::from_toml(
            "model = \"m\"\nword_order = \"high_first\"\nunit_id = 1\n\
             [[register]]\nname = \"energy\"\nkind = \"holding\"\naddress = 0\ntype = \"u32\"\n\
             scale = 1.0\nunit = \"J\"\nmin = 0.0\nmax = 1e9\ndescription = \"d\"\n",
            "m.toml",
        )
        .unwrap();
        assert_eq!(written(&wide, 0, &[1, 2])[0].value, Some(65538.0));
        assert_eq!(written(&wide, 0, &[1])[0].register, None);
    }

    #[test]
    fn changes_come_fallback_first_then_pumps_then_valves() {
        let a = PlantState {
            pumps_running: [true, false],
            valves_open: vec![true, true, true],
            fallback: false,
        };
        assert!(a.changes(&a).is_empty());
        let b = PlantState {
            pumps_running: [false, true],
            valves_open: vec![true, false, true],
            fallback: true,
        };
        assert_eq!(
            a.changes(&b),
            vec![
                Fact::Fallback { on: true },
                Fact::Pump {
                    pump: "A".into(),
                    running: false
                },
                Fact::Pump {
                    pump: "B".into(),
                    running: true
                },
                Fact::Valve {
                    rack: 1,
                    open: false
                },
            ]
        );
    }

    /// The plant state as the hall's own registers show it, where no
    /// fault makes them lie.
    fn shown(cdu: &SimCdu, fallback: bool) -> PlantState {
        let closed = cdu.measurement("valves_closed").unwrap() as u32;
        PlantState {
            pumps_running: ["pump_a_running", "pump_b_running"]
                .map(|p| cdu.measurement(p).unwrap() != 0.0),
            valves_open: (0..2).map(|r| closed & (1 << r) == 0).collect(),
            fallback,
        }
    }

    #[test]
    fn the_plant_state_is_what_the_hall_played() {
        // A pump trip, a valve stuck open, and the heartbeat stopping.
        let (mut h, cdu, sc) = hall(
            "[[fault]]\nat_s = 10\nuntil_s = 30\nkind = \"pump_trip\"\ntarget = \"A\"\n\
             [[fault]]\nat_s = 20\nkind = \"valve_stuck\"\ntarget = \"1\"\n",
        );
        let mut seen = Vec::new();
        let writes: [(f64, &str, f64); 5] = [
            (2.0, "heartbeat", 1.0),
            (4.0, "valves_open", 1.0),
            (12.0, "pumps_run", 3.0),
            (24.0, "valves_open", 0.0),
            (40.0, "pumps_run", 2.0),
        ];
        for k in 0..60 {
            let t = h.time_s();
            for (at, name, v) in writes {
                if at == t {
                    cdu.write_setting(name, v).unwrap();
                }
            }
            h.step(1.0).unwrap();
            let active: Vec<&FaultKind> = sc
                .faults
                .iter()
                .filter(|f| f.active(t))
                .map(|f| &f.kind)
                .collect();
            let state = PlantState::of(&h, &cdu, &active).unwrap();
            assert_eq!(state, shown(&cdu, h.in_fallback()), "step {k} from {t} s");
            seen.push(state);
        }
        // Each case was played: A tripped, both running, rack 1 stuck
        // open though written shut, the fallback.
        assert!(seen.iter().any(|s| s.pumps_running == [false, false]));
        assert!(seen.iter().any(|s| s.pumps_running == [true, true]));
        assert!(seen.iter().any(|s| s.valves_open == [false, true]));
        assert!(seen.iter().any(|s| s.fallback) && !seen[0].fallback);
    }

    fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn the_record_holds_each_write_between_the_steps_around_it() {
        let (h, cdu, sc) =
            hall("[[fault]]\nat_s = 3\nuntil_s = 5\nkind = \"leak\"\ntarget = \"1\"\n");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let t0 = Instant::now();
        let started = Started {
            scenario: "t".into(),
            speed: 1.0,
        };
        let w = Watch::start(
            Record::create(&path).unwrap(),
            t0,
            &h,
            &cdu,
            sc.faults.clone(),
            started,
            "here".into(),
        )
        .unwrap();
        let (hall, watch) = (Arc::new(Mutex::new(h)), Arc::new(Mutex::new(w)));
        let file = RecordedCdu::new(cdu.clone(), hall.clone(), watch.clone());
        let step = |k: u64| {
            let mut h = hall.lock().unwrap();
            let from = h.time_s();
            h.step(1.0).unwrap();
            let at = t0 + Duration::from_millis(100 * k);
            watch.lock().unwrap().stepped(from, &h, &cdu, at);
        };
        for k in 1..=4 {
            step(k);
        }
        // The leak took effect in the step from 3 s; the rack's valve is
        // closed by a write, refused once out of range.
        assert_eq!(
            file.write_registers(3, &words(&cdu, "valves_open", 1.0)),
            Ok(())
        );
        assert_eq!(
            file.write_registers(0, &[9900]),
            Err(ExceptionCode::IllegalDataValue)
        );
        for k in 5..=6 {
            step(k);
        }
        let mut w = watch.lock().unwrap();
        w.stopped(6.0, t0 + Duration::from_millis(700));
        assert!(w.take_failure().is_none());
        let got: Vec<String> = lines(&path)
            .iter()
            .map(|l| {
                let kind = l["kind"].as_str().unwrap().to_string();
                let what = match kind.as_str() {
                    "write" => format!(
                        "{}={} {}",
                        l["register"].as_str().unwrap(),
                        l["value"],
                        l["ok"]
                    ),
                    "fault_begins" | "fault_ends" => l["fault"].as_str().unwrap().to_string(),
                    "valve" => format!("{} {}", l["rack"], l["open"]),
                    _ => String::new(),
                };
                format!("{} {kind} {what}", l["sim_ms"])
            })
            .collect();
        assert_eq!(
            got,
            [
                "0 start ",
                "4000 fault_begins leak",
                "4000 write valves_open=1 true",
                "4000 write supply_setpoint=99 false",
                "5000 valve 1 false",
                "6000 fault_ends leak",
                "6000 stop ",
            ]
        );
        let first = &lines(&path)[0];
        assert_eq!(first["valves_open"], serde_json::json!([true, true]));
        assert_eq!(first["pumps_running"], serde_json::json!([true, false]));
        assert_eq!(first["serving"], "here");
        let refused = &lines(&path)[3];
        assert_eq!(refused["exception"], "Illegal data value");
        assert_eq!(refused["exception_code"], 3);
    }
}

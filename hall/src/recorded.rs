//! The simulated CDU's record of what it was told and what happened to
//! it (`loopwarden-hall cdu --record`, the format in [`crate::record`]).
//!
//! Nothing is sampled. The simulated CDU hands every client write to the
//! record as it does or refuses it ([`record_writes`], on
//! `SimCdu::observe_writes`), and `loopwarden-hall cdu` holds client
//! writes back while the hall steps and the record takes in what the step
//! did (`SimCdu::hold_writes`), so a write is done between two steps and
//! the next step reads exactly the settings recorded before it. After
//! each step [`Watch::stepped`] records the scenario faults the step
//! began or ended and what changed in the CDU as the hall played it
//! (`Hall::plant_state`): its fallback, its pumps, its valves. A fact's
//! `sim_ms` is the hall's time when it happened: a write's is the time of
//! the step before it (the plant meets it in the step after), a fault's
//! and a state change's the end of the step that played it, when it shows
//! in the registers.
//!
//! Glossary:
//! - *plant state*: the pumps running (contactor closed and the drive
//!   not tripped), the valves open (as commanded, or stuck open) and the
//!   fallback, as the hall played them in its last step.
//! - *watch*: the record, what it last recorded of the plant state and
//!   the faults, and the hall's time at its last step.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_boards::modbus_map::{Kind, RegisterMap};
use loopwarden_twin::hall::{Hall, PlantState};
use loopwarden_twin::scenario::Fault;
use loopwarden_twin::sim_cdu::{ClientWrite, SimCdu};

use crate::record::{number, Fact, FaultFact, Record, RecordError};

/// What changed from `was` to `now`: the fallback, then the pumps, then
/// the valves rack by rack.
pub fn changes(was: &PlantState, now: &PlantState) -> Vec<Fact> {
    let mut facts = Vec::new();
    if was.fallback != now.fallback {
        facts.push(Fact::Fallback { on: now.fallback });
    }
    for (i, name) in ["A", "B"].into_iter().enumerate() {
        if was.pumps_running[i] != now.pumps_running[i] {
            facts.push(Fact::Pump {
                pump: name.to_string(),
                running: now.pumps_running[i],
            });
        }
    }
    for (rack, (a, b)) in was.valves_open.iter().zip(&now.valves_open).enumerate() {
        if a != b {
            facts.push(Fact::Valve { rack, open: *b });
        }
    }
    facts
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
    /// The hall's time at its last step, s: a write's time.
    t_s: f64,
    /// The first line that could not be written.
    failed: Option<RecordError>,
    /// The last line is written: nothing more is.
    ended: bool,
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
    /// Starts the record of `hall` (playing `faults`) and its CDU (serving
    /// `map`), which begins serving at `t0` on `serving`: its first line,
    /// the state they start in.
    pub fn start(
        record: Record,
        t0: Instant,
        hall: &Hall,
        map: &RegisterMap,
        faults: Vec<Fault>,
        started: Started,
        serving: String,
    ) -> Result<Self, RecordError> {
        // Before the first step nothing is played: the CDU at rest, no
        // fault in effect.
        let state = hall.plant_state().clone();
        let mut w = Self {
            record,
            t0,
            map: map.clone(),
            in_effect: vec![false; faults.len()],
            faults,
            state: state.clone(),
            t_s: hall.time_s(),
            failed: None,
            ended: false,
        };
        let first = Fact::Start {
            scenario: started.scenario,
            speed: started.speed,
            serving,
            pumps_running: state.pumps_running,
            valves_open: state.valves_open,
            fallback: state.fallback,
        };
        w.record.write(w.t_s, Duration::ZERO, &first)?;
        Ok(w)
    }

    /// Records `fact` at scenario time `t_s` and wall time `now`; after a
    /// line fails, or the last line, writes nothing more.
    fn put(&mut self, t_s: f64, now: Instant, fact: &Fact) {
        if self.failed.is_some() || self.ended {
            return;
        }
        let wall = now.saturating_duration_since(self.t0);
        if let Err(e) = self.record.write(t_s, wall, fact) {
            self.failed = Some(e);
        }
    }

    /// A client's write `w`, done or refused at wall time `now` (at the
    /// hall's time of its last step): one line per register.
    pub fn wrote(&mut self, now: Instant, w: &ClientWrite<'_>) {
        for reg in written(&self.map, w.address, w.words) {
            let fact = Fact::Write {
                register: reg.register,
                address: reg.address,
                value: reg.value.and_then(number),
                words: (!reg.words.is_empty()).then_some(reg.words),
                ok: w.outcome.is_ok(),
                exception: w.outcome.err().map(|e| e.to_string()),
                exception_code: w.outcome.err().map(u8::from),
            };
            self.put(self.t_s, now, &fact);
        }
    }

    /// The hall just stepped from scenario time `from_s` (to its time
    /// now), done at wall time `now`: the faults it began or ended, then
    /// what changed in the CDU as it played it.
    pub fn stepped(&mut self, from_s: f64, hall: &Hall, now: Instant) {
        self.t_s = hall.time_s();
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
        let next = hall.plant_state();
        facts.extend(changes(&self.state, next));
        self.state = next.clone();
        for fact in &facts {
            self.put(self.t_s, now, fact);
        }
    }

    /// The CDU stopped as told at wall time `now`: the last line; a write
    /// a connection still makes after it is not recorded.
    pub fn stopped(&mut self, t_s: f64, now: Instant) {
        self.put(t_s, now, &Fact::Stop);
        self.ended = true;
    }

    /// Why the record stopped, once (then `None`).
    pub fn take_failure(&mut self) -> Option<RecordError> {
        self.failed.take()
    }
}

/// Records every client write `cdu` does or refuses from now on in
/// `watch`, as it is done (the observer runs under the CDU's write lock:
/// lock the watch after `SimCdu::hold_writes`, never before).
pub fn record_writes(cdu: &SimCdu, watch: &Arc<Mutex<Watch>>) {
    let watch = watch.clone();
    cdu.observe_writes(move |w| {
        watch.lock().expect("record lock").wrote(Instant::now(), w);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_boards::pins::PinMap;
    use loopwarden_twin::pins::SimLines;
    use loopwarden_twin::scenario::Scenario;
    use tokio_modbus::prelude::*;

    /// A two-rack hall playing `faults` (TOML `[[fault]]` tables), its
    /// CDU at rest with both valves open.
    fn hall(faults: &str) -> (Hall, SimCdu, Scenario) {
        let text = format!(
            "format = \"plant-scenario/1\"\ndescription = \"t\"\nduration_s = 3600\nseed = 1\n\
             [site]\nracks = 2\n[ambient]\npoints = [[0, 20.0]]\n[load]\nall = [[0, 0.8]]\n{faults}"
        );
        let sc = Scenario::from_toml(&text, "t.toml").unwrap();
        let cdu = SimCdu::new(RegisterMap::sim_cdu(), &[("valves_open", 3.0)]).unwrap();
        let pins = PinMap::sim_controller();
        let h = Hall::new(sc.clone(), cdu.clone(), SimLines::new(), pins);
        (h, cdu, sc)
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
        assert!(changes(&a, &a).is_empty());
        let b = PlantState {
            pumps_running: [false, true],
            valves_open: vec![true, false, true],
            fallback: true,
        };
        assert_eq!(
            changes(&a, &b),
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

    fn lines(path: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The hall's step `k` (1 s), and the record of it at 100 ms a step.
    fn step(hall: &Mutex<Hall>, watch: &Mutex<Watch>, t0: Instant, k: u64) {
        let mut h = hall.lock().unwrap();
        let from = h.time_s();
        h.step(1.0).unwrap();
        let at = t0 + Duration::from_millis(100 * k);
        watch.lock().unwrap().stepped(from, &h, at);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_record_holds_each_write_between_the_steps_around_it() {
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
            cdu.map(),
            sc.faults.clone(),
            started,
            "here".into(),
        )
        .unwrap();
        let (hall, watch) = (Arc::new(Mutex::new(h)), Arc::new(Mutex::new(w)));
        record_writes(&cdu, &watch);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(cdu.clone().serve(listener));
        let mut ctx = tcp::connect(addr).await.unwrap();
        for k in 1..=3 {
            let _held = cdu.hold_writes();
            step(&hall, &watch, t0, k);
        }
        // The leak takes effect in the step from 3 s. A write sent while
        // that step is under way waits for it and its record: the rack's
        // valve is closed after the leak, at the step's end.
        {
            let _held = cdu.hold_writes();
            let write = tokio::spawn(async move {
                let done = ctx.write_single_register(3, 1).await;
                (ctx, done)
            });
            // Waiting on the runtime here could wait forever: the held
            // write may block the thread that drives its timers.
            std::thread::sleep(Duration::from_millis(200));
            step(&hall, &watch, t0, 4);
            drop(_held);
            let done;
            (ctx, done) = write.await.unwrap();
            assert!(matches!(done, Ok(Ok(()))), "{done:?}");
        }
        // Refused: out of range.
        let refused = ctx.write_multiple_registers(0, &[9900]).await.unwrap();
        assert_eq!(refused, Err(ExceptionCode::IllegalDataValue));
        for k in 5..=6 {
            let _held = cdu.hold_writes();
            step(&hall, &watch, t0, k);
        }
        let stop_at = t0 + Duration::from_millis(700);
        watch.lock().unwrap().stopped(6.0, stop_at);
        // Past the last line nothing is recorded.
        ctx.write_single_register(3, 3).await.unwrap().unwrap();
        assert!(watch.lock().unwrap().take_failure().is_none());
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

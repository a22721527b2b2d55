//! A decider's trace, recorded on a scripted hall (a leak, its valve
//! closed before the record's keep and the planned valve write after it
//! unanswered, a pump trip, host reports believed and refused, refused
//! writes, a record that did not go to flash, a silent CDU, a restart
//! with what was learned),
//! encoded with postcard, decoded, and replayed into a fresh decider:
//! the same results and digests, step by step; the direct calls give
//! the same; and a changed input changes the digest where it changed.

use cooling_core::estimate::record::{MAX_LEN, PARTS};
use cooling_core::{Commands, CoreConfig, Learned};
use cooling_decide::hosts::heard_of;
use cooling_decide::hosts::Bounds;
use cooling_decide::{
    leak_inputs, Applied, BoardRead, CduMeasurements, Decider, MapLimits, Opening, Outcome,
    Setting, StepIn, Traced, Verdict,
};
use loopwarden_protocol::message::Pump;
use loopwarden_protocol::samples;
use loopwarden_protocol::units::{TimestampMs, Watts};

/// The wall clock at the scenario's start, ms since the epoch.
const EPOCH_MS: u64 = 1_800_000_000_000;
/// Steps of the scenario, one a second.
const STEPS: u64 = 200;
/// Hosts of the default layout.
const HOSTS: u32 = 16;

fn limits() -> MapLimits {
    MapLimits {
        mapped: [true; 6],
        setpoint_c: Some((17.0, 45.0)),
        speed_pct: Some((30.0, 100.0)),
        positions: true,
    }
}

fn decider(latched: Opening) -> Decider {
    Decider::new(CoreConfig::default(), limits(), &latched.read()).unwrap()
}

/// A CDU that takes what is written and reports it back.
struct Cdu {
    valves_open: u16,
    pumps_run: u8,
}

impl Cdu {
    fn measured(&self, s: u64) -> Option<CduMeasurements> {
        if (150..154).contains(&s) {
            return None;
        }
        let tripped = (100..130).contains(&s);
        let wobble = ((s % 7) as f64 - 3.0) * 0.05;
        Some(CduMeasurements {
            supply_c: Some(30.0 + wobble),
            return_c: Some(38.0 + wobble),
            flow_lpm: Some(192.0),
            facility_supply_c: Some(27.0),
            pumps_running: [
                Some(self.pumps_run & 1 != 0 && !tripped),
                Some(self.pumps_run & 2 != 0),
            ],
            leaks: Some(if (40..70).contains(&s) { 0b0010 } else { 0 }),
            diff_pressure_kpa: Some(100.0),
            valves_closed: Some(!self.valves_open & 0b1111),
            pump_faults: [Some(tripped), Some(false)],
            it_w: Some(80_000.0),
            cooling_w: None,
            facility_w: Some(88_000.0),
            outdoor_c: Some(20.0),
        })
    }

    /// Writes `plan` as the shell does: in order, the heartbeat only when
    /// the safety writes went in (then said sent); the setpoint refused
    /// in 90..95, the valves unanswered at 40 (after the early write) and
    /// 110.
    fn write(&mut self, plan: &cooling_decide::Plan, s: u64) -> Outcome {
        let mut o = Outcome::default();
        for w in &plan.writes {
            if !o.due(w) {
                continue;
            }
            o.heartbeat_sent |= w.setting == Setting::Heartbeat;
            let refused = match w.setting {
                Setting::Setpoint if (90..95).contains(&s) => {
                    Some("exception 3 (illegal data value)")
                }
                Setting::Valves if s == 40 || s == 110 => Some("no answer within 500 ms"),
                _ => None,
            };
            match refused {
                Some(why) => o.record(w.setting, Err(why)),
                None => {
                    match w.setting {
                        Setting::Valves => self.valves_open = w.value as u16,
                        Setting::PumpsRun => self.pumps_run = w.value as u8,
                        _ => {}
                    }
                    o.record(w.setting, Ok::<(), &str>(()));
                }
            }
        }
        o
    }
}

/// What a decider gave for each input, the valve word it holds as the
/// CDU's after each, and each step's commands (kept in the decider, read
/// after the step).
#[derive(Default)]
struct Gave {
    applied: Vec<Applied>,
    taken: Vec<Option<u16>>,
    commands: Vec<Commands>,
}

impl Gave {
    fn apply(&mut self, d: &mut Decider, t: &Traced) -> Applied {
        let a = d.apply(t);
        if let Applied::Stepped { .. } = a {
            let c = d.last_commands().expect("a step's commands are kept");
            self.commands.push(c.clone());
        }
        self.applied.push(a.clone());
        self.taken.push(d.valves_taken());
        a
    }
}

/// A recording of what a decider was given and what it gave.
struct Recorder {
    d: Decider,
    trace: Vec<Traced>,
    gave: Gave,
}

impl Recorder {
    fn apply(&mut self, t: Traced) -> Applied {
        let a = self.gave.apply(&mut self.d, &t);
        self.trace.push(t);
        a
    }
}

fn board(s: u64) -> BoardRead {
    let wet = if (40..70).contains(&s) { 0b0010 } else { 0 };
    BoardRead::Read { wet, faults: 0 }
}

/// The scripted hall, recorded.
fn record() -> Recorder {
    let mut r = Recorder {
        d: decider(Opening::Nothing),
        trace: Vec::new(),
        gave: Gave::default(),
    };
    r.apply(Traced::Start {
        latched: Opening::Nothing,
    });
    let mut cdu = Cdu {
        valves_open: 0b1111,
        pumps_run: 1,
    };
    let mut kept = None;
    let mut failed_once = false;
    for s in 0..STEPS {
        let now_ms = s * 1000;
        let stamp = TimestampMs(EPOCH_MS + now_ms);
        events_before(&mut r, s, kept);
        for h in 0..HOSTS {
            let mut t = samples::host_telemetry(8);
            if h == 3 && (50..60).contains(&s) {
                t.gpus[1].power = Watts(9_000);
            }
            let heard = heard_of(&t, stamp, now_ms, &Bounds::ANY);
            r.apply(Traced::Heard {
                h,
                heard,
                now: stamp,
            });
        }
        let m = cdu.measured(s);
        let inp = StepIn {
            now_ms,
            board: board(s),
            ambient_c: m.and_then(|m| m.outdoor_c).map(|c| c as f32),
        };
        r.apply(Traced::Step { cdu: m, inp });
        if s == 40 {
            early_valves(&mut r, &mut cdu);
        }
        if let Applied::ToKeep(Some(rec)) = r.apply(Traced::ToKeep) {
            // The first record of the leak does not go to flash.
            let ok = s < 40 || std::mem::replace(&mut failed_once, true);
            r.apply(Traced::Kept(ok));
            kept = if ok { Some(rec) } else { kept };
        }
        let closed = m.and_then(|m| m.valves_closed);
        let Applied::Planned { plan, .. } = r.apply(Traced::Plan { closed }) else {
            panic!("step {s}: no plan");
        };
        let o = cdu.write(&plan, s);
        r.apply(Traced::Written(o));
    }
    r
}

/// The leak's first step, as a shell whose flash is slow runs it: the
/// valve word of the step's commands, closings only, written before the
/// record's keep, and taken by the CDU.
fn early_valves(r: &mut Recorder, cdu: &mut Cdu) {
    let asked =
        r.d.last_commands()
            .expect("the step's commands")
            .valves_open;
    let taken =
        r.d.valves_taken()
            .expect("the valves written before the leak");
    let word = asked & taken;
    assert_ne!(word, taken, "the leak's rack closed");
    cdu.valves_open = word;
    r.apply(Traced::EarlyValves(word));
}

/// Every kind of input a decider is given, numbered: no wildcard, so a
/// kind added does not build until it is numbered here, and then the
/// scenario must trace it ([`KINDS`]).
fn kind(t: &Traced) -> usize {
    match t {
        Traced::Start { .. } => 0,
        Traced::LearnedPart { .. } => 1,
        Traced::Heard { .. } => 2,
        Traced::Step { .. } => 3,
        Traced::ToKeep => 4,
        Traced::Kept(_) => 5,
        Traced::Plan { .. } => 6,
        Traced::Written(_) => 7,
        Traced::SetLimits { .. } => 8,
        Traced::FacilityTarget { .. } => 9,
        Traced::ClearLeak { .. } => 10,
        Traced::ClearPump { .. } => 11,
        Traced::EarlyValves(_) => 12,
        Traced::GenerationWritten(_) => 13,
    }
}

/// The kinds of input [`kind`] numbers.
const KINDS: usize = 14;

/// What the scenario's outside world does before step `s`.
fn events_before(r: &mut Recorder, s: u64, kept: Option<cooling_decide::LatchRecord>) {
    match s {
        20 => {
            r.apply(Traced::SetLimits {
                setpoint_ceiling_c: 30.0,
                plan_offset_k: -2.0,
            });
        }
        25 => {
            r.apply(Traced::FacilityTarget {
                water_c: 28.0,
                now_ms: s * 1000,
            });
        }
        80 => {
            let leaks = leak_inputs(board(s - 1), Some(0));
            let a = r.apply(Traced::ClearLeak { rack: 1, leaks });
            assert_eq!(a, Applied::Cleared(Ok(())), "the rope is dry");
        }
        140 => {
            let a = r.apply(Traced::ClearPump {
                pump: Pump::A,
                fault_shown: false,
            });
            assert_eq!(a, Applied::Cleared(Ok(())));
        }
        160 => {
            // The process starts again: the record kept, then what was
            // learned, part by part as the flash holds it.
            let learned = r.d.core().learned();
            r.apply(Traced::Start {
                latched: kept.map_or(Opening::Nothing, Opening::Record),
            });
            // The generation item read beside it (a shell traces it after
            // a record it cannot believe; beside one believed it changes
            // nothing, and the replay must not make it change anything).
            let g = kept.map_or(0, |k| k.generation);
            assert_eq!(r.apply(Traced::GenerationWritten(g)), Applied::Done);
            for part in 0..PARTS {
                let mut buf = [0u8; MAX_LEN];
                let n = learned.encode_part(part, &mut buf).unwrap();
                let bytes = buf[..n].iter().copied().collect();
                let a = r.apply(Traced::LearnedPart {
                    part: part as u8,
                    bytes,
                });
                assert_eq!(a, Applied::Learned(Ok(())), "part {part}");
            }
        }
        _ => {}
    }
}

fn encode(trace: &[Traced]) -> Vec<u8> {
    trace
        .iter()
        .flat_map(|t| postcard::to_stdvec(t).unwrap())
        .collect()
}

fn decode(mut bytes: &[u8]) -> Vec<Traced> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (t, rest) = postcard::take_from_bytes(bytes).unwrap();
        out.push(t);
        bytes = rest;
    }
    out
}

fn replay(trace: &[Traced]) -> Gave {
    // Built from another record than the one traced: the trace's start
    // sets it right.
    let mut d = decider(Opening::Unreadable(
        "cdu.latched: damaged".try_into().unwrap(),
    ));
    let mut gave = Gave::default();
    for t in trace {
        gave.apply(&mut d, t);
    }
    gave
}

fn digests(applied: &[Applied]) -> Vec<Option<u32>> {
    applied.iter().map(Applied::digest).collect()
}

#[test]
fn a_trace_decoded_and_replayed_gives_the_same_digests_step_by_step() {
    let r = record();
    let stepped = (r.gave.applied.iter()).filter(|a| matches!(a, Applied::Stepped { .. }));
    assert_eq!(stepped.count() as u64, STEPS);
    // The scenario did what it says.
    let commands = &r.gave.commands;
    assert_eq!(commands.len() as u64, STEPS);
    assert_ne!(commands[10].valves_open & 0b0010, 0);
    assert_eq!(
        commands[45].valves_open & 0b0010,
        0,
        "the leak's rack isolated"
    );
    assert_eq!(commands[110].lead, Pump::B, "the lag pump took over");
    assert!((r.gave.applied.iter()).any(|a| matches!(a, Applied::Verdict(Verdict::Refused { .. }))));
    let kinds: std::collections::BTreeSet<_> = r.trace.iter().map(kind).collect();
    assert_eq!(kinds, (0..KINDS).collect(), "every kind of input traced");
    // The valve word closed before the keep is the one taken, and stays
    // so past the planned valve write the CDU did not answer.
    let early = (r.trace.iter()).position(|t| matches!(t, Traced::EarlyValves(_)));
    let early = early.expect("the early valve write traced");
    let Traced::EarlyValves(word) = r.trace[early] else {
        unreachable!()
    };
    let written = early
        + (r.trace[early..].iter())
            .position(|t| matches!(t, Traced::Written(_)))
            .unwrap();
    for at in [early, written] {
        assert_eq!(r.gave.taken[at], Some(word), "after input {at}");
    }
    assert!(r.trace.contains(&Traced::Kept(false)));
    let bytes = encode(&r.trace);
    let decoded = decode(&bytes);
    assert_eq!(decoded, r.trace);
    let again = replay(&decoded);
    assert_eq!(digests(&again.applied), digests(&r.gave.applied));
    assert_eq!(again.applied, r.gave.applied, "every result");
    assert_eq!(again.taken.len(), r.gave.taken.len());
    let differs = (again.taken.iter().zip(&r.gave.taken)).position(|(a, b)| a != b);
    assert_eq!(
        differs, None,
        "the valve word taken differs after that input"
    );
    assert_eq!(again.commands, r.gave.commands, "every step's commands");
}

/// The decider driven by its direct calls, as the Linux shell drives it.
fn direct(trace: &[Traced]) -> Vec<Option<u32>> {
    let mut d = decider(Opening::Nothing);
    let mut last = None;
    let mut out = Vec::new();
    for t in trace {
        let digest = match t {
            Traced::Step { cdu, inp } => {
                let c = d.step(cdu.as_ref(), inp);
                let digest = cooling_decide::trace::digest_commands(&c);
                last = Some(c);
                Some(digest)
            }
            Traced::Plan { closed } => {
                let p = d.plan(last.as_ref().unwrap(), *closed);
                Some(cooling_decide::trace::digest_plan(&p))
            }
            Traced::Heard { h, heard, now } => {
                d.hear_host(*h as usize, heard, *now);
                None
            }
            Traced::ToKeep => {
                d.to_keep();
                None
            }
            Traced::Kept(ok) => {
                d.kept(*ok);
                None
            }
            Traced::Written(o) => {
                d.written(o);
                None
            }
            Traced::EarlyValves(v) => {
                d.took_early_valves(*v);
                None
            }
            other => {
                // The rest have no direct call of the decider's own.
                d.apply(other);
                None
            }
        };
        out.push(digest);
    }
    out
}

#[test]
fn applying_a_trace_gives_what_the_direct_calls_give() {
    let r = record();
    assert_eq!(direct(&r.trace), digests(&r.gave.applied));
}

#[test]
fn a_changed_input_changes_the_digest_where_it_changed() {
    let r = record();
    let mut changed = decode(&encode(&r.trace));
    let at = (changed.iter())
        .enumerate()
        .filter(|(_, t)| matches!(t, Traced::Step { .. }))
        .nth(30)
        .map(|(i, _)| i)
        .unwrap();
    let Traced::Step { inp, .. } = &mut changed[at] else {
        unreachable!()
    };
    // Rack 2's rope reads wet at step 30.
    inp.board = BoardRead::Read {
        wet: 0b0100,
        faults: 0,
    };
    let was = digests(&r.gave.applied);
    let now = digests(&replay(&changed).applied);
    let first = (was.iter().zip(&now)).position(|(a, b)| a != b);
    assert_eq!(first, Some(at), "the same until the changed step");
    // The CDU's own leak register reads rack 3 wet at that step.
    let mut wet = r.trace.clone();
    let Traced::Step { cdu: Some(m), .. } = &mut wet[at] else {
        unreachable!()
    };
    m.leaks = Some(0b1000);
    let now = digests(&replay(&wet).applied);
    let first = (was.iter().zip(&now)).position(|(a, b)| a != b);
    assert_eq!(first, Some(at));
}

#[test]
fn learned_parts_restored_one_by_one_give_the_whole_restored() {
    let cfg = CoreConfig::default();
    let mut learned = Learned::new(&cfg);
    learned.flow.value *= 1.1;
    learned.flow.trust = 0.5;
    learned.hosts[5].value = 1.2;
    learned.hosts[5].trust = 0.8;
    learned.hosts[5].fed_s = 3_600.0;
    // What the flash holds, read back.
    let mut read = Learned::new(&cfg);
    let mut parts = Vec::new();
    for part in 0..PARTS {
        let mut buf = [0u8; MAX_LEN];
        let n = learned.encode_part(part, &mut buf).unwrap();
        read.decode_part(part, &buf[..n]).unwrap();
        parts.push(buf[..n].to_vec());
    }
    let mut whole = decider(Opening::Nothing);
    whole.core_mut().restore_learned(&read).unwrap();
    let mut by_part = decider(Opening::Nothing);
    for (part, bytes) in parts.iter().enumerate() {
        let t = Traced::LearnedPart {
            part: part as u8,
            bytes: bytes.iter().copied().collect(),
        };
        assert_eq!(by_part.apply(&t), Applied::Learned(Ok(())));
    }
    assert_eq!(whole.core().learned(), by_part.core().learned());
    assert_ne!(
        whole.core().learned(),
        Learned::new(&cfg),
        "something restored"
    );
    // A part that does not decode is refused, and says why.
    let t = Traced::LearnedPart {
        part: 0,
        bytes: [9u8; 3].into_iter().collect(),
    };
    let Applied::Learned(Err(e)) = by_part.apply(&t) else {
        panic!("a 3-byte part taken");
    };
    assert_eq!(e.to_string(), "a learned record of 3 bytes");
}

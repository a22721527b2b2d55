//! Every input a [`Decider`] is given, as values ([`Traced`]), so that
//! what one machine did can be replayed through the same code on
//! another and compared: the firmware drives its decider only through
//! [`Decider::apply`] and sends each [`Traced`] it applied, in order
//! (postcard), out of a debug UART; a host tool decodes them, applies
//! them to a decider built with the same configuration and map limits,
//! and compares the digests of the step's commands and of the plan,
//! step by step.
//!
//! [`Decider::apply`] performs the call a [`Traced`] names and gives back
//! what the direct call gives ([`Applied`]), with a digest for a step
//! and a plan. The digests are CRC-32 (ISO HDLC) over every field in a
//! fixed order: floats by their bits, enums and events by their postcard
//! encoding ([`digest_commands`], [`digest_plan`]).
//!
//! Variants are only ever appended: a trace's bytes name each variant by
//! its index, and a golden test holds the order.
//!
//! Not traced, for they change no decision: what is taken out
//! ([`Decider::take_said`], [`Decider::take_events`]) and what is only
//! read. The lease book ([`crate::leases::LeaseBook`]) is outside the
//! decider: its orders follow from the step's caps (in the step's
//! digest) and what was sent.
//!
//! Glossary:
//! - *trace*: the [`Traced`] values a decider was given, in order.
//! - *replay*: applying a trace to a fresh decider of the same
//!   configuration and map limits.
//! - *digest*: a CRC-32 of a step's commands or of a plan.

use core::fmt::{self, Display};

use cooling_core::estimate::record::{RecordError as LearnedRecordError, MAX_LEN};
use cooling_core::{Commands, ConfigError, LeakInputs};
use crc::{Crc, Digest, CRC_32_ISO_HDLC};
use loopwarden_protocol::message::Pump;
use loopwarden_protocol::units::TimestampMs;
use serde::{Deserialize, Serialize};

use crate::said::{words, Words};
use crate::{CduMeasurements, Decider, Heard, LatchRecord, Outcome, Plan, StepIn, Verdict};

/// The digests' CRC.
const CRC32: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// What the flash held of the latched record at start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Opening {
    /// None was ever written.
    Nothing,
    /// This record.
    Record(LatchRecord),
    /// It cannot be read, for this reason.
    Unreadable(Words),
}

impl Opening {
    /// What was read at start (`read`: a record, none, or why not).
    pub fn of<E: Display>(read: &Result<Option<LatchRecord>, E>) -> Self {
        match read {
            Ok(None) => Opening::Nothing,
            Ok(Some(r)) => Opening::Record(*r),
            Err(e) => Opening::Unreadable(words(e)),
        }
    }

    /// As [`Decider::new`] takes it.
    pub fn read(&self) -> Result<Option<LatchRecord>, &Words> {
        match self {
            Opening::Nothing => Ok(None),
            Opening::Record(r) => Ok(Some(*r)),
            Opening::Unreadable(why) => Err(why),
        }
    }
}

/// [`LeakInputs`] in a trace, field by field.
#[derive(Serialize, Deserialize)]
#[serde(remote = "LeakInputs")]
struct LeakInputsDef {
    wet: u16,
    rope_faults: u16,
    read_ok: bool,
    cdu: Option<u16>,
}

/// One input to a decider: a call that changes its state, with its
/// arguments. Append new variants at the end only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// An outcome carries the words of each failed write; there is no
// allocator to box it in, and one input is handled at a time.
#[allow(clippy::large_enum_variant)]
pub enum Traced {
    /// The decider starts (again) from what the flash held
    /// ([`Decider::restart`]).
    Start {
        /// The latched record at start.
        latched: Opening,
    },
    /// A part of what was learned, as the flash held it, restored
    /// ([`Decider::restore_learned_part`]).
    LearnedPart {
        /// The part's number.
        part: u8,
        /// Its bytes.
        bytes: heapless::Vec<u8, MAX_LEN>,
    },
    /// A host's report heard ([`Decider::hear_host`]).
    Heard {
        /// The host's index.
        h: u32,
        /// The report as heard.
        heard: Heard,
        /// Now, on the clock of its stamp.
        now: TimestampMs,
    },
    /// A step ([`Decider::step`]).
    Step {
        /// The CDU's measurements (`None`: it did not answer).
        cdu: Option<CduMeasurements>,
        /// The rest of the step's inputs.
        inp: StepIn,
    },
    /// The latched record to keep asked for ([`Decider::to_keep`]).
    ToKeep,
    /// The record went to flash, or not ([`Decider::kept`]).
    Kept(bool),
    /// The writes of the last step planned, with the valve positions the
    /// CDU read ([`Decider::plan`] with that step's commands).
    Plan {
        /// Valves reading closed, bit n = rack n.
        closed: Option<u16>,
    },
    /// What the CDU took ([`Decider::written`]).
    Written(Outcome),
    /// The BMS's limits (`Core::set_limits`).
    SetLimits {
        /// The warmest setpoint allowed, °C.
        setpoint_ceiling_c: f32,
        /// The offset of the plan, K.
        plan_offset_k: f32,
    },
    /// The hall coordinator's facility water target
    /// (`Core::facility_target`).
    FacilityTarget {
        /// The water, °C.
        water_c: f32,
        /// When it was told, ms.
        now_ms: u64,
    },
    /// An operator's clear of a rack's latched leak (`Core::clear_leak`).
    ClearLeak {
        /// The rack.
        rack: u8,
        /// The leak inputs of the last step.
        #[serde(with = "LeakInputsDef")]
        leaks: LeakInputs,
    },
    /// An operator's clear of a pump's trip (`Core::clear_pump`).
    ClearPump {
        /// The pump.
        pump: Pump,
        /// The CDU still shows its fault.
        fault_shown: bool,
    },
    /// The valve word written before the latched record's keep, closings
    /// only, went in ([`Decider::took_early_valves`]): bit n = rack n open.
    EarlyValves(u16),
    /// After a start whose record could not be believed, the generation
    /// the flash's generation item held: the records written anew go
    /// above it ([`Decider::continue_above`]).
    GenerationWritten(u32),
}

/// Why a learned part was not restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LearnedRefused {
    /// Its bytes do not decode.
    Record(LearnedRecordError),
    /// The figures with it are out of their bounds.
    Bounds(&'static str),
}

impl Display for LearnedRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LearnedRefused::Record(e) => e.fmt(f),
            LearnedRefused::Bounds(e) => f.write_str(e),
        }
    }
}

/// What applying a [`Traced`] gave: what the direct call gives (a step's
/// commands stay in the decider: [`Decider::last_commands`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// Started again; a configuration refused (never, for one the decider
    /// was built with).
    Started(Result<(), ConfigError>),
    /// A learned part restored, or why not.
    Learned(Result<(), LearnedRefused>),
    /// What became of a host's report.
    Verdict(Verdict),
    /// A step, the digest of its commands.
    Stepped {
        /// [`digest_commands`] of [`Decider::last_commands`].
        digest: u32,
    },
    /// The record to keep, if any.
    ToKeep(Option<LatchRecord>),
    /// A plan and its digest.
    Planned {
        /// The writes.
        plan: Plan,
        /// [`digest_plan`] of it.
        digest: u32,
    },
    /// A plan asked for before any step: nothing to plan.
    PlanBeforeStep,
    /// An operator's clear, done or refused and why.
    Cleared(Result<(), &'static str>),
    /// Done; nothing to give back.
    Done,
}

impl Applied {
    /// The digest of a step or a plan.
    pub fn digest(&self) -> Option<u32> {
        match self {
            Applied::Stepped { digest, .. } | Applied::Planned { digest, .. } => Some(*digest),
            _ => None,
        }
    }
}

impl Decider {
    /// Performs the call `t` names, as the direct call would.
    pub fn apply(&mut self, t: &Traced) -> Applied {
        match t {
            Traced::Start { latched } => Applied::Started(self.restart(latched)),
            Traced::LearnedPart { part, bytes } => {
                Applied::Learned(self.restore_learned_part(usize::from(*part), bytes))
            }
            Traced::Heard { h, heard, now } => {
                let h = usize::try_from(*h).unwrap_or(usize::MAX);
                Applied::Verdict(self.hear_host(h, heard, *now))
            }
            Traced::Step { cdu, inp } => Applied::Stepped {
                digest: digest_commands(self.step_kept(cdu.as_ref(), inp)),
            },
            Traced::ToKeep => Applied::ToKeep(self.to_keep()),
            Traced::Kept(ok) => {
                self.kept(*ok);
                Applied::Done
            }
            Traced::Plan { closed } => match self.plan_last(*closed) {
                Some(plan) => {
                    let digest = digest_plan(&plan);
                    Applied::Planned { plan, digest }
                }
                None => Applied::PlanBeforeStep,
            },
            Traced::Written(o) => {
                self.written(o);
                Applied::Done
            }
            Traced::SetLimits {
                setpoint_ceiling_c,
                plan_offset_k,
            } => {
                self.core_mut()
                    .set_limits(*setpoint_ceiling_c, *plan_offset_k);
                Applied::Done
            }
            Traced::FacilityTarget { water_c, now_ms } => {
                self.core_mut().facility_target(*water_c, *now_ms);
                Applied::Done
            }
            Traced::ClearLeak { rack, leaks } => {
                Applied::Cleared(self.clear_leak(usize::from(*rack), leaks))
            }
            Traced::ClearPump { pump, fault_shown } => {
                Applied::Cleared(self.core_mut().clear_pump(*pump, *fault_shown))
            }
            Traced::EarlyValves(valves) => {
                self.took_early_valves(*valves);
                Applied::Done
            }
            Traced::GenerationWritten(g) => {
                self.continue_above(*g);
                Applied::Done
            }
        }
    }

    /// After a start whose latched record could not be believed: the
    /// records written anew go above generation `g`, the one the flash's
    /// generation item holds (`record::generation_written`), so that a
    /// cut between the relatch's record and its generation leaves the
    /// record one ahead, believed (`LatchKeeper::continue_above`).
    pub fn continue_above(&mut self, g: u32) {
        self.keeper.continue_above(g);
    }
}

/// Feeds postcard's bytes into a digest.
struct Feed<'a, 'b>(&'a mut Digest<'b, u32>);

impl postcard::ser_flavors::Flavor for Feed<'_, '_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.update(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.update(&[data]);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// `v`'s postcard encoding into `d` (a value postcard cannot encode, none
/// of the protocol's, adds a marker that no encoding starts with alone).
fn feed<T: Serialize>(d: &mut Digest<'_, u32>, v: &T) {
    if postcard::serialize_with_flavor(v, Feed(d)).is_err() {
        d.update(b"\xff\xffunencodable");
    }
}

/// The digest of a step's commands: CRC-32 (ISO HDLC) over the
/// setpoint and speed (bits, LE), the pumps on, the lead (postcard),
/// the rack masks (LE), each host's cap (0, or 1 then the watts' bits and
/// the reason's code), the beacon, the mode and reason (postcard), and
/// the events (their count, then each one's postcard encoding).
pub fn digest_commands(c: &Commands) -> u32 {
    let mut d = CRC32.digest();
    d.update(&c.setpoint_c.to_bits().to_le_bytes());
    d.update(&c.pump_speed.to_bits().to_le_bytes());
    d.update(&c.pump_on.map(u8::from));
    feed(&mut d, &c.lead);
    for mask in [
        c.valves_open,
        c.cooling_lost,
        c.sensing_lost,
        c.isolation_failed,
        c.valve_feedback_faults,
    ] {
        d.update(&mask.to_le_bytes());
    }
    for cap in &c.caps {
        match cap {
            None => d.update(&[0]),
            Some(cap) => {
                d.update(&[1]);
                d.update(&cap.watts.to_bits().to_le_bytes());
                d.update(&cap.reason.0.to_le_bytes());
            }
        }
    }
    d.update(&[u8::from(c.beacon)]);
    feed(&mut d, &c.mode);
    d.update(&c.reason.0.to_le_bytes());
    d.update(&(c.events.len() as u32).to_le_bytes());
    for e in &c.events {
        feed(&mut d, e);
    }
    d.finalize()
}

/// The digest of a plan: CRC-32 (ISO HDLC) over the count of writes,
/// then each write's setting (its place in [`crate::Setting::ORDER`])
/// and value (bits, LE).
pub fn digest_plan(p: &Plan) -> u32 {
    let mut d = CRC32.digest();
    d.update(&[p.writes.len() as u8]);
    for w in &p.writes {
        d.update(&[w.setting as u8]);
        d.update(&w.value.to_bits().to_le_bytes());
    }
    d.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writes::tests::sim_cdu;
    use crate::{Setting, Write};
    use cooling_core::CoreConfig;

    fn decider() -> Decider {
        Decider::new(CoreConfig::default(), sim_cdu(), &Ok::<_, &str>(None)).unwrap()
    }

    #[test]
    fn a_plan_before_any_step_plans_nothing() {
        let mut d = decider();
        let t = Traced::Plan { closed: None };
        assert_eq!(d.apply(&t), Applied::PlanBeforeStep);
    }

    #[test]
    fn every_field_of_a_plan_counts_in_its_digest() {
        let mut p = Plan::default();
        let empty = digest_plan(&p);
        let w = |setting, value| Write { setting, value };
        p.writes.push(w(Setting::Valves, 15.0)).unwrap();
        let one = digest_plan(&p);
        assert_ne!(one, empty);
        p.writes[0].value = 14.0;
        assert_ne!(digest_plan(&p), one);
        p.writes[0] = w(Setting::PumpsRun, 15.0);
        assert_ne!(digest_plan(&p), one);
        // The same value by bits: −0 is not 0.
        let zero = Plan {
            writes: [w(Setting::Setpoint, 0.0)].into_iter().collect(),
        };
        let minus = Plan {
            writes: [w(Setting::Setpoint, -0.0)].into_iter().collect(),
        };
        assert_ne!(digest_plan(&zero), digest_plan(&minus));
    }

    #[test]
    fn every_field_of_the_commands_counts_in_their_digest() {
        let mut d = decider();
        let inp = StepIn {
            now_ms: 0,
            board: crate::BoardRead::Absent,
            ambient_c: None,
        };
        let c = d.step(None, &inp);
        let base = digest_commands(&c);
        assert_eq!(digest_commands(&c.clone()), base, "a digest is a function");
        let changed: [&dyn Fn(&mut Commands); 8] = [
            &|c| c.setpoint_c += 0.01,
            &|c| c.pump_on[1] = !c.pump_on[1],
            &|c| c.lead = if c.lead == Pump::A { Pump::B } else { Pump::A },
            &|c| c.valve_feedback_faults ^= 1,
            &|c| {
                c.caps[127] = Some(cooling_core::HostCap {
                    watts: 300.0,
                    reason: loopwarden_protocol::ReasonCode::COOLING_LOST,
                })
            },
            &|c| c.beacon = !c.beacon,
            &|c| c.reason = loopwarden_protocol::ReasonCode(c.reason.0 ^ 1),
            &|c| {
                let _ = c.events.pop();
            },
        ];
        for (i, change) in changed.iter().enumerate() {
            let mut other = c.clone();
            change(&mut other);
            assert_ne!(digest_commands(&other), base, "change {i}");
        }
    }

    #[test]
    fn a_trace_names_its_variants_by_their_place() {
        // Golden bytes: a variant's index is its place, and a new one goes
        // at the end.
        let mut buf = [0u8; 64];
        let mut bytes =
            |t: &Traced| -> std::vec::Vec<u8> { postcard::to_slice(t, &mut buf).unwrap().to_vec() };
        assert_eq!(bytes(&Traced::ToKeep), [4]);
        assert_eq!(bytes(&Traced::Kept(true)), [5, 1]);
        assert_eq!(bytes(&Traced::Plan { closed: Some(2) }), [6, 1, 2]);
        assert_eq!(
            bytes(&Traced::ClearPump {
                pump: Pump::B,
                fault_shown: false
            }),
            [11, 1, 0]
        );
        assert_eq!(bytes(&Traced::EarlyValves(0b1011)), [12, 0b1011]);
        assert_eq!(bytes(&Traced::GenerationWritten(7)), [13, 7]);
        assert_eq!(
            bytes(&Traced::Start {
                latched: Opening::Unreadable(words(&"bad"))
            }),
            [0, 2, 3, b'b', b'a', b'd']
        );
    }
}

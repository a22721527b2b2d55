//! Frames from the bus: the CDU's state (the cooling context of the
//! health engine, and whether this host's rack lost cooling) and commands
//! to this host (cap leases, quarantine releases), each logged to flash
//! before its ack. A release runs again the quarantine actions of every
//! other GPU still quarantined, so the site's drain reason names one.
//!
//! Glossary:
//! - *pending command*: a command taken, whose ack waits for its flash
//!   write and its limits ([`Pending`]); only the limits of the GPUs its
//!   lease caps are its own: another GPU's failure, retried with it, is
//!   said in the log, not in its ack.

use loopwarden_protocol::{
    Ack, AckCode, CduMode, CduState, Correlation, Event, Family, Frame, GpuCap, GpuSelector,
    HealthState, Message, QuarantineRelease, RackCooling, Text, TimestampMs, Topic, Watts,
    MAX_GPUS,
};

use super::{gpu_index, Effect, Level, Node, Now};
use crate::health::{Coolant, LoopState, Refusal};

/// What a command's flash record is, for what its ack says when it could
/// not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    Release,
    Lease,
}

/// A command whose ack is not out yet.
#[derive(Debug)]
pub(crate) struct Pending {
    correlation: Correlation,
    /// `cap_lease from c1 seq 7`, for the log.
    what: String,
    code: AckCode,
    detail: String,
    record: Option<Record>,
    /// Its lease's cap on each GPU, by index (none for a release): only
    /// the failures of the GPUs it caps are its own.
    caps: [Option<Watts>; MAX_GPUS],
    /// A copy of a command answered already ([`crate::commands::Verdict::copy`]).
    copy: bool,
    /// Kept as its sender's last command ([`crate::commands::Verdict::kept`]).
    kept: bool,
    /// The `caps_applied` events of its limits, to go after the ack (the
    /// sender waits for the ack, not for their flash writes).
    pub(super) events: Vec<Event>,
}

impl Pending {
    /// Its lease's cap on GPU `gpu`, if it caps it.
    fn cap(&self, gpu: u8) -> Option<Watts> {
        self.caps.get(gpu as usize).copied().flatten()
    }

    /// GPU `gpu`'s lowest limit is `min` (learned since its verdict): a
    /// cap of its lease below it is clamped to it, said in its ack.
    pub(super) fn clamped(&mut self, gpu: u8, min: Watts) {
        let Some(cap) = self.cap(gpu).filter(|&c| c < min) else {
            return;
        };
        if !matches!(self.code, AckCode::Ok | AckCode::Clamped) {
            return;
        }
        self.code = AckCode::Clamped;
        if !self.detail.is_empty() {
            self.detail.push_str("; ");
        }
        self.detail.push_str(&format!(
            "GPU {gpu}: {} W is below its minimum {} W; clamped to {} W",
            cap.0, min.0, min.0
        ));
    }

    /// GPU `gpu`'s limit could not be put in force: the ack says which and
    /// why where the command's lease caps it (another GPU's failure is
    /// said in the log only).
    pub(super) fn failed(&mut self, gpu: u8, why: String) {
        if self.cap(gpu).is_none() {
            return;
        }
        if self.code != AckCode::Failed {
            self.code = AckCode::Failed;
            self.detail.clear();
        } else {
            self.detail.push_str("; ");
        }
        self.detail.push_str(&why);
    }
}

impl Node {
    /// A frame on `topic`.
    pub(super) fn frame(&mut self, now: Now, topic: &Topic, frame: &Frame, out: &mut Vec<Effect>) {
        if self.coolant.as_ref().is_some_and(|c| &c.topic == topic) {
            if let Message::CduState(_) = &frame.message {
                self.cdu_state(now, frame, out);
            }
        } else if topic.family == Family::Cmd {
            self.command(now, frame, out);
        }
    }

    /// The CDU's state: whether this host's rack lost cooling, and the
    /// cooling context of the health engine.
    fn cdu_state(&mut self, now: Now, frame: &Frame, out: &mut Vec<Effect>) {
        let (Some(c), Message::CduState(st)) = (&self.coolant, &frame.message) else {
            return;
        };
        if let Err(why) = self.commands.cdu_state(&c.cdu, &c.topic, frame, now.wall()) {
            out.push(Effect::Say(
                Level::Warn,
                format!("cooling context not taken: {why}"),
            ));
            return;
        }
        if let Some((floor, last)) = self.commands.state_floor() {
            out.push(Effect::KeepStateFloor {
                cdu: c.cdu.clone(),
                floor,
                last,
            });
        }
        let lost = rack_lost(c, st, out);
        let steps = match lost {
            Some(lost) => {
                self.say_unknown_decided(lost, out);
                self.cooling.told(now.steady.0, lost)
            }
            None => self.cooling.tick(now.steady.0),
        };
        self.cooling_word_taken(now, out);
        self.run_cooling(now, steps, out);
        let state = match st.mode {
            _ if lost == Some(true) => LoopState::Failsafe,
            CduMode::Normal => LoopState::Normal,
            CduMode::Degraded | CduMode::Boot => LoopState::Degraded,
            CduMode::Failsafe => LoopState::Failsafe,
        };
        let coolant = Coolant {
            supply_c: st.supply.map(|c| c.value()),
            flow_lpm_per_gpu: st.flow_per_gpu.map(|f| f.value()),
            state,
        };
        let outputs = self.health.coolant_stamped(now.steady, frame.time, coolant);
        self.health_outputs(outputs, out);
    }

    /// A command: checked by the command core; a release carried out by
    /// the health engine, a lease put in force; both logged before the ack.
    fn command(&mut self, now: Now, frame: &Frame, out: &mut Vec<Effect>) {
        let floor = self.commands.replay_floor(&frame.sender);
        let verdict = self.commands.command(now.wall(), frame);
        if self.commands.replay_floor(&frame.sender) != floor {
            // Kept before the ack goes: after a restart, this command and
            // those before it from its sender are replays.
            if let Some(floor) = self.commands.replay_floor(&frame.sender) {
                out.push(Effect::KeepReplayFloor {
                    sender: frame.sender.clone(),
                    floor,
                });
            }
        }
        self.pending = Some(Pending {
            correlation: Correlation {
                from: frame.sender.clone(),
                seq: frame.seq,
            },
            what: format!(
                "{} from {} seq {}",
                frame.message.kind().name(),
                frame.sender.id.as_str(),
                frame.seq
            ),
            code: verdict.code,
            detail: verdict.detail,
            record: None,
            caps: lease_caps(&frame.message),
            copy: verdict.copy,
            kept: verdict.kept,
            events: Vec::new(),
        });
        if let (Some(gpu), Message::QuarantineRelease(r)) = (verdict.release, &frame.message) {
            self.release(now, frame.time, gpu, r, out);
        }
        if verdict.changed_caps {
            self.pending_mut().record = Some(Record::Lease);
            out.push(Effect::LogCommand);
            self.reconcile(now, true, out);
        }
        out.push(Effect::Acknowledge);
    }

    fn pending_mut(&mut self) -> &mut Pending {
        self.pending.as_mut().expect("a command is pending")
    }

    /// An operator's release of a quarantined GPU: logged, published, kept
    /// in flash; refused (`not_quarantined`) for a GPU that is not, and
    /// (`failed`) when quarantine-level evidence came after it was
    /// `signed`.
    fn release(
        &mut self,
        now: Now,
        signed: TimestampMs,
        gpu: u8,
        r: &QuarantineRelease,
        out: &mut Vec<Effect>,
    ) {
        let operator = r.operator.as_str();
        match self
            .health
            .release(now.steady, signed, gpu, operator, r.note.as_str())
        {
            Ok(change) => {
                self.pending_mut().record = Some(Record::Release);
                out.push(Effect::LogCommand);
                out.push(Effect::Say(
                    Level::Warn,
                    format!("GPU {gpu} released by {operator}: {}", r.note.as_str()),
                ));
                out.push(Effect::PublishHealth);
                out.push(Effect::KeepHealth(gpu));
                out.push(Effect::Emit(Event::QuarantineReleased {
                    gpu: r.gpu,
                    operator: r.operator.clone(),
                    note: r.note.clone(),
                }));
                out.push(Effect::Emit(Event::HealthChanged {
                    gpu: r.gpu,
                    from: change.from,
                    to: change.to,
                    reason: change.reason,
                }));
                self.quarantine_still_out(gpu, out);
            }
            Err(Refusal::NotQuarantined(state)) => {
                let p = self.pending_mut();
                p.code = AckCode::NotQuarantined;
                let state = format!("{state:?}").to_lowercase();
                p.detail = format!("GPU {gpu} is {state}, not quarantined");
            }
            Err(Refusal::NewerEvidence(why)) => {
                if let Some(l) = self.health.later_evidence(gpu) {
                    out.push(Effect::Say(
                        Level::Warn,
                        format!(
                            "release of GPU {gpu} by {operator} refused: {why}: {}",
                            l.evidence
                        ),
                    ));
                }
                let p = self.pending_mut();
                p.code = AckCode::Failed;
                p.detail = why;
            }
        }
    }

    /// After the release of `released`: the quarantine actions of every
    /// GPU still quarantined run again (each bears running twice), so the
    /// site's drain reason, which the last quarantine's actions wrote,
    /// names a GPU still out rather than the one just released. The
    /// release itself does nothing in the scheduler (docs/health.md,
    /// section 7).
    fn quarantine_still_out(&self, released: u8, out: &mut Vec<Effect>) {
        for gpu in (0..self.gpus.len()).filter_map(|g| u8::try_from(g).ok()) {
            let Some(st) = self.health.status(gpu) else {
                continue;
            };
            if gpu == released || st.state != HealthState::Quarantined {
                continue;
            }
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "GPU {gpu} is still quarantined after the release of GPU {released}: \
                     its quarantine actions run again"
                ),
            ));
            out.push(Effect::Quarantine {
                gpu,
                reason: format!("{}: {}", st.reason, st.evidence),
            });
        }
    }

    /// The pending command's record is in flash, or is not (said, and the
    /// ack says what it costs).
    pub(super) fn logged(&mut self, result: Result<(), &str>, out: &mut Vec<Effect>) {
        let (Err(e), Some(p)) = (result, self.pending.as_mut()) else {
            return;
        };
        match p.record {
            Some(Record::Release) => {
                out.push(Effect::Say(
                    Level::Error,
                    format!("release not logged to flash: {e}"),
                ));
                p.detail = format!(
                    "released, but not logged to flash ({e}): the quarantine may come back after a restart"
                );
            }
            // The cap still applies (the sender needs it now); the ack
            // says it will not survive a restart.
            Some(Record::Lease) => {
                out.push(Effect::Say(
                    Level::Error,
                    format!("lease not logged to flash: {e}"),
                ));
                p.detail = format!("not logged to flash ({e}): lost if the agent restarts");
            }
            None => {}
        }
    }

    /// The pending command's ack, with every limit now in force (read
    /// back), then its limits' events. A refusal over its sender's rate
    /// ([`crate::ack_limit`]) is neither answered nor logged, only counted.
    pub(super) fn acknowledge(&mut self, now: Now, out: &mut Vec<Effect>) {
        let Some(p) = self.pending.take() else {
            return;
        };
        // What the command got is what a copy of it gets, answered or not.
        if p.kept {
            self.commands
                .settled(&p.correlation.from, p.code, &p.detail);
        }
        // A copy of a command already answered goes under the refusals'
        // rate too: a flood of copies costs no more than one of refusals.
        let limited = p.copy || !matches!(p.code, AckCode::Ok | AckCode::Clamped);
        if limited && !self.ack_limit.answer(&p.correlation.from, now.steady) {
            out.extend(p.events.into_iter().map(Effect::Emit));
            return;
        }
        out.push(Effect::Say(
            Level::Info,
            format!("{}: {} {}", p.what, p.code, p.detail),
        ));
        let mut in_force = heapless::Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if let Some(limit) = g.applied {
                let _ = in_force.push(GpuCap {
                    gpus: GpuSelector::Gpu(gpu_index(i as u8)),
                    limit,
                });
            }
        }
        out.push(Effect::Ack(Ack {
            correlation: p.correlation,
            code: p.code,
            in_force,
            detail: Text::truncated(&p.detail),
        }));
        out.extend(p.events.into_iter().map(Effect::Emit));
    }
}

/// A command's lease's cap on each GPU, by index (the lowest where it
/// names one twice; every GPU for a cap on all); none for any other
/// command.
fn lease_caps(m: &Message) -> [Option<Watts>; MAX_GPUS] {
    let mut caps = [None; MAX_GPUS];
    let Message::CapLease(l) = m else {
        return caps;
    };
    for c in &l.caps {
        let mut put = |i: usize| {
            if let Some(w) = caps.get_mut(i) {
                *w = Some(w.map_or(c.limit, |w: Watts| w.min(c.limit)));
            }
        };
        match c.gpus {
            GpuSelector::All => (0..MAX_GPUS).for_each(&mut put),
            GpuSelector::Gpu(g) => put(g.get() as usize),
        }
    }
    caps
}

/// Whether the state `st` says this host's rack lost cooling: `None` when
/// it does not list the rack (said), which says no more that cooling is
/// back than silence does. A host without a rack never lost it.
fn rack_lost(c: &super::CoolantSource, st: &CduState, out: &mut Vec<Effect>) -> Option<bool> {
    let Some(r) = c.rack else {
        return Some(false);
    };
    let Some(rack) = st.racks.iter().find(|x| x.rack.get() == r) else {
        out.push(Effect::Say(
            Level::Warn,
            format!(
                "cdu/{}'s state does not list rack {r}, this host's: \
                 nothing is known of its cooling",
                c.cdu
            ),
        ));
        return None;
    };
    Some(rack.cooling == RackCooling::Lost)
}

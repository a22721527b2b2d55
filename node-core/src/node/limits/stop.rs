//! What a stop does with the power limits, once every GPU's limit was
//! read: with a lease in force and a flash, the limits stay for the next
//! start to keep or lift as the kept leases say; with none, every GPU is
//! given its ceiling back.
//!
//! With volatile state (no flash file: [`Setup::volatile_state`]) the
//! leases die with the agent, and the next start takes a cap left on for
//! the GPU's ceiling, never to be lifted. So a stop puts the ceilings
//! back even under a lease (a capacity cap: the CDU caps again at its
//! next renewal), said as a warning; but not while the host's cooling is
//! lost: lifting the caps there would run drained jobs at full power on a
//! shut valve until the power-down (a `systemctl poweroff` stops the
//! agent first) or for as long as the agent is down. The caps stay (fail
//! closed), said as an error naming each GPU kept below its ceiling and
//! the command that sets it back once cooling is back, or a reboot.
//!
//! Glossary:
//! - *cooling lost*: the host's cooling-loss phase is not cooled
//!   (drained, in the grace or powered down, or not known since a
//!   restart), or a lease in force gives a cooling loss as its reason
//!   ([`COOLING_LOSS_REASONS`]).
//!
//! [`Setup::volatile_state`]: crate::node::Setup::volatile_state

use loopwarden_protocol::{ReasonCode, TimestampMs};

use super::{was_read, Reconciling, SetLimit};
use crate::cooling_loss::Phase;
use crate::health::fmt_time;
use crate::node::{Effect, Level, Node, Now};

/// The reasons of a lease that caps for a cooling loss: the CDU's
/// minimum cap on a rack whose valve a leak shut (`cooling-lost`), and
/// the leak and its failed isolation, should a sender give those.
const COOLING_LOSS_REASONS: [ReasonCode; 3] = [
    ReasonCode::COOLING_LOST,
    ReasonCode::LEAK,
    ReasonCode::ISOLATION_FAILED,
];

impl Node {
    /// At the stop, the limits read (see the module note); a GPU whose
    /// limit was not read just now (`read`) is given its ceiling only
    /// where that lowers it: a raise could overwrite an administrator's
    /// limit unseen, and is said.
    pub(super) fn stopping(&mut self, now: Now, read: &[bool], out: &mut Vec<Effect>) {
        self.commands.targets(now.steady);
        let leases = self.commands.leases().len();
        if leases > 0 && !self.volatile_state {
            out.push(Effect::Say(
                Level::Info,
                format!(
                    "stopping with {leases} lease(s) in force: the power limits stay as they are, for the next start to keep or lift"
                ),
            ));
            return;
        }
        if self.volatile_state {
            if let Some(lost) = self.cooling_lost_words(now) {
                self.keep_for_cooling(&lost, out);
                return;
            }
        }
        if leases > 0 {
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "stopping with {leases} lease(s) in force and volatile_state = true, no cooling loss: the leases are not kept, so the power limits are put back to the ceilings (a cap left on would be taken for the uncapped limit at the next start); a CDU caps again at its next renewal"
                ),
            ));
        }
        self.restore_ceilings(read, out);
    }

    /// Why the host's cooling counts as lost now, in words (see the
    /// module note); `None`: it does not.
    fn cooling_lost_words(&self, now: Now) -> Option<String> {
        let wall = |since: u64| fmt_time(TimestampMs(since.saturating_add_signed(now.offset)));
        let (cdu, rack) = self.coolant.as_ref().map_or(("?".into(), "?".into()), |c| {
            let rack = c.rack.map_or("?".into(), |r| r.to_string());
            (c.cdu.as_str().to_string(), rack)
        });
        let mut why = Vec::new();
        match self.cooling.phase() {
            _ if self.cooling.is_unknown() => why.push(format!(
                "rack {rack} of {cdu}: its cooling-loss phase is not known since the restart"
            )),
            Phase::Cooled => {}
            Phase::Draining { since } => why.push(format!(
                "rack {rack} of {cdu} lost cooling: drained at {}, powered down after the grace",
                wall(since)
            )),
            Phase::PoweredDown { since } => why.push(format!(
                "rack {rack} of {cdu} lost cooling: powered down at {}",
                wall(since)
            )),
        }
        let cooling_leases: Vec<String> = (self.commands.leases().iter())
            .filter(|l| COOLING_LOSS_REASONS.contains(&l.reason))
            .map(|l| format!("lease {} of {} ({})", l.lease, l.from, l.reason))
            .collect();
        if !cooling_leases.is_empty() {
            why.push(format!(
                "a cooling-loss cap in force: {}",
                cooling_leases.join(", ")
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Cooling lost at a stop with volatile state: no limit is set; each
    /// GPU left below its ceiling (or whose limit was not read) is named,
    /// with the command that puts its ceiling back.
    fn keep_for_cooling(&self, lost: &str, out: &mut Vec<Effect>) {
        let kept: Vec<String> = (self.gpus.iter().enumerate())
            .filter(|(_, g)| g.applied != Some(g.ceiling))
            .map(|(i, g)| {
                let at = g
                    .applied
                    .map_or(", its limit not read".into(), |a| format!(" at {} W", a.0));
                format!("GPU {i}{at}: nvidia-smi -i {i} -pl {}", g.ceiling.0)
            })
            .collect();
        if kept.is_empty() {
            out.push(Effect::Say(
                Level::Warn,
                format!(
                    "stopping with volatile_state = true while cooling is lost ({lost}): every GPU is at its ceiling, none is set"
                ),
            ));
            return;
        }
        out.push(Effect::Say(
            Level::Error,
            format!(
                "stopping with volatile_state = true while cooling is lost ({lost}): the power limits are kept, not put back to the ceilings (lifting a cooling-loss cap would run the GPUs at full power on a shut valve); with no flash file the next start will take them for the GPUs' ceilings: once cooling is back, set each GPU's limit back as root ({}), or reboot the host (the driver comes up at each GPU's default limit)",
                kept.join("; ")
            ),
        ));
    }

    /// Every GPU not at its ceiling is given it back, but for one whose
    /// limit was not read just now where that raises it (said).
    fn restore_ceilings(&mut self, read: &[bool], out: &mut Vec<Effect>) {
        let mut sets = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            if g.applied == Some(g.ceiling) {
                continue;
            }
            if !was_read(read, i) && !g.settable_unread(g.ceiling) {
                out.push(Effect::Say(
                    Level::Error,
                    format!(
                        "GPU {i}: uncapped limit {} W not restored: {}",
                        g.ceiling.0,
                        g.unread_raise(g.ceiling)
                    ),
                ));
                continue;
            }
            sets.push(SetLimit {
                gpu: i as u8,
                limit: g.ceiling,
                read_first: !g.ceiling_read,
            });
        }
        if sets.is_empty() {
            return;
        }
        out.push(Effect::KeepLimits(self.kept_asking(&sets)));
        self.reconciling = Some(Reconciling {
            sources: Vec::new(),
            changes: Vec::new(),
            restoring: true,
        });
        out.push(Effect::SetLimits(sets));
    }
}

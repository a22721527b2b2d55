//! Commands in, decisions out: the pure part of the agent's command path.
//!
//! Every command frame that reaches the host goes through
//! [`CommandCore::command`], which checks, in order: that it is a command
//! this host takes, its signature against the host's keyring, that its
//! signer may ask it of this host, that it is above the floor of that
//! sender's commands (its sequence number or its stamp), and then what it
//! asks. A lease
//! goes to the [`CapArbiter`]; a refused command changes nothing. The
//! shell applies what [`CommandCore::targets`] says, reads the limits
//! back, and sends the ack with the values in force.
//!
//! Glossary:
//! - *authority*: who may command this host: the keyring's signers, each
//!   with what it may do, and the CDU that cools the host (a CDU
//!   controller may lease only the hosts of its own racks).
//! - *verdict*: what the core decided about one command: the ack code and
//!   the sentence for its `detail`.
//! - *replay*: a command frame at or below the floor of its sender's: its
//!   sequence number not above the highest taken from it, and its stamp
//!   not after the latest ([`ReplayFloor`]; an old command sent again, by
//!   a fault or an attacker); from a sender with no floor kept over a
//!   restart, one stamped before this host's start.
//! - *copy*: the last command taken from a sender, delivered again (the
//!   bus delivers at least once): answered as the command was, and
//!   nothing done again.

use std::collections::{HashMap, HashSet};

use loopwarden_protocol::auth::{May, Signer};
use loopwarden_protocol::{
    AckCode, AuthError, CapLease, CapSource, Frame, GpuIndex, GpuSelector, Ident, Message, NodeId,
    ReplayFloor, Role, TimestampMs, Topic, Watts,
};

use crate::caps::{CapArbiter, GpuRange, InForce, LeaseLimits, LeaseView, COOLING_LEASES};

mod floor;
mod restore;

/// How far a command's time may be from the host's clock, ms (both
/// directions): a lease or a release older than this is not acted on.
pub const COMMAND_MAX_AGE_MS: u64 = 300_000;

/// How far a sender's clock may run behind this host's before a lease it
/// stamps loses life to it, ms: a lease runs from the earlier of its
/// arrival and its stamp plus this ([`runs_from`]). A cooling lease lasts
/// 30 s and is renewed every 10 s, so without this allowance a host whose
/// clock ran 30 s ahead of its CDU's would take every lease as expired on
/// arrival and never be capped. A lease may so outlast its sender's
/// intent by this much at most; the sequence numbers still order a lease
/// and its lift, however they are stamped.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// When a lease stamped `stamp` and taken at `now` (this host's clock)
/// runs from: its arrival, unless the stamp is more than
/// [`CLOCK_SKEW_MS`] behind it, then the stamp plus that. A stamp ahead of
/// the clock never lengthens a lease.
pub fn runs_from(now: TimestampMs, stamp: TimestampMs) -> TimestampMs {
    TimestampMs(now.0.min(stamp.0.saturating_add(CLOCK_SKEW_MS)))
}

/// Whether a CDU state may be taken as this host's cooling context: it
/// must come from the host's own CDU (`cdu`), and be stamped within
/// [`COMMAND_MAX_AGE_MS`] of `now` (a state left retained by a controller
/// that stopped long ago says nothing of the loop now). `Err` says why not.
pub fn check_cdu_state(cdu: &Ident, frame: &Frame, now: TimestampMs) -> Result<(), String> {
    if frame.sender.role != Role::Cdu || frame.sender.id != *cdu {
        return Err(format!(
            "a CDU state sent by {}/{} on cdu/{cdu}'s topic: not its controller",
            frame.sender.role.as_str(),
            frame.sender.id
        ));
    }
    let (age, ahead) = distance(now, frame.time);
    if age > COMMAND_MAX_AGE_MS {
        return Err(format!(
            "cdu/{cdu}'s state is stamped {} s {}: too far from now to describe the loop",
            age / 1000,
            if ahead { "ahead" } else { "ago" }
        ));
    }
    Ok(())
}

/// The refusal of a command stamped too far from `now`, if it is: acted
/// on only within [`COMMAND_MAX_AGE_MS`] of its time either way.
fn stale(now: TimestampMs, frame: &Frame) -> Option<Verdict> {
    let (age, ahead) = distance(now, frame.time);
    (age > COMMAND_MAX_AGE_MS).then(|| {
        Verdict::refuse(
            AckCode::Expired,
            format!(
                "sent {} s {} (is the sender's clock right?): commands are acted on within {} s of their time",
                age / 1000,
                if ahead { "in the future" } else { "ago" },
                COMMAND_MAX_AGE_MS / 1000
            ),
        )
    })
}

/// How far a sender's stamp `t` is from `now`, ms, and whether it is
/// ahead of it: exact for any two stamps (a stamp from the wire may be
/// anything up to `u64::MAX`), never wrapping.
fn distance(now: TimestampMs, t: TimestampMs) -> (u64, bool) {
    match now.0.checked_sub(t.0) {
        Some(ago) => (ago, false),
        None => (t.0 - now.0, true),
    }
}

/// The GPUs of bit set `gpus` (bit `i` for GPU `i`), in words.
fn gpu_list(gpus: u16) -> String {
    (0..16)
        .filter(|i| gpus & (1 << i) != 0)
        .map(|i: u8| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What became of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The ack code.
    pub code: AckCode,
    /// The ack's detail (empty when `ok`).
    pub detail: String,
    /// Whether limits may have changed (the shell applies and reads back).
    pub changed_caps: bool,
    /// An authentic release of this GPU, for the health engine to carry
    /// out (the shell answers `not_quarantined` when it is not).
    pub release: Option<u8>,
    /// A copy of the last command taken from its sender, answered as it
    /// was: its ack goes under the rate of refusals, whatever its code,
    /// so that copies sent in a flood cost no more than refusals do.
    pub copy: bool,
    /// The command passed its sender's and seq's checks and is kept as
    /// the sender's last ([`CommandCore::settled`] takes what its ack
    /// says); a refusal before that (a replay, a forgery) is not.
    pub kept: bool,
}

impl Verdict {
    fn refuse(code: AckCode, detail: String) -> Self {
        Self {
            code,
            detail,
            changed_caps: false,
            release: None,
            copy: false,
            kept: false,
        }
    }
}

/// Who may command a host.
#[derive(Debug, Clone, Default)]
pub struct Authority {
    /// The keys the host trusts and what each signer may do.
    pub signers: Vec<Signer>,
    /// The CDU that cools this host, whose controller may lease it;
    /// `None`: no CDU controller may.
    pub cdu: Option<Ident>,
}

impl Authority {
    /// The simulated hall's: any CDU controller or facility system may
    /// lease and any operator may lease and release (operators and
    /// facility systems may ask for resends), with the public demo
    /// key ([`loopwarden_protocol::samples::demo_signing_key`]) as key 1;
    /// the host's own CDU rule still holds.
    pub fn demo(cdu: Option<Ident>) -> Self {
        let key = loopwarden_protocol::samples::demo_signing_key().verifying_key();
        let signer = |role, release| Signer {
            role,
            name: None,
            key_id: 1,
            key,
            may: May {
                lease: true,
                release,
                resend: role != Role::Cdu,
            },
        };
        Self {
            signers: vec![
                signer(Role::Cdu, false),
                signer(Role::Facility, false),
                signer(Role::Operator, true),
            ],
            cdu,
        }
    }

    /// Why `frame`, authentic, may not be acted on here; `None` if it may.
    fn forbids(&self, frame: &Frame) -> Option<String> {
        let key_id = frame.signed_auth()?.key_id;
        let may = self
            .signers
            .iter()
            .find(|s| s.is(&frame.sender, key_id))?
            .may;
        let who = format!(
            "{}/{}",
            frame.sender.role.as_str(),
            frame.sender.id.as_str()
        );
        match &frame.message {
            Message::CapLease(_) if !may.lease => Some(format!("{who} may not send cap leases")),
            // Whatever a keyring says: a quarantine is released only by an
            // authenticated operator.
            Message::QuarantineRelease(_) if frame.sender.role != Role::Operator => Some(format!(
                "{who} may not release quarantines: only an operator may, whatever the keyring says"
            )),
            Message::QuarantineRelease(_) if !may.release => {
                Some(format!("{who} may not release quarantines"))
            }
            Message::QuarantineRelease(r) if r.operator != frame.sender.id => Some(format!(
                "{who} signed a release in the name of {}: a release names its signer",
                r.operator
            )),
            Message::CapLease(l) if !source_fits(l.source, frame.sender.role) => Some(format!(
                "{who} may not send a lease in the name of {}: a lease's source is its signer's role",
                l.source
            )),
            Message::CapLease(_)
                if frame.sender.role == Role::Cdu
                    && self.cdu.as_ref() != Some(&frame.sender.id) =>
            {
                Some(match &self.cdu {
                    Some(c) => format!(
                        "{who} may lease only the hosts of its own racks; this host is cooled by cdu/{c}"
                    ),
                    None => format!("{who}: this host is cooled by no CDU it knows"),
                })
            }
            _ => None,
        }
    }
}

/// Whether a lease from a signer of `role` may name `source`: a CDU
/// controller's is `cooling`, a facility system's `facility_budget`, an
/// operator's `operator`, so the source a lease is shown and arbitrated
/// under is its signer's (`thermal_guard` is refused earlier, as the
/// host's own).
fn source_fits(source: CapSource, role: Role) -> bool {
    matches!(
        (source, role),
        (CapSource::Cooling, Role::Cdu)
            | (CapSource::FacilityBudget, Role::Facility)
            | (CapSource::Operator, Role::Operator)
            | (CapSource::ThermalGuard, _)
    )
}

/// The last command taken from a sender, and how it was answered.
#[derive(Debug, Clone)]
struct Answered {
    frame: Frame,
    code: AckCode,
    detail: String,
}

/// The command core of one host.
#[derive(Debug, Clone)]
pub struct CommandCore {
    /// This host's `cmd` topic: what its commands are signed for.
    own: Topic,
    authority: Authority,
    /// The floor of the commands taken from each sender: its highest seq
    /// and latest stamp ([`ReplayFloor`]; see [`CommandCore::replayed`]).
    floors: HashMap<NodeId, ReplayFloor>,
    /// When this host started (steady time), if it was said: the start
    /// floor, what a sender with no floor kept signed before it is a
    /// replay ([`CommandCore::set_started`]).
    started: Option<TimestampMs>,
    /// The senders whose floor was kept from before the start: the start
    /// floor is not theirs.
    kept: HashSet<NodeId>,
    /// The last command taken from each sender, and its answer, to answer
    /// a copy of it alike (not kept across a restart).
    answered: HashMap<NodeId, Answered>,
    /// The floor of the CDU's states taken (its highest seq and latest
    /// stamp, [`ReplayFloor`]), and the seq and stamp of the last one (a
    /// copy of it, delivered again, is taken as it was).
    last_state: Option<(ReplayFloor, (u32, TimestampMs))>,
    arbiter: CapArbiter,
    /// What became of the leases taken back after a restart that differs
    /// from them, by sender and lease id ([`CommandCore::restore_notes`]).
    restore_notes: Vec<((NodeId, u32), String)>,
    /// The wall clock minus steady time, ms (see
    /// [`CommandCore::set_wall_offset`]).
    wall_offset: i64,
}

impl CommandCore {
    /// A core for GPUs with `ranges`, checking commands signed for `own`
    /// (this host's `cmd` topic) against `authority`, with the default
    /// lease limits.
    pub fn new(own: Topic, ranges: Vec<GpuRange>, authority: Authority) -> Self {
        Self::with_limits(own, ranges, authority, LeaseLimits::default())
    }

    /// As [`CommandCore::new`], taking leases within `limits`.
    pub fn with_limits(
        own: Topic,
        ranges: Vec<GpuRange>,
        authority: Authority,
        limits: LeaseLimits,
    ) -> Self {
        Self {
            own,
            authority,
            floors: HashMap::new(),
            started: None,
            kept: HashSet::new(),
            answered: HashMap::new(),
            last_state: None,
            arbiter: CapArbiter::with_limits(ranges, limits),
            restore_notes: Vec::new(),
            wall_offset: 0,
        }
    }

    /// Tells the core how far the wall clock is from steady time, ms
    /// (wall minus steady). A command's freshness is checked on the wall
    /// clock (it is the sender's stamp against this host's clock), but a
    /// lease, once taken, lapses on steady time: its end is turned into
    /// steady time when it is taken, so a step of this host's wall clock
    /// neither lifts a cap early nor holds one longer. 0 (the default)
    /// when both clocks are one.
    pub fn set_wall_offset(&mut self, wall_minus_steady_ms: i64) {
        self.wall_offset = wall_minus_steady_ms;
    }

    /// Tells the core when this host started, in steady time (the wall
    /// clock at the start, where steady time is anchored): what a sender
    /// with no floor kept from before ([`CommandCore::restore_replay_floor`])
    /// signed before it is a replay (its state volatile, or its
    /// floor's record unreadable: a command taken before the restart,
    /// captured and sent again while fresh, is refused). Its commands
    /// stamped at the start or after are taken by the floor they raise,
    /// as any. A stamp is compared with it in steady time, so a step of
    /// the wall clock since ([`CommandCore::set_wall_offset`]) moves the
    /// start with it.
    pub fn set_started(&mut self, started: TimestampMs) {
        self.started = Some(started);
    }

    /// Wall-clock stamp `t` in steady time.
    fn steady(&self, t: TimestampMs) -> TimestampMs {
        TimestampMs(t.0.saturating_add_signed(-self.wall_offset))
    }

    /// Decides about a command frame received at `now` (wall clock).
    pub fn command(&mut self, now: TimestampMs, frame: &Frame) -> Verdict {
        let kind = frame.message.kind();
        if !matches!(
            frame.message,
            Message::CapLease(_) | Message::QuarantineRelease(_)
        ) {
            return Verdict::refuse(
                AckCode::Unsupported,
                format!("{kind:?} is not a command a host takes"),
            );
        }
        if let Err(e) = self.authenticate(frame) {
            return Verdict::refuse(AckCode::Unauthenticated, e);
        }
        if let Some(why) = self.authority.forbids(frame) {
            return Verdict::refuse(AckCode::Forbidden, why);
        }
        if let Some(refused) = self.replayed(now, frame) {
            return self.copy_answered(frame).unwrap_or(refused);
        }
        // Its seq counts even if it is refused below; its stamp only if it
        // is fresh: a stamp refused as wrong (a clock far ahead) never
        // holds back its sender's later commands.
        let stale = stale(now, frame);
        let stamp = stale.is_none().then_some(frame.time);
        self.raise_floor(&frame.sender, frame.seq, stamp);
        let verdict = match stale {
            Some(v) => v,
            None => self.decide(now, frame),
        };
        let answer = Answered {
            frame: frame.clone(),
            code: verdict.code,
            detail: verdict.detail.clone(),
        };
        self.answered.insert(frame.sender.clone(), answer);
        Verdict {
            kept: true,
            ..verdict
        }
    }

    /// The answer to a copy of the last command taken from its sender
    /// (the same frame again: the bus delivers at least once, and a
    /// sender's outbox sends again what the broker had not acknowledged
    /// before a restart): what the command got, said to be a copy, and
    /// nothing done again. `None`: not such a copy (a replay).
    fn copy_answered(&self, frame: &Frame) -> Option<Verdict> {
        let a = self.answered.get(&frame.sender)?;
        if a.frame != *frame {
            return None;
        }
        let mut detail = format!("a copy of seq {}, answered already", frame.seq);
        if !a.detail.is_empty() {
            detail = format!("{detail}: {}", a.detail);
        }
        Some(Verdict {
            copy: true,
            ..Verdict::refuse(a.code, detail)
        })
    }

    /// The last command kept from `sender` ([`Verdict::kept`]) was
    /// answered with `code` and `detail` (what its ack said, after the
    /// limits were set and it was logged): a copy of it is answered so.
    pub fn settled(&mut self, sender: &NodeId, code: AckCode, detail: &str) {
        if let Some(a) = self.answered.get_mut(sender) {
            (a.code, a.detail) = (code, detail.to_string());
        }
    }

    /// Decides about a command past the checks of its sender and its seq,
    /// and fresh: a copy captured and sent again later (or to this host
    /// after a restart that forgot its sender) is refused before
    /// ([`stale`]).
    fn decide(&mut self, now: TimestampMs, frame: &Frame) -> Verdict {
        match &frame.message {
            Message::CapLease(lease) => self.lease(now, frame, lease),
            Message::QuarantineRelease(r) => {
                if (r.gpu.get() as usize) >= self.arbiter.ranges().len() {
                    Verdict::refuse(AckCode::UnknownGpu, self.no_such_gpu(r.gpu.get()))
                } else if r.note.as_str().trim().is_empty() {
                    Verdict::refuse(
                        AckCode::Malformed,
                        "a release needs a note saying why the GPU is fit again".into(),
                    )
                } else {
                    Verdict {
                        code: AckCode::Ok,
                        detail: String::new(),
                        changed_caps: false,
                        release: Some(r.gpu.get()),
                        copy: false,
                        kept: false,
                    }
                }
            }
            _ => unreachable!("only commands get here"),
        }
    }

    /// Whether a CDU state that came on `topic` (the `health` topic of
    /// `cdu`, the host's CDU) may be taken as this host's cooling context
    /// at `now` (wall clock): sent and signed by `cdu` with a key of the
    /// keyring, fresh ([`check_cdu_state`]), and no replay of a state
    /// older than the last one taken. `Err` says why not; a state refused
    /// changes nothing.
    pub fn cdu_state(
        &mut self,
        cdu: &Ident,
        topic: &Topic,
        frame: &Frame,
        now: TimestampMs,
    ) -> Result<(), String> {
        check_cdu_state(cdu, frame, now)?;
        if frame
            .signed_auth()
            .is_some_and(|a| a.signature == [[0; 32]; 2])
        {
            return Err(format!(
                "cdu/{cdu}'s state is unsigned (a controller older than protocol 2.7, or one \
                 with no sign key): a host takes only a signed state"
            ));
        }
        self.authenticate_on(topic, "its state topic", frame)
            .map_err(|e| format!("cdu/{cdu}'s state: {e}"))?;
        let this = (frame.seq, frame.time);
        match self.last_state.as_mut() {
            // A copy of the last taken (the retained state delivered
            // again): taken as it was.
            Some((_, last)) if *last == this => {}
            // A controller that lost its counter restarts it, but its
            // clock goes on: a state at or below both the highest seq
            // and the latest stamp taken is a replay.
            Some((floor, _)) if floor.replays(frame.seq, frame.time) => {
                return Err(format!(
                    "cdu/{cdu}'s state seq {} stamped {} is not above seq {} or stamp {}, the highest taken: a replay",
                    frame.seq, frame.time.0, floor.seq, floor.time.0
                ));
            }
            Some((floor, last)) => {
                floor.raise(frame.seq, frame.time);
                *last = this;
            }
            None => self.last_state = Some((ReplayFloor::new(frame.seq, frame.time), this)),
        }
        Ok(())
    }

    fn authenticate(&self, frame: &Frame) -> Result<(), String> {
        self.authenticate_on(&self.own, "this host", frame)
    }

    /// Checks `frame`'s signature for `topic` (`target` in words) against
    /// the keyring.
    fn authenticate_on(&self, topic: &Topic, target: &str, frame: &Frame) -> Result<(), String> {
        let signers = &self.authority.signers;
        let keys = |who: &NodeId, id: u8| signers.iter().find(|s| s.is(who, id)).map(|s| &s.key);
        frame.verify(topic, keys).map_err(|e| match e {
            AuthError::UnknownKey(id) => format!(
                "the keyring holds no key {id} for {}/{}",
                frame.sender.role.as_str(),
                frame.sender.id.as_str()
            ),
            AuthError::BadSignature => format!(
                "the signature does not verify with {}/{}'s key for {target}",
                frame.sender.role.as_str(),
                frame.sender.id.as_str()
            ),
            other => other.to_string(),
        })
    }

    /// The floor of the commands taken from `sender` (its highest seq and
    /// latest stamp): a command at or below both is a replay. Kept in
    /// flash so that a restart does not forget it.
    pub fn replay_floor(&self, sender: &NodeId) -> Option<ReplayFloor> {
        self.floors.get(sender).copied()
    }

    /// Takes back the floor of the CDU's states taken before a restart
    /// and the seq and stamp of the last one ([`CommandCore::state_floor`]):
    /// a state at or below the floor sent again after the restart is a
    /// replay, as it was before, but the last one taken (the retained
    /// state, delivered again) is a copy. One already taken raises it.
    pub fn restore_state_floor(&mut self, floor: ReplayFloor, last: (u32, TimestampMs)) {
        match self.last_state.as_mut() {
            Some((f, _)) => f.raise(floor.seq, floor.time),
            None => self.last_state = Some((floor, last)),
        }
    }

    /// The floor of the CDU's states taken and the seq and stamp of the
    /// last one, to keep across a restart.
    pub fn state_floor(&self) -> Option<(ReplayFloor, (u32, TimestampMs))> {
        self.last_state
    }

    fn no_such_gpu(&self, gpu: u8) -> String {
        format!(
            "no GPU {gpu} on this host ({} GPUs, 0 to {})",
            self.arbiter.ranges().len(),
            self.arbiter.ranges().len().saturating_sub(1)
        )
    }

    fn lease(&mut self, now: TimestampMs, frame: &Frame, lease: &CapLease) -> Verdict {
        if lease.source == CapSource::ThermalGuard {
            return Verdict::refuse(
                AckCode::Malformed,
                "source thermal_guard is the host's own; a lease names cooling, facility_budget or operator".into(),
            );
        }
        if lease.caps.is_empty() {
            return Verdict::refuse(AckCode::Malformed, "the lease caps no GPU".into());
        }
        if lease.duration.0 == 0 {
            return Verdict::refuse(AckCode::Malformed, "the lease lasts 0 ms".into());
        }
        // A lease runs from its arrival, less what its stamp says beyond
        // the clocks' allowed skew: a stamp ahead of the clock never
        // lengthens it.
        let (at, sent) = (self.steady(now), self.steady(runs_from(now, frame.time)));
        let outcome = self.arbiter.lease(at, &frame.sender, sent, lease);
        let detail = match outcome.code {
            AckCode::Ok => String::new(),
            AckCode::Clamped => self.clamped_detail(lease, outcome.shortened),
            AckCode::UnknownGpu => {
                let bad = lease
                    .caps
                    .iter()
                    .find_map(|c| match c.gpus {
                        GpuSelector::Gpu(g)
                            if (g.get() as usize) >= self.arbiter.ranges().len() =>
                        {
                            Some(g.get())
                        }
                        _ => None,
                    })
                    .unwrap_or(0);
                self.no_such_gpu(bad)
            }
            AckCode::Expired => format!(
                "sent at {} ms for {} ms, {} s behind this host's clock: expired before it arrived \
                 (beyond {} s that is the bus's delay or the clocks: check both hosts' time sync)",
                frame.time.0,
                lease.duration.0,
                frame.time.until(now) / 1000,
                CLOCK_SKEW_MS / 1000
            ),
            AckCode::TooMany if lease.source == CapSource::Cooling => format!(
                "this host already holds {} cooling leases, its most",
                self.arbiter.most_leases(lease.source)
            ),
            AckCode::TooMany => format!(
                "this host already holds {} leases of operators and facility systems, its most",
                self.arbiter.most_leases(lease.source)
            ),
            other => format!("{other:?}"),
        };
        // The CDU's cooling leases full: its new one took the place of one
        // it numbers no more, whose caps lifted (said).
        let detail = match outcome.replaced {
            Some(id) => {
                let sep = if detail.is_empty() { "" } else { "; " };
                format!(
                    "{detail}{sep}it replaced cooling lease {id}, the least recently renewed of \
                     the {COOLING_LEASES} this host holds at most"
                )
            }
            None => detail,
        };
        Verdict {
            changed_caps: matches!(outcome.code, AckCode::Ok | AckCode::Clamped),
            code: outcome.code,
            detail,
            release: None,
            copy: false,
            kept: false,
        }
    }

    /// What a `Clamped` ack says of `lease`: each cap raised to a GPU's
    /// minimum, or above its maximum and so clamped to its ceiling (the
    /// limit in force uncapped), and whether it was `shortened` to the
    /// longest taken.
    fn clamped_detail(&self, lease: &CapLease, shortened: bool) -> String {
        let ranges = self.arbiter.ranges();
        let mut parts = Vec::new();
        if shortened {
            let longest = self.arbiter.limits().max_duration.0;
            parts.push(format!(
                "{}{} to {longest} ms, this host's longest lease",
                loopwarden_protocol::LEASE_SHORTENED,
                lease.duration.0
            ));
        }
        for cap in &lease.caps {
            let gpus: Vec<usize> = match cap.gpus {
                GpuSelector::All => (0..ranges.len()).collect(),
                GpuSelector::Gpu(g) => vec![g.get() as usize],
            };
            for i in gpus {
                let min = ranges[i].min;
                if cap.limit < min {
                    parts.push(format!(
                        "GPU {i}: {} W is below its minimum {} W; clamped to {} W",
                        cap.limit.0, min.0, min.0
                    ));
                }
                // Such a cap caps nothing: the GPU holds its ceiling (a
                // site's or an administrator's limit may keep it below
                // the maximum), which is what the ack names.
                if let Some(max) = self.arbiter.highest(i).filter(|&m| cap.limit > m) {
                    parts.push(format!(
                        "GPU {i}: {} W is above its maximum {} W; clamped to {} W",
                        cap.limit.0, max.0, ranges[i].max.0
                    ));
                }
            }
        }
        let mut s = parts.join("; ");
        if s.len() > loopwarden_protocol::NOTE_MAX {
            s.truncate(loopwarden_protocol::NOTE_MAX - 3);
            while !s.is_char_boundary(s.len()) {
                s.pop();
            }
            s.push_str("...");
        }
        s
    }

    /// Sets (or clears) the thermal guard's cap on `gpu`.
    pub fn guard(&mut self, gpu: GpuIndex, cap: Option<Watts>) {
        self.arbiter.guard(gpu, cap);
    }

    /// The limit every GPU must have at `steady` (steady time; expired
    /// leases dropped).
    pub fn targets(&mut self, steady: TimestampMs) -> Vec<InForce> {
        self.arbiter.in_force(steady)
    }

    /// When the next lease lapses, in steady time.
    pub fn next_expiry(&self) -> Option<TimestampMs> {
        self.arbiter.next_expiry()
    }

    /// The leases held, their ends on the wall clock.
    pub fn leases(&self) -> Vec<LeaseView> {
        let mut v = self.arbiter.leases();
        for l in &mut v {
            l.expires = TimestampMs(l.expires.0.saturating_add_signed(self.wall_offset));
        }
        v
    }

    /// Makes `max` the limit `gpu` runs at uncapped (its ceiling).
    pub fn set_ceiling(&mut self, gpu: GpuIndex, max: Watts) {
        self.arbiter.set_ceiling(gpu, max);
    }

    /// Makes `max` the highest settable limit of `gpu`: a cap above it
    /// is acked clamped, naming it.
    pub fn set_highest(&mut self, gpu: GpuIndex, max: Watts) {
        self.arbiter.set_highest(gpu, max);
    }

    /// Makes `min` the lowest settable limit of `gpu` (read after the
    /// start).
    pub fn set_floor(&mut self, gpu: GpuIndex, min: Watts) {
        self.arbiter.set_floor(gpu, min);
    }

    /// The GPUs' settable ranges.
    pub fn ranges(&self) -> &[GpuRange] {
        self.arbiter.ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{samples, CommandAuth, DurationMs, QuarantineRelease, Role, Text};

    const SEED: [u8; 32] = [0x5a; 32];

    pub(super) fn key() -> loopwarden_protocol::auth::SigningKey {
        loopwarden_protocol::auth::SigningKey::from_bytes(&SEED)
    }

    pub(super) fn signer(role: Role, name: &str, release: bool) -> Signer {
        Signer {
            role,
            name: Some(loopwarden_protocol::Ident::new(name).unwrap()),
            key_id: 1,
            key: key().verifying_key(),
            may: May {
                lease: true,
                release,
                resend: role != Role::Cdu,
            },
        }
    }

    /// cdu-a (this host's CDU) and cdu-b may lease, jdoe may also release,
    /// all with the same test key.
    pub(super) fn authority() -> Authority {
        Authority {
            signers: vec![
                signer(Role::Cdu, "cdu-a", false),
                signer(Role::Cdu, "cdu-b", false),
                signer(Role::Operator, "jdoe", true),
            ],
            cdu: Some(loopwarden_protocol::Ident::new("cdu-a").unwrap()),
        }
    }

    pub(super) fn own() -> Topic {
        Topic::new(
            &loopwarden_protocol::Ident::new("hall-1").unwrap(),
            Role::Host,
            &loopwarden_protocol::Ident::new("h07").unwrap(),
            loopwarden_protocol::Family::Cmd,
        )
    }

    pub(super) fn core() -> CommandCore {
        CommandCore::new(
            own(),
            vec![
                GpuRange {
                    min: Watts(200),
                    max: Watts(700)
                };
                8
            ],
            authority(),
        )
    }

    pub(super) fn lease_frame(seq: u32, time: u64, caps: &[(GpuSelector, u32)], ms: u32) -> Frame {
        let lease = samples::cooling_lease(1, caps, ms);
        let mut f = Frame {
            sender: NodeId::new(Role::Cdu, "cdu-a").unwrap(),
            seq,
            time: TimestampMs(time),
            message: Message::CapLease(lease),
        };
        f.sign(&own(), 1, &key()).unwrap();
        f
    }

    fn gpu(i: u8) -> GpuSelector {
        GpuSelector::Gpu(GpuIndex::new(i).unwrap())
    }

    #[test]
    fn a_signed_lease_is_taken_its_copy_answered_alike_and_its_replay_refused() {
        let mut c = core();
        let f = lease_frame(5, 1_000, &[(GpuSelector::All, 500)], 30_000);
        let v = c.command(TimestampMs(1_100), &f);
        assert_eq!(v.code, AckCode::Ok);
        assert!(v.changed_caps);
        assert_eq!(c.targets(TimestampMs(1_100))[3].limit, Watts(500));
        // The same frame again (the bus delivers at least once): answered
        // as it was, nothing done again.
        let v = c.command(TimestampMs(1_200), &f);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert_eq!(v.detail, "a copy of seq 5, answered already");
        assert!(!v.changed_caps && v.release.is_none());
        // An older one, and the copy once a newer one was taken: replays.
        let older = lease_frame(4, 1_000, &[(GpuSelector::All, 300)], 30_000);
        assert_eq!(
            c.command(TimestampMs(1_300), &older).code,
            AckCode::Replayed
        );
        let newer = lease_frame(6, 1_300, &[(GpuSelector::All, 450)], 30_000);
        assert_eq!(c.command(TimestampMs(1_400), &newer).code, AckCode::Ok);
        let v = c.command(TimestampMs(1_500), &f);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        assert_eq!(c.targets(TimestampMs(1_500))[3].limit, Watts(450));
        // A copy of a refused one is refused alike, and says so.
        let stale = lease_frame(7, 1_000, &[(GpuSelector::All, 300)], 1_000);
        assert_eq!(
            c.command(TimestampMs(400_000), &stale).code,
            AckCode::Expired
        );
        let v = c.command(TimestampMs(400_100), &stale);
        assert_eq!(v.code, AckCode::Expired);
        assert!(
            v.detail
                .starts_with("a copy of seq 7, answered already: sent "),
            "{}",
            v.detail
        );
    }

    #[test]
    fn forged_and_unknown_key_commands_change_nothing() {
        let mut c = core();
        let mut f = lease_frame(5, 1_000, &[(GpuSelector::All, 300)], 30_000);
        f.seq = 6; // changed after signing
        assert_eq!(
            c.command(TimestampMs(1_000), &f).code,
            AckCode::Unauthenticated
        );
        let mut g = lease_frame(7, 1_000, &[(GpuSelector::All, 300)], 30_000);
        g.sign(&own(), 9, &key()).unwrap();
        let v = c.command(TimestampMs(1_000), &g);
        assert_eq!(v.code, AckCode::Unauthenticated);
        assert!(v.detail.contains("no key 9 for cdu/cdu-a"), "{}", v.detail);
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
        // A forged frame does not advance the replay counter.
        let ok = lease_frame(6, 1_000, &[(GpuSelector::All, 300)], 30_000);
        assert_eq!(c.command(TimestampMs(1_000), &ok).code, AckCode::Ok);
    }

    /// A host whose clock runs 40 s ahead of its CDU's takes the CDU's
    /// 30 s leases for their whole life from their arrival (before, each
    /// was expired on arrival and the host was never capped), and a
    /// renewal 10 s later keeps the cap in force; a stamp ahead of the
    /// clock never lengthens one.
    #[test]
    fn a_lease_from_a_clock_behind_this_hosts_keeps_its_life() {
        let mut c = core();
        let now = 1_041_000;
        let v = c.command(
            TimestampMs(now),
            &lease_frame(1, now - 40_000, &[(gpu(0), 300)], 30_000),
        );
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert_eq!(c.next_expiry(), Some(TimestampMs(now + 30_000)));
        assert_eq!(c.targets(TimestampMs(now + 29_000))[0].limit, Watts(300));
        let renewed = lease_frame(2, now - 30_000, &[(gpu(0), 300)], 30_000);
        assert_eq!(
            c.command(TimestampMs(now + 10_000), &renewed).code,
            AckCode::Ok
        );
        assert_eq!(c.next_expiry(), Some(TimestampMs(now + 40_000)));
        // Ahead: from its arrival, no longer.
        let ahead = lease_frame(3, now + 120_000, &[(gpu(0), 300)], 30_000);
        assert_eq!(
            c.command(TimestampMs(now + 11_000), &ahead).code,
            AckCode::Ok
        );
        assert_eq!(c.next_expiry(), Some(TimestampMs(now + 41_000)));
        assert_eq!(
            runs_from(TimestampMs(200_000), TimestampMs(100_000)),
            TimestampMs(160_000)
        );
    }

    #[test]
    fn refusals_say_why() {
        let mut c = core();
        let v = c.command(TimestampMs(0), &lease_frame(1, 0, &[(gpu(12), 300)], 1_000));
        assert_eq!(v.code, AckCode::UnknownGpu);
        assert!(v.detail.contains("no GPU 12"), "{}", v.detail);
        let v = c.command(TimestampMs(0), &lease_frame(2, 0, &[], 1_000));
        assert_eq!(v.code, AckCode::Malformed);
        let v = c.command(
            TimestampMs(70_000),
            &lease_frame(3, 1_000, &[(gpu(0), 300)], 5_000),
        );
        assert_eq!(v.code, AckCode::Expired);
        assert!(
            v.detail.contains("69 s behind this host's clock"),
            "{}",
            v.detail
        );
        assert!(v.detail.contains("time sync"), "{}", v.detail);
        let v = c.command(TimestampMs(0), &lease_frame(4, 0, &[(gpu(6), 150)], 1_000));
        assert_eq!(v.code, AckCode::Clamped);
        assert_eq!(
            v.detail,
            "GPU 6: 150 W is below its minimum 200 W; clamped to 200 W"
        );
        assert_eq!(c.targets(TimestampMs(0))[6].limit, Watts(200));
    }

    #[test]
    fn other_messages_and_releases() {
        let mut c = core();
        let mut tel = lease_frame(1, 0, &[(gpu(0), 300)], 1_000);
        tel.message = Message::HostTelemetry(samples::host_telemetry(2));
        assert_eq!(c.command(TimestampMs(0), &tel).code, AckCode::Unsupported);
        let mut rel = Frame {
            sender: NodeId::new(Role::Operator, "jdoe").unwrap(),
            seq: 1,
            time: TimestampMs(0),
            message: Message::QuarantineRelease(QuarantineRelease {
                gpu: GpuIndex::new(3).unwrap(),
                operator: loopwarden_protocol::Ident::new("jdoe").unwrap(),
                note: Text::new("reseated").unwrap(),
                auth: CommandAuth::default(),
            }),
        };
        rel.sign(&own(), 1, &key()).unwrap();
        let v = c.command(TimestampMs(0), &rel);
        assert_eq!(
            (v.code, v.release),
            (AckCode::Ok, Some(3)),
            "handed to the health engine"
        );
        if let Message::QuarantineRelease(r) = &mut rel.message {
            r.note = Text::new(" ").unwrap();
        }
        rel.seq = 2;
        rel.sign(&own(), 1, &key()).unwrap();
        assert_eq!(
            c.command(TimestampMs(0), &rel).code,
            AckCode::Malformed,
            "no reason given"
        );
    }

    #[test]
    fn a_command_signed_for_another_host_is_refused() {
        let mut c = core();
        let mut f = lease_frame(1, 1_000, &[(gpu(0), 300)], 30_000);
        let h12 = Topic::new(
            &loopwarden_protocol::Ident::new("hall-1").unwrap(),
            Role::Host,
            &loopwarden_protocol::Ident::new("h12").unwrap(),
            loopwarden_protocol::Family::Cmd,
        );
        f.sign(&h12, 1, &key()).unwrap();
        let v = c.command(TimestampMs(1_000), &f);
        assert_eq!(v.code, AckCode::Unauthenticated, "{}", v.detail);
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
    }

    #[test]
    fn a_signer_may_do_only_what_the_keyring_says_and_a_cdu_only_for_its_own_hosts() {
        let mut c = core();
        // cdu-b is known and signs well, but this host is cdu-a's.
        let mut f = lease_frame(1, 1_000, &[(gpu(0), 300)], 30_000);
        f.sender = NodeId::new(Role::Cdu, "cdu-b").unwrap();
        f.sign(&own(), 1, &key()).unwrap();
        let v = c.command(TimestampMs(1_000), &f);
        assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
        assert!(v.detail.contains("cooled by cdu/cdu-a"), "{}", v.detail);
        // A controller may not release a quarantine.
        let mut rel = lease_frame(2, 1_000, &[], 1);
        rel.message = Message::QuarantineRelease(QuarantineRelease {
            gpu: GpuIndex::new(3).unwrap(),
            operator: loopwarden_protocol::Ident::new("cdu-a").unwrap(),
            note: Text::new("fine").unwrap(),
            auth: CommandAuth::default(),
        });
        rel.sign(&own(), 1, &key()).unwrap();
        let v = c.command(TimestampMs(1_000), &rel);
        assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
        assert!(v.detail.contains("may not release"), "{}", v.detail);
        // An operator signs releases in its own name only.
        rel.sender = NodeId::new(Role::Operator, "jdoe").unwrap();
        rel.seq = 3;
        rel.sign(&own(), 1, &key()).unwrap();
        let v = c.command(TimestampMs(1_000), &rel);
        assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
        assert!(v.detail.contains("in the name of cdu-a"), "{}", v.detail);
        // A host is never a signer: its own key, under its own name or
        // a controller's, does not verify.
        let host_key = loopwarden_protocol::auth::SigningKey::from_bytes(&[0x11; 32]);
        let mut f = lease_frame(3, 1_000, &[(gpu(0), 300)], 30_000);
        f.sender = NodeId::new(Role::Host, "h12").unwrap();
        f.sign(&own(), 1, &host_key).unwrap();
        assert_eq!(
            c.command(TimestampMs(1_000), &f).code,
            AckCode::Unauthenticated
        );
        let mut f = lease_frame(4, 1_000, &[(gpu(0), 300)], 30_000);
        f.sign(&own(), 1, &host_key).unwrap();
        assert_eq!(
            c.command(TimestampMs(1_000), &f).code,
            AckCode::Unauthenticated
        );
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
        // Without a CDU of its own, a host takes no controller's lease.
        let mut lone = CommandCore::new(
            own(),
            vec![
                GpuRange {
                    min: Watts(200),
                    max: Watts(700)
                };
                8
            ],
            Authority {
                cdu: None,
                ..authority()
            },
        );
        let v = lone.command(
            TimestampMs(1_000),
            &lease_frame(5, 1_000, &[(gpu(0), 300)], 30_000),
        );
        assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
    }

    #[test]
    fn a_release_from_anyone_but_an_operator_is_refused_whatever_its_rights() {
        // A CDU controller and a facility system given `release` by an
        // authority built past the keyring's checks.
        let mut c = CommandCore::new(
            own(),
            vec![
                GpuRange {
                    min: Watts(200),
                    max: Watts(700)
                };
                8
            ],
            Authority {
                signers: vec![
                    signer(Role::Cdu, "cdu-a", true),
                    signer(Role::Facility, "bms1", true),
                    signer(Role::Operator, "jdoe", true),
                ],
                cdu: Some(loopwarden_protocol::Ident::new("cdu-a").unwrap()),
            },
        );
        let release = |role, name: &str, seq| {
            let mut f = lease_frame(seq, 1_000, &[], 1);
            f.sender = NodeId::new(role, name).unwrap();
            f.message = Message::QuarantineRelease(QuarantineRelease {
                gpu: GpuIndex::new(3).unwrap(),
                operator: loopwarden_protocol::Ident::new(name).unwrap(),
                note: Text::new("fine").unwrap(),
                auth: CommandAuth::default(),
            });
            f.sign(&own(), 1, &key()).unwrap();
            f
        };
        for (role, name) in [(Role::Cdu, "cdu-a"), (Role::Facility, "bms1")] {
            let v = c.command(TimestampMs(1_000), &release(role, name, 1));
            assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
            assert!(
                v.detail.contains("only an operator may") && v.release.is_none(),
                "{v:?}"
            );
        }
        let v = c.command(TimestampMs(1_000), &release(Role::Operator, "jdoe", 1));
        assert_eq!((v.code, v.release), (AckCode::Ok, Some(3)), "{}", v.detail);
    }

    #[test]
    fn a_leases_source_is_its_signers_role() {
        let mut c = core();
        let as_jdoe = |seq: u32, source: CapSource| {
            let mut f = lease_frame(seq, 1_000, &[(gpu(0), 300)], 30_000);
            f.sender = NodeId::new(Role::Operator, "jdoe").unwrap();
            if let Message::CapLease(l) = &mut f.message {
                l.source = source;
            }
            f.sign(&own(), 1, &key()).unwrap();
            f
        };
        for (seq, source) in [(1, CapSource::Cooling), (2, CapSource::FacilityBudget)] {
            let v = c.command(TimestampMs(1_000), &as_jdoe(seq, source));
            assert_eq!(v.code, AckCode::Forbidden, "{}", v.detail);
            assert!(v.detail.contains("in the name of"), "{}", v.detail);
        }
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
        let v = c.command(TimestampMs(1_000), &as_jdoe(3, CapSource::Operator));
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
    }

    #[test]
    fn a_cdu_state_counts_only_from_the_hosts_cdu_and_when_fresh() {
        let cdu = loopwarden_protocol::Ident::new("cdu-a").unwrap();
        let mut f = samples::frame(loopwarden_protocol::MessageKind::CduState);
        let now = f.time;
        assert_eq!(check_cdu_state(&cdu, &f, now), Ok(()));
        let other = loopwarden_protocol::Ident::new("cdu-b").unwrap();
        let e = check_cdu_state(&other, &f, now).unwrap_err();
        assert!(e.contains("not its controller"), "{e}");
        f.sender = NodeId::new(Role::Host, "cdu-a").unwrap();
        assert!(
            check_cdu_state(&cdu, &f, now).is_err(),
            "a host, whatever its name"
        );
        let f = samples::frame(loopwarden_protocol::MessageKind::CduState);
        let later = TimestampMs(now.0 + COMMAND_MAX_AGE_MS + 1_000);
        let e = check_cdu_state(&cdu, &f, later).unwrap_err();
        assert!(e.contains("s ago"), "{e}");
        assert!(check_cdu_state(&cdu, &f, TimestampMs(now.0 + 60_000)).is_ok());
        // Stamps from the wire may be anything: none wraps the arithmetic.
        for stamp in [1 << 63, u64::MAX] {
            let mut f = samples::frame(loopwarden_protocol::MessageKind::CduState);
            f.time = TimestampMs(stamp);
            let e = check_cdu_state(&cdu, &f, now).unwrap_err();
            assert!(e.contains("s ahead"), "{e}");
        }
        let mut f = samples::frame(loopwarden_protocol::MessageKind::CduState);
        f.time = TimestampMs(0);
        let e = check_cdu_state(&cdu, &f, TimestampMs(u64::MAX)).unwrap_err();
        assert!(e.contains("s ago"), "{e}");
    }

    #[test]
    fn a_cdu_state_counts_only_signed_by_the_hosts_cdu_and_never_replayed() {
        let cdu = loopwarden_protocol::Ident::new("cdu-a").unwrap();
        let topic = samples::cdu_state_topic();
        let mut c = CommandCore::new(own(), vec![], Authority::demo(Some(cdu.clone())));
        let good = samples::frame(loopwarden_protocol::MessageKind::CduState);
        let now = good.time;
        assert_eq!(c.cdu_state(&cdu, &topic, &good, now), Ok(()));
        assert_eq!(
            c.cdu_state(&cdu, &topic, &good, now),
            Ok(()),
            "the same state again (a retained copy) still counts"
        );
        let mut unsigned = good.clone();
        if let Message::CduState(st) = &mut unsigned.message {
            st.auth = CommandAuth::default();
        }
        let e = c.cdu_state(&cdu, &topic, &unsigned, now).unwrap_err();
        assert!(e.contains("unsigned"), "{e}");
        let mut forged = good.clone();
        forged.seq += 1;
        forged.sign(&topic, 1, &key()).unwrap();
        let e = c.cdu_state(&cdu, &topic, &forged, now).unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
        // Signed for cdu-b's topic, sent on cdu-a's.
        let cdu_b = Topic::new(
            &loopwarden_protocol::Ident::new("hall-1").unwrap(),
            Role::Cdu,
            &loopwarden_protocol::Ident::new("cdu-b").unwrap(),
            loopwarden_protocol::Family::Health,
        );
        let mut moved = good.clone();
        moved.seq += 1;
        moved.sign(&cdu_b, 1, &samples::demo_signing_key()).unwrap();
        assert!(c.cdu_state(&cdu, &topic, &moved, now).is_err());
        // A newer state, then the older one again: refused as a replay.
        let sign = |seq: u32, time: u64| {
            let mut f = good.clone();
            (f.seq, f.time) = (seq, TimestampMs(time));
            f.sign(&topic, 1, &samples::demo_signing_key()).unwrap();
            f
        };
        let newer = sign(good.seq + 5, now.0 + 1_000);
        assert_eq!(c.cdu_state(&cdu, &topic, &newer, now), Ok(()));
        let e = c.cdu_state(&cdu, &topic, &good, now).unwrap_err();
        assert!(e.contains("a replay"), "{e}");
        // A controller whose counter restarted, with a later stamp, counts.
        let restarted = sign(3, now.0 + 2_000);
        assert_eq!(c.cdu_state(&cdu, &topic, &restarted, now), Ok(()));
        assert_eq!(c.cdu_state(&cdu, &topic, &restarted, now), Ok(()), "a copy");
        // The state from before the restart, sent again: not taken, nor
        // after it the restarted one's predecessor (they would undo each
        // other in turn).
        let after = sign(4, now.0 + 3_000);
        assert_eq!(c.cdu_state(&cdu, &topic, &after, now), Ok(()));
        for old in [&newer, &restarted, &newer, &good] {
            let e = c.cdu_state(&cdu, &topic, old, now).unwrap_err();
            assert!(e.contains("a replay"), "{e}");
        }
        // A clock stepped back, the counter going on: taken.
        let stepped = sign(good.seq + 6, now.0 + 500);
        assert_eq!(c.cdu_state(&cdu, &topic, &stepped, now), Ok(()));
        // After a restart, the floor and the last state taken back: the
        // retained state delivered again is a copy, though below the
        // floor's stamp; the one before it is a replay.
        let (floor, last) = c.state_floor().expect("states taken");
        assert_eq!(last, (stepped.seq, stepped.time));
        let mut again = CommandCore::new(own(), vec![], Authority::demo(Some(cdu.clone())));
        again.restore_state_floor(floor, last);
        assert_eq!(
            again.cdu_state(&cdu, &topic, &stepped, now),
            Ok(()),
            "a copy"
        );
        assert!(again.cdu_state(&cdu, &topic, &after, now).is_err());
        // A key not in the keyring: no key.
        let mut other_id = good.clone();
        other_id
            .sign(&topic, 7, &samples::demo_signing_key())
            .unwrap();
        let e = c.cdu_state(&cdu, &topic, &other_id, now).unwrap_err();
        assert!(e.contains("no key 7"), "{e}");
    }

    #[test]
    fn a_lease_whose_key_left_the_keyring_is_not_restored_and_said() {
        let f = lease_frame(1, 1_000, &[(gpu(0), 300)], 30_000);
        let mut c = core();
        assert!(c.restore(TimestampMs(2_000), f.time, &f));
        assert!(c.restore_notes().is_empty());
        let mut rotated = core();
        rotated.authority.signers.retain(|s| s.role != Role::Cdu);
        assert!(!rotated.restore(TimestampMs(2_000), f.time, &f));
        assert_eq!(rotated.targets(TimestampMs(2_000))[0].limit, Watts(700));
        let notes = rotated.restore_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0]
                .starts_with("lease 1 from cdu/cdu-a (seq 1, for the cooling) not taken back: ")
                && notes[0].contains("no key 1"),
            "{notes:?}"
        );
        assert!(rotated.restore_notes().is_empty(), "said once");
        // One that had ended anyway: not said.
        assert!(!rotated.restore(TimestampMs(40_000), f.time, &f));
        assert!(rotated.restore_notes().is_empty());
    }

    #[test]
    fn a_lease_longer_than_the_host_takes_is_shortened_and_said_in_its_ack() {
        let limits = LeaseLimits {
            max_duration: DurationMs(20_000),
            max_leases: 16,
        };
        let mut c = CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        // The controller's 30 s lease on a host that takes 20 s at most.
        let f = lease_frame(1, 1_000, &[(GpuSelector::All, 400)], 30_000);
        let v = c.command(TimestampMs(1_000), &f);
        assert_eq!(v.code, AckCode::Clamped);
        assert!(v.changed_caps);
        assert_eq!(
            v.detail,
            "shortened from 30000 to 20000 ms, this host's longest lease"
        );
        assert_eq!(c.next_expiry(), Some(TimestampMs(21_000)));
        assert_eq!(c.targets(TimestampMs(20_999))[5].limit, Watts(400));
        // A cap below the minimum as well: both said.
        let f = lease_frame(2, 2_000, &[(gpu(1), 100)], 30_000);
        let v = c.command(TimestampMs(2_000), &f);
        assert_eq!(v.code, AckCode::Clamped);
        assert!(
            v.detail.starts_with("shortened from 30000 to 20000 ms, this host's longest lease; GPU 1: 100 W is below its"),
            "{}",
            v.detail
        );
    }

    /// A lease shortened when taken ends at its sending plus the longest
    /// taken after a restart too: a restart never runs it again.
    #[test]
    fn a_shortened_lease_is_not_taken_back_past_its_shortened_end() {
        let limits = LeaseLimits {
            max_duration: DurationMs(20_000),
            max_leases: 16,
        };
        let mut c = CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        let f = lease_frame(1, 1_000, &[(gpu(0), 300)], 30_000);
        assert_eq!(c.command(TimestampMs(1_000), &f).code, AckCode::Clamped);
        let mut again =
            CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        assert!(again.restore(TimestampMs(15_000), f.time, &f));
        assert_eq!(again.next_expiry(), Some(TimestampMs(21_000)));
        let mut late =
            CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        assert!(!late.restore(TimestampMs(25_000), f.time, &f));
        assert_eq!(late.targets(TimestampMs(25_000))[0].limit, Watts(700));
        // Ended by this host's longest, its asked end still to come: said
        // (the longest may have been lowered since it was taken).
        let notes = late.restore_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            format!("{notes:?}").contains("not taken back: it ran 20000 ms since its sending"),
            "{notes:?}"
        );
        // Its key gone since: ended all the same, so not said either.
        let mut rotated =
            CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        rotated.authority.signers.retain(|s| s.role != Role::Cdu);
        assert!(!rotated.restore(TimestampMs(25_000), f.time, &f));
        assert!(rotated.restore_notes().is_empty());
    }

    #[test]
    fn a_lease_taken_back_shortened_is_said_once_and_not_after_its_renewal() {
        let limits = LeaseLimits {
            max_duration: DurationMs(300_000),
            max_leases: 16,
        };
        let mut c = CommandCore::with_limits(own(), core().ranges().to_vec(), authority(), limits);
        let first = lease_frame(1, 1_000, &[(gpu(0), 300), (gpu(9), 300)], 600_000);
        assert!(c.restore(TimestampMs(61_000), first.time, &first));
        assert_eq!(c.next_expiry(), Some(TimestampMs(301_000)));
        let notes = c.restore_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("GPU(s) 9 left out")
                && notes[0].contains("taken back for 240 s, not the 540 s it had left"),
            "{notes:?}"
        );
        // Its renewal, taken back after it, holds as it came: nothing said.
        let renewal = lease_frame(2, 50_000, &[(gpu(0), 300)], 30_000);
        assert!(c.restore(TimestampMs(61_000), first.time, &first));
        assert!(c.restore(TimestampMs(61_000), renewal.time, &renewal));
        assert!(c.restore_notes().is_empty());
        assert_eq!(c.next_expiry(), Some(TimestampMs(80_000)));
    }

    #[test]
    fn stale_or_future_commands_are_refused() {
        let mut c = core();
        let f = lease_frame(1, 1_000, &[(gpu(0), 300)], 3_600_000);
        let v = c.command(TimestampMs(1_000 + COMMAND_MAX_AGE_MS + 1), &f);
        assert_eq!(v.code, AckCode::Expired);
        assert!(v.detail.contains("ago"), "{}", v.detail);
        let f = lease_frame(2, 10_000_000, &[(gpu(0), 300)], 3_600_000);
        let v = c.command(TimestampMs(1_000), &f);
        assert_eq!(v.code, AckCode::Expired);
        assert!(v.detail.contains("in the future"), "{}", v.detail);
        // A stamp past i64::MAX or at u64::MAX is far in the future, not a
        // wrapped age.
        for (seq, stamp) in [(3, 1 << 63), (4, u64::MAX)] {
            let f = lease_frame(seq, stamp, &[(gpu(0), 300)], 3_600_000);
            let v = c.command(TimestampMs(1_000), &f);
            assert_eq!(v.code, AckCode::Expired);
            assert!(v.detail.contains("in the future"), "{}", v.detail);
        }
        // Below the floor and stale (a sender whose clock is behind): the
        // clock is said, not a replay alone; the floor stays. Every
        // command seen was stale: the floor has no stamp.
        let late = lease_frame(2, 1_000, &[(gpu(0), 300)], 3_600_000);
        let v = c.command(TimestampMs(1_000 + 10 * 60_000), &late);
        assert_eq!(v.code, AckCode::Expired, "{}", v.detail);
        assert!(
            v.detail.contains("ago (is the sender's clock right?)")
                && v.detail.ends_with(
                    "; and its seq 2 is not above seq 4, the highest taken from cdu-a \
                     (no stamp of it known)"
                ),
            "{}",
            v.detail
        );
        // A fresh one, then a stale one below both: the stamps are said.
        let fresh = lease_frame(5, 600_000, &[(gpu(0), 300)], 30_000);
        assert_eq!(c.command(TimestampMs(601_000), &fresh).code, AckCode::Ok);
        let v = c.command(TimestampMs(1_000 + 20 * 60_000), &late);
        assert!(
            v.detail
                .ends_with("; and its seq 2 stamped 1000 is not above seq 5 or stamp 600000, the highest taken from cdu-a"),
            "{}",
            v.detail
        );
        assert!(!v.kept);
    }

    #[test]
    fn a_lease_stamped_ahead_of_the_hosts_clock_lasts_no_longer() {
        let mut c = core();
        // Stamped 4 minutes ahead (within the 5 minutes a stamp may be
        // off), for 10 minutes: it ends 10 minutes after it came, not 14.
        let f = lease_frame(1, 241_000, &[(gpu(0), 300)], 600_000);
        assert_eq!(c.command(TimestampMs(1_000), &f).code, AckCode::Ok);
        assert_eq!(c.next_expiry(), Some(TimestampMs(601_000)));
        assert_eq!(c.targets(TimestampMs(600_999))[0].limit, Watts(300));
        assert_eq!(c.targets(TimestampMs(601_000))[0].limit, Watts(700));
        // A stamp behind the clock counts from the stamp beyond the
        // clocks' allowed skew: 120 s behind, it runs from 60 s after it.
        let mut d = core();
        let f = lease_frame(1, 1_000, &[(gpu(0), 300)], 600_000);
        assert_eq!(d.command(TimestampMs(121_000), &f).code, AckCode::Ok);
        assert_eq!(d.next_expiry(), Some(TimestampMs(661_000)));
    }

    /// A lease taken from a CDU whose clock ran 40 s behind this host's
    /// holds after a restart as it did before it: from when it was taken,
    /// not from its stamp (which would end it at once).
    #[test]
    fn a_restored_lease_runs_from_when_it_was_taken() {
        let f = lease_frame(1, 1_000, &[(gpu(0), 300)], 30_000);
        let mut c = core();
        assert!(c.restore(TimestampMs(50_000), TimestampMs(41_000), &f));
        assert_eq!(c.next_expiry(), Some(TimestampMs(71_000)));
        let mut d = core();
        assert!(!d.restore(TimestampMs(71_000), TimestampMs(41_000), &f));
    }

    #[test]
    fn restored_leases_hold_only_while_valid() {
        let mut c = core();
        let f = lease_frame(9, 1_000, &[(gpu(2), 400)], 10_000);
        assert!(c.restore(TimestampMs(5_000), f.time, &f));
        assert_eq!(c.targets(TimestampMs(5_000))[2].limit, Watts(400));
        let mut d = core();
        assert!(
            !d.restore(TimestampMs(11_000), f.time, &f),
            "expired while the agent was down"
        );
        assert_eq!(d.targets(TimestampMs(11_000))[2].limit, Watts(700));
        // Its seq still counts against replays.
        assert_eq!(d.command(TimestampMs(11_000), &f).code, AckCode::Replayed);
    }

    #[test]
    fn a_renewal_that_shortened_a_lease_still_ends_it_after_a_restart() {
        // 300 W for 60 s, renewed at 10 s for 1 s: lifted at 11 s.
        let first = lease_frame(1, 1_000, &[(gpu(0), 300)], 60_000);
        let renewal = lease_frame(2, 10_000, &[(gpu(0), 300)], 1_000);
        let mut c = core();
        assert!(
            c.restore(TimestampMs(20_000), first.time, &first),
            "valid until 61 s"
        );
        assert!(
            !c.restore(TimestampMs(20_000), renewal.time, &renewal),
            "lapsed at 11 s"
        );
        assert_eq!(c.targets(TimestampMs(20_000))[0].limit, Watts(700));
        assert!(c.arbiter.leases().is_empty());
        // Still in force at the restart: the renewal holds, as it did.
        let mut d = core();
        assert!(d.restore(TimestampMs(10_500), first.time, &first));
        assert!(d.restore(TimestampMs(10_500), renewal.time, &renewal));
        assert_eq!(d.targets(TimestampMs(10_500))[0].limit, Watts(300));
        assert_eq!(d.next_expiry(), Some(TimestampMs(11_000)));
    }

    #[test]
    fn a_taken_lease_lapses_on_steady_time_whatever_the_wall_clock_does() {
        // Steady time runs 1,000 ms behind the wall clock at first.
        let mut c = core();
        c.set_wall_offset(1_000);
        let f = lease_frame(1, 2_000, &[(gpu(1), 400)], 10_000);
        assert_eq!(c.command(TimestampMs(2_500), &f).code, AckCode::Ok);
        // Taken at 2,500 on the wall clock, it ends at 12,500: 11,500
        // steady.
        assert_eq!(c.next_expiry(), Some(TimestampMs(11_500)));
        assert_eq!(
            c.leases()[0].expires,
            TimestampMs(12_500),
            "shown on the wall clock"
        );
        // The wall clock steps an hour forward: steady time goes on as it
        // was, and the cap holds until its steady end.
        c.set_wall_offset(1_000 + 3_600_000);
        assert_eq!(c.targets(TimestampMs(11_499))[1].limit, Watts(400));
        assert_eq!(c.targets(TimestampMs(11_500))[1].limit, Watts(700));
    }
}

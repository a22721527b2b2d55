//! Commands in, decisions out: the pure part of the agent's command path.
//!
//! Every command frame that reaches the host goes through
//! [`CommandCore::command`], which checks, in order: that it is a command
//! this host takes, its MAC against the site keys, that its sequence
//! number is above the last one accepted from that sender, and then what
//! it asks. A lease goes to the [`CapArbiter`]; a refused command changes
//! nothing. The shell applies what [`CommandCore::targets`] says, reads
//! the limits back, and sends the ack with the values in force.
//!
//! Glossary:
//! - *verdict*: what the core decided about one command: the ack code and
//!   the sentence for its `detail`.
//! - *replay*: a command frame whose sequence number is not above the last
//!   accepted from its sender (a copy, or an attacker's resend).

use std::collections::{BTreeMap, HashMap};

use loopwarden_protocol::{
    AckCode, AuthError, CapLease, CapSource, Frame, GpuIndex, GpuSelector, Message, NodeId,
    TimestampMs, Topic, Watts,
};

use crate::caps::{CapArbiter, GpuRange, InForce, LeaseLimits, LeaseView};

/// How far a command's time may be from the host's clock, ms (both
/// directions): a lease or a release older than this is not acted on.
pub const COMMAND_MAX_AGE_MS: u64 = 300_000;

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
}

impl Verdict {
    fn refuse(code: AckCode, detail: String) -> Self {
        Self {
            code,
            detail,
            changed_caps: false,
            release: None,
        }
    }
}

/// The command core of one host.
#[derive(Debug, Clone)]
pub struct CommandCore {
    /// This host's `cmd` topic: what its commands are signed for.
    own: Topic,
    keys: BTreeMap<u8, Vec<u8>>,
    last_seq: HashMap<NodeId, u32>,
    arbiter: CapArbiter,
}

impl CommandCore {
    /// A core for GPUs with `ranges`, checking commands signed for `own`
    /// (this host's `cmd` topic) against `keys`, with the default lease
    /// limits.
    pub fn new(own: Topic, ranges: Vec<GpuRange>, keys: BTreeMap<u8, Vec<u8>>) -> Self {
        Self::with_limits(own, ranges, keys, LeaseLimits::default())
    }

    /// As [`CommandCore::new`], taking leases within `limits`.
    pub fn with_limits(
        own: Topic,
        ranges: Vec<GpuRange>,
        keys: BTreeMap<u8, Vec<u8>>,
        limits: LeaseLimits,
    ) -> Self {
        Self {
            own,
            keys,
            last_seq: HashMap::new(),
            arbiter: CapArbiter::with_limits(ranges, limits),
        }
    }

    /// Decides about a command frame received at `now`.
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
        if let Err(e) = frame.verify(&self.own, |id| self.keys.get(&id).map(Vec::as_slice)) {
            let detail = match e {
                AuthError::UnknownKey(id) => format!("key {id} is not a key of this site"),
                AuthError::BadTag => {
                    "the MAC does not verify with the site key for this host".into()
                }
                other => other.to_string(),
            };
            return Verdict::refuse(AckCode::Unauthenticated, detail);
        }
        if let Some(&last) = self.last_seq.get(&frame.sender) {
            if frame.seq <= last {
                return Verdict::refuse(
                    AckCode::Replayed,
                    format!(
                        "seq {} is not above {last}, the last seen from {}",
                        frame.seq,
                        frame.sender.id.as_str()
                    ),
                );
            }
        }
        self.last_seq.insert(frame.sender.clone(), frame.seq);
        // A command is acted on only while it is fresh: a copy captured and
        // sent again later (or to this host after a restart that forgot its
        // sender) is refused.
        let age = now.0 as i64 - frame.time.0 as i64;
        if age.unsigned_abs() > COMMAND_MAX_AGE_MS {
            return Verdict::refuse(
                AckCode::Expired,
                format!(
                    "sent {} s {}: commands are acted on within {} s of their time",
                    age.unsigned_abs() / 1000,
                    if age >= 0 { "ago" } else { "in the future" },
                    COMMAND_MAX_AGE_MS / 1000
                ),
            );
        }
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
                    }
                }
            }
            _ => unreachable!("only commands get here"),
        }
    }

    /// Takes back a lease logged before a restart, without the checks of
    /// a live command (it passed them when it came); one that has expired
    /// since is dropped. Returns whether it still holds.
    pub fn restore(&mut self, now: TimestampMs, frame: &Frame) -> bool {
        let last = self.last_seq.entry(frame.sender.clone()).or_insert(0);
        *last = (*last).max(frame.seq);
        match &frame.message {
            Message::CapLease(lease) => matches!(
                self.arbiter
                    .lease(now, &frame.sender, frame.time, lease)
                    .code,
                AckCode::Ok | AckCode::Clamped
            ),
            _ => false,
        }
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
        let outcome = self.arbiter.lease(now, &frame.sender, frame.time, lease);
        let detail = match outcome.code {
            AckCode::Ok => String::new(),
            AckCode::Clamped => self.clamped_detail(lease),
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
                "sent at {} ms for {} ms: expired {} ms before it arrived",
                frame.time.0,
                lease.duration.0,
                frame.time.after(lease.duration).until(now)
            ),
            AckCode::TooLong => format!(
                "the lease lasts {} ms; this host takes at most {} ms",
                lease.duration.0,
                self.arbiter.limits().max_duration.0
            ),
            AckCode::TooMany => format!(
                "this host already holds {} leases, its most",
                self.arbiter.limits().max_leases
            ),
            other => format!("{other:?}"),
        };
        Verdict {
            changed_caps: matches!(outcome.code, AckCode::Ok | AckCode::Clamped),
            code: outcome.code,
            detail,
            release: None,
        }
    }

    fn clamped_detail(&self, lease: &CapLease) -> String {
        let ranges = self.arbiter.ranges();
        let mut parts = Vec::new();
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

    /// The limit every GPU must have at `now` (expired leases dropped).
    pub fn targets(&mut self, now: TimestampMs) -> Vec<InForce> {
        self.arbiter.in_force(now)
    }

    /// When the next lease lapses.
    pub fn next_expiry(&self) -> Option<TimestampMs> {
        self.arbiter.next_expiry()
    }

    /// The leases held.
    pub fn leases(&self) -> Vec<LeaseView> {
        self.arbiter.leases()
    }

    /// The GPUs' settable ranges.
    pub fn ranges(&self) -> &[GpuRange] {
        self.arbiter.ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::{
        samples, CommandAuth, DurationMs, GpuCap, QuarantineRelease, ReasonCode, Role, Text,
    };

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn own() -> Topic {
        Topic::new(
            &loopwarden_protocol::Ident::new("hall-1").unwrap(),
            Role::Host,
            &loopwarden_protocol::Ident::new("h07").unwrap(),
            loopwarden_protocol::Family::Cmd,
        )
    }

    fn core() -> CommandCore {
        CommandCore::new(
            own(),
            vec![
                GpuRange {
                    min: Watts(200),
                    max: Watts(700)
                };
                8
            ],
            BTreeMap::from([(1, KEY.to_vec())]),
        )
    }

    fn lease_frame(seq: u32, time: u64, caps: &[(GpuSelector, u32)], ms: u32) -> Frame {
        let lease = CapLease {
            lease: 1,
            source: CapSource::Cooling,
            reason: ReasonCode::CAPACITY_SHORT,
            caps: caps
                .iter()
                .map(|(g, w)| GpuCap {
                    gpus: *g,
                    limit: Watts(*w),
                })
                .collect(),
            duration: DurationMs(ms),
            auth: CommandAuth::default(),
        };
        let mut f = Frame {
            sender: NodeId::new(Role::Cdu, "cdu-a").unwrap(),
            seq,
            time: TimestampMs(time),
            message: Message::CapLease(lease),
        };
        f.sign(&own(), 1, KEY).unwrap();
        f
    }

    fn gpu(i: u8) -> GpuSelector {
        GpuSelector::Gpu(GpuIndex::new(i).unwrap())
    }

    #[test]
    fn a_signed_lease_is_taken_and_its_replay_refused() {
        let mut c = core();
        let f = lease_frame(5, 1_000, &[(GpuSelector::All, 500)], 30_000);
        let v = c.command(TimestampMs(1_100), &f);
        assert_eq!(v.code, AckCode::Ok);
        assert!(v.changed_caps);
        assert_eq!(c.targets(TimestampMs(1_100))[3].limit, Watts(500));
        let v = c.command(TimestampMs(1_200), &f);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
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
        g.sign(&own(), 9, KEY).unwrap();
        let v = c.command(TimestampMs(1_000), &g);
        assert_eq!(v.code, AckCode::Unauthenticated);
        assert!(v.detail.contains("key 9"), "{}", v.detail);
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
        // A forged frame does not advance the replay counter.
        let ok = lease_frame(6, 1_000, &[(GpuSelector::All, 300)], 30_000);
        assert_eq!(c.command(TimestampMs(1_000), &ok).code, AckCode::Ok);
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
            TimestampMs(10_000),
            &lease_frame(3, 1_000, &[(gpu(0), 300)], 5_000),
        );
        assert_eq!(v.code, AckCode::Expired);
        assert!(v.detail.contains("4000 ms before"), "{}", v.detail);
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
        rel.sign(&own(), 1, KEY).unwrap();
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
        rel.sign(&own(), 1, KEY).unwrap();
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
        f.sign(&h12, 1, KEY).unwrap();
        let v = c.command(TimestampMs(1_000), &f);
        assert_eq!(v.code, AckCode::Unauthenticated, "{}", v.detail);
        assert_eq!(c.targets(TimestampMs(1_000))[0].limit, Watts(700));
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
    }

    #[test]
    fn restored_leases_hold_only_while_valid() {
        let mut c = core();
        let f = lease_frame(9, 1_000, &[(gpu(2), 400)], 10_000);
        assert!(c.restore(TimestampMs(5_000), &f));
        assert_eq!(c.targets(TimestampMs(5_000))[2].limit, Watts(400));
        let mut d = core();
        assert!(
            !d.restore(TimestampMs(11_000), &f),
            "expired while the agent was down"
        );
        assert_eq!(d.targets(TimestampMs(11_000))[2].limit, Watts(700));
        // Its seq still counts against replays.
        assert_eq!(d.command(TimestampMs(11_000), &f).code, AckCode::Replayed);
    }
}

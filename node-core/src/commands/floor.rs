//! The floor of the commands taken from each sender: its highest sequence
//! number and its latest stamp, each kept on its own ([`ReplayFloor`], the
//! rule the CDU's states and resend requests go by too).
//!
//! A command at or below both is a replay. A sender that lost its counter
//! (a CDU whose flash was replaced or restored) numbers again from its
//! clock, below the highest number taken, but its stamps go on past the
//! latest: its commands are taken at once, not refused as replays until
//! its numbers catch up (hours, for a CDU that numbered faster than its
//! clock). A captured command sent again is at or below both once its
//! sender's next is taken; before that it is the last one taken, a copy
//! answered as it was ([`CommandCore::command`]).
//!
//! Glossary:
//! - *seq-only floor*: the number alone an earlier version kept; taken
//!   back with the stamp of the restart plus [`COMMAND_MAX_AGE_MS`], above
//!   every command stamped fresh before it.

use loopwarden_protocol::{AckCode, Frame, NodeId, ReplayFloor, TimestampMs};

use super::{stale, CommandCore, Verdict, COMMAND_MAX_AGE_MS};

impl CommandCore {
    /// The refusal of `frame` received at `now` as a replay, if it is one:
    /// at or below its sender's floor on both its seq and its stamp.
    /// Stale as well, its sender's clock is the likelier cause (a laptop
    /// set by hand, a VM resumed), said first.
    pub(super) fn replayed(&self, now: TimestampMs, frame: &Frame) -> Option<Verdict> {
        let floor = self.floors.get(&frame.sender)?;
        if !floor.replays(frame.seq, frame.time) {
            return None;
        }
        let below = format!(
            "seq {} stamped {} is not above seq {} or stamp {}, the highest taken from {}",
            frame.seq,
            frame.time.0,
            floor.seq,
            floor.time.0,
            frame.sender.id.as_str()
        );
        Some(match stale(now, frame) {
            Some(mut v) => {
                v.detail = format!("{}; and its {below}", v.detail);
                v
            }
            None => Verdict::refuse(AckCode::Replayed, below),
        })
    }

    /// A command numbered `seq` and stamped `time` was taken from
    /// `sender` (or one taken before a restart is taken back): its floor
    /// rises to it where it is higher, never lower.
    pub(super) fn raise_floor(&mut self, sender: &NodeId, seq: u32, time: TimestampMs) {
        match self.floors.get_mut(sender) {
            Some(f) => f.raise(seq, time),
            None => {
                self.floors
                    .insert(sender.clone(), ReplayFloor::new(seq, time));
            }
        }
    }

    /// Takes back a floor kept before a restart
    /// ([`CommandCore::replay_floor`]): commands from `sender` at or below
    /// it are replays. One already taken rises to it.
    pub fn restore_replay_floor(&mut self, sender: &NodeId, floor: ReplayFloor) {
        self.raise_floor(sender, floor.seq, floor.time);
    }

    /// Takes back a seq-only floor (an earlier version kept no stamp),
    /// at `started` (this host's start, wall clock): its stamp is taken as
    /// `started` plus [`COMMAND_MAX_AGE_MS`], so that every command from
    /// `sender` numbered at or below `seq` and fresh enough to be taken
    /// before the restart is still a replay; a command stamped after it
    /// (a sender that lost its counter) is taken.
    pub fn restore_seq_floor(&mut self, sender: &NodeId, seq: u32, started: TimestampMs) {
        let time = TimestampMs(started.0.saturating_add(COMMAND_MAX_AGE_MS));
        self.raise_floor(sender, seq, time);
    }
}

#[cfg(test)]
mod tests {
    use loopwarden_protocol::{samples, CapSource, GpuSelector, Message, Role, Watts};

    use super::super::tests::{core, key, lease_frame, own};
    use super::*;

    /// A CDU that lost its counter (a new or restored flash) numbers from
    /// its clock, far below the floor: its lease is taken, as its stamp is
    /// after the latest taken. A true replay (the same frame once a newer
    /// one was taken, or a lower seq stamped earlier) is still refused.
    #[test]
    fn a_cdu_that_lost_its_counter_is_taken_by_its_stamp_and_a_replay_is_not() {
        let mut c = core();
        let t = 1_800_000_000_000;
        let all = |w| [(GpuSelector::All, w)];
        let first = lease_frame(1_000_000, t, &all(500), 30_000);
        assert_eq!(c.command(TimestampMs(t), &first).code, AckCode::Ok);
        // Its flash replaced: numbered from its clock, half as high.
        let after = lease_frame(500_000, t + 10_000, &all(300), 30_000);
        let v = c.command(TimestampMs(t + 10_000), &after);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert!(v.kept);
        assert_eq!(c.targets(TimestampMs(t + 10_000))[0].limit, Watts(300));
        assert_eq!(
            c.replay_floor(&first.sender),
            Some(ReplayFloor::new(1_000_000, TimestampMs(t + 10_000)))
        );
        // The frame before, sent again: at or below both.
        let v = c.command(TimestampMs(t + 11_000), &first);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        assert_eq!(
            v.detail,
            format!(
                "seq 1000000 stamped {t} is not above seq 1000000 or stamp {}, the highest \
                 taken from cdu-a",
                t + 10_000
            )
        );
        // A lower seq stamped earlier (captured between the two).
        let between = lease_frame(400_000, t + 5_000, &all(200), 30_000);
        let v = c.command(TimestampMs(t + 11_000), &between);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        // The last one taken, delivered again: a copy, answered as it was.
        let v = c.command(TimestampMs(t + 12_000), &after);
        assert_eq!((v.code, v.copy), (AckCode::Ok, true), "{}", v.detail);
        assert!(!v.changed_caps);
        assert_eq!(c.targets(TimestampMs(t + 12_000))[0].limit, Watts(300));
    }

    /// The floor kept and taken back after a restart: its stamp counts as
    /// before; a seq-only floor (an earlier version's) refuses every
    /// command stamped fresh before the start, and takes one stamped after.
    #[test]
    fn a_floor_taken_back_keeps_both_and_a_seq_only_floor_holds_the_commands_before_the_start() {
        let t = 1_800_000_000_000;
        let all = [(GpuSelector::All, 400)];
        let sender = lease_frame(9, t, &all, 30_000).sender;
        let mut c = core();
        c.restore_replay_floor(&sender, ReplayFloor::new(1_000, TimestampMs(t)));
        let low_later = lease_frame(10, t + 1, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t + 1), &low_later).code, AckCode::Ok);
        let low_before = lease_frame(11, t - 1, &all, 30_000);
        assert_eq!(
            c.command(TimestampMs(t + 2), &low_before).code,
            AckCode::Replayed
        );
        // Seq only, the host started at `t`: a command stamped up to its
        // freshness after the start, numbered at or below, is a replay.
        let mut c = core();
        c.restore_seq_floor(&sender, 1_000, TimestampMs(t));
        let ahead = lease_frame(999, t + COMMAND_MAX_AGE_MS, &all, 30_000);
        assert_eq!(
            c.command(TimestampMs(t + 1), &ahead).code,
            AckCode::Replayed
        );
        let past = lease_frame(5, t + COMMAND_MAX_AGE_MS + 1, &all, 30_000);
        let now = TimestampMs(t + COMMAND_MAX_AGE_MS + 1);
        assert_eq!(c.command(now, &past).code, AckCode::Ok);
        let above = lease_frame(1_001, t, &all, 30_000);
        let mut c = core();
        c.restore_seq_floor(&sender, 1_000, TimestampMs(t));
        assert_eq!(c.command(TimestampMs(t), &above).code, AckCode::Ok);
    }

    /// An operator's lease `id`, numbered `seq`.
    fn jdoe_lease(seq: u32, id: u32, time: u64, watts: u32) -> Frame {
        let lease = loopwarden_protocol::CapLease {
            source: CapSource::Operator,
            ..samples::cooling_lease(id, &[(GpuSelector::All, watts)], 60_000)
        };
        let mut f = Frame {
            sender: NodeId::new(Role::Operator, "jdoe").unwrap(),
            seq,
            time: TimestampMs(time),
            message: Message::CapLease(lease),
        };
        f.sign(&own(), 1, &key()).unwrap();
        f
    }

    /// An operator (or a facility system, one lease per GPU) holding as
    /// many leases as the host takes never makes it refuse its CDU's
    /// cooling cap: the main safety action lands.
    #[test]
    fn leases_of_others_filling_the_host_never_refuse_its_cdus_cooling_cap() {
        let mut c = core();
        let t = 1_800_000_000_000;
        for id in 1..=16 {
            let f = jdoe_lease(id, id, t, 700);
            assert_eq!(c.command(TimestampMs(t), &f).code, AckCode::Ok, "{id}");
        }
        let v = c.command(TimestampMs(t), &jdoe_lease(17, 17, t, 650));
        assert_eq!(v.code, AckCode::TooMany);
        assert_eq!(
            v.detail,
            "this host already holds 16 leases of operators and facility systems, its most"
        );
        let cooling = lease_frame(1, t, &[(GpuSelector::All, 300)], 30_000);
        let v = c.command(TimestampMs(t), &cooling);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        let targets = c.targets(TimestampMs(t));
        assert!(targets.iter().all(|g| g.limit == Watts(300)), "{targets:?}");
        assert!(targets.iter().all(|g| g.source == Some(CapSource::Cooling)));
    }
}

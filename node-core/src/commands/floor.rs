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
//! The stamp is raised only by a command fresh on this host's clock (one
//! refused as stale raises the seq alone): a stamp far ahead, from a
//! sender's clock gone wrong for one command, would otherwise hold every
//! later command of that sender at or below it, and the floor kept in
//! flash would hold them after a restart too.
//!
//! Glossary:
//! - *seq-only floor*: the number alone an earlier version kept, or the
//!   floor of a sender whose commands seen were all stale: its stamp is
//!   [`NO_STAMP`], none known, and every command at or below its seq is a
//!   replay whatever its stamp (the earlier rule), until a fresh command
//!   above its seq is taken, whose stamp it takes from then on.
//! - *start floor*: this host's start ([`CommandCore::set_started`]), the
//!   floor of a sender with none kept from before it (state volatile, a
//!   record unreadable): every command it stamped before the start is
//!   a replay, whatever its seq, for as long as the host runs. It is
//!   kept in steady time and a stamp is turned into steady time to be
//!   compared with it, so a step of this host's wall clock since the
//!   start (booted ahead, then set right by NTP) moves it too.

use loopwarden_protocol::{AckCode, Frame, NodeId, ReplayFloor, TimestampMs};

use super::{stale, CommandCore, Verdict};

/// The stamp of a seq-only floor: none known. No stamp is after it, so
/// every command at or below the floor's seq is a replay; it is kept in
/// flash as it is, and read back as seq-only again. No command taken has
/// it: a command is taken only within
/// [`COMMAND_MAX_AGE_MS`](super::COMMAND_MAX_AGE_MS) of this host's clock.
pub const NO_STAMP: TimestampMs = TimestampMs(u64::MAX);

/// Raises `floor` by a command numbered `seq`, stamped `time` if that
/// stamp counts (`None`: refused as stale, its seq alone counts). A
/// seq-only floor takes its first stamp from a command above its seq.
fn lift(floor: &mut ReplayFloor, seq: u32, time: Option<TimestampMs>) {
    match time {
        Some(t) if floor.time == NO_STAMP => {
            if seq > floor.seq {
                *floor = ReplayFloor::new(seq, t);
            }
        }
        Some(t) => floor.raise(seq, t),
        None => floor.seq = floor.seq.max(seq),
    }
}

/// `frame`, received at `now`, refused as a replay (`below`: of which
/// floor). Stale as well, its sender's clock is the likelier cause (a
/// laptop set by hand, a VM resumed), said first.
fn replay(now: TimestampMs, frame: &Frame, below: String) -> Verdict {
    match stale(now, frame) {
        Some(mut v) => {
            v.detail = format!("{}; and its {below}", v.detail);
            v
        }
        None => Verdict::refuse(AckCode::Replayed, below),
    }
}

impl CommandCore {
    /// The refusal of `frame` received at `now` as a replay, if it is one:
    /// at or below its sender's floor on both its seq and its stamp, or,
    /// from a sender with none, stamped before this host's start.
    pub(super) fn replayed(&self, now: TimestampMs, frame: &Frame) -> Option<Verdict> {
        if let Some(refused) = self.before_start(now, frame) {
            return Some(refused);
        }
        let floor = self.floors.get(&frame.sender)?;
        if !floor.replays(frame.seq, frame.time) {
            return None;
        }
        let below = if floor.time == NO_STAMP {
            format!(
                "seq {} is not above seq {}, the highest taken from {} (no stamp of it known)",
                frame.seq,
                floor.seq,
                frame.sender.id.as_str()
            )
        } else {
            format!(
                "seq {} stamped {} is not above seq {} or stamp {}, the highest taken from {}",
                frame.seq,
                frame.time.0,
                floor.seq,
                floor.time.0,
                frame.sender.id.as_str()
            )
        };
        Some(replay(now, frame, below))
    }

    /// The refusal of `frame`, from a sender with no floor kept from
    /// before this host's start, as signed before the start: the
    /// start floor. It holds whatever that sender's floor since: a sender
    /// that lost its counter numbers its first command after the start
    /// below those captured before it.
    fn before_start(&self, now: TimestampMs, frame: &Frame) -> Option<Verdict> {
        if self.kept.contains(&frame.sender) {
            return None;
        }
        // On steady time: a step of this host's clock since its start
        // (one booted ahead, then set right) moves the start with it.
        let started = self.started.filter(|s| self.steady(frame.time) < *s)?;
        // Said first: an ack's detail holds 96 bytes. The start as this
        // host's wall clock now gives it, to be read against the stamp.
        let below = format!(
            "signed before this host's start (no floor kept): stamp {}, start {}",
            frame.time.0,
            started.0.saturating_add_signed(self.wall_offset)
        );
        Some(replay(now, frame, below))
    }

    /// A command numbered `seq` and stamped `time` was taken from
    /// `sender` (or one taken before a restart is taken back), or passed
    /// the seq check and was refused later (`time` `None` where it was
    /// refused as stale: its stamp does not count): its floor rises to it
    /// where it is higher, never lower.
    pub(super) fn raise_floor(&mut self, sender: &NodeId, seq: u32, time: Option<TimestampMs>) {
        match self.floors.get_mut(sender) {
            Some(f) => lift(f, seq, time),
            None => {
                let floor = ReplayFloor::new(seq, time.unwrap_or(NO_STAMP));
                self.floors.insert(sender.clone(), floor);
            }
        }
    }

    /// Takes back a floor kept before a restart
    /// ([`CommandCore::replay_floor`]): commands from `sender` at or below
    /// it are replays, and the start floor is not its
    /// ([`CommandCore::set_started`]). One already taken rises to it. A
    /// floor kept
    /// seq-only ([`NO_STAMP`]) is taken back so.
    pub fn restore_replay_floor(&mut self, sender: &NodeId, floor: ReplayFloor) {
        if floor.time == NO_STAMP {
            self.restore_seq_floor(sender, floor.seq);
        } else {
            self.kept.insert(sender.clone());
            self.raise_floor(sender, floor.seq, Some(floor.time));
        }
    }

    /// Takes back a seq-only floor (an earlier version kept no stamp):
    /// every command from `sender` numbered at or below `seq` is a replay,
    /// whatever its stamp, as it was before the restart; the first fresh
    /// command above it gives the floor its stamp, from which a sender
    /// that lost its counter is taken by its stamp. A floor already taken
    /// back with a stamp and a seq at or above `seq` holds as it is.
    pub fn restore_seq_floor(&mut self, sender: &NodeId, seq: u32) {
        self.kept.insert(sender.clone());
        let floor = self
            .floors
            .entry(sender.clone())
            .or_insert(ReplayFloor::new(seq, NO_STAMP));
        if floor.time == NO_STAMP || seq > floor.seq {
            *floor = ReplayFloor::new(floor.seq.max(seq), NO_STAMP);
        }
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
    /// before.
    #[test]
    fn a_floor_taken_back_keeps_both() {
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
    }

    /// A seq-only floor (an earlier version's, read back whatever this
    /// host's clock said at its start) refuses every command at or below
    /// its seq, stamped before or after; the first command above it gives
    /// it a stamp, from which a sender that lost its counter is taken.
    #[test]
    fn a_seq_only_floor_refuses_every_command_at_or_below_it_until_one_above_is_taken() {
        let t = 1_800_000_000_000;
        let all = [(GpuSelector::All, 400)];
        let sender = lease_frame(9, t, &all, 30_000).sender;
        let mut c = core();
        c.restore_seq_floor(&sender, 1_000);
        for (seq, stamp) in [(999, t - 10_000), (1_000, t + 60_000), (5, t)] {
            let v = c.command(TimestampMs(t), &lease_frame(seq, stamp, &all, 30_000));
            assert_eq!(v.code, AckCode::Replayed, "seq {seq}: {}", v.detail);
        }
        let v = c.command(TimestampMs(t), &lease_frame(999, t - 10_000, &all, 30_000));
        assert_eq!(
            v.detail,
            "seq 999 is not above seq 1000, the highest taken from cdu-a (no stamp of it known)"
        );
        // Kept in flash as it is, it reads back seq-only.
        let kept = c.replay_floor(&sender).unwrap();
        assert_eq!(kept, ReplayFloor::new(1_000, NO_STAMP));
        let mut again = core();
        again.restore_replay_floor(&sender, kept);
        let v = again.command(TimestampMs(t), &lease_frame(999, t + 1, &all, 30_000));
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        // One stale above it counts its seq, not its stamp.
        let ahead = lease_frame(1_001, u64::MAX, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t), &ahead).code, AckCode::Expired);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_001, NO_STAMP))
        );
        // The first fresh one above it: the floor has its stamp, and the
        // sender that lost its counter since is taken by its stamp.
        let above = lease_frame(1_002, t, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t), &above).code, AckCode::Ok);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_002, TimestampMs(t)))
        );
        let lost = lease_frame(10, t + 10_000, &all, 30_000);
        let v = c.command(TimestampMs(t + 10_000), &lost);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        // A seq-only floor above a floor with its stamp: seq-only; at or
        // below it, the floor keeps its stamp.
        let mut c = core();
        c.restore_replay_floor(&sender, ReplayFloor::new(1_000, TimestampMs(t)));
        c.restore_seq_floor(&sender, 1_000);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_000, TimestampMs(t)))
        );
        c.restore_seq_floor(&sender, 1_001);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_001, NO_STAMP))
        );
    }

    /// A command refused as stamped far ahead (a CDU's clock wrong for a
    /// moment) counts its seq but not its stamp: the CDU, having lost its
    /// counter later, is still taken by its stamp.
    #[test]
    fn a_command_refused_as_stale_never_raises_the_stamp() {
        let t = 1_800_000_000_000;
        let all = [(GpuSelector::All, 400)];
        let mut c = core();
        let first = lease_frame(1_000, t, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t), &first).code, AckCode::Ok);
        let ahead = lease_frame(1_001, u64::MAX, &all, 30_000);
        let v = c.command(TimestampMs(t), &ahead);
        assert_eq!(v.code, AckCode::Expired, "{}", v.detail);
        let sender = first.sender.clone();
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_001, TimestampMs(t)))
        );
        let behind = lease_frame(1_002, t - 3_600_000, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t), &behind).code, AckCode::Expired);
        let lost = lease_frame(10, t + 10_000, &all, 30_000);
        let v = c.command(TimestampMs(t + 10_000), &lost);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_002, TimestampMs(t + 10_000)))
        );
        // A first command seen from a sender, stale: its seq holds, with
        // no stamp known.
        let mut c = core();
        assert_eq!(c.command(TimestampMs(t), &ahead).code, AckCode::Expired);
        assert_eq!(
            c.replay_floor(&sender),
            Some(ReplayFloor::new(1_001, NO_STAMP))
        );
    }

    /// A host started at `t` with no floor kept for a sender (its state
    /// volatile, or the floor's record unreadable): what that sender
    /// signed before the start (a release taken before the restart,
    /// captured and sent again while still fresh) is a replay; neither a
    /// stale command, nor one taken back from the log, nor one taken
    /// after the start numbered below it lowers that floor. A floor kept
    /// is gone by alone.
    #[test]
    fn a_sender_with_no_floor_kept_is_floored_at_the_hosts_start() {
        let t = 1_800_000_000_000;
        let all = [(GpuSelector::All, 400)];
        let mut c = core();
        c.set_started(TimestampMs(t));
        let before = lease_frame(7, t - 60_000, &all, 600_000);
        let v = c.command(TimestampMs(t + 1_000), &before);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        assert_eq!(
            v.detail,
            format!(
                "signed before this host's start (no floor kept): stamp {}, start {t}",
                t - 60_000
            )
        );
        let just_before = lease_frame(8, t - 1, &all, 30_000);
        let v = c.command(TimestampMs(t), &just_before);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        assert!(c.restore(TimestampMs(t), TimestampMs(t - 60_000), &before));
        let ahead = lease_frame(9, u64::MAX, &all, 30_000);
        assert_eq!(c.command(TimestampMs(t), &ahead).code, AckCode::Expired);
        let between = lease_frame(8, t - 30_000, &all, 30_000);
        let v = c.command(TimestampMs(t + 1_000), &between);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        let after = lease_frame(3, t, &all, 30_000);
        let v = c.command(TimestampMs(t + 2_000), &after);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert_eq!(
            c.replay_floor(&after.sender),
            Some(ReplayFloor::new(9, TimestampMs(t)))
        );
        assert_eq!(
            c.command(TimestampMs(t + 2_000), &before).code,
            AckCode::Replayed
        );
        // A floor kept: a command above it, signed before the start and
        // not taken yet (sent again from its sender's outbox), is taken.
        let mut kept = core();
        kept.set_started(TimestampMs(t));
        kept.restore_replay_floor(&before.sender, ReplayFloor::new(6, TimestampMs(t - 90_000)));
        let v = kept.command(TimestampMs(t + 1_000), &before);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
    }

    /// The start floor is kept in steady time: a host that started with
    /// its clock an hour ahead (its RTC in local time, a VM resumed),
    /// then stepped back, takes a command its signer stamped after the
    /// start at once; one that started an hour behind, then stepped
    /// forward, still refuses what was signed before its start.
    #[test]
    fn the_start_floor_follows_a_step_of_this_hosts_clock() {
        let t = 1_800_000_000_000;
        let all = [(GpuSelector::All, 400)];
        let hour: u64 = 3_600_000;
        let mut ahead = core();
        ahead.set_started(TimestampMs(t));
        ahead.set_wall_offset(-(hour as i64));
        let f = lease_frame(7, t - hour + 10_000, &all, 30_000);
        let v = ahead.command(TimestampMs(t - hour + 10_500), &f);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        let before = lease_frame(8, t - hour - 1, &all, 30_000);
        let v = ahead.command(TimestampMs(t - hour + 10_500), &before);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        let mut behind = core();
        behind.set_started(TimestampMs(t));
        behind.set_wall_offset(hour as i64);
        let before = lease_frame(7, t + hour - 60_000, &all, 600_000);
        let v = behind.command(TimestampMs(t + hour + 1_000), &before);
        assert_eq!(v.code, AckCode::Replayed, "{}", v.detail);
        assert_eq!(
            v.detail,
            format!(
                "signed before this host's start (no floor kept): stamp {}, start {}",
                t + hour - 60_000,
                t + hour
            )
        );
        let after = lease_frame(8, t + hour, &all, 30_000);
        let v = behind.command(TimestampMs(t + hour + 1_000), &after);
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
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

    /// The CDU renumbered its hosts more often than its leases lapse: its
    /// ninth cooling lease id is taken, in the place of its oldest, and
    /// the ack says which it replaced.
    #[test]
    fn the_cdus_ninth_cooling_lease_is_taken_in_the_place_of_its_oldest() {
        let mut c = core();
        let t = 1_800_000_000_000;
        let frame = |seq: u32, id: u32, watts: u32| {
            let mut f = lease_frame(seq, t, &[], 600_000);
            f.message = Message::CapLease(samples::cooling_lease(
                id,
                &[(GpuSelector::All, watts)],
                600_000,
            ));
            f.sign(&own(), 1, &key()).unwrap();
            f
        };
        for id in 1..=8 {
            let v = c.command(TimestampMs(t), &frame(id, id, 250));
            assert_eq!((v.code, v.detail.as_str()), (AckCode::Ok, ""), "{id}");
        }
        let v = c.command(TimestampMs(t), &frame(9, 9, 400));
        assert_eq!(v.code, AckCode::Ok, "{}", v.detail);
        assert_eq!(
            v.detail,
            "it replaced cooling lease 1, the least recently renewed of the 8 this host holds at most"
        );
        let ids: Vec<u32> = c.leases().iter().map(|l| l.lease).collect();
        assert_eq!(ids, [2, 3, 4, 5, 6, 7, 8, 9]);
    }
}

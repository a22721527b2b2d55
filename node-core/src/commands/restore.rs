//! Leases taken back after a restart ([`CommandCore::restore`]): each
//! checked again against the keyring and its signer's rights, and held
//! under the rules it was taken with; what differs from it is said.

use loopwarden_protocol::{AckCode, Frame, Message, TimestampMs};

use super::{gpu_list, runs_from, CommandCore};

impl CommandCore {
    /// Takes back a lease logged before a restart, without the checks of
    /// a live command (it passed them when it came); one that has expired
    /// since is dropped. Returns whether it still holds.
    /// Its signature and its signer's rights are checked again: a lease
    /// whose key has left the keyring since is not taken back.
    /// Only a lease that was taken is logged, so one expired since was a
    /// renewal that replaced its sender's lease of the same id, and ends
    /// that one too: a lease shortened by its renewal is not back at its
    /// first length after a restart.
    /// It is taken back under the rules it was taken with
    /// ([`CapArbiter::restore`]); what differs from it, and a lease not
    /// ended yet dropped, is said ([`CommandCore::restore_notes`]).
    /// `taken`: when this host took it (its clock), from which it ran as
    /// at its arrival ([`runs_from`]); a record that does not say gives
    /// the frame's stamp.
    pub fn restore(&mut self, now: TimestampMs, taken: TimestampMs, frame: &Frame) -> bool {
        let lease = match &frame.message {
            Message::CapLease(l) => Some(l),
            _ => None,
        };
        if let Some(l) = lease {
            // A later renewal of the same lease says what holds now.
            let key = (frame.sender.clone(), l.lease);
            self.restore_notes.retain(|(k, _)| *k != key);
        }
        let refused = match self.authenticate(frame) {
            Err(e) => Some(e),
            Ok(()) => self.authority.forbids(frame),
        };
        let from = runs_from(taken.min(now), frame.time);
        if let Some(why) = refused {
            // One ended anyway (as asked or the longest taken): unsaid.
            let longest = from.after(self.arbiter.limits().max_duration);
            if lease.is_some_and(|l| from.after(l.duration).min(longest) > now) {
                self.restore_note(frame, format!("not taken back: {why}"));
            }
            return false;
        }
        self.raise_floor(&frame.sender, frame.seq, Some(frame.time));
        let Some(lease) = lease else {
            return false;
        };
        let (at, sent) = (self.steady(now), self.steady(from));
        let outcome = self.arbiter.restore(at, &frame.sender, sent, lease);
        let mut notes = Vec::new();
        if outcome.missing != 0 {
            notes.push(format!(
                "its caps on GPU(s) {} left out: {}",
                gpu_list(outcome.missing),
                self.no_such_gpu(outcome.missing.trailing_zeros() as u8)
            ));
        }
        let held = match outcome.code {
            AckCode::Ok | AckCode::Clamped => true,
            AckCode::Expired => {
                self.arbiter.forget(&frame.sender, lease.lease);
                // Ended only by this host's longest (shortened when taken,
                // or the longest lowered since), its asked end still to
                // come: said, as the sender may hold it in force.
                if sent.after(lease.duration) > at {
                    self.restore_note(
                        frame,
                        format!(
                            "not taken back: it ran {} ms since its sending, this host's \
                             longest lease now ({} s before the end it asked)",
                            self.arbiter.limits().max_duration.0,
                            sent.after(lease.duration).0.saturating_sub(at.0) / 1000
                        ),
                    );
                }
                return false;
            }
            _ => false,
        };
        if held && outcome.shortened {
            let limits = self.arbiter.limits();
            notes.push(format!(
                "taken back for {} s, not the {} s it had left: this host takes leases of at most {} ms from their sending",
                sent.after(limits.max_duration).0.saturating_sub(at.0) / 1000,
                sent.after(lease.duration).0.saturating_sub(at.0) / 1000,
                limits.max_duration.0
            ));
        }
        if held && outcome.over_count {
            notes.push(format!(
                "taken back beyond the {} leases of its kind this host now holds at most (new ones are refused until some lapse)",
                self.arbiter.most_leases(lease.source)
            ));
        }
        match outcome.code {
            _ if held => {}
            AckCode::UnknownGpu => notes.push("not taken back: it caps no GPU of this host".into()),
            code => notes.push(format!("not taken back ({code:?})")),
        }
        if !notes.is_empty() {
            self.restore_note(frame, notes.join("; "));
        }
        held
    }

    /// Says of the lease in `frame`, taken back after a restart, `what`
    /// (nothing for another command).
    fn restore_note(&mut self, frame: &Frame, what: String) {
        let Message::CapLease(l) = &frame.message else {
            return;
        };
        let line = format!(
            "lease {} from {}/{} (seq {}, for {}) {what}",
            l.lease,
            frame.sender.role.as_str(),
            frame.sender.id.as_str(),
            frame.seq,
            l.source
        );
        self.restore_notes
            .push(((frame.sender.clone(), l.lease), line));
    }

    /// What became of the leases taken back after a restart that differs
    /// from them, in words, once each (see [`CommandCore::restore`]);
    /// emptied.
    pub fn restore_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.restore_notes)
            .into_iter()
            .map(|(_, line)| line)
            .collect()
    }
}

//! The limits the agent may have left on a GPU after sets whose
//! read-back failed ([`Unconfirmed`]).

use loopwarden_protocol::Watts;

use super::KeptLimit;

/// How many limits asked since the last good read [`Unconfirmed`] keeps.
pub(super) const ASKED_MAX: usize = 8;

/// Sets whose read-back failed: what the agent may have left on the GPU
/// until its limit is read again. Each limit asked since the last good
/// read (a set past its deadline may land late, after a later one that
/// was never made), distinct, the latest last; past [`ASKED_MAX`] the
/// oldest is let go, said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unconfirmed {
    /// The limits asked for (the first `len`).
    asked: [Watts; ASKED_MAX],
    len: usize,
    /// The limit last read from the GPU before them (`None`: not known).
    read: Option<Watts>,
}

impl Unconfirmed {
    /// `limit` asked, its read-back failed, after those asked of `was`
    /// since the last good read, `read` before them. Whether one asked
    /// before was let go (the oldest) to make room.
    pub(super) fn asking(
        was: Option<Unconfirmed>,
        read: Option<Watts>,
        limit: Watts,
    ) -> (Self, bool) {
        let mut u = was.unwrap_or(Self {
            asked: [limit; ASKED_MAX],
            len: 0,
            read,
        });
        let mut kept: Vec<Watts> = u.asked().iter().copied().filter(|&w| w != limit).collect();
        let dropped = kept.len() == ASKED_MAX;
        if dropped {
            kept.remove(0);
        }
        kept.push(limit);
        u.len = kept.len();
        u.asked[..u.len].copy_from_slice(&kept);
        (u, dropped)
    }

    /// `limit` asked of a GPU not read since the start, its read-back
    /// failed: what the flash kept for it (`kept`) may be on it still, so
    /// it stays beside `limit`. The limit last asked before the restart
    /// stands for the one read (a record written now keeps it), the one
    /// before it as asked; the ceiling is kept apart (and no limit asked
    /// is above it).
    pub(super) fn from_kept(kept: KeptLimit, limit: Watts) -> (Self, bool) {
        let read = Some(kept.asked);
        let was = kept
            .before
            .filter(|&b| b != kept.asked && b != limit)
            .map(|b| Self::asking(None, read, b).0);
        Self::asking(was, read, limit)
    }

    /// The limit read before the first of them (`None`: not known).
    pub(super) fn read(&self) -> Option<Watts> {
        self.read
    }

    /// The limits asked, the latest last.
    pub(super) fn asked(&self) -> &[Watts] {
        &self.asked[..self.len]
    }

    /// The limit asked last.
    pub(super) fn last(&self) -> Watts {
        self.asked()[self.len - 1]
    }

    /// Whether `found` is one the agent may have left.
    pub(super) fn left(&self, found: Watts) -> bool {
        self.read == Some(found) || self.asked().contains(&found)
    }

    /// The lowest the agent may have left (`None`: not known).
    pub(super) fn lowest(&self) -> Option<Watts> {
        let asked = self.asked().iter().min().copied();
        self.read.and_then(|r| asked.map(|a| a.min(r)))
    }

    /// In words.
    pub(super) fn words(&self) -> String {
        let asked = self
            .asked()
            .iter()
            .map(|w| format!("{} W", w.0))
            .collect::<Vec<_>>()
            .join(", ");
        match self.read {
            Some(r) => format!("{} W, or {asked} asked and not read back", r.0),
            None => format!("{asked} asked and not read back"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_asked_is_left_until_the_oldest_is_let_go() {
        let (mut u, dropped) = Unconfirmed::asking(None, Some(Watts(700)), Watts(675));
        assert!(!dropped);
        for w in [650, 675, 625] {
            (u, _) = Unconfirmed::asking(Some(u), None, Watts(w));
        }
        assert_eq!(u.asked(), [Watts(650), Watts(675), Watts(625)], "distinct");
        assert_eq!(
            (u.read(), u.last(), u.lowest()),
            (Some(Watts(700)), Watts(625), Some(Watts(625)))
        );
        assert!(u.left(Watts(700)) && u.left(Watts(650)) && !u.left(Watts(600)));
        for w in 0..5 {
            let (next, dropped) = Unconfirmed::asking(Some(u), None, Watts(500 + w));
            assert!(!dropped, "{w}");
            u = next;
        }
        let (u, dropped) = Unconfirmed::asking(Some(u), None, Watts(400));
        assert!(dropped, "a ninth");
        assert!(!u.left(Watts(650)) && u.left(Watts(675)) && u.left(Watts(400)));
        assert_eq!(u.words().matches(" W").count(), ASKED_MAX + 1);
        // Asked of a GPU unread since the start: every kept limit stays,
        // the one asked last before the restart as the one read.
        let kept = KeptLimit {
            ceiling: Watts(700),
            asked: Watts(500),
            before: Some(Watts(600)),
        };
        let (u, dropped) = Unconfirmed::from_kept(kept, Watts(450));
        assert!(!dropped);
        assert_eq!((u.read(), u.last()), (Some(Watts(500)), Watts(450)));
        assert!([600, 500, 450].iter().all(|&w| u.left(Watts(w))));
        assert_eq!(u.lowest(), Some(Watts(450)));
        let uncapped = KeptLimit {
            asked: Watts(700),
            before: None,
            ..kept
        };
        let u = Unconfirmed::from_kept(uncapped, Watts(450)).0;
        assert_eq!((u.read(), u.asked()), (Some(Watts(700)), &[Watts(450)][..]));
        assert_eq!(u.lowest(), Some(Watts(450)), "known: cap-downs go on");
        let none = Unconfirmed::asking(None, None, Watts(400)).0;
        assert_eq!(none.lowest(), None, "nothing read before: not known");
        assert_eq!(none.words(), "400 W asked and not read back");
    }
}

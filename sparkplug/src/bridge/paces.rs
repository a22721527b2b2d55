//! The paces of devices forgotten (dead and unheard past [`PACE_MAX_MS`]),
//! kept so that one heard again is judged by its pace, not as a new
//! device: a slow sampler back after a long absence is not declared dead
//! between its first two samples. At most `--max-devices` are kept, the
//! one forgotten longest ago making room.
//!
//! Glossary:
//! - *pace*: the gaps between a device's last two samples and last two
//!   states, which set its silence limit.
//!
//! [`PACE_MAX_MS`]: super::PACE_MAX_MS

use std::collections::BTreeMap;

use loopwarden_protocol::{Ident, Role};

use super::devices::Device;

/// What is kept of a forgotten device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    role: Role,
    sample_gap: Option<u64>,
    state_gap: Option<u64>,
}

impl Device {
    /// Its pace, if one is known.
    pub(super) fn pace(&self) -> Option<Pace> {
        let (sample_gap, state_gap) = (self.sample_gap, self.state_gap);
        (sample_gap.is_some() || state_gap.is_some()).then_some(Pace {
            role: self.role,
            sample_gap,
            state_gap,
        })
    }

    /// The device with the pace it had when forgotten, if of its role:
    /// its next two samples measure it again.
    pub(super) fn with_pace(mut self, pace: Option<Pace>) -> Self {
        if let Some(p) = pace.filter(|p| p.role == self.role) {
            (self.sample_gap, self.state_gap) = (p.sample_gap, p.state_gap);
        }
        self
    }
}

/// The paces of forgotten devices, at most `max`.
pub(super) struct Paces {
    /// Each one's pace, and the order it was kept in.
    by_id: BTreeMap<Ident, (u64, Pace)>,
    /// The ids by the order they were kept in, oldest first.
    order: BTreeMap<u64, Ident>,
    next: u64,
    max: usize,
}

impl Paces {
    pub(super) fn new(max: usize) -> Self {
        Paces {
            by_id: BTreeMap::new(),
            order: BTreeMap::new(),
            next: 0,
            max,
        }
    }

    /// Keeps the pace of a device forgotten (none if it had none), the
    /// oldest kept making room past `max`.
    pub(super) fn keep(&mut self, id: Ident, pace: Option<Pace>) {
        self.take(&id);
        let Some(pace) = pace else {
            return;
        };
        while self.by_id.len() >= self.max {
            let Some((_, oldest)) = self.order.pop_first() else {
                return;
            };
            self.by_id.remove(&oldest);
        }
        self.order.insert(self.next, id.clone());
        self.by_id.insert(id, (self.next, pace));
        self.next += 1;
    }

    /// The pace of a device forgotten, heard again: no longer kept.
    pub(super) fn take(&mut self, id: &Ident) -> Option<Pace> {
        let (at, pace) = self.by_id.remove(id)?;
        self.order.remove(&at);
        Some(pace)
    }

    /// How many are kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace(gap: u64) -> Option<Pace> {
        Some(Pace {
            role: Role::Host,
            sample_gap: Some(gap),
            state_gap: None,
        })
    }

    #[test]
    fn the_paces_kept_are_bounded_the_oldest_making_room() {
        let mut paces = Paces::new(2);
        let id = |s: &str| Ident::new(s).unwrap();
        paces.keep(id("h1"), pace(1_000));
        paces.keep(id("h2"), pace(2_000));
        paces.keep(id("h3"), pace(3_000));
        assert_eq!(paces.len(), 2);
        assert_eq!(paces.take(&id("h1")), None, "the oldest made room");
        assert_eq!(paces.take(&id("h3")), pace(3_000));
        assert_eq!(paces.take(&id("h3")), None, "taken once");
        paces.keep(id("h4"), None);
        assert_eq!(paces.len(), 1, "no pace, nothing kept");
        assert_eq!(paces.take(&id("h2")), pace(2_000));
    }
}

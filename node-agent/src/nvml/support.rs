//! What one GPU answers "not supported" for, and whether it answered
//! before: a GPU that lacks a counter is told from one that lost it.
//!
//! Every NVML call and field value the agent asks for is an *item*. An
//! item that says "not supported" before it ever answered is
//! *unsupported*: the GPU lacks it. It is said once and not asked again
//! until a reprobe. An item that answered and then says "not supported"
//! (a driver change, a GPU in a bad state) is *lost*: a sensor gone, said
//! once as a warning, reported unsupported like the first, and asked
//! again at every scheduled read of the slow counters, so it comes back
//! when it answers again, without waiting for a driver reload.
//!
//! An item that fails with an NVML error that leaves the GPU readable
//! (`nvml::sample` says which) changes no state here: it is asked again at
//! its next read. What is kept is which errors each item was said to fail
//! with, so each (item, error) is said once, until a reprobe.
//!
//! Glossary:
//! - *item*: one NVML call (by its bit in `nvml::call`), one field value
//!   (by its id), or the field-value query as a whole.
//! - *unsupported*: said "not supported" and never answered.
//! - *lost*: answered, then said "not supported".
//! - *failed*: answered an NVML error other than "not supported".
//! - *reprobe*: forgetting every answer, so everything is asked again.

use std::collections::{BTreeMap, BTreeSet};

/// One thing asked of NVML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Item {
    /// A single call, by its bit in `nvml::call`.
    Call(u16),
    /// One field value of the batched query, by its id.
    Field(u32),
    /// The batched field-value query itself.
    FieldsCall,
}

/// What an item answered last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Answered,
    Unsupported,
    /// `asking`: asked again at the next chance.
    Lost {
        asking: bool,
    },
}

/// A change worth saying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// Not supported, never answered.
    Unsupported,
    /// Answered before, not supported now.
    Lost,
    /// Lost, and answers again.
    Back,
}

/// Every item's last answer, for one GPU.
#[derive(Debug, Clone, Default)]
pub(super) struct Support {
    items: BTreeMap<Item, State>,
    /// Every item and NVML's words it was said to have failed with.
    failures_said: BTreeSet<(Item, String)>,
}

impl Support {
    /// Whether `item` is to be asked now.
    pub(super) fn asks(&self, item: Item) -> bool {
        match self.items.get(&item) {
            None | Some(State::Answered) => true,
            Some(State::Unsupported) => false,
            Some(State::Lost { asking }) => *asking,
        }
    }

    /// `item` answered; `Back` when it was lost.
    pub(super) fn answered(&mut self, item: Item) -> Option<Change> {
        match self.items.insert(item, State::Answered) {
            Some(State::Lost { .. }) => Some(Change::Back),
            _ => None,
        }
    }

    /// `item` said "not supported": what changed, if anything.
    pub(super) fn not_supported(&mut self, item: Item) -> Option<Change> {
        let (next, change) = match self.items.get(&item) {
            None => (State::Unsupported, Some(Change::Unsupported)),
            Some(State::Unsupported) => (State::Unsupported, None),
            Some(State::Answered) => (State::Lost { asking: false }, Some(Change::Lost)),
            Some(State::Lost { .. }) => (State::Lost { asking: false }, None),
        };
        self.items.insert(item, next);
        change
    }

    /// `item` failed with NVML's `words`: whether that is news (not said
    /// for this item and these words since the start or a reprobe).
    pub(super) fn failed(&mut self, item: Item, words: &str) -> bool {
        self.failures_said.insert((item, words.to_owned()))
    }

    /// Every lost item is asked again at the next chance.
    pub(super) fn retry_lost(&mut self) {
        for s in self.items.values_mut() {
            if let State::Lost { asking } = s {
                *asking = true;
            }
        }
    }

    /// The items that are not supported now, lost ones included.
    pub(super) fn not_supported_now(&self) -> impl Iterator<Item = Item> + '_ {
        self.items
            .iter()
            .filter(|(_, s)| **s != State::Answered)
            .map(|(i, _)| *i)
    }

    /// Forgets every answer and every failure said (a reprobe); whether
    /// any was "not supported".
    pub(super) fn forget(&mut self) -> bool {
        let any = self.not_supported_now().next().is_some();
        self.items.clear();
        self.failures_said.clear();
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_item_is_told_from_an_unsupported_one_and_asked_again_when_retried() {
        let mut s = Support::default();
        let (never, lost) = (Item::Field(82), Item::Call(1));
        assert!(s.asks(never) && s.asks(lost), "unknown items are asked");
        assert_eq!(s.not_supported(never), Some(Change::Unsupported));
        assert_eq!(s.not_supported(never), None, "said once");
        assert_eq!(s.answered(lost), None);
        assert_eq!(s.not_supported(lost), Some(Change::Lost));
        assert!(!s.asks(never) && !s.asks(lost));
        assert_eq!(s.not_supported_now().collect::<Vec<_>>(), [lost, never]);
        // A scheduled read asks the lost item again, never the other.
        s.retry_lost();
        assert!(s.asks(lost) && !s.asks(never));
        assert_eq!(s.not_supported(lost), None, "still lost: said once");
        assert!(!s.asks(lost), "until the next retry");
        s.retry_lost();
        assert_eq!(s.answered(lost), Some(Change::Back));
        assert_eq!(s.not_supported_now().collect::<Vec<_>>(), [never]);
        assert!(s.forget());
        assert!(s.asks(never));
        assert!(!s.forget());
    }

    #[test]
    fn a_failure_is_news_once_per_item_and_error_until_a_reprobe_and_changes_no_state() {
        let mut s = Support::default();
        let (ecc, field) = (Item::Call(1 << 11), Item::Field(94));
        assert!(s.failed(ecc, "the infoROM is corrupted"));
        assert!(!s.failed(ecc, "the infoROM is corrupted"), "said once");
        assert!(s.failed(ecc, "no data"), "another error is news");
        assert!(s.failed(field, "no data"), "another item is news");
        assert!(s.asks(ecc), "a failed item is asked again");
        assert_eq!(s.not_supported_now().count(), 0, "and is not unsupported");
        assert!(!s.forget());
        assert!(
            s.failed(ecc, "the infoROM is corrupted"),
            "said again after a reprobe"
        );
    }
}

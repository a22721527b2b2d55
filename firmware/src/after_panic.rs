//! What the board does after a panic, and what its console says: the
//! watchdog resets a board whose watchdog runs (it is not fed again); a
//! panic before it starts (at boot: the flash's restores, the figures,
//! the decision path's start) would otherwise hang the board for good,
//! so the core resets itself, after a pause of about the watchdog's
//! timeout on the board's clock (a panic at every boot then restarts at
//! the pace a watchdog's reset would, not as fast as it can, each start
//! counted in flash).
//!
//! Glossary:
//! - *started*: the watchdog was started (`board::watchdog::start`); it
//!   is never stopped.

/// What the panic handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Waits: the watchdog, no longer fed, resets the board.
    AwaitWatchdog,
    /// Resets the core itself after a pause: nothing else would.
    Reset,
}

/// The action after a panic and the words the console's panic line ends
/// with, the watchdog `started` or not.
pub fn after_panic(started: bool) -> (Action, &'static str) {
    if started {
        (
            Action::AwaitWatchdog,
            "the watchdog, no longer fed, resets the board",
        )
    } else {
        (
            Action::Reset,
            "the watchdog is not running yet: the board resets itself after a pause",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_before_the_watchdog_runs_resets_the_board_and_says_so() {
        let (action, words) = after_panic(false);
        assert_eq!(action, Action::Reset);
        assert!(words.contains("not running") && words.contains("resets itself"));
        let (action, words) = after_panic(true);
        assert_eq!(action, Action::AwaitWatchdog);
        assert!(words.contains("the watchdog") && words.contains("resets the board"));
    }
}

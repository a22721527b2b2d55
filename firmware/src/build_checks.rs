//! The build script's checks of the board file (`build/board.rs`, with
//! what it reads the file with, `build/input.rs`), compiled again here so
//! that their tests run with the lib's host tests
//! (`cargo test --target x86_64-unknown-linux-gnu --lib`): `cargo test`
//! never runs a build script's own tests.

#[path = "../build/input.rs"]
mod input;

// The build script writes the board out; its tests here only load it.
#[allow(dead_code)]
#[path = "../build/board.rs"]
mod board;

use input::read_toml;

#[cfg(test)]
mod tests {
    #[test]
    fn the_watchdogs_check_plans_on_the_steps_own_figures() {
        assert_eq!(
            super::board::STEP_BUDGET_MS * 1000,
            crate::budget::STEP_BUDGET_US
        );
        assert_eq!(super::board::LATCH_ITEMS, crate::budget::LATCH_ITEMS);
        assert_eq!(super::board::CLEAR_ITEMS, crate::budget::CLEAR_ITEMS);
    }
}

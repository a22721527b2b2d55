//! The agent's log as text, for tests that check what it says.
//!
//! A log line's callsite remembers whether anyone listens to it. One first
//! reached on a thread with no subscriber, while another thread sets its
//! own up to capture it, can be remembered as unheard and the capture
//! miss the line. The tests of a binary that captures lines run one at a
//! time: each takes [`one_at_a_time`] first.

use std::sync::{Mutex, MutexGuard};

/// Held for a whole test: no two tests of the binary run together.
#[allow(dead_code)] // a binary whose captured lines no other test reaches runs freely
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[path = "../../src/test_log.rs"]
mod test_log;
pub use test_log::logged;

/// The lines of `log` that hold every one of `words`.
pub fn lines_with<'a>(log: &'a str, words: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect()
}

/// Asserts that every `#[test]` of `source` (a test binary's own text)
/// takes [`one_at_a_time`] as its first line.
#[allow(dead_code)] // only the binaries that check themselves call it
pub fn every_test_takes_the_lock_first(source: &str) {
    let mut lines = source.lines();
    let mut tests = 0;
    while let Some(line) = lines.next() {
        if line.trim() != "#[test]" {
            continue;
        }
        let signature = lines.next().unwrap_or_default();
        let first = lines.next().unwrap_or_default();
        assert_eq!(
            first.trim(),
            "let _one = logs::one_at_a_time();",
            "{signature}: take the log lock first"
        );
        tests += 1;
    }
    assert!(tests > 1, "{tests} tests found");
}

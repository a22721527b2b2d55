//! A line to the gateway cut to its room.

use super::*;
use loopwarden_link::message::SAID_MAX;

/// A line past the gateway's room is cut on a character boundary and
/// marked `…`, so its reader knows words are missing; one that fits is
/// whole and unmarked.
#[test]
fn a_line_cut_to_the_gateways_room_is_marked_cut() {
    let fits = "x".repeat(SAID_MAX);
    assert_eq!(said_words(&fits).as_str(), fits);
    for long in ["y".repeat(SAID_MAX + 1), "é".repeat(SAID_MAX)] {
        let said = said_words(&long);
        assert!(said.len() <= SAID_MAX, "{} bytes", said.len());
        assert!(said.ends_with('…'), "{said}");
        let kept = said.trim_end_matches('…');
        assert!(
            long.starts_with(kept) && kept.len() >= SAID_MAX - 4,
            "{said}"
        );
    }
}

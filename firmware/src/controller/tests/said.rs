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

/// A flash that refuses the latched record, said to the gateway once;
/// the gateway starts again (its frames numbered from 0 again): the
/// next keep that fails says it again, for the restarted gateway's log,
/// then no more; the record going in is said once.
#[test]
fn a_latched_record_not_kept_is_said_again_to_a_restarted_gateway() {
    booted(|c, p| {
        let said = |p: &Fake, words: &str| {
            (p.ups.iter())
                .filter(|u| matches!(u, Up::Said { words: w, .. } if w.as_str() == words))
                .count()
        };
        for s in 0..3u64 {
            hear_numbered(c, p, &alive(s), 10 + s as u32, s * 1000);
            c.kept(p, false);
        }
        assert_eq!(said(p, super::super::LATCH_NOT_KEPT), 1);
        for s in 3..6u64 {
            hear_numbered(c, p, &alive(s), (s - 3) as u32, s * 1000);
            c.kept(p, false);
        }
        assert_eq!(c.link.restarts, 1);
        assert_eq!(said(p, super::super::LATCH_NOT_KEPT), 2, "said again once");
        c.kept(p, true);
        assert_eq!(said(p, super::super::LATCH_KEPT_AGAIN), 1);
    });
}

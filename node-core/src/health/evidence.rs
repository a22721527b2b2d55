//! Evidence text: the words a field engineer reads with a state change,
//! short enough for the bus.
//!
//! Glossary:
//! - *evidence*: why a GPU changed state, in words, with the time it was
//!   seen; at most [`EVIDENCE_MAX`] bytes.

use loopwarden_protocol::{xid, TimestampMs};

/// Evidence text fits the bus's 96 bytes.
pub(super) const EVIDENCE_MAX: usize = loopwarden_protocol::EVIDENCE_MAX;

/// A time for evidence: `t=… ms` for simulated time (replays start near
/// 0), `HH:MM:SS.mmm UTC` for wall-clock time. Formatted only when an
/// evidence is written.
#[derive(Debug, Clone, Copy)]
pub struct At(pub TimestampMs);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0 .0;
        if t < 100_000_000_000 {
            write!(f, "t={t} ms")
        } else {
            let ms = t % 86_400_000;
            write!(
                f,
                "{:02}:{:02}:{:02}.{:03} UTC",
                ms / 3_600_000,
                ms / 60_000 % 60,
                ms / 1000 % 60,
                ms % 1000
            )
        }
    }
}

/// [`At`] as a string.
pub fn fmt_time(t: TimestampMs) -> String {
    At(t).to_string()
}

/// `s` cut to [`EVIDENCE_MAX`] bytes (on a character boundary, ending in
/// `...`) when it is longer.
pub(super) fn fit(mut s: String) -> String {
    if s.len() > EVIDENCE_MAX {
        s.truncate(EVIDENCE_MAX - 3);
        while !s.is_char_boundary(s.len()) {
            s.pop();
        }
        s.push_str("...");
    }
    s
}

/// A short name of an XID for evidence: the catalog's meaning up to its
/// first colon or semicolon.
pub(super) fn xid_words(code: u16) -> String {
    match xid::lookup(code) {
        Some(x) => {
            let m = x.meaning.split([':', ';']).next().unwrap_or(x.meaning);
            m.trim().to_string()
        }
        None => "not in the catalog".into(),
    }
}

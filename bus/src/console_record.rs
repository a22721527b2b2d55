//! What the serial console leaves in the agent's flash log: each session
//! opened and closed, each login accepted or refused, each state-changing
//! command and its result.
//!
//! These records stay on the agent (they are not bus messages): kind
//! [`CONSOLE_RECORD`] in the event log, the body the record as JSON.
//! Both agents' `ctl events` and `lwbus flash` show them as sentences
//! (`serial console /dev/ttyS1: login refused (2 in a row)`), and with
//! `--json` as `{"console": …}`. The serial console that writes them is
//! `loopwarden_field::serial`.
//!
//! Glossary:
//! - *port*: the serial device the session came in on (`/dev/ttyS1`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The event-log kind of a console record: outside the protocol's
/// message kinds (1 to 9) and the log's own markers (0xF0); declared with
/// the recorder.
pub use loopwarden_store::recorder::CONSOLE_RECORD;

/// The longest command result kept, in characters.
const RESULT_MAX: usize = 300;

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// `logout`, `exit` or `quit`.
    Logout,
    /// Nothing typed for the idle timeout.
    Idle,
    /// The port failed or went away.
    LineLost,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum What {
    /// Someone started typing.
    SessionOpened,
    /// The session ended.
    SessionClosed {
        /// Why.
        why: CloseReason,
        /// It was logged in when it ended.
        logged_in: bool,
    },
    /// The password was right.
    LoginAccepted,
    /// The password was wrong.
    LoginRefused {
        /// Refusals in a row, this one included.
        in_a_row: u32,
    },
    /// A state-changing command was carried out or refused.
    Command {
        /// The command as typed.
        line: String,
        /// The agent did it.
        ok: bool,
        /// What the agent answered.
        result: String,
    },
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The serial port.
    pub port: String,
    /// What happened.
    #[serde(flatten)]
    pub what: What,
}

impl Record {
    /// The record's body in the event log (JSON; a long result cut).
    pub fn encode(&self) -> Vec<u8> {
        let mut r = self.clone();
        if let What::Command { result, .. } = &mut r.what {
            if let Some((i, _)) = result.char_indices().nth(RESULT_MAX) {
                result.truncate(i);
                result.push('…');
            }
        }
        serde_json::to_vec(&r).expect("a console record serialises")
    }

    /// A body read back from the log.
    pub fn decode(body: &[u8]) -> Option<Record> {
        serde_json::from_slice(body).ok()
    }
}

/// A console record's body as the `event` of an `events` answer:
/// `{"console": {port, what, …}}`, or a note when it does not decode.
pub fn to_event(body: &[u8]) -> Value {
    match Record::decode(body) {
        Some(r) => json!({ "console": r }),
        None => json!("undecodable console record"),
    }
}

/// A console record of the event log as an entry of an `events` answer:
/// `{"seq", "time_ms", "event": {"console": …}, "text"}`, `text` the
/// record in words.
pub fn entry(seq: u32, time_ms: u64, body: &[u8]) -> Value {
    let event = to_event(body);
    let text = sentence(&event["console"]);
    json!({ "seq": seq, "time_ms": time_ms, "event": event, "text": text })
}

/// A console record (the value under `console`) in words, for the
/// events table.
pub fn sentence(v: &Value) -> String {
    let Ok(r) = serde_json::from_value::<Record>(v.clone()) else {
        return "undecodable console record".into();
    };
    let what = match r.what {
        What::SessionOpened => "session opened".to_string(),
        What::SessionClosed { why, logged_in } => format!(
            "session closed ({}){}",
            match why {
                CloseReason::Logout => "logout",
                CloseReason::Idle => "idle",
                CloseReason::LineLost => "line lost",
            },
            if logged_in { ", was logged in" } else { "" }
        ),
        What::LoginAccepted => "login accepted".to_string(),
        What::LoginRefused { in_a_row } => format!("login refused ({in_a_row} in a row)"),
        What::Command { line, ok, result } => format!(
            "{line}: {} — {result}",
            if ok { "done" } else { "not done" }
        ),
    };
    format!("serial console {}: {what}", r.port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_read_as_sentences() {
        let r = Record {
            port: "/dev/ttyS1".into(),
            what: What::SessionClosed {
                why: CloseReason::Idle,
                logged_in: true,
            },
        };
        let body = r.encode();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"port":"/dev/ttyS1","what":"session_closed","why":"idle","logged_in":true}"#
        );
        let v = to_event(&body);
        assert_eq!(
            sentence(&v["console"]),
            "serial console /dev/ttyS1: session closed (idle), was logged in"
        );
        assert_eq!(to_event(b"{"), json!("undecodable console record"));
        let e = entry(7, 9, &body);
        assert_eq!(e["event"]["console"]["why"], "idle");
        assert_eq!(
            e["text"],
            "serial console /dev/ttyS1: session closed (idle), was logged in"
        );
    }

    #[test]
    fn a_long_result_is_cut() {
        let r = Record {
            port: "p".into(),
            what: What::Command {
                line: "clear-leak 2".into(),
                ok: false,
                result: "é".repeat(1000),
            },
        };
        let back = Record::decode(&r.encode()).unwrap();
        let What::Command { result, .. } = back.what else {
            panic!("{back:?}")
        };
        assert_eq!(result.chars().count(), RESULT_MAX + 1);
        assert!(r.encode().len() < 1000);
    }
}

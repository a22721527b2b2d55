//! From a command line to an agent's request: the parts every agent's
//! serial console reads alike, so `events` takes the same arguments and
//! a wrong line gets the same usage on every agent. Pure: words in, a
//! request or why not out.
//!
//! Glossary:
//! - *words*: a command line split at white space, as the session hands
//!   it to the agent (never empty).
//! - *usage*: how a command is typed, said for a line with the wrong
//!   arguments ([`Spec::usage`]).
//! - *earlier*: the rows of the event log that `events` with no `--since`
//!   leaves out on a serial console ([`last_events`], applied to an
//!   agent's answer by [`as_serial_shows`]).

use super::session::Spec;

/// `events [--since T]`, the event log, which every agent's console
/// offers.
pub const EVENTS: Spec = Spec {
    name: "events",
    args: "[--since T]",
    summary: "the event log (T: 30s, 10m, 2h, 1d)",
    changes_state: false,
};

/// A command line as an agent matches it: the command word, lowercased,
/// and its arguments.
pub fn split(words: &[String]) -> (String, Vec<&str>) {
    let name = words
        .first()
        .map(|w| w.to_ascii_lowercase())
        .unwrap_or_default();
    let args = words.iter().skip(1).map(String::as_str).collect();
    (name, args)
}

/// The arguments of [`EVENTS`] as the time the log is asked from
/// (`None`: all of it), `now_ms` being now (ms since the epoch); its
/// usage when they are not its arguments, why when `T` is not a time.
pub fn events_since(args: &[&str], now_ms: u64) -> Result<Option<u64>, String> {
    match args {
        [] => Ok(None),
        ["--since", t] => crate::time::parse_since(t, now_ms).map(Some),
        _ => Err(Spec::usage(&[EVENTS], EVENTS.name)),
    }
}

/// Rows `events` shows on a serial console when no `--since` is given:
/// the whole log (thousands of rows, a megabyte) takes minutes at 115200
/// baud and more than twenty at 9600.
pub const EVENTS_SHOWN: usize = 200;

/// The answer `v` of `events` with no `--since`, as a serial console
/// shows it: its last [`EVENTS_SHOWN`] rows, and how many came before
/// them in `earlier` (absent when none). Any other answer (an error) as
/// it is.
pub fn last_events(mut v: serde_json::Value) -> serde_json::Value {
    let Some(events) = v.get_mut("events").and_then(|e| e.as_array_mut()) else {
        return v;
    };
    let earlier = events.len().saturating_sub(EVENTS_SHOWN);
    if earlier > 0 {
        events.drain(..earlier);
        v["earlier"] = earlier.into();
    }
    v
}

/// An agent's answer as its serial console shows it: `answer`'s value,
/// bounded by [`last_events`] when it is `events` with no `--since`
/// (`whole_log`), as it is otherwise.
pub async fn as_serial_shows(
    whole_log: bool,
    answer: impl std::future::Future<Output = serde_json::Value>,
) -> serde_json::Value {
    let v = answer.await;
    if whole_log {
        last_events(v)
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_command_word_is_lowercased_and_the_arguments_kept() {
        let w = words("Clear-Leak 2 B");
        assert_eq!(split(&w), ("clear-leak".to_string(), vec!["2", "B"]));
        assert_eq!(split(&[]), (String::new(), vec![]));
    }

    #[test]
    fn events_with_no_since_keeps_the_last_rows_and_counts_the_earlier() {
        let rows = |n: u64| {
            (0..n)
                .map(|i| serde_json::json!({"seq": i}))
                .collect::<Vec<_>>()
        };
        let v = last_events(serde_json::json!({"events": rows(250), "queued_for_flash": 1}));
        let kept = v["events"].as_array().unwrap();
        assert_eq!(kept.len(), EVENTS_SHOWN);
        assert_eq!(kept[0]["seq"], 50);
        assert_eq!(kept[EVENTS_SHOWN - 1]["seq"], 249);
        assert_eq!(v["earlier"], 50);
        assert_eq!(v["queued_for_flash"], 1);
        let v = last_events(serde_json::json!({"events": rows(200)}));
        assert_eq!(v["events"].as_array().unwrap().len(), 200);
        assert!(v.get("earlier").is_none(), "{v}");
        let e = serde_json::json!({"error": "reading the event log: gone"});
        assert_eq!(last_events(e.clone()), e);
    }

    #[tokio::test]
    async fn a_serial_console_bounds_the_whole_log_only() {
        let rows = serde_json::json!({"events": vec![serde_json::json!({}); 250]});
        let v = as_serial_shows(true, async { rows.clone() }).await;
        assert_eq!(v["events"].as_array().unwrap().len(), EVENTS_SHOWN);
        assert_eq!(v["earlier"], 50);
        let v = as_serial_shows(false, async { rows.clone() }).await;
        assert_eq!(v, rows, "an answer with --since, or not events");
    }

    #[test]
    fn events_takes_nothing_or_a_since() {
        let now = 1_000_000;
        assert_eq!(events_since(&[], now), Ok(None));
        assert_eq!(events_since(&["--since", "10s"], now), Ok(Some(990_000)));
        assert!(events_since(&["--since", "soon"], now).is_err());
        assert_eq!(
            events_since(&["--from", "10s"], now),
            Err("usage: events [--since T]".into())
        );
        assert_eq!(
            events_since(&["--since"], now),
            Err("usage: events [--since T]".into())
        );
    }
}

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

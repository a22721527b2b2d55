//! The hall's log: the bus crate's format (stderr, colours only on a
//! terminal, `RUST_LOG` or a default filter), less the embedded broker's
//! ERROR lines for clients that simply left.
//!
//! rumqttd (0.20) logs at ERROR level three things that are no error:
//! - *router-drop*: the router closed a client's link, which it does
//!   after every orderly MQTT DISCONNECT (every agent and the controller
//!   leave that way at the end of a run), error `Recv(Disconnected)`;
//! - "no-connection id N is already gone": after such a DISCONNECT the
//!   link's end brings the router a second disconnection (rumqttd's own
//!   comment says so), or a last packet, for the connection it has just
//!   removed;
//! - a connection closed before its CONNECT packet (`ConnectionAborted`,
//!   "connection closed by peer"): the embedded broker's own readiness
//!   probe, which connects once and closes.
//!
//! Only those three are dropped, and only from rumqttd; any other rumqttd
//! error (a refused or broken connection, a listener that fails, an
//! unexpected `disconnected`) still shows. The clients of a run log their
//! own connection troubles besides.
//!
//! Glossary:
//! - *link*: rumqttd's per-client connection task.

use std::fmt::Debug;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Starts the log with `default` as the filter unless `RUST_LOG` is set,
/// without rumqttd's lines for clients that left ([`is_client_leaving`]).
pub fn init(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(ClientsLeaving)
        .with(fmt)
        .try_init();
}

/// Whether a log event of `target` at `level`, with `message` and the
/// Debug text of its `error` field, is rumqttd saying that a client left
/// in order (see the module's notes).
pub fn is_client_leaving(target: &str, level: Level, message: &str, error: &str) -> bool {
    if level != Level::ERROR || !target.starts_with("rumqttd") {
        return false;
    }
    match message {
        "router-drop" => error == "Recv(Disconnected)",
        "Error while handling MQTT connect packet" => {
            error.contains("ConnectionAborted") && error.contains("connection closed by peer")
        }
        m => {
            m.strip_prefix("no-connection id ")
                .and_then(|r| r.strip_suffix(" is already gone"))
                .is_some_and(|id| id.parse::<u64>().is_ok())
                && error.is_empty()
        }
    }
}

/// The layer that drops what [`is_client_leaving`] recognises.
struct ClientsLeaving;

impl<S: Subscriber> Layer<S> for ClientsLeaving {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("rumqttd") {
            return true;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        !is_client_leaving(meta.target(), *meta.level(), &f.message, &f.error)
    }
}

/// An event's `message` and `error` fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    error: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_string(),
            "error" => self.error = value.to_string(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKER: &str = "rumqttd::server::broker";

    #[test]
    fn an_orderly_leave_and_the_readiness_probe_are_not_errors() {
        assert!(is_client_leaving(
            BROKER,
            Level::ERROR,
            "router-drop",
            "Recv(Disconnected)"
        ));
        assert!(is_client_leaving(
            BROKER,
            Level::ERROR,
            "Error while handling MQTT connect packet",
            r#"Network(Io(Custom { kind: ConnectionAborted, error: "connection closed by peer" }))"#
        ));
        assert!(is_client_leaving(
            "rumqttd::router::routing",
            Level::ERROR,
            "no-connection id 6 is already gone",
            ""
        ));
    }

    #[test]
    fn every_other_broker_error_stays() {
        for (message, error) in [
            (
                "disconnected",
                r#"Network(Io(Os { code: 104, kind: ConnectionReset, message: "Connection reset by peer" }))"#,
            ),
            (
                "Error while handling MQTT connect packet",
                "Timeout(Elapsed(()))",
            ),
            ("Remote link error", "NotConnectAck"),
            ("router-drop", "Send(Full)"),
            ("Server error - V4", "Io(AddrInUse)"),
            ("no space for new connection", ""),
            ("no-connection id x is already gone", ""),
        ] {
            assert!(
                !is_client_leaving(BROKER, Level::ERROR, message, error),
                "{message} {error}"
            );
        }
        // Not rumqttd, or not an error: never filtered here.
        assert!(!is_client_leaving(
            "loopwarden_bus",
            Level::ERROR,
            "router-drop",
            "Recv(Disconnected)"
        ));
        assert!(!is_client_leaving(
            BROKER,
            Level::WARN,
            "router-drop",
            "Recv(Disconnected)"
        ));
    }
}

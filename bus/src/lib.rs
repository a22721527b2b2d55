//! # loopwarden-bus: the MQTT shell both agents share
//!
//! A thin shell around `rumqttc` that speaks the protocol of
//! `loopwarden-protocol` and nothing else: it numbers and frames messages,
//! publishes each family with its QoS and retention, keeps a last will on
//! `online`, reconnects with backoff and jitter, bounds every queue and
//! counts every message it drops. The embedded broker (`rumqttd`) is the
//! zero-install default when no broker is configured.
//!
//! What both agents keep in flash (the flash image, the recorder thread)
//! is `loopwarden-store`, which knows no network code: [`Bus`] implements
//! its `Publisher`, through which the recorder publishes events and acks.
//!
//! Glossary:
//! - *last will*: a message the broker publishes for us when our connection
//!   dies without a goodbye (`online: false`, retained).
//! - *offline buffer*: QoS 1 publishes kept in memory across an outage.
//! - *outbox*: their power-fail-safe successor in flash (`loopwarden-flash`).

#![warn(missing_docs)]

mod backoff;
mod client;
mod config;
pub mod console_record;
mod durable;
#[cfg(feature = "embedded-broker")]
pub mod embedded;
pub mod keys;
mod metrics;
pub mod pki;
pub mod prometheus;
pub mod resend;
pub mod tls;

pub use backoff::Backoff;
pub use client::{now_ms, site_filter, AckedLedger, Bus, BusTask, Inbound, PublishError};
pub use config::{
    BrokerAddr, BrokerAddrError, Brokers, BrokersError, BusConfig, DEFAULT_PORT, MAX_PACKET_SIZE,
};
pub use durable::{DurableOutbox, Pending, StoreFailure};
pub use metrics::{Metrics, MetricsSnapshot};

/// Logs to standard error for an agent: `RUST_LOG` when set, else `info`
/// with the MQTT libraries quieted (the embedded broker off, the client's
/// warnings only); colours only when standard error is a terminal.
pub fn init_agent_logging() {
    init_logging("info,rumqttd=off,rumqttc=warn");
}

/// Logs to standard error: `RUST_LOG` when set, else `default` (an
/// `EnvFilter` directive); colours only when standard error is a terminal,
/// so a redirected log holds no escape codes.
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

//! # loopwarden-bus: the MQTT shell both agents share
//!
//! A thin shell around `rumqttc` that speaks the protocol of
//! `loopwarden-protocol` and nothing else: it numbers and frames messages,
//! publishes each family with its QoS and retention, keeps a last will on
//! `online`, reconnects with backoff and jitter, bounds every queue and
//! counts every message it drops. The embedded broker (`rumqttd`) is the
//! zero-install default when no broker is configured.
//!
//! Around it, what both agents' shells keep in flash: [`agent_flash`] (the
//! flash image, its stores, the sequence floor) and [`recorder`] (the one
//! thread that writes it and publishes events and acks through the
//! outbox).
//!
//! Glossary:
//! - *last will*: a message the broker publishes for us when our connection
//!   dies without a goodbye (`online: false`, retained).
//! - *offline buffer*: QoS 1 publishes kept in memory across an outage.
//! - *outbox*: their power-fail-safe successor in flash (`loopwarden-flash`).

#![warn(missing_docs)]

pub mod agent_flash;
mod backoff;
mod client;
mod config;
mod durable;
#[cfg(feature = "embedded-broker")]
pub mod embedded;
pub mod keys;
mod metrics;
pub mod recorder;

pub use backoff::Backoff;
pub use client::{now_ms, site_filter, Bus, BusTask, Inbound, PublishError};
pub use config::{BrokerAddr, BrokerAddrError, BusConfig, DEFAULT_PORT};
pub use durable::{DurableOutbox, Pending, StoreFailure};
pub use metrics::{Metrics, MetricsSnapshot};

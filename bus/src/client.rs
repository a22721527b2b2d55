//! The connection to the broker: one tokio task that owns the MQTT event
//! loop, and a cheap handle ([`Bus`]) the agent publishes through.
//!
//! What it guarantees:
//! - a last will on `online` (retained): the broker tells everyone when we
//!   vanish; on every (re)connection we announce `online` again; with
//!   `json_presence`, the same in the JSON tree over a second connection;
//! - QoS and retention by family, from the protocol crate, never by caller;
//! - reconnects with exponential backoff and jitter, to the next broker of
//!   its list after each failure (failover between the nodes of a
//!   clustered broker); every connection, to whichever node, announces
//!   `online` again, renews the subscriptions and the retained state;
//! - bounded queues everywhere, and a counter for every message dropped;
//! - QoS 1 publishes not yet acknowledged when the connection drops are
//!   kept (up to `offline_capacity`, oldest dropped first) and sent again
//!   after the reconnection. Telemetry is not: it is stale by then.
//!   Surviving a crash or power cut is the flash outbox's job, not this one.
//!
//! Split the way `rumqttc` splits its client:
//! - [`handle`]: the cloneable [`Bus`] that publishes, and the [`BusTask`];
//! - [`state`]: what both sides share (sequence numbers, what is pending,
//!   presence and the last will, the counters);
//! - [`event_loop`]: the task that drives `rumqttc`'s `EventLoop`:
//!   (re)connection with backoff, hand-over of kept and outbox frames,
//!   acknowledgements and inbound frames;
//! - [`presence`]: the second, light connection that keeps the JSON
//!   mirror of `online`, with its own last will (`json_presence`).

use std::time::{SystemTime, UNIX_EPOCH};

use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{Frame, Ident, MessageKind, Role, TimestampMs, Topic};

mod event_loop;
mod handle;
mod presence;
mod state;

pub use handle::{Bus, BusTask};

/// The most QoS 1 publishes in flight at once. Packet ids wrap at this
/// number; the shell never hands over more than it leaves room for, so a
/// replay after an outage cannot reuse the id of an unacknowledged publish.
const MAX_INFLIGHT: u16 = 1024;
/// Room kept for publishes the shell does not count (presence, mirrors).
const INFLIGHT_MARGIN: usize = 32;

/// A frame received from the bus, with the topic it came on.
#[derive(Debug, Clone, PartialEq)]
pub struct Inbound {
    /// Where it came from.
    pub topic: Topic,
    /// What came.
    pub frame: Frame,
}

/// Why a publish was not queued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The frame could not be encoded.
    #[error("cannot encode {kind:?} frame: {source}")]
    Encode {
        /// The message kind.
        kind: MessageKind,
        /// Why.
        source: loopwarden_protocol::EncodeError,
    },
    /// A command goes to another node's `cmd` topic: use [`Bus::send_command`].
    #[error("{0:?} is a command: send it to a node with send_command")]
    IsCommand(MessageKind),
    /// Only commands go to another node's `cmd` topic.
    #[error("{0:?} is not a command: publish it on our own topic")]
    NotACommand(MessageKind),
    /// Only hosts and CDUs own a topic subtree to publish in.
    #[error("a {0:?} node owns no topics; it can only send commands")]
    NoOwnTopics(Role),
    /// The topic could not be built.
    #[error("topic: {0}")]
    Topic(loopwarden_protocol::TopicError),
    /// Telemetry while the broker is unreachable: dropped, it would be stale.
    #[error("broker unreachable: telemetry dropped")]
    Offline,
    /// The outgoing queue is full: dropped.
    #[error("outgoing queue full: dropped")]
    QueueFull,
    /// The bus task has stopped.
    #[error("bus stopped")]
    Stopped,
    /// The outbox is full of critical frames: this one was not stored and
    /// not sent. Keep the decision in the log and retry.
    #[error("outbox full of critical frames: frame {0} not stored")]
    OutboxFull(u32),
    /// The outbox's flash failed.
    #[error("outbox: {0}")]
    Outbox(String),
    /// Shutdown ended with publishes the broker had not acknowledged (not
    /// connected, or the timeout passed); with an outbox they are still in
    /// flash and go out after the next start.
    #[error("{count} publishes not acknowledged by the broker at shutdown")]
    Unacknowledged {
        /// How many were handed over and not acknowledged.
        count: usize,
    },
}

/// The system's real-time clock in milliseconds since the Unix epoch (for
/// shells; cores get their time passed in).
pub fn now_ms() -> TimestampMs {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    TimestampMs(ms)
}

/// Subscription filter for every frame of a site.
pub fn site_filter(site: &Ident) -> String {
    filter::site_frames(site)
        .map(|s| s.to_string())
        .unwrap_or_else(|_| format!("dc/v2/{site}/+/+/+"))
}

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
//! Shaped the way `rumqttc` shapes its client: cloneable handles send
//! requests over channels to the one task that owns the connection and
//! all of its state. Modules, each using only those listed before it:
//! - [`status`]: the frame counter and the counters, the only state the
//!   handles and the task share (atomics, read without asking the task);
//! - [`node`]: who the node is (its configuration) and the packets that
//!   follow from it: options, topics, numbered frames, presence, wills;
//! - [`command`]: the channels between the handles and the task, and the
//!   messages on them; the one module both sides import;
//! - [`session`]: the delivery state, a plain struct with no I/O: order
//!   of hand-over, packet ids and acknowledgements, what is kept across a
//!   reconnection, what the outbox still holds, the retained state;
//! - [`presence`]: the second, light connection that keeps the JSON
//!   mirror of `online`, with its own last will (`json_presence`);
//! - [`acker`]: the thread that removes acknowledged frames from flash;
//! - [`subscribing`]: subscriptions the broker refused, asked for again;
//! - [`log_limit`]: which refused inbound frames are logged (all counted);
//! - [`event_loop`]: the task: drives `rumqttc`'s `EventLoop` (connection,
//!   backoff, failover), owns the session and feeds it;
//! - [`handle`]: the cloneable [`Bus`] and the [`BusTask`].
//!
//! This module wires the two halves together ([`Bus::start`]).
//!
//! Glossary:
//! - *handle*: a clone of [`Bus`]; *task*: the event loop.
//! - *outbox*: the flash store of QoS 1 frames not yet acknowledged
//!   (`loopwarden-flash`), surviving a crash or power cut.

use std::time::{SystemTime, UNIX_EPOCH};

use loopwarden_protocol::topic::filter;
use loopwarden_protocol::{Frame, Ident, MessageKind, Role, TimestampMs, Topic};
use tokio::sync::mpsc;

use crate::config::BusConfig;
use crate::durable::DurableOutbox;

mod acker;
mod command;
mod event_loop;
mod handle;
mod log_limit;
mod node;
mod presence;
mod session;
mod status;
mod subscribing;

pub use handle::{AckedLedger, Bus, BusTask};

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
    /// The frame could not be signed.
    #[error("cannot sign: {0}")]
    Sign(loopwarden_protocol::AuthError),
    /// Shutdown ended with publishes the broker had not acknowledged (not
    /// connected, or the timeout passed); with an outbox they are still in
    /// flash and go out after the next start.
    #[error("{count} publishes not acknowledged by the broker at shutdown")]
    Unacknowledged {
        /// How many were handed over (or waited to be) and not
        /// acknowledged, those kept from a lost connection included.
        count: usize,
    },
    /// Shutdown ended, connected, with outbox frames never handed over to
    /// the broker: the outbox could not be read back from flash, or the
    /// timeout passed before there was room for them. They stay in flash
    /// and go out after the next start.
    #[error(
        "outbox frames left unsent in flash at shutdown (not read back, or no room before the timeout), and {unacknowledged} publishes not acknowledged by the broker; they go out after the next start"
    )]
    LeftInFlash {
        /// Publishes handed over and not acknowledged, as in
        /// [`PublishError::Unacknowledged`].
        unacknowledged: usize,
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

impl Bus {
    /// Starts the bus task. Returns at once; the task connects in the
    /// background and keeps reconnecting. Received frames arrive on the
    /// returned channel.
    pub fn start(config: BusConfig) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
        start(config, None)
    }

    /// As [`Bus::start`], with every QoS 1 frame of this node stored in
    /// `outbox` before it is sent and removed when the broker acknowledged
    /// it; what the outbox holds from before (a crash, a power cut) is sent
    /// again on the first connection, with its original sequence numbers.
    /// `config.first_seq` should come from a reservation in flash
    /// (`ConfigStore::reserve_seq`) so numbers keep rising across restarts.
    pub fn start_with_outbox(
        config: BusConfig,
        outbox: Box<dyn DurableOutbox>,
    ) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
        start(config, Some(outbox))
    }
}

/// The handle and the task over one set of channels.
fn start(
    config: BusConfig,
    outbox: Option<Box<dyn DurableOutbox>>,
) -> (Bus, mpsc::Receiver<Inbound>, BusTask) {
    let outbox = outbox.map(|o| std::sync::Arc::new(std::sync::Mutex::new(o)));
    // A certificate expired, not valid yet or ending soon is said now:
    // once it has ended, the bus would only say the broker is unreachable.
    if let Some(tls) = &config.tls {
        tls.say_validity(now_ms());
    }
    let (inbound_tx, inbound_rx) = mpsc::channel(config.inbound_capacity.max(1));
    let (handles, ends) = command::channels(config.queue_capacity);
    let node = std::sync::Arc::new(node::Node::new(config));
    let bus = Bus::new(node.clone(), handles, outbox.clone());
    let task = tokio::spawn(event_loop::run(node, ends, inbound_tx, outbox));
    (bus, inbound_rx, BusTask::new(task))
}

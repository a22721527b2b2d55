//! The channels between the handles ([`super::handle`]) and the event
//! loop ([`super::event_loop`]), and what travels on them. The one module
//! both sides import; neither imports the other.
//!
//! From the handles to the loop:
//! - *commands* (bounded by `queue_capacity`): publishes to hand to the
//!   client. A full channel is the handle's "queue full";
//! - *control* (small, bounded): shutdown (answered over a oneshot) and the
//!   ledger of acknowledged outbox frames;
//! - the *outbox bell* (one slot): "frames were stored in the outbox that
//!   no command carries" (not connected, or the commands were full); the
//!   loop then reads them from flash, in order;
//! - *retained* (`watch`): the latest retained state whose publish the
//!   full command channel refused, so it still reaches the broker.
//!
//! From the loop to the handles (`watch`): whether the bus is ready, and
//! which broker of the list is in use.
//!
//! Glossary:
//! - *ready*: connected with every subscription answered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::QoS;
use tokio::sync::{mpsc, oneshot, watch};

use super::PublishError;

/// A publish for the loop to hand to the client.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Outgoing {
    /// The topic name.
    pub(super) topic: String,
    /// The payload (a frame or its JSON mirror).
    pub(super) payload: Vec<u8>,
    pub(super) qos: QoS,
    pub(super) retain: bool,
    /// What the delivery bookkeeping must know of it.
    pub(super) class: Class,
}

/// What kind of publish an [`Outgoing`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Sent once (QoS 0), or kept across a reconnection (QoS 1).
    Plain,
    /// Retained state (`health`): the loop keeps the latest and announces
    /// it again on every re-connection.
    Retained,
    /// Frame `seq`, already stored in the flash outbox.
    Durable(u32),
}

/// Requests that are not publishes.
#[derive(Debug)]
pub(super) enum Control {
    /// Leave cleanly within `timeout` (see [`crate::Bus::shutdown`]).
    Shutdown {
        timeout: Duration,
        answer: oneshot::Sender<Result<(), PublishError>>,
    },
    /// From now on, send the sequence number of every outbox frame the
    /// broker acknowledges here.
    KeepLedger(mpsc::UnboundedSender<(u32, loopwarden_protocol::Family)>),
}

/// The latest retained state the command channel refused, by topic name.
pub(super) type Unsent = BTreeMap<String, Vec<u8>>;

/// The handles' ends.
#[derive(Clone)]
pub(super) struct HandleEnds {
    pub(super) commands: mpsc::Sender<Outgoing>,
    pub(super) control: mpsc::Sender<Control>,
    pub(super) outbox_bell: mpsc::Sender<()>,
    pub(super) retained: Arc<watch::Sender<Unsent>>,
    pub(super) ready: watch::Receiver<bool>,
    pub(super) broker: watch::Receiver<usize>,
}

/// The loop's ends.
pub(super) struct LoopEnds {
    pub(super) commands: mpsc::Receiver<Outgoing>,
    pub(super) control: mpsc::Receiver<Control>,
    pub(super) outbox_bell: mpsc::Receiver<()>,
    pub(super) retained: watch::Receiver<Unsent>,
    pub(super) ready: watch::Sender<bool>,
    pub(super) broker: watch::Sender<usize>,
}

/// Control requests that may wait at once (there are two kinds, each sent
/// about once).
const CONTROL_CAPACITY: usize = 8;

/// The channels, commands bounded by `capacity`.
pub(super) fn channels(capacity: usize) -> (HandleEnds, LoopEnds) {
    let (commands_tx, commands) = mpsc::channel(capacity.max(1));
    let (control_tx, control) = mpsc::channel(CONTROL_CAPACITY);
    let (bell_tx, outbox_bell) = mpsc::channel(1);
    let (retained_tx, retained) = watch::channel(Unsent::new());
    let (ready, ready_rx) = watch::channel(false);
    let (broker, broker_rx) = watch::channel(0);
    let handles = HandleEnds {
        commands: commands_tx,
        control: control_tx,
        outbox_bell: bell_tx,
        retained: Arc::new(retained_tx),
        ready: ready_rx,
        broker: broker_rx,
    };
    let ends = LoopEnds {
        commands,
        control,
        outbox_bell,
        retained,
        ready,
        broker,
    };
    (handles, ends)
}

//! Delivery that survives a crash: QoS 1 frames go through a flash outbox
//! (`loopwarden-flash`) before they are sent, and leave it only when the
//! broker acknowledged them.
//!
//! The MQTT client tells which packet id it gave each publish only as an
//! event (`Outgoing::Publish(pkid)`), in the order it sends them. The shell
//! therefore keeps, under one lock with every hand-over to the client, the
//! order in which it handed QoS 1 publishes over (`order`), matches each
//! send event to the front of that order, and each PUBACK to its frame's
//! sequence number (`inflight`).
//!
//! Glossary:
//! - *durable*: a QoS 1 frame on the node's own frame topics, not presence
//!   (presence is rebuilt on every connection) and not the JSON mirror.
//! - *deferred*: stored in the outbox but not handed to the client (queue
//!   full, or not connected); sent on the next connection or when the queue
//!   drains.
//! - *acking*: acknowledged by the broker, waiting for the acker thread to
//!   remove it from flash (never handed over again meanwhile).

use std::collections::{HashMap, VecDeque};

use loopwarden_flash::outbox::{Class, Dropped, Entry, Outbox};

/// A frame waiting in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The frame's sequence number.
    pub seq: u32,
    /// Its topic.
    pub topic: String,
    /// The frame.
    pub payload: Vec<u8>,
}

/// Why the outbox did not take a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreFailure {
    /// Full of frames that must not be dropped.
    Full,
    /// The flash failed.
    Flash(String),
}

/// What the bus shell needs of an outbox. Implemented for
/// [`loopwarden_flash::Outbox`] over any flash.
pub trait DurableOutbox: Send {
    /// Stores a frame before it is sent.
    fn store(
        &mut self,
        seq: u32,
        class: Class,
        topic: &str,
        payload: &[u8],
    ) -> Result<Dropped, StoreFailure>;
    /// The broker acknowledged frame `seq`.
    fn ack(&mut self, seq: u32) -> Result<bool, String>;
    /// Everything not yet acknowledged, in sequence order.
    fn pending(&mut self) -> Result<Vec<Pending>, String>;
}

impl<S> DurableOutbox for Outbox<S>
where
    S: embedded_storage_async::nor_flash::MultiwriteNorFlash + Send,
    S::Error: std::fmt::Debug,
{
    fn store(
        &mut self,
        seq: u32,
        class: Class,
        topic: &str,
        payload: &[u8],
    ) -> Result<Dropped, StoreFailure> {
        let entry = Entry {
            seq,
            class,
            topic,
            payload,
        };
        // Flash futures of this workspace never wait: run them to completion here.
        futures::executor::block_on(self.push(&entry)).map_err(|e| match e {
            loopwarden_flash::StoreError::Full => StoreFailure::Full,
            e => StoreFailure::Flash(e.to_string()),
        })
    }

    fn ack(&mut self, seq: u32) -> Result<bool, String> {
        futures::executor::block_on(Outbox::ack(self, seq)).map_err(|e| e.to_string())
    }

    fn pending(&mut self) -> Result<Vec<Pending>, String> {
        let mut out = Vec::new();
        futures::executor::block_on(self.for_each(|e| {
            out.push(Pending {
                seq: e.seq,
                topic: e.topic.to_string(),
                payload: e.payload.to_vec(),
            })
        }))
        .map_err(|e| e.to_string())?;
        Ok(out)
    }
}

/// The bookkeeping between the outbox and the MQTT client (see the module
/// note). One lock guards it together with every QoS 1 hand-over.
#[derive(Default)]
pub(crate) struct Delivery {
    /// The outbox has a lock of its own, taken after this one: a PUBACK
    /// removes its frame from flash without holding the delivery lock, so
    /// a publish that does not go through the outbox (health, presence,
    /// mirrors) never waits for a flash write.
    pub(crate) outbox: Option<SharedOutbox>,
    /// For every QoS 1 publish handed over and not yet sent: its frame seq
    /// if it is in the outbox.
    pub(crate) order: VecDeque<Option<u32>>,
    /// Packet id -> frame seq of sent, unacknowledged outbox frames.
    pub(crate) inflight: HashMap<u16, u32>,
    /// Outbox frames not handed over yet.
    pub(crate) deferred: bool,
    /// Outbox frames the broker acknowledged whose removal from flash
    /// has not happened yet (done off the bus task); never handed over
    /// again meanwhile.
    pub(crate) acking: std::collections::HashSet<u32>,
    /// The seqs of every outbox frame the broker acknowledged, in order,
    /// when asked for ([`crate::Bus::keep_acked_ledger`]): what a
    /// subscriber must have received, for a measurement.
    pub(crate) ledger: Option<Vec<u32>>,
}

/// The outbox, shared between publishers and the bus task.
pub(crate) type SharedOutbox = std::sync::Arc<std::sync::Mutex<Box<dyn DurableOutbox>>>;

impl Delivery {
    /// Outbox frames neither sent nor handed over: what to hand over now.
    pub(crate) fn unsent(&mut self) -> Result<Vec<Pending>, String> {
        let Some(outbox) = self.outbox.clone() else {
            return Ok(Vec::new());
        };
        let mut outbox = outbox
            .lock()
            .map_err(|_| "the outbox lock is poisoned".to_string())?;
        let busy: std::collections::HashSet<u32> = self
            .inflight
            .values()
            .copied()
            .chain(self.order.iter().flatten().copied())
            .chain(self.acking.iter().copied())
            .collect();
        Ok(outbox
            .pending()?
            .into_iter()
            .filter(|p| !busy.contains(&p.seq))
            .collect())
    }
}

//! Delivery that survives a crash: QoS 1 frames go through a flash outbox
//! (`loopwarden-flash`) before they are sent, and leave it only when the
//! broker acknowledged them.
//!
//! Matching sends and acknowledgements to outbox frames is the session's
//! job (`client::session`); this module is the outbox as the bus sees it.
//!
//! Glossary:
//! - *durable*: a QoS 1 frame on the node's own frame topics, not presence
//!   (presence is rebuilt on every connection) and not the JSON mirror.
//! - *deferred*: stored in the outbox but not handed to the client (queue
//!   full, or not connected); sent on the next connection or when the queue
//!   drains.
//! - *acking*: acknowledged by the broker, waiting for the acker thread to
//!   remove it from flash (never handed over again meanwhile).

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
    S::Error: std::fmt::Display + Send,
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

/// The outbox, shared between publishers (which store) and the bus task
/// (which reads what to hand over, and whose acker removes what the broker
/// acknowledged).
pub(crate) type SharedOutbox = std::sync::Arc<std::sync::Mutex<Box<dyn DurableOutbox>>>;

//! The acker: the thread that removes acknowledged frames from the flash
//! outbox, in the order they were acknowledged, so a flash sync never
//! holds up the event loop (nor the health frames behind it in the
//! client's queue). It tells the loop each frame it is done with over a
//! channel; the frame stays "acking" in the session until then.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use tracing::warn;

use super::node::Node;
use crate::durable::SharedOutbox;
use crate::metrics::Metrics;

/// The thread's handle. The thread ends when this is dropped.
pub(super) struct Acker {
    tx: std::sync::mpsc::Sender<u32>,
}

impl Acker {
    /// Starts the thread; it sends each seq it is done with to `done`.
    pub(super) fn start(
        outbox: SharedOutbox,
        node: Arc<Node>,
        done: UnboundedSender<u32>,
    ) -> Acker {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let spawned = std::thread::Builder::new()
            .name("bus-acker".into())
            .spawn(move || {
                for seq in rx {
                    remove_acked(&outbox, &node, seq);
                    let _ = done.send(seq);
                }
            });
        if let Err(e) = spawned {
            warn!(error = %e, "no acker thread: acknowledged frames stay in the outbox until resent");
        }
        Acker { tx }
    }

    /// Hands `seq` to the thread. Every seq waiting is a frame still in
    /// the outbox, so the flash's capacity bounds the channel (and the one
    /// back to the loop).
    pub(super) fn ack(&self, seq: u32) {
        let _ = self.tx.send(seq);
    }
}

/// Removes acknowledged frame `seq` from the outbox.
fn remove_acked(outbox: &SharedOutbox, node: &Node, seq: u32) {
    let result = match outbox.lock() {
        Ok(mut o) => o.ack(seq),
        Err(_) => Err("the outbox lock is poisoned".to_string()),
    };
    match result {
        Ok(true) => Metrics::add(&node.status.metrics.outbox_acked),
        Ok(false) => {} // dropped to make room meanwhile
        Err(e) => warn!(seq, error = %e, "cannot remove an acknowledged frame from the outbox"),
    }
}

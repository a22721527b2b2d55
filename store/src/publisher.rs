//! What the recorder publishes through: the bus, seen from storage.
//!
//! The recorder hands events and acks to a [`Publisher`] after logging
//! them; the publisher stores each in the flash outbox and sends it. When
//! the outbox is full the publisher refuses the frame
//! ([`Refused::OutboxFull`]), or its flash fails while the broker is
//! unreachable ([`Refused::Unstored`]), and the recorder holds it and
//! offers it again.
//!
//! Glossary:
//! - *mirror*: the frame's JSON form, published next to it on the JSON tree.

use loopwarden_protocol::{Message, TimestampMs};

/// Why a publisher did not take a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The outbox is full of frames that must not be dropped: hold the
    /// message and offer it again later.
    OutboxFull,
    /// Telemetry while the broker is unreachable: dropped (and counted by
    /// the publisher), stale by the time it would arrive.
    Offline,
    /// The outbox's flash failed to store the frame and the broker is
    /// unreachable, so it was not sent either (the reason given): hold the
    /// message and offer it again later.
    Unstored(String),
    /// Not published, for the reason given (the message is dropped).
    Failed(String),
}

/// Publishes an agent's messages on its own topics (implemented by
/// `loopwarden_bus::Bus`).
pub trait Publisher: Send + Sync {
    /// Numbers `message` with the next sequence number and publishes it,
    /// and its JSON mirror when `mirror`; returns the number it took.
    fn publish_message(
        &self,
        message: Message,
        time: TimestampMs,
        mirror: bool,
    ) -> Result<u32, Refused>;

    /// The sequence number the next frame will carry.
    fn next_seq(&self) -> u32;
}

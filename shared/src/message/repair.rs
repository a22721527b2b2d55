//! Repair from the source (`docs/bus.md` §4.8): a reader's request to a
//! node to publish its logged events again, and the node's report.
//!
//! Glossary:
//! - *resend*: publishing a logged event frame again, unchanged.
//! - *held from*: the lowest number a node's log still holds an event of.

use serde::{Deserialize, Serialize};

use super::{CommandAuth, Correlation};

/// The most numbers one resend request may span (`to - from + 1`): about
/// a day of a busy host's frames. A wider request is `malformed`.
pub const RESEND_SPAN_MAX: u32 = 1_000_000;

/// Publish the logged event frames numbered `from..=to` again (family
/// `resend` of the node asked, QoS 1). Sent by a reader that saw a gap in
/// the node's numbers (see `docs/bus.md` §4.7); signed as commands are,
/// over the node's `resend` topic, by a signer whose keyring entry may
/// `resend`. The node answers on its `resent` topic: the frames, unchanged
/// (their own sequence numbers, times and CRCs), then a [`ResendReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct ResendRequest {
    /// The first sequence number wanted.
    pub from: u32,
    /// The last sequence number wanted (inclusive).
    pub to: u32,
    /// The reader's proof that it may ask.
    pub auth: CommandAuth,
}

/// How a resend request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ResendCode {
    /// Every logged event of the range the log still holds was resent.
    Ok,
    /// The node's resend rate stopped it: the events from `next` on were
    /// not resent yet; ask again from there later.
    Limited,
    /// `to` below `from`, or a span wider than [`RESEND_SPAN_MAX`].
    Malformed,
    /// The signature did not verify, or the key is unknown.
    Unauthenticated,
    /// Authentic, but its signer may not ask for resends.
    Forbidden,
    /// Not newer (by sequence number) than the last request taken from
    /// the same reader, or older than the node takes.
    Replayed,
    /// The node could not read its log (the detail is in its own log).
    Unavailable,
}

/// A node's answer to a resend request (family `resent`, QoS 1), after the
/// frames it resent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct ResendReport {
    /// The request answered.
    pub correlation: Correlation,
    /// The outcome.
    pub code: ResendCode,
    /// The range asked for.
    pub from: u32,
    /// The range asked for (inclusive).
    pub to: u32,
    /// Frames resent for this request.
    pub resent: u32,
    /// The lowest sequence number of an event the log still holds; events
    /// numbered below it are beyond repair (the log wrapped, or the flash
    /// was replaced). `None`: the log holds no published event.
    pub held_from: Option<u32>,
    /// With `limited`: the first number not yet covered.
    pub next: Option<u32>,
}

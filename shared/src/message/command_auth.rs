//! The proof a command (a lease, a release, a CDU's state, a resend
//! request) carries of its signer, and how a signed frame came: the
//! minor version its signature covers (see [`crate::auth`]).
//!
//! Glossary:
//! - *received as*: the sender's minor in byte 1 and whether the body
//!   went on past what this version reads; not on the wire.

use serde::{Deserialize, Serialize};

/// Proof that a command comes from a signer the receiver trusts: an
/// Ed25519 signature over the target's topic and the frame, made with the
/// signature itself zeroed (see [`crate::auth`]). The frame's sequence
/// number is the anti-replay counter (it only rises per sender).
#[derive(Debug, Clone, Copy, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
pub struct CommandAuth {
    /// Which of the sender's keys signed (keys rotate).
    pub key_id: u8,
    /// The Ed25519 signature: R, then S.
    pub signature: [[u8; 32]; 2],
    /// How the frame was received, so that its signature is checked over
    /// the bytes that came: set by [`crate::Frame::decode`], cleared by
    /// [`crate::Frame::sign`]. Neither on the wire nor in JSON.
    #[serde(skip)]
    #[cfg_attr(feature = "std", schemars(skip))]
    pub received: ReceivedAs,
}

/// Two auths are equal when their key ids and signatures are: how the
/// frame was received ([`ReceivedAs`]) is not compared, so a decoded frame
/// equals the frame it was encoded from.
impl PartialEq for CommandAuth {
    fn eq(&self, other: &Self) -> bool {
        self.key_id == other.key_id && self.signature == other.signature
    }
}

/// How a signed frame was received: the minor version its sender wrote in
/// byte 1 (it is signed), and whether its body went on past what this
/// version reads (fields a newer minor appended, also signed). The
/// default is a frame as this version encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedAs {
    /// The frame's minor version (byte 1).
    pub minor: u8,
    /// Its body carried bytes after the fields this version reads.
    pub unread_tail: bool,
}

impl Default for ReceivedAs {
    fn default() -> Self {
        ReceivedAs {
            minor: crate::frame::PROTOCOL.minor,
            unread_tail: false,
        }
    }
}

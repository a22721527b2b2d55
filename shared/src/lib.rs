//! # loopwarden-protocol: the language of the Loopwarden bus
//!
//! Node agents (one per GPU host) and cooling controllers (one per CDU)
//! share one MQTT bus. This crate is everything they say to each other and
//! to the facility, and nothing else: unit newtypes, identities, the XID
//! catalog, the messages, the frame that carries them (header, postcard
//! body, CRC-32) and the topic names. It is `no_std` and needs no
//! allocator, so the same code runs in a CDU's microcontroller; the `std`
//! feature adds the JSON form of every frame and its JSON Schema.
//!
//! Glossary:
//! - *frame*: the bytes of one message with its header and CRC ([`frame`]).
//! - *kind*: which message a frame holds ([`MessageKind`]).
//! - *family*: the last topic level, which fixes QoS and retention ([`topic`]).
//! - *mirror*: the JSON copy of a frame for facility subscribers ([`json`]).
//! - *XID*: an NVIDIA driver error code ([`xid`]).
//!
//! ```
//! use loopwarden_protocol::{samples, Frame, MessageKind, MAX_FRAME_LEN};
//!
//! let frame = samples::frame(MessageKind::HostTelemetry);
//! let mut buf = [0u8; MAX_FRAME_LEN];
//! let len = frame.encode(&mut buf).unwrap();
//! assert_eq!(Frame::decode(&buf[..len]).unwrap(), frame);
//! ```

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod auth;
mod flags;
pub mod frame;
pub mod ids;
#[cfg(feature = "std")]
pub mod json;
pub mod message;
pub mod reason;
pub mod replay;
pub mod samples;
#[cfg(feature = "std")]
pub mod seq;
pub mod text;
pub mod topic;
pub mod units;
pub mod xid;

pub use auth::AuthError;
pub use frame::{
    DecodeError, EncodeError, Frame, Message, MessageKind, Version, MAX_FRAME_LEN, PROTOCOL,
};
pub use ids::{GpuIndex, Ident, IdentError, NodeId, RackIndex, Role, Text, MAX_GPUS, MAX_RACKS};
pub use message::*;
pub use reason::ReasonCode;
pub use replay::ReplayFloor;
pub use topic::{Family, Qos, Topic, TopicError};
pub use units::*;

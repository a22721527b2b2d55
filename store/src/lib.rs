//! # loopwarden-store: what both agents keep in flash
//!
//! The storage half of an agent's shell, with no network code in it:
//! [`agent_flash`] (the flash image, its stores, the sequence floor),
//! [`check`] (the check that keeps a damaged record from reading as the
//! older one), [`recorder`] (the one thread that writes it, and hands the
//! frames that go through the outbox to a [`Publisher`] in the order given),
//! [`lease_record`] (a controller's sent lease as its log keeps it) and
//! [`resend`] (the logged events found again by their frame numbers, for
//! a reader that missed them).
//!
//! The bus (`loopwarden-bus`) implements [`Publisher`]; this crate does not
//! know it, so storage can be built and tested without MQTT.
//!
//! Glossary:
//! - *outbox*: the power-fail-safe store of frames the broker has not
//!   acknowledged (`loopwarden-flash`); the publisher stores into it.
//! - *publisher*: what the recorder publishes events and acks through.

#![warn(missing_docs)]

pub mod agent_flash;
pub mod check;
pub mod lease_record;
mod publisher;
pub mod recorder;
pub mod resend;

pub use publisher::{Publisher, Refused};

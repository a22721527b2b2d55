//! # loopwarden-flash: what an agent decided survives a power cut
//!
//! Both agents must lose nothing they decided: a quarantine, a cap, a leak,
//! an XID must survive a power cut, a crash and a broker outage, and be
//! readable by a field engineer afterwards. This crate keeps them in flash,
//! generic over the `embedded-storage` `NorFlash` trait, on the
//! controller's microcontroller and on Linux hosts alike:
//!
//! - [`EventLog`]: append-only records with sequence numbers that survive
//!   restarts; the oldest are recycled when full, and a marker says how many;
//! - [`Outbox`]: frames that must reach the broker, kept until the broker
//!   acknowledged them; when full, telemetry-class entries go first and
//!   critical ones (quarantine, cap, leak) never;
//! - [`ConfigStore`]: settings a field engineer changes on the device, and
//!   the reservation that keeps frame sequence numbers rising across restarts.
//!
//! The store underneath is `sequential-storage` (power-fail safe, fuzzed,
//! wear-levelling); this crate adds the records and the policies. Beside the
//! real flash of a board it has two flashes of its own (feature `std`):
//! [`SimFlash`], in memory with power-cut injection, and [`FileFlash`], a
//! file with the geometry of a real part for Linux hosts.
//!
//! Glossary:
//! - *sector*: the erase unit; *word*: the write unit.
//! - *power cut*: an operation stopped part-way; the store repairs itself on
//!   the next operation and loses at most the item being written.
//! - *damaged sector*: one whose bytes are not what was written (zeroed,
//!   garbage); where it keeps a queue from opening, it alone is erased,
//!   said, and the rest opens (`salvage`).

#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

pub mod config;
mod error;
#[cfg(feature = "std")]
pub mod file;
pub mod log;
#[cfg(feature = "std")]
pub mod nor;
pub mod outbox;
mod salvage;
#[cfg(feature = "std")]
pub mod shared;
#[cfg(feature = "std")]
pub mod sim;

pub use config::ConfigStore;
pub use error::StoreError;
#[cfg(feature = "std")]
pub use file::{FileFlash, FileFlashError, FlashGeometry};
pub use log::{Damaged, EventLog, Record, Wrapped};
#[cfg(feature = "std")]
pub use nor::{FlashError, FlashStats, IoOp};
pub use outbox::{Class, Dropped, Entry, Outbox};
#[cfg(feature = "std")]
pub use shared::SharedFlash;
#[cfg(feature = "std")]
pub use sim::SimFlash;

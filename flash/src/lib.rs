//! # loopwarden-flash: what an agent decided survives a power cut
//!
//! Both agents must lose nothing they decided: a quarantine, a cap, a leak,
//! an XID must survive a power cut, a crash and a broker outage, and be
//! readable by a field engineer afterwards. This crate keeps them in flash,
//! generic over the `embedded-storage` `NorFlash` trait (on the controller's
//! microcontroller) with a file-backed flash of the same geometry for Linux
//! hosts:
//!
//! - the *event log*: append-only records with sequence numbers that survive
//!   restarts; the oldest are recycled when full, and the log says how many;
//! - the *outbox*: frames that must reach the broker, kept until the broker
//!   acknowledged them, sent again in order with their original sequence
//!   numbers after a restart or a reconnection;
//! - the *config store*: settings a field engineer changes on the device.
//!
//! The store itself is `sequential-storage`, which is power-fail safe and
//! fuzzed; this crate adds the records, the outbox policy and the
//! file-backed flash. It is built by its own piece of work; until then the
//! bus shell keeps unacknowledged QoS 1 frames in memory only
//! (`loopwarden-bus`), which survives a reconnection but not a crash.

#![no_std]

//! # node-agent: the agent on every GPU host
//!
//! One per host. It samples every GPU through NVML (or the twin), decides
//! each GPU's health, quarantines sick GPUs, arbitrates and applies power
//! caps, keeps a power-fail-safe log, publishes telemetry, health and events
//! on the bus, and answers a field engineer on its console. It acts on its
//! own when the bus is down.
//!
//! Its decisions are pure cores (inputs and a time in, outputs out, no
//! clock, no I/O) inside a thin shell of tokio tasks (NVML behind the
//! `GpuSource` trait, the bus through `loopwarden-bus`, the flash stores of
//! `loopwarden-flash`, the console). What exists today: the power-cap
//! arbiter ([`caps::CapArbiter`]). The health engine, the GPU sources and
//! the shell land with their own pieces of work.
//!
//! Glossary:
//! - *quarantine*: a GPU taken out of service now, released only by an
//!   operator with a reason.
//! - *lease*: a power cap that lapses unless its sender renews it.
//! - *thermal guard*: the host's own cap when a GPU runs hot; needs no bus.

#![warn(missing_docs)]

pub mod caps;

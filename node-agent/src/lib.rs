//! # node-agent: the agent on every GPU host
//!
//! One per host. It samples every GPU through NVML (or the twin), decides
//! each GPU's health, quarantines sick GPUs, arbitrates and applies power
//! caps, keeps a power-fail-safe log, publishes telemetry, health and events
//! on the bus, and answers a field engineer on its console. It acts on its
//! own when the bus is down.
//!
//! Its decisions are one pure core (`node_core::node::Node`: an input
//! and a time in, effects out, no clock, no I/O) inside a thin shell of
//! tokio tasks:
//! - [`gpu`]: the `GpuDevice`/`GpuSource` traits; [`nvml`] (real GPUs)
//!   implements them, and with the `twin` feature `sim_gpus` (simulated
//!   ones) and `hall_gpus` (the simulated hall's GPUs); [`worker`] runs each
//!   GPU's calls on its own thread with a deadline.
//! - every decision (health, commands, the thermal guard, caps, the
//!   cooling loss) is the crate `node-core`'s, named where it is used.
//! - [`shell`]: the running agent: it samples, hears the bus and the
//!   driver, gives each to the node and carries out its effects (limits,
//!   publishes, flash, actions); [`clock`]: the wall clock for stamps, a
//!   monotonic one for windows; [`console`]: `node-agent ctl`; [`config`]:
//!   the TOML file and flags; [`metrics`]: Prometheus's `/metrics`
//!   (`metrics_listen`); [`watchdog`]: systemd's readiness and watchdog
//!   notices (the lifecycle itself is `loopwarden_field::lifecycle`'s).
//!
//! `node-agent replay` runs the health engine over a recorded trace in
//! simulated time (`node_core::replay`).
//!
//! Glossary:
//! - *quarantine*: a GPU taken out of service now, released only by an
//!   operator with a reason.
//! - *lease*: a power cap that lapses unless its sender renews it.
//! - *thermal guard*: the host's own cap when a GPU runs hot; needs no bus.
//! - *read back*: the limit NVML reports after a set; only that value is
//!   ever reported as in force.

#![warn(missing_docs)]

pub mod actions;
pub mod clock;
pub mod config;
pub mod console;
pub mod gpu;
#[cfg(feature = "twin")]
pub mod hall_gpus;
pub mod metrics;
pub mod nvml;
pub mod shell;
#[cfg(feature = "twin")]
pub mod sim_gpus;
#[cfg(test)]
mod test_log;
pub mod watchdog;
pub mod worker;
pub mod xid_queue;

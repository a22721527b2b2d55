//! # node-core: the host agent's decisions
//!
//! Every decision the node agent makes, as pure functions of what it is
//! given and a time passed in: no clock, no socket, no file, no NVML. The
//! crate depends on the protocol and on data crates alone (no runtime, no
//! network, no NVML binding), so that purity is checked by the compiler,
//! not by review. [`node::Node::step`] takes every input of the agent and
//! returns what to do; the agent (`node-agent`) is the shell that feeds it
//! and carries out what it returns, and `node-agent replay` runs the same
//! health engine over a recorded trace.
//!
//! - [`health`]: the health engine: each GPU healthy, degraded or
//!   quarantined, with the evidence (rules in `docs/health.md`).
//! - [`caps`]: the power-cap arbiter: the limit in force from every lease,
//!   the thermal guard and the board's range.
//! - [`guard`]: the thermal guard, the host's own cap when a GPU runs hot.
//! - [`commands`]: the checks of a command (authentication, replay, the
//!   lease's bounds) and what it changes.
//! - [`cooling_loss`]: drain, power down and undo when the rack's cooling
//!   is lost and comes back.
//! - [`replay`]: the health engine over a recorded trace, text in and
//!   verdict lines out (`node-agent replay`).
//! - [`node`]: the one step that owns all of the above: an input and the
//!   time in, the effects for the agent to carry out.
//! - [`xid_level`]: the state a driver XID raises its GPU to, shared by
//!   the health engine and the agent's XID queue.
//!
//! Glossary:
//! - *quarantine*: a GPU taken out of service now, released only by an
//!   operator with a reason.
//! - *lease*: a power cap that lapses unless its sender renews it.
//! - *thermal guard*: the host's own cap when a GPU runs hot; needs no bus.

#![warn(missing_docs)]

pub mod ack_limit;
pub mod caps;
pub mod commands;
pub mod cooling_loss;
pub mod guard;
pub mod health;
pub mod node;
pub mod replay;
pub mod xid_level;
pub use xid_level::xid_level;

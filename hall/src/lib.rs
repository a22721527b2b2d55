//! # loopwarden-hall: the one-command run of the simulated hall
//!
//! This crate will become the project's main command (`docs/twin.md`):
//! it starts the broker, the simulated CDU, a node agent per simulated
//! host and the cooling controller, plays a scenario and shows what
//! happens, live and as a report with charts. It is the only crate that
//! links both agents.
//!
//! What is here today is the report: [`trace`] reads (and writes) the
//! run's CSV trace, the one `cooling-ctrl simulate --trace` writes, and
//! [`report`] turns a trace and the run's summary into SVG charts and a
//! Markdown page (`loopwarden-hall plot`). [`cdu`] serves the simulated
//! CDU alone on Modbus (`loopwarden-hall cdu`), on the parts
//! [`sim_side`] gives `play` and `fleet` too, and with `--record` writes
//! what it was told and what happened to it ([`record`], [`recorded`]).

#![warn(missing_docs)]

pub mod cdu;
pub mod compare;
pub mod fleet;
pub mod logging;
pub mod play;
pub mod precursors;
pub mod record;
pub mod recorded;
pub mod report;
pub mod sim_side;
pub mod trace;

pub use report::{write_report, ReportError};
pub use trace::{read_trace, TraceError, TraceRow};

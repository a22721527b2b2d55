//! # loopwarden-twin: the simulated hall
//!
//! The hall of `docs/plant-model.md` that both agents are tested against,
//! behind the same traits as real hardware. [`plant`]: GPUs on cold
//! plates, the CDU's loop, dry cooler, trim chiller and meters, on a
//! site's figures (`loopwarden_boards::site`). Around it: [`scenario`]
//! (what happens to a hall over a run), [`hosts`] (what hosts do when their
//! agents quarantine a GPU or lose cooling), [`sim`] (plays a scenario with
//! a controller in charge, in simulated time), [`oracle`] (the reference
//! controller that knows the true state), [`sim_cdu`] (the simulated CDU,
//! a Modbus TCP and RTU server on a board's register map), [`pins`]
//! (simulated board pins behind `embedded-hal`) and [`hall`] (the plant
//! behind the simulated CDU's registers and pins, in real time). Apart
//! from the hall, [`goodput`]: a large training job's time under failures.
//!
//! Production builds leave this crate out: the agents link it only behind
//! their `twin` feature.
//!
//! Glossary:
//! - *twin*: the simulated hall standing in for a real one.
//! - *scenario*: a `plant-scenario/1` TOML file: a site, weather, load and
//!   faults over a run.
//! - *oracle*: a controller that reads the plant's true state; the bound
//!   the others are measured against.

#![warn(missing_docs)]

pub mod goodput;
pub mod hall;
pub mod hosts;
pub mod oracle;
pub mod pins;
pub mod plant;
pub mod scenario;
pub mod sim;
pub mod sim_cdu;
pub mod tally;

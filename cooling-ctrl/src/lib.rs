//! # cooling-ctrl: the controller on every CDU
//!
//! One per cooling unit. It reads and drives the CDU over Modbus (pumps,
//! valves, temperatures, flow, leak inputs, power meters) and its board pins
//! over `embedded-hal`, and runs four layers in order of authority:
//! *safety* (leak isolation, failsafe on lost or implausible sensors, lag
//! pump on a trip), *regulation* (supply temperature and pump loops),
//! *optimisation* (the warmest water and slowest pumps the GPUs' margins
//! allow, for the least facility energy per unit of GPU work) and
//! *coordination* (power-cap leases to hosts when cooling falls short).
//!
//! The control core is the `cooling-core` crate (`no_std` and
//! allocation-free, a pure `step(now, readings) -> commands`), so the same
//! code runs on a CDU's microcontroller, in the twin and in production. This
//! crate is the rest of the controller around it: the Modbus client, the
//! real-time shell on the bus, the northbound Modbus server, the board pins,
//! the console and the simulate command.
//!
//! Glossary:
//! - *CDU*: coolant distribution unit: the heat exchanger and pumps between
//!   the facility water and the racks' secondary loop.
//! - *supply / return*: coolant temperature into / out of the racks.
//! - *failsafe*: fixed conservative setpoints while the controller cannot
//!   trust its sensors.

pub mod config;

pub mod console;

/// The decision path between the CDU and the control core, shared with
/// the firmware (the `cooling-decide` crate).
pub use cooling_decide as decide;

pub mod estimates;

pub mod facility;

pub mod gateway;

#[cfg(target_os = "linux")]
pub mod gpio;

pub mod journal;

pub mod metrics;

pub mod modbus;

pub mod northbound;

pub mod replay;

pub mod shell;

pub mod site_figures;

pub mod watchdog;

#[cfg(feature = "twin")]
pub mod simulated;

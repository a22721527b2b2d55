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
//! The control core is `no_std` and allocation-free, a pure
//! `step(now, readings) -> commands`, so the same code runs on a CDU's
//! microcontroller, in the twin and in production; this crate is `no_std`
//! from the start to keep it so. The core, the Modbus and MQTT shell and the
//! northbound Modbus server land with their own pieces of work.
//!
//! Glossary:
//! - *CDU*: coolant distribution unit: the heat exchanger and pumps between
//!   the facility water and the racks' secondary loop.
//! - *supply / return*: coolant temperature into / out of the racks.
//! - *failsafe*: fixed conservative setpoints while the controller cannot
//!   trust its sensors.

#![no_std]

#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod core;

#[cfg(feature = "std")]
pub mod config;

#[cfg(feature = "std")]
pub mod console;

#[cfg(all(feature = "std", target_os = "linux"))]
pub mod gpio;

#[cfg(feature = "std")]
pub mod journal;

#[cfg(feature = "std")]
pub mod modbus;

#[cfg(feature = "std")]
pub mod northbound;

#[cfg(feature = "std")]
pub mod shell;

#[cfg(feature = "std")]
pub mod site_figures;

#[cfg(feature = "twin")]
pub mod simulated;

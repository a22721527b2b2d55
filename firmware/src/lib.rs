//! # loopwarden-firmware: the CDU's controller on a microcontroller
//!
//! The Linux controller's decision path (`cooling_decide::Decider`, around
//! `cooling_core::Core`) on a Cortex-M4F, here Arm's MPS2 AN386 as QEMU
//! models it: a hardware timer sets the control period; each step takes
//! what the gateway said (UART1, the link's frames), reads the CDU over
//! Modbus RTU (UART0), decides, keeps the latched record in NOR flash
//! before anything acts, writes the settings in the Linux controller's
//! order, tells the gateway its state, events and leases, writes every
//! input it decided on to the debug port (UART3) for replay elsewhere,
//! prints a status line on the console (UART2) and feeds the watchdog.
//!
//! The pure parts build and are tested on the host
//! (`cargo test --target x86_64-unknown-linux-gnu --lib`): the register
//! map ([`map`], generated from `boards/cdus/*.toml`), the CDU's
//! measurements and the map's limits ([`cdu`]), the Modbus RTU master
//! ([`rtu`]), a step's read of it, span by span, a failed span losing
//! only its own registers ([`reads`]), a step's time planned on the worst of its waits
//! ([`budget`]), a plan's writes carried out ([`writes`]) and its
//! safety writes read back ([`read_back`]), the latched
//! record's flash items ([`latch`]) and the other counts kept there
//! ([`counters`]), the hall's figures built in ([`figures`]), what the
//! estimator learned, restored and kept ([`learned`]), operators'
//! clears ([`clears`]), frames out without waiting ([`outbound`]), the
//! controller around the decision path and its trace ([`controller`]),
//! the steps' cost ([`cost`]), the NOR rules ([`board::nor`]) and what
//! a panic does ([`after_panic`]). The build script's checks of the
//! board file run with them (`build_checks`: `cargo test` runs no build
//! script's tests). The drivers ([`board`]) touch registers and build for the
//! target only.
//!
//! Glossary:
//! - *step*: one control period's read, decision and writes.
//! - *board*: the microcontroller board, as data in `boards/mcu/`.
//! - *gateway*: the Linux process on the other end of UART1; it decides
//!   nothing.

#![cfg_attr(not(test), no_std)]
#![warn(missing_docs)]

pub mod after_panic;
pub mod block_on;
pub mod board;
pub mod budget;
#[cfg(test)]
mod build_checks;
pub mod cdu;
pub mod clears;
pub mod controller;
pub mod cost;
pub mod counters;
pub mod figures;
pub mod latch;
pub mod learned;
pub mod map;
pub mod outbound;
pub mod read_back;
pub mod reads;
pub mod rtu;
pub mod writes;

//! # loopwarden-firmware: the CDU's controller on a microcontroller
//!
//! The control core (`cooling_core::Core`) on a Cortex-M4F, here Arm's
//! MPS2 AN386 as QEMU models it: a hardware timer sets the control
//! period; each step reads the CDU over Modbus RTU on UART0, runs the
//! core, keeps the latched state in NOR flash before anything acts,
//! writes the settings in the Linux controller's order, feeds the
//! watchdog and prints a status line on UART2.
//!
//! The pure parts build and are tested on the host
//! (`cargo test --target x86_64-unknown-linux-gnu --lib`): the register
//! map ([`map`], generated from `boards/cdus/*.toml`), the CDU's
//! measurements ([`cdu`]), the Modbus RTU master ([`rtu`]), the writes of
//! a step ([`plan`]), the latched record ([`latch`]) and the NOR rules
//! ([`board::nor`]). The drivers ([`board`]) touch registers and build
//! for the target only.
//!
//! Glossary:
//! - *step*: one control period's read, decision and writes.
//! - *board*: the microcontroller board, as data in `boards/mcu/`.

#![cfg_attr(not(test), no_std)]
#![warn(missing_docs)]

pub mod block_on;
pub mod board;
pub mod cdu;
pub mod latch;
pub mod map;
pub mod plan;
pub mod rtu;

//! # loopwarden-link: the serial link between a CDU's microcontroller and its gateway
//!
//! The CDU controller can run as firmware on a microcontroller (`firmware/`,
//! docs/firmware.md) that drives the CDU over Modbus RTU and keeps the hall
//! safe on its own, with a Linux gateway beside it that carries what it
//! says to the bus and what the bus says to it. This crate is the wire
//! between them, and the debug port's trace: checked, numbered frames
//! ([`frame`]) of postcard messages. `no_std`, no allocator: the same code
//! runs on both sides.
//!
//! Glossary:
//! - *MCU*: the microcontroller running the control core.
//! - *gateway*: the Linux process beside it (`cooling-ctrl gateway`); it
//!   decides nothing.
//! - *frame*: one message on the wire ([`frame`]).
//! - *trace*: the firmware's debug-port record of every input its
//!   decision path took, replayed on another machine ([`trace`]).

#![no_std]

pub mod frame;
pub mod message;
pub mod trace;

pub use frame::{Deframer, EncodeError, Fed, FrameError, Order, Received, SeqWatch, VERSION};
pub use message::{
    CduLayout, Clear, ClearAction, Cost, Down, Hello, RackBits, ResetCause, SignedClear, Status,
    Up, MAX_MESSAGE,
};

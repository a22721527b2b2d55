//! The instruction counter: SysTick, clocked by the CPU clock (SYSCLK,
//! 25 MHz), free-running over its 24 bits. QEMU 7.2 models no cycle
//! counter (DWT), but under `-icount shift=0` virtual time advances one
//! nanosecond per instruction executed, and SysTick counts virtual time,
//! so it counts instructions: one SysTick tick is 40 instructions
//! ([`INSTRUCTIONS_PER_TICK`]).
//!
//! Measured (`examples/icount_calibrate.rs`, QEMU 7.2 `-icount shift=0`):
//! loops of 40,000, 400,000, 4 million and 40 million instructions read
//! 1,000, 10,000, 100,000 and 1,000,000 ticks, exactly 40 instructions a
//! tick; an empty loop reads 0. A count is therefore exact to within one
//! tick: between the figure and 39 instructions more.
//!
//! A span longer than 2^24 ticks (0.67 s, 671 million instructions)
//! wraps and reads short; a step is far below.
//!
//! Registers: SYST_CSR (0xE000E010: bit 0 enable, bit 2 CPU clock),
//! SYST_RVR (0xE000E014), SYST_CVR (0xE000E018).
//!
//! Glossary:
//! - *tick*: one count of SysTick, one SYSCLK period.

use super::{read, write, SYSTEM_CLOCK_HZ};

const CSR: u32 = 0xE000_E010;
const RVR: u32 = 0xE000_E014;
const CVR: u32 = 0xE000_E018;
const MASK: u32 = 0x00FF_FFFF;

/// Instructions per SysTick tick under `-icount shift=0`: a nanosecond
/// per instruction over SYSCLK's period.
pub const INSTRUCTIONS_PER_TICK: u32 = 1_000_000_000 / SYSTEM_CLOCK_HZ;

/// Starts SysTick free-running on the CPU clock, no interrupt.
pub fn start() {
    // SAFETY: the core's SysTick registers; nothing else uses SysTick.
    unsafe {
        write(CSR, 0);
        write(RVR, MASK);
        write(CVR, 0);
        write(CSR, (1 << 2) | 1);
    }
}

/// The counter now (it counts down).
pub fn now() -> u32 {
    // SAFETY: a read of SysTick's current value.
    unsafe { read(CVR) & MASK }
}

/// Ticks from `start` (an earlier [`now`]) to `end`.
pub fn ticks_between(start: u32, end: u32) -> u32 {
    start.wrapping_sub(end) & MASK
}

/// Instructions from `start` (an earlier [`now`]) to now.
pub fn instructions_since(start: u32) -> u32 {
    ticks_between(start, now()) * INSTRUCTIONS_PER_TICK
}

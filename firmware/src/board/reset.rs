//! Why the board last started. The CMSDK watchdog keeps no state across
//! the reset it causes, and QEMU's MPS2 has no reset-cause register, so
//! the firmware marks one word of RAM that neither a load nor a reset
//! touches (the board file's `reset_cause`): the watchdog's interrupt
//! (its first expiry: the reset follows unless a step feeds it) marks
//! [`ResetCause::Watchdog`], a panic or a hard fault marks
//! [`ResetCause::Fault`] (and waits for the watchdog), a feed marks
//! the board running again. At boot the mark read is the cause: anything
//! but the two marks (a cold start's RAM, a running board's reset by its
//! button) reads as power-on.
//!
//! Glossary:
//! - *mark*: the word's value, one of three tags.

use loopwarden_link::ResetCause;

use super::{read, write, RESET_CAUSE_ADDR};

/// Running normally: a reset now is not the firmware's doing.
const RUNNING: u32 = 0x5255_4E21;
/// The watchdog's first expiry passed without a feed.
const WATCHDOG: u32 = 0x5744_4F47;
/// A panic or a hard fault stopped the firmware.
const FAULT: u32 = 0x4641_554C;

/// The cause of this start, read once at boot; the board is marked
/// running from here.
pub fn take() -> ResetCause {
    // SAFETY: the board file's reset-cause word, RAM outside the image.
    let mark = unsafe { read(RESET_CAUSE_ADDR) };
    running();
    match mark {
        WATCHDOG => ResetCause::Watchdog,
        FAULT => ResetCause::Fault,
        _ => ResetCause::PowerOn,
    }
}

/// A step completed: the board runs.
pub fn running() {
    // SAFETY: as in `take`.
    unsafe { write(RESET_CAUSE_ADDR, RUNNING) };
}

/// The watchdog's first expiry: a reset follows unless a step feeds it.
/// A fault's mark stays (it is why the steps stopped).
pub fn watchdog_expired() {
    // SAFETY: as in `take`.
    unsafe {
        if read(RESET_CAUSE_ADDR) != FAULT {
            write(RESET_CAUSE_ADDR, WATCHDOG);
        }
    }
}

/// The firmware stopped on a fault; the watchdog resets the board.
pub fn fault() {
    // SAFETY: as in `take`.
    unsafe { write(RESET_CAUSE_ADDR, FAULT) };
}

/// A hard fault: marked, then the watchdog resets the board.
#[cortex_m_rt::exception]
unsafe fn HardFault(_: &cortex_m_rt::ExceptionFrame) -> ! {
    fault();
    loop {
        cortex_m::asm::nop();
    }
}

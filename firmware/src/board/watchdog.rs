//! The CMSDK APB watchdog (Arm DDI 0479C, 4.7): a counter of SYSCLK that
//! raises its interrupt (the NMI on this board) when it reaches zero and
//! reloads; if the interrupt is still raised when it reaches zero again,
//! it resets the board. The firmware feeds it only after a completed
//! step, so a step that hangs is reset after two timeouts; the NMI in
//! between marks the reset's cause ([`super::reset`]) and is counted for
//! the console.
//!
//! Registers: LOAD (+0x00), VALUE (+0x04), CTRL (+0x08: bit 0 interrupt
//! enable, bit 1 reset enable), INTCLR (+0x0C: any write clears the
//! interrupt and reloads), RIS (+0x10), LOCK (+0xC00: 0x1ACCE551 unlocks
//! the others).
//!
//! Glossary:
//! - *feed*: clearing the interrupt and reloading the counter.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::{write, SYSTEM_CLOCK_HZ, WATCHDOG_BASE, WATCHDOG_TIMEOUT_MS};

const LOAD: u32 = 0x00;
const CTRL: u32 = 0x08;
const INTCLR: u32 = 0x0C;
const LOCK: u32 = 0xC00;
const UNLOCK: u32 = 0x1ACC_E551;

/// NMIs taken (a step overdue by one timeout).
static WARNINGS: AtomicU32 = AtomicU32::new(0);

/// The watchdog was started (it is never stopped).
static STARTED: AtomicBool = AtomicBool::new(false);

/// Whether the watchdog was started: a panic before it would hang the
/// board for good unless the panic handler resets it
/// ([`crate::after_panic`]).
pub fn started() -> bool {
    STARTED.load(Ordering::Relaxed)
}

/// Starts the watchdog with the board's timeout.
pub fn start() {
    let load = WATCHDOG_TIMEOUT_MS * (SYSTEM_CLOCK_HZ / 1000);
    // SAFETY: the board's watchdog (board file); the timeout's ticks fit
    // 32 bits (checked at build time).
    unsafe {
        write(WATCHDOG_BASE + LOCK, UNLOCK);
        write(WATCHDOG_BASE + LOAD, load);
        write(WATCHDOG_BASE + CTRL, 0b11);
        write(WATCHDOG_BASE + LOCK, 0);
    }
    STARTED.store(true, Ordering::Relaxed);
}

/// Feeds the watchdog: call after a completed step only. The board is
/// marked running again ([`super::reset`]).
pub fn feed() {
    super::reset::running();
    // SAFETY: the board's watchdog; unlocked for the one write.
    unsafe {
        write(WATCHDOG_BASE + LOCK, UNLOCK);
        write(WATCHDOG_BASE + INTCLR, 1);
        write(WATCHDOG_BASE + LOCK, 0);
    }
}

/// NMIs taken since boot.
pub fn warnings() -> u32 {
    WARNINGS.load(Ordering::Relaxed)
}

/// The watchdog's first expiry: counted, and left raised so the second
/// resets the board unless a step completes and feeds it first.
#[cortex_m_rt::exception]
unsafe fn NonMaskableInt() {
    WARNINGS.fetch_add(1, Ordering::Relaxed);
    super::reset::watchdog_expired();
}

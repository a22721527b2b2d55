//! Time on the board, from SYSCLK counted by three timers:
//! - TIMER0 (CMSDK APB timer) interrupts once per control period: the
//!   control tick ([`wait_for_tick`]);
//! - TIMER1 (CMSDK APB timer) counts down free-running over 32 bits and
//!   interrupts never; [`now_us`] extends it to 64 bits on each read (a
//!   wrap every 171.8 s, read far more often). A clock built on counted
//!   interrupts runs slow whenever two of them merge into one, which
//!   QEMU does when the host wakes it late from a sleep;
//! - the dual timer's first counter (SP804-like) interrupts every
//!   millisecond only to wake a sleeping loop, so a deadline is never
//!   slept past by more.
//!
//! Under QEMU's `-icount` these timers count virtual time; while the CPU
//! sleeps (`wfi`) virtual time follows the host's clock, so a control
//! period is a real second as the simulated CDU sees it.
//!
//! Registers, CMSDK APB timer: CTRL (+0x00: bit 0 enable, bit 3
//! interrupt enable), VALUE (+0x04), RELOAD (+0x08), INTSTATUS/INTCLEAR
//! (+0x0C, bit 0). Dual timer, counter 1: LOAD (+0x00), CONTROL (+0x08:
//! bit 7 enable, bit 6 periodic, bit 5 interrupt enable, bit 1 32-bit),
//! INTCLR (+0x0C).
//!
//! Glossary:
//! - *tick*: one control period elapsed (TIMER0's interrupt).

use core::cell::Cell;
use core::sync::atomic::{AtomicU32, Ordering};

use cortex_m::interrupt::{self, Mutex};

use super::{
    read, write, Irq, CONTROL_PERIOD_MS, SYSTEM_CLOCK_HZ, TIMER_CONTROL, TIMER_MICROS, TIMER_WAKE,
};
use crate::rtu;

const CTRL: u32 = 0x00;
const VALUE: u32 = 0x04;
const RELOAD: u32 = 0x08;
const INTSTATUS: u32 = 0x0C;
const CTRL_ENABLE: u32 = 1 << 0;
const CTRL_INT_EN: u32 = 1 << 3;

const DUAL_LOAD: u32 = 0x00;
const DUAL_CONTROL: u32 = 0x08;
const DUAL_INTCLR: u32 = 0x0C;
const DUAL_ENABLE_PERIODIC_INT_32: u32 = (1 << 7) | (1 << 6) | (1 << 5) | (1 << 1);

/// SYSCLK ticks in a microsecond.
const TICKS_PER_US: u64 = SYSTEM_CLOCK_HZ as u64 / 1_000_000;

static TICKS: AtomicU32 = AtomicU32::new(0);
/// TIMER1's counts so far (64 bits) and its value at the last read.
static ELAPSED: Mutex<Cell<(u64, u32)>> = Mutex::new(Cell::new((0, u32::MAX)));

/// Starts the three timers. Call once, at boot.
pub fn start() {
    let period = CONTROL_PERIOD_MS * (SYSTEM_CLOCK_HZ / 1000) - 1;
    // SAFETY: the board's timers (board file); the control period's ticks
    // fit 32 bits (checked at build time).
    unsafe {
        for (t, reload, irq) in [
            (&TIMER_MICROS, u32::MAX, false),
            (&TIMER_CONTROL, period, true),
        ] {
            write(t.base + CTRL, 0);
            write(t.base + RELOAD, reload);
            write(t.base + VALUE, reload);
            write(t.base + INTSTATUS, 1);
            write(
                t.base + CTRL,
                CTRL_ENABLE | if irq { CTRL_INT_EN } else { 0 },
            );
        }
        cortex_m::peripheral::NVIC::unmask(Irq(TIMER_CONTROL.irq));
        write(TIMER_WAKE.base + DUAL_CONTROL, 0);
        write(TIMER_WAKE.base + DUAL_LOAD, SYSTEM_CLOCK_HZ / 1000);
        write(TIMER_WAKE.base + DUAL_INTCLR, 1);
        write(TIMER_WAKE.base + DUAL_CONTROL, DUAL_ENABLE_PERIODIC_INT_32);
        cortex_m::peripheral::NVIC::unmask(Irq(TIMER_WAKE.irq));
    }
}

/// TIMER0's interrupt.
pub fn on_control_tick() {
    // SAFETY: TIMER0's own interrupt clear.
    unsafe { write(TIMER_CONTROL.base + INTSTATUS, 1) };
    TICKS.fetch_add(1, Ordering::Relaxed);
}

/// The wake-up timer's interrupt: cleared, nothing else.
pub fn on_wake() {
    // SAFETY: the dual timer's own interrupt clear.
    unsafe { write(TIMER_WAKE.base + DUAL_INTCLR, 1) };
}

/// Microseconds since [`start`].
pub fn now_us() -> u64 {
    interrupt::free(|cs| {
        let cell = ELAPSED.borrow(cs);
        let (elapsed, last) = cell.get();
        // SAFETY: a read of TIMER1's counter.
        let value = unsafe { read(TIMER_MICROS.base + VALUE) };
        // It counts down; from `last` to `value` across a wrap or not.
        let elapsed = elapsed + u64::from(last.wrapping_sub(value));
        cell.set((elapsed, value));
        elapsed / TICKS_PER_US
    })
}

/// Control ticks since [`start`].
pub fn ticks() -> u32 {
    TICKS.load(Ordering::Relaxed)
}

/// Sleeps until an interrupt unless `ready()` already holds; checked with
/// interrupts off, so an interrupt that makes it hold is not slept past.
pub fn sleep_unless(ready: impl Fn() -> bool) {
    interrupt::free(|_| {
        if !ready() {
            cortex_m::asm::wfi();
        }
    });
}

/// Waits for the control tick after `seen`; returns the tick count.
pub fn wait_for_tick(seen: u32) -> u32 {
    loop {
        let t = ticks();
        if t != seen {
            return t;
        }
        sleep_unless(|| ticks() != seen);
    }
}

/// The board's clock for the Modbus master: it sleeps until a byte or a
/// millisecond.
#[derive(Debug, Default)]
pub struct BoardClock;

impl rtu::Clock for BoardClock {
    fn now_us(&mut self) -> u64 {
        now_us()
    }

    fn idle(&mut self) {
        sleep_unless(super::uart::any_received);
    }
}

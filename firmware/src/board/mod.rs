//! The board: its figures as data (generated from
//! `boards/mcu/mps2-an386.toml` by the build) and a small driver for each
//! part the firmware uses. The NOR rules ([`nor`]) are pure and tested on
//! the host; the others touch the hardware's registers and build for the
//! target only:
//! - [`uart`]: the CMSDK APB UARTs (UART0 Modbus RTU to the CDU, UART1
//!   the gateway link, UART2 the console, UART3 the debug port's trace),
//!   bytes in by interrupt;
//! - [`clock`]: the control tick (TIMER0), the microsecond clock
//!   (TIMER1) and a millisecond wake-up (the dual timer), and sleeping
//!   until an interrupt;
//! - [`icount`]: the instruction counter (SysTick under `-icount`);
//! - [`watchdog`]: the CMSDK APB watchdog;
//! - [`reset`]: why the board last started, marked in RAM no reset
//!   touches;
//! - [`stack`]: the painted stack's high-water mark;
//! - [`led`]: the FPGA's LEDs as `embedded-hal` output pins.
//!
//! Glossary:
//! - *IRQ*: an interrupt line's number on the NVIC, from the board file.
//! - *SYSCLK*: the board's system clock; every part here counts it.

pub mod nor;

#[cfg(target_arch = "arm")]
pub mod clock;
#[cfg(target_arch = "arm")]
pub mod icount;
#[cfg(target_arch = "arm")]
pub mod led;
#[cfg(target_arch = "arm")]
pub mod reset;
#[cfg(target_arch = "arm")]
pub mod stack;
#[cfg(target_arch = "arm")]
pub mod uart;
#[cfg(target_arch = "arm")]
pub mod watchdog;

/// A UART as the board file gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uart {
    /// Its name on the board.
    pub name: &'static str,
    /// Its registers' base address.
    pub base: u32,
    /// Its receive interrupt.
    pub rx_irq: u8,
    /// Its baud rate.
    pub baud: u32,
}

/// A timer as the board file gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    /// Its name on the board.
    pub name: &'static str,
    /// Its registers' base address.
    pub base: u32,
    /// Its interrupt.
    pub irq: u8,
}

include!(concat!(env!("OUT_DIR"), "/board.rs"));

/// Reads a 32-bit register.
///
/// # Safety
/// `addr` is a register of this board that may be read.
#[cfg(target_arch = "arm")]
#[inline(always)]
pub(crate) unsafe fn read(addr: u32) -> u32 {
    core::ptr::read_volatile(addr as *const u32)
}

/// Writes a 32-bit register.
///
/// # Safety
/// `addr` is a register of this board that may be written with `v`.
#[cfg(target_arch = "arm")]
#[inline(always)]
pub(crate) unsafe fn write(addr: u32, v: u32) {
    core::ptr::write_volatile(addr as *mut u32, v)
}

/// An NVIC interrupt line by number.
#[cfg(target_arch = "arm")]
#[derive(Debug, Clone, Copy)]
pub struct Irq(pub u8);

#[cfg(target_arch = "arm")]
// SAFETY: the numbers come from the board file, which names the lines
// QEMU wires for this board (below the NVIC's 32 on AN386).
unsafe impl cortex_m::interrupt::InterruptNumber for Irq {
    fn number(self) -> u16 {
        u16::from(self.0)
    }
}

/// Dispatches the board's interrupts (no device crate: cortex-m-rt's
/// default handler gets every interrupt with its number).
#[cfg(target_arch = "arm")]
#[cortex_m_rt::exception]
unsafe fn DefaultHandler(irqn: i16) {
    let Ok(n) = u8::try_from(irqn) else {
        // A fault with no handler of its own: stop; the watchdog resets.
        reset::fault();
        loop {
            cortex_m::asm::nop();
        }
    };
    match n {
        n if n == TIMER_CONTROL.irq => clock::on_control_tick(),
        n if n == TIMER_WAKE.irq => clock::on_wake(),
        n => uart::on_rx_interrupt(n),
    }
}

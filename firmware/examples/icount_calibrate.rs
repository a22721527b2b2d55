//! Calibrates the instruction counter: runs a loop of known length
//! (`subs` and `bne`, two instructions an iteration) and prints what
//! SysTick counted for it on the console (UART2). Run under QEMU with
//! `-icount shift=0`:
//!
//! ```text
//! cargo build --release --example icount_calibrate
//! qemu-system-arm -M mps2-an386 -nographic -icount shift=0 -serial null \
//!   -serial null -serial stdio -monitor none \
//!   -kernel ../target/firmware/thumbv7em-none-eabihf/release/examples/icount_calibrate
//! ```
//!
//! Glossary:
//! - *overhead*: the instructions around the loop (reading SysTick, the
//!   call), measured with an empty loop.

#![no_std]
#![no_main]

use core::fmt::Write as _;

use cortex_m_rt::entry;
use loopwarden_firmware::board::icount;
use loopwarden_firmware::board::uart::Uart;

/// Runs `n` iterations of a two-instruction loop.
#[inline(never)]
fn spin(n: u32) {
    // SAFETY: a register-only countdown loop.
    unsafe {
        core::arch::asm!("1:", "subs {0}, {0}, #1", "bne 1b", inout(reg) n => _, options(nomem, nostack));
    }
}

fn ticks_for(n: u32) -> u32 {
    let t0 = icount::now();
    spin(n);
    icount::ticks_between(t0, icount::now())
}

#[entry]
fn main() -> ! {
    let mut console = Uart::console();
    icount::start();
    let base = ticks_for(1);
    let _ = writeln!(console, "icount: an empty loop reads {base} SysTick ticks");
    for n in [20_000u32, 200_000, 2_000_000, 20_000_000] {
        let ticks = ticks_for(n);
        let insn = 2 * u64::from(n);
        let per_tick_milli = insn * 1000 / u64::from(ticks.max(1));
        let _ = writeln!(
            console,
            "icount: {insn} instructions counted {ticks} ticks: {}.{:03} instructions per tick",
            per_tick_milli / 1000,
            per_tick_milli % 1000
        );
    }
    let _ = writeln!(console, "icount: done");
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

//! Shows on QEMU that a starved watchdog resets the board, and what
//! memory survives the reset. Each boot it prints, on the console (UART2):
//! - a boot count kept in PSRAM just past the NOR region (outside the
//!   loaded image), and a word in SSRAM2/3 between the statics and the
//!   stack (RAM the image neither loads nor clears at startup);
//! - the latched record read back through the flash crate from the NOR
//!   region, then writes the next one;
//!
//! then starves the watchdog (sleeps, never feeds) for the first two
//! boots, and feeds it from the third on.
//!
//! ```text
//! cargo build --release --example watchdog_reset
//! timeout 15 qemu-system-arm -M mps2-an386 -nographic -icount shift=0 \
//!   -serial null -serial null -serial stdio -monitor none \
//!   -kernel ../target/firmware/thumbv7em-none-eabihf/release/examples/watchdog_reset
//! ```
//!
//! Glossary:
//! - *marker*: a word that says a value was written by an earlier boot.

#![no_std]
#![no_main]

use core::fmt::Write as _;

use cooling_core::Latched;
use cooling_decide::LatchRecord;
use cortex_m_rt::entry;
use loopwarden_firmware::block_on::block_on;
use loopwarden_firmware::board::nor::{store_start, RamNor, StoreStart};
use loopwarden_firmware::board::uart::Uart;
use loopwarden_firmware::board::{self, clock, watchdog};
use loopwarden_firmware::latch;
use loopwarden_flash::ConfigStore;

const MARKER: u32 = 0x4C57_4254;
/// Marker and boot count, in PSRAM just past the NOR region.
const PSRAM_WORDS: u32 = board::NOR_BASE + board::NOR_BYTES;
/// A marker in SSRAM2/3 past the statics, below the stack.
const SSRAM_WORD: u32 = board::RAM_BASE + board::RAM_BYTES / 2;

fn peek(addr: u32) -> u32 {
    // SAFETY: RAM of this board outside anything the image uses.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

fn poke(addr: u32, v: u32) {
    // SAFETY: as `peek`.
    unsafe { core::ptr::write_volatile(addr as *mut u32, v) }
}

/// Boots counted so far, this one included.
fn count_boot(console: &mut Uart) -> u32 {
    let boots = if peek(PSRAM_WORDS) == MARKER {
        peek(PSRAM_WORDS + 4) + 1
    } else {
        1
    };
    poke(PSRAM_WORDS, MARKER);
    poke(PSRAM_WORDS + 4, boots);
    let ssram = if peek(SSRAM_WORD) == MARKER {
        "kept"
    } else {
        "not set (first boot) or lost"
    };
    poke(SSRAM_WORD, MARKER);
    let _ = writeln!(
        console,
        "boot {boots}: PSRAM count kept: {}; SSRAM2/3 marker {ssram}",
        boots > 1
    );
    boots
}

/// Reads the latched record back and writes the next.
fn latch_round(console: &mut Uart, boots: u32) {
    // SAFETY: the NOR region of the board file, referenced once.
    let bytes = unsafe {
        core::slice::from_raw_parts_mut(board::NOR_BASE as *mut u8, board::NOR_BYTES as usize)
    };
    let mut nor = RamNor::new(bytes);
    let r = board::NOR_CONFIG;
    if store_start(&nor, r.clone(), board::NOR_STARTS_ZEROED) == StoreStart::Erase {
        let _ = nor.erase_sectors(r.start, r.end);
    }
    let Ok(mut store) = ConfigStore::open(nor, board::NOR_CONFIG) else {
        let _ = writeln!(console, "flash: the config store did not open");
        return;
    };
    match block_on(latch::load(&mut store)) {
        Ok(Some(r)) => {
            let _ = writeln!(
                console,
                "latch: generation {} read back, leaks {:#06b}",
                r.generation, r.latched.leaks
            );
        }
        Ok(None) => {
            let _ = writeln!(console, "latch: none in flash");
        }
        Err(e) => {
            let _ = writeln!(console, "latch: {e}");
        }
    }
    let next = LatchRecord {
        generation: boots,
        latched: Latched {
            leaks: 1 << (boots % 4),
            ..Latched::default()
        },
    };
    if block_on(latch::save(&mut store, &next)).is_ok() {
        let _ = writeln!(
            console,
            "latch: generation {boots} written, leaks {:#06b}",
            next.latched.leaks
        );
    }
}

#[entry]
fn main() -> ! {
    let mut console = Uart::console();
    clock::start();
    let boots = count_boot(&mut console);
    latch_round(&mut console, boots);
    watchdog::start();
    if boots < 3 {
        let _ = writeln!(
            console,
            "watchdog: started, starving it (expect the NMI, then a reset)"
        );
        let mut warned = 0;
        loop {
            clock::sleep_unless(|| watchdog::warnings() != warned);
            if watchdog::warnings() != warned {
                warned = watchdog::warnings();
                let _ = writeln!(
                    console,
                    "watchdog: NMI at {} ms: one timeout without a feed",
                    clock::now_us() / 1000
                );
            }
        }
    }
    let _ = writeln!(console, "watchdog: fed from now on; done");
    let mut tick = clock::ticks();
    loop {
        tick = clock::wait_for_tick(tick);
        watchdog::feed();
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

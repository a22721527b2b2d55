//! The stack's high-water mark. At reset cortex-m-rt paints the stack
//! (`paint-stack`: every word from `_stack_end` to `_stack_start` is
//! [`PAINT`]); the linker script generated from the board file puts
//! `_stack_end` the board's `stack.bytes` below the top of RAM. The
//! deepest word no longer painted is the deepest the stack has reached.
//!
//! Glossary:
//! - *high-water mark*, *peak*: the most stack used since reset, bytes.

/// The paint (cortex-m-rt's `STACK_PAINT_VALUE`).
pub const PAINT: u32 = 0xCCCC_CCCC;

extern "C" {
    static _stack_start: u32;
    static _stack_end: u32;
}

fn bounds() -> (*const u32, *const u32) {
    // Linker symbols: only their addresses are taken.
    (&raw const _stack_end, &raw const _stack_start)
}

/// The most stack used since reset, bytes; `Err` with the budget when the
/// stack has reached its bottom (it may have gone past).
pub fn peak_bytes() -> Result<u32, u32> {
    let (bottom, top) = bounds();
    let budget = top as u32 - bottom as u32;
    let mut p = bottom;
    while p < top {
        // SAFETY: inside the stack region, word aligned (linker asserts).
        if unsafe { core::ptr::read_volatile(p) } != PAINT {
            break;
        }
        p = p.wrapping_add(1);
    }
    if p == bottom {
        return Err(budget);
    }
    Ok(top as u32 - p as u32)
}

/// Paints the stack again below the caller's frame, so the high-water
/// mark from here on is the steps' own (boot's is read before).
#[inline(never)]
pub fn repaint() {
    let (bottom, _) = bounds();
    cortex_m::interrupt::free(|_| {
        // Below this function's frame, less a margin for the loop itself.
        let sp = cortex_m::register::msp::read() as usize - 64;
        let mut p = bottom as *mut u32;
        while (p as usize) < sp {
            // SAFETY: between the stack's bottom and below the live frames,
            // with interrupts off: no live data is there.
            unsafe { core::ptr::write_volatile(p, PAINT) };
            p = p.wrapping_add(1);
        }
    });
}

//! The firmware's entry: boot, then one control step per tick.
//!
//! Boot: the stack is painted (by cortex-m-rt, before `main`); the
//! clocks start; the reset's cause is read ([`board::reset`]); the flash
//! counts the start and gives the latched record; the decision path
//! ([`cooling_decide::Decider`], about 19 KB: more than the stack's
//! budget) starts in place in its static, made at compile time, from
//! that record (an unreadable one is the decider's relatch at the
//! CDU's first answer); `Up::Hello` goes to the gateway and `Trace::Boot`
//! and the start to the debug port; what the estimator learned is
//! restored from the flash, part by part, through the decision path
//! (traced); the watchdog starts.
//!
//! Each control period (TIMER0's tick) a step, in the Linux shell's
//! order ([`loopwarden_firmware::controller`]): what the gateway said,
//! the CDU read over Modbus RTU, the decision, the record to flash, the
//! writes, the leases, events, status and cost to the gateway, what was
//! learned to flash every ten minutes (the parts that changed, while the
//! step's budget allows), the status line on the console; then the
//! watchdog is fed. Between steps the gateway's bytes are acted on and
//! the queued frames go out.
//!
//! A step's Modbus transactions stop when the period's budget
//! ([`shell::STEP_BUDGET_US`]) would be overrun, so a silent CDU cannot
//! make the steps late; no frame out ever waits (a dead gateway or an
//! unread debug port only drops frames, counted).
//!
//! Glossary:
//! - *boot peak*: the stack's high-water mark when boot is done; the
//!   steps' own peak is measured from there (the stack is painted again
//!   below boot's frames) and both are reported; the status's
//!   `stack_peak` is the larger.

#![no_std]
#![no_main]

mod shell;
mod status;

use core::fmt::Write as _;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, Ordering};

use cooling_core::CoreConfig;
use cooling_decide::learned::LearnedKeeper;
use cooling_decide::{Decider, LatchRecord};
use cortex_m_rt::entry;
use loopwarden_firmware::board::{self, clock, icount, reset, uart::Uart, watchdog};
use loopwarden_firmware::cdu::map_limits;
use loopwarden_firmware::clears::ClearGate;
use loopwarden_firmware::controller::Controller;
use loopwarden_firmware::latch::LoadError;
use loopwarden_link::ResetCause;

use shell::Shell;

/// The decision path, not started: made at compile time, for it cannot
/// be made on the stack ([`decider_in_place`] starts it).
static mut DECIDER: Decider = Decider::unstarted();
static DECIDER_TAKEN: AtomicBool = AtomicBool::new(false);
/// The keeper of what the estimator learned (the figures being kept and
/// each part's bytes, 4.6 KB), made at compile time.
static mut LEARNED: LearnedKeeper = LearnedKeeper::new();

#[entry]
fn main() -> ! {
    let mut console = Uart::console();
    let _ = writeln!(
        console,
        "loopwarden-firmware {}: boot on {} ({})",
        env!("CARGO_PKG_VERSION"),
        board::NAME,
        board::DESCRIPTION
    );
    clock::start();
    icount::start();
    let cause = reset::take();
    let (sh, read) = shell_in_place(console, cause);
    let decider = decider_in_place(&read);
    let ctl = controller_in_place(decider);
    sh.start(ctl, cause, &read);
    let boot_peak = board::stack::peak_bytes();
    sh.boot_done(boot_peak);
    board::stack::repaint();
    watchdog::start();
    let _ = writeln!(
        sh.console,
        "watchdog: {} ms to its NMI, reset at the second expiry; control period {} ms",
        board::WATCHDOG_TIMEOUT_MS,
        board::CONTROL_PERIOD_MS
    );
    let mut tick = clock::ticks();
    loop {
        tick = sh.wait_for_tick(ctl, tick);
        sh.step(ctl, tick);
    }
}

/// The board's shell, in its static (its buffers stay off the stack),
/// and what the flash held of the latched record.
#[inline(never)]
fn shell_in_place(console: Uart, cause: ResetCause) -> (&'static mut Shell, shell::Read) {
    let slot =
        cortex_m::singleton!(: MaybeUninit<Shell> = MaybeUninit::uninit()).expect("made once");
    let (sh, read) = Shell::boot(console, cause);
    (slot.write(sh), read)
}

/// The decision path, started in its static from the record the flash
/// held (`read`); a configuration it refuses stops the firmware.
#[inline(never)]
fn decider_in_place(read: &Result<Option<LatchRecord>, LoadError>) -> &'static mut Decider {
    assert!(
        !DECIDER_TAKEN.swap(true, Ordering::Relaxed),
        "the decision path is started once"
    );
    let p = &raw mut DECIDER;
    // SAFETY: the static's only reference, taken once (`DECIDER_TAKEN`).
    let d = unsafe { &mut *p };
    if let Err(e) = d.start(CoreConfig::default(), map_limits(), read) {
        panic!("the decision path's configuration: {e}");
    }
    d
}

/// The controller around `decider`, in its static, with the learned
/// figures' keeper in its own.
#[inline(never)]
fn controller_in_place(decider: &'static mut Decider) -> &'static mut Controller<'static> {
    let slot = cortex_m::singleton!(: MaybeUninit<Controller<'static>> = MaybeUninit::uninit())
        .expect("made once");
    // SAFETY: the static's only reference: this function runs once (the
    // singleton above panics at a second call).
    let p = &raw mut LEARNED;
    let learned = unsafe { &mut *p };
    slot.write(Controller::new(decider, ClearGate::built_in(), learned))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    reset::fault();
    // The console may be mid-line; a panic's line starts afresh.
    let mut console = Uart::console();
    let _ = writeln!(console, "\npanic: {info}; the watchdog resets the board");
    loop {
        cortex_m::asm::wfi();
    }
}

//! The firmware's entry: boot, then one control step per tick.
//!
//! Boot: the stack is painted (by cortex-m-rt, before `main`); the
//! clocks start; the reset's cause is read ([`board::reset`]); the flash
//! counts the start and gives the latched record; the hall's figures
//! built in are decoded and checked ([`loopwarden_firmware::figures`]);
//! the decision path ([`cooling_decide::Decider`], about 19 KB: more
//! than the stack's budget) starts in place in its static, made at
//! compile time, with those figures and from that record (an
//! unreadable one is the decider's relatch at the
//! CDU's first answer); `Up::Hello` goes to the gateway and `Trace::Boot`
//! and the start to the debug port; what the estimator learned is
//! restored from the flash, part by part, through the decision path
//! (traced); the watchdog starts.
//!
//! Each control period (TIMER0's tick) a step, in the Linux shell's
//! order ([`loopwarden_firmware::controller`]): what the gateway said,
//! the CDU read over Modbus RTU, the decision, the record to flash, the
//! writes, the events, status, leases and cost to the gateway, what was
//! learned to flash every ten minutes (the parts that changed, while the
//! step's budget allows), the status line on the console; then the
//! watchdog is fed. Between steps the gateway's bytes are acted on and
//! the queued frames go out.
//!
//! A step's Modbus transactions stop when the period's budget
//! ([`loopwarden_firmware::budget::STEP_BUDGET_US`]) would be overrun, so a silent CDU cannot
//! make the steps late; no frame out ever waits (a dead gateway or an
//! unread debug port only drops frames, counted).
//!
//! Figures the firmware refuses (a damaged record, or one the core
//! refuses) or a configuration the decision path refuses stop it before
//! its core runs ([`Shell::refuse`]): it says why on the console and to
//! the gateway, never starts the watchdog or the heartbeat, and the CDU
//! falls back on its own.
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
use loopwarden_firmware::after_panic::{after_panic, Action};
use loopwarden_firmware::board::{self, clock, icount, reset, uart::Uart, watchdog};
use loopwarden_firmware::cdu::{map_limits, valves_fit};
use loopwarden_firmware::clears::ClearGate;
use loopwarden_firmware::controller::Controller;
use loopwarden_firmware::figures::{self, built_in};
use loopwarden_firmware::latch::LoadError;
use loopwarden_firmware::map;
use loopwarden_link::ResetCause;

use shell::Shell;

/// The decision path, not started: made at compile time, for it cannot
/// be made on the stack ([`decider_in_place`] starts it).
static mut DECIDER: Decider = Decider::unstarted();
static DECIDER_TAKEN: AtomicBool = AtomicBool::new(false);
/// The keeper of what the estimator learned (the figures being kept and
/// each part's bytes, 4.6 KB), made at compile time.
static mut LEARNED: LearnedKeeper = LearnedKeeper::new();
/// The hall's figures as the core starts with them, decoded here from
/// the record built in (off the stack).
static mut FIGURES: CoreConfig = CoreConfig::reference();

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
    let decider = core_in_place(sh, cause, &read);
    let ctl = controller_in_place(decider);
    ctl.set_digest(figures::digest(built_in::RECORD));
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

/// The decision path with the hall's figures built in, started from the
/// record the flash held (`read`); figures or a configuration refused
/// stop the firmware here, its core not run ([`Shell::refuse`]). The
/// figures are decoded into their static, off the stack.
#[inline(never)]
fn core_in_place(
    sh: &mut Shell,
    cause: ResetCause,
    read: &Result<Option<LatchRecord>, LoadError>,
) -> &'static mut Decider {
    let p = &raw mut FIGURES;
    // SAFETY: the static's only reference: this function runs once, from
    // `main` (which never returns), and the reference ends with it.
    let cfg = unsafe { &mut *p };
    if let Err(e) = figures::configure(built_in::RECORD, cfg) {
        sh.refuse(cause, format_args!("figures ({}): {e}", built_in::SOURCE));
    }
    say_figures(sh, cfg);
    if let Err(e) = valves_fit(map::VALVES_OPEN, cfg.layout.racks) {
        sh.refuse(
            cause,
            format_args!("the CDU's register map ({}): {e}", map::MODEL),
        );
    }
    match decider_in_place(cfg, read) {
        Ok(d) => d,
        Err(e) => sh.refuse(
            cause,
            format_args!("the decision path's configuration: {e}"),
        ),
    }
}

/// The hall the core runs, on the console.
#[inline(never)]
fn say_figures(sh: &mut Shell, cfg: &CoreConfig) {
    let l = &cfg.layout;
    let _ = writeln!(
        sh.console,
        "figures: {}: {} racks of {} hosts of {} GPUs, {} CDU(s) on the facility water (digest {:#010x})",
        built_in::SOURCE,
        l.racks,
        l.hosts_per_rack,
        l.gpus_per_host,
        cfg.facility.cdus,
        figures::digest(built_in::RECORD)
    );
}

/// The decision path, started in its static with `cfg` from the record
/// the flash held (`read`); a configuration it refuses is the caller's
/// to refuse.
#[inline(never)]
fn decider_in_place(
    cfg: &CoreConfig,
    read: &Result<Option<LatchRecord>, LoadError>,
) -> Result<&'static mut Decider, cooling_core::ConfigError> {
    assert!(
        !DECIDER_TAKEN.swap(true, Ordering::Relaxed),
        "the decision path is started once"
    );
    let p = &raw mut DECIDER;
    // SAFETY: the static's only reference, taken once (`DECIDER_TAKEN`).
    let d = unsafe { &mut *p };
    d.start(*cfg, map_limits(), read)?;
    Ok(d)
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

/// A panic: said on the console; the watchdog, no longer fed, resets
/// the board, or the core resets itself where the watchdog was not
/// started yet (a panic at boot would otherwise hang the board for good):
/// `loopwarden_firmware::after_panic`.
#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    reset::fault();
    let (action, words) = after_panic(watchdog::started());
    // The console may be mid-line; a panic's line starts afresh.
    let mut console = Uart::console();
    let _ = writeln!(console, "\npanic: {info}; {words}");
    if action == Action::Reset {
        // About the watchdog's timeout on the board's clock: a panic at
        // every boot restarts at a watchdog's pace.
        cortex_m::asm::delay(board::WATCHDOG_TIMEOUT_MS * (board::SYSTEM_CLOCK_HZ / 1000));
        cortex_m::peripheral::SCB::sys_reset();
    }
    loop {
        cortex_m::asm::wfi();
    }
}

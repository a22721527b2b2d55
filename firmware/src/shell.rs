//! The board's side of the controller: it moves bytes and decides
//! nothing. The ports ([`Ports`]): frames to the gateway on UART1 and to
//! the debug port on UART3, each through a static queue that the UART
//! drains as it takes bytes (never a wait), and text lines on the
//! console (UART2). The Modbus RTU master on UART0, the flash (the
//! latched record and the mark that one was kept, the boot count, the
//! operators' last clear ids, what the estimator learned:
//! [`LearnedFlash`]), the LEDs, and each step's
//! sequence and timing ([`Shell::step`]).
//!
//! Glossary:
//! - *work*: the step's instructions outside its Modbus transactions
//!   (their waits are the CDU's and the line's time, not the board's).

use core::fmt::{self, Write as _};
use core::sync::atomic::{AtomicBool, Ordering};

use cooling_core::estimate::record::MAX_LEN;
use cooling_decide::{CduMeasurements, LatchRecord, Opening, Outcome, Plan, Setting};
use embedded_hal::digital::{OutputPin, StatefulOutputPin};
use loopwarden_firmware::block_on::block_on;
use loopwarden_firmware::board::clock::{self, BoardClock};
use loopwarden_firmware::board::nor::NorError;
use loopwarden_firmware::board::nor::{store_start, RamNor, StoreStart};
use loopwarden_firmware::board::{self, icount, led::Led, uart, uart::Uart, watchdog};
use loopwarden_firmware::budget::{self, StepBudget, Transaction};
use loopwarden_firmware::clears::{keyring, Last, Taken, MAX_OPERATORS};
use loopwarden_firmware::controller::{said_words, Controller, Ports, StepKeep};
use loopwarden_firmware::latch::{self, LoadError};
use loopwarden_firmware::learned::{self, LearnedFlash};
use loopwarden_firmware::map::{self, Register, Span};
use loopwarden_firmware::outbound::{FrameBuffers, FramedPort, GATEWAY_QUEUE};
use loopwarden_firmware::read_back::{HoldingPort, SafetyHeld};
use loopwarden_firmware::reads::{self, InputPort, ReadErrors};
use loopwarden_firmware::writes::{self, SettingPort};
use loopwarden_firmware::{counters, rtu};
use loopwarden_flash::{ConfigStore, StoreError};
use loopwarden_link::trace::Trace;
use loopwarden_link::{Hello, ResetCause, Up};

use crate::status::Line;

mod clears;

/// How long the CDU is given to answer a request, µs: a read's answer
/// is 27 bytes (14 ms at 19,200 baud); the rest is the CDU's turnaround.
const RESPONSE_TIMEOUT_US: u32 = 200_000;
/// One Modbus transaction's least and worst on the CDU's line, µs.
const TRANSACTION: Transaction = Transaction {
    least_us: budget::transaction_least_us(board::UART_MODBUS.baud, map::longest_answer_bytes()),
    worst_us: budget::transaction_worst_us(board::UART_MODBUS.baud, RESPONSE_TIMEOUT_US),
};
// A Modbus line too slow for the firmware's timing does not build: the
// longest answer and the CDU's least turnaround must fit the response
// timeout, and the least transaction a step's budget.
const _: () = assert!(
    map::longest_answer_bytes() as u64 * rtu::char_us(board::UART_MODBUS.baud) as u64
        + budget::TURNAROUND_LEAST_US
        < RESPONSE_TIMEOUT_US as u64,
    "the Modbus UART's baud rate is too slow for the longest answer within the response timeout"
);
const _: () = assert!(
    TRANSACTION.least_us <= budget::STEP_BUDGET_US,
    "the Modbus UART's baud rate is too slow for one transaction within a step's budget"
);
/// The latched record's keep at its worst on the board's NOR part, µs
/// (the board file's `nor.item_worst_us` for each item). The PSRAM
/// standing in for the part writes in microseconds; the step is planned
/// on the part a real board carries.
const LATCH_KEEP_WORST_US: u64 = budget::LATCH_ITEMS * board::NOR_ITEM_WORST_US;
/// How often a firmware that refuses to run its core says why again, ms:
/// to a gateway started since, and the console's reader.
const REFUSAL_EVERY_MS: u32 = 60_000;
/// Bytes of frames waiting for the debug port: a step's trace several
/// times over.
const TRACE_QUEUE: usize = 16384;

type Cdu = rtu::RtuMaster<Uart, BoardClock>;
type Store = ConfigStore<RamNor<'static>>;
/// What the flash held of the latched record.
pub type Read = Result<Option<LatchRecord>, LoadError>;

static mut GATEWAY_PORT: FramedPort<GATEWAY_QUEUE> = FramedPort::new();
static mut TRACE_PORT: FramedPort<TRACE_QUEUE> = FramedPort::new();
static mut FRAME_BUFFERS: FrameBuffers = FrameBuffers::new();
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The board's ports, its CDU, its flash and its LEDs.
pub struct Shell {
    /// UART2: text lines for a person.
    pub console: Uart,
    gateway: Uart,
    trace: Uart,
    up: &'static mut FramedPort<GATEWAY_QUEUE>,
    tr: &'static mut FramedPort<TRACE_QUEUE>,
    bufs: &'static mut FrameBuffers,
    cdu: Cdu,
    store: Store,
    /// The mark that a record was kept is known to be in flash.
    marked: bool,
    boots: u32,
    step_led: Led,
    leak_led: Led,
    boot_peak: u32,
    /// The step's time.
    budget: StepBudget,
    /// The step's work so far, and where its count resumed.
    work: (u32, u32),
    /// The CDU's reads that failed, in whole or in part, since boot.
    read_errors: ReadErrors,
    /// What the read-backs of the safety writes found: while one is not
    /// held, the heartbeat is withheld.
    safety: SafetyHeld,
}

/// The only reference to the static at `p`.
///
/// # Safety
/// Called once per static, before anything else refers to it.
unsafe fn once<T>(p: *mut T) -> &'static mut T {
    &mut *p
}

/// The NOR region of the board file.
fn board_nor() -> RamNor<'static> {
    // SAFETY: the region is RAM outside the loaded image (board file,
    // checked at build time not to overlap code or RAM); this is its only
    // reference, taken once at boot.
    let bytes = unsafe {
        core::slice::from_raw_parts_mut(board::NOR_BASE as *mut u8, board::NOR_BYTES as usize)
    };
    RamNor::new(bytes)
}

impl Shell {
    /// Opens the ports, the CDU's line and the flash; counts the start
    /// and reads the latched record. Call once.
    #[inline(never)]
    pub fn boot(mut console: Uart, cause: ResetCause) -> (Self, Read) {
        assert!(
            !TAKEN.swap(true, Ordering::Relaxed),
            "the shell is made once"
        );
        let _ = writeln!(console, "reset: {}", cause_words(cause));
        let mut store = open_store(&mut console);
        let boots = match block_on(counters::count_boot(&mut store)) {
            Ok(n) => n,
            Err(e) => {
                let _ = writeln!(console, "flash: the boot count not kept: {e}");
                0
            }
        };
        let read = block_on(latch::load(&mut store));
        say_read(&mut console, &read);
        // A record kept before the mark existed gets its mark now.
        let marked = matches!(read, Ok(Some(_))) && mark(&mut console, &mut store);
        let cdu = rtu::RtuMaster::new(
            Uart::modbus(),
            BoardClock,
            map::UNIT_ID,
            board::UART_MODBUS.baud,
            RESPONSE_TIMEOUT_US,
        );
        let _ = writeln!(
            console,
            "cdu: {} unit {} on {} at {} baud 8N1, inter-frame gap {} us",
            map::MODEL,
            map::UNIT_ID,
            board::UART_MODBUS.name,
            board::UART_MODBUS.baud,
            rtu::gap_us(board::UART_MODBUS.baud)
        );
        // SAFETY: the statics' only references, taken once (`TAKEN`).
        let (up, tr, bufs) = unsafe {
            (
                once(&raw mut GATEWAY_PORT),
                once(&raw mut TRACE_PORT),
                once(&raw mut FRAME_BUFFERS),
            )
        };
        let sh = Self {
            console,
            gateway: Uart::gateway(),
            trace: Uart::trace(),
            up,
            tr,
            bufs,
            cdu,
            store,
            marked,
            boots,
            step_led: Led::new(0).expect("the board has LED 0"),
            leak_led: Led::new(1).expect("the board has LED 1"),
            boot_peak: 0,
            budget: StepBudget::new(0, budget::STEP_BUDGET_US, TRANSACTION),
            work: (0, 0),
            read_errors: ReadErrors::default(),
            safety: SafetyHeld::default(),
        };
        (sh, read)
    }

    /// The controller's start: the operators' last clear ids from the
    /// flash, the hello, and the start from what the flash held (`read`).
    #[inline(never)]
    pub fn start(&mut self, ctl: &mut Controller<'_>, cause: ResetCause, read: &Read) {
        self.restore_clears(ctl);
        let hello = Hello {
            boot: self.boots,
            reset: cause,
            firmware: heapless::String::try_from(env!("CARGO_PKG_VERSION")).unwrap_or_default(),
            restored: matches!(read, Ok(Some(_))),
        };
        ctl.boot(self, hello, Opening::of(read));
        let floor = block_on(latch::relatch_floor(&mut self.store, read));
        ctl.continue_above(self, floor);
        learned::restore(ctl, self);
    }

    /// Does not run the core, for `why`: says so on the console and to
    /// the gateway (a `Hello`, then `why` as an error line), and again
    /// every [`REFUSAL_EVERY_MS`], forever. The watchdog is not started
    /// and the CDU is written nothing, so it falls back on its own when
    /// its heartbeat stops; the gateway tells the bus the controller is
    /// silent between the lines.
    #[inline(never)]
    #[cold]
    pub fn refuse(&mut self, cause: ResetCause, why: fmt::Arguments<'_>) -> ! {
        let words = said_words(&why);
        let hello = Hello {
            boot: self.boots,
            reset: cause,
            firmware: heapless::String::try_from(env!("CARGO_PKG_VERSION")).unwrap_or_default(),
            restored: false,
        };
        self.up(&Up::Hello(hello));
        let every = (REFUSAL_EVERY_MS / board::CONTROL_PERIOD_MS.max(1)).max(1);
        loop {
            let _ = writeln!(
                self.console,
                "refused to run: {why}; the core does not run, the CDU is left to its own fallback"
            );
            self.up(&Up::Said {
                error: true,
                words: words.clone(),
            });
            let until = clock::ticks().wrapping_add(every);
            while clock::ticks() != until {
                self.pump();
                clock::sleep_unless(|| clock::ticks() == until);
            }
        }
    }

    /// Boot is done, its stack peak `peak` (`Err`: the painted region's
    /// bottom was reached).
    pub fn boot_done(&mut self, peak: Result<u32, u32>) {
        self.boot_peak = peak.unwrap_or_else(|b| b);
        let over = if self.boot_peak > board::STACK_BUDGET_BYTES {
            " OVER BUDGET"
        } else {
            ""
        };
        let _ = writeln!(
            self.console,
            "boot: stack peak {}{} B of a {} B budget{over}; the steps' own peak is measured from here",
            if peak.is_err() { "at least " } else { "" },
            self.boot_peak,
            board::STACK_BUDGET_BYTES,
        );
        self.pump();
    }

    /// Waits for the control tick after `seen`, acting on what the gateway
    /// says and sending what is queued meanwhile; returns the tick.
    pub fn wait_for_tick(&mut self, ctl: &mut Controller<'_>, seen: u32) -> u32 {
        loop {
            self.hear_gateway(ctl, clock::now_us() / 1000, StepKeep::NoWrite);
            self.pump();
            let t = clock::ticks();
            if t != seen {
                return t;
            }
            clock::sleep_unless(|| clock::ticks() != seen || uart::gateway_received());
        }
    }

    /// Moves queued frames into their UARTs while they take them.
    pub fn pump(&mut self) {
        self.gateway.send_from(&mut self.up.queue);
        self.trace.send_from(&mut self.tr.queue);
    }

    /// Acts on the bytes the gateway sent, at `now_ms`: at most
    /// `controller::HEAR_MAX_BYTES` a call, none of them said on the console (bad
    /// frames and bytes the ring lost are counted, on the status line);
    /// no clear's number kept in a step that wrote one (`keep`) before it.
    #[inline(never)]
    fn hear_gateway(&mut self, ctl: &mut Controller<'_>, now_ms: u64, keep: StepKeep) {
        let mut rx = self.gateway.receiver();
        ctl.hear_after_keep(self, &mut rx, now_ms, keep);
    }

    /// One control step at `tick`: what the gateway said, the CDU read,
    /// the decision, then the rest ([`Shell::act`]) in a frame of its
    /// own, so that the decision's deep stack sits on a short one.
    #[inline(never)]
    pub fn step(&mut self, ctl: &mut Controller<'_>, tick: u32) {
        let start_us = clock::now_us();
        let now_ms = start_us / 1000;
        self.safety.tick(now_ms);
        self.budget = StepBudget::new(start_us, budget::STEP_BUDGET_US, TRANSACTION);
        self.work = (0, icount::now());
        let keep = self.settle_clears(ctl);
        self.hear_gateway(ctl, now_ms, keep);
        let readings = self.read_cdu();
        ctl.step(self, readings, now_ms);
        self.act(ctl, tick, now_ms);
    }

    /// The step after its decision: the record to flash, the writes, the
    /// reports, what was learned to flash when due, the status line, the
    /// watchdog fed.
    #[inline(never)]
    fn act(&mut self, ctl: &mut Controller<'_>, tick: u32, now_ms: u64) {
        if let Some(r) = ctl.to_keep(self) {
            self.close_first(ctl);
            let before = clock::now_us();
            let ok = self.keep_latch(&r);
            let took = clock::now_us().saturating_sub(before);
            self.budget.kept(took, LATCH_KEEP_WORST_US);
            ctl.kept(self, ok);
        }
        let plan = ctl.plan(self);
        let outcome = self.write_cdu(ctl, &plan);
        let writes_ok = outcome.all_ok();
        let failed = outcome.tried.iter().filter(|(_, r)| r.is_err()).count();
        ctl.written(self, outcome);
        ctl.report(self, now_ms, writes_ok);
        // What was learned, after the writes and the reports, while the
        // step's budget allows.
        learned::keep(ctl, self, now_ms);
        let work = self.work.0 + icount::instructions_since(self.work.1);
        self.show(ctl);
        watchdog::feed();
        let line = Line {
            tick,
            now_ms,
            ctl,
            plan: &plan,
            failed,
            work,
            stack: board::stack::peak_bytes(),
            boot_peak: self.boot_peak,
            watchdog_warnings: watchdog::warnings(),
            dropped: (self.up.dropped, self.tr.dropped),
            safety: &self.safety,
        };
        let _ = writeln!(self.console, "{line}");
        self.pump();
    }

    /// Stops counting the step's work (a Modbus transaction begins).
    fn pause_work(&mut self) {
        self.work.0 += icount::instructions_since(self.work.1);
    }

    /// Counts the step's work again.
    fn resume_work(&mut self) {
        self.work.1 = icount::now();
    }

    /// Before the latched record's keep, when its worst leaves the step
    /// no time for a write after it: the valves the step closes, written
    /// closed (a word that opens none, [`budget::closings`]), so a leak
    /// is shut in the step that latches it however long the flash takes.
    /// The latch's rule allows it: closing always proceeds. The word the
    /// CDU took is the decision path's valve word taken (traced).
    #[inline(never)]
    fn close_first(&mut self, ctl: &mut Controller<'_>) {
        if !self
            .budget
            .closings_first(clock::now_us(), LATCH_KEEP_WORST_US)
        {
            return;
        }
        let Some(asked) = ctl.commands().map(|c| c.valves_open) else {
            return;
        };
        let racks = ctl.decider().core().config().layout.racks;
        let mask = (1u32 << racks.min(16)).wrapping_sub(1) as u16;
        // What is open: the valve word the CDU took, the inputs only
        // without one, as the decision path plans (an input may read
        // closed on an open valve).
        let taken = ctl.decider().valves_taken();
        let closed = ctl.readings().and_then(|m| m.valves_closed);
        let Some(word) = budget::closings(asked, taken, closed, mask) else {
            return;
        };
        self.pause_work();
        let mut port = RtuPort {
            cdu: &mut self.cdu,
            budget: self.budget,
        };
        let r = writes::write_one(&mut port, Setting::Valves, f64::from(word));
        self.resume_work();
        if r.is_ok() {
            // The decision path holds it as the valve word taken.
            ctl.took_early_valves(self, word);
        }
        let _ = match r {
            Ok(()) => writeln!(
                self.console,
                "latch: valves_open {word:#06b} written before the record goes to flash (closings only)"
            ),
            Err(e) => writeln!(
                self.console,
                "latch: the closings before the record ({word:#06b}) not written: {e}"
            ),
        };
    }

    /// Reads every span of input registers: a span that fails loses only
    /// its own registers, said and counted ([`reads`]); `None` when no
    /// span answered.
    fn read_cdu(&mut self) -> Option<CduMeasurements> {
        self.pause_work();
        let mut port = RtuPort {
            cdu: &mut self.cdu,
            budget: self.budget,
        };
        let read = reads::read_spans(&mut port, &mut self.console, &mut self.read_errors);
        self.resume_work();
        read
    }

    /// Writes the plan, each setting on its own (the heartbeat withheld
    /// while a safety setting reads back not held), then reads back the
    /// safety writes that went in
    /// ([`loopwarden_firmware::read_back::write_step`], through
    /// [`Controller::write_and_read_back`]: said again to a gateway that
    /// started again); each failure to the console, a change of what the
    /// CDU holds to the gateway too.
    #[inline(never)]
    fn write_cdu(&mut self, ctl: &mut Controller<'_>, plan: &Plan) -> Outcome {
        self.pause_work();
        let mut port = RtuPort {
            cdu: &mut self.cdu,
            budget: self.budget,
        };
        let (outcome, change) =
            ctl.write_and_read_back(&mut port, plan, &mut self.safety, &mut self.console);
        self.resume_work();
        if let Some(c) = change {
            ctl.read_back_changed(self, &c);
        }
        for (s, r) in &outcome.tried {
            if let Err(why) = r {
                let _ = writeln!(self.console, "write {}: {why}", s.register());
            }
        }
        outcome
    }

    /// Keeps `r` in flash; whether it went in.
    fn keep_latch(&mut self, r: &LatchRecord) -> bool {
        match block_on(latch::save(&mut self.store, r)) {
            Ok(()) => {
                let _ = writeln!(
                    self.console,
                    "latch: generation {} kept in flash",
                    r.generation
                );
                if !self.marked {
                    self.marked = mark(&mut self.console, &mut self.store);
                }
                true
            }
            // The decision path hears it: no valve opens on a record that
            // did not go in.
            Err(e) => {
                let _ = writeln!(
                    self.console,
                    "latch: generation {} not kept in flash: {e}",
                    r.generation
                );
                false
            }
        }
    }

    /// The LEDs: one toggles each completed step, one shows a latched leak.
    fn show(&mut self, ctl: &Controller<'_>) {
        let on = self.step_led.is_set_high().unwrap_or(false);
        let _ = if on {
            self.step_led.set_low()
        } else {
            self.step_led.set_high()
        };
        let lost = ctl.commands().is_some_and(|c| c.cooling_lost != 0);
        let leak = ctl.decider().core().leaks_latched() != 0 || lost;
        let _ = if leak {
            self.leak_led.set_high()
        } else {
            self.leak_led.set_low()
        };
    }
}

/// The config store of the board's NOR; a store that reads all zeros on
/// a board whose NOR does not start so ([`store_start`]), or that cannot
/// open, stops the firmware (the watchdog is not started yet: it stays
/// stopped, and the CDU falls back on its own).
fn open_store(console: &mut Uart) -> Store {
    let mut nor = board_nor();
    let range = board::NOR_CONFIG;
    match store_start(&nor, range.clone(), board::NOR_STARTS_ZEROED) {
        StoreStart::Open => {}
        // QEMU starts the RAM that stands in for the part as zeros: erased
        // as a new part comes.
        StoreStart::Erase => {
            if nor.erase_sectors(range.start, range.end).is_ok() {
                let _ = writeln!(
                    console,
                    "flash: {} read all zeros (never used, as this board's starts): erased",
                    board::NOR_NAME
                );
            }
        }
        StoreStart::Refuse => {
            let _ = writeln!(
                console,
                "flash: the config store of {} (bytes {:#x}..{:#x}) reads all zeros, which no NOR part does, erased or written (a read path stuck low?), and the board file does not say its NOR starts zeroed (nor.starts_zeroed): not erased, for it may hold the latched record; the firmware does not start, the CDU is left to its own fallback",
                board::NOR_NAME,
                range.start,
                range.end
            );
            // Stopped here for good: no panic, whose line would promise
            // a watchdog reset that never comes.
            loop {
                cortex_m::asm::wfi();
            }
        }
    }
    match ConfigStore::open(nor, board::NOR_CONFIG) {
        Ok(s) => s,
        Err(e) => panic!("flash: the config store of {}: {e}", board::NOR_NAME),
    }
}

/// Keeps the mark that a record went into `store`; whether it is there.
/// Without it a record the flash later loses reads as never written.
fn mark(console: &mut Uart, store: &mut Store) -> bool {
    let e = match block_on(latch::mark(store)) {
        Ok(()) => return true,
        Err(e) => e,
    };
    let _ = writeln!(
        console,
        "latch: the mark that a record was kept ({}) not written: {e}; tried again when the next record is kept, and at the next start",
        latch::KEPT_KEY
    );
    false
}

/// What the flash held of the latched record, on the console.
fn say_read(console: &mut Uart, read: &Read) {
    let _ = match read {
        Ok(Some(r)) => writeln!(
            console,
            "latch: generation {} read from flash: the decision path starts from it",
            r.generation
        ),
        Ok(None) => writeln!(
            console,
            "latch: no record in flash, and none was ever kept in it: starting afresh, nothing latched"
        ),
        // The decision path says what it does about it.
        Err(e) => writeln!(console, "latch: {e}"),
    };
}

fn cause_words(c: ResetCause) -> &'static str {
    match c {
        ResetCause::PowerOn => "power-on (or a reset not the firmware's)",
        ResetCause::Watchdog => "the watchdog: a step did not complete in time",
        ResetCause::Fault => "a fault stopped the firmware",
    }
}

/// The CDU's settings through the RTU master, within the step's time.
struct RtuPort<'a> {
    cdu: &'a mut Cdu,
    budget: StepBudget,
}

impl SettingPort for RtuPort<'_> {
    type Error = rtu::RtuError;

    fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), rtu::RtuError> {
        self.cdu.set_deadline(self.budget.end_us());
        self.cdu.write(r, words)
    }

    fn was_sent(e: &rtu::RtuError) -> bool {
        e.was_sent()
    }

    fn time_left(&mut self) -> bool {
        self.budget.transaction_fits(clock::now_us())
    }
}

impl HoldingPort for RtuPort<'_> {
    fn read_holding(
        &mut self,
        first: &Register,
        last: &Register,
        out: &mut [u16],
    ) -> Result<(), rtu::RtuError> {
        self.cdu.set_deadline(self.budget.end_us());
        self.cdu.read_holding(first, last, out)
    }
}

impl InputPort for RtuPort<'_> {
    fn read_inputs(&mut self, span: &Span, out: &mut [u16]) -> Result<usize, rtu::RtuError> {
        self.cdu.set_deadline(self.budget.end_us());
        self.cdu.read_inputs(span, out)
    }

    fn time_left(&mut self) -> bool {
        self.budget.transaction_fits(clock::now_us())
    }
}

impl LearnedFlash for Shell {
    type Error = StoreError<NorError>;

    fn read_learned(
        &mut self,
        key: &str,
        out: &mut [u8; MAX_LEN],
    ) -> Result<Option<usize>, Self::Error> {
        learned::read_part(&mut self.store, key, out)
    }

    fn write_learned(&mut self, key: &str, bytes: &[u8]) -> Result<(), Self::Error> {
        learned::write_part(&mut self.store, key, bytes)
    }

    fn time_for_learned(&mut self) -> bool {
        (self.budget).learned_part_fits(clock::now_us(), board::NOR_ITEM_WORST_US)
    }
}

impl Ports for Shell {
    fn up(&mut self, up: &Up) -> bool {
        match self.up.send(up, self.bufs) {
            Ok(queued) => {
                self.gateway.send_from(&mut self.up.queue);
                queued
            }
            Err(e) => {
                let _ = writeln!(self.console, "link: a message to the gateway: {e}");
                false
            }
        }
    }

    fn trace(&mut self, t: &Trace) {
        match self.tr.send(t, self.bufs) {
            Ok(_) => {
                self.trace.send_from(&mut self.tr.queue);
            }
            Err(e) => {
                let _ = writeln!(self.console, "trace: a record: {e}");
            }
        }
    }

    fn say(&mut self, line: fmt::Arguments<'_>) {
        let _ = writeln!(self.console, "{line}");
    }

    fn insn_mark(&mut self) -> u32 {
        icount::now()
    }

    fn insn_since(&mut self, mark: u32) -> u32 {
        icount::instructions_since(mark)
    }

    fn stack_peak(&mut self) -> u32 {
        let steps = board::stack::peak_bytes().unwrap_or_else(|b| b);
        steps.max(self.boot_peak)
    }

    /// Keeps a clear's number in flash before it is acted on, so a replay
    /// after a restart is still refused. One the flash does not keep is
    /// not acted on, and refuses every further clear of that operator
    /// until a later try keeps it ([`Shell::settle_clears`], each step).
    fn keep_clear(&mut self, t: &Taken) -> bool {
        let Err(e) = block_on(counters::keep_clear(&mut self.store, t.slot, t.name, t.id)) else {
            return true;
        };
        let _ = writeln!(
            self.console,
            "clears: {}'s clear number {} not kept in flash: {e}; the clear is not acted on, and {}'s clears are refused until the number is kept (tried again each step)",
            t.name, t.id, t.name
        );
        false
    }
}

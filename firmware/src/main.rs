//! The firmware's entry: boot, then one control step per tick.
//!
//! Boot: the stack is painted (by cortex-m-rt, before `main`), the clocks
//! start, the latched record is read from the NOR flash and restored
//! into the core (an unreadable one latches every rack: no valve reopens
//! on a record that cannot be believed), then the watchdog starts.
//!
//! Each control period (TIMER0's tick) a step:
//! 1. reads the CDU over Modbus RTU on UART0 (its leak register stands in
//!    for the board's leak ropes, which QEMU does not model);
//! 2. runs `cooling_core::Core::step`, counting its instructions;
//! 3. keeps the latched state in flash when it changed, before acting;
//! 4. writes the settings in the Linux controller's order;
//! 5. feeds the watchdog, and prints one status line on UART2.
//!
//! A step's transactions stop when the period's budget
//! ([`STEP_BUDGET_US`]) would be overrun, so a silent CDU cannot make
//! the steps late. (The decision path, the latch keeper's relatch and
//! the lease book move here with the shared `cooling-decide` crate.)
//!
//! Glossary:
//! - *status line*: `step N`, the core's instructions (and their median
//!   and worst), the stack's peak, the mode, the leak and valve bits
//!   read, and what was written.

#![no_std]
#![no_main]

mod status;

use core::fmt::Write as _;
use core::mem::MaybeUninit;

use cooling_core::{
    Commands, ConfigError, Core, CoreConfig, HostReport, Inputs, LeakInputs, MAX_HOSTS,
};
use cortex_m_rt::entry;
use embedded_hal::digital::{OutputPin, StatefulOutputPin};
use loopwarden_firmware::block_on::block_on;
use loopwarden_firmware::board::clock::{self, BoardClock};
use loopwarden_firmware::board::nor::RamNor;
use loopwarden_firmware::board::{self, icount, led::Led, uart::Uart, watchdog};
use loopwarden_firmware::cdu::{self, CduMeasurements, InputValues};
use loopwarden_firmware::latch::{self, Keeper};
use loopwarden_firmware::plan::{self, Outcome, WriteFailure};
use loopwarden_firmware::{map, rtu};
use loopwarden_flash::ConfigStore;

use status::{InsnStats, Status};

/// How long the CDU is given to answer a request, µs: a read's answer
/// is 27 bytes (14 ms at 19,200 baud); the rest is the CDU's turnaround.
const RESPONSE_TIMEOUT_US: u32 = 200_000;
/// The part of a control period a step's transactions may take, µs.
const STEP_BUDGET_US: u64 = 800_000;

type Cdu = rtu::RtuMaster<Uart, BoardClock>;
type Store = ConfigStore<RamNor<'static>>;

/// No host reports yet (they come over the gateway link).
static NO_HOSTS: [Option<HostReport>; MAX_HOSTS] = [None; MAX_HOSTS];

/// The controller between steps.
struct Controller {
    core: &'static mut Core,
    cdu: Cdu,
    store: Store,
    keeper: Keeper,
    heartbeat: u16,
    writes_ok: bool,
    insn: InsnStats,
    step_led: Led,
    leak_led: Led,
}

#[entry]
fn main() -> ! {
    let mut trace = Uart::trace();
    let _ = writeln!(
        trace,
        "loopwarden-firmware: boot on {} ({})",
        board::NAME,
        board::DESCRIPTION
    );
    clock::start();
    icount::start();
    let mut c = Controller::boot(&mut trace);
    match board::stack::peak_bytes() {
        Ok(b) => writeln!(
            trace,
            "boot: stack peak {b} B of {}; painted again for the steps",
            board::STACK_BYTES
        ),
        Err(budget) => writeln!(
            trace,
            "boot: the stack reached the bottom of its {budget} B"
        ),
    }
    .ok();
    board::stack::repaint();
    watchdog::start();
    let _ = writeln!(
        trace,
        "watchdog: {} ms to its NMI, reset at the second expiry; control period {} ms",
        board::WATCHDOG_TIMEOUT_MS,
        board::CONTROL_PERIOD_MS
    );
    let mut tick = clock::ticks();
    loop {
        tick = clock::wait_for_tick(tick);
        c.step(&mut trace, tick);
    }
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

impl Controller {
    /// Not inlined: its temporaries then leave the stack with its frame
    /// instead of enlarging `main`'s for every step.
    #[inline(never)]
    fn boot(trace: &mut Uart) -> Self {
        let mut nor = board_nor();
        // QEMU starts the RAM that stands in for the part as zeros, a state
        // no NOR part is in: erased as a new part comes.
        let range = board::NOR_CONFIG;
        if nor.all_bytes(range.clone(), 0) && nor.erase_sectors(range.start, range.end).is_ok() {
            let _ = writeln!(
                trace,
                "flash: {} read all zeros (never used): erased",
                board::NOR_NAME
            );
        }
        let mut store = match ConfigStore::open(nor, board::NOR_CONFIG) {
            Ok(s) => s,
            Err(e) => panic!("flash: the config store of {}: {e}", board::NOR_NAME),
        };
        let cfg = CoreConfig::default();
        let (start, keeper) = start_of(block_on(latch::load(&mut store)), trace);
        let core = core_in_place(cfg, start);
        let cdu = rtu::RtuMaster::new(
            Uart::modbus(),
            BoardClock,
            map::UNIT_ID,
            board::UART_MODBUS.baud,
            RESPONSE_TIMEOUT_US,
        );
        let _ = writeln!(
            trace,
            "cdu: {} unit {} on {} at {} baud 8N1, inter-frame gap {} us",
            map::MODEL,
            map::UNIT_ID,
            board::UART_MODBUS.name,
            board::UART_MODBUS.baud,
            rtu::gap_us(board::UART_MODBUS.baud)
        );
        Self {
            core,
            cdu,
            store,
            keeper,
            heartbeat: 0,
            writes_ok: true,
            insn: InsnStats::default(),
            step_led: Led::new(0).expect("the board has LED 0"),
            leak_led: Led::new(1).expect("the board has LED 1"),
        }
    }

    fn step(&mut self, trace: &mut Uart, tick: u32) {
        let start_us = clock::now_us();
        let deadline_us = start_us + STEP_BUDGET_US;
        let measured = self.read_cdu(trace, deadline_us);
        let t0 = icount::now();
        let commands = self
            .core
            .step(&inputs(start_us / 1000, measured.as_ref(), self.writes_ok));
        let insn = icount::instructions_since(t0);
        self.insn.add(insn);
        self.keep_latch(trace);
        self.heartbeat = self.heartbeat.wrapping_add(1);
        let outcome = self.write(trace, &commands, deadline_us);
        self.writes_ok = outcome.all_ok();
        watchdog::feed();
        self.show(&commands);
        let status = Status {
            step: tick,
            now_ms: start_us / 1000,
            insn,
            stats: &self.insn,
            stack: board::stack::peak_bytes(),
            measured: measured.as_ref(),
            commands: &commands,
            heartbeat: self.heartbeat,
            outcome: &outcome,
            watchdog_warnings: watchdog::warnings(),
        };
        let _ = writeln!(trace, "{status}");
    }

    /// Reads every span of input registers; `None` when one fails.
    fn read_cdu(&mut self, trace: &mut Uart, deadline_us: u64) -> Option<CduMeasurements> {
        let mut values = InputValues::default();
        let mut words = [0u16; rtu::MAX_READ];
        for span in &map::SPANS {
            if !self.time_left(deadline_us) {
                let _ = writeln!(
                    trace,
                    "cdu: read input {} not asked: the step's time ran out",
                    span.start
                );
                return None;
            }
            if let Err(e) = self.cdu.read_inputs(span, &mut words) {
                let _ = writeln!(trace, "cdu: {e}");
                return None;
            }
            values.take(span, &words[..usize::from(span.count)]);
        }
        Some(values.measurements())
    }

    fn time_left(&mut self, deadline_us: u64) -> bool {
        clock::now_us() + u64::from(self.cdu.timeout_us()) <= deadline_us
    }

    /// Keeps the latched state in flash when it changed.
    fn keep_latch(&mut self, trace: &mut Uart) {
        let Some(r) = self.keeper.to_keep(self.core.latched()) else {
            return;
        };
        match block_on(latch::save(&mut self.store, &r)) {
            Ok(()) => {
                self.keeper.kept(r);
                let _ = writeln!(trace, "latch: generation {} kept in flash", r.generation);
            }
            // The writes go out all the same: closing a valve is never
            // less safe for a record that did not go in.
            Err(e) => {
                let _ = writeln!(
                    trace,
                    "latch: generation {} not kept in flash: {e}",
                    r.generation
                );
            }
        }
    }

    /// Writes the step's settings in order, each on its own.
    fn write(&mut self, trace: &mut Uart, c: &Commands, deadline_us: u64) -> Outcome {
        let mut outcome = Outcome::default();
        for w in plan::plan(c, self.heartbeat) {
            let r = if !outcome.due(&w) {
                Err(WriteFailure::Withheld)
            } else if !self.time_left(deadline_us) {
                Err(WriteFailure::OutOfTime)
            } else {
                let reg = w.setting.register();
                match reg.encode(w.value) {
                    Ok(words) => self.cdu.write(reg, &words).map_err(WriteFailure::Rtu),
                    Err(e) => Err(WriteFailure::Value(e)),
                }
            };
            if let Err(e) = &r {
                let _ = writeln!(trace, "write {}: {e}", w.setting.register().name);
            }
            outcome.record(w.setting, r);
        }
        outcome
    }

    /// The LEDs: one toggles each completed step, one shows a latched leak.
    fn show(&mut self, c: &Commands) {
        let on = self.step_led.is_set_high().unwrap_or(false);
        let _ = if on {
            self.step_led.set_low()
        } else {
            self.step_led.set_high()
        };
        let leak = self.core.leaks_latched() != 0 || c.cooling_lost != 0;
        let _ = if leak {
            self.leak_led.set_high()
        } else {
            self.leak_led.set_low()
        };
    }
}

/// How the core starts, from what the flash held.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// No record: afresh.
    Fresh,
    /// A record: its state restored.
    Restore(cooling_core::Latched),
    /// An unreadable record: every rack latched (no valve reopens on a
    /// record that cannot be believed).
    LatchAll,
}

/// How the core starts after `read`, and the keeper of what was kept.
fn start_of(
    read: Result<Option<latch::LatchRecord>, latch::LatchReadError>,
    trace: &mut Uart,
) -> (Start, Keeper) {
    match read {
        Ok(Some(r)) => {
            let _ = writeln!(
                trace,
                "latch: generation {} read from flash, restored",
                r.generation
            );
            (Start::Restore(r.latched), Keeper::new(Some(r)))
        }
        Ok(None) => {
            let _ = writeln!(trace, "latch: no record in flash, starting afresh");
            (Start::Fresh, Keeper::new(None))
        }
        Err(e) => {
            let _ = writeln!(
                trace,
                "latch: {e}; every rack latched until an operator clears it"
            );
            (Start::LatchAll, Keeper::new(None))
        }
    }
}

/// The core, made in a static so the stack never holds a copy of it.
#[inline(never)]
fn core_in_place(cfg: CoreConfig, start: Start) -> &'static mut Core {
    // The result itself lives in the static: `Core::new` writes it there.
    let slot =
        cortex_m::singleton!(: MaybeUninit<Result<Core, ConfigError>> = MaybeUninit::uninit())
            .expect("made once");
    let made = match start {
        Start::Restore(l) => slot.write(restored(cfg, &l)),
        Start::Fresh | Start::LatchAll => slot.write(Core::new(cfg)),
    };
    let core = match made {
        Ok(core) => core,
        Err(e) => panic!("the control core's configuration: {e}"),
    };
    if let Start::LatchAll = start {
        core.latch_racks(cooling_core::safety::all_racks(usize::from(
            cfg.layout.racks,
        )));
    }
    core
}

/// `Core::restore` in a frame of its own (inlined, its temporaries
/// would sit in the caller's frame beside `Core::new`'s).
#[inline(never)]
fn restored(cfg: CoreConfig, l: &cooling_core::Latched) -> Result<Core, ConfigError> {
    Core::restore(cfg, l)
}

/// The core's inputs for a step at `now_ms`: the CDU's leak register
/// stands in for the board's ropes, and while the CDU does not answer
/// leak sensing is lost (as the Linux controller without a board).
fn inputs(now_ms: u64, m: Option<&CduMeasurements>, writes_ok: bool) -> Inputs<'static> {
    let leaks = m.and_then(|m| m.leaks);
    let hosts = CoreConfig::default().layout.hosts().min(MAX_HOSTS);
    Inputs {
        now_ms,
        cdu: m.map(cdu::core_readings),
        ambient_c: m
            .and_then(|m| m.outdoor_c)
            .filter(|c| (-50.0..=60.0).contains(c))
            .map(|c| c as f32),
        leaks: LeakInputs {
            wet: 0,
            rope_faults: 0,
            read_ok: m.is_some(),
            cdu: leaks,
        },
        cdu_writes_ok: writes_ok,
        hosts: &NO_HOSTS[..hosts],
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let mut trace = Uart::trace();
    let _ = writeln!(trace, "panic: {info}; the watchdog resets the board");
    loop {
        cortex_m::asm::wfi();
    }
}

//! The board file (`boards/mcu/*.toml`): memory, the NOR region, UARTs,
//! the reset-cause word, timers, the watchdog and the FPGA's LEDs,
//! checked and written out as `memory.x` and Rust consts. Its leak ropes'
//! pins must be none: this firmware reads no rope pins yet (the CDU's
//! `leak_inputs` register stands in), so a board file naming some is
//! refused rather than built to never see a wet or cut rope.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Board {
    board: String,
    description: String,
    system_clock_hz: u32,
    memory: Memory,
    stack: Stack,
    nor: Nor,
    uart: Uarts,
    reset_cause: ResetCause,
    timer: Timers,
    watchdog: Watchdog,
    fpgaio: Fpgaio,
    leak_ropes: LeakRopes,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Region {
    name: String,
    base: u32,
    size: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Memory {
    code: Region,
    ram: Region,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stack {
    bytes: u32,
    budget_bytes: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Nor {
    name: String,
    base: u32,
    size: u32,
    sector_bytes: u32,
    write_bytes: u32,
    config: [u32; 2],
    /// The region reads all zeros before its first use (RAM standing in
    /// for a part): a config store found so is erased at start. Without
    /// it, one found so is refused: no NOR part reads so, erased or
    /// written, and erasing it could wipe the latched record.
    #[serde(default)]
    starts_zeroed: bool,
    /// The longest one config item's write may take on the part, µs: a
    /// sector's erase and a sector's live items moved first, at the
    /// part's worst (its datasheet's maxima). The step's time is planned
    /// on it (the latched record's keep, what was learned).
    item_worst_us: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Uart {
    name: String,
    base: u32,
    rx_irq: u8,
    baud: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Uarts {
    modbus: Uart,
    gateway: Uart,
    console: Uart,
    trace: Uart,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetCause {
    base: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Timer {
    name: String,
    base: u32,
    irq: u8,
    #[serde(default)]
    period_ms: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Timers {
    control: Timer,
    micros: Timer,
    wake: Timer,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Watchdog {
    base: u32,
    timeout_ms: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fpgaio {
    base: u32,
    leds: u8,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeakRopes {
    gpio: Vec<u32>,
}

impl LeakRopes {
    /// No pins: this firmware reads none, and a pin named would be a rope
    /// that is never read.
    fn check(&self) -> Result<(), String> {
        if self.gpio.is_empty() {
            return Ok(());
        }
        Err(format!(
            "leak_ropes.gpio {:?}: this firmware reads no rope pins (the CDU's leak_inputs \
             register stands in for the ropes), so a rope on these pins would never be seen; \
             leave it empty (gpio = []) until the firmware reads rope pins",
            self.gpio
        ))
    }
}

fn end(r: (u32, u32)) -> u64 {
    u64::from(r.0) + u64::from(r.1)
}

fn overlap(a: (u32, u32), b: (u32, u32)) -> bool {
    u64::from(a.0) < end(b) && u64::from(b.0) < end(a)
}

/// The part of a control period a step's Modbus transactions may take,
/// ms: the shell's `STEP_BUDGET_US` (a host test holds the two equal).
pub const STEP_BUDGET_MS: u64 = 800;
/// Config items the latched record's keep writes: `budget::LATCH_ITEMS`.
pub const LATCH_ITEMS: u64 = 3;
/// Config items one clear's number kept writes (the number and its
/// slot's count): `budget::CLEAR_ITEMS`.
pub const CLEAR_ITEMS: u64 = 2;
/// A step's work beyond its transactions and flash writes, ms, at most:
/// the decision (about 3 ms at 100 MHz), two clears' signature checks,
/// the console and the frames out.
pub const STEP_WORK_MS: u64 = 100;

/// The longest time between two feeds of the watchdog, ms, with a
/// control period of `period_ms` and a NOR part whose item write takes
/// `item_ms` at its worst: the wait for the next tick, overrun by one
/// clear's number kept just before it ([`CLEAR_ITEMS`] items); then the
/// step: one clear's number kept before its transactions (a number kept
/// again, or a clear's heard: never both in one step), its budget running
/// meanwhile; the latched record's keep (a step that keeps none may write
/// one part of what was learned past its budget instead: less); its work.
pub fn feed_interval_worst_ms(period_ms: u64, item_ms: u64) -> u64 {
    let clear = CLEAR_ITEMS * item_ms;
    let before_keep = STEP_BUDGET_MS.max(clear);
    period_ms + clear + before_keep + LATCH_ITEMS * item_ms + STEP_WORK_MS
}

impl Board {
    /// Reads and checks the board file at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let b: Board = super::read_toml(path)?;
        b.check()
            .map_err(|why| format!("{}: {why}", path.display()))?;
        Ok(b)
    }

    /// The control period, ms (`timer.control.period_ms`, checked by
    /// [`Board::load`]).
    pub fn control_period_ms(&self) -> u32 {
        self.timer.control.period_ms.unwrap_or(0)
    }

    fn check(&self) -> Result<(), String> {
        self.check_clock()?;
        let code = (self.memory.code.base, self.memory.code.size);
        let ram = (self.memory.ram.base, self.memory.ram.size);
        let nor = (self.nor.base, self.nor.size);
        if overlap(code, ram) || overlap(nor, code) || overlap(nor, ram) {
            return Err("memory.code, memory.ram and nor must not overlap (the NOR region lies outside the loaded image)".into());
        }
        self.check_places(code, ram, nor)?;
        self.check_nor()?;
        if self.stack.bytes == 0
            || self.stack.bytes % 8 != 0
            || self.stack.bytes >= self.memory.ram.size
        {
            return Err(format!(
                "stack.bytes {}: a multiple of 8, smaller than RAM",
                self.stack.bytes
            ));
        }
        self.check_uarts()?;
        self.check_irqs()?;
        match self.timer.control.period_ms {
            Some(p)
                if p > 0
                    && u64::from(p) * u64::from(self.system_clock_hz) / 1000
                        <= u64::from(u32::MAX) => {}
            _ => {
                return Err(
                    "timer.control.period_ms: above 0, and its ticks must fit the timer's 32 bits"
                        .into(),
                )
            }
        }
        if u64::from(self.watchdog.timeout_ms) * u64::from(self.system_clock_hz) / 1000
            > u64::from(u32::MAX)
        {
            return Err("watchdog.timeout_ms: its ticks must fit the watchdog's 32 bits".into());
        }
        self.check_watchdog()?;
        if !(2..=8).contains(&self.fpgaio.leds) {
            return Err(format!(
                "fpgaio.leds {}: 2 to 8 (LED 0 blinks each step, LED 1 shows a latched leak)",
                self.fpgaio.leds
            ));
        }
        self.leak_ropes.check()
    }

    /// SYSCLK a whole number of MHz: the microsecond clock counts
    /// `system_clock_hz / 1_000_000` ticks a µs (`board::clock`), so any
    /// other would run it fast (2.4% at 32.768 MHz), and with it the
    /// step's budget and the Modbus timeouts; under 1 MHz it would not
    /// build.
    fn check_clock(&self) -> Result<(), String> {
        let hz = self.system_clock_hz;
        if hz >= 1_000_000 && hz % 1_000_000 == 0 {
            return Ok(());
        }
        Err(format!(
            "system_clock_hz {hz}: a whole number of MHz, at least 1 (the microsecond clock \
             counts whole ticks a µs: any other runs it, the step's budget and the Modbus \
             timeouts fast)"
        ))
    }

    /// The NOR region: whole sectors of whole writes, a worst item write
    /// given, a config store of at least two sectors within it.
    fn check_nor(&self) -> Result<(), String> {
        let n = &self.nor;
        if n.write_bytes == 0 {
            return Err("nor.write_bytes 0: give the part's write unit, bytes".into());
        }
        if n.sector_bytes == 0 || n.sector_bytes % n.write_bytes != 0 {
            return Err(format!(
                "nor.sector_bytes {}: the part's erase unit, above 0 and whole writes of {} bytes",
                n.sector_bytes, n.write_bytes
            ));
        }
        if n.size % n.sector_bytes != 0 {
            return Err(format!(
                "nor.size {}: whole sectors of {} bytes",
                n.size, n.sector_bytes
            ));
        }
        if n.item_worst_us == 0 {
            return Err("nor.item_worst_us 0: give the part's worst time for one item's write (a sector's erase and a sector's moves), µs".into());
        }
        let sectors = n.size / n.sector_bytes;
        if !(n.config[0] + 2 <= n.config[1] && n.config[1] <= sectors) {
            return Err(format!(
                "nor.config {:?}: at least two sectors within the region's {sectors}",
                n.config
            ));
        }
        Ok(())
    }

    /// The UARTs by their keys.
    fn uarts(&self) -> [(&'static str, &Uart); 4] {
        let u = &self.uart;
        [
            ("modbus", &u.modbus),
            ("gateway", &u.gateway),
            ("console", &u.console),
            ("trace", &u.trace),
        ]
    }

    /// Each UART's baud above 0 and within reach of its divider: the
    /// firmware divides SYSCLK by it at boot (0 would stop it there).
    fn check_uarts(&self) -> Result<(), String> {
        let hz = self.system_clock_hz;
        for (key, u) in self.uarts() {
            if u.baud == 0 || hz / u.baud < 16 {
                return Err(format!(
                    "uart.{key}.baud {} ({}): above 0, with a divider of at least 16 at {hz} Hz",
                    u.baud, u.name
                ));
            }
        }
        Ok(())
    }

    /// Every interrupt the file names is one of the NVIC's 32 lines (QEMU's
    /// MPS2), and no two devices share one: the dispatch
    /// (`board::DefaultHandler`) takes the control timer's first, so a
    /// UART's on it would count each byte received as a control tick.
    fn check_irqs(&self) -> Result<(), String> {
        let t = &self.timer;
        let mut irqs = vec![
            ("timer.control.irq".to_string(), t.control.irq),
            ("timer.micros.irq".to_string(), t.micros.irq),
            ("timer.wake.irq".to_string(), t.wake.irq),
        ];
        for (key, u) in self.uarts() {
            irqs.push((format!("uart.{key}.rx_irq"), u.rx_irq));
        }
        for (i, (key, n)) in irqs.iter().enumerate() {
            if *n >= 32 {
                return Err(format!(
                    "{key} {n}: below 32 (the board's interrupt lines are 0 to 31)"
                ));
            }
            if let Some((other, _)) = irqs[..i].iter().find(|(_, m)| m == n) {
                return Err(format!(
                    "{key} {n}: {other} has it too; each interrupt must be one device's"
                ));
            }
        }
        Ok(())
    }

    /// The watchdog resets the board at its second expiry: the longest
    /// time between two feeds ([`feed_interval_worst_ms`]) must stay
    /// under it, or the step that latches a leak on a slow part would
    /// reset the board.
    fn check_watchdog(&self) -> Result<(), String> {
        let period = u64::from(self.timer.control.period_ms.unwrap_or(0));
        let item = u64::from(self.nor.item_worst_us).div_ceil(1000);
        let worst = feed_interval_worst_ms(period, item);
        let reset = 2 * u64::from(self.watchdog.timeout_ms);
        if worst < reset {
            return Ok(());
        }
        Err(format!(
            "watchdog.timeout_ms {}: its reset, at the second expiry ({reset} ms), comes before \
             the longest time between two feeds ({worst} ms: the control period {period}, \
             two clear numbers kept in flash ({CLEAR_ITEMS} items each), the {STEP_BUDGET_MS} ms \
             step budget and the latched record's {LATCH_ITEMS} items, at nor.item_worst_us \
             {item} ms an item, {STEP_WORK_MS} of work): the step that latches a leak would reset the board. Give at least {} ms, or \
             a part whose worst item write is shorter",
            self.watchdog.timeout_ms,
            worst / 2 + 1
        ))
    }

    /// The reset-cause word lies outside the image, RAM and the NOR
    /// region (regions as (base, size)); the stack's budget within what
    /// is painted.
    fn check_places(
        &self,
        code: (u32, u32),
        ram: (u32, u32),
        nor: (u32, u32),
    ) -> Result<(), String> {
        let word = (self.reset_cause.base, 4);
        if self.reset_cause.base % 4 != 0
            || overlap(word, code)
            || overlap(word, ram)
            || overlap(word, nor)
        {
            return Err(format!(
                "reset_cause.base {:#x}: a word-aligned address outside memory.code, memory.ram and nor",
                self.reset_cause.base
            ));
        }
        if self.stack.budget_bytes == 0 || self.stack.budget_bytes > self.stack.bytes {
            return Err(format!(
                "stack.budget_bytes {}: above 0, within the {} bytes painted",
                self.stack.budget_bytes, self.stack.bytes
            ));
        }
        Ok(())
    }

    /// The linker's memory regions.
    pub fn memory_x(&self) -> String {
        let (c, r) = (&self.memory.code, &self.memory.ram);
        format!(
            "/* Generated by firmware/build.rs from boards/mcu/{b}.toml: do not edit. */\n\
             MEMORY\n{{\n  /* {cn} */\n  FLASH : ORIGIN = {cb:#010x}, LENGTH = {cs:#x}\n  \
             /* {rn} */\n  RAM : ORIGIN = {rb:#010x}, LENGTH = {rs:#x}\n}}\n\n\
             /* The stack: its top {sb} bytes of RAM, painted at reset (cortex-m-rt's\n   \
             paint-stack) and watched for its high-water mark. */\n\
             _stack_start = ORIGIN(RAM) + LENGTH(RAM);\n\
             _stack_end = _stack_start - {sb};\n\
             ASSERT(_stack_end >= __ebss, \"the statics reach into the stack budget of boards/mcu/{b}.toml\");\n",
            b = self.board,
            cn = c.name,
            cb = c.base,
            cs = c.size,
            rn = r.name,
            rb = r.base,
            rs = r.size,
            sb = self.stack.bytes,
        )
    }

    /// The board as Rust consts.
    pub fn consts(&self) -> String {
        let mut s = String::new();
        for (name, ty, value, doc) in self.memory_consts().into_iter().chain(self.device_consts()) {
            let _ = writeln!(s, "/// {doc}\npub const {name}: {ty} = {value};");
        }
        s
    }

    /// The board, its memory, its stack and its NOR region.
    fn memory_consts(&self) -> Vec<Const> {
        let (n, st) = (&self.nor, &self.stack);
        let config = format!(
            "{}..{}",
            n.config[0] * n.sector_bytes,
            n.config[1] * n.sector_bytes
        );
        vec![
            konst(
                "NAME",
                "&str",
                format!("{:?}", self.board),
                "The board's name.",
            ),
            konst(
                "DESCRIPTION",
                "&str",
                format!("{:?}", self.description),
                "What it is.",
            ),
            konst(
                "SYSTEM_CLOCK_HZ",
                "u32",
                self.system_clock_hz,
                "SYSCLK, Hz: the CPU, timers, UARTs and watchdog.",
            ),
            konst(
                "RAM_BASE",
                "u32",
                hex(self.memory.ram.base),
                "RAM's first address.",
            ),
            konst("RAM_BYTES", "u32", hex(self.memory.ram.size), "RAM's size."),
            konst(
                "STACK_BYTES",
                "u32",
                st.bytes,
                "The stack painted and watched, at the top of RAM.",
            ),
            konst(
                "STACK_BUDGET_BYTES",
                "u32",
                st.budget_bytes,
                "The most stack the firmware may use, boot and steps alike.",
            ),
            konst(
                "NOR_NAME",
                "&str",
                format!("{:?}", n.name),
                "What stands in for the NOR part.",
            ),
            konst(
                "NOR_BASE",
                "u32",
                hex(n.base),
                "The NOR region's first address.",
            ),
            konst("NOR_BYTES", "u32", hex(n.size), "The NOR region's size."),
            konst(
                "NOR_SECTOR_BYTES",
                "usize",
                n.sector_bytes,
                "The NOR's erase unit.",
            ),
            konst(
                "NOR_WRITE_BYTES",
                "usize",
                n.write_bytes,
                "The NOR's write unit.",
            ),
            konst(
                "NOR_CONFIG",
                "core::ops::Range<u32>",
                config,
                "Offsets in the NOR region of the config store (the latched record).",
            ),
            konst(
                "NOR_ITEM_WORST_US",
                "u64",
                n.item_worst_us,
                "The longest one config item's write may take on the NOR part, µs (a sector's erase and a sector's moves).",
            ),
            konst(
                "NOR_STARTS_ZEROED",
                "bool",
                n.starts_zeroed,
                "The NOR region reads all zeros before its first use (RAM standing in for a part): a config store found so is erased at start, not refused.",
            ),
        ]
    }

    /// The UARTs, the reset-cause word, the timers, the watchdog and the
    /// LEDs.
    fn device_consts(&self) -> Vec<Const> {
        let mut v = Vec::new();
        for (tag, u, doc) in [
            ("MODBUS", &self.uart.modbus, "Modbus RTU to the CDU"),
            ("GATEWAY", &self.uart.gateway, "the gateway link"),
            ("CONSOLE", &self.uart.console, "the console's text lines"),
            ("TRACE", &self.uart.trace, "the debug port's trace"),
        ] {
            let value = format!(
                "Uart {{ name: {:?}, base: {}, rx_irq: {}, baud: {} }}",
                u.name,
                hex(u.base),
                u.rx_irq,
                u.baud
            );
            v.push(konst(
                &format!("UART_{tag}"),
                "Uart",
                value,
                &format!("{}: {doc}.", u.name),
            ));
        }
        v.push(konst(
            "RESET_CAUSE_ADDR",
            "u32",
            hex(self.reset_cause.base),
            "The word that says why the board last started (RAM no reset touches).",
        ));
        for (tag, t, doc) in [
            ("CONTROL", &self.timer.control, "the control tick"),
            ("MICROS", &self.timer.micros, "the microsecond clock"),
            ("WAKE", &self.timer.wake, "the millisecond wake-up"),
        ] {
            let value = format!(
                "Timer {{ name: {:?}, base: {}, irq: {} }}",
                t.name,
                hex(t.base),
                t.irq
            );
            v.push(konst(
                &format!("TIMER_{tag}"),
                "Timer",
                value,
                &format!("{}: {doc}.", t.name),
            ));
        }
        let period = self.timer.control.period_ms.unwrap_or(0);
        v.extend([
            konst(
                "CONTROL_PERIOD_MS",
                "u32",
                period,
                "The control period, ms.",
            ),
            konst(
                "WATCHDOG_BASE",
                "u32",
                hex(self.watchdog.base),
                "The CMSDK APB watchdog.",
            ),
            konst(
                "WATCHDOG_TIMEOUT_MS",
                "u32",
                self.watchdog.timeout_ms,
                "Time to the watchdog's NMI; its second expiry resets the board.",
            ),
            konst(
                "FPGAIO_BASE",
                "u32",
                hex(self.fpgaio.base),
                "The FPGA's system I/O block (LEDs).",
            ),
            konst("FPGAIO_LEDS", "u8", self.fpgaio.leds, "LEDs on it."),
        ]);
        v
    }
}

/// One const: its name, type, value and doc line.
type Const = (String, String, String, String);

fn konst(name: &str, ty: &str, value: impl ToString, doc: &str) -> Const {
    (name.into(), ty.into(), value.to_string(), doc.into())
}

fn hex(v: u32) -> String {
    format!("{v:#010x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped board file, its line `line` (once in it) replaced by
    /// `with`, loaded from a file of its own named `name`.
    fn load_edited(line: &str, with: &str, name: &str) -> Result<Board, String> {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(here.join("../boards/mcu/mps2-an386.toml")).unwrap();
        let line = format!("\n{line}\n");
        assert_eq!(text.matches(&line).count(), 1, "{line}");
        let file = std::env::temp_dir().join(format!("{name}-{}.toml", std::process::id()));
        std::fs::write(&file, text.replace(&line, &format!("\n{with}\n"))).unwrap();
        let b = Board::load(&file);
        std::fs::remove_file(&file).unwrap();
        b
    }

    /// The shipped board file, its `[leak_ropes]` table's `gpio` set to
    /// `gpio`, loaded from a file of its own named `name`.
    fn load_with(gpio: &str, name: &str) -> Result<Board, String> {
        load_edited("gpio = []", &format!("gpio = {gpio}"), name)
    }

    #[test]
    fn a_nor_starts_zeroed_only_where_its_board_file_says_so() {
        let zeroed = "pub const NOR_STARTS_ZEROED: bool = true;";
        let shipped = load_edited("starts_zeroed = true", "starts_zeroed = true", "qemu");
        assert!(shipped.unwrap().consts().contains(zeroed));
        let real = load_edited("starts_zeroed = true", "", "real-part").unwrap();
        let consts = real.consts();
        assert!(!consts.contains(zeroed));
        assert!(consts.contains("pub const NOR_STARTS_ZEROED: bool = false;"));
    }

    #[test]
    fn a_nors_worst_item_write_is_the_board_files_and_must_be_given() {
        let line = "item_worst_us = 450_000";
        let shipped = load_edited(line, line, "item-worst").unwrap();
        assert!(shipped
            .consts()
            .contains("pub const NOR_ITEM_WORST_US: u64 = 450000;"));
        let slow = load_edited(line, "item_worst_us = 200_000", "fast-part").unwrap();
        assert!(slow
            .consts()
            .contains("pub const NOR_ITEM_WORST_US: u64 = 200000;"));
        let e = load_edited(line, "", "no-worst").unwrap_err();
        assert!(e.contains("item_worst_us"), "{e}");
        let e = load_edited(line, "item_worst_us = 0", "zero-worst").unwrap_err();
        assert!(e.contains("nor.item_worst_us 0"), "{e}");
    }

    #[test]
    fn a_watchdog_that_would_reset_a_step_keeping_the_latched_record_is_refused() {
        // The shipped board: 1,000 + 900 + 900 + 1,350 + 100 ms between
        // two feeds at worst (a clear's number is two items), under the
        // reset at 4,400 ms.
        assert_eq!(feed_interval_worst_ms(1_000, 450), 4_250);
        let line = "timeout_ms = 2200";
        assert!(load_edited(line, line, "watchdog").is_ok());
        // The reset at 4,000 ms, the figure before a clear's number was
        // counted as two items, comes before the worst.
        let e = load_edited(line, "timeout_ms = 2000", "short-watchdog").unwrap_err();
        assert!(
            e.contains("watchdog.timeout_ms 2000: its reset, at the second expiry (4000 ms)"),
            "{e}"
        );
        assert!(e.contains("(4250 ms:"), "{e}");
        assert!(e.contains("Give at least 2126 ms"), "{e}");
        // A slower part needs a longer watchdog.
        let slow = load_edited(
            "item_worst_us = 450_000",
            "item_worst_us = 1_200_000",
            "slow-part",
        )
        .unwrap_err();
        assert!(slow.contains("(9500 ms:"), "{slow}");
    }

    #[test]
    fn a_board_naming_rope_pins_is_refused_for_the_firmware_reads_none() {
        assert!(load_with("[]", "no-ropes").is_ok());
        let e = load_with("[3, 7]", "two-ropes").unwrap_err();
        assert!(e.contains("two-ropes-"), "names the file: {e}");
        assert!(
            e.contains(".toml: leak_ropes.gpio [3, 7]: this firmware reads no rope pins"),
            "{e}"
        );
    }

    /// LED 0 blinks each step and LED 1 shows a latched leak: a board
    /// with fewer would stop the firmware at boot.
    #[test]
    fn a_board_with_fewer_than_two_leds_is_refused() {
        assert!(load_edited("leds = 2", "leds = 8", "eight-leds").is_ok());
        for n in [0, 1, 9] {
            let e = load_edited("leds = 2", &format!("leds = {n}"), "leds").unwrap_err();
            assert!(e.contains(&format!("fpgaio.leds {n}: 2 to 8")), "{e}");
            assert!(e.contains("LED 1 shows a latched leak"), "{e}");
        }
    }

    /// Values that would panic the build script or the firmware at boot,
    /// or run its clock fast, are refused naming their key.
    #[test]
    fn board_values_the_firmware_cannot_run_on_are_refused_naming_their_key() {
        let refused = |line: &str, with: &str, said: &str| {
            let e = load_edited(line, with, "bad-value").unwrap_err();
            assert!(e.contains("bad-value-"), "names the file: {e}");
            assert!(e.contains(said), "{with}: {e}");
        };
        refused("baud = 19_200", "baud = 0", "uart.modbus.baud 0");
        refused(
            "baud = 19_200",
            "baud = 2_000_000",
            "uart.modbus.baud 2000000",
        );
        refused(
            "sector_bytes = 4096",
            "sector_bytes = 0",
            "nor.sector_bytes 0",
        );
        refused(
            "sector_bytes = 4096",
            "sector_bytes = 4094",
            "nor.sector_bytes 4094",
        );
        refused("write_bytes = 4", "write_bytes = 0", "nor.write_bytes 0");
        refused(
            "system_clock_hz = 25_000_000",
            "system_clock_hz = 32_768_000",
            "system_clock_hz 32768000: a whole number of MHz",
        );
        refused(
            "system_clock_hz = 25_000_000",
            "system_clock_hz = 0",
            "system_clock_hz 0",
        );
        // The gateway UART's receive interrupt on the control timer's.
        refused(
            "rx_irq = 2",
            "rx_irq = 8",
            "uart.gateway.rx_irq 8: timer.control.irq has it too",
        );
        refused(
            "rx_irq = 18",
            "rx_irq = 32",
            "uart.trace.rx_irq 32: below 32",
        );
        assert!(load_edited("rx_irq = 18", "rx_irq = 31", "irq-31").is_ok());
        assert!(load_edited(
            "system_clock_hz = 25_000_000",
            "system_clock_hz = 32_000_000",
            "clock-32"
        )
        .is_ok());
    }
}

//! The step's status line on the trace port, and the instruction counts
//! it summarises.
//!
//! Glossary:
//! - *median*: of the last 256 steps' instruction counts.

use core::fmt;

use cooling_core::Commands;
use loopwarden_firmware::cdu::CduMeasurements;
use loopwarden_firmware::map::Centi;
use loopwarden_firmware::plan::Outcome;
use loopwarden_protocol::message::{CduMode, Pump};

/// Steps whose instruction counts the median is taken over.
const WINDOW: usize = 256;

/// The core's instructions per step: the last [`WINDOW`] and the worst.
#[derive(Debug, Default)]
pub struct InsnStats {
    last: heapless::Deque<u32, WINDOW>,
    max: u32,
    steps: u32,
}

impl InsnStats {
    /// Adds a step's count.
    pub fn add(&mut self, insn: u32) {
        if self.last.is_full() {
            self.last.pop_front();
        }
        let _ = self.last.push_back(insn);
        self.max = self.max.max(insn);
        self.steps = self.steps.saturating_add(1);
    }

    /// The median of the last steps.
    pub fn median(&self) -> u32 {
        let mut v: heapless::Vec<u32, WINDOW> = self.last.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

fn mode(m: CduMode) -> &'static str {
    match m {
        CduMode::Boot => "boot",
        CduMode::Normal => "normal",
        CduMode::Degraded => "degraded",
        CduMode::Failsafe => "failsafe",
    }
}

/// One step's status line.
pub struct Status<'a> {
    /// The control tick.
    pub step: u32,
    /// The step's time, ms since boot.
    pub now_ms: u64,
    /// The core's instructions this step.
    pub insn: u32,
    /// Over the steps.
    pub stats: &'a InsnStats,
    /// The stack's peak (`Err`: it reached its bottom).
    pub stack: Result<u32, u32>,
    /// What the CDU measured.
    pub measured: Option<&'a CduMeasurements>,
    /// What the core decided.
    pub commands: &'a Commands,
    /// The heartbeat planned.
    pub heartbeat: u16,
    /// What became of the writes.
    pub outcome: &'a Outcome,
    /// Watchdog NMIs since boot.
    pub watchdog_warnings: u32,
}

impl fmt::Display for Status<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.stats;
        write!(
            f,
            "step {} t={} ms insn {} (median {} max {} over {} steps) ",
            self.step,
            self.now_ms,
            self.insn,
            s.median(),
            s.max,
            s.steps
        )?;
        match self.stack {
            Ok(b) => write!(f, "stack {b} B")?,
            Err(budget) => write!(f, "stack OVER its {budget} B")?,
        }
        let c = self.commands;
        write!(f, " | {}", mode(c.mode))?;
        match self.measured {
            Some(m) => {
                let bits = |v: Option<u16>| v.unwrap_or(0);
                write!(
                    f,
                    " | leaks {:#06b} closed {:#06b}",
                    bits(m.leaks),
                    bits(m.valves_closed)
                )?;
                let on = |p: Option<bool>| if p == Some(true) { "on" } else { "off" };
                write!(
                    f,
                    " pumps A {} B {}",
                    on(m.pumps_running[0]),
                    on(m.pumps_running[1])
                )?;
                if let Some(t) = m.supply_c {
                    write!(f, " supply {} C", Centi(t))?;
                }
            }
            None => write!(f, " | cdu not read")?,
        }
        let pumps = u8::from(c.pump_on[0]) | (u8::from(c.pump_on[1]) << 1);
        let lead = if c.lead == Pump::B { "B" } else { "A" };
        write!(f, " | valves_open {:#06b} pumps_run {pumps:#04b} lead {lead} heartbeat {} speed {} % setpoint {} C", c.valves_open, self.heartbeat, Centi(f64::from(c.pump_speed) * 100.0), Centi(f64::from(c.setpoint_c)))?;
        let failed = self
            .outcome
            .tried
            .iter()
            .filter(|(_, r)| r.is_err())
            .count();
        match failed {
            0 => write!(f, " | writes ok")?,
            n => write!(f, " | {n} writes failed")?,
        }
        if self.watchdog_warnings > 0 {
            write!(f, " | watchdog NMIs {}", self.watchdog_warnings)?;
        }
        Ok(())
    }
}

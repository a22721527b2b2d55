//! The step's status line on the console (UART2): the step, its time,
//! its instructions and stack, the mode, what the CDU read, what was
//! written and what its read-back found (the heartbeat withheld while a
//! safety setting reads back not held, or since the start until a
//! read-back reads them held), then the link's counts (frames in, bad and why the last
//! was, bytes the receive ring lost, repeated, the gaps
//! in their numbers and the frames lost in them, the gateway's restarts,
//! frames dropped out; `firmware/test-qemu.sh` shows the
//! console's end when a check fails).
//!
//! Glossary:
//! - *insn*: the decision's instructions (the decision path's step and
//!   plan); *work*: the whole step's, its Modbus transactions excepted.

use core::fmt;

use cooling_decide::{Plan, Setting};
use loopwarden_firmware::controller::Controller;
use loopwarden_firmware::map::Centi;
use loopwarden_firmware::read_back::SafetyHeld;
use loopwarden_protocol::message::{CduMode, Pump};

fn mode(m: CduMode) -> &'static str {
    match m {
        CduMode::Boot => "boot",
        CduMode::Normal => "normal",
        CduMode::Degraded => "degraded",
        CduMode::Failsafe => "failsafe",
    }
}

/// One step's status line.
pub struct Line<'a, 'd> {
    /// The control tick.
    pub tick: u32,
    /// The step's time, ms since boot.
    pub now_ms: u64,
    /// The controller after the step.
    pub ctl: &'a Controller<'d>,
    /// What was planned.
    pub plan: &'a Plan,
    /// Writes that failed.
    pub failed: usize,
    /// The step's work, instructions.
    pub work: u32,
    /// The steps' stack peak (`Err`: it reached the painted bottom).
    pub stack: Result<u32, u32>,
    /// Boot's stack peak.
    pub boot_peak: u32,
    /// Watchdog NMIs since boot.
    pub watchdog_warnings: u32,
    /// Frames dropped for the gateway and for the trace.
    pub dropped: (u32, u32),
    /// What the read-backs of the safety writes found.
    pub safety: &'a SafetyHeld,
}

impl fmt::Display for Line<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.ctl.insn;
        write!(
            f,
            "step {} t={} ms insn {} (median {} max {} over {} steps) work {} ",
            self.tick,
            self.now_ms,
            self.ctl.insn_last(),
            s.median(),
            s.max(),
            s.steps(),
            self.work
        )?;
        match self.stack {
            Ok(b) => write!(f, "stack {b} B (boot {} B)", self.boot_peak)?,
            Err(bottom) => write!(f, "stack OVER its {bottom} B painted")?,
        }
        self.measured(f)?;
        self.written(f)?;
        let l = &self.ctl.link;
        write!(f, " | link in {} bad {}", l.frames, l.bad)?;
        if let Some(e) = l.last_bad {
            write!(f, " (last: {e})")?;
        }
        write!(
            f,
            " overruns {} repeats {} gaps {} (lost {}) restarts {} dropped up {} trace {}",
            l.overruns, l.repeats, l.gaps, l.lost, l.restarts, self.dropped.0, self.dropped.1
        )?;
        match self.ctl.gateway() {
            (Some(at_ms), bus) => write!(
                f,
                " gateway heard {} ms ago{}",
                self.now_ms.saturating_sub(at_ms),
                if bus { "" } else { " (no broker)" }
            )?,
            (None, _) => write!(f, " gateway never heard")?,
        }
        match self.ctl.layouts() {
            (_, Some(theirs)) if !self.ctl.layouts_agree() => {
                write!(f, " | LAYOUT DIFFERS: the gateway's {theirs}")?
            }
            (_, None) => write!(f, " | the gateway's layout not heard")?,
            _ => {}
        }
        if self.watchdog_warnings > 0 {
            write!(f, " | watchdog NMIs {}", self.watchdog_warnings)?;
        }
        Ok(())
    }
}

impl Line<'_, '_> {
    fn measured(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, _, _) = self.ctl.decider().core().mode();
        write!(f, " | {}", mode(m))?;
        let Some(r) = self.ctl.readings() else {
            return write!(f, " | cdu not read");
        };
        let bits = |v: Option<u16>| v.unwrap_or(0);
        write!(
            f,
            " | leaks {:#06b} closed {:#06b}",
            bits(r.leaks),
            bits(r.valves_closed)
        )?;
        let on = |p: Option<bool>| if p == Some(true) { "on" } else { "off" };
        write!(
            f,
            " pumps A {} B {}",
            on(r.pumps_running[0]),
            on(r.pumps_running[1])
        )?;
        if let Some(t) = r.supply_c {
            write!(f, " supply {} C", Centi(t))?;
        }
        Ok(())
    }

    fn written(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(c) = self.ctl.commands() else {
            return Ok(());
        };
        let pumps = u8::from(c.pump_on[0]) | (u8::from(c.pump_on[1]) << 1);
        let lead = if c.lead == Pump::B { "B" } else { "A" };
        let heartbeat = self.plan.value(Setting::Heartbeat).unwrap_or(0.0) as u32;
        write!(
            f,
            " | valves_open {:#06b} pumps_run {pumps:#04b} lead {lead} heartbeat {heartbeat} speed {} % setpoint {} C",
            c.valves_open,
            Centi(f64::from(c.pump_speed) * 100.0),
            Centi(f64::from(c.setpoint_c))
        )?;
        if self.plan.value(Setting::Valves).is_none() {
            write!(f, " (valves held)")?;
        }
        match self.failed {
            0 => write!(f, " | writes ok")?,
            n => write!(f, " | {n} writes failed")?,
        }
        self.read_back(f)
    }

    /// The read-backs' counts since boot, when any failed, and the
    /// heartbeat withheld, with why: a safety setting reads back not
    /// held, or none has read back held since the start
    /// ([`SafetyHeld::withheld_why`]).
    fn read_back(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.safety;
        if s.not_held > 0 || s.unread > 0 {
            write!(
                f,
                " | read back: not held {} unread {}",
                s.not_held, s.unread
            )?;
        }
        if let Some(why) = s.withheld_why() {
            write!(f, " | HEARTBEAT WITHHELD: {why}")?;
        }
        Ok(())
    }
}

//! The shell's side of operators' clears: the keyring and each
//! operator's last clear number read from flash at the start
//! ([`Shell::restore_clears`]), and, each step before the gateway is
//! heard, those the flash could not read or keep read or kept again
//! ([`Shell::settle_clears`]), one write a step at most.

use super::*;
use loopwarden_firmware::controller::StepKeep;

impl Shell {
    /// The keyring built in, and each operator's last clear id.
    pub(super) fn restore_clears(&mut self, ctl: &mut Controller<'_>) {
        let gate = ctl.gate_mut();
        let Some(cdu) = gate.cdu() else {
            let _ = writeln!(
                self.console,
                "clears: no operator keyring ({}): every clear is refused",
                keyring::SOURCE
            );
            return;
        };
        let _ = writeln!(
            self.console,
            "clears: {} operator keys for CDU {cdu} (keyring {})",
            keyring::OPERATORS.len(),
            keyring::SOURCE
        );
        // Every slot read: the keyring may have changed since they were
        // kept, and each operator's number is moved to their place.
        match block_on(counters::restore(&mut self.store, gate)) {
            Ok(r) => self.say_restored(&r),
            Err(e) => {
                let _ = writeln!(
                    self.console,
                    "clears: the operators' last clear numbers unreadable in flash: {e}; every operator's clears are refused until they are read (tried again each step)"
                );
            }
        }
    }

    /// What the start's read of the operators' last clear numbers did.
    fn say_restored(&mut self, r: &counters::Restored) {
        if r.moved > 0 {
            let _ = writeln!(
                self.console,
                "clears: {} operators' last clear numbers moved to their places in this keyring",
                r.moved
            );
        }
        if r.unplaced > 0 {
            let _ = writeln!(
                self.console,
                "clears: {} operators' last clear numbers not moved to their places (no slot to copy another's aside): their clears are refused until they are (tried again each step)",
                r.unplaced
            );
        }
        // Each is an operator's place: its operator is refused at least
        // (a damaged slot that is no operator's place refuses every
        // operator, said as unreadable).
        for d in &r.damaged {
            let (a, b) = (d.refused.first().copied().unwrap_or(""), d.refused.get(1));
            let (and, b) = (if b.is_some() { " and " } else { "" }, b.unwrap_or(&""));
            let _ = writeln!(
                self.console,
                "error: clears: {}: the clears of {a}{and}{b} are refused until the flash is mended (docs/firmware.md: a damaged clear number); every other operator's clears are taken",
                d.damaged,
            );
        }
    }

    /// The operators whose last clear number the flash could not read
    /// or keep: read or kept again; one that now is has its clears taken
    /// again (said on the console). A try that fails again is not said.
    /// One keep a step at most (a write may take the NOR part's worst):
    /// the others wait for the next steps. Returns what it did to the
    /// flash: after a write, tried or done, the step's hearing keeps no
    /// clear's number ([`StepKeep`]); reads alone spend nothing.
    #[inline(never)]
    pub(super) fn settle_clears(&mut self, ctl: &mut Controller<'_>) -> StepKeep {
        let gate = ctl.gate_mut();
        let unsettled: heapless::Vec<(usize, &str, Last), MAX_OPERATORS> =
            gate.unsettled().collect();
        if unsettled.iter().any(|u| u.2 == Last::Unread) {
            // Every slot read again, as at the start (a damaged slot is
            // said at the start only), one number moved at most: the
            // others stay unread until a later step moves them.
            let r = block_on(counters::restore_step(&mut self.store, gate));
            let unread = gate.unsettled().any(|u| u.2 == Last::Unread);
            if r.is_ok() && !unread {
                let _ = writeln!(
                    self.console,
                    "clears: the operators' last clear numbers read from flash: their clears are taken again"
                );
            }
            // An operator whose number waits to be kept is tried below
            // while another's slot stays damaged; not after a write here,
            // nor after a read that failed (it wrote nothing).
            let Ok(writes) = r.map(|r| r.writes) else {
                return StepKeep::NoWrite;
            };
            if writes > 0 {
                // A number moved that the flash refused is left unkept.
                let was_unkept =
                    |slot| unsettled.iter().any(|u| u.0 == slot && u.2 != Last::Unread);
                let refused = (gate.unsettled())
                    .any(|(slot, _, l)| matches!(l, Last::Unkept(_)) && !was_unkept(slot));
                return StepKeep::of(writes, refused);
            }
        }
        // One keep, of the first operator whose number waits for one.
        let Some((slot, name, id)) = unsettled.iter().find_map(|&(slot, name, l)| match l {
            Last::Unkept(id) => Some((slot, name, id)),
            _ => None,
        }) else {
            return StepKeep::NoWrite;
        };
        let kept = block_on(counters::keep_clear(&mut self.store, slot, name, id)).is_ok();
        if kept {
            gate.set(slot, Last::Id(id));
            let _ = writeln!(
                self.console,
                "clears: {name}'s last clear number kept in flash: {name}'s clears are taken again"
            );
        }
        StepKeep::of(1, !kept)
    }
}

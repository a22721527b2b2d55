//! The read-back of the settings: a write's echo does not show what the
//! CDU holds. A function-16 write's echo carries the first register and
//! the count, never the value; a function-6 write's echo is the request
//! itself, whatever the CDU kept. So a CDU that clamps a setting (a
//! 32-bit `pump_speed` from 72.5 % to 70 %, a 16-bit `supply_setpoint`
//! from 42 °C to 40 °C) without an exception echoes it as if it took it,
//! and the controller would judge the supply against a setpoint the CDU
//! never got. A two-word setting is read back (function 3) right after
//! its echo ([`ModbusCdu::read_back_wide`]); the one-word settings of a
//! step are read back together after the step's writes, one request per
//! run of contiguous holding registers ([`CduPort::read_back`]: one for
//! the simulated CDU's map). Both compare word for word: another value is
//! a bad answer naming the value held. A two-word setting's read-back
//! that fails (no answer, refused, a bad answer) fails its write. A
//! one-word run's read-back that fails leaves its settings as their echo
//! said, taken, and is reported apart ([`ReadBack::unread`]): a CDU that
//! echoes function 6 but does not serve function 3 on its holding
//! registers (or holds a write-only register in the run) would otherwise
//! have every setting not taken every step, its lead pump's trip never
//! judged and its setpoint never applied. (The shell still reports one
//! whose last write did not go in as not taken until a read-back reads
//! it held, while acting on its echo: `Outcome::unsure`.) After a run the CDU did not
//! answer (no answer, garbled, the link failed, a gateway that could not
//! reach it), the later runs are not tried, as a read's later requests
//! are not: each would wait out its own timeout, and a step waits at
//! most two. Their settings join that run's failure, named not tried.
//! The heartbeat is not read
//! back: a CDU may count its watchdog register down or clear it, so what
//! it holds says nothing of the write; its echo is checked.
//!
//! Glossary:
//! - *held*: the words a setting's registers read back.
use super::*;

/// What a step's read-back of its one-word settings found.
#[derive(Debug, Default)]
pub struct ReadBack {
    /// Settings the CDU holds another value of than written, each with
    /// the bad answer naming both: not taken.
    pub not_held: Vec<(Vec<Setting>, CduError)>,
    /// Runs whose read-back failed (no answer, refused, a bad answer):
    /// their settings stay as their echo said (taken, for what the
    /// controller acts on); the failure is to be reported as a failed
    /// read, and the shell reports a setting whose last write did not go
    /// in as not taken still (`Outcome::unsure`, unless the CDU does not
    /// serve the read-back at all: exception 1 or 2).
    pub unread: Vec<(Vec<Setting>, CduError)>,
}

/// The outcome of a whole write ([`ModbusCdu::write`]) of the settings
/// `names`, every one echoed right, whose read-back found `back`: every
/// setting of every failure is named, those holding another value as
/// failed (not taken), those not read back as not known (taken as their
/// echo said).
pub(super) fn whole_write(names: Vec<&'static str>, back: ReadBack) -> Result<(), CduError> {
    if back.not_held.is_empty() && back.unread.is_empty() {
        return Ok(());
    }
    let named = |failures: &[(Vec<Setting>, CduError)]| -> Vec<&'static str> {
        let set: Vec<&str> = failures
            .iter()
            .flat_map(|(s, _)| s.iter().map(|s| s.register()))
            .collect();
        names.iter().copied().filter(|n| set.contains(n)).collect()
    };
    let failed = named(&back.not_held);
    let not_known = named(&back.unread);
    let mut causes: Vec<(Option<usize>, CduError)> = back
        .not_held
        .into_iter()
        .chain(back.unread)
        .map(|(s, e)| {
            (
                names
                    .iter()
                    .position(|n| s.iter().any(|s| s.register() == *n)),
                e,
            )
        })
        .collect();
    causes.sort_by_key(|(at, _)| *at);
    Err(CduError::ReadBack {
        written: names.into_iter().filter(|n| !failed.contains(n)).collect(),
        failed,
        not_known,
        causes: causes.into_iter().map(|(_, e)| e).collect(),
    })
}

/// A one-word setting to read back: its register, the value written and
/// its word.
struct OneWord {
    setting: Setting,
    register: Register,
    value: f64,
    word: u16,
}

impl ModbusCdu {
    /// Reads back holding register `r`'s words after the write of `value`
    /// as `words` was echoed right (`write_op`: that write, as its errors
    /// name it). Done only when the CDU holds `words`. Holding another
    /// value is a bad answer naming the value held; a read-back that fails
    /// (no answer, refused, a bad answer) fails the write: whether the
    /// CDU took the value is not known.
    pub(super) async fn read_back_wide(
        &mut self,
        r: &Register,
        value: f64,
        words: &[u16],
        write_op: String,
    ) -> Result<(), CduError> {
        let n = words.len() as u16;
        let last = u32::from(r.address) + u32::from(n) - 1;
        let at = format!("holding {}-{last}", r.address);
        let op = format!("{write_op}, read back from {at}");
        let held = self.read_holding(op, r.address, n).await?;
        if held == words {
            return Ok(());
        }
        Err(self.held_other(r, value, words, &held, &at, write_op))
    }

    /// Holding registers `start` to `start + n - 1`, read for `op`.
    async fn read_holding(&mut self, op: String, start: u16, n: u16) -> Result<Vec<u16>, CduError> {
        match self
            .exchange(op.clone(), Request::ReadHoldingRegisters(start, n))
            .await?
        {
            Response::ReadHoldingRegisters(held) if held.len() == usize::from(n) => Ok(held),
            Response::ReadHoldingRegisters(held) => {
                let detail = format!("{} registers for {n} asked", held.len());
                Err(self.bad_answer(op, detail))
            }
            other => Err(self.bad_answer(op, format!("{other:?}"))),
        }
    }

    /// The bad answer of a write of `value` as `words` to `r`
    /// (`write_op`) whose registers (`at`) read back `held`.
    fn held_other(
        &mut self,
        r: &Register,
        value: f64,
        words: &[u16],
        held: &[u16],
        at: &str,
        write_op: String,
    ) -> CduError {
        let held_value = r.decode(self.map.word_order, held);
        let detail = format!(
            "the CDU echoed the write, but {at} reads back {}, not the {} written: \
             it clamped the value or did not take it",
            written(held_value, &r.unit, held),
            written(value, &r.unit, words)
        );
        self.bad_answer(write_op, detail)
    }

    /// The one-word settings of `writes` to read back, by address.
    fn one_word(&self, writes: &[Write]) -> Vec<OneWord> {
        let mut out: Vec<OneWord> = writes
            .iter()
            .filter(|w| w.setting != Setting::Heartbeat)
            .filter_map(|w| {
                let name = w.setting.register();
                let r = self.map.get(name).filter(|r| r.kind == Kind::Holding)?;
                match self.map.encode(name, w.value).ok()?.as_slice() {
                    [word] => Some(OneWord {
                        setting: w.setting,
                        register: r.clone(),
                        value: w.value,
                        word: *word,
                    }),
                    _ => None,
                }
            })
            .collect();
        out.sort_by_key(|o| o.register.address);
        out.dedup_by_key(|o| o.register.address);
        out
    }

    /// Reads back the one-word settings of `writes`, one request per run
    /// of contiguous holding registers (at most 125 each): each setting
    /// that holds another value, and each run that could not be read,
    /// with why. After a run the CDU did not answer, the later runs are
    /// not tried (each would wait out its own timeout): their settings
    /// join that run's failure, which names them not tried.
    pub(super) async fn read_back_settings(&mut self, writes: &[Write]) -> ReadBack {
        let mut failed = ReadBack::default();
        let settings = self.one_word(writes);
        let runs = runs(&settings);
        for (i, run) in runs.iter().enumerate() {
            if !self.read_back_run(run, &mut failed).await {
                continue;
            }
            let rest = &runs[i + 1..];
            if rest.is_empty() {
                break;
            }
            if let Some((mut unread, e)) = failed.unread.pop() {
                let at: Vec<String> = rest.iter().map(|r| run_named(r)).collect();
                let why = format!(" ({} not tried after it)", at.join(", "));
                unread.extend(rest.iter().flat_map(|r| r.iter().map(|o| o.setting)));
                failed.unread.push((unread, reads::noted(e, &why)));
            }
            break;
        }
        failed
    }

    /// Reads back `run` (contiguous registers) in one request, adding
    /// each failure to `failed`: whether the CDU did not answer it.
    async fn read_back_run(&mut self, run: &[OneWord], failed: &mut ReadBack) -> bool {
        let at = run[0].register.address;
        let op = self.op(format_args!("read back {}", run_named(run)));
        let held = match self.read_holding(op, at, run.len() as u16).await {
            Ok(held) => held,
            Err(e) => {
                let unanswered = e.is_unanswered();
                let settings = run.iter().map(|o| o.setting).collect();
                failed.unread.push((settings, e));
                return unanswered;
            }
        };
        for (o, h) in run.iter().zip(held) {
            if h == o.word {
                continue;
            }
            let r = &o.register;
            let write_op = format!(
                "{}, {}",
                self.op(format_args!("write {} at holding {}", r.name, r.address)),
                written(o.value, &r.unit, &[o.word])
            );
            let here = format!("holding {}", r.address);
            let e = self.held_other(r, o.value, &[o.word], &[h], &here, write_op);
            failed.not_held.push((vec![o.setting], e));
        }
        false
    }
}

/// `settings` (by address, no address twice) in runs of contiguous
/// registers ([`read_back_runs`]): one read-back request per run.
fn runs(settings: &[OneWord]) -> Vec<&[OneWord]> {
    let mut rest = settings;
    read_back_runs(settings.iter().map(|o| o.register.address))
        .into_iter()
        .map(|(_, n)| {
            let (run, after) = rest.split_at(usize::from(n));
            rest = after;
            run
        })
        .collect()
}

/// The runs of holding registers `addresses` (in any order, twice or
/// not) that a read-back asks in one request each: contiguous, at most
/// 125 registers, each as its first address and its count, by address.
/// The step's read-back and the serial timeout's check
/// (`config::link`) split them the same way.
pub fn read_back_runs(addresses: impl IntoIterator<Item = u16>) -> Vec<(u16, u16)> {
    let mut at: Vec<u16> = addresses.into_iter().collect();
    at.sort_unstable();
    at.dedup();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for a in at {
        match out.last_mut() {
            Some((start, n)) if u32::from(a) == u32::from(*start) + u32::from(*n) && *n < 125 => {
                *n += 1
            }
            _ => out.push((a, 1)),
        }
    }
    out
}

/// A run's registers as its read-back names them: `holding 0-4
/// (supply_setpoint to pumps_run)`.
fn run_named(run: &[OneWord]) -> String {
    let (first, last) = (&run[0].register, &run[run.len() - 1].register);
    let names = if run.len() == 1 {
        first.name.clone()
    } else {
        format!("{} to {}", first.name, last.name)
    };
    format!("holding {}-{} ({names})", first.address, last.address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_back_runs_are_contiguous_and_at_most_125_registers() {
        assert_eq!(
            read_back_runs([4, 0, 1, 2, 2, 10, 20]),
            [(0, 3), (4, 1), (10, 1), (20, 1)]
        );
        let long = read_back_runs(0..300);
        assert_eq!(long, [(0, 125), (125, 125), (250, 50)]);
        assert!(read_back_runs([]).is_empty());
        assert_eq!(read_back_runs([65_535, 65_534]), [(65_534, 2)]);
    }
}

//! The shell's devices: the CDU on its Modbus link and the controller
//! board's pins. Each read and write goes here, and each failure is
//! counted and logged once per change of its message, and its end said;
//! what a reading means and what is written are the decision path's.
//! The board's outputs are driven each on its own: a relay line that
//! fails does not keep the beacon dark.
use super::*;
use crate::decide::{Plan, Setting, Write};

/// A device's failure in force, so it is said once per change of its
/// message, and its end said.
#[derive(Debug, Default)]
struct Failing(Option<String>);

impl Failing {
    /// A failure with message `e`: whether it is news (to be said).
    fn failed(&mut self, e: String) -> bool {
        let news = self.0.as_deref() != Some(e.as_str());
        self.0 = Some(e);
        news
    }

    /// It worked: the failure that ended, if one was in force (to be said).
    fn worked(&mut self) -> Option<String> {
        self.0.take()
    }

    /// A board pin's outcome `r`: a failure counted in `errors`, and
    /// said when news; the end of one said.
    fn judge(&mut self, what: &str, r: Result<(), String>, errors: &mut u64) {
        match r {
            Ok(()) => {
                if let Some(e) = self.worked() {
                    tracing::info!("cooling shell: {what} works again (was: {e})");
                }
            }
            Err(e) => {
                *errors += 1;
                if self.failed(e.clone()) {
                    tracing::error!("cooling shell: {what}: {e}");
                }
            }
        }
    }
}

/// The board's pins, each as it last did.
#[derive(Debug, Default)]
struct BoardErrors {
    ropes: Failing,
    relay: Failing,
    beacon: Failing,
}

/// Whether a read-back failed as the CDU refusing to serve it at all
/// (exception 1, illegal function, or 2, illegal data address): its
/// settings' echo is all there is of them, and is taken, but for one last
/// read back not held (the read-back refuted its echo).
fn not_served(e: &crate::modbus::CduError) -> bool {
    matches!(e.refused_code(), Some(1 | 2))
}

/// Why the heartbeat is withheld before a read-back has read the safety
/// settings held since the start.
const UNPROVEN: &str = "the safety settings not read back held since the start (read back first)";

/// A setting not known taken since its last write did not go in.
#[derive(Debug)]
struct NotTaken {
    setting: Setting,
    /// Read back holding another value, and not read back held since:
    /// why. A safety setting so holds the heartbeat back; a write of it
    /// refused or not planned, or a read-back that fails (even one the
    /// CDU does not serve at all), leaves it so.
    not_held: Option<String>,
}

/// The CDU, the board, and what each last said.
pub(super) struct Devices<P> {
    pub(super) cdu: P,
    board: Option<Box<dyn BoardIo>>,
    cdu_error: Failing,
    /// A request of the read that failed while another answered.
    read_gap: Failing,
    write_error: Failing,
    /// A read-back of the settings that failed (the settings taken on
    /// their echo).
    read_back_error: Failing,
    /// A read-back found a safety setting (valves, pumps to run, lead
    /// pump) not held: why, said once per change. The heartbeat is not
    /// written, so the CDU falls back to its own control while its
    /// echoes say one thing and its registers another.
    safety_not_held: Failing,
    /// The wait after the start for a read-back that proves the safety
    /// settings held, at most the bound ([`start::StartWait`]): until it
    /// ends the heartbeat is not written, so a controller restarted
    /// faster than the CDU's heartbeat timeout writes none unproven.
    start: start::StartWait,
    /// The settings whose last write did not go in (refused, not
    /// answered, not tried, read back holding another value, or not read
    /// back since one of those), each with whether it was read back not
    /// held ([`NotTaken`]): one leaves when a write of it goes in and is
    /// read back held, or needs no read-back (the heartbeat; a CDU that
    /// does not serve the read-back, exception 1 or 2, for one not read
    /// back not held). Until then a read-back of it that fails leaves it
    /// not taken: its echo alone does not say the CDU takes it again; one
    /// read back not held stays not taken, for the decision path too,
    /// over any read-back that fails, one refused by exception 1 or 2
    /// included. A safety setting read back not held holds the heartbeat
    /// back.
    not_taken: Vec<NotTaken>,
    board_errors: BoardErrors,
    /// When the CDU last answered a read.
    pub(super) last_read: Option<TimestampMs>,
    /// The pumps' fault bits as last read (`None` in one: the map has no
    /// such bit, or its read request failed, `read_gap`);
    /// `None` before the first read and while the CDU does not answer:
    /// unknown.
    pub(super) pump_faults: Option<[Option<bool>; 2]>,
    /// Whether the register map has each pump's fault bit.
    fault_bits: [bool; 2],
}

/// Why a pump's trip is not cleared while its fault flag was not read
/// this step. A fault flag is a bit word, which no pattern makes the
/// CDU's "not available" (`Register::reading`): it reads no value only
/// where the read request that holds it failed, or was not tried after
/// one that failed, while others answered (`gaps`: those requests'
/// errors, as logged). The cause is that read, not the pump's drive.
fn fault_unread(pump: usize, gaps: Option<&str>) -> String {
    let flag = ["pump_a_fault", "pump_b_fault"][pump % 2];
    let why = gaps.unwrap_or("the read error is in the log");
    format!(
        "not cleared: {flag} was not read this step: its read request failed or was not \
         tried after one that failed ({why}; logged as `reading the CDU (in part)`), so \
         whether the CDU still shows the pump's fault is unknown"
    )
}

/// What a pump's clear reads of its fault, from the fault bits as last
/// read (`faults`), whether the map has each (`mapped`) and the failed
/// requests of that read (`gaps`): `Ok(Some(shown))` from the bit,
/// `Ok(None)` where the map has no such bit (the clear is then taken on
/// the operator's word alone, and said so), `Err` while the CDU has not
/// been read or the bit's read request failed (unknown).
pub(super) fn pump_fault(
    faults: Option<[Option<bool>; 2]>,
    mapped: [bool; 2],
    pump: usize,
    gaps: Option<&str>,
) -> Result<Option<bool>, String> {
    let faults = faults.ok_or(super::NOT_READ)?;
    match (faults[pump], mapped[pump]) {
        (Some(shown), _) => Ok(Some(shown)),
        (None, false) => Ok(None),
        (None, true) => Err(fault_unread(pump, gaps)),
    }
}

/// What an operator is told of a pump put back in service: where no fault
/// bit could be read, that nothing but their word said it is repaired.
pub(super) fn pump_cleared(pump: &str, fault: Option<bool>) -> String {
    match fault {
        Some(_) => format!("pump {pump} back in service"),
        None => format!(
            "pump {pump} back in service on your word: the CDU's register map has no fault \
             bit for it, so whether its drive still shows a fault was not read; check it at \
             the CDU"
        ),
    }
}

impl<P: CduPort> Devices<P> {
    pub(super) fn new(cdu: P, board: Option<Box<dyn BoardIo>>) -> Self {
        Self {
            fault_bits: cdu.pump_fault_bits(),
            cdu,
            board,
            cdu_error: Failing::default(),
            read_gap: Failing::default(),
            write_error: Failing::default(),
            read_back_error: Failing::default(),
            safety_not_held: Failing::default(),
            start: start::StartWait::new(start::DEFAULT_BOUND_MS),
            not_taken: Vec::new(),
            board_errors: BoardErrors::default(),
            last_read: None,
            pump_faults: None,
        }
    }

    /// The wait after a start bounded by the CDU's heartbeat `timeout`,
    /// where the site figures give it (else [`start::DEFAULT_BOUND_MS`]).
    pub(super) fn start_bound(mut self, timeout: Option<Duration>) -> Self {
        let ms = timeout.map_or(start::DEFAULT_BOUND_MS, |t| t.as_millis() as u64);
        self.start = start::StartWait::new(ms);
        self
    }

    /// What a clear of `pump` (0: A, 1: B) reads of its fault
    /// ([`pump_fault`]).
    pub(super) fn pump_fault(&self, pump: usize) -> Result<Option<bool>, String> {
        let gaps = self.read_gap.0.as_deref();
        pump_fault(self.pump_faults, self.fault_bits, pump, gaps)
    }

    /// As past a read-back that read the safety settings held: a
    /// controller that has run a while.
    #[cfg(test)]
    pub(super) fn seen_held(mut self) -> Self {
        self.start.over = true;
        self
    }

    /// The last read's error, while the CDU does not answer.
    pub(super) fn cdu_error(&self) -> Option<&String> {
        self.cdu_error.0.as_ref()
    }

    /// Reads the CDU.
    pub(super) async fn read_cdu(&mut self, stats: &mut ShellStats) -> Option<CduMeasurements> {
        match self.cdu.read().await {
            Ok(r) => {
                if let Some(e) = self.cdu_error.worked() {
                    tracing::info!("cooling shell: the CDU answers again (was: {e})");
                }
                stats.cdu_reads += 1;
                self.judge_gaps(stats);
                self.last_read = Some(now_ms());
                self.pump_faults = Some(r.pump_faults);
                Some(r)
            }
            Err(e) => {
                stats.cdu_read_errors += 1;
                self.pump_faults = None;
                self.cdu_failed(&e);
                None
            }
        }
    }

    /// Writes `plan` to the CDU in its order, each setting on its own
    /// (one that is not due after an earlier failure is skipped). After a
    /// write the CDU did not answer (no answer in time, or the link
    /// failed), the rest are not tried this step: each would wait out its
    /// own timeout, and a step of such waits outlasts its period. Every
    /// write is tried after a read the CDU did not answer: a leak's valve
    /// close goes out on the step that latches it. After the writes (unless
    /// one went unanswered), what went in is read back, one request per
    /// run of registers ([`CduPort::read_back`]): a setting the CDU does
    /// not hold counts as not taken, and a safety setting so holds the
    /// heartbeat back (not written) from the next step until a read-back
    /// reads it held: the heartbeat held back is recorded as not written
    /// (so the core reads the CDU as not taking its writes: degraded) and
    /// said in `stats` for the step it was held back
    /// ([`ShellStats::heartbeat_held`]). After the start the heartbeat is
    /// so held back too until a step's read-back proves the safety
    /// settings held or the bound has passed since the start, `now_ms`
    /// being the step's time ([`Devices::start`]; the valves and pumps
    /// are written at the first step as ever). The outcome says whether
    /// the heartbeat went out ([`Outcome::heartbeat_sent`]): one withheld
    /// or not tried is not counted. A setting whose
    /// last write did not go in stays not taken over a step whose
    /// read-back of it fails ([`Devices::not_taken`]). The first failure
    /// is counted, and logged whole once per change of its text.
    pub(super) async fn write(
        &mut self,
        plan: &Plan,
        now_ms: u64,
        stats: &mut ShellStats,
    ) -> Outcome {
        if self.start.tick(now_ms) {
            self.say_wait_over();
        }
        let mut outcome = Outcome::default();
        let mut first: Option<String> = None;
        let mut held = None;
        let mut beat_held = None;
        for w in &plan.writes {
            if self.heartbeat_held(w) {
                self.start.say();
                beat_held = Some(self.held_why());
                if outcome.due(w) {
                    outcome.record(w.setting, Err(self.held_back()));
                    outcome.heartbeat_held = true;
                }
                continue;
            }
            if !outcome.due(w) {
                continue;
            }
            // Sent, whatever its answer: the next heartbeat is one past it
            // (one unanswered may have gone in; one refused, perhaps for
            // its value, is not sent again).
            outcome.heartbeat_sent |= w.setting == Setting::Heartbeat && held.is_none();
            let r = self.write_one(w, &mut held).await;
            if let Err(e) = &r {
                first.get_or_insert_with(|| format!("{}: {e}", w.setting.register()));
            }
            outcome.record(w.setting, r);
        }
        let proof = match &held {
            None => self.read_back(plan, &mut outcome, &mut first, stats).await,
            Some(why) => self.not_read_back(why, &mut outcome, &mut first),
        };
        self.start.judge(proof);
        self.judge_taken(&outcome);
        self.judge_writes(first, stats);
        // A read-back failing (refused) since is said with it.
        stats.heartbeat_held = beat_held.map(|why| match &self.read_back_error.0 {
            Some(e) => format!("{why}; not read back since: {e}"),
            None => why,
        });
        // What the mode's next reason reads: the heartbeat held back this
        // step (its write failed) or from the next step on, known now, so
        // the mode names it from the step that found it to the step that
        // read it held again, never the refused writes.
        outcome.heartbeat_held |= self.beat_withheld();
        outcome
    }

    /// Why the heartbeat is not written this step (while
    /// [`Devices::heartbeat_held`]).
    fn held_back(&self) -> String {
        if self.unheld_safety().next().is_none() {
            return format!("not written: {}", self.start.held_why());
        }
        let why = self.safety_not_held.0.as_deref().unwrap_or_default();
        format!(
            "not written: the CDU does not hold a safety setting it echoed ({why}), so it \
             falls back to its own control"
        )
    }

    /// Why the heartbeat is held back, for `ctl status` and the stats
    /// ([`ShellStats::heartbeat_held`]): the settings found not held, or
    /// none read back held since the start.
    fn held_why(&self) -> String {
        match self.safety_not_held.0.as_deref() {
            Some(why) if self.unheld_safety().next().is_some() => {
                format!("the CDU does not hold a safety setting it echoed ({why})")
            }
            _ => self.start.held_why(),
        }
    }

    /// Keeps [`Devices::not_taken`] after a step's `outcome`: a setting
    /// that failed joins it; the heartbeat that went in leaves it (it
    /// needs no read-back). The others leave it with their read-back
    /// ([`Devices::judge_held`]).
    fn judge_taken(&mut self, outcome: &Outcome) {
        for (s, r) in &outcome.tried {
            if r.is_err() {
                if self.not_taken(*s).is_none() {
                    self.not_taken.push(NotTaken {
                        setting: *s,
                        not_held: None,
                    });
                }
            } else if *s == Setting::Heartbeat {
                self.not_taken.retain(|t| t.setting != *s);
            }
        }
    }

    /// The setting `s` as not taken, if it is.
    fn not_taken(&self, s: Setting) -> Option<&NotTaken> {
        self.not_taken.iter().find(|t| t.setting == s)
    }

    /// The step's read-back of the writes that went in
    /// ([`CduPort::read_back`]): a setting the CDU does not hold is
    /// recorded as not taken. A read-back that failed leaves its settings
    /// as their echo said (taken): it is counted as a read error and
    /// logged once per change of its text ([`Devices::judge_read_back`]);
    /// one not taken before is judged by [`Devices::judge_unread`].
    /// Whether it proves the plan's safety settings held
    /// ([`start::proof`]).
    async fn read_back(
        &mut self,
        plan: &Plan,
        outcome: &mut Outcome,
        first: &mut Option<String>,
        stats: &mut ShellStats,
    ) -> Result<(), String> {
        let went_in = |w: &&Write| {
            outcome
                .tried
                .iter()
                .any(|(s, r)| *s == w.setting && r.is_ok())
        };
        let went_in: Vec<Write> = plan.writes.iter().filter(went_in).copied().collect();
        if went_in.is_empty() {
            return start::proof(plan, &went_in, &crate::modbus::ReadBack::default());
        }
        let back = self.cdu.read_back(&went_in).await;
        let proof = start::proof(plan, &went_in, &back);
        self.judge_read_back(&back.unread, stats);
        for (settings, e) in &back.unread {
            for s in settings {
                self.judge_unread(*s, !not_served(e), e, outcome, first);
            }
        }
        self.judge_held(&went_in, &back);
        for (settings, e) in back.not_held {
            let why = e.to_string();
            for s in settings {
                first.get_or_insert_with(|| format!("{}: {why}", s.register()));
                if let Some(tried) = outcome.tried.iter_mut().find(|(t, _)| *t == s) {
                    tried.1 = Err(crate::decide::said::words(&why));
                }
            }
        }
        proof
    }

    /// The step's writes that went in, not read back since a later write
    /// went unanswered (`why`): each judged as a read-back that failed
    /// ([`Devices::judge_unread`]), the heartbeat aside (never read back).
    /// Never proves the safety settings held: not asked, said why.
    fn not_read_back(
        &self,
        why: &str,
        outcome: &mut Outcome,
        first: &mut Option<String>,
    ) -> Result<(), String> {
        let went_in: Vec<Setting> = (outcome.tried.iter())
            .filter(|(s, r)| r.is_ok() && *s != Setting::Heartbeat)
            .map(|(s, _)| *s)
            .collect();
        for s in went_in {
            self.judge_unread(s, true, &why, outcome, first);
        }
        Err(start::not_asked(why))
    }

    /// The setting `s`, not taken before, whose read-back failed (`e`;
    /// `served`: not a CDU refusing to serve the read-back at all).
    /// One last read back holding another value stays not taken, for the
    /// decision path too, over any read-back that fails, one the CDU
    /// refuses (exception 1 or 2) included, and is said so: its echo says
    /// nothing the read-back did not refute (a pump handover the CDU
    /// echoed but never ran is not judged a trip). Any other is taken on
    /// its echo (what the decision path acts on) but not known taken
    /// ([`Outcome::unsure`]), unless the CDU serves no read-back at all.
    /// The heartbeat is never read back (its echo is checked).
    fn judge_unread(
        &self,
        s: Setting,
        served: bool,
        e: &dyn std::fmt::Display,
        outcome: &mut Outcome,
        first: &mut Option<String>,
    ) {
        let Some(t) = self.not_taken(s) else {
            return;
        };
        let (why, refuted) = match (t.not_held.as_deref(), served) {
            (Some(held), true) => (
                format!("last read back not held ({held}); not read back since: {e}"),
                true,
            ),
            (Some(held), false) => (
                format!("last read back not held ({held}); the CDU refuses the read-back: {e}"),
                true,
            ),
            (None, false) => return,
            (None, true) => (
                format!("not read back since its write did not go in: {e}"),
                false,
            ),
        };
        first.get_or_insert_with(|| format!("{}: {why}", s.register()));
        let said = crate::decide::said::words(&why);
        match outcome.tried.iter_mut().find(|(t, _)| *t == s) {
            Some(tried) if refuted => tried.1 = Err(said),
            _ => {
                let _ = outcome.unsure.push((s, said));
            }
        }
    }

    /// Writes `w`, unless the writes are `held` (why); a write the CDU
    /// does not answer holds the rest.
    async fn write_one(&mut self, w: &Write, held: &mut Option<String>) -> Result<(), String> {
        if let Some(why) = held {
            return Err(why.clone());
        }
        let r = self.cdu.write_setting(w).await;
        if r.as_ref().is_err_and(|e| e.is_unanswered()) {
            let register = w.setting.register();
            *held = Some(format!(
                "not tried: the CDU did not answer the {register} write"
            ));
        }
        r.map_err(|e| e.to_string())
    }

    /// A step's writes ended with `first` as their first failure: counted
    /// and logged whole when news; the end of the failures said once every
    /// setting is taken again ([`Devices::not_taken`]: went in and read
    /// back held, the heartbeat written again).
    fn judge_writes(&mut self, first: Option<String>, stats: &mut ShellStats) {
        match first {
            None if !self.not_taken.is_empty() => {}
            None => {
                if let Some(e) = self.write_error.worked() {
                    tracing::info!("cooling shell: the CDU takes its settings again (was: {e})");
                }
            }
            Some(msg) => {
                stats.cdu_write_errors += 1;
                if self.write_error.failed(msg.clone()) {
                    tracing::error!("cooling shell: writing the CDU's settings: {msg}");
                }
            }
        }
    }

    /// The wait after the start over without proof: the heartbeat is
    /// written on the writes' echo from this step, said so, unless a
    /// read-back found a safety setting not held, which still withholds
    /// it: then that is said (once).
    fn say_wait_over(&mut self) {
        let unheld = (self.unheld_safety().next()).map(|(s, why)| (s, why.to_string()));
        match unheld {
            None => self.start.say_echo(),
            Some((s, why)) => tracing::warn!(
                "cooling shell: the wait after the start is over; heartbeat still withheld: {} \
                 not held ({why})",
                s.register()
            ),
        }
    }

    /// Whether `w` is the heartbeat and it is withheld
    /// ([`Devices::beat_withheld`]): then it is not written this step.
    fn heartbeat_held(&self, w: &Write) -> bool {
        w.setting == Setting::Heartbeat && self.beat_withheld()
    }

    /// Whether the heartbeat is withheld: a read-back found a safety
    /// setting not held that none has read held since, or the wait after
    /// the start is on ([`Devices::start`]).
    fn beat_withheld(&self) -> bool {
        !self.start.over || self.unheld_safety().next().is_some()
    }

    /// The safety settings read back not held and not read back held
    /// since, each with why.
    fn unheld_safety(&self) -> impl Iterator<Item = (Setting, &str)> {
        (self.not_taken.iter())
            .filter(|t| t.setting.safety())
            .filter_map(|t| t.not_held.as_deref().map(|why| (t.setting, why)))
    }

    /// The read-back `back` of the step's writes that went in
    /// (`went_in`) kept in [`Devices::not_taken`]: a setting read back
    /// held leaves it, and one whose read-back the CDU does not serve at
    /// all (exception 1 or 2) unless it was read back not held; one found
    /// holding another value is not taken, not held. A safety setting so
    /// holds the heartbeat back until a read-back reads it held (one not
    /// read back, its read-back failed or its write not gone in, stays as
    /// it was); said once per change of why; its end said.
    fn judge_held(&mut self, went_in: &[Write], back: &crate::modbus::ReadBack) {
        let listed = |failures: &[(Vec<Setting>, CduError)], s: Setting| {
            failures.iter().any(|(set, _)| set.contains(&s))
        };
        let not_served =
            |s: Setting| (back.unread.iter()).any(|(set, e)| set.contains(&s) && not_served(e));
        self.not_taken.retain(|t| {
            let s = t.setting;
            let went = went_in.iter().any(|w| w.setting == s);
            let read_held = went && !listed(&back.unread, s) && !listed(&back.not_held, s);
            // Leaves: read held, or not served and never read not held.
            let echo_enough = went && not_served(s) && t.not_held.is_none();
            !(read_held || echo_enough)
        });
        for (settings, e) in &back.not_held {
            for s in settings {
                self.not_taken.retain(|t| t.setting != *s);
                self.not_taken.push(NotTaken {
                    setting: *s,
                    not_held: Some(e.to_string()),
                });
            }
        }
        if self.unheld_safety().next().is_none() {
            if let Some(e) = self.safety_not_held.worked() {
                tracing::info!(
                    "cooling shell: the CDU holds its safety settings again (read back): the \
                     heartbeat is written again (was: {e})"
                );
            }
            return;
        }
        let said: Vec<String> = self
            .unheld_safety()
            .map(|(s, e)| format!("{}: {e}", s.register()))
            .collect();
        let why = said.join("; ");
        if self.safety_not_held.failed(why.clone()) {
            tracing::error!(
                "cooling shell: the CDU does not hold a safety setting it echoed ({why}): the \
                 heartbeat is not written until it does, so the CDU falls back to its own control"
            );
        }
    }

    /// The read-backs of the step that failed (`unread`): counted as a
    /// read error and logged once per change of their text, naming the
    /// settings taken on their echo; their end said.
    fn judge_read_back(&mut self, unread: &[(Vec<Setting>, CduError)], stats: &mut ShellStats) {
        if unread.is_empty() {
            if let Some(e) = self.read_back_error.worked() {
                tracing::info!("cooling shell: the CDU's settings read back again (was: {e})");
            }
            return;
        }
        stats.cdu_read_errors += 1;
        let msg: Vec<String> = unread.iter().map(|(_, e)| e.to_string()).collect();
        let msg = msg.join("; ");
        if self.read_back_error.failed(msg.clone()) {
            let unheld = |s: &Setting| self.not_taken(*s).is_some_and(|t| t.not_held.is_some());
            let settings = unread.iter().flat_map(|(s, _)| s.iter());
            let (unheld, echoed): (Vec<&Setting>, Vec<&Setting>) =
                settings.partition(|s| unheld(s));
            let names = |s: Vec<&Setting>| {
                let names: Vec<&str> = s.iter().map(|s| s.register()).collect();
                names.join(", ")
            };
            let refused = unread.iter().any(|(_, e)| not_served(e));
            let mut fates = Vec::new();
            if !echoed.is_empty() {
                fates.push(format!(
                    "{} taken as their write's echo said; whether the CDU holds them is not \
                     known",
                    names(echoed)
                ));
            }
            if !unheld.is_empty() {
                fates.push(format!(
                    "{} last read back not held: not taken (a safety one holds the heartbeat \
                     back) until a read-back reads it held",
                    names(unheld)
                ));
            }
            let what = if refused { "refused" } else { "failed" };
            tracing::warn!(
                "cooling shell: reading back the CDU's settings ({what}): {msg}: {}",
                fates.join("; ")
            );
        }
    }

    /// A read that answered in part: its failed requests (the CDU's
    /// [`CduPort::read_gaps`]) counted as a read error and logged once per
    /// change of their text; their end said.
    fn judge_gaps(&mut self, stats: &mut ShellStats) {
        let gaps = self.cdu.read_gaps();
        if gaps.is_empty() {
            if let Some(e) = self.read_gap.worked() {
                tracing::info!(
                    "cooling shell: the CDU answers every read request again (was: {e})"
                );
            }
            return;
        }
        stats.cdu_read_errors += 1;
        let msg: Vec<String> = gaps.iter().map(ToString::to_string).collect();
        let msg = msg.join("; ");
        if self.read_gap.failed(msg.clone()) {
            tracing::error!(
                "cooling shell: reading the CDU (in part): {msg}: its registers (and those \
                 of any request not tried after it) read no value this step; the rest was read"
            );
        }
    }

    fn cdu_failed(&mut self, e: &CduError) {
        let msg = e.to_string();
        if self.cdu_error.failed(msg.clone()) {
            let what = if e.refused_code().is_some() {
                "refused"
            } else if e.is_no_answer() {
                "no answer"
            } else {
                "failed"
            };
            tracing::error!("cooling shell: reading the CDU ({what}): {msg}");
        }
    }
}

/// The board's pins: the same whatever the CDU's link.
impl<P> Devices<P> {
    /// Board pins are configured: the ropes are read.
    pub(super) fn has_board(&self) -> bool {
        self.board.is_some()
    }

    /// The racks with a rope on the board, bit n = rack n (`None`: no
    /// board pins).
    pub(super) fn roped(&self) -> Option<u16> {
        self.board.as_ref().map(|b| b.roped())
    }

    /// The board's leak lines this step.
    pub(super) fn read_board(&mut self, stats: &mut ShellStats) -> BoardRead {
        let Some(board) = self.board.as_mut() else {
            return BoardRead::Absent;
        };
        let read = board.ropes();
        let judged = read.as_ref().map(|_| ()).map_err(Clone::clone);
        let what = "board pins: the leak lines";
        self.board_errors
            .ropes
            .judge(what, judged, &mut stats.board_errors);
        match read {
            Ok(ropes) => BoardRead::Read {
                wet: ropes.wet,
                faults: ropes.faults,
            },
            Err(_) => BoardRead::Failed,
        }
    }

    /// One pulse of the healthy relay (once per completed step), and the
    /// beacon as the step left it: each driven whatever the other did.
    pub(super) fn pulse(&mut self, beacon: bool, stats: &mut ShellStats) {
        let Some(b) = self.board.as_mut() else {
            return;
        };
        let errors = &mut stats.board_errors;
        let relay = b.pulse_healthy();
        let lit = b.beacon(beacon);
        let e = &mut self.board_errors;
        e.relay
            .judge("board pins: the healthy relay", relay, errors);
        e.beacon.judge("board pins: the beacon", lit, errors);
    }
}

mod start;

#[cfg(test)]
mod after_a_start;
#[cfg(test)]
mod beat_count;
#[cfg(test)]
mod fallback;
#[cfg(test)]
mod fault_unread;
#[cfg(test)]
mod held_reason;
#[cfg(test)]
mod never_read_back;
#[cfg(test)]
mod refused_read_back;
#[cfg(test)]
mod scripted;

#[cfg(test)]
mod tests {
    use super::scripted::{
        beat, every_setting, not_held, refused, run, valves_not_held, Script, Scripted,
    };
    use super::*;
    use crate::modbus::CduError;

    /// A clear reads the fault bit where there is one, refuses while the
    /// CDU is unread, and says so where the map has no bit.
    #[test]
    fn a_pump_clear_without_a_fault_bit_says_it_went_on_the_operators_word() {
        let a_only = [true, false];
        let not_read = Err(super::super::NOT_READ.to_string());
        assert_eq!(pump_fault(None, a_only, 0, None), not_read);
        assert_eq!(pump_fault(None, a_only, 1, None), not_read);
        let read = Some([Some(true), None]);
        assert_eq!(pump_fault(read, a_only, 0, None), Ok(Some(true)));
        assert_eq!(pump_fault(read, a_only, 1, None), Ok(None));
        assert_eq!(pump_cleared("A", Some(false)), "pump A back in service");
        let word = pump_cleared("B", None);
        assert!(
            word.contains("on your word") && word.contains("no fault bit"),
            "{word}"
        );
    }

    /// A CDU whose map has the fault bits `mapped` and whose reads give
    /// them as `shown`.
    struct Faults {
        mapped: [bool; 2],
        shown: [Option<bool>; 2],
    }

    /// The request of inputs 10-20 (where the fault flags are) refused.
    static FLAGS_REFUSED: std::sync::LazyLock<[CduError; 1]> = std::sync::LazyLock::new(|| {
        [CduError::Refused {
            op: "read input 10-20 (it_power to outdoor_temp)".into(),
            code: 2,
            meaning: crate::modbus::exception_meaning(2),
        }]
    });

    impl Script for Faults {
        fn read(&mut self) -> Result<CduMeasurements, CduError> {
            Ok(CduMeasurements {
                pump_faults: self.shown,
                ..CduMeasurements::default()
            })
        }
        /// A mapped flag reads no value only where its request failed.
        fn read_gaps(&self) -> &[CduError] {
            let unread = (0..2).any(|p| self.mapped[p] && self.shown[p].is_none());
            if unread {
                &FLAGS_REFUSED[..]
            } else {
                &[]
            }
        }
        fn pump_fault_bits(&self) -> [bool; 2] {
            self.mapped
        }
    }

    /// A CDU whose reads answer in part: one request refused.
    struct InPart {
        gaps: Vec<CduError>,
    }

    impl Script for InPart {
        fn read(&mut self) -> Result<CduMeasurements, CduError> {
            Ok(CduMeasurements {
                leaks: Some(0b100),
                ..CduMeasurements::default()
            })
        }
        fn read_gaps(&self) -> &[CduError] {
            &self.gaps
        }
    }

    #[test]
    fn a_read_that_answered_in_part_is_kept_and_counted_as_a_read_error() {
        let refused = CduError::Refused {
            op: "read input 10-20 (it_power to outdoor_temp)".into(),
            code: 4,
            meaning: crate::modbus::exception_meaning(4),
        };
        let cdu = Scripted(InPart {
            gaps: vec![refused],
        });
        let mut d = Devices::new(cdu, None).seen_held();
        let mut stats = ShellStats::default();
        let r = run(d.read_cdu(&mut stats)).expect("the readings that answered");
        assert_eq!(r.leaks, Some(0b100));
        assert_eq!((stats.cdu_reads, stats.cdu_read_errors), (1, 1));
        assert!(d.cdu_error().is_none(), "the CDU answers");
        assert!(d
            .read_gap
            .0
            .as_ref()
            .is_some_and(|e| e.contains("exception 4")));
        // Read whole again: no error counted, the gap ended.
        d.cdu.gaps.clear();
        assert!(run(d.read_cdu(&mut stats)).is_some());
        assert_eq!((stats.cdu_reads, stats.cdu_read_errors), (2, 1));
        assert!(d.read_gap.0.is_none());
    }

    /// A CDU that echoes every write and holds 40 °C for any setpoint.
    struct Clamps;

    impl Script for Clamps {
        fn read_back(&mut self, written: &[Write]) -> ReadBack {
            let setpoint = written.iter().find(|w| w.setting == Setting::Setpoint);
            match setpoint {
                Some(w) if w.value != 40.0 => {
                    not_held(vec![Setting::Setpoint], "supply_setpoint", 0, "value 40 °C")
                }
                _ => ReadBack::default(),
            }
        }
    }

    #[test]
    fn a_setting_the_cdu_does_not_hold_after_its_echo_is_not_taken() {
        let mut d = Devices::new(Scripted(Clamps), None).seen_held();
        let mut stats = ShellStats::default();
        let o = run(d.write(&every_setting(), 0, &mut stats));
        assert_eq!(failed_with(&o, "reads back value 40"), [Setting::Setpoint]);
        let taken = o.taken();
        assert!(!taken.setpoint && taken.speed && taken.valves && taken.pumps);
        assert_eq!(stats.cdu_write_errors, 1);
        assert!(d
            .write_error
            .0
            .as_ref()
            .is_some_and(|e| e.starts_with("supply_setpoint: ")));
    }

    /// A CDU that echoes every write and refuses every read-back
    /// (function 3 on its holding registers) with exception 1.
    struct NoReadBack;

    impl Script for NoReadBack {
        fn read_back(&mut self, written: &[Write]) -> ReadBack {
            refused(written, READ_BACK, 1)
        }
    }

    /// The read-back of the scripted CDUs here, in the CDU's words.
    const READ_BACK: &str = "read back holding 0-4 (supply_setpoint to pumps_run)";

    #[test]
    fn a_read_back_that_fails_leaves_the_settings_taken_and_is_a_read_error() {
        let mut d = Devices::new(Scripted(NoReadBack), None).seen_held();
        let mut stats = ShellStats::default();
        for step in 1..=3 {
            let o = run(d.write(&every_setting(), 0, &mut stats));
            assert!(o.all_ok(), "{:?}", o.tried);
            let taken = o.taken();
            assert!(taken.setpoint && taken.speed && taken.valves && taken.pumps);
            assert_eq!((stats.cdu_write_errors, stats.cdu_read_errors), (0, step));
        }
        assert!(d
            .read_back_error
            .0
            .as_ref()
            .is_some_and(|e| e.contains("exception 1")));
    }

    /// A CDU that echoes every write and holds its valves otherwise.
    struct ValvesNotHeld;

    impl Script for ValvesNotHeld {
        fn read_back(&mut self, _: &[Write]) -> ReadBack {
            valves_not_held()
        }
    }

    #[test]
    fn a_safety_setting_not_held_holds_the_next_heartbeat_back() {
        let mut d = Devices::new(Scripted(ValvesNotHeld), None).seen_held();
        let mut stats = ShellStats::default();
        let first = run(d.write(&every_setting(), 0, &mut stats));
        assert!(
            beat(&first),
            "found after this step's heartbeat: {:?}",
            first.tried
        );
        let second = run(d.write(&every_setting(), 0, &mut stats));
        assert!(!beat(&second), "{:?}", second.tried);
        assert!(!second.taken().valves);
    }

    /// A CDU that echoes every write and whose read-backs answer in turn
    /// as `answers` says: `Some(true)` finds what `not_held` says not
    /// held, `Some(false)` every setting held, `None` fails for every
    /// setting, refused with exception `code`.
    struct InTurn {
        answers: std::collections::VecDeque<Option<bool>>,
        code: u8,
        not_held: fn(&[Write]) -> ReadBack,
    }

    impl InTurn {
        /// Whose read-backs find the valves not held (`Some(true)`) or
        /// are refused with exception `code` (`None`), in turn.
        fn valves(answers: &[Option<bool>], code: u8) -> Scripted<InTurn> {
            Scripted(InTurn {
                answers: answers.iter().copied().collect(),
                code,
                not_held: |_| valves_not_held(),
            })
        }
    }

    impl Script for InTurn {
        fn read_back(&mut self, written: &[Write]) -> ReadBack {
            match self.answers.pop_front().expect("a read-back answer") {
                Some(true) => (self.not_held)(written),
                Some(false) => ReadBack::default(),
                None => refused(written, READ_BACK, self.code),
            }
        }
    }

    /// A safety setting read back not held is one setting not taken: a
    /// CDU that then stops serving the read-back (exception 1) leaves it
    /// so, reported not taken for as long as it holds the heartbeat back,
    /// never reported taken while the heartbeat is held for it.
    #[test]
    fn a_setting_not_held_is_reported_not_taken_while_it_holds_the_heartbeat_back() {
        // Its first read-back finds the valves not held; it refuses the
        // later ones with exception 1 (no function 3 there).
        let cdu = InTurn::valves(&[Some(true), None, None, None], 1);
        let mut d = Devices::new(cdu, None).seen_held();
        let mut stats = ShellStats::default();
        let steps: Vec<(bool, bool)> = (0..4)
            .map(|_| {
                let o = run(d.write(&every_setting(), 0, &mut stats));
                let unsure = o.unsure.iter().any(|(s, _)| *s == Setting::Valves);
                let valves_failed = !o.taken().valves;
                (unsure || valves_failed, stats.heartbeat_held.is_some())
            })
            .collect();
        // Step 1 reads the valves not held (its beat went out); the next
        // ones hold the beat back and report the valves not taken.
        assert_eq!(
            steps,
            [(true, false), (true, true), (true, true), (true, true)]
        );
    }

    /// The valves found not held stay so until a read-back reads them
    /// held: a read-back that fails in between does not let the heartbeat
    /// out again.
    #[test]
    fn a_read_back_that_fails_keeps_the_heartbeat_held_back_until_one_reads_it_held() {
        let answers = [Some(true), None, Some(true), None, Some(false), None];
        let mut d = Devices::new(InTurn::valves(&answers, 6), None).seen_held();
        let mut stats = ShellStats::default();
        let beats: Vec<bool> = (0..answers.len())
            .map(|_| beat(&run(d.write(&every_setting(), 0, &mut stats))))
            .collect();
        // Found not held after step 1's beat; failed read-backs (2, 4)
        // and a not held (3) keep it back; read held at step 5, it beats
        // at step 6.
        assert_eq!(beats, [true, false, false, false, false, true]);
    }

    /// While the heartbeat is held back it is said (the stats, for the
    /// console and `/metrics`) and is a write not taken, so the core's
    /// mode reads degraded (the CDU not taking its writes) until the
    /// heartbeat goes out again.
    #[test]
    fn a_heartbeat_held_back_is_said_and_keeps_the_writes_not_all_taken() {
        let answers = [Some(true), Some(true), Some(false), Some(false)];
        let mut d = Devices::new(InTurn::valves(&answers, 6), None).seen_held();
        let mut stats = ShellStats::default();
        let mut all = Vec::new();
        let mut held = Vec::new();
        for step in 1..=answers.len() {
            let o = run(d.write(&every_setting(), 0, &mut stats));
            let not_written = failed_with(&o, "not written");
            assert_eq!(not_written.is_empty(), step != 2 && step != 3, "{step}");
            all.push(o.taken().all);
            held.push(stats.heartbeat_held.clone());
        }
        // Step 1 finds the valves not held after its beat; steps 2 and 3
        // hold the beat back (3 reads them held); step 4 beats. The
        // stats say so on the steps whose beat was held back.
        assert_eq!(all, [false, false, false, true]);
        let said = held[1].as_deref().unwrap_or_default();
        assert!(
            said.starts_with("the CDU does not hold a safety setting it echoed (valves_open: ")
                && said.contains("reads back value 0"),
            "{said}"
        );
        assert_eq!(held[2], held[1]);
        assert_eq!([&held[0], &held[3]], [&None, &None], "their beats went out");
    }

    /// A setting read back holding another value stays not taken over a
    /// step whose read-back fails (exception 6, busy): its echo alone
    /// does not say the CDU takes it again, and the write failure stays
    /// in force. Read back held, all is taken and the failure's end said.
    #[test]
    fn a_read_back_that_fails_after_a_failed_write_leaves_the_writes_not_all_taken() {
        let steps = |code: u8| {
            let answers = [Some(true), None, Some(false)];
            let cdu = InTurn {
                answers: answers.into_iter().collect(),
                code,
                not_held: |written| Clamps.read_back(written),
            };
            let mut d = Devices::new(Scripted(cdu), None).seen_held();
            let mut stats = ShellStats::default();
            (0..answers.len())
                .map(|_| {
                    let o = run(d.write(&every_setting(), 0, &mut stats));
                    let failure = d.write_error.0.clone();
                    (
                        o.taken().setpoint,
                        o.taken().all,
                        failure,
                        stats.cdu_write_errors,
                    )
                })
                .collect::<Vec<_>>()
        };
        let busy = steps(6);
        assert_eq!(
            busy.iter().map(|s| (s.0, s.1, s.3)).collect::<Vec<_>>(),
            [(false, false, 1), (false, false, 2), (true, true, 2)]
        );
        let said = busy[1].2.as_deref().unwrap_or_default();
        assert!(
            said.starts_with("supply_setpoint: last read back not held")
                && said.contains("exception 6"),
            "{said}"
        );
        assert!(busy[2].2.is_none(), "read back held: its end said");
        // A CDU that stops serving the read-back (exception 1) says
        // nothing new of a setting it was read holding another value of:
        // still not taken (not on its echo either), until read held, and
        // the refusal said.
        let not_served = steps(1);
        assert_eq!(
            not_served.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            [(false, false), (false, false), (true, true)]
        );
        let said = not_served[1].2.as_deref().unwrap_or_default();
        assert!(
            said.contains("last read back not held")
                && said.contains("refuses the read-back")
                && said.contains("exception 1"),
            "{said}"
        );
    }

    #[test]
    fn a_fault_bit_the_map_has_that_was_not_read_refuses_the_clear_naming_the_read() {
        // Pump A's bit is mapped, but the request that holds it failed
        // while the others answered (a fault flag, a bit word, reads no
        // value only so); pump B has none in the map.
        let cdu = Scripted(Faults {
            mapped: [true, false],
            shown: [None, None],
        });
        let mut d = Devices::new(cdu, None).seen_held();
        assert_eq!(d.pump_fault(0), Err(super::super::NOT_READ.to_string()));
        let mut stats = ShellStats::default();
        assert!(run(d.read_cdu(&mut stats)).is_some());
        let why = d.pump_fault(0).unwrap_err();
        assert!(
            why.starts_with("not cleared")
                && why.contains("pump_a_fault was not read this step")
                && why.contains("read input 10-20 (it_power to outdoor_temp)")
                && why.contains("exception 2")
                && why.contains("unknown")
                && !why.contains("not available"),
            "{why}"
        );
        assert_eq!(d.pump_fault(1), Ok(None), "on the operator's word");
        // Read again with a value: the bit is what the clear goes by.
        d.cdu.shown = [Some(false), None];
        assert!(run(d.read_cdu(&mut stats)).is_some());
        assert_eq!(d.pump_fault(0), Ok(Some(false)));
    }
    use crate::decide::said::Words;
    use crate::decide::{Setting, Write};
    use crate::modbus::ReadBack;
    use crate::shell::links::Ropes;

    /// A board whose relay line fails and whose beacon lights.
    #[derive(Default)]
    struct RelayBroken {
        beacon: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl BoardIo for RelayBroken {
        fn ropes(&mut self) -> Result<Ropes, String> {
            Err("/dev/gpiochip0 line 4: read failed".into())
        }
        fn roped(&self) -> u16 {
            0b1
        }
        fn pulse_healthy(&mut self) -> Result<(), String> {
            Err("/dev/gpiochip0 line 7: write failed".into())
        }
        fn beacon(&mut self, on: bool) -> Result<(), String> {
            self.beacon.store(on, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// A CDU that answers no write, or whose gateway answers that it
    /// cannot reach it (`gateway`: the exception code): each would cost
    /// its timeout.
    #[derive(Default)]
    struct Silent {
        writes: usize,
        gateway: Option<u8>,
    }

    impl Script for Silent {
        fn write(&mut self, w: &Write) -> Result<(), CduError> {
            self.writes += 1;
            let op = format!("write {}", w.setting.register());
            Err(match self.gateway {
                None => CduError::NoAnswer { op, after_ms: 500 },
                Some(code) => CduError::Refused {
                    op,
                    code,
                    meaning: crate::modbus::exception_meaning(code),
                },
            })
        }
    }

    #[test]
    fn after_a_write_the_cdu_does_not_answer_the_rest_are_not_tried_this_step() {
        for gateway in [None, Some(10), Some(11)] {
            the_rest_are_not_tried_after(Scripted(Silent {
                gateway,
                ..Silent::default()
            }));
        }
    }

    fn the_rest_are_not_tried_after(cdu: Scripted<Silent>) {
        let mut d = Devices::new(cdu, None).seen_held();
        let mut stats = ShellStats::default();
        let o = run(d.write(&every_setting(), 0, &mut stats));
        assert_eq!(
            d.cdu.writes, 1,
            "only the first write waited for its answer"
        );
        assert_eq!(stats.cdu_write_errors, 1);
        let not_tried: Vec<Setting> = o
            .tried
            .iter()
            .filter(|(_, r)| r.as_ref().is_err_and(|w| w.contains("not tried")))
            .map(|(s, _)| *s)
            .collect();
        // The heartbeat is not due after a safety write failed.
        let want = [
            Setting::PumpsRun,
            Setting::LeadPump,
            Setting::PumpSpeed,
            Setting::Setpoint,
        ];
        assert_eq!(not_tried, want, "{:?}", o.tried);
    }

    /// A CDU that answers its reads and refuses the setpoint with
    /// exception 3 in `op`'s words.
    struct RefusesSetpoint {
        op: String,
    }

    impl Script for RefusesSetpoint {
        fn write(&mut self, w: &Write) -> Result<(), CduError> {
            if w.setting != Setting::Setpoint {
                return Ok(());
            }
            Err(CduError::Refused {
                op: self.op.clone(),
                code: 3,
                meaning: crate::modbus::exception_meaning(3),
            })
        }
    }

    /// The settings of `o` that failed with words containing `why`.
    fn failed_with(o: &Outcome, why: &str) -> Vec<Setting> {
        let failed = |r: &Result<(), _>| r.as_ref().is_err_and(|w: &Words| w.contains(why));
        o.tried
            .iter()
            .filter(|(_, r)| failed(r))
            .map(|(s, _)| *s)
            .collect()
    }

    #[test]
    fn a_refused_write_is_logged_and_kept_whole() {
        let cdu = Scripted(RefusesSetpoint {
            op: "write supply_setpoint at holding 0 of unit 1 on Modbus TCP 10.0.3.20:502, \
                 value 50 °C (raw 0x1388)"
                .into(),
        });
        let mut d = Devices::new(cdu, None).seen_held();
        let mut stats = ShellStats::default();
        let o = run(d.write(&every_setting(), 0, &mut stats));
        assert_eq!(failed_with(&o, "write"), [Setting::Setpoint]);
        let kept = d.write_error.0.as_deref().unwrap_or_default();
        assert!(kept.len() > crate::decide::said::WORDS, "{kept}");
        assert!(
            kept.starts_with("supply_setpoint: write supply_setpoint at holding 0")
                && kept.ends_with("the CDU refused it with exception 3 (illegal data value)"),
            "{kept}"
        );
        assert_eq!(stats.cdu_write_errors, 1);
    }

    #[test]
    fn a_failed_relay_line_leaves_the_beacon_driven_and_each_failure_is_counted() {
        let board = RelayBroken::default();
        let lit = board.beacon.clone();
        let mut d = Devices {
            cdu: (),
            board: Some(Box::new(board)),
            cdu_error: Failing::default(),
            read_gap: Failing::default(),
            write_error: Failing::default(),
            read_back_error: Failing::default(),
            safety_not_held: Failing::default(),
            start: start::StartWait::new(start::DEFAULT_BOUND_MS),
            not_taken: Vec::new(),
            board_errors: BoardErrors::default(),
            last_read: None,
            pump_faults: None,
            fault_bits: [false; 2],
        };
        let mut stats = ShellStats::default();
        d.pulse(true, &mut stats);
        assert!(
            lit.load(std::sync::atomic::Ordering::Relaxed),
            "beacon dark"
        );
        assert_eq!(stats.board_errors, 1, "the relay's failure");
        assert_eq!(d.read_board(&mut stats), BoardRead::Failed);
        assert_eq!(stats.board_errors, 2);
        assert!(d.board_errors.relay.0.is_some() && d.board_errors.ropes.0.is_some());
        assert!(d.board_errors.beacon.0.is_none());
    }

    #[test]
    fn a_failure_is_said_once_per_message_and_its_end_said() {
        let mut f = Failing::default();
        let mut n = 0;
        f.judge("x", Err("a".into()), &mut n);
        f.judge("x", Err("a".into()), &mut n);
        assert_eq!((n, f.0.as_deref()), (2, Some("a")));
        f.judge("x", Ok(()), &mut n);
        assert_eq!((n, f.0.as_deref()), (2, None));
    }
}

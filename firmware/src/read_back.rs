//! The read-back of a step's safety writes, as the Linux controller reads
//! back its settings (`cooling_ctrl::modbus`'s `read_back`): a write's
//! echo does not show what the CDU holds (function 6 echoes the request
//! itself, whatever the CDU kept), so a CDU that ignores a valve close or
//! a pump's run flag without an exception would be fed a heartbeat that
//! says all is well while it runs what it ran before. After the step's
//! writes ([`write_step`]), the safety settings that went in
//! ([`Setting::safety`]: the valve word, the pumps to run, the lead pump;
//! the only ones read back, for the step's time) are read back (function
//! 3), one request per run of contiguous holding registers (one for the
//! shipped map). A setting that reads back another value than written is
//! not taken (its write's answer in the [`Outcome`] becomes the failure),
//! and the heartbeat is withheld from the next step on
//! ([`crate::writes::WriteFailure::NotHeld`]), through the path that withholds it after
//! a safety write that failed, until a read-back reads every such setting
//! held: the CDU then falls back to its own control within its watchdog
//! time. One not read back since (its write refused or not planned, its
//! read-back failed) stays not held. What was found not held goes with a
//! restart, so after the start the heartbeat is withheld until a step's
//! read-back reads every safety setting of its plan held, each gone in
//! (or the map has none of them), for at most [`START_BOUND_MS`] (the
//! CDU's heartbeat timeout the figures built in give, else 10 s) from
//! the first step: a board in a reset loop faster than that never feeds
//! a CDU that does not hold them. A
//! read-back refused (any exception), unanswered or not asked proves
//! nothing: past the bound the writes' echo is taken and the heartbeat
//! written, said once on the console, unless a read-back found a setting
//! not held. The first step's valves and pumps go out as ever; only the
//! heartbeat waits, a step at least ([`SafetyHeld::beat_withheld`]).
//!
//! The read-back comes after the heartbeat and the writes after it, so it
//! never takes their time; a run is asked only while the step has time
//! for a transaction ([`crate::budget`]), and its waits end at the step's
//! end. A run that fails (no answer, refused, a bad answer) or that the
//! step's time left unasked leaves its settings as their echo said
//! (taken), but for one last read back not held: that one stays not
//! taken (its write's answer the failure `… last read back word 0, not
//! the word 1 written; not read back since: not taken`), so a lead pump
//! the CDU was found not to run is not judged tripped on an echo, until
//! a read-back reads it held, whatever failed the read-back: a CDU that
//! answered it and then refuses it (exception 1 or 2) included. A write
//! that failed (refused, unanswered, not sent) with no read-back to say
//! otherwise is taken on a later echo: such a CDU (one that serves no
//! function 3 on its holding registers, say) would otherwise have its
//! lead pump's trip never judged. The Linux
//! controller acts on these settings alike and differs in what it
//! reports: a setting whose write failed, then taken on its echo alone,
//! it reports not taken (degraded `cdu-writes-refused`) until a
//! read-back reads it held, where the firmware reports it taken. A
//! heartbeat withheld reads `heartbeat-held` on both, from the step
//! whose read-back found a setting not held (`Outcome::heartbeat_held`,
//! docs/firmware.md section 3). After a run the
//! CDU did not answer, the later runs are not
//! asked (each would wait out its own timeout), as a read's later spans
//! are not. A read-back that fails is said on the console at each step,
//! and to the gateway's log at the first of a run and when one reads
//! back again ([`Change::Unread`], [`Change::ReadAgain`]), so a CDU
//! whose read-back never works does not have the check silently off;
//! the gateway's line says why in a few words, where, and whether a
//! setting stays not taken ([`Failing`]), whole within its 120 bytes.
//! A gateway that started again hears the settings not held and a
//! read-back failing again at the next step ([`SafetyHeld::gateway_back`]).
//!
//! Glossary:
//! - *held*: the words a setting's registers read back.
//! - *run*: contiguous holding registers read back in one request.
//! - *unsure*: a setting whose write went in but whose run was not read
//!   back (failed, refused, or not asked).
//! - *the wait*: after the start, until a read-back proves the safety
//!   settings held or [`START_BOUND_MS`] has passed (MCU clock, each
//!   step's `now_ms` through [`SafetyHeld::tick`]).

use core::fmt;

use cooling_decide::{Outcome, Plan, Setting};

use crate::cdu::holding;
use crate::map::{self, Register};
use crate::rtu::{RtuError, MAX_READ};
use crate::writes::{self, SettingPort};

/// The CDU's holding registers, read back within the step's time.
pub trait HoldingPort: SettingPort {
    /// Reads the `out.len()` holding registers from `first`'s address to
    /// `last`'s last word into `out`.
    fn read_holding(
        &mut self,
        first: &Register,
        last: &Register,
        out: &mut [u16],
    ) -> Result<(), RtuError>;
}

/// The safety settings: at most one of each in a step's writes.
const SAFETY: usize = 3;

/// A safety setting the CDU echoed but reads back holding another value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotHeld {
    /// Which.
    pub setting: Setting,
    /// Its register's first address.
    pub address: u16,
    /// The words written, the first `len`.
    pub written: [u16; 2],
    /// The words read back, the first `len`.
    pub held: [u16; 2],
    /// The register's words.
    pub len: usize,
}

/// Words as said: `word 15`, `words 1, 34464`.
struct Said<'a>(&'a [u16]);

impl fmt::Display for Said<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.len() == 1 { "word" } else { "words" })?;
        for (i, w) in self.0.iter().enumerate() {
            write!(f, "{}{w}", if i == 0 { " " } else { ", " })?;
        }
        Ok(())
    }
}

impl fmt::Display for NotHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at holding {} reads back {}, not the {} written: the CDU did not take it",
            self.setting.register(),
            self.address,
            Said(&self.held[..self.len]),
            Said(&self.written[..self.len])
        )
    }
}

/// A step's read-back that failed, as the gateway is told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failing {
    /// The step's first failure.
    pub why: Unread,
    /// The settings last read back not held that stay not taken.
    pub not_taken: u8,
}

/// Why a read-back failed in a few words: `no answer`, `exception 6`,
/// `no time`.
struct Reason<'a>(&'a Unread);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = match self.0 {
            Unread::OutOfTime { .. } => return f.write_str("no time"),
            Unread::Port(e) => e,
        };
        match e {
            RtuError::NoAnswer { cut: false, .. } => f.write_str("no answer"),
            RtuError::NoAnswer { .. } => f.write_str("no answer in time"),
            RtuError::Crc { .. } => f.write_str("bad CRC"),
            RtuError::Refused { code, .. } => write!(f, "exception {code}"),
            RtuError::BadAnswer { .. } => f.write_str("bad answer"),
            RtuError::LineBusy { .. } => f.write_str("line busy"),
            RtuError::OutOfTime { .. } => f.write_str("no time"),
            RtuError::Serial { kind, .. } => write!(f, "UART {kind:?}"),
        }
    }
}

/// What the read-back of the safety settings said since the start.
#[derive(Debug, Clone, Default)]
pub struct SafetyHeld {
    /// The safety settings found not held, none read held since: while
    /// any is, the heartbeat is withheld.
    unheld: heapless::Vec<NotHeld, SAFETY>,
    /// Read-backs that found a safety setting not held, since boot.
    pub not_held: u32,
    /// Read-back requests that failed or were not asked, since boot:
    /// their settings taken on their echo, but for those in `unheld`.
    pub unread: u32,
    /// The first failure of the last step whose read-back failed, while
    /// none has read back since.
    failing: Option<Failing>,
    /// Whether the gateway was last told the read-back fails.
    said_failing: bool,
    /// The gateway started again: the settings not held are said again
    /// at the next read-back, whether or not they changed.
    say_unheld: bool,
    /// A step's read-back has read every safety setting that went in
    /// held since the start (or the map has none of them), or
    /// [`START_BOUND_MS`] has passed since the start: until then the
    /// heartbeat is withheld, so a board in a reset loop faster than that
    /// writes none on settings it has not seen held
    /// ([`SafetyHeld::beat_withheld`]).
    read_held: bool,
    /// The wait after the start: why the last read-back proved nothing.
    waiting: Waiting,
    /// The MCU clock at the first step since the start, and now
    /// ([`SafetyHeld::tick`]), ms.
    started_ms: Option<u64>,
    now_ms: u64,
}

/// The most the heartbeat waits after a start for a read-back that
/// proves the safety settings held, ms: the CDU's heartbeat timeout in
/// the figures built in (the site figures' `[loop] heartbeat_timeout_s`,
/// carried by the figures record), else 10 s, which the build warns of
/// (generated by `build/figures.rs`). Past it with no proof either way,
/// the writes' echo is taken.
pub const START_BOUND_MS: u64 = crate::figures::built_in::START_BOUND_MS;

/// Why a step's read-back proved nothing after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// A safety setting's write did not go in: not read back.
    NotWritten(&'static str),
    /// A run failed or was not asked.
    Unread(Unread),
    /// A safety setting read back not held.
    NotHeld,
}

/// The wait after the start, for the status line: why the read-back has
/// not proved the safety settings held (`None`: none read back yet).
#[derive(Debug, Clone, Copy, Default)]
struct Waiting(Option<Why>);

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SINCE_START}: ")?;
        match self.0 {
            None => f.write_str("none read back yet"),
            Some(Why::NotWritten(r)) => write!(f, "not asked: the {r} write did not go in"),
            Some(Why::Unread(Unread::OutOfTime { .. })) => {
                f.write_str("not asked: the step's time ran out")
            }
            Some(Why::Unread(Unread::Port(RtuError::Refused { code, .. }))) => {
                write!(f, "refused: exception {code}")
            }
            Some(Why::Unread(Unread::Port(RtuError::NoAnswer { .. }))) => f.write_str("unanswered"),
            Some(Why::Unread(u)) => write!(f, "failed: {}", Reason(&u)),
            Some(Why::NotHeld) => f.write_str("read back not held"),
        }
    }
}

/// A change of whether the CDU holds its safety settings, for the
/// gateway's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Which settings are found not held changed, some still are: this
    /// one (one that came in, else the first still not held).
    NotHeld(NotHeld),
    /// Every one found not held reads back held again.
    HeldAgain,
    /// A read-back failed or was not asked, none failing before: the
    /// settings are taken on their echo, whether the CDU holds them not
    /// known, but for those last read back not held (the first failure
    /// of the run).
    Unread(Failing),
    /// A read-back that failed before reads back again.
    ReadAgain,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Whole within a line to the gateway (`SAID_MAX`, 120 bytes),
            // the heartbeat first.
            Change::NotHeld(n) => {
                write!(
                    f,
                    "heartbeat withheld, the CDU falls back: {} at holding {} reads back {}, not",
                    n.setting.register(),
                    n.address,
                    Said(&n.held[..n.len])
                )?;
                for (i, w) in n.written[..n.len].iter().enumerate() {
                    write!(f, "{}{w}", if i == 0 { " " } else { ", " })?;
                }
                Ok(())
            }
            Change::HeldAgain => f.write_str(
                "heartbeat written again: the CDU holds its safety settings again (read back)",
            ),
            // Whole within a line too at the widest fields (119 bytes):
            // the console says the failure in full.
            Change::Unread(u) => {
                write!(f, "read-back failing ({}) at holding ", Reason(&u.why))?;
                let (first, words) = u.why.span();
                let end = u32::from(first) + u32::from(words).max(1) - 1;
                match words {
                    0 | 1 => write!(f, "{first}: ")?,
                    _ => write!(f, "{first}-{end}: ")?,
                }
                match u.not_taken {
                    0 => f.write_str("safety settings taken on their echo"),
                    1 => f.write_str("echo taken, but 1 last read back not held stays not taken"),
                    n => write!(
                        f,
                        "echo taken, but {n} last read back not held stay not taken"
                    ),
                }
            }
            Change::ReadAgain => f.write_str("the CDU's safety settings read back again"),
        }
    }
}

impl SafetyHeld {
    /// Whether the heartbeat is withheld: a safety setting was read back
    /// not held, and none has read it held since.
    pub fn withholds(&self) -> bool {
        !self.unheld.is_empty()
    }

    /// As after a read-back that read the safety settings held: a
    /// controller past its first read-back.
    #[cfg(test)]
    pub fn seen_held() -> Self {
        Self {
            read_held: true,
            ..Self::default()
        }
    }

    /// Whether the heartbeat is withheld: a safety setting is not held
    /// ([`SafetyHeld::withholds`]), or none has been read back held
    /// since the start.
    pub fn beat_withheld(&self) -> bool {
        self.withholds() || !self.read_held
    }

    /// A step at `now_ms` (MCU clock): the first since the start starts
    /// the wait for a read-back ([`START_BOUND_MS`]).
    pub fn tick(&mut self, now_ms: u64) {
        self.started_ms.get_or_insert(now_ms);
        self.now_ms = now_ms;
    }

    /// The wait after the start is past its bound.
    fn past_bound(&self) -> bool {
        let since = |s: u64| self.now_ms.saturating_sub(s);
        self.started_ms.is_some_and(|s| since(s) >= START_BOUND_MS)
    }

    /// Why the heartbeat is withheld, for the console's status line: the
    /// first setting found not held, else none read back held since the
    /// start (`None`: not withheld).
    pub fn withheld_why(&self) -> Option<&dyn fmt::Display> {
        match self.unheld.first() {
            Some(n) => Some(n),
            None if !self.read_held => Some(&self.waiting),
            None => None,
        }
    }

    /// The settings found not held, none read held since.
    pub fn unheld(&self) -> &[NotHeld] {
        &self.unheld
    }

    /// The gateway started again, its log empty of what was said: the
    /// next read-back says what it finds again (a setting not held, a
    /// read-back failing), whether or not it changed.
    pub fn gateway_back(&mut self) {
        self.said_failing = false;
        self.say_unheld = true;
    }

    /// A read-back of `read` (the settings read back held or not) that
    /// found `found` not held: one read held leaves, one found not held
    /// comes in (or is renewed). The change of which are not held, if
    /// any: naming one that came in, else the first still not held.
    fn judge(&mut self, read: &[Setting], found: &[NotHeld]) -> Option<Change> {
        let was = self.withholds();
        let before: heapless::Vec<Setting, SAFETY> =
            self.unheld.iter().map(|u| u.setting).collect();
        self.unheld.retain(|u| !read.contains(&u.setting));
        for n in found {
            // At most one of each safety setting: the push cannot fail.
            let _ = self.unheld.push(*n);
        }
        if !found.is_empty() {
            self.not_held = self.not_held.wrapping_add(1);
        }
        let same = self.unheld.len() == before.len()
            && self.unheld.iter().all(|u| before.contains(&u.setting));
        let came = self.unheld.iter().find(|u| !before.contains(&u.setting));
        let again = core::mem::take(&mut self.say_unheld);
        match (was, came.or(self.unheld.first())) {
            (true, None) => Some(Change::HeldAgain),
            (_, Some(n)) if !same || again => Some(Change::NotHeld(*n)),
            _ => None,
        }
    }

    /// A step's read-back failed first with `failed`, or read every run
    /// asked (`read_any`: a run was read). Whether the read-back fails,
    /// as the gateway was last told, changed: the change, said once a
    /// run (one that meets a change of what is held is said at a later
    /// step).
    fn news(&mut self, failed: Option<Failing>, read_any: bool, said: bool) -> Option<Change> {
        if failed.is_some() {
            self.failing = failed;
        } else if read_any {
            self.failing = None;
        }
        if said || self.said_failing == self.failing.is_some() {
            return None;
        }
        self.said_failing = self.failing.is_some();
        Some(self.failing.map_or(Change::ReadAgain, Change::Unread))
    }
}

/// A safety setting that went in: its register and the words written.
#[derive(Debug, Clone, Copy)]
struct Written {
    setting: Setting,
    register: &'static Register,
    words: map::Words,
}

/// The safety settings of `plan` whose write went in, by address.
fn went_in(plan: &Plan, outcome: &Outcome) -> heapless::Vec<Written, SAFETY> {
    let ok = |s: Setting| outcome.tried.iter().any(|(t, r)| *t == s && r.is_ok());
    let mut out: heapless::Vec<Written, SAFETY> = heapless::Vec::new();
    for w in plan.writes.iter().filter(|w| w.setting.safety()) {
        let Some(register) = holding(w.setting.register()) else {
            continue;
        };
        let Ok(words) = map::encode(register, w.value) else {
            continue;
        };
        if !ok(w.setting) {
            continue;
        }
        // By address, as they come: three at most, so no sort is built
        // into the image for them.
        let at = (out.iter())
            .position(|o| o.register.address > register.address)
            .unwrap_or(out.len());
        let _ = out.insert(
            at,
            Written {
                setting: w.setting,
                register,
                words,
            },
        );
    }
    out
}

/// The next run of `rest` (by address): its settings, and their words.
fn next_run(rest: &[Written]) -> (usize, usize) {
    let mut n = 0;
    let mut words = 0usize;
    for w in rest {
        let at = usize::from(rest[0].register.address) + words;
        if usize::from(w.register.address) != at || words + w.words.len() > MAX_READ {
            break;
        }
        n += 1;
        words += w.words.len();
    }
    (n, words)
}

/// Writes `plan` through `port` ([`writes::execute`], the heartbeat
/// withheld while `held` says so), then reads back the safety settings
/// that went in: one found not held becomes its write's failure and
/// withholds the heartbeat from the next step. One not read back (its
/// run failed or not asked) is taken on its echo, but for one last read
/// back not held ([`SafetyHeld::unheld`]): that one stays not taken
/// ([`StillNotHeld`]), a CDU that refuses the read-back itself
/// (exception 1 or 2) included. Each read-back that failed is
/// said on `console`. The outcome, and the change for the gateway's log.
pub fn write_step<P: HoldingPort>(
    port: &mut P,
    plan: &Plan,
    held: &mut SafetyHeld,
    console: &mut impl fmt::Write,
) -> (Outcome, Option<Change>) {
    if !held.read_held && held.past_bound() {
        held.read_held = true;
        let _ = match held.unheld.first() {
            Some(n) => writeln!(
                console,
                "the wait after the start is over; heartbeat still withheld: {} not held",
                n.setting.register()
            ),
            None => writeln!(
                console,
                "heartbeat sent on the writes' echo: no read-back proved the safety settings \
                 held within {} of the start: {}",
                crate::figures::built_in::START_BOUND_SAID,
                held.waiting
            ),
        };
    }
    let withheld = held.beat_withheld();
    let mut outcome = writes::execute(port, plan, withheld);
    if !held.read_held && held.unheld.is_empty() {
        fail_unproven(&mut outcome);
    }
    let written = went_in(plan, &outcome);
    let mut proven = Proven::of(plan, &written);
    let mut read: heapless::Vec<Setting, SAFETY> = heapless::Vec::new();
    let mut found: heapless::Vec<NotHeld, SAFETY> = heapless::Vec::new();
    let mut unsure: heapless::Vec<Setting, SAFETY> = heapless::Vec::new();
    let mut failed = None;
    let mut rest = &written[..];
    while !rest.is_empty() {
        let (n, words) = next_run(rest);
        let (run, after) = rest.split_at(n);
        rest = after;
        let why = match read_run(port, run, words) {
            Ok(held) => {
                judge_run(run, &held[..words], &mut read, &mut found);
                continue;
            }
            Err(why) => why,
        };
        proven.failed(&why);
        let mut unread = |run: &[Written]| {
            if run.is_empty() {
                return;
            }
            held.unread = held.unread.wrapping_add(1);
            unsure.extend(run.iter().map(|w| w.setting));
        };
        // After a run the CDU did not answer, the later ones are not asked.
        let stops = !matches!(why, Unread::Port(RtuError::Refused { .. }));
        unread(run);
        if stops {
            unread(rest);
        }
        failed.get_or_insert(why);
        let taken = |run| Taken { run, held };
        let _ = writeln!(console, "{why}: {}", taken(run));
        if stops {
            if !rest.is_empty() {
                let _ = writeln!(
                    console,
                    "read back {}: not asked after it: {}",
                    Names(rest),
                    taken(rest)
                );
            }
            break;
        }
    }
    for n in &found {
        fail(&mut outcome, n.setting, &n);
    }
    for n in held.unheld.iter().filter(|u| unsure.contains(&u.setting)) {
        fail(&mut outcome, n.setting, &StillNotHeld(n));
    }
    let not_taken = (held.unheld.iter())
        .filter(|u| unsure.contains(&u.setting))
        .count();
    let failed = failed.map(|why| Failing {
        why,
        not_taken: not_taken as u8,
    });
    let change = held.judge(&read, &found);
    if !held.read_held {
        match proven.why {
            None if found.is_empty() => held.read_held = true,
            why => held.waiting.0 = Some(why.unwrap_or(Why::NotHeld)),
        }
    }
    // The heartbeat withheld this step or from the next step on: the
    // mode's change names it (`heartbeat-held`) from the step that found
    // it to the step that read it held again, never the refused writes.
    outcome.heartbeat_held = withheld || held.beat_withheld();
    let news = held.news(failed, !read.is_empty(), change.is_some());
    (outcome, change.or(news))
}

/// Why the heartbeat is withheld before a read-back has read the safety
/// settings held since the start.
const UNPROVEN: &str =
    "withheld: the safety settings not read back held since the start (read back first)";

/// The same, for the status line ([`SafetyHeld::withheld_why`]).
const SINCE_START: &str =
    "the safety settings not read back held since the start (read back first)";

/// The heartbeat withheld before a read-back has read the safety
/// settings held since the start: said so, unless withheld for a safety
/// write that failed.
fn fail_unproven(outcome: &mut Outcome) {
    let safety_in = (outcome.tried.iter()).all(|(s, r)| !s.safety() || r.is_ok());
    if safety_in {
        fail(outcome, Setting::Heartbeat, &UNPROVEN);
    }
}

/// Whether a step's read-back proves the CDU holds its safety settings,
/// for the first heartbeat since the start: every safety setting of the
/// plan in the map went in and every run was read (none found not held);
/// a run failed in any way (refused with any exception, 1 and 2 too, no
/// answer, not asked) proves nothing. A step whose plan has no safety
/// setting in the map has nothing to read back.
struct Proven {
    /// Why it proves nothing, but for a setting found not held.
    why: Option<Why>,
}

impl Proven {
    /// For the safety settings of `plan` that went in (`written`).
    fn of(plan: &Plan, written: &[Written]) -> Self {
        let mapped = |s: Setting| s.safety() && holding(s.register()).is_some();
        let went = |s: Setting| written.iter().any(|w| w.setting == s);
        let missing = (plan.writes.iter()).find(|w| mapped(w.setting) && !went(w.setting));
        Self {
            why: missing.map(|w| Why::NotWritten(w.setting.register())),
        }
    }

    /// A run failed with `why`.
    fn failed(&mut self, why: &Unread) {
        self.why.get_or_insert(Why::Unread(*why));
    }
}

/// Records `why` as the failure of `s`'s write in `outcome`.
fn fail(outcome: &mut Outcome, s: Setting, why: &impl fmt::Display) {
    if let Some(t) = outcome.tried.iter_mut().find(|(t, _)| *t == s) {
        t.1 = Err(cooling_decide::said::words(why));
    }
}

/// A setting last read back not held whose read-back since failed or
/// was not asked: not taken on its echo.
struct StillNotHeld<'a>(&'a NotHeld);

impl fmt::Display for StillNotHeld<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        write!(
            f,
            "{} at holding {} last read back {}, not the {} written; not read back since: not taken",
            n.setting.register(),
            n.address,
            Said(&n.held[..n.len]),
            Said(&n.written[..n.len])
        )
    }
}

/// What becomes of the settings of a run not read back, as the console
/// says it: taken on their echo, but for those last read back not held
/// (whatever failed the read-back, a CDU refusing it included).
struct Taken<'a> {
    run: &'a [Written],
    held: &'a SafetyHeld,
}

impl fmt::Display for Taken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("taken as their write's echo said")?;
        let unheld = |w: &&Written| self.held.unheld.iter().any(|u| u.setting == w.setting);
        if !self.run.iter().any(|w| unheld(&w)) {
            return Ok(());
        }
        f.write_str(", but not")?;
        for w in self.run.iter().filter(unheld) {
            write!(f, " {}", w.register.name)?;
        }
        f.write_str(" (last read back not held)")
    }
}

/// Why a run was not read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unread {
    /// The CDU or the line failed it.
    Port(RtuError),
    /// Not asked: the step's time ran out.
    OutOfTime {
        /// The run's first setting's register, and its address.
        first: &'static str,
        /// Its last's.
        last: &'static str,
        /// The first register's address.
        address: u16,
        /// The run's registers (words).
        words: u16,
    },
}

impl Unread {
    /// The run's first address and its registers.
    pub fn span(&self) -> (u16, u16) {
        match self {
            Unread::Port(e) => (e.op().address, e.op().count),
            Unread::OutOfTime { address, words, .. } => (*address, *words),
        }
    }
}

impl fmt::Display for Unread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unread::Port(e) => write!(f, "{e}"),
            Unread::OutOfTime {
                first,
                last,
                address,
                ..
            } => {
                f.write_str("read back ")?;
                if first != last {
                    write!(f, "{first} to ")?;
                }
                write!(
                    f,
                    "{last} at holding {address}: not asked: the step's time ran out"
                )
            }
        }
    }
}

/// Reads back `run` (`words` registers from its first address).
fn read_run<P: HoldingPort>(
    port: &mut P,
    run: &[Written],
    words: usize,
) -> Result<[u16; 2 * SAFETY], Unread> {
    let mut held = [0u16; 2 * SAFETY];
    let (first, last) = (run[0].register, run[run.len() - 1].register);
    if !port.time_left() {
        return Err(Unread::OutOfTime {
            first: first.name,
            last: last.name,
            address: first.address,
            words: words as u16,
        });
    }
    port.read_holding(first, last, &mut held[..words])
        .map_err(Unread::Port)?;
    Ok(held)
}

/// The words `held` read back for `run`: each setting read into `read`,
/// each holding another value than written into `found`.
fn judge_run(
    run: &[Written],
    held: &[u16],
    read: &mut heapless::Vec<Setting, SAFETY>,
    found: &mut heapless::Vec<NotHeld, SAFETY>,
) {
    let mut at = 0;
    for w in run {
        let len = w.words.len();
        let back = &held[at..at + len];
        at += len;
        let _ = read.push(w.setting);
        if back == w.words.as_slice() {
            continue;
        }
        let mut n = NotHeld {
            setting: w.setting,
            address: w.register.address,
            written: [0; 2],
            held: [0; 2],
            len,
        };
        n.written[..len].copy_from_slice(&w.words);
        n.held[..len].copy_from_slice(back);
        let _ = found.push(n);
    }
}

/// Settings' names as a read-back says them: `lead_pump to pumps_run`.
struct Names<'a>(&'a [Written]);

impl fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (first, last) = (self.0[0].register, self.0[self.0.len() - 1].register);
        if self.0.len() == 1 {
            write!(f, "{} at holding {}", first.name, first.address)
        } else {
            write!(
                f,
                "{} to {} at holding {}",
                first.name, last.name, first.address
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cooling_decide::Write;
    use std::collections::BTreeMap;
    use std::string::{String, ToString};
    use std::vec::Vec;

    use crate::rtu::{Op, OpKind};

    /// A CDU that echoes every write, holds what it takes, and reads its
    /// holding registers back.
    pub(super) struct Cdu {
        pub(super) holding: BTreeMap<u16, u16>,
        /// Registers it echoes but does not take.
        pub(super) ignores: Vec<&'static str>,
        /// Registers whose write it refuses (exception 4).
        pub(super) refuses_write: Vec<&'static str>,
        /// It does not answer a read-back.
        pub(super) silent: bool,
        /// It refuses a read-back with this exception.
        pub(super) refuses: Option<u8>,
        /// Transactions left before the step's time runs out: all it is
        /// sent, over any number of steps (the boot tests step through the
        /// whole bound built in), unless a test cuts it.
        budget: usize,
        /// What it was sent: each write's register, each read-back's
        /// first address and count.
        pub(super) writes: Vec<&'static str>,
        reads: Vec<(u16, usize)>,
    }

    impl Cdu {
        pub(super) fn new() -> Self {
            Self {
                holding: BTreeMap::new(),
                ignores: Vec::new(),
                refuses_write: Vec::new(),
                silent: false,
                refuses: None,
                budget: usize::MAX,
                writes: Vec::new(),
                reads: Vec::new(),
            }
        }

        /// Runs one step of `plan`, as the board's shell does.
        pub(super) fn step(
            &mut self,
            plan: &Plan,
            held: &mut SafetyHeld,
        ) -> (Outcome, Option<Change>, String) {
            self.writes.clear();
            let mut console = String::new();
            let (o, c) = write_step(self, plan, held, &mut console);
            (o, c, console)
        }
    }

    impl SettingPort for Cdu {
        type Error = String;
        fn write(&mut self, r: &Register, words: &[u16]) -> Result<(), String> {
            self.budget -= 1;
            self.writes.push(r.name);
            if self.refuses_write.contains(&r.name) {
                return Err(format!("write {}: exception 4", r.name));
            }
            if !self.ignores.contains(&r.name) {
                for (i, w) in words.iter().enumerate() {
                    self.holding.insert(r.address + i as u16, *w);
                }
            }
            Ok(())
        }
        fn was_sent(_: &String) -> bool {
            true
        }
        fn time_left(&mut self) -> bool {
            self.budget > 0
        }
    }

    impl HoldingPort for Cdu {
        fn read_holding(
            &mut self,
            first: &Register,
            last: &Register,
            out: &mut [u16],
        ) -> Result<(), RtuError> {
            self.budget -= 1;
            self.reads.push((first.address, out.len()));
            let op = Op {
                kind: OpKind::ReadHolding,
                unit: 1,
                address: first.address,
                count: out.len() as u16,
                first: first.name,
                last: last.name,
                sent: [0; 2],
            };
            if self.silent {
                return Err(RtuError::NoAnswer {
                    op,
                    after_us: 200_000,
                    got: 0,
                    cut: false,
                });
            }
            if let Some(code) = self.refuses {
                return Err(RtuError::Refused { op, code });
            }
            for (i, w) in out.iter_mut().enumerate() {
                *w = self
                    .holding
                    .get(&(first.address + i as u16))
                    .copied()
                    .unwrap_or(0);
            }
            Ok(())
        }
    }

    /// Valves `valves` (bit n: rack n open), pump A to run and lead.
    pub(super) fn plan(valves: u16) -> Plan {
        let values = [f64::from(valves), 1.0, 0.0, 7.0, 80.0, 30.13];
        Plan {
            writes: Setting::ORDER
                .iter()
                .zip(values)
                .map(|(s, v)| Write {
                    setting: *s,
                    value: v,
                })
                .collect(),
        }
    }

    pub(super) fn why(o: &Outcome, s: Setting) -> Option<String> {
        let (_, r) = o.tried.iter().find(|(t, _)| *t == s)?;
        r.as_ref().err().map(|w| w.to_string())
    }

    #[test]
    fn a_valve_close_the_cdu_echoes_but_does_not_hold_withholds_the_heartbeat_until_it_reads_back_closed(
    ) {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        // Every rack open, taken and held.
        let (o, change, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(o.all_ok() && change.is_none() && !held.withholds());
        // Rack 2 to close: the CDU echoes the write and keeps it open.
        cdu.ignores.push("valves_open");
        let (o, change, _) = cdu.step(&plan(0b1011), &mut held);
        assert!(cdu.writes.contains(&"heartbeat"), "read back after it");
        let said = "valves_open at holding 3 reads back word 15, not the word 11 written: \
                    the CDU did not take it";
        assert_eq!(why(&o, Setting::Valves).as_deref(), Some(said));
        assert!(!o.taken().valves, "not taken");
        assert!(matches!(change, Some(Change::NotHeld(n)) if n.setting == Setting::Valves));
        assert_eq!(
            change.unwrap().to_string(),
            "heartbeat withheld, the CDU falls back: valves_open at holding 3 reads back \
             word 15, not 11"
        );
        assert_eq!(held.not_held, 1);
        // The next step writes no heartbeat, the rest as planned.
        let (o, change, _) = cdu.step(&plan(0b1011), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat"), "{:?}", cdu.writes);
        assert_eq!(cdu.writes.len(), 5);
        assert_eq!(
            why(&o, Setting::Heartbeat).as_deref(),
            Some("withheld: the CDU does not hold a safety setting it echoed (read back)")
        );
        assert_eq!(change, None, "said once");
        // The CDU takes the close: this step's read-back reads it closed,
        // and the heartbeat goes again from the next step.
        cdu.ignores.clear();
        let (o, change, _) = cdu.step(&plan(0b1011), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat"));
        assert_eq!(why(&o, Setting::Valves), None);
        assert_eq!(change, Some(Change::HeldAgain));
        assert!(!held.withholds());
        let (o, change, _) = cdu.step(&plan(0b1011), &mut held);
        assert!(cdu.writes.contains(&"heartbeat"));
        assert!(o.all_ok() && change.is_none());
        assert_eq!(cdu.holding.get(&3), Some(&0b1011));
    }

    #[test]
    fn the_safety_settings_are_read_back_in_one_request_per_run_the_others_not_at_all() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        cdu.step(&plan(0b1111), &mut held);
        // lead_pump, valves_open and pumps_run: holding 2 to 4, one run;
        // the heartbeat, the speed and the setpoint are not read back.
        assert_eq!(cdu.reads, [(2, 3)]);
        // A safety write that did not go in is not read back.
        cdu.reads.clear();
        let mut p = plan(0b1111);
        p.writes[0].value = 70_000.0;
        let (o, _, _) = cdu.step(&p, &mut held);
        assert!(why(&o, Setting::Valves).is_some());
        assert_eq!(cdu.reads, [(2, 1), (4, 1)], "two runs about the gap");
    }

    #[test]
    fn a_read_back_that_fails_leaves_the_settings_taken_and_what_was_not_held_not_held() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        cdu.silent = true;
        let (o, change, console) = cdu.step(&plan(0b1111), &mut held);
        assert!(o.all_ok(), "taken on their echo");
        assert!(
            matches!(change, Some(Change::Unread(_))),
            "said to the gateway: {change:?}"
        );
        assert!(
            console.contains("no whole answer within 200 ms")
                && console.contains("taken as their write's echo said"),
            "{console}"
        );
        assert_eq!(held.unread, 1);
        // Found not held, then a read-back that fails: still withheld.
        cdu.silent = false;
        cdu.ignores.push("pumps_run");
        let mut both = plan(0b1111);
        both.writes[1].value = 3.0;
        let (o, _, _) = cdu.step(&both, &mut held);
        assert!(why(&o, Setting::PumpsRun).is_some_and(|w| w.contains("reads back word 1")));
        assert!(held.withholds());
        cdu.ignores.clear();
        cdu.silent = true;
        cdu.step(&plan(0b1111), &mut held);
        assert!(held.withholds(), "not read held");
        // A step with no time left for it: not asked, taken, said so.
        cdu.silent = false;
        cdu.budget = 5;
        let (o, change, console) = cdu.step(&plan(0b1111), &mut held);
        assert!(
            console.contains("not asked: the step's time ran out"),
            "{console}"
        );
        assert!(why(&o, Setting::PumpsRun).is_some(), "last read not held");
        assert!(change.is_none() && held.withholds());
    }

    /// A read-back that fails (no answer, not asked for the step's time)
    /// is said to the gateway at the first of a run, and again when one
    /// reads back: otherwise a CDU whose read-back never works has the
    /// check silently off.
    #[test]
    fn a_read_back_that_fails_is_said_to_the_gateway_at_the_first_of_a_run_and_when_it_works_again()
    {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        cdu.silent = true;
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        let said = change.map(|c| c.to_string()).unwrap_or_default();
        assert!(said.starts_with("read-back failing (no answer)"), "{said}");
        assert!(matches!(change, Some(Change::Unread(_))));
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        assert_eq!(change, None, "once a run");
        cdu.silent = false;
        cdu.budget = 5;
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        assert_eq!(change, None, "still failing");
        cdu.budget = 100;
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        assert_eq!(change, Some(Change::ReadAgain));
        assert!(Change::ReadAgain.to_string().contains("read back again"));
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        assert_eq!(change, None);
        // Never asked (a CDU too slow for the step's time): said too.
        cdu.budget = 5;
        let (_, change, _) = cdu.step(&plan(0b1111), &mut held);
        let said = change.map(|c| c.to_string()).unwrap_or_default();
        assert!(said.starts_with("read-back failing (no time)"), "{said}");
    }

    /// Each change of which settings the CDU does not hold is said to
    /// the gateway, naming one that came in (else one still not held),
    /// so its last word never blames a setting held again.
    #[test]
    fn a_change_of_the_settings_not_held_is_said_naming_the_new_one() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        cdu.step(&plan(0b1111), &mut held);
        let named = |c: Option<Change>| match c {
            Some(Change::NotHeld(n)) => Some(n.setting),
            _ => None,
        };
        let mut lead_b = plan(0b1011);
        lead_b.writes[2].value = 1.0;
        cdu.ignores = std::vec!["valves_open"];
        let (_, change, _) = cdu.step(&plan(0b1011), &mut held);
        assert_eq!(named(change), Some(Setting::Valves));
        // Both not held: the lead pump said.
        cdu.ignores.push("lead_pump");
        let (_, change, _) = cdu.step(&lead_b, &mut held);
        assert_eq!(named(change), Some(Setting::LeadPump));
        let (_, change, _) = cdu.step(&lead_b, &mut held);
        assert_eq!(change, None, "no change");
        // The valves held again, the lead pump still not.
        cdu.ignores = std::vec!["lead_pump"];
        let (_, change, _) = cdu.step(&lead_b, &mut held);
        assert_eq!(named(change), Some(Setting::LeadPump));
        assert!(held.withholds());
        // The valves not held again while the lead pump is not.
        cdu.ignores.push("valves_open");
        let (_, change, _) = cdu.step(&lead_b, &mut held);
        assert_eq!(change, None, "the valves written 0b1011, held");
        let mut open = lead_b.clone();
        open.writes[0].value = 15.0;
        let (_, change, _) = cdu.step(&open, &mut held);
        assert_eq!(named(change), Some(Setting::Valves));
        cdu.ignores.clear();
        let (_, change, _) = cdu.step(&open, &mut held);
        assert_eq!(change, Some(Change::HeldAgain));
    }

    /// The gateway's line of a setting not held says the heartbeat is
    /// withheld first, and is whole within a line's room, at the widest
    /// words and address, for each safety setting.
    #[test]
    fn the_gateways_line_of_a_setting_not_held_says_the_heartbeat_is_withheld_whole() {
        use crate::controller::said_words;
        use loopwarden_link::message::SAID_MAX;
        for (setting, len) in [
            (Setting::Valves, 1),
            (Setting::PumpsRun, 1),
            (Setting::LeadPump, 1),
            (Setting::Valves, 2),
        ] {
            let n = NotHeld {
                setting,
                address: u16::MAX,
                written: [u16::MAX; 2],
                held: [u16::MAX - 1; 2],
                len,
            };
            let whole = Change::NotHeld(n).to_string();
            let said = said_words(&Change::NotHeld(n));
            assert!(whole.len() <= SAID_MAX, "{} bytes: {whole}", whole.len());
            assert_eq!(said.as_str(), whole);
            assert!(said.starts_with("heartbeat withheld"), "{said}");
            assert!(said.contains(setting.register()) && said.contains("65534"));
        }
        let again = Change::HeldAgain.to_string();
        assert!(
            again.len() <= SAID_MAX && again.contains("heartbeat"),
            "{again}"
        );
    }

    /// The gateway's line of a read-back that fails says why (no
    /// answer, the exception, no time), where, and what became of the
    /// settings, whole within a line's room, for every failure kind.
    #[test]
    fn the_gateways_line_of_a_failing_read_back_says_why_whole_for_every_failure_kind() {
        use crate::controller::said_words;
        let said = |c: Option<Change>| {
            let c = c.expect("the read-back failing said");
            let said = said_words(&c);
            assert_eq!(said.as_str(), c.to_string(), "cut");
            std::string::String::from(said.as_str())
        };
        let fresh = || (Cdu::new(), SafetyHeld::seen_held());
        let (mut cdu, mut held) = fresh();
        cdu.silent = true;
        let line = said(cdu.step(&plan(0b1111), &mut held).1);
        assert_eq!(
            line,
            "read-back failing (no answer) at holding 2-4: safety settings taken on their echo"
        );
        for (code, why) in [(6, "exception 6"), (1, "exception 1")] {
            let (mut cdu, mut held) = fresh();
            cdu.refuses = Some(code);
            let line = said(cdu.step(&plan(0b1111), &mut held).1);
            assert!(line.contains(why) && line.contains("holding 2-4"), "{line}");
        }
        let (mut cdu, mut held) = fresh();
        cdu.budget = 5;
        let line = said(cdu.step(&plan(0b1111), &mut held).1);
        assert!(line.contains("(no time) at holding 2-4"), "{line}");
        // A setting last read back not held stays not taken: said so.
        let (mut cdu, mut held) = fresh();
        cdu.ignores.push("pumps_run");
        let mut both = plan(0b1111);
        both.writes[1].value = 3.0;
        cdu.step(&both, &mut held);
        cdu.silent = true;
        let line = said(cdu.step(&both, &mut held).1);
        assert_eq!(
            line,
            "read-back failing (no answer) at holding 2-4: echo taken, but 1 last read back \
             not held stays not taken"
        );
        // Every failure kind at the widest fields: whole.
        let op = Op {
            kind: OpKind::ReadHolding,
            unit: u8::MAX,
            address: u16::MAX,
            count: MAX_READ as u16,
            first: "lead_pump",
            last: "valves_open",
            sent: [0; 2],
        };
        let port = |e| Unread::Port(e);
        use embedded_hal_nb::serial::ErrorKind;
        for (why, reason) in [
            (
                port(RtuError::NoAnswer {
                    op,
                    after_us: u32::MAX,
                    got: u16::MAX,
                    cut: false,
                }),
                "no answer",
            ),
            (
                port(RtuError::NoAnswer {
                    op,
                    after_us: u32::MAX,
                    got: u16::MAX,
                    cut: true,
                }),
                "no answer in time",
            ),
            (
                port(RtuError::Crc {
                    op,
                    sent: 0,
                    computed: 1,
                }),
                "bad CRC",
            ),
            (
                port(RtuError::Refused { op, code: u8::MAX }),
                "exception 255",
            ),
            (
                port(RtuError::BadAnswer {
                    op,
                    why: crate::rtu::Mismatch::Length,
                }),
                "bad answer",
            ),
            (port(RtuError::LineBusy { op }), "line busy"),
            (port(RtuError::OutOfTime { op }), "no time"),
            (
                port(RtuError::Serial {
                    op,
                    kind: ErrorKind::FrameFormat,
                }),
                "UART FrameFormat",
            ),
            (
                Unread::OutOfTime {
                    first: "lead_pump",
                    last: "valves_open",
                    address: u16::MAX,
                    words: MAX_READ as u16,
                },
                "no time",
            ),
        ] {
            for not_taken in 0..=3 {
                let c = Change::Unread(Failing { why, not_taken });
                let line = said(Some(c));
                assert!(
                    line.starts_with(&std::format!(
                        "read-back failing ({reason}) at holding 65535-"
                    )),
                    "{line}"
                );
            }
        }
    }

    /// Lead pump A tripped: pump B to run and lead, the CDU echoes both
    /// writes but keeps A. The pumps stay not taken over steps whose
    /// read-back fails or is not asked (so B, never started, is not
    /// judged tripped), until a read-back reads them held: over a CDU
    /// that answered the read-back and then refuses it (exception 1 or
    /// 2) too, the heartbeat withheld. A write refused, with no
    /// read-back to say otherwise, is taken on a later echo whose
    /// read-back fails.
    #[test]
    fn a_setting_read_back_not_held_stays_not_taken_over_a_read_back_that_fails_or_is_not_asked() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::seen_held();
        cdu.step(&plan(0b1111), &mut held);
        let mut b = plan(0b1111);
        b.writes[1].value = 2.0;
        b.writes[2].value = 1.0;
        cdu.ignores = std::vec!["pumps_run", "lead_pump"];
        let (o, _, _) = cdu.step(&b, &mut held);
        assert!(!o.taken().pumps && held.withholds());
        let not_taken = |o: &Outcome| {
            [Setting::PumpsRun, Setting::LeadPump]
                .map(|s| why(o, s).is_some_and(|w| w.contains("not read back since")))
        };
        // No answer, a bad answer (busy), no time: not taken, and said.
        cdu.silent = true;
        let (o, _, console) = cdu.step(&b, &mut held);
        assert_eq!(not_taken(&o), [true, true], "{:?} {console}", o.tried);
        assert!(why(&o, Setting::LeadPump).is_some());
        assert!(!o.taken().pumps && o.taken().valves);
        assert_eq!(
            why(&o, Setting::LeadPump).as_deref(),
            Some(
                "lead_pump at holding 2 last read back word 0, not the word 1 written; \
                 not read back since: not taken"
            )
        );
        cdu.silent = false;
        cdu.refuses = Some(6);
        let (o, _, _) = cdu.step(&b, &mut held);
        assert_eq!(not_taken(&o), [true, true]);
        cdu.refuses = None;
        cdu.budget = 5;
        let (o, _, _) = cdu.step(&b, &mut held);
        assert_eq!(not_taken(&o), [true, true]);
        assert!(held.withholds());
        // A CDU that answered the read-back refuses it now (exception 1
        // or 2): still not taken, the heartbeat withheld, the refusal
        // said.
        cdu.budget = 100;
        for code in [1, 2] {
            cdu.refuses = Some(code);
            let (o, _, console) = cdu.step(&b, &mut held);
            assert_eq!(not_taken(&o), [true, true], "{:?} {console}", o.tried);
            assert!(!o.taken().pumps && held.withholds(), "{:?}", o.tried);
            let beat = why(&o, Setting::Heartbeat).unwrap_or_default();
            assert!(beat.starts_with("withheld"), "{beat}");
            assert!(
                console.contains(&std::format!("exception {code}"))
                    && console.contains("but not lead_pump pumps_run (last read back not held)"),
                "{console}"
            );
        }
        // Read back held: taken, the heartbeat back from the next step.
        cdu.refuses = None;
        cdu.ignores.clear();
        let (o, change, _) = cdu.step(&b, &mut held);
        assert!(o.taken().pumps && change == Some(Change::HeldAgain));
        // A write refused (its value past the register), then echoed
        // with the read-back unanswered: taken on its echo.
        let mut big = plan(0b1111);
        big.writes[0].value = 70_000.0;
        let (o, _, _) = cdu.step(&big, &mut held);
        assert!(!o.taken().valves);
        cdu.silent = true;
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(o.taken().valves && o.taken().pumps, "{:?}", o.tried);
    }
}

#[cfg(test)]
mod boot {
    //! The first heartbeat after a start waits for a read-back that reads
    //! the safety settings held.
    use super::tests::{plan, why, Cdu};
    use super::*;
    use crate::figures::built_in;
    use cooling_core::config::figures::decode_with;

    /// The bound, in whole seconds up: the first step at 1 s a step that
    /// is past it.
    fn bound_s() -> u64 {
        START_BOUND_MS.div_ceil(1000)
    }

    /// The bound is the CDU's heartbeat timeout the figures built in
    /// carry (10 s where they give none), and the wait after a start
    /// lasts it to the ms: a read-back that proves nothing keeps the
    /// heartbeat withheld at a step 1 ms short of it, and it goes at the
    /// step at it, said with the bound.
    #[test]
    fn after_a_start_the_wait_lasts_the_cdus_heartbeat_timeout_built_in() {
        let given = built_in::RECORD.map(|r| decode_with(r).expect("the figures built in").1);
        let want = given.flatten().map_or(10_000, |ms| u64::from(ms.get()));
        assert_eq!(START_BOUND_MS, want);
        assert_eq!(
            built_in::HEARTBEAT_TIMEOUT_MS,
            given.flatten().map(|ms| ms.get())
        );
        let mut cdu = Cdu::new();
        cdu.silent = true;
        let mut held = SafetyHeld::default();
        for (now, beat) in [
            (0, false),
            (START_BOUND_MS - 1, false),
            (START_BOUND_MS, true),
        ] {
            held.tick(now);
            let (_, _, console) = cdu.step(&plan(0b1111), &mut held);
            assert_eq!(
                cdu.writes.contains(&"heartbeat"),
                beat,
                "{now} ms: {console}"
            );
            if beat {
                let said = format!("within {} of the start", built_in::START_BOUND_SAID);
                assert!(console.contains(&said), "{console}");
            }
        }
    }

    /// A board that starts again on a CDU whose own fallback holds both
    /// pumps to run and takes no run flag: the valves and the pumps are
    /// written at the first step, but no heartbeat, nor at any step
    /// whose read-back finds them not held or fails (no answer); once a
    /// read-back reads them held, the heartbeat goes from the next step.
    #[test]
    fn after_a_start_the_first_heartbeat_waits_for_a_read_back_that_reads_the_safety_settings_held()
    {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        let pumps = holding("pumps_run").map(|r| r.address).unwrap();
        cdu.holding.insert(pumps, 0b11);
        cdu.ignores.push("pumps_run");
        let (o, _, console) = cdu.step(&plan(0b1111), &mut held);
        assert!(cdu
            .writes
            .starts_with(&["valves_open", "pumps_run", "lead_pump"]));
        assert!(!cdu.writes.contains(&"heartbeat"), "{console}");
        assert_eq!(why(&o, Setting::Heartbeat).as_deref(), Some(UNPROVEN));
        assert!(o.heartbeat_held && held.withholds());
        // Not held, then not answered: still withheld.
        cdu.step(&plan(0b1111), &mut held);
        cdu.ignores.clear();
        cdu.silent = true;
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat") && o.heartbeat_held);
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat") && o.heartbeat_held);
        assert!(held.beat_withheld(), "none read held");
        // Read back held: the heartbeat from the next step.
        cdu.silent = false;
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat") && o.heartbeat_held);
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(
            cdu.writes.contains(&"heartbeat") && o.all_ok(),
            "{:?}",
            o.tried
        );
        assert!(!o.heartbeat_held);
    }

    /// A read-back that reads every safety setting held ends the wait at
    /// once: the heartbeat from the second step. One that proves nothing
    /// (refused with any exception, 1 and 2 included, or unanswered)
    /// leaves the heartbeat withheld until [`START_BOUND_MS`] has passed
    /// since the first step, then it goes on the writes' echo, said once.
    #[test]
    fn after_a_start_a_read_back_that_proves_nothing_waits_for_the_bound_then_the_heartbeat_goes() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        held.tick(0);
        cdu.step(&plan(0b1111), &mut held);
        held.tick(1000);
        cdu.step(&plan(0b1111), &mut held);
        assert!(cdu.writes.contains(&"heartbeat"), "read back held");
        for (refuses, silent, why) in [
            (Some(1), false, "refused: exception 1"),
            (Some(2), false, "refused: exception 2"),
            (Some(4), false, "refused: exception 4"),
            (None, true, "unanswered"),
        ] {
            let mut cdu = Cdu::new();
            cdu.refuses = refuses;
            cdu.silent = silent;
            let mut held = SafetyHeld::default();
            let mut said = 0;
            let (bound, last) = (bound_s(), bound_s() + 2);
            let beats: Vec<bool> = (0..=last)
                .map(|s| {
                    held.tick(s * 1000);
                    let (_, _, console) = cdu.step(&plan(0b1111), &mut held);
                    said += console
                        .matches("heartbeat sent on the writes' echo")
                        .count();
                    if s == last {
                        assert!(held.withheld_why().is_none(), "{why}");
                    } else if s > 0 && s < bound {
                        let line = held.withheld_why().map(|w| w.to_string());
                        let line = line.unwrap_or_default();
                        assert!(line.ends_with(why), "{why}: {line}");
                    }
                    cdu.writes.contains(&"heartbeat")
                })
                .collect();
            let mut want = vec![false; last as usize + 1];
            want[bound as usize..].fill(true);
            assert_eq!(beats, want, "{why}");
            assert_eq!(said, 1, "{why}");
        }
    }

    /// Every safety setting of the plan must read back held: a start whose
    /// valve write is refused while the pumps and the lead read back held
    /// proves nothing, so the second step writes no heartbeat; once the
    /// valves read back held too, it goes from the next step.
    #[test]
    fn after_a_start_a_safety_write_that_did_not_go_in_proves_nothing() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        cdu.refuses_write.push("valves_open");
        cdu.step(&plan(0b1111), &mut held);
        cdu.refuses_write.clear();
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(!cdu.writes.contains(&"heartbeat"), "{:?}", o.tried);
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert!(cdu.writes.contains(&"heartbeat"), "{:?}", o.tried);
    }

    /// A start whose first read-back finds the pumps not held: the
    /// heartbeat's failure says a setting is found not held, not the
    /// start's wait, and the status line names it.
    #[test]
    fn after_a_start_a_setting_found_not_held_is_the_heartbeats_failure() {
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        cdu.ignores.push("pumps_run");
        let pumps = holding("pumps_run").map(|r| r.address).unwrap();
        cdu.holding.insert(pumps, 0b11);
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        assert_eq!(why(&o, Setting::Heartbeat).as_deref(), Some(UNPROVEN));
        let (o, _, _) = cdu.step(&plan(0b1111), &mut held);
        let failure = why(&o, Setting::Heartbeat).unwrap_or_default();
        assert!(
            failure.contains("does not hold a safety setting")
                && !failure.contains("read back first"),
            "{failure}"
        );
        let status = held.withheld_why().map(|w| w.to_string());
        assert!(status.unwrap_or_default().contains("pumps_run"));
        // Past the bound it stays withheld, and is never said sent.
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        cdu.ignores.push("pumps_run");
        cdu.holding.insert(pumps, 0b11);
        let mut over = 0;
        for s in 0..=bound_s() + 2 {
            held.tick(s * 1000);
            let (_, _, console) = cdu.step(&plan(0b1111), &mut held);
            assert!(!console.contains("heartbeat sent"), "{s}: {console}");
            assert!(!cdu.writes.contains(&"heartbeat"), "{s}: heartbeat written");
            over += console
                .matches("the wait after the start is over; heartbeat still withheld: pumps_run not held")
                .count();
        }
        assert_eq!(over, 1);
        assert!(held.waiting.to_string().ends_with("read back not held"));
    }

    /// The status line's why of the heartbeat withheld: from the start
    /// until a read-back reads the safety settings held, then the setting
    /// found not held, then none once it reads back held.
    #[test]
    fn the_status_line_says_why_the_heartbeat_is_withheld_from_the_start() {
        let why = |h: &SafetyHeld| h.withheld_why().map(|w| w.to_string());
        let mut cdu = Cdu::new();
        let mut held = SafetyHeld::default();
        let start = format!("{SINCE_START}: none read back yet");
        assert_eq!(why(&held), Some(start));
        assert!(UNPROVEN.ends_with(SINCE_START));
        cdu.silent = true;
        cdu.step(&plan(0b1111), &mut held);
        let said = format!("{SINCE_START}: unanswered");
        assert_eq!(why(&held), Some(said), "unanswered");
        cdu.silent = false;
        cdu.step(&plan(0b1111), &mut held);
        assert_eq!(why(&held), None, "read back held");
        let valves = holding("valves_open").map(|r| r.address).unwrap();
        cdu.ignores.push("valves_open");
        cdu.holding.insert(valves, 0b1111);
        cdu.step(&plan(0b0111), &mut held);
        let said = why(&held).unwrap_or_default();
        assert!(said.contains("valves_open"), "{said}");
    }
}

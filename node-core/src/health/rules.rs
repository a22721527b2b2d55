//! The rules that judge a GPU on its own sample: its error counters and
//! flags, against the previous sample or over a trailing minute.
//!
//! In the order [`HealthEngine::sample`] runs them: the quarantine-level
//! memory errors (volatile double-bit ECC, retired pages, row remap
//! failure) and NVLink faults, the degraded-level pending resets, then the
//! degraded-level sustained rates (PCIe replays, corrected ECC errors,
//! NVLink CRC errors).
//!
//! Glossary:
//! - *window*: a counter's recent values as read, for its increase over a
//!   trailing span ([`Window`]). A counter read every sample (corrected
//!   ECC, NVLink CRC) has a point at every sample that knows it (none
//!   from a failed read) and counts from the newest point at least the
//!   span old, scaled to the span when that is older ([`Increase`]). The PCIe replay counter has a point only at
//!   the samples that read it (every sample, or only the reads of the
//!   slow counters where the agent cannot read it every sample:
//!   [`Observation::pcie_held`]; none from a sample that does not know
//!   it) and counts over exactly the span before
//!   its newest read, its value at the span's start interpolated between
//!   the two reads around it ([`Window::interpolated`]): read every 22 s,
//!   a minute's count runs from 8/22 of the way between two reads 22 s
//!   apart, never 9 whole replays in 66 s scaled to 8.2 a minute. Read at
//!   an interval that divides the span (every sample at 1 s periods), a
//!   read falls on its start and the count is whole.
//! - *whole count*: an interpolated increase with its fraction dropped
//!   ([`Increase::floor`]); the PCIe sustain is judged on it.
//! - *streak*: how long a condition has held ([`Streak`]); paused over
//!   samples that cannot judge it (its start moved forward by their
//!   time past a grace since the last known one, up to the next known
//!   one: [`STREAK_GRACE_MS`] for PCIe replays, none for the counters
//!   read every period), so it never grows over a long gap not known.
//! - *least count*: what a sample that did not read a counter read
//!   every period is judged on, the newest read's value held to it
//!   ([`Window::held_to`]): no more than the reads prove.
//! - *rate*: a counter's window and its streak above the limit
//!   ([`Rate`]), the same for the three rates: a sample that does not
//!   know the counter ([`Read::Unknown`]) adds no point and pauses the
//!   streak (a counter read every period: judged on its least count).

use std::collections::VecDeque;

use loopwarden_protocol::{HealthState, ReasonCode, Unsupported};

use super::{At, HealthEngine, Observation, Output};

/// A counter's recent values as read, for rates over a trailing window.
#[derive(Debug, Clone, Default)]
pub(super) struct Window {
    points: VecDeque<(u64, u64)>,
}

/// A counter's increase over a trailing span: `count` over the `over` ms
/// between the newest point and the newest point at least the span
/// before it. `over` exceeds the span when the reads do not fall on it (a
/// period that does not divide it, a gap); it is shorter while the window
/// fills. An interpolated increase ([`Window::interpolated`]) is over
/// exactly the span and may hold a fraction of a count: `count / den`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Increase {
    count: u128,
    den: u64,
    over: u64,
}

impl Increase {
    /// A whole count over `over` ms.
    fn whole(count: u64, over: u64) -> Self {
        Increase {
            count: u128::from(count),
            den: 1,
            over,
        }
    }

    /// The whole counts in it, the fraction dropped.
    pub(super) fn floor(&self) -> Self {
        Increase {
            count: self.count / u128::from(self.den),
            den: 1,
            over: self.over,
        }
    }

    /// The increase per `span` ms, to the nearest: the count scaled to
    /// the span when counted over longer, as counted otherwise (over the
    /// span, or over less while the window fills: never more than seen).
    pub(super) fn per(&self, span: u64) -> u64 {
        let over = u128::from(self.over.max(span).max(1)) * u128::from(self.den);
        ((self.count * u128::from(span) + over / 2) / over) as u64
    }

    /// Whether the rate is above `limit` per `limit_span` ms, the count
    /// taken over the time it was counted over (or over `span` while the
    /// window fills), without rounding.
    pub(super) fn above(&self, span: u64, limit: u64, limit_span: u64) -> bool {
        self.count * u128::from(limit_span)
            > u128::from(limit) * u128::from(self.over.max(span)) * u128::from(self.den)
    }

    /// The count in words: whole, or to a tenth when interpolated.
    fn count_words(&self) -> String {
        if self.count % u128::from(self.den) == 0 {
            format!("{}", self.count / u128::from(self.den))
        } else {
            format!("{:.1}", self.count as f64 / self.den as f64)
        }
    }

    /// The increase in words, with what was counted: `{rate}/{per}
    /// ({count} in {s} s)` once counted over the span or longer, only
    /// `{count} in {s} s` while the window fills.
    fn words(&self, span: u64, per: &str) -> String {
        let secs = self.over as f64 / 1000.0;
        let count = self.count_words();
        if self.over >= span {
            format!("{}/{per} ({count} in {secs:.1} s)", self.per(span))
        } else {
            format!("{count} in {secs:.1} s")
        }
    }
}

impl Window {
    /// Adds a point, the counter `v` read at `t`, and keeps what the
    /// last `span` ms before it need.
    fn push(&mut self, t: u64, v: u64, span: u64) {
        // A counter that went down was reset (driver reload), or the clock
        // stepped back: start again.
        if self
            .points
            .back()
            .is_some_and(|&(lt, last)| v < last || t < lt)
        {
            self.points.clear();
        }
        self.points.push_back((t, v));
        while self.points.len() > 2 && t.saturating_sub(self.points[1].0) >= span {
            self.points.pop_front();
        }
    }

    /// The increase over the last `span` ms read (at most the span pushed
    /// with): from the newest point at least `span` before the newest,
    /// else the oldest kept, to the newest, over the time between them.
    fn increase_over(&self, span: u64) -> Increase {
        match self.points.back() {
            Some(&(t, last)) => self.increase_to(t, last, span),
            None => Increase::whole(0, 0),
        }
    }

    /// The least increase over the last `span` ms before `t`, a sample
    /// that did not read the counter: as if read at `t` with the value of
    /// its newest read (a counter never falls but at a reset, which
    /// starts the window again), so no more than the reads prove.
    fn held_to(&self, t: u64, span: u64) -> Increase {
        match self.points.back() {
            Some(&(lt, last)) if t >= lt => self.increase_to(t, last, span),
            _ => Increase::whole(0, 0),
        }
    }

    /// The increase to `last` at `t`: from the newest point at least
    /// `span` before `t`, else the oldest kept, over the time between.
    fn increase_to(&self, t: u64, last: u64, span: u64) -> Increase {
        // Points run oldest first: those at least `span` old come first.
        let old = self
            .points
            .partition_point(|&(pt, _)| t.saturating_sub(pt) >= span);
        let (from, first) = self.points[old.saturating_sub(1)];
        Increase::whole(last - first, t.saturating_sub(from))
    }

    /// The increase over exactly the last `span` ms before the newest
    /// point (at most the span pushed with), the counter's value at that
    /// instant interpolated between the two points around it: a counter
    /// read every 22 s counts the minute from 8/22 of the way between two
    /// reads, never 66 s scaled to 60. Equal to [`Window::increase_over`]
    /// when a point falls on the instant (reads that divide the span) and
    /// while the window fills.
    fn interpolated(&self, span: u64) -> Increase {
        let Some(&(t, last)) = self.points.back() else {
            return Increase::whole(0, 0);
        };
        let old = self
            .points
            .partition_point(|&(pt, _)| t.saturating_sub(pt) >= span);
        let (Some(&(a, va)), Some(&(b, vb))) = (
            old.checked_sub(1).and_then(|i| self.points.get(i)),
            self.points.get(old),
        ) else {
            return self.increase_over(span);
        };
        let at = t - span;
        if a == at {
            return self.increase_over(span);
        }
        // `a < at < b`, `va <= vb <= last`: (last - v(at)) * (b - a).
        let ab = u128::from(b - a);
        let count = u128::from(last - va) * ab - u128::from(vb - va) * u128::from(at - a);
        Increase {
            count,
            den: b - a,
            over: span,
        }
    }
}

/// The longest time between reads a PCIe replay streak counts across as
/// it would across reads made that far apart: the slow counters' longest
/// interval (`slow_counters_s` at most 60), so a counter whose reads
/// fail but for one every so often is judged as one read that often.
/// The counters read every period (corrected ECC, NVLink CRC) have
/// none: a sample that does not read them is judged on the least the
/// reads prove ([`Rate::minute`]).
pub(super) const STREAK_GRACE_MS: u64 = 60_000;

/// A condition that must hold for a while.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Streak {
    since: Option<u64>,
    /// When it was last updated or paused.
    last: Option<u64>,
    /// When it was last updated (known).
    known: Option<u64>,
    /// Whether it was last paused past its grace: the time from that
    /// sample to the next known one is not known either.
    lapsed: bool,
}

impl Streak {
    /// `on`: seen now; `off`: clearly gone now; neither: keep as is.
    /// Returns how long it has held.
    pub(super) fn update(&mut self, t: u64, on: bool, off: bool) -> Option<u64> {
        let lapsed = std::mem::take(&mut self.lapsed);
        let unknown = self
            .last
            .filter(|_| lapsed)
            .map_or(0, |l| t.saturating_sub(l));
        self.last = Some(t);
        self.known = Some(t);
        if on {
            // A clock that stepped back restarts the streak; the time
            // since a sample past the grace was not known.
            let since = self.since.filter(|&s| s <= t);
            let since = since.map_or(t, |s| s.saturating_add(unknown).min(t));
            self.since = Some(since);
            Some(t - since)
        } else {
            if off {
                self.since = None;
            }
            None
        }
    }

    /// Not known now: the streak neither starts nor ends; past `grace`
    /// since its last known update it is paused, its start moved forward
    /// by the time not known beyond that (to the next known update
    /// included), so a long gap never lengthens it (judged again at the
    /// next read) while reads that fail but for one every so often,
    /// within the grace, count as reads made that far apart.
    pub(super) fn pause(&mut self, t: u64, grace: u64) {
        let graced = self.known.map_or(t, |k| k.saturating_add(grace));
        let from = self.last.map_or(graced, |l| l.max(graced));
        if let Some(since) = self.since {
            self.since = Some(since.saturating_add(t.saturating_sub(from)).min(t));
        }
        self.lapsed = t >= graced;
        self.last = Some(t);
    }
}

/// A counter judged on its rate: its window of reads and its streak
/// above the limit. A sample that does not know the counter (a failed
/// read, a field not in the sample) adds no point and pauses the
/// streak, never judged on values not known: the next read counts
/// across the gap, so a failed read now and then neither starts the
/// count again nor ends the streak (only a counter that fell, a reset,
/// starts the window again).
#[derive(Debug, Clone, Default)]
pub(super) struct Rate {
    pub(super) window: Window,
    pub(super) high: Streak,
}

/// What a sample says of a rate counter.
#[derive(Debug, Clone, Copy)]
pub(super) enum Read {
    /// Read at this sample: a point of the window.
    Fresh(u64),
    /// Known, as read at an earlier sample (a slow counter held between
    /// its reads): judged, but no point.
    Held,
    /// Not known (a failed read): not judged.
    Unknown,
}

impl Read {
    /// The counter `v` as a sample has it: not known, held from an
    /// earlier read, or read now.
    fn of(v: u64, known: bool, held: bool) -> Self {
        match (known, held) {
            (false, _) => Read::Unknown,
            (true, true) => Read::Held,
            (true, false) => Read::Fresh(v),
        }
    }
}

impl Rate {
    /// Takes the sample's `read` at `t` into the window (a fresh read
    /// only), keeping what the last `span` ms before it need.
    fn take(&mut self, t: u64, read: Read, span: u64) {
        if let Read::Fresh(v) = read {
            self.window.push(t, v, span);
        }
    }

    /// A counter read every period, judged on its count over the last
    /// minute against `limit` per `limit_span` ms: takes `read` at `t`,
    /// and returns the minute's increase and how long its streak above
    /// the limit has held (`None`: not above, or not known now). A streak
    /// ends once the minute is down to the limit. A sample that does not
    /// know the counter is judged on the least the reads prove (the
    /// newest read's value held to now, [`Window::held_to`]): while that
    /// minute is above the limit the streak grows (a storm whose reads
    /// fail but for one every so often); once it is not, the streak is
    /// paused with no grace, so a gap between two bursts, whose minutes
    /// read would have fallen to the limit, does not join them.
    fn minute(
        &mut self,
        t: u64,
        read: Read,
        limit: u64,
        limit_span: u64,
    ) -> (Increase, Option<u64>) {
        self.take(t, read, 60_000);
        if let Read::Unknown = read {
            let least = self.window.held_to(t, 60_000);
            if least.above(60_000, limit, limit_span) {
                self.high.update(t, true, false);
            } else {
                self.high.pause(t, 0);
            }
            return (least, None);
        }
        let minute = self.window.increase_over(60_000);
        let on = minute.above(60_000, limit, limit_span);
        (minute, self.high.update(t, on, true))
    }

    /// The streak at `t` after `read`: `on` and `off` as
    /// [`Streak::update`] when the counter is known, else paused
    /// ([`Streak::pause`]) and `None`.
    fn judge(&mut self, t: u64, read: Read, on: bool, off: bool) -> Option<u64> {
        if let Read::Unknown = read {
            self.high.pause(t, STREAK_GRACE_MS);
            None
        } else {
            self.high.update(t, on, off)
        }
    }
}

impl HealthEngine {
    /// Quarantine-level memory errors: the volatile double-bit ECC count
    /// rose (or is above 0 on the first sample), too many retired pages,
    /// row remapping failed.
    pub(super) fn memory_errors(
        &mut self,
        t: u64,
        g: usize,
        o: &Observation,
        prev: Option<Observation>,
        out: &mut Vec<Output>,
    ) {
        let p = self.policy;
        let when = At(self.stamp(t));
        let dbe_rose = match prev {
            Some(p) => o.dbe_volatile > p.dbe_volatile,
            None => o.dbe_volatile > 0,
        };
        if dbe_rose {
            let n = o.dbe_volatile;
            self.raise(
                t,
                g,
                HealthState::Quarantined,
                ReasonCode::DBE_VOLATILE,
                || format!("volatile uncorrectable ECC count {n} at {when}: reset needed"),
                out,
            );
        }
        let retired = o.retired_sbe.saturating_add(o.retired_dbe);
        if retired >= p.retired_pages_limit {
            self.raise(
                t,
                g,
                HealthState::Quarantined,
                ReasonCode::RETIRED_PAGES_LIMIT,
                || {
                    format!(
                        "{retired} retired pages (limit {}) at {when}",
                        p.retired_pages_limit
                    )
                },
                out,
            );
        }
        if o.remap_failure {
            self.raise(
                t,
                g,
                HealthState::Quarantined,
                ReasonCode::REMAP_FAILURE,
                || format!("row remapping failed at {when}: no spare rows left"),
                out,
            );
        }
    }

    /// Quarantine-level NVLink faults: a replay or recovery counter rose
    /// since the previous sample. Per link where the GPU reports links
    /// (the evidence names them), else, or for links beyond those, by the
    /// totals; a counter that fell is a reset (a driver reload), not an
    /// error.
    pub(super) fn nvlink_faults(
        &mut self,
        t: u64,
        g: usize,
        o: &Observation,
        prev: Option<Observation>,
        out: &mut Vec<Output>,
    ) {
        let when = At(self.stamp(t));
        let Some(pv) = prev else { return };
        let links = o.nvlink_links.rises(&pv.nvlink_links);
        let replay = o.nvlink_replay.saturating_sub(pv.nvlink_replay);
        let recovery = o.nvlink_recovery.saturating_sub(pv.nvlink_recovery);
        let evidence = if !links.is_empty() {
            let each: Vec<String> = links
                .iter()
                .map(|(l, a, b)| format!("link {l} replays +{a}, recoveries +{b}"))
                .collect();
            format!("NVLink {} at {when}", each.join("; "))
        } else if replay > 0 || recovery > 0 {
            format!("NVLink replays +{replay}, recoveries +{recovery} at {when}")
        } else {
            return;
        };
        self.raise(
            t,
            g,
            HealthState::Quarantined,
            ReasonCode::NVLINK_ERRORS,
            || evidence,
            out,
        );
    }

    /// Degraded-level flags: a page retirement or a row remap waits for a
    /// reset.
    pub(super) fn pending_resets(
        &mut self,
        t: u64,
        g: usize,
        o: &Observation,
        out: &mut Vec<Output>,
    ) {
        let when = At(self.stamp(t));
        if o.retired_pending {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::RETIRED_PENDING,
                || format!("page retirement pending since {when}: reset at next drain"),
                out,
            );
        }
        if o.remap_pending {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::REMAP_PENDING,
                || format!("row remap pending since {when}: reset at next drain"),
                out,
            );
        }
    }

    /// The recovery action the driver names for the GPU: a reset or a
    /// reboot it needs quarantines (it cannot be trusted until then, as
    /// NVIDIA's catalog says of an XID whose action is a reset); draining
    /// peer-to-peer traffic, or draining then a reset, degrades (the work
    /// may finish, as for an XID whose action is drain-and-reset). An
    /// action this engine does not know (a newer driver's: a bus reset, a
    /// system reboot) quarantines: the driver asks for something to be
    /// done before the GPU is trusted, and what is not known fails closed.
    pub(super) fn recovery_action(
        &mut self,
        t: u64,
        g: usize,
        o: &Observation,
        out: &mut Vec<Output>,
    ) {
        let when = At(self.stamp(t));
        let (state, what) = match o.recovery_action {
            0 => return,
            1 => (HealthState::Quarantined, "a GPU reset"),
            2 => (HealthState::Quarantined, "a node reboot"),
            3 => (HealthState::Degraded, "draining peer-to-peer traffic"),
            4 => (HealthState::Degraded, "draining, then a GPU reset"),
            _ => (
                HealthState::Quarantined,
                "an action this agent does not know",
            ),
        };
        let n = o.recovery_action;
        self.raise(
            t,
            g,
            state,
            ReasonCode::RECOVERY_ACTION,
            || format!("the driver asks for {what} (recovery action {n}) at {when}"),
            out,
        );
    }

    /// Degraded-level rates of counters over the last minute, sustained:
    /// PCIe replays, corrected ECC errors, NVLink CRC errors. A count over
    /// more than its span (samples that do not fall on it) is scaled to
    /// the span before it is held against a limit per span. A streak
    /// ends once the rate over its sustain time is down to the limit, so
    /// a lull between bursts does not end it while the bursts keep the
    /// average above the limit; for ECC and CRC errors, whose sustain is
    /// the minute the rate is read over, that is the minute's rate. The
    /// PCIe replay counter is read every sample, or with the slow
    /// counters where the agent cannot: its window takes a point only
    /// from a sample that read it, so its rates are counted between
    /// reads, over exactly the minute and the 2 minutes before the newest
    /// read (interpolated); the streak still runs in the samples' time.
    /// For all three ([`Rate`]), a sample that does not know the counter
    /// (a failed read, a field not in the sample) adds no point and
    /// pauses the streak, never judged on values not known: the next read
    /// counts across the gap, and a failed read now and then neither
    /// restarts the count nor ends the streak (a counter that fell,
    /// reset, starts the window again). For PCIe replays, up to
    /// [`STREAK_GRACE_MS`] since the last read the streak grows as across
    /// reads made that far apart; past it, its start moves forward by the
    /// time not known, so
    /// a long gap of failed reads, whose counts the next read spreads
    /// evenly over it, does not count towards the sustain. For ECC and
    /// CRC errors, read every period, the 60 s would be their whole
    /// sustain: a sample not knowing them is judged on the least count
    /// the reads prove ([`Rate::minute`]), and the streak grows only while
    /// that is above the limit. A PCIe streak
    /// ends only once the count over exactly the 2 minutes (interpolated
    /// start), its fraction kept, is down to the limit, so a steady rate
    /// from 8.5/min up is detected at any read interval, and replays in
    /// bursts below the limit, whose exact 2 minutes fall to the limit
    /// between bursts, are not degraded when read every sample. The PCIe 2
    /// minutes are judged on whole replays, and the
    /// GPU is degraded only while they are above the limit: a steady rate
    /// at or below the limit, whose interpolated minute can read up to one
    /// replay above it, counts no more whole replays in 2 minutes than
    /// the limit allows, so it is never degraded at any read interval.
    pub(super) fn sustained_rates(
        &mut self,
        t: u64,
        g: usize,
        o: &Observation,
        out: &mut Vec<Output>,
    ) {
        let p = self.policy;
        self.pcie_replay_rate(t, g, o, out);
        let sbe = Read::of(o.sbe_volatile, !o.unknown.contains(Unsupported::ECC), false);
        let crc = Read::of(
            o.nvlink_crc,
            !o.unknown.contains(Unsupported::NVLINK),
            false,
        );
        let tr = &mut self.gpus[g];
        let (sbe_min, sbe_for) = tr.sbe.minute(t, sbe, p.sbe_per_min, 60_000);
        let (crc_min, crc_for) = tr.crc.minute(t, crc, p.nvlink_crc_per_s, 1_000);
        let sbe_held = (sbe_for, p.sbe_sustain_ms);
        let sbe_rate = (ReasonCode::SBE_RATE_RISING, "corrected ECC errors");
        self.raise_rate(t, g, sbe_rate, sbe_min, sbe_held, out);
        let crc_held = (crc_for, p.nvlink_crc_sustain_ms);
        let crc_rate = (ReasonCode::NVLINK_ERRORS, "NVLink CRC errors");
        self.raise_rate(t, g, crc_rate, crc_min, crc_held, out);
    }

    /// `g` missed its sample at `t`: no counter is known, so each rate
    /// is judged as on a failed read of its counter (the PCIe streak
    /// paused past its grace, the others judged on their least count),
    /// and a stall never counts towards a sustain as if read.
    pub(super) fn rates_not_known(&mut self, t: u64, g: usize) {
        let p = self.policy;
        let tr = &mut self.gpus[g];
        tr.pcie.high.pause(t, STREAK_GRACE_MS);
        tr.sbe.minute(t, Read::Unknown, p.sbe_per_min, 60_000);
        tr.crc.minute(t, Read::Unknown, p.nvlink_crc_per_s, 1_000);
    }

    /// The PCIe replay rate ([`HealthEngine::sustained_rates`]): its
    /// window takes the sample's read, its streak is judged, and the GPU
    /// is degraded once more than the limit's whole replays over exactly
    /// the sustain have held for it.
    fn pcie_replay_rate(&mut self, t: u64, g: usize, o: &Observation, out: &mut Vec<Output>) {
        let p = self.policy;
        let when = At(self.stamp(t));
        let tr = &mut self.gpus[g];
        // One window for both spans of PCIe replays, of the values read.
        let pcie = Read::of(
            o.pcie_replay,
            !o.unknown.contains(Unsupported::PCIE),
            o.pcie_held,
        );
        tr.pcie.take(t, pcie, p.pcie_sustain_ms.max(60_000));
        let pcie_min = tr.pcie.window.interpolated(60_000);
        let pcie_exact = tr.pcie.window.interpolated(p.pcie_sustain_ms);
        let pcie_sustained = pcie_exact.floor();
        let pcie_over = pcie_sustained.above(p.pcie_sustain_ms, p.pcie_replays_per_min, 60_000);
        // The streak ends only once the replays over exactly the sustain
        // (interpolated start) are down to the limit with their fraction
        // kept: the whole count alone dropped a replay at some reads of a
        // steady 8.5/min and ended the streak there.
        let pcie_held = pcie_exact.above(p.pcie_sustain_ms, p.pcie_replays_per_min, 60_000);
        // A sample that does not know the counter neither starts, ends
        // nor lengthens the streak (paused over the time not known): it
        // is judged again at the next read.
        let pcie_for = tr.pcie.judge(
            t,
            pcie,
            pcie_min.above(60_000, p.pcie_replays_per_min, 60_000),
            !pcie_held,
        );
        if pcie_over && pcie_for.is_some_and(|d| d >= p.pcie_sustain_ms) {
            let per = format!("{} min", p.pcie_sustain_ms / 60_000);
            let two = pcie_sustained.words(p.pcie_sustain_ms, &per);
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::PCIE_REPLAY_RATE,
                || {
                    format!(
                        "PCIe replays {}, {two} at {when}, limit {}/min",
                        pcie_min.words(60_000, "min"),
                        p.pcie_replays_per_min
                    )
                },
                out,
            );
        }
    }

    /// Degrades `g` for a rate's reason once its count over the minute
    /// has held above the limit for its sustain: `held` is how long it
    /// has held now (if it does) and the sustain; the evidence names
    /// what is counted and the minute's count.
    fn raise_rate(
        &mut self,
        t: u64,
        g: usize,
        (reason, what): (ReasonCode, &str),
        minute: Increase,
        held: (Option<u64>, u64),
        out: &mut Vec<Output>,
    ) {
        let (held_for, sustain) = held;
        if held_for.is_none_or(|d| d < sustain) {
            return;
        }
        let when = At(self.stamp(t));
        let evidence = || format!("{what} {} at {when}", minute.words(60_000, "min"));
        self.raise(t, g, HealthState::Degraded, reason, evidence, out);
    }
}

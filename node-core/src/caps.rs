//! The power-cap arbiter: which power limit each GPU must have now.
//!
//! Pure: leases, the thermal guard and the time go in, limits come out; no
//! clock, no NVML. The shell applies the limits and reads them back.
//!
//! The limit in force on a GPU is the lowest of: its thermal guard (the
//! host's own cap, which needs no bus), every unexpired lease that names it
//! (cooling controller, facility budget, operator), and the board's highest
//! settable limit; never below the GPU's lowest settable limit, or its
//! ceiling where that is lower (a limit found below the lowest settable one
//! is never raised).
//!
//! Glossary:
//! - *lease*: a cap from a sender, keyed by the sender and its lease id; a
//!   new lease with the same key replaces the old; it lapses at its expiry
//!   unless renewed, and its cap lifts.
//! - *guard*: the thermal guard's cap, set and cleared by the host itself.
//! - *clamped*: a cap below the GPU's minimum settable limit, raised to
//!   it, a cap above its highest settable limit (which caps nothing: a
//!   figure in the wrong unit, say), or a lease longer than the host
//!   takes, shortened to its longest.

use loopwarden_protocol::{
    AckCode, CapLease, CapSource, DurationMs, GpuIndex, GpuSelector, NodeId, ReasonCode,
    TimestampMs, Watts,
};

/// The settable range of one GPU, read from NVML (or the board) at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRange {
    /// Lowest settable power limit.
    pub min: Watts,
    /// The limit when nothing caps it: the GPU's ceiling (what the site
    /// left on it, within its highest settable limit).
    pub max: Watts,
}

/// The most cooling leases held at once, apart from
/// [`LeaseLimits::max_leases`]: only the host's own CDU controller sends
/// them (one lease id per host, a few more while its numbering of the
/// hosts changes), so the leases of operators and facility systems, however
/// many, never crowd out the cap that cooling falls short by. One more
/// from a CDU that holds them all is never refused: it replaces that
/// CDU's least recently taken or renewed (an id it numbers no more), so
/// a CDU that renumbered its hosts often within one lease's life still
/// caps the host.
pub const COOLING_LEASES: usize = 8;

/// What a host takes of leases: a longer one is taken for the longest
/// only (shortened, said in its ack), one more than the count is refused,
/// so a sender (a compromised one included) can neither cap a GPU for
/// weeks nor fill the host's memory. The cooling leases of the host's own
/// CDU are counted apart, at most [`COOLING_LEASES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLimits {
    /// The longest a lease runs: one asked longer is shortened to it.
    pub max_duration: DurationMs,
    /// The most leases held at once from operators and facility systems
    /// together (a renewal of a held lease is always taken); the CDU's
    /// cooling leases are not counted here ([`COOLING_LEASES`]).
    pub max_leases: usize,
}

impl Default for LeaseLimits {
    /// Ten minutes, sixteen leases.
    fn default() -> Self {
        Self {
            max_duration: DurationMs(600_000),
            max_leases: 16,
        }
    }
}

/// A lease held by the arbiter.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    from: NodeId,
    lease: u32,
    source: CapSource,
    /// Why its sender caps (a cooling loss, capacity short, a budget).
    reason: ReasonCode,
    /// Per GPU index: the cap this lease puts on it, if any.
    caps: Vec<Option<Watts>>,
    expires: TimestampMs,
}

/// What became of a lease request: the ack code to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// `Ok`, `Clamped` (accepted, a cap raised to a GPU's minimum or the
    /// lease shortened to the longest taken), or why it was refused
    /// (`UnknownGpu`, `Malformed`, `Expired`, `TooMany`); a refused lease
    /// changes nothing.
    pub code: AckCode,
    /// Taken, it runs shorter than it asked: until its sending plus
    /// [`LeaseLimits::max_duration`] (taken back after a restart too).
    pub shortened: bool,
    /// Taken back after a restart: the GPUs it caps that this host does
    /// not have (bit `i` for GPU `i`), their caps left out.
    pub missing: u16,
    /// Taken back after a restart beyond the most held of its kind
    /// ([`CapArbiter::most_leases`]).
    pub over_count: bool,
    /// A cooling lease taken with [`COOLING_LEASES`] held: the id of its
    /// sender's lease it replaced (the least recently taken or renewed),
    /// whose caps lifted.
    pub replaced: Option<u32>,
}

impl LeaseOutcome {
    fn of(code: AckCode) -> Self {
        Self {
            code,
            shortened: false,
            missing: 0,
            over_count: false,
            replaced: None,
        }
    }
}

/// A lease as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Who sent it.
    pub from: NodeId,
    /// The sender's lease id.
    pub lease: u32,
    /// On whose behalf.
    pub source: CapSource,
    /// Why, as its sender said (`cooling-lost`: a rack's cooling loss).
    pub reason: ReasonCode,
    /// When it lapses unless renewed.
    pub expires: TimestampMs,
    /// The caps it puts, per GPU index.
    pub caps: Vec<(GpuIndex, Watts)>,
}

/// The limit in force on one GPU and who set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    /// The GPU.
    pub gpu: GpuIndex,
    /// Its power limit.
    pub limit: Watts,
    /// The source of the lowest cap, or `None` when uncapped.
    pub source: Option<CapSource>,
}

/// The arbiter of one host (see the module note).
#[derive(Debug, Clone)]
pub struct CapArbiter {
    /// Each GPU's range now: its lowest limit is the configured one, or
    /// its ceiling where that is lower.
    ranges: Vec<GpuRange>,
    /// Each GPU's configured lowest settable limit.
    floors: Vec<Watts>,
    /// Each GPU's highest settable limit, where known
    /// ([`CapArbiter::set_highest`]): a cap above it is clamped.
    highest: Vec<Option<Watts>>,
    guard: Vec<Option<Watts>>,
    leases: Vec<Held>,
    limits: LeaseLimits,
}

impl CapArbiter {
    /// An arbiter for GPUs `0..ranges.len()` with their settable ranges,
    /// taking leases within the default [`LeaseLimits`].
    pub fn new(ranges: Vec<GpuRange>) -> Self {
        Self::with_limits(ranges, LeaseLimits::default())
    }

    /// As [`CapArbiter::new`], within `limits`.
    pub fn with_limits(ranges: Vec<GpuRange>, limits: LeaseLimits) -> Self {
        let floors = ranges.iter().map(|r| r.min).collect();
        let ranges = ranges
            .into_iter()
            .map(|r| GpuRange {
                min: r.min.min(r.max),
                max: r.max,
            })
            .collect::<Vec<_>>();
        Self {
            guard: vec![None; ranges.len()],
            highest: vec![None; ranges.len()],
            ranges,
            floors,
            leases: Vec::new(),
            limits,
        }
    }

    /// Takes a lease sent by `from` in a frame stamped `sent`. It holds
    /// until `sent + duration`, or `sent` plus the longest lease taken if
    /// that is sooner (shortened, and `Clamped`); one that has expired at
    /// `now`, names a GPU this host does not have, caps nothing, or would
    /// be one lease more than the limit is refused and changes nothing.
    pub fn lease(
        &mut self,
        now: TimestampMs,
        from: &NodeId,
        sent: TimestampMs,
        lease: &CapLease,
    ) -> LeaseOutcome {
        self.take(now, from, sent, lease, false)
    }

    /// Takes back a lease taken before a restart, under the rules it was
    /// taken with (the limits may have changed since): it holds until
    /// `sent + duration`, or `sent` plus the longest lease taken if that is
    /// sooner, as when it was taken (a restart never lengthens it; one past
    /// that end has expired); beyond the count it is taken all the same;
    /// its caps on GPUs
    /// this host does not have are left out (refused `UnknownGpu` only if
    /// no cap is left). The outcome says what differs from the lease.
    pub fn restore(
        &mut self,
        now: TimestampMs,
        from: &NodeId,
        sent: TimestampMs,
        lease: &CapLease,
    ) -> LeaseOutcome {
        self.take(now, from, sent, lease, true)
    }

    /// [`CapArbiter::lease`], or [`CapArbiter::restore`] if `restoring`.
    fn take(
        &mut self,
        now: TimestampMs,
        from: &NodeId,
        sent: TimestampMs,
        lease: &CapLease,
        restoring: bool,
    ) -> LeaseOutcome {
        let refuse = LeaseOutcome::of;
        if lease.caps.is_empty() || lease.duration.0 == 0 {
            return refuse(AckCode::Malformed);
        }
        let asked = sent.after(lease.duration);
        // Taken or taken back, from its sending: a restart never runs a
        // shortened lease again.
        let longest = sent.after(self.limits.max_duration);
        let expires = asked.min(longest);
        if expires <= now {
            return refuse(AckCode::Expired);
        }
        self.expire(now);
        let renewal = self
            .leases
            .iter()
            .any(|h| h.from == *from && h.lease == lease.lease);
        // Cooling leases (the host's own CDU's) and the others are counted
        // apart: neither kind can crowd out the other.
        let cooling = lease.source == CapSource::Cooling;
        let held = (self.leases.iter())
            .filter(|h| (h.source == CapSource::Cooling) == cooling)
            .count();
        let full = !renewal && held >= self.most_leases(lease.source);
        // The cooling leases full, the CDU's new one takes the place of its
        // least recently taken or renewed (an id it numbers no more).
        let replaced = (full && cooling)
            .then(|| {
                self.leases
                    .iter()
                    .find(|h| h.from == *from && h.source == lease.source)
            })
            .flatten()
            .map(|h| h.lease);
        let over_count = full && replaced.is_none();
        if over_count && !restoring {
            return refuse(AckCode::TooMany);
        }
        let mut caps = vec![None; self.ranges.len()];
        let mut clamped = false;
        let mut missing = 0u16;
        for cap in &lease.caps {
            let gpus: Vec<usize> = match cap.gpus {
                GpuSelector::All => (0..self.ranges.len()).collect(),
                GpuSelector::Gpu(g) if (g.get() as usize) < self.ranges.len() => {
                    vec![g.get() as usize]
                }
                GpuSelector::Gpu(g) if restoring => {
                    missing |= 1 << g.get();
                    continue;
                }
                GpuSelector::Gpu(_) => return refuse(AckCode::UnknownGpu),
            };
            for i in gpus {
                clamped |= cap.limit < self.ranges[i].min
                    || self.highest[i].is_some_and(|max| cap.limit > max);
                // Several caps for one GPU in one lease: the lowest holds.
                caps[i] = Some(caps[i].map_or(cap.limit, |c: Watts| c.min(cap.limit)));
            }
        }
        if missing != 0 && caps.iter().all(Option::is_none) {
            return LeaseOutcome {
                missing,
                ..refuse(AckCode::UnknownGpu)
            };
        }
        self.leases.retain(|h| {
            !(h.from == *from && (h.lease == lease.lease || Some(h.lease) == replaced))
        });
        self.leases.push(Held {
            from: from.clone(),
            lease: lease.lease,
            source: lease.source,
            reason: lease.reason,
            caps,
            expires,
        });
        let shortened = expires < asked;
        LeaseOutcome {
            code: if clamped || shortened {
                AckCode::Clamped
            } else {
                AckCode::Ok
            },
            shortened,
            missing,
            over_count,
            replaced,
        }
    }

    /// Sets (or with `None` clears) the thermal guard's cap on `gpu`.
    /// Unknown GPUs are ignored: the guard only knows the host's own.
    pub fn guard(&mut self, gpu: GpuIndex, cap: Option<Watts>) {
        if let Some(g) = self.guard.get_mut(gpu.get() as usize) {
            *g = cap;
        }
    }

    /// Drops lease `lease` of `from`, if held: a renewal of it, taken
    /// before a restart, has expired since ([`crate::commands::CommandCore::restore`]).
    pub fn forget(&mut self, from: &NodeId, lease: u32) {
        self.leases
            .retain(|h| !(h.from == *from && h.lease == lease));
    }

    /// Drops the leases that have expired at `now` (their caps lift).
    pub fn expire(&mut self, now: TimestampMs) {
        self.leases.retain(|h| h.expires > now);
    }

    /// The leases held (including any that expired since the last
    /// [`CapArbiter::expire`]).
    pub fn leases(&self) -> Vec<LeaseView> {
        self.leases
            .iter()
            .map(|h| LeaseView {
                from: h.from.clone(),
                lease: h.lease,
                source: h.source,
                reason: h.reason,
                expires: h.expires,
                caps: h
                    .caps
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| Some((GpuIndex::new(i as u8)?, (*c)?)))
                    .collect(),
            })
            .collect()
    }

    /// The thermal guard's cap on `gpu`.
    pub fn guard_cap(&self, gpu: GpuIndex) -> Option<Watts> {
        self.guard.get(gpu.get() as usize).copied().flatten()
    }

    /// Makes `max` the highest limit of `gpu` (its ceiling: the limit it
    /// runs at uncapped). A ceiling below its configured lowest limit is
    /// its lowest limit too, while it holds: it is never raised.
    pub fn set_ceiling(&mut self, gpu: GpuIndex, max: Watts) {
        let i = gpu.get() as usize;
        if let (Some(r), Some(&floor)) = (self.ranges.get_mut(i), self.floors.get(i)) {
            r.max = max;
            r.min = floor.min(max);
        }
    }

    /// Makes `min` the lowest settable limit of `gpu` (NVML's, read after
    /// the start): caps below it are clamped to it, or to its ceiling
    /// where that is lower.
    pub fn set_floor(&mut self, gpu: GpuIndex, min: Watts) {
        let i = gpu.get() as usize;
        if let (Some(r), Some(floor)) = (self.ranges.get_mut(i), self.floors.get_mut(i)) {
            *floor = min;
            r.min = min.min(r.max);
        }
    }

    /// Makes `max` the highest settable limit of `gpu` (NVML's, within
    /// the board's): a lease's cap above it is taken `Clamped` (it caps
    /// nothing; the ceiling holds).
    pub fn set_highest(&mut self, gpu: GpuIndex, max: Watts) {
        if let Some(h) = self.highest.get_mut(gpu.get() as usize) {
            *h = Some(max);
        }
    }

    /// The highest settable limit of `gpu`, where known.
    pub fn highest(&self, gpu: usize) -> Option<Watts> {
        self.highest.get(gpu).copied().flatten()
    }

    /// The settable range of every GPU.
    pub fn ranges(&self) -> &[GpuRange] {
        &self.ranges
    }

    /// What this host takes of leases.
    pub fn limits(&self) -> LeaseLimits {
        self.limits
    }

    /// The most leases of `source`'s kind held at once: [`COOLING_LEASES`]
    /// for cooling, else [`LeaseLimits::max_leases`] (operators and
    /// facility systems together).
    pub fn most_leases(&self, source: CapSource) -> usize {
        match source {
            CapSource::Cooling => COOLING_LEASES,
            _ => self.limits.max_leases,
        }
    }

    /// When the next lease expires, for the shell's timer.
    pub fn next_expiry(&self) -> Option<TimestampMs> {
        self.leases.iter().map(|h| h.expires).min()
    }

    /// The limit that must be in force on every GPU at `now` (expired
    /// leases are dropped first).
    pub fn in_force(&mut self, now: TimestampMs) -> Vec<InForce> {
        self.expire(now);
        self.ranges
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let mut limit = range.max;
                let mut source = None;
                // The lowest cap wins; on a tie the first (the guard) keeps it.
                let mut lower = |cap: Watts, from: CapSource| {
                    if cap < limit {
                        limit = cap;
                        source = Some(from);
                    }
                };
                if let Some(g) = self.guard[i] {
                    lower(g, CapSource::ThermalGuard);
                }
                for h in &self.leases {
                    if let Some(c) = h.caps[i] {
                        lower(c, h.source);
                    }
                }
                if limit < range.min {
                    limit = range.min;
                }
                InForce {
                    gpu: GpuIndex::new(i as u8).expect("at most 16 GPUs per host"),
                    limit,
                    source,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::samples::cooling_lease as lease;
    use loopwarden_protocol::{DurationMs, Role};

    fn arbiter() -> CapArbiter {
        CapArbiter::new(vec![
            GpuRange {
                min: Watts(200),
                max: Watts(700)
            };
            4
        ])
    }

    fn cdu() -> NodeId {
        NodeId::new(Role::Cdu, "cdu-a").unwrap()
    }

    fn gpu(i: u8) -> GpuSelector {
        GpuSelector::Gpu(GpuIndex::new(i).unwrap())
    }

    fn op() -> NodeId {
        NodeId::new(Role::Operator, "jdoe").unwrap()
    }

    /// An operator's lease.
    fn op_lease(id: u32, caps: &[(GpuSelector, u32)], ms: u32) -> CapLease {
        CapLease {
            source: CapSource::Operator,
            ..lease(id, caps, ms)
        }
    }

    #[test]
    fn lowest_cap_wins_and_lifts_at_expiry() {
        let mut a = arbiter();
        let t = TimestampMs(1_000);
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[(GpuSelector::All, 550)], 30_000))
                .code,
            AckCode::Ok
        );
        a.guard(GpuIndex::new(2).unwrap(), Some(Watts(450)));
        let f = a.in_force(t);
        assert_eq!(f[0].limit, Watts(550));
        assert_eq!(f[0].source, Some(CapSource::Cooling));
        assert_eq!(f[2].limit, Watts(450));
        assert_eq!(f[2].source, Some(CapSource::ThermalGuard));
        // At expiry the lease's cap lifts; the guard stays.
        let f = a.in_force(TimestampMs(31_000));
        assert_eq!((f[0].limit, f[0].source), (Watts(700), None));
        assert_eq!(f[2].limit, Watts(450));
    }

    #[test]
    fn below_minimum_is_clamped_and_said() {
        let mut a = arbiter();
        let t = TimestampMs(0);
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[(gpu(1), 150)], 1_000))
                .code,
            AckCode::Clamped
        );
        assert_eq!(a.in_force(t)[1].limit, Watts(200));
    }

    #[test]
    fn a_ceiling_below_the_minimum_is_never_raised() {
        let mut a = arbiter();
        let t = TimestampMs(0);
        let g1 = GpuIndex::new(1).unwrap();
        a.set_ceiling(g1, Watts(150));
        assert_eq!(a.in_force(t)[1].limit, Watts(150), "uncapped");
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[(gpu(1), 100)], 1_000))
                .code,
            AckCode::Clamped
        );
        assert_eq!(a.in_force(t)[1].limit, Watts(150), "clamped to it");
        // A higher ceiling found since: the minimum is 200 W again.
        a.set_ceiling(g1, Watts(600));
        assert_eq!(a.in_force(t)[1].limit, Watts(200));
    }

    #[test]
    fn bad_leases_change_nothing() {
        let mut a = arbiter();
        let t = TimestampMs(10_000);
        let before = a.in_force(t);
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[(gpu(9), 300)], 1_000))
                .code,
            AckCode::UnknownGpu
        );
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[], 1_000)).code,
            AckCode::Malformed
        );
        assert_eq!(
            a.lease(t, &cdu(), t, &lease(1, &[(gpu(0), 300)], 0)).code,
            AckCode::Malformed
        );
        assert_eq!(
            a.lease(
                t,
                &cdu(),
                TimestampMs(1_000),
                &lease(1, &[(gpu(0), 300)], 5_000)
            )
            .code,
            AckCode::Expired,
            "sent at 1 s for 5 s, arrived at 10 s"
        );
        assert_eq!(a.in_force(t), before);
        assert_eq!(a.next_expiry(), None);
    }

    #[test]
    fn a_lease_too_long_is_shortened_one_too_many_refused_and_a_renewal_always_taken() {
        let mut a = CapArbiter::with_limits(
            vec![
                GpuRange {
                    min: Watts(200),
                    max: Watts(700)
                };
                2
            ],
            LeaseLimits {
                max_duration: DurationMs(600_000),
                max_leases: 3,
            },
        );
        let t = TimestampMs(0);
        let ten_min = lease(1, &[(gpu(0), 300)], 600_000);
        assert_eq!(a.lease(t, &cdu(), t, &ten_min).code, AckCode::Ok);
        // Longer than the host takes: taken for ten minutes, said.
        let longer = lease(2, &[(gpu(0), 250)], 600_001);
        let outcome = a.lease(t, &cdu(), t, &longer);
        assert_eq!((outcome.code, outcome.shortened), (AckCode::Clamped, true));
        assert_eq!(a.in_force(t)[0].limit, Watts(250));
        assert_eq!(a.in_force(TimestampMs(599_999))[0].limit, Watts(250));
        assert_eq!(a.in_force(TimestampMs(600_000))[0].limit, Watts(700));
        a.forget(&cdu(), 1);
        // 49 days, as a forged lease could ask: ten minutes at most.
        let weeks = lease(3, &[(gpu(1), 200)], u32::MAX);
        assert_eq!(a.lease(t, &cdu(), t, &weeks).code, AckCode::Clamped);
        assert_eq!(a.in_force(t)[1].limit, Watts(200));
        assert_eq!(a.next_expiry(), Some(TimestampMs(600_000)));
        a.forget(&cdu(), 3);
        assert_eq!(a.lease(t, &cdu(), t, &ten_min).code, AckCode::Ok);
        for id in 10..12 {
            assert_eq!(
                a.lease(t, &op(), t, &op_lease(id, &[(gpu(1), 400)], 1_000))
                    .code,
                AckCode::Ok
            );
        }
        let third = op_lease(12, &[(gpu(1), 400)], 1_000);
        assert_eq!(a.lease(t, &op(), t, &third).code, AckCode::Ok);
        let fourth = op_lease(20, &[(gpu(1), 200)], 1_000);
        assert_eq!(a.lease(t, &op(), t, &fourth).code, AckCode::TooMany);
        assert_eq!(a.lease(t, &op(), t, &third).code, AckCode::Ok, "a renewal");
        // Once they have lapsed there is room again.
        let later = TimestampMs(2_000);
        assert_eq!(a.lease(later, &op(), later, &fourth).code, AckCode::Ok);
        assert_eq!(a.leases().len(), 2);
    }

    /// Operators' and facility systems' leases fill their count; the
    /// cooling leases of the host's CDU are counted apart, at most
    /// [`COOLING_LEASES`]: the cap that cooling falls short by is always
    /// taken.
    #[test]
    fn the_cdus_cooling_leases_are_never_crowded_out_by_others() {
        let mut a = arbiter();
        let t = TimestampMs(0);
        for id in 1..=16 {
            let l = op_lease(id, &[(GpuSelector::All, 700)], 60_000);
            assert_eq!(a.lease(t, &op(), t, &l).code, AckCode::Ok, "lease {id}");
        }
        let more = op_lease(17, &[(GpuSelector::All, 650)], 60_000);
        assert_eq!(a.lease(t, &op(), t, &more).code, AckCode::TooMany);
        let cooling = lease(1, &[(GpuSelector::All, 300)], 30_000);
        assert_eq!(a.lease(t, &cdu(), t, &cooling).code, AckCode::Ok);
        assert_eq!(a.in_force(t)[0].limit, Watts(300));
        assert_eq!(a.in_force(t)[0].source, Some(CapSource::Cooling));
        assert_eq!(a.most_leases(CapSource::Cooling), COOLING_LEASES);
        assert_eq!(a.most_leases(CapSource::FacilityBudget), 16);
    }

    /// A CDU that renumbered its hosts often within one lease's life
    /// holds [`COOLING_LEASES`] ids: one more is taken, in the place of
    /// its least recently taken or renewed, never refused.
    #[test]
    fn a_cooling_lease_beyond_the_count_replaces_the_cdus_oldest() {
        let mut a = arbiter();
        let t = TimestampMs(0);
        for id in 1..=COOLING_LEASES as u32 {
            // Lease 2 (an id no longer numbered) holds GPU 1 low.
            let low = if id == 2 { 250 } else { 600 };
            let l = lease(id, &[(GpuSelector::All, 600), (gpu(1), low)], 600_000);
            let outcome = a.lease(TimestampMs(id as u64), &cdu(), t, &l);
            assert_eq!((outcome.code, outcome.replaced), (AckCode::Ok, None));
        }
        // Lease 1 renewed: lease 2 is now the least recently taken.
        let renewed = lease(1, &[(GpuSelector::All, 600)], 600_000);
        let at = TimestampMs(20);
        assert_eq!(a.lease(at, &cdu(), at, &renewed).code, AckCode::Ok);
        let ninth = lease(9, &[(GpuSelector::All, 500)], 30_000);
        let at = TimestampMs(30);
        let outcome = a.lease(at, &cdu(), at, &ninth);
        assert_eq!((outcome.code, outcome.replaced), (AckCode::Ok, Some(2)));
        assert!(!outcome.over_count);
        let ids: Vec<u32> = a.leases().iter().map(|l| l.lease).collect();
        assert_eq!(ids, [3, 4, 5, 6, 7, 8, 1, 9]);
        // Lease 2's cap lifted: the new lease's limit is in force.
        let limits: Vec<Watts> = a.in_force(at).iter().map(|g| g.limit).collect();
        assert_eq!(limits, [Watts(500); 4]);
        // Another sender's cooling leases are not its to replace.
        let mut a = arbiter();
        let other = NodeId::new(Role::Cdu, "cdu-b").unwrap();
        for id in 1..=COOLING_LEASES as u32 {
            let l = lease(id, &[(gpu(0), 400)], 600_000);
            assert_eq!(a.lease(t, &other, t, &l).code, AckCode::Ok);
        }
        let mine = lease(1, &[(gpu(0), 300)], 30_000);
        assert_eq!(a.lease(t, &cdu(), t, &mine).code, AckCode::TooMany);
    }

    #[test]
    fn a_renewal_replaces_the_same_lease_only() {
        let mut a = arbiter();
        let t = TimestampMs(0);
        a.lease(t, &cdu(), t, &lease(7, &[(gpu(0), 300)], 1_000));
        a.lease(t, &cdu(), t, &lease(7, &[(gpu(0), 500)], 5_000));
        let op = NodeId::new(Role::Operator, "jdoe").unwrap();
        a.lease(t, &op, t, &lease(7, &[(gpu(0), 600)], 2_000));
        assert_eq!(
            a.in_force(t)[0].limit,
            Watts(500),
            "the renewal raised the cap"
        );
        assert_eq!(a.next_expiry(), Some(TimestampMs(2_000)));
        assert_eq!(a.in_force(TimestampMs(5_000))[0].limit, Watts(700));
    }

    #[test]
    fn a_lease_taken_back_keeps_its_caps_under_changed_limits() {
        let limits = LeaseLimits {
            max_duration: DurationMs(300_000),
            max_leases: 1,
        };
        let mut a = CapArbiter::with_limits(arbiter().ranges().to_vec(), limits);
        let (sent, now) = (TimestampMs(0), TimestampMs(60_000));
        // Ten minutes asked, one gone: five minutes from its sending, as a
        // live lease gets, not from the restart.
        let long = lease(1, &[(gpu(0), 300), (gpu(9), 300)], 600_000);
        let outcome = a.restore(now, &cdu(), sent, &long);
        assert_eq!(outcome.code, AckCode::Clamped);
        assert!(outcome.shortened && !outcome.over_count);
        assert_eq!(outcome.missing, 1 << 9, "GPU 9's cap left out");
        assert_eq!(a.next_expiry(), Some(TimestampMs(300_000)));
        assert_eq!(a.in_force(TimestampMs(299_999))[0].limit, Watts(300));
        // One more than the count: taken back all the same.
        let op = op();
        let first = a.restore(now, &op, sent, &op_lease(7, &[(gpu(3), 500)], 120_000));
        assert_eq!((first.code, first.over_count), (AckCode::Ok, false));
        let second = a.restore(now, &op, sent, &op_lease(2, &[(gpu(1), 400)], 120_000));
        assert_eq!((second.code, second.over_count), (AckCode::Ok, true));
        assert!(!second.shortened);
        assert_eq!(a.in_force(now)[1].limit, Watts(400));
        // Only GPUs it does not have: nothing to take back.
        let gone = a.restore(now, &op, sent, &op_lease(3, &[(gpu(9), 300)], 120_000));
        assert_eq!((gone.code, gone.missing), (AckCode::UnknownGpu, 1 << 9));
        // Its end passed: expired, as before.
        let past = a.restore(now, &op, sent, &op_lease(4, &[(gpu(2), 300)], 60_000));
        assert_eq!(past.code, AckCode::Expired);
        assert_eq!(a.leases().len(), 3);
        // Live, the count holds.
        let live = op_lease(5, &[(gpu(2), 300)], 1_000);
        assert_eq!(a.lease(now, &op, now, &live).code, AckCode::TooMany);
        // Asked past its sending plus the longest taken, and that passed:
        // expired, not taken back for the longest again.
        let again = a.restore(
            TimestampMs(300_000),
            &cdu(),
            sent,
            &lease(6, &[(gpu(3), 300)], u32::MAX),
        );
        assert_eq!(again.code, AckCode::Expired);
    }
}

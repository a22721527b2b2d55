//! The health engine: which GPUs of a host are healthy, degraded or
//! quarantined, and why.
//!
//! Pure and deterministic: samples, missed samples, XID events and the
//! cooling context go in with their time; state changes (each with a
//! stable reason code and the evidence a field engineer reads) come out.
//! The same engine runs in the live agent and in `node-agent replay`.
//!
//! The rules (each explained, with its source, in `docs/health.md`):
//!
//! | level | rule | reason |
//! |---|---|---|
//! | quarantine | an XID the catalog calls fatal hardware (`xid::XidInfo::is_fatal_hardware`) | `xid-<n>` |
//! | quarantine | the volatile double-bit ECC count rises (or is above 0 at start) | `dbe-volatile` |
//! | quarantine | retired pages (single- plus double-bit) at or above 63 | `retired-pages-limit` |
//! | quarantine | row remapping failed | `remap-failure` |
//! | quarantine | an NVLink replay or recovery counter rises | `nvlink-errors` |
//! | quarantine | `unresponsive_after` samples in a row missed | `unresponsive` |
//! | degraded | a page retirement or a row remap waits for a reset | `retired-pending`, `remap-pending` |
//! | degraded | XID 92 (excessive corrected errors), or an XID whose action is drain-and-reset or "follow the recovery action" | `xid-<n>` |
//! | degraded | PCIe replays above 8 per minute, sustained | `pcie-replay-rate` |
//! | degraded | corrected ECC errors above 100 per minute, sustained | `sbe-rate-rising` |
//! | degraded | NVLink CRC errors above 100 per second, sustained | `nvlink-errors` |
//! | degraded | 12 K or more hotter than its peers predict at its power and coolant, sustained | `hot-for-power` |
//! | degraded | clocks 20 % or more behind its peers at the same load, with no power or thermal reason, sustained | `straggler` |
//!
//! The thermal and straggler rules hold their judgement while the host's
//! loop reports trouble (`degraded`, `failsafe`) or while most of the
//! host's GPUs run hot together: that heat is the cooling's, and the
//! engine says so once per episode ([`Output::CoolingAttributed`]).
//!
//! States only rise on evidence. A quarantine falls only by an operator's
//! release; `degraded` falls back to `healthy` after a quiet period without
//! any degraded-level evidence.
//!
//! Glossary:
//! - *observation*: one sample of one GPU in natural units.
//! - *sustained*: a condition seen on every sample for the rule's sustain
//!   time (a sample that clearly clears it restarts the count).
//! - *peers*: the host's other responsive GPUs, the baseline for the
//!   thermal and straggler rules.
//! - *episode*: a stretch of time in which the cooling explains the heat.

use std::collections::VecDeque;

use loopwarden_protocol::{xid, HealthState, ReasonCode, ThrottleReasons, TimestampMs};

/// One sample of one GPU, in natural units. Counters are cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Observation {
    /// Die temperature, °C.
    pub temp: f64,
    /// Power draw, W.
    pub power: f64,
    /// Power limit in force, W.
    pub power_limit: f64,
    /// SM clock, MHz.
    pub sm_clock: f64,
    /// Utilisation, %.
    pub util: f64,
    /// Corrected ECC errors, volatile.
    pub sbe_volatile: u64,
    /// Uncorrected ECC errors, volatile.
    pub dbe_volatile: u64,
    /// Pages retired for single-bit errors.
    pub retired_sbe: u64,
    /// Pages retired for double-bit errors.
    pub retired_dbe: u64,
    /// A page retirement waits for a reset.
    pub retired_pending: bool,
    /// A row remap waits for a reset.
    pub remap_pending: bool,
    /// Row remapping failed.
    pub remap_failure: bool,
    /// PCIe replays.
    pub pcie_replay: u64,
    /// NVLink CRC errors.
    pub nvlink_crc: u64,
    /// NVLink replays.
    pub nvlink_replay: u64,
    /// NVLink recoveries.
    pub nvlink_recovery: u64,
    /// Active clock-event reasons.
    pub throttle: ThrottleReasons,
}

/// The state of the host's cooling loop, as its controller reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopState {
    /// Regulating normally.
    Normal,
    /// Capacity short; caps requested.
    Degraded,
    /// Sensors lost; fixed safe setpoints.
    Failsafe,
}

/// The cooling context of the host's loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coolant {
    /// Supply temperature, °C, when known.
    pub supply_c: Option<f64>,
    /// Flow per GPU, L/min, when known.
    pub flow_lpm_per_gpu: Option<f64>,
    /// The loop's state.
    pub state: LoopState,
}

/// The GPU model's temperatures the rules use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Max operating temperature, °C.
    pub max_operating_c: f64,
}

/// Thresholds and times of the rules. Defaults follow DCGM's health
/// watches and NVIDIA's guidance (see `docs/health.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Missed samples in a row before a GPU is quarantined as unresponsive.
    pub unresponsive_after: u32,
    /// Retired pages at which a GPU is quarantined.
    pub retired_pages_limit: u64,
    /// PCIe replays per minute above which a link is marginal.
    pub pcie_replays_per_min: u64,
    /// How long the PCIe rate must hold, ms.
    pub pcie_sustain_ms: u64,
    /// Corrected ECC errors per minute above which memory is failing.
    pub sbe_per_min: u64,
    /// How long the corrected-error rate must hold, ms.
    pub sbe_sustain_ms: u64,
    /// NVLink CRC errors per second above which a link is marginal.
    pub nvlink_crc_per_s: u64,
    /// How long the CRC rate must hold, ms.
    pub nvlink_crc_sustain_ms: u64,
    /// Kelvin above the peers' prediction that counts as hot.
    pub hot_excess_k: f64,
    /// Below this excess a hot streak ends (hysteresis), K.
    pub hot_clear_k: f64,
    /// Power below which the thermal rule does not judge (idle), W.
    pub hot_min_power_w: f64,
    /// How long a GPU must run hot, ms.
    pub hot_sustain_ms: u64,
    /// Clock share of the peers' median under which a GPU straggles.
    pub straggler_clock_ratio: f64,
    /// Utilisation, %, at or above which GPU and peers count as loaded.
    pub straggler_min_util: f64,
    /// How long a GPU must straggle, ms.
    pub straggler_sustain_ms: u64,
    /// Responsive peers needed for a peer rule.
    pub min_peers: usize,
    /// A peer's sample older than this is not compared, ms.
    pub peer_fresh_ms: u64,
    /// Quiet time after which `degraded` falls back to `healthy`, ms.
    pub quiet_ms: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            unresponsive_after: 3,
            retired_pages_limit: 63,
            pcie_replays_per_min: 8,
            pcie_sustain_ms: 120_000,
            sbe_per_min: 100,
            sbe_sustain_ms: 60_000,
            nvlink_crc_per_s: 100,
            nvlink_crc_sustain_ms: 60_000,
            hot_excess_k: 12.0,
            hot_clear_k: 8.0,
            hot_min_power_w: 150.0,
            hot_sustain_ms: 60_000,
            straggler_clock_ratio: 0.8,
            straggler_min_util: 90.0,
            straggler_sustain_ms: 60_000,
            min_peers: 3,
            peer_fresh_ms: 5_000,
            quiet_ms: 6 * 3_600_000,
        }
    }
}

/// A GPU's state change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// When the engine decided.
    pub time: TimestampMs,
    /// The GPU.
    pub gpu: u8,
    /// The state before.
    pub from: HealthState,
    /// The state now.
    pub to: HealthState,
    /// Why, as a stable code.
    pub reason: ReasonCode,
    /// Why, in words.
    pub evidence: String,
}

/// What the engine says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A GPU changed state.
    Change(Change),
    /// The cooling explains the heat of these GPUs (bit n = GPU n); no GPU
    /// is marked for it.
    CoolingAttributed {
        /// When.
        time: TimestampMs,
        /// Which GPUs.
        gpus: u16,
        /// `cooling-fault`.
        reason: ReasonCode,
    },
}

/// A GPU's state as the engine holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuStatus {
    /// The state.
    pub state: HealthState,
    /// Why.
    pub reason: ReasonCode,
    /// Since when.
    pub since: TimestampMs,
    /// The evidence.
    pub evidence: String,
}

/// A counter's recent values, for rates over a trailing window.
#[derive(Debug, Clone, Default)]
struct Window {
    points: VecDeque<(u64, u64)>,
}

impl Window {
    /// Adds a point and returns the increase over the last `span` ms (from
    /// the oldest point at least `span` old, else the oldest kept).
    fn push(&mut self, t: u64, v: u64, span: u64) -> u64 {
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
        v - self.points.front().map_or(v, |&(_, first)| first)
    }
}

/// A condition that must hold for a while.
#[derive(Debug, Clone, Copy, Default)]
struct Streak {
    since: Option<u64>,
}

impl Streak {
    /// `on`: seen now; `off`: clearly gone now; neither: keep as is.
    /// Returns how long it has held.
    fn update(&mut self, t: u64, on: bool, off: bool) -> Option<u64> {
        if on {
            // A clock that stepped back restarts the streak.
            let since = self.since.filter(|&s| s <= t).unwrap_or(t);
            self.since = Some(since);
            Some(t - since)
        } else {
            if off {
                self.since = None;
            }
            None
        }
    }
}

#[derive(Debug, Clone)]
struct Track {
    status: GpuStatus,
    last: Option<(u64, Observation)>,
    missed: u32,
    first_miss: Option<u64>,
    last_degrade_evidence: u64,
    pcie: Window,
    sbe: Window,
    crc: Window,
    pcie_high: Streak,
    sbe_high: Streak,
    crc_high: Streak,
    hot: Streak,
    straggle: Streak,
    /// The peers' thermal resistance at the last judgement, for evidence.
    hot_excess: f64,
}

impl Track {
    fn new(t: TimestampMs) -> Self {
        Self {
            status: GpuStatus {
                state: HealthState::Healthy,
                reason: ReasonCode::OK,
                since: t,
                evidence: String::new(),
            },
            last: None,
            missed: 0,
            first_miss: None,
            last_degrade_evidence: 0,
            pcie: Window::default(),
            sbe: Window::default(),
            crc: Window::default(),
            pcie_high: Streak::default(),
            sbe_high: Streak::default(),
            crc_high: Streak::default(),
            hot: Streak::default(),
            straggle: Streak::default(),
            hot_excess: 0.0,
        }
    }
}

/// The health engine of one host.
#[derive(Debug, Clone)]
pub struct HealthEngine {
    policy: Policy,
    limits: Limits,
    gpus: Vec<Track>,
    coolant: Option<Coolant>,
    /// GPUs whose heat the cooling explains in the current episode.
    attributed: u16,
    /// GPUs added to `attributed` and not yet said, and when to say them
    /// (a moment after the first, so one event names every GPU of the
    /// round of samples).
    unsaid: Option<u64>,
}

/// How long an attribution waits for the rest of a round of samples, ms.
const ATTRIBUTION_SETTLE_MS: u64 = 2_000;

/// Evidence text fits the bus's 96 bytes.
const EVIDENCE_MAX: usize = loopwarden_protocol::EVIDENCE_MAX;

/// A time for evidence: `t=… ms` for simulated time (replays start near
/// 0), `HH:MM:SS.mmm UTC` for wall-clock time. Formatted only when an
/// evidence is written.
#[derive(Debug, Clone, Copy)]
pub struct At(pub TimestampMs);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0 .0;
        if t < 100_000_000_000 {
            write!(f, "t={t} ms")
        } else {
            let ms = t % 86_400_000;
            write!(
                f,
                "{:02}:{:02}:{:02}.{:03} UTC",
                ms / 3_600_000,
                ms / 60_000 % 60,
                ms / 1000 % 60,
                ms % 1000
            )
        }
    }
}

/// [`At`] as a string.
pub fn fmt_time(t: TimestampMs) -> String {
    At(t).to_string()
}

fn fit(mut s: String) -> String {
    if s.len() > EVIDENCE_MAX {
        s.truncate(EVIDENCE_MAX - 3);
        while !s.is_char_boundary(s.len()) {
            s.pop();
        }
        s.push_str("...");
    }
    s
}

/// Up to 16 values on the stack (one per GPU of a host).
#[derive(Clone, Copy)]
struct Few {
    v: [f64; loopwarden_protocol::MAX_GPUS],
    n: usize,
}

impl Few {
    fn new() -> Self {
        Self {
            v: [0.0; loopwarden_protocol::MAX_GPUS],
            n: 0,
        }
    }
    fn push(&mut self, x: f64) {
        if self.n < self.v.len() {
            self.v[self.n] = x;
            self.n += 1;
        }
    }
    fn median(&mut self) -> Option<f64> {
        median(&mut self.v[..self.n])
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A short name of an XID for evidence: the catalog's meaning up to its
/// first colon or semicolon.
fn xid_words(code: u16) -> String {
    match xid::lookup(code) {
        Some(x) => {
            let m = x.meaning.split([':', ';']).next().unwrap_or(x.meaning);
            m.trim().to_string()
        }
        None => "not in the catalog".into(),
    }
}

impl HealthEngine {
    /// An engine for `gpus` GPUs, all healthy since `start`.
    pub fn new(gpus: usize, limits: Limits, policy: Policy, start: TimestampMs) -> Self {
        Self {
            policy,
            limits,
            gpus: (0..gpus).map(|_| Track::new(start)).collect(),
            coolant: None,
            attributed: 0,
            unsaid: None,
        }
    }

    /// The number of GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether the engine has no GPU.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// A GPU's state.
    pub fn status(&self, gpu: u8) -> Option<&GpuStatus> {
        self.gpus.get(gpu as usize).map(|t| &t.status)
    }

    /// Puts back a state kept from before a restart.
    pub fn restore(&mut self, gpu: u8, status: GpuStatus) {
        if let Some(t) = self.gpus.get_mut(gpu as usize) {
            t.last_degrade_evidence = status.since.0;
            t.status = status;
        }
    }

    /// Raises `gpu` to `to` if that is higher than its state. A repeat of
    /// degraded-level evidence keeps a degraded GPU from falling back.
    fn raise(
        &mut self,
        now: u64,
        gpu: usize,
        to: HealthState,
        reason: ReasonCode,
        evidence: impl FnOnce() -> String,
        out: &mut Vec<Output>,
    ) {
        let t = &mut self.gpus[gpu];
        if to >= HealthState::Degraded {
            t.last_degrade_evidence = now;
        }
        if to <= t.status.state {
            return;
        }
        let change = Change {
            time: TimestampMs(now),
            gpu: gpu as u8,
            from: t.status.state,
            to,
            reason,
            evidence: fit(evidence()),
        };
        t.status = GpuStatus {
            state: to,
            reason,
            since: TimestampMs(now),
            evidence: change.evidence.clone(),
        };
        out.push(Output::Change(change));
    }

    /// A driver XID on `gpu`.
    pub fn xid(&mut self, now: TimestampMs, gpu: u8, code: u16) -> Vec<Output> {
        let mut out = Vec::new();
        let g = gpu as usize;
        if g >= self.gpus.len() {
            return out;
        }
        let Some(info) = xid::lookup(code) else {
            return out;
        };
        let level = if info.is_fatal_hardware() {
            Some(HealthState::Quarantined)
        } else if code == 92
            || matches!(
                info.action,
                xid::XidAction::DrainAndReset | xid::XidAction::FollowRecoveryAction
            )
        {
            Some(HealthState::Degraded)
        } else {
            None
        };
        if let Some(level) = level {
            self.raise(
                now.0,
                g,
                level,
                ReasonCode::xid(code).expect("catalog XIDs are below 1000"),
                || format!("XID {code} ({}) at {}", xid_words(code), fmt_time(now)),
                &mut out,
            );
        }
        out
    }

    /// The host's loop reported its state.
    /// The episode the cooling explains ends in the peer rules, once the
    /// loop is normal and no GPU runs hot, not on the report itself.
    pub fn coolant(&mut self, now: TimestampMs, c: Coolant) -> Vec<Output> {
        let _ = now;
        self.coolant = Some(c);
        Vec::new()
    }

    /// `gpu` did not answer its sample in time.
    pub fn missed(&mut self, now: TimestampMs, gpu: u8) -> Vec<Output> {
        let mut out = Vec::new();
        let g = gpu as usize;
        let Some(t) = self.gpus.get_mut(g) else {
            return out;
        };
        t.missed += 1;
        let first = *t.first_miss.get_or_insert(now.0);
        let missed = t.missed;
        if missed >= self.policy.unresponsive_after {
            self.raise(
                now.0,
                g,
                HealthState::Quarantined,
                ReasonCode::UNRESPONSIVE,
                || {
                    format!(
                        "missed {missed} samples in a row since {}: NVML does not answer",
                        fmt_time(TimestampMs(first))
                    )
                },
                &mut out,
            );
        }
        out
    }

    /// A sample of `gpu`.
    pub fn sample(&mut self, now: TimestampMs, gpu: u8, o: &Observation) -> Vec<Output> {
        let mut out = Vec::new();
        let g = gpu as usize;
        if g >= self.gpus.len() {
            return out;
        }
        let p = self.policy;
        let t = now.0;
        let prev = {
            let tr = &mut self.gpus[g];
            tr.missed = 0;
            tr.first_miss = None;
            tr.last.replace((t, *o)).map(|(_, p)| p)
        };
        let when = At(now);

        // Quarantine-level counters and flags.
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
                &mut out,
            );
        }
        let retired = o.retired_sbe + o.retired_dbe;
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
                &mut out,
            );
        }
        if o.remap_failure {
            self.raise(
                t,
                g,
                HealthState::Quarantined,
                ReasonCode::REMAP_FAILURE,
                || format!("row remapping failed at {when}: no spare rows left"),
                &mut out,
            );
        }
        if let Some(pv) = prev {
            let replay = o.nvlink_replay.saturating_sub(pv.nvlink_replay);
            let recovery = o.nvlink_recovery.saturating_sub(pv.nvlink_recovery);
            if replay > 0 || recovery > 0 {
                self.raise(
                    t,
                    g,
                    HealthState::Quarantined,
                    ReasonCode::NVLINK_ERRORS,
                    || format!("NVLink replays +{replay}, recoveries +{recovery} at {when}"),
                    &mut out,
                );
            }
        }

        // Degraded-level flags.
        if o.retired_pending {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::RETIRED_PENDING,
                || format!("page retirement pending since {when}: reset at next drain"),
                &mut out,
            );
        }
        if o.remap_pending {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::REMAP_PENDING,
                || format!("row remap pending since {when}: reset at next drain"),
                &mut out,
            );
        }

        // Rates of counters, sustained.
        let tr = &mut self.gpus[g];
        let pcie_min = tr.pcie.push(t, o.pcie_replay, 60_000);
        let sbe_min = tr.sbe.push(t, o.sbe_volatile, 60_000);
        let crc_min = tr.crc.push(t, o.nvlink_crc, 60_000);
        let pcie_for = tr
            .pcie_high
            .update(t, pcie_min > p.pcie_replays_per_min, true);
        let sbe_for = tr.sbe_high.update(t, sbe_min > p.sbe_per_min, true);
        let crc_for = tr
            .crc_high
            .update(t, crc_min > p.nvlink_crc_per_s * 60, true);
        if pcie_for.is_some_and(|d| d >= p.pcie_sustain_ms) {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::PCIE_REPLAY_RATE,
                || {
                    format!(
                        "{pcie_min} PCIe replays in the last minute at {when} (limit {}/min)",
                        p.pcie_replays_per_min
                    )
                },
                &mut out,
            );
        }
        if sbe_for.is_some_and(|d| d >= p.sbe_sustain_ms) {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::SBE_RATE_RISING,
                || format!("{sbe_min} corrected ECC errors in the last minute at {when}"),
                &mut out,
            );
        }
        if crc_for.is_some_and(|d| d >= p.nvlink_crc_sustain_ms) {
            self.raise(
                t,
                g,
                HealthState::Degraded,
                ReasonCode::NVLINK_ERRORS,
                || format!("{crc_min} NVLink CRC errors in the last minute at {when}"),
                &mut out,
            );
        }

        self.peer_rules(t, g, o, &mut out);

        // A degraded GPU without fresh evidence for the quiet period heals.
        let tr = &mut self.gpus[g];
        if tr.status.state == HealthState::Degraded
            && t.saturating_sub(tr.last_degrade_evidence) >= p.quiet_ms
        {
            let from = tr.status.state;
            let quiet = if p.quiet_ms >= 3_600_000 {
                format!("{:.1} h", p.quiet_ms as f64 / 3_600_000.0)
            } else {
                format!("{} min", p.quiet_ms / 60_000)
            };
            tr.status = GpuStatus {
                state: HealthState::Healthy,
                reason: ReasonCode::QUIET_PERIOD,
                since: now,
                evidence: fit(format!("no new evidence for {quiet}")),
            };
            out.push(Output::Change(Change {
                time: now,
                gpu,
                from,
                to: HealthState::Healthy,
                reason: ReasonCode::QUIET_PERIOD,
                evidence: tr.status.evidence.clone(),
            }));
        }
        out
    }

    /// The thermal and straggler rules, against the peers.
    fn peer_rules(&mut self, t: u64, g: usize, o: &Observation, out: &mut Vec<Output>) {
        let p = self.policy;
        let fresh = |tr: &Track| {
            tr.last
                .filter(|(lt, _)| t.saturating_sub(*lt) <= p.peer_fresh_ms && tr.missed == 0)
        };
        // The peers, by index, without copying their samples.
        let mut peer_idx = [0usize; loopwarden_protocol::MAX_GPUS];
        let mut n = 0;
        for (i, tr) in self.gpus.iter().enumerate() {
            if i != g && fresh(tr).is_some() && n < peer_idx.len() {
                peer_idx[n] = i;
                n += 1;
            }
        }
        let peer = |k: usize| -> &Observation {
            &self.gpus[peer_idx[k]]
                .last
                .as_ref()
                .expect("fresh peers have a sample")
                .1
        };

        // Is the host hot as a whole, or does the loop report trouble?
        let hot_now = |ob: &Observation| {
            ob.temp >= self.limits.max_operating_c
                || ob.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN)
                || ob.throttle.contains(ThrottleReasons::SW_THERMAL_SLOWDOWN)
        };
        let hot_count = (0..n).filter(|&k| hot_now(peer(k))).count() + usize::from(hot_now(o));
        let all = n + 1;
        let host_hot = all >= 2 && hot_count * 2 > all;
        let loop_trouble = self.coolant.is_some_and(|c| c.state != LoopState::Normal);
        let cooling_explains = loop_trouble || host_hot;

        // Thermal: how much hotter than its peers predict at its power.
        let supply = self.coolant.and_then(|c| c.supply_c);
        let excess = if o.power >= p.hot_min_power_w {
            let mut predicted = Few::new();
            for k in 0..n {
                let q = peer(k);
                match supply {
                    // Peers' thermal resistance, applied to this GPU's power.
                    Some(s) if q.power >= p.hot_min_power_w => {
                        predicted.push(s + (q.temp - s) / q.power * o.power)
                    }
                    // Without the coolant: peers at a similar power.
                    None if (q.power - o.power).abs() <= 0.2 * o.power => predicted.push(q.temp),
                    _ => {}
                }
            }
            if predicted.n >= p.min_peers {
                predicted.median().map(|m| o.temp - m)
            } else {
                None
            }
        } else {
            None
        };
        let is_hot = excess.is_some_and(|e| e >= p.hot_excess_k);
        let is_cool = excess.is_some_and(|e| e < p.hot_clear_k) || o.power < p.hot_min_power_w;

        // Straggler: clocks behind loaded peers, nothing to explain it.
        let explained = o.throttle.contains(ThrottleReasons::SW_POWER_CAP)
            || o.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN)
            || o.throttle.contains(ThrottleReasons::SW_THERMAL_SLOWDOWN)
            || o.throttle.contains(ThrottleReasons::HW_POWER_BRAKE)
            || o.throttle.contains(ThrottleReasons::IDLE)
            || o.temp >= self.limits.max_operating_c
            || (o.power_limit > 0.0 && o.power >= 0.95 * o.power_limit);
        let mut peer_clocks = Few::new();
        for k in 0..n {
            let q = peer(k);
            if q.util >= p.straggler_min_util {
                peer_clocks.push(q.sm_clock);
            }
        }
        let loaded = o.util >= p.straggler_min_util;
        let peer_clock = if peer_clocks.n >= p.min_peers {
            peer_clocks.median()
        } else {
            None
        };
        let slow = loaded
            && !explained
            && peer_clock.is_some_and(|m| o.sm_clock < p.straggler_clock_ratio * m);
        // An explained slow sample ends the streak too: only unexplained
        // slowness, sustained, makes a straggler.
        let not_slow = !loaded || explained || peer_clock.is_some_and(|m| o.sm_clock >= 0.9 * m);

        if cooling_explains {
            // The cooling's fault: no GPU is judged on heat now; say so once.
            let tr = &mut self.gpus[g];
            tr.hot = Streak::default();
            if hot_now(o) || is_hot {
                let bit = 1u16 << g;
                if self.attributed & bit == 0 {
                    self.attributed |= bit;
                    self.unsaid.get_or_insert(t + ATTRIBUTION_SETTLE_MS);
                }
            }
            // Clock loss under thermal trouble is explained too.
            if !slow || hot_now(o) {
                self.gpus[g].straggle = Streak::default();
                self.say_attribution(t, out);
                return;
            }
        } else if !loop_trouble && hot_count == 0 {
            self.attributed = 0;
            self.unsaid = None;
        }
        self.say_attribution(t, out);

        let tr = &mut self.gpus[g];
        if let Some(e) = excess {
            tr.hot_excess = e;
        }
        let hot_for = if cooling_explains {
            None
        } else {
            tr.hot.update(t, is_hot, is_cool)
        };
        let straggle_for = tr.straggle.update(t, slow, not_slow);
        let when = At(TimestampMs(t));
        if hot_for.is_some_and(|d| d >= p.hot_sustain_ms) {
            let e = tr.hot_excess;
            let temp = o.temp;
            let power = o.power;
            self.raise(t, g, HealthState::Degraded, ReasonCode::HOT_FOR_POWER,
                || format!("{temp:.0} C at {power:.0} W, {e:.0} K above its peers, at {when}: check the cold plate"), out);
        }
        if straggle_for.is_some_and(|d| d >= p.straggler_sustain_ms) {
            let clock = o.sm_clock;
            let m = peer_clock.unwrap_or(0.0);
            self.raise(t, g, HealthState::Degraded, ReasonCode::STRAGGLER,
                || format!("SM {clock:.0} MHz vs peers {m:.0} MHz at the same load, no power or thermal cause, at {when}"), out);
        }
    }

    /// Says which GPUs the cooling explains, once the round has settled.
    fn say_attribution(&mut self, t: u64, out: &mut Vec<Output>) {
        if self.unsaid.is_some_and(|due| t >= due) {
            self.unsaid = None;
            out.push(Output::CoolingAttributed {
                time: TimestampMs(t),
                gpus: self.attributed,
                reason: ReasonCode::COOLING_FAULT,
            });
        }
    }

    /// An operator releases a quarantined GPU. `Err` when it is not
    /// quarantined (nothing changes).
    pub fn release(
        &mut self,
        now: TimestampMs,
        gpu: u8,
        operator: &str,
        note: &str,
    ) -> Result<Change, HealthState> {
        let Some(tr) = self.gpus.get_mut(gpu as usize) else {
            return Err(HealthState::Healthy);
        };
        if tr.status.state != HealthState::Quarantined {
            return Err(tr.status.state);
        }
        let evidence = fit(format!(
            "released by {operator} at {}: {note}",
            fmt_time(now)
        ));
        let change = Change {
            time: now,
            gpu,
            from: HealthState::Quarantined,
            to: HealthState::Healthy,
            reason: ReasonCode::OPERATOR_RELEASE,
            evidence: evidence.clone(),
        };
        *tr = Track::new(now);
        tr.status.reason = ReasonCode::OPERATOR_RELEASE;
        tr.status.evidence = evidence;
        Ok(change)
    }
}

//! A small deterministic simulator of an 8-GPU liquid-cooled host, shared by
//! the health engine's tests (`health_traces.rs`, `health_properties.rs`).
//!
//! It follows the GPU model of `docs/plant-model.md` §2 (static and dynamic power,
//! power cap, thermal resistance junction to coolant, one lumped heat
//! capacity, hardware thermal slowdown) at one sample per GPU per second,
//! with noise from a seeded xorshift generator: the same seed gives the same
//! trace, byte for byte. Counters start above zero, as they do since boot.
//! A scenario is a hook called at the start of every tick; it changes the
//! workload, the cooling, the counters or the flags, and sends XIDs.
//!
//! Only IEEE-exact arithmetic (no `exp`, `powf`: their last bit differs
//! between C libraries), so the traces are the same on every platform.
//!
//! The same records run through the engine directly ([`run_engine`]) and,
//! written as `gpu-trace/1` JSON lines ([`Trace::to_jsonl`]), through
//! `node_core::replay::replay` ([`run_replay`]). Expectations ([`Expect`])
//! have the semantics of `node-core/tests/traces/README.md`
//! ("The expectations": `must`/`after_ms`/`by_ms`/`max` per GPU, `*` for
//! the rest) and are checked here by those rules.
//!
//! Glossary:
//! - *tick*: one sampling round of every GPU, once per second.
//! - *hook*: the scenario's code, run at the start of each tick.

#![allow(dead_code)]

use std::fmt::Write as _;

use loopwarden_protocol::{xid, HealthState, ThrottleReasons, TimestampMs};
use node_core::health::{Coolant, HealthEngine, Limits, LoopState, Observation, Output, Policy};
use node_core::replay::verdict_line;

/// GPUs of the simulated host.
pub const GPUS: usize = 8;
/// Sampling period, ms.
pub const PERIOD_MS: u64 = 1_000;
/// Board power limit, W.
pub const TDP_W: f64 = 700.0;
/// Max operating temperature, °C.
pub const MAX_OPERATING_C: f64 = 87.0;
/// Hardware slowdown temperature, °C.
pub const SLOWDOWN_C: f64 = 89.0;
/// The GPU model's limits as the engine takes them.
pub const LIMITS: Limits = Limits {
    max_operating_c: MAX_OPERATING_C,
};
/// Coolant supply in normal operation, °C.
pub const NOMINAL_SUPPLY_C: f64 = 32.0;
/// Flow per GPU in normal operation, L/min.
pub const NOMINAL_FLOW: f64 = 1.45;
/// When the standard job starts, s.
pub const JOB_START_S: u64 = 15;

/// Static power at 50 °C, W.
const P_S0: f64 = 90.0;
/// Leakage growth per K above 50 °C.
const K_LEAK: f64 = 0.015;
/// Junction to cold-plate case, K/W.
const R_JC: f64 = 0.022;
/// Lumped heat capacity, J/K.
const C_J: f64 = 500.0;
/// Supply temperature time constant, s.
const TAU_SUPPLY_S: f64 = 30.0;
/// A full sample (every field) at least this often, ms.
const FULL_EVERY_MS: u64 = 300_000;

// ------------------------------------------------------------------ noise

/// xorshift64*: small, fast, deterministic.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        let mut r = Rng((seed ^ 0x9E37_79B9_7F4A_7C15).max(1));
        for _ in 0..8 {
            r.next_u64();
        }
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// About normal, mean 0, deviation 1 (Irwin-Hall of 4).
    pub fn gauss(&mut self) -> f64 {
        ((0..4).map(|_| self.unit()).sum::<f64>() - 2.0) * 3f64.sqrt()
    }
}

// ---------------------------------------------------------------- records

/// What NVML reports for one GPU: every field of a `gpu-trace/1` sample.
/// Floats are held exactly as the trace text reads back.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    pub temp_c: f64,
    pub mem_temp_c: f64,
    pub power_w: f64,
    pub power_limit_w: f64,
    pub sm_clock_mhz: f64,
    pub mem_clock_mhz: f64,
    pub util_pct: f64,
    pub ecc_sbe_volatile: u64,
    pub ecc_dbe_volatile: u64,
    pub retired_sbe: u64,
    pub retired_dbe: u64,
    pub retired_pending: bool,
    pub remap_correctable: u64,
    pub remap_uncorrectable: u64,
    pub remap_pending: bool,
    pub remap_failure: bool,
    pub pcie_replay: u64,
    pub nvlink_crc: u64,
    pub nvlink_replay: u64,
    pub nvlink_recovery: u64,
    pub throttle: ThrottleReasons,
}

impl Sample {
    /// The engine's view of this sample.
    pub fn observation(&self) -> Observation {
        Observation {
            temp: self.temp_c,
            power: self.power_w,
            power_limit: self.power_limit_w,
            sm_clock: self.sm_clock_mhz,
            util: self.util_pct,
            sbe_volatile: self.ecc_sbe_volatile,
            dbe_volatile: self.ecc_dbe_volatile,
            retired_sbe: self.retired_sbe,
            retired_dbe: self.retired_dbe,
            retired_pending: self.retired_pending,
            remap_pending: self.remap_pending,
            remap_failure: self.remap_failure,
            pcie_replay: self.pcie_replay,
            nvlink_crc: self.nvlink_crc,
            nvlink_replay: self.nvlink_replay,
            nvlink_recovery: self.nvlink_recovery,
            throttle: self.throttle,
            recovery_action: 0,
            nvlink_links: Default::default(),
            unknown: Default::default(),
            // A trace reads every counter at every sample.
            pcie_held: false,
        }
    }
}

/// One record of a trace.
#[derive(Debug, Clone, PartialEq)]
pub enum Rec {
    /// A sample of a GPU.
    Sample { t: u64, gpu: u8, s: Sample },
    /// The GPU did not answer its sample in time.
    Missed { t: u64, gpu: u8 },
    /// A driver XID.
    Xid { t: u64, gpu: u8, code: u16 },
    /// The cooling loop's report.
    Coolant { t: u64, c: Coolant },
}

impl Rec {
    /// The record's time, ms.
    pub fn t(&self) -> u64 {
        match *self {
            Rec::Sample { t, .. } | Rec::Missed { t, .. } | Rec::Xid { t, .. } => t,
            Rec::Coolant { t, .. } => t,
        }
    }
}

/// A generated trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// One line of what happens.
    pub description: String,
    /// GPUs of the host.
    pub gpus: usize,
    /// The sampling period, ms.
    pub period_ms: u64,
    /// The records, in time order.
    pub recs: Vec<Rec>,
}

/// Parses a number the way the replay does, so that both paths see the
/// same value.
fn exact(text: &str) -> f64 {
    serde_json::from_str(text).expect("a number")
}

fn q1(x: f64) -> f64 {
    exact(&format!("{x:.1}"))
}

fn q2(x: f64) -> f64 {
    exact(&format!("{x:.2}"))
}

/// A JSON string literal.
fn js(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn loop_name(s: LoopState) -> &'static str {
    match s {
        LoopState::Normal => "normal",
        LoopState::Degraded => "degraded",
        LoopState::Failsafe => "failsafe",
    }
}

/// The fields of `s` that differ from `prev` (all of them without `prev`),
/// in the order of the expectations' format (`tests/traces/README.md`).
fn sample_fields(s: &Sample, prev: Option<&Sample>) -> String {
    let mut f = String::new();
    macro_rules! field {
        ($name:ident, $fmt:expr) => {
            if prev.is_none_or(|p| p.$name != s.$name) {
                if !f.is_empty() {
                    f.push(',');
                }
                let v = s.$name;
                write!(f, "\"{}\":{}", stringify!($name), $fmt(v)).expect("a string");
            }
        };
    }
    let int = |v: f64| format!("{v:.0}");
    let dec = |v: f64| format!("{v:.1}");
    let num = |v: u64| v.to_string();
    let flag = |v: bool| v.to_string();
    let thr = |v: ThrottleReasons| serde_json::to_string(&v).expect("throttle reasons serialise");
    field!(temp_c, int);
    field!(mem_temp_c, int);
    field!(power_w, dec);
    field!(power_limit_w, int);
    field!(sm_clock_mhz, int);
    field!(mem_clock_mhz, int);
    field!(util_pct, int);
    field!(ecc_sbe_volatile, num);
    field!(ecc_dbe_volatile, num);
    field!(retired_sbe, num);
    field!(retired_dbe, num);
    field!(retired_pending, flag);
    field!(remap_correctable, num);
    field!(remap_uncorrectable, num);
    field!(remap_pending, flag);
    field!(remap_failure, flag);
    field!(pcie_replay, num);
    field!(nvlink_crc, num);
    field!(nvlink_replay, num);
    field!(nvlink_recovery, num);
    field!(throttle, thr);
    f
}

impl Trace {
    /// The trace as an agent sampling every `k` periods would have seen
    /// it: the samples and misses of every `k`-th round, every XID and
    /// cooling report.
    pub fn thinned(&self, k: u64) -> Trace {
        let kept = |t: u64| (t / self.period_ms) % k == 0;
        Trace {
            description: format!(
                "{} (sampled every {} ms)",
                self.description,
                self.period_ms * k
            ),
            gpus: self.gpus,
            period_ms: self.period_ms * k,
            recs: self
                .recs
                .iter()
                .filter(|r| match r {
                    Rec::Sample { t, .. } | Rec::Missed { t, .. } => kept(*t),
                    Rec::Xid { .. } | Rec::Coolant { .. } => true,
                })
                .cloned()
                .collect(),
        }
    }

    /// The trace with each GPU's samples and misses taken `offset(gpu)`
    /// ms later, in time order again: rounds in another order, spread
    /// over part of a period.
    pub fn shifted(&self, offset: impl Fn(u8) -> u64) -> Trace {
        let mut recs: Vec<Rec> = self
            .recs
            .iter()
            .map(|r| match *r {
                Rec::Sample { t, gpu, s } => Rec::Sample {
                    t: t + offset(gpu),
                    gpu,
                    s,
                },
                Rec::Missed { t, gpu } => Rec::Missed {
                    t: t + offset(gpu),
                    gpu,
                },
                ref other => other.clone(),
            })
            .collect();
        recs.sort_by_key(Rec::t);
        Trace {
            description: format!("{} (samples shifted per GPU)", self.description),
            recs,
            ..self.clone()
        }
    }

    /// The trace as `gpu-trace/1` JSON lines: a header, then one record a
    /// line; a sample lists only the fields that changed since that GPU's
    /// last sample, and all of them every 5 minutes.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        writeln!(
            out,
            "{{\"format\":\"gpu-trace/1\",\"host\":\"sim01\",\"gpus\":{},\"model\":\"H200-SXM\",\"period_ms\":{},\
             \"limits\":{{\"tdp_w\":700,\"min_cap_w\":200,\"max_operating_c\":87,\"slowdown_c\":89,\"shutdown_c\":92,\"mem_max_c\":95}},\
             \"description\":{}}}",
            self.gpus,
            self.period_ms,
            js(&self.description)
        )
        .expect("a string");
        let mut last: Vec<Option<(u64, Sample)>> = vec![None; self.gpus];
        let mut missed = vec![false; self.gpus];
        for r in &self.recs {
            match r {
                Rec::Sample { t, gpu, s } => {
                    let g = *gpu as usize;
                    let full_at = last[g]
                        .map(|(full, _)| full)
                        .filter(|full| t - full < FULL_EVERY_MS);
                    let prev = full_at.and(last[g].map(|(_, p)| p));
                    let mut f = sample_fields(s, prev.as_ref());
                    if missed[g] {
                        if !f.is_empty() {
                            f.push(',');
                        }
                        f.push_str("\"responsive\":true");
                        missed[g] = false;
                    }
                    writeln!(out, "{{\"t_ms\":{t},\"gpu\":{gpu},\"sample\":{{{f}}}}}")
                        .expect("a string");
                    last[g] = Some((full_at.unwrap_or(*t), *s));
                }
                Rec::Missed { t, gpu } => {
                    missed[*gpu as usize] = true;
                    writeln!(
                        out,
                        "{{\"t_ms\":{t},\"gpu\":{gpu},\"sample\":{{\"responsive\":false}}}}"
                    )
                    .expect("a string");
                }
                Rec::Xid { t, gpu, code } => {
                    let detail = xid::lookup(*code).map_or("unknown XID", |x| x.mnemonic);
                    writeln!(
                        out,
                        "{{\"t_ms\":{t},\"gpu\":{gpu},\"xid\":{code},\"detail\":{}}}",
                        js(detail)
                    )
                    .expect("a string");
                }
                Rec::Coolant { t, c } => {
                    writeln!(
                        out,
                        "{{\"t_ms\":{t},\"coolant\":{{\"supply_c\":{:.1},\"flow_lpm_per_gpu\":{:.2},\"state\":\"{}\"}}}}",
                        c.supply_c.unwrap_or(f64::NAN),
                        c.flow_lpm_per_gpu.unwrap_or(f64::NAN),
                        loop_name(c.state)
                    )
                    .expect("a string");
                }
            }
        }
        out
    }

    /// The index of the first XID record `code` on `gpu`.
    pub fn xid_index(&self, gpu: u8, code: u16) -> Option<usize> {
        self.recs
            .iter()
            .position(|r| matches!(r, Rec::Xid { gpu: g, code: c, .. } if *g == gpu && *c == code))
    }

    /// Inserts a record after every record of the same or an earlier time;
    /// returns its index.
    pub fn insert(&mut self, r: Rec) -> usize {
        let i = self.recs.partition_point(|x| x.t() <= r.t());
        self.recs.insert(i, r);
        i
    }

    /// The time of the last record.
    pub fn end_ms(&self) -> u64 {
        self.recs.last().map_or(0, Rec::t)
    }
}

// ------------------------------------------------------------- simulation

/// What a GPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Nothing: low clocks, `idle`.
    Idle,
    /// A training job near the power limit.
    Train,
    /// Inference: moderate power, utilisation 55-80 %.
    Infer,
    /// A checkpoint: the job writes, the GPU mostly waits.
    Checkpoint,
}

/// One simulated GPU: its physics, its workload and what NVML reports.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// The workload now.
    pub work: Work,
    /// Training intensity (1: the full power demand).
    pub demand: f64,
    /// The power limit in force, W.
    pub power_limit: f64,
    /// Extra thermal resistance (a bad cold-plate contact), K/W.
    pub r_extra: f64,
    /// This GPU's share of the nominal flow (a starved plate: < 1).
    pub flow_share: f64,
    /// Clocks held at this share, with these reasons reported (a straggler
    /// or a slowed GPU).
    pub slow: Option<(f64, ThrottleReasons)>,
    /// The HBM is over temperature: `hw_thermal_slowdown`, clocks down.
    pub hbm_hot: bool,
    /// This tick's sample is missed (reset after the tick).
    pub miss: bool,
    /// The GPU answers no more (fallen off the bus, hung).
    pub down: bool,
    /// PCIe replays per second.
    pub pcie_per_s: f64,
    /// Corrected ECC errors per second.
    pub sbe_per_s: f64,
    /// NVLink CRC errors per second.
    pub crc_per_s: f64,
    /// This tick's sample reports these reasons and this power instead
    /// (reset after the tick): a flickering flag.
    pub glitch: Option<(ThrottleReasons, f64)>,
    /// What NVML reports; hooks change counters and flags here.
    pub s: Sample,
    /// Junction temperature, °C.
    pub tj: f64,
    latched: bool,
    acc: [f64; 3],
}

/// The host's cooling loop.
#[derive(Debug, Clone)]
pub struct Cooling {
    /// Where the supply temperature goes, °C.
    pub supply_target: f64,
    /// The supply temperature now, °C.
    pub supply: f64,
    /// Flow per GPU, L/min.
    pub flow: f64,
    /// What the loop's controller reports.
    pub state: LoopState,
    /// Whether the controller's reports reach this host (records every
    /// 10 s and on a change of state).
    pub publish: bool,
    published: Option<LoopState>,
}

/// The simulated host, as a hook sees it.
#[derive(Debug)]
pub struct World {
    /// Start of this tick, ms.
    pub t: u64,
    /// Noise.
    pub rng: Rng,
    /// The GPUs.
    pub gpus: Vec<Gpu>,
    /// The loop.
    pub cooling: Cooling,
    recs: Vec<Rec>,
}

impl World {
    /// Seconds since the start.
    pub fn secs(&self) -> u64 {
        self.t / 1000
    }

    /// Whether this tick starts at second `s`.
    pub fn at(&self, s: u64) -> bool {
        self.t == s * 1000
    }

    /// Whether this tick lies in `[from, to)` seconds.
    pub fn during(&self, from: u64, to: u64) -> bool {
        (from * 1000..to * 1000).contains(&self.t)
    }

    /// A driver XID on `gpu` at `t_ms` (absolute, this tick or later).
    pub fn xid(&mut self, gpu: usize, code: u16, t_ms: u64) {
        self.recs.push(Rec::Xid {
            t: t_ms,
            gpu: gpu as u8,
            code,
        });
    }

    /// Every GPU.
    pub fn all(&mut self, mut f: impl FnMut(&mut Gpu)) {
        self.gpus.iter_mut().for_each(&mut f);
    }
}

/// Cold plate, case to coolant, K/W, by flow per GPU in L/min.
fn r_cp(q: f64) -> f64 {
    const PTS: [(f64, f64); 6] = [
        (0.4, 0.0389),
        (0.6, 0.0300),
        (1.0, 0.0245),
        (1.4, 0.0220),
        (2.0, 0.0204),
        (2.4, 0.0197),
    ];
    if q <= PTS[0].0 {
        return PTS[0].1;
    }
    for w in PTS.windows(2) {
        if q <= w[1].0 {
            let f = (q - w[0].0) / (w[1].0 - w[0].0);
            return w[0].1 + f * (w[1].1 - w[0].1);
        }
    }
    PTS[PTS.len() - 1].1
}

fn new_gpu(rng: &mut Rng) -> Gpu {
    let s = Sample {
        power_limit_w: TDP_W,
        mem_clock_mhz: 2619.0,
        // Counters since boot.
        ecc_sbe_volatile: rng.below(4),
        pcie_replay: rng.below(40),
        nvlink_crc: rng.below(120),
        remap_correctable: rng.below(2),
        ..Sample::default()
    };
    Gpu {
        work: Work::Idle,
        demand: 1.0,
        power_limit: TDP_W,
        // Plates differ a little.
        r_extra: rng.range(-0.0015, 0.0015),
        flow_share: 1.0,
        slow: None,
        hbm_hot: false,
        miss: false,
        down: false,
        pcie_per_s: 0.0,
        sbe_per_s: 0.0,
        crc_per_s: 0.0,
        glitch: None,
        s,
        tj: NOMINAL_SUPPLY_C + 3.0,
        latched: false,
        acc: [0.0; 3],
    }
}

/// One second of one GPU; returns what NVML reports.
fn step(g: &mut Gpu, c: &Cooling, rng: &mut Rng) -> Sample {
    let q = c.flow * g.flow_share;
    let r = (R_JC + r_cp(q) + g.r_extra).max(0.01);
    let p_s = P_S0 * (1.0 + K_LEAK * (g.tj - 50.0)).max(0.5);
    let (u, util) = match g.work {
        Work::Idle => (0.0, 0.0),
        Work::Train => (g.demand * rng.range(0.95, 1.0), rng.range(93.0, 100.99)),
        Work::Infer => (rng.range(0.35, 0.55), rng.range(55.0, 80.99)),
        Work::Checkpoint => (rng.range(0.15, 0.25), rng.range(10.0, 30.99)),
    };
    let mut p_d = u * (TDP_W - P_S0);
    let mut clock = 1.0;
    let mut thr = ThrottleReasons::empty();
    if let Some((f, why)) = g.slow {
        p_d *= f * f;
        clock *= f;
        thr = thr | why;
    }
    if g.hbm_hot {
        p_d *= 0.4;
        clock *= 0.63;
        thr = thr | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    }
    if g.tj >= SLOWDOWN_C {
        g.latched = true;
    } else if g.tj < MAX_OPERATING_C {
        g.latched = false;
    }
    let mut limit = g.power_limit;
    if g.latched {
        limit = limit.min(0.5 * TDP_W);
        thr = thr | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    }
    let mut p = p_s + p_d + rng.gauss() * (1.5 + 0.006 * p_d);
    if p > limit {
        let share = ((limit - p_s).max(0.0) / p_d.max(1.0)).min(1.0);
        clock *= share.sqrt();
        // NVML's power is a 1 s average; the cap acts faster.
        p = limit * (1.0 - rng.range(0.0, 0.06));
        if !g.latched {
            thr = thr | ThrottleReasons::SW_POWER_CAP;
        }
    }
    let p = p.max(40.0);
    let sm = if g.work == Work::Idle {
        thr = thr | ThrottleReasons::IDLE;
        345.0
    } else {
        ((1980.0 * clock / 15.0).round() - rng.below(2) as f64) * 15.0
    };
    // Temperature: first order towards the steady state.
    let t_in = c.supply;
    let steady = t_in + p * r;
    // One implicit Euler step of C dT/dt = P - (T - T_in) / R.
    let a = 1.0 / (C_J * r);
    g.tj = (g.tj + a * steady) / (1.0 + a);
    // Counters at their rates, with jitter.
    for (i, rate) in [g.pcie_per_s, g.sbe_per_s, g.crc_per_s]
        .into_iter()
        .enumerate()
    {
        g.acc[i] += rate * rng.range(0.6, 1.4);
    }
    let mut take = |i: usize| {
        let n = g.acc[i].floor();
        g.acc[i] -= n;
        n as u64
    };
    let (dp, ds, dc) = (take(0), take(1), take(2));
    g.s.pcie_replay += dp;
    g.s.ecc_sbe_volatile += ds;
    g.s.nvlink_crc += dc;

    let mut s = g.s;
    s.temp_c = (g.tj + rng.gauss() * 0.3).round();
    s.mem_temp_c = if g.hbm_hot {
        96.0
    } else {
        (t_in + 0.8 * (g.tj - t_in) + rng.gauss() * 0.5).round()
    };
    s.power_w = q1(p);
    s.power_limit_w = g.power_limit.round();
    s.sm_clock_mhz = sm;
    s.util_pct = util.floor();
    s.throttle = thr;
    if let Some((thr, power)) = g.glitch.take() {
        s.throttle = thr;
        s.power_w = q1(power);
    }
    s
}

/// Runs a host for `secs` seconds: the standard plan (idle, then a training
/// job from [`JOB_START_S`] on every GPU, normal loop reported every 10 s),
/// changed by `hook` at the start of every tick.
pub fn simulate(seed: u64, secs: u64, mut hook: impl FnMut(&mut World)) -> Vec<Rec> {
    let mut rng = Rng::new(seed);
    let gpus = (0..GPUS).map(|_| new_gpu(&mut rng)).collect();
    let mut w = World {
        t: 0,
        rng,
        gpus,
        cooling: Cooling {
            supply_target: NOMINAL_SUPPLY_C,
            supply: NOMINAL_SUPPLY_C,
            flow: NOMINAL_FLOW,
            state: LoopState::Normal,
            publish: true,
            published: None,
        },
        recs: Vec::new(),
    };
    for tick in 0..secs {
        w.t = tick * PERIOD_MS;
        if tick == JOB_START_S {
            w.all(|g| g.work = Work::Train);
        }
        hook(&mut w);
        let World {
            t,
            rng,
            gpus,
            cooling,
            recs,
        } = &mut w;
        cooling.supply = cooling.supply_target
            + (cooling.supply - cooling.supply_target) / (1.0 + 1.0 / TAU_SUPPLY_S);
        for (i, g) in gpus.iter_mut().enumerate() {
            let s = step(g, cooling, rng);
            let ts = *t + 2 + 4 * i as u64 + rng.below(3);
            let gpu = i as u8;
            if g.down || g.miss {
                recs.push(Rec::Missed { t: ts, gpu });
            } else {
                recs.push(Rec::Sample { t: ts, gpu, s });
            }
            g.miss = false;
        }
        if cooling.publish && (*t % 10_000 == 0 || cooling.published != Some(cooling.state)) {
            cooling.published = Some(cooling.state);
            recs.push(Rec::Coolant {
                t: *t + 700,
                c: Coolant {
                    supply_c: Some(q1(cooling.supply)),
                    flow_lpm_per_gpu: Some(q2(cooling.flow)),
                    state: cooling.state,
                },
            });
        }
    }
    let mut recs = w.recs;
    recs.sort_by_key(Rec::t);
    recs
}

// ------------------------------------------------------------------ runs

/// A verdict line, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub t: u64,
    pub gpu: u8,
    pub state: HealthState,
    pub reason: String,
    pub evidence: String,
}

/// What a run of the engine said.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// The verdict lines, as `node-agent replay` prints them.
    pub lines: Vec<String>,
    /// The same, read back.
    pub verdicts: Vec<Verdict>,
    /// Cooling attributions: when, which GPUs.
    pub attributions: Vec<(u64, u16)>,
    /// The outputs of each record's call (direct runs only).
    pub per_record: Vec<Vec<Output>>,
}

/// The name of a state in the trace format.
pub fn state_name(s: HealthState) -> &'static str {
    match s {
        HealthState::Healthy => "healthy",
        HealthState::Degraded => "degraded",
        HealthState::Quarantined => "quarantined",
    }
}

/// A state from its name.
pub fn state_from(name: &str) -> HealthState {
    match name {
        "healthy" => HealthState::Healthy,
        "degraded" => HealthState::Degraded,
        "quarantined" => HealthState::Quarantined,
        other => panic!("unknown state {other:?}"),
    }
}

/// Reads a verdict line.
pub fn parse_verdict(line: &str) -> Verdict {
    let v: serde_json::Value = serde_json::from_str(line).expect("a verdict is JSON");
    Verdict {
        t: v["t_ms"].as_u64().expect("t_ms"),
        gpu: v["gpu"].as_u64().expect("gpu") as u8,
        state: state_from(v["state"].as_str().expect("state")),
        reason: v["reason"].as_str().expect("reason").to_string(),
        evidence: v["evidence"].as_str().expect("evidence").to_string(),
    }
}

/// Feeds one record to the engine.
pub fn feed(e: &mut HealthEngine, r: &Rec) -> Vec<Output> {
    match r {
        Rec::Sample { t, gpu, s } => e.sample(TimestampMs(*t), *gpu, &s.observation()),
        Rec::Missed { t, gpu } => e.missed(TimestampMs(*t), *gpu),
        Rec::Xid { t, gpu, code } => e.xid(TimestampMs(*t), *gpu, *code),
        Rec::Coolant { t, c } => e.coolant(TimestampMs(*t), *c),
    }
}

/// The trace through the engine directly, as the replay would run it.
pub fn run_engine(trace: &Trace, policy: Policy) -> Run {
    let mut e = HealthEngine::new(trace.gpus, LIMITS, policy, TimestampMs(0));
    let mut run = Run::default();
    for r in &trace.recs {
        let outs = feed(&mut e, r);
        for o in &outs {
            match o {
                Output::Change(c) => run.lines.push(verdict_line(c)),
                Output::CoolingAttributed { time, gpus, .. } => {
                    run.attributions.push((time.0, *gpus))
                }
                Output::HostStall { .. } | Output::HostStallEnded { .. } => {}
            }
        }
        run.per_record.push(outs);
    }
    run.verdicts = run.lines.iter().map(|l| parse_verdict(l)).collect();
    run
}

/// Replays trace text; returns what it printed on both streams.
pub fn replay_text(text: &str, policy: Policy) -> (Vec<u8>, Vec<u8>) {
    replay_text_scheduled(text, policy, 0)
}

/// As [`replay_text`], the slow counters read every `slow_ms`.
pub fn replay_text_scheduled(text: &str, policy: Policy, slow_ms: u64) -> (Vec<u8>, Vec<u8>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    node_core::replay::replay_scheduled(text.as_bytes(), policy, slow_ms, &mut out, &mut notes)
        .expect("the trace replays");
    (out, notes)
}

/// The trace, written as text, through `node_core::replay::replay`.
pub fn run_replay(trace: &Trace, policy: Policy) -> Run {
    run_replay_scheduled(trace, policy, 0)
}

/// As [`run_replay`], the slow counters read every `slow_ms` as the
/// live agent reads them.
pub fn run_replay_scheduled(trace: &Trace, policy: Policy, slow_ms: u64) -> Run {
    let (out, notes) = replay_text_scheduled(&trace.to_jsonl(), policy, slow_ms);
    let out = String::from_utf8(out).expect("verdicts are UTF-8");
    let notes = String::from_utf8(notes).expect("notes are UTF-8");
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let verdicts = lines.iter().map(|l| parse_verdict(l)).collect();
    // "t=1234 ms: the cooling explains the heat of GPUs 0x0080; ..."
    let attributions = notes
        .lines()
        .filter(|l| l.contains("the cooling explains"))
        .map(|l| {
            let t = l
                .strip_prefix("t=")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("a note with a time: {l:?}"));
            let gpus = l
                .split("0x")
                .nth(1)
                .and_then(|r| u16::from_str_radix(&r[..4.min(r.len())], 16).ok())
                .unwrap_or_else(|| panic!("a note with GPUs: {l:?}"));
            (t, gpus)
        })
        .collect();
    Run {
        lines,
        verdicts,
        attributions,
        per_record: Vec::new(),
    }
}

// ----------------------------------------------------------- expectations

/// One GPU's expectation (`tests/traces/README.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// The state to reach, at or after `after_ms`, no later than `by_ms`.
    pub must: Option<(HealthState, u64, u64)>,
    /// The highest state allowed; default: `must`'s, else healthy.
    pub max: Option<HealthState>,
}

/// What a trace must and may do, per GPU; `*` for the rest.
#[derive(Debug, Clone)]
pub struct Expect {
    gpus: Vec<(u8, Rule)>,
    rest: Rule,
    why: String,
}

impl Expect {
    /// Every GPU healthy, unless said otherwise.
    pub fn new(why: &str) -> Self {
        Self {
            gpus: Vec::new(),
            rest: Rule {
                must: None,
                max: Some(HealthState::Healthy),
            },
            why: why.into(),
        }
    }

    fn rule(&mut self, gpu: u8) -> &mut Rule {
        if let Some(i) = self.gpus.iter().position(|(g, _)| *g == gpu) {
            return &mut self.gpus[i].1;
        }
        self.gpus.push((
            gpu,
            Rule {
                must: None,
                max: None,
            },
        ));
        self.gpus.sort_by_key(|(g, _)| *g);
        let i = self
            .gpus
            .iter()
            .position(|(g, _)| *g == gpu)
            .expect("added");
        &mut self.gpus[i].1
    }

    /// `gpu` must reach `state` in `[after_ms, by_ms]`.
    pub fn must(mut self, gpu: u8, state: HealthState, after_ms: u64, by_ms: u64) -> Self {
        self.rule(gpu).must = Some((state, after_ms, by_ms));
        self
    }

    /// `gpu` may reach `state` at most.
    pub fn max(mut self, gpu: u8, state: HealthState) -> Self {
        self.rule(gpu).max = Some(state);
        self
    }

    /// The GPUs not named may reach `state` at most.
    pub fn rest(mut self, state: HealthState) -> Self {
        self.rest = Rule {
            must: None,
            max: Some(state),
        };
        self
    }

    /// As a `NAME.expect.json` file.
    pub fn to_json(&self) -> String {
        let rule = |r: &Rule| {
            let mut f = Vec::new();
            if let Some((s, a, b)) = r.must {
                f.push(format!(
                    "\"must\":\"{}\",\"after_ms\":{a},\"by_ms\":{b}",
                    state_name(s)
                ));
            }
            if let Some(m) = r.max {
                f.push(format!("\"max\":\"{}\"", state_name(m)));
            }
            format!("{{{}}}", f.join(","))
        };
        let mut s = String::from("{\"gpus\":{\n");
        for (g, r) in &self.gpus {
            writeln!(s, "  \"{g}\":{},", rule(r)).expect("a string");
        }
        writeln!(s, "  \"*\":{}}},", rule(&self.rest)).expect("a string");
        writeln!(s, " \"why\":{}}}", js(&self.why)).expect("a string");
        s
    }

    /// Checks verdicts by the expectations' rules: `Ok` with the detection latency
    /// of every met `must`, or every miss and false alarm.
    pub fn check(&self, gpus: usize, verdicts: &[Verdict]) -> Result<Vec<u64>, Vec<String>> {
        let mut problems = Vec::new();
        let mut latencies = Vec::new();
        for g in 0..gpus as u8 {
            let r = self
                .gpus
                .iter()
                .find(|(x, _)| *x == g)
                .map_or(self.rest, |(_, r)| *r);
            let max = r
                .max
                .or(r.must.map(|(s, _, _)| s))
                .unwrap_or(HealthState::Healthy);
            let mine: Vec<&Verdict> = verdicts.iter().filter(|v| v.gpu == g).collect();
            if let Some(v) = mine.iter().find(|v| v.state > max) {
                problems.push(format!(
                    "false alarm: gpu {g}: {} at {} ms ({}: {}), allowed at most {}",
                    state_name(v.state),
                    v.t,
                    v.reason,
                    v.evidence,
                    state_name(max)
                ));
            }
            if let Some((need, after, by)) = r.must {
                match mine
                    .iter()
                    .find(|v| v.state >= need && (after..=by).contains(&v.t))
                {
                    Some(v) => latencies.push(v.t - after),
                    None => problems.push(format!(
                        "miss: gpu {g}: {} not reached between {after} and {by} ms (verdicts: {:?})",
                        state_name(need),
                        mine
                    )),
                }
            }
        }
        if problems.is_empty() {
            Ok(latencies)
        } else {
            Err(problems)
        }
    }
}

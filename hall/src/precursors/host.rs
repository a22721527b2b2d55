//! A simulated 8-GPU H200 host that writes what its node agent would
//! observe as a `gpu-trace/1` trace (`docs/health.md` section 8).
//!
//! The physics runs every second: a workload of jobs (training near the
//! power limit, checkpoints, idle gaps), each GPU's temperature lagging
//! towards the coolant's supply plus its thermal resistance times its
//! power, and the error counters that the scenarios raise. Samples are
//! written every [`COARSE_MS`], and every second inside the *dense*
//! windows a scenario opens around what happens fast (a failure, missed
//! samples, a sensor spike). The engine's rates and sustains are in
//! milliseconds, not samples, so the thinning moves a flag by at most one
//! coarse period; what counts samples (missed samples, the XIDs) always
//! runs at one second.
//!
//! Glossary:
//! - *round*: the samples of every GPU for one second.
//! - *dense window*: a span sampled every second.
//! - *delta sample*: a sample that leaves out the fields that did not
//!   change (a full one every 5 minutes), as the format allows.

use std::fmt::Write as _;

use rand::rngs::StdRng;
use rand::Rng;

/// The sampling period of the live agent, ms.
pub const PERIOD_MS: u64 = 1_000;
/// The sampling period outside dense windows, ms. The engine judges a
/// GPU against its peers' samples of the same round, however far apart
/// rounds are (`Policy::round_ms`), so coarse rounds lose no peer rule.
pub const COARSE_MS: u64 = 5_000;
/// A full sample (every field) at least this often, ms.
const FULL_EVERY_MS: u64 = 300_000;
/// Coolant reports this often, ms.
const COOLANT_EVERY_MS: u64 = 10_000;
/// GPUs of a host.
pub const GPUS: usize = 8;
/// H200-SXM limits as the trace header gives them.
pub const MAX_OPERATING_C: f64 = 87.0;
/// Hardware thermal slowdown starts here, °C.
pub const SLOWDOWN_C: f64 = 89.0;
/// The GPU shuts itself down here, °C.
pub const SHUTDOWN_C: f64 = 92.0;
/// Board power, W.
pub const TDP_W: f64 = 700.0;

/// Clock-event reasons, one bit each.
pub mod throttle {
    /// No work.
    pub const IDLE: u8 = 1;
    /// At the power limit.
    pub const SW_POWER_CAP: u8 = 2;
    /// Hardware slowdown (power delivery, an external signal).
    pub const HW_SLOWDOWN: u8 = 4;
    /// Hardware thermal slowdown.
    pub const HW_THERMAL: u8 = 8;
    /// The names, in bit order.
    pub const NAMES: [&str; 4] = ["idle", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"];
}

/// What the workload asks of every GPU now.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Train,
    Checkpoint,
    Idle,
}

/// One GPU: what it reads and what a scenario may change.
#[derive(Debug, Clone)]
pub struct Gpu {
    /// Thermal resistance to the coolant, K/W.
    pub r_th: f64,
    /// Die temperature, °C (the lagged physics, before sensor faults).
    pub temp: f64,
    /// Extra heat a fault adds (a thermal interface going bad), K.
    pub extra_k: f64,
    /// What a failing sensor adds to the reading, K.
    pub sensor_k: f64,
    /// Power draw, W.
    pub power: f64,
    /// SM clock, MHz.
    pub clock: f64,
    /// Utilisation, %.
    pub util: f64,
    /// Active clock-event reasons ([`throttle`]).
    pub throttle: u8,
    /// Clock multiplier of a hardware slowdown (1: none).
    pub slow_factor: f64,
    /// This GPU's share of the job's demand (small spread between GPUs).
    pub demand: f64,
    /// Corrected ECC errors, volatile.
    pub sbe: u64,
    /// Uncorrected ECC errors, volatile.
    pub dbe: u64,
    /// Rows remapped for correctable errors.
    pub remap_correctable: u64,
    /// Rows remapped for uncorrectable errors.
    pub remap_uncorrectable: u64,
    /// A remap waits for a reset.
    pub remap_pending: bool,
    /// Remapping failed.
    pub remap_failure: bool,
    /// PCIe replays.
    pub pcie: u64,
    /// NVLink CRC errors.
    pub nvlink_crc: u64,
    /// NVLink replays.
    pub nvlink_replay: u64,
    /// NVLink CRC errors per second, a benign trickle.
    pub crc_per_s: f64,
    /// Gone for good (off the bus, hung): every sample from now is missed.
    pub dead: bool,
    /// Samples still to miss (a slow NVML call), then it answers again.
    pub miss: u32,
    /// What was last written, for delta samples.
    written: Option<Written>,
}

/// The fields of the last sample written.
#[derive(Debug, Clone, PartialEq)]
struct Written {
    at: u64,
    clock: i64,
    throttle: u8,
    limit: i64,
    counters: [u64; 7],
    flags: [bool; 2],
}

impl Gpu {
    fn new(rng: &mut StdRng) -> Self {
        Self {
            r_th: rng.gen_range(0.040..0.048),
            temp: 35.0,
            extra_k: 0.0,
            sensor_k: 0.0,
            power: 80.0,
            clock: 345.0,
            util: 0.0,
            throttle: throttle::IDLE,
            slow_factor: 1.0,
            demand: rng.gen_range(0.97..1.03),
            // Counters run since boot: many start above zero.
            sbe: if rng.gen_bool(0.3) {
                rng.gen_range(1..6)
            } else {
                0
            },
            dbe: 0,
            remap_correctable: if rng.gen_bool(0.1) { 1 } else { 0 },
            remap_uncorrectable: 0,
            remap_pending: false,
            remap_failure: false,
            pcie: rng.gen_range(0..40),
            nvlink_crc: rng.gen_range(0..120),
            nvlink_replay: 0,
            crc_per_s: if rng.gen_bool(0.2) {
                rng.gen_range(0.01..0.5)
            } else {
                0.0
            },
            dead: false,
            miss: 0,
            written: None,
        }
    }
}

/// The simulated host, writing its trace as it runs.
pub struct Host {
    /// Its GPUs.
    pub gpus: Vec<Gpu>,
    /// Coolant supply temperature, °C.
    pub supply_c: f64,
    /// Flow per GPU, L/min.
    pub flow: f64,
    /// The loop's state as the cooling controller reports it.
    pub loop_state: &'static str,
    /// Whether the host hears the cooling controller (coolant records).
    pub coolant_known: bool,
    /// The power limit in force, W.
    pub power_limit: f64,
    /// The job died at this time: the peers hang, then idle.
    pub job_died: Option<u64>,
    /// The randomness of this trace.
    pub rng: StdRng,
    /// Sampled every this many ms outside dense windows ([`COARSE_MS`]).
    pub coarse_ms: u64,
    phase: Phase,
    phase_until: u64,
    job_until: u64,
    job_demand: f64,
    ckpt_every: u64,
    next_ckpt: u64,
    dense: Vec<(u64, u64)>,
    xids: Vec<(u64, usize, u16, &'static str)>,
    out: String,
    records: usize,
    now: u64,
}

impl Host {
    /// A host with `GPUS` GPUs; the trace starts with its header.
    pub fn new(mut rng: StdRng, name: &str, description: &str) -> Self {
        let gpus = (0..GPUS).map(|_| Gpu::new(&mut rng)).collect();
        let supply_c = rng.gen_range(28.0..38.0);
        let coolant_known = rng.gen_bool(0.85);
        let mut out = String::with_capacity(1 << 20);
        let description = serde_json::to_string(description).expect("a string serialises");
        let _ = writeln!(
            out,
            "{{\"format\":\"gpu-trace/1\",\"host\":\"{name}\",\"gpus\":{GPUS},\"model\":\"H200-SXM\",\"period_ms\":{PERIOD_MS},\
             \"limits\":{{\"tdp_w\":{TDP_W},\"min_cap_w\":200,\"max_operating_c\":{MAX_OPERATING_C},\"slowdown_c\":{SLOWDOWN_C},\
             \"shutdown_c\":{SHUTDOWN_C},\"mem_max_c\":95}},\"description\":{description}}}"
        );
        Self {
            gpus,
            supply_c,
            flow: rng.gen_range(1.3..1.6),
            loop_state: "normal",
            coolant_known,
            power_limit: TDP_W,
            job_died: None,
            rng,
            coarse_ms: COARSE_MS,
            phase: Phase::Idle,
            phase_until: 0,
            job_until: 0,
            job_demand: 0.0,
            ckpt_every: 0,
            next_ckpt: 0,
            dense: Vec::new(),
            xids: Vec::new(),
            out,
            records: 0,
            now: 0,
        }
    }

    /// Samples every second from `from` to `to` ms.
    pub fn dense(&mut self, from: u64, to: u64) {
        self.dense.push((from, to));
    }

    /// An XID on `gpu` at `t_ms` (within the current second or later).
    pub fn xid(&mut self, t_ms: u64, gpu: usize, code: u16, detail: &'static str) {
        self.xids.push((t_ms, gpu, code, detail));
    }

    /// The current second, ms.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// A Poisson count of mean `mean` (small means: inversion; large:
    /// a normal approximation).
    pub fn poisson(&mut self, mean: f64) -> u64 {
        poisson(&mut self.rng, mean)
    }

    /// Runs the workload and the physics for the second starting at `t`
    /// (ms, a multiple of [`PERIOD_MS`], rising), then writes what the
    /// agent sees of it.
    pub fn step(&mut self, t: u64) {
        self.now = t;
        self.workload(t);
        for g in 0..self.gpus.len() {
            self.physics(g);
        }
        self.write_second(t);
    }

    /// The trace text and its record count.
    pub fn finish(self) -> (String, usize) {
        (self.out, self.records)
    }

    /// Moves the workload on: jobs with checkpoints, idle gaps between
    /// them; after a job died, its GPUs hang a minute, then idle.
    fn workload(&mut self, t: u64) {
        if let Some(died) = self.job_died {
            if t >= died + 60_000 {
                self.phase = Phase::Idle;
            }
            return;
        }
        if t < self.phase_until {
            return;
        }
        let rng = &mut self.rng;
        match self.phase {
            Phase::Idle => {
                // A new job: its demand (some pinned at the limit), its
                // checkpoint interval and length.
                self.phase = Phase::Train;
                self.job_demand = rng.gen_range(540.0..760.0);
                self.job_until = t + rng.gen_range(2..12) * 3_600_000;
                self.ckpt_every = rng.gen_range(10..60) * 60_000;
                self.next_ckpt = t + self.ckpt_every;
                self.phase_until = self.next_ckpt.min(self.job_until);
            }
            Phase::Train if t >= self.job_until => {
                self.phase = Phase::Idle;
                self.phase_until = t + rng.gen_range(2..30) * 60_000;
            }
            Phase::Train => {
                self.phase = Phase::Checkpoint;
                self.phase_until = t + rng.gen_range(40..120) * 1_000;
            }
            Phase::Checkpoint => {
                self.phase = Phase::Train;
                self.next_ckpt = t + self.ckpt_every;
                self.phase_until = self.next_ckpt.min(self.job_until);
            }
        }
    }

    /// One second of one GPU: what the workload asks, what a fault takes
    /// away, and the temperature lagging towards its target.
    fn physics(&mut self, g: usize) {
        let hang = self.job_died.is_some() && self.phase != Phase::Idle;
        let (phase, limit, supply, demand, flow) = (
            self.phase,
            self.power_limit,
            self.supply_c,
            self.job_demand,
            self.flow.max(0.1),
        );
        let noise: f64 = self.rng.gen_range(-1.0..1.0);
        let crc = {
            let m = self.gpus[g].crc_per_s;
            poisson(&mut self.rng, m)
        };
        let gpu = &mut self.gpus[g];
        gpu.nvlink_crc += crc;
        let mut thr = 0;
        let (util, mut power, mut clock) = match phase {
            _ if hang => (100.0, 110.0 + 10.0 * noise, 1980.0),
            Phase::Train => {
                let want = demand * gpu.demand * (1.0 + 0.03 * noise);
                if want >= limit - 5.0 {
                    thr |= throttle::SW_POWER_CAP;
                    let clock = 1980.0 - (want - limit).min(200.0) * 1.2;
                    (98.0 + noise, limit - 3.0 + 2.0 * noise, clock.round())
                } else {
                    (97.0 + 2.0 * noise, want, 1980.0)
                }
            }
            Phase::Checkpoint => (15.0 + 5.0 * noise, 190.0 + 20.0 * noise, 1980.0),
            Phase::Idle => {
                thr |= throttle::IDLE;
                (0.0, 80.0 + 5.0 * noise, 345.0)
            }
        };
        if gpu.slow_factor < 1.0 && util > 50.0 {
            thr |= throttle::HW_SLOWDOWN;
            thr &= !throttle::SW_POWER_CAP;
            clock = (clock * gpu.slow_factor).round();
            power *= 0.55 + 0.45 * gpu.slow_factor;
        }
        if gpu.temp >= SLOWDOWN_C {
            thr |= throttle::HW_THERMAL;
            thr &= !throttle::SW_POWER_CAP;
            clock = (clock * 0.8).round();
            power *= 0.85;
        }
        // Less flow, a warmer plate for the same power.
        let target = supply + gpu.r_th * power * (1.45 / flow).sqrt() + gpu.extra_k;
        if self.now == 0 {
            gpu.temp = target;
        }
        // First-order lag, about 20 s.
        gpu.temp += (target - gpu.temp) * 0.05;
        gpu.util = util.clamp(0.0, 100.0);
        gpu.power = power;
        gpu.clock = clock;
        gpu.throttle = thr;
    }

    /// Whether second `t` is sampled.
    fn sampled(&self, t: u64) -> bool {
        t % self.coarse_ms.max(PERIOD_MS) == 0 || self.dense.iter().any(|&(a, b)| a <= t && t <= b)
    }

    /// Writes the records of second `t`: the coolant report, the samples
    /// of a sampled second, and the XIDs due, in time order.
    fn write_second(&mut self, t: u64) {
        let sampled = self.sampled(t);
        let mut due: Vec<(u64, usize, u16, &'static str)> = Vec::new();
        self.xids.retain(|x| {
            if x.0 < t + PERIOD_MS {
                due.push(*x);
                false
            } else {
                true
            }
        });
        due.sort_by_key(|x| x.0);
        let mut xi = due.into_iter().peekable();
        if self.coolant_known && t % COOLANT_EVERY_MS == 0 {
            let _ = writeln!(
                self.out,
                "{{\"t_ms\":{t},\"coolant\":{{\"supply_c\":{:.1},\"flow_lpm_per_gpu\":{:.2},\"state\":\"{}\"}}}}",
                self.supply_c, self.flow, self.loop_state
            );
            self.records += 1;
        }
        if sampled {
            for g in 0..self.gpus.len() {
                let at = t + 1 + 3 * g as u64;
                while let Some(x) = xi.next_if(|x| x.0 <= at) {
                    self.write_xid(x);
                }
                self.write_sample(at, g);
            }
        }
        for x in xi {
            self.write_xid(x);
        }
    }

    fn write_xid(&mut self, (t, g, code, detail): (u64, usize, u16, &'static str)) {
        let _ = writeln!(
            self.out,
            "{{\"t_ms\":{t},\"gpu\":{g},\"xid\":{code},\"detail\":\"{detail}\"}}"
        );
        self.records += 1;
    }

    /// One sample of GPU `g` at `at`: missed, full or delta.
    fn write_sample(&mut self, at: u64, g: usize) {
        self.records += 1;
        let limit = self.power_limit;
        let noise: f64 = self.rng.gen_range(-0.6..0.6);
        let gpu = &mut self.gpus[g];
        if gpu.dead || gpu.miss > 0 {
            gpu.miss = gpu.miss.saturating_sub(1);
            let _ = writeln!(
                self.out,
                "{{\"t_ms\":{at},\"gpu\":{g},\"sample\":{{\"responsive\":false}}}}"
            );
            // The next answer is written in full.
            gpu.written = None;
            return;
        }
        let temp = (gpu.temp + gpu.sensor_k + noise).round();
        let now = Written {
            at,
            clock: gpu.clock as i64,
            throttle: gpu.throttle,
            limit: limit as i64,
            counters: [
                gpu.sbe,
                gpu.dbe,
                gpu.remap_correctable,
                gpu.remap_uncorrectable,
                gpu.pcie,
                gpu.nvlink_crc,
                gpu.nvlink_replay,
            ],
            flags: [gpu.remap_pending, gpu.remap_failure],
        };
        let full = gpu
            .written
            .as_ref()
            .is_none_or(|w| at.saturating_sub(w.at) >= FULL_EVERY_MS);
        let o = &mut self.out;
        let _ = write!(
            o,
            "{{\"t_ms\":{at},\"gpu\":{g},\"sample\":{{\"temp_c\":{temp},\"power_w\":{:.1},\"util_pct\":{:.0}",
            gpu.power, gpu.util
        );
        let w = if full { None } else { gpu.written.as_ref() };
        if w.is_none_or(|w| w.limit != now.limit) {
            let _ = write!(o, ",\"power_limit_w\":{}", now.limit);
        }
        if w.is_none_or(|w| w.clock != now.clock) {
            let _ = write!(o, ",\"sm_clock_mhz\":{}", now.clock);
        }
        const NAMES: [&str; 7] = [
            "ecc_sbe_volatile",
            "ecc_dbe_volatile",
            "remap_correctable",
            "remap_uncorrectable",
            "pcie_replay",
            "nvlink_crc",
            "nvlink_replay",
        ];
        for (i, name) in NAMES.iter().enumerate() {
            if w.is_none_or(|w| w.counters[i] != now.counters[i]) {
                let _ = write!(o, ",\"{name}\":{}", now.counters[i]);
            }
        }
        if full {
            let _ = write!(
                o,
                ",\"retired_sbe\":0,\"retired_dbe\":0,\"retired_pending\":false,\"nvlink_recovery\":0,\"responsive\":true"
            );
        }
        for (i, name) in ["remap_pending", "remap_failure"].iter().enumerate() {
            if w.is_none_or(|w| w.flags[i] != now.flags[i]) {
                let _ = write!(o, ",\"{name}\":{}", now.flags[i]);
            }
        }
        if w.is_none_or(|w| w.throttle != now.throttle) {
            let names: Vec<String> = throttle::NAMES
                .iter()
                .enumerate()
                .filter(|(i, _)| now.throttle & (1 << i) != 0)
                .map(|(_, n)| format!("\"{n}\""))
                .collect();
            let _ = write!(o, ",\"throttle\":[{}]", names.join(","));
        }
        let _ = writeln!(o, "}}}}");
        if full {
            gpu.written = Some(now);
        } else if let Some(w) = gpu.written.as_mut() {
            let at_full = w.at;
            *w = now;
            w.at = at_full;
        }
    }
}

/// A Poisson count of mean `mean`.
pub fn poisson(rng: &mut StdRng, mean: f64) -> u64 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 30.0 {
        // Normal approximation (Box-Muller).
        let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
        let u2: f64 = rng.gen();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        return (mean + z * mean.sqrt()).round().max(0.0) as u64;
    }
    let l = (-mean).exp();
    let mut k = 0;
    let mut p: f64 = rng.gen();
    while p > l {
        k += 1;
        p *= rng.gen::<f64>();
    }
    k
}

//! What happens on a generated host: one GPU's failure of a class, with
//! or without a precursor ([`Mechanism`]), and the benign events of a
//! normal day on every host ([`Benign`]).
//!
//! Each class is a fixed mix of mechanisms ([`MIXES`]): the share with a
//! precursor and the share that strikes without warning. The mix is an
//! assumption (`docs/goodput-precursors.md` says where each comes from);
//! the parameters of each failure (when the precursor starts, how fast it
//! grows, how noisy it is) are drawn from the trace's seed.
//!
//! Glossary:
//! - *onset*: when the precursor starts (the first sign a host could
//!   see); `None` for an abrupt failure.
//! - *failure*: when the job is interrupted (the fatal XID, the hang).
//! - *onset lead*: failure minus onset, drawn; the engine's lead is
//!   failure minus its first flag, measured.

use rand::Rng;

use super::host::{Host, PERIOD_MS, SHUTDOWN_C};

/// Onset leads are drawn log-uniformly from this, ms, to the run's
/// longest (`Size::max_onset_lead_h`).
pub const MIN_ONSET_LEAD_MS: f64 = 2.0 * 60_000.0;

/// How one failure comes about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mechanism {
    /// HBM: corrected errors accelerate (rate from `r0` to `r_end` per
    /// minute, exponentially), then an uncorrectable error (XID 48, the
    /// volatile DBE count +1, XID 63 and a pending remap).
    SbeStorm {
        /// Corrected errors per minute at the onset.
        r0: f64,
        /// Per minute at the failure.
        r_end: f64,
    },
    /// HBM: a row remapped for correctable errors waits for a reset (XID
    /// 63, `remap_pending`), then an uncontained error (XID 95) or a
    /// failed remap (XID 64, `remap_failure`).
    RemapPending {
        /// The failure is XID 64 (else XID 95).
        remap_fails: bool,
    },
    /// HBM without warning: XID 48 (with the DBE count), or XID 95.
    AbruptHbm {
        /// XID 48 or 95.
        xid: u16,
    },
    /// SRAM: corrected SRAM errors (in the volatile corrected count) rise
    /// linearly to `r_end` per minute, then an uncontained error (XID 95).
    SramCorrected {
        /// Per minute at the failure.
        r_end: f64,
    },
    /// SRAM without warning: XID 95 or 140, with the DBE count.
    AbruptSram {
        /// XID 95 or 140.
        xid: u16,
    },
    /// The PCIe link degrades: replays at `per_min` on average, in
    /// bursts, then the GPU falls off the bus (XID 79).
    PcieReplays {
        /// Mean replays per minute.
        per_min: f64,
    },
    /// Power delivery fails: clocks at `factor` of its peers with
    /// `hw_slowdown` only, then XID 79 or 62.
    Straggler {
        /// Clock ratio.
        factor: f64,
        /// The fatal XID.
        xid: u16,
    },
    /// An NVLink degrades: replays (`per_min` after the first), then XID 74.
    NvlinkReplays {
        /// Replays per minute.
        per_min: f64,
    },
    /// A GPU fault without warning: `Some(xid)` (79, 62, 46, 109), or
    /// `None`: NVML stops answering for it with no XID (a hang).
    AbruptGpu {
        /// The XID, if any.
        xid: Option<u16>,
    },
    /// GSP: NVML calls for the GPU miss their deadline now and then (1-2
    /// samples, every `every_min` on average), then XID 119.
    GspSlow {
        /// Mean minutes between slow calls.
        every_min: f64,
    },
    /// GSP without warning: XID 119 or 120, then no answers.
    AbruptGsp {
        /// XID 119 or 120.
        xid: u16,
    },
    /// The thermal interface degrades: its excess over its peers grows
    /// linearly until it shuts down (XID 79 at the shutdown).
    TimDegrading,
    /// The temperature sensor glitches: spikes of 20-35 K for 1-3 s every
    /// `every_min` on average, until a spike shuts the GPU down.
    SensorGlitch {
        /// Mean minutes between spikes.
        every_min: f64,
    },
    /// The cold plate loses contact at once: the GPU heats to shutdown in
    /// `ramp_s` seconds (the onset is the start of the ramp).
    PlateLoss {
        /// Seconds from contact lost to shutdown.
        ramp_s: f64,
    },
}

impl Mechanism {
    /// A short stable name.
    pub fn name(&self) -> &'static str {
        match self {
            Mechanism::SbeStorm { .. } => "sbe-storm",
            Mechanism::RemapPending { .. } => "remap-pending",
            Mechanism::AbruptHbm { .. } => "abrupt-hbm",
            Mechanism::SramCorrected { .. } => "sram-corrected",
            Mechanism::AbruptSram { .. } => "abrupt-sram",
            Mechanism::PcieReplays { .. } => "pcie-replays",
            Mechanism::Straggler { .. } => "straggler",
            Mechanism::NvlinkReplays { .. } => "nvlink-replays",
            Mechanism::AbruptGpu { xid: Some(_) } => "abrupt-xid",
            Mechanism::AbruptGpu { xid: None } => "abrupt-hang",
            Mechanism::GspSlow { .. } => "gsp-slow-calls",
            Mechanism::AbruptGsp { .. } => "abrupt-gsp",
            Mechanism::TimDegrading => "tim-degrading",
            Mechanism::SensorGlitch { .. } => "sensor-glitch",
            Mechanism::PlateLoss { .. } => "plate-loss",
        }
    }

    /// Whether it is a hang (the job blocks in its collective rather than
    /// crashing, so the agent's detection is what can stop it sooner): a
    /// GPU that stops answering without an XID, and the GSP's timeouts
    /// (XID 119 or 120). The job model goes by class, not by this: it
    /// plays `gsp` as a hang and `faulty_gpu`, hangs without an XID
    /// included, as a crash (`precursors::detection`).
    pub fn is_hang(&self) -> bool {
        matches!(
            self,
            Mechanism::AbruptGpu { xid: None }
                | Mechanism::GspSlow { .. }
                | Mechanism::AbruptGsp { .. }
        )
    }

    /// Whether it shows a sign before the failure (the onset).
    pub fn has_precursor(&self) -> bool {
        !matches!(
            self,
            Mechanism::AbruptHbm { .. }
                | Mechanism::AbruptSram { .. }
                | Mechanism::AbruptGpu { .. }
                | Mechanism::AbruptGsp { .. }
        )
    }
}

/// The kinds of mechanism of a class, with their shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`Mechanism::SbeStorm`].
    SbeStorm,
    /// [`Mechanism::RemapPending`].
    RemapPending,
    /// [`Mechanism::AbruptHbm`].
    AbruptHbm,
    /// [`Mechanism::SramCorrected`].
    SramCorrected,
    /// [`Mechanism::AbruptSram`].
    AbruptSram,
    /// [`Mechanism::PcieReplays`].
    PcieReplays,
    /// [`Mechanism::Straggler`].
    Straggler,
    /// [`Mechanism::NvlinkReplays`].
    NvlinkReplays,
    /// [`Mechanism::AbruptGpu`] with an XID.
    AbruptXid,
    /// [`Mechanism::AbruptGpu`] without one.
    AbruptHang,
    /// [`Mechanism::GspSlow`].
    GspSlow,
    /// [`Mechanism::AbruptGsp`].
    AbruptGsp,
    /// [`Mechanism::TimDegrading`].
    TimDegrading,
    /// [`Mechanism::SensorGlitch`].
    SensorGlitch,
    /// [`Mechanism::PlateLoss`].
    PlateLoss,
}

/// Each host-visible class (Llama 3's names) and its mix of mechanisms.
/// The shares of each class sum to 1.
pub const MIXES: &[(&str, &[(Kind, f64)])] = &[
    (
        "faulty_gpu",
        &[
            (Kind::PcieReplays, 0.20),
            (Kind::Straggler, 0.10),
            (Kind::NvlinkReplays, 0.10),
            (Kind::AbruptXid, 0.40),
            (Kind::AbruptHang, 0.20),
        ],
    ),
    (
        "hbm3",
        &[
            (Kind::SbeStorm, 0.25),
            (Kind::RemapPending, 0.15),
            (Kind::AbruptHbm, 0.60),
        ],
    ),
    (
        "gpu_sram",
        &[(Kind::SramCorrected, 0.40), (Kind::AbruptSram, 0.60)],
    ),
    ("gsp", &[(Kind::GspSlow, 0.20), (Kind::AbruptGsp, 0.80)]),
    (
        "thermal",
        &[
            (Kind::TimDegrading, 0.50),
            (Kind::SensorGlitch, 0.20),
            (Kind::PlateLoss, 0.30),
        ],
    ),
];

/// The kind of trace `i` of `n` of a class: the mix applied exactly
/// (stratified), so a small `n` still has every kind in its share.
pub fn kind_of(mix: &[(Kind, f64)], i: usize, n: usize) -> Kind {
    let x = (i as f64 + 0.5) / n as f64;
    let mut acc = 0.0;
    for &(k, share) in mix {
        acc += share;
        if x < acc {
            return k;
        }
    }
    mix.last().expect("a class has a mechanism").0
}

/// Log-uniform in `[a, b)`.
pub fn log_uniform(rng: &mut impl Rng, a: f64, b: f64) -> f64 {
    (a.ln() + rng.gen::<f64>() * (b.ln() - a.ln())).exp()
}

/// Draws a mechanism of `kind`.
pub fn draw(kind: Kind, rng: &mut impl Rng) -> Mechanism {
    let pick = |rng: &mut dyn rand::RngCore, xs: &[u16]| xs[rng.gen_range(0..xs.len())];
    match kind {
        Kind::SbeStorm => Mechanism::SbeStorm {
            r0: log_uniform(rng, 0.2, 3.0),
            r_end: log_uniform(rng, 20.0, 3000.0),
        },
        Kind::RemapPending => Mechanism::RemapPending {
            remap_fails: rng.gen_bool(0.5),
        },
        Kind::AbruptHbm => Mechanism::AbruptHbm {
            xid: pick(rng, &[48, 95]),
        },
        Kind::SramCorrected => Mechanism::SramCorrected {
            r_end: log_uniform(rng, 3.0, 800.0),
        },
        Kind::AbruptSram => Mechanism::AbruptSram {
            xid: pick(rng, &[95, 140]),
        },
        Kind::PcieReplays => Mechanism::PcieReplays {
            per_min: log_uniform(rng, 2.0, 60.0),
        },
        Kind::Straggler => Mechanism::Straggler {
            factor: rng.gen_range(0.55..0.78),
            xid: pick(rng, &[79, 62]),
        },
        Kind::NvlinkReplays => Mechanism::NvlinkReplays {
            per_min: log_uniform(rng, 0.05, 2.0),
        },
        // 79 most often, then 62; 46 and 109 less.
        Kind::AbruptXid => Mechanism::AbruptGpu {
            xid: Some(pick(rng, &[79, 79, 79, 79, 62, 62, 46, 109])),
        },
        Kind::AbruptHang => Mechanism::AbruptGpu { xid: None },
        Kind::GspSlow => Mechanism::GspSlow {
            every_min: log_uniform(rng, 5.0, 30.0),
        },
        Kind::AbruptGsp => Mechanism::AbruptGsp {
            xid: pick(rng, &[119, 119, 119, 119, 119, 119, 119, 120, 120, 120]),
        },
        Kind::TimDegrading => Mechanism::TimDegrading,
        Kind::SensorGlitch => Mechanism::SensorGlitch {
            every_min: log_uniform(rng, 3.0, 30.0),
        },
        Kind::PlateLoss => Mechanism::PlateLoss {
            ramp_s: rng.gen_range(20.0..60.0),
        },
    }
}

/// The words the driver writes with an XID.
pub fn detail(xid: u16) -> &'static str {
    match xid {
        13 => "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
        31 => "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2c_3a000000",
        43 => "Ch 00000010",
        45 => "Ch 00000010",
        46 => "GPU stopped processing",
        48 => "An uncorrectable double bit error (DBE) has been detected on GPU",
        62 => "PMU halt error",
        63 => "Row Remapper: New row marked for remapping, reset gpu to activate",
        64 => "Row Remapper: Failed to mark a row for remapping",
        68 => "NVDEC0 Exception: Error 0x2",
        74 => "NVLink: fatal error detected on link 2",
        79 => "GPU has fallen off the bus",
        94 => "Contained: SM (0x1). RST: No, D-RST: No",
        95 => "Uncontained: FBHUB. RST: Yes, D-RST: No",
        109 => "Context switch timeout",
        119 => "Timeout after 6s of waiting for RPC response from GPU0 GSP",
        120 => "GSP Error: Task 1 raised error code 0x5",
        140 => "An uncorrectable ECC error escaped the row remapper",
        _ => "",
    }
}

/// One failure on one host: the truth the replay is scored against.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// Its class (`hbm3`, …).
    pub class: &'static str,
    /// How it comes about.
    pub mechanism: Mechanism,
    /// The failing GPU.
    pub gpu: usize,
    /// When the precursor starts, ms (`None`: abrupt).
    pub onset_ms: Option<u64>,
    /// When the job is interrupted, ms.
    pub failure_ms: u64,
    /// When a careful operator expects the quarantine: from, to (ms).
    pub quarantine_window: (u64, u64),
}

/// What a failure needs to remember while it runs.
#[derive(Debug, Default)]
pub struct Running {
    /// Current burst factor of PCIe replays, and until when.
    burst: (f64, u64),
    /// The next glitch, slow call or the like, ms.
    next_event: u64,
    /// The temperature spike ends here, ms.
    spike_until: u64,
    /// The first NVLink replay is written.
    first_done: bool,
}

impl Failure {
    /// The second (ms) of the failure.
    fn fail_second(&self) -> u64 {
        self.failure_ms / PERIOD_MS * PERIOD_MS
    }

    /// Whether the GPU stops answering after the failure.
    fn goes_silent(&self) -> bool {
        match self.mechanism {
            Mechanism::AbruptGpu { xid } => xid != Some(109),
            Mechanism::PcieReplays { .. }
            | Mechanism::Straggler { .. }
            | Mechanism::GspSlow { .. }
            | Mechanism::AbruptGsp { .. }
            | Mechanism::TimDegrading
            | Mechanism::SensorGlitch { .. }
            | Mechanism::PlateLoss { .. } => true,
            _ => false,
        }
    }

    /// The fatal XID(s) at the failure (with a follow-on 63 where the
    /// driver records a remap).
    fn fatal_xids(&self) -> Vec<u16> {
        match self.mechanism {
            Mechanism::SbeStorm { .. } => vec![48, 63],
            Mechanism::RemapPending { remap_fails } => vec![if remap_fails { 64 } else { 95 }],
            Mechanism::AbruptHbm { xid } => {
                if xid == 48 {
                    vec![48, 63]
                } else {
                    vec![xid]
                }
            }
            Mechanism::SramCorrected { .. } => vec![95],
            Mechanism::AbruptSram { xid } => vec![xid],
            Mechanism::PcieReplays { .. }
            | Mechanism::TimDegrading
            | Mechanism::SensorGlitch { .. }
            | Mechanism::PlateLoss { .. } => vec![79],
            Mechanism::Straggler { xid, .. } => vec![xid],
            Mechanism::NvlinkReplays { .. } => vec![74],
            Mechanism::AbruptGpu { xid } => xid.into_iter().collect(),
            Mechanism::GspSlow { .. } => vec![119],
            Mechanism::AbruptGsp { xid } => vec![xid],
        }
    }

    /// Whether the failure raises the volatile uncorrectable count.
    fn raises_dbe(&self) -> bool {
        matches!(
            self.mechanism,
            Mechanism::SbeStorm { .. }
                | Mechanism::AbruptHbm { .. }
                | Mechanism::SramCorrected { .. }
                | Mechanism::AbruptSram { .. }
        ) || self.mechanism == Mechanism::RemapPending { remap_fails: false }
    }

    /// Where the careful operator's quarantine window opens and closes
    /// (the semantics of the repository's expectation files): a fatal XID
    /// from the event to + 1 s; a hang without XID from its first miss to
    /// the third miss + 3 periods.
    pub fn window(mechanism: Mechanism, gpu: usize, failure_ms: u64) -> (u64, u64) {
        let second = failure_ms / PERIOD_MS * PERIOD_MS;
        if mechanism == (Mechanism::AbruptGpu { xid: None }) {
            let first_miss = second + PERIOD_MS + 1 + 3 * gpu as u64;
            (first_miss, first_miss + 5 * PERIOD_MS)
        } else {
            (failure_ms, failure_ms + PERIOD_MS)
        }
    }

    /// The failure's doing in the second starting at `t`: the precursor
    /// between onset and failure, the failure itself, and what follows.
    pub fn apply(&self, host: &mut Host, run: &mut Running, t: u64) {
        let g = self.gpu;
        let fail = self.failure_ms;
        let second = self.fail_second();
        if let Some(onset) = self.onset_ms {
            if t >= onset && t < second {
                let frac = (t - onset) as f64 / (fail - onset).max(1) as f64;
                self.precursor(host, run, t, frac);
            }
        }
        if t == second {
            for (i, x) in self.fatal_xids().into_iter().enumerate() {
                host.xid(fail + 40 * i as u64, g, x, detail(x));
            }
            host.job_died = Some(fail);
            if self.mechanism == (Mechanism::RemapPending { remap_fails: true }) {
                host.gpus[g].remap_failure = true;
            }
        }
        if t == second + PERIOD_MS {
            let gpu = &mut host.gpus[g];
            if self.raises_dbe() {
                gpu.dbe += 1;
            }
            if self.fatal_xids().contains(&63) {
                gpu.remap_uncorrectable += 1;
                gpu.remap_pending = true;
            }
            if self.goes_silent() {
                gpu.dead = true;
            }
        }
    }

    /// The precursor's doing in second `t`, `frac` of the way from the
    /// onset to the failure.
    fn precursor(&self, host: &mut Host, run: &mut Running, t: u64, frac: f64) {
        let g = self.gpu;
        match self.mechanism {
            Mechanism::SbeStorm { r0, r_end } => {
                let per_min = r0 * (r_end / r0).powf(frac);
                let n = host.poisson(per_min / 60.0);
                host.gpus[g].sbe += n;
            }
            Mechanism::RemapPending { .. } => {
                let onset = self.onset_ms.expect("a precursor has an onset");
                if t == onset {
                    // The correctable errors that made the remapper act,
                    // then its XID; the flag is read with the next sample.
                    host.gpus[g].sbe += host.rng.gen_range(1..4);
                    host.xid(t + 400, g, 63, detail(63));
                } else if t == onset + PERIOD_MS {
                    host.gpus[g].remap_correctable += 1;
                    host.gpus[g].remap_pending = true;
                }
            }
            Mechanism::SramCorrected { r_end } => {
                let n = host.poisson(r_end * frac / 60.0);
                host.gpus[g].sbe += n;
            }
            Mechanism::PcieReplays { per_min } => {
                if t >= run.burst.1 {
                    // Minutes of bursts and lulls, the mean kept.
                    let burst = host.rng.gen_bool(0.5);
                    run.burst = (
                        if burst { 1.8 } else { 0.2 },
                        t + host.rng.gen_range(30..180) * 1_000,
                    );
                }
                let n = host.poisson(per_min * run.burst.0 / 60.0);
                host.gpus[g].pcie += n;
            }
            Mechanism::Straggler { factor, .. } => {
                host.gpus[g].slow_factor = factor;
            }
            Mechanism::NvlinkReplays { per_min } => {
                let n = if run.first_done {
                    host.poisson(per_min / 60.0)
                } else {
                    run.first_done = true;
                    host.dense(t, t + 60_000);
                    1
                };
                host.gpus[g].nvlink_replay += n;
            }
            Mechanism::GspSlow { every_min } => {
                if run.next_event == 0 {
                    run.next_event = t;
                }
                if t >= run.next_event {
                    // A silence already running (a benign episode) runs
                    // to the later end, never shortened.
                    let n = host.rng.gen_range(1..3);
                    host.gpus[g].miss = host.gpus[g].miss.max(n);
                    host.dense(t, t + 10_000);
                    let gap = exp_ms(host, every_min);
                    run.next_event = t + gap.max(10_000);
                }
            }
            Mechanism::TimDegrading => {
                // Enough excess at full power to reach the shutdown by the
                // failure.
                let full = host.supply_c + host.gpus[g].r_th * 680.0;
                host.gpus[g].extra_k = (SHUTDOWN_C + 3.0 - full).max(15.0) * frac;
            }
            Mechanism::SensorGlitch { every_min } => {
                if run.next_event == 0 {
                    run.next_event = t;
                }
                if t >= run.next_event {
                    host.gpus[g].sensor_k = host.rng.gen_range(20.0..35.0);
                    run.spike_until = t + host.rng.gen_range(1..4) * PERIOD_MS;
                    host.dense(t.saturating_sub(2_000), t + 10_000);
                    run.next_event = t + exp_ms(host, every_min).max(10_000);
                } else if t >= run.spike_until {
                    host.gpus[g].sensor_k = 0.0;
                }
            }
            Mechanism::PlateLoss { .. } => {
                let full = host.supply_c + host.gpus[g].r_th * 680.0;
                // The plate's contact is gone: the heat rises as fast as
                // the die's lag allows, towards far past the shutdown.
                host.gpus[g].extra_k = (SHUTDOWN_C + 40.0 - full) * frac.sqrt();
            }
            Mechanism::AbruptHbm { .. }
            | Mechanism::AbruptSram { .. }
            | Mechanism::AbruptGpu { .. }
            | Mechanism::AbruptGsp { .. } => {}
        }
    }
}

/// An exponential gap of mean `mean_min` minutes, ms.
fn exp_ms(host: &mut Host, mean_min: f64) -> u64 {
    let u: f64 = host.rng.gen_range(f64::EPSILON..1.0);
    (-u.ln() * mean_min * 60_000.0) as u64 / PERIOD_MS * PERIOD_MS
}

/// The benign events of a normal day, drawn for a trace of `secs`
/// seconds: what a careful operator does not take a GPU out for.
#[derive(Debug, Default)]
pub struct Benign {
    /// (ms, what) in time order.
    events: Vec<(u64, Event)>,
    next: usize,
    /// Until when the power limit is lowered, ms.
    cap_until: Option<u64>,
    /// Until when the loop is degraded, and the supply and flow before.
    trouble_until: Option<(u64, f64, f64)>,
}

/// One benign event.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// A few corrected ECC errors on a GPU.
    Sbe(usize, u64),
    /// A blip of PCIe replays.
    PcieBlip(usize, u64),
    /// A GPU misses 1 or 2 samples (independent of other such runs: two
    /// can adjoin into a longer silence).
    Missed(usize, u32),
    /// Every GPU misses 3-6 rounds: the driver or host stalls.
    Stall(u32),
    /// A bad job: XID 13 on every GPU within milliseconds, then XID 43.
    BadJob,
    /// An MMU fault on one GPU (XID 31), the other ranks stopped (XID 45).
    MmuFault(usize),
    /// A contained error (XID 94) or a decoder error (68) on one GPU.
    Contained(usize, u16),
    /// The operator lowers the power limit to 600 W for a while, ms.
    PowerCap(u64),
    /// The loop runs short (flow down, supply up) for a while, ms.
    LoopTrouble(u64),
}

/// Rates of the benign events per GPU-day (GPU events) or per host-day.
/// Generous rather than typical: the false-alarm bound is conservative.
pub mod rates {
    /// Scattered corrected ECC errors, per GPU-day.
    pub const SBE: f64 = 2.0;
    /// PCIe replay blips, per GPU-day.
    pub const PCIE_BLIP: f64 = 1.0;
    /// One or two missed samples, per GPU-day.
    pub const MISSED: f64 = 1.0;
    /// Driver or host stalls, per host-day.
    pub const STALL: f64 = 0.3;
    /// Application XIDs (bad jobs, MMU faults, contained errors), per
    /// host-day.
    pub const APP_XIDS: f64 = 3.0;
    /// Lowered power limits, per host-day.
    pub const POWER_CAP: f64 = 0.3;
    /// Loop trouble episodes (hosts that hear the cooling controller),
    /// per host-day.
    pub const LOOP_TROUBLE: f64 = 0.5;
}

impl Benign {
    /// Draws the events of `secs` seconds on `gpus` GPUs; `cooling`:
    /// loop trouble episodes too.
    pub fn draw(host: &mut Host, gpus: usize, secs: u64, cooling: bool) -> Self {
        let days = secs as f64 / 86_400.0;
        let mut events = Vec::new();
        let rng = &mut host.rng;
        let at = |rng: &mut rand::rngs::StdRng| rng.gen_range(60..secs.max(61)) * 1_000;
        for g in 0..gpus {
            for _ in 0..super::host::poisson(rng, rates::SBE * days) {
                let n = rng.gen_range(1..3);
                events.push((at(rng), Event::Sbe(g, n)));
            }
            for _ in 0..super::host::poisson(rng, rates::PCIE_BLIP * days) {
                let n = rng.gen_range(1..5);
                events.push((at(rng), Event::PcieBlip(g, n)));
            }
            for _ in 0..super::host::poisson(rng, rates::MISSED * days) {
                let n = rng.gen_range(1..3);
                events.push((at(rng), Event::Missed(g, n)));
            }
        }
        for _ in 0..super::host::poisson(rng, rates::STALL * days) {
            let n = rng.gen_range(3..7);
            events.push((at(rng), Event::Stall(n)));
        }
        for _ in 0..super::host::poisson(rng, rates::APP_XIDS * days) {
            let e = match rng.gen_range(0..4) {
                0 => Event::BadJob,
                1 => Event::MmuFault(rng.gen_range(0..gpus)),
                2 => Event::Contained(rng.gen_range(0..gpus), 94),
                _ => Event::Contained(rng.gen_range(0..gpus), 68),
            };
            events.push((at(rng), e));
        }
        for _ in 0..super::host::poisson(rng, rates::POWER_CAP * days) {
            let len = rng.gen_range(10..60) * 60_000;
            events.push((at(rng), Event::PowerCap(len)));
        }
        if cooling && host.coolant_known {
            for _ in 0..super::host::poisson(rng, rates::LOOP_TROUBLE * days) {
                let len = rng.gen_range(5..20) * 60_000;
                events.push((at(rng), Event::LoopTrouble(len)));
            }
        }
        events.sort_by_key(|e| e.0);
        Self {
            events,
            ..Self::default()
        }
    }

    /// Applies what is due in the second starting at `t`.
    pub fn apply(&mut self, host: &mut Host, t: u64) {
        if self.cap_until.is_some_and(|u| t >= u) {
            self.cap_until = None;
            host.power_limit = super::host::TDP_W;
        }
        if let Some((until, supply, flow)) = self.trouble_until {
            if t >= until {
                self.trouble_until = None;
                host.supply_c = supply;
                host.flow = flow;
                host.loop_state = "normal";
            }
        }
        while let Some(&(at, e)) = self.events.get(self.next) {
            if at > t {
                break;
            }
            self.next += 1;
            self.event(host, t, e);
        }
    }

    fn event(&mut self, host: &mut Host, t: u64, e: Event) {
        let live = |host: &Host, g: usize| !host.gpus[g].dead;
        match e {
            Event::Sbe(g, n) => host.gpus[g].sbe += n,
            Event::PcieBlip(g, n) => host.gpus[g].pcie += n,
            Event::Missed(g, n) => {
                // One episode of one or two slow calls. Episodes are
                // independent: one drawn while another runs on the GPU
                // runs to the later end, and one drawn just after another
                // joins it into a longer silence of that GPU alone, as
                // independent slow calls do on a real host. Such a
                // silence is what `unresponsive` quarantines, so it is
                // kept: the false-alarm bound counts it.
                if live(host, g) {
                    let gpu = &mut host.gpus[g];
                    gpu.miss = gpu.miss.max(n);
                    host.dense(t, t + 10_000);
                }
            }
            Event::Stall(n) => {
                for gpu in host.gpus.iter_mut() {
                    gpu.miss = n;
                }
                host.dense(t, t + 20_000);
            }
            Event::BadJob => {
                let gpus = host.gpus.len();
                for g in 0..gpus {
                    if live(host, g) {
                        host.xid(t + 200 + g as u64 * 3, g, 13, detail(13));
                        host.xid(t + 600 + g as u64 * 3, g, 43, detail(43));
                    }
                }
                host.dense(t, t + 30_000);
            }
            Event::MmuFault(f) => {
                let gpus = host.gpus.len();
                host.xid(t + 300, f, 31, detail(31));
                for g in 0..gpus {
                    if g != f && live(host, g) {
                        host.xid(t + 900 + g as u64, g, 45, detail(45));
                    }
                }
                host.dense(t, t + 30_000);
            }
            Event::Contained(g, x) => {
                host.xid(t + 500, g, x, detail(x));
                host.dense(t, t + 30_000);
            }
            Event::PowerCap(len) => {
                host.power_limit = 600.0;
                self.cap_until = Some(t + len);
            }
            Event::LoopTrouble(len) => {
                if self.trouble_until.is_none() {
                    self.trouble_until = Some((t + len, host.supply_c, host.flow));
                    host.supply_c += host.rng.gen_range(8.0..16.0);
                    host.flow *= 0.4;
                    host.loop_state = "degraded";
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::host::Host;
    use super::*;

    /// The longest run of missed samples of `gpu` in the trace `jsonl`.
    fn longest_miss_run(jsonl: &str, gpu: usize) -> usize {
        let own = format!("\"gpu\":{gpu},\"sample\"");
        let (mut run, mut longest) = (0, 0);
        for line in jsonl.lines().filter(|l| l.contains(&own)) {
            run = if line.contains("\"responsive\":false") {
                run + 1
            } else {
                0
            };
            longest = longest.max(run);
        }
        longest
    }

    /// Plays `events` on a healthy host for `secs`; its trace.
    fn played(events: Vec<(u64, Event)>, secs: u64) -> String {
        let mut host = Host::new(rand::rngs::StdRng::seed_from_u64(1), "t", "t");
        let mut benign = Benign {
            events,
            ..Benign::default()
        };
        for s in 0..secs {
            benign.apply(&mut host, s * 1_000);
            host.step(s * 1_000);
        }
        host.finish().0
    }

    #[test]
    fn two_missed_sample_events_back_to_back_make_one_four_sample_silence() {
        // Two independent episodes of two slow calls, the second drawn as
        // the first ends: on a real host nothing keeps them apart, and
        // together they are a 4-sample silence of that GPU alone.
        let events = vec![(60_000, Event::Missed(7, 2)), (62_000, Event::Missed(7, 2))];
        assert_eq!(longest_miss_run(&played(events, 80), 7), 4);
        // One drawn inside another's run lengthens it to the later end,
        // never shortens it.
        let inside = vec![(60_000, Event::Missed(7, 2)), (61_000, Event::Missed(7, 1))];
        assert_eq!(longest_miss_run(&played(inside, 80), 7), 2);
        let overlapping = vec![(60_000, Event::Missed(7, 2)), (61_000, Event::Missed(7, 2))];
        assert_eq!(longest_miss_run(&played(overlapping, 80), 7), 3);
        // Apart, both happen.
        let apart = vec![(60_000, Event::Missed(7, 2)), (70_000, Event::Missed(7, 2))];
        let jsonl = played(apart, 80);
        let missed = jsonl
            .lines()
            .filter(|l| l.contains("\"gpu\":7,\"sample\":{\"responsive\":false"))
            .count();
        assert_eq!((longest_miss_run(&jsonl, 7), missed), (2, 4));
    }

    #[test]
    fn a_slow_gsp_call_lengthens_a_silence_already_running_never_shortens_it() {
        let mut host = Host::new(rand::rngs::StdRng::seed_from_u64(1), "t", "t");
        let failure = Failure {
            class: "gsp",
            mechanism: Mechanism::GspSlow { every_min: 1.0 },
            gpu: 7,
            onset_ms: Some(0),
            failure_ms: 3_600_000,
            quarantine_window: (0, 0),
        };
        // A benign episode has the GPU silent for 5 more samples when the
        // failing GSP's first slow call (1 or 2 samples) comes.
        host.gpus[7].miss = 5;
        failure.apply(&mut host, &mut Running::default(), 60_000);
        assert_eq!(host.gpus[7].miss, 5);
        // On a GPU that answers, the slow call starts a silence.
        host.gpus[7].miss = 0;
        failure.apply(&mut host, &mut Running::default(), 60_000);
        assert!((1..3).contains(&host.gpus[7].miss), "{}", host.gpus[7].miss);
    }
}

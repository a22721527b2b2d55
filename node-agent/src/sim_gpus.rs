//! Simulated GPUs behind the same trait as NVML.
//!
//! A stand-alone host of the hall model (`docs/plant-model.md` §2, with
//! the constants of `loopwarden_boards::site`): each
//! GPU heats up with its power and cools through its cold plate into the
//! coolant; its static power grows with temperature (leakage); its power
//! limit caps the work it does; it slows down in hardware at the slowdown
//! temperature and shuts down at the shutdown temperature. The coolant
//! temperature and flow are inputs (fixed unless a test or the hall sets
//! them). Faults are injected through [`TwinControl`]: XIDs, ECC counts,
//! retired pages and remaps, PCIe replays, and a GPU whose calls hang.
//!
//! [`TwinHost`] is pure (time passed in, seeded noise); [`TwinSource`]
//! wraps it for the agent and advances it by the wall clock.
//!
//! Glossary:
//! - *u*: workload demand, 0 to 1: the share of the GPU's dynamic power
//!   the job asks for.
//! - *w*: work rate, what the GPU delivers of `u` under its power limit.
//! - *R_cp(q)*: the cold plate's thermal resistance at `q` L/min.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopwarden_boards::site::GpuModel;
use loopwarden_boards::GpuBoard;
use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons,
    Unsupported, Watts, WholeCelsius,
};

use crate::gpu::{GpuDevice, GpuError, GpuInfo, GpuSample, GpuSource, XidEvent, XidReport};

/// Physical constants of one simulated GPU (defaults of `docs/plant-model.md` §2.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwinGpuParams {
    /// Default power limit, W.
    pub tdp: f64,
    /// Lowest settable limit, W.
    pub min_cap: f64,
    /// Highest settable limit, W.
    pub max_cap: f64,
    /// Static power at 50 °C, W.
    pub p_s0: f64,
    /// Leakage growth, fraction of `p_s0` per K above 50 °C.
    pub k_leak: f64,
    /// Max operating temperature, °C.
    pub t_maxop: f64,
    /// Hardware slowdown, °C.
    pub t_slow: f64,
    /// Hardware shutdown, °C.
    pub t_shut: f64,
    /// Junction to case, K/W.
    pub r_jc: f64,
    /// Lumped heat capacity, J/K.
    pub c_j: f64,
}

impl TwinGpuParams {
    /// The hall model's GPU (`loopwarden_boards::site::GpuModel`) with
    /// the limits and temperatures of `board`.
    pub fn from_board(board: &GpuBoard) -> Self {
        let m = GpuModel::default();
        Self {
            tdp: board.power.tdp_w.0 as f64,
            min_cap: board.power.min_cap_w.0 as f64,
            max_cap: board.power.max_cap_w.0 as f64,
            p_s0: m.static_w,
            k_leak: m.leak_per_k,
            t_maxop: board.thermal.max_operating_c.0 as f64,
            t_slow: board.thermal.slowdown_c.0 as f64,
            t_shut: board.thermal.shutdown_c.0 as f64,
            r_jc: m.r_jc,
            c_j: m.heat_capacity_j_per_k,
        }
    }
}

/// One simulated GPU's state.
#[derive(Debug, Clone)]
struct TwinGpu {
    t_j: f64,
    power: f64,
    work: f64,
    limit: f64,
    demand: f64,
    /// The demand of the last step, noise included.
    u: f64,
    slowdown: bool,
    shut_down: bool,
    energy_j: f64,
    hung: bool,
    ecc: EccCounts,
    repair: MemoryRepair,
    flags: GpuFlags,
    pcie_replay: u32,
    nvlink: NvlinkErrors,
    recovery_action: u8,
}

/// A simulated host: its GPUs and their coolant (pure; time passed in).
#[derive(Debug, Clone)]
pub struct TwinHost {
    params: TwinGpuParams,
    /// The hall model's GPU with these parameters (its power law).
    model: GpuModel,
    gpus: Vec<TwinGpu>,
    /// Coolant temperature at the GPUs' inlet, °C.
    pub coolant_c: f64,
    /// Flow per GPU, L/min.
    pub flow_lpm: f64,
    rng: u64,
    xids: Vec<XidReport>,
}

impl TwinHost {
    /// `count` GPUs at `demand`, on coolant at 32 °C and 1.5 L/min per GPU,
    /// starting in equilibrium with the coolant; `seed` fixes the noise.
    pub fn new(params: TwinGpuParams, count: usize, demand: f64, seed: u64) -> Self {
        let gpu = TwinGpu {
            t_j: 32.0,
            power: 0.0,
            work: 0.0,
            limit: params.tdp,
            demand,
            u: demand,
            slowdown: false,
            shut_down: false,
            energy_j: 0.0,
            hung: false,
            ecc: EccCounts::default(),
            repair: MemoryRepair::default(),
            flags: GpuFlags::ECC_ENABLED,
            pcie_replay: 0,
            nvlink: NvlinkErrors::default(),
            recovery_action: 0,
        };
        let model = GpuModel {
            tdp_w: params.tdp,
            min_cap_w: params.min_cap,
            static_w: params.p_s0,
            leak_per_k: params.k_leak,
            max_operating_c: params.t_maxop,
            slowdown_c: params.t_slow,
            shutdown_c: params.t_shut,
            r_jc: params.r_jc,
            heat_capacity_j_per_k: params.c_j,
            ..GpuModel::default()
        };
        Self {
            params,
            model,
            gpus: vec![gpu; count],
            coolant_c: 32.0,
            flow_lpm: 1.5,
            rng: seed | 1,
            xids: Vec::new(),
        }
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether the host has no GPU.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    fn noise(&mut self) -> f64 {
        // xorshift64: deterministic, no dependency.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }

    /// Advances every GPU by `dt` seconds (in steps of at most 1 s).
    pub fn step(&mut self, mut dt: f64) {
        while dt > 0.0 {
            let h = dt.min(1.0);
            self.step_once(h);
            dt -= h;
        }
    }

    fn step_once(&mut self, dt: f64) {
        let p = self.params;
        let r = p.r_jc + self.model.r_cold_plate(self.flow_lpm);
        for i in 0..self.gpus.len() {
            let jitter = 0.02 * self.noise();
            let g = &mut self.gpus[i];
            if g.shut_down {
                g.power = 0.0;
                g.work = 0.0;
                g.t_j += (self.coolant_c - g.t_j) * (dt / (p.c_j * r)).min(1.0);
                continue;
            }
            let u = (g.demand + jitter).clamp(0.0, 1.0);
            g.u = u;
            g.slowdown = self.model.slowdown(g.slowdown, g.t_j);
            let limit = self.model.limit_under(g.limit, g.slowdown);
            (g.power, g.work) = self.model.draw(g.t_j, u, limit);
            (g.t_j, _) = self
                .model
                .junction_step(g.t_j, g.power, self.coolant_c, r, dt);
            g.energy_j += g.power * dt;
            if g.t_j >= p.t_shut {
                g.shut_down = true;
                self.xids.push(XidReport {
                    gpu: i as u8,
                    xid: 79,
                });
            }
        }
    }

    /// Takes the XIDs raised since the last call.
    pub fn take_xids(&mut self) -> Vec<XidReport> {
        std::mem::take(&mut self.xids)
    }

    /// Die temperature of `gpu`, °C.
    pub fn temperature(&self, gpu: usize) -> f64 {
        self.gpus[gpu].t_j
    }

    /// Power of `gpu`, W.
    pub fn power(&self, gpu: usize) -> f64 {
        self.gpus[gpu].power
    }

    /// Work rate of `gpu`, 0 to 1.
    pub fn work(&self, gpu: usize) -> f64 {
        self.gpus[gpu].work
    }

    /// The sample NVML would give for `gpu`.
    pub fn sample(&self, gpu: usize) -> Result<GpuSample, GpuError> {
        let p = self.params;
        let g = &self.gpus[gpu];
        if g.shut_down {
            return Err(GpuError::Lost);
        }
        let mut throttle = ThrottleReasons::empty();
        let idle = g.demand < 0.05;
        throttle = throttle.with(ThrottleReasons::IDLE, idle);
        throttle = throttle.with(ThrottleReasons::HW_THERMAL_SLOWDOWN, g.slowdown);
        let capped = g.work + 1e-6 < g.u && !g.slowdown;
        throttle = throttle.with(ThrottleReasons::SW_POWER_CAP, capped);
        let ratio = if g.u > 0.0 {
            (g.work / g.u).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let sm = if idle { 345.0 } else { 1980.0 * ratio.cbrt() };
        let t_mem = self.coolant_c + 0.8 * (g.t_j - self.coolant_c);
        Ok(GpuSample {
            flags: g.flags,
            unsupported: Unsupported::empty(),
            temp: WholeCelsius(g.t_j.round().clamp(0.0, 255.0) as u8),
            mem_temp: WholeCelsius(t_mem.round().clamp(0.0, 255.0) as u8),
            power: Watts(g.power.round() as u32),
            energy_mj: (g.energy_j * 1000.0) as u64,
            power_limit: Watts(if g.slowdown {
                g.limit.min(0.5 * p.tdp)
            } else {
                g.limit
            } as u32),
            enforced_unread: false,
            sm_clock: MegaHertz(sm.round() as u16),
            mem_clock: MegaHertz(2619),
            util: Percent::new((g.demand.clamp(0.0, 1.0) * 100.0).round() as u8)
                .unwrap_or(Percent::FULL),
            throttle,
            ecc: g.ecc,
            repair: g.repair,
            pcie_replay: g.pcie_replay,
            nvlink: g.nvlink,
            nvlink_links: Default::default(),
            recovery_action: Some(g.recovery_action),
            // Every counter is read at every sample.
            pcie_held: false,
        })
    }

    /// Sets the power limit of `gpu` as NVML would: refused outside the
    /// settable range.
    pub fn set_limit(&mut self, gpu: usize, limit: Watts) -> Result<(), GpuError> {
        let p = self.params;
        let w = limit.0 as f64;
        if w < p.min_cap || w > p.max_cap {
            return Err(GpuError::InvalidArgument);
        }
        self.gpus[gpu].limit = w;
        Ok(())
    }

    /// The power limit set on `gpu`.
    pub fn limit(&self, gpu: usize) -> Watts {
        Watts(self.gpus[gpu].limit as u32)
    }

    fn info(&self, gpu: usize) -> GpuInfo {
        let p = self.params;
        GpuInfo {
            name: "Loopwarden twin GPU".into(),
            uuid: format!("GPU-twin-{gpu:02}"),
            default_limit: Watts(p.tdp as u32),
            min_limit: Watts(p.min_cap as u32),
            max_limit: Watts(p.max_cap as u32),
            persistence: Some(true),
        }
    }
}

/// A fault or a change of conditions to inject into a running twin.
#[derive(Debug, Clone, PartialEq)]
pub enum TwinFault {
    /// The driver reports this XID on this GPU.
    Xid {
        /// GPU index.
        gpu: u8,
        /// XID number.
        xid: u16,
    },
    /// ECC errors: corrected (single-bit) and uncorrected (double-bit).
    Ecc {
        /// GPU index.
        gpu: u8,
        /// Corrected errors to add.
        sbe: u32,
        /// Uncorrected errors to add.
        dbe: u32,
    },
    /// Row remaps (and their pending flag).
    Remap {
        /// GPU index.
        gpu: u8,
        /// Rows remapped for uncorrectable errors to add.
        uncorrectable: u16,
        /// Whether a remap waits for the next reset.
        pending: bool,
        /// Whether remapping failed (no spare rows).
        failure: bool,
    },
    /// PCIe replays to add.
    PcieReplay {
        /// GPU index.
        gpu: u8,
        /// Replays to add.
        count: u32,
    },
    /// The driver names a recovery action for this GPU (NVML's values: 0
    /// none, 1 reset, 2 reboot, 3 drain peer-to-peer, 4 drain and reset).
    RecoveryAction {
        /// GPU index.
        gpu: u8,
        /// The action.
        action: u8,
    },
    /// Every call to this GPU hangs until `Hang { on: false }`.
    Hang {
        /// GPU index.
        gpu: u8,
        /// Hang or answer again.
        on: bool,
    },
    /// The job's demand on this GPU, 0 to 1.
    Demand {
        /// GPU index.
        gpu: u8,
        /// Demand.
        u: f64,
    },
    /// The coolant at every GPU's inlet, °C, and the flow per GPU, L/min.
    Coolant {
        /// Inlet temperature.
        celsius: f64,
        /// Flow per GPU.
        lpm: f64,
    },
}

struct TwinShared {
    host: TwinHost,
    /// When the model was last advanced.
    at: Instant,
    xid_sink: Option<crate::xid_queue::XidSink>,
}

impl TwinShared {
    fn advance(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.at).as_secs_f64();
        self.at = now;
        self.host.step(dt);
        let xids = self.host.take_xids();
        if let Some(sink) = &self.xid_sink {
            for x in xids {
                let _ = sink.send(XidEvent::Xid(x));
            }
        }
    }
}

/// Injects faults into a running twin (clone it freely).
#[derive(Clone)]
pub struct TwinControl {
    shared: Arc<Mutex<TwinShared>>,
    hung: Arc<Vec<AtomicBool>>,
}

impl TwinControl {
    /// Applies `fault`. Refuses a GPU index the host does not have.
    pub fn inject(&self, fault: TwinFault) -> Result<(), String> {
        let mut s = self.shared.lock().expect("twin state");
        s.advance();
        let count = s.host.len();
        let gpu_of = |g: u8| {
            if (g as usize) < count {
                Ok(g as usize)
            } else {
                Err(format!("no GPU {g}: the twin has {count}"))
            }
        };
        match fault {
            TwinFault::Xid { gpu, xid } => {
                gpu_of(gpu)?;
                if let Some(sink) = &s.xid_sink {
                    let _ = sink.send(XidEvent::Xid(XidReport { gpu, xid }));
                }
            }
            TwinFault::Ecc { gpu, sbe, dbe } => {
                let g = &mut s.host.gpus[gpu_of(gpu)?];
                g.ecc.sbe_volatile = g.ecc.sbe_volatile.saturating_add(sbe);
                g.ecc.sbe_aggregate = g.ecc.sbe_aggregate.saturating_add(sbe);
                g.ecc.dbe_volatile = g.ecc.dbe_volatile.saturating_add(dbe);
                g.ecc.dbe_aggregate = g.ecc.dbe_aggregate.saturating_add(dbe);
            }
            TwinFault::Remap {
                gpu,
                uncorrectable,
                pending,
                failure,
            } => {
                let g = &mut s.host.gpus[gpu_of(gpu)?];
                g.repair.remap_uncorrectable =
                    g.repair.remap_uncorrectable.saturating_add(uncorrectable);
                g.flags = g
                    .flags
                    .with(GpuFlags::REMAP_PENDING, pending)
                    .with(GpuFlags::REMAP_FAILURE, failure);
            }
            TwinFault::PcieReplay { gpu, count } => {
                let g = &mut s.host.gpus[gpu_of(gpu)?];
                g.pcie_replay = g.pcie_replay.saturating_add(count);
            }
            TwinFault::RecoveryAction { gpu, action } => {
                s.host.gpus[gpu_of(gpu)?].recovery_action = action;
            }
            TwinFault::Hang { gpu, on } => {
                let i = gpu_of(gpu)?;
                s.host.gpus[i].hung = on;
                self.hung[i].store(on, Ordering::SeqCst);
            }
            TwinFault::Demand { gpu, u } => {
                if !(0.0..=1.0).contains(&u) {
                    return Err(format!("demand {u} is outside 0 to 1"));
                }
                s.host.gpus[gpu_of(gpu)?].demand = u;
            }
            TwinFault::Coolant { celsius, lpm } => {
                if !(0.0..=80.0).contains(&celsius) || !(0.0..=10.0).contains(&lpm) {
                    return Err(format!(
                        "coolant {celsius} °C at {lpm} L/min is outside 0–80 °C, 0–10 L/min"
                    ));
                }
                s.host.coolant_c = celsius;
                s.host.flow_lpm = lpm;
            }
        }
        Ok(())
    }

    /// Reads the model (advanced to now).
    pub fn with_host<T>(&self, f: impl FnOnce(&TwinHost) -> T) -> T {
        let mut s = self.shared.lock().expect("twin state");
        s.advance();
        f(&s.host)
    }
}

/// The twin as a [`GpuSource`].
pub struct TwinSource {
    control: TwinControl,
}

impl TwinSource {
    /// `count` GPUs of `board` under a busy job (demand 0.9).
    pub fn new(board: &GpuBoard, count: usize, seed: u64) -> Self {
        let host = TwinHost::new(TwinGpuParams::from_board(board), count, 0.9, seed);
        let hung = Arc::new((0..count).map(|_| AtomicBool::new(false)).collect());
        Self {
            control: TwinControl {
                shared: Arc::new(Mutex::new(TwinShared {
                    host,
                    at: Instant::now(),
                    xid_sink: None,
                })),
                hung,
            },
        }
    }

    /// Every GPU starts at `limit`, as if an administrator had set it
    /// (`nvidia-smi -pl`); refused outside the settable range, as NVML
    /// would.
    pub fn at_limit(self, limit: Watts) -> Result<Self, GpuError> {
        {
            let mut s = self.control.shared.lock().expect("twin state");
            for i in 0..s.host.len() {
                s.host.set_limit(i, limit)?;
            }
        }
        Ok(self)
    }

    /// The same GPUs again, for an agent started after another stopped
    /// (their limits, temperatures and faults as that one left them).
    pub fn again(control: &TwinControl) -> Self {
        Self {
            control: control.clone(),
        }
    }

    /// The handle that injects faults.
    pub fn control(&self) -> TwinControl {
        self.control.clone()
    }
}

impl GpuSource for TwinSource {
    fn devices(&mut self) -> Result<Vec<Box<dyn GpuDevice>>, GpuError> {
        let count = self.control.with_host(|h| h.len());
        Ok((0..count)
            .map(|i| {
                Box::new(TwinDevice {
                    control: self.control.clone(),
                    index: i,
                }) as Box<dyn GpuDevice>
            })
            .collect())
    }

    fn watch_xids(
        &mut self,
        sink: crate::xid_queue::XidSink,
    ) -> Result<Vec<(u8, GpuError)>, GpuError> {
        self.control.shared.lock().expect("twin state").xid_sink = Some(sink);
        Ok(Vec::new())
    }
}

/// One twin GPU.
struct TwinDevice {
    control: TwinControl,
    index: usize,
}

impl TwinDevice {
    /// A hung GPU's calls block, as a hung NVML call does.
    fn wait_while_hung(&self) {
        while self.control.hung[self.index].load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut TwinHost) -> T) -> T {
        self.wait_while_hung();
        let mut s = self.control.shared.lock().expect("twin state");
        s.advance();
        f(&mut s.host)
    }
}

impl GpuDevice for TwinDevice {
    fn describe(&mut self) -> Result<GpuInfo, GpuError> {
        let i = self.index;
        Ok(self.with(|h| h.info(i)))
    }
    fn sample(&mut self) -> Result<GpuSample, GpuError> {
        let i = self.index;
        self.with(|h| h.sample(i))
    }
    fn set_power_limit(&mut self, limit: Watts) -> Result<(), GpuError> {
        let i = self.index;
        self.with(|h| h.set_limit(i, limit))
    }
    fn power_limit(&mut self) -> Result<Watts, GpuError> {
        let i = self.index;
        Ok(self.with(|h| h.limit(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> TwinGpuParams {
        TwinGpuParams::from_board(&GpuBoard::builtin("h200-sxm").expect("built-in board"))
    }

    #[test]
    fn full_power_on_45_degree_water_settles_near_76() {
        // The model's calibration point: 700 W on 45 °C water gives ~76 °C
        // (with leakage, demand 1 draws the full 700 W limit).
        let mut h = TwinHost::new(h200(), 1, 1.0, 7);
        h.coolant_c = 45.0;
        h.step(600.0);
        let t = h.temperature(0);
        assert!((h.power(0) - 700.0).abs() < 1.0, "power {}", h.power(0));
        assert!((73.0..79.0).contains(&t), "settled at {t} °C");
    }

    #[test]
    fn a_cap_lowers_power_work_and_temperature() {
        let mut free = TwinHost::new(h200(), 1, 1.0, 7);
        let mut capped = free.clone();
        capped.set_limit(0, Watts(400)).expect("in range");
        free.step(600.0);
        capped.step(600.0);
        assert!((capped.power(0) - 400.0).abs() < 1.0);
        assert!(capped.work(0) < free.work(0));
        assert!(capped.temperature(0) < free.temperature(0) - 5.0);
        let s = capped.sample(0).expect("answers");
        assert!(s.throttle.contains(ThrottleReasons::SW_POWER_CAP));
        assert_eq!(s.power_limit, Watts(400));
    }

    #[test]
    fn limits_outside_the_range_are_refused() {
        let mut h = TwinHost::new(h200(), 1, 0.5, 7);
        assert_eq!(h.set_limit(0, Watts(150)), Err(GpuError::InvalidArgument));
        assert_eq!(h.set_limit(0, Watts(800)), Err(GpuError::InvalidArgument));
        assert_eq!(h.limit(0), Watts(700));
    }

    #[test]
    fn without_flow_a_busy_gpu_slows_then_shuts_down_with_xid_79() {
        let mut h = TwinHost::new(h200(), 1, 1.0, 7);
        h.flow_lpm = 0.0;
        h.coolant_c = 40.0;
        let mut slowed = false;
        for _ in 0..600 {
            h.step(1.0);
            slowed |= h
                .sample(0)
                .is_ok_and(|s| s.throttle.contains(ThrottleReasons::HW_THERMAL_SLOWDOWN));
        }
        assert!(slowed, "hardware slowdown came first");
        assert_eq!(h.sample(0), Err(GpuError::Lost));
        assert_eq!(h.take_xids(), vec![XidReport { gpu: 0, xid: 79 }]);
    }

    #[test]
    fn same_seed_same_run() {
        let mut a = TwinHost::new(h200(), 8, 0.9, 42);
        let mut b = a.clone();
        a.step(100.0);
        b.step(100.0);
        for i in 0..8 {
            assert_eq!(a.sample(i), b.sample(i));
        }
    }
}

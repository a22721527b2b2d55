//! The hall as the core sees it in a step, for every layer to work from:
//! which host reports count, the hottest GPU, the supply the GPUs imply,
//! the cold plates' resistance at the flow now, the IT meter's trend and
//! whether the loop is in a transient.
//!
//! Glossary:
//! - *fresh*: a sane host report younger than `host_timeout_ms` from a
//!   host on an open rack.
//! - *transient*: a load step, a speed change or a pump change happened
//!   lately; sensors are not judged for drift and loops do not trim then.
//! - *GPU-implied supply*: each loaded host's hottest junction less its
//!   power times the model's resistance and its learned thermal factor
//!   (median over hosts; see [`super::estimate`]).

use super::config::CoreConfig;
use super::sensors::{Readings, Supervisor, Which};
use super::{bit, model, HostReport, Inputs, MAX_HOSTS};

/// What the core keeps of the hall between steps.
#[derive(Debug, Clone)]
pub struct HallView {
    it_filtered: Option<f32>,
    transient_until_ms: u64,
}

impl Default for HallView {
    fn default() -> Self {
        Self::new()
    }
}

impl HallView {
    /// Nothing seen yet.
    pub const fn new() -> Self {
        Self {
            it_filtered: None,
            transient_until_ms: 0,
        }
    }
}

/// One step's time, configuration and inputs, for every layer to work
/// from.
#[derive(Debug, Clone, Copy)]
pub struct Tick<'a> {
    /// What the step is given.
    pub inp: &'a Inputs<'a>,
    /// Now, ms.
    pub now: u64,
    /// Seconds since the last step.
    pub dt: f32,
    /// The configuration with the limits the BMS set.
    pub cfg: CoreConfig,
    /// The CDU's readings.
    pub rd: Readings,
    /// Rack valves open, bit n = rack n.
    pub valves_open: u16,
    /// Racks whose cooling is lost, bit n = rack n: those with a latched
    /// leak, or every rack while an isolation has failed.
    pub cooling_lost: u16,
}

impl<'a> Tick<'a> {
    /// The step of `inp`, `dt` s after the last, under `cfg`, with the
    /// valves the leaks left open and the racks whose cooling is lost.
    pub fn new(
        inp: &'a Inputs<'a>,
        dt: f32,
        cfg: CoreConfig,
        valves_open: u16,
        cooling_lost: u16,
    ) -> Self {
        Self {
            inp,
            now: inp.now_ms,
            dt,
            cfg,
            rd: Readings::of(inp.cdu),
            valves_open,
            cooling_lost,
        }
    }

    /// The hottest GPU of the fresh reports, °C.
    pub fn hottest(&self) -> Option<f32> {
        (0..self.cfg.layout.hosts())
            .filter_map(|h| self.fresh(h))
            .map(|r| r.hottest_c)
            .reduce(f32::max)
    }

    /// GPUs on racks whose valve is open.
    pub fn open_gpus(&self) -> usize {
        let lay = self.cfg.layout;
        let per_rack_gpus = lay.hosts_per_rack as usize * lay.gpus_per_host as usize;
        (self.valves_open.count_ones() as usize) * per_rack_gpus
    }

    /// Host `h`'s report, if fresh.
    pub fn fresh(&self, h: usize) -> Option<HostReport> {
        let r = self.inp.hosts.get(h).copied().flatten()?;
        // A report no GPU could make is no report.
        let sane = (-20.0..=150.0).contains(&r.hottest_c)
            && (0.0..=1.0e5).contains(&r.gpu_power_w)
            && (0.0..=1.0e4).contains(&r.limit_w);
        let open = sane && bit(self.valves_open, self.cfg.layout.rack_of(h));
        (open && r.gpus > 0 && self.now.saturating_sub(r.at_ms) <= self.cfg.timing.host_timeout_ms)
            .then_some(r)
    }
}

/// What a step sees of the hall.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    /// The IT meter, W, where plausible.
    pub it_w: Option<f32>,
    /// The loop is in a transient.
    pub transient: bool,
    /// A GPU's resistance to the coolant at the flow now, K/W.
    pub r_now: f32,
    /// The hottest GPU of the fresh reports, °C.
    pub hottest: Option<f32>,
    /// The supply the GPUs imply, °C (two loaded hosts at least).
    pub gpu_implied_supply: Option<f32>,
}

impl HallView {
    /// A pump change: the loop is in a transient until `until_ms`.
    pub fn restart_transient(&mut self, until_ms: u64) {
        self.transient_until_ms = until_ms;
    }

    /// A change that keeps the loop in a transient until `until_ms` at
    /// least.
    pub fn extend_transient(&mut self, until_ms: u64) {
        self.transient_until_ms = self.transient_until_ms.max(until_ms);
    }

    /// The hall in step `t` at pump `speed`, the flow sensor judged by
    /// `sensors` as the last step left them, each host's GPUs read with
    /// its thermal `factor`.
    pub fn see(
        &mut self,
        t: &Tick<'_>,
        sensors: &Supervisor,
        speed: f32,
        factor: &dyn Fn(usize) -> f32,
    ) -> Seen {
        let (cfg, now, dt) = (&t.cfg, t.now, t.dt);
        let it_w = t.rd.it_w.filter(|w| (0.0..=1.0e8).contains(w));
        if let Some(it) = it_w {
            let f = *self.it_filtered.get_or_insert(it);
            if (it - f).abs() > 0.05 * f.max(1000.0) {
                self.transient_until_ms = self.transient_until_ms.max(now + 120_000);
            }
            self.it_filtered = Some(f + (it - f) * (dt / 60.0).min(1.0));
        }
        let transient = now < self.transient_until_ms;
        let flow_trusted = sensors.trusted(Which::Flow, t.rd.flow_lpm);
        let open_gpus = t.open_gpus();
        let q_now = model::flow_per_gpu(cfg, speed, open_gpus)
            .max(flow_trusted.map_or(0.0, |f| f / open_gpus.max(1) as f32));
        let r_now = cfg.gpu.r_jc_k_per_w + model::r_cold_plate(&cfg.gpu, q_now);
        let (hottest, gpu_implied_supply) = gpus(t, r_now, factor);
        Seen {
            it_w,
            transient,
            r_now,
            hottest,
            gpu_implied_supply,
        }
    }
}

/// The hottest GPU of the fresh reports in step `t` and the supply their
/// GPUs imply at resistance `r_now` times each host's `factor`.
fn gpus(t: &Tick<'_>, r_now: f32, factor: &dyn Fn(usize) -> f32) -> (Option<f32>, Option<f32>) {
    let mut implied = [0.0f32; MAX_HOSTS];
    let mut n_implied = 0;
    let mut hottest: Option<f32> = None;
    for h in 0..t.cfg.layout.hosts() {
        if let Some(r) = t.fresh(h) {
            hottest = Some(hottest.map_or(r.hottest_c, |t: f32| t.max(r.hottest_c)));
            let p = r.gpu_power_w / r.gpus as f32;
            if p > 150.0 {
                implied[n_implied] = r.hottest_c - p * r_now * factor(h);
                n_implied += 1;
            }
        }
    }
    let gpu_implied_supply = if n_implied >= 2 {
        median(&mut implied[..n_implied])
    } else {
        None
    };
    (hottest, gpu_implied_supply)
}

fn median(values: &mut [f32]) -> Option<f32> {
    if values.is_empty() {
        return None;
    }
    // Insertion sort: at most MAX_HOSTS values.
    for i in 1..values.len() {
        let mut j = i;
        while j > 0 && values[j - 1] > values[j] {
            values.swap(j - 1, j);
            j -= 1;
        }
    }
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2 - 1] + values[n / 2])
    })
}

//! One GPU's sample through NVML, on a schedule: every period only what
//! the rules need at that pace, the slow counters every few periods.
//!
//! Every period: temperature, power, the enforced limit, clocks,
//! utilisation, clock-event reasons, the volatile ECC counts, and one
//! field-value query for the HBM temperature and the NVLink totals.
//! Every [`NvmlGpu::slow_every`] samples (and at the first, after a
//! reprobe, and at once when the volatile ECC counts moved or the GPU
//! reported an XID since the last read: a page is retired, a row remapped,
//! only after an ECC error, and the driver says so with an XID): energy,
//! the ECC mode, the aggregate ECC counts, retired pages, remapped rows,
//! the PCIe replay counter and the per-link NVLink counters, in the same
//! field-value query. The per-link counters are also read at once whenever
//! the NVLink totals move, so a link's fault is named in the sample that
//! shows it. Between reads a sample carries the slow values as last read
//! (`node_core::health::SlowCounters` plays the same schedule over a
//! trace).
//!
//! Glossary:
//! - *slow counters*: the fields above read every few periods.
//! - *held*: the slow counters as last read, carried by the samples
//!   between reads.

use loopwarden_protocol::{
    EccCounts, GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons,
    Unsupported, Watts, WholeCelsius,
};
use node_core::health::{NvlinkLinks, NVLINK_LINKS};

use super::{call, field, throttle_from_nvml, NvmlApi, NvmlFailure, NvmlGpu};
use crate::gpu::{GpuError, GpuSample};

/// The slow counters as last read.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Held {
    energy_mj: u64,
    ecc_on: bool,
    sbe_aggregate: u32,
    dbe_aggregate: u32,
    repair: MemoryRepair,
    /// Retirement and remap flags.
    flags: GpuFlags,
    pcie_replay: u32,
    links: NvlinkLinks,
    /// The NVLink replay and recovery totals when the links were read.
    links_at: Option<(u32, u32)>,
    /// The volatile ECC counts when the slow counters were read.
    ecc_at: Option<(u32, u32)>,
}

/// The flags the slow fields set.
const SLOW_FLAGS: [GpuFlags; 3] = [
    GpuFlags::RETIRED_PENDING,
    GpuFlags::REMAP_PENDING,
    GpuFlags::REMAP_FAILURE,
];

/// Field ids read every period.
const FAST_FIELDS: [u32; 4] = [
    field::MEMORY_TEMP,
    field::NVLINK_CRC_DATA_TOTAL,
    field::NVLINK_REPLAY_TOTAL,
    field::NVLINK_RECOVERY_TOTAL,
];

impl<A: NvmlApi> NvmlGpu<A> {
    /// One sample: the fast fields, the slow ones when due, the held ones
    /// otherwise.
    pub(super) fn read_sample(&mut self) -> Result<GpuSample, GpuError> {
        // Until this sample is read whole, the next is a first one again.
        let prior = self.since_slow.take();
        let first = prior.is_none();
        if first {
            self.ecc_mode()?;
        }
        let mut s = GpuSample::default();
        self.fast_calls(&mut s)?;
        self.ecc_volatile(&mut s)?;
        let ecc = (s.ecc.sbe_volatile, s.ecc.dbe_volatile);
        let nudged = self.take_nudge();
        let slow = first
            || nudged
            || self.held.ecc_at != Some(ecc)
            || prior.is_some_and(|n| n + 1 >= self.slow_every);
        if slow {
            self.slow_calls(!first)?;
            self.held.ecc_at = Some(ecc);
        }
        self.fields(&mut s, slow)?;
        let links = self.links_moved(&s);
        if links && !slow {
            self.link_fields(&mut s)?;
        }
        self.hold(&mut s, slow, slow || links);
        self.zero_unsupported(&mut s);
        s.unsupported = self.unsupported;
        self.since_slow = Some(if slow { 0 } else { prior.map_or(0, |n| n + 1) });
        Ok(s)
    }

    /// Whether the XID watch asked for the slow counters since the last
    /// sample (and no longer).
    fn take_nudge(&self) -> bool {
        self.nudge
            .as_ref()
            .and_then(|(flags, i)| flags.get(*i))
            .is_some_and(|f| f.swap(false, std::sync::atomic::Ordering::Relaxed))
    }

    /// Temperature, power, the limit in force, clocks, utilisation and
    /// clock-event reasons.
    fn fast_calls(&mut self, s: &mut GpuSample) -> Result<(), GpuError> {
        let what = "nvmlDeviceGetTemperature";
        let temp = self
            .timed(what, |a, i| a.temperature(i))
            .map_err(|e| e.into_gpu_error(what))?;
        s.temp = WholeCelsius(temp.min(255) as u8);
        let power = Some(Unsupported::POWER);
        if let Some(mw) = self.ask(
            call::POWER_USAGE,
            power,
            "nvmlDeviceGetPowerUsage",
            |a, i| a.power_usage_mw(i),
        )? {
            s.power = Watts::from_milliwatts(mw);
        }
        // The enforced limit, else the limit set (what the agent caps).
        let enforced = self.ask(
            call::ENFORCED_LIMIT,
            None,
            "nvmlDeviceGetEnforcedPowerLimit",
            |a, i| a.enforced_limit_mw(i),
        )?;
        let limit = match enforced {
            Some(mw) => Some(mw),
            None => self.ask(
                call::LIMIT,
                None,
                "nvmlDeviceGetPowerManagementLimit",
                |a, i| a.limit_mw(i),
            )?,
        };
        s.power_limit = limit.map_or(Watts(0), Watts::from_milliwatts);
        let clocks = Some(Unsupported::CLOCKS);
        if let Some((sm, mem)) =
            self.ask(call::CLOCKS, clocks, "nvmlDeviceGetClockInfo", |a, i| {
                a.clocks_mhz(i)
            })?
        {
            s.sm_clock = MegaHertz(sm.min(u16::MAX as u32) as u16);
            s.mem_clock = MegaHertz(mem.min(u16::MAX as u32) as u16);
        }
        let util = Some(Unsupported::UTIL);
        if let Some(u) = self.ask(call::UTIL, util, "nvmlDeviceGetUtilizationRates", |a, i| {
            a.utilization(i)
        })? {
            s.util = Percent::new(u.min(100) as u8).unwrap_or(Percent::FULL);
        }
        let throttle = Some(Unsupported::THROTTLE);
        if let Some(bits) = self.ask(
            call::THROTTLE,
            throttle,
            "nvmlDeviceGetCurrentClocksEventReasons",
            |a, i| a.throttle_bits(i),
        )? {
            s.throttle = throttle_from_nvml(bits);
        }
        Ok(())
    }

    /// Energy, the ECC mode (unless `mode` is false: just read) and the
    /// aggregate ECC counts, into [`Held`].
    fn slow_calls(&mut self, mode: bool) -> Result<(), GpuError> {
        if let Some(mj) = self.ask(
            call::ENERGY,
            None,
            "nvmlDeviceGetTotalEnergyConsumption",
            |a, i| a.energy_mj(i),
        )? {
            self.held.energy_mj = mj;
        }
        if mode {
            self.ecc_mode()?;
        }
        if self.held.ecc_on {
            self.held.sbe_aggregate = self.ecc_count(2, true, false)?;
            self.held.dbe_aggregate = self.ecc_count(3, false, false)?;
        }
        Ok(())
    }

    /// Whether ECC is on, into [`Held`].
    fn ecc_mode(&mut self) -> Result<(), GpuError> {
        let ecc = Some(Unsupported::ECC);
        self.held.ecc_on = self
            .ask(call::ECC_MODE, ecc, "nvmlDeviceGetEccMode", |a, i| {
                a.ecc_enabled(i)
            })?
            .unwrap_or(false);
        Ok(())
    }

    /// The volatile ECC counts, where ECC is on.
    fn ecc_volatile(&mut self, s: &mut GpuSample) -> Result<(), GpuError> {
        s.flags = s.flags.with(GpuFlags::ECC_ENABLED, self.held.ecc_on);
        if self.held.ecc_on {
            s.ecc.sbe_volatile = self.ecc_count(0, true, true)?;
            s.ecc.dbe_volatile = self.ecc_count(1, false, true)?;
        }
        Ok(())
    }

    /// One ECC counter (`slot` 0 to 3 of [`call::ECC_COUNT`]).
    fn ecc_count(&mut self, slot: u16, corrected: bool, volatile: bool) -> Result<u32, GpuError> {
        let bit = call::ECC_COUNT << slot;
        let ecc = Some(Unsupported::ECC);
        Ok(self
            .ask(bit, ecc, "nvmlDeviceGetTotalEccErrors", |a, i| {
                a.ecc_total(i, corrected, volatile)
            })?
            .map_or(0, |v| v.min(u32::MAX as u64) as u32))
    }

    /// The field-value query: the fast fields, and the slow ones with the
    /// per-link counters when `slow`.
    fn fields(&mut self, s: &mut GpuSample, slow: bool) -> Result<(), GpuError> {
        let mut ids: Vec<u32> = FAST_FIELDS.to_vec();
        if slow {
            ids.extend(field::GROUPS.iter().map(|(id, _)| *id));
            ids.sort_unstable();
            ids.dedup();
            ids.extend(self.link_ids());
        }
        self.batched_fields(s, ids)
    }

    /// The per-link counters alone.
    fn link_fields(&mut self, s: &mut GpuSample) -> Result<(), GpuError> {
        let ids = self.link_ids();
        self.batched_fields(s, ids)
    }

    /// The per-link field ids still asked for.
    fn link_ids(&self) -> Vec<u32> {
        if self.unsupported.contains(Unsupported::NVLINK) {
            return Vec::new();
        }
        (0..NVLINK_LINKS)
            .filter(|l| self.links_skipped & (1 << l) == 0)
            .flat_map(|l| [field::nvlink_link(l, false), field::nvlink_link(l, true)])
            .collect()
    }

    /// Whether the NVLink totals moved since the links were last read.
    fn links_moved(&self, s: &GpuSample) -> bool {
        self.held.links_at != Some((s.nvlink.replay, s.nvlink.recovery))
    }

    /// Keeps what `s` read (the slow counters when `slow`, the links when
    /// `links`), and gives `s` the held values of what it did not.
    fn hold(&mut self, s: &mut GpuSample, slow: bool, links: bool) {
        let h = &mut self.held;
        if slow {
            h.repair = s.repair;
            h.pcie_replay = s.pcie_replay;
            for f in SLOW_FLAGS {
                h.flags = h.flags.with(f, s.flags.contains(f));
            }
        }
        if links {
            h.links = s.nvlink_links;
            h.links_at = Some((s.nvlink.replay, s.nvlink.recovery));
        }
        s.energy_mj = h.energy_mj;
        s.ecc.sbe_aggregate = h.sbe_aggregate;
        s.ecc.dbe_aggregate = h.dbe_aggregate;
        s.repair = h.repair;
        s.pcie_replay = h.pcie_replay;
        for f in SLOW_FLAGS {
            s.flags = s.flags.with(f, h.flags.contains(f));
        }
        s.nvlink_links = h.links;
    }

    /// Asks for the field values `ids` (those of groups not marked
    /// unsupported) and puts each answer into `s`.
    fn batched_fields(&mut self, s: &mut GpuSample, mut ids: Vec<u32>) -> Result<(), GpuError> {
        ids.retain(|&id| !self.unsupported.contains(field::group_of(id)));
        if ids.is_empty() {
            return Ok(());
        }
        if ids.iter().any(|&id| field::link_of(id).is_some()) {
            // Read unless one of its fields fails below.
            s.nvlink_links.read = !self.links_skipped & ((1 << NVLINK_LINKS) - 1);
        }
        let answers = match self.timed("nvmlDeviceGetFieldValues", |a, i| a.fields(i, &ids)) {
            Ok(a) => a,
            Err(NvmlFailure::NotSupported) => {
                for (_, g) in field::GROUPS {
                    self.mark(g, "nvmlDeviceGetFieldValues");
                }
                self.mark(Unsupported::NVLINK, "nvmlDeviceGetFieldValues");
                return Ok(());
            }
            Err(e) => return Err(e.into_gpu_error("nvmlDeviceGetFieldValues")),
        };
        for (id, answer) in ids.iter().zip(answers) {
            if let Some((l, recovery)) = field::link_of(*id) {
                self.link_answer(s, l, recovery, answer);
                continue;
            }
            match answer {
                Ok(v) => put_field(s, *id, v),
                Err(NvmlFailure::NotSupported) => self.mark(
                    field::group_of(*id),
                    &format!("field value {}", field::name(*id)),
                ),
                Err(e) => return Err(e.into_gpu_error("nvmlDeviceGetFieldValues")),
            }
        }
        Ok(())
    }

    /// One per-link NVLink counter's answer: a value, or that link left
    /// out of this sample (and of every later one when not supported).
    /// A per-link failure never fails the sample: the totals stand in.
    fn link_answer(
        &mut self,
        s: &mut GpuSample,
        l: usize,
        recovery: bool,
        a: super::NvmlResult<u64>,
    ) {
        let bit = 1u16 << l;
        match a {
            Ok(v) => {
                let v = v.min(u64::from(u32::MAX)) as u32;
                if recovery {
                    s.nvlink_links.recovery[l] = v;
                } else {
                    s.nvlink_links.replay[l] = v;
                }
            }
            Err(NvmlFailure::NotSupported) => {
                self.links_skipped |= bit;
                s.nvlink_links.read &= !bit;
            }
            Err(_) => s.nvlink_links.read &= !bit,
        }
    }

    /// Zeroes every field of a group marked unsupported, so a sample never
    /// carries a value next to an `unsupported` bit that says it means
    /// nothing.
    fn zero_unsupported(&self, s: &mut GpuSample) {
        let u = self.unsupported;
        if u.contains(Unsupported::MEM_TEMP) {
            s.mem_temp = WholeCelsius(0);
        }
        if u.contains(Unsupported::POWER) {
            s.power = Watts(0);
        }
        if u.contains(Unsupported::CLOCKS) {
            s.sm_clock = MegaHertz(0);
            s.mem_clock = MegaHertz(0);
        }
        if u.contains(Unsupported::UTIL) {
            s.util = Percent::ZERO;
        }
        if u.contains(Unsupported::THROTTLE) {
            s.throttle = ThrottleReasons::empty();
        }
        if u.contains(Unsupported::ECC) {
            s.ecc = EccCounts::default();
        }
        if u.contains(Unsupported::RETIRED) {
            s.repair.retired_sbe = 0;
            s.repair.retired_dbe = 0;
            s.flags = s.flags.with(GpuFlags::RETIRED_PENDING, false);
        }
        if u.contains(Unsupported::REMAP) {
            s.repair.remap_correctable = 0;
            s.repair.remap_uncorrectable = 0;
            s.flags = s
                .flags
                .with(GpuFlags::REMAP_PENDING, false)
                .with(GpuFlags::REMAP_FAILURE, false);
        }
        if u.contains(Unsupported::PCIE) {
            s.pcie_replay = 0;
        }
        if u.contains(Unsupported::NVLINK) {
            s.nvlink = NvlinkErrors::default();
            s.nvlink_links = NvlinkLinks::default();
        }
    }
}

/// Puts field `id`'s value `v` into `s`.
fn put_field(s: &mut GpuSample, id: u32, v: u64) {
    let sat16 = |v: u64| v.min(u16::MAX as u64) as u16;
    let sat32 = |v: u64| v.min(u32::MAX as u64) as u32;
    match id {
        field::MEMORY_TEMP => s.mem_temp = WholeCelsius(v.min(255) as u8),
        field::RETIRED_SBE => s.repair.retired_sbe = sat16(v),
        field::RETIRED_DBE => s.repair.retired_dbe = sat16(v),
        field::RETIRED_PENDING => s.flags = s.flags.with(GpuFlags::RETIRED_PENDING, v != 0),
        field::REMAPPED_COR => s.repair.remap_correctable = sat16(v),
        field::REMAPPED_UNC => s.repair.remap_uncorrectable = sat16(v),
        field::REMAPPED_PENDING => s.flags = s.flags.with(GpuFlags::REMAP_PENDING, v != 0),
        field::REMAPPED_FAILURE => s.flags = s.flags.with(GpuFlags::REMAP_FAILURE, v != 0),
        field::PCIE_REPLAY_COUNTER => s.pcie_replay = sat32(v),
        field::NVLINK_CRC_DATA_TOTAL => s.nvlink.crc = sat32(v),
        field::NVLINK_REPLAY_TOTAL => s.nvlink.replay = sat32(v),
        field::NVLINK_RECOVERY_TOTAL => s.nvlink.recovery = sat32(v),
        _ => {}
    }
}

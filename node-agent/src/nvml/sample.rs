//! One GPU's sample through NVML, on a schedule: every period only what
//! the rules need at that pace, the slow counters every few periods.
//!
//! Every period: temperature, power, the enforced limit, clocks,
//! utilisation, clock-event reasons, the volatile ECC counts, and one
//! field-value query for the HBM temperature, the NVLink totals and the
//! PCIe replay counter (so its rate is counted over fresh values at every
//! sample). A GPU that answers none of the other per-sample fields makes
//! no query between reads of the slow counters, and one for the counter
//! alone would cost a call per sample: it reads the counter with the slow
//! counters instead (the sample says so: `pcie_held`).
//! Every [`NvmlGpu::slow_every`] samples (and at the first, after a
//! reprobe, and at once when the volatile ECC counts moved or the GPU
//! reported an XID since the last read: a page is retired, a row remapped,
//! only after an ECC error, and the driver says so with an XID): energy,
//! the ECC mode, the aggregate ECC counts, retired pages, remapped rows,
//! the recovery action the driver names for the
//! GPU and the per-link NVLink counters, in the same field-value query
//! (an XID 154, "recovery action changed", so reads the action at the
//! next sample). The per-link counters are also read at once whenever
//! the NVLink totals move, so a link's fault is named in the sample that
//! shows it. An ECC mode that changed at a read of the slow counters (one
//! that failed answering again, a reset turning ECC on) has the volatile
//! counts read again under it in the same sample: counts skipped under the
//! old mode are never sent as read. Between reads a sample carries the
//! slow values as last read
//! (`node_core::health::SlowCounters` plays the same schedule over a
//! trace).
//!
//! Failing closed, per NVML's answer to one call:
//! - "not supported": the GPU lacks it (`nvml::support`): its group is
//!   reported unsupported and it is not asked again.
//! - ECC off: no memory error is counted, so the ECC groups are reported
//!   unknown (never "0 errors"), said once as an error; the mode is asked
//!   again at every read of the slow counters.
//! - An error that says the GPU itself cannot be read now fails the whole
//!   sample, a miss, and the next sample reads every slow counter again,
//!   so a held value is never passed on for one that could not be read:
//!   `NVML_ERROR_GPU_IS_LOST`, `NVML_ERROR_TIMEOUT`,
//!   `NVML_ERROR_INVALID_ARGUMENT` (the handle is not a GPU's), and any
//!   other error but those below: the library not initialised, the driver
//!   not loaded or not matching the library, a reset required, an
//!   interrupt issue, the device blocked by the OS, power cables not
//!   attached, `NVML_ERROR_NO_PERMISSION`, and an answer the agent does
//!   not know (not guessed to be harmless). The die temperature is
//!   required: any error of its read fails the sample.
//! - An error about the call's own data ([`CALL_ONLY`]: a corrupted
//!   InfoROM, `NVML_ERROR_UNKNOWN`, no data, not found, in use, out of
//!   memory) leaves the GPU readable: only that call's group is unknown,
//!   reported in `unsupported` like a group not supported, and the sample
//!   goes on with temperature and power (were the GPU itself gone, the
//!   temperature read, first in every sample, would fail the sample). The
//!   call is said once per error (`GPU n: … failed: …`, a warning) and
//!   asked again at its next read; a slow counter's group stays unknown
//!   until the next read of the slow counters. A failed enforced limit
//!   falls back to the limit set.
//!
//! In a field-value answer, an entry that says "invalid argument" is that
//! field's "not supported": the call itself answered for this GPU, so the
//! argument refused is the field id (a driver older than the field).
//!
//! A per-link NVLink counter that fails leaves its link out of the sample
//! (the totals still judge) and is asked again at the next sample. A
//! field-value answer that does not match what was asked, or a value
//! NVML cannot give as a count, fails the sample.
//!
//! Energy and the power limit have no `unsupported` bit: energy not known
//! (not supported, lost: answered, then "not supported", or failed) is
//! sent as 0, never the last value held, and the limit as 0 W when neither
//! limit call answers. Every reader takes those zeros as "not known" (no
//! GPU that ran has used no energy, none is limited to 0 W).
//!
//! Glossary:
//! - *slow counters*: the fields above read every few periods.
//! - *held*: the slow counters as last read, carried by the samples
//!   between reads.
//! - *unknown*: a group whose read failed with an error of [`CALL_ONLY`],
//!   reported in the sample's `unsupported` set.

use loopwarden_protocol::{
    GpuFlags, MegaHertz, MemoryRepair, NvlinkErrors, Percent, ThrottleReasons, Unsupported, Watts,
    WholeCelsius,
};
use node_core::health::{NvlinkLinks, NVLINK_LINKS};

use super::support::{Change, Item};
use super::{call, field, throttle_from_nvml, NvmlApi, NvmlFailure, NvmlGpu, NvmlResult};
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
    /// The last read of the PCIe replay counter failed: the samples that
    /// hold it until its next read say it unknown (`pcie_replay` keeps
    /// the last value read, never a failed read's 0).
    pcie_failed: bool,
    links: NvlinkLinks,
    /// The NVLink replay and recovery totals when the links were read.
    links_at: Option<(u32, u32)>,
    /// The volatile ECC counts when the slow counters were read.
    ecc_at: Option<(u32, u32)>,
    /// A per-link counter failed in this sample: the links are asked
    /// again at the next.
    links_failed: bool,
    /// The groups whose read failed at the last read of the slow
    /// counters: unknown until the next.
    unknown: Unsupported,
    /// The recovery action as last read: a read that fails keeps it.
    recovery_action: Option<u8>,
    /// This sample's field-value query carries the PCIe replay counter
    /// whether or not the slow counters are read ([`NvmlGpu::pcie_rides`]).
    pcie_rides: bool,
}

/// NVML's answers, in `nvml-wrapper`'s words (as `NvmlFailure::Other`
/// carries them), that are about one call's own data, not the GPU: that
/// call's fields are unknown, the rest of the sample goes on. Any other
/// error fails the sample (the module note).
pub(super) const CALL_ONLY: [&str; 7] = [
    // NVML_ERROR_CORRUPTED_INFOROM
    "the infoROM is corrupted",
    // NVML_ERROR_UNKNOWN
    "an internal driver error occurred",
    // NVML_ERROR_NO_DATA
    "no data",
    // NVML_ERROR_NOT_FOUND
    "a query to find an object was unsuccessful",
    // NVML_ERROR_IN_USE
    "operation cannot be performed because the GPU is currently in use",
    // NVML_ERROR_MEMORY
    "insufficient memory",
    // NVML_ERROR_VGPU_ECC_NOT_SUPPORTED
    "the requested vgpu operation is not available on the target device because ECC is enabled",
];

/// Whether NVML's `words` for a failed call leave the GPU readable
/// ([`CALL_ONLY`]).
fn call_only(words: &str) -> bool {
    CALL_ONLY.contains(&words)
}

/// The groups of fields read with the slow counters: one whose read
/// failed stays unknown until their next read.
const SLOW_FIELD_GROUPS: [Unsupported; 3] =
    [Unsupported::RETIRED, Unsupported::REMAP, Unsupported::PCIE];

/// The flags the slow fields set.
const SLOW_FLAGS: [GpuFlags; 3] = [
    GpuFlags::RETIRED_PENDING,
    GpuFlags::REMAP_PENDING,
    GpuFlags::REMAP_FAILURE,
];

/// Field ids read every period (and the PCIe replay counter with them,
/// [`NvmlGpu::pcie_rides`]).
pub(super) const FAST_FIELDS: [u32; 4] = [
    field::MEMORY_TEMP,
    field::NVLINK_CRC_DATA_TOTAL,
    field::NVLINK_REPLAY_TOTAL,
    field::NVLINK_RECOVERY_TOTAL,
];

/// Whether the field-value query made every sample carries the PCIe
/// replay counter, on a GPU that asks the query (`call`) and the fields
/// `asks` says: one of [`FAST_FIELDS`] is asked. A GPU with none reads
/// the counter with the slow counters, never in a query of its own every
/// sample. The agent ([`NvmlGpu::pcie_rides`]) and `node-agent probe`
/// decide by this.
pub(super) fn pcie_rides(call: bool, asks: impl Fn(u32) -> bool) -> bool {
    call && FAST_FIELDS.into_iter().any(asks)
}

impl<A: NvmlApi> NvmlGpu<A> {
    /// One sample: the fast fields, the slow ones when due, the held ones
    /// otherwise.
    pub(super) fn read_sample(&mut self) -> Result<GpuSample, GpuError> {
        // Until this sample is read whole, the next is a first one again.
        let prior = self.since_slow.take();
        let first = prior.is_none();
        let due = prior.is_none_or(|n| n + 1 >= self.slow_every);
        if due {
            // A lost sensor is asked again at every scheduled read.
            self.support.retry_lost();
        }
        // `s.unsupported` gathers the groups unknown in this sample alone.
        let mut s = GpuSample::default();
        if first {
            self.held.unknown = Unsupported::empty();
            self.ecc_mode()?;
        }
        self.fast_calls(&mut s)?;
        self.ecc_volatile(&mut s)?;
        let ecc = self.volatile_read(&s);
        let nudged = self.take_nudge();
        let slow = due || nudged || ecc.is_some_and(|e| self.held.ecc_at != Some(e));
        if slow {
            if !first {
                self.held.unknown = Unsupported::empty();
            }
            let was_on = self.held.ecc_on;
            self.slow_calls(!first)?;
            if self.held.ecc_on != was_on {
                // The mode changed at this read: the volatile counts are
                // read again under it, never sent as read when they were
                // not (the counts are skipped while the mode is off or
                // unknown).
                s.ecc.sbe_volatile = 0;
                s.ecc.dbe_volatile = 0;
                self.ecc_volatile(&mut s)?;
            }
            self.held.ecc_at = self.volatile_read(&s).or(self.held.ecc_at);
        }
        self.held.pcie_rides = self.pcie_rides();
        s.pcie_held = !slow && !self.held.pcie_rides;
        self.fields(&mut s, slow)?;
        let totals = !s.unsupported.contains(Unsupported::NVLINK);
        let links = totals && self.links_moved(&s);
        if links && !slow {
            self.link_fields(&mut s)?;
        }
        self.hold(&mut s, slow, (slow || links) && totals);
        s.unsupported = s.unsupported | self.held.unknown | self.unsupported();
        zero_unsupported(&mut s);
        self.since_slow = Some(if slow { 0 } else { prior.map_or(0, |n| n + 1) });
        Ok(s)
    }

    /// The volatile ECC counts `s` read: none with ECC off or its mode
    /// or counts unknown (counts not read are no move).
    fn volatile_read(&self, s: &GpuSample) -> Option<(u32, u32)> {
        (self.held.ecc_on && !s.unsupported.contains(Unsupported::ECC))
            .then_some((s.ecc.sbe_volatile, s.ecc.dbe_volatile))
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
        let u = &mut s.unsupported;
        let what = "nvmlDeviceGetPowerUsage";
        if let Some(mw) = self.read(call::POWER_USAGE, what, u, |a, i| a.power_usage_mw(i))? {
            s.power = Watts::from_milliwatts(mw);
        }
        // The enforced limit, else the limit set (what the agent caps),
        // marked as not the enforced one; 0 W when neither is known.
        let what = "nvmlDeviceGetEnforcedPowerLimit";
        let enforced = self.read(call::ENFORCED_LIMIT, what, u, |a, i| a.enforced_limit_mw(i))?;
        s.enforced_unread = enforced.is_none();
        let limit = match enforced {
            Some(mw) => Some(mw),
            None => self.read(
                call::LIMIT,
                "nvmlDeviceGetPowerManagementLimit",
                u,
                |a, i| a.limit_mw(i),
            )?,
        };
        s.power_limit = limit.map_or(Watts(0), Watts::from_milliwatts_down);
        let what = "nvmlDeviceGetClockInfo";
        if let Some((sm, mem)) = self.read(call::CLOCKS, what, u, |a, i| a.clocks_mhz(i))? {
            s.sm_clock = MegaHertz(sm.min(u16::MAX as u32) as u16);
            s.mem_clock = MegaHertz(mem.min(u16::MAX as u32) as u16);
        }
        let what = "nvmlDeviceGetUtilizationRates";
        if let Some(p) = self.read(call::UTIL, what, u, |a, i| a.utilization(i))? {
            s.util = Percent::new(p.min(100) as u8).unwrap_or(Percent::FULL);
        }
        let what = "nvmlDeviceGetCurrentClocksThrottleReasons";
        if let Some(bits) = self.read(call::THROTTLE, what, u, |a, i| a.throttle_bits(i))? {
            s.throttle = throttle_from_nvml(bits);
        }
        Ok(())
    }

    /// [`NvmlGpu::ask`], but an error of [`CALL_ONLY`] is said once (per
    /// call and error), adds the call's group to `unknown` and yields
    /// `None`, as "not supported" does, without marking it unsupported:
    /// it is asked again at its next read.
    fn read<T>(
        &mut self,
        bit: u16,
        what: &'static str,
        unknown: &mut Unsupported,
        call: impl FnOnce(&A, u32) -> NvmlResult<T>,
    ) -> Result<Option<T>, GpuError> {
        match self.ask(bit, what, call) {
            Err(GpuError::Failed { detail, .. }) if call_only(&detail) => {
                let group = call::group(bit);
                self.say_failed(Item::Call(bit), &call_name(bit, what), &detail, group);
                *unknown = *unknown | group;
                Ok(None)
            }
            other => other,
        }
    }

    /// Says, once per item and NVML's `words`, that `name` failed and
    /// what the sample goes without meanwhile (`group`).
    fn say_failed(&mut self, item: Item, name: &str, words: &str, group: Unsupported) {
        if !self.support.failed(item, words) {
            return;
        }
        let without = match (group_names(group), item) {
            (names, _) if !names.is_empty() => format!("{names} reported as unsupported"),
            (_, Item::Call(call::ENFORCED_LIMIT)) => "the limit set is read in its place".into(),
            (_, Item::Call(call::ENERGY | call::LIMIT)) => "sent as 0 (not known)".into(),
            (_, Item::Field(field::RECOVERY_ACTION)) => {
                "the recovery action last read is kept".into()
            }
            // Only per-link counters: their links are left out.
            _ => "the per-link NVLink counters left out".into(),
        };
        tracing::warn!(
            "GPU {}: {name} failed: {words}; {without} while it fails, the rest of the \
             sample goes on; asked again at its next read",
            self.index
        );
    }

    /// Energy, the ECC mode (unless `mode` is false: just read) and the
    /// aggregate ECC counts, into [`Held`]; the groups whose read failed
    /// into `held.unknown`.
    fn slow_calls(&mut self, mode: bool) -> Result<(), GpuError> {
        let mut unknown = Unsupported::empty();
        let what = "nvmlDeviceGetTotalEnergyConsumption";
        // Not known (not supported, lost, failed): 0, never the last value
        // held.
        let energy = self.read(call::ENERGY, what, &mut unknown, |a, i| a.energy_mj(i))?;
        self.held.energy_mj = energy.unwrap_or(0);
        if mode {
            self.ecc_mode()?;
        }
        // With ECC off there is no count: none from before it went off.
        let (sbe, dbe) = if self.held.ecc_on {
            (
                self.ecc_count(call::ECC_SBE_AGGREGATE, true, false, &mut unknown)?,
                self.ecc_count(call::ECC_DBE_AGGREGATE, false, false, &mut unknown)?,
            )
        } else {
            (0, 0)
        };
        self.held.sbe_aggregate = sbe;
        self.held.dbe_aggregate = dbe;
        self.held.unknown = self.held.unknown | unknown;
        Ok(())
    }

    /// Whether ECC is on, into [`Held`]; a mode that could not be read
    /// is off, its groups unknown until the next read. With ECC off no
    /// memory error is counted: its groups are unknown too (never "0
    /// errors"), said once as an error.
    fn ecc_mode(&mut self) -> Result<(), GpuError> {
        let what = "nvmlDeviceGetEccMode";
        let mut unknown = self.held.unknown;
        let on = self.read(call::ECC_MODE, what, &mut unknown, |a, i| a.ecc_enabled(i))?;
        self.held.ecc_on = on.unwrap_or(false);
        if on == Some(false) {
            unknown = unknown | call::group(call::ECC_MODE);
            self.say_ecc_off();
        }
        self.held.unknown = unknown;
        Ok(())
    }

    /// Says, once (until a reprobe), that ECC is off on this GPU.
    fn say_ecc_off(&mut self) {
        if !self.support.failed(Item::Call(call::ECC_MODE), "ECC off") {
            return;
        }
        tracing::error!(
            "GPU {}: ECC is off (nvmlDeviceGetEccMode): its memory errors are not counted, so \
             no health rule on them can see one (dbe-volatile, sbe-rate-rising); {} reported as unknown while it is off, never as no errors. \
             Turn ECC on (`nvidia-smi -e 1`, then a GPU reset or a reboot)",
            self.index,
            group_names(call::group(call::ECC_MODE)),
        );
    }

    /// The volatile ECC counts, where ECC is on.
    fn ecc_volatile(&mut self, s: &mut GpuSample) -> Result<(), GpuError> {
        s.flags = s.flags.with(GpuFlags::ECC_ENABLED, self.held.ecc_on);
        if self.held.ecc_on {
            let u = &mut s.unsupported;
            s.ecc.sbe_volatile = self.ecc_count(call::ECC_SBE_VOLATILE, true, true, u)?;
            s.ecc.dbe_volatile = self.ecc_count(call::ECC_DBE_VOLATILE, false, true, u)?;
        }
        Ok(())
    }

    /// One ECC counter: call `bit` (one of `call::ECC_*_VOLATILE`,
    /// `call::ECC_*_AGGREGATE`), the `corrected` or uncorrected count,
    /// `volatile` or aggregate; its group into `unknown` when its read
    /// fails ([`Self::read`]).
    fn ecc_count(
        &mut self,
        bit: u16,
        corrected: bool,
        volatile: bool,
        unknown: &mut Unsupported,
    ) -> Result<u32, GpuError> {
        let what = "nvmlDeviceGetTotalEccErrors";
        Ok(self
            .read(bit, what, unknown, |a, i| {
                a.ecc_total(i, corrected, volatile)
            })?
            .map_or(0, |v| v.min(u32::MAX as u64) as u32))
    }

    /// Whether the field-value query made every sample can carry the
    /// PCIe replay counter on this GPU now ([`pcie_rides`]).
    fn pcie_rides(&self) -> bool {
        let asks = |id: u32| self.support.asks(Item::Field(id));
        pcie_rides(self.support.asks(Item::FieldsCall), asks)
    }

    /// The field-value query: the fast fields (with the PCIe replay counter
    /// unless `s` holds it), and the slow ones with the per-link counters
    /// when `slow`.
    fn fields(&mut self, s: &mut GpuSample, slow: bool) -> Result<(), GpuError> {
        let mut ids: Vec<u32> = FAST_FIELDS.to_vec();
        if !s.pcie_held {
            ids.push(field::PCIE_REPLAY_COUNTER);
        }
        if slow {
            ids.extend(field::GROUPS.iter().map(|(id, _)| *id));
            ids.push(field::RECOVERY_ACTION);
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

    /// Every per-link field id.
    fn link_ids(&self) -> Vec<u32> {
        (0..NVLINK_LINKS)
            .flat_map(|l| [field::nvlink_link(l, false), field::nvlink_link(l, true)])
            .collect()
    }

    /// Whether the NVLink totals moved since the links were last read.
    fn links_moved(&self, s: &GpuSample) -> bool {
        self.held.links_at != Some((s.nvlink.replay, s.nvlink.recovery))
    }

    /// Keeps what `s` read (the slow counters when `slow`, the links when
    /// `links`), and gives `s` the held values of what it did not (a
    /// failed read of the PCIe replay counter keeps the value before it,
    /// said unknown until the counter is read again).
    fn hold(&mut self, s: &mut GpuSample, slow: bool, links: bool) {
        let h = &mut self.held;
        if !s.pcie_held {
            let unknown = s.unsupported | h.unknown;
            h.pcie_failed = unknown.contains(Unsupported::PCIE);
            if !h.pcie_failed {
                h.pcie_replay = s.pcie_replay;
            }
        } else if h.pcie_failed {
            s.unsupported = s.unsupported | Unsupported::PCIE;
        }
        if slow {
            h.repair = s.repair;
            for f in SLOW_FLAGS {
                h.flags = h.flags.with(f, s.flags.contains(f));
            }
        }
        if links {
            h.links = s.nvlink_links;
            // A link that failed is asked again at the next sample.
            let failed = std::mem::take(&mut h.links_failed);
            h.links_at = (!failed).then_some((s.nvlink.replay, s.nvlink.recovery));
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
        // Read only with the slow counters; kept through a failed read.
        h.recovery_action = s.recovery_action.or(h.recovery_action);
        s.recovery_action = h.recovery_action;
    }

    /// Asks for the field values `ids` (those still asked: [`super::support`])
    /// and puts each answer into `s`.
    fn batched_fields(&mut self, s: &mut GpuSample, mut ids: Vec<u32>) -> Result<(), GpuError> {
        const WHAT: &str = "nvmlDeviceGetFieldValues";
        ids.retain(|&id| self.support.asks(Item::Field(id)));
        if ids.is_empty() || !self.support.asks(Item::FieldsCall) {
            return Ok(());
        }
        s.nvlink_links.read = asked_links(&ids);
        let answers = match self.timed(WHAT, |a, i| a.fields(i, &ids)) {
            Ok(a) => a,
            Err(NvmlFailure::NotSupported) => {
                if let Some(c) = self.support.not_supported(Item::FieldsCall) {
                    self.say(c, WHAT, fields_call_groups());
                }
                s.nvlink_links.read = 0;
                return Ok(());
            }
            Err(NvmlFailure::Other(words)) if call_only(&words) => {
                let groups = ids
                    .iter()
                    .fold(Unsupported::empty(), |acc, &id| acc | field_group(id));
                self.say_failed(Item::FieldsCall, WHAT, &words, groups);
                for &id in &ids {
                    self.field_unknown(s, id);
                }
                return Ok(());
            }
            Err(e) => return Err(e.into_gpu_error(WHAT)),
        };
        if answers.len() != ids.len() {
            return Err(GpuError::Failed {
                what: WHAT,
                detail: format!("{} answers for {} fields", answers.len(), ids.len()),
            });
        }
        if let Some(c) = self.support.answered(Item::FieldsCall) {
            self.say(c, WHAT, Unsupported::empty());
        }
        for (&id, answer) in ids.iter().zip(answers) {
            match answer {
                Ok(v) => {
                    if let Some(c) = self.support.answered(Item::Field(id)) {
                        self.say(
                            c,
                            &format!("field value {}", field::name(id)),
                            field_group(id),
                        );
                    }
                    put_field(s, id, v);
                }
                // The call answered for this GPU, so an invalid argument in
                // one entry is about its field id: a driver older than the
                // field (NVML answers so for an id it does not know).
                Err(NvmlFailure::NotSupported | NvmlFailure::InvalidArgument) => {
                    s.nvlink_links.read &= !link_bit(id);
                    let change = self.support.not_supported(Item::Field(id));
                    // A link the GPU does not have is no news: its bit says it.
                    let quiet = field::link_of(id).is_some() && change == Some(Change::Unsupported);
                    if let (Some(c), false) = (change, quiet) {
                        self.say(
                            c,
                            &format!("field value {}", field::name(id)),
                            field_group(id),
                        );
                    }
                }
                // A per-link failure never fails the sample: the totals
                // stand in, and the link is asked again at the next sample.
                Err(e) if field::link_of(id).is_some() => {
                    tracing::debug!("GPU {}: {} failed: {e:?}", self.index, field::name(id));
                    self.field_unknown(s, id);
                }
                Err(NvmlFailure::Other(words)) if call_only(&words) => {
                    let name = format!("field value {}", field::name(id));
                    self.say_failed(Item::Field(id), &name, &words, field_group(id));
                    self.field_unknown(s, id);
                }
                Err(e) => return Err(e.into_gpu_error(WHAT)),
            }
        }
        Ok(())
    }

    /// Field `id` could not be read in this sample: a per-link counter
    /// leaves its link out (asked again at the next sample), a slow
    /// field's group is unknown until the next read of the slow counters,
    /// a fast field's (the PCIe replay counter's where it rides with
    /// them) in this sample.
    fn field_unknown(&mut self, s: &mut GpuSample, id: u32) {
        if field::link_of(id).is_some() {
            s.nvlink_links.read &= !link_bit(id);
            self.held.links_failed = true;
            return;
        }
        let g = field::group_of(id);
        let fast = g == Unsupported::PCIE && self.held.pcie_rides;
        if SLOW_FIELD_GROUPS.contains(&g) && !fast {
            self.held.unknown = self.held.unknown | g;
        } else {
            s.unsupported = s.unsupported | g;
        }
    }

    /// The groups reported unsupported now: those of every call and field
    /// not supported now ([`super::support`]).
    pub(super) fn unsupported(&self) -> Unsupported {
        self.support
            .not_supported_now()
            .fold(Unsupported::empty(), |acc, item| {
                acc | match item {
                    Item::Call(bit) => call::group(bit),
                    // A link the GPU lacks is left out of `read`, not the group.
                    Item::Field(id) if field::link_of(id).is_some() => Unsupported::empty(),
                    Item::Field(id) => field::group_of(id),
                    Item::FieldsCall => fields_call_groups(),
                }
            })
    }
}

/// The names of `group`'s groups, comma-separated (empty for none).
fn group_names(group: Unsupported) -> String {
    let names: Vec<&str> = Unsupported::NAMES
        .iter()
        .filter(|(g, _)| group.contains(*g))
        .map(|(_, n)| *n)
        .collect();
    names.join(", ")
}

/// How the log names call `bit` (NVML's `what`): which ECC counter, as
/// `node-agent probe` names it.
fn call_name(bit: u16, what: &str) -> String {
    let counter = match bit {
        call::ECC_SBE_VOLATILE => " (corrected, volatile)",
        call::ECC_DBE_VOLATILE => " (uncorrected, volatile)",
        call::ECC_SBE_AGGREGATE => " (corrected, aggregate)",
        call::ECC_DBE_AGGREGATE => " (uncorrected, aggregate)",
        _ => "",
    };
    format!("{what}{counter}")
}

/// The groups of every field value: what an unsupported field-value query
/// leaves unsupported.
fn fields_call_groups() -> Unsupported {
    field::GROUPS
        .iter()
        .fold(Unsupported::NVLINK, |acc, (_, g)| acc | *g)
}

/// The group field `id` is reported with (none for a per-link counter).
fn field_group(id: u32) -> Unsupported {
    match field::link_of(id) {
        Some(_) => Unsupported::empty(),
        None => field::group_of(id),
    }
}

/// The bit of the link field `id` counts, if it is a per-link field.
fn link_bit(id: u32) -> u16 {
    field::link_of(id).map_or(0, |(l, _)| 1 << l)
}

/// The links both of whose counters are among `ids`.
fn asked_links(ids: &[u32]) -> u16 {
    (0..NVLINK_LINKS)
        .filter(|&l| {
            let (replay, recovery) = (field::nvlink_link(l, false), field::nvlink_link(l, true));
            ids.contains(&replay) && ids.contains(&recovery)
        })
        .fold(0, |acc, l| acc | 1 << l)
}

/// Zeroes every field of a group `s` reports unsupported, so a sample
/// never carries a value next to an `unsupported` bit that says it means
/// nothing.
fn zero_unsupported(s: &mut GpuSample) {
    let u = s.unsupported;
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
    // Each ECC group zeroes its own counts: an aggregate counter the GPU
    // lacks leaves the volatile ones to the health rules.
    if u.contains(Unsupported::ECC) {
        s.ecc.sbe_volatile = 0;
        s.ecc.dbe_volatile = 0;
    }
    if u.contains(Unsupported::ECC_AGGREGATE) {
        s.ecc.sbe_aggregate = 0;
        s.ecc.dbe_aggregate = 0;
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
        field::RECOVERY_ACTION => s.recovery_action = Some(v.min(u8::MAX as u64) as u8),
        _ => match field::link_of(id) {
            Some((l, false)) => s.nvlink_links.replay[l] = sat32(v),
            Some((l, true)) => s.nvlink_links.recovery[l] = sat32(v),
            None => {}
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::error::NvmlError as E;

    /// `NvmlFailure::Other` carries `nvml-wrapper`'s words: these pin the
    /// ones [`CALL_ONLY`] knows to the library's, so a rewording there
    /// fails here instead of turning a call's error into a missed sample.
    #[test]
    fn errors_about_a_calls_own_data_are_told_from_those_about_the_gpu() {
        let call_only_errors = [
            E::CorruptedInfoROM,
            E::Unknown,
            E::NoData,
            E::NotFound,
            E::InUse,
            E::InsufficientMemory,
            E::VgpuEccNotSupported,
        ];
        for e in call_only_errors {
            assert!(call_only(&e.to_string()), "{e}");
        }
        let gpu_errors = [
            E::Uninitialized,
            E::DriverNotLoaded,
            E::LibraryNotFound,
            E::LibRmVersionMismatch,
            E::ResetRequired,
            E::IrqIssue,
            E::OperatingSystem,
            E::InsufficientPower,
            E::GpuLost,
            E::Timeout,
            E::InvalidArg,
            E::NoPermission,
        ];
        for e in gpu_errors {
            assert!(!call_only(&e.to_string()), "{e}");
        }
        assert!(!call_only("x"), "an answer the agent does not know");
    }
}

//! The GPU fields the agent shares with NVIDIA's dcgm-exporter, under
//! dcgm-exporter's names, types, units and labels, so DCGM dashboards
//! and alerts read them unchanged.
//!
//! Names, types and help texts follow dcgm-exporter's counters files
//! (`etc/default-counters.csv`, `etc/dcp-metrics-included.csv`); fields
//! those files leave commented out or do not list (ECC, retired pages,
//! NVLink errors, power limits, clock-event reasons) carry DCGM's field
//! name with the type the commented-out line gives, else `gauge`. A
//! field is written only when the agent measures it on this GPU: never
//! one this GPU answered "not supported" for or does not know (ECC off
//! comes as its ECC groups not known, so no `DCGM_FI_DEV_ECC_*` series
//! reads 0 errors for it), and nothing for a GPU whose last sample did
//! not answer; no `DCGM_FI_DEV_XID_ERRORS` 0 while the XID watch is
//! down (no XID is seen then). The power limits of the GPU's description are written
//! only as NVML gave them: one it did not give is left out, never shown
//! as the board's figure the agent guards the GPU with.
//!
//! Glossary:
//! - *DCGM field*: a named reading of NVIDIA's Data Center GPU Manager
//!   (`DCGM_FI_DEV_GPU_TEMP`); dcgm-exporter names each metric after one.
//! - *clock-event reasons*: NVML's bitmask of why clocks are held down
//!   (formerly "throttle reasons"), written with NVML's bit values.

use loopwarden_bus::prometheus::{Exposition, Metric};
use loopwarden_protocol::{GpuFlags, ThrottleReasons, Unsupported, Watts};

use crate::console::GpuView;
use crate::gpu::GpuSample;
use crate::nvml::UNREAD_LIMIT;

/// One exported field: the metric, the sample field it needs supported
/// (empty: none), and where its value comes from.
struct Field {
    metric: Metric,
    needs: Unsupported,
    value: Source,
}

/// Where a field's value comes from (`None`: not measured).
enum Source {
    /// The GPU's last sample: written only while the GPU answers.
    Sample(fn(&GpuSample) -> Option<f64>),
    /// What the agent knows of the GPU besides its samples (its XIDs,
    /// its identity and limits, the limit read back): written whether or
    /// not the GPU answers its samples.
    Gpu(fn(&GpuView) -> Option<f64>),
    /// The GPU's last XID: 0 for none only while XIDs are watched (the
    /// watch down, no XID is seen, and a 0 would read as none).
    Xid,
}

/// A field read from the last sample.
const fn field(metric: Metric, needs: Unsupported, value: fn(&GpuSample) -> Option<f64>) -> Field {
    Field {
        metric,
        needs,
        value: Source::Sample(value),
    }
}

/// A field not read from the samples.
const fn gpu_field(metric: Metric, value: fn(&GpuView) -> Option<f64>) -> Field {
    Field {
        metric,
        needs: ALWAYS,
        value: Source::Gpu(value),
    }
}

const ALWAYS: Unsupported = Unsupported::empty();
use Metric as M;
use Unsupported as U;

fn flag(s: &GpuSample, f: GpuFlags) -> Option<f64> {
    Some(if s.flags.contains(f) { 1.0 } else { 0.0 })
}

/// Every field, in dcgm-exporter's order where it has one.
const FIELDS: &[Field] = &[
    field(
        M::gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
        U::CLOCKS,
        |s| Some(s.sm_clock.0.into()),
    ),
    field(
        M::gauge("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz)."),
        U::CLOCKS,
        |s| Some(s.mem_clock.0.into()),
    ),
    field(
        M::gauge("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),
        U::MEM_TEMP,
        |s| Some(s.mem_temp.0.into()),
    ),
    field(
        M::gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
        ALWAYS,
        |s| Some(s.temp.0.into()),
    ),
    field(
        M::gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
        U::POWER,
        |s| Some(s.power.0.into()),
    ),
    // NVML gives no "not supported" the agent keeps for energy: 0 is
    // read as not measured (a GPU that ran has used energy).
    field(
        M::counter(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "Total energy consumption since boot (in mJ).",
        ),
        ALWAYS,
        |s| (s.energy_mj > 0).then_some(s.energy_mj as f64),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "Total number of PCIe retries.",
        ),
        U::PCIE,
        |s| Some(s.pcie_replay.into()),
    ),
    field(
        M::gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        U::UTIL,
        |s| Some(s.util.get().into()),
    ),
    Field {
        metric: M::gauge(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
        ),
        needs: ALWAYS,
        value: Source::Xid,
    },
    field(
        M::gauge(
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "Current clock event reasons (bitmask of NVML's reasons).",
        ),
        U::THROTTLE,
        |s| Some(nvml_bits(s.throttle) as f64),
    ),
    gpu_field(
        M::gauge(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT",
            "Power management limit (in W).",
        ),
        |g| g.applied.map(|w| w.0.into()),
    ),
    gpu_field(
        M::gauge(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN",
            "Minimum power management limit (in W).",
        ),
        |g| read(g.info.min_limit),
    ),
    gpu_field(
        M::gauge(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX",
            "Maximum power management limit (in W).",
        ),
        |g| read(g.info.max_limit),
    ),
    gpu_field(
        M::gauge(
            "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
            "Default power management limit (in W).",
        ),
        |g| read(g.info.default_limit),
    ),
    field(
        M::gauge(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            "Effective power limit the driver enforces (in W).",
        ),
        ALWAYS,
        |s| (s.power_limit.0 > 0 && !s.enforced_unread).then_some(s.power_limit.0.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors.",
        ),
        U::ECC,
        |s| Some(s.ecc.sbe_volatile.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors.",
        ),
        U::ECC,
        |s| Some(s.ecc.dbe_volatile.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "Total number of single-bit persistent ECC errors.",
        ),
        U::ECC_AGGREGATE,
        |s| Some(s.ecc.sbe_aggregate.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "Total number of double-bit persistent ECC errors.",
        ),
        U::ECC_AGGREGATE,
        |s| Some(s.ecc.dbe_aggregate.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_RETIRED_SBE",
            "Total number of retired pages due to single-bit errors.",
        ),
        U::RETIRED,
        |s| Some(s.repair.retired_sbe.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_RETIRED_DBE",
            "Total number of retired pages due to double-bit errors.",
        ),
        U::RETIRED,
        |s| Some(s.repair.retired_dbe.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_RETIRED_PENDING",
            "Total number of pages pending retirement.",
        ),
        U::RETIRED,
        |s| flag(s, GpuFlags::RETIRED_PENDING),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
            "Total number of NVLink data CRC errors.",
        ),
        U::NVLINK,
        |s| Some(s.nvlink.crc.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            "Total number of NVLink retries.",
        ),
        U::NVLINK,
        |s| Some(s.nvlink.replay.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            "Total number of NVLink recovery errors.",
        ),
        U::NVLINK,
        |s| Some(s.nvlink.recovery.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "Number of remapped rows for uncorrectable errors",
        ),
        U::REMAP,
        |s| Some(s.repair.remap_uncorrectable.into()),
    ),
    field(
        M::counter(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "Number of remapped rows for correctable errors",
        ),
        U::REMAP,
        |s| Some(s.repair.remap_correctable.into()),
    ),
    field(
        M::gauge(
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "Whether remapping of rows has failed",
        ),
        U::REMAP,
        |s| flag(s, GpuFlags::REMAP_FAILURE),
    ),
    field(
        M::gauge(
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "Whether remapping of rows is pending",
        ),
        U::REMAP,
        |s| flag(s, GpuFlags::REMAP_PENDING),
    ),
];

/// A limit of the GPU's description, only where NVML gave it: one not
/// read ([`UNREAD_LIMIT`]) is left out, never shown as the board's figure
/// the agent guards it with.
fn read(limit: Watts) -> Option<f64> {
    (limit != UNREAD_LIMIT).then(|| limit.0.into())
}

/// Writes every DCGM field of GPU `g`, with `labels`: those of its last
/// sample only while it answers (nothing of a sample that did not answer
/// is shown as live), and never one it does not support; those not read
/// from the samples (its last XID, its limits) always, so an XID 79 is
/// seen on a GPU that has stopped answering. While XIDs are not watched
/// (`xids_watched` false: the driver's watch is down) its XID series is
/// written only for an XID seen, never 0.
pub fn write(out: &mut Exposition, g: &GpuView, xids_watched: bool, labels: &[(&str, &str)]) {
    let sample = g.last.as_ref().filter(|_| g.responsive);
    for f in FIELDS {
        let v = match (&f.value, sample) {
            (Source::Gpu(value), _) => value(g),
            (Source::Xid, _) => {
                let last = g.xids.last().map(|(_, x)| f64::from(*x));
                last.or(xids_watched.then_some(0.0))
            }
            (Source::Sample(value), Some(s)) => {
                if !f.needs.is_empty() && s.unsupported.contains(f.needs) {
                    continue;
                }
                value(s)
            }
            (Source::Sample(_), None) => continue,
        };
        if let Some(v) = v {
            out.sample(&f.metric, labels, v);
        }
    }
}

/// The bus's clock-event reasons as NVML's bits (`nvml.h`,
/// `nvmlClocksEventReason*`), the values DCGM reports.
pub fn nvml_bits(r: ThrottleReasons) -> u64 {
    const BITS: [(ThrottleReasons, u64); 8] = [
        (ThrottleReasons::IDLE, 0x1),
        (ThrottleReasons::APPLICATIONS_CLOCKS, 0x2),
        (ThrottleReasons::SW_POWER_CAP, 0x4),
        (ThrottleReasons::HW_SLOWDOWN, 0x8),
        (ThrottleReasons::SYNC_BOOST, 0x10),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, 0x20),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, 0x40),
        (ThrottleReasons::HW_POWER_BRAKE, 0x80),
    ];
    BITS.iter()
        .filter(|(reason, _)| r.contains(*reason))
        .fold(0, |acc, (_, bit)| acc | bit)
}

/// The names of every DCGM field exported, for the documentation's test.
#[cfg(test)]
pub fn names() -> Vec<&'static str> {
    FIELDS.iter().map(|f| f.metric.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvml::throttle_from_nvml;

    #[test]
    fn clock_event_bits_are_nvmls_both_ways() {
        for bits in 0..=0xffu64 {
            assert_eq!(nvml_bits(throttle_from_nvml(bits)), bits, "{bits:#x}");
        }
    }

    #[test]
    fn names_are_unique() {
        let mut n = names();
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), FIELDS.len());
    }
}

//! The field ids of `nvmlDeviceGetFieldValues` the agent asks for (from
//! `nvml.h`), the groups it reports as unsupported together, and each
//! field's name, so a log line or `node-agent probe` can say which field
//! a GPU does not support.

use loopwarden_protocol::Unsupported;

/// HBM temperature, °C.
pub const MEMORY_TEMP: u32 = 82;
/// Pages retired for single-bit errors.
pub const RETIRED_SBE: u32 = 29;
/// Pages retired for double-bit errors.
pub const RETIRED_DBE: u32 = 30;
/// A page retirement waits for the next reset (0 or 1).
pub const RETIRED_PENDING: u32 = 31;
/// Rows remapped for correctable errors.
pub const REMAPPED_COR: u32 = 142;
/// Rows remapped for uncorrectable errors.
pub const REMAPPED_UNC: u32 = 143;
/// A row remap waits for the next reset (0 or 1).
pub const REMAPPED_PENDING: u32 = 144;
/// Row remapping failed (0 or 1).
pub const REMAPPED_FAILURE: u32 = 145;
/// PCIe replay counter.
pub const PCIE_REPLAY_COUNTER: u32 = 94;
/// NVLink CRC data errors, all links.
pub const NVLINK_CRC_DATA_TOTAL: u32 = 45;
/// NVLink replay errors, all links.
pub const NVLINK_REPLAY_TOTAL: u32 = 52;
/// NVLink recovery errors, all links.
pub const NVLINK_RECOVERY_TOTAL: u32 = 59;
/// NVLink replay errors of link 0 (links 0 to 5 follow in order).
pub const NVLINK_REPLAY_L0: u32 = 46;
/// NVLink recovery errors of link 0 (links 0 to 5 follow in order).
pub const NVLINK_RECOVERY_L0: u32 = 53;
/// NVLink replay errors of link 6 (links 6 to 11 follow in order).
pub const NVLINK_REPLAY_L6: u32 = 108;
/// NVLink recovery errors of link 6 (links 6 to 11 follow in order).
pub const NVLINK_RECOVERY_L6: u32 = 114;

/// The recovery action the driver names for the GPU (0 none, 1 reset
/// the GPU, 2 reboot the node, 3 drain peer-to-peer, 4 drain and reset);
/// recent drivers only. It belongs to no group: not supported, it is
/// simply not known.
pub const RECOVERY_ACTION: u32 = 230;

/// The field of link `l`'s replay (`recovery: false`) or recovery
/// count, for links 0 to 11.
pub fn nvlink_link(l: usize, recovery: bool) -> u32 {
    let l = l as u32;
    match (l < 6, recovery) {
        (true, false) => NVLINK_REPLAY_L0 + l,
        (true, true) => NVLINK_RECOVERY_L0 + l,
        (false, false) => NVLINK_REPLAY_L6 + l - 6,
        (false, true) => NVLINK_RECOVERY_L6 + l - 6,
    }
}

/// Which link and counter a per-link field is, if it is one.
pub fn link_of(id: u32) -> Option<(usize, bool)> {
    let span = |base: u32| (base..base + 6).contains(&id).then(|| (id - base) as usize);
    span(NVLINK_REPLAY_L0)
        .map(|l| (l, false))
        .or_else(|| span(NVLINK_RECOVERY_L0).map(|l| (l, true)))
        .or_else(|| span(NVLINK_REPLAY_L6).map(|l| (l + 6, false)))
        .or_else(|| span(NVLINK_RECOVERY_L6).map(|l| (l + 6, true)))
}

/// Groups of fields that are asked for together and reported unsupported
/// together.
pub(crate) const GROUPS: [(u32, Unsupported); 11] = [
    (MEMORY_TEMP, Unsupported::MEM_TEMP),
    (RETIRED_SBE, Unsupported::RETIRED),
    (RETIRED_DBE, Unsupported::RETIRED),
    (RETIRED_PENDING, Unsupported::RETIRED),
    (REMAPPED_COR, Unsupported::REMAP),
    (REMAPPED_UNC, Unsupported::REMAP),
    (REMAPPED_PENDING, Unsupported::REMAP),
    (REMAPPED_FAILURE, Unsupported::REMAP),
    (PCIE_REPLAY_COUNTER, Unsupported::PCIE),
    (NVLINK_CRC_DATA_TOTAL, Unsupported::NVLINK),
    (NVLINK_REPLAY_TOTAL, Unsupported::NVLINK),
];

/// The group field `id` is reported unsupported with (a per-link or total
/// NVLink field: NVLink; the recovery action: none).
pub(crate) fn group_of(id: u32) -> Unsupported {
    if id == RECOVERY_ACTION {
        return Unsupported::empty();
    }
    GROUPS
        .iter()
        .find(|(f, _)| *f == id)
        .map_or(Unsupported::NVLINK, |(_, g)| *g)
}

/// Field `id`'s name in `nvml.h`, with its number:
/// `NVML_FI_DEV_MEMORY_TEMP (82)`.
pub fn name(id: u32) -> String {
    let fixed = match id {
        MEMORY_TEMP => Some("MEMORY_TEMP"),
        RETIRED_SBE => Some("RETIRED_SBE"),
        RETIRED_DBE => Some("RETIRED_DBE"),
        RETIRED_PENDING => Some("RETIRED_PENDING"),
        REMAPPED_COR => Some("REMAPPED_COR"),
        REMAPPED_UNC => Some("REMAPPED_UNC"),
        REMAPPED_PENDING => Some("REMAPPED_PENDING"),
        REMAPPED_FAILURE => Some("REMAPPED_FAILURE"),
        PCIE_REPLAY_COUNTER => Some("PCIE_REPLAY_COUNTER"),
        NVLINK_CRC_DATA_TOTAL => Some("NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        NVLINK_REPLAY_TOTAL => Some("NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
        NVLINK_RECOVERY_TOTAL => Some("NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
        RECOVERY_ACTION => Some("GET_GPU_RECOVERY_ACTION"),
        _ => None,
    };
    match (fixed, link_of(id)) {
        (Some(n), _) => format!("NVML_FI_DEV_{n} ({id})"),
        (None, Some((l, false))) => format!("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L{l} ({id})"),
        (None, Some((l, true))) => format!("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L{l} ({id})"),
        (None, None) => format!("field {id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_has_its_nvml_name_and_links_map_both_ways() {
        assert_eq!(name(MEMORY_TEMP), "NVML_FI_DEV_MEMORY_TEMP (82)");
        assert_eq!(
            name(nvlink_link(7, true)),
            "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L7 (115)"
        );
        for l in 0..12 {
            for recovery in [false, true] {
                assert_eq!(link_of(nvlink_link(l, recovery)), Some((l, recovery)));
            }
        }
        assert_eq!(group_of(PCIE_REPLAY_COUNTER), Unsupported::PCIE);
        assert_eq!(group_of(nvlink_link(3, false)), Unsupported::NVLINK);
        assert_eq!(group_of(RECOVERY_ACTION), Unsupported::empty());
        assert_eq!(
            name(RECOVERY_ACTION),
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230)"
        );
        assert!(GROUPS
            .iter()
            .all(|(id, _)| !name(*id).starts_with("field ")));
    }
}

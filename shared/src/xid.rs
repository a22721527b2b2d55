//! The XID catalog as data: what each NVIDIA driver error code means, what
//! usually causes it and what NVIDIA recommends doing about it.
//!
//! The health engine reads this table; it does not hard-code XIDs. Sources:
//! NVIDIA's "Xid Errors" catalog for Ampere and newer GPUs (its *resolution
//! bucket* is [`XidAction`]) and DCGM's health-watch documentation.
//!
//! Glossary:
//! - *XID*: an error report of the NVIDIA kernel driver, a number with a
//!   device and some detail text, delivered to NVML event sets.
//! - *cause*: where the fault usually lies. An application XID (a bad memory
//!   access of a CUDA program) says nothing about the GPU's health.
//! - *contained*: an error the GPU confined to one process; the GPU itself
//!   keeps working for others.
//! - *DBE / SBE*: double-bit (uncorrectable) / single-bit (corrected) ECC error.

use serde::{Deserialize, Serialize};

/// Where an XID's fault usually lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum XidCause {
    /// The GPU's hardware: memory, NVLink, the bus interface, the die.
    Hardware,
    /// The application (user program) running on the GPU.
    Application,
    /// The driver or the GPU's firmware (GSP); may be hardware underneath.
    DriverFirmware,
    /// The host system: PCIe, power delivery, cooling.
    System,
}

/// NVIDIA's recommended immediate action (the catalog's resolution bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum XidAction {
    /// Informational, handled automatically, or a follow-on of another
    /// error: nothing to do for this XID itself (`IGNORE`).
    Ignore,
    /// Restart the application; the GPU is fine (`RESTART_APP`).
    RestartApp,
    /// Drain the GPU, then reset it: a repair such as a row remap is pending
    /// and takes effect at the reset (`DRAIN_AND_RESET`).
    DrainAndReset,
    /// Reset the GPU now; it cannot be trusted until then (`RESET_GPU`).
    ResetGpu,
    /// Reboot the node: a reset alone does not bring the GPU back
    /// (`RESTART_BM`).
    RebootNode,
    /// XID 154 names the action another XID needs in its detail text
    /// (none, drain peer-to-peer, drain and reset, reset, reboot).
    FollowRecoveryAction,
}

/// NVIDIA's investigatory action, once the immediate one is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "std", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum XidFollowUp {
    /// Nothing further.
    None,
    /// Check the application (and the CUDA stack); repeats on one GPU
    /// warrant DCGM and field diagnostics.
    CheckApplication,
    /// Run the vendor's field diagnostics on the GPU.
    FieldDiagnostics,
    /// Investigate the driver and firmware versions.
    InvestigateSoftware,
    /// Investigate the link (cabling, signal integrity, the peer).
    InvestigateLink,
    /// Open a case with the vendor: the board may need replacement.
    ContactSupport,
}

/// One entry of the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    /// The XID number.
    pub code: u16,
    /// The driver's mnemonic.
    pub mnemonic: &'static str,
    /// What it means, in a field engineer's words.
    pub meaning: &'static str,
    /// Where the fault usually lies.
    pub cause: XidCause,
    /// NVIDIA's recommended immediate action.
    pub action: XidAction,
    /// NVIDIA's investigatory action.
    pub follow_up: XidFollowUp,
    /// The GPU confined the error to one process and keeps serving others.
    pub contained: bool,
}

impl XidInfo {
    /// The fault lies in the GPU, its firmware or its link to the host, and
    /// NVIDIA's immediate action takes the GPU out of service now (a reset
    /// or a reboot). Application, contained and informational XIDs never are,
    /// nor drain-and-reset ones: the GPU keeps serving until a drain lets
    /// the pending repair take effect at its reset (degraded).
    pub const fn is_fatal_hardware(&self) -> bool {
        !matches!(self.cause, XidCause::Application)
            && matches!(self.action, XidAction::ResetGpu | XidAction::RebootNode)
            && !self.contained
    }
}

macro_rules! xid {
    ($code:expr, $mn:expr, $cause:ident, $action:ident, $follow:ident, $contained:expr, $meaning:expr) => {
        XidInfo {
            code: $code,
            mnemonic: $mn,
            meaning: $meaning,
            cause: XidCause::$cause,
            action: XidAction::$action,
            follow_up: XidFollowUp::$follow,
            contained: $contained,
        }
    };
}

/// The catalog, sorted by code. Ampere-and-newer entries, as they apply to
/// Hopper (H100/H200); codes NVIDIA lists as unused there are left out.
pub const XID_CATALOG: &[XidInfo] = &[
    xid!(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", Application, RestartApp, CheckApplication, false,
        "GPU stopped processing: a channel timed out, usually the application"),
    xid!(13, "ROBUST_CHANNEL_GR_EXCEPTION", Application, RestartApp, CheckApplication, false,
        "Graphics engine exception: an out-of-bounds access or illegal instruction of the program"),
    xid!(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", Application, RestartApp, CheckApplication, false,
        "GPU memory page fault: the program accessed an illegal address"),
    xid!(32, "ROBUST_CHANNEL_PBDMA_ERROR", System, RestartApp, ContactSupport, false,
        "Invalid or corrupted push buffer stream, mostly poor PCIe signal quality"),
    xid!(38, "ROBUST_CHANNEL_DRIVER_ERROR", DriverFirmware, Ignore, InvestigateSoftware, false,
        "Driver firmware error"),
    xid!(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", Application, Ignore, CheckApplication, false,
        "The program hit a software fault and was stopped; the GPU stays healthy"),
    xid!(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", DriverFirmware, Ignore, InvestigateSoftware, false,
        "Graphics engine fault during a context switch"),
    xid!(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", Application, Ignore, None, false,
        "Cleanup after a program was stopped or after an earlier error: follow the other XID"),
    xid!(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", DriverFirmware, ResetGpu, ContactSupport, false,
        "GPU stopped processing"),
    xid!(48, "ROBUST_CHANNEL_GPU_ECC_DBE", Hardware, ResetGpu, FieldDiagnostics, false,
        "Double-bit (uncorrectable) ECC error in GPU memory; a reset is needed to clear it"),
    xid!(62, "PMU_HALT_ERROR", DriverFirmware, ResetGpu, ContactSupport, false,
        "Internal micro-controller halted"),
    xid!(63, "INFOROM_DRAM_RETIREMENT_EVENT", Hardware, Ignore, None, false,
        "Row remap or page retirement recorded; it takes effect at the next GPU reset"),
    xid!(64, "INFOROM_DRAM_RETIREMENT_FAILURE", Hardware, ResetGpu, ContactSupport, false,
        "Row remap or page retirement failed to record"),
    xid!(68, "ROBUST_CHANNEL_NVDEC0_ERROR", Application, RestartApp, ContactSupport, false,
        "Video decoder exception"),
    xid!(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", Application, RestartApp, CheckApplication, false,
        "Graphics engine class error: an illegal method from the program"),
    xid!(74, "NVLINK_ERROR", Hardware, ResetGpu, ContactSupport, false,
        "NVLink error towards a peer GPU or NVSwitch; a reset or reboot is needed to clear it"),
    xid!(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", System, RebootNode, ContactSupport, false,
        "GPU has fallen off the bus: it no longer answers on PCIe"),
    xid!(92, "EXCESSIVE_SBE_INTERRUPTS", Hardware, Ignore, ContactSupport, false,
        "High rate of single-bit (corrected) ECC errors"),
    xid!(94, "ROBUST_CHANNEL_CONTAINED_ERROR", Hardware, RestartApp, None, true,
        "Contained memory error: only the program that touched it was stopped; reset when convenient"),
    xid!(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", Hardware, ResetGpu, None, false,
        "Uncontained memory error: every program on the GPU is affected"),
    xid!(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", DriverFirmware, ResetGpu, ContactSupport, false,
        "Context switch timeout"),
    xid!(119, "GSP_RPC_TIMEOUT", DriverFirmware, ResetGpu, InvestigateSoftware, false,
        "The GPU's GSP firmware did not answer the driver in time"),
    xid!(120, "GSP_ERROR", DriverFirmware, ResetGpu, InvestigateSoftware, false,
        "The GPU's GSP firmware reported an error"),
    xid!(121, "C2C_ERROR", Hardware, Ignore, ContactSupport, false,
        "Corrected errors on the chip-to-chip link to a Grace CPU (Grace systems only)"),
    xid!(136, "ALI_TRAINING_FAIL", Hardware, ResetGpu, InvestigateLink, false,
        "NVLink training failed"),
    xid!(137, "NVLINK_PRIV_ERR", Application, Ignore, CheckApplication, false,
        "Illegal NVLink peer-to-peer access, usually a program bug"),
    xid!(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", Hardware, ResetGpu, ContactSupport, false,
        "Uncorrectable ECC error the driver could not remap"),
    xid!(143, "GPU_INIT_ERROR", Hardware, ResetGpu, ContactSupport, false,
        "GPU initialisation failure"),
    xid!(154, "GPU_RECOVERY_ACTION_CHANGED", DriverFirmware, FollowRecoveryAction, None, false,
        "The driver names the recovery another XID needs: drain, reset or reboot"),
    xid!(158, "GPU_FATAL_TIMEOUT", DriverFirmware, ResetGpu, ContactSupport, false,
        "GPU fatal timeout"),
];

/// The catalog entry of `code`, if the catalog knows it.
pub fn lookup(code: u16) -> Option<&'static XidInfo> {
    XID_CATALOG
        .binary_search_by_key(&code, |x| x.code)
        .ok()
        .map(|i| &XID_CATALOG[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_sorted_and_unique() {
        assert!(XID_CATALOG.windows(2).all(|w| w[0].code < w[1].code));
    }

    #[test]
    fn catalog_covers_the_required_codes() {
        for code in [
            13, 31, 43, 45, 48, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 140, 143,
            154,
        ] {
            assert!(
                lookup(code).is_some(),
                "XID {code} missing from the catalog"
            );
        }
        assert!(lookup(9999).is_none());
    }

    #[test]
    fn application_and_contained_xids_are_never_fatal_hardware() {
        for code in [13, 31, 43, 45, 63, 68, 69, 92, 94, 121, 154] {
            assert!(!lookup(code).unwrap().is_fatal_hardware(), "XID {code}");
        }
        for code in [48, 62, 64, 74, 79, 95, 119, 120, 140, 143] {
            assert!(lookup(code).unwrap().is_fatal_hardware(), "XID {code}");
        }
    }

    #[test]
    fn a_drain_and_reset_xid_is_not_fatal_hardware() {
        // No catalog entry has this action today; the first one added (a
        // repair pending until the next reset) must degrade, not quarantine.
        let info = XidInfo {
            code: 0,
            mnemonic: "TEST",
            meaning: "a row remap waits for the next reset",
            cause: XidCause::Hardware,
            action: XidAction::DrainAndReset,
            follow_up: XidFollowUp::None,
            contained: false,
        };
        assert!(!info.is_fatal_hardware());
        let reset = XidInfo {
            action: XidAction::ResetGpu,
            ..info
        };
        assert!(reset.is_fatal_hardware());
    }
}

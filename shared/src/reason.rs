//! Stable reason codes: why a GPU changed state, why a CDU left normal
//! operation, why a command was refused.
//!
//! A reason is a number on the wire and a short name in JSON and on the
//! console (`xid-79`, `dbe-volatile`). Numbers never change meaning; new
//! reasons get new numbers, and a reader that does not know one shows it as
//! `reason-<n>` instead of failing.
//!
//! Glossary:
//! - `1..=999`: the XID of that number (`xid-<n>`), see [`crate::xid`].
//! - `1000..`: reasons of the health engine (GPU state).
//! - `2000..`: reasons of the cooling controller (CDU state, cap leases).

use core::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A stable reason code (see the module note).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ReasonCode(pub u16);

macro_rules! reasons {
    ($( $(#[$m:meta])* $name:ident = $code:expr => $label:literal, )+) => {
        impl ReasonCode {
            $( $(#[$m])* pub const $name: ReasonCode = ReasonCode($code); )+

            /// Every named reason (XIDs excepted) with its name.
            pub const NAMED: &'static [(ReasonCode, &'static str)] = &[ $( (ReasonCode($code), $label), )+ ];
        }
    };
}

reasons! {
    /// Nothing wrong.
    OK = 0 => "ok",
    /// A volatile double-bit ECC error count above zero.
    DBE_VOLATILE = 1000 => "dbe-volatile",
    /// Retired pages at or above the limit (DCGM: 63 with no remapping).
    RETIRED_PAGES_LIMIT = 1001 => "retired-pages-limit",
    /// A page retirement is pending: takes effect at the next reset.
    RETIRED_PENDING = 1002 => "retired-pending",
    /// Row remapping failed: no spare rows are left.
    REMAP_FAILURE = 1003 => "remap-failure",
    /// A row remap is pending: takes effect at the next reset.
    REMAP_PENDING = 1004 => "remap-pending",
    /// PCIe replays above the rate DCGM allows (8 per minute).
    PCIE_REPLAY_RATE = 1005 => "pcie-replay-rate",
    /// NVLink replay or recovery errors.
    NVLINK_ERRORS = 1006 => "nvlink-errors",
    /// The GPU keeps missing its sampling deadline.
    UNRESPONSIVE = 1007 => "unresponsive",
    /// The corrected (single-bit) ECC error rate is accelerating.
    SBE_RATE_RISING = 1008 => "sbe-rate-rising",
    /// The GPU runs hot for its power and its coolant: a bad cold plate.
    HOT_FOR_POWER = 1009 => "hot-for-power",
    /// Clocks behind its peers at the same load without an explained reason.
    STRAGGLER = 1010 => "straggler",
    /// An operator released the GPU.
    OPERATOR_RELEASE = 1011 => "operator-release",
    /// A quiet period passed without new evidence.
    QUIET_PERIOD = 1012 => "quiet-period",
    /// The host's loop reports trouble: the heat is the cooling's fault.
    COOLING_FAULT = 1013 => "cooling-fault",
    /// The health state kept in flash from before a restart could not be
    /// read (or the GPU's UUID, which matches it, is unknown): the GPU may
    /// have been quarantined, so it is marked degraded, not taken as
    /// healthy.
    KEPT_STATE_UNREADABLE = 1014 => "kept-state-unreadable",
    /// The driver reports the GPU lost (fallen off the bus): it needs a
    /// reset or a reboot, however many of its peers are lost with it.
    GPU_LOST = 1015 => "gpu-lost",
    /// The driver names a recovery action the GPU needs (NVML's GPU
    /// recovery action): a reset or a reboot quarantines, draining
    /// degrades.
    RECOVERY_ACTION = 1016 => "recovery-action",
    /// The controller is booting and waits for every required sensor.
    BOOTING = 2000 => "booting",
    /// A required sensor stopped reporting.
    SENSOR_LOST = 2001 => "sensor-lost",
    /// A sensor disagrees with the others or the GPUs (stuck or drifting).
    SENSOR_IMPLAUSIBLE = 2002 => "sensor-implausible",
    /// A leak was detected.
    LEAK = 2003 => "leak",
    /// A pump tripped.
    PUMP_TRIP = 2004 => "pump-trip",
    /// Heat rejection cannot carry the load: capacity is short.
    CAPACITY_SHORT = 2005 => "capacity-short",
    /// A rack's cooling was isolated (its valve is closed).
    COOLING_LOST = 2006 => "cooling-lost",
    /// The GPUs run above their operating margin.
    OVER_TEMPERATURE = 2007 => "over-temperature",
    /// The controller cannot reach the CDU.
    CDU_UNREACHABLE = 2008 => "cdu-unreachable",
    /// A facility power budget asks for the cap.
    POWER_BUDGET = 2009 => "power-budget",
    /// A pump reports running but moves no water (seized, or its shaft or
    /// coupling broke).
    PUMP_SEIZED = 2010 => "pump-seized",
    /// A leaking rack's valve did not confirm closed: the secondary pumps
    /// are stopped and every host of the CDU is capped.
    ISOLATION_FAILED = 2011 => "isolation-failed",
    /// A rack's leak sensing is lost (rope cut or shorted, input lines
    /// failing, or no rope).
    LEAK_SENSING_LOST = 2012 => "leak-sensing-lost",
    /// The CDU refuses the controller's writes (local mode at its panel).
    CDU_WRITES_REFUSED = 2013 => "cdu-writes-refused",
    /// A required sensor is under a fault and the controller runs on an
    /// estimate of it from the others (heat balance, pump curve, GPUs).
    SENSOR_ESTIMATED = 2014 => "sensor-estimated",
    /// The CDU's controller runs on a microcontroller, and its gateway to
    /// the bus has heard nothing from it for 3 s: the gateway says so for
    /// it (the CDU falls back on its heartbeat).
    CONTROLLER_SILENT = 2015 => "controller-silent",
    /// The controller holds the CDU's heartbeat back (does not write it):
    /// the CDU echoed a safety setting (valves, pumps to run, lead pump)
    /// that it does not hold, so it runs on its own control until one
    /// reads back held.
    HEARTBEAT_HELD = 2016 => "heartbeat-held",
}

impl ReasonCode {
    /// The code of XID `xid`, if `xid` is in `1..=999`.
    pub const fn xid(xid: u16) -> Option<ReasonCode> {
        if xid >= 1 && xid <= 999 {
            Some(ReasonCode(xid))
        } else {
            None
        }
    }

    /// The XID this reason stands for, if any.
    pub const fn as_xid(self) -> Option<u16> {
        if self.0 >= 1 && self.0 <= 999 {
            Some(self.0)
        } else {
            None
        }
    }

    /// The name of a named reason (not an XID, not an unknown code).
    pub fn name(self) -> Option<&'static str> {
        Self::NAMED
            .iter()
            .find(|(c, _)| *c == self)
            .map(|(_, n)| *n)
    }

    /// Parses a name as [`fmt::Display`] writes it.
    pub fn parse(s: &str) -> Option<ReasonCode> {
        if let Some((c, _)) = Self::NAMED.iter().find(|(_, n)| *n == s) {
            return Some(*c);
        }
        if let Some(n) = s.strip_prefix("xid-") {
            return n.parse().ok().and_then(ReasonCode::xid);
        }
        s.strip_prefix("reason-")
            .and_then(|n| n.parse().ok())
            .map(ReasonCode)
            .filter(|c| c.name().is_none() && c.as_xid().is_none())
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.name() {
            f.write_str(name)
        } else if let Some(xid) = self.as_xid() {
            write!(f, "xid-{xid}")
        } else {
            write!(f, "reason-{}", self.0)
        }
    }
}

impl Serialize for ReasonCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_str(self)
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for ReasonCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            // Longer than any name `Display` writes; longer input is refused.
            let s = <heapless::String<32>>::deserialize(d)?;
            // Named so that `Frame::from_json` can say which and where.
            ReasonCode::parse(&s).ok_or_else(|| {
                serde::de::Error::custom(format_args!("unknown reason {:?}", s.as_str()))
            })
        } else {
            u16::deserialize(d).map(ReasonCode)
        }
    }
}

#[cfg(feature = "std")]
impl schemars::JsonSchema for ReasonCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ReasonCode".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: std::vec::Vec<&str> = Self::NAMED.iter().map(|(_, n)| *n).collect();
        schemars::json_schema!({
            "description": "a stable reason code: a named reason, xid-<n> or reason-<n>",
            "anyOf": [
                { "enum": names },
                { "type": "string", "pattern": "^(xid|reason)-[0-9]{1,5}$" }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for code in [0u16, 79, 999, 1000, 1013, 2009, 4242, 65535] {
            let c = ReasonCode(code);
            let mut s = heapless::String::<16>::new();
            fmt::Write::write_fmt(&mut s, format_args!("{c}")).unwrap();
            assert_eq!(ReasonCode::parse(&s), Some(c), "{s}");
        }
        assert_eq!(ReasonCode::parse("xid-0"), None);
        assert_eq!(ReasonCode::parse("reason-79"), None, "79 is written xid-79");
        assert_eq!(ReasonCode::parse("nonsense"), None);
    }

    /// Regression: `retired-pages-limit` did not fit the 16-byte buffer the
    /// JSON reader used, found by the JSON round-trip property test.
    #[cfg(feature = "std")]
    #[test]
    fn every_named_reason_round_trips_through_json() {
        for (code, name) in ReasonCode::NAMED {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, std::format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<ReasonCode>(&json).unwrap(), *code);
        }
    }

    #[test]
    fn codes_are_unique() {
        for (i, (a, _)) in ReasonCode::NAMED.iter().enumerate() {
            for (b, _) in &ReasonCode::NAMED[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}

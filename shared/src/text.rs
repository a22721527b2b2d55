//! Events and states as people read them: one sentence per event, in the
//! words a field engineer uses ("pump A tripped; lag pump started",
//! "GPU 5: healthy → quarantined (xid-79)"), for the live view, the
//! consoles and the logs. The JSON form and the frames stay as they are;
//! only what is shown to a person reads through here.
//!
//! Every type gets [`core::fmt::Display`], so `format!("{event}")` is the
//! sentence; a sentence names its GPU, rack or pump but not its node (the
//! caller, who knows the topic, writes `"r0h3: {event}"`). No sentence
//! contains a brace: Rust's debug text never reaches a person.
//!
//! Glossary:
//! - *GPU set*: a bit mask of GPU indices, written as ranges
//!   (`GPUs 0-3,6`; one GPU is `GPU 6`).
//! - *latch*: a fault that stays until an operator clears it (a leak, a
//!   seized or tripped pump).

use core::fmt;

use crate::message::{
    AckCode, CapLease, CapSource, CduMode, CduSetting, CoolingStep, Event, EventClass, GpuCap,
    GpuSelector, HealthState, Pump, QuarantineRelease, ResendCode, Sensor, SensorFault,
};
use crate::units::DurationMs;
use crate::xid::{self, XidAction, XidCause};

/// A set of GPUs (one bit per index) as people write it: `GPU 6`,
/// `GPUs 0-3,6`, `no GPU`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSet(pub u16);

impl fmt::Display for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_set(f, self.0, "GPU")
    }
}

/// A set of racks (one bit per index): `rack 2`, `racks 0-1,4`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RackSet(pub u16);

impl fmt::Display for RackSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_set(f, self.0, "rack")
    }
}

/// A set of `thing`s (one bit per index): `no GPU`, `GPU 6`, `GPUs 0-3,6`.
fn write_set(f: &mut fmt::Formatter<'_>, mask: u16, thing: &str) -> fmt::Result {
    match mask.count_ones() {
        0 => write!(f, "no {thing}"),
        1 => write!(f, "{thing} {}", mask.trailing_zeros()),
        _ => {
            write!(f, "{thing}s ")?;
            write_ranges(f, mask as u32, 16)
        }
    }
}

/// The set bits of `mask` below `width` as `0-3,6`.
fn write_ranges(f: &mut fmt::Formatter<'_>, mask: u32, width: u32) -> fmt::Result {
    let mut first = true;
    let mut i = 0;
    while i < width {
        if mask & (1 << i) == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i + 1 < width && mask & (1 << (i + 1)) != 0 {
            i += 1;
        }
        if !first {
            f.write_str(",")?;
        }
        first = false;
        match i - start {
            0 => write!(f, "{start}")?,
            _ => write!(f, "{start}-{i}")?,
        }
        i += 1;
    }
    Ok(())
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Quarantined => "quarantined",
        })
    }
}

impl fmt::Display for CduMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CduMode::Boot => "booting",
            CduMode::Normal => "normal",
            CduMode::Degraded => "degraded",
            CduMode::Failsafe => "failsafe",
        })
    }
}

impl fmt::Display for Pump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pump::A => "pump A",
            Pump::B => "pump B",
        })
    }
}

impl fmt::Display for Sensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sensor::SupplyTemp => "supply temperature",
            Sensor::ReturnTemp => "return temperature",
            Sensor::Flow => "flow",
            Sensor::DiffPressure => "differential pressure",
            Sensor::FacilitySupplyTemp => "facility supply temperature",
            Sensor::ReservoirLevel => "reservoir level",
            Sensor::PumpFeedback => "pump feedback",
            Sensor::LeakInput => "leak input",
            Sensor::ItPower => "IT power",
            Sensor::CoolingPower => "cooling power",
            Sensor::FacilityPower => "facility power",
            Sensor::OutdoorTemp => "outdoor temperature",
            Sensor::ValvePosition => "valve position",
        })
    }
}

impl fmt::Display for SensorFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SensorFault::Stuck => "stuck (its reading stopped changing)",
            SensorFault::Drift => "drifting from what the others imply",
            SensorFault::Lost => "lost (no answer)",
            SensorFault::Implausible => "implausible (out of range or against physics)",
            SensorFault::Cleared => "reads plausibly again",
        })
    }
}

impl fmt::Display for CapSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CapSource::ThermalGuard => "the thermal guard",
            CapSource::Cooling => "the cooling",
            CapSource::FacilityBudget => "the facility's power budget",
            CapSource::Operator => "an operator",
        })
    }
}

impl fmt::Display for CoolingStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CoolingStep::Drain => "drain",
            CoolingStep::PowerDown => "power-down",
            CoolingStep::PowerUp => "power-up",
            CoolingStep::Resume => "resume",
        })
    }
}

impl fmt::Display for AckCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AckCode::Ok => "done",
            AckCode::Clamped => "done, raised to the GPU's minimum or shortened",
            AckCode::UnknownGpu => "refused: no such GPU",
            AckCode::Malformed => "refused: malformed",
            AckCode::Expired => "refused: expired on arrival",
            AckCode::Unauthenticated => "refused: signature not verified",
            AckCode::Replayed => "refused: replayed",
            AckCode::Failed => "failed on the device",
            AckCode::Unsupported => "refused: not taken by this node",
            AckCode::NotQuarantined => "refused: the GPU is not quarantined",
            AckCode::TooLong => "refused: lease too long",
            AckCode::TooMany => "refused: too many leases",
            AckCode::Forbidden => "refused: the signer may not do this",
        })
    }
}

impl fmt::Display for ResendCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResendCode::Ok => "resent",
            ResendCode::Limited => "resent in part: the rate limit stopped it",
            ResendCode::Malformed => "refused: malformed range",
            ResendCode::Unauthenticated => "refused: signature not verified",
            ResendCode::Forbidden => "refused: the signer may not ask for resends",
            ResendCode::Replayed => "refused: replayed",
            ResendCode::Unavailable => "failed: the log could not be read",
        })
    }
}

impl fmt::Display for XidAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XidAction::Ignore => "nothing to do",
            XidAction::RestartApp => "restart the application",
            XidAction::DrainAndReset => "drain, then reset the GPU",
            XidAction::ResetGpu => "reset the GPU",
            XidAction::RebootNode => "reboot the node",
            XidAction::FollowRecoveryAction => "follow the recovery action in the detail",
        })
    }
}

impl fmt::Display for XidCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XidCause::Hardware => "hardware",
            XidCause::Application => "application",
            XidCause::DriverFirmware => "driver or firmware",
            XidCause::System => "host system",
        })
    }
}

impl fmt::Display for GpuCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.gpus {
            GpuSelector::All => write!(f, "all GPUs to {}", self.limit),
            GpuSelector::Gpu(g) => write!(f, "{g} to {}", self.limit),
        }
    }
}

/// A duration as people write it: `30 s`, `1.5 s`, `250 ms`.
struct Span(DurationMs);

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0 .0;
        match ms {
            0..=999 => write!(f, "{ms} ms"),
            _ if ms % 1000 == 0 => write!(f, "{} s", ms / 1000),
            _ => write!(f, "{}.{} s", ms / 1000, ms % 1000 / 100),
        }
    }
}

/// `lease 12 from the cooling (capacity-short): all GPUs to 300 W for 30 s`
/// (the signature is not shown).
impl fmt::Display for CapLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {} from {} ({}): ",
            self.lease, self.source, self.reason
        )?;
        for (i, c) in self.caps.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c}")?;
        }
        if self.caps.is_empty() {
            f.write_str("no cap")?;
        }
        write!(f, " for {}", Span(self.duration))
    }
}

/// `release GPU 3 by alice: reseated` (the signature is not shown).
impl fmt::Display for QuarantineRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "release {} by {}: {}",
            self.gpu, self.operator, self.note
        )
    }
}

/// How a command (drain, cooling-loss action) ended: `ran` or why not.
struct Outcome {
    ok: bool,
    exit_code: Option<i32>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ok, self.exit_code) {
            (true, _) => f.write_str("ran"),
            (false, Some(c)) => write!(f, "failed (exit status {c})"),
            (false, None) => f.write_str("did not finish in time (killed)"),
        }
    }
}

/// A limit in force, and why: `capped to 300 W by the cooling`, or
/// `uncapped (limit 700 W)`.
struct Limit {
    limit: crate::units::Watts,
    source: Option<CapSource>,
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            Some(s) => write!(f, "capped to {} by {s}", self.limit),
            None => write!(f, "uncapped (limit {})", self.limit),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Xid { gpu, xid } => xid_sentence(f, *gpu, *xid),
            Event::HealthChanged {
                gpu,
                from,
                to,
                reason,
            } => write!(f, "{gpu}: {from} → {to} ({reason})"),
            Event::CapApplied { gpu, limit, source } => {
                let (limit, source) = (*limit, *source);
                write!(f, "{gpu} {}", Limit { limit, source })
            }
            Event::CapsApplied {
                gpus,
                limit,
                source,
            } => {
                let (limit, source) = (*limit, *source);
                write!(f, "{} {}", GpuSet(*gpus), Limit { limit, source })
            }
            Event::PowerCeiling { gpus, ceiling, was } => write!(
                f,
                "{}: power limit changed outside the agent; uncapped limit now {ceiling} (was {was})",
                GpuSet(*gpus)
            ),
            Event::QuarantineAction { gpu, ok, exit_code } => {
                let (ok, exit_code) = (*ok, *exit_code);
                write!(f, "{gpu}: drain command {}", Outcome { ok, exit_code })
            }
            Event::QuarantineReleased {
                gpu,
                operator,
                note,
            } => write!(f, "{gpu} released from quarantine by {operator}: {note}"),
            Event::CoolingAttributed { gpus, reason } => write!(
                f,
                "{} run hot because of the cooling ({reason}), not a GPU fault",
                GpuSet(*gpus)
            ),
            _ if self.class() == EventClass::Cooling => cooling_sentence(f, self),
            _ => host_sentence(f, self),
        }
    }
}

/// `GPU 5: XID 79, GPU has fallen off the bus: …; reboot the node`.
fn xid_sentence(f: &mut fmt::Formatter<'_>, gpu: crate::ids::GpuIndex, code: u16) -> fmt::Result {
    match xid::lookup(code) {
        Some(x) => write!(f, "{gpu}: XID {code}, {}; {}", x.meaning, x.action),
        None => write!(f, "{gpu}: XID {code} (not in the catalog)"),
    }
}

/// The sentences of the CDU's and the host's cooling and monitoring events.
fn cooling_sentence(f: &mut fmt::Formatter<'_>, e: &Event) -> fmt::Result {
    match e {
        Event::Leak { rack, active } => {
            let what = if *active {
                "leak detected"
            } else {
                "leak cleared"
            };
            write!(f, "rack {}: {what}", rack.get())
        }
        Event::CduModeChanged { from, to, reason } => {
            write!(f, "CDU mode {from} → {to} ({reason})")
        }
        Event::PumpTrip { pump, lag_started } => {
            write!(f, "{pump} tripped; {}", lag(*lag_started))
        }
        Event::PumpSeized { pump, lag_started } => write!(
            f,
            "{pump} runs but moves no water: out of service until cleared; {}",
            lag(*lag_started)
        ),
        Event::SensorFault {
            sensor,
            rack,
            fault,
        } => match rack {
            Some(r) => write!(f, "rack {} {sensor} sensor {fault}", r.get()),
            None => write!(f, "{sensor} sensor {fault}"),
        },
        Event::LeakSensing { rack, lost } => match lost {
            true => write!(
                f,
                "rack {}: leak sensing lost (rope cut or shorted, or its input failing)",
                rack.get()
            ),
            false => write!(f, "rack {}: leak sensing back", rack.get()),
        },
        Event::IsolationFailed { rack, active } => match active {
            true => write!(
                f,
                "rack {}: valve did not confirm closed; secondary pumps stopped, every host capped",
                rack.get()
            ),
            false => write!(
                f,
                "rack {}: isolated at last; pumps may run again",
                rack.get()
            ),
        },
        Event::OperatorCleared {
            rack,
            pump,
            operator,
        } => match (rack, pump) {
            (Some(r), _) => write!(f, "{operator} cleared rack {}'s leak latch", r.get()),
            (None, Some(p)) => write!(f, "{operator} put {p} back in service"),
            (None, None) => write!(f, "{operator} cleared nothing"),
        },
        Event::SettingLimited {
            setting,
            wanted_centi,
            written_centi,
            active,
        } => {
            let (name, unit) = match setting {
                CduSetting::SupplySetpoint => ("supply setpoint", " °C"),
                CduSetting::PumpSpeed => ("pump speed", " %"),
            };
            let v = |c: &i32| *c as f64 / 100.0;
            match active {
                true => write!(
                    f,
                    "{name} {:.1}{unit} is outside the CDU's register map: {:.1}{unit} written",
                    v(wanted_centi),
                    v(written_centi)
                ),
                false => write!(
                    f,
                    "{name} within the CDU's register map again ({:.1}{unit})",
                    v(wanted_centi)
                ),
            }
        }
        _ => unreachable!("Event's fmt sends only the CDU's events here"),
    }
}

/// `lag pump started` or not.
fn lag(started: bool) -> &'static str {
    if started {
        "lag pump started"
    } else {
        "no lag pump started"
    }
}

/// The sentences of restarts, stalls and host actions.
fn host_sentence(f: &mut fmt::Formatter<'_>, e: &Event) -> fmt::Result {
    match e {
        Event::ControllerRestored {
            leaks_latched,
            pumps_out,
            lead,
        } => {
            f.write_str("controller restarted; restored from flash: ")?;
            match leaks_latched {
                0 => f.write_str("no leak latched")?,
                m => write!(f, "leak latched on {}", RackSet(*m))?,
            }
            match pumps_out & 0b11 {
                0 => f.write_str(", no pump out of service")?,
                0b01 => f.write_str(", pump A out of service")?,
                0b10 => f.write_str(", pump B out of service")?,
                _ => f.write_str(", both pumps out of service")?,
            }
            write!(f, ", lead {lead}")
        }
        Event::HostStalled { gpus, .. } => write!(
            f,
            "{} stopped answering together: a driver or host stall, not a GPU fault",
            GpuSet(*gpus)
        ),
        Event::HostResumed { .. } => f.write_str("the GPUs answer again after a stall"),
        Event::XidWatch { running } => f.write_str(match running {
            true => "XID watch runs again",
            false => "XID watch stopped; restarting it (XIDs are not seen meanwhile)",
        }),
        Event::CoolingAction {
            step,
            ok,
            exit_code,
        } => {
            let (ok, exit_code) = (*ok, *exit_code);
            write!(
                f,
                "cooling-loss {step} command {}",
                Outcome { ok, exit_code }
            )
        }
        _ => unreachable!("Event's fmt sends only these events here"),
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::String;

    use super::*;
    use crate::ids::{GpuIndex, Ident, RackIndex, Text};
    use crate::reason::ReasonCode;
    use crate::units::{TimestampMs, Watts};

    fn gpu(i: u8) -> GpuIndex {
        GpuIndex::new(i).unwrap()
    }

    fn rack(i: u8) -> RackIndex {
        RackIndex::new(i).unwrap()
    }

    #[test]
    fn gpu_sets_read_as_ranges() {
        assert_eq!(format!("{}", GpuSet(0)), "no GPU");
        assert_eq!(format!("{}", GpuSet(1 << 6)), "GPU 6");
        assert_eq!(format!("{}", GpuSet(0xff)), "GPUs 0-7");
        assert_eq!(format!("{}", GpuSet(0b0100_1111)), "GPUs 0-3,6");
        assert_eq!(format!("{}", GpuSet(0b1010)), "GPUs 1,3");
        assert_eq!(format!("{}", GpuSet(0xc000)), "GPUs 14-15");
        assert_eq!(format!("{}", RackSet(0b101)), "racks 0,2");
    }

    #[test]
    fn the_issues_examples_read_as_sentences() {
        let mode = Event::CduModeChanged {
            from: CduMode::Boot,
            to: CduMode::Normal,
            reason: ReasonCode(0),
        };
        assert_eq!(format!("{mode}"), "CDU mode booting → normal (ok)");
        let x = format!(
            "{}",
            Event::Xid {
                gpu: gpu(5),
                xid: 79
            }
        );
        assert!(
            x.starts_with("GPU 5: XID 79, GPU has fallen off the bus"),
            "{x}"
        );
        assert!(x.ends_with("; reboot the node"), "{x}");
        let caps = Event::CapsApplied {
            gpus: 0xff,
            limit: Watts(200),
            source: Some(CapSource::Cooling),
        };
        assert_eq!(format!("{caps}"), "GPUs 0-7 capped to 200 W by the cooling");
        let lifted = Event::CapApplied {
            gpu: gpu(2),
            limit: Watts(700),
            source: None,
        };
        assert_eq!(format!("{lifted}"), "GPU 2 uncapped (limit 700 W)");
        let ceiling = Event::PowerCeiling {
            gpus: 0b1,
            ceiling: Watts(500),
            was: Watts(700),
        };
        assert_eq!(
            format!("{ceiling}"),
            "GPU 0: power limit changed outside the agent; uncapped limit now 500 W (was 700 W)"
        );
        let leak = Event::Leak {
            rack: rack(3),
            active: true,
        };
        assert_eq!(format!("{leak}"), "rack 3: leak detected");
    }

    /// One of every event, with the fields that change the sentence.
    fn every_event() -> std::vec::Vec<Event> {
        let w = Watts(300);
        let t = TimestampMs(1_795_867_200_000);
        let op = Ident::new("alice").unwrap();
        let mut v = std::vec![
            Event::Xid {
                gpu: gpu(1),
                xid: 48
            },
            Event::Xid {
                gpu: gpu(1),
                xid: 999
            },
            Event::HealthChanged {
                gpu: gpu(0),
                from: HealthState::Healthy,
                to: HealthState::Quarantined,
                reason: ReasonCode::DBE_VOLATILE
            },
            Event::CapApplied {
                gpu: gpu(0),
                limit: w,
                source: Some(CapSource::ThermalGuard)
            },
            Event::CapsApplied {
                gpus: 0b11,
                limit: w,
                source: None
            },
            Event::PowerCeiling {
                gpus: 0b100,
                ceiling: Watts(500),
                was: Watts(700)
            },
            Event::QuarantineReleased {
                gpu: gpu(3),
                operator: op.clone(),
                note: Text::new("reseated").unwrap()
            },
            Event::CoolingAttributed {
                gpus: 0xf,
                reason: ReasonCode::COOLING_FAULT
            },
            Event::Leak {
                rack: rack(1),
                active: false
            },
            Event::PumpTrip {
                pump: Pump::A,
                lag_started: true
            },
            Event::PumpSeized {
                pump: Pump::B,
                lag_started: false
            },
            Event::SensorFault {
                sensor: Sensor::Flow,
                rack: None,
                fault: SensorFault::Stuck
            },
            Event::SensorFault {
                sensor: Sensor::LeakInput,
                rack: Some(rack(2)),
                fault: SensorFault::Cleared
            },
            Event::LeakSensing {
                rack: rack(0),
                lost: true
            },
            Event::LeakSensing {
                rack: rack(0),
                lost: false
            },
            Event::IsolationFailed {
                rack: rack(4),
                active: true
            },
            Event::IsolationFailed {
                rack: rack(4),
                active: false
            },
            Event::SettingLimited {
                setting: CduSetting::SupplySetpoint,
                wanted_centi: 1_400,
                written_centi: 1_700,
                active: true,
            },
            Event::SettingLimited {
                setting: CduSetting::PumpSpeed,
                wanted_centi: 4_000,
                written_centi: 4_000,
                active: false,
            },
            Event::SensorFault {
                sensor: Sensor::ValvePosition,
                rack: Some(rack(0)),
                fault: SensorFault::Implausible
            },
            Event::ControllerRestored {
                leaks_latched: 0b110,
                pumps_out: 1,
                lead: Pump::B
            },
            Event::ControllerRestored {
                leaks_latched: 0,
                pumps_out: 0,
                lead: Pump::A
            },
            Event::OperatorCleared {
                rack: Some(rack(2)),
                pump: None,
                operator: op.clone()
            },
            Event::OperatorCleared {
                rack: None,
                pump: Some(Pump::A),
                operator: op
            },
            Event::HostStalled {
                gpus: 0xff,
                since: t
            },
            Event::HostResumed { stalled_since: t },
            Event::XidWatch { running: false },
            Event::XidWatch { running: true },
        ];
        for (ok, exit_code) in [(true, Some(0)), (false, Some(3)), (false, None)] {
            v.push(Event::QuarantineAction {
                gpu: gpu(7),
                ok,
                exit_code,
            });
            v.push(Event::CoolingAction {
                step: CoolingStep::PowerDown,
                ok,
                exit_code,
            });
        }
        v
    }

    #[test]
    fn no_sentence_has_debug_text() {
        for e in every_event() {
            let s: String = format!("{e}");
            assert!(!s.is_empty(), "{e:?}");
            for bad in ['{', '}', '('] {
                if bad == '(' {
                    // Parentheses are words' business; debug text shows
                    // as `Name(`.
                    assert!(!s.contains("Index("), "{s}");
                    continue;
                }
                assert!(!s.contains(bad), "{s}");
            }
            assert!(!s.contains("Some") && !s.contains("None"), "{s}");
            assert!(!s.contains('_'), "{s}");
        }
    }

    #[test]
    fn commands_read_without_their_signature() {
        use crate::frame::{Message, MessageKind};
        let Message::CapLease(l) = crate::samples::message(MessageKind::CapLease) else {
            panic!("the sample lease");
        };
        let s = format!("{l}");
        assert!(s.starts_with(&format!("lease {} from ", l.lease)), "{s}");
        assert!(s.contains(" to ") && s.contains(" for "), "{s}");
        assert!(
            !s.contains('{') && !s.contains("auth") && !s.contains("Some"),
            "{s}"
        );
        let Message::QuarantineRelease(r) = crate::samples::message(MessageKind::QuarantineRelease)
        else {
            panic!("the sample release");
        };
        assert_eq!(
            format!("{r}"),
            format!("release {} by {}: {}", r.gpu, r.operator, r.note)
        );
        assert_eq!(format!("{}", Span(DurationMs(30_000))), "30 s");
        assert_eq!(format!("{}", Span(DurationMs(1_500))), "1.5 s");
        assert_eq!(format!("{}", Span(DurationMs(250))), "250 ms");
    }

    #[test]
    fn outcomes_say_how_a_command_ended() {
        let ran = Event::QuarantineAction {
            gpu: gpu(7),
            ok: true,
            exit_code: Some(0),
        };
        assert_eq!(format!("{ran}"), "GPU 7: drain command ran");
        let killed = Event::CoolingAction {
            step: CoolingStep::Drain,
            ok: false,
            exit_code: None,
        };
        assert_eq!(
            format!("{killed}"),
            "cooling-loss drain command did not finish in time (killed)"
        );
    }
}

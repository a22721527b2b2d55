//! What the microcontroller and its gateway say to each other.
//!
//! Into the MCU ([`Down`]) comes what the bus and the facility give a CDU
//! controller: the gateway's heartbeat with the wall clock, host reports,
//! the BMS's limits and outdoor temperature, the hall's facility target,
//! and operators' clears, signed by the operator (the MCU checks the
//! signature itself: the gateway cannot forge one). Out of it ([`Up`])
//! goes what a controller tells the bus: its state every step, its
//! events, the cap leases it asks of its hosts, its offer to the hall's
//! facility coordinator when it moves, and what it has to say.
//!
//! The gateway decides nothing: it turns each [`Up`] into the messages
//! `cooling-ctrl run` would publish, and each bus message into a [`Down`].
//!
//! Glossary:
//! - *MCU clock*: ms since the MCU started, from its hardware timer.
//! - *wall clock*: Unix ms, which the MCU knows only from the gateway's
//!   [`Down::Alive`].
//! - *clear*: an operator's request to clear a latched leak or put a
//!   tripped pump back in service.

use cooling_decide::CduMeasurements;
use heapless::String;
use loopwarden_protocol::ids::Ident;
use loopwarden_protocol::message::{
    CapLease, CduMode, Event, FacilityOffer, HostTelemetry, Pump, SensorFault,
};
use loopwarden_protocol::units::TimestampMs;
use loopwarden_protocol::ReasonCode;
use serde::{Deserialize, Serialize};

/// The longest message either way, postcard bytes (a host report of 16
/// GPUs is the largest).
pub const MAX_MESSAGE: usize = 1536;

/// Words of a [`Up::Said`] line.
pub const SAID_MAX: usize = 120;

/// Into the MCU, from the gateway.
// No allocator to box a host report in: messages are made and read one
// at a time, in static buffers.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Down {
    /// The gateway is alive (sent every second, and at once when the MCU
    /// starts): the wall clock, whether it is connected to the broker,
    /// and the layout it maps host ids and racks by. The MCU takes no host
    /// report and sends no status or lease while that layout is not its
    /// own ([`CduLayout`]).
    Alive {
        /// Unix ms.
        unix_ms: u64,
        /// Connected to the broker.
        bus: bool,
        /// The gateway's layout of this CDU.
        layout: CduLayout,
    },
    /// A host's telemetry as the bus carried it.
    Host {
        /// The host's index in the CDU's layout (rack-major), from the
        /// gateway's list of this CDU's hosts.
        index: u16,
        /// The frame's timestamp.
        stamped: TimestampMs,
        /// The report.
        telemetry: HostTelemetry,
    },
    /// The BMS wrote its limits.
    Limits {
        /// Highest supply setpoint the BMS allows, °C.
        ceiling_c: f32,
        /// Offset the BMS adds to the setpoint, K.
        offset_k: f32,
    },
    /// The BMS wrote the outdoor temperature, °C.
    Outdoor(f32),
    /// The hall's facility coordinator set the facility water, °C.
    FacilityTarget(f32),
    /// An operator asks to clear a latch, signed.
    Clear(SignedClear),
}

/// A CDU's layout, by which both ends index its hosts (rack-major) and
/// its racks: the MCU's from the figures built into its image, the
/// gateway's from its configuration. Where they differ, a host index or a
/// rack bit means another host or rack on each end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CduLayout {
    /// Racks.
    pub racks: u8,
    /// Hosts per rack.
    pub hosts_per_rack: u8,
    /// GPUs per host.
    pub gpus_per_host: u8,
}

impl From<&cooling_core::config::Layout> for CduLayout {
    fn from(l: &cooling_core::config::Layout) -> Self {
        Self {
            racks: l.racks,
            hosts_per_rack: l.hosts_per_rack,
            gpus_per_host: l.gpus_per_host,
        }
    }
}

impl core::fmt::Display for CduLayout {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} racks of {} hosts of {} GPUs",
            self.racks, self.hosts_per_rack, self.gpus_per_host
        )
    }
}

/// What an operator clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClearAction {
    /// The latched leak of this rack (index).
    Leak(u8),
    /// This tripped or seized pump, back in service.
    Pump(Pump),
}

/// An operator's clear, as signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clear {
    /// The request's number, unique per operator; it only rises (a
    /// replay is refused).
    pub id: u32,
    /// The CDU it is for, by name (a clear signed for one CDU does not
    /// act on another).
    pub cdu: Ident,
    /// Who asks.
    pub operator: Ident,
    /// When it was signed, wall clock (stale ones are refused).
    pub at: TimestampMs,
    /// What.
    pub action: ClearAction,
}

/// A clear with the operator's Ed25519 signature over [`Clear`]'s
/// postcard bytes, after the context `b"loopwarden-link clear\0"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedClear {
    /// The request.
    pub clear: Clear,
    /// Which of the operator's keys signed.
    pub key_id: u8,
    /// The signature: R, then S.
    pub signature: [[u8; 32]; 2],
}

/// The context signed before a clear's bytes.
pub const CLEAR_CONTEXT: &[u8] = b"loopwarden-link clear\0";

/// Out of the MCU, to the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Up {
    /// The MCU started (the first frame after every start).
    Hello(Hello),
    /// Its state after a step (every step).
    Status(Status),
    /// Something happened (every event, once).
    Event(Event),
    /// A cap lease for a host, to sign and send on its `cmd` topic.
    Lease {
        /// The host's index in the CDU's layout.
        host: u16,
        /// The lease, unsigned.
        lease: CapLease,
        /// A lift: the short lease at the GPU's TDP that ends a cap (the
        /// gateway's flash log tells lifts from caps).
        lift: bool,
    },
    /// The answer to an operator's clear.
    Answer {
        /// The clear's id.
        id: u32,
        /// Done, or why not.
        outcome: Result<(), String<SAID_MAX>>,
    },
    /// A line for the gateway's log.
    Said {
        /// An error (else a warning).
        error: bool,
        /// The words.
        words: String<SAID_MAX>,
    },
    /// What this CDU offers the hall's facility coordinator, as the bus
    /// carries it in the CDU's state: sent when it moved by `run`'s rule
    /// and again every minute while one is made
    /// (`cooling_decide::facility::OfferWatch`); `None`: it no longer
    /// offers. Never sent in a hall of one CDU.
    Offer(Option<FacilityOffer>),
}

/// Why the MCU last started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResetCause {
    /// Power on, or a reset not otherwise known.
    PowerOn,
    /// Its watchdog was not fed in time.
    Watchdog,
    /// It stopped on a fault (a panic or a hard fault).
    Fault,
}

/// The MCU's first frame after a start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Starts since its flash was formatted.
    pub boot: u32,
    /// Why it started.
    pub reset: ResetCause,
    /// The firmware's version.
    pub firmware: String<24>,
    /// It started from a latched record kept in its flash.
    pub restored: bool,
}

/// The MCU's state after one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The step's number since the start.
    pub step: u32,
    /// The step's time, MCU clock.
    pub at_ms: u64,
    /// The mode, why, and since when (MCU clock).
    pub mode: (CduMode, ReasonCode, u64),
    /// Supply setpoint commanded, °C.
    pub setpoint_c: f32,
    /// Pump speed commanded, fraction.
    pub pump_speed: f32,
    /// Pumps A and B commanded on.
    pub pump_on: [bool; 2],
    /// The lead pump.
    pub lead: Pump,
    /// Racks: valves commanded open, cooling lost, leak sensing lost,
    /// isolation failed, leak latched, leak input wet now; bit n = rack n.
    pub racks: RackBits,
    /// Pumps out of service.
    pub pumps_failed: [bool; 2],
    /// The alarm beacon.
    pub beacon: bool,
    /// The fault each sensor stands under (supply, return, flow, facility
    /// supply).
    pub sensor_faults: [Option<SensorFault>; 4],
    /// What the CDU answered (`None`: it did not).
    pub readings: Option<CduMeasurements>,
    /// The outdoor temperature the step used, °C, as measured.
    pub outdoor_c: Option<f32>,
    /// Every write of the step went in.
    pub writes_ok: bool,
    /// Events the core could not report (its list was full), since start.
    pub events_dropped: u32,
    /// What the step cost.
    pub cost: Cost,
}

/// Per-rack facts, bit n = rack n.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RackBits {
    /// Valves open as the CDU took them: its last valve write that went
    /// in (every valve open before any has).
    pub valves_open: u16,
    /// Cooling lost (their hosts must drain and power down).
    pub cooling_lost: u16,
    /// Leak sensing lost by a fault.
    pub sensing_lost: u16,
    /// Isolation failed: both pumps stopped for them.
    pub isolation_failed: u16,
    /// Leak latched.
    pub leaks_latched: u16,
    /// Leak input wet now.
    pub leaks_wet: u16,
}

/// What one step cost the MCU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cost {
    /// Instructions of the decision (the core's step and the plan).
    pub insn: u32,
    /// The most instructions of any step since start.
    pub insn_max: u32,
    /// The deepest the stack has been since start, bytes.
    pub stack_peak: u32,
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::frame::{encode, max_frame, Deframer, Fed};

    const LAYOUT: CduLayout = CduLayout {
        racks: 4,
        hosts_per_rack: 4,
        gpus_per_host: 8,
    };

    #[test]
    fn a_layout_reads_as_the_figures_say_it() {
        let l = CduLayout::from(&cooling_core::CoreConfig::reference().layout);
        assert_eq!(l, LAYOUT);
        assert_eq!(std::format!("{l}"), "4 racks of 4 hosts of 8 GPUs");
    }

    fn through<T: Serialize + serde::de::DeserializeOwned>(m: &T) -> T {
        let mut scratch = [0u8; MAX_MESSAGE + crate::frame::OVERHEAD];
        let mut out = [0u8; max_frame(MAX_MESSAGE)];
        let n = encode(m, 3, &mut scratch, &mut out).unwrap();
        let mut d = Deframer::<{ max_frame(MAX_MESSAGE) }>::default();
        let mut got = None;
        for b in &out[..n] {
            if let Fed::Frame(r) = d.push(*b) {
                got = Some(r.message().unwrap());
            }
        }
        got.unwrap()
    }

    /// An offer with every capped step the bus holds.
    fn offer() -> FacilityOffer {
        let c = |v| loopwarden_protocol::units::Celsius::new(v).unwrap();
        let w = loopwarden_protocol::units::Watts::from_milliwatts;
        let step = |water| loopwarden_protocol::message::OfferStep {
            water: c(water),
            work_lost_centigpus: 37,
            power_saved: w(410_000),
        };
        FacilityOffer {
            accept: c(31.25),
            heat: w(118_000_000),
            at_water: c(31.25),
            heat_per_k: w(200_000),
            work_centigpus: 12_800,
            capped: [32.25, 33.25, 34.25, 36.25].into_iter().map(step).collect(),
        }
    }

    fn cap_lease() -> CapLease {
        match loopwarden_protocol::samples::message(loopwarden_protocol::MessageKind::CapLease) {
            loopwarden_protocol::Message::CapLease(l) => l,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_message_either_way_comes_back_whole() {
        let words = |s: &str| String::try_from(s).unwrap();
        let ups = [
            Up::Hello(Hello {
                boot: 7,
                reset: ResetCause::Watchdog,
                firmware: String::try_from("0.1.0").unwrap(),
                restored: true,
            }),
            Up::Event(Event::PumpTrip {
                pump: Pump::B,
                lag_started: true,
            }),
            Up::Lease {
                host: 13,
                lease: cap_lease(),
                lift: false,
            },
            Up::Answer {
                id: 4,
                outcome: Err(words("rack 2: its rope still reads wet")),
            },
            Up::Answer {
                id: 5,
                outcome: Ok(()),
            },
            Up::Said {
                error: true,
                words: words("the latched record is not in flash"),
            },
            Up::Offer(Some(offer())),
            Up::Offer(None),
        ];
        for up in ups {
            assert_eq!(through(&up), up);
        }
        let clear = SignedClear {
            clear: Clear {
                id: 9,
                cdu: Ident::new("cdu-1").unwrap(),
                operator: Ident::new("jdoe").unwrap(),
                at: TimestampMs(1_700_000_000_000),
                action: ClearAction::Leak(2),
            },
            key_id: 1,
            signature: [[7; 32], [9; 32]],
        };
        let downs = [
            Down::Alive {
                unix_ms: 1_700_000_000_000,
                bus: true,
                layout: LAYOUT,
            },
            Down::Limits {
                ceiling_c: 40.0,
                offset_k: -1.5,
            },
            Down::Outdoor(12.5),
            Down::FacilityTarget(27.0),
            Down::Clear(clear),
        ];
        for down in downs {
            assert_eq!(through(&down), down);
        }
    }

    /// The bytes both sides put on the wire: a change of a message's shape
    /// must be on purpose (and bump [`crate::VERSION`]), never by accident.
    #[test]
    fn the_wire_bytes_stay_as_committed() {
        let alive = Down::Alive {
            unix_ms: 1_700_000_000_000,
            bus: true,
            layout: LAYOUT,
        };
        let mut buf = [0u8; 256];
        let got = postcard::to_slice(&alive, &mut buf).unwrap();
        assert_eq!(
            got,
            [0, 128, 208, 149, 255, 188, 49, 1, 4, 4, 8],
            "the layout last: racks, hosts per rack, GPUs per host"
        );
        let hello = Up::Hello(Hello {
            boot: 3,
            reset: ResetCause::Fault,
            firmware: String::try_from("fw").unwrap(),
            restored: false,
        });
        let got = postcard::to_slice(&hello, &mut buf).unwrap();
        assert_eq!(got, [0, 3, 2, 2, b'f', b'w', 0]);
        let lease = Up::Lease {
            host: 300,
            lease: CapLease {
                caps: heapless::Vec::new(),
                ..cap_lease()
            },
            lift: true,
        };
        let got = postcard::to_slice(&lease, &mut buf).unwrap();
        assert_eq!(&got[..3], [3, 172, 2], "variant, then host 300 as a varint");
        assert_eq!(got.last(), Some(&1), "lift last");
        let mut o = offer();
        o.capped.truncate(1);
        let got = postcard::to_slice(&Up::Offer(Some(o)), &mut buf).unwrap();
        // Variant 6, Some, then the bus's offer as its units' integers:
        // accept 31.25 °C as 3125 (zigzag varint), heat 118,000 W, at
        // 31.25 °C, 200 W/K, 12,800 centi-GPUs, one step.
        let want = [6, 1, 234, 48, 240, 153, 7, 234, 48, 200, 1, 128, 100, 1];
        assert_eq!(&got[..14], want);
        assert_eq!(&got[14..], [178, 50, 37, 154, 3], "32.25 °C, 0.37, 410 W");
    }

    #[test]
    fn a_full_status_and_a_host_report_of_sixteen_gpus_fit_a_frame() {
        let s = Status {
            step: 9,
            at_ms: 9_000,
            mode: (CduMode::Normal, ReasonCode::OK, 1_000),
            setpoint_c: 31.5,
            pump_speed: 0.62,
            pump_on: [true, false],
            lead: Pump::A,
            racks: RackBits {
                valves_open: 0b1011,
                leaks_latched: 0b0100,
                ..RackBits::default()
            },
            pumps_failed: [false, true],
            beacon: true,
            sensor_faults: [None, Some(SensorFault::Stuck), None, None],
            // Every reading present: the longest status.
            readings: Some(CduMeasurements {
                supply_c: Some(31.2),
                return_c: Some(41.9),
                flow_lpm: Some(812.0),
                facility_supply_c: Some(24.0),
                pumps_running: [Some(true), Some(false)],
                leaks: Some(0b0100),
                diff_pressure_kpa: Some(110.0),
                valves_closed: Some(0b0100),
                pump_faults: [Some(false), Some(true)],
                it_w: Some(812_000.0),
                cooling_w: Some(41_000.0),
                facility_w: Some(870_000.0),
                outdoor_c: Some(12.5),
            }),
            outdoor_c: Some(12.5),
            writes_ok: true,
            events_dropped: 0,
            cost: Cost {
                insn: 40_000,
                insn_max: 180_000,
                stack_peak: 7_400,
            },
        };
        assert_eq!(through(&Up::Status(s.clone())), Up::Status(s));
        let t = loopwarden_protocol::samples::host_telemetry(16);
        let down = Down::Host {
            index: 5,
            stamped: TimestampMs(1_700_000_000_000),
            telemetry: t,
        };
        assert_eq!(through(&down), down);
    }
}

//! The gateway's side towards the building management system: what the
//! northbound Modbus server (the same as `run`'s, [`crate::northbound`])
//! shows, and what the BMS's writes become on the link. No I/O and no
//! clock: the gateway hands it the writes, the leases it sent and the
//! MCU's last status with the time, and sends what it returns.
//!
//! Reads: the input registers are the MCU's last [`Status`] in the
//! snapshot's plain values, as `run` fills them from its step, by the
//! same rules (the northbound server's `sensors`, `pump_word` and `Meters`). What the MCU does
//! not say is not available (its type's sentinel), never guessed:
//! `hottest_gpu` (the MCU judges the host reports; which it believed is
//! not said), `proposed_setpoint`, `proposed_speed` and
//! `rejection_short` (the optimiser's state stays on it). `hosts_capped`
//! and `lowest_cap` count the leases the gateway signed and sent for the
//! MCU that have not run out (a lift ends one). `uptime` is the MCU's
//! own (its clock at its last status): it stops when the MCU does. A
//! silent MCU reads as the bus tells it: `failsafe`, `controller-silent`,
//! since its last frame, the racks last heard, nothing measured, and the
//! beacon lit, as failsafe lights it. Before
//! the MCU's first status (booting, or silent from the start) it reads
//! as `run` before its first step: nothing measured, and the setpoint
//! (while booting), the proposals and `rejection_short` not available.
//!
//! Writes: the limits (`setpoint_ceiling`, `plan_ceiling_offset`) go
//! down as [`Down::Limits`] at once, again every [`LIMITS_EVERY_MS`] and
//! at once when the MCU starts again, by its hello or by its frame
//! numbers starting again (it forgets them at a restart, and the gateway
//! outlives it). The outdoor temperature goes down as
//! [`Down::Outdoor`] once per write: the MCU dates it from when it hears
//! it and keeps it for
//! [`BMS_FRESH`](cooling_decide::outdoor::BMS_FRESH) (300 s), so a
//! repeat would make an old value look new. It is in force (the holding
//! register reads it) from when the line took it, as the MCU holds it: one
//! the line did not take (closed, or its queue full) never is, and the
//! value in force is forgotten when the MCU starts again (it holds none
//! then). `alarm_ack` is kept here, as `run` keeps it
//! ([`AlarmAck`]: the holding register, covering what the registers
//! showed alarming as the server took the write, cleared when a snapshot
//! shows anything alarming the acknowledgement did not cover); nothing
//! goes down.
//! The holding registers read what the gateway sent: the MCU does not
//! say what it runs with. The limits are kept in the gateway's flash as
//! `run` keeps them (`crate::journal::BMS_LIMITS_KEY`), so a restart of
//! the gateway, or of the whole cabinet, does not lift them: a BMS
//! writes a limit once, when it changes.
//!
//! Glossary:
//! - *steady ms*: the gateway's monotonic clock, ms since it started.

use std::collections::BTreeMap;

use cooling_core::CoreConfig;
use cooling_decide::outdoor::OutdoorSources;
use loopwarden_link::{Down, Status};
use loopwarden_protocol::message::{CapLease, CduMode, Pump};
use loopwarden_protocol::ReasonCode;

use crate::northbound::{pump_word, sensors, valves_held, valves_shown, Meters};
use crate::northbound::{
    AlarmAck, Alarms, NorthboundSettings, NorthboundSnapshot, NorthboundWrite,
};

/// The limits the BMS wrote go down again this often, ms.
pub const LIMITS_EVERY_MS: u64 = 30_000;

/// A lease the gateway sent for the MCU, while it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LeaseHeld {
    /// The lowest cap in it, W per GPU.
    lowest_w: f32,
    /// It runs out at this steady ms.
    until_ms: u64,
}

/// What the MCU last said, as the snapshot takes it.
#[derive(Debug, Clone, Copy)]
pub enum Heard<'a> {
    /// Nothing yet (and not silent yet): the MCU is booting, as `run`
    /// before its first step.
    Nothing,
    /// Its last status, and it speaks.
    Speaking(&'a Status),
    /// It is silent: for `quiet_ms`, its last status before (if any).
    Silent {
        /// The last status heard.
        last: Option<&'a Status>,
        /// How long since its last status (or the gateway's start), ms.
        quiet_ms: u64,
    },
}

/// What to say of the MCU's line and the BMS's messages
/// ([`BmsBridge::line_took`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTook {
    /// The line refused one, the first of a run.
    Refused,
    /// The line took one again, after refusals.
    Again,
}

/// The gateway's BMS side (see the module note).
#[derive(Debug, Clone)]
pub struct BmsBridge {
    settings: NorthboundSettings,
    outdoor: OutdoorSources,
    /// The BMS has written limits (or they were restored from flash).
    limits_written: bool,
    /// When the limits were last handed to the MCU's line, steady ms
    /// (`None`: not since they were written: due at once).
    limits_sent_ms: Option<u64>,
    /// The MCU's line refused the last of the BMS's messages offered.
    line_refusing: bool,
    /// The BMS's acknowledgement of the alarms the snapshots showed.
    ack: AlarmAck,
    /// A GPU above this is alarming, °C.
    gpu_max_c: f32,
    /// The setpoint a silent MCU that never said one shows, °C.
    failsafe_setpoint_c: f32,
    /// The CDU's racks.
    racks: u8,
    leases: BTreeMap<usize, LeaseHeld>,
}

impl BmsBridge {
    /// Before the BMS wrote anything: the settings of `core` (the ceiling
    /// at the CDU's highest setpoint, no offset).
    pub fn new(core: &CoreConfig) -> Self {
        Self {
            settings: NorthboundSettings::new(core),
            outdoor: OutdoorSources::new(),
            limits_written: false,
            limits_sent_ms: None,
            line_refusing: false,
            ack: AlarmAck::default(),
            gpu_max_c: core.gpu.max_operating_c,
            failsafe_setpoint_c: core.margins.failsafe_setpoint_c,
            racks: core.layout.racks,
            leases: BTreeMap::new(),
        }
    }

    /// The settings the holding registers read at `now_ms`.
    pub fn settings(&self, now_ms: u64) -> NorthboundSettings {
        NorthboundSettings {
            outdoor_c: self.outdoor.bms_fresh(now_ms),
            ..self.settings
        }
    }

    /// The BMS wrote `w`: what goes down for it, if anything.
    /// An `alarm_ack` acknowledges what the BMS had read
    /// ([`AlarmAck::acknowledge`]): one taken after more became alarming
    /// reads 0. An outdoor temperature is in force only once the line
    /// took it ([`BmsBridge::outdoor_handed`]).
    pub fn write(&mut self, w: NorthboundWrite) -> Option<Down> {
        self.settings.apply(w);
        match w {
            NorthboundWrite::OutdoorTemp { celsius } => Some(Down::Outdoor(celsius)),
            NorthboundWrite::AlarmAck { seen } => {
                self.settings.alarm_acknowledged = self.ack.acknowledge(seen);
                None
            }
            NorthboundWrite::SetpointCeiling { .. } | NorthboundWrite::PlanCeilingOffset { .. } => {
                Some(self.limits())
            }
        }
    }

    /// The MCU's line took the BMS's outdoor temperature, `celsius`, at
    /// `now_ms`: the MCU holds it from then, and the holding register
    /// reads it for as long
    /// ([`BMS_FRESH`](cooling_decide::outdoor::BMS_FRESH)).
    pub fn outdoor_handed(&mut self, celsius: f32, now_ms: u64) {
        self.outdoor.bms_wrote(celsius, now_ms);
    }

    /// The MCU started again (the bridge's
    /// [`Act::Started`](super::bridge::Act::Started)): it forgot the
    /// BMS's outdoor temperature, so none reads as in force; the value
    /// that was, if any. (The limits go down again: [`BmsBridge::due`].)
    pub fn mcu_started(&mut self, now_ms: u64) -> Option<f32> {
        let was = self.outdoor.bms_fresh(now_ms);
        self.outdoor = OutdoorSources::new();
        was
    }

    /// The limits the BMS set before a restart of the gateway, as kept in
    /// flash: in force again, and due ([`BmsBridge::due`]): they go down
    /// when the MCU's line is open, then as after a write.
    pub fn restored(&mut self, (ceiling_c, offset_k): (f32, f32)) {
        self.settings.setpoint_ceiling_c = ceiling_c;
        self.settings.plan_ceiling_offset_k = offset_k;
        self.limits();
    }

    /// The limits the BMS set, to keep in flash: `None` until it wrote one.
    pub fn limits_set(&self) -> Option<(f32, f32)> {
        let s = &self.settings;
        self.limits_written
            .then_some((s.setpoint_ceiling_c, s.plan_ceiling_offset_k))
    }

    /// The limits again, when due at `now_ms`: every
    /// [`LIMITS_EVERY_MS`] after they were last handed to the line
    /// ([`BmsBridge::limits_handed`]), at every call until they are
    /// (a line that did not take them), and at once when the MCU
    /// `restarted` (the bridge's [`Act::Started`](super::bridge::Act::Started)),
    /// once the BMS has written any.
    pub fn due(&mut self, now_ms: u64, restarted: bool) -> Option<Down> {
        if !self.limits_written {
            return None;
        }
        let due = match self.limits_sent_ms {
            None => true,
            Some(sent) => restarted || now_ms.saturating_sub(sent) >= LIMITS_EVERY_MS,
        };
        due.then(|| self.limits())
    }

    /// The limits went to the MCU's line at `now_ms`: due again after
    /// [`LIMITS_EVERY_MS`].
    pub fn limits_handed(&mut self, now_ms: u64) {
        self.limits_sent_ms = Some(now_ms);
    }

    /// The MCU's line took one of the BMS's messages (`took`), or not:
    /// what to say of it, once a run: its first refusal, and the line
    /// taking one again after refusals (a stuck line's retries at every
    /// tick are not said again).
    pub fn line_took(&mut self, took: bool) -> Option<LineTook> {
        let was = core::mem::replace(&mut self.line_refusing, !took);
        match (was, took) {
            (false, false) => Some(LineTook::Refused),
            (true, true) => Some(LineTook::Again),
            _ => None,
        }
    }

    /// The limits, to go down now (due at every call of
    /// [`BmsBridge::due`] until [`BmsBridge::limits_handed`] says they
    /// went).
    fn limits(&mut self) -> Down {
        self.limits_written = true;
        self.limits_sent_ms = None;
        Down::Limits {
            ceiling_c: self.settings.setpoint_ceiling_c,
            offset_k: self.settings.plan_ceiling_offset_k,
        }
    }

    /// The gateway sent `lease` to host `host` at `now_ms` (`lift`: it
    /// ends the host's cap).
    pub fn lease_sent(&mut self, host: usize, lease: &CapLease, lift: bool, now_ms: u64) {
        let lowest = lease.caps.iter().map(|c| c.limit.0).min();
        match (lift, lowest) {
            (false, Some(w)) => {
                let held = LeaseHeld {
                    lowest_w: w as f32,
                    until_ms: now_ms.saturating_add(u64::from(lease.duration.0)),
                };
                self.leases.insert(host, held);
            }
            _ => {
                self.leases.remove(&host);
            }
        }
    }

    /// The snapshot at `now_ms` of what the MCU said (`heard`). Anything
    /// alarming in it that the BMS's acknowledgement did not cover (a
    /// silent MCU's failsafe included) clears the acknowledgement.
    pub fn snapshot(&mut self, heard: Heard<'_>, now_ms: u64) -> NorthboundSnapshot {
        self.leases.retain(|_, l| l.until_ms > now_ms);
        let settings = self.settings(now_ms);
        let mut snap = match heard {
            Heard::Nothing => NorthboundSnapshot {
                settings,
                ..NorthboundSnapshot::booting(self.racks)
            },
            Heard::Speaking(s) => of_status(s, self.racks, &settings),
            Heard::Silent { last, quiet_ms } => {
                let failsafe_c = self.failsafe_setpoint_c;
                silent(last, quiet_ms, failsafe_c, self.racks, &settings)
            }
        };
        self.settings.alarm_acknowledged = self.ack.shown(&mut snap, self.gpu_max_c);
        snap.hosts_capped = self.leases.len().min(usize::from(u16::MAX)) as u16;
        snap.lowest_cap_w = self.leases.values().map(|l| l.lowest_w).reduce(f32::min);
        snap
    }
}

/// Seconds of `ms`, held to a u32.
fn secs(ms: u64) -> u32 {
    (ms / 1000).min(u64::from(u32::MAX)) as u32
}

/// The snapshot of status `s` of a CDU of `racks`, with the BMS's
/// `settings`. What a status does not carry is not available (see the
/// module note).
fn of_status(s: &Status, racks: u8, settings: &NorthboundSettings) -> NorthboundSnapshot {
    let readings = s.readings.as_ref();
    let ([supply_c, return_c, flow_lpm, facility_supply_c], sensor_faults) =
        sensors(readings, s.sensor_faults);
    let m = Meters::of(readings);
    let (mode, reason, since_ms) = s.mode;
    NorthboundSnapshot {
        mode,
        reason,
        seconds_in_mode: secs(s.at_ms.saturating_sub(since_ms)),
        uptime_s: secs(s.at_ms),
        setpoint_c: s.setpoint_c,
        supply_c,
        return_c,
        flow_lpm,
        facility_supply_c,
        sensor_faults,
        pumps: pump_word(readings, s.pumps_failed, s.pump_on),
        lead_pump: match s.lead {
            Pump::A => 0,
            Pump::B => 1,
        },
        pump_speed_pct: s.pump_speed * 100.0,
        valves_open: valves_of(s, racks),
        cooling_lost: s.racks.cooling_lost,
        leaks_latched: s.racks.leaks_latched,
        leak_sensing_lost: s.racks.sensing_lost,
        isolation_failed: s.racks.isolation_failed,
        hosts_capped: 0,
        lowest_cap_w: None,
        hottest_gpu_c: None,
        proposed_setpoint_c: f32::NAN,
        proposed_speed_pct: f32::NAN,
        rejection_short: None,
        beacon: s.beacon,
        cdu_refuses_writes: readings.is_some() && !s.writes_ok,
        pue: m.pue,
        it_w: m.it_w,
        facility_w: m.facility_w,
        cooling_w: m.cooling_w,
        settings: *settings,
        alarms: Alarms::default(),
    }
}

/// The valves the CDU has as status `s` tells them (bit n = rack n, of
/// `racks`), as `run` shows them ([`valves_held`]): the positions the
/// CDU read, else the valves the MCU says the CDU last took (its
/// `racks.valves_open`: its last valve write that went in, every valve
/// open before one has), whatever else of the step failed: a close not
/// known to have gone in is not shown as done.
pub(super) fn valves_of(s: &Status, racks: u8) -> u16 {
    let taken = Some(s.racks.valves_open);
    valves_shown(valves_held(s.readings.as_ref(), taken, racks), racks)
}

/// The snapshot of a silent MCU, quiet for `quiet_ms` after its `last`
/// status: as the bus is told (failsafe, controller-silent, the racks and
/// setpoint last heard, nothing measured, no pump commanded), its uptime
/// stopped, and the beacon lit, as failsafe lights it (the core's
/// `beacon`), whatever the last status said.
fn silent(
    last: Option<&Status>,
    quiet_ms: u64,
    failsafe_setpoint_c: f32,
    racks: u8,
    settings: &NorthboundSettings,
) -> NorthboundSnapshot {
    let snap = match last {
        Some(s) => of_status(s, racks, settings),
        None => NorthboundSnapshot {
            setpoint_c: failsafe_setpoint_c,
            settings: *settings,
            ..NorthboundSnapshot::booting(racks)
        },
    };
    let (_, sensor_faults) = sensors(None, last.map_or([None; 4], |s| s.sensor_faults));
    let failed = last.map_or([false; 2], |s| s.pumps_failed);
    let m = Meters::of(None);
    NorthboundSnapshot {
        mode: CduMode::Failsafe,
        reason: ReasonCode::CONTROLLER_SILENT,
        seconds_in_mode: secs(quiet_ms),
        supply_c: None,
        return_c: None,
        flow_lpm: None,
        facility_supply_c: None,
        sensor_faults,
        pumps: pump_word(None, failed, [false; 2]),
        pump_speed_pct: 0.0,
        beacon: true,
        pue: m.pue,
        it_w: m.it_w,
        facility_w: m.facility_w,
        cooling_w: m.cooling_w,
        ..snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::northbound::{encode_snapshot, northbound_map, pump_bits, NOT_AVAILABLE_BIT};
    use cooling_decide::CduMeasurements;
    use loopwarden_link::{Cost, RackBits};
    use loopwarden_protocol::message::{GpuCap, GpuSelector, SensorFault};
    use loopwarden_protocol::units::{DurationMs, Watts};

    fn status(at_ms: u64, beacon: bool) -> Status {
        Status {
            step: 7,
            at_ms,
            mode: (CduMode::Degraded, ReasonCode::CAPACITY_SHORT, 2_000),
            setpoint_c: 31.5,
            pump_speed: 0.62,
            pump_on: [false, true],
            lead: Pump::B,
            racks: RackBits {
                valves_open: 0b1011,
                cooling_lost: 0b0100,
                sensing_lost: 0b1000,
                isolation_failed: 0,
                leaks_latched: 0b0100,
                leaks_wet: 0b0100,
            },
            pumps_failed: [true, false],
            beacon,
            sensor_faults: [None, None, Some(SensorFault::Lost), None],
            readings: Some(CduMeasurements {
                supply_c: Some(31.2),
                return_c: Some(40.0),
                flow_lpm: Some(300.0),
                pumps_running: [Some(false), Some(true)],
                it_w: Some(100_000.0),
                facility_w: Some(110_000.0),
                ..Default::default()
            }),
            outdoor_c: None,
            writes_ok: true,
            events_dropped: 0,
            cost: Cost::default(),
        }
    }

    fn lease(watts: [u32; 2], duration_ms: u32) -> CapLease {
        let Some(loopwarden_protocol::Message::CapLease(mut l)) = Some(
            loopwarden_protocol::samples::message(loopwarden_protocol::MessageKind::CapLease),
        ) else {
            panic!("a lease sample")
        };
        l.caps.clear();
        for w in watts {
            l.caps
                .push(GpuCap {
                    gpus: GpuSelector::All,
                    limit: Watts(w),
                })
                .unwrap();
        }
        l.duration = DurationMs(duration_ms);
        l
    }

    #[test]
    fn a_status_reads_as_runs_step_and_what_it_does_not_say_is_not_available() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let s = b.snapshot(Heard::Speaking(&status(65_400, false)), 1_000);
        assert_eq!(
            (s.mode, s.reason),
            (CduMode::Degraded, ReasonCode::CAPACITY_SHORT)
        );
        assert_eq!((s.seconds_in_mode, s.uptime_s), (63, 65));
        assert_eq!((s.setpoint_c, s.lead_pump), (31.5, 1));
        assert!((s.pump_speed_pct - 62.0).abs() < 1e-4);
        assert_eq!((s.supply_c, s.return_c), (Some(31.2), Some(40.0)));
        // The flow's sensor is held lost: not available, with its fault.
        assert_eq!(s.flow_lpm, None);
        assert_eq!(
            s.sensor_faults & (0b0100 | NOT_AVAILABLE_BIT << 2),
            0b0100 | NOT_AVAILABLE_BIT << 2
        );
        assert_eq!(
            s.pumps,
            pump_bits::B_RUNNING | pump_bits::A_FAILED | pump_bits::B_ON
        );
        assert_eq!(
            (
                s.valves_open,
                s.cooling_lost,
                s.leaks_latched,
                s.leak_sensing_lost
            ),
            (0b1011, 0b0100, 0b0100, 0b1000)
        );
        assert!((s.pue.unwrap() - 1.1).abs() < 1e-9);
        let m = northbound_map();
        let img = encode_snapshot(&m, &s, true);
        for (name, sentinel) in [
            ("hottest_gpu", 0x8000),
            ("proposed_setpoint", 0x8000),
            ("proposed_speed", 0xFFFF),
            ("rejection_short", 0xFFFF),
            ("hosts_capped", 0),
            ("lowest_cap", 0xFFFF),
        ] {
            assert_eq!(img.words(&m, name).unwrap(), vec![sentinel], "{name}");
        }
        // Before any status (and before silence): booting, as run's first.
        let s = b.snapshot(Heard::Nothing, 0);
        assert_eq!((s.mode, s.reason), (CduMode::Boot, ReasonCode::BOOTING));
    }

    #[test]
    fn before_any_status_what_was_never_said_reads_not_available() {
        let core = CoreConfig::default();
        let m = northbound_map();
        let mut b = BmsBridge::new(&core);
        let booting = b.snapshot(Heard::Nothing, 0);
        let silent = b.snapshot(
            Heard::Silent {
                last: None,
                quiet_ms: 3_000,
            },
            3_000,
        );
        for (when, s) in [("booting", &booting), ("silent", &silent)] {
            let img = encode_snapshot(&m, s, true);
            for (name, sentinel) in [
                ("proposed_setpoint", 0x8000),
                ("proposed_speed", 0xFFFF),
                ("rejection_short", 0xFFFF),
                ("supply_temp", 0x8000),
            ] {
                assert_eq!(
                    img.words(&m, name).unwrap(),
                    vec![sentinel],
                    "{when} {name}"
                );
            }
            assert_eq!(s.sensor_faults & 0x0F00, 0x0F00, "{when}: nothing measured");
        }
        // No setpoint said yet; a silent MCU that never spoke shows the
        // failsafe setpoint it runs.
        let img = encode_snapshot(&m, &booting, true);
        assert_eq!(img.words(&m, "setpoint").unwrap(), vec![0x8000]);
        assert_eq!(silent.setpoint_c, core.margins.failsafe_setpoint_c);
    }

    #[test]
    fn the_bms_writes_go_down_at_once_and_the_limits_again_when_due() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        assert_eq!(b.due(0, true), None, "nothing written, nothing repeated");
        let ceiling = NorthboundWrite::SetpointCeiling { celsius: 35.5 };
        assert_eq!(
            b.write(ceiling),
            Some(Down::Limits {
                ceiling_c: 35.5,
                offset_k: 0.0
            })
        );
        let offset = NorthboundWrite::PlanCeilingOffset { kelvin: -2.0 };
        let both = Down::Limits {
            ceiling_c: 35.5,
            offset_k: -2.0,
        };
        assert_eq!(b.write(offset), Some(both.clone()));
        b.limits_handed(2_000);
        assert_eq!(b.due(2_000 + LIMITS_EVERY_MS - 1, false), None);
        assert_eq!(b.due(2_000 + LIMITS_EVERY_MS, false), Some(both.clone()));
        b.limits_handed(2_000 + LIMITS_EVERY_MS);
        assert_eq!(b.due(2_000 + LIMITS_EVERY_MS + 10, false), None);
        // The MCU started again: at once.
        assert_eq!(b.due(2_000 + LIMITS_EVERY_MS + 20, true), Some(both));
        // The outdoor temperature: once per write, read back while fresh
        // from when the line took it.
        let outdoor = NorthboundWrite::OutdoorTemp { celsius: -4.5 };
        assert_eq!(b.write(outdoor), Some(Down::Outdoor(-4.5)));
        b.outdoor_handed(-4.5, 10_000);
        assert_eq!(b.settings(10_000 + 299_999).outdoor_c, Some(-4.5));
        assert_eq!(b.settings(10_000 + 300_000).outdoor_c, None);
        let s = b.snapshot(Heard::Nothing, 11_000);
        assert_eq!(
            (
                s.settings.setpoint_ceiling_c,
                s.settings.plan_ceiling_offset_k
            ),
            (35.5, -2.0)
        );
    }

    /// The outdoor temperature reads back only while the MCU holds it:
    /// from when the line took it (not as the BMS wrote it: one the line
    /// refused never reaches the MCU, and the one it holds stands), and
    /// not after the MCU started again (it forgot it).
    #[test]
    fn the_outdoor_temperature_reads_back_only_while_the_mcu_holds_it() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let write = |celsius| NorthboundWrite::OutdoorTemp { celsius };
        assert_eq!(b.write(write(-4.5)), Some(Down::Outdoor(-4.5)));
        assert_eq!(b.settings(1_000).outdoor_c, None, "not taken yet");
        let s = b.snapshot(Heard::Nothing, 1_000);
        let m = northbound_map();
        let img = encode_snapshot(&m, &s, true);
        assert_eq!(img.words(&m, "outdoor_temp").unwrap(), vec![0x8000]);
        b.outdoor_handed(-4.5, 1_200);
        assert_eq!(b.settings(1_200).outdoor_c, Some(-4.5));
        // A later write the line refuses: the value the MCU holds stands.
        b.write(write(7.25));
        assert_eq!(b.settings(2_000).outdoor_c, Some(-4.5));
        assert_eq!(b.settings(1_200 + 299_999).outdoor_c, Some(-4.5));
        // The MCU started again: it holds none.
        assert_eq!(b.mcu_started(3_000), Some(-4.5));
        assert_eq!(b.settings(3_000).outdoor_c, None);
        assert_eq!(b.snapshot(Heard::Nothing, 3_000).settings.outdoor_c, None);
    }

    /// A line that did not take the limits: they are due again at the
    /// next step, not after [`LIMITS_EVERY_MS`].
    #[test]
    fn limits_the_line_did_not_take_go_again_at_the_next_step() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let ceiling = NorthboundWrite::SetpointCeiling { celsius: 36.0 };
        let limits = b.write(ceiling).expect("the limits go down");
        // Not handed (the line's queue refused them).
        assert_eq!(b.due(1_250, false), Some(limits.clone()));
        assert_eq!(b.due(1_500, false), Some(limits.clone()), "until handed");
        b.limits_handed(1_500);
        assert_eq!(b.due(1_750, false), None);
        assert_eq!(b.limits_set(), Some((36.0, 0.0)));
        // Restored from flash, not handed: due at once too.
        let mut b = BmsBridge::new(&CoreConfig::default());
        b.restored((34.0, -1.0));
        let down = Down::Limits {
            ceiling_c: 34.0,
            offset_k: -1.0,
        };
        assert_eq!(b.due(250, false), Some(down));
    }

    #[test]
    fn an_alarm_acknowledged_stays_until_anything_new_is_alarming() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        // Rack 3's sensing lost, rack 2's leak and pump A light the beacon.
        let seen = b.snapshot(Heard::Speaking(&status(1_000, true)), 0).alarms;
        assert_eq!(b.write(NorthboundWrite::AlarmAck { seen }), None);
        let lit = status(2_000, true);
        assert!(
            b.snapshot(Heard::Speaking(&lit), 200)
                .settings
                .alarm_acknowledged
        );
        // Rack 0 leaks while the beacon is still lit: a new alarm.
        let mut leak = status(3_000, true);
        leak.racks.leaks_latched |= 0b0001;
        let s = b.snapshot(Heard::Speaking(&leak), 300);
        assert!(!s.settings.alarm_acknowledged, "rack 0's leak is new");
        assert!(!b.settings(300).alarm_acknowledged, "the register reads 0");
        b.write(NorthboundWrite::AlarmAck { seen: s.alarms });
        assert!(
            b.snapshot(Heard::Speaking(&leak), 500)
                .settings
                .alarm_acknowledged
        );
        // The beacon going out and lighting again.
        b.snapshot(Heard::Speaking(&status(4_000, false)), 600);
        let again = b.snapshot(Heard::Speaking(&status(5_000, true)), 700);
        assert!(!again.settings.alarm_acknowledged);
        // The MCU falling silent: failsafe, controller-silent, is new.
        b.write(NorthboundWrite::AlarmAck { seen: again.alarms });
        let quiet = Heard::Silent {
            last: Some(&lit),
            quiet_ms: 3_000,
        };
        assert!(!b.snapshot(quiet, 900).settings.alarm_acknowledged);
    }

    /// The status does not carry the hottest GPU: a GPU above its
    /// maximum clears the acknowledgement by the beacon it lights, as
    /// docs/cooling.md says, and `hottest_gpu` reads not available.
    #[test]
    fn a_hot_gpu_clears_the_acknowledgement_on_the_gateway_by_its_beacon() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let mut calm = status(1_000, false);
        calm.racks = RackBits::default();
        calm.pumps_failed = [false; 2];
        calm.mode = (CduMode::Normal, ReasonCode::OK, 0);
        let seen = b.snapshot(Heard::Speaking(&calm), 0).alarms;
        b.write(NorthboundWrite::AlarmAck { seen });
        assert!(
            b.snapshot(Heard::Speaking(&calm), 200)
                .settings
                .alarm_acknowledged
        );
        // Nothing but the beacon: what a GPU above its maximum lights.
        let hot = Status {
            beacon: true,
            ..calm.clone()
        };
        let s = b.snapshot(Heard::Speaking(&hot), 300);
        assert_eq!(s.hottest_gpu_c, None);
        assert!(!s.settings.alarm_acknowledged, "the beacon lit: new");
    }

    /// The BMS writes `alarm_ack` against the registers as they read;
    /// the MCU's next status, published before the gateway takes the
    /// write, shows rack 0 leaking: the write does not cover it.
    #[test]
    fn an_acknowledgement_taken_after_a_new_alarm_does_not_cover_it_on_the_gateway() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let read = b.snapshot(Heard::Speaking(&status(1_000, true)), 0).alarms;
        let mut leak = status(2_000, true);
        leak.racks.leaks_latched |= 0b0001;
        let shown = b.snapshot(Heard::Speaking(&leak), 100);
        assert_eq!(b.write(NorthboundWrite::AlarmAck { seen: read }), None);
        assert!(!b.settings(150).alarm_acknowledged, "at once");
        let s = b.snapshot(Heard::Speaking(&leak), 200);
        assert!(!s.settings.alarm_acknowledged, "rack 0's leak unread");
        // Written against what the registers show: acknowledged.
        b.write(NorthboundWrite::AlarmAck { seen: shown.alarms });
        assert!(b.settings(250).alarm_acknowledged);
        let s = b.snapshot(Heard::Speaking(&leak), 300);
        assert!(s.settings.alarm_acknowledged);
    }

    #[test]
    fn the_caps_are_the_leases_sent_that_hold() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        b.lease_sent(3, &lease([450, 500], 30_000), false, 1_000);
        b.lease_sent(5, &lease([380, 600], 10_000), false, 1_000);
        let s = b.snapshot(Heard::Nothing, 2_000);
        assert_eq!((s.hosts_capped, s.lowest_cap_w), (2, Some(380.0)));
        // Host 5's lease runs out; host 3's is lifted.
        let s = b.snapshot(Heard::Nothing, 11_000);
        assert_eq!((s.hosts_capped, s.lowest_cap_w), (1, Some(450.0)));
        b.lease_sent(3, &lease([700, 700], 5_000), true, 12_000);
        let s = b.snapshot(Heard::Nothing, 12_000);
        assert_eq!((s.hosts_capped, s.lowest_cap_w), (0, None));
    }

    /// Rack 2 commanded shut (0b1011): the register shows the valves
    /// the CDU has, as `run` does, never a close not known to be done.
    #[test]
    fn valves_open_shows_the_valves_the_cdu_has_not_those_commanded() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let mut valves = |closed: Option<u16>, writes_ok: bool| {
            let mut s = status(65_400, true);
            s.readings.as_mut().unwrap().valves_closed = closed;
            s.writes_ok = writes_ok;
            b.snapshot(Heard::Speaking(&s), 1_000).valves_open
        };
        // The positions read rack 2 open: its close did not go in.
        assert_eq!(valves(Some(0), true), 0b1111);
        assert_eq!(valves(Some(0b0100), false), 0b1011);
        // No positions: the valves the MCU says the CDU took, whatever
        // else of the step failed (as run shows them).
        assert_eq!(valves(None, true), 0b1011);
        assert_eq!(valves(None, false), 0b1011);
    }

    #[test]
    fn a_silent_mcu_reads_failsafe_controller_silent_with_its_racks_and_its_uptime_stopped() {
        let core = CoreConfig::default();
        let mut b = BmsBridge::new(&core);
        let last = status(65_400, true);
        let s = b.snapshot(
            Heard::Silent {
                last: Some(&last),
                quiet_ms: 4_200,
            },
            70_000,
        );
        assert_eq!(
            (s.mode, s.reason),
            (CduMode::Failsafe, ReasonCode::CONTROLLER_SILENT)
        );
        assert_eq!((s.seconds_in_mode, s.uptime_s), (4, 65));
        assert_eq!((s.valves_open, s.leaks_latched), (0b1011, 0b0100));
        assert_eq!((s.supply_c, s.it_w, s.pue), (None, None, None));
        assert_eq!(s.sensor_faults & 0x0F00, 0x0F00, "nothing measured");
        assert_eq!(s.pumps, pump_bits::A_FAILED, "no pump commanded");
        let s = b.snapshot(
            Heard::Silent {
                last: None,
                quiet_ms: 3_000,
            },
            3_000,
        );
        assert_eq!(s.setpoint_c, core.margins.failsafe_setpoint_c);
        assert_eq!(s.uptime_s, 0);
        assert_eq!(s.valves_open, 0b1111, "no valve known shut");
    }

    /// A silent MCU reads failsafe, and the core lights the beacon in
    /// failsafe: the beacon register reads 1 whatever its last status
    /// said, and before any status too.
    #[test]
    fn a_silent_mcu_lights_the_beacon_register_as_failsafe_does() {
        let m = northbound_map();
        let mut b = BmsBridge::new(&CoreConfig::default());
        let dark = status(65_400, false);
        for last in [Some(&dark), None] {
            let s = b.snapshot(
                Heard::Silent {
                    last,
                    quiet_ms: 4_200,
                },
                70_000,
            );
            assert_eq!(s.mode, CduMode::Failsafe);
            assert!(s.beacon, "last status {:?}", last.map(|l| l.beacon));
            let img = encode_snapshot(&m, &s, true);
            assert_eq!(img.words(&m, "beacon").unwrap(), vec![1]);
        }
    }

    /// Before any status no valve is known shut: every rack's shows open.
    #[test]
    fn before_any_status_every_valve_shows_open() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        assert_eq!(b.snapshot(Heard::Nothing, 0).valves_open, 0b1111);
    }

    /// A stuck line refuses the limits at every tick: said once, and
    /// once again when it takes them.
    #[test]
    fn a_line_refusing_at_every_tick_is_said_once_and_its_return_once() {
        let mut b = BmsBridge::new(&CoreConfig::default());
        let said: Vec<_> = (0..10).filter_map(|_| b.line_took(false)).collect();
        assert_eq!(said, [LineTook::Refused]);
        assert_eq!(b.line_took(true), Some(LineTook::Again));
        assert_eq!(b.line_took(true), None);
        assert_eq!(b.line_took(false), Some(LineTook::Refused), "a new run");
    }
}

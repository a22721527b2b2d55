//! The northbound Modbus TCP server: the controller's state and
//! measurements for the building management system (BMS), and the few
//! bounded settings the BMS may ask of it.
//!
//! What it serves is data, like a CDU's map: a [`RegisterMap`](loopwarden_boards::modbus_map::RegisterMap)
//! (`boards/northbound/loopwarden-cdu-ctrl.toml`, [`northbound_map`]) names
//! every register with its kind, address, type, scale, unit and, for the
//! settings, the range a write may set; 32-bit values follow the map's word
//! order. [`check_map`] accepts a map whose registers are all known here
//! (by name, of the right kind; bit words at scale 1); a map may leave
//! registers out, and those are not served.
//!
//! How it fits the shell: after every control step the shell fills a
//! [`NorthboundSnapshot`] ([`snapshot_from`]: plain values from the core's
//! [`Commands`](cooling_core::Commands), the core itself, the CDU's readings and the hosts'
//! reports) and sends it on a [`watch`](tokio::sync::watch) channel ([`snapshot_channel`]);
//! [`serve`] answers every request from the latest snapshot, so a read
//! never waits for the control loop and never sees half a step. Writes,
//! when enabled, are checked against the map and handed to the shell as
//! [`NorthboundWrite`]s on an [`mpsc`](tokio::sync::mpsc) channel; the shell takes them as they
//! come, between its steps ([`NorthboundSettings::apply`]), and sends its
//! snapshot again with them. An `alarm_ack` carries what the snapshot
//! showed alarming as the server took it ([`NorthboundSnapshot::alarms`]),
//! and acknowledges no more ([`AlarmAck`]). The holding registers read what is in force,
//! and a write is answered once they read it ([`WRITE_SHOWN_WITHIN`] at
//! most), so a BMS that reads back straight after its write sees it.
//!
//! Answers:
//! - input registers (function 4) and holding registers (function 3):
//!   1 to 125 registers (else exception 3, illegal data value, as the
//!   Modbus specification asks of a quantity out of range), every one in
//!   the map (else exception 2; a read may start or end inside a 32-bit
//!   value);
//! - writes (functions 6 and 16) while writes are disabled (`serve` got no
//!   sender): exception 1, "illegal function", whatever the address: the
//!   server does not do writes, which is not a matter of the address;
//! - writes while enabled: every register touched whole and in the map
//!   (else exception 2), every value within its `[min, max]` (else
//!   exception 3); all or nothing: one refused register refuses the lot
//!   and nothing is handed on. When the shell's channel is full the write
//!   is refused with exception 6 (busy: try again), when the shell is gone
//!   with exception 4. An accepted write is answered once the holding
//!   registers read it, or after 200 ms ([`WRITE_SHOWN_WITHIN`]);
//! - any other function: exception 1.
//!
//! Connections: at most 16 at once (`northbound_max_connections`; one
//! more is closed at once, unread), each closed after 120 s without a
//! request (`northbound_idle_s`); refusals and idle closes are logged and
//! counted (`loopwarden_listener_*{listener="northbound"}`). See
//! [`LIMITS`] for why these. An `accept()` that fails (file descriptors
//! or memory run out, a connection aborted) closes the connections open
//! and the server serves again on the same socket after a short backoff,
//! each failure logged.
//!
//! Unit ids: it answers its own (`northbound_unit_id`, the map's `unit_id`
//! unless configured, 1 in the shipped map) and 255, the value the Modbus
//! TCP implementation guide recommends for a server reached directly by
//! its IP address. A request for any other unit id, 0 (a serial line's
//! broadcast) included, gets no answer at all, as a device on a serial
//! line does not answer another's address, and changes nothing; the first
//! such request of each unit id on a connection is logged with the
//! client's address. It does not answer exception 11 (gateway target
//! device failed to respond) for them: that would claim a gateway with
//! devices behind it, which it is not.
//!
//! Glossary:
//! - *BMS*: the building management system, the site's supervisory
//!   system, a Modbus TCP client of this server.
//! - *northbound*: towards the BMS (southbound is the CDU).
//! - *snapshot*: the plain values of one control step that the registers
//!   show.
//! - *sentinel*: the raw value of "not available" for a type: `0x8000` for
//!   i16, `0xFFFF` for u16, `0xFFFF_FFFF` for u32, `0x8000_0000` for i32.
//!   A value that exists but falls outside its type is clamped to the
//!   nearest value that is not the sentinel. Bit words are never "not
//!   available" and use all their bits.
//! - *in force*: what the control loop runs with now, not what was last
//!   written.
//! - *heartbeat*: the `uptime` register, which advances every step and
//!   stops when the control loop stalls.
//! - *exception 1 / 2 / 3 / 4 / 6*: Modbus illegal function / illegal data
//!   address / illegal data value / server device failure / server device
//!   busy.

mod again;
mod alarms;
mod codec;
mod guard;
mod map;
mod server;
mod snapshot;

pub use alarms::{AlarmAck, Alarms};
pub use codec::{decode_write, encode_snapshot, Image};
pub use map::{check_map, fit_setpoint_ceiling, northbound_map, MapError, MAP_TOML};
pub use server::{addressed, serve, serve_within, ANY_UNIT, LIMITS, WRITE_SHOWN_WITHIN};
pub use snapshot::{
    pump_bits, snapshot_channel, snapshot_channel_of, snapshot_from, valves_held, valves_shown,
    CduTook, NorthboundSettings, NorthboundSnapshot, NorthboundWrite, FAULT_BIT, NOT_AVAILABLE_BIT,
};
pub(crate) use snapshot::{pump_word, sensors, Meters};

#[cfg(test)]
mod tests {
    use super::map::KNOWN;
    use super::server::State;
    use super::*;
    use crate::modbus::CduMeasurements;
    use cooling_core::sensors::Which;
    use cooling_core::{Core, CoreConfig, HostCap, HostReport, Inputs};
    use loopwarden_boards::modbus_map::{Kind, RegisterMap};
    use loopwarden_boards::modbus_server::answer;
    use loopwarden_protocol::message::{CduMode, SensorFault};
    use loopwarden_protocol::ReasonCode;
    use std::string::ToString;
    use std::vec;
    use std::vec::Vec;
    use tokio::sync::mpsc;
    use tokio_modbus::{ExceptionCode, Request};

    fn snap() -> NorthboundSnapshot {
        NorthboundSnapshot {
            mode: CduMode::Degraded,
            reason: ReasonCode::CAPACITY_SHORT,
            seconds_in_mode: 70_000,
            uptime_s: 123,
            setpoint_c: 32.05,
            supply_c: Some(-1.5),
            return_c: None,
            flow_lpm: Some(172.8),
            facility_supply_c: Some(400.0),
            sensor_faults: 0x0202,
            pumps: pump_bits::A_RUNNING | pump_bits::A_ON | pump_bits::B_FAILED,
            lead_pump: 0,
            pump_speed_pct: 80.0,
            valves_open: 0xFFFF,
            cooling_lost: 0,
            leaks_latched: 0,
            leak_sensing_lost: 0,
            isolation_failed: 0,
            hosts_capped: 3,
            lowest_cap_w: Some(450.0),
            hottest_gpu_c: None,
            proposed_setpoint_c: 34.5,
            proposed_speed_pct: 60.0,
            rejection_short: Some(true),
            beacon: false,
            cdu_refuses_writes: false,
            pue: Some(1.0845),
            it_w: Some(108_400.0),
            facility_w: Some(117_550.0),
            cooling_w: None,
            settings: NorthboundSettings {
                setpoint_ceiling_c: 40.0,
                plan_ceiling_offset_k: -2.5,
                alarm_acknowledged: false,
                outdoor_c: Some(-12.5),
            },
            alarms: Alarms::default(),
        }
    }

    #[test]
    fn only_its_own_unit_id_and_255_reach_the_server() {
        assert!(addressed(1, 1));
        assert!(addressed(ANY_UNIT, 1));
        assert!(addressed(17, 17));
        for other in [0, 2, 16, 247, 254] {
            assert!(!addressed(other, 1), "unit {other}");
        }
        assert!(!addressed(1, 17));
    }

    #[test]
    fn the_shipped_map_is_served_whole() {
        let m = northbound_map();
        check_map(&m).unwrap();
        assert_eq!(m.registers().count(), KNOWN.len());
        // Input registers run without a gap from 0.
        let mut next = 0;
        let mut inputs: Vec<_> = m.registers().filter(|r| r.kind == Kind::Input).collect();
        inputs.sort_by_key(|r| r.address);
        for r in inputs {
            assert_eq!(r.address, next, "{}", r.name);
            next += r.ty.words();
        }
    }

    #[test]
    fn the_reason_registers_description_names_every_cdu_reason() {
        let block = MAP_TOML
            .split("[[register]]")
            .find(|b| b.contains("name = \"reason\""))
            .expect("the reason register");
        let description = block
            .lines()
            .find(|l| l.starts_with("description"))
            .expect("its description")
            .to_lowercase();
        let cdu = ReasonCode::NAMED
            .iter()
            .filter(|(c, _)| c.0 == 0 || (2000..3000).contains(&c.0));
        for (code, label) in cdu {
            let named = format!("{} {}", code.0, label.replace('-', " "));
            assert!(description.contains(&named), "{named} missing");
        }
    }

    /// Each condition that lights the beacon (`Core::beacon`, in
    /// `cooling-core/src/beacon.rs`), by what its code tests, and the
    /// words the `beacon` register's description names it by.
    const BEACON_CONDITIONS: &[(&str, &str)] = &[
        ("leaks_latched()", "a latched leak"),
        ("sensing_lost()", "leak sensing lost"),
        ("feedback_faults()", "a valve position input not believed"),
        ("pumps.faults()", "a pump out of service"),
        ("required_ok()", "a required sensor"),
        ("CduMode::Failsafe", "failsafe"),
        ("CDU_WRITES_REFUSED", "the cdu refusing writes"),
        ("writes_refused", "the cdu refusing writes"),
        (
            "max_operating_c",
            "a gpu above its maximum operating temperature",
        ),
    ];

    /// The conditions `Core::beacon` ORs together, as its code reads.
    fn beacon_terms() -> Vec<String> {
        let code = include_str!("../../cooling-core/src/beacon.rs");
        let body = code
            .split_once("fn beacon(")
            .and_then(|(_, rest)| rest.split_once("\n    }"))
            .expect("Core::beacon in cooling-core/src/beacon.rs")
            .0;
        let (_, expr) = body.rsplit_once(';').expect("its lets, then its OR");
        expr.split("||").map(|t| t.trim().to_string()).collect()
    }

    #[test]
    fn the_beacons_description_names_every_condition_that_lights_it() {
        let terms = beacon_terms();
        assert!(terms.len() >= 8, "{terms:?}");
        let block = MAP_TOML
            .split("[[register]]")
            .find(|b| b.contains("name = \"beacon\""))
            .expect("the beacon register");
        let toml = block
            .lines()
            .find(|l| l.starts_with("description"))
            .expect("its description")
            .to_lowercase();
        let doc = include_str!("../../docs/cooling.md")
            .lines()
            .find(|l| l.starts_with("| input | 24 | beacon |"))
            .expect("the beacon register in docs/cooling.md")
            .to_lowercase();
        for term in &terms {
            let Some((_, words)) = BEACON_CONDITIONS.iter().find(|(c, _)| term.contains(c)) else {
                panic!("the beacon lights for `{term}`: name it in BEACON_CONDITIONS");
            };
            assert!(toml.contains(words), "the map's beacon: {words} missing");
            assert!(
                doc.contains(words),
                "docs/cooling.md's beacon: {words} missing"
            );
        }
        // A failed isolation lights it by failsafe: named too.
        assert!(toml.contains("a failed isolation") && doc.contains("a failed isolation"));
    }

    #[test]
    fn snapshot_encoding_follows_scale_sentinels_and_clamps() {
        let m = northbound_map();
        let img = encode_snapshot(&m, &snap(), false);
        let w = |n: &str| img.words(&m, n).unwrap();
        assert_eq!(w("mode"), vec![2]);
        assert_eq!(w("reason"), vec![2005]);
        // 70,000 s = 0x0001_1170, high word first.
        assert_eq!(w("seconds_in_mode"), vec![0x0001, 0x1170]);
        assert_eq!(w("setpoint"), vec![3205]);
        assert_eq!(w("supply_temp"), vec![(-150i16) as u16]);
        assert_eq!(w("return_temp"), vec![0x8000]);
        assert_eq!(w("flow"), vec![1728]);
        // 400 °C does not fit at 0.01: clamped short of nothing-to-say.
        assert_eq!(w("facility_supply_temp"), vec![32767]);
        assert_eq!(w("sensor_faults"), vec![0x0202]);
        assert_eq!(w("pumps"), vec![0b1_1001]);
        assert_eq!(w("pump_speed"), vec![800]);
        // A bit word keeps all 16 bits, although 0xFFFF is u16's sentinel.
        assert_eq!(w("valves_open"), vec![0xFFFF]);
        assert_eq!(w("hosts_capped"), vec![3]);
        assert_eq!(w("lowest_cap"), vec![450]);
        assert_eq!(w("hottest_gpu"), vec![0x8000]);
        assert_eq!(w("proposed_setpoint"), vec![3450]);
        assert_eq!(w("proposed_speed"), vec![600]);
        assert_eq!(w("rejection_short"), vec![1]);
        assert_eq!(w("pue"), vec![1085]);
        // 108,400 W = 0x0001_A770; 117,550 W = 0x0001_CB2E.
        assert_eq!(w("it_power"), vec![0x0001, 0xA770]);
        assert_eq!(w("facility_power"), vec![0x0001, 0xCB2E]);
        assert_eq!(w("cooling_power"), vec![0xFFFF, 0xFFFF]);
        assert_eq!(w("writes_enabled"), vec![0]);
        assert_eq!(w("setpoint_ceiling"), vec![4000]);
        assert_eq!(w("plan_ceiling_offset"), vec![(-25i16) as u16]);
        assert_eq!(w("alarm_ack"), vec![0]);
        assert_eq!(w("outdoor_temp"), vec![(-1250i16) as u16]);
        assert_eq!(encode_snapshot(&m, &snap(), true).input[&32], 1);
        // Nothing is not a number, and a snapshot's setting outside the
        // map's range reads the nearest end.
        let mut s = snap();
        s.setpoint_c = f32::NAN;
        s.settings.setpoint_ceiling_c = 50.0;
        s.settings.outdoor_c = None;
        let img = encode_snapshot(&m, &s, false);
        assert_eq!(img.words(&m, "setpoint").unwrap(), vec![0x8000]);
        assert_eq!(img.words(&m, "setpoint_ceiling").unwrap(), vec![4500]);
        // No BMS outdoor temperature in force: the sentinel.
        assert_eq!(img.words(&m, "outdoor_temp").unwrap(), vec![0x8000]);
        // A belief of the optimiser not known (on a gateway): the
        // sentinel, not 0.
        s.rejection_short = None;
        let img = encode_snapshot(&m, &s, false);
        assert_eq!(img.words(&m, "rejection_short").unwrap(), vec![0xFFFF]);
        // A belief of the optimiser not known (on a gateway): the
        // sentinel, not 0.
        s.rejection_short = None;
        let img = encode_snapshot(&m, &s, false);
        assert_eq!(img.words(&m, "rejection_short").unwrap(), vec![0xFFFF]);
    }

    #[test]
    fn thirty_two_bit_values_follow_the_map_word_order() {
        let low =
            RegisterMap::from_toml(&MAP_TOML.replace("high_first", "low_first"), "low").unwrap();
        let img = encode_snapshot(&low, &snap(), false);
        assert_eq!(img.words(&low, "it_power").unwrap(), vec![0xA770, 0x0001]);
        assert_eq!(
            img.words(&low, "seconds_in_mode").unwrap(),
            vec![0x1170, 0x0001]
        );
    }

    #[test]
    fn maps_with_registers_the_server_cannot_fill_are_refused() {
        let m = RegisterMap::from_toml(
            &MAP_TOML.replace("name = \"beacon\"", "name = \"bacon\""),
            "m",
        )
        .unwrap();
        assert!(check_map(&m).unwrap_err().to_string().contains("bacon"));
        let m = RegisterMap::from_toml(
            &MAP_TOML.replace(
                "name = \"pumps\"\nkind = \"input\"\naddress = 12\ntype = \"u16\"\nscale = 1.0",
                "name = \"pumps\"\nkind = \"input\"\naddress = 12\ntype = \"u16\"\nscale = 0.5",
            ),
            "m",
        )
        .unwrap();
        assert!(check_map(&m).unwrap_err().0.contains("scale 1"));
        // Leaving a register out is fine: it is not served.
        let cut = MAP_TOML
            .split("[[register]]\nname = \"cooling_power\"")
            .next()
            .unwrap();
        let m = RegisterMap::from_toml(cut, "m").unwrap();
        check_map(&m).unwrap();
        assert!(!encode_snapshot(&m, &snap(), false).input.contains_key(&30));
    }

    #[test]
    fn writes_are_checked_whole_against_the_map() {
        let m = northbound_map();
        assert_eq!(
            decode_write(&m, 0, &[3550]).unwrap(),
            vec![NorthboundWrite::SetpointCeiling { celsius: 35.5 }]
        );
        assert_eq!(
            decode_write(&m, 0, &[2000, (-100i16) as u16, 1]).unwrap(),
            vec![
                NorthboundWrite::SetpointCeiling { celsius: 20.0 },
                NorthboundWrite::PlanCeilingOffset { kelvin: -10.0 },
                NorthboundWrite::AlarmAck {
                    seen: Alarms::default()
                },
            ]
        );
        assert_eq!(decode_write(&m, 2, &[0]).unwrap(), vec![]);
        assert_eq!(
            decode_write(&m, 0, &[4501]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 0, &[1999]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 1, &[1]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 2, &[2]),
            Err(ExceptionCode::IllegalDataValue)
        );
        // One bad register refuses the lot.
        assert_eq!(
            decode_write(&m, 0, &[3000, 5, 1]),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert_eq!(
            decode_write(&m, 4, &[0]),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(
            decode_write(&m, 2, &[0, 0, 0]),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(
            decode_write(&m, 0, &[]),
            Err(ExceptionCode::IllegalDataValue)
        );
        let mut s = NorthboundSettings::new(&CoreConfig::default());
        assert_eq!(s.setpoint_ceiling_c, 45.0);
        for w in decode_write(&m, 0, &[3000, (-30i16) as u16, 1, (-525i16) as u16]).unwrap() {
            s.apply(w);
        }
        assert_eq!(
            s,
            NorthboundSettings {
                setpoint_ceiling_c: 30.0,
                plan_ceiling_offset_k: -3.0,
                alarm_acknowledged: true,
                outdoor_c: Some(-5.25),
            }
        );
    }

    /// A site whose setpoints run 24 to 48 °C: a ceiling of 20 °C, which
    /// the core would hold at 24, is refused; 48 is beyond what the
    /// register holds, said.
    #[test]
    fn the_ceiling_the_bms_may_write_is_held_to_the_controllers_setpoints() {
        let mut m = northbound_map();
        assert!(decode_write(&m, 0, &[2000]).is_ok(), "the map's 20 °C");
        let note = fit_setpoint_ceiling(&mut m, 24.0, 48.0).expect("they meet");
        let note = note.expect("48 °C is beyond the register");
        assert!(note.contains("at most 45.00 °C"), "{note}");
        for raw in [2000, 2399] {
            assert_eq!(
                decode_write(&m, 0, &[raw]),
                Err(ExceptionCode::IllegalDataValue),
                "{raw}"
            );
        }
        assert_eq!(
            decode_write(&m, 0, &[2400]),
            Ok(vec![NorthboundWrite::SetpointCeiling { celsius: 24.0 }])
        );
        assert_eq!(fit_setpoint_ceiling(&mut m, 26.0, 40.0), Ok(None));
        assert_eq!(
            decode_write(&m, 0, &[4001]),
            Err(ExceptionCode::IllegalDataValue)
        );
        let e = fit_setpoint_ceiling(&mut m, 41.0, 50.0).unwrap_err();
        assert!(e.to_string().contains("do not meet"), "{e}");
        assert!(decode_write(&m, 0, &[3000]).is_ok(), "left as it was");
    }

    #[test]
    fn an_outdoor_temperature_the_bms_writes_is_bounded_to_minus_50_to_60() {
        let m = northbound_map();
        let outdoor = |c: f32| Ok(vec![NorthboundWrite::OutdoorTemp { celsius: c }]);
        assert_eq!(decode_write(&m, 3, &[(-5000i16) as u16]), outdoor(-50.0));
        assert_eq!(decode_write(&m, 3, &[6000]), outdoor(60.0));
        assert_eq!(decode_write(&m, 3, &[0]), outdoor(0.0));
        // Out of range (the sentinel among them): exception 3, and a
        // multiple write with it is refused whole.
        for raw in [6001, (-5001i16) as u16, 0x8000, 0x7FFF] {
            assert_eq!(
                decode_write(&m, 3, &[raw]),
                Err(ExceptionCode::IllegalDataValue),
                "{raw:#06x}"
            );
        }
        assert_eq!(
            decode_write(&m, 0, &[3000, 0, 0, 6001]),
            Err(ExceptionCode::IllegalDataValue)
        );
        // Through the server, as a BMS's write arrives: exception 3 and
        // nothing reaches the shell; in range, it does.
        let (_tx, rx) = snapshot_channel();
        let (wtx, mut wrx) = mpsc::channel(4);
        let state = State {
            map: m,
            snapshots: rx,
            writes: Some(wtx),
        };
        assert_eq!(
            answer(&state, Request::WriteSingleRegister(3, 6100)),
            Err(ExceptionCode::IllegalDataValue)
        );
        assert!(wrx.try_recv().is_err());
        assert!(answer(&state, Request::WriteSingleRegister(3, 2250)).is_ok());
        assert_eq!(
            wrx.try_recv().unwrap(),
            [NorthboundWrite::OutdoorTemp { celsius: 22.5 }]
        );
    }

    fn readings() -> CduMeasurements {
        CduMeasurements {
            supply_c: Some(30.0),
            return_c: Some(38.0),
            flow_lpm: Some(190.0),
            facility_supply_c: None,
            pumps_running: [Some(true), Some(false)],
            leaks: Some(0),
            it_w: Some(100_000.0),
            cooling_w: Some(4_000.0),
            facility_w: Some(110_000.0),
            ..Default::default()
        }
    }

    #[test]
    fn snapshot_from_a_core_step() {
        let cfg = CoreConfig::default();
        let mut core = Core::new(cfg).unwrap();
        let r = readings();
        let hot = HostReport {
            gpus: 8,
            hottest_c: 71.5,
            gpu_power_w: 8.0 * 500.0,
            limit_w: 700.0,
            slowdown: false,
            at_ms: 2_000,
        };
        let hosts = [
            Some(hot),
            Some(HostReport {
                hottest_c: 90.0,
                at_ms: 0,
                ..hot
            }),
            None,
        ];
        let mut cmds = None;
        for s in 0..=12u64 {
            cmds = Some(core.step(&Inputs {
                now_ms: s * 1000,
                cdu: Some(crate::decide::core_readings(&r)),
                ambient_c: None,
                leaks: cooling_core::LeakInputs::DRY,
                cdu_taken: cooling_core::Taken::ALL,
                valves_held: 0,
                hosts: &hosts,
            }));
        }
        let mut cmds = cmds.unwrap();
        cmds.caps = [None; cooling_core::MAX_HOSTS];
        cmds.caps[5] = Some(HostCap {
            watts: 420.0,
            reason: ReasonCode::CAPACITY_SHORT,
        });
        cmds.caps[9] = Some(HostCap {
            watts: 380.0,
            reason: ReasonCode::CAPACITY_SHORT,
        });
        let settings = NorthboundSettings::new(&cfg);
        // At 16 s the second host's report (at 0 ms) is stale.
        let s = snapshot_from(
            &core,
            &cmds,
            16_000,
            Some(&r),
            CduTook::ALL,
            &hosts,
            &settings,
        );
        assert_eq!(s.mode, cmds.mode);
        assert_eq!(s.uptime_s, 16);
        assert_eq!(s.supply_c, Some(30.0));
        assert_eq!(s.facility_supply_c, None);
        assert_eq!(
            s.sensor_faults & (NOT_AVAILABLE_BIT << 3),
            NOT_AVAILABLE_BIT << 3
        );
        assert_eq!(s.sensor_faults & (NOT_AVAILABLE_BIT * 0b111), 0);
        assert_eq!(s.pumps & pump_bits::A_RUNNING, pump_bits::A_RUNNING);
        assert_eq!(s.pumps & pump_bits::B_RUNNING, 0);
        assert_eq!(s.pumps & pump_bits::A_ON, pump_bits::A_ON);
        assert_eq!(s.lead_pump, 0);
        assert_eq!(s.hosts_capped, 2);
        assert_eq!(s.lowest_cap_w, Some(380.0));
        assert_eq!(s.hottest_gpu_c, Some(71.5));
        assert!((s.pue.unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(s.cooling_w, Some(4_000.0));
        assert_eq!(s.valves_open, 0b1111);
        assert_eq!(s.settings, settings);
        assert!((s.pump_speed_pct - cmds.pump_speed * 100.0).abs() < 1e-4);
        // The CDU silent: every reading and meter not available.
        let s = snapshot_from(&core, &cmds, 16_000, None, CduTook::ALL, &hosts, &settings);
        assert_eq!((s.supply_c, s.it_w, s.pue), (None, None, None));
        assert_eq!(s.sensor_faults & 0x0F00, 0x0F00);
        assert_eq!(s.pumps & (pump_bits::A_RUNNING | pump_bits::B_RUNNING), 0);
    }

    /// Rack 2 leaks and its valve is commanded shut; the register shows
    /// the valves the CDU has (`ctl status`'s), not the command: a close
    /// that did not go in is not shown as done.
    #[test]
    fn valves_open_shows_the_valves_the_cdu_has_not_those_commanded() {
        let core = Core::new(CoreConfig::default()).unwrap();
        let racks = CoreConfig::default().layout.racks;
        assert_eq!(racks, 4);
        let mut cmds = cooling_core::Commands::UNSET;
        cmds.valves_open = 0b1011;
        let settings = NorthboundSettings::default();
        let snap = |r: Option<&CduMeasurements>, valves| {
            let took = CduTook {
                valves,
                ..CduTook::ALL
            };
            snapshot_from(&core, &cmds, 1_000, r, took, &[], &settings).valves_open
        };
        // The positions read every valve open: rack 2's close did not go in.
        let open = CduMeasurements {
            valves_closed: Some(0),
            ..readings()
        };
        assert_eq!(snap(Some(&open), Some(0b1011)), 0b1111);
        assert_eq!(snap(Some(&open), None), 0b1111);
        // Positions read shut: shut.
        let shut = CduMeasurements {
            valves_closed: Some(0b0100),
            ..readings()
        };
        assert_eq!(snap(Some(&shut), None), 0b1011);
        // No positions: as the CDU last took them; the CDU silent too.
        assert_eq!(snap(Some(&readings()), Some(0b1111)), 0b1111);
        assert_eq!(snap(None, Some(0b1011)), 0b1011);
        // Nothing known (no write went in, no positions): none shown shut.
        assert_eq!(snap(None, None), 0b1111);
        assert_eq!(valves_held(None, None, racks), None);
    }

    #[test]
    fn a_cdus_sentinel_reads_not_available_at_once() {
        let core = Core::new(CoreConfig::default()).unwrap();
        let cmds = cooling_core::Commands::UNSET;
        let mut r = readings();
        // 0x8000 of a centidegree register: the CDU's "no value".
        r.supply_c = Some(-327.68);
        let s = snapshot_from(
            &core,
            &cmds,
            1_000,
            Some(&r),
            CduTook::ALL,
            &[],
            &NorthboundSettings::default(),
        );
        assert_eq!(s.supply_c, None, "not a figure, before any fault");
        let supply = Which::Supply as u16;
        assert_eq!(
            s.sensor_faults & (NOT_AVAILABLE_BIT << supply),
            NOT_AVAILABLE_BIT << supply
        );
        assert_eq!(s.return_c, readings().return_c.map(|x| x as f32));
    }

    #[test]
    fn a_lost_sensor_reads_not_available_with_its_fault_bit() {
        let mut core = Core::new(CoreConfig::default()).unwrap();
        let mut r = readings();
        let mut cmds = None;
        for s in 0..=30u64 {
            if s >= 15 {
                r.flow_lpm = None;
            }
            cmds = Some(core.step(&Inputs {
                now_ms: s * 1000,
                cdu: Some(crate::decide::core_readings(&r)),
                ambient_c: None,
                leaks: cooling_core::LeakInputs::DRY,
                cdu_taken: cooling_core::Taken::ALL,
                valves_held: 0,
                hosts: &[],
            }));
        }
        let cmds = cmds.unwrap();
        assert_eq!(core.sensor_fault(Which::Flow), Some(SensorFault::Lost));
        // Even were the CDU to give a number again, the core holds it lost.
        let s = snapshot_from(
            &core,
            &cmds,
            30_000,
            Some(&readings()),
            CduTook::ALL,
            &[],
            &NorthboundSettings::default(),
        );
        assert_eq!(s.flow_lpm, None);
        // The facility supply never read: lost too (not required).
        let (flow, fac) = (Which::Flow as u16, Which::FacilitySupply as u16);
        assert_eq!(
            core.sensor_fault(Which::FacilitySupply),
            Some(SensorFault::Lost)
        );
        assert_eq!(
            s.sensor_faults,
            (FAULT_BIT << flow)
                | (FAULT_BIT << fac)
                | (NOT_AVAILABLE_BIT << flow)
                | (NOT_AVAILABLE_BIT << fac)
        );
        // The pump's curve stands in for the flow: degraded, not failsafe.
        assert_eq!(s.mode, CduMode::Degraded);
        let img = encode_snapshot(&northbound_map(), &s, false);
        assert_eq!(img.input[&9], 0xFFFF);
        assert_eq!(img.input[&0], 2);
    }

    #[tokio::test]
    async fn a_full_channel_is_busy_and_a_gone_shell_a_device_failure() {
        let (_tx, rx) = snapshot_channel();
        let (wtx, mut wrx) = mpsc::channel(1);
        let state = State {
            map: northbound_map(),
            snapshots: rx,
            writes: Some(wtx),
        };
        // A request's writes go as one, the ceiling and the offset
        // together: the shell never takes one without the other.
        let block = [
            NorthboundWrite::SetpointCeiling { celsius: 45.0 },
            NorthboundWrite::PlanCeilingOffset { kelvin: -0.5 },
        ];
        assert_eq!(state.write(0, &[4500, (-5i16) as u16]), Ok(block.to_vec()));
        // The channel of one is full until the shell takes it.
        assert_eq!(
            state.write(0, &[3000]),
            Err(ExceptionCode::ServerDeviceBusy)
        );
        assert_eq!(wrx.try_recv().unwrap(), block);
        assert!(wrx.try_recv().is_err(), "one message");
        assert_eq!(
            state.write(0, &[3000]),
            Ok(vec![NorthboundWrite::SetpointCeiling { celsius: 30.0 }])
        );
        assert_eq!(
            wrx.try_recv().unwrap(),
            [NorthboundWrite::SetpointCeiling { celsius: 30.0 }]
        );
        // The shell closes its end as it stops (taking what was queued):
        // a write is then a device failure (exception 4), as once it is
        // gone, never answered as taken.
        wrx.close();
        assert_eq!(
            state.write(0, &[3000]),
            Err(ExceptionCode::ServerDeviceFailure)
        );
        drop(wrx);
        assert_eq!(
            state.write(0, &[3000]),
            Err(ExceptionCode::ServerDeviceFailure)
        );
        assert_eq!(
            answer(&state, Request::ReadCoils(0, 1)),
            Err(ExceptionCode::IllegalFunction)
        );
        let disabled = State {
            writes: None,
            ..state
        };
        assert_eq!(disabled.write(7, &[1]), Err(ExceptionCode::IllegalFunction));
        assert_eq!(
            disabled.read(Kind::Input, 34, 2),
            Err(ExceptionCode::IllegalDataAddress)
        );
        assert_eq!(disabled.read(Kind::Input, 31, 2), Ok(vec![0xFFFF, 0]));
    }

    /// A read of no register or of more than 125 is a quantity out of
    /// range: exception 3, whatever the address; 125 is a quantity the
    /// server takes (exception 2 only for the addresses outside the map).
    #[test]
    fn a_read_of_0_or_126_registers_is_an_illegal_data_value() {
        let (_tx, rx) = snapshot_channel();
        let state = State {
            map: northbound_map(),
            snapshots: rx,
            writes: None,
        };
        for kind in [Kind::Input, Kind::Holding] {
            for count in [0, 126, u16::MAX] {
                assert_eq!(
                    state.read(kind, 0, count),
                    Err(ExceptionCode::IllegalDataValue),
                    "{kind:?} {count}"
                );
            }
            assert_eq!(
                state.read(kind, 0, 125),
                Err(ExceptionCode::IllegalDataAddress)
            );
        }
        assert_eq!(
            answer(&state, Request::ReadInputRegisters(0, 126)),
            Err(ExceptionCode::IllegalDataValue)
        );
    }
}

//! The controller's northbound Modbus TCP server, read and written the way
//! a building management system would, by a client nobody here wrote:
//! `mbpoll`.

use cooling_ctrl::northbound::{
    northbound_map, pump_bits, serve, snapshot_channel, Alarms, NorthboundSettings,
    NorthboundSnapshot, NorthboundWrite, NOT_AVAILABLE_BIT,
};
use loopwarden_protocol::message::CduMode;
use loopwarden_protocol::ReasonCode;
use loopwarden_system_tests::{mbpoll, mbpoll_unit, mbpoll_values as values, require_tool};
use tokio::sync::{mpsc, watch};

/// A known step: degraded for capacity, the return sensor lost, with
/// what it shows alarming (as the shell publishes it).
fn snapshot() -> NorthboundSnapshot {
    let mut s = step();
    s.alarms = Alarms::of(&s, 87.0);
    s
}

/// The step of [`snapshot`], its alarms not yet set.
fn step() -> NorthboundSnapshot {
    NorthboundSnapshot {
        mode: CduMode::Degraded,
        reason: ReasonCode::CAPACITY_SHORT,
        seconds_in_mode: 70_000,
        uptime_s: 86_500,
        setpoint_c: 32.05,
        supply_c: Some(-1.5),
        return_c: None,
        flow_lpm: Some(172.8),
        facility_supply_c: Some(24.0),
        sensor_faults: 0x0002 | (NOT_AVAILABLE_BIT << 1),
        pumps: pump_bits::A_RUNNING | pump_bits::A_ON | pump_bits::B_FAILED,
        lead_pump: 0,
        pump_speed_pct: 80.0,
        valves_open: 0b1011,
        cooling_lost: 0b0100,
        leaks_latched: 0b0100,
        leak_sensing_lost: 0b0001,
        isolation_failed: 0,
        hosts_capped: 3,
        lowest_cap_w: Some(450.0),
        hottest_gpu_c: Some(81.25),
        proposed_setpoint_c: 34.5,
        proposed_speed_pct: 60.0,
        rejection_short: Some(true),
        beacon: true,
        cdu_refuses_writes: false,
        pue: Some(1.0845),
        it_w: Some(108_400.0),
        facility_w: Some(117_550.0),
        cooling_w: None,
        settings: NorthboundSettings {
            setpoint_ceiling_c: 40.0,
            plan_ceiling_offset_k: -2.5,
            alarm_acknowledged: false,
            outdoor_c: None,
        },
        alarms: Alarms::default(),
    }
}

struct Served {
    port: u16,
    snapshots: watch::Sender<NorthboundSnapshot>,
    writes: Option<mpsc::Receiver<Vec<NorthboundWrite>>>,
    _rt: tokio::runtime::Runtime,
}

/// The server on a free loopback port, writes enabled or not.
fn serve_it(writes_enabled: bool) -> Served {
    serve_as(writes_enabled, northbound_map())
}

/// As [`serve_it`], serving `map` (and its unit id).
fn serve_as(writes_enabled: bool, map: loopwarden_boards::modbus_map::RegisterMap) -> Served {
    let (tx, rx) = snapshot_channel();
    tx.send_replace(snapshot());
    let (wtx, wrx) = if writes_enabled {
        let (a, b) = mpsc::channel(8);
        (Some(a), Some(b))
    } else {
        (None, None)
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    rt.spawn(serve(listener, map, rx, wtx));
    Served {
        port,
        snapshots: tx,
        writes: wrx,
        _rt: rt,
    }
}

#[test]
fn mbpoll_reads_the_state_meters_and_sentinels() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let s = serve_it(false);
    // Input registers 0-12: mode 2 (degraded), reason 2005, 70,000 s in
    // mode (0x0001_1170), uptime 86,500 s (0x0001_51E4), setpoint 32.05,
    // supply -1.5 °C (unsigned 65386), return lost (0x8000 = 32768), flow
    // 172.8, facility supply 24.00, faults (return faulty and not
    // available), pumps (A running and on, B failed).
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "0", "-c", "13", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(
        values(&text),
        vec![2, 2005, 1, 0x1170, 1, 0x51E4, 3205, 65386, 32768, 1728, 2400, 0x0202, 0b1_1001],
        "{text}"
    );
    // The rest: lead, speed, valves, lost, leaks, capped, lowest cap,
    // hottest, proposals, short, beacon, PUE, meters (cooling's not
    // available), writes disabled.
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "13", "-c", "20", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(
        values(&text),
        vec![
            0, 800, 0b1011, 0b0100, 0b0100, 3, 450, 8125, 3450, 600, 1, 1, 1085, 1, 0xA770, 1,
            0xCB2E, 65535, 65535, 0
        ],
        "{text}"
    );
    // The 32-bit meters as mbpoll joins them, high word first (-B) as the
    // map says.
    let (ok, text) = mbpoll(
        s.port,
        &["-t", "3:int", "-B", "-r", "26", "-c", "2", "127.0.0.1"],
    );
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![108_400, 117_550], "{text}");
    // The sentinel in hex.
    let (ok, text) = mbpoll(s.port, &["-t", "3:hex", "-r", "8", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert!(text.contains("0x8000"), "{text}");
    // Holding registers: ceiling 40.00 °C, offset -2.5 K (unsigned
    // 65511), nothing acknowledged, no outdoor temperature of the BMS in
    // force (0x8000).
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "-c", "4", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![4000, 65511, 0, 32768], "{text}");
    // A new step shows at once.
    let mut next = snapshot();
    next.mode = CduMode::Normal;
    next.reason = ReasonCode::OK;
    s.snapshots.send_replace(next);
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "0", "-c", "2", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![1, 0], "{text}");
    // Leak sensing lost on rack 0, no isolation failed.
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "33", "-c", "2", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![1, 0], "{text}");
    // Past the map: exception 2.
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "34", "-c", "2", "127.0.0.1"]);
    assert!(!ok, "{text}");
    assert!(
        text.to_lowercase().contains("illegal data address"),
        "{text}"
    );
}

#[test]
fn writes_are_refused_with_exception_1_while_disabled() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let s = serve_it(false);
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "127.0.0.1", "3500"]);
    assert!(!ok, "{text}");
    eprintln!("mbpoll, writes disabled:\n{text}");
    assert!(text.to_lowercase().contains("illegal function"), "{text}");
    // Nothing changed.
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![4000], "{text}");
}

#[test]
fn writes_in_range_reach_the_shell_and_out_of_range_get_exception_3() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let mut s = serve_it(true);
    let mut writes = s.writes.take().expect("writes enabled");
    let (ok, text) = mbpoll(s.port, &["-t", "3", "-r", "32", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![1], "{text}");
    // One setting.
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "127.0.0.1", "3550"]);
    assert!(ok, "{text}");
    assert_eq!(
        writes.try_recv(),
        Ok(vec![NorthboundWrite::SetpointCeiling { celsius: 35.5 }])
    );
    // Several at once: -5.0 K is 0xFFCE, and the alarm acknowledged.
    let (ok, text) = mbpoll(
        s.port,
        &["-t", "4:hex", "-r", "0", "127.0.0.1", "3000", "0xFFCE", "1"],
    );
    assert!(ok, "{text}");
    // One request's writes reach the shell as one, to be applied together;
    // the acknowledgement carries what the registers showed alarming.
    let seen = snapshot().alarms;
    assert_ne!(seen, Alarms::default());
    assert_eq!(
        writes.try_recv(),
        Ok(vec![
            NorthboundWrite::SetpointCeiling { celsius: 30.0 },
            NorthboundWrite::PlanCeilingOffset { kelvin: -5.0 },
            NorthboundWrite::AlarmAck { seen }
        ])
    );
    // 50 °C is above the 45 °C the map allows: exception 3, nothing sent.
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "127.0.0.1", "5000"]);
    assert!(!ok, "{text}");
    eprintln!("mbpoll, out of range:\n{text}");
    assert!(text.to_lowercase().contains("illegal data value"), "{text}");
    // A multiple write with one bad value (+1 K offset) is refused whole.
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "127.0.0.1", "3000", "10"]);
    assert!(!ok, "{text}");
    assert!(text.to_lowercase().contains("illegal data value"), "{text}");
    assert!(writes.try_recv().is_err(), "nothing reached the shell");
    // The holding registers read what is in force: the shell applies and
    // publishes, then they read back.
    let mut next = snapshot();
    let mut settings = next.settings;
    settings.apply(NorthboundWrite::SetpointCeiling { celsius: 30.0 });
    settings.apply(NorthboundWrite::PlanCeilingOffset { kelvin: -5.0 });
    settings.apply(NorthboundWrite::AlarmAck { seen });
    next.settings = settings;
    s.snapshots.send_replace(next);
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "0", "-c", "3", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![3000, 0xFFCE, 1], "{text}");
}

#[test]
fn an_outdoor_temperature_out_of_range_gets_exception_3() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let mut s = serve_it(true);
    let mut writes = s.writes.take().expect("writes enabled");
    // -7.25 °C (unsigned 64811) is taken.
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "3", "127.0.0.1", "64811"]);
    assert!(ok, "{text}");
    assert_eq!(
        writes.try_recv(),
        Ok(vec![NorthboundWrite::OutdoorTemp { celsius: -7.25 }])
    );
    // 61.00 °C and -50.01 °C (unsigned 60535) are outside -50 to 60 °C:
    // exception 3, nothing sent.
    for raw in ["6100", "60535"] {
        let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "3", "127.0.0.1", raw]);
        assert!(!ok, "{text}");
        assert!(text.to_lowercase().contains("illegal data value"), "{text}");
    }
    assert!(writes.try_recv().is_err(), "nothing reached the shell");
    // In force, it reads back.
    let mut next = snapshot();
    next.settings.outdoor_c = Some(-7.25);
    s.snapshots.send_replace(next);
    let (ok, text) = mbpoll(s.port, &["-t", "4", "-r", "3", "127.0.0.1"]);
    assert!(ok, "{text}");
    assert_eq!(values(&text), vec![64811], "{text}");
}

#[test]
fn only_its_own_unit_id_and_255_are_answered_and_another_unit_changes_nothing() {
    if require_tool("mbpoll").is_none() {
        return;
    }
    let mut map = northbound_map();
    map.unit_id = 17;
    let mut s = serve_as(true, map);
    let read = ["-t", "3", "-r", "0", "-c", "2", "127.0.0.1"];
    // Its own unit id and 255 (the Modbus TCP "this server") read the
    // mode and the reason.
    for unit in [17, 255] {
        let (ok, text) = mbpoll_unit(s.port, unit, "1", &read);
        assert!(ok, "unit {unit}: {text}");
        assert_eq!(values(&text), vec![2, 2005], "unit {unit}: {text}");
    }
    // Any other, 0 and the map's shipped 1 included: no answer at all,
    // not an exception.
    for unit in [0, 1, 16, 247] {
        let (ok, text) = mbpoll_unit(s.port, unit, "0.3", &read);
        assert!(!ok, "unit {unit} got an answer: {text}");
        assert!(values(&text).is_empty(), "unit {unit}: {text}");
        assert!(text.contains("timed out"), "unit {unit}: {text}");
        assert!(!text.contains("xception"), "unit {unit}: {text}");
    }
    // A write to another unit is not done; the same write to its own is.
    let write = ["-t", "4", "-r", "0", "127.0.0.1", "3550"];
    let (ok, text) = mbpoll_unit(s.port, 5, "0.3", &write);
    assert!(!ok, "{text}");
    let writes = s.writes.as_mut().expect("writes enabled");
    assert!(writes.try_recv().is_err(), "a write for unit 5 was taken");
    let (ok, text) = mbpoll_unit(s.port, 17, "1", &write);
    assert!(ok, "{text}");
    assert!(
        writes.try_recv().is_ok(),
        "the write for unit 17 was not taken"
    );
}

//! The northbound server's request parsing, two ways.
//!
//! - `northbound_write`: [`decode_write`], the pure function the server
//!   hands a BMS's write to, on mutated writes (addresses and lengths on
//!   the map's edges and the address space's, values on and past each
//!   register's range) under the shipped map and maps whose holding
//!   registers are moved (as TOML, then kept only if [`check_map`] takes
//!   them). A write it accepts must lie inside the address space and hand
//!   on only values within each register's range.
//! - `northbound_server`: the server itself ([`serve`], over tokio-modbus)
//!   on loopback, fed mutated request bytes: whole requests of every
//!   function and unit id with their length kept right (so the PDU parser
//!   and the register file are reached) or mutated as raw bytes, several
//!   in one send, cut anywhere. The client then closes its side; the
//!   server must answer only whole Modbus TCP frames, never panic (a panic
//!   hook watches its thread), hand on only values within range, and go
//!   on answering a valid read on another connection after every input.

use std::io::{Read, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cooling_ctrl::northbound::{
    check_map, decode_write, encode_snapshot, northbound_map, serve, snapshot_channel, Alarms,
    NorthboundWrite, MAP_TOML,
};
use loopwarden_boards::modbus_map::{Kind, RegisterMap};

use crate::harness::{fuzz, mutate_bytes, Hex, Rng};
use crate::toml_mutate::TomlMutator;

/// The register a write is for, and its value (`None`: the acknowledge).
fn written(w: &NorthboundWrite) -> (&'static str, Option<f64>) {
    match w {
        NorthboundWrite::SetpointCeiling { celsius } => {
            ("setpoint_ceiling", Some(f64::from(*celsius)))
        }
        NorthboundWrite::PlanCeilingOffset { kelvin } => {
            ("plan_ceiling_offset", Some(f64::from(*kelvin)))
        }
        NorthboundWrite::AlarmAck { .. } => ("alarm_ack", None),
        NorthboundWrite::OutdoorTemp { celsius } => ("outdoor_temp", Some(f64::from(*celsius))),
    }
}

/// A write handed on must be within its register's range (to f32's
/// precision).
fn within_range(map: &RegisterMap, w: &NorthboundWrite) -> Result<(), String> {
    let (name, value) = written(w);
    let r = map
        .get(name)
        .ok_or_else(|| format!("{w:?}: {name} is not in the map"))?;
    let (Some(v), Some(lo), Some(hi)) = (value, r.min, r.max) else {
        return Ok(());
    };
    let slack = 1e-6 * (1.0 + lo.abs().max(hi.abs()));
    if !(v >= lo - slack && v <= hi + slack) {
        return Err(format!("{w:?} is outside {name}'s [{lo}, {hi}]"));
    }
    Ok(())
}

/// A write: the map (an index into the maps), the first address and the
/// words.
#[derive(Debug, Clone)]
struct WriteCase {
    map: usize,
    addr: u16,
    words: Vec<u16>,
}

fn check_write(maps: &[RegisterMap], case: &WriteCase) -> Result<(), String> {
    let map = &maps[case.map];
    let Ok(writes) = decode_write(map, case.addr, &case.words) else {
        return Ok(());
    };
    if case.words.is_empty() || u32::from(case.addr) + case.words.len() as u32 > 65_536 {
        return Err(format!(
            "{} words at {} taken: {writes:?}",
            case.words.len(),
            case.addr
        ));
    }
    writes.iter().try_for_each(|w| within_range(map, w))
}

/// The shipped map with register `name` moved to `address`.
fn moved(name: &str, address: u16) -> RegisterMap {
    let mut file: toml::Table = MAP_TOML.parse().expect("the shipped map");
    let registers = file["register"].as_array_mut().expect("registers");
    for r in registers.iter_mut().filter_map(toml::Value::as_table_mut) {
        if r["name"].as_str() == Some(name) {
            r.insert("address".into(), toml::Value::Integer(address.into()));
        }
    }
    let text = toml::to_string(&file).expect("TOML");
    RegisterMap::from_toml(&text, "moved").expect("a map")
}

/// Maps for `northbound_write`: the shipped one, each setting moved to
/// the last address, and mutations of the shipped one that the server
/// would serve.
fn write_maps(rng: &mut Rng) -> Vec<RegisterMap> {
    let mutator = TomlMutator::new(&[MAP_TOML.to_string()]);
    let mut maps = vec![northbound_map()];
    let settings = [
        "setpoint_ceiling",
        "plan_ceiling_offset",
        "alarm_ack",
        "outdoor_temp",
    ];
    maps.extend(settings.iter().map(|name| moved(name, 65_535)));
    for _ in 0..20_000 {
        if maps.len() == 64 {
            break;
        }
        let text = mutator.mutate(rng);
        if let Ok(m) = RegisterMap::from_toml(&text, "fuzz map") {
            if check_map(&m).is_ok() && m.registers().any(|r| r.kind == Kind::Holding) {
                maps.push(m);
            }
        }
    }
    maps
}

/// Words on and past the registers' edges, in raw units.
const WORDS: [u16; 10] = [0, 1, 2, 100, 2_000, 4_500, 4_501, 0x7FFF, 0x8000, 0xFFFF];

fn mutate_write(rng: &mut Rng, maps: &[RegisterMap], seeds: &[WriteCase]) -> WriteCase {
    let mut c = rng.pick(seeds).clone();
    c.map = rng.below(maps.len());
    let holding: Vec<u16> = maps[c.map]
        .registers()
        .filter(|r| r.kind == Kind::Holding)
        .map(|r| r.address)
        .collect();
    for _ in 0..rng.between(1, 3) {
        match rng.below(5) {
            0 => c.addr = *rng.pick(&holding),
            1 => c.addr = *rng.pick(&[0, 1, 65_534, 65_535, c.addr.wrapping_sub(1)]),
            2 => c.words.resize(*rng.pick(&[0, 1, 2, 3, 4, 5, 123, 124]), 0),
            _ if !c.words.is_empty() => {
                let i = rng.below(c.words.len());
                c.words[i] = if rng.one_in(2) {
                    *rng.pick(&WORDS)
                } else {
                    rng.next_u64() as u16
                };
            }
            _ => c.words.push(rng.next_u64() as u16),
        }
    }
    c
}

#[test]
fn northbound_write() {
    let maps = write_maps(&mut Rng::new(0x6E62));
    let seeds = vec![
        WriteCase {
            map: 0,
            addr: 0,
            words: vec![4_000, (-25i16) as u16, 1, (-1_250i16) as u16],
        },
        WriteCase {
            map: 0,
            addr: 2,
            words: vec![0],
        },
        WriteCase {
            map: 0,
            addr: 3,
            words: vec![(-5_000i16) as u16],
        },
    ];
    fuzz(
        "northbound_write",
        &seeds,
        |rng, seeds| mutate_write(rng, &maps, seeds),
        |case| check_write(&maps, case),
    );
}

/// The name of the thread the server runs on, which the panic hook
/// watches.
const SERVER_THREAD: &str = "northbound-fuzz";

/// What went wrong on the server's side: panics on its thread, values
/// out of range handed on.
type Faults = Mutex<Vec<String>>;

/// The server every test of this file sends to, and what went wrong on
/// its side. Started once, with a panic hook that records the panics on
/// its thread (and passes every panic on to the previous hook).
fn server() -> (SocketAddr, &'static Faults) {
    static FAULTS: Faults = Mutex::new(Vec::new());
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    let addr = *ADDR.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some(SERVER_THREAD) {
                FAULTS
                    .lock()
                    .unwrap()
                    .push(format!("the server panicked: {info}"));
            }
            previous(info);
        }));
        start_server(&FAULTS)
    });
    (addr, &FAULTS)
}

/// Starts the server, writes enabled, on its own thread; its address.
fn start_server(faults: &'static Faults) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(SERVER_THREAD.into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                tx.send(listener.local_addr().expect("addr"))
                    .expect("the test waits");
                let (snap_tx, snapshots) = snapshot_channel();
                let (writes, mut handed_on) = tokio::sync::mpsc::channel(8);
                // The shell's part: check each write, then publish the
                // registers with it, as `run` and the gateway do (the
                // server answers a write once the registers read it).
                tokio::spawn(async move {
                    let map = northbound_map();
                    while let Some(ws) = handed_on.recv().await {
                        for w in ws {
                            if let Err(e) = within_range(&map, &w) {
                                faults.lock().unwrap().push(e);
                            }
                            snap_tx.send_modify(|s| s.settings.apply(w));
                        }
                    }
                });
                let _ = serve(listener, northbound_map(), snapshots, Some(writes)).await;
            });
        })
        .expect("a thread");
    rx.recv().expect("the server's address")
}

/// A Modbus TCP frame of `pdu`.
fn adu(tid: u16, unit: u8, pdu: &[u8]) -> Vec<u8> {
    let mut out = tid.to_be_bytes().to_vec();
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(pdu.len() as u16 + 1).to_be_bytes());
    out.push(unit);
    out.extend_from_slice(pdu);
    out
}

/// Request PDUs of every kind the server sees: reads, writes (single and
/// multiple, in and out of range), functions it does not serve.
const PDUS: &[&[u8]] = &[
    &[4, 0, 0, 0, 10],
    &[4, 0, 30, 0, 20],
    &[3, 0, 0, 0, 4],
    &[6, 0, 0, 0x0F, 0xA0],
    &[6, 0, 2, 0, 1],
    &[16, 0, 0, 0, 4, 8, 0x0F, 0xA0, 0xFF, 0xE7, 0, 1, 0xFB, 0x1E],
    &[16, 0, 1, 0, 1, 2, 0, 0],
    &[1, 0, 0, 0, 8],
    &[43, 14, 1, 0],
    &[23, 0, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0],
];

/// Units: its own, the one for anyone, the broadcast, another.
const UNITS: [u8; 4] = [1, 255, 0, 2];

/// One to three requests, each whole with a mutated PDU, or all mutated
/// as raw bytes (the frames' lengths included).
fn mutate_requests(rng: &mut Rng, seeds: &[Hex]) -> Hex {
    let others: Vec<Vec<u8>> = seeds.iter().map(|s| s.0.clone()).collect();
    let mut out = Vec::new();
    for tid in 0..rng.between(1, 3) as u16 {
        let mut pdu = rng.pick(PDUS).to_vec();
        if !rng.one_in(4) {
            mutate_bytes(rng, &mut pdu, &[], 300);
        }
        out.extend(adu(tid, *rng.pick(&UNITS), &pdu));
    }
    if rng.one_in(3) {
        mutate_bytes(rng, &mut out, &others, 1_000);
    }
    Hex(out)
}

/// Whether `bytes` are whole Modbus TCP frames, one after another.
fn whole_frames(mut bytes: &[u8]) -> bool {
    while !bytes.is_empty() {
        if bytes.len() < 8 || bytes[2..4] != [0, 0] {
            return false;
        }
        let len = 6 + usize::from(u16::from_be_bytes([bytes[4], bytes[5]]));
        match bytes.get(len..) {
            Some(rest) if len >= 8 => bytes = rest,
            _ => return false,
        }
    }
    true
}

/// A connection to `addr`. Hundreds of thousands of connections leave
/// this side's ports waiting out their close: a port not free yet is
/// waited for, up to a second, rather than taken for the server's fault.
fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let mut tries = 0;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    }
}

/// Sends `bytes`, closes the sending side and reads what comes back
/// until the server closes.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut s = connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(bytes).map_err(|e| format!("send: {e}"))?;
    let _ = s.shutdown(Shutdown::Write);
    let mut back = Vec::new();
    match s.read_to_end(&mut back) {
        Ok(_) => Ok(back),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(back),
        Err(e) => Err(format!("no end within 5 s: {e}")),
    }
}

/// A valid read on a connection of its own gets its answer.
fn still_answers(addr: SocketAddr) -> Result<(), String> {
    let back = exchange(addr, &adu(7, 1, &[4, 0, 0, 0, 2]))?;
    match back.as_slice() {
        [0, 7, 0, 0, 0, 7, 1, 4, 4, _, _, _, _] => Ok(()),
        other => Err(format!("a valid read afterwards got {other:?}")),
    }
}

fn check_requests(input: &Hex) -> Result<(), String> {
    let (addr, faults) = server();
    let back = exchange(addr, &input.0)?;
    if !whole_frames(&back) {
        return Err(format!(
            "answered with broken frames: {}",
            crate::harness::hex(&back)
        ));
    }
    still_answers(addr)?;
    match faults.lock().unwrap().first() {
        Some(f) => Err(f.clone()),
        None => Ok(()),
    }
}

/// Found by `northbound_write`: a write running past the last address
/// went on at address 0, so a write of two words at 65535 set the
/// register there and the one at 0.
#[test]
fn a_write_past_the_last_address_is_refused() {
    let map = moved("alarm_ack", 65_535);
    assert_eq!(
        decode_write(&map, 65_535, &[1, 4_000]),
        Err(tokio_modbus::ExceptionCode::IllegalDataAddress)
    );
    assert_eq!(
        decode_write(&map, 65_535, &[1]),
        Ok(vec![NorthboundWrite::AlarmAck {
            seen: Alarms::default()
        }])
    );
}

/// Found with `northbound_write`'s maps: a register at the last address
/// overflowed the image's count of its words. Every map of the pool
/// encodes a snapshot with each register's words.
#[test]
fn every_map_of_the_pool_encodes_a_snapshot() {
    let (_tx, snapshots) = snapshot_channel();
    for map in write_maps(&mut Rng::new(0x6E62)) {
        let image = encode_snapshot(&map, &snapshots.borrow(), true);
        for r in map.registers() {
            let words = image.words(&map, &r.name).expect("every register encoded");
            assert_eq!(words.len(), usize::from(r.ty.words()), "{}", r.name);
        }
    }
}

#[test]
fn northbound_server() {
    let seeds: Vec<Hex> = PDUS.iter().map(|p| Hex(adu(1, 1, p))).collect();
    fuzz("northbound_server", &seeds, mutate_requests, check_requests);
}

/// Found by `northbound_server`: requests tokio-modbus's decoder panicked
/// on in the connection's task (a coil write of more coils than its
/// bytes hold; a register write of 0x8004 registers, whose doubling
/// overflows). The server's guard now fails such a connection.
#[test]
fn northbound_server_requests_that_panicked() {
    for hex in [
        "00000000000a010f02c50f0200000f0200010000000601040000000a00020000000602040000000a",
        "00000000000b021000008004080fa0ffe70001000000100110000100010200010001027f7f7f7f7f7f\
         7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f7f48eb7f7f7f7f08040000",
    ] {
        check_requests(&Hex(crate::harness::unhex(hex))).unwrap();
    }
}

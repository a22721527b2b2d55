//! `modbus_client`: the controller's Modbus client ([`ModbusCdu`]) against
//! a CDU on loopback that answers one request of each input with mutated
//! bytes, under a register map that is itself mutated.
//!
//! The fake CDU answers every request correctly from a register file of
//! words on boundaries (0, 0x7FFF, 0x8000, 0xFFFF and random), except the
//! input's chosen one: that answer is mutated (bytes flipped, inserted,
//! cut; the transaction id, length, unit, function or byte count changed
//! with the frame kept whole; or an exception of any code) and the CDU
//! then closes its side, so an answer cut short ends at once rather than
//! at the timeout. The map ([`RegisterMap::from_toml`], a CDU model's
//! file) is mutated as TOML first: addresses, types, scales and word
//! orders on their boundaries change the requests and the decoding.
//!
//! Checks: nothing panics; an error says something; and the client
//! recovers: after an answer that broke the link (a bad answer, none, a
//! link failure) the next read succeeds, and after one that did not,
//! the next or the one after it does.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cooling_ctrl::decide::{Setting, Write};
use cooling_ctrl::modbus::{CduError, CduPort, CduSettings, Link, ModbusCdu};
use loopwarden_boards::modbus_map::RegisterMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{fuzz, mutate_bytes, says_something, Rng};
use crate::toml_mutate::TomlMutator;

const MAP: &str = include_str!("../../../boards/cdus/sim-cdu.toml");

/// What the client does first.
#[derive(Debug, Clone)]
enum Op {
    Read,
    WriteSetting(Setting, f64),
    WriteAll(CduSettings),
}

/// One input: the map, the client's first operation and the answer that
/// goes wrong.
#[derive(Debug, Clone)]
struct Case {
    map: String,
    op: Op,
    /// The register file's words.
    words: u64,
    /// Which answer goes wrong (0: the first), and how.
    fault_at: usize,
    fault: u64,
}

/// What the fake CDU is to do; shared with its connections.
#[derive(Debug, Default)]
struct Plan {
    words: u64,
    /// Answers to give well before the faulty one, and its mutation.
    fault: Option<(usize, u64)>,
}

type Shared = Arc<Mutex<Plan>>;

/// The word at `address` of the register file `seed`.
fn word(seed: u64, address: u16) -> u16 {
    let mut rng = Rng::new(seed ^ u64::from(address).wrapping_mul(0x9E37));
    match rng.below(6) {
        0 => 0,
        1 => 0x7FFF,
        2 => 0x8000,
        3 => 0xFFFF,
        _ => rng.next_u64() as u16,
    }
}

fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

/// The right answer's PDU to `pdu`.
fn answer_pdu(words: u64, pdu: &[u8]) -> Vec<u8> {
    match pdu {
        [f @ (3 | 4), _, _, _, _] => {
            let (start, count) = (be16(pdu, 1), be16(pdu, 3));
            let mut out = vec![*f, (count * 2) as u8];
            for i in 0..count {
                out.extend_from_slice(&word(words, start.wrapping_add(i)).to_be_bytes());
            }
            out
        }
        [6, ..] => pdu.to_vec(),
        [16, a, b, c, d, ..] => vec![16, *a, *b, *c, *d],
        [f, ..] => vec![f | 0x80, 1],
        [] => vec![0x80, 1],
    }
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

/// `frame` (a whole ADU) mutated by the fault `seed`.
fn corrupt(seed: u64, frame: &mut Vec<u8>) {
    let mut rng = Rng::new(seed);
    let pdu_len = frame.len() - 7;
    match rng.below(6) {
        0 => frame[1] = frame[1].wrapping_add(1),
        1 => {
            let len = rng.below(300) as u16;
            frame[4..6].copy_from_slice(&len.to_be_bytes());
        }
        2 => frame[6] = rng.byte(),
        3 if pdu_len >= 2 => frame[7 + rng.below(2)] = rng.byte(),
        4 => {
            let code = if rng.one_in(2) {
                rng.byte()
            } else {
                rng.between(1, 11) as u8
            };
            *frame = adu(be16(frame, 0), frame[6], &[frame[7] | 0x80, code]);
        }
        _ => {
            let mut pdu = frame[7..].to_vec();
            mutate_bytes(&mut rng, &mut pdu, &[], 260);
            if rng.one_in(2) {
                *frame = adu(be16(frame, 0), frame[6], &pdu);
            } else {
                frame.truncate(7);
                frame.extend_from_slice(&pdu);
            }
        }
    }
}

/// The fake CDU's answer to one request; `true` when it is the faulty one.
fn respond(plan: &Shared, tid: u16, unit: u8, pdu: &[u8]) -> (Vec<u8>, bool) {
    let mut plan = plan.lock().unwrap();
    let mut frame = adu(tid, unit, &answer_pdu(plan.words, pdu));
    match plan.fault {
        Some((0, seed)) => {
            plan.fault = None;
            corrupt(seed, &mut frame);
            (frame, true)
        }
        Some((n, seed)) => {
            plan.fault = Some((n - 1, seed));
            (frame, false)
        }
        None => (frame, false),
    }
}

/// Serves one connection: answers requests until the faulty answer, then
/// closes its side and reads until the client goes.
async fn serve_connection(mut stream: TcpStream, plan: Shared) {
    let mut header = [0u8; 7];
    while stream.read_exact(&mut header).await.is_ok() {
        let mut pdu = vec![0u8; usize::from(be16(&header, 4)).saturating_sub(1)];
        if stream.read_exact(&mut pdu).await.is_err() {
            return;
        }
        let (frame, faulty) = respond(&plan, be16(&header, 0), header[6], &pdu);
        if stream.write_all(&frame).await.is_err() {
            return;
        }
        if faulty {
            let _ = stream.shutdown().await;
            let mut sink = Vec::new();
            let _ = stream.read_to_end(&mut sink).await;
            return;
        }
    }
}

async fn fake_cdu(plan: Shared) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, plan.clone()));
        }
    });
    addr
}

async fn run_op(cdu: &mut ModbusCdu, op: &Op) -> Result<(), CduError> {
    match op {
        Op::Read => cdu.read().await.map(|_| ()),
        Op::WriteSetting(setting, value) => {
            let w = Write {
                setting: *setting,
                value: *value,
            };
            cdu.write_setting(&w).await
        }
        Op::WriteAll(settings) => cdu.write(settings).await,
    }
}

/// Whether the client dropped the link after `e`: the next request opens
/// it afresh.
fn link_dropped(e: &CduError) -> bool {
    matches!(
        e.root(),
        CduError::BadAnswer { .. } | CduError::NoAnswer { .. } | CduError::Io { .. }
    )
}

async fn exercise(case: &Case, addr: SocketAddr, plan: &Shared) -> Result<(), String> {
    let map = match RegisterMap::from_toml(&case.map, "fuzz map") {
        Err(e) => return says_something("register map", &e.to_string()),
        Ok(map) => map,
    };
    *plan.lock().unwrap() = Plan {
        words: case.words,
        fault: Some((case.fault_at, case.fault)),
    };
    let mut cdu = ModbusCdu::new(map, Link::Tcp(addr.into())).with_timeout(Duration::from_secs(2));
    let first = run_op(&mut cdu, &case.op).await;
    plan.lock().unwrap().fault = None;
    if let Err(e) = &first {
        says_something("client", &e.to_string())?;
    }
    match (cdu.read().await, first) {
        (Ok(_), _) => Ok(()),
        (Err(e), Err(first)) if link_dropped(&first) => {
            Err(format!("after {first}, the next read failed: {e}"))
        }
        (Err(e), _) => match cdu.read().await {
            Ok(_) => Ok(()),
            Err(again) => Err(format!("no recovery: {e}, then {again}")),
        },
    }
}

/// A value for a setting: inside, on and past the maps' ranges.
fn value(rng: &mut Rng) -> f64 {
    const VALUES: [f64; 12] = [
        0.0,
        1.0,
        3.0,
        15.0,
        30.5,
        100.0,
        65_535.0,
        65_536.0,
        -1.0,
        1e12,
        f64::NAN,
        f64::INFINITY,
    ];
    if rng.one_in(3) {
        (rng.next_u64() % 20_000) as f64 / 100.0
    } else {
        *rng.pick(&VALUES)
    }
}

fn op(rng: &mut Rng) -> Op {
    match rng.below(4) {
        0 | 1 => Op::Read,
        2 => Op::WriteSetting(*rng.pick(&Setting::ORDER), value(rng)),
        _ => Op::WriteAll(CduSettings {
            setpoint_c: value(rng),
            pump_speed_pct: value(rng),
            lead_pump: rng.byte(),
            valves_open: rng.next_u64() as u16,
            pumps_run: rng.byte() % 4,
            heartbeat: rng.next_u64() as u16,
        }),
    }
}

fn seeds() -> Vec<String> {
    let low = MAP.replacen(
        "word_order = \"high_first\"",
        "word_order = \"low_first\"",
        1,
    );
    vec![MAP.to_string(), low]
}

#[test]
fn modbus_client() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let plan = Shared::default();
    let addr = rt.block_on(fake_cdu(plan.clone()));
    let maps = seeds();
    let mutator = TomlMutator::new(&maps);
    let cases: Vec<Case> = maps
        .iter()
        .map(|m| Case {
            map: m.clone(),
            op: Op::Read,
            words: 1,
            fault_at: 9,
            fault: 1,
        })
        .collect();
    fuzz(
        "modbus_client",
        &cases,
        |rng, cases| Case {
            map: if rng.one_in(3) {
                mutator.mutate(rng)
            } else {
                rng.pick(cases).map.clone()
            },
            op: op(rng),
            words: rng.next_u64(),
            fault_at: rng.below(3),
            fault: rng.next_u64(),
        },
        |case| rt.block_on(exercise(case, addr, &plan)),
    );
}

/// Found by `modbus_client`: a map with a register at the last address,
/// 65535, made the map's parser overflow (its addresses' end in 16 bits),
/// and then a read of it the client's own description of the request.
#[test]
fn a_register_at_the_last_address_is_read() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let plan = Shared::default();
    let addr = rt.block_on(fake_cdu(plan.clone()));
    let map = MAP.replacen("address = 20\n", "address = 65535\n", 1);
    assert_ne!(map, MAP, "the outdoor sensor moved");
    let case = Case {
        map,
        op: Op::Read,
        words: 1,
        fault_at: 9,
        fault: 1,
    };
    rt.block_on(exercise(&case, addr, &plan)).unwrap();
}

//! Fuzz targets of the protocol's decoders, run for a time budget (see
//! `tests/fuzz/harness.rs`): what a node reads off the bus.
//!
//! - `frame_decode`: [`Frame::decode`] on mutated sample frames of every
//!   kind. Random bytes never pass a frame's CRC, so seven inputs in eight
//!   get their CRC recomputed after the mutation and reach the version,
//!   header and body decoders (the older minor versions' shapes too: the
//!   minor byte is a favourite target); the rest keep a bad one. A frame
//!   that decodes must encode, decode back to itself, go to JSON and back,
//!   and have its signature checked (if it has one) without a panic.
//! - `body_decode`: [`Message::decode_body`], the bodies the event log
//!   stores, mutated; one that decodes must round-trip.
//! - `json_decode`: [`Frame::from_json`], the JSON form a bus client also
//!   accepts, on mutated sample JSON; one that decodes must round-trip.
//!
//! Every error must say something (a non-empty `Display`).

#[path = "../../tests/fuzz/harness.rs"]
mod harness;

use std::sync::OnceLock;

use harness::{fuzz, mutate_bytes, says_something, unhex, Hex, Rng};
use loopwarden_protocol::auth::VerifyingKey;
use loopwarden_protocol::samples;
use loopwarden_protocol::{Frame, Message, MessageKind, MAX_FRAME_LEN};

const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// Every kind's sample frame, and telemetry of 0, 1 and 16 GPUs.
fn sample_frames() -> Vec<Frame> {
    let mut frames: Vec<Frame> = MessageKind::ALL
        .iter()
        .map(|k| samples::frame(*k))
        .collect();
    for gpus in [0, 1, 16] {
        let mut f = samples::frame(MessageKind::HostTelemetry);
        f.message = Message::HostTelemetry(samples::host_telemetry(gpus));
        frames.push(f);
    }
    frames
}

/// `content` with its CRC appended.
fn with_crc(mut content: Vec<u8>) -> Vec<u8> {
    let crc = CRC32.checksum(&content);
    content.extend_from_slice(&crc.to_le_bytes());
    content
}

/// Minor versions with a shape of their own, and beyond this reader's.
const MINORS: [u8; 9] = [0, 1, 2, 3, 5, 6, 7, 8, 255];

/// A sample frame's bytes before the CRC, mutated; a CRC recomputed
/// (seven in eight) or left as the mutation made it.
fn mutate_frame(rng: &mut Rng, contents: &[Vec<u8>]) -> Hex {
    let mut content = rng.pick(contents).clone();
    if rng.one_in(4) {
        content[1] = if rng.one_in(2) {
            *rng.pick(&MINORS)
        } else {
            rng.byte()
        };
    }
    if !rng.one_in(8) {
        mutate_bytes(rng, &mut content, contents, MAX_FRAME_LEN + 16);
    }
    if rng.one_in(8) {
        content.extend((0..4).map(|_| rng.byte()));
        return Hex(content);
    }
    Hex(with_crc(content))
}

/// The demonstration key the samples are signed with (derived once: in
/// a debug build that takes milliseconds).
fn demo_key() -> &'static VerifyingKey {
    static KEY: OnceLock<VerifyingKey> = OnceLock::new();
    KEY.get_or_init(|| samples::demo_signing_key().verifying_key())
}

/// Decodes; what decodes must survive its round trips.
fn check_frame(bytes: &Hex) -> Result<(), String> {
    match Frame::decode(&bytes.0) {
        Err(e) => says_something("decode", &e.to_string()),
        // An Ed25519 check takes milliseconds in a debug build: one frame
        // in 64 (by the CRC's last byte) has its signature checked.
        Ok(frame) => frame_round_trips(&frame, bytes.0.last().is_some_and(|b| b % 64 == 0)),
    }
}

/// Encode and decode, JSON and back, and the signature's check.
fn frame_round_trips(frame: &Frame, check_signature: bool) -> Result<(), String> {
    match frame.to_vec() {
        Err(e) => says_something("encode", &e.to_string())?,
        Ok(again) => match Frame::decode(&again) {
            Ok(back) if back == *frame => {}
            Ok(back) => return Err(format!("decodes as {frame:?}, re-encoded as {back:?}")),
            Err(e) => return Err(format!("its own encoding is refused: {e}")),
        },
    }
    let json = frame.to_json();
    match Frame::from_json(&json) {
        Ok(back) if back == *frame => {}
        Ok(back) => return Err(format!("JSON {json} reads back as {back:?}")),
        Err(e) => return Err(format!("its own JSON {json} is refused: {e}")),
    }
    if check_signature && frame.signed_auth().is_some() {
        let topic = match frame.message {
            Message::CduState(_) => samples::cdu_state_topic(),
            _ => samples::command_topic(),
        };
        if let Err(e) = frame.verify(&topic, |_, _| Some(demo_key())) {
            says_something("verify", &e.to_string())?;
        }
    }
    Ok(())
}

#[test]
fn frame_decode() {
    let frames = sample_frames();
    let seeds: Vec<Hex> = frames.iter().map(|f| Hex(f.to_vec().unwrap())).collect();
    let contents: Vec<Vec<u8>> = seeds
        .iter()
        .map(|s| s.0[..s.0.len() - 4].to_vec())
        .collect();
    fuzz(
        "frame_decode",
        &seeds,
        |rng, _| mutate_frame(rng, &contents),
        check_frame,
    );
}

/// A body and the kind code it is read as.
#[derive(Debug, Clone)]
struct Body {
    kind: u8,
    bytes: Hex,
}

fn mutate_body(rng: &mut Rng, seeds: &[Body], bodies: &[Vec<u8>]) -> Body {
    let seed = rng.pick(seeds);
    let mut bytes = seed.bytes.0.clone();
    mutate_bytes(rng, &mut bytes, bodies, MAX_FRAME_LEN);
    let kind = if rng.one_in(8) {
        rng.pick(seeds).kind
    } else {
        seed.kind
    };
    Body {
        kind,
        bytes: Hex(bytes),
    }
}

fn check_body(body: &Body) -> Result<(), String> {
    let kind = MessageKind::from_code(body.kind).expect("seed kinds");
    let message = match Message::decode_body(kind, &body.bytes.0) {
        Err(e) => return says_something("decode_body", &e.to_string()),
        Ok(m) => m,
    };
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let n = match message.encode_body(&mut buf) {
        Err(e) => return says_something("encode_body", &e.to_string()),
        Ok(n) => n,
    };
    match Message::decode_body(kind, &buf[..n]) {
        Ok(back) if back == message => Ok(()),
        Ok(back) => Err(format!("decodes as {message:?}, re-encoded as {back:?}")),
        Err(e) => Err(format!("its own encoding is refused: {e}")),
    }
}

#[test]
fn body_decode() {
    let seeds: Vec<Body> = sample_frames()
        .iter()
        .map(|f| {
            let mut buf = vec![0u8; MAX_FRAME_LEN];
            let n = f.message.encode_body(&mut buf).unwrap();
            buf.truncate(n);
            Body {
                kind: f.message.kind() as u8,
                bytes: Hex(buf),
            }
        })
        .collect();
    let bodies: Vec<Vec<u8>> = seeds.iter().map(|s| s.bytes.0.clone()).collect();
    fuzz(
        "body_decode",
        &seeds,
        |rng, seeds| mutate_body(rng, seeds, &bodies),
        check_body,
    );
}

fn check_json(text: &str) -> Result<(), String> {
    match Frame::from_json(text) {
        Err(e) => says_something("from_json", &e.to_string()),
        Ok(frame) => match Frame::from_json(&frame.to_json()) {
            Ok(back) if back == frame => Ok(()),
            Ok(back) => Err(format!("reads as {frame:?}, back as {back:?}")),
            Err(e) => Err(format!("its own JSON is refused: {e}")),
        },
    }
}

#[test]
fn json_decode() {
    let seeds: Vec<String> = sample_frames().iter().map(Frame::to_json).collect();
    let others: Vec<Vec<u8>> = seeds.iter().map(|s| s.clone().into_bytes()).collect();
    fuzz(
        "json_decode",
        &seeds,
        |rng, seeds| {
            let mut bytes = rng.pick(seeds).clone().into_bytes();
            mutate_bytes(rng, &mut bytes, &others, 16 * 1024);
            String::from_utf8_lossy(&bytes).into_owned()
        },
        |text| check_json(text),
    );
}

/// The harness's own parts: a seed is repeatable and hex reads back.
#[test]
fn the_harness_repeats_a_seed_and_reads_its_hex() {
    let run = |seed| {
        let mut rng = Rng::new(seed);
        (0..8).map(|_| rng.next_u64()).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
    let bytes = samples::frame(MessageKind::Ack).to_vec().unwrap();
    assert_eq!(unhex(&harness::hex(&bytes)), bytes);
    assert!(says_something("x", " ").is_err());
}

//! Golden-byte fixtures: the exact bytes of one frame of every kind are
//! committed in `tests/golden/<kind>.hex`, so any change of the wire format
//! shows in review. Regenerate on purpose with `LOOPWARDEN_BLESS=1`, and
//! bump the protocol version as `docs/bus.md` says.

use std::fmt::Write as _;
use std::path::PathBuf;

use loopwarden_protocol::{samples, Frame, MessageKind, PROTOCOL};

fn fixture_path(kind: MessageKind) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{}.hex", kind.name()))
}

fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::new();
    for line in bytes.chunks(32) {
        for b in line {
            write!(s, "{b:02x}").unwrap();
        }
        s.push('\n');
    }
    s
}

fn from_hex(text: &str) -> Vec<u8> {
    let digits: String = text.split_whitespace().collect();
    assert!(digits.len() % 2 == 0, "odd number of hex digits");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digit"))
        .collect()
}

#[test]
fn every_kind_matches_its_golden_bytes() {
    let bless = std::env::var_os("LOOPWARDEN_BLESS").is_some();
    for kind in MessageKind::ALL {
        let frame = samples::frame(kind);
        let bytes = frame.to_vec().unwrap();
        let path = fixture_path(kind);
        if bless {
            std::fs::write(&path, to_hex(&bytes)).unwrap();
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with LOOPWARDEN_BLESS=1)", path.display()));
        let golden = from_hex(&golden);
        assert_eq!(
            to_hex(&bytes),
            to_hex(&golden),
            "{} encodes differently from {}",
            kind.name(),
            path.display()
        );
        assert_eq!(
            Frame::decode(&golden).unwrap(),
            frame,
            "{} decodes differently",
            kind.name()
        );
    }
}

/// The golden bytes of the minor before this one, as its build wrote them
/// (`tests/golden/2.9/`): every frame still decodes to the same message,
/// and the signed ones verify with the minor their signer wrote in byte 1
/// (docs/bus.md sections 9.4 and 10).
#[test]
fn the_previous_minors_golden_bytes_decode_and_verify() {
    assert_eq!(PROTOCOL.minor, 10, "keep the goldens of the minor before");
    let key = samples::demo_signing_key().verifying_key();
    for kind in MessageKind::ALL {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/2.9")
            .join(format!("{}.hex", kind.name()));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bytes = from_hex(&text);
        assert_eq!(bytes[1], 9, "{}", path.display());
        let frame = Frame::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let sample = samples::frame(kind);
        let topic = match kind {
            MessageKind::CapLease | MessageKind::QuarantineRelease => samples::command_topic(),
            MessageKind::CduState => samples::cdu_state_topic(),
            MessageKind::ResendRequest => samples::resend_topic(),
            _ => {
                assert_eq!(frame, sample, "{} decodes differently", kind.name());
                continue;
            }
        };
        // Signed over the 2.9 bytes: the same message, another signature.
        let now = sample.to_vec().unwrap();
        let unsigned = |b: &[u8]| b[2..b.len() - 68].to_vec();
        assert_eq!(unsigned(&bytes), unsigned(&now), "{}", kind.name());
        assert_eq!(
            frame.verify(&topic, |_, id| (id == 1).then_some(&key)),
            Ok(()),
            "{} signed at 2.9",
            kind.name()
        );
    }
}

/// The size target of the wire format: an 8-GPU host's telemetry frame at
/// load fits 256 bytes (see docs/benchmarks.md for how values move it).
#[test]
fn eight_gpu_telemetry_fits_256_bytes() {
    let len = samples::frame(MessageKind::HostTelemetry)
        .to_vec()
        .unwrap()
        .len();
    assert!(len <= 256, "8-GPU telemetry frame is {len} bytes");
}

#[test]
fn golden_header_layout_is_as_documented() {
    let bytes = samples::frame(MessageKind::Event).to_vec().unwrap();
    assert_eq!(bytes[0], 2, "major version first");
    assert_eq!(bytes[1], 10, "minor version second");
    assert_eq!(bytes[2], MessageKind::Event as u8, "kind third");
    // The trailing CRC is the zlib CRC-32 of everything before it.
    let (content, crc) = bytes.split_at(bytes.len() - 4);
    let expect = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(content);
    assert_eq!(crc, expect.to_le_bytes());
}

/// The command signatures in the golden bytes are Ed25519 as anyone
/// computes it: checked with Python's `cryptography` (OpenSSL), not with
/// the crate that made them.
#[test]
fn golden_command_signatures_verify_with_an_independent_ed25519() {
    let Ok(python) = which_python() else {
        eprintln!("SKIP: python3 not found");
        return;
    };
    let has_module = std::process::Command::new(&python)
        .args(["-c", "import cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_module {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: python module cryptography is missing"
        );
        eprintln!("SKIP: python module cryptography not installed");
        return;
    }
    const CHECK: &str = "import sys\n\
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey\n\
pub = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sys.argv[1])).public_key()\n\
pub.verify(bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]))\n\
print('ok')";
    for (kind, topic) in [
        (MessageKind::CapLease, "dc/v2/hall-1/host/h07/cmd"),
        (MessageKind::QuarantineRelease, "dc/v2/hall-1/host/h07/cmd"),
        (MessageKind::CduState, "dc/v2/hall-1/cdu/cdu-a/health"),
    ] {
        let text = std::fs::read_to_string(fixture_path(kind)).unwrap();
        let bytes = from_hex(&text);
        // The auth is the body's last field: key id, then the 64-byte
        // signature, then the CRC.
        let (signed, rest) = bytes.split_at(bytes.len() - 68);
        let signature = &rest[..64];
        // Signed for the target's topic (a state: its own): the topic, a
        // zero byte, then the frame with its signature zeroed.
        let mut unsigned = format!("{topic}\0").into_bytes();
        unsigned.extend_from_slice(signed);
        unsigned.extend_from_slice(&[0u8; 64]);
        let hex = |b: &[u8]| to_hex(b).replace('\n', "");
        let out = std::process::Command::new(&python)
            .args([
                "-c",
                CHECK,
                &hex(&samples::DEMO_SIGNING_SEED),
                &hex(signature),
                &hex(&unsigned),
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "ok",
            "{}: {}",
            kind.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn which_python() -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .find(|p| p.is_file())
        })
        .ok_or(())
}

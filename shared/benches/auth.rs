//! Command signature benchmarks: what signing and checking a command costs.
//!
//! Run with `cargo bench -p loopwarden-protocol --bench auth`.
//! A host checks every command it receives with `Frame::verify`: it
//! re-encodes the frame with the signature zeroed (postcard, into a stack
//! buffer), prefixes the target's `cmd` topic and runs Ed25519
//! `verify_strict`. A signer pays `Frame::sign`, which encodes the same
//! bytes and signs them. The frames are the signed samples
//! (`samples::frame(MessageKind::CapLease)` and `QuarantineRelease`, key 1
//! of the demo key, for `samples::command_topic()`).
//!
//! Besides the frame-level calls, `ed25519` times `verify_strict` and
//! `sign` alone over a message of the same length as the cap lease's
//! signed bytes, so that what the framing adds is the difference. Before
//! the benchmarks, `main` prints the frame sizes and the number of signed
//! bytes. Results are in `docs/benchmarks.md`.

use std::time::Duration;

use divan::counter::ItemsCount;
use divan::{black_box, AllocProfiler, Bencher};
use loopwarden_protocol::auth::{SigningKey, VerifyingKey};
use loopwarden_protocol::{samples, AuthError, Frame, MessageKind, Topic};

// Counts heap allocations inside each benchmark: signing and verifying
// must show none.
#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

/// The key the samples are signed with.
fn demo_public() -> VerifyingKey {
    samples::demo_signing_key().verifying_key()
}

/// A key that did not sign the samples.
fn other_public() -> VerifyingKey {
    SigningKey::from_bytes(&[7; 32]).verifying_key()
}

fn target() -> Topic {
    samples::command_topic()
}

/// Bytes a signature covers for `frame`: the topic, one zero byte and the
/// frame before its CRC (the signature's 64 bytes are in the frame, zeroed).
fn signed_len(frame: &Frame) -> usize {
    let topic = target().build().expect("the sample topic fits");
    let frame_len = frame.to_vec().expect("sample frames fit").len();
    topic.len() + 1 + frame_len - 4
}

fn bench_verify(
    bencher: Bencher,
    kind: MessageKind,
    key: VerifyingKey,
    expect: Result<(), AuthError>,
) {
    let frame = samples::frame(kind);
    let to = target();
    assert_eq!(frame.verify(&to, |_, _| Some(&key)), expect);
    bencher
        .counter(ItemsCount::new(1u32))
        .bench_local(|| black_box(&frame).verify(black_box(&to), |_, _| Some(black_box(&key))));
}

fn bench_sign(bencher: Bencher, kind: MessageKind) {
    let mut frame = samples::frame(kind);
    let to = target();
    let key = samples::demo_signing_key();
    bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
        black_box(&mut frame)
            .sign(black_box(&to), 1, black_box(&key))
            .expect("a command")
    });
    // Ed25519 is deterministic: signing again gives the sample's signature.
    assert_eq!(frame, samples::frame(kind));
}

/// `Frame::verify` on a host: the sample cap lease and release, signed by
/// the key the host holds (accepted) or checked against another key
/// (refused).
#[divan::bench_group]
mod verify {
    use super::*;

    #[divan::bench]
    fn cap_lease(bencher: Bencher) {
        bench_verify(bencher, MessageKind::CapLease, demo_public(), Ok(()));
    }

    #[divan::bench]
    fn quarantine_release(bencher: Bencher) {
        bench_verify(
            bencher,
            MessageKind::QuarantineRelease,
            demo_public(),
            Ok(()),
        );
    }

    /// The cap lease checked against a key that did not sign it: the full
    /// check runs and the signature does not match.
    #[divan::bench]
    fn cap_lease_wrong_key(bencher: Bencher) {
        bench_verify(
            bencher,
            MessageKind::CapLease,
            other_public(),
            Err(AuthError::BadSignature),
        );
    }

    /// No key for the sender: refused before any arithmetic.
    #[divan::bench]
    fn cap_lease_unknown_key(bencher: Bencher) {
        let frame = samples::frame(MessageKind::CapLease);
        let to = target();
        bencher
            .counter(ItemsCount::new(1u32))
            .bench_local(|| black_box(&frame).verify(black_box(&to), |_, _| None::<&VerifyingKey>));
    }
}

/// `Frame::sign` by a signer (CDU controller, operator).
#[divan::bench_group]
mod sign {
    use super::*;

    #[divan::bench]
    fn cap_lease(bencher: Bencher) {
        bench_sign(bencher, MessageKind::CapLease);
    }

    #[divan::bench]
    fn quarantine_release(bencher: Bencher) {
        bench_sign(bencher, MessageKind::QuarantineRelease);
    }
}

/// Ed25519 alone, over a message as long as the cap lease's signed bytes.
#[divan::bench_group]
mod ed25519 {
    use super::*;
    use ed25519_dalek::Signer as _;
    use loopwarden_protocol::auth::Signature;

    fn message() -> Vec<u8> {
        let len = signed_len(&samples::frame(MessageKind::CapLease));
        (0..len).map(|i| i as u8).collect()
    }

    #[divan::bench]
    fn verify_strict(bencher: Bencher) {
        let msg = message();
        let key = samples::demo_signing_key();
        let public = key.verifying_key();
        let sig: Signature = key.sign(&msg);
        bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
            black_box(&public)
                .verify_strict(black_box(&msg), black_box(&sig))
                .expect("valid")
        });
    }

    #[divan::bench]
    fn sign(bencher: Bencher) {
        let msg = message();
        let key = samples::demo_signing_key();
        bencher
            .counter(ItemsCount::new(1u32))
            .bench_local(|| black_box(&key).sign(black_box(&msg)));
    }
}

fn print_sizes() {
    println!("command frames (bytes): postcard frame, signed bytes (topic + 0 + frame before CRC)");
    for kind in [MessageKind::CapLease, MessageKind::QuarantineRelease] {
        let frame = samples::frame(kind);
        println!(
            "  {:<24} {:>5} {:>5}",
            kind.name(),
            frame.to_vec().expect("fits").len(),
            signed_len(&frame)
        );
    }
    println!();
}

fn main() {
    print_sizes();
    // As in the codec benchmark: each benchmark samples for at least 0.5 s.
    // `--min-time`, `--sample-count` and the `DIVAN_*` variables override it.
    divan::Divan::default()
        .min_time(Duration::from_millis(500))
        .config_with_args()
        .main();
}

//! Frame codec benchmarks: postcard encode/decode and the JSON mirror.
//!
//! Run with `cargo bench -p loopwarden-protocol --bench codec`.
//! Before the benchmarks, `main` prints the frame sizes (postcard and JSON)
//! and the in-memory sizes of `Frame` and `Message`, all measured here.
//! Divan's allocation profiler reports any heap allocation per benchmark.
//! Results and targets are in `docs/benchmarks.md`.

use std::mem::size_of;
use std::time::Duration;

use divan::counter::{BytesCount, ItemsCount};
use divan::{black_box, AllocProfiler, Bencher};
use loopwarden_protocol::{
    samples, Ack, CapLease, CduState, CduTelemetry, Event, Frame, HostHealth, HostTelemetry,
    Message, MessageKind, Online, QuarantineRelease, MAX_FRAME_LEN,
};

// Counts heap allocations inside each benchmark: encode and decode must
// show none.
#[global_allocator]
static ALLOC: AllocProfiler = AllocProfiler::system();

/// The 8-GPU host telemetry frame (the sample frame of its kind).
fn telemetry_8() -> Frame {
    samples::frame(MessageKind::HostTelemetry)
}

/// A 16-GPU host telemetry frame: the sample frame with 16 GPUs.
fn telemetry_16() -> Frame {
    Frame {
        message: Message::HostTelemetry(samples::host_telemetry(16)),
        ..samples::frame(MessageKind::HostTelemetry)
    }
}

/// The 8-GPU frame with every error counter of every GPU set to `n32` (u32
/// counters) and `n16` (u16 counters): postcard varints grow with the value.
fn telemetry_8_counters(n32: u32, n16: u16) -> Frame {
    let mut telemetry = samples::host_telemetry(8);
    for g in telemetry.gpus.iter_mut() {
        g.ecc.sbe_volatile = n32;
        g.ecc.dbe_volatile = n32;
        g.ecc.sbe_aggregate = n32;
        g.ecc.dbe_aggregate = n32;
        g.repair.retired_sbe = n16;
        g.repair.retired_dbe = n16;
        g.repair.remap_correctable = n16;
        g.repair.remap_uncorrectable = n16;
        g.pcie_replay = n32;
        g.nvlink.crc = n32;
        g.nvlink.replay = n32;
        g.nvlink.recovery = n32;
    }
    Frame {
        message: Message::HostTelemetry(telemetry),
        ..samples::frame(MessageKind::HostTelemetry)
    }
}

fn encoded(frame: &Frame) -> Vec<u8> {
    frame.to_vec().expect("sample frames fit MAX_FRAME_LEN")
}

fn bench_encode(bencher: Bencher, frame: &Frame) {
    let len = encoded(frame).len();
    let mut buf = [0u8; MAX_FRAME_LEN];
    bencher
        .counter(ItemsCount::new(1u32))
        .counter(BytesCount::new(len))
        .bench_local(|| black_box(frame).encode(black_box(&mut buf)).expect("fits"));
}

fn bench_decode(bencher: Bencher, frame: &Frame) {
    let bytes = encoded(frame);
    bencher
        .counter(ItemsCount::new(1u32))
        .counter(BytesCount::new(bytes.len()))
        .bench_local(|| Frame::decode(black_box(&bytes)).expect("valid"));
}

/// The 8-GPU telemetry frame: the size and speed targets apply to it.
#[divan::bench_group]
mod telemetry_8gpu {
    use super::*;

    #[divan::bench]
    fn encode(bencher: Bencher) {
        bench_encode(bencher, &telemetry_8());
    }

    #[divan::bench]
    fn decode(bencher: Bencher) {
        bench_decode(bencher, &telemetry_8());
    }

    #[divan::bench]
    fn to_json(bencher: Bencher) {
        let frame = telemetry_8();
        let len = frame.to_json().len();
        bencher
            .counter(ItemsCount::new(1u32))
            .counter(BytesCount::new(len))
            .bench_local(|| black_box(&frame).to_json());
    }

    #[divan::bench]
    fn from_json(bencher: Bencher) {
        let json = telemetry_8().to_json();
        bencher
            .counter(ItemsCount::new(1u32))
            .counter(BytesCount::new(json.len()))
            .bench_local(|| Frame::from_json(black_box(&json)).expect("valid"));
    }
}

/// A 16-GPU telemetry frame, the largest host telemetry.
#[divan::bench_group]
mod telemetry_16gpu {
    use super::*;

    #[divan::bench]
    fn encode(bencher: Bencher) {
        bench_encode(bencher, &telemetry_16());
    }

    #[divan::bench]
    fn decode(bencher: Bencher) {
        bench_decode(bencher, &telemetry_16());
    }
}

/// The sample frame of every kind.
#[divan::bench_group]
mod by_kind {
    use super::*;

    #[divan::bench(args = MessageKind::ALL)]
    fn encode(bencher: Bencher, kind: MessageKind) {
        bench_encode(bencher, &samples::frame(kind));
    }

    #[divan::bench(args = MessageKind::ALL)]
    fn decode(bencher: Bencher, kind: MessageKind) {
        bench_decode(bencher, &samples::frame(kind));
    }

    /// Encode into a stack buffer, then decode those bytes.
    #[divan::bench(args = MessageKind::ALL)]
    fn roundtrip(bencher: Bencher, kind: MessageKind) {
        let frame = samples::frame(kind);
        let mut buf = [0u8; MAX_FRAME_LEN];
        bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
            let len = black_box(&frame).encode(&mut buf).expect("fits");
            Frame::decode(black_box(&buf[..len])).expect("valid")
        });
    }
}

/// Where the time of an 8-GPU telemetry frame goes: the CRC-32 over the
/// frame's bytes, with each of the two tables `Frame` uses, and the postcard
/// body alone, without header or CRC.
#[divan::bench_group]
mod breakdown_8gpu {
    use super::*;
    use crc::{Crc, Table, CRC_32_ISO_HDLC};

    fn content() -> Vec<u8> {
        let mut bytes = encoded(&telemetry_8());
        bytes.truncate(bytes.len() - 4);
        bytes
    }

    /// The byte-wise table (1 KiB) of builds without `std`
    /// (microcontrollers); `crc::Crc<u32>` is `Crc<u32, Table<1>>`.
    #[divan::bench]
    fn crc32_table1(bencher: Bencher) {
        const CRC: Crc<u32, Table<1>> = Crc::<u32, Table<1>>::new(&CRC_32_ISO_HDLC);
        let bytes = content();
        bencher
            .counter(BytesCount::new(bytes.len()))
            .bench_local(|| CRC.checksum(black_box(&bytes)));
    }

    /// The slice-by-16 table (16 KiB) of `std` builds (hosts, the default):
    /// what `Frame` uses in this benchmark.
    #[divan::bench]
    fn crc32_table16(bencher: Bencher) {
        const CRC: Crc<u32, Table<16>> = Crc::<u32, Table<16>>::new(&CRC_32_ISO_HDLC);
        let bytes = content();
        bencher
            .counter(BytesCount::new(bytes.len()))
            .bench_local(|| CRC.checksum(black_box(&bytes)));
    }

    fn body() -> HostTelemetry {
        samples::host_telemetry(8)
    }

    #[divan::bench]
    fn body_encode(bencher: Bencher) {
        let body = body();
        let mut buf = [0u8; MAX_FRAME_LEN];
        bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
            postcard::to_slice(black_box(&body), black_box(&mut buf[..]))
                .expect("fits")
                .len()
        });
    }

    #[divan::bench]
    fn body_decode(bencher: Bencher) {
        let bytes = postcard::to_stdvec(&body()).expect("fits");
        bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
            postcard::from_bytes::<HostTelemetry>(black_box(&bytes)).expect("valid")
        });
    }
}

fn print_sizes() {
    println!("frame sizes (bytes): postcard frame, JSON mirror");
    for (name, frame) in [
        ("host_telemetry 8 GPUs", telemetry_8()),
        ("host_telemetry 16 GPUs", telemetry_16()),
        ("  8 GPUs, counters 127", telemetry_8_counters(127, 127)),
        ("  8 GPUs, counters 128", telemetry_8_counters(128, 128)),
        (
            "  8 GPUs, counters 16383",
            telemetry_8_counters(16_383, 16_383),
        ),
        (
            "  8 GPUs, counters max",
            telemetry_8_counters(u32::MAX, u16::MAX),
        ),
    ] {
        println!(
            "  {name:<24} {:>5} {:>6}",
            encoded(&frame).len(),
            frame.to_json().len()
        );
    }
    for kind in MessageKind::ALL {
        let frame = samples::frame(kind);
        println!(
            "  {:<24} {:>5} {:>6}",
            kind.name(),
            encoded(&frame).len(),
            frame.to_json().len()
        );
    }
    println!("in-memory sizes (bytes)");
    for (name, size) in [
        ("Frame", size_of::<Frame>()),
        ("Message", size_of::<Message>()),
        ("HostTelemetry", size_of::<HostTelemetry>()),
        ("HostHealth", size_of::<HostHealth>()),
        ("Event", size_of::<Event>()),
        ("CapLease", size_of::<CapLease>()),
        ("QuarantineRelease", size_of::<QuarantineRelease>()),
        ("Ack", size_of::<Ack>()),
        ("CduTelemetry", size_of::<CduTelemetry>()),
        ("CduState", size_of::<CduState>()),
        ("Online", size_of::<Online>()),
        ("MAX_FRAME_LEN (buffer)", MAX_FRAME_LEN),
    ] {
        println!("  {name:<24} {size:>5}");
    }
    println!();
}

fn main() {
    print_sizes();
    // As `divan::main()`, but each benchmark samples for at least 0.5 s so
    // that medians hold still on a shared machine. `--min-time`,
    // `--sample-count` and the `DIVAN_*` variables still override this.
    divan::Divan::default()
        .min_time(Duration::from_millis(500))
        .config_with_args()
        .main();
}

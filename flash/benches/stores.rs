//! Flash store benchmarks: the event log and the outbox on the flash of the
//! host board (`boards/flash/host-file.toml`), file-backed and simulated.
//!
//! Run with `cargo bench -p loopwarden-flash --bench stores`.
//!
//! Before the benchmarks, `main` prints what the stores write to flash for
//! 10,000 appends or push+ack pairs: bytes, write amplification, write and
//! erase operations, erases per sector. The simulated flash counts them, so
//! these figures are the same on every run and machine.
//!
//! The timed benchmarks run each operation to completion with
//! `futures::executor::block_on` (the stores' futures never wait), on a
//! `SharedFlash` as the agents open them. The file-backed flash calls
//! `fdatasync` after every write and erase, so its figures measure the disk
//! under the temporary directory (`$TMPDIR`, else `/tmp`) more than the
//! stores; the simulated flash gives the cost of the stores alone.
//!
//! Results are in `docs/benchmarks.md`.

use std::fmt::Debug;
use std::ops::Range;
use std::path::Path;

use divan::counter::ItemsCount;
use divan::{black_box, Bencher};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use futures::executor::block_on;
use loopwarden_boards::FlashBoard;
use loopwarden_flash::log::RECORD_HEADER;
use loopwarden_flash::outbox::OutboxLayout;
use loopwarden_flash::{
    Class, Entry, EventLog, FileFlash, FlashStats, Outbox, SharedFlash, SimFlash,
};
use loopwarden_protocol::{samples, Ident, Message, MessageKind, TimestampMs, Topic};

/// The host board's flash: 4-byte words, 4 KiB sectors.
type File = FileFlash<4, 4096>;
type Sim = SimFlash<4, 4096>;

/// What is logged or sent: the sample `Event` (an XID) or the sample
/// `HostHealth` (eight GPUs, one quarantined).
const WHAT: &[&str] = &["event", "health"];

/// Operations per deterministic measurement.
const OPS: u32 = 10_000;

/// Sectors of the small log range, to make the log wrap many times.
const SMALL_LOG_SECTORS: u32 = 8;

fn kind_of(what: &str) -> MessageKind {
    match what {
        "event" => MessageKind::Event,
        "health" => MessageKind::HostHealth,
        _ => unreachable!("unknown body {what}"),
    }
}

/// A log record's kind and body: the postcard body of the sample message,
/// as the agents log it.
fn record_body(what: &str) -> (u8, Vec<u8>) {
    let kind = kind_of(what);
    let body = match samples::message(kind) {
        Message::Event(e) => postcard::to_allocvec(&e),
        Message::HostHealth(h) => postcard::to_allocvec(&h),
        _ => unreachable!("only events and health are logged here"),
    }
    .expect("sample bodies encode");
    (kind as u8, body)
}

/// An outbox entry as the bus stores it: the sample frame, its topic and
/// its class.
struct Framed {
    class: Class,
    topic: String,
    payload: Vec<u8>,
}

impl Framed {
    fn sample(what: &str) -> Self {
        let kind = kind_of(what);
        let frame = samples::frame(kind);
        let site = Ident::new("hall-1").expect("site ident");
        let topic = Topic::new(&site, frame.sender.role, &frame.sender.id, kind.family())
            .build()
            .expect("sample topic")
            .to_string();
        Self {
            class: Class::of(&frame.message),
            topic,
            payload: frame.to_vec().expect("sample frames encode"),
        }
    }

    fn entry(&self, seq: u32) -> Entry<'_> {
        Entry {
            seq,
            class: self.class,
            topic: &self.topic,
            payload: &self.payload,
        }
    }

    /// Bytes of the entry as the outbox encodes it: seq (4), class (1),
    /// topic length (1), topic, frame.
    fn entry_len(&self) -> usize {
        6 + self.topic.len() + self.payload.len()
    }
}

fn board() -> FlashBoard {
    FlashBoard::host_file()
}

/// The host flash in a file `flash.bin` of `dir`; `image`, if given, is
/// written to the file first (a flash already in use).
fn file_flash(dir: &Path, image: Option<&[u8]>) -> SharedFlash<File> {
    let path = dir.join("flash.bin");
    if let Some(image) = image {
        std::fs::write(&path, image).expect("flash image written");
    }
    SharedFlash::new(File::open(&path, &board().geometry()).expect("flash file"))
}

fn sim_flash() -> Sim {
    Sim::new(board().geometry().sectors as usize)
}

/// A simulated host flash whose log has just filled up: appends of `what`
/// until the first wrap marker. From then on every append may recycle the
/// oldest records, as in a log that has been in service for long.
fn full_log_image(what: &str) -> Sim {
    let (kind, body) = record_body(what);
    let mut log = block_on(EventLog::open(sim_flash(), board().layout().log)).expect("log");
    let mut t = samples::T0.0;
    loop {
        t += 1;
        let seq = block_on(log.append(TimestampMs(t), kind, &body)).expect("append");
        if log.next_seq() != seq.wrapping_add(1) {
            // A wrap marker followed the record: the log is full.
            return log.into_flash();
        }
    }
}

fn bench_append<S>(bencher: Bencher, log: &mut EventLog<S>, what: &str)
where
    S: MultiwriteNorFlash,
    S::Error: Debug,
{
    let (kind, body) = record_body(what);
    let mut t = samples::T0.0;
    bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
        t += 1;
        block_on(log.append(TimestampMs(t), kind, black_box(&body))).expect("append")
    });
}

/// Appends to the event log: the host board's log range (160 sectors).
/// `*_fresh` starts from an erased flash; `*_full` from a log that has just
/// filled up, so appends recycle the oldest records. Each sample count
/// and size is fixed: the log's state changes with every append, so the
/// number of appends is part of what is measured.
mod log_append {
    use super::*;

    #[divan::bench(args = WHAT, sample_count = 1000, sample_size = 1)]
    fn file_fresh(bencher: Bencher, what: &str) {
        let dir = tempfile::tempdir().expect("temp dir");
        let flash = file_flash(dir.path(), None);
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_append(bencher, &mut log, what);
    }

    #[divan::bench(args = WHAT, sample_count = 1000, sample_size = 1)]
    fn file_full(bencher: Bencher, what: &str) {
        let mut image = full_log_image(what);
        let dir = tempfile::tempdir().expect("temp dir");
        let flash = file_flash(dir.path(), Some(image.bytes_mut()));
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_append(bencher, &mut log, what);
    }

    // 1,000 appends: the log stays far from full.
    #[divan::bench(args = WHAT, sample_count = 100, sample_size = 10)]
    fn sim_fresh(bencher: Bencher, what: &str) {
        let flash = SharedFlash::new(sim_flash());
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_append(bencher, &mut log, what);
    }

    #[divan::bench(args = WHAT, sample_count = 1000, sample_size = 10)]
    fn sim_full(bencher: Bencher, what: &str) {
        let flash = SharedFlash::new(full_log_image(what));
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_append(bencher, &mut log, what);
    }
}

/// One read of every record of a full log: what a reader's resend request
/// costs the flash thread twice (docs/bus.md §4.8), and a restart once.
/// The file's pages are in the page cache after the first read, as on a
/// host that reads its log now and then.
mod log_scan {
    use super::*;

    fn bench_scan<S>(bencher: Bencher, log: &mut EventLog<S>)
    where
        S: MultiwriteNorFlash,
        S::Error: Debug,
    {
        bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
            let mut n = 0u32;
            block_on(log.for_each(|r| n += u32::from(r.kind))).expect("scan");
            black_box(n)
        });
    }

    #[divan::bench(args = WHAT, sample_count = 20, sample_size = 1)]
    fn file_full(bencher: Bencher, what: &str) {
        let mut image = full_log_image(what);
        let dir = tempfile::tempdir().expect("temp dir");
        let flash = file_flash(dir.path(), Some(image.bytes_mut()));
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_scan(bencher, &mut log);
    }

    #[divan::bench(args = WHAT, sample_count = 20, sample_size = 1)]
    fn sim_full(bencher: Bencher, what: &str) {
        let flash = SharedFlash::new(full_log_image(what));
        let mut log = block_on(EventLog::open(flash, board().layout().log)).expect("log");
        bench_scan(bencher, &mut log);
    }
}

fn bench_round_trip<S>(bencher: Bencher, outbox: &mut Outbox<S>, what: &str)
where
    S: MultiwriteNorFlash,
    S::Error: Debug,
{
    let framed = Framed::sample(what);
    let mut seq = 0u32;
    bencher.counter(ItemsCount::new(1u32)).bench_local(|| {
        seq += 1;
        block_on(outbox.push(black_box(&framed.entry(seq)))).expect("push");
        assert!(block_on(outbox.ack(seq)).expect("ack"), "acknowledged");
    });
}

/// One frame through the outbox: pushed before it is sent, acknowledged
/// (removed) after the broker's PUBACK. The host board's outbox parts; the
/// event frame is of the normal class, the health frame (a quarantined GPU)
/// critical.
mod outbox_round_trip {
    use super::*;

    #[divan::bench(args = WHAT, sample_count = 1000, sample_size = 1)]
    fn file(bencher: Bencher, what: &str) {
        let dir = tempfile::tempdir().expect("temp dir");
        let flash = file_flash(dir.path(), None);
        let mut outbox = block_on(Outbox::open(flash, board().layout().outbox)).expect("outbox");
        bench_round_trip(bencher, &mut outbox, what);
    }

    #[divan::bench(args = WHAT, sample_count = 1000, sample_size = 10)]
    fn sim(bencher: Bencher, what: &str) {
        let flash = SharedFlash::new(sim_flash());
        let mut outbox = block_on(Outbox::open(flash, board().layout().outbox)).expect("outbox");
        bench_round_trip(bencher, &mut outbox, what);
    }
}

/// What `OPS` operations did to the flash.
struct Wear {
    stats: FlashStats,
    /// The most flash syncs one operation made: writes plus erases, as the
    /// file-backed flash calls `fdatasync` once for each.
    max_syncs: u64,
}

impl Wear {
    /// Runs `op` `OPS` times, reading the statistics of `flash` after
    /// each to record the worst operation.
    fn measure(flash: &SharedFlash<Sim>, mut op: impl FnMut(u32)) -> Self {
        let stats = || flash.with(|f| f.stats());
        let syncs = |s: &FlashStats| s.writes + s.erases;
        let mut before = stats();
        let mut max_syncs = 0;
        for i in 0..OPS {
            op(i);
            let after = stats();
            max_syncs = max_syncs.max(syncs(&after) - syncs(&before));
            before = after;
        }
        Wear {
            stats: before,
            max_syncs,
        }
    }

    /// One line of figures: per operation, then erases.
    fn line(&self, payload: usize, sectors: u32) -> String {
        let s = &self.stats;
        let ops = OPS as f64;
        format!(
            "{payload:>5} {:>8.1} {:>5.2} {:>7.2} {:>6.2} {:>5} {:>6} {:>11.1} {:>10}",
            s.bytes_written as f64 / ops,
            s.bytes_written as f64 / (ops * payload as f64),
            s.writes as f64 / ops,
            (s.writes + s.erases) as f64 / ops,
            self.max_syncs,
            s.erases,
            s.erases as f64 / sectors as f64,
            s.max_sector_erases,
        )
    }
}

/// Column heads of [`Wear::line`].
const COLUMNS: &str = "    B     B/op    WA  writes  syncs worst erases mean/sector max/sector";

fn sectors(range: &Range<u32>) -> u32 {
    (range.end - range.start) / board().geometry().erase_size
}

/// `full`: start from a log that has just filled up (a copy of its bytes
/// on a flash that has counted nothing yet), rather than from an erased one.
fn print_log_wear(name: &str, range: Range<u32>, what: &str, full: bool) {
    let (kind, body) = record_body(what);
    let mut sim = sim_flash();
    if full {
        sim.bytes_mut()
            .copy_from_slice(full_log_image(what).bytes_mut());
    }
    let flash = SharedFlash::new(sim);
    let mut log = block_on(EventLog::open(flash.clone(), range.clone())).expect("log");
    let start = log.next_seq();
    let wear = Wear::measure(&flash, |i| {
        let t = TimestampMs(samples::T0.0 + i as u64);
        block_on(log.append(t, kind, &body)).expect("append");
    });
    // Each wrap marker takes a sequence number of its own.
    let markers = log.next_seq() - start - OPS;
    let mut kept = 0u32;
    block_on(log.for_each(|_| kept += 1)).expect("read back");
    println!(
        "{name:<15} {what:<7} {} {markers:>7} {kept:>6}",
        wear.line(RECORD_HEADER + body.len(), sectors(&range))
    );
}

fn print_outbox_wear(what: &str) {
    let framed = Framed::sample(what);
    let layout: OutboxLayout = board().layout().outbox;
    let part = match framed.class {
        Class::Telemetry => layout.telemetry.clone(),
        Class::Normal => layout.normal.clone(),
        Class::Critical => layout.critical.clone(),
    };
    let flash = SharedFlash::new(sim_flash());
    let mut outbox = block_on(Outbox::open(flash.clone(), layout)).expect("outbox");
    let wear = Wear::measure(&flash, |i| {
        block_on(outbox.push(&framed.entry(i + 1))).expect("push");
        assert!(block_on(outbox.ack(i + 1)).expect("ack"), "acknowledged");
    });
    let class = format!("{:?} ({})", framed.class, sectors(&part)).to_lowercase();
    println!(
        "{what:<7} {class:<13} {}",
        wear.line(framed.entry_len(), sectors(&part))
    );
}

fn print_wear() {
    let layout = board().layout();
    let erase = board().geometry().erase_size;
    let small = layout.log.start..layout.log.start + SMALL_LOG_SECTORS * erase;
    println!("Flash writes of the stores: {OPS} operations each, counted by a simulated flash");
    println!("with the host board's geometry (4-byte words, {erase}-byte sectors).");
    for what in WHAT {
        let body = record_body(what).1.len();
        println!(
            "  {what}: postcard body {body} bytes, log record {} bytes, outbox entry {} bytes",
            RECORD_HEADER + body,
            Framed::sample(what).entry_len()
        );
    }
    println!("B: record or entry bytes; B/op: flash bytes written per operation; WA: B/op / B;");
    println!("writes, syncs: flash writes, and writes plus erases (one fdatasync each on the");
    println!("file-backed flash), per operation; worst: the most syncs of one operation;");
    println!("erases: sector erases in all; mean/sector, max/sector: erases per sector of the");
    println!("range (the log's) or part (the outbox's).");
    println!();
    println!("Event log, {OPS} appends (range in sectors; full: from a log that has just filled up;\nmarkers: wrap markers written; kept: records in the log afterwards)");
    println!("{:<15} {:<7} {COLUMNS} markers   kept", "range", "body");
    let host = format!("host ({})", sectors(&layout.log));
    let small_name = format!("small ({SMALL_LOG_SECTORS})");
    let host_full = format!("{host} full");
    for what in WHAT {
        print_log_wear(&host, layout.log.clone(), what, false);
    }
    for what in WHAT {
        print_log_wear(&host_full, layout.log.clone(), what, true);
    }
    for what in WHAT {
        print_log_wear(&small_name, small.clone(), what, false);
    }
    println!();
    println!("Outbox, {OPS} push+ack pairs (part in sectors)");
    println!("{:<7} {:<13} {COLUMNS}", "frame", "class (part)");
    for what in WHAT {
        print_outbox_wear(what);
    }
    println!();
}

fn main() {
    print_wear();
    // Sample counts and sizes are set on each benchmark; `--sample-count`,
    // `--sample-size`, `--min-time` and the `DIVAN_*` variables override them.
    divan::main();
}

//! What reading the outbox costs the flash when it is full: after a long
//! broker outage on the host board's layout (`boards/flash/host-file.toml`),
//! opening the outbox and reading it back in order must each take a few
//! passes over the entries, not one pass per entry. The bus reads it on
//! every keep-alive while frames wait, holding the outbox's lock, and the
//! agent opens it before it starts.
//!
//! Reads are counted by a flash wrapper and compared with one plain pass
//! (an acknowledgement of a number no entry has reads every entry once).
//! `--nocapture` prints the counts and the times.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use futures::executor::block_on;
use loopwarden_boards::FlashBoard;
use loopwarden_flash::{Class, Entry, FlashError, Outbox, SimFlash, StoreError};

type Sim = SimFlash<4, 4096>;

/// A flash that counts its read operations.
struct Counting {
    flash: Sim,
    reads: Rc<Cell<u64>>,
}

impl ErrorType for Counting {
    type Error = FlashError;
}

impl ReadNorFlash for Counting {
    const READ_SIZE: usize = Sim::READ_SIZE;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        self.reads.set(self.reads.get() + 1);
        self.flash.read(offset, bytes).await
    }

    fn capacity(&self) -> usize {
        self.flash.capacity()
    }
}

impl NorFlash for Counting {
    const WRITE_SIZE: usize = Sim::WRITE_SIZE;
    const ERASE_SIZE: usize = Sim::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        self.flash.erase(from, to).await
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        self.flash.write(offset, bytes).await
    }
}

impl MultiwriteNorFlash for Counting {}

/// Reads counted while `f` runs.
fn reads_of<T>(reads: &Rc<Cell<u64>>, f: impl FnOnce() -> T) -> (T, u64) {
    let before = reads.get();
    let out = f();
    (out, reads.get() - before)
}

/// The host board's outbox after a long outage: entries of about 200 bytes
/// of the three classes in turn, until the critical part refuses one (the
/// telemetry and normal parts have long been recycling). Returns the
/// flash and the entries held.
fn full_outbox(reads: &Rc<Cell<u64>>) -> (Counting, usize) {
    let board = FlashBoard::host_file();
    let flash = Counting {
        flash: Sim::new(board.geometry().sectors as usize),
        reads: reads.clone(),
    };
    let mut outbox = block_on(Outbox::open(flash, board.layout().outbox)).expect("outbox");
    let classes = [Class::Telemetry, Class::Normal, Class::Critical];
    let mut held = 0usize;
    for seq in 0u32.. {
        let payload = [seq as u8; 180];
        let entry = Entry {
            seq,
            class: classes[seq as usize % 3],
            topic: "dc/v2/hall-1/host/gpu-host-0001/event",
            payload: &payload,
        };
        match block_on(outbox.push(&entry)) {
            Ok(d) => held = held + 1 - d.count as usize,
            Err(StoreError::Full) => break,
            Err(e) => panic!("push {seq}: {e}"),
        }
    }
    (outbox.into_flash(), held)
}

#[test]
fn a_full_outbox_is_opened_and_read_in_a_few_passes() {
    let reads = Rc::new(Cell::new(0));
    let (flash, held) = full_outbox(&reads);
    let layout = FlashBoard::host_file().layout().outbox;

    let t = Instant::now();
    let (outbox, open_reads) = reads_of(&reads, || block_on(Outbox::open(flash, layout)));
    let open_time = t.elapsed();
    let mut outbox = outbox.expect("re-open");
    assert_eq!(outbox.skipped(), 0);

    let mut seqs = Vec::new();
    let t = Instant::now();
    let (skipped, read_reads) = reads_of(&reads, || {
        block_on(outbox.for_each(|e| seqs.push(e.seq))).expect("read back")
    });
    let read_time = t.elapsed();
    assert_eq!(skipped, 0);
    assert_eq!(seqs.len(), held, "every entry held, once");
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in sequence order");

    let (found, pass_reads) = reads_of(&reads, || block_on(outbox.ack(u32::MAX)));
    assert!(!found.expect("ack"));

    println!(
        "outbox of the host board, {held} entries: one pass {pass_reads} flash reads; \
         open {open_reads} reads in {open_time:?}; in order {read_reads} reads in {read_time:?}"
    );
    assert!(
        open_reads <= 2 * pass_reads,
        "opening took {open_reads} flash reads, one pass takes {pass_reads}"
    );
    assert!(
        read_reads <= 2 * pass_reads,
        "reading in order took {read_reads} flash reads, one pass takes {pass_reads}"
    );
}

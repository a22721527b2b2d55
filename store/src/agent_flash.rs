//! An agent's flash: one image, a file on disk or memory when no file is
//! configured, holding the layout of `boards/flash/host-file.toml` (event
//! log, outbox, config store), opened the same way by both agents.
//!
//! The file survives restarts and power cuts; the memory form is for
//! demonstrations and says so in the log at start. Opening reserves a
//! block of frame sequence numbers in the config store (the recorder
//! thread keeps the reservation ahead of the bus's counter before it
//! numbers a frame, and [`SeqFloor`] has it do so for the frames the bus
//! numbers itself), so a restarted agent's
//! frames are never taken for duplicates of its earlier ones. On a blank
//! flash (memory, at every start; a file made at this opening, missing or
//! 0 bytes long, or one erased throughout, said in a warning), and on a
//! file with no floor kept, the reservation starts from the clock
//! (tenths of a second since 2025-01-01 UTC), which rises across restarts
//! as flash would, so receivers that keep a floor of the agent's numbers
//! from before do not refuse its frames as replayed. [`Stores::blank`]
//! says the flash held nothing an earlier run kept.
//!
//! Every opening writes the floor before any other record, so a file that
//! is not blank and holds no floor has lost its config store since (a
//! sector erased by a repair, a board layout that moved the range, a
//! damaged disk): [`Stores::config_lost`], said as an error. What the
//! agents kept there (the controller's latched state, a GPU's health) is
//! then unknown, and each reads it as unreadable, never as "nothing
//! kept". A controller's file from a version that kept only its event log
//! (before the floor was kept) reads the same, once, after the upgrade:
//! the error names that case too. The start that finds the store lost
//! marks it so ([`LOST_MARK_KEY`]) before it writes the floor, and the
//! store reads lost at every start until the agent clears the mark
//! ([`clear_lost`]) once what it recovered is kept again. A sector of
//! the store damaged whole (zeroed, garbage), through which the store
//! would read older copies without an error, reads it as lost too, said
//! naming the sector, once (`damaged_config`). A store that
//! does not read at all (the storage finds it corrupted: a file of zeros
//! made by `fallocate`, blocks zeroed by damage) runs in memory, said as
//! an error naming the file and the remedy, the file left as it was: the
//! config store is then lost, the event log or the outbox empty. An event
//! log or an outbox part kept from opening by one sector damaged whole
//! opens without it (erased in the file), and an outbox part that does
//! not read is passed over while the others work: each said as an error.
//! A file the disk refuses to write at start (the floor's write fails:
//! EIO, ENOSPC, EDQUOT) is run from a copy in memory, as one on a
//! read-only file system is, said as an error. A floor that leaves no
//! block below `u32::MAX` (numbers used up: [`StoreError::SeqExhausted`])
//! refuses the start, saying what a new numbering costs and how to start
//! one, not blaming the disk.
//!
//! Glossary:
//! - *agent flash*: the one flash image an agent's stores share.
//! - *sequence floor*: the first sequence number not yet reserved; the
//!   bus's counter stays below it.
//! - *config store lost*: a flash that holds records but no sequence
//!   floor, one with a config sector damaged whole not found before, or
//!   one whose *lost mark* is set.
//! - *lost mark*: the config value [`LOST_MARK_KEY`], set when the store
//!   is found lost, cleared when what was recovered is kept.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use loopwarden_boards::FlashBoard;
use loopwarden_flash::config::SEQ_FLOOR_KEY;
use loopwarden_flash::{
    ConfigStore, EventLog, FileFlash, FileFlashError, FlashError, Outbox, SharedFlash, SimFlash,
    StoreError,
};

use crate::recorder::Recorder;
use crate::Publisher;

mod damaged_config;

/// Word size of the agent flash, bytes.
pub const WORD: usize = 4;
/// Sector size of the agent flash, bytes.
pub const SECTOR: usize = 4096;

/// The agent flash.
pub enum AgentFlash {
    /// A flash file.
    File(FileFlash<WORD, SECTOR>),
    /// Memory only: lost at exit.
    Memory(SimFlash<WORD, SECTOR>),
}

impl ErrorType for AgentFlash {
    type Error = FlashError;
}

impl ReadNorFlash for AgentFlash {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        match self {
            Self::File(f) => f.read(offset, bytes).await,
            Self::Memory(f) => f.read(offset, bytes).await,
        }
    }

    fn capacity(&self) -> usize {
        match self {
            Self::File(f) => f.capacity(),
            Self::Memory(f) => f.capacity(),
        }
    }
}

impl NorFlash for AgentFlash {
    const WRITE_SIZE: usize = WORD;
    const ERASE_SIZE: usize = SECTOR;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        match self {
            Self::File(f) => f.erase(from, to).await,
            Self::Memory(f) => f.erase(from, to).await,
        }
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        match self {
            Self::File(f) => f.write(offset, bytes).await,
            Self::Memory(f) => f.write(offset, bytes).await,
        }
    }
}

impl MultiwriteNorFlash for AgentFlash {}

impl AgentFlash {
    /// It holds nothing an earlier run kept: memory, or a file made at
    /// this opening.
    pub fn blank(&self) -> bool {
        match self {
            Self::File(f) => f.created(),
            Self::Memory(_) => true,
        }
    }

    /// Every byte reads erased: nothing was ever written (a file made by
    /// a start that stopped before it wrote its first record).
    async fn erased(&mut self) -> Result<bool, FlashError> {
        let mut bytes = vec![0u8; self.capacity()];
        self.read(0, &mut bytes).await?;
        Ok(bytes.iter().all(|&b| b == 0xFF))
    }
}

/// The agent flash as its stores share it.
pub type Flash = SharedFlash<AgentFlash>;

/// Frame sequence numbers reserved at a time.
pub const SEQ_BLOCK: u32 = 10_000;

/// Numbers kept reserved ahead of the next frame's: with fewer left
/// below the floor, the recorder reserves the next block before it
/// numbers a frame.
pub const SEQ_MARGIN: u32 = SEQ_BLOCK / 2;

/// 2025-01-01T00:00:00Z, ms since the Unix epoch: the origin of the
/// sequence floor of an agent without a flash file.
const SEQ_EPOCH_MS: u64 = 1_735_689_600_000;

/// 2026-12-01T00:00:00Z, ms since the Unix epoch: a clock that reads
/// earlier is wrong (never set, an RTC without its battery, before the
/// network's time came), and the sequence floor starts here instead.
const CLOCK_FLOOR_MS: u64 = 1_796_083_200_000;

/// The highest floor the clock raises: room is left above it for ten
/// thousand blocks reserved since (restarts, or frames sent).
const CLOCK_SEQ_MAX: u32 = u32::MAX - 10_000 * SEQ_BLOCK;

/// The sequence floor the clock at `clock_ms` gives: ten numbers a second
/// since [`SEQ_EPOCH_MS`], from [`CLOCK_FLOOR_MS`] at the earliest. `None`
/// for a clock past what the numbers hold (2038-04-15, or a clock far
/// ahead): it raises nothing, so the clock alone never uses the numbers
/// up. A clock set ahead but before that raises the floor as far, for
/// good: the step is not bounded, since a floor far below the clock is
/// what a file from a backup, or a unit off for long, holds, and the
/// raise is for them. A floor left with no block below `u32::MAX`
/// refuses the start ([`used_up_message`]).
fn clock_seq(clock_ms: u64) -> Option<u32> {
    let from = clock_ms.max(CLOCK_FLOOR_MS).saturating_sub(SEQ_EPOCH_MS) / 100;
    u32::try_from(from).ok().filter(|&f| f <= CLOCK_SEQ_MAX)
}

/// The system's real-time clock, ms since the Unix epoch (0 before it).
fn clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What an agent's flash holds, opened.
pub struct Stores {
    /// Config values (a GPU's health, the sequence floor).
    pub store: ConfigStore<Flash>,
    /// The event log.
    pub log: EventLog<Flash>,
    /// Frames for the broker that it has not acknowledged.
    pub outbox: Outbox<Flash>,
    /// The first sequence number of the block reserved at opening.
    pub first_seq: u32,
    /// The flash file, `None` when kept in memory.
    pub path: Option<PathBuf>,
    /// The flash held nothing an earlier run kept when it was opened:
    /// memory (at every start), or a file made at this opening (missing
    /// or 0 bytes long) or erased throughout.
    pub blank: bool,
    /// The flash held what an earlier run kept but its config store held
    /// no sequence floor, which every opening writes before any other
    /// record: the config store was lost since. Or an earlier start found
    /// it so and stopped before the agent kept what it recovered (the
    /// mark [`LOST_MARK_KEY`] is set): the agent clears it
    /// ([`clear_lost`]) once that is kept.
    pub config_lost: bool,
}

fn flash_err(what: &'static str) -> impl FnOnce(StoreError<FlashError>) -> String {
    move |e| format!("{what}: {e}")
}

/// The agent's flash image: the file at `path` (made, with its folder, if
/// missing), or memory.
fn image(path: Option<&Path>, board: &FlashBoard) -> Result<AgentFlash, String> {
    match path {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let _ = std::fs::create_dir_all(dir);
            }
            let flash = match FileFlash::open(path, &board.geometry()) {
                Ok(flash) => flash,
                Err(FileFlashError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::ReadOnlyFilesystem =>
                {
                    return read_only_copy(path, board);
                }
                Err(e) => return Err(format!("{}: {e}", path.display())),
            };
            if flash.created() {
                tracing::warn!(
                    "{}: a new flash file (it was missing or empty): nothing an earlier run kept is in it; sequence numbers start from the clock",
                    path.display()
                );
            }
            if let Some(d) = flash.sync_delay() {
                tracing::warn!(
                    "{}: every flash sync is slowed by {} ms ({}, fault injection for benchmarks and tests)",
                    path.display(),
                    d.as_millis(),
                    loopwarden_flash::file::SYNC_DELAY_ENV
                );
            }
            Ok(AgentFlash::File(flash))
        }
        None => {
            tracing::warn!(
                "no flash file configured: the event log, the outbox and what the agent keeps are in memory only and lost at exit"
            );
            Ok(AgentFlash::Memory(SimFlash::new(
                board.geometry.sectors as usize,
            )))
        }
    }
}

/// The flash file at `path` on a file system mounted read-only (a disk
/// error remounted it so): a copy of it in memory, so the agent still
/// starts from what it kept and guards what it guards, said as an error
/// (what it keeps from now on is lost at exit).
fn read_only_copy(path: &Path, board: &FlashBoard) -> Result<AgentFlash, String> {
    let copy = copy_of(path, board).map_err(|e| format!("on a read-only file system: {e}"))?;
    tracing::error!(
        "{}: the file system is read-only (a disk error?): running on a copy of the flash in memory; what was kept before is read, what is kept from now on is lost at exit; check `dmesg`, remount or repair, and restart",
        path.display()
    );
    Ok(copy)
}

/// A copy in memory of the flash file at `path`, read as it is on disk.
fn copy_of(path: &Path, board: &FlashBoard) -> Result<AgentFlash, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let capacity = board.geometry().capacity();
    if bytes.len() as u64 != capacity {
        return Err(format!(
            "{}: {} bytes where the board's flash is {capacity}: nothing to run from",
            path.display(),
            bytes.len()
        ));
    }
    Ok(AgentFlash::Memory(SimFlash::from_bytes(bytes)))
}

/// Whether `image` (the file at `path`, else memory) holds nothing an
/// earlier run kept: memory, a file made at this opening, or one erased
/// throughout (said). A copy of a read-only file holds what it held.
async fn blank(image: &mut AgentFlash, path: Option<&Path>) -> Result<bool, String> {
    let copy = matches!((path, &*image), (Some(_), AgentFlash::Memory(_)));
    if image.blank() && !copy {
        return Ok(true);
    }
    let name = path.map_or("flash".into(), |p| p.display().to_string());
    let erased = (image.erased().await).map_err(|e| format!("{name}: reading it: {e}"))?;
    if erased {
        tracing::warn!(
            "{name}: erased throughout (made by a start that stopped before it wrote): nothing an earlier run kept is in it; sequence numbers start from the clock"
        );
    }
    Ok(erased)
}

/// Opens the flash (the file at `path`, else memory) and its stores, and
/// reserves a block of sequence numbers. It blocks for the flash's reads
/// and writes, as the recorder thread does later: call it at start.
pub fn open(path: Option<&Path>) -> Result<Stores, String> {
    futures::executor::block_on(open_stores(path, clock_ms()))
}

/// The error said at start when the flash `name` holds records but no
/// sequence floor ([`Stores::config_lost`]).
fn config_lost_message(name: &str) -> String {
    format!(
        "{name}: the config store holds no sequence floor, which every start writes before any other record, though the flash holds records: the config store was lost (a sector erased by a repair, a board layout that moved its range, a damaged disk), or the file was written by an older version that kept only its event log, before the sequence floor was kept (a controller's flash from then: the relatch that follows is then expected once, at the first start after the upgrade); what was kept in it (latched state, GPU health) is unknown and read as unreadable, never as nothing kept; sequence numbers start from the clock"
    )
}

/// The config key of the mark that the config store was found lost
/// ([`Stores::config_lost`]), written before the floor at the start that
/// finds it so and kept until the agent has kept again what it recovered
/// ([`clear_lost`]): a start that stops between the two (a crash, a power
/// cut, a refused bus) finds the store lost again, never intact and
/// empty.
pub const LOST_MARK_KEY: &str = "flash.config_lost";

/// The mark's value while the store is lost.
const MARKED: u8 = 1;

/// The mark's value once what was recovered is kept: not lost.
const CLEARED: u8 = 0;

/// The item that clears the lost mark ([`LOST_MARK_KEY`]), for a writer
/// that keeps it in order after what it recovered (the recorder thread).
pub fn lost_mark_cleared() -> (String, Vec<u8>) {
    (LOST_MARK_KEY.to_string(), vec![CLEARED])
}

/// Clears the lost mark ([`LOST_MARK_KEY`]) in `store`: what the agent
/// recovered after the store was lost is kept.
pub async fn clear_lost(store: &mut ConfigStore<Flash>) -> Result<(), String> {
    let (key, value) = lost_mark_cleared();
    (store.set(&key, &value).await).map_err(|e| format!("{key} not cleared in flash: {e}"))
}

/// Whether the config store in `store` (of the flash `name`) is lost:
/// `found` at this opening (holding no floor), which is marked at once,
/// before the floor goes in; or marked by an earlier start that stopped
/// before the agent kept what it recovered. A mark that cannot be read
/// reads as lost.
async fn lost(store: &mut ConfigStore<Flash>, name: &str, found: bool) -> bool {
    if found {
        if let Err(e) = store.set(LOST_MARK_KEY, &[MARKED]).await {
            tracing::error!(
                "{name}: {LOST_MARK_KEY}: the mark that the config store was lost is not kept ({e}): a restart before what is recovered is kept again would read the store as intact and empty"
            );
        }
        return true;
    }
    let mut b = [0u8; 1];
    match store.get(LOST_MARK_KEY, &mut b).await {
        Ok(None) => false,
        Ok(Some(1)) if b[0] == CLEARED => false,
        Ok(_) => {
            tracing::error!(
                "{name}: the config store was found lost by an earlier start, and no start since has kept again all it took back (on a host: GPU health, the cooling-loss phase; on a controller: the latched state; the mark is cleared only once all are): it is read as lost again (what was kept is unknown, never nothing kept)"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                "{name}: {LOST_MARK_KEY}: the mark that the config store was lost does not read ({e}): the store is read as lost"
            );
            true
        }
    }
}

/// [`open`] with the clock reading `clock` (ms since the Unix epoch).
/// The floor is raised to the clock's ([`clock_seq`]) at every opening,
/// so numbers stay above those hosts have seen from this agent even when
/// what it kept is older than what it sent: a flash file put back from a
/// backup, an image copied from another unit, a floor lost.
async fn open_stores(path: Option<&Path>, clock: u64) -> Result<Stores, String> {
    let board = FlashBoard::host_file();
    let mut image = image(path, &board)?;
    let blank = blank(&mut image, path).await?;
    let copy = match (&image, path) {
        (AgentFlash::File(_), Some(path)) => Some(|| copy_of(path, &board)),
        _ => None,
    };
    open_image(image, path, blank, clock, copy).await
}

/// [`open_stores`] on `image` (the file at `path`, else memory; `blank`
/// as [`blank`] found it). Where the floor cannot be written (a disk that
/// refuses writes: EIO, ENOSPC on a copy-on-write file system, EDQUOT),
/// the agent runs on `copy` (the file's copy in memory; `None` for
/// memory) as on a read-only file system, said as an error: what was
/// kept is read, what is kept from then on is lost at exit.
async fn open_image(
    image: AgentFlash,
    path: Option<&Path>,
    blank: bool,
    clock: u64,
    copy: Option<impl FnOnce() -> Result<AgentFlash, String>>,
) -> Result<Stores, String> {
    let board = FlashBoard::host_file();
    let name = path.map_or("flash".into(), |p| p.display().to_string());
    let flash = SharedFlash::new(image);
    let (mut store, config_lost) = config_store(&flash, &board, &name, blank).await?;
    let (flash, store, first_seq, config_lost) = match (
        reserve(&mut store, clock, path).await,
        copy,
    ) {
        (Ok(first), _) => (flash, store, first, config_lost),
        (Err(StoreError::SeqExhausted { floor, .. }), _) => {
            return Err(used_up_message(&name, floor))
        }
        (Err(e), Some(copy)) => {
            let e = flash_err("sequence reservation")(e);
            tracing::error!(
                "{name}: {e}: the disk refuses writes (full, over quota, failing? check `df` and `dmesg`): running on a copy of the flash in memory; what was kept before is read, what is kept from now on is lost at exit; sequence numbers start from the clock; free or repair the disk and restart"
            );
            drop((store, flash));
            let flash = SharedFlash::new(copy()?);
            let (mut store, lost) = config_store(&flash, &board, &name, blank).await?;
            let first = (reserve(&mut store, clock, path).await)
                .map_err(flash_err("sequence reservation"))?;
            (flash, store, first, config_lost || lost)
        }
        (Err(e), None) => return Err(flash_err("sequence reservation")(e)),
    };
    let (log, outbox) = log_and_outbox(&flash, &board, &name).await?;
    Ok(Stores {
        store,
        log,
        outbox,
        first_seq,
        path: path.map(Path::to_path_buf),
        blank,
        config_lost,
    })
}

/// A flash in memory of the board's geometry, erased: for a store of a
/// file that does not read.
fn memory(board: &FlashBoard) -> Flash {
    SharedFlash::new(AgentFlash::Memory(SimFlash::new(
        board.geometry.sectors as usize,
    )))
}

/// The error said at start when the store `what` of the flash `name`
/// does not read (`e`: the storage finds it corrupted, zeroed blocks or
/// damage): it runs in memory, the file left as it was.
fn unreadable_message(name: &str, what: &str, e: &str) -> String {
    let then = match what {
        "config store" => "read as lost: what was kept in it (GPU health, latched state, limits) is unknown, never nothing kept; it runs in memory, and what is kept from now on is lost at exit",
        "event log" => "it runs in memory: what it held is not read (no quarantine is taken back from it, no event resent), and what is logged from now on is lost at exit",
        _ => "it runs in memory: frames that waited in it are not sent, and frames that wait from now on are lost at exit",
    };
    format!(
        "{name}: {what} unreadable ({e}): {then}; the file is left as it was, as evidence: move it away to start empty (the agent stopped; `lwbus flash {name}` reads what still reads of it), knowing that a blank file keeps nothing of before: on a host, a GPU quarantined in the old file's event log starts healthy, so drain the GPUs this run shows quarantined (`ctl gpus`) before"
    )
}

/// The config store of `flash` (the flash `name`, `blank` as
/// [`blank`] found it), and whether it is lost ([`lost`]): holding no
/// floor, though the flash is not blank; a sector of it damaged whole,
/// not found before ([`damaged_config`]); or not reading at all (the
/// storage finds it corrupted), then read as lost, in memory (said).
async fn config_store(
    flash: &Flash,
    board: &FlashBoard,
    name: &str,
    blank: bool,
) -> Result<(ConfigStore<Flash>, bool), String> {
    let range = board.layout().config;
    let mut store =
        ConfigStore::open(flash.clone(), range.clone()).map_err(flash_err("config store"))?;
    let mut b = [0u8; 4];
    let mut damage = None;
    let found = match store.get(SEQ_FLOOR_KEY, &mut b).await {
        Ok(floor) => {
            let found = floor.is_none() && !blank;
            if found {
                tracing::error!("{}", config_lost_message(name));
            }
            let sectors = damaged_config::check(flash, &mut store, name, range.clone()).await;
            let found = found || sectors.lost();
            damage = Some(sectors);
            found
        }
        Err(e) => {
            let e = e.to_string();
            tracing::error!("{}", unreadable_message(name, "config store", &e));
            store = ConfigStore::open(memory(board), range)
                .map_err(flash_err("config store in memory"))?;
            true
        }
    };
    let lost = lost(&mut store, name, found).await;
    if let Some(damage) = damage {
        damaged_config::note(&mut store, name, &damage).await;
    }
    Ok((store, lost))
}

/// Reserves the first block of sequence numbers in `store` (of the flash
/// file at `path`, else memory), the floor raised to the clock's
/// (`clock`) first: the first number.
async fn reserve(
    store: &mut ConfigStore<Flash>,
    clock: u64,
    path: Option<&Path>,
) -> Result<u32, StoreError<FlashError>> {
    if clock < CLOCK_FLOOR_MS {
        tracing::error!(
            "the clock reads {clock} ms since 1970, before 2026-12-01: it is not set (check timedatectl); frames are stamped wrong and refused as expired, and where this flash's floor is older than what hosts saw from this agent (a file from a backup, or none) they refuse its frames as replays too; restart it with the clock right"
        );
    }
    // A clock past what its numbers hold (2038, or far ahead) raises a
    // file's floor no further, so the clock alone never uses the numbers
    // up; memory, with no floor of its own, starts as high as the
    // clock's go.
    let from_clock = match (clock_seq(clock), path) {
        (Some(n), _) => Some(n),
        (None, None) => Some(CLOCK_SEQ_MAX),
        (None, Some(_)) => {
            tracing::error!(
                "the clock reads {clock} ms since 1970, past what sequence numbers from the clock hold: is it right? numbers go on from the flash's floor"
            );
            None
        }
    };
    if let Some(n) = from_clock {
        store.raise_seq_floor(n).await?;
    }
    store.reserve_seq(SEQ_BLOCK).await
}

/// The error said when the flash `name`'s floor (`floor`) leaves no
/// block below `u32::MAX` ([`StoreError::SeqExhausted`]): the start is
/// refused, for numbering again from below, unasked, would give numbers
/// receivers have seen; what a new numbering costs and how to start one.
fn used_up_message(name: &str, floor: u32) -> String {
    format!(
        "{name}: sequence numbers used up: the floor kept is {floor}, and a block of {SEQ_BLOCK} more would pass {}, the highest a frame carries (numbers rise ten a second with the clock until 2038-04-15, then by the frames sent; one start with the clock set years ahead raises the floor near the top for good); numbers never go down, so the agent does not start. A new numbering must start below: readers take a sender's commands, states and resend requests by their stamp as well as their number (one stamped after the latest taken is no replay, whatever its number), so it is taken, with the clock right; a reader that holds only a number of this agent (a floor an earlier version kept, or one that only ever saw its commands stale) refuses its commands as replays until a fresh one above that number comes. To start one: stop here, read what the file keeps (`lwbus flash {name}`), drain every GPU it shows quarantined and note the leases in force, then move the file away: the next start makes a new one, numbering from the clock's floor (from 0 past 2038-04-15), and keeps nothing of before (event log, GPU health, latched state)",
        u32::MAX
    )
}

/// The event log and the outbox of `flash` (the flash `name`); one that
/// does not read (the storage finds it corrupted) runs in memory, said.
async fn log_and_outbox(
    flash: &Flash,
    board: &FlashBoard,
    name: &str,
) -> Result<(EventLog<Flash>, Outbox<Flash>), String> {
    let layout = board.layout();
    let log = match EventLog::open(flash.clone(), layout.log.clone()).await {
        Ok(log) => log,
        Err(e) => {
            let e = e.to_string();
            tracing::error!("{}", unreadable_message(name, "event log", &e));
            (EventLog::open(memory(board), layout.log).await)
                .map_err(flash_err("event log in memory"))?
        }
    };
    let outbox = match Outbox::open(flash.clone(), layout.outbox.clone()).await {
        Ok(outbox) => outbox,
        Err(e) => {
            let e = e.to_string();
            tracing::error!("{}", unreadable_message(name, "outbox", &e));
            (Outbox::open(memory(board), layout.outbox).await)
                .map_err(flash_err("outbox in memory"))?
        }
    };
    if log.skipped() > 0 || outbox.skipped() > 0 {
        tracing::warn!(
            "{name}: {} event-log and {} outbox items were unreadable and skipped (a power cut mid-write, or damage)",
            log.skipped(),
            outbox.skipped()
        );
    }
    for said in damage_said(name, &log, &outbox) {
        tracing::error!("{said}");
    }
    Ok((log, outbox))
}

/// What the event log and the outbox of the flash `name` lost to damage
/// in flash when they opened, one error each: a damaged sector erased so
/// that the rest opens, records missing between records read, an outbox
/// part that does not read (passed over, the others working).
fn damage_said<F: MultiwriteNorFlash>(
    name: &str,
    log: &EventLog<F>,
    outbox: &Outbox<F>,
) -> Vec<String>
where
    F::Error: std::fmt::Display,
{
    let mut said = Vec::new();
    if let Some(at) = log.salvaged() {
        said.push(format!(
            "{name}: event log: the sector at {at:#x} is damaged (zeroed or garbage) and kept the log from opening: it was erased, and the records it held (the newest before this start) are lost, their numbers given again; the rest of the log is read; a lease or a quarantine logged in it is not taken back"
        ));
    }
    if let Some(d) = log.damaged() {
        said.push(format!(
            "{name}: event log: {d} (damaged in flash): a lease or a quarantine among them is not taken back; `lwbus flash {name}` shows the records around them"
        ));
    }
    for (class, at) in outbox.salvaged() {
        said.push(format!(
            "{name}: outbox, {class:?} part: the sector at {at:#x} is damaged (zeroed or garbage) and kept the part from opening: it was erased, and the frames it held are not resent; the rest is"
        ));
    }
    for (class, e) in outbox.unreadable() {
        said.push(format!(
            "{name}: outbox, {class:?} part unreadable ({e}): frames that waited in it are not resent, and it keeps none from now on (sent unkept while connected); the other parts work; the file is left as it was"
        ));
    }
    said
}

/// The sequence floor as the recorder thread keeps it (it owns the config
/// store): before it numbers a frame within [`SEQ_MARGIN`] of the floor it
/// reserves the next block in flash, and a reservation that fails leaves
/// the floor where it is (the recorder then numbers no frame past it).
#[derive(Debug)]
pub(crate) struct FloorKeeper {
    floor: u32,
    /// The floor, for the handles ([`Recorder::seq_floor`]).
    shared: Arc<AtomicU32>,
}

impl FloorKeeper {
    /// The floor stored in `store`; 0 when unset or unreadable (said: the
    /// first frame then reserves, or waits).
    pub(crate) fn read(store: &mut ConfigStore<Flash>, shared: Arc<AtomicU32>) -> Self {
        let mut b = [0u8; 4];
        let floor = match futures::executor::block_on(store.get(SEQ_FLOOR_KEY, &mut b)) {
            Ok(Some(4)) => u32::from_le_bytes(b),
            Ok(None) => 0,
            other => {
                tracing::error!("the sequence floor in flash is unreadable ({other:?}): frames wait for a reservation");
                0
            }
        };
        shared.store(floor, Ordering::Relaxed);
        Self { floor, shared }
    }

    /// The first number not reserved in flash.
    pub(crate) fn floor(&self) -> u32 {
        self.floor
    }

    /// Reserves the next block when `next` (the next frame's number) is
    /// within [`SEQ_MARGIN`] of the floor; the floor after. An error:
    /// not reserved, the floor is where it was.
    pub(crate) fn ahead(
        &mut self,
        store: &mut ConfigStore<Flash>,
        next: u32,
    ) -> Result<u32, String> {
        if next.saturating_add(SEQ_MARGIN) < self.floor {
            return Ok(self.floor);
        }
        if next >= self.floor {
            tracing::error!(
                "frame {next} is at or past the sequence floor in flash ({}): raised past it now; a crash before could repeat numbers",
                self.floor
            );
        }
        let floor = self.floor;
        let first = futures::executor::block_on(async {
            if next >= floor {
                store.raise_seq_floor(next).await?;
            }
            store.reserve_seq(SEQ_BLOCK).await
        })
        .map_err(|e| format!("sequence numbers not reserved in flash: {e}"))?;
        self.reserved(first, SEQ_BLOCK);
        Ok(self.floor)
    }

    /// Takes a reservation of `block` numbers from `first`.
    pub(crate) fn reserved(&mut self, first: u32, block: u32) {
        self.floor = self.floor.max(first.saturating_add(block));
        self.shared.store(self.floor, Ordering::Relaxed);
    }
}

/// Keeps the flash reservation of sequence numbers ahead of the bus's
/// counter for the frames the bus numbers itself (telemetry, health,
/// its connections): the recorder reserves the next block (if it has not
/// already, before numbering an event or an ack) when the counter comes
/// within half a block of the floor.
#[derive(Debug)]
pub struct SeqFloor {
    floor: u32,
    /// A reservation asked for and not answered yet.
    asked: Option<tokio::sync::oneshot::Receiver<Result<u32, String>>>,
}

impl SeqFloor {
    /// The floor after the block reserved at opening (`first_seq`).
    pub fn new(first_seq: u32) -> Self {
        Self {
            floor: first_seq.saturating_add(SEQ_BLOCK),
            asked: None,
        }
    }

    /// Has `recorder` reserve the next block when `bus`'s counter needs
    /// it. Half a block before the floor it asks without waiting (by the
    /// recorder's priority channel: behind one write at most); it waits
    /// only when the counter is within an eighth of a block of the floor
    /// and the answer has not come.
    pub async fn keep_ahead(&mut self, bus: &dyn Publisher, recorder: &Recorder) {
        if let Some(rx) = self.asked.as_mut() {
            match rx.try_recv() {
                Ok(answer) => {
                    self.asked = None;
                    self.take(answer);
                }
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => self.asked = None,
            }
        }
        // What the recorder reserved before numbering events.
        self.floor = self.floor.max(recorder.seq_floor());
        let next = bus.next_seq();
        if self.asked.is_none() && next.saturating_add(SEQ_MARGIN) >= self.floor {
            self.asked = recorder.keep_seq_ahead_later(next);
        }
        if next.saturating_add(SEQ_BLOCK / 8) >= self.floor {
            let answer = match self.asked.take() {
                Some(rx) => rx
                    .await
                    .unwrap_or_else(|_| Err("the recorder has stopped".into())),
                None => recorder.keep_seq_ahead(next).await,
            };
            self.take(answer);
        }
    }

    /// Takes the recorder's answer: the floor after its reservation.
    fn take(&mut self, answer: Result<u32, String>) {
        match answer {
            Ok(floor) => self.floor = self.floor.max(floor),
            Err(e) => tracing::error!("sequence numbers not reserved in flash: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reopened_file_reserves_above_the_last_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.flash");
        let first = open(Some(&path)).unwrap();
        assert_eq!(first.path.as_deref(), Some(path.as_path()));
        let a = first.first_seq;
        drop(first);
        let b = open(Some(&path)).unwrap().first_seq;
        assert_eq!(b, a + SEQ_BLOCK, "the next block, never the same numbers");
    }

    #[test]
    fn a_new_file_reserves_from_the_clock_and_a_reopened_one_above_its_last_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.flash");
        let clock = (clock_ms() - SEQ_EPOCH_MS) / 100;
        let first = open(Some(&path)).unwrap();
        assert!(first.blank, "made at this opening");
        assert!(
            u64::from(first.first_seq) >= clock,
            "{} < {clock}",
            first.first_seq
        );
        let a = first.first_seq;
        drop(first);
        let again = open(Some(&path)).unwrap();
        assert!(!again.blank);
        assert_eq!(again.first_seq, a + SEQ_BLOCK);
        drop(again);
        // Emptied (a state folder rebuilt): blank again, from the clock.
        std::fs::write(&path, []).unwrap();
        let emptied = open(Some(&path)).unwrap();
        assert!(emptied.blank && u64::from(emptied.first_seq) >= clock);
    }

    /// A flash file on a file system remounted read-only: the agent runs
    /// on a copy in memory, from what the file kept.
    #[test]
    fn a_read_only_file_is_run_from_a_copy_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro.flash");
        let mut first = open(Some(&path)).unwrap();
        futures::executor::block_on(first.store.set("health.1", &[7])).unwrap();
        drop(first);
        let board = FlashBoard::host_file();
        let copy = read_only_copy(&path, &board).expect("a copy");
        assert!(matches!(copy, AgentFlash::Memory(_)));
        let layout = board.layout();
        let mut store = ConfigStore::open(SharedFlash::new(copy), layout.config.clone()).unwrap();
        let mut b = [0u8; 4];
        let got = futures::executor::block_on(store.get("health.1", &mut b)).unwrap();
        assert_eq!(got, Some(1));
        assert_eq!(b[0], 7, "what the file kept");
        std::fs::write(&path, [0xFFu8; 10]).unwrap();
        let e = read_only_copy(&path, &board).err().expect("a short file");
        assert!(e.contains("nothing to run from"), "{e}");
    }

    /// A bus that numbers nothing: only its counter, at `0`.
    struct Counter(u32);

    impl Publisher for Counter {
        fn publish_message(
            &self,
            _: loopwarden_protocol::Message,
            _: loopwarden_protocol::TimestampMs,
            _: bool,
        ) -> Result<u32, crate::Refused> {
            Err(crate::Refused::Failed("not in this test".into()))
        }

        fn next_seq(&self) -> u32 {
            self.0
        }
    }

    #[test]
    fn the_loop_and_the_recorder_reserve_one_block_between_them() {
        let s = open(None).unwrap();
        let floor = s.first_seq + SEQ_BLOCK;
        let r = Recorder::start(s.log, s.store, None).unwrap();
        let mut seq = SeqFloor::new(s.first_seq);
        let bus = Counter(floor - SEQ_MARGIN);
        futures::executor::block_on(seq.keep_ahead(&bus, &r));
        futures::executor::block_on(r.flush());
        assert_eq!(r.seq_floor(), floor + SEQ_BLOCK, "asked without waiting");
        // The thread has it already: asked again, no second block.
        futures::executor::block_on(seq.keep_ahead(&bus, &r));
        futures::executor::block_on(r.flush());
        assert_eq!(seq.floor, floor + SEQ_BLOCK);
        assert_eq!(r.seq_floor(), floor + SEQ_BLOCK);
        assert!(seq.asked.is_none());
    }

    #[test]
    fn a_file_without_a_floor_kept_reserves_from_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.flash");
        let mut first = open(Some(&path)).unwrap();
        futures::executor::block_on(first.store.remove(SEQ_FLOOR_KEY)).unwrap();
        drop(first);
        let clock = (clock_ms() - SEQ_EPOCH_MS) / 100;
        let again = open(Some(&path)).unwrap();
        assert!(!again.blank, "the file held what an earlier run kept");
        assert!(again.config_lost, "its floor is gone: the store was lost");
        assert!(
            u64::from(again.first_seq) >= clock,
            "{} < {clock}: not from 0",
            again.first_seq
        );
    }

    /// Only a file that held something, and whose config store holds no
    /// floor, has lost its store: not a new file, not one reopened, not
    /// one made erased by a start that wrote nothing (a crash before the
    /// floor went in), not memory.
    #[test]
    fn a_config_store_is_lost_only_from_a_file_that_held_records() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let first = open(Some(&path)).unwrap();
        assert!(first.blank && !first.config_lost, "new");
        drop(first);
        let mut again = open(Some(&path)).unwrap();
        assert!(!again.blank && !again.config_lost, "reopened");
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(again.log.append(time, kind, &[1, 2])).unwrap();
        drop(again);
        let board = FlashBoard::host_file();
        let config = board.layout().config;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let erased = vec![0xFF; (config.end - config.start) as usize];
        file.write_all_at(&erased, config.start.into()).unwrap();
        let lost = open(Some(&path)).unwrap();
        assert!(
            !lost.blank && lost.config_lost,
            "the log stayed, the store went"
        );
        drop(lost);
        // Erased throughout, at its full size: nothing was ever kept in it.
        let whole = vec![0xFF; board.geometry().capacity() as usize];
        file.write_all_at(&whole, 0).unwrap();
        drop(file);
        let erased = open(Some(&path)).unwrap();
        assert!(erased.blank && !erased.config_lost, "erased throughout");
        assert!(!open(None).unwrap().config_lost, "memory");
    }

    /// A start that found the config store lost and stopped before the
    /// agent kept what it recovered (a bus refused, a crash, a power
    /// cut): the next start finds the store lost still, though the floor
    /// went in, until the agent clears the mark.
    #[test]
    fn a_start_that_stops_after_finding_the_store_lost_leaves_it_lost() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut first = open(Some(&path)).unwrap();
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(first.log.append(time, kind, &[1, 2])).unwrap();
        drop(first);
        let config = FlashBoard::host_file().layout().config;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let erased = vec![0xFF; (config.end - config.start) as usize];
        file.write_all_at(&erased, config.start.into()).unwrap();
        drop(file);
        assert!(open(Some(&path)).unwrap().config_lost, "found lost");
        let mut again = open(Some(&path)).unwrap();
        assert!(again.config_lost, "the loss is not forgotten");
        assert!(!again.blank);
        futures::executor::block_on(clear_lost(&mut again.store)).unwrap();
        drop(again);
        assert!(!open(Some(&path)).unwrap().config_lost, "recovered, kept");
    }

    /// A file of the board's size holding zeros throughout (made by
    /// `fallocate`, or blocks zeroed by damage), which the storage reads
    /// as corrupted: the agent starts, its config store read as lost (in
    /// memory), its event log and outbox in memory; the file is left as
    /// it was, for `lwbus flash`.
    #[test]
    fn a_corrupted_file_starts_with_its_store_lost_and_is_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zero.flash");
        let capacity = FlashBoard::host_file().geometry().capacity() as usize;
        std::fs::write(&path, vec![0u8; capacity]).unwrap();
        let mut s = open(Some(&path)).expect("started, not refused");
        assert!(s.config_lost && !s.blank);
        futures::executor::block_on(s.store.set("health.1", &[7])).unwrap();
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(s.log.append(time, kind, &[1, 2])).unwrap();
        drop(s);
        assert_eq!(std::fs::read(&path).unwrap(), vec![0u8; capacity]);
        let said = unreadable_message("zero.flash", "config store", "flash store corrupted");
        assert!(
            said.starts_with("zero.flash: config store unreadable"),
            "{said}"
        );
        assert!(
            said.contains("move it away to start empty") && said.contains("lwbus flash zero.flash"),
            "{said}"
        );
        assert!(
            said.contains("quarantined") && said.contains("`ctl gpus`"),
            "a blank file's cost unsaid: {said}"
        );
    }

    /// The event log's sectors zeroed, the config store intact: the agent
    /// starts from what the store kept, its event log in memory.
    #[test]
    fn an_unreadable_event_log_runs_in_memory_beside_the_store_kept() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut first = open(Some(&path)).unwrap();
        futures::executor::block_on(first.store.set("health.1", &[7])).unwrap();
        drop(first);
        let log = FlashBoard::host_file().layout().log;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let zeros = vec![0u8; (log.end - log.start) as usize];
        file.write_all_at(&zeros, log.start.into()).unwrap();
        drop(file);
        let mut s = open(Some(&path)).expect("started, not refused");
        assert!(!s.config_lost, "the store is intact");
        let mut b = [0u8; 1];
        let got = futures::executor::block_on(s.store.get("health.1", &mut b)).unwrap();
        assert_eq!((got, b[0]), (Some(1), 7), "what the store kept");
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(s.log.append(time, kind, &[1, 2])).unwrap();
    }

    /// A record damaged in the file (bits cleared in its body): the
    /// store drops it, and the start says which record went and what
    /// that costs, not silently.
    #[test]
    fn a_damaged_record_is_said_by_its_number() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut first = open(Some(&path)).unwrap();
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        for fill in [0xA0u8, 0xA1, 0xA2, 0xA3] {
            futures::executor::block_on(first.log.append(time, 3, &[fill; 32])).unwrap();
        }
        drop(first);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.windows(32).position(|w| w == [0xA2; 32]).unwrap();
        bytes[at + 5] = 0;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&bytes[at + 5..at + 6], at as u64 + 5)
            .unwrap();
        drop(file);
        let s = open(Some(&path)).unwrap();
        let said = damage_said("host.flash", &s.log, &s.outbox);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("host.flash: event log: record #2 is damaged")
                && said[0].contains("not taken back"),
            "{said:?}"
        );
    }

    /// The outbox's telemetry part zeroed: it is said unreadable and left
    /// as it is, and the critical part's frame still waits in the file.
    #[test]
    fn a_damaged_outbox_part_leaves_the_critical_frames_kept() {
        use loopwarden_flash::{Class, Entry};
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.flash");
        let mut first = open(Some(&path)).unwrap();
        let entry = Entry {
            seq: 7,
            class: Class::Critical,
            topic: "dc/v2/s/host/h1/event",
            payload: &[1, 2, 3],
        };
        futures::executor::block_on(first.outbox.push(&entry)).unwrap();
        drop(first);
        let part = FlashBoard::host_file().layout().outbox.telemetry;
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let zeros = vec![0u8; (part.end - part.start) as usize];
        file.write_all_at(&zeros, part.start.into()).unwrap();
        drop(file);
        let mut s = open(Some(&path)).unwrap();
        let said = damage_said("host.flash", &s.log, &s.outbox);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("host.flash: outbox, Telemetry part unreadable"),
            "{said:?}"
        );
        let mut waiting = Vec::new();
        futures::executor::block_on(s.outbox.for_each(|e| waiting.push(e.seq))).unwrap();
        assert_eq!(waiting, [7], "the critical frame is kept");
    }

    /// A disk that refuses writes at start (EIO, ENOSPC on a
    /// copy-on-write file system, EDQUOT): the floor cannot be written,
    /// and the agent runs on a copy of the flash in memory, from what it
    /// kept (a quarantine), its floor from the clock.
    #[test]
    fn a_flash_that_refuses_the_floor_runs_on_a_copy_in_memory() {
        let mut kept = open(None).unwrap();
        futures::executor::block_on(kept.store.set("health.1", &[7])).unwrap();
        let mut bytes = Vec::new();
        kept.store.into_flash().with(|f| {
            let AgentFlash::Memory(m) = f else {
                panic!("a memory flash")
            };
            bytes = m.bytes_mut().to_vec();
        });
        let mut refusing = SimFlash::from_bytes(bytes.clone());
        refusing.cut_power_after(1);
        let path = Path::new("/var/lib/loopwarden/refusing.flash");
        let copy = || Ok(AgentFlash::Memory(SimFlash::from_bytes(bytes)));
        let clock = clock_ms();
        let opened = open_image(
            AgentFlash::Memory(refusing),
            Some(path),
            false,
            clock,
            Some(copy),
        );
        let mut s = futures::executor::block_on(opened).expect("started on a copy");
        assert!(!s.config_lost && !s.blank);
        assert!(
            s.first_seq >= clock_seq(clock).unwrap(),
            "from the clock at least"
        );
        let mut b = [0u8; 1];
        let got = futures::executor::block_on(s.store.get("health.1", &mut b)).unwrap();
        assert_eq!((got, b[0]), (Some(1), 7), "what was kept");
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(s.log.append(time, kind, &[1, 2])).unwrap();
    }

    /// A floor within a block of the top (a clock once set far ahead
    /// raised it): the start is refused saying the numbers are used up
    /// and what to do, not blaming the disk, and no copy in memory is
    /// tried.
    #[test]
    fn a_floor_at_the_top_refuses_the_start_as_numbers_used_up_not_the_disk() {
        let mut kept = open(None).unwrap();
        let top = (u32::MAX - 5).to_le_bytes();
        futures::executor::block_on(kept.store.set(SEQ_FLOOR_KEY, &top)).unwrap();
        let mut bytes = Vec::new();
        kept.store.into_flash().with(|f| {
            let AgentFlash::Memory(m) = f else {
                panic!("a memory flash")
            };
            bytes = m.bytes_mut().to_vec();
        });
        let copied = std::cell::Cell::new(false);
        let copy = || {
            copied.set(true);
            Ok(AgentFlash::Memory(SimFlash::from_bytes(bytes.clone())))
        };
        let path = Path::new("/var/lib/loopwarden/top.flash");
        let opened = open_image(
            AgentFlash::Memory(SimFlash::from_bytes(bytes.clone())),
            Some(path),
            false,
            clock_ms(),
            Some(copy),
        );
        let e = futures::executor::block_on(opened).err().expect("refused");
        assert!(
            !copied.get(),
            "not run from a copy: the disk is not at fault"
        );
        assert!(
            e.starts_with("/var/lib/loopwarden/top.flash: sequence numbers used up")
                && e.contains("4294967290")
                && e.contains("lwbus flash /var/lib/loopwarden/top.flash")
                && !e.contains("disk"),
            "{e}"
        );
    }

    /// A controller's flash file made by a version that kept only its
    /// event log (no sequence floor, no config store records): classed
    /// lost, fail closed, and the error names that case beside the faults.
    #[test]
    fn a_file_with_only_an_event_log_is_lost_and_said_as_maybe_an_older_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let board = FlashBoard::host_file();
        let flash = SharedFlash::new(image(Some(&path), &board).unwrap());
        let mut log = futures::executor::block_on(EventLog::open(flash, board.layout().log))
            .expect("an event log on a new file");
        let kind = loopwarden_protocol::MessageKind::Event as u8;
        let time = loopwarden_protocol::TimestampMs(1_800_000_000_000);
        futures::executor::block_on(log.append(time, kind, &[1, 2])).unwrap();
        drop(log);
        let old = futures::executor::block_on(open_stores(Some(&path), clock_ms())).unwrap();
        assert!(!old.blank && old.config_lost, "records but no floor");
        let said = config_lost_message(&path.display().to_string());
        assert!(said.starts_with(&path.display().to_string()), "{said}");
        assert!(
            said.contains("older version") && said.contains("event log"),
            "{said}"
        );
        assert!(said.contains("expected once"), "{said}");
    }

    /// A file put back from a backup (its floor below the numbers sent
    /// since), and a clock never set: the floor is the clock's at least,
    /// and never below 2026-12-01's.
    #[test]
    fn an_old_floor_is_raised_to_the_clock_and_an_unset_clock_to_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backup.flash");
        let mut first = open(Some(&path)).unwrap();
        futures::executor::block_on(first.store.set(SEQ_FLOOR_KEY, &1_000u32.to_le_bytes()))
            .unwrap();
        drop(first);
        let now = clock_ms();
        let again = futures::executor::block_on(open_stores(Some(&path), now)).unwrap();
        assert!(!again.blank);
        assert_eq!(
            again.first_seq,
            clock_seq(now).unwrap(),
            "from the clock, not from 1,000"
        );
        drop(again);
        std::fs::remove_file(&path).unwrap();
        let unset = futures::executor::block_on(open_stores(Some(&path), 0)).unwrap();
        assert_eq!(unset.first_seq, clock_seq(CLOCK_FLOOR_MS).unwrap());
        assert!(unset.first_seq > 600_000_000, "{}", unset.first_seq);
        drop(unset);
        // A clock past what the numbers hold (2040) raises nothing: the
        // starts go on from the floor kept.
        let far = 2_208_988_800_000;
        assert_eq!(clock_seq(far), None);
        let a = futures::executor::block_on(open_stores(Some(&path), far))
            .unwrap()
            .first_seq;
        let b = futures::executor::block_on(open_stores(Some(&path), far))
            .unwrap()
            .first_seq;
        assert_eq!(b, a + SEQ_BLOCK);
        let memory = futures::executor::block_on(open_stores(None, far)).unwrap();
        assert_eq!(
            memory.first_seq, CLOCK_SEQ_MAX,
            "memory starts high, not at 0"
        );
    }

    #[test]
    fn in_memory_the_floor_starts_from_the_clock() {
        let clock = (clock_ms() - SEQ_EPOCH_MS) / 100;
        let s = open(None).unwrap();
        assert!(s.path.is_none() && s.blank);
        assert!(u64::from(s.first_seq) >= clock, "{} < {clock}", s.first_seq);
        let later = open(None).unwrap().first_seq;
        assert!(later >= s.first_seq, "a restart in memory does not go back");
    }
}

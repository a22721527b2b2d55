//! The rules of NOR flash, on an image in memory: what the simulated flash
//! is, and what the file-backed flash checks before it touches its file.
//!
//! - Erased bytes read `0xFF`; erase works on whole sectors only.
//! - A write is aligned to the write size and may only clear bits (1 → 0):
//!   setting a bit back to 1 needs an erase.
//! - A word may be written at most twice between erases (parts allow a
//!   second write that clears more bits; the store uses it to mark items).
//! - A power cut can be armed: after a budget of bytes, the write or erase
//!   in progress stops where it is and every later operation fails, as on
//!   a board that lost power, until power is restored (the store re-opened);
//!   or right after a number of sector erases, the last one done whole.

use core::fmt;

use embedded_storage_async::nor_flash::{NorFlashError, NorFlashErrorKind};

/// Why a flash operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlashError {
    /// Outside the flash.
    OutOfBounds,
    /// Not aligned to the write or erase size.
    NotAligned,
    /// A write tried to set a bit that is 0 back to 1 (needs an erase).
    BitSet {
        /// The address of the offending byte.
        at: u32,
    },
    /// A word was written more often than the part allows between erases.
    TooManyWrites {
        /// The address of the word.
        at: u32,
    },
    /// Power was cut during or before this operation.
    PowerCut,
    /// The backing file failed (file-backed flash only). The flash's
    /// image in memory is put back to what the file holds.
    Io {
        /// What failed.
        op: IoOp,
        /// The flash address the operation was for.
        at: u32,
        /// The operating system's error number, where it gave one.
        os_error: Option<i32>,
    },
    /// An operation of a flash shared between threads did not finish at
    /// once, as a file's or memory's always does.
    NotReady,
}

/// The file operation behind a [`FlashError::Io`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Writing the changed bytes to the file.
    Write,
    /// Syncing them to the disk (`fdatasync`).
    Sync,
}

/// An operating system's error number in words.
struct OsError(Option<i32>);

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(code) => write!(f, "{}", std::io::Error::from_raw_os_error(code)),
            None => write!(f, "no error number given"),
        }
    }
}

impl fmt::Display for FlashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlashError::OutOfBounds => write!(f, "address outside the flash"),
            FlashError::NotAligned => write!(
                f,
                "address or length not aligned to the write or erase size"
            ),
            FlashError::BitSet { at } => write!(
                f,
                "write at {at:#x} would set a cleared bit (needs an erase)"
            ),
            FlashError::TooManyWrites { at } => {
                write!(f, "word at {at:#x} written too often since its erase")
            }
            FlashError::PowerCut => write!(f, "power cut"),
            FlashError::Io { op, at, os_error } => {
                let op = match op {
                    IoOp::Write => "writing",
                    IoOp::Sync => "syncing",
                };
                write!(
                    f,
                    "flash file failed {op} at {at:#x}: {}",
                    OsError(*os_error)
                )
            }
            FlashError::NotReady => write!(f, "shared flash operation did not finish at once"),
        }
    }
}

impl core::error::Error for FlashError {}

impl NorFlashError for FlashError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            FlashError::OutOfBounds => NorFlashErrorKind::OutOfBounds,
            FlashError::NotAligned => NorFlashErrorKind::NotAligned,
            _ => NorFlashErrorKind::Other,
        }
    }
}

/// Writes allowed per word between erases.
pub const MAX_WRITES_PER_WORD: u8 = 2;

/// What the flash has done, for wear and write-amplification figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlashStats {
    /// Bytes programmed.
    pub bytes_written: u64,
    /// Write operations.
    pub writes: u64,
    /// Sector erases, all sectors together.
    pub erases: u64,
    /// The most erases any one sector has had.
    pub max_sector_erases: u32,
}

/// A NOR flash image in memory with its rules (see the module note).
#[derive(Debug, Clone)]
pub(crate) struct NorImage {
    pub(crate) bytes: std::vec::Vec<u8>,
    write_size: usize,
    erase_size: usize,
    writes_per_word: std::vec::Vec<u8>,
    erases_per_sector: std::vec::Vec<u32>,
    pub(crate) stats: FlashStats,
    /// Bytes left before the power goes; `Some(0)` once it has gone.
    cut_budget: Option<u64>,
    /// Sector erases left before the power goes, right after the last.
    cut_erases: Option<u64>,
}

impl NorImage {
    pub(crate) fn new(bytes: std::vec::Vec<u8>, write_size: usize, erase_size: usize) -> Self {
        let words = bytes.len() / write_size;
        let sectors = bytes.len() / erase_size;
        Self {
            bytes,
            write_size,
            erase_size,
            writes_per_word: std::vec![0; words],
            erases_per_sector: std::vec![0; sectors],
            stats: FlashStats::default(),
            cut_budget: None,
            cut_erases: None,
        }
    }

    pub(crate) fn arm_power_cut(&mut self, after_bytes: u64) {
        self.cut_budget = Some(after_bytes);
    }

    /// The power goes right after `erases` more sectors are erased (at
    /// least one): the last of them erased whole, every later operation
    /// failing.
    pub(crate) fn arm_power_cut_after_erases(&mut self, erases: u64) {
        self.cut_erases = Some(erases.max(1));
    }

    pub(crate) fn restore_power(&mut self) {
        self.cut_budget = None;
        self.cut_erases = None;
    }

    pub(crate) fn power_is_cut(&self) -> bool {
        self.cut_budget == Some(0)
    }

    /// Spends `n` bytes of the budget; returns how many may still happen.
    fn spend(&mut self, n: usize) -> usize {
        match &mut self.cut_budget {
            None => n,
            Some(left) => {
                let allowed = (*left).min(n as u64) as usize;
                *left -= allowed as u64;
                allowed
            }
        }
    }

    fn range(&self, offset: u32, len: usize) -> Result<core::ops::Range<usize>, FlashError> {
        let start = offset as usize;
        let end = start.checked_add(len).ok_or(FlashError::OutOfBounds)?;
        if end > self.bytes.len() {
            return Err(FlashError::OutOfBounds);
        }
        Ok(start..end)
    }

    pub(crate) fn read(&self, offset: u32, out: &mut [u8]) -> Result<(), FlashError> {
        if self.power_is_cut() {
            return Err(FlashError::PowerCut);
        }
        let r = self.range(offset, out.len())?;
        out.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    /// Checks a write without doing it.
    pub(crate) fn check_write(&self, offset: u32, data: &[u8]) -> Result<(), FlashError> {
        if self.power_is_cut() {
            return Err(FlashError::PowerCut);
        }
        if offset as usize % self.write_size != 0 || data.len() % self.write_size != 0 {
            return Err(FlashError::NotAligned);
        }
        let r = self.range(offset, data.len())?;
        for (i, (old, new)) in self.bytes[r.clone()].iter().zip(data).enumerate() {
            if new & !old != 0 {
                return Err(FlashError::BitSet {
                    at: offset + i as u32,
                });
            }
        }
        for w in r.start / self.write_size..r.end / self.write_size {
            if self.writes_per_word[w] >= MAX_WRITES_PER_WORD {
                return Err(FlashError::TooManyWrites {
                    at: (w * self.write_size) as u32,
                });
            }
        }
        Ok(())
    }

    /// Writes (after [`Self::check_write`]); returns the bytes actually
    /// written, fewer than asked when the power went mid-write.
    pub(crate) fn write(&mut self, offset: u32, data: &[u8]) -> Result<usize, FlashError> {
        self.check_write(offset, data)?;
        let done = self.spend(data.len());
        let start = offset as usize;
        for (b, d) in self.bytes[start..start + done].iter_mut().zip(data) {
            *b &= d;
        }
        let words = start / self.write_size..(start + done).div_ceil(self.write_size);
        for w in words {
            self.writes_per_word[w] += 1;
        }
        self.stats.bytes_written += done as u64;
        self.stats.writes += 1;
        if done < data.len() {
            return Err(FlashError::PowerCut);
        }
        Ok(done)
    }

    /// Takes back the count of a write of `len` bytes at `offset` that the
    /// medium refused (its bytes put back as they were): a word rewritten
    /// after it is no nearer its limit.
    pub(crate) fn unwrite(&mut self, offset: u32, len: usize) {
        let start = offset as usize;
        let words = start / self.write_size..(start + len).div_ceil(self.write_size);
        for w in words {
            self.writes_per_word[w] = self.writes_per_word[w].saturating_sub(1);
        }
    }

    /// Erases `[from, to)`; returns the range actually erased, shorter when
    /// the power went mid-erase (the rest of that sector keeps old bytes).
    pub(crate) fn erase(
        &mut self,
        from: u32,
        to: u32,
    ) -> Result<core::ops::Range<usize>, FlashError> {
        if self.power_is_cut() {
            return Err(FlashError::PowerCut);
        }
        if from > to || from as usize % self.erase_size != 0 || to as usize % self.erase_size != 0 {
            return Err(FlashError::NotAligned);
        }
        let r = self.range(from, (to - from) as usize)?;
        let mut done = self.spend(r.len());
        if let Some(left) = self.cut_erases {
            let sectors = done.div_ceil(self.erase_size) as u64;
            if sectors >= left {
                // The power goes with the last counted sector erased whole.
                done = done.min(left as usize * self.erase_size);
                self.cut_erases = None;
                self.cut_budget = Some(0);
            } else {
                self.cut_erases = Some(left - sectors);
            }
        }
        self.bytes[r.start..r.start + done].fill(0xFF);
        for s in r.start / self.erase_size..(r.start + done).div_ceil(self.erase_size) {
            self.erases_per_sector[s] += 1;
            self.stats.erases += 1;
            self.stats.max_sector_erases =
                self.stats.max_sector_erases.max(self.erases_per_sector[s]);
        }
        let words = r.start / self.write_size..(r.start + done) / self.write_size;
        self.writes_per_word[words].fill(0);
        if done < r.len() {
            return Err(FlashError::PowerCut);
        }
        Ok(r)
    }
}

//! A NOR flash over a region of memory, with NOR's rules enforced: what
//! the flash crate (`loopwarden-flash`, through `embedded-storage-async`)
//! needs, on a board whose only non-volatile stand-in is RAM outside the
//! loaded image (on mps2-an386 under QEMU: the PSRAM bank, which neither
//! a load nor a reset touches).
//!
//! - Erasing works on whole sectors and sets their bytes to `0xFF`.
//! - A write is aligned to the write size and may only clear bits: one
//!   that would turn a 0 into a 1 fails and changes nothing.
//! - A word may be written again while that only clears more bits (the
//!   store marks items so; `MultiwriteNorFlash`).
//!
//! Glossary:
//! - *sector*: the erase unit; *word*: the write unit.

use core::fmt;

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

use super::{NOR_SECTOR_BYTES, NOR_WRITE_BYTES};

/// Why a flash operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NorError {
    /// Outside the region.
    OutOfBounds {
        /// The operation's offset.
        offset: u32,
        /// Its length.
        len: usize,
    },
    /// Not aligned to the write or erase size.
    NotAligned {
        /// The operation's offset.
        offset: u32,
        /// Its length.
        len: usize,
    },
    /// A write would set a cleared bit (it needs an erase first).
    BitSet {
        /// The offset of the offending byte.
        at: u32,
    },
}

impl fmt::Display for NorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NorError::OutOfBounds { offset, len } => {
                write!(f, "{len} bytes at {offset:#x} run outside the flash")
            }
            NorError::NotAligned { offset, len } => write!(
                f,
                "{len} bytes at {offset:#x} are not aligned to the write or erase size"
            ),
            NorError::BitSet { at } => {
                write!(
                    f,
                    "write at {at:#x} would set a cleared bit (needs an erase)"
                )
            }
        }
    }
}

impl NorFlashError for NorError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            NorError::OutOfBounds { .. } => NorFlashErrorKind::OutOfBounds,
            NorError::NotAligned { .. } => NorFlashErrorKind::NotAligned,
            NorError::BitSet { .. } => NorFlashErrorKind::Other,
        }
    }
}

/// NOR flash over `bytes` (see the module note).
#[derive(Debug)]
pub struct RamNor<'a> {
    bytes: &'a mut [u8],
}

impl<'a> RamNor<'a> {
    /// A flash over `bytes`, as they are (a reset keeps them).
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Self { bytes }
    }

    fn range(&self, offset: u32, len: usize) -> Result<core::ops::Range<usize>, NorError> {
        let start = offset as usize;
        match start.checked_add(len) {
            Some(end) if end <= self.bytes.len() => Ok(start..end),
            _ => Err(NorError::OutOfBounds { offset, len }),
        }
    }

    /// Reads `out.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u32, out: &mut [u8]) -> Result<(), NorError> {
        let r = self.range(offset, out.len())?;
        out.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    /// Programs `data` at `offset`: aligned, clearing bits only.
    pub fn program(&mut self, offset: u32, data: &[u8]) -> Result<(), NorError> {
        if offset as usize % NOR_WRITE_BYTES != 0 || data.len() % NOR_WRITE_BYTES != 0 {
            return Err(NorError::NotAligned {
                offset,
                len: data.len(),
            });
        }
        let r = self.range(offset, data.len())?;
        if let Some(i) = self.bytes[r.clone()]
            .iter()
            .zip(data)
            .position(|(old, new)| new & !old != 0)
        {
            return Err(NorError::BitSet {
                at: offset + i as u32,
            });
        }
        for (b, d) in self.bytes[r].iter_mut().zip(data) {
            *b &= d;
        }
        Ok(())
    }

    /// Whether every byte of `range` is `v` (`false` outside the flash).
    pub fn all_bytes(&self, range: core::ops::Range<u32>, v: u8) -> bool {
        let len = range.end.saturating_sub(range.start) as usize;
        self.range(range.start, len)
            .is_ok_and(|r| self.bytes[r].iter().all(|b| *b == v))
    }

    /// Erases the sectors of `[from, to)` to `0xFF`.
    pub fn erase_sectors(&mut self, from: u32, to: u32) -> Result<(), NorError> {
        let len = to.saturating_sub(from) as usize;
        if from > to || from as usize % NOR_SECTOR_BYTES != 0 || to as usize % NOR_SECTOR_BYTES != 0
        {
            return Err(NorError::NotAligned { offset: from, len });
        }
        let r = self.range(from, len)?;
        self.bytes[r].fill(0xFF);
        Ok(())
    }
}

/// What a start does with the config store it finds, before opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreStart {
    /// Open it as it is.
    Open,
    /// Erase it first: it reads all zeros on a board whose NOR region
    /// starts so before its first use (RAM standing in for a part).
    Erase,
    /// Do not start: it reads all zeros on a board whose NOR region does
    /// not start so. No NOR part reads so, erased (`0xFF`) or written
    /// (the store's headers); a read path stuck low does, and erasing
    /// would wipe the latched record it may hold.
    Refuse,
}

/// What a start does with the config store at `range` of `nor`;
/// `starts_zeroed`: the board file's `nor.starts_zeroed`
/// ([`super::NOR_STARTS_ZEROED`]).
pub fn store_start(
    nor: &RamNor<'_>,
    range: core::ops::Range<u32>,
    starts_zeroed: bool,
) -> StoreStart {
    match (nor.all_bytes(range, 0), starts_zeroed) {
        (false, _) => StoreStart::Open,
        (true, true) => StoreStart::Erase,
        (true, false) => StoreStart::Refuse,
    }
}

impl ErrorType for RamNor<'_> {
    type Error = NorError;
}

impl ReadNorFlash for RamNor<'_> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), NorError> {
        self.read_at(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.bytes.len()
    }
}

impl NorFlash for RamNor<'_> {
    const WRITE_SIZE: usize = NOR_WRITE_BYTES;
    const ERASE_SIZE: usize = NOR_SECTOR_BYTES;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), NorError> {
        self.erase_sectors(from, to)
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), NorError> {
        self.program(offset, bytes)
    }
}

impl MultiwriteNorFlash for RamNor<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_all_zero_store_is_erased_only_on_a_board_whose_nor_starts_zeroed() {
        let sectors = 0..(2 * NOR_SECTOR_BYTES) as u32;
        let mut zeros = std::vec![0u8; 3 * NOR_SECTOR_BYTES];
        let nor = RamNor::new(&mut zeros);
        assert_eq!(store_start(&nor, sectors.clone(), true), StoreStart::Erase);
        assert_eq!(
            store_start(&nor, sectors.clone(), false),
            StoreStart::Refuse
        );
        // Erased, or one byte not zero: opened as it is, either way.
        let mut erased = std::vec![0xFFu8; 3 * NOR_SECTOR_BYTES];
        let nor = RamNor::new(&mut erased);
        assert_eq!(store_start(&nor, sectors.clone(), false), StoreStart::Open);
        let mut used = std::vec![0u8; 3 * NOR_SECTOR_BYTES];
        used[NOR_SECTOR_BYTES + 17] = 0x5A;
        let nor = RamNor::new(&mut used);
        assert_eq!(store_start(&nor, sectors.clone(), false), StoreStart::Open);
        assert_eq!(store_start(&nor, sectors, true), StoreStart::Open);
    }

    #[test]
    fn writes_only_clear_bits_and_erase_sets_a_sector_to_ff() {
        let mut mem = std::vec![0xFFu8; 2 * NOR_SECTOR_BYTES];
        let mut nor = RamNor::new(&mut mem);
        nor.program(8, &[0xF0, 0x0F, 0xFF, 0x00]).unwrap();
        // Clearing more bits of the same word is allowed.
        nor.program(8, &[0x00, 0x0F, 0xFF, 0x00]).unwrap();
        // Setting one back is not, and changes nothing.
        assert_eq!(
            nor.program(8, &[0x00, 0x1F, 0xFF, 0x00]),
            Err(NorError::BitSet { at: 9 })
        );
        let mut out = [0u8; 4];
        nor.read_at(8, &mut out).unwrap();
        assert_eq!(out, [0x00, 0x0F, 0xFF, 0x00]);
        assert_eq!(
            nor.program(6, &[0; 4]),
            Err(NorError::NotAligned { offset: 6, len: 4 })
        );
        assert_eq!(
            nor.erase_sectors(0, 100),
            Err(NorError::NotAligned {
                offset: 0,
                len: 100
            })
        );
        let end = (2 * NOR_SECTOR_BYTES) as u32;
        assert!(matches!(
            nor.program(end, &[0; 4]),
            Err(NorError::OutOfBounds { .. })
        ));
        nor.erase_sectors(0, NOR_SECTOR_BYTES as u32).unwrap();
        nor.read_at(8, &mut out).unwrap();
        assert_eq!(out, [0xFF; 4]);
        assert_eq!(
            std::format!("{}", NorError::BitSet { at: 9 }),
            "write at 0x9 would set a cleared bit (needs an erase)"
        );
    }
}

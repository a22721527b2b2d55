//! The host's flash: a file on disk, or memory when no file is configured.
//!
//! Both hold the layout of `boards/flash/host-file.toml` (event log,
//! outbox, config store). The file survives restarts and power cuts; the
//! memory form is for demonstrations and says so in the log at start.
//!
//! Glossary:
//! - *host flash*: the one flash image the agent's stores share.

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use loopwarden_flash::{FileFlash, FlashError, SimFlash};

/// Word size of the host flash, bytes.
pub const WORD: usize = 4;
/// Sector size of the host flash, bytes.
pub const SECTOR: usize = 4096;

/// The host flash.
pub enum HostFlash {
    /// A flash file.
    File(FileFlash<WORD, SECTOR>),
    /// Memory only: lost at exit.
    Memory(SimFlash<WORD, SECTOR>),
}

impl ErrorType for HostFlash {
    type Error = FlashError;
}

impl ReadNorFlash for HostFlash {
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

impl NorFlash for HostFlash {
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

impl MultiwriteNorFlash for HostFlash {}

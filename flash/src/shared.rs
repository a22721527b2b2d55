//! One flash part, several stores: the log, the outbox and the config store
//! each own a range of the same part, as partitions of one chip do.

use std::sync::{Arc, Mutex};

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};
use futures::FutureExt;

use crate::nor::FlashError;

/// A flash shared by several stores (clone it for each). Every operation
/// takes the lock for its duration. For this crate's flashes, whose
/// operations complete without waiting; one that would wait is refused.
#[derive(Debug)]
pub struct SharedFlash<F>(Arc<Mutex<F>>);

impl<F> Clone for SharedFlash<F> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<F> SharedFlash<F> {
    /// Shares `flash`.
    pub fn new(flash: F) -> Self {
        Self(Arc::new(Mutex::new(flash)))
    }

    /// Runs `f` on the flash (for statistics).
    pub fn with<T>(&self, f: impl FnOnce(&mut F) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn now<T>(fut: impl core::future::Future<Output = Result<T, FlashError>>) -> Result<T, FlashError> {
    fut.now_or_never().unwrap_or(Err(FlashError::NotReady))
}

impl<F: ErrorType<Error = FlashError>> ErrorType for SharedFlash<F> {
    type Error = FlashError;
}

impl<F: ReadNorFlash + ErrorType<Error = FlashError>> ReadNorFlash for SharedFlash<F> {
    const READ_SIZE: usize = F::READ_SIZE;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        self.with(|f| now(f.read(offset, bytes)))
    }

    fn capacity(&self) -> usize {
        self.with(|f| f.capacity())
    }
}

impl<F: NorFlash + ErrorType<Error = FlashError>> NorFlash for SharedFlash<F> {
    const WRITE_SIZE: usize = F::WRITE_SIZE;
    const ERASE_SIZE: usize = F::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        self.with(|f| now(f.erase(from, to)))
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        self.with(|f| now(f.write(offset, bytes)))
    }
}

impl<F: MultiwriteNorFlash + ErrorType<Error = FlashError>> MultiwriteNorFlash for SharedFlash<F> {}

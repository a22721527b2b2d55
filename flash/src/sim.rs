//! A simulated NOR flash in memory, beside the real ones: for tests, for
//! the twin, and for power-cut injection.

use embedded_storage_async::nor_flash::{ErrorType, MultiwriteNorFlash, NorFlash, ReadNorFlash};

use crate::nor::{FlashError, FlashStats, NorImage};

/// A NOR flash of `sectors` sectors of `ERASE` bytes, written in words of
/// `WRITE` bytes, held in memory. [`SimFlash::cut_power_after`] arms a power
/// cut after a number of bytes written or erased,
/// [`SimFlash::cut_power_after_erases`] one right after a number of sector
/// erases.
#[derive(Debug, Clone)]
pub struct SimFlash<const WRITE: usize, const ERASE: usize> {
    image: NorImage,
}

impl<const WRITE: usize, const ERASE: usize> SimFlash<WRITE, ERASE> {
    /// An erased flash of `sectors` sectors.
    pub fn new(sectors: usize) -> Self {
        Self {
            image: NorImage::new(std::vec![0xFF; sectors * ERASE], WRITE, ERASE),
        }
    }

    /// A flash holding `bytes` (a copy of a file that cannot be written),
    /// whole sectors of it.
    pub fn from_bytes(mut bytes: std::vec::Vec<u8>) -> Self {
        let whole = bytes.len() / ERASE * ERASE;
        bytes.truncate(whole);
        Self {
            image: NorImage::new(bytes, WRITE, ERASE),
        }
    }

    /// The power goes after `bytes` more bytes are written or erased: the
    /// operation in progress stops mid-way and every later one fails.
    pub fn cut_power_after(&mut self, bytes: u64) {
        self.image.arm_power_cut(bytes);
    }

    /// The power goes right after `erases` more sectors are erased (at
    /// least one), the last of them whole: what a store wrote after the
    /// erase is lost, every later operation fails.
    pub fn cut_power_after_erases(&mut self, erases: u64) {
        self.image.arm_power_cut_after_erases(erases);
    }

    /// Whether the power has gone.
    pub fn power_is_cut(&self) -> bool {
        self.image.power_is_cut()
    }

    /// Power back on: the same bytes, every operation allowed again (like a
    /// board that reboots; re-open the stores on it).
    pub fn restore_power(&mut self) {
        self.image.restore_power();
    }

    /// The raw bytes (for tests that damage them).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.image.bytes
    }

    /// What the flash has done so far.
    pub fn stats(&self) -> FlashStats {
        self.image.stats.clone()
    }
}

impl<const WRITE: usize, const ERASE: usize> ErrorType for SimFlash<WRITE, ERASE> {
    type Error = FlashError;
}

impl<const WRITE: usize, const ERASE: usize> ReadNorFlash for SimFlash<WRITE, ERASE> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashError> {
        self.image.read(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.image.bytes.len()
    }
}

impl<const WRITE: usize, const ERASE: usize> NorFlash for SimFlash<WRITE, ERASE> {
    const WRITE_SIZE: usize = WRITE;
    const ERASE_SIZE: usize = ERASE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashError> {
        self.image.erase(from, to).map(|_| ())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashError> {
        self.image.write(offset, bytes).map(|_| ())
    }
}

impl<const WRITE: usize, const ERASE: usize> MultiwriteNorFlash for SimFlash<WRITE, ERASE> {}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    #[test]
    fn enforces_nor_rules() {
        block_on(async {
            let mut f = SimFlash::<4, 256>::new(2);
            assert_eq!(f.write(1, &[0; 4]).await, Err(FlashError::NotAligned));
            assert_eq!(f.write(0, &[0; 3]).await, Err(FlashError::NotAligned));
            assert_eq!(f.write(512, &[0; 4]).await, Err(FlashError::OutOfBounds));
            f.write(0, &[0xF0; 4]).await.unwrap();
            assert_eq!(
                f.write(0, &[0xFF; 4]).await,
                Err(FlashError::BitSet { at: 0 })
            );
            f.write(0, &[0x00; 4]).await.unwrap(); // clearing more bits: second write
            assert_eq!(
                f.write(0, &[0x00; 4]).await,
                Err(FlashError::TooManyWrites { at: 0 })
            );
            assert_eq!(f.erase(0, 100).await, Err(FlashError::NotAligned));
            f.erase(0, 256).await.unwrap();
            let mut b = [0; 4];
            f.read(0, &mut b).await.unwrap();
            assert_eq!(b, [0xFF; 4]);
            assert_eq!(f.stats().erases, 1);
        });
    }

    #[test]
    fn power_cut_stops_mid_write_and_fails_after() {
        block_on(async {
            let mut f = SimFlash::<4, 256>::new(1);
            f.cut_power_after(6);
            assert_eq!(f.write(0, &[0; 8]).await, Err(FlashError::PowerCut));
            assert!(f.power_is_cut());
            assert_eq!(f.write(8, &[0; 4]).await, Err(FlashError::PowerCut));
            f.restore_power();
            let mut b = [0xAA; 8];
            f.read(0, &mut b).await.unwrap();
            assert_eq!(b, [0, 0, 0, 0, 0, 0, 0xFF, 0xFF], "six bytes made it");
        });
    }

    #[test]
    fn power_cut_after_erases_goes_with_the_last_sector_erased_whole() {
        block_on(async {
            let mut f = SimFlash::<4, 256>::new(4);
            for at in [0, 256, 512, 768] {
                f.write(at, &[0; 4]).await.unwrap();
            }
            f.cut_power_after_erases(2);
            f.erase(0, 256).await.unwrap();
            assert!(!f.power_is_cut());
            f.write(4, &[0; 4]).await.unwrap();
            // Three sectors asked, one erased: the power goes after the
            // second erase counted.
            assert_eq!(f.erase(256, 1024).await, Err(FlashError::PowerCut));
            assert!(f.power_is_cut());
            assert_eq!(f.write(8, &[0; 4]).await, Err(FlashError::PowerCut));
            f.restore_power();
            let mut b = [0xAA; 4];
            for (at, left) in [(0, 0xFF), (4, 0), (256, 0xFF), (512, 0), (768, 0)] {
                f.read(at, &mut b).await.unwrap();
                assert_eq!(b, [left; 4], "{at}");
            }
            assert_eq!(f.stats().erases, 2);
            // Whole: the power goes after the erase that completes.
            f.cut_power_after_erases(1);
            assert_eq!(f.erase(0, 256).await, Ok(()));
            assert!(f.power_is_cut());
        });
    }
}

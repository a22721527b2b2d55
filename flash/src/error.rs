//! Errors of the stores.

use core::fmt;

/// Why a store operation failed. `E` is the flash's own error.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError<E> {
    /// The flash range does not suit the store (alignment, too few sectors).
    Range(&'static str),
    /// The flash or the store below failed (`sequential-storage`).
    Flash(sequential_storage::Error<E>),
    /// The item is larger than the store can ever hold.
    TooLarge {
        /// Its size in bytes.
        len: usize,
    },
    /// Full of entries that must not be dropped (outbox: critical ones).
    Full,
    /// A value read back is not what was written (config: wrong length).
    BadValue,
    /// Erasing a damaged sector, so that the rest of its store opens,
    /// failed.
    Erase {
        /// The sector's address.
        at: u32,
        /// The flash's error.
        error: E,
    },
    /// Sequence numbers used up: a block reserved from the floor kept
    /// would pass `u32::MAX`, the highest number a frame carries.
    SeqExhausted {
        /// The floor kept.
        floor: u32,
        /// The block asked for.
        block: u32,
    },
    /// Reading a sector, to check it, failed.
    Read {
        /// The sector's address.
        at: u32,
        /// The flash's error.
        error: E,
    },
}

impl<E> From<sequential_storage::Error<E>> for StoreError<E> {
    fn from(e: sequential_storage::Error<E>) -> Self {
        StoreError::Flash(e)
    }
}

impl<E: fmt::Display> fmt::Display for StoreError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use sequential_storage::Error as Below;
        match self {
            StoreError::Range(why) => write!(f, "flash range unusable: {why}"),
            // The flash's own error in its words, not the store's wrapping.
            StoreError::Flash(Below::Storage { value, .. }) => write!(f, "{value}"),
            StoreError::Flash(Below::Corrupted { .. }) => {
                write!(
                    f,
                    "flash store corrupted (its items do not read back as written)"
                )
            }
            StoreError::Flash(e) => write!(f, "flash store: {e}"),
            StoreError::TooLarge { len } => {
                write!(f, "item of {len} bytes is larger than the store can hold")
            }
            StoreError::Full => write!(f, "store full of entries that must not be dropped"),
            StoreError::BadValue => write!(f, "stored value has an unexpected size"),
            StoreError::Erase { at, error } => write!(
                f,
                "flash store corrupted; erasing its damaged sector at {at:#x} failed: {error}"
            ),
            StoreError::SeqExhausted { floor, block } => write!(
                f,
                "sequence numbers used up: the floor kept is {floor}, and {block} more would pass {}, the highest a frame carries; numbers never go down, so none is given: a new numbering must start below it (docs/flash.md section 5)",
                u32::MAX
            ),
            StoreError::Read { at, error } => {
                write!(f, "reading the flash sector at {at:#x} failed: {error}")
            }
        }
    }
}

impl<E: fmt::Debug + fmt::Display> core::error::Error for StoreError<E> {}

pub(crate) fn queue_range<S: embedded_storage_async::nor_flash::NorFlash, E>(
    range: core::ops::Range<u32>,
) -> Result<sequential_storage::queue::QueueConfig<S>, StoreError<E>> {
    use sequential_storage::queue::{QueueConfig, QueueConfigError};
    QueueConfig::try_new(range).map_err(|e| {
        StoreError::Range(match e {
            QueueConfigError::StartRangeNotAtPageBoundary => "start is not at a sector boundary",
            QueueConfigError::EndRangeNotAtPageBoundary => "end is not at a sector boundary",
            QueueConfigError::RangeTooSmall => "smaller than one sector",
            QueueConfigError::PagesTooSmall => "sectors too small",
            _ => "not accepted by the store",
        })
    })
}

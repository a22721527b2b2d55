//! Opening a queue (the event log, a part of the outbox) that the store
//! below still finds corrupted after its own repair, at the cost of one
//! damaged sector.
//!
//! The store writes one sector at a time and closes it when full; once a
//! queue has wrapped, every sector is closed but the one being written. A
//! sector damaged whole (zeroed, or garbage) reads closed too, and a queue
//! with no sector left open does not open: the store's repair only
//! re-erases a sector whose erase was cut. Erasing one sector opens it
//! again. Which one is found by trial, with nothing written: each sector
//! in turn is read as if erased ([`Trial`]), and the choice whose queue
//! opens and reads the most items, in order, is erased. An intact sector
//! erased would lose its items, so the damaged one wins; a sector whose
//! items read is never erased where another choice loses fewer. Where no
//! choice reads any item, nothing is erased: there is nothing to keep,
//! and the flash is left as it is, as evidence.
//!
//! Glossary:
//! - *salvage*: erasing the damaged sector so that the rest opens.
//! - *trial*: reading the queue as if one sector were erased (or, for the
//!   config store's check, as if all but one were: `config::damage`).

use core::ops::Range;

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};
use sequential_storage::cache::Cache;
use sequential_storage::queue::QueueStorage;

use crate::error::{queue_range, StoreError};

/// Whether `e` is the store below finding the queue corrupted.
pub(crate) fn corrupted<E>(e: &StoreError<E>) -> bool {
    matches!(
        e,
        StoreError::Flash(sequential_storage::Error::Corrupted { .. })
    )
}

/// Finds the sector of `range` (a queue of `flash` that does not open)
/// whose erasing opens the queue with the most items read, as
/// `number` numbers them (`None`: not one of this queue's items), and
/// erases it: its address. `None`: no choice opens with an item read, and
/// nothing was erased. `buf` holds the largest item.
pub(crate) async fn salvage<S: MultiwriteNorFlash>(
    flash: &mut S,
    range: Range<u32>,
    buf: &mut [u8],
    number: impl Fn(&[u8]) -> Option<u32>,
) -> Result<Option<u32>, StoreError<S::Error>> {
    let size = S::ERASE_SIZE as u32;
    let mut best: Option<(u32, Tally)> = None;
    for at in range.clone().step_by(S::ERASE_SIZE) {
        let trial = Trial::new(&mut *flash, at..at + size);
        let Ok(tally) = tally(trial, range.clone(), buf, &number).await else {
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| tally.better_than(b)) {
            best = Some((at, tally));
        }
    }
    let Some((at, _)) = best.filter(|(_, t)| t.items > 0) else {
        return Ok(None);
    };
    flash
        .erase(at, at + size)
        .await
        .map_err(|error| StoreError::Erase { at, error })?;
    Ok(Some(at))
}

/// What a trial read: items, and how often one was numbered no higher
/// than the one before (read out of order: the wrong sector erased).
#[derive(Debug, Clone, Copy)]
struct Tally {
    items: u32,
    out_of_order: u32,
}

impl Tally {
    fn better_than(&self, other: &Tally) -> bool {
        (self.items, other.out_of_order) > (other.items, self.out_of_order)
    }
}

/// Reads the queue of `range` over `flash` through.
async fn tally<F: NorFlash>(
    flash: F,
    range: Range<u32>,
    buf: &mut [u8],
    number: &impl Fn(&[u8]) -> Option<u32>,
) -> Result<Tally, StoreError<F::Error>> {
    let config = queue_range::<F, F::Error>(range)?;
    let mut queue = QueueStorage::new(flash, config, Cache::new_uncached());
    let mut iter = queue.iter().await?;
    let mut tally = Tally {
        items: 0,
        out_of_order: 0,
    };
    let mut last: Option<u32> = None;
    while let Some(item) = iter.next(buf).await? {
        let Some(n) = number(&item) else { continue };
        tally.items += 1;
        // Numbers that wrap past u32::MAX still rise.
        if last.is_some_and(|l| (n.wrapping_sub(l) as i32) <= 0) {
            tally.out_of_order += 1;
        }
        last = Some(n);
    }
    Ok(tally)
}

/// A flash read as if the sectors `erased` held were erased, changed by
/// nothing: what the store would read after erasing them. The store may
/// erase a sector it finds holding nothing live as it reads; that is
/// taken as done (read erased from then on). It never writes while it
/// reads; a write is refused.
pub(crate) struct Trial<'f, S> {
    flash: &'f mut S,
    erased: heapless::Vec<Range<u32>, 4>,
}

impl<'f, S> Trial<'f, S> {
    /// `range` of `flash` read with only `sector` as it is, the rest of
    /// `range` as erased.
    pub(crate) fn only(flash: &'f mut S, range: Range<u32>, sector: Range<u32>) -> Self {
        let mut erased = heapless::Vec::new();
        let _ = erased.push(range.start..sector.start);
        let _ = erased.push(sector.end..range.end);
        Self { flash, erased }
    }

    fn new(flash: &'f mut S, sector: Range<u32>) -> Self {
        let mut erased = heapless::Vec::new();
        let _ = erased.push(sector);
        Self { flash, erased }
    }
}

/// Why a trial's flash failed.
#[derive(Debug)]
pub(crate) enum TrialError<E> {
    /// The flash itself.
    Flash(E),
    /// The store wrote, or erased more than a trial keeps.
    Refused,
}

impl<E: NorFlashError> NorFlashError for TrialError<E> {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            TrialError::Flash(e) => e.kind(),
            TrialError::Refused => NorFlashErrorKind::Other,
        }
    }
}

impl<S: ErrorType> ErrorType for Trial<'_, S> {
    type Error = TrialError<S::Error>;
}

impl<S: ReadNorFlash> ReadNorFlash for Trial<'_, S> {
    const READ_SIZE: usize = S::READ_SIZE;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.flash
            .read(offset, bytes)
            .await
            .map_err(TrialError::Flash)?;
        let end = offset + bytes.len() as u32;
        for r in &self.erased {
            let (from, to) = (r.start.max(offset), r.end.min(end));
            if from < to {
                bytes[(from - offset) as usize..(to - offset) as usize].fill(0xFF);
            }
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.flash.capacity()
    }
}

impl<S: NorFlash> NorFlash for Trial<'_, S> {
    const WRITE_SIZE: usize = S::WRITE_SIZE;
    const ERASE_SIZE: usize = S::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        self.erased.push(from..to).map_err(|_| TrialError::Refused)
    }

    async fn write(&mut self, _offset: u32, _bytes: &[u8]) -> Result<(), Self::Error> {
        Err(TrialError::Refused)
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::SimFlash;

    #[test]
    fn a_trial_reads_its_sector_erased_and_changes_nothing() {
        block_on(async {
            let mut flash = SimFlash::<4, 256>::new(2);
            flash.bytes_mut().fill(0);
            let mut trial = Trial::new(&mut flash, 256..512);
            let mut b = [1u8; 8];
            trial.read(252, &mut b).await.unwrap();
            assert_eq!(b, [0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
            trial.erase(0, 256).await.unwrap();
            trial.read(0, &mut b).await.unwrap();
            assert_eq!(b, [0xFF; 8]);
            assert!(trial.write(0, &[0; 4]).await.is_err());
            assert!(flash.bytes_mut().iter().all(|b| *b == 0), "nothing changed");
        });
    }
}

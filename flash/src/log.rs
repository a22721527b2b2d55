//! The event log: every decision an agent made, in order, in flash.
//!
//! A record is `{seq, time, kind, body}`: `seq` rises by one per record and
//! survives restarts (re-read from the log when it opens), `kind` is a
//! message kind of the bus protocol (its code) or one of this module's own
//! kinds, and `body` is the postcard body of that message. A field engineer
//! reads the log with the same decoder as the bus.
//!
//! When the log is full, the oldest sector is erased to make room, and a
//! [`WRAPPED`] record after the new one says how many records went and which
//! sequence numbers they had. The one window where a loss goes unmarked: a
//! power cut after the erase and before the marker is written.
//!
//! Sequence numbers have no gaps: a record a power cut left unfinished
//! gives its number to the next, and a wrap removes only the oldest. A
//! record missing between two that read was damaged in flash (its
//! checksum fails, so the store does not return it): [`EventLog::damaged`]
//! says which. A sector damaged whole that kept the log from opening is
//! erased at opening and said ([`EventLog::salvaged`]); its records are
//! lost, and where they were the newest, their numbers are given again.
//!
//! Glossary:
//! - *record*: one entry of the log.
//! - *wrap*: the log reusing the space of its oldest records.
//! - *damaged*: records missing between two that read.

use core::ops::Range;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_protocol::TimestampMs;
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::queue::QueueStorage;

use crate::error::{queue_range, StoreError};
use crate::salvage::{corrupted, salvage};

/// Bytes of a record's fixed header: seq (4), time (8), kind (1).
pub const RECORD_HEADER: usize = 13;
/// The largest body a record holds (the largest frame body of the protocol).
pub const MAX_BODY: usize = loopwarden_protocol::MAX_FRAME_LEN;
/// Kind of the marker of records lost to a wrap; body: [`Wrapped`].
pub const WRAPPED: u8 = 0xF0;

/// The body of a [`WRAPPED`] record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wrapped {
    /// Records lost.
    pub lost: u32,
    /// Sequence number of the first record lost.
    pub first_seq: u32,
    /// Sequence number of the last record lost.
    pub last_seq: u32,
}

impl Wrapped {
    const LEN: usize = 12;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.lost.to_le_bytes());
        b[4..8].copy_from_slice(&self.first_seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.last_seq.to_le_bytes());
        b
    }

    /// Decodes a marker's body.
    pub fn decode(body: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = body.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Self {
            lost: word(0),
            first_seq: word(4),
            last_seq: word(8),
        })
    }
}

impl core::fmt::Display for Wrapped {
    /// The marker as a field engineer reads it: how many records were
    /// recycled for room, and which.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} older records recycled (#{} to #{})",
            self.lost, self.first_seq, self.last_seq
        )
    }
}

/// Records missing between records read: damaged in flash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damaged {
    /// Records missing.
    pub records: u32,
    /// The number of the first one missing.
    pub first_seq: u32,
    /// The number of the last one missing (those between the first and
    /// the last that read are not counted).
    pub last_seq: u32,
}

impl Damaged {
    /// Counts the records missing between `last` (the number read before,
    /// if any) and `seq`, read now.
    fn count(this: &mut Option<Self>, last: Option<u32>, seq: u32) {
        let Some(last) = last else { return };
        let step = seq.wrapping_sub(last);
        // Numbers that wrap past u32::MAX still rise; one not above the
        // one before is no gap.
        if step <= 1 || step as i32 <= 0 {
            return;
        }
        let d = this.get_or_insert(Self {
            records: 0,
            first_seq: last.wrapping_add(1),
            last_seq: 0,
        });
        d.records = d.records.saturating_add(step - 1);
        d.last_seq = seq.wrapping_sub(1);
    }
}

impl core::fmt::Display for Damaged {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.records == 1 {
            write!(f, "record #{} is damaged and unreadable", self.first_seq)
        } else {
            write!(
                f,
                "{} records between #{} and #{} are damaged and unreadable",
                self.records, self.first_seq, self.last_seq
            )
        }
    }
}

/// One record as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its sequence number.
    pub seq: u32,
    /// When it was decided.
    pub time: TimestampMs,
    /// A protocol message kind code, or [`WRAPPED`].
    pub kind: u8,
    /// The postcard body.
    pub body: &'a [u8],
}

impl<'a> Record<'a> {
    fn encode(&self, buf: &mut [u8]) -> usize {
        buf[0..4].copy_from_slice(&self.seq.to_le_bytes());
        buf[4..12].copy_from_slice(&self.time.0.to_le_bytes());
        buf[12] = self.kind;
        buf[RECORD_HEADER..RECORD_HEADER + self.body.len()].copy_from_slice(self.body);
        RECORD_HEADER + self.body.len()
    }

    /// Decodes a stored record; `None` if it is too short to be one.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        if bytes.len() < RECORD_HEADER {
            return None;
        }
        let mut seq = [0u8; 4];
        seq.copy_from_slice(&bytes[0..4]);
        let mut time = [0u8; 8];
        time.copy_from_slice(&bytes[4..12]);
        Some(Self {
            seq: u32::from_le_bytes(seq),
            time: TimestampMs(u64::from_le_bytes(time)),
            kind: bytes[12],
            body: &bytes[RECORD_HEADER..],
        })
    }
}

/// No cache: every operation reads what it needs from flash, so nothing in
/// RAM can disagree with flash after a power cut.
pub(crate) type NoCache = Cache<Uncached, Uncached, Uncached>;

/// The event log over a flash range (see the module note).
pub struct EventLog<S: MultiwriteNorFlash> {
    queue: QueueStorage<S, NoCache>,
    next_seq: u32,
    skipped: u32,
    /// Records missing between records read, at the last reading through.
    damaged: Option<Damaged>,
    /// The address of the sector erased at opening (damaged), if any.
    salvaged: Option<u32>,
    /// Times a sector was erased for room since the log was opened.
    wraps: u32,
    buf: [u8; RECORD_HEADER + MAX_BODY],
}

impl<S: MultiwriteNorFlash> EventLog<S> {
    /// Opens the log in `range` of `flash` (whole sectors; two or more, so
    /// that a wrap keeps records),
    /// finding where its sequence numbers left off. Where the store finds
    /// it corrupted after its own repair (a sector damaged whole), the
    /// damaged sector is erased and the rest opens ([`Self::salvaged`]
    /// says where); where nothing would read, the log is left as it is
    /// and the error returned.
    pub async fn open(flash: S, range: Range<u32>) -> Result<Self, StoreError<S::Error>> {
        let config = queue_range(range.clone())?;
        let queue = QueueStorage::new(flash, config, Cache::new_uncached());
        let mut log = Self {
            queue,
            next_seq: 0,
            skipped: 0,
            damaged: None,
            salvaged: None,
            wraps: 0,
            buf: [0; RECORD_HEADER + MAX_BODY],
        };
        match log.read_through().await {
            Err(e) if corrupted(&e) => {
                let seq = |b: &[u8]| Record::decode(b).map(|r| r.seq);
                log.salvaged = salvage(log.queue.flash(), range, &mut log.buf, seq).await?;
                if log.salvaged.is_none() {
                    return Err(e);
                }
                log.read_through().await?;
            }
            other => other?,
        }
        Ok(log)
    }

    /// Reads the log through: where its numbers left off, the items that
    /// are not records, the records damaged.
    async fn read_through(&mut self) -> Result<(), StoreError<S::Error>> {
        let mut max: Option<u32> = None;
        self.skipped = self
            .for_each(|r| {
                max = Some(max.map_or(r.seq, |m| m.max(r.seq)));
            })
            .await?;
        self.next_seq = max.map_or(0, |m| m.wrapping_add(1));
        Ok(())
    }

    /// The sequence number the next record gets.
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Stored items that were not records (too short), skipped when the
    /// log was opened. Items the store itself found damaged (CRC) never
    /// reach this layer (`sequential-storage` drops them): see
    /// [`Self::damaged`].
    pub fn skipped(&self) -> u32 {
        self.skipped
    }

    /// Records missing between records read (damaged in flash: the store
    /// drops an item whose checksum fails), found when the log was opened
    /// or last read through ([`Self::for_each`]). Records missing after
    /// the newest that reads cannot be told from records never written.
    pub fn damaged(&self) -> Option<Damaged> {
        self.damaged
    }

    /// The address of the sector erased when the log was opened: damaged
    /// whole (zeroed, garbage), it kept the log from opening; what it
    /// held is lost. `None` when none was.
    pub fn salvaged(&self) -> Option<u32> {
        self.salvaged
    }

    /// Times the log erased its oldest sector for room since it was opened:
    /// records were recycled when it changed.
    pub fn wraps(&self) -> u32 {
        self.wraps
    }

    /// The number of the oldest record the log holds (`None`: empty).
    pub async fn oldest(&mut self) -> Result<Option<u32>, StoreError<S::Error>> {
        self.oldest_seq().await
    }

    /// A number below which every record the log's next wrap erases
    /// lies, once that wrap is near: no erased sector is left ahead of
    /// the one being written, so the first record that does not fit in it
    /// erases the oldest sector. `None` while an erased sector is left
    /// ahead, or the log is empty. A record that must outlive the wrap (a
    /// lease in force) is logged again as soon as it lies below this,
    /// while the sector being written has room: its copy is then in
    /// flash before its sector is erased, and a power cut between the
    /// erase and the write after it loses neither.
    ///
    /// The oldest sector's records are the first ones read that fit in a
    /// sector together, counted at their size in flash (header and
    /// padding): a record the store no longer reads (damaged by a power
    /// cut) only makes the number higher than the first record the wrap
    /// keeps, never lower.
    pub async fn kept_by_next_wrap(&mut self) -> Result<Option<u32>, StoreError<S::Error>> {
        // What a whole erased sector holds (the store's marker words at
        // either end left out): the room while one is left ahead.
        let word = S::READ_SIZE.max(S::WRITE_SIZE) as u32;
        let whole = S::ERASE_SIZE as u32 - 2 * word;
        if self.queue.find_max_fit().await? == Some(whole) {
            return Ok(None);
        }
        let overhead = QueueStorage::<S, NoCache>::item_overhead_size();
        let mut used = 0u32;
        let mut any = false;
        let mut iter = self.queue.iter().await?;
        while let Some(entry) = iter.next(&mut self.buf).await? {
            used += overhead + (entry.len() as u32).next_multiple_of(word);
            let Some(r) = Record::decode(&entry) else {
                continue;
            };
            // The first that does not fit after those before it is in a
            // later sector, and every one after it.
            if used > whole {
                return Ok(Some(r.seq));
            }
            any = true;
        }
        // Every record in what one sector holds: all may go.
        Ok(any.then_some(self.next_seq))
    }

    /// Appends a record; returns its sequence number. When the log is full
    /// the oldest sector is erased to make room, and a [`WRAPPED`] marker
    /// after the record says how many records went.
    pub async fn append(
        &mut self,
        time: TimestampMs,
        kind: u8,
        body: &[u8],
    ) -> Result<u32, StoreError<S::Error>> {
        if body.len() > MAX_BODY {
            return Err(StoreError::TooLarge { len: body.len() });
        }
        let seq = self.next_seq;
        match self
            .push(
                Record {
                    seq,
                    time,
                    kind,
                    body,
                },
                false,
            )
            .await
        {
            Ok(()) => return Ok(seq),
            Err(sequential_storage::Error::FullStorage) => {}
            Err(e) => return Err(e.into()),
        }
        // Full: the store erases the oldest sector (one erase) to make room;
        // what it held is then counted from the oldest sequence number
        // before and after, and said in a marker after the record.
        let mut before = self.oldest_seq().await?;
        self.wraps = self.wraps.wrapping_add(1);
        self.push(
            Record {
                seq,
                time,
                kind,
                body,
            },
            true,
        )
        .await?;
        loop {
            let after = self.oldest_seq().await?;
            let (Some(b), Some(a)) = (before, after) else {
                break;
            };
            if a == b {
                break;
            }
            let lost = Wrapped {
                lost: a.wrapping_sub(b),
                first_seq: b,
                last_seq: a.wrapping_sub(1),
            }
            .encode();
            let marker = Record {
                seq: self.next_seq,
                time,
                kind: WRAPPED,
                body: &lost,
            };
            match self.push(marker, false).await {
                Ok(()) => break,
                Err(sequential_storage::Error::FullStorage) => {
                    // The marker itself needs another sector: count that one too.
                    before = after;
                    self.wraps = self.wraps.wrapping_add(1);
                    self.push(marker, true).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(seq)
    }

    /// Writes a record (erasing the oldest sector for room when
    /// `overwrite`), and moves the numbering past it.
    async fn push(
        &mut self,
        record: Record<'_>,
        overwrite: bool,
    ) -> Result<(), sequential_storage::Error<S::Error>> {
        let n = record.encode(&mut self.buf);
        self.queue.push(&self.buf[..n], overwrite).await?;
        self.next_seq = record.seq.wrapping_add(1);
        Ok(())
    }

    /// The sequence number of the oldest record, if any.
    async fn oldest_seq(&mut self) -> Result<Option<u32>, StoreError<S::Error>> {
        let mut iter = self.queue.iter().await?;
        Ok(iter
            .next(&mut self.buf)
            .await?
            .and_then(|e| Record::decode(&e).map(|r| r.seq)))
    }

    /// Calls `f` with every record, oldest first; returns how many stored
    /// items were skipped as not being records. Records missing between
    /// those read are counted for [`Self::damaged`].
    pub async fn for_each(
        &mut self,
        mut f: impl FnMut(Record<'_>),
    ) -> Result<u32, StoreError<S::Error>> {
        let mut skipped = 0;
        let mut damaged = None;
        let mut last = None;
        let mut iter = self.queue.iter().await?;
        while let Some(entry) = iter.next(&mut self.buf).await? {
            match Record::decode(&entry) {
                Some(r) => {
                    Damaged::count(&mut damaged, last, r.seq);
                    last = Some(r.seq);
                    f(r)
                }
                None => skipped += 1,
            }
        }
        self.damaged = damaged;
        Ok(skipped)
    }

    /// The flash back.
    pub fn into_flash(self) -> S {
        self.queue.destroy().0
    }

    /// The flash, to inspect it (statistics).
    pub fn flash(&mut self) -> &mut S {
        self.queue.flash()
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use futures::executor::block_on;

    use super::*;
    use crate::SimFlash;

    #[test]
    fn the_records_the_next_wrap_erases_are_known_before_it() {
        block_on(async {
            // Three sectors of 1 KiB: 15 records of 53 bytes (64 in flash)
            // fill one.
            let mut log = EventLog::open(SimFlash::<4, 1024>::new(3), 0..3072)
                .await
                .unwrap();
            assert_eq!(log.kept_by_next_wrap().await.unwrap(), None, "empty");
            let mut known = std::vec::Vec::new();
            for i in 0..80u32 {
                let kept = log.kept_by_next_wrap().await.unwrap();
                known.push(kept);
                let wraps = log.wraps();
                log.append(TimestampMs(u64::from(i)), 3, &[i as u8; 40])
                    .await
                    .unwrap();
                if log.wraps() != wraps {
                    // Every record it erased lay below what it said.
                    let oldest = log.oldest().await.unwrap().unwrap();
                    assert_eq!(kept, Some(oldest), "record {i}");
                }
            }
            // Two sectors of room: nothing said until the last one is
            // being written (from record 30), then the first sector's
            // records, then the second's after the first wrap (at 45).
            assert!(known[..31].iter().all(Option::is_none), "{known:?}");
            assert!(known[31..46].iter().all(|k| *k == Some(15)), "{known:?}");
            assert_eq!(known[46], Some(30), "{known:?}");
            assert_eq!(log.wraps(), 3);
        });
    }
}

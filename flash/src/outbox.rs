//! The outbox: frames that must reach the broker, kept in flash from before
//! they are sent until the broker acknowledged them.
//!
//! An entry is `{seq, class, topic, payload}`: the frame's own sequence
//! number (so a resent frame is recognisably the same), its class, the
//! topic and the frame bytes. Entries leave only by [`Outbox::ack`]; after a
//! restart or a reconnection [`Outbox::for_each`] gives them back in order
//! to be sent again.
//!
//! Each class has its own part of the flash, so a flood of cheap entries can
//! never crowd out a dear one. When the telemetry or the normal part is full,
//! its oldest entries make room (counted and reported, so the caller logs
//! them); the critical part (a quarantine, a cap, a leak) never drops
//! anything: [`Outbox::push`] fails instead, and the caller keeps the
//! decision in its log. Resending merges the parts by sequence number.
//!
//! (A flash queue frees space only a whole sector at a time, oldest first:
//! dropping "telemetry first" from one shared queue would free nothing while
//! the oldest sector held a single critical entry. Separate parts make the
//! priority hold.)
//!
//! Glossary:
//! - *class*: how much losing an entry would cost ([`Class`]).
//! - *ack*: the broker's PUBACK for the frame's publish.

use core::ops::Range;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_protocol::{Event, HealthState, Message, MAX_FRAME_LEN};
use sequential_storage::cache::Cache;
use sequential_storage::queue::QueueStorage;

use crate::error::{queue_range, StoreError};
use crate::log::NoCache;

/// Bytes of an entry's fixed header: seq (4), class (1), topic length (1).
const ENTRY_HEADER: usize = 6;
/// The longest topic an entry holds.
pub const MAX_TOPIC: usize = loopwarden_protocol::topic::TOPIC_MAX;

/// How much losing an entry would cost, in rising order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Class {
    /// Superseded by the next one anyway (presence, a JSON mirror).
    Telemetry = 0,
    /// Worth delivering (an XID, an ack, a health change without quarantine).
    Normal = 1,
    /// Must never be lost: a quarantine, a cap, a leak, a failsafe.
    Critical = 2,
}

impl Class {
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(Class::Telemetry),
            1 => Some(Class::Normal),
            2 => Some(Class::Critical),
            _ => None,
        }
    }

    /// The class of a message: what the brief says must never be lost is
    /// critical.
    pub fn of(message: &Message) -> Class {
        match message {
            Message::HostTelemetry(_) | Message::CduTelemetry(_) | Message::Online(_) => {
                Class::Telemetry
            }
            Message::HostHealth(h) => {
                if h.gpus.iter().any(|g| g.state == HealthState::Quarantined) {
                    Class::Critical
                } else {
                    Class::Normal
                }
            }
            Message::Event(e) => match e {
                Event::HealthChanged {
                    to: HealthState::Quarantined,
                    ..
                }
                | Event::QuarantineAction { .. }
                | Event::QuarantineReleased { .. }
                | Event::CapApplied { .. }
                | Event::CapsApplied { .. }
                | Event::Leak { .. }
                | Event::CduModeChanged { .. }
                | Event::PumpTrip { .. }
                | Event::PumpSeized { .. }
                | Event::IsolationFailed { .. }
                | Event::OperatorCleared { .. }
                | Event::CoolingAction { .. } => Class::Critical,
                // Faults that can come and go many times in an outage
                // (a sensor, a rope's sensing) stay normal, so they can
                // never crowd a leak out of the critical part; they stay
                // in the event log, to be asked for again.
                _ => Class::Normal,
            },
            Message::CapLease(_) | Message::CduState(_) => Class::Critical,
            Message::QuarantineRelease(_) | Message::Ack(_) => Class::Normal,
            // Never stored (not durable): a reader asks again.
            Message::ResendRequest(_) | Message::ResendReport(_) => Class::Telemetry,
        }
    }
}

/// One entry as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The frame's sequence number.
    pub seq: u32,
    /// Its class.
    pub class: Class,
    /// Where it goes.
    pub topic: &'a str,
    /// The frame.
    pub payload: &'a [u8],
}

impl<'a> Entry<'a> {
    fn encode(&self, buf: &mut [u8]) -> usize {
        let t = self.topic.len();
        buf[0..4].copy_from_slice(&self.seq.to_le_bytes());
        buf[4] = self.class as u8;
        buf[5] = t as u8;
        buf[ENTRY_HEADER..ENTRY_HEADER + t].copy_from_slice(self.topic.as_bytes());
        let p = ENTRY_HEADER + t;
        buf[p..p + self.payload.len()].copy_from_slice(self.payload);
        p + self.payload.len()
    }

    /// Decodes a stored entry; `None` if it is not one.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        if bytes.len() < ENTRY_HEADER {
            return None;
        }
        let seq = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let class = Class::from_u8(bytes[4])?;
        let t = bytes[5] as usize;
        let topic = core::str::from_utf8(bytes.get(ENTRY_HEADER..ENTRY_HEADER + t)?).ok()?;
        Some(Self {
            seq,
            class,
            topic,
            payload: &bytes[ENTRY_HEADER + t..],
        })
    }
}

/// What a push had to drop to make room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Entries dropped.
    pub count: u32,
    /// The lowest sequence number dropped.
    pub first_seq: Option<u32>,
    /// The highest class dropped.
    pub worst: Option<Class>,
}

/// Where each class lives: three ranges of whole sectors of one flash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxLayout {
    /// Telemetry-class entries (at least one sector; two or more keep
    /// more of them through an outage).
    pub telemetry: Range<u32>,
    /// Normal entries.
    pub normal: Range<u32>,
    /// Critical entries, never dropped.
    pub critical: Range<u32>,
}

impl OutboxLayout {
    fn range(&self, class: Class) -> Range<u32> {
        match class {
            Class::Telemetry => self.telemetry.clone(),
            Class::Normal => self.normal.clone(),
            Class::Critical => self.critical.clone(),
        }
    }
}

const BUF: usize = ENTRY_HEADER + MAX_TOPIC + MAX_FRAME_LEN;
const CLASSES: [Class; 3] = [Class::Telemetry, Class::Normal, Class::Critical];

/// The queue of one class, over the shared flash.
fn part<'f, S: MultiwriteNorFlash>(
    flash: &'f mut S,
    layout: &OutboxLayout,
    class: Class,
) -> Result<QueueStorage<&'f mut S, NoCache>, StoreError<S::Error>> {
    let config = queue_range::<&mut S, S::Error>(layout.range(class))?;
    Ok(QueueStorage::new(flash, config, Cache::new_uncached()))
}

/// The outbox (see the module note).
pub struct Outbox<S: MultiwriteNorFlash> {
    flash: S,
    layout: OutboxLayout,
    buf: [u8; BUF],
    best: [u8; BUF],
    skipped: u32,
}

impl<S: MultiwriteNorFlash> Outbox<S> {
    /// Opens the outbox over `layout` of `flash`.
    pub async fn open(flash: S, layout: OutboxLayout) -> Result<Self, StoreError<S::Error>> {
        for class in CLASSES {
            queue_range::<S, S::Error>(layout.range(class))?;
        }
        let mut outbox = Self {
            flash,
            layout,
            buf: [0; BUF],
            best: [0; BUF],
            skipped: 0,
        };
        outbox.skipped = outbox.for_each(|_| {}).await?;
        Ok(outbox)
    }

    /// Stored items that were not entries, skipped when the outbox opened.
    pub fn skipped(&self) -> u32 {
        self.skipped
    }

    /// Stores an entry before it is sent. When its class's part is full,
    /// the oldest entries of that part make room, unless the class is
    /// critical: then it fails with [`StoreError::Full`].
    pub async fn push(&mut self, entry: &Entry<'_>) -> Result<Dropped, StoreError<S::Error>> {
        if entry.topic.len() > MAX_TOPIC || entry.payload.len() > MAX_FRAME_LEN {
            return Err(StoreError::TooLarge {
                len: entry.topic.len() + entry.payload.len(),
            });
        }
        let n = entry.encode(&mut self.buf);
        let mut dropped = Dropped::default();
        // Two buffers: the entry stays encoded in `best` while `buf` reads.
        self.best[..n].copy_from_slice(&self.buf[..n]);
        loop {
            let mut queue = part(&mut self.flash, &self.layout, entry.class)?;
            match queue.push(&self.best[..n], false).await {
                Ok(()) => return Ok(dropped),
                Err(sequential_storage::Error::FullStorage) => {}
                Err(e) => return Err(e.into()),
            }
            if entry.class == Class::Critical {
                return Err(StoreError::Full);
            }
            let mut iter = queue.iter().await?;
            let Some(item) = iter.next(&mut self.buf).await? else {
                return Err(StoreError::TooLarge { len: n });
            };
            let seq = Entry::decode(&item).map(|e| e.seq);
            item.pop().await?;
            dropped.count += 1;
            dropped.worst = Some(dropped.worst.map_or(entry.class, |w| w.max(entry.class)));
            if let Some(seq) = seq {
                dropped.first_seq = Some(dropped.first_seq.map_or(seq, |s| s.min(seq)));
            }
        }
    }

    /// The broker acknowledged the frame `seq`: the entry leaves. False if
    /// no entry has that number (already acknowledged, or dropped).
    pub async fn ack(&mut self, seq: u32) -> Result<bool, StoreError<S::Error>> {
        for class in CLASSES {
            let mut queue = part(&mut self.flash, &self.layout, class)?;
            let mut iter = queue.iter().await?;
            while let Some(item) = iter.next(&mut self.buf).await? {
                if Entry::decode(&item).is_some_and(|e| e.seq == seq) {
                    item.pop().await?;
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Calls `f` with every entry still unacknowledged, all classes merged
    /// in sequence order; returns how many stored items were skipped as not
    /// being entries. Takes time in the square of the entries held.
    pub async fn for_each(
        &mut self,
        mut f: impl FnMut(Entry<'_>),
    ) -> Result<u32, StoreError<S::Error>> {
        let mut last: Option<u32> = None;
        let mut skipped;
        loop {
            skipped = 0;
            let mut best: Option<(u32, usize)> = None;
            for class in CLASSES {
                let mut queue = part(&mut self.flash, &self.layout, class)?;
                let mut iter = queue.iter().await?;
                while let Some(item) = iter.next(&mut self.buf).await? {
                    let Some(e) = Entry::decode(&item) else {
                        skipped += 1;
                        continue;
                    };
                    let after_last = last.is_none_or(|l| e.seq > l);
                    if after_last && best.is_none_or(|(b, _)| e.seq < b) {
                        best = Some((e.seq, item.len()));
                        self.best[..item.len()].copy_from_slice(&item);
                    }
                }
            }
            let Some((seq, len)) = best else { break };
            if let Some(e) = Entry::decode(&self.best[..len]) {
                f(e);
            }
            last = Some(seq);
        }
        Ok(skipped)
    }

    /// The flash back.
    pub fn into_flash(self) -> S {
        self.flash
    }
}

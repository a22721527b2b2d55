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
//! The parts open one by one: a part damaged whole is opened without its
//! damaged sector (erased, said: [`Outbox::salvaged`]); one that does not
//! read even so is said ([`Outbox::unreadable`]) and passed over, and the
//! other parts keep working. A damaged telemetry part never takes the
//! critical entries down with it.
//!
//! Glossary:
//! - *class*: how much losing an entry would cost ([`Class`]).
//! - *ack*: the broker's PUBACK for the frame's publish.
//! - *part*: the flash of one class.
//! - *unreadable part*: one that did not open; left as it is.

use core::ops::Range;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_protocol::{Event, HealthState, Message, MAX_FRAME_LEN};
use sequential_storage::cache::Cache;
use sequential_storage::queue::QueueStorage;

use crate::error::{queue_range, StoreError};
use crate::log::NoCache;
use crate::salvage::{corrupted, salvage};

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
    /// By class: why the part did not open (`None`: it did).
    unreadable: [Option<StoreError<S::Error>>; 3],
    /// By class: the address of the damaged sector erased to open it.
    salvaged: [Option<u32>; 3],
}

impl<S: MultiwriteNorFlash> Outbox<S> {
    /// Opens the outbox over `layout` of `flash`, each part on its own: a
    /// part that does not read is said ([`Self::unreadable`]) and passed
    /// over while the others work; an error only when none reads.
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
            unreadable: [None, None, None],
            salvaged: [None; 3],
        };
        for class in CLASSES {
            match outbox.open_part(class).await {
                Ok(skipped) => outbox.skipped += skipped,
                Err(e) => outbox.unreadable[class as usize] = Some(e),
            }
        }
        if outbox.unreadable.iter().all(Option::is_some) {
            // Nothing reads: the critical part's error.
            if let [_, _, Some(e)] = outbox.unreadable {
                return Err(e);
            }
        }
        Ok(outbox)
    }

    /// Reads the part of `class` through: the items that are not entries.
    /// Where the store finds it corrupted after its own repair, the
    /// damaged sector is erased (said: [`Self::salvaged`]) and the rest
    /// read; where nothing would read, the part is left as it is.
    async fn open_part(&mut self, class: Class) -> Result<u32, StoreError<S::Error>> {
        let Self {
            flash, layout, buf, ..
        } = self;
        match read_part(flash, layout, class, buf, &mut |_, _| {}).await {
            Err(e) if corrupted(&e) => {
                let seq = |b: &[u8]| Entry::decode(b).map(|e| e.seq);
                let Some(at) = salvage(flash, layout.range(class), buf, seq).await? else {
                    return Err(e);
                };
                self.salvaged[class as usize] = Some(at);
                read_part(flash, layout, class, buf, &mut |_, _| {}).await
            }
            other => other,
        }
    }

    /// Stored items that were not entries, skipped when the outbox opened.
    pub fn skipped(&self) -> u32 {
        self.skipped
    }

    /// The parts that did not open, and why (the store finds them
    /// corrupted and erasing one sector would read nothing, or the flash
    /// failed): passed over by [`Self::for_each`] and [`Self::ack`], left
    /// as they are; a push to one fails.
    pub fn unreadable(&self) -> impl Iterator<Item = (Class, &StoreError<S::Error>)> {
        CLASSES
            .into_iter()
            .filter_map(|c| self.unreadable[c as usize].as_ref().map(|e| (c, e)))
    }

    /// The parts opened without a damaged sector, erased (what it held is
    /// lost), and its address.
    pub fn salvaged(&self) -> impl Iterator<Item = (Class, u32)> + '_ {
        CLASSES
            .into_iter()
            .filter_map(|c| self.salvaged[c as usize].map(|at| (c, at)))
    }

    /// Whether the part of `class` opened.
    fn readable(&self) -> [bool; 3] {
        self.unreadable.each_ref().map(Option::is_none)
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
        let readable = self.readable();
        for class in CLASSES.into_iter().filter(|c| readable[*c as usize]) {
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
    /// in sequence order (an entry whose number an earlier one of the
    /// merge already had is passed over); returns how many stored items
    /// were skipped as not being entries.
    ///
    /// With `std`, one pass over the flash, the entries held in memory
    /// meanwhile. Without (no allocator), one pass per entry: time in the
    /// square of the entries held.
    pub async fn for_each(
        &mut self,
        mut f: impl FnMut(Entry<'_>),
    ) -> Result<u32, StoreError<S::Error>> {
        let readable = self.readable();
        #[cfg(feature = "std")]
        let mut chosen = Everything::default();
        #[cfg(not(feature = "std"))]
        let mut chosen = Lowest::new(&mut self.best);
        merged(
            &mut self.flash,
            (&self.layout, readable),
            &mut self.buf,
            &mut chosen,
            &mut f,
        )
        .await
    }

    /// The flash back.
    pub fn into_flash(self) -> S {
        self.flash
    }
}

/// The parts of a layout that are read: those marked readable.
type Parts<'l> = (&'l OutboxLayout, [bool; 3]);

/// One pass over every stored item of the readable parts, telemetry
/// first, each part in the order stored: calls `f` with each entry's
/// number and stored bytes; returns how many items were not entries.
async fn pass<S: MultiwriteNorFlash>(
    flash: &mut S,
    (layout, readable): Parts<'_>,
    buf: &mut [u8; BUF],
    mut f: impl FnMut(u32, &[u8]),
) -> Result<u32, StoreError<S::Error>> {
    let mut skipped = 0;
    for class in CLASSES.into_iter().filter(|c| readable[*c as usize]) {
        skipped += read_part(flash, layout, class, buf, &mut f).await?;
    }
    Ok(skipped)
}

/// [`pass`] over the part of `class`.
async fn read_part<S: MultiwriteNorFlash>(
    flash: &mut S,
    layout: &OutboxLayout,
    class: Class,
    buf: &mut [u8; BUF],
    f: &mut impl FnMut(u32, &[u8]),
) -> Result<u32, StoreError<S::Error>> {
    let mut skipped = 0;
    let mut queue = part(flash, layout, class)?;
    let mut iter = queue.iter().await?;
    while let Some(item) = iter.next(buf).await? {
        match Entry::decode(&item) {
            Some(e) => f(e.seq, &item),
            None => skipped += 1,
        }
    }
    Ok(skipped)
}

/// Passes until every entry went to `f` in sequence order, each pass
/// giving `chosen` the entries numbered above those already passed on.
async fn merged<S: MultiwriteNorFlash, C: Chosen>(
    flash: &mut S,
    parts: Parts<'_>,
    buf: &mut [u8; BUF],
    chosen: &mut C,
    f: &mut impl FnMut(Entry<'_>),
) -> Result<u32, StoreError<S::Error>> {
    let mut last: Option<u32> = None;
    loop {
        let skipped = pass(flash, parts, buf, |seq, bytes| {
            if last.is_none_or(|l| seq > l) {
                chosen.offer(seq, bytes);
            }
        })
        .await?;
        let more = chosen.spilled();
        if let Some(top) = chosen.emit(f) {
            last = Some(top);
        }
        if !more {
            return Ok(skipped);
        }
    }
}

/// What one pass of [`merged`] keeps: the lowest numbers it is offered,
/// each number once (the first offered: the lowest class, then the oldest).
trait Chosen {
    /// Offers the entry numbered `seq`, stored as `bytes`.
    fn offer(&mut self, seq: u32, bytes: &[u8]);
    /// Whether an entry was turned away or pushed out for want of room:
    /// another pass must follow.
    fn spilled(&self) -> bool;
    /// Calls `f` with the entries kept, in sequence order, and forgets
    /// them; returns the highest number kept.
    fn emit(&mut self, f: &mut impl FnMut(Entry<'_>)) -> Option<u32>;
}

/// Keeps every entry offered (in memory): one pass is enough.
#[cfg(feature = "std")]
#[derive(Default)]
struct Everything {
    /// Number, start in `bytes` and length of each entry, as offered.
    index: std::vec::Vec<(u32, usize, usize)>,
    bytes: std::vec::Vec<u8>,
}

#[cfg(feature = "std")]
impl Chosen for Everything {
    fn offer(&mut self, seq: u32, bytes: &[u8]) {
        self.index.push((seq, self.bytes.len(), bytes.len()));
        self.bytes.extend_from_slice(bytes);
    }

    fn spilled(&self) -> bool {
        false
    }

    fn emit(&mut self, f: &mut impl FnMut(Entry<'_>)) -> Option<u32> {
        // Stable: of equal numbers, the first offered stays first.
        self.index.sort_by_key(|&(seq, _, _)| seq);
        let mut last = None;
        for &(seq, at, len) in &self.index {
            if last == Some(seq) {
                continue;
            }
            last = Some(seq);
            if let Some(e) = Entry::decode(&self.bytes[at..at + len]) {
                f(e);
            }
        }
        self.index.clear();
        self.bytes.clear();
        last
    }
}

/// Keeps the one lowest entry offered, in a buffer of the outbox: one pass
/// per entry, for builds without an allocator.
#[cfg_attr(feature = "std", allow(dead_code))]
struct Lowest<'b> {
    buf: &'b mut [u8; BUF],
    kept: Option<(u32, usize)>,
    spilled: bool,
}

#[cfg_attr(feature = "std", allow(dead_code))]
impl<'b> Lowest<'b> {
    fn new(buf: &'b mut [u8; BUF]) -> Self {
        Self {
            buf,
            kept: None,
            spilled: false,
        }
    }
}

impl Chosen for Lowest<'_> {
    fn offer(&mut self, seq: u32, bytes: &[u8]) {
        match self.kept {
            Some((k, _)) if seq >= k => self.spilled |= seq > k,
            kept => {
                self.spilled |= kept.is_some();
                self.buf[..bytes.len()].copy_from_slice(bytes);
                self.kept = Some((seq, bytes.len()));
            }
        }
    }

    fn spilled(&self) -> bool {
        self.spilled
    }

    fn emit(&mut self, f: &mut impl FnMut(Entry<'_>)) -> Option<u32> {
        let (seq, len) = self.kept.take()?;
        self.spilled = false;
        if let Some(e) = Entry::decode(&self.buf[..len]) {
            f(e);
        }
        Some(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimFlash;
    use futures::executor::block_on;

    type Flash = SimFlash<4, 1024>;

    fn layout() -> OutboxLayout {
        OutboxLayout {
            telemetry: 0..2048,
            normal: 2048..4096,
            critical: 4096..6144,
        }
    }

    /// Entries stored out of order, numbers repeated within and across
    /// parts, and items that are not entries: what `f` gets, and the
    /// count skipped.
    fn read_back(chosen: &mut impl Chosen) -> (std::vec::Vec<(u32, Class, u8)>, u32) {
        block_on(async {
            let mut o = Outbox::open(Flash::new(6), layout()).await.unwrap();
            let stored = [
                (7, Class::Critical, 1),
                (3, Class::Normal, 2),
                (9, Class::Telemetry, 3),
                (3, Class::Critical, 4),
                (1, Class::Normal, 5),
                (7, Class::Telemetry, 6),
                (3, Class::Normal, 7),
                (0, Class::Critical, 8),
                (u32::MAX, Class::Normal, 9),
            ];
            for (seq, class, fill) in stored {
                let payload = [fill; 20];
                let e = Entry {
                    seq,
                    class,
                    topic: "t",
                    payload: &payload,
                };
                o.push(&e).await.unwrap();
            }
            for (class, junk) in [(Class::Normal, [1u8, 2]), (Class::Critical, [0, 0])] {
                let mut q = part(&mut o.flash, &o.layout, class).unwrap();
                q.push(&junk, false).await.unwrap();
            }
            let mut seen = std::vec::Vec::new();
            let Outbox {
                flash, layout, buf, ..
            } = &mut o;
            let mut f = |e: Entry<'_>| seen.push((e.seq, e.class, e.payload[0]));
            let parts = (&*layout, [true; 3]);
            let skipped = merged(flash, parts, buf, chosen, &mut f).await.unwrap();
            (seen, skipped)
        })
    }

    #[test]
    fn both_ways_merge_in_order_the_first_of_a_number_in_class_then_stored_order() {
        let expected = std::vec![
            (0, Class::Critical, 8),
            (1, Class::Normal, 5),
            (3, Class::Normal, 2),
            (7, Class::Telemetry, 6),
            (9, Class::Telemetry, 3),
            (u32::MAX, Class::Normal, 9),
        ];
        assert_eq!(read_back(&mut Everything::default()), (expected.clone(), 2));
        let mut best = [0; BUF];
        assert_eq!(read_back(&mut Lowest::new(&mut best)), (expected, 2));
    }
}

//! The recorder's thread: it owns the event log and the config store,
//! takes the jobs of [`super::Recorder`] (the priority channel first),
//! numbers and publishes frames, and holds by outbox class the frames the
//! full outbox refused.
//!
//! Glossary:
//! - *held*: a frame waiting for room in its part of the outbox.

use super::*;

/// A frame waiting for room in the outbox.
pub(super) struct Held {
    pub(super) message: Message,
    pub(super) time: TimestampMs,
    pub(super) mirror: bool,
    /// An event's log record, whose frame number is logged once published.
    pub(super) logged: Option<u32>,
    /// Its outbox class: the part of the outbox it waits for.
    pub(super) class: Class,
}

impl Held {
    pub(super) fn new(
        message: Message,
        time: TimestampMs,
        mirror: bool,
        logged: Option<u32>,
    ) -> Self {
        let class = Class::of(&message);
        Self {
            message,
            time,
            mirror,
            logged,
            class,
        }
    }
}

/// What became of a publish.
pub(super) enum Published {
    /// Numbered and handed to the bus.
    As(u32),
    /// Not published, and never will be (said in the log).
    Never,
    /// The outbox is full: offer it again later.
    Held(Box<Held>),
}

/// Publishes and its JSON mirror; gives the frame back when the outbox
/// is full, or failed while the broker is unreachable.
pub(super) fn try_publish(bus: &dyn Publisher, held: Held) -> Published {
    let kind = held.message.kind();
    match bus.publish_message(held.message.clone(), held.time, held.mirror) {
        Ok(seq) => Published::As(seq),
        Err(Refused::OutboxFull) => Published::Held(Box::new(held)),
        Err(Refused::Unstored(e)) => {
            tracing::debug!("{kind:?} not stored nor sent, offered again: {e}");
            Published::Held(Box::new(held))
        }
        Err(Refused::Offline) => Published::Never,
        Err(Refused::Failed(e)) => {
            tracing::warn!("{kind:?} not published: {e}");
            Published::Never
        }
    }
}

/// The thread's side: the stores, the publisher once attached, and the
/// frames waiting to be published.
pub(super) struct Worker {
    pub(super) log: Log,
    pub(super) store: Store,
    pub(super) bus: Option<Box<dyn Publisher>>,
    pub(super) unsent: VecDeque<Held>,
    /// Frames waiting, and frames dropped from the wait.
    pub(super) counts: Arc<(AtomicU64, AtomicU64)>,
    /// Reads of the log waiting: served before the next job.
    pub(super) reads: Reads,
    /// Jobs handed over on the FIFO channel and not yet done.
    pub(super) queued: Arc<AtomicUsize>,
    /// Jobs handed over on the priority channel and not yet done.
    pub(super) pressing: Arc<AtomicUsize>,
    /// The sequence floor: no frame is numbered past it.
    pub(super) floor: FloorKeeper,
    /// The leases in force, logged again when the log wraps past them.
    pub(super) pins: Pins,
    /// The log's wraps when the pins were last looked at.
    pub(super) wraps_seen: u32,
    /// Config values the flash refused to keep.
    pub(super) refused: Arc<AtomicU64>,
}

impl Worker {
    pub(super) fn run(mut self, inbox: Inbox) {
        loop {
            self.drain_urgent(&inbox.urgent);
            // While frames wait for the outbox, look again every second.
            let job = if self.unsent.is_empty() {
                match inbox.jobs.recv() {
                    Ok(j) => Some(j),
                    Err(_) => break,
                }
            } else {
                match inbox.jobs.recv_timeout(Duration::from_secs(1)) {
                    Ok(j) => Some(j),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            };
            // What came on the priority channel while this one was taken
            // goes first.
            self.drain_urgent(&inbox.urgent);
            self.retry_unsent();
            self.serve_reads();
            match job {
                Some(Job::Wake) | None => {}
                Some(job) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    self.handle(job);
                }
            }
        }
        self.drain_urgent(&inbox.urgent);
        if let Some(note) = self.unsent_note() {
            tracing::error!("the recorder stops: {note}");
        }
    }

    /// Does every job waiting on the priority channel, in order.
    pub(super) fn drain_urgent(&mut self, urgent: &mpsc::Receiver<Job>) {
        while let Ok(job) = urgent.try_recv() {
            self.pressing.fetch_sub(1, Ordering::Relaxed);
            self.handle(job);
        }
    }

    /// Jobs handed over and not yet done, both channels.
    pub(super) fn backlog(&self) -> usize {
        self.queued.load(Ordering::Relaxed) + self.pressing.load(Ordering::Relaxed)
    }

    /// Answers the reads waiting, ahead of the jobs queued (the one just
    /// taken counted among them).
    pub(super) fn serve_reads(&mut self) {
        let waiting = std::mem::take(&mut *self.reads.lock().unwrap_or_else(|e| e.into_inner()));
        if waiting.is_empty() {
            return;
        }
        let read = self.read_now();
        for done in waiting {
            let _ = done.send(read.clone());
        }
    }

    /// The log in flash, and the jobs queued.
    pub(super) fn read_now(&mut self) -> Result<LogRead, String> {
        let entries = self.read()?;
        let queued = self.backlog();
        Ok(LogRead { entries, queued })
    }

    /// Publishes what waits, in order within each class, until one of
    /// that class is held again: a class whose part of the outbox is full
    /// does not hold back the others.
    pub(super) fn retry_unsent(&mut self) {
        if let Some(bus) = self.bus.take() {
            let (mut full, mut numbering) = (Vec::new(), true);
            for held in std::mem::take(&mut self.unsent) {
                numbering =
                    numbering && (full.contains(&held.class) || self.may_number(bus.as_ref()));
                if !numbering || full.contains(&held.class) {
                    self.unsent.push_back(held);
                    continue;
                }
                let (logged, time, class) = (held.logged, held.time, held.class);
                match try_publish(bus.as_ref(), held) {
                    Published::As(seq) => self.mark_published(logged, seq, time),
                    Published::Never => {}
                    Published::Held(held) => {
                        full.push(class);
                        self.unsent.push_back(*held);
                    }
                }
            }
            self.bus = Some(bus);
        }
        self.count_unsent();
    }

    /// Publishes `held` at once unless a frame of its class waits (then
    /// behind it), else holds it.
    pub(super) fn publish(&mut self, held: Held) {
        let behind = self.unsent.iter().any(|h| h.class == held.class);
        let held = match self.bus.take() {
            Some(bus) if !behind && self.may_number(bus.as_ref()) => {
                let (logged, time) = (held.logged, held.time);
                let published = try_publish(bus.as_ref(), held);
                self.bus = Some(bus);
                match published {
                    Published::As(seq) => return self.mark_published(logged, seq, time),
                    Published::Never => return,
                    Published::Held(held) => *held,
                }
            }
            bus => {
                self.bus = bus;
                held
            }
        };
        if self.unsent.is_empty() && self.bus.is_some() {
            tracing::warn!("the outbox refused a frame (full, or its flash failing while the broker is unreachable): frames wait in memory and are offered again every second");
        }
        self.hold(held);
    }

    /// Whether `bus` may number a frame now: the sequence floor in flash
    /// is kept [ahead](FloorKeeper::ahead) of its next number first. A
    /// failed reservation is said; frames are then numbered only below
    /// the floor, and held once they reach it (fail closed).
    pub(super) fn may_number(&mut self, bus: &dyn Publisher) -> bool {
        let next = bus.next_seq();
        match self.floor.ahead(&mut self.store, next) {
            Ok(_) => true,
            Err(e) if next < self.floor.floor() => {
                tracing::error!("{e}: frames are numbered up to the floor, then held");
                true
            }
            Err(e) => {
                tracing::error!("{e}: frames wait in memory, not numbered past the floor");
                false
            }
        }
    }

    /// Keeps `held` waiting; with [`UNSENT_MAX`] waiting, the oldest of
    /// the lowest class among them and `held` is dropped.
    pub(super) fn hold(&mut self, held: Held) {
        let held = match self.unsent.len() >= UNSENT_MAX {
            true => self.evict_for(held),
            false => Some(held),
        };
        if let Some(held) = held {
            self.unsent.push_back(held);
        }
        self.count_unsent();
    }

    /// Drops the oldest frame of the lowest class among those waiting and
    /// `held` (counted; a critical one said as an error); `held` back
    /// unless it was the one.
    pub(super) fn evict_for(&mut self, held: Held) -> Option<Held> {
        let lowest = (self.unsent.iter().enumerate())
            .min_by_key(|(i, h)| (h.class, *i))
            .map(|(i, h)| (i, h.class));
        let (dropped, kept) = match lowest {
            Some((i, class)) if class <= held.class => (self.unsent.remove(i), Some(held)),
            _ => (Some(held), None),
        };
        self.counts.1.fetch_add(1, Ordering::Relaxed);
        if let Some(d) = dropped.filter(|d| d.class == Class::Critical) {
            tracing::error!(
                "{UNSENT_MAX} critical frames wait for room in the outbox: the oldest ({:?} of {} ms) is dropped, never published (it stays in the event log)",
                d.message.kind(),
                d.time.0
            );
        }
        kept
    }

    pub(super) fn count_unsent(&self) {
        self.counts
            .0
            .store(self.unsent.len() as u64, Ordering::Relaxed);
    }

    /// What is said when the frames waiting may be lost (a flush before a
    /// stop, the thread's end): how many wait, and how many are critical.
    pub(super) fn unsent_note(&self) -> Option<String> {
        if self.unsent.is_empty() {
            return None;
        }
        let critical = (self.unsent.iter())
            .filter(|h| h.class == Class::Critical)
            .count();
        Some(format!(
            "{} frames ({critical} critical) still wait in memory for room in the outbox: not published, and lost if the agent stops now (their events stay in the event log)",
            self.unsent.len()
        ))
    }

    /// Logs an event, then publishes it; once published, the frame's
    /// number is logged beside it (what a resend reads).
    pub(super) fn emit(&mut self, message: Message, time: TimestampMs) {
        let logged = match resend::event_body(&message) {
            Ok(body) => self.append(time, MessageKind::Event as u8, &body).ok(),
            Err(e) => {
                tracing::error!("event not encodable: {e}");
                None
            }
        };
        self.publish(Held::new(message, time, true, logged));
    }

    /// Logs that the event of log record `logged`, of `time`, went out as
    /// frame `seq`.
    pub(super) fn mark_published(&mut self, logged: Option<u32>, seq: u32, time: TimestampMs) {
        if let Some(record) = logged {
            let body = resend::Published { record, seq }.encode();
            let _ = self.append(time, resend::PUBLISHED, &body);
        }
    }

    pub(super) fn append(
        &mut self,
        time: TimestampMs,
        kind: u8,
        body: &[u8],
    ) -> Result<u32, String> {
        self.keep_ahead(time);
        let r = futures::executor::block_on(self.log.append(time, kind, body))
            .map_err(|e| format!("{e}"));
        match &r {
            Ok(seq) => self.pins.logged(*seq, time, kind, body),
            Err(e) => tracing::error!("not logged to flash (kind {kind}): {e}"),
        }
        self.keep_pins(time);
        r
    }

    /// Before a record goes in: the leases in force whose records the
    /// log's next wrap would erase are logged again first, while the
    /// sector being written has room for them, so no lease in force is in
    /// flash only in the sector a wrap erases (a power cut after the
    /// erase would lose it, and a restart lift its caps).
    fn keep_ahead(&mut self, now: TimestampMs) {
        if self.pins.is_empty() {
            return;
        }
        let first_kept = match futures::executor::block_on(self.log.kept_by_next_wrap()) {
            Ok(Some(first)) => first,
            Ok(None) => return,
            Err(e) => {
                tracing::error!("the event log's next wrap not foreseen: {e}");
                return;
            }
        };
        for p in self.pins.recycled(first_kept, now) {
            self.log_again(p, "before the log's next wrap erases it");
        }
    }

    /// After the log wrapped: the leases in force whose records it
    /// recycled all the same are logged again (their time and frame as
    /// taken).
    fn keep_pins(&mut self, now: TimestampMs) {
        // Each one logged again may wrap the log once more: a bounded round.
        for _ in 0..4 {
            if self.log.wraps() == self.wraps_seen {
                return;
            }
            self.wraps_seen = self.log.wraps();
            let oldest = match futures::executor::block_on(self.log.oldest()) {
                Ok(Some(oldest)) => oldest,
                Ok(None) => return,
                Err(e) => {
                    tracing::error!("the event log's oldest record unreadable: {e}");
                    return;
                }
            };
            for p in self.pins.recycled(oldest, now) {
                self.log_again(p, "before the log recycled it");
            }
        }
    }

    /// Logs pinned lease `p` again, as taken; `when` says, should it
    /// fail, what it was to be logged before.
    fn log_again(&mut self, p: pins::Pinned, when: &str) {
        let kind = MessageKind::CapLease as u8;
        match futures::executor::block_on(self.log.append(p.time, kind, &p.body)) {
            Ok(seq) => self.pins.logged(seq, p.time, kind, &p.body),
            Err(e) => tracing::error!(
                "a lease in force not logged again {when}: {e}; a restart would not find it"
            ),
        }
    }

    pub(super) fn read(&mut self) -> Result<Vec<Entry>, String> {
        let mut entries = Vec::new();
        futures::executor::block_on(self.log.for_each(|r| {
            entries.push(Entry {
                seq: r.seq,
                time: r.time,
                kind: r.kind,
                body: r.body.to_vec(),
            })
        }))
        .map(|_| entries)
        .map_err(|e| format!("{e}"))
    }

    pub(super) fn handle(&mut self, job: Job) {
        match job {
            Job::Attach(bus) => {
                self.bus = Some(bus);
                self.retry_unsent();
            }
            Job::Publish {
                message,
                time,
                mirror,
            } => self.publish(Held::new(*message, time, mirror, None)),
            Job::Emit { message, time } => self.emit(*message, time),
            Job::Resend {
                from,
                to,
                max,
                done,
            } => {
                let _ = done.send(resend::read(&mut self.log, from, to, max));
            }
            Job::Append {
                time,
                kind,
                body,
                done,
            } => {
                let r = self.append(time, kind, &body);
                if let Some(d) = done {
                    let _ = d.send(r);
                }
            }
            Job::Set { items, stop, done } => {
                // Every value is tried, a refused one said first: a record
                // refused with its check kept after it reads as damaged,
                // where stopping would leave the older record and its
                // check agreeing.
                let mut r = Ok(());
                for (key, value) in &items {
                    if stop && r.is_err() {
                        break;
                    }
                    let kept = futures::executor::block_on(self.store.set(key, value))
                        .map_err(|e| format!("{key} not kept in flash: {e}"));
                    if kept.is_err() {
                        self.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    r = r.and(kept);
                }
                // Said here when nobody waits for it (or waits no more):
                // a refusal is never lost unsaid.
                let unheard = match (done, r) {
                    (Some(done), r) => done.send(r).err().and_then(Result::err),
                    (None, r) => r.err(),
                };
                if let Some(e) = unheard {
                    tracing::error!("{e}");
                }
            }
            Job::Get { key, done } => {
                let mut buf = [0u8; loopwarden_flash::config::MAX_VALUE];
                let r = match futures::executor::block_on(self.store.get(&key, &mut buf)) {
                    Ok(n) => Ok(n.map(|n| buf[..n].to_vec())),
                    Err(e) => Err(format!("{key} not read from flash: {e}")),
                };
                let _ = done.send(r);
            }
            Job::ReserveSeq { block, done } => {
                let r = futures::executor::block_on(self.store.reserve_seq(block))
                    .map_err(|e| format!("{e}"));
                if let Ok(first) = r {
                    self.floor.reserved(first, block);
                }
                let _ = done.send(r);
            }
            Job::KeepSeqAhead { next, done } => {
                let _ = done.send(self.floor.ahead(&mut self.store, next));
            }
            Job::Flush { done } => {
                // A flush comes before a stop: what waits is said.
                if let Some(note) = self.unsent_note() {
                    tracing::error!("{note}");
                }
                let _ = done.send(());
            }
            Job::Read { done } => {
                let _ = done.send(self.read_now());
            }
            Job::Wake => {}
        }
    }
}

//! The recorder: the one thread that writes an agent's flash, the same
//! for both agents.
//!
//! A flash write ends with a sync and, now and then, a sector erase; on a
//! busy disk that can take tens of milliseconds. The agent's loop must not
//! wait for it while a GPU is failing or a leak is being isolated: it hands
//! records to this thread, which writes them in the order given (what is
//! waited for first, below), and waits only where it must (a lease is in
//! flash before its ack goes out; a sequence reservation before its
//! numbers are used).
//!
//! The frames that go through the bus's flash outbox (events and acks) are
//! published from here too (through a [`Publisher`], the bus), in the order given and after their log entry:
//! storing them in the outbox is a flash write as well. Frames the full
//! outbox refused, and frames handed over before the bus is attached, wait
//! here and go out in order once they can: in order within their outbox
//! class, so a frame whose class's part has room goes past a held one of
//! another class. Up to 256 wait; past that the oldest of the lowest
//! class is dropped (a critical one only when all are, said as an error).
//! A flush (before a stop) and the thread's end say, as an error, how
//! many still wait.
//!
//! Handing work to the thread never blocks the caller (the agent's loop
//! runs on one thread: a blocked send would stall its sampling). Work
//! goes by two channels: what a caller waits for (a lease's record, a
//! config value, a sequence reservation), config values and acks go by a
//! priority channel that the thread drains before each job of the FIFO
//! channel, in their own order; so a cap or a cooling-loss step waits for
//! one write at most, never behind a storm's events. What can
//! be lost (an event of the outbox's normal class published or logged
//! without waiting, as in a storm of XIDs) is dropped and counted
//! ([`Recorder::dropped`]) once [`JOBS_MAX`] jobs wait. What must not be
//! lost (a critical event such as a leak, a cap applied or a quarantine,
//! an ack, a config value such as a GPU's health, anything waited for)
//! is queued beyond that, up
//! to [`VITAL_MAX`]; past it the flash has fallen minutes behind, and it
//! is dropped, counted and said as an error. A console's audit record
//! ([`Recorder::append_kept`]) is queued beyond [`JOBS_MAX`] too, but
//! only [`AUDIT_ROOM`] jobs beyond it, never into the critical events'
//! room; and one of someone not logged in (anyone at a serial port can
//! cause it) only [`ANYONE_ROOM`] of those, the rest a logged-in
//! operator's ([`AuditBy`]). Acks to refused commands are
//! rate-limited before they get here, so a flood on a host's `cmd` topic
//! cannot fill it.
//!
//! A read of the log for the console waits behind the jobs queued, so it
//! shows what was done before it; but past [`READ_AHEAD_OVER`] jobs (a
//! storm of XIDs queues thousands, each synced) it goes ahead of them:
//! the field engineer asking for the events must not wait minutes. It
//! then shows the log as it is in flash and says how many jobs were still
//! queued ([`LogRead::queued`]); asked again later, it shows them.
//!
//! The log is a ring: the latest lease of each sender, while it lasts,
//! is logged again before the log's next wrap erases its record
//! (`pins`), so a storm of events cannot push a lease in force out before
//! a restart reads it, not even with a power cut at the wrap.
//!
//! Glossary:
//! - *audit record*: a console's record of a session, a login or a
//!   state-changing command, kept past a storm's events.
//! - *record*: an event-log entry (an event, or an accepted command kept
//!   whole) or a config-store value (a GPU's health, the sequence floor).
//! - *attach*: give the recorder the publisher (the bus) it publishes on;
//!   an agent opens its flash (and starts the recorder) before its bus,
//!   which needs the outbox and the sequence floor from that flash.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use loopwarden_flash::{Class, ConfigStore, EventLog};
use loopwarden_protocol::{Message, MessageKind, TimestampMs};
use tokio::sync::oneshot;

use crate::agent_flash::{Flash, FloorKeeper};
use crate::resend::{self, Resendable};
use crate::{Publisher, Refused};

type Log = EventLog<Flash>;
type Store = ConfigStore<Flash>;

/// A log entry read back.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The log's sequence number.
    pub seq: u32,
    /// When it happened.
    pub time: TimestampMs,
    /// Message kind code.
    pub kind: u8,
    /// The record's bytes.
    pub body: Vec<u8>,
}

enum Job {
    Attach(Box<dyn Publisher>),
    Publish {
        message: Box<Message>,
        time: TimestampMs,
        mirror: bool,
    },
    /// An event: logged, published, and its frame's number logged.
    Emit {
        message: Box<Message>,
        time: TimestampMs,
    },
    Resend {
        from: u32,
        to: u32,
        max: usize,
        done: oneshot::Sender<Result<Resendable, String>>,
    },
    Append {
        time: TimestampMs,
        kind: u8,
        body: Vec<u8>,
        done: Option<oneshot::Sender<Result<u32, String>>>,
    },
    /// Config values, written in order, one job so that none is queued
    /// without those after it; each is tried, the first refusal said, or
    /// (`stop`) none after a refused one.
    Set {
        items: Vec<(String, Vec<u8>)>,
        stop: bool,
        done: Option<oneshot::Sender<Result<(), String>>>,
    },
    /// A read of a config value, in order with the values handed over
    /// before it.
    Get {
        key: String,
        done: oneshot::Sender<Result<Option<Vec<u8>>, String>>,
    },
    ReserveSeq {
        block: u32,
        done: oneshot::Sender<Result<u32, String>>,
    },
    /// Reserves the next block if frame `next` is within the margin of
    /// the floor; answers the floor.
    KeepSeqAhead {
        next: u32,
        done: oneshot::Sender<Result<u32, String>>,
    },
    /// A read of the log, in its turn.
    Read {
        done: oneshot::Sender<Result<LogRead, String>>,
    },
    /// Wakes the thread for the reads waiting in [`Reads`], or for a
    /// job on the priority channel.
    Wake,
    Flush {
        done: oneshot::Sender<()>,
    },
}

/// The event log as a read found it in flash.
#[derive(Debug, Clone)]
pub struct LogRead {
    /// Every entry, oldest first.
    pub entries: Vec<Entry>,
    /// Jobs handed over and not yet done when it was read: records among
    /// them are not in `entries` yet.
    pub queued: usize,
}

/// Reads of the log waiting for the thread: served before its next job.
type Reads = Arc<Mutex<Vec<oneshot::Sender<Result<LogRead, String>>>>>;

/// Frames kept in memory while the outbox is full.
const UNSENT_MAX: usize = 256;

/// Jobs queued beyond which a read of the log goes ahead of them (each
/// a synced write, some milliseconds: under a second behind fewer).
pub const READ_AHEAD_OVER: usize = 64;

/// Jobs queued for the thread beyond which what can be lost is dropped.
pub const JOBS_MAX: usize = 4096;

/// Jobs queued at most, what must not be lost included.
pub const VITAL_MAX: usize = 4 * JOBS_MAX;

/// Jobs queued beyond [`JOBS_MAX`] past which an audit record
/// ([`Recorder::append_kept`]) is dropped: a console's records (which
/// anyone at its port can cause, logged in or not) never take the room
/// up to [`VITAL_MAX`] that the critical events need.
pub const AUDIT_ROOM: usize = 1024;

/// Of [`AUDIT_ROOM`], the jobs beyond [`JOBS_MAX`] past which an audit
/// record of someone not logged in ([`AuditBy::Anyone`]) is dropped: the
/// rest stays a logged-in operator's, so a flood typed at the port
/// cannot push out the record of an operator's command.
pub const ANYONE_ROOM: usize = 512;

/// Who caused an audit record, which sets the room it may wait in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditBy {
    /// A logged-in operator (a login accepted, a command carried out, a
    /// logged-in session closed): up to [`AUDIT_ROOM`] beyond
    /// [`JOBS_MAX`].
    Operator,
    /// Anyone at the port (a session opened, a login or a command
    /// refused, a session closed that never logged in): up to
    /// [`ANYONE_ROOM`] beyond [`JOBS_MAX`].
    Anyone,
}

/// The event-log kind of an agent's serial console record (a session, a
/// login, a state-changing command; `loopwarden_field::serial::record`),
/// its body JSON text. Agent-local: never a bus message.
pub const CONSOLE_RECORD: u8 = 0xE0;

/// Which channel a job goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// In the order given, behind what can be dropped.
    Fifo,
    /// Ahead of the FIFO channel's jobs (what the caller waits for), in
    /// the order given among themselves.
    Priority,
}

/// How much of the queue a job may wait behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// What can be lost: up to [`JOBS_MAX`].
    Droppable,
    /// An audit record: [`AUDIT_ROOM`] beyond that, [`ANYONE_ROOM`]
    /// for one of someone not logged in.
    Audit(AuditBy),
    /// What must not be lost: up to [`VITAL_MAX`].
    Vital,
}

/// The thread's ends of the two channels.
struct Inbox {
    jobs: mpsc::Receiver<Job>,
    urgent: mpsc::Receiver<Job>,
}

/// The handle the loop writes through.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
    /// The priority channel: what the caller waits for.
    urgent: mpsc::Sender<Job>,
    /// Jobs handed over on the FIFO channel and not yet taken by the thread.
    queued: Arc<AtomicUsize>,
    /// Jobs handed over on the priority channel and not yet taken.
    pressing: Arc<AtomicUsize>,
    /// [`JOBS_MAX`], smaller in tests.
    bound: usize,
    /// Jobs dropped because the queue was full.
    dropped: Arc<AtomicU64>,
    /// Config values the flash refused to keep ([`Recorder::refused`]).
    refused: Arc<AtomicU64>,
    /// The flash file, `None`: memory.
    path: Option<Arc<Path>>,
    /// Frames waiting for room in the outbox, and dropped from that wait.
    waiting: Arc<(AtomicU64, AtomicU64)>,
    /// Reads of the log waiting for the thread.
    reads: Reads,
    /// The sequence floor in flash, as the thread last kept it.
    floor: Arc<AtomicU32>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.path)
            .finish()
    }
}

mod pins;
mod worker;
use pins::Pins;
use worker::*;

impl Recorder {
    /// Starts the thread that owns `log` and `store` (of the flash file at
    /// `path`, `None`: in memory); frames handed over wait until a bus is
    /// [attached](Self::attach).
    pub fn start(log: Log, store: Store, path: Option<&Path>) -> std::io::Result<Self> {
        let (r, inbox) = Self::unstarted(JOBS_MAX, path);
        let worker = r.worker(log, store);
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || worker.run(inbox))?;
        Ok(r)
    }

    /// The handle and the thread's ends of its channels, no thread yet;
    /// what can be lost is dropped once `bound` jobs wait.
    fn unstarted(bound: usize, path: Option<&Path>) -> (Self, Inbox) {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (urgent, urgent_rx) = mpsc::channel::<Job>();
        let r = Self {
            jobs,
            urgent,
            queued: Arc::new(AtomicUsize::new(0)),
            pressing: Arc::new(AtomicUsize::new(0)),
            bound,
            dropped: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
            path: path.map(Arc::from),
            waiting: Arc::new((AtomicU64::new(0), AtomicU64::new(0))),
            reads: Reads::default(),
            floor: Arc::new(AtomicU32::new(0)),
        };
        let inbox = Inbox {
            jobs: rx,
            urgent: urgent_rx,
        };
        (r, inbox)
    }

    /// The thread's side of this handle, over `log` and `store`.
    fn worker(&self, mut log: Log, mut store: Store) -> Worker {
        let floor = FloorKeeper::read(&mut store, self.floor.clone());
        // The leases the log holds from before: pinned as they are.
        let mut pins = Pins::default();
        if let Err(e) = futures::executor::block_on(
            log.for_each(|r| pins.logged(r.seq, r.time, r.kind, r.body)),
        ) {
            tracing::error!(
                "event log: the leases it holds could not be read to be kept through its wraps \
                 ({e}): a lease logged before this start may be recycled before it ends"
            );
        }
        Worker {
            pins,
            wraps_seen: 0,
            refused: self.refused.clone(),
            floor,
            log,
            store,
            bus: None,
            unsent: VecDeque::new(),
            counts: self.waiting.clone(),
            reads: self.reads.clone(),
            queued: self.queued.clone(),
            pressing: self.pressing.clone(),
        }
    }

    /// Hands over `job` if there is room, else drops and counts it;
    /// whether it was handed over.
    fn offer(&self, job: Job, what: &str) -> bool {
        self.hand(job, Room::Droppable, what, Lane::Fifo)
    }

    /// Hands over what must not be lost, in the FIFO channel: queued up
    /// to [`VITAL_MAX`].
    fn vital(&self, job: Job, what: &str) -> Result<(), String> {
        self.vital_by(job, what, Lane::Fifo)
    }

    /// Hands over what must not be lost and should not wait behind what
    /// can be: the priority channel, up to [`VITAL_MAX`] of its own.
    fn pressing(&self, job: Job, what: &str) -> Result<(), String> {
        self.vital_by(job, what, Lane::Priority)
    }

    fn vital_by(&self, job: Job, what: &str, lane: Lane) -> Result<(), String> {
        match self.hand(job, Room::Vital, what, lane) {
            true => Ok(()),
            false => Err(format!("{what} not handed to the flash thread")),
        }
    }

    /// Jobs that may wait on a lane when one of `room` is handed over.
    fn limit(&self, room: Room) -> usize {
        let vital = VITAL_MAX.max(self.bound);
        match room {
            Room::Droppable => self.bound,
            Room::Audit(AuditBy::Operator) => (self.bound + AUDIT_ROOM).min(vital),
            Room::Audit(AuditBy::Anyone) => (self.bound + ANYONE_ROOM).min(vital),
            Room::Vital => vital,
        }
    }

    /// Queues `job` on `lane` while fewer than its `room`'s limit wait
    /// there, and says whether it did; never blocks. A job over the limit
    /// is dropped and counted (an event in a storm said once a thousand,
    /// an audit record as an error once a thousand, anything vital each
    /// time).
    fn hand(&self, job: Job, room: Room, what: &str, lane: Lane) -> bool {
        let limit = self.limit(room);
        let (count, tx) = match lane {
            Lane::Fifo => (&self.queued, &self.jobs),
            Lane::Priority => (&self.pressing, &self.urgent),
        };
        if count.fetch_add(1, Ordering::Relaxed) >= limit {
            count.fetch_sub(1, Ordering::Relaxed);
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            match room {
                Room::Vital => tracing::error!(
                    "flash queue full ({limit} jobs): {what} dropped: the flash has fallen far behind"
                ),
                Room::Audit(_) if n % 1000 == 0 => tracing::error!(
                    "flash queue full ({limit} jobs, the most an audit record may wait behind): \
                     {what} dropped ({} jobs dropped since the start)",
                    n + 1
                ),
                Room::Droppable if n % 1000 == 0 => {
                    tracing::warn!("flash queue full ({limit} jobs): {what} dropped")
                }
                _ => {}
            }
            return false;
        }
        if tx.send(job).is_err() {
            count.fetch_sub(1, Ordering::Relaxed);
            tracing::error!("{what} dropped: {}", Self::gone());
            return false;
        }
        // The thread may be waiting on the FIFO channel: a wake-up there
        // (not a job: never dropped, never counted).
        if lane == Lane::Priority {
            let _ = self.jobs.send(Job::Wake);
        }
        true
    }

    /// Jobs dropped because the queue was full (events in a storm).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Config values the flash refused to keep (full, worn, an I/O
    /// error): each said at error, by whoever waits for it or else by the
    /// flash thread, and counted here (a replay floor among them lets a
    /// command taken before a restart be taken again after it).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Starts the recorder already attached to `bus`.
    pub fn start_on(
        log: Log,
        store: Store,
        path: Option<&Path>,
        bus: impl Publisher + 'static,
    ) -> std::io::Result<Self> {
        let r = Self::start(log, store, path)?;
        r.attach(bus);
        Ok(r)
    }

    /// The flash file, `None` when the flash is in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Gives the recorder the publisher (the bus) it publishes on; what
    /// waited goes out.
    pub fn attach(&self, bus: impl Publisher + 'static) {
        let _ = self.pressing(Job::Attach(Box::new(bus)), "the bus to publish on");
    }

    /// Publishes an event or an ack (through the outbox), never waiting:
    /// an event after what was handed over before it, dropped (and
    /// counted) when [`JOBS_MAX`] jobs wait unless it is
    /// [critical](Class::Critical) (then only past [`VITAL_MAX`]); an
    /// ack by the priority channel, ahead of the events queued (a lease's
    /// ack must not wait behind a storm's writes), dropped only past
    /// [`VITAL_MAX`].
    pub fn publish(&self, message: Message, time: TimestampMs, mirror: bool) {
        let ack = matches!(message, Message::Ack(_));
        let critical = Class::of(&message) == Class::Critical;
        let job = Job::Publish {
            message: Box::new(message),
            time,
            mirror,
        };
        if ack {
            let _ = self.pressing(job, "an ack to publish");
        } else if critical {
            let _ = self.vital(job, "a critical event to publish");
        } else {
            self.offer(job, "an event to publish");
        }
    }

    /// Logs an event and publishes it (and its JSON mirror) through the
    /// outbox, after what was handed over before it, never waiting; once
    /// published, the frame's number is logged beside it, so a reader
    /// that missed the frame can have it again ([`Recorder::resendable`]).
    /// Dropped (and counted) when [`JOBS_MAX`] jobs wait, unless its
    /// class is [critical](Class::Critical) (a leak, a cap applied, a
    /// quarantine, an isolation failed): that one is vital, queued in its
    /// turn beyond [`JOBS_MAX`] and dropped only past [`VITAL_MAX`]
    /// (said as an error). Returns whether it was taken.
    pub fn emit(&self, event: loopwarden_protocol::Event, time: TimestampMs) -> bool {
        let message = Message::Event(event);
        let critical = Class::of(&message) == Class::Critical;
        let job = Job::Emit {
            message: Box::new(message),
            time,
        };
        if critical {
            self.vital(job, "a critical event to log and publish")
                .is_ok()
        } else {
            self.offer(job, "an event to log and publish")
        }
    }

    /// The logged events published as frames `from..=to`, at most `max`
    /// of them, read from the log after what was handed over before.
    pub async fn resendable(&self, from: u32, to: u32, max: usize) -> Result<Resendable, String> {
        let (done, rx) = oneshot::channel();
        let job = Job::Resend {
            from,
            to,
            max,
            done,
        };
        if !self.offer(job, "a read of the log for a resend") {
            return Err("the flash queue is full".into());
        }
        rx.await.map_err(|_| Self::gone())?
    }

    /// Frames waiting for room in the outbox, and those dropped from the wait.
    pub fn waiting(&self) -> (u64, u64) {
        (
            self.waiting.0.load(Ordering::Relaxed),
            self.waiting.1.load(Ordering::Relaxed),
        )
    }

    fn gone() -> String {
        "the recorder thread has ended".into()
    }

    /// Appends to the event log without waiting; dropped (and counted)
    /// when the queue is full.
    pub fn append(&self, time: TimestampMs, kind: u8, body: Vec<u8>) {
        let job = Job::Append {
            time,
            kind,
            body,
            done: None,
        };
        self.offer(job, "an event-log entry");
    }

    /// Appends an audit record (a console's session, login, refusal or
    /// state-changing command) to the event log without waiting: queued
    /// beyond [`JOBS_MAX`], behind a storm's events, and dropped (counted,
    /// said as an error once a thousand) past [`AUDIT_ROOM`] more jobs,
    /// so as never to take the room of a critical event; one `by`
    /// [`AuditBy::Anyone`] past [`ANYONE_ROOM`]. Whether it was taken:
    /// the caller says what it was when not.
    pub fn append_kept(&self, time: TimestampMs, kind: u8, body: Vec<u8>, by: AuditBy) -> bool {
        let job = Job::Append {
            time,
            kind,
            body,
            done: None,
        };
        self.hand(
            job,
            Room::Audit(by),
            "an audit record for the event log",
            Lane::Fifo,
        )
    }

    /// Keeps a config value if the queue has room, else drops and counts
    /// it (for a value written again later: it never blocks the caller);
    /// whether it was handed over. It goes by the FIFO channel, behind
    /// events: a key written by [`set`](Self::set) or
    /// [`set_sync`](Self::set_sync) (the priority channel) must never be
    /// offered, or an older value offered could land after a newer one.
    pub fn offer_set(&self, key: String, value: Vec<u8>) -> bool {
        let job = Job::Set {
            items: vec![(key, value)],
            stop: false,
            done: None,
        };
        self.offer(job, "a config value")
    }

    /// Appends to the event log and waits until it is in flash; by the
    /// priority channel, ahead of what can be dropped (events, appends
    /// without waiting), after the other waited-for writes.
    pub async fn append_sync(
        &self,
        time: TimestampMs,
        kind: u8,
        body: Vec<u8>,
    ) -> Result<u32, String> {
        let (done, rx) = oneshot::channel();
        let job = Job::Append {
            time,
            kind,
            body,
            done: Some(done),
        };
        self.pressing(job, "an event-log entry")?;
        rx.await.map_err(|_| Self::gone())?
    }

    /// Keeps a config value, without waiting; by the priority channel, in
    /// order with the values waited for ([`set_sync`](Self::set_sync)).
    pub fn set(&self, key: String, value: Vec<u8>) {
        let job = Job::Set {
            items: vec![(key, value)],
            stop: false,
            done: None,
        };
        let _ = self.pressing(job, "a config value");
    }

    /// Keeps a config value and waits until it is in flash (by the
    /// priority channel: after the values and waited-for writes handed
    /// over before it, ahead of events).
    pub async fn set_sync(&self, key: String, value: Vec<u8>) -> Result<(), String> {
        self.set_later(key, value)?
            .await
            .map_err(|_| Self::gone())?
    }

    /// Keeps every value of `items`, in order, handed over as one (by the
    /// priority channel), and waits until all are in flash: a wait given
    /// up on still leaves them to land together, never one without those
    /// after it (a record without its generation or its check).
    pub async fn set_all_sync(&self, items: Vec<(String, Vec<u8>)>) -> Result<(), String> {
        self.set_all_later(items)?.await.map_err(|_| Self::gone())?
    }

    /// Keeps a config value without waiting; the returned channel says
    /// when it is in flash (by the priority channel, as
    /// [`set_sync`](Self::set_sync)). An error: not handed over (said).
    pub fn set_later(
        &self,
        key: String,
        value: Vec<u8>,
    ) -> Result<oneshot::Receiver<Result<(), String>>, String> {
        self.set_all_later(vec![(key, value)])
    }

    /// Keeps every value of `items` without waiting, in order, handed over
    /// as one job so that a full queue never takes one without those
    /// after it; a value the flash refuses does not stop those after it
    /// (a record refused, its new check kept: the pair reads as damaged,
    /// never as the older record). The returned channel says when all are
    /// in flash, or the first refused. An error: none handed over (said).
    pub fn set_all_later(
        &self,
        items: Vec<(String, Vec<u8>)>,
    ) -> Result<oneshot::Receiver<Result<(), String>>, String> {
        self.set_items_later(items, false)
    }

    /// As [`set_all_later`](Self::set_all_later), but a value the flash
    /// refuses stops those after it: for a record whose older copy is the
    /// better to read than none (the BMS's limits: a check written after
    /// a refused record would make the older limits unreadable).
    pub fn set_in_order_later(
        &self,
        items: Vec<(String, Vec<u8>)>,
    ) -> Result<oneshot::Receiver<Result<(), String>>, String> {
        self.set_items_later(items, true)
    }

    fn set_items_later(
        &self,
        items: Vec<(String, Vec<u8>)>,
        stop: bool,
    ) -> Result<oneshot::Receiver<Result<(), String>>, String> {
        let (done, rx) = oneshot::channel();
        let job = Job::Set {
            items,
            stop,
            done: Some(done),
        };
        self.pressing(job, "a config value").map(|()| rx)
    }

    /// Reads a config value (by the priority channel: after the values
    /// handed over before it, so it reads what they wrote). `None`: none
    /// kept under `key`.
    pub async fn get(&self, key: String) -> Result<Option<Vec<u8>>, String> {
        let (done, rx) = oneshot::channel();
        self.pressing(Job::Get { key, done }, "a read of a config value")?;
        rx.await.map_err(|_| Self::gone())?
    }

    /// Reserves a block of frame sequence numbers (by the priority
    /// channel).
    pub async fn reserve_seq(&self, block: u32) -> Result<u32, String> {
        let (done, rx) = oneshot::channel();
        self.pressing(Job::ReserveSeq { block, done }, "a sequence reservation")?;
        rx.await.map_err(|_| Self::gone())?
    }

    /// The sequence floor in flash as the recorder thread last kept it
    /// (0 before it read it): the bus's counter must stay below it.
    pub fn seq_floor(&self) -> u32 {
        self.floor.load(Ordering::Relaxed)
    }

    /// Has the thread reserve the next block of sequence numbers if frame
    /// `next` is within [`SEQ_MARGIN`](crate::agent_flash::SEQ_MARGIN) of
    /// the floor (the thread does so itself before it numbers an event or
    /// an ack), by the priority channel; the floor after.
    pub async fn keep_seq_ahead(&self, next: u32) -> Result<u32, String> {
        self.keep_seq_ahead_later(next)
            .ok_or_else(|| "a sequence reservation not handed to the flash thread".to_string())?
            .await
            .map_err(|_| Self::gone())?
    }

    /// As [`keep_seq_ahead`](Self::keep_seq_ahead) without waiting: the
    /// answer comes on the returned channel; `None` when not handed over
    /// (said).
    pub fn keep_seq_ahead_later(
        &self,
        next: u32,
    ) -> Option<oneshot::Receiver<Result<u32, String>>> {
        let (done, rx) = oneshot::channel();
        let job = Job::KeepSeqAhead { next, done };
        self.pressing(job, "a sequence reservation")
            .ok()
            .map(|()| rx)
    }

    /// Asks for a block of sequence numbers without waiting (by the
    /// priority channel): the answer comes on the returned channel once
    /// the recorder got to it; `None` when not handed over (said).
    pub fn reserve_seq_later(&self, block: u32) -> Option<oneshot::Receiver<Result<u32, String>>> {
        let (done, rx) = oneshot::channel();
        self.pressing(Job::ReserveSeq { block, done }, "a sequence reservation")
            .ok()
            .map(|()| rx)
    }

    /// Waits until everything handed over before is written and published.
    pub async fn flush(&self) {
        let (done, rx) = oneshot::channel();
        if self.vital(Job::Flush { done }, "a flush").is_ok() {
            let _ = rx.await;
        }
    }

    /// Every log entry in flash, oldest first, and the jobs still queued:
    /// after what was handed over before, unless more than
    /// [`READ_AHEAD_OVER`] jobs wait; then ahead of them (it waits for
    /// the one being done only). To read all that was handed over
    /// before, [`flush`](Self::flush) first.
    pub async fn read(&self) -> Result<LogRead, String> {
        let (done, rx) = oneshot::channel();
        let backlog = self.queued.load(Ordering::Relaxed) + self.pressing.load(Ordering::Relaxed);
        if backlog <= READ_AHEAD_OVER {
            self.vital(Job::Read { done }, "a read of the log")?;
        } else {
            self.reads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(done);
            // The wake-up is not a job: never dropped, never counted.
            if self.jobs.send(Job::Wake).is_err() {
                return Err(Self::gone());
            }
        }
        rx.await.map_err(|_| Self::gone())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Publisher, Refused};
    use loopwarden_protocol::{samples, MessageKind};
    use std::future::Future;

    /// A recorder that drops what may be lost once `n` jobs wait, and
    /// that no thread drains.
    fn stalled(n: usize) -> (Recorder, Inbox) {
        Recorder::unstarted(n, None)
    }

    /// Starts the thread of `r` (from [`stalled`]) over a memory flash,
    /// with the jobs handed over so far waiting for it.
    fn start_stalled(r: &Recorder, inbox: Inbox) {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let worker = r.worker(stores.log, stores.store);
        std::thread::spawn(move || worker.run(inbox));
    }

    /// The jobs of `inbox`'s FIFO channel, wake-ups left out.
    fn fifo(inbox: &Inbox) -> Vec<Job> {
        inbox
            .jobs
            .try_iter()
            .filter(|j| !matches!(j, Job::Wake))
            .collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_events_and_an_ack_never_waits() {
        let (r, rx) = stalled(2);
        for _ in 0..5 {
            r.append(TimestampMs(0), 1, vec![1]);
        }
        assert_eq!(r.dropped(), 3);
        r.publish(samples::message(MessageKind::Event), TimestampMs(0), false);
        assert_eq!(r.dropped(), 4, "an event to publish is dropped too");
        // An ack is queued past the bound at once (by the priority
        // channel): nobody takes a job, and this call returns all the same.
        r.publish(samples::message(MessageKind::Ack), TimestampMs(0), false);
        assert_eq!(r.dropped(), 4, "the ack was not dropped");
        assert_eq!(fifo(&rx).len(), 2);
        let urgent: Vec<Job> = rx.urgent.try_iter().collect();
        assert!(
            matches!(&urgent[..], [Job::Publish { message, .. }] if matches!(**message, Message::Ack(_)))
        );
        // Past VITAL_MAX even an ack is dropped, and said.
        let (r, _rx) = stalled(2);
        for _ in 0..VITAL_MAX + 3 {
            r.publish(samples::message(MessageKind::Ack), TimestampMs(0), false);
        }
        assert_eq!(r.dropped(), 3);
    }

    /// An entry appended as kept (the consoles' audit records) is queued
    /// past the bound that drops a storm's events, and reaches the log.
    #[test]
    fn an_entry_appended_as_kept_is_not_dropped_by_a_full_queue() {
        let (r, rx) = stalled(2);
        for i in 0..2u8 {
            r.append(TimestampMs(0), 1, vec![i]);
        }
        r.append(TimestampMs(0), 1, vec![9]);
        assert_eq!(r.dropped(), 1, "the queue is full");
        assert!(r.append_kept(
            TimestampMs(1),
            CONSOLE_RECORD,
            b"login".to_vec(),
            AuditBy::Operator
        ));
        assert_eq!(r.dropped(), 1, "the kept entry was not dropped");
        start_stalled(&r, rx);
        futures::executor::block_on(r.flush());
        let read = futures::executor::block_on(r.read()).expect("the log");
        let kept: Vec<_> = read
            .entries
            .iter()
            .filter(|e| e.kind == CONSOLE_RECORD)
            .map(|e| e.body.clone())
            .collect();
        assert_eq!(kept, [b"login".to_vec()]);
    }

    /// Audit records (which anyone at the serial port can cause, logged
    /// in or not) have a room of their own past the bound of a storm's
    /// events: beyond it they are dropped and counted, and the room left
    /// up to VITAL_MAX stays the critical events'.
    #[test]
    fn audit_records_never_take_the_room_of_a_critical_event() {
        let (r, rx) = stalled(JOBS_MAX);
        let taken = (0..VITAL_MAX)
            .filter(|_| {
                r.append_kept(
                    TimestampMs(1),
                    CONSOLE_RECORD,
                    b"{}".to_vec(),
                    AuditBy::Operator,
                )
            })
            .count();
        assert_eq!(taken, JOBS_MAX + AUDIT_ROOM);
        assert_eq!(r.dropped(), (VITAL_MAX - taken) as u64);
        let leak = loopwarden_protocol::Event::Leak {
            rack: loopwarden_protocol::RackIndex::new(3).expect("a rack"),
            active: true,
        };
        assert!(r.emit(leak, TimestampMs(2)), "the leak is kept");
        assert_eq!(fifo(&rx).len(), taken + 1);
    }

    /// Records of someone not logged in (a flood typed at the port while
    /// the flash is stalled) fill only their part of the audit room: an
    /// operator's record still finds a place.
    #[test]
    fn records_of_someone_not_logged_in_leave_room_for_an_operators() {
        let (r, rx) = stalled(JOBS_MAX);
        for _ in 0..JOBS_MAX {
            r.append(TimestampMs(0), 1, vec![0]);
        }
        let refused = b"{\"what\":\"login_refused\"}".to_vec();
        let taken = (0..AUDIT_ROOM)
            .filter(|_| {
                r.append_kept(
                    TimestampMs(1),
                    CONSOLE_RECORD,
                    refused.clone(),
                    AuditBy::Anyone,
                )
            })
            .count();
        assert_eq!(taken, ANYONE_ROOM);
        assert_eq!(r.dropped(), (AUDIT_ROOM - ANYONE_ROOM) as u64);
        let command = b"{\"what\":\"command\",\"line\":\"clear-leak 3\"}".to_vec();
        assert!(
            r.append_kept(
                TimestampMs(2),
                CONSOLE_RECORD,
                command.clone(),
                AuditBy::Operator
            ),
            "the operator's record is taken"
        );
        let jobs = fifo(&rx);
        assert_eq!(jobs.len(), JOBS_MAX + ANYONE_ROOM + 1);
        assert!(matches!(jobs.last(), Some(Job::Append { body, .. }) if *body == command));
    }

    #[test]
    fn a_read_behind_many_jobs_goes_ahead_and_counts_them() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let (r, rx) = stalled(JOBS_MAX);
        for i in 0..100u8 {
            r.append(TimestampMs(u64::from(i)), 1, vec![i]);
        }
        let mut read = std::pin::pin!(r.read());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(read.as_mut().poll(&mut cx).is_pending(), "no thread yet");
        // The thread starts with the 100 appends and the read queued.
        let worker = r.worker(stores.log, stores.store);
        std::thread::spawn(move || worker.run(rx));
        let first = futures::executor::block_on(read).expect("the log");
        assert!(first.entries.is_empty(), "{:?}", first.entries);
        assert_eq!(first.queued, 100, "served before the first write");
        futures::executor::block_on(r.flush());
        let after = futures::executor::block_on(r.read()).expect("the log");
        assert_eq!(after.entries.len(), 100);
        assert_eq!(after.queued, 0);
        assert_eq!(after.entries[99].body, [99]);
    }

    #[test]
    fn a_config_value_read_sees_what_was_handed_over_before_it() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let r = Recorder::start(stores.log, stores.store, None).expect("the thread");
        let get = |k: &str| futures::executor::block_on(r.get(k.into()));
        assert_eq!(get("health.1"), Ok(None), "none kept");
        r.set("health.1".into(), vec![1, 2]);
        r.set("health.1".into(), vec![3]);
        assert_eq!(
            get("health.1"),
            Ok(Some(vec![3])),
            "the last value handed over"
        );
        let bad = get(&"k".repeat(300)).expect_err("a key too long");
        assert!(bad.contains("not read from flash"), "{bad}");
    }

    #[test]
    fn values_handed_over_together_are_all_tried_and_the_first_refused_said() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let r = Recorder::start(stores.log, stores.store, None).expect("the thread");
        let long = "k".repeat(300);
        let items = vec![
            ("rec.a".to_string(), vec![1]),
            (long.clone(), vec![2]),
            ("rec.a.check".to_string(), vec![3]),
        ];
        let e = futures::executor::block_on(r.set_all_sync(items)).expect_err("a key too long");
        assert!(
            e.starts_with(&long) && e.contains("not kept in flash"),
            "{e}"
        );
        let get = |k: &str| futures::executor::block_on(r.get(k.into()));
        assert_eq!(get("rec.a"), Ok(Some(vec![1])), "the one before is kept");
        assert_eq!(get("rec.a.check"), Ok(Some(vec![3])), "and the one after");
        // In order: none after a refused one.
        let items = vec![(long.clone(), vec![4]), ("rec.b".to_string(), vec![5])];
        let rx = r.set_in_order_later(items).expect("handed over");
        assert!(futures::executor::block_on(rx).unwrap().is_err());
        assert_eq!(get("rec.b"), Ok(None), "stopped at the refused one");
    }

    /// A value the store refuses is counted, whether its caller waits
    /// for the answer, dropped it, or never asked; said at error when
    /// nobody hears the answer.
    #[test]
    fn a_value_the_flash_refuses_is_counted_waited_for_or_not() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let r = Recorder::start(stores.log, stores.store, None).expect("the thread");
        let long = "k".repeat(300);
        assert_eq!(r.refused(), 0);
        r.set("ok".into(), vec![1]);
        futures::executor::block_on(r.flush());
        assert_eq!(r.refused(), 0, "a value kept is not counted");
        // The answer dropped, as a replay floor kept without waiting.
        drop(
            r.set_all_later(vec![(long.clone(), vec![1])])
                .expect("handed over"),
        );
        // No answer asked for.
        r.set(long.clone(), vec![2]);
        // Waited for.
        assert!(futures::executor::block_on(r.set_sync(long, vec![3])).is_err());
        assert_eq!(r.refused(), 3);
        assert_eq!(
            futures::executor::block_on(r.get("ok".into())),
            Ok(Some(vec![1]))
        );
    }

    #[test]
    fn a_read_behind_few_jobs_waits_for_them() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let r = Recorder::start(stores.log, stores.store, None).expect("the thread");
        for i in 0..READ_AHEAD_OVER as u8 {
            r.append(TimestampMs(u64::from(i)), 1, vec![i]);
        }
        let read = futures::executor::block_on(r.read()).expect("the log");
        assert_eq!(read.entries.len(), READ_AHEAD_OVER, "all written before");
        assert_eq!(read.queued, 0);
    }

    #[test]
    fn a_config_value_offered_to_a_full_queue_is_dropped_without_waiting() {
        let (r, rx) = stalled(1);
        assert!(r.offer_set("a.key".into(), vec![1]));
        assert!(!r.offer_set("a.key".into(), vec![2]), "no room: dropped");
        assert_eq!(r.dropped(), 1);
        let left = fifo(&rx);
        assert!(
            matches!(&left[..], [Job::Set { items, done: None, .. }] if items[..] == [("a.key".to_string(), vec![1])])
        );
    }

    #[test]
    fn a_critical_event_is_queued_in_its_turn_when_an_xid_would_be_dropped() {
        let (r, rx) = stalled(2);
        let taken: Vec<bool> = (0..3).map(|_| r.emit(xid(), TimestampMs(0))).collect();
        assert_eq!(
            taken,
            [true, true, false],
            "the third XID is dropped, and said so"
        );
        assert_eq!(r.dropped(), 1);
        let leak = loopwarden_protocol::Event::Leak {
            rack: loopwarden_protocol::RackIndex::new(3).expect("a rack"),
            active: true,
        };
        assert!(
            r.emit(leak.clone(), TimestampMs(1)),
            "a critical event is taken"
        );
        r.publish(Message::Event(leak), TimestampMs(2), true);
        assert_eq!(r.dropped(), 1, "neither the leak's log nor its publish");
        let left = fifo(&rx);
        assert_eq!(left.len(), 4);
        assert!(matches!(
            &left[2],
            Job::Emit { message, .. }
                if matches!(**message, Message::Event(loopwarden_protocol::Event::Leak { .. }))
        ));
        assert!(matches!(
            &left[3],
            Job::Publish {
                time: TimestampMs(2),
                ..
            }
        ));
    }

    fn xid() -> loopwarden_protocol::Event {
        match samples::message(MessageKind::Event) {
            Message::Event(e) => e,
            other => panic!("not an event: {other:?}"),
        }
    }

    /// A bus whose outbox parts of the classes in `full` are full;
    /// numbers what it takes from 0 on.
    #[derive(Clone, Default)]
    struct Parts {
        full: Arc<Mutex<Vec<Class>>>,
        /// How many publishes to refuse yet as not stored (the outbox's
        /// flash failing while the broker is unreachable).
        unstored: Arc<Mutex<u32>>,
        sent: Arc<Mutex<Vec<Message>>>,
        /// The first number.
        base: u32,
    }

    impl Publisher for Parts {
        fn publish_message(&self, m: Message, _: TimestampMs, _: bool) -> Result<u32, Refused> {
            if self.full.lock().unwrap().contains(&Class::of(&m)) {
                return Err(Refused::OutboxFull);
            }
            let mut unstored = self.unstored.lock().unwrap();
            if *unstored > 0 {
                *unstored -= 1;
                return Err(Refused::Unstored(
                    "writing at 0x1000: Input/output error".into(),
                ));
            }
            let mut sent = self.sent.lock().unwrap();
            sent.push(m);
            Ok(self.base + sent.len() as u32 - 1)
        }

        fn next_seq(&self) -> u32 {
            self.base + self.sent.lock().unwrap().len() as u32
        }
    }

    /// A worker over a memory flash publishing on `bus`, run by the test.
    fn worker_on(bus: &Parts) -> Worker {
        worker_over(crate::agent_flash::open(None).expect("a memory flash"), bus)
    }

    fn worker_over(stores: crate::agent_flash::Stores, bus: &Parts) -> Worker {
        let (r, _) = stalled(JOBS_MAX);
        let mut w = r.worker(stores.log, stores.store);
        w.bus = Some(Box::new(bus.clone()));
        w
    }

    fn leak(rack: u8) -> Message {
        Message::Event(loopwarden_protocol::Event::Leak {
            rack: loopwarden_protocol::RackIndex::new(rack).expect("a rack"),
            active: true,
        })
    }

    /// Lease `id`'s frame from `sender` (a CDU), stamped `at`, for `ms`.
    fn lease_body(sender: &str, id: u32, at: u64, ms: u32) -> Vec<u8> {
        let mut f = loopwarden_protocol::samples::frame(MessageKind::CapLease);
        f.sender =
            loopwarden_protocol::NodeId::new(loopwarden_protocol::Role::Cdu, sender).unwrap();
        f.time = TimestampMs(at);
        if let Message::CapLease(l) = &mut f.message {
            l.duration = loopwarden_protocol::DurationMs(ms);
            l.lease = id;
        }
        f.to_vec().unwrap()
    }

    /// A storm wraps the log many times over: the leases still in force
    /// are in it at the end (logged again as it wrapped past them), one
    /// that ended is not.
    #[test]
    fn a_storm_that_wraps_the_log_keeps_the_leases_in_force_in_it() {
        let mut w = worker_on(&Parts::default());
        let kind = MessageKind::CapLease as u8;
        let t0 = 1_800_000_000_000;
        let hour = lease_body("fac-a", 1, t0, 3_600_000);
        let other = lease_body("fac-a", 2, t0, 3_600_000);
        let short = lease_body("cdu-b", 1, t0, 1_000);
        for body in [&hour, &other, &short] {
            w.append(TimestampMs(t0), kind, body).unwrap();
        }
        assert_eq!(w.pins.len(), 3, "a lease is its sender's and its id's");
        let xid = [0x5a; 40];
        let mut t = t0;
        while w.log.wraps() < 6 {
            t += 10;
            w.append(TimestampMs(t), 1, &xid).unwrap();
        }
        let leases: Vec<Vec<u8>> = w
            .read()
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.body)
            .collect();
        assert_eq!(
            leases,
            [hour, other],
            "both of the hour's leases kept, the ended one let go"
        );
        assert_eq!(w.pins.len(), 2);
    }

    /// The power goes right after the wrap that erases the sector of a
    /// lease in force, before the record it made room for is written: the
    /// lease is in the log when it is opened again (logged again before
    /// the wrap, while there was room, not after it).
    #[test]
    fn a_lease_in_force_survives_a_power_cut_at_the_wrap_that_erases_its_record() {
        use crate::agent_flash::AgentFlash;
        let mut w = worker_on(&Parts::default());
        let kind = MessageKind::CapLease as u8;
        let t0 = 1_800_000_000_000;
        let lease = lease_body("fac-a", 7, t0, 3_600_000);
        assert_eq!(w.append(TimestampMs(t0), kind, &lease), Ok(0));
        let flash = w.log.flash().clone();
        fn memory<T>(
            flash: &Flash,
            f: impl FnOnce(&mut loopwarden_flash::SimFlash<4, 4096>) -> T,
        ) -> T {
            flash.with(|a| match a {
                AgentFlash::Memory(m) => f(m),
                AgentFlash::File(_) => panic!("a memory flash"),
            })
        }
        // The log's first erase is its first wrap's, of the lease's sector.
        memory(&flash, |m| m.cut_power_after_erases(1));
        let xid = [0x5a; 40];
        let mut t = t0;
        let cut = loop {
            t += 10;
            if let Err(e) = w.append(TimestampMs(t), 1, &xid) {
                break e;
            }
        };
        assert!(cut.contains("power cut"), "{cut}");
        assert!(memory(&flash, |m| m.power_is_cut()));
        memory(&flash, |m| m.restore_power());
        // Restarted: the log as the power cut left it.
        let range = loopwarden_boards::FlashBoard::host_file().layout().log;
        let mut log = futures::executor::block_on(EventLog::open(flash, range)).unwrap();
        let mut leases = Vec::new();
        let mut oldest = None;
        futures::executor::block_on(log.for_each(|r| {
            oldest = oldest.or(Some(r.seq));
            if r.kind == kind {
                leases.push(r.body.to_vec());
            }
        }))
        .unwrap();
        assert!(
            oldest > Some(0),
            "the lease's first record erased: {oldest:?}"
        );
        assert_eq!(leases, [lease], "the lease in force still in the log");
    }

    #[test]
    fn a_full_wait_list_drops_the_oldest_of_the_lowest_class_and_keeps_a_leak() {
        let bus = Parts::default();
        *bus.full.lock().unwrap() = vec![Class::Normal, Class::Critical];
        let mut w = worker_on(&bus);
        w.publish(Held::new(leak(1), TimestampMs(1), false, None));
        for t in 2..UNSENT_MAX as u64 + 10 {
            let xid = Message::Event(xid());
            w.publish(Held::new(xid, TimestampMs(t), false, None));
        }
        assert_eq!(w.unsent.len(), UNSENT_MAX);
        assert!(matches!(
            w.unsent[0].message,
            Message::Event(loopwarden_protocol::Event::Leak { .. })
        ));
        assert_eq!(w.unsent[1].time, TimestampMs(11), "the oldest XIDs went");
        assert_eq!(w.counts.1.load(Ordering::Relaxed), 9);
        // Full of critical frames, a later XID is the one dropped.
        let mut w = worker_on(&bus);
        for t in 0..UNSENT_MAX as u64 {
            w.publish(Held::new(leak(2), TimestampMs(t), false, None));
        }
        w.publish(Held::new(
            Message::Event(xid()),
            TimestampMs(999),
            false,
            None,
        ));
        assert!(w.unsent.iter().all(|h| h.class == Class::Critical));
        assert_eq!(w.unsent[0].time, TimestampMs(0));
        let note = w.unsent_note().expect("said at a flush or the end");
        assert!(
            note.starts_with("256 frames (256 critical) still wait"),
            "{note}"
        );
    }

    #[test]
    fn a_frame_of_another_class_goes_past_a_held_critical_one() {
        let bus = Parts::default();
        *bus.full.lock().unwrap() = vec![Class::Critical];
        let mut w = worker_on(&bus);
        w.publish(Held::new(leak(1), TimestampMs(1), false, None));
        w.publish(Held::new(
            Message::Event(xid()),
            TimestampMs(2),
            false,
            None,
        ));
        w.publish(Held::new(leak(2), TimestampMs(3), false, None));
        assert_eq!(*bus.sent.lock().unwrap(), [Message::Event(xid())]);
        assert_eq!(w.unsent.len(), 2, "both leaks wait, in order");
        bus.full.lock().unwrap().clear();
        w.retry_unsent();
        assert_eq!(
            *bus.sent.lock().unwrap(),
            [Message::Event(xid()), leak(1), leak(2)]
        );
        assert!(w.unsent_note().is_none());
    }

    #[test]
    fn a_frame_the_failing_outbox_did_not_store_is_offered_again_until_it_goes() {
        let bus = Parts::default();
        *bus.unstored.lock().unwrap() = 2;
        let mut w = worker_on(&bus);
        w.publish(Held::new(leak(1), TimestampMs(1), false, None));
        assert!(bus.sent.lock().unwrap().is_empty());
        assert_eq!(w.unsent.len(), 1, "held, not dropped");
        w.retry_unsent();
        assert_eq!(w.unsent.len(), 1, "refused again, still held");
        w.retry_unsent();
        assert_eq!(*bus.sent.lock().unwrap(), [leak(1)]);
        assert!(w.unsent.is_empty());
    }

    /// The sequence floor kept in `w`'s flash.
    fn stored_floor(w: &mut Worker) -> u32 {
        let mut b = [0u8; 4];
        let key = loopwarden_flash::config::SEQ_FLOOR_KEY;
        let n = futures::executor::block_on(w.store.get(key, &mut b)).expect("readable");
        assert_eq!(n, Some(4));
        u32::from_le_bytes(b)
    }

    #[test]
    fn the_floor_is_reserved_ahead_before_a_frame_is_numbered_near_it() {
        use crate::agent_flash::{SEQ_BLOCK, SEQ_MARGIN};
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let floor = stores.first_seq + SEQ_BLOCK;
        // No early request from the loop came (dropped, or behind a
        // storm): the next frame is the first within the margin.
        let bus = Parts {
            base: floor - SEQ_MARGIN,
            ..Parts::default()
        };
        let mut w = worker_over(stores, &bus);
        assert_eq!(w.floor.floor(), floor, "read at start");
        w.publish(Held::new(
            Message::Event(xid()),
            TimestampMs(1),
            false,
            None,
        ));
        assert_eq!(bus.sent.lock().unwrap().len(), 1);
        assert_eq!(
            stored_floor(&mut w),
            floor + SEQ_BLOCK,
            "reserved before it"
        );
        assert_eq!(w.floor.floor(), floor + SEQ_BLOCK);
        w.publish(Held::new(
            Message::Event(xid()),
            TimestampMs(2),
            false,
            None,
        ));
        assert_eq!(stored_floor(&mut w), floor + SEQ_BLOCK, "once a block");
    }

    #[test]
    fn a_failed_reservation_numbers_no_frame_past_the_floor() {
        let stores = crate::agent_flash::open(None).expect("a memory flash");
        let floor = stores.first_seq + crate::agent_flash::SEQ_BLOCK;
        let bus = Parts {
            base: floor - 1,
            ..Parts::default()
        };
        let mut w = worker_over(stores, &bus);
        let key = loopwarden_flash::config::SEQ_FLOOR_KEY;
        // A floor the store cannot read back: every reservation fails.
        futures::executor::block_on(w.store.set(key, &[1, 2, 3])).expect("set");
        for t in 0..3 {
            w.publish(Held::new(
                Message::Event(xid()),
                TimestampMs(t),
                false,
                None,
            ));
        }
        assert_eq!(
            bus.sent.lock().unwrap().len(),
            1,
            "the last number below it"
        );
        assert_eq!(bus.next_seq(), floor);
        assert_eq!(w.unsent.len(), 2, "held, not numbered past it");
        // The flash takes a reservation again: they go, above a new floor.
        futures::executor::block_on(w.store.set(key, &floor.to_le_bytes())).expect("set");
        w.retry_unsent();
        assert_eq!(bus.sent.lock().unwrap().len(), 3);
        assert!(stored_floor(&mut w) > floor + 2);
    }

    #[test]
    fn what_is_waited_for_goes_ahead_of_the_droppable_backlog_in_its_own_order() {
        let (r, inbox) = stalled(JOBS_MAX);
        // A storm's backlog: droppable appends (fewer than a full queue:
        // the memory log would recycle the first).
        for i in 0..200u32 {
            r.append(TimestampMs(u64::from(i)), 1, i.to_le_bytes().to_vec());
        }
        let mut lease = std::pin::pin!(r.append_sync(TimestampMs(1), 2, b"lease".to_vec()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(lease.as_mut().poll(&mut cx).is_pending(), "handed over");
        let kept = r.set_later("limit.0".into(), vec![7]).expect("handed over");
        let reserved = r.reserve_seq_later(10).expect("handed over");
        start_stalled(&r, inbox);
        let seq = futures::executor::block_on(lease).expect("the lease in flash");
        futures::executor::block_on(kept)
            .expect("the thread answered")
            .expect("kept");
        let first = futures::executor::block_on(reserved).expect("answered");
        assert!(first.is_ok(), "{first:?}");
        futures::executor::block_on(r.flush());
        let read = futures::executor::block_on(r.read()).expect("the log");
        let lease_at = read.entries.iter().position(|e| e.seq == seq);
        assert_eq!(
            lease_at,
            Some(0),
            "the waited-for record is written before the droppable backlog"
        );
        assert_eq!(read.entries[0].body, b"lease");
        assert_eq!(read.entries.len(), 201, "none of the backlog lost");
    }
}

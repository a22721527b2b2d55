//! The recorder: the one thread that writes the agent's flash.
//!
//! A flash write ends with a sync and, now and then, a sector erase; on a
//! busy disk that can take tens of milliseconds. The agent's loop must not
//! wait for it while a GPU is failing: it hands records to this thread,
//! which writes them in the order given, and waits only where it must (a
//! lease is in flash before its ack goes out; a sequence reservation
//! before its numbers are used).
//!
//! The frames that go through the bus's flash outbox (events and acks) are
//! published from here too, in the order given and after their log entry:
//! storing them in the outbox is a flash write as well. Frames the full
//! outbox refused wait here (up to 256, oldest dropped first) and go out in
//! order once there is room.
//!
//! Glossary:
//! - *record*: an event-log entry (an event, or an accepted command kept
//!   whole) or a config-store value (a GPU's health, the sequence floor).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use loopwarden_bus::{Bus, PublishError};
use loopwarden_protocol::Message;

use loopwarden_flash::{ConfigStore, EventLog, SharedFlash};
use loopwarden_protocol::TimestampMs;
use tokio::sync::oneshot;

use crate::store::HostFlash;

type Log = EventLog<SharedFlash<HostFlash>>;
type Store = ConfigStore<SharedFlash<HostFlash>>;

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
    Publish {
        message: Box<Message>,
        time: TimestampMs,
        mirror: bool,
    },
    Append {
        time: TimestampMs,
        kind: u8,
        body: Vec<u8>,
        done: Option<oneshot::Sender<Result<u32, String>>>,
    },
    Set {
        key: String,
        value: Vec<u8>,
    },
    ReserveSeq {
        block: u32,
        done: oneshot::Sender<Result<u32, String>>,
    },
    Read {
        done: oneshot::Sender<Result<Vec<Entry>, String>>,
    },
    Flush {
        done: oneshot::Sender<()>,
    },
}

/// Frames kept in memory while the outbox is full.
const UNSENT_MAX: usize = 256;

/// The handle the loop writes through.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
    /// Frames waiting for room in the outbox, and dropped from that wait.
    waiting: Arc<(AtomicU64, AtomicU64)>,
}

/// Publishes and its JSON mirror; gives the message back when the outbox
/// is full.
fn try_publish(bus: &Bus, message: Message, time: TimestampMs, mirror: bool) -> Option<Message> {
    let kind = message.kind();
    match bus.publish(message.clone(), time) {
        Ok(frame) => {
            if mirror {
                if let Err(e) = bus.publish_json(&frame) {
                    tracing::debug!("JSON mirror of {kind:?} not sent: {e}");
                }
            }
            None
        }
        Err(PublishError::OutboxFull(_)) => Some(message),
        Err(PublishError::Offline) => None,
        Err(e) => {
            tracing::warn!("{kind:?} not published: {e}");
            None
        }
    }
}

impl Recorder {
    /// Starts the thread that owns `log` and `store` and publishes on
    /// `bus`.
    pub fn start(mut log: Log, mut store: Store, bus: Bus) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let waiting = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let counts = waiting.clone();
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                let mut unsent: VecDeque<(Message, TimestampMs, bool)> = VecDeque::new();
                loop {
                    // While frames wait for the outbox, look again every second.
                    let job = if unsent.is_empty() {
                        match rx.recv() {
                            Ok(j) => Some(j),
                            Err(_) => break,
                        }
                    } else {
                        match rx.recv_timeout(Duration::from_secs(1)) {
                            Ok(j) => Some(j),
                            Err(mpsc::RecvTimeoutError::Timeout) => None,
                            Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    };
                    while let Some((m, t, mirror)) = unsent.pop_front() {
                        if let Some(m) = try_publish(&bus, m, t, mirror) {
                            unsent.push_front((m, t, mirror));
                            break;
                        }
                    }
                    counts.0.store(unsent.len() as u64, Ordering::Relaxed);
                    let Some(job) = job else { continue };
                    match job {
                        Job::Publish {
                            message,
                            time,
                            mirror,
                        } => {
                            let held = if unsent.is_empty() {
                                try_publish(&bus, *message, time, mirror)
                            } else {
                                Some(*message)
                            };
                            if let Some(m) = held {
                                if unsent.is_empty() {
                                    tracing::warn!(
                                        "the outbox is full: frames wait in memory until the broker takes some"
                                    );
                                }
                                if unsent.len() == UNSENT_MAX {
                                    unsent.pop_front();
                                    counts.1.fetch_add(1, Ordering::Relaxed);
                                }
                                unsent.push_back((m, time, mirror));
                                counts.0.store(unsent.len() as u64, Ordering::Relaxed);
                            }
                        }
                        Job::Append {
                            time,
                            kind,
                            body,
                            done,
                        } => {
                            let r = futures::executor::block_on(log.append(time, kind, &body))
                                .map_err(|e| format!("{e:?}"));
                            if let Err(e) = &r {
                                tracing::error!("not logged to flash (kind {kind}): {e}");
                            }
                            if let Some(d) = done {
                                let _ = d.send(r);
                            }
                        }
                        Job::Set { key, value } => {
                            if let Err(e) = futures::executor::block_on(store.set(&key, &value)) {
                                tracing::error!("{key} not kept in flash: {e:?}");
                            }
                        }
                        Job::ReserveSeq { block, done } => {
                            let r = futures::executor::block_on(store.reserve_seq(block))
                                .map_err(|e| format!("{e:?}"));
                            let _ = done.send(r);
                        }
                        Job::Flush { done } => {
                            let _ = done.send(());
                        }
                        Job::Read { done } => {
                            let mut entries = Vec::new();
                            let r = futures::executor::block_on(log.for_each(|r| {
                                entries.push(Entry {
                                    seq: r.seq,
                                    time: r.time,
                                    kind: r.kind,
                                    body: r.body.to_vec(),
                                })
                            }));
                            let _ = done.send(r.map(|_| entries).map_err(|e| format!("{e:?}")));
                        }
                    }
                }
            })?;
        Ok(Self { jobs, waiting })
    }

    /// Publishes an event or an ack (through the outbox) after what was
    /// handed over before it.
    pub fn publish(&self, message: Message, time: TimestampMs, mirror: bool) {
        if self
            .jobs
            .send(Job::Publish {
                message: Box::new(message),
                time,
                mirror,
            })
            .is_err()
        {
            tracing::error!("not published: {}", Self::gone());
        }
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

    /// Appends to the event log without waiting.
    pub fn append(&self, time: TimestampMs, kind: u8, body: Vec<u8>) {
        if self
            .jobs
            .send(Job::Append {
                time,
                kind,
                body,
                done: None,
            })
            .is_err()
        {
            tracing::error!("not logged to flash: {}", Self::gone());
        }
    }

    /// Appends to the event log and waits until it is in flash.
    pub async fn append_sync(
        &self,
        time: TimestampMs,
        kind: u8,
        body: Vec<u8>,
    ) -> Result<u32, String> {
        let (done, rx) = oneshot::channel();
        self.jobs
            .send(Job::Append {
                time,
                kind,
                body,
                done: Some(done),
            })
            .map_err(|_| Self::gone())?;
        rx.await.map_err(|_| Self::gone())?
    }

    /// Keeps a config value, without waiting.
    pub fn set(&self, key: String, value: Vec<u8>) {
        if self.jobs.send(Job::Set { key, value }).is_err() {
            tracing::error!("not kept in flash: {}", Self::gone());
        }
    }

    /// Reserves a block of frame sequence numbers.
    pub async fn reserve_seq(&self, block: u32) -> Result<u32, String> {
        let (done, rx) = oneshot::channel();
        self.jobs
            .send(Job::ReserveSeq { block, done })
            .map_err(|_| Self::gone())?;
        rx.await.map_err(|_| Self::gone())?
    }

    /// Waits until everything handed over before is written and published.
    pub async fn flush(&self) {
        let (done, rx) = oneshot::channel();
        if self.jobs.send(Job::Flush { done }).is_ok() {
            let _ = rx.await;
        }
    }

    /// Every log entry, oldest first (after what is queued before it).
    pub async fn read(&self) -> Result<Vec<Entry>, String> {
        let (done, rx) = oneshot::channel();
        self.jobs
            .send(Job::Read { done })
            .map_err(|_| Self::gone())?;
        rx.await.map_err(|_| Self::gone())?
    }
}

//! The recorder: the one thread that writes the agent's flash.
//!
//! A flash write ends with a sync and, now and then, a sector erase; on a
//! busy disk that can take tens of milliseconds. The agent's loop must not
//! wait for it while a GPU is failing: it hands records to this thread,
//! which writes them in the order given, and waits only where it must (a
//! lease is in flash before its ack goes out; a sequence reservation
//! before its numbers are used).
//!
//! Glossary:
//! - *record*: an event-log entry (an event, or an accepted command kept
//!   whole) or a config-store value (a GPU's health, the sequence floor).

use std::sync::mpsc;

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
}

/// The handle the loop writes through.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
}

impl Recorder {
    /// Starts the thread that owns `log` and `store`.
    pub fn start(mut log: Log, mut store: Store) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                for job in rx {
                    match job {
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
        Ok(Self { jobs })
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

    /// Every log entry, oldest first (after what is queued before it).
    pub async fn read(&self) -> Result<Vec<Entry>, String> {
        let (done, rx) = oneshot::channel();
        self.jobs
            .send(Job::Read { done })
            .map_err(|_| Self::gone())?;
        rx.await.map_err(|_| Self::gone())?
    }
}

//! The controller's event log: every core event and every lease sent or
//! lifted, in loopwarden-flash's [`EventLog`] on the flash file (the
//! layout of `boards/flash/host-file.toml`, its `log` range), so
//! `cooling-ctrl ctl events` shows them across restarts. Without a flash
//! file the same log lives in memory and is lost at exit.
//!
//! A flash write ends with a sync and now and then a sector erase; the
//! control loop does not wait for it. The shell hands [`Journal`] entries
//! to a channel ([`crate::shell::ShellOptions::journal`]); one thread, the
//! recorder, owns the log and writes them in order, and answers reads.
//!
//! Records: an event is kind `MessageKind::Event` with the message's body;
//! a lease is kind `MessageKind::CapLease` with a byte for lift (1) or cap
//! (0), the host id's length and bytes, and the signed frame as sent.
//!
//! Glossary:
//! - *recorder*: the thread that writes the log.

use std::format;
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::sync::mpsc;
use std::vec::Vec;

use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use loopwarden_boards::FlashBoard;
use loopwarden_flash::log::WRAPPED;
use loopwarden_flash::{EventLog, FileFlash, FlashError, SimFlash, Wrapped};
use loopwarden_protocol::{Frame, Message, MessageKind, TimestampMs, MAX_FRAME_LEN};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::shell::Journal;

/// Word size of the flash, bytes.
pub const WORD: usize = 4;
/// Sector size of the flash, bytes.
pub const SECTOR: usize = 4096;

/// A log entry read back.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The log's sequence number.
    pub seq: u32,
    /// When (Unix ms).
    pub time: TimestampMs,
    /// Record kind.
    pub kind: u8,
    /// The record's bytes.
    pub body: Vec<u8>,
}

enum Job {
    Append {
        time: TimestampMs,
        kind: u8,
        body: Vec<u8>,
    },
    Read {
        done: oneshot::Sender<Result<Vec<Entry>, String>>,
    },
    Flush {
        done: oneshot::Sender<()>,
    },
}

/// The handle the shell's entries and the console's reads go through.
#[derive(Clone)]
pub struct Recorder {
    jobs: mpsc::Sender<Job>,
    /// The flash file, `None`: memory.
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("path", &self.path)
            .finish()
    }
}

fn run<S>(mut log: EventLog<S>, rx: mpsc::Receiver<Job>)
where
    S: MultiwriteNorFlash<Error = FlashError>,
{
    while let Ok(job) = rx.recv() {
        match job {
            Job::Append { time, kind, body } => {
                if let Err(e) = futures::executor::block_on(log.append(time, kind, &body)) {
                    tracing::error!("cooling-ctrl: not logged to flash (kind {kind}): {e:?}");
                }
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
            Job::Flush { done } => {
                let _ = done.send(());
            }
        }
    }
}

fn spawn<S>(log: EventLog<S>) -> std::io::Result<mpsc::Sender<Job>>
where
    S: MultiwriteNorFlash<Error = FlashError> + Send + 'static,
{
    let (jobs, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("recorder".into())
        .spawn(move || run(log, rx))?;
    Ok(jobs)
}

impl Recorder {
    /// Opens the log in the flash file at `path` (made if missing), or in
    /// memory, and starts the recorder thread.
    pub fn open(path: Option<&Path>) -> Result<Self, String> {
        let board = FlashBoard::host_file();
        let range = board.layout().log;
        let jobs = match path {
            Some(p) => {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    let _ = std::fs::create_dir_all(dir);
                }
                let f = FileFlash::<WORD, SECTOR>::open(p, &board.geometry())
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                let log = futures::executor::block_on(EventLog::open(f, range))
                    .map_err(|e| format!("{}: event log: {e:?}", p.display()))?;
                if log.skipped() > 0 {
                    tracing::warn!(
                        "flash: {} event-log items were unreadable and skipped (a power cut mid-write, or damage)",
                        log.skipped()
                    );
                }
                spawn(log)
            }
            None => {
                let f = SimFlash::<WORD, SECTOR>::new(board.geometry.sectors as usize);
                let log = futures::executor::block_on(EventLog::open(f, range))
                    .map_err(|e| format!("event log in memory: {e:?}"))?;
                spawn(log)
            }
        }
        .map_err(|e| format!("the recorder thread: {e}"))?;
        Ok(Self {
            jobs,
            path: path.map(Path::to_path_buf),
        })
    }

    /// The flash file, or `None` for memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Logs one of the shell's entries, without waiting.
    pub fn record(&self, entry: &Journal) {
        let Some((time, kind, body)) = encode(entry) else {
            return;
        };
        if self.jobs.send(Job::Append { time, kind, body }).is_err() {
            tracing::error!("cooling-ctrl: not logged: the recorder thread has ended");
        }
    }

    /// Every entry, oldest first (after what was handed over before).
    pub async fn read(&self) -> Result<Vec<Entry>, String> {
        let (done, rx) = oneshot::channel();
        let gone = || "the recorder thread has ended".to_string();
        self.jobs.send(Job::Read { done }).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Waits until everything handed over before is written.
    pub async fn flush(&self) {
        let (done, rx) = oneshot::channel();
        if self.jobs.send(Job::Flush { done }).is_ok() {
            let _ = rx.await;
        }
    }
}

/// A journal entry as a record: time, kind and body.
pub fn encode(entry: &Journal) -> Option<(TimestampMs, u8, Vec<u8>)> {
    let mut buf = [0u8; MAX_FRAME_LEN];
    match entry {
        Journal::Event { time, event } => {
            let n = match Message::Event(event.clone()).encode_body(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("cooling-ctrl: event not logged: {e:?}");
                    return None;
                }
            };
            Some((*time, MessageKind::Event as u8, buf[..n].to_vec()))
        }
        Journal::Lease { host, frame, lift } => {
            let n = match frame.encode(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!("cooling-ctrl: lease not logged: {e:?}");
                    return None;
                }
            };
            let h = host.as_str().as_bytes();
            let mut body = Vec::with_capacity(2 + h.len() + n);
            body.push(u8::from(*lift));
            body.push(h.len() as u8);
            body.extend_from_slice(h);
            body.extend_from_slice(&buf[..n]);
            Some((frame.time, MessageKind::CapLease as u8, body))
        }
    }
}

/// An entry for the console, as JSON: `{"seq", "time_ms", "event"}` where
/// `event` is the event's JSON, `{"lease_sent": …}` / `{"lift_sent": …}`
/// or `{"wrapped": …}`.
pub fn describe(e: &Entry) -> Value {
    let what = if e.kind == MessageKind::Event as u8 {
        match Message::decode_body(MessageKind::Event, &e.body) {
            Ok(Message::Event(ev)) => serde_json::to_value(ev).unwrap_or(Value::Null),
            _ => json!("undecodable event"),
        }
    } else if e.kind == MessageKind::CapLease as u8 {
        decode_lease(&e.body).unwrap_or_else(|| json!("undecodable lease"))
    } else if e.kind == WRAPPED {
        match Wrapped::decode(&e.body) {
            Some(w) => json!({ "wrapped": {
                "lost": w.lost, "first_seq": w.first_seq, "last_seq": w.last_seq,
            }}),
            None => json!("undecodable wrap marker"),
        }
    } else {
        json!(format!("record of kind {}", e.kind))
    };
    json!({ "seq": e.seq, "time_ms": e.time.0, "event": what })
}

fn decode_lease(body: &[u8]) -> Option<Value> {
    let (&lift, rest) = body.split_first()?;
    let (&len, rest) = rest.split_first()?;
    let host = std::str::from_utf8(rest.get(..usize::from(len))?).ok()?;
    let frame = Frame::decode(rest.get(usize::from(len)..)?).ok()?;
    let Message::CapLease(l) = &frame.message else {
        return None;
    };
    let name = if lift == 1 { "lift_sent" } else { "lease_sent" };
    Some(json!({ name: {
        "host": host,
        "seq": frame.seq,
        "lease": l.lease,
        "reason": l.reason,
        "limit_w": l.caps.first().map(|c| c.limit.0),
        "duration_ms": l.duration.0,
    }}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::message::{CduMode, Event};
    use loopwarden_protocol::{Ident, NodeId, ReasonCode, Role};
    use std::boxed::Box;

    fn event() -> Event {
        Event::CduModeChanged {
            from: CduMode::Boot,
            to: CduMode::Normal,
            reason: ReasonCode::OK,
        }
    }

    #[test]
    fn entries_survive_a_reopen_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu.flash");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let lease = crate::shell::cap_lease(
            3,
            ReasonCode::CAPACITY_SHORT,
            550.0,
            std::time::Duration::from_secs(30),
        );
        let frame = Frame {
            sender: NodeId::new(Role::Cdu, "cdu-1").unwrap(),
            seq: 77,
            time: TimestampMs(1_800_000_000_000),
            message: Message::CapLease(lease),
        };
        {
            let r = Recorder::open(Some(&path)).unwrap();
            r.record(&Journal::Event {
                time: TimestampMs(1_800_000_000_000),
                event: event(),
            });
            r.record(&Journal::Lease {
                host: Ident::new("h03").unwrap(),
                frame: Box::new(frame),
                lift: false,
            });
            rt.block_on(r.flush());
        }
        let r = Recorder::open(Some(&path)).unwrap();
        let entries = rt.block_on(r.read()).unwrap();
        assert_eq!(entries.len(), 2);
        let v: Vec<Value> = entries.iter().map(describe).collect();
        assert_eq!(v[0]["event"]["cdu_mode_changed"]["to"], "normal", "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["host"], "h03", "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["limit_w"], 550, "{v:?}");
        assert_eq!(v[1]["event"]["lease_sent"]["reason"], "capacity-short");
    }
}

//! A facility reader of the JSON tree for the presence tests: the paho
//! client `tests/json_presence_watch.py` on a node's JSON `online` topic,
//! its lines read as they come, with the time each arrived.
//!
//! Glossary:
//! - *bound*: how long after a node died or hung its JSON `online` may
//!   still say `true`: 1.5 × the keep-alive (the broker's wait) plus a
//!   margin for a busy machine.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::require_python_module;

/// One message the reader got on a JSON `online` topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Presence {
    /// The topic.
    pub topic: String,
    /// Delivered as retained (a subscriber's first look).
    pub retained: bool,
    /// What it says.
    pub online: bool,
    /// The frame's sequence number.
    pub seq: u64,
    /// When the node's bus started (ms since the epoch).
    pub started: u64,
    /// When the line reached the test.
    pub at: Instant,
}

/// The running reader; stopped when dropped.
pub struct JsonPresenceWatch {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

/// The time within which a node that died or hung must read offline:
/// 1.5 × `keep_alive` plus `margin`.
pub fn bound(keep_alive: Duration, margin: Duration) -> Duration {
    keep_alive * 3 / 2 + margin
}

impl JsonPresenceWatch {
    /// Subscribes to `topics` on the broker at `port`; returns once the
    /// broker answered the subscription. `None` (skip) when Python or
    /// paho-mqtt is missing outside CI.
    pub fn start(port: u16, topics: &[&str]) -> Option<JsonPresenceWatch> {
        let python = require_python_module("paho.mqtt.client")?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/json_presence_watch.py");
        let mut child = Command::new(python)
            .arg(script)
            .args(["--port", &port.to_string()])
            .args(topics)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start json_presence_watch.py");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let w = JsonPresenceWatch { child, lines };
        let (_, first) = w
            .lines
            .recv_timeout(Duration::from_secs(15))
            .expect("json_presence_watch.py subscribed within 15 s");
        assert_eq!(first, r#"{"subscribed": true}"#, "first line of the reader");
        Some(w)
    }

    /// The next message, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Option<Presence> {
        let (at, line) = self.lines.recv_timeout(timeout).ok()?;
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("reader line {line:?}: {e}"));
        assert!(v.get("error").is_none(), "the reader says {line}");
        let field = |k: &str| v[k].clone();
        Some(Presence {
            topic: field("topic").as_str().expect("topic").to_string(),
            retained: field("retained").as_bool().expect("retained"),
            online: field("online").as_bool().expect("online"),
            seq: field("seq").as_u64().expect("seq"),
            started: field("started").as_u64().expect("started"),
            at,
        })
    }

    /// Messages until one says `online`, at most `timeout` in all; the
    /// last one is that one. `None` when it did not come in time.
    pub fn until(&mut self, online: bool, timeout: Duration) -> Option<Vec<Presence>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Some(p) = self.next(deadline.saturating_duration_since(Instant::now())) {
            let done = p.online == online;
            seen.push(p);
            if done {
                return Some(seen);
            }
        }
        None
    }
}

/// Sends `signal` (`STOP`, `CONT`) to `child`.
fn signal(child: &Child, signal: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{signal} {}", child.id());
}

/// Waits for the next `online: false`, at most `limit` and a few seconds
/// more (so a late one is told apart from none); asserts it came within
/// `limit` of `since`, and returns it.
fn offline_within(
    reader: &mut JsonPresenceWatch,
    since: Instant,
    limit: Duration,
    what: &str,
) -> Presence {
    let seen = reader
        .until(false, limit + Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: the JSON tree never said offline"));
    let gone = seen
        .last()
        .expect("until returns what it waited for")
        .clone();
    let took = gone.at.saturating_duration_since(since);
    eprintln!("{what}: offline in the JSON tree after {took:?} (bound {limit:?})");
    assert!(
        took <= limit,
        "{what}: offline after {took:?}, bound {limit:?}"
    );
    gone
}

/// The issue's check on a running agent whose JSON `online` `reader`
/// watches, the agent connecting with `keep_alive`: it reads online; hung
/// (SIGSTOP) it reads offline within [`bound`], and online again once it
/// runs again (SIGCONT); killed (SIGKILL) it reads offline within the
/// bound. Every message is newer (a higher `seq`) than the one before,
/// and all come from the same run (`started`).
pub fn check_hang_and_kill(
    reader: &mut JsonPresenceWatch,
    agent: &mut Child,
    keep_alive: Duration,
    margin: Duration,
) {
    let limit = bound(keep_alive, margin);
    let hello = reader
        .until(true, Duration::from_secs(60))
        .expect("the agent announced itself online in the JSON tree");
    let up = hello.last().expect("the announcement").clone();

    // A hang: both of its connections fall silent.
    signal(agent, "STOP");
    let hung = offline_within(reader, Instant::now(), limit, "hung (SIGSTOP)");
    assert!(hung.seq > up.seq, "the will {hung:?} is older than {up:?}");
    signal(agent, "CONT");
    let again = reader
        .until(true, Duration::from_secs(60))
        .expect("online again in the JSON tree after SIGCONT");
    let back = again.last().expect("the announcement").clone();
    assert!(
        back.seq > hung.seq,
        "{back:?} is older than the will {hung:?}"
    );
    assert_eq!(back.started, up.started, "the same run");

    // A kill: no goodbye; the broker sees the sockets close.
    agent.kill().expect("kill -9 the agent");
    let killed = Instant::now();
    agent.wait().expect("reap the agent");
    let dead = offline_within(reader, killed, limit, "killed (SIGKILL)");
    assert!(
        dead.seq > back.seq,
        "the will {dead:?} is older than {back:?}"
    );
}

impl Drop for JsonPresenceWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! A serial line for the serial console's tests: two pseudo-terminals
//! joined by `socat` (the agent opens one end as its port, the test types
//! on the other as a field engineer's terminal would), and a
//! [`Terminal`] that sends bytes and waits for what comes back.
//!
//! Glossary:
//! - *transcript*: everything the terminal received, shown when an
//!   expectation fails.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Two joined pseudo-terminals, `agent` and `engineer`, in a temporary
/// folder; `None` (a skip) without `socat` outside CI.
pub struct PtyPair {
    socat: Child,
    dir: tempfile::TempDir,
}

impl PtyPair {
    /// Starts `socat` and waits (5 s at most) for both ends.
    pub fn start() -> Option<PtyPair> {
        let socat = crate::require_tool("socat")?;
        let dir = tempfile::tempdir().expect("temp dir");
        let end = |n: &str| format!("pty,raw,echo=0,link={}", dir.path().join(n).display());
        let child = Command::new(socat)
            .args(["-d", "-d", &end("agent"), &end("engineer")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start socat");
        let pair = PtyPair { socat: child, dir };
        let t0 = Instant::now();
        while !(pair.agent().exists() && pair.engineer().exists()) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "socat made no pseudo-terminals in 5 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(pair)
    }

    /// The agent's end: its `--console-serial`.
    pub fn agent(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    /// The engineer's end.
    pub fn engineer(&self) -> PathBuf {
        self.dir.path().join("engineer")
    }
}

impl Drop for PtyPair {
    fn drop(&mut self) {
        let _ = self.socat.kill();
        let _ = self.socat.wait();
    }
}

/// The engineer's terminal on a pseudo-terminal.
pub struct Terminal {
    port: File,
    rx: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
    read_to: usize,
}

impl Terminal {
    /// Opens `path` and reads it on a thread.
    pub fn open(path: &std::path::Path) -> Terminal {
        let port = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open the engineer's end");
        let mut reader = port.try_clone().expect("clone the terminal");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal {
            port,
            rx,
            seen: Vec::new(),
            read_to: 0,
        }
    }

    /// Types `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.port.write_all(bytes).expect("write to the terminal");
        self.port.flush().expect("flush the terminal");
    }

    /// Waits (at most `within`) until `want` comes after what was
    /// expected before; gives the text up to and including it. Panics
    /// with the transcript when it does not come.
    pub fn expect(&mut self, want: &str, within: Duration) -> String {
        let t0 = Instant::now();
        loop {
            let text = String::from_utf8_lossy(&self.seen[self.read_to..]).into_owned();
            if let Some(i) = text.find(want) {
                let upto = &text[..i + want.len()];
                self.read_to += upto.len();
                return upto.to_string();
            }
            let left = within.saturating_sub(t0.elapsed());
            assert!(
                !left.is_zero(),
                "no {want:?} within {within:?}; the terminal shows:\n{}",
                self.transcript()
            );
            if let Ok(bytes) = self.rx.recv_timeout(left.min(Duration::from_millis(100))) {
                self.seen.extend(bytes);
            }
        }
    }

    /// Everything received so far.
    pub fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }
}

/// The console records of an agent's `ctl events --json` answer, in
/// order, as `what` or `what:why` (`session_closed:logout`).
pub fn console_records(v: &serde_json::Value) -> Vec<String> {
    v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let c = &e["event"]["console"];
            let what = c["what"].as_str()?;
            Some(match c["why"].as_str() {
                Some(why) => format!("{what}:{why}"),
                None => what.to_string(),
            })
        })
        .collect()
}

//! A private Prometheus for the tests: the real server (Debian package
//! `prometheus`) on a free loopback port, scraping the agents' `/metrics`
//! every second, asked through its HTTP API; and `promtool check
//! metrics` on one scrape.
//!
//! Glossary:
//! - *target*: an address Prometheus scrapes (`127.0.0.1:PORT`), under a
//!   job name.
//! - *instant query*: `/api/v1/query?query=PROMQL`, answered with one
//!   value per matching series, as of now.
//! - *lint problem*: what `promtool check metrics` says of text that
//!   parses but breaks Prometheus's naming rules (exit status 3); text
//!   that does not parse is an error (exit status 1).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{free_port, require_tool, wait_listening};

/// A private Prometheus, stopped when dropped; its log is `DIR/prometheus.log`.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

/// One series of a query's answer: its labels and its value.
#[derive(Debug, Clone)]
pub struct Series {
    /// The labels, `__name__` included.
    pub labels: serde_json::Map<String, Value>,
    /// The value.
    pub value: f64,
}

impl Series {
    /// The value of label `name`, or "".
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).and_then(Value::as_str).unwrap_or("")
    }
}

/// Finds a tool of the Debian package `prometheus`, by the harness's
/// skip-or-fail rule.
fn require(tool: &str) -> Option<PathBuf> {
    let found = require_tool(tool);
    if found.is_none() {
        eprintln!(
            "SKIP: {tool} comes with the Debian package prometheus (apt-get install prometheus)"
        );
    }
    found
}

impl Prometheus {
    /// Starts one scraping every `(job, target)` every second, and waits
    /// until its API answers; `None` (skip) when it is not installed,
    /// outside CI.
    pub fn start(targets: &[(&str, SocketAddr)]) -> Option<Prometheus> {
        let bin = require("prometheus")?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, scrape_config(targets)).expect("write prometheus.yml");
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("a log file");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, addr, dir };
        assert!(
            wait_listening(addr, Duration::from_secs(20)),
            "prometheus did not listen on {addr}:\n{}",
            p.log()
        );
        p.wait("its API to be ready", Duration::from_secs(20), || {
            http_get(addr, "/-/ready").is_ok_and(|(code, _)| code == 200)
        });
        Some(p)
    }

    /// What Prometheus has logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// Runs an instant query; panics with Prometheus's words when it fails.
    pub fn query(&self, promql: &str) -> Vec<Series> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let (code, body) = http_get(self.addr, &path)
            .unwrap_or_else(|e| panic!("asking prometheus {promql}: {e}\n{}", self.log()));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("prometheus answered {promql} with no JSON ({e}): {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "prometheus refused {promql}: HTTP {code}: {body}"
        );
        v["data"]["result"]
            .as_array()
            .expect("a vector result")
            .iter()
            .map(|s| Series {
                labels: s["metric"].as_object().cloned().unwrap_or_default(),
                value: s["value"][1]
                    .as_str()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(f64::NAN),
            })
            .collect()
    }

    /// Waits until `promql` answers as `done` wants, at most `timeout`;
    /// the last answer.
    pub fn query_until(
        &self,
        promql: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Series]) -> bool,
    ) -> Vec<Series> {
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self.query(promql);
            if done(&answer) {
                return answer;
            }
            assert!(
                Instant::now() < deadline,
                "{promql} never answered as expected within {timeout:?}; last: {answer:#?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until every target is up (`up == 1`), at most `timeout`.
    pub fn wait_targets_up(&self, targets: usize, timeout: Duration) {
        self.query_until("up", timeout, |s| {
            s.len() == targets && s.iter().all(|x| x.value == 1.0)
        });
    }

    fn wait(&self, what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !ok() {
            assert!(
                Instant::now() < deadline,
                "prometheus: waited {timeout:?} for {what}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `prometheus.yml`: every target scraped every second.
fn scrape_config(targets: &[(&str, SocketAddr)]) -> String {
    let mut yml =
        String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
    for (job, addr) in targets {
        yml.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
        ));
    }
    yml
}

/// What `promtool check metrics` says of `text`: `Ok` with its lint
/// problems (one line each) when the text parses, `Err` with its words
/// when it does not; `None` (skip) when promtool is missing, outside CI.
pub fn promtool_check(text: &str) -> Option<Result<Vec<String>, String>> {
    let bin = require("promtool")?;
    let mut child = Command::new(bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("run promtool");
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    Some(match out.status.code() {
        Some(0) => Ok(Vec::new()),
        Some(3) => Ok(said.lines().map(str::to_string).collect()),
        other => Err(format!(
            "promtool check metrics exited with {other:?}: {said}"
        )),
    })
}

/// One `GET path` of `addr` (HTTP/1.0, so the answer is neither chunked
/// nor kept alive): the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

//! `node-agent run` with its `/metrics` address taken by another process
//! (dcgm-exporter on 9400, say): the agent still starts and samples (it
//! says READY=1 to a fake service manager), logs the address and the OS's
//! reason, and serves `/metrics` once the address is free.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopwarden_field::watchdog::NotifyListener;
use loopwarden_system_tests::free_port;

const AGENT: &str = env!("CARGO_BIN_EXE_node-agent");

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The answer to `GET /metrics` on `addr`, if it answers.
fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

#[test]
fn a_taken_metrics_address_does_not_stop_the_agent_and_is_served_once_free() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let notify = NotifyListener::bind(&dir.path().join("notify")).unwrap();
    let log = dir.path().join("agent.log");
    let child = Command::new(AGENT)
        .args(["run", "--twin-gpus", "2", "--site", "tp", "--host", "h1"])
        .args(["--broker", &format!("127.0.0.1:{}", free_port())])
        .args(["--period-ms", "200", "--metrics-listen", &addr.to_string()])
        .arg("--console")
        .arg(dir.path().join("agent.sock"))
        .env("RUST_LOG", "info,rumqttc=off")
        .env("NOTIFY_SOCKET", notify.path())
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start node-agent");
    let mut child = Guard(child);
    let ready = notify.next(Duration::from_secs(30)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(ready.as_deref(), Some("READY=1"), "log:\n{text}");
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
    assert!(
        text.contains(&format!("metrics listener on {addr}: cannot listen")),
        "the address and the reason in the log:\n{text}"
    );
    drop(taken);
    let t0 = Instant::now();
    let answer = loop {
        if let Some(a) = scrape(addr).filter(|a| a.contains("loopwarden_agent_")) {
            break a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "/metrics never served once free; log:\n{}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(child.0.try_wait().unwrap().is_none(), "still running");
}

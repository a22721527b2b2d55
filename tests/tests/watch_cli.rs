//! `lwbus watch` on a busy site, against a real mosquitto: a reader that
//! stops early (`| head -1`) ends the watch with exit 0, not a panic;
//! and a Ctrl-C that comes while a line is being written stops it.
//!
//! A host h07 in this process publishes telemetry every millisecond or
//! so: the watch always has a frame waiting.
//!
//! `lwbus` is another package's program: the test runs the one built
//! beside this test (`cargo build -p loopwarden-bus --bin lwbus`, or a
//! workspace build); missing, it is a skip outside CI and a failure in CI.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopwarden_bus::{now_ms, Bus, BusConfig};
use loopwarden_protocol::{samples, Ident, MessageKind, NodeId, Role};
use loopwarden_system_tests::{lwbus, Mosquitto};

const SITE: &str = "wc";

/// Host h07 publishing telemetry as fast as it can, until dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(port: u16) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("a runtime");
            rt.block_on(async {
                let addr: loopwarden_bus::BrokerAddr =
                    format!("127.0.0.1:{port}").parse().expect("an address");
                let node = NodeId::new(Role::Host, "h07").expect("a node");
                let config = BusConfig::new(addr, Ident::new(SITE).unwrap(), node);
                let (bus, _inbound, _task) = Bus::start(config);
                assert!(bus.wait_connected(Duration::from_secs(10)).await);
                let message = samples::frame(MessageKind::HostTelemetry).message;
                while !stopped.load(Ordering::SeqCst) {
                    // A full queue drops one: the watch still has plenty.
                    let _ = bus.publish(message.clone(), now_ms());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let _ = bus.shutdown(Duration::from_secs(2)).await;
            });
        });
        Flood {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(lwbus: &PathBuf, port: u16) -> Child {
    Command::new(lwbus)
        .args(["watch", "--broker", &format!("127.0.0.1:{port}")])
        .args(["--site", SITE])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lwbus watch")
}

/// Waits up to `timeout` for `child` to end; killed if it does not.
fn ended(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("its status") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn errors(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text
}

#[test]
fn a_reader_that_stops_after_one_line_ends_the_watch_with_exit_0() {
    let Some(lwbus) = lwbus() else { return };
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let _flood = Flood::start(broker.port());
    let mut child = watch(&lwbus, broker.port());
    let mut out = BufReader::new(child.stdout.take().expect("its output"));
    let mut first = String::new();
    out.read_line(&mut first).expect("a line");
    assert!(first.contains(" host/h07/"), "{first}");
    // `| head -1`: the reader goes.
    drop(out);
    let status = ended(&mut child, Duration::from_secs(15));
    let err = errors(&mut child);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
}

#[test]
fn a_ctrl_c_while_a_line_waits_for_the_terminal_stops_the_watch() {
    let Some(lwbus) = lwbus() else { return };
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let flood = Flood::start(broker.port());
    let mut child = watch(&lwbus, broker.port());
    let mut out = BufReader::new(child.stdout.take().expect("its output"));
    let mut first = String::new();
    out.read_line(&mut first).expect("a line");
    // Nothing read for a while: the pipe fills, and the watch waits in
    // the middle of writing a line when the Ctrl-C comes.
    std::thread::sleep(Duration::from_secs(3));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    drop(flood);
    // The terminal takes the lines again.
    let drain = std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let status = ended(&mut child, Duration::from_secs(15));
    let err = errors(&mut child);
    let _ = drain.join();
    assert!(
        status.is_some(),
        "the Ctrl-C was lost: still watching\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
}

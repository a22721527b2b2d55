//! The broker configuration of `lwbus pki init` against an attacker.
//!
//! Each test writes a site's PKI for `lab` (hosts h01 and h02 under CDU
//! cdu1, operator ops1, facility reader bms1), starts mosquitto with the
//! generated `mosquitto.conf` and ACL, and then acts with
//! `mosquitto_pub`/`mosquitto_sub` (and, in one test, a paho-mqtt client,
//! `tests/acl_attacker.py`) as a client that tries what its certificate
//! must not allow.
//!
//! Mosquitto drops a denied publish silently (a QoS 1 publish still gets
//! its PUBACK under MQTT 3.1.1), so a denial shows as "nothing arrives".
//! To tell that from "nothing arrived yet", every check ends with a
//! *marker*: a publish that is allowed, sent after the attacks; mosquitto
//! delivers a subscriber's messages in order, so once the marker is in,
//! whatever was published before it has arrived or never will.
//!
//! Glossary:
//! - *marker*: the allowed publish that closes a check (see above).
//! - *ready*: a subscriber that has received an allowed publish, so its
//!   subscription is live.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use loopwarden_system_tests::{pki_dir, require_python_module, PkiBroker};

/// The lab of every test: hosts, CDUs, operators, readers.
const LAB: [&str; 4] = ["h01,h02", "cdu1", "ops1", "bms1"];

/// How long a subscriber waits for something that must arrive.
const ARRIVE: Duration = Duration::from_secs(10);

fn lab() -> Option<PkiBroker> {
    PkiBroker::start("lab", LAB)
}

/// A client id no other client of this test process has.
fn client_id(who: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{who}-{}-{n}", std::process::id())
}

/// One QoS 1 publish with `mosquitto_pub` as `who` (none: no certificate).
fn publish_as(b: &PkiBroker, who: Option<&str>, topic: &str, payload: &str) -> Output {
    let mut cmd = b.client("mosquitto_pub", who).expect("mosquitto_pub");
    cmd.args(["-q", "1", "-i", &client_id(who.unwrap_or("anon"))]);
    cmd.args(["-t", topic, "-m", payload]);
    cmd.output().expect("run mosquitto_pub")
}

/// A publish that the broker accepts (its drop, if denied, is silent);
/// retried when a loaded machine refuses a connection now and then.
fn publish(b: &PkiBroker, who: &str, topic: &str, payload: &str) {
    let mut out = publish_as(b, Some(who), topic, payload);
    for _ in 0..4 {
        if out.status.success() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
        out = publish_as(b, Some(who), topic, payload);
    }
    panic!(
        "mosquitto_pub as {who} on {topic} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        b.log()
    );
}

/// A `mosquitto_sub` as one identity, its messages as `(topic, payload)`.
struct Sub {
    child: Child,
    rx: mpsc::Receiver<(String, String)>,
}

impl Sub {
    fn start(b: &PkiBroker, who: &str, filters: &[&str]) -> Sub {
        let mut cmd = b.client("mosquitto_sub", Some(who)).expect("mosquitto_sub");
        cmd.args(["-q", "1", "-i", &client_id(who), "-F", "%t %p"]);
        for f in filters {
            cmd.args(["-t", f]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mosquitto_sub");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let (t, p) = line.split_once(' ').unwrap_or((&line, ""));
                if tx.send((t.to_string(), p.to_string())).is_err() {
                    break;
                }
            }
        });
        Sub { child, rx }
    }

    /// Publishes `topic` as `who` until this subscriber has it: ready.
    fn ready(&self, b: &PkiBroker, who: &str, topic: &str) {
        let deadline = Instant::now() + ARRIVE;
        loop {
            publish(b, who, topic, "ready");
            if let Ok((t, p)) = self.rx.recv_timeout(Duration::from_millis(500)) {
                if t == topic && p == "ready" {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{who} never reached the subscriber on {topic}\n{}",
                b.log()
            );
        }
        // Late copies of the readiness publish.
        while self.rx.recv_timeout(Duration::from_millis(100)).is_ok() {}
    }

    /// Publishes the marker `topic` as `who` and returns what arrived before
    /// it, readiness publishes left out; panics if the marker never comes.
    fn until_marker(&self, b: &PkiBroker, who: &str, topic: &str) -> Vec<(String, String)> {
        publish(b, who, topic, "marker");
        let deadline = Instant::now() + ARRIVE;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((t, p)) if t == topic && p == "marker" => return before,
                Ok((_, p)) if p == "ready" => {}
                Ok(seen) => before.push(seen),
                Err(_) => panic!(
                    "the marker {topic} never arrived; before it: {before:?}\n{}",
                    b.log()
                ),
            }
        }
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seen(topic: &str, payload: &str) -> (String, String) {
    (topic.to_string(), payload.to_string())
}

#[test]
fn clients_without_a_site_certificate_are_refused() {
    let Some(b) = lab() else { return };
    let other = pki_dir("lab", LAB, 1);
    let refused = |out: Output, what: &str| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{what} was let in: {stderr}\n{}",
            b.log()
        );
    };
    assert!(other.path().join("h01.key").is_file());
    refused(
        publish_as(&b, None, "dc/v2/lab/host/h01/telemetry", "x"),
        "no certificate",
    );
    let mut cmd = b.client("mosquitto_pub", None).expect("mosquitto_pub");
    cmd.arg("--cert").arg(other.path().join("h01.crt"));
    cmd.arg("--key").arg(other.path().join("h01.key"));
    cmd.args(["-q", "1", "-t", "dc/v2/lab/host/h01/telemetry", "-m", "x"]);
    refused(
        cmd.output().expect("run mosquitto_pub"),
        "h01 of another CA",
    );
    // The same publish with the site's own h01 is let in.
    publish(&b, "h01", "dc/v2/lab/host/h01/telemetry", "x");
}

#[test]
fn a_host_cannot_publish_as_another_node() {
    let Some(b) = lab() else { return };
    let own = "dc/v2/lab/host/h01/telemetry";
    let reader = Sub::start(&b, "bms1", &["dc/v2/lab/#"]);
    reader.ready(&b, "h01", own);
    for forged in [
        "dc/v2/lab/host/h02/health",
        "dc/v2/lab/cdu/cdu1/health",
        "dc/v2/lab/host/h02/cmd",
        "dc/v2/lab/json/host/h02/health",
    ] {
        publish(&b, "h01", forged, "forged");
    }
    publish(&b, "h01", own, "control");
    let before = reader.until_marker(&b, "h01", own);
    assert_eq!(
        before,
        [seen(own, "control")],
        "only h01's own topic gets through"
    );
}

#[test]
fn only_operators_and_cdus_publish_commands() {
    let Some(b) = lab() else { return };
    let (h01_cmd, h02_cmd) = ("dc/v2/lab/host/h01/cmd", "dc/v2/lab/host/h02/cmd");
    let reader = Sub::start(&b, "bms1", &["dc/v2/lab/#"]);
    reader.ready(&b, "h01", "dc/v2/lab/host/h01/telemetry");
    publish(&b, "h01", h01_cmd, "host to itself");
    publish(&b, "h01", h02_cmd, "host to host");
    for topic in [
        h01_cmd,
        "dc/v2/lab/cdu/cdu1/cmd",
        "dc/v2/lab/facility/bms1/event",
        "dc/v2/lab/host/h01/telemetry",
        "dc/v2/lab/json/host/h01/health",
    ] {
        publish(&b, "bms1", topic, "reader");
    }
    publish(&b, "ops1", h01_cmd, "operator");
    publish(&b, "cdu1", h02_cmd, "controller");
    let before = reader.until_marker(&b, "h01", "dc/v2/lab/host/h01/telemetry");
    assert_eq!(
        before,
        [seen(h01_cmd, "operator"), seen(h02_cmd, "controller")]
    );
}

#[test]
fn readers_and_operators_ask_for_resends_and_only_the_node_itself_answers() {
    let Some(b) = lab() else { return };
    let (h01_resend, h01_resent) = ("dc/v2/lab/host/h01/resend", "dc/v2/lab/host/h01/resent");
    let marker = "dc/v2/lab/host/h01/telemetry";
    let reader = Sub::start(&b, "bms1", &["dc/v2/lab/#"]);
    reader.ready(&b, "h01", marker);
    publish(&b, "bms1", h01_resend, "reader asks");
    publish(&b, "ops1", "dc/v2/lab/cdu/cdu1/resend", "operator asks");
    publish(&b, "h02", h01_resend, "host asks host");
    publish(&b, "cdu1", h01_resend, "controller asks");
    publish(&b, "h02", h01_resent, "host answers for host");
    publish(&b, "bms1", h01_resent, "reader answers");
    publish(&b, "h01", h01_resent, "h01 answers");
    let before = reader.until_marker(&b, "h01", marker);
    assert_eq!(
        before,
        [
            seen(h01_resend, "reader asks"),
            seen("dc/v2/lab/cdu/cdu1/resend", "operator asks"),
            seen(h01_resent, "h01 answers"),
        ]
    );
    // The request reaches the node asked, and no other host.
    let h02_resend = "dc/v2/lab/host/h02/resend";
    let h01 = Sub::start(&b, "h01", &[h01_resend]);
    let h02 = Sub::start(&b, "h02", &[h01_resend, h02_resend]);
    h01.ready(&b, "bms1", h01_resend);
    h02.ready(&b, "bms1", h02_resend);
    publish(&b, "bms1", h01_resend, "again");
    assert_eq!(
        h01.until_marker(&b, "bms1", h01_resend),
        [seen(h01_resend, "again")]
    );
    let to_h02 = h02.until_marker(&b, "bms1", h02_resend);
    assert!(to_h02.is_empty(), "h02 read {to_h02:?}");
}

#[test]
fn a_host_reads_only_its_own_commands() {
    let Some(b) = lab() else { return };
    let (h01_cmd, h02_cmd) = ("dc/v2/lab/host/h01/cmd", "dc/v2/lab/host/h02/cmd");
    let h01 = Sub::start(&b, "h01", &[h01_cmd]);
    let h02 = Sub::start(&b, "h02", &[h01_cmd, h02_cmd, "dc/v2/lab/host/+/cmd"]);
    h01.ready(&b, "ops1", h01_cmd);
    h02.ready(&b, "ops1", h02_cmd);
    publish(&b, "ops1", h01_cmd, "for h01 only");
    let to_h01 = h01.until_marker(&b, "ops1", h01_cmd);
    assert_eq!(to_h01, [seen(h01_cmd, "for h01 only")]);
    // h02 has two subscriptions on its own topic: the marker may come twice.
    let to_h02 = h02.until_marker(&b, "ops1", h02_cmd);
    assert!(to_h02.is_empty(), "h02 read {to_h02:?}");
}

#[test]
fn a_paho_client_is_refused_without_a_site_certificate_and_its_forgery_dropped() {
    let Some(python) = require_python_module("paho") else {
        return;
    };
    let Some(b) = lab() else { return };
    let other = pki_dir("lab", LAB, 1);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/acl_attacker.py");
    let out = Command::new(python)
        .arg(script)
        .args(["--port", &b.port().to_string(), "--site", "lab"])
        .arg("--dir")
        .arg(b.dir())
        .arg("--other-dir")
        .arg(other.path())
        .output()
        .expect("run acl_attacker.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "acl_attacker.py failed: {stderr}");
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(r["no_cert"]["connected"], false, "{r}");
    assert_eq!(r["other_ca"]["connected"], false, "{r}");
    assert_eq!(r["reader_subscribed"], true, "{r}");
    assert_eq!(r["h01_connected"], true, "{r}");
    assert_eq!(r["marker_seen"], true, "{r}");
    assert_eq!(
        r["seen"],
        serde_json::json!(["dc/v2/lab/host/h01/telemetry"]),
        "h01's forgeries arrived\n{}",
        b.log()
    );
}

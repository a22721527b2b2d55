//! `lwbus flash` on a flash file that holds what both agents log: a
//! node agent's accepted command (the frame whole), a controller's sent
//! lease and lift (host id, then the frame), an event, and a record that
//! reads as neither. Each is shown in words, and with `--json` as JSON;
//! the one that cannot be read says so.

use std::process::Command;

use loopwarden_protocol::{samples, Ident, MessageKind, TimestampMs, MAX_FRAME_LEN};
use loopwarden_store::lease_record::LeaseRecord;

fn flash_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("flash.bin");
    let mut stores = loopwarden_store::agent_flash::open(Some(&path)).expect("flash opens");
    let lease = samples::frame(MessageKind::CapLease);
    let mut frame = [0u8; MAX_FRAME_LEN];
    let n = lease.encode(&mut frame).unwrap();
    let mut event = [0u8; MAX_FRAME_LEN];
    let e = samples::message(MessageKind::Event)
        .encode_body(&mut event)
        .unwrap();
    let record = |lift| {
        LeaseRecord {
            host: Ident::new("h03").unwrap(),
            lift,
            frame: lease.clone(),
        }
        .encode()
        .unwrap()
    };
    let cap = MessageKind::CapLease as u8;
    let records: [(u8, &[u8]); 5] = [
        (cap, &frame[..n]),
        (cap, &record(false)),
        (cap, &record(true)),
        (MessageKind::Event as u8, &event[..e]),
        (cap, &[9, 9, 9]),
    ];
    futures::executor::block_on(async {
        for (kind, body) in records {
            stores
                .log
                .append(TimestampMs(1_780_000_000_000), kind, body)
                .await
                .expect("record appended");
        }
    });
    drop(stores);
    path
}

fn lwbus_flash(path: &std::path::Path, json: bool) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lwbus"));
    cmd.arg("flash").arg(path);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("lwbus runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lwbus flash failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

/// The log's lines (after the first, which counts records), by record.
fn log_lines(lines: &[String]) -> &[String] {
    &lines[1..6]
}

#[test]
fn every_record_both_agents_log_reads_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = flash_file(dir.path());
    let lines = lwbus_flash(&path, false);
    let log = log_lines(&lines);
    assert!(
        log[0].contains("cap_lease") && log[0].contains(" from "),
        "{log:?}"
    );
    assert!(
        log[1].contains("lease_sent") && log[1].contains("h03: "),
        "{log:?}"
    );
    assert!(
        log[2].contains("lift_sent") && log[2].contains("cap lifted on h03"),
        "{log:?}"
    );
    assert!(!log[3].contains("unreadable"), "{log:?}");
    assert!(log[4].contains("command frame unreadable"), "{log:?}");
}

#[test]
fn with_json_a_sent_lease_is_one_object_with_its_host_and_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = flash_file(dir.path());
    let lines = lwbus_flash(&path, true);
    let log = log_lines(&lines);
    for (i, lift) in [(1, false), (2, true)] {
        let json = &log[i][log[i].find('{').expect("JSON")..];
        let v: serde_json::Value = serde_json::from_str(json).expect(json);
        let r = &v["lease_record"];
        assert_eq!(r["host"], "h03", "{v}");
        assert_eq!(r["lift"], lift, "{v}");
        assert_eq!(r["frame"]["kind"], "cap_lease", "{v}");
        assert!(r["frame"]["body"]["caps"].is_array(), "{v}");
    }
}

/// An event log that does not read (its sectors zeroed) is said, and the
/// outbox and the config store are still read and printed; the command
/// then fails, naming the store that did not read.
#[test]
fn an_unreadable_event_log_is_said_and_the_other_stores_still_read() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = flash_file(dir.path());
    let log = loopwarden_boards::FlashBoard::host_file().layout().log;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let zeros = vec![0u8; (log.end - log.start) as usize];
    file.write_all_at(&zeros, log.start.into()).unwrap();
    drop(file);
    let out = Command::new(env!("CARGO_BIN_EXE_lwbus"))
        .arg("flash")
        .arg(&path)
        .output()
        .expect("lwbus runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("event log unreadable: flash store corrupted"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("outbox: 0 frames not yet acknowledged"),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("frame sequence numbers reserved up to"),
        "{stdout}"
    );
    assert!(!out.status.success(), "{stdout}");
    assert!(stderr.contains("the event log did not read"), "{stderr}");
}

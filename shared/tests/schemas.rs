//! The JSON Schemas committed under `docs/schemas/` are the ones the code
//! generates, and every sample frame's JSON is valid against its schema's
//! shape. (The whole-system test checks the JSON on the bus against the
//! committed files with Python's `jsonschema`, a validator written elsewhere.)
//! Regenerate on purpose with `LOOPWARDEN_BLESS=1`.

#![cfg(feature = "std")]

use std::path::PathBuf;

use loopwarden_protocol::{json, samples, Frame, MessageKind, Version, PROTOCOL};

fn schema_path(kind: MessageKind) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/schemas")
        .join(format!("{}.json", kind.name()))
}

#[test]
fn committed_schemas_are_current() {
    let bless = std::env::var_os("LOOPWARDEN_BLESS").is_some();
    for kind in MessageKind::ALL {
        let path = schema_path(kind);
        let generated = json::schema_text(kind);
        if bless {
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run with LOOPWARDEN_BLESS=1)", path.display()));
        assert!(
            committed == generated,
            "{} is stale: run LOOPWARDEN_BLESS=1 cargo test -p loopwarden-protocol --test schemas",
            path.display()
        );
    }
}

#[test]
fn sample_json_names_its_kind_and_round_trips() {
    for kind in MessageKind::ALL {
        let frame = samples::frame(kind);
        let text = frame.to_json();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["kind"], kind.name());
        assert_eq!(value["protocol"], "2.10");
        assert_eq!(Frame::from_json(&text).unwrap(), frame);
    }
}

#[test]
fn json_reads_like_units() {
    let t = samples::frame(MessageKind::CduTelemetry).to_json();
    assert!(t.contains(r#""supply":32.05"#), "{t}");
    assert!(t.contains(r#""pue":1.084"#), "{t}");
    let t = samples::frame(MessageKind::HostTelemetry).to_json();
    assert!(t.contains(r#""throttle":["sw_power_cap"]"#), "{t}");
    assert!(t.contains(r#""flags":["responsive","ecc_enabled"]"#), "{t}");
    let t = samples::frame(MessageKind::HostHealth).to_json();
    assert!(t.contains(r#""reason":"xid-79""#), "{t}");
}

#[test]
fn json_refuses_bad_input_with_a_reason() {
    let good = samples::frame(MessageKind::Online).to_json();
    let newer = good.replace(r#""protocol":"2.10""#, r#""protocol":"3.0""#);
    assert!(Frame::from_json(&newer)
        .unwrap_err()
        .to_string()
        .contains("3.0"));
    let bad_pct = samples::frame(MessageKind::CduTelemetry)
        .to_json()
        .replace(r#""reservoir":81"#, r#""reservoir":181"#);
    assert!(Frame::from_json(&bad_pct)
        .unwrap_err()
        .to_string()
        .contains("percent"));
    assert!(Frame::from_json("{").is_err());
}

/// A two-digit minor is a number: 2.10 is newer than 2.9 (not older, as
/// the strings would sort), prints as "2.10", and JSON of any minor of
/// this major, one or two digits, older or newer, is read.
#[test]
fn a_two_digit_minor_is_read_and_compared_as_a_number() {
    assert_eq!(PROTOCOL.to_string(), "2.10");
    let older = Version { major: 2, minor: 9 };
    assert!(PROTOCOL > older, "2.10 is newer than 2.9");
    assert!("2.10" < "2.9", "as strings they sort the other way");
    let frame = samples::frame(MessageKind::Online);
    let good = frame.to_json();
    assert!(good.contains(r#""protocol":"2.10""#), "{good}");
    for version in ["2.9", "2.10", "2.11", "2.255"] {
        let text = good.replace(
            r#""protocol":"2.10""#,
            &format!(r#""protocol":"{version}""#),
        );
        assert_eq!(Frame::from_json(&text).unwrap(), frame, "{version}");
    }
    for version in ["3.10", "1.10", "2", "2.", "2.x", "2.256"] {
        let text = good.replace(
            r#""protocol":"2.10""#,
            &format!(r#""protocol":"{version}""#),
        );
        let e = Frame::from_json(&text).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{version:?}")) && e.contains("speaks 2.10"),
            "{e}"
        );
    }
}

//! Each way a frame can be wrong gets its own typed error.

use loopwarden_protocol::{
    samples, DecodeError, Frame, MessageKind, Version, MAX_FRAME_LEN, PROTOCOL,
};

fn with_crc(mut content: Vec<u8>) -> Vec<u8> {
    let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(&content);
    content.extend_from_slice(&crc.to_le_bytes());
    content
}

fn sample_bytes() -> Vec<u8> {
    samples::frame(MessageKind::HostTelemetry).to_vec().unwrap()
}

#[test]
fn bad_crc() {
    let mut b = sample_bytes();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    assert!(matches!(Frame::decode(&b), Err(DecodeError::BadCrc { .. })));
}

#[test]
fn unknown_kind() {
    let mut b = sample_bytes();
    b.truncate(b.len() - 4);
    b[2] = 200;
    assert_eq!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::UnknownKind { code: 200 })
    );
}

#[test]
fn newer_major_version() {
    let mut b = sample_bytes();
    b.truncate(b.len() - 4);
    b[0] = 3;
    assert_eq!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::UnsupportedVersion {
            found: Version {
                major: 3,
                minor: PROTOCOL.minor
            }
        })
    );
}

#[test]
fn truncated_body_with_recomputed_crc() {
    let mut b = sample_bytes();
    b.truncate(b.len() - 4 - 10);
    assert_eq!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { part: "body" })
    );
}

#[test]
fn truncated_frame_is_a_crc_or_length_error() {
    let b = sample_bytes();
    assert!(matches!(
        Frame::decode(&b[..b.len() - 1]),
        Err(DecodeError::BadCrc { .. })
    ));
    assert_eq!(
        Frame::decode(&b[..5]),
        Err(DecodeError::TooShort { len: 5 })
    );
    assert_eq!(Frame::decode(&[]), Err(DecodeError::TooShort { len: 0 }));
}

#[test]
fn oversized_frame() {
    let b = vec![0u8; MAX_FRAME_LEN + 1];
    assert_eq!(
        Frame::decode(&b),
        Err(DecodeError::TooLong {
            len: MAX_FRAME_LEN + 1
        })
    );
}

#[test]
fn trailing_bytes_same_minor_refused_newer_minor_ignored() {
    let mut b = sample_bytes();
    b.truncate(b.len() - 4);
    b.extend_from_slice(&[7, 7, 7]);
    assert_eq!(
        Frame::decode(&with_crc(b.clone())),
        Err(DecodeError::TrailingBytes { count: 3 })
    );
    // A newer minor may append fields: the tail is ignored.
    b[1] = PROTOCOL.minor + 1;
    let f = Frame::decode(&with_crc(b)).unwrap();
    assert_eq!(f, samples::frame(MessageKind::HostTelemetry));
}

#[test]
fn malformed_values_are_refused() {
    // An event frame whose body is an Xid with GPU index 99.
    let f = samples::frame(MessageKind::Event);
    let mut b = f.to_vec().unwrap();
    b.truncate(b.len() - 4);
    let body_at = b.len() - 3; // variant 0, gpu 3, xid 79
    assert_eq!(&b[body_at..], &[0, 3, 79]);
    b[body_at + 1] = 99;
    assert_eq!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Malformed { part: "body" })
    );
}

#[test]
fn errors_say_what_was_wrong() {
    let e = DecodeError::UnsupportedVersion {
        found: Version { major: 3, minor: 1 },
    };
    assert_eq!(
        e.to_string(),
        "protocol version 3.1 is not supported (this reader speaks 2.10)"
    );
    let e = DecodeError::BadCrc {
        carried: 1,
        computed: 2,
    };
    assert!(e.to_string().contains("damaged or cut short"));
}

#[test]
fn the_largest_messages_fit_a_frame() {
    use loopwarden_protocol::message::*;
    use loopwarden_protocol::*;
    let long = "x".repeat(200);
    let gpus = (0..16u8)
        .map(|i| GpuHealth {
            gpu: GpuIndex::new(i).unwrap(),
            state: HealthState::Quarantined,
            reason: ReasonCode(u16::MAX),
            since: TimestampMs(u64::MAX),
            evidence: Text::truncated(&long),
        })
        .collect();
    let sender = NodeId::new(Role::Host, &"h".repeat(32)).unwrap();
    let f = Frame {
        sender: sender.clone(),
        seq: u32::MAX,
        time: TimestampMs(u64::MAX),
        message: Message::HostHealth(HostHealth {
            gpus,
            monitoring: Default::default(),
        }),
    };
    let len = f.to_vec().unwrap().len();
    assert!(len <= MAX_FRAME_LEN, "largest health frame is {len} bytes");
    let mut t = samples::gpu_at_load(0);
    t.ecc = EccCounts {
        sbe_volatile: u32::MAX,
        dbe_volatile: u32::MAX,
        sbe_aggregate: u32::MAX,
        dbe_aggregate: u32::MAX,
    };
    t.pcie_replay = u32::MAX;
    t.power = Watts(u32::MAX);
    let f = Frame {
        sender,
        seq: u32::MAX,
        time: TimestampMs(u64::MAX),
        message: Message::HostTelemetry(HostTelemetry {
            gpus: (0..16).map(|_| t.clone()).collect(),
            drops: QueueDrops {
                xids: u32::MAX,
                flash: u32::MAX,
                bus: u32::MAX,
                acks_withheld: u32::MAX,
            },
        }),
    };
    let len = f.to_vec().unwrap().len();
    assert!(
        len <= MAX_FRAME_LEN,
        "largest telemetry frame is {len} bytes"
    );
    // A CDU of 16 racks with every reading and every learned figure at
    // its widest.
    let figure = FigureEstimate {
        ratio_permille: u16::MAX,
        confidence_pct: Percent::FULL,
        trust_pct: Percent::FULL,
    };
    let f = Frame {
        sender: NodeId::new(Role::Cdu, &"c".repeat(32)).unwrap(),
        seq: u32::MAX,
        time: TimestampMs(u64::MAX),
        message: Message::CduTelemetry(CduTelemetry {
            supply: Some(Celsius::MAX),
            return_temp: Some(Celsius::MAX),
            setpoint: Celsius::MAX,
            flow: Some(LitresPerMinute::MAX),
            diff_pressure: Some(KiloPascals::MAX),
            facility_supply: Some(Celsius::MAX),
            ambient: Some(Celsius::MAX),
            reservoir: Some(Percent::FULL),
            pump_a: PumpStatus {
                running: true,
                command: Percent::FULL,
                feedback: Some(Percent::FULL),
            },
            pump_b: PumpStatus::default(),
            racks: (0..16u8)
                .map(|r| RackStatus {
                    rack: RackIndex::new(r).unwrap(),
                    valve: Percent::FULL,
                    leak: true,
                })
                .collect(),
            it_power: Some(Watts(u32::MAX)),
            cooling_power: Some(Watts(u32::MAX)),
            facility_power: Some(Watts(u32::MAX)),
            pue: Some(Pue::MAX),
            learned: Some(HallEstimates {
                host_factor_min_permille: u16::MAX,
                host_factor_max_permille: u16::MAX,
                host_factor_max_host: Some(Ident::new(&"h".repeat(32)).unwrap()),
                host_trust_min_pct: Percent::FULL,
                dry_cooler_ua: figure,
                chiller_cop: figure,
                pump_power: figure,
                flow_per_gpu_full_lpm: LitresPerMinute::MAX,
                approach_centikelvin: u16::MAX,
                outdoor_fallback: true,
            }),
        }),
    };
    let len = f.to_vec().unwrap().len();
    assert!(len <= 256, "largest CDU telemetry frame is {len} bytes");
}

#[test]
fn a_2_0_telemetry_frame_reads_with_no_drops_and_is_not_taken_for_2_1() {
    let mut want = samples::frame(MessageKind::HostTelemetry);
    // 2.0 wrote the body without `drops`: the sample's drops (12, 0, 1,
    // and 0 acks withheld) are its last four bytes, one varint each.
    let mut b = want.to_vec().unwrap();
    b.truncate(b.len() - 4 - 4);
    b[1] = 0;
    let got = Frame::decode(&with_crc(b.clone())).expect("a 2.0 frame reads");
    if let loopwarden_protocol::Message::HostTelemetry(t) = &mut want.message {
        t.drops = Default::default();
    }
    assert_eq!(got, want);
    // The same body stamped 2.1 lacks a field.
    b[1] = 1;
    assert!(matches!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_2_6_telemetry_frame_reads_with_no_acks_withheld_and_is_not_taken_for_2_7() {
    let want = samples::frame(MessageKind::HostTelemetry);
    // 2.6 wrote `drops` without `acks_withheld`, the sample's last byte (0).
    let mut b = want.to_vec().unwrap();
    assert_eq!(b[b.len() - 5], 0, "acks_withheld");
    b.truncate(b.len() - 4 - 1);
    b[1] = 6;
    let got = Frame::decode(&with_crc(b.clone())).expect("a 2.6 frame reads");
    assert_eq!(got, want);
    b[1] = 7;
    assert!(matches!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_2_2_cdu_state_frame_reads_with_no_facility_and_is_not_taken_for_2_3() {
    let mut want = samples::frame(MessageKind::CduState);
    if let loopwarden_protocol::Message::CduState(s) = &mut want.message {
        assert!(
            s.facility.is_some(),
            "the sample carries an offer and a plan"
        );
        s.facility = None;
        s.auth = Default::default();
    }
    // 2.2 wrote the body without `facility` and unsigned: today's body
    // with `facility` `None` is 2.2's, one byte more (the `None`) and the
    // signature (AUTH_LEN bytes), before the CRC.
    let mut b = want.to_vec().unwrap();
    b.truncate(b.len() - 4 - AUTH_LEN);
    assert_eq!(b[b.len() - 1], 0, "the None of `facility`");
    b.truncate(b.len() - 1);
    b[1] = 2;
    let got = Frame::decode(&with_crc(b.clone())).expect("a 2.2 frame reads");
    assert_eq!(got, want);
    // The same body stamped 2.3 lacks a field.
    b[1] = 3;
    assert!(matches!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { .. })
    ));
}

/// Bytes of a [`loopwarden_protocol::CommandAuth`] in a body: its key id
/// and the 64 bytes of its signature.
const AUTH_LEN: usize = 1 + 64;

#[test]
fn a_2_6_cdu_state_frame_reads_unsigned_and_is_not_taken_for_2_7() {
    let mut want = samples::frame(MessageKind::CduState);
    // 2.6 wrote the body without the signature, its last AUTH_LEN bytes.
    let mut b = want.to_vec().unwrap();
    b.truncate(b.len() - 4 - AUTH_LEN);
    b[1] = 6;
    let got = Frame::decode(&with_crc(b.clone())).expect("a 2.6 frame reads");
    if let loopwarden_protocol::Message::CduState(s) = &mut want.message {
        assert_ne!(s.auth, Default::default(), "the sample is signed");
        s.auth = Default::default();
    }
    assert_eq!(got, want, "read as unsigned");
    let key = samples::demo_signing_key().verifying_key();
    assert!(
        got.verify(&samples::cdu_state_topic(), |_, _| Some(&key))
            .is_err(),
        "an unsigned state does not verify"
    );
    // The same body stamped 2.7 lacks a field.
    b[1] = 7;
    assert!(matches!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn a_2_1_cdu_telemetry_frame_reads_with_nothing_learned_and_is_not_taken_for_2_2() {
    let mut want = samples::frame(MessageKind::CduTelemetry);
    if let loopwarden_protocol::Message::CduTelemetry(t) = &mut want.message {
        assert!(t.learned.is_some(), "the sample carries what was learned");
        t.learned = None;
    }
    // 2.1 wrote the body without `learned`: today's body with `learned`
    // `None` is 2.1's and one byte more (the `None`), before the CRC.
    let mut b = want.to_vec().unwrap();
    assert_eq!(b[b.len() - 5], 0, "the None of `learned`");
    b.truncate(b.len() - 4 - 1);
    b[1] = 1;
    let got = Frame::decode(&with_crc(b.clone())).expect("a 2.1 frame reads");
    assert_eq!(got, want);
    // And 2.0's, which had the same CDU telemetry.
    b[1] = 0;
    assert_eq!(Frame::decode(&with_crc(b.clone())).unwrap(), want);
    // The same body stamped 2.2 lacks a field.
    b[1] = 2;
    assert!(matches!(
        Frame::decode(&with_crc(b)),
        Err(DecodeError::Truncated { .. })
    ));
}

/// A JSON reader that meets a reason or flag name it does not know (a
/// newer minor's) refuses the frame naming the name, the field it is in and
/// both versions, not as "unknown reason name" somewhere in the frame.
#[test]
fn json_naming_an_unknown_reason_or_flag_is_refused_naming_it_and_its_field() {
    use loopwarden_protocol::json::JsonError;
    let newer = |kind: MessageKind, from: &str, to: &str| {
        let good = samples::frame(kind).to_json();
        assert!(good.contains(from), "{good}");
        let bad = good
            .replace(from, to)
            .replace(r#""protocol":"2.10""#, r#""protocol":"2.11""#);
        Frame::from_json(&bad).unwrap_err()
    };
    let e = newer(
        MessageKind::CduState,
        r#""reason":"capacity-short""#,
        r#""reason":"pump-sulking""#,
    );
    assert_eq!(
        e.to_string(),
        r#"unknown reason "pump-sulking" in body.reason: this reader speaks 2.10, the frame 2.11"#
    );
    match e {
        JsonError::UnknownName {
            what, name, field, ..
        } => {
            assert_eq!(
                (what, name.as_str(), field.as_str()),
                ("reason", "pump-sulking", "body.reason")
            )
        }
        e => panic!("{e:?}"),
    }
    let e = newer(
        MessageKind::HostHealth,
        r#""reason":"xid-79""#,
        r#""reason":"xid-1000""#,
    );
    assert!(
        e.to_string()
            .starts_with(r#"unknown reason "xid-1000" in body.gpus[3].reason: "#),
        "{e}"
    );
    let e = newer(
        MessageKind::HostTelemetry,
        r#""flags":["responsive","ecc_enabled"]"#,
        r#""flags":["responsive","ecc_sparkly"]"#,
    );
    assert!(
        e.to_string()
            .starts_with(r#"unknown flag "ecc_sparkly" in body.gpus[0].flags: "#),
        "{e}"
    );
    // A frame of another major is refused for its version first.
    let good = samples::frame(MessageKind::CduState).to_json();
    let other_major = good
        .replace(r#""reason":"capacity-short""#, r#""reason":"pump-sulking""#)
        .replace(r#""protocol":"2.10""#, r#""protocol":"3.0""#);
    let e = Frame::from_json(&other_major).unwrap_err();
    assert!(
        matches!(&e, JsonError::UnsupportedVersion(v) if v == "3.0"),
        "{e:?}"
    );
    // A version not written as the protocol writes it is refused, not
    // read as the version it resembles.
    for odd in [
        "2.010", "02.10", "+2.10", "2.+10", "2. 10", "2.", ".10", "2.10.0",
    ] {
        let frame = good.replace(r#""protocol":"2.10""#, &format!(r#""protocol":"{odd}""#));
        let e = Frame::from_json(&frame).unwrap_err();
        assert!(
            matches!(&e, JsonError::UnsupportedVersion(v) if v == odd),
            "{odd}: {e:?}"
        );
    }
    // Anything else wrong is still said as serde_json says it.
    let e = newer(
        MessageKind::CduState,
        r#""reason":"capacity-short""#,
        r#""reason":7"#,
    );
    assert!(matches!(e, JsonError::Invalid(_)), "{e:?}");
}

/// The field named is the one whose own parser refuses the name: a flag
/// valid in `flags` but unknown in `unsupported` is named in
/// `unsupported`, and a reason name written in an evidence sentence is not
/// taken for the reason.
#[test]
fn json_names_the_field_whose_parser_refuses_the_name() {
    let edit = |kind: MessageKind, change: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_str(&samples::frame(kind).to_json()).unwrap();
        change(&mut v["body"]);
        Frame::from_json(&v.to_string()).unwrap_err().to_string()
    };
    let e = edit(MessageKind::HostTelemetry, &|body| {
        let gpu = &mut body["gpus"][0];
        assert!(
            gpu["flags"]
                .as_array()
                .unwrap()
                .contains(&"ecc_enabled".into()),
            "{gpu}"
        );
        gpu["unsupported"] = serde_json::json!(["ecc_enabled"]);
    });
    assert!(
        e.starts_with(r#"unknown flag "ecc_enabled" in body.gpus[0].unsupported: "#),
        "{e}"
    );
    let e = edit(MessageKind::HostHealth, &|body| {
        body["gpus"][0]["evidence"] = "xid-1000".into();
        body["gpus"][3]["reason"] = "xid-1000".into();
    });
    assert!(
        e.starts_with(r#"unknown reason "xid-1000" in body.gpus[3].reason: "#),
        "{e}"
    );
}

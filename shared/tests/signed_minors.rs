//! A signed frame verifies across minor versions: its signature covers
//! the bytes its sender wrote (byte 1 is the sender's minor, not the
//! receiver's), built here by hand as docs/bus.md section 9.4 says, as a
//! signer of another minor would.

use ed25519_dalek::Signer as _;
use loopwarden_protocol::auth::AuthError;
use loopwarden_protocol::topic::Topic;
use loopwarden_protocol::{samples, Frame, Message, MessageKind, PROTOCOL};

fn with_crc(mut content: Vec<u8>) -> Vec<u8> {
    let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(&content);
    content.extend_from_slice(&crc.to_le_bytes());
    content
}

/// The sample frame of `kind` as a signer of minor `minor` sends it to
/// `to`: byte 1 = `minor`, `tail` after the body's last field (the auth),
/// signed over the topic, a zero byte and the frame before the CRC with
/// the signature zeroed, and a fresh CRC.
fn signed_as(kind: MessageKind, to: &Topic, minor: u8, tail: &[u8]) -> Vec<u8> {
    let bytes = samples::frame(kind).to_vec().unwrap();
    let mut content = bytes[..bytes.len() - 4].to_vec();
    let sig_at = content.len() - 64;
    content[1] = minor;
    content[sig_at..].fill(0);
    content.extend_from_slice(tail);
    let mut signed = to.build().unwrap().as_bytes().to_vec();
    signed.push(0);
    signed.extend_from_slice(&content);
    let signature = samples::demo_signing_key().sign(&signed).to_bytes();
    content[sig_at..sig_at + 64].copy_from_slice(&signature);
    with_crc(content)
}

fn verify(frame: &Frame, to: &Topic) -> Result<(), AuthError> {
    let key = samples::demo_signing_key().verifying_key();
    frame.verify(to, |_, id| (id == 1).then_some(&key))
}

#[test]
fn the_hand_built_bytes_at_this_minor_are_the_crates_own() {
    let to = samples::command_topic();
    let own = samples::frame(MessageKind::CapLease).to_vec().unwrap();
    assert_eq!(
        signed_as(MessageKind::CapLease, &to, PROTOCOL.minor, &[]),
        own
    );
}

#[test]
fn a_cap_lease_signed_by_an_older_minor_verifies() {
    assert_eq!(PROTOCOL.minor, 10, "move these minors with the version");
    let to = samples::command_topic();
    for minor in [7, 8, 9] {
        let f = Frame::decode(&signed_as(MessageKind::CapLease, &to, minor, &[])).unwrap();
        let mut want = samples::frame(MessageKind::CapLease);
        if let (Message::CapLease(w), Message::CapLease(got)) = (&mut want.message, &f.message) {
            w.auth.signature = got.auth.signature; // signed over other bytes
        }
        assert_eq!(f, want);
        assert_eq!(verify(&f, &to), Ok(()), "signed at 2.{minor}");
    }
}

#[test]
fn a_cap_lease_signed_by_a_newer_minor_without_new_fields_verifies() {
    let to = samples::command_topic();
    let bytes = signed_as(MessageKind::CapLease, &to, PROTOCOL.minor + 1, &[]);
    let f = Frame::decode(&bytes).unwrap();
    assert_eq!(verify(&f, &to), Ok(()));
}

#[test]
fn other_signed_kinds_verify_across_minors() {
    for (kind, to) in [
        (MessageKind::QuarantineRelease, samples::command_topic()),
        (MessageKind::CduState, samples::cdu_state_topic()),
        (MessageKind::ResendRequest, samples::resend_topic()),
    ] {
        for minor in [PROTOCOL.minor - 1, PROTOCOL.minor + 1] {
            let f = Frame::decode(&signed_as(kind, &to, minor, &[])).unwrap();
            assert_eq!(
                verify(&f, &to),
                Ok(()),
                "{} signed at 2.{minor}",
                kind.name()
            );
        }
    }
}

#[test]
fn a_newer_minors_command_with_fields_after_its_auth_is_refused_as_uncheckable() {
    let to = samples::command_topic();
    let minor = PROTOCOL.minor + 1;
    let bytes = signed_as(MessageKind::CapLease, &to, minor, &[1, 2, 3]);
    let f = Frame::decode(&bytes).expect("a newer minor's tail is ignored when decoding");
    let err = verify(&f, &to).unwrap_err();
    assert_eq!(err, AuthError::NewerFields { minor });
    let words = err.to_string();
    assert!(
        words.starts_with(
            "a newer minor's command with fields this version cannot check; upgrade this receiver"
        ),
        "{words}"
    );
    assert!(
        words.contains(&format!("(the frame is 2.{minor}, this receiver 2.10)")),
        "{words}"
    );
}

#[test]
fn the_minor_in_byte_1_is_signed() {
    let to = samples::command_topic();
    let mut bytes = signed_as(MessageKind::CapLease, &to, 8, &[]);
    bytes[1] = PROTOCOL.minor; // the signer wrote 8
    let n = bytes.len();
    let bytes = with_crc(bytes[..n - 4].to_vec());
    let f = Frame::decode(&bytes).unwrap();
    assert_eq!(verify(&f, &to), Err(AuthError::BadSignature));
    // And the other way: signed here, relabelled as another minor.
    let mut own = samples::frame(MessageKind::CapLease).to_vec().unwrap();
    own[1] = 8;
    let f = Frame::decode(&with_crc(own[..n - 4].to_vec())).unwrap();
    assert_eq!(verify(&f, &to), Err(AuthError::BadSignature));
}

#[test]
fn signing_a_received_frame_again_signs_it_as_this_version_encodes_it() {
    let to = samples::command_topic();
    let mut f = Frame::decode(&signed_as(MessageKind::CapLease, &to, 8, &[])).unwrap();
    f.sign(&to, 1, &samples::demo_signing_key()).unwrap();
    let again = Frame::decode(&f.to_vec().unwrap()).unwrap();
    assert_eq!(verify(&again, &to), Ok(()));
    let Message::CapLease(l) = &f.message else {
        panic!("not a lease")
    };
    assert_eq!(l.auth.received, Default::default());
}

#[test]
fn a_received_command_encoded_as_received_is_its_senders_bytes_and_verifies_again() {
    let to = samples::command_topic();
    for minor in [PROTOCOL.minor - 1, PROTOCOL.minor, PROTOCOL.minor + 1] {
        let sent = signed_as(MessageKind::CapLease, &to, minor, &[]);
        let f = Frame::decode(&sent).unwrap();
        let mut buf = [0u8; loopwarden_protocol::MAX_FRAME_LEN];
        let n = f.encode_as_received(&mut buf).unwrap();
        assert_eq!(&buf[..n], &sent[..], "2.{minor}: the bytes as sent");
        // As a log read back after a restart: it verifies again.
        let logged = Frame::decode(&buf[..n]).unwrap();
        assert_eq!(verify(&logged, &to), Ok(()), "2.{minor}");
    }
    // A frame made here, and one that carries no signature, as `encode`.
    for kind in [MessageKind::CapLease, MessageKind::Event] {
        let f = samples::frame(kind);
        let mut buf = [0u8; loopwarden_protocol::MAX_FRAME_LEN];
        let n = f.encode_as_received(&mut buf).unwrap();
        assert_eq!(&buf[..n], &f.to_vec().unwrap()[..], "{kind:?}");
    }
}

#[test]
fn a_signed_frame_in_another_encoding_of_its_values_is_refused() {
    let to = samples::command_topic();
    let bytes = samples::frame(MessageKind::CapLease).to_vec().unwrap();
    let good = Frame::decode(&bytes).unwrap();
    assert_eq!(verify(&good, &to), Ok(()));
    // The sender's role, the header's first varint, written overlong
    // (its low seven bits, then a byte of zero): postcard reads the same
    // value, and the signature over the re-encoded frame would verify.
    let role = bytes[3];
    assert!(role < 0x80, "a one-byte varint");
    let mut content = bytes[..3].to_vec();
    content.extend_from_slice(&[role | 0x80, 0x00]);
    content.extend_from_slice(&bytes[4..bytes.len() - 4]);
    let e = Frame::decode(&with_crc(content)).unwrap_err();
    assert_eq!(e.to_string(), "frame header holds an invalid value");
    // So is one a signer of an older minor sent: its lease is as signed
    // then, and the same bytes rewritten are refused too.
    let older = signed_as(MessageKind::CapLease, &to, 6, &[]);
    assert_eq!(verify(&Frame::decode(&older).unwrap(), &to), Ok(()));
    let mut content = older[..3].to_vec();
    content.extend_from_slice(&[older[3] | 0x80, 0x00]);
    content.extend_from_slice(&older[4..older.len() - 4]);
    assert!(Frame::decode(&with_crc(content)).is_err());
}

//! Command signatures: only a holder of a signing key the host's keyring
//! lists can cap a GPU or release a quarantine, or tell the host's rack it
//! lost its cooling (the CDU's state is signed as commands are, since 2.7).
//!
//! A command frame carries a [`CommandAuth`]: the id of the sender's key
//! and an Ed25519 signature (RFC 8032, pure Ed25519) over the target's
//! `cmd` topic (UTF-8, e.g. `dc/v2/hall-1/host/h07/cmd`), one zero byte,
//! and the frame's bytes up to (not including) the CRC, encoded with the
//! signature set to zeros. Those bytes are the ones sent: a received
//! frame is checked with the minor version its sender wrote in byte 1
//! (recorded by [`Frame::decode`]), not this version's, so any two minors
//! whose body of that kind is alike verify each other's signatures (a
//! signed kind's body never grows within a major). A frame whose body goes
//! on past what this version reads cannot be checked, and is refused as
//! such ([`AuthError::NewerFields`]). A CDU state is signed the same way,
//! over the topic it is published on (`dc/v2/hall-1/cdu/cdu1/health`): a state
//! signed for one CDU does not verify as another's. The target is inside what is signed, so a
//! command for one host does not verify on another; the frame's sender,
//! timestamp and sequence number are too, so a receiver that refuses a
//! sequence number not above the last one it accepted from that sender
//! refuses replays, and a signature made by one signer cannot be passed
//! off under another's name.
//!
//! Hosts hold only public keys ([`VerifyingKey`]): a host that is broken
//! into cannot sign for anyone.
//!
//! Glossary:
//! - *signer*: a node that may command others (a CDU controller, an
//!   operator, a facility system), known to hosts by its role, name and
//!   key id.
//! - *key id*: which of a signer's keys signed; two coexist while a key
//!   rotates.
//! - *keyring*: the public keys a host accepts, each with what its signer
//!   may do (kept by the host, not here).

use core::fmt;

use ed25519_dalek::Signer as _;
pub use ed25519_dalek::{Signature, SigningKey, VerifyingKey};

use crate::frame::{EncodeError, Frame, Message, Version, MAX_FRAME_LEN, PROTOCOL};
use crate::ids::{Ident, NodeId, Role};
use crate::message::{CommandAuth, ReceivedAs};
use crate::topic::{Topic, TOPIC_MAX};

/// Bytes of a signature.
pub const SIGNATURE_LEN: usize = 64;

/// Why a command did not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthError {
    /// The frame is not of a kind that is signed (a command or a CDU
    /// state); it carries no signature.
    NotACommand,
    /// No key is known for this sender under this id.
    UnknownKey(u8),
    /// The signature does not verify: another key signed, or the frame
    /// (or its target) was altered.
    BadSignature,
    /// The frame could not be encoded to check its signature.
    Encode(EncodeError),
    /// The frame came from a newer minor with fields after the
    /// ones this version reads: they are signed, and this version cannot
    /// rebuild the bytes to check them.
    NewerFields {
        /// The frame's minor version.
        minor: u8,
    },
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::NotACommand => write!(f, "not a signed frame (a command or a CDU state)"),
            AuthError::UnknownKey(id) => write!(f, "no key with id {id} for this sender"),
            AuthError::BadSignature => write!(
                f,
                "signature does not verify (another key signed, or the frame was altered)"
            ),
            AuthError::Encode(e) => write!(f, "cannot encode frame to check its signature: {e}"),
            AuthError::NewerFields { minor } => write!(
                f,
                "a newer minor's command with fields this version cannot check; upgrade this \
                 receiver (the frame is {}, this receiver {PROTOCOL})",
                Version {
                    major: PROTOCOL.major,
                    minor: *minor
                }
            ),
        }
    }
}

impl core::error::Error for AuthError {}

/// What a signer may command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct May {
    /// Send cap leases.
    pub lease: bool,
    /// Release quarantined GPUs.
    pub release: bool,
    /// Ask for logged events to be published again (a reader's right).
    pub resend: bool,
}

/// A key a host trusts: whose it is and what its holder may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The signer's role; never [`Role::Host`].
    pub role: Role,
    /// The signer's name; `None` for any of the role (the simulated
    /// hall's demo keyring only).
    pub name: Option<Ident>,
    /// Which of its keys this is.
    pub key_id: u8,
    /// The public key.
    pub key: VerifyingKey,
    /// What it may do.
    pub may: May,
}

impl Signer {
    /// Whether this entry is `who`'s key `key_id`.
    pub fn is(&self, who: &NodeId, key_id: u8) -> bool {
        self.role == who.role
            && self.key_id == key_id
            && self.name.as_ref().is_none_or(|n| *n == who.id)
    }
}

/// The auth of a signed kind.
pub(crate) fn auth_mut(message: &mut Message) -> Option<&mut CommandAuth> {
    match message {
        Message::CapLease(m) => Some(&mut m.auth),
        Message::QuarantineRelease(m) => Some(&mut m.auth),
        Message::CduState(m) => Some(&mut m.auth),
        Message::ResendRequest(m) => Some(&mut m.auth),
        _ => None,
    }
}

/// What is signed for `frame` sent to `to`, written into `buf`: the
/// target's topic, a zero byte, the frame's bytes before the CRC with the
/// signature zeroed, and in byte 1 the minor version the frame was received
/// with (this version's for a frame made here). Returns its length.
fn signed_bytes(
    frame: &Frame,
    to: &Topic,
    buf: &mut [u8; TOPIC_MAX + 1 + MAX_FRAME_LEN],
) -> Result<usize, AuthError> {
    let mut unsigned = frame.clone();
    let auth = auth_mut(&mut unsigned.message).ok_or(AuthError::NotACommand)?;
    auth.signature = [[0; 32]; 2];
    let target = to.build().map_err(|_| AuthError::BadSignature)?;
    let t = target.len();
    buf[..t].copy_from_slice(target.as_bytes());
    buf[t] = 0;
    let len = unsigned
        .encode_as_received(&mut buf[t + 1..])
        .map_err(AuthError::Encode)?;
    Ok(t + 1 + len - 4)
}

fn split(sig: &Signature) -> [[u8; 32]; 2] {
    let (r, s) = (sig.r_bytes(), sig.s_bytes());
    [*r, *s]
}

impl Frame {
    /// Signs a command frame for the target whose `cmd` topic is `to` (a
    /// CDU state or a resend request: for the topic it is published on),
    /// with the sender's key
    /// `key_id`. Call it last: any change to the frame afterwards breaks
    /// the signature. It signs the frame as this version encodes it (a
    /// received frame signed again loses its record of how it came).
    pub fn sign(&mut self, to: &Topic, key_id: u8, key: &SigningKey) -> Result<(), AuthError> {
        let auth = auth_mut(&mut self.message).ok_or(AuthError::NotACommand)?;
        auth.key_id = key_id;
        auth.received = ReceivedAs::default();
        let mut buf = [0u8; TOPIC_MAX + 1 + MAX_FRAME_LEN];
        let len = signed_bytes(self, to, &mut buf)?;
        let signature = split(&key.sign(&buf[..len]));
        auth_mut(&mut self.message)
            .ok_or(AuthError::NotACommand)?
            .signature = signature;
        Ok(())
    }

    /// The signature of a signed frame (a command or a CDU state): who
    /// signed with which key.
    pub fn signed_auth(&self) -> Option<CommandAuth> {
        match &self.message {
            Message::CapLease(m) => Some(m.auth),
            Message::QuarantineRelease(m) => Some(m.auth),
            Message::CduState(m) => Some(m.auth),
            Message::ResendRequest(m) => Some(m.auth),
            _ => None,
        }
    }

    /// Checks a command frame received on `to` (the receiver's own `cmd`
    /// topic; for a CDU state, the topic it came on) against the key `keys`
    /// returns for its sender and key id. Strict verification:
    /// non-canonical signatures and weak keys fail; an unsigned state
    /// (a zero signature) fails too. A frame from a newer minor with fields
    /// this version does not read cannot be checked
    /// ([`AuthError::NewerFields`]).
    pub fn verify<'k>(
        &self,
        to: &Topic,
        keys: impl FnOnce(&NodeId, u8) -> Option<&'k VerifyingKey>,
    ) -> Result<(), AuthError> {
        let auth = self.signed_auth().ok_or(AuthError::NotACommand)?;
        if auth.received.unread_tail {
            return Err(AuthError::NewerFields {
                minor: auth.received.minor,
            });
        }
        let key = keys(&self.sender, auth.key_id).ok_or(AuthError::UnknownKey(auth.key_id))?;
        let mut buf = [0u8; TOPIC_MAX + 1 + MAX_FRAME_LEN];
        let len = signed_bytes(self, to, &mut buf)?;
        let mut sig = [0u8; SIGNATURE_LEN];
        sig[..32].copy_from_slice(&auth.signature[0]);
        sig[32..].copy_from_slice(&auth.signature[1]);
        key.verify_strict(&buf[..len], &Signature::from_bytes(&sig))
            .map_err(|_| AuthError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MessageKind;
    use crate::ids::{Ident, Role};
    use crate::samples;
    use crate::topic::Family;
    use crate::units::Watts;

    fn demo() -> VerifyingKey {
        samples::demo_signing_key().verifying_key()
    }

    fn h07() -> Topic {
        samples::command_topic()
    }

    #[test]
    fn samples_are_signed_with_the_demo_key_for_h07() {
        let key = demo();
        for kind in [MessageKind::CapLease, MessageKind::QuarantineRelease] {
            let f = samples::frame(kind);
            assert_eq!(
                f.verify(&h07(), |_, id| (id == 1).then_some(&key)),
                Ok(()),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_command_for_one_host_does_not_verify_on_another() {
        let key = demo();
        let f = samples::frame(MessageKind::QuarantineRelease);
        let site = Ident::new("hall-1").unwrap();
        let h12 = Topic::new(&site, Role::Host, &Ident::new("h12").unwrap(), Family::Cmd);
        assert_eq!(
            f.verify(&h12, |_, _| Some(&key)),
            Err(AuthError::BadSignature)
        );
        let other_site = Topic::new(
            &Ident::new("hall-2").unwrap(),
            Role::Host,
            &Ident::new("h07").unwrap(),
            Family::Cmd,
        );
        assert_eq!(
            f.verify(&other_site, |_, _| Some(&key)),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn any_change_breaks_the_signature() {
        let key = demo();
        let good = samples::frame(MessageKind::CapLease);
        let mut f = good.clone();
        if let Message::CapLease(l) = &mut f.message {
            l.caps[0].limit = Watts(700);
        }
        assert_eq!(
            f.verify(&h07(), |_, _| Some(&key)),
            Err(AuthError::BadSignature)
        );
        let mut f = good.clone();
        f.seq += 1; // a replay with a new number is not signed
        assert_eq!(
            f.verify(&h07(), |_, _| Some(&key)),
            Err(AuthError::BadSignature)
        );
        let mut f = good.clone();
        f.sender = NodeId::new(Role::Cdu, "cdu-b").unwrap(); // another's name
        assert_eq!(
            f.verify(&h07(), |_, _| Some(&key)),
            Err(AuthError::BadSignature)
        );
        let other = SigningKey::from_bytes(&[7; 32]).verifying_key();
        assert_eq!(
            good.verify(&h07(), |_, _| Some(&other)),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn the_keyring_is_asked_for_the_sender_and_key_id() {
        let key = demo();
        let f = samples::frame(MessageKind::CapLease);
        let mut asked = None;
        let _ = f.verify(&h07(), |who, id| {
            asked = Some((who.clone(), id));
            Some(&key)
        });
        assert_eq!(asked, Some((f.sender.clone(), 1)));
    }

    #[test]
    fn unknown_key_and_non_commands_are_refused() {
        let key = demo();
        let mut f = samples::frame(MessageKind::QuarantineRelease);
        f.sign(&h07(), 9, &samples::demo_signing_key()).unwrap();
        assert_eq!(
            f.verify(&h07(), |_, id| (id == 1).then_some(&key)),
            Err(AuthError::UnknownKey(9))
        );
        let mut e = samples::frame(MessageKind::Event);
        assert_eq!(
            e.sign(&h07(), 1, &samples::demo_signing_key()),
            Err(AuthError::NotACommand)
        );
        assert_eq!(
            e.verify(&h07(), |_, _| Some(&key)),
            Err(AuthError::NotACommand)
        );
    }
}

//! Command authentication: only a holder of the site key can cap a GPU or
//! release a quarantine.
//!
//! A command frame carries a [`CommandAuth`]: the id of the site key that
//! signed it and a tag, HMAC-SHA-256 truncated to its first 16 bytes, over
//! the target's `cmd` topic (UTF-8, e.g. `dc/v1/hall-1/host/h07/cmd`), one
//! zero byte, and the frame's bytes up to (not including) the CRC,
//! computed with the tag set to zeros. The target is inside what is
//! signed, so a command for one host does not verify on another; the
//! frame's timestamp and sequence number are too, so a receiver that
//! refuses a sequence number not above the last one it accepted from that
//! sender refuses replays.
//!
//! Glossary:
//! - *site key*: a secret shared by the nodes of a site that may command
//!   each other; several may be in use while keys rotate (`key_id`).
//! - *tag*: the truncated MAC.

use core::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::frame::{EncodeError, Frame, Message, MAX_FRAME_LEN};
use crate::message::CommandAuth;
use crate::topic::Topic;

/// Bytes of the tag.
pub const TAG_LEN: usize = 16;

/// Why a command did not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthError {
    /// The frame is not a command; it carries no authentication.
    NotACommand,
    /// No key is known under this id.
    UnknownKey(u8),
    /// The tag does not match: wrong key, or the frame was altered.
    BadTag,
    /// The frame could not be encoded to compute the tag.
    Encode(EncodeError),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::NotACommand => write!(f, "not a command frame"),
            AuthError::UnknownKey(id) => write!(f, "no site key with id {id}"),
            AuthError::BadTag => write!(
                f,
                "authentication tag does not match (wrong key or altered frame)"
            ),
            AuthError::Encode(e) => write!(f, "cannot encode frame to authenticate it: {e}"),
        }
    }
}

impl core::error::Error for AuthError {}

fn auth_mut(message: &mut Message) -> Option<&mut CommandAuth> {
    match message {
        Message::CapLease(m) => Some(&mut m.auth),
        Message::QuarantineRelease(m) => Some(&mut m.auth),
        _ => None,
    }
}

/// The MAC over `frame` as signed for `to`: the target's topic, a zero
/// byte, the frame's bytes before the CRC with the tag zeroed.
fn mac(frame: &Frame, to: &Topic, key: &[u8]) -> Result<Hmac<Sha256>, AuthError> {
    let mut unsigned = frame.clone();
    let auth = auth_mut(&mut unsigned.message).ok_or(AuthError::NotACommand)?;
    auth.tag = [0; TAG_LEN];
    let mut buf = [0u8; MAX_FRAME_LEN];
    let len = unsigned.encode(&mut buf).map_err(AuthError::Encode)?;
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(|_| AuthError::BadTag)?;
    let target = to.build().map_err(|_| AuthError::BadTag)?;
    mac.update(target.as_bytes());
    mac.update(&[0]);
    mac.update(&buf[..len - 4]);
    Ok(mac)
}

impl Frame {
    /// Signs a command frame for the target whose `cmd` topic is `to`,
    /// with site key `key_id`. Call it last: any change to the frame
    /// afterwards breaks the tag.
    pub fn sign(&mut self, to: &Topic, key_id: u8, key: &[u8]) -> Result<(), AuthError> {
        auth_mut(&mut self.message)
            .ok_or(AuthError::NotACommand)?
            .key_id = key_id;
        let tag = mac(self, to, key)?.finalize().into_bytes();
        let auth = auth_mut(&mut self.message).ok_or(AuthError::NotACommand)?;
        auth.tag.copy_from_slice(&tag[..TAG_LEN]);
        Ok(())
    }

    /// Checks a command frame received on `to` (the receiver's own `cmd`
    /// topic) against the key `keys` returns for its key id, in constant
    /// time.
    pub fn verify<'k>(
        &self,
        to: &Topic,
        keys: impl FnOnce(u8) -> Option<&'k [u8]>,
    ) -> Result<(), AuthError> {
        let auth = match &self.message {
            Message::CapLease(m) => m.auth,
            Message::QuarantineRelease(m) => m.auth,
            _ => return Err(AuthError::NotACommand),
        };
        let key = keys(auth.key_id).ok_or(AuthError::UnknownKey(auth.key_id))?;
        mac(self, to, key)?
            .verify_truncated_left(&auth.tag)
            .map_err(|_| AuthError::BadTag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::MessageKind;
    use crate::ids::{Ident, Role};
    use crate::samples::{self, DEMO_KEY};
    use crate::topic::Family;
    use crate::units::Watts;

    fn keyring(id: u8) -> Option<&'static [u8]> {
        (id == 1).then_some(DEMO_KEY)
    }

    fn h07() -> Topic {
        samples::command_topic()
    }

    #[test]
    fn samples_are_signed_with_the_demo_key_for_h07() {
        for kind in [MessageKind::CapLease, MessageKind::QuarantineRelease] {
            assert_eq!(
                samples::frame(kind).verify(&h07(), keyring),
                Ok(()),
                "{kind:?}"
            );
        }
    }

    #[test]
    fn a_command_for_one_host_does_not_verify_on_another() {
        let f = samples::frame(MessageKind::QuarantineRelease);
        let site = Ident::new("hall-1").unwrap();
        let h12 = Topic::new(&site, Role::Host, &Ident::new("h12").unwrap(), Family::Cmd);
        assert_eq!(f.verify(&h12, keyring), Err(AuthError::BadTag));
        let other_site = Topic::new(
            &Ident::new("hall-2").unwrap(),
            Role::Host,
            &Ident::new("h07").unwrap(),
            Family::Cmd,
        );
        assert_eq!(f.verify(&other_site, keyring), Err(AuthError::BadTag));
    }

    #[test]
    fn any_change_breaks_the_tag() {
        let good = samples::frame(MessageKind::CapLease);
        let mut f = good.clone();
        if let Message::CapLease(l) = &mut f.message {
            l.caps[0].limit = Watts(700);
        }
        assert_eq!(f.verify(&h07(), keyring), Err(AuthError::BadTag));
        let mut f = good.clone();
        f.seq += 1; // a replay with a new number is not signed
        assert_eq!(f.verify(&h07(), keyring), Err(AuthError::BadTag));
        assert_eq!(
            good.verify(&h07(), |_| Some(b"another key".as_slice())),
            Err(AuthError::BadTag)
        );
    }

    #[test]
    fn unknown_key_and_non_commands_are_refused() {
        let mut f = samples::frame(MessageKind::QuarantineRelease);
        f.sign(&h07(), 9, b"k").unwrap();
        assert_eq!(f.verify(&h07(), keyring), Err(AuthError::UnknownKey(9)));
        let mut e = samples::frame(MessageKind::Event);
        assert_eq!(e.sign(&h07(), 1, DEMO_KEY), Err(AuthError::NotACommand));
        assert_eq!(e.verify(&h07(), keyring), Err(AuthError::NotACommand));
    }
}

//! Fuzz targets of the key files, run for a time budget (see
//! `tests/fuzz/harness.rs`): what a host and a signer read at start, from
//! files an operator writes or copies.
//!
//! - `keyring`: [`parse_keyring`] on keyrings written by [`keyring_toml`]
//!   (signers of every role, key ids, rights), mutated as
//!   TOML (values on boundaries or of another type, keys removed, moved or
//!   added, strings mutated, `*` names among them) and, one in four, as bytes. A keyring that
//!   parses must hold only signers that may do something, no host, no
//!   release but an operator's, no key id or public key twice, and read
//!   back the same when written again.
//! - `sign_key`: [`parse_sign_key`] on sign key files written by
//!   [`SignKey::to_toml`], mutated the same way; a key that parses must
//!   never be a host's and must read back the same when written again.
//!
//! Every error must say something (a non-empty message).

#[path = "../../tests/fuzz/harness.rs"]
mod harness;
#[path = "../../tests/fuzz/toml_mutate.rs"]
mod toml_mutate;

use harness::{fuzz, says_something};
use loopwarden_bus::keys::{keyring_toml, parse_keyring, parse_sign_key, SignKey};
use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::{Ident, NodeId, Role};
use toml_mutate::TomlMutator;

fn ident(s: &str) -> Ident {
    Ident::new(s).expect("an ident")
}

fn signer(role: Role, name: Option<&str>, key_id: u8, seed: u8, may: (bool, bool, bool)) -> Signer {
    Signer {
        role,
        name: name.map(ident),
        key_id,
        key: SigningKey::from_bytes(&[seed; 32]).verifying_key(),
        may: May {
            lease: may.0,
            release: may.1,
            resend: may.2,
        },
    }
}

/// Keyrings as `lwbus pki init` and the demonstration hall write them.
fn keyring_seeds() -> Vec<String> {
    let site = ident("hall-1");
    let cdu = signer(Role::Cdu, Some("cdu1"), 1, 1, (true, false, false));
    let rotated = signer(Role::Cdu, Some("cdu1"), 2, 2, (true, false, false));
    let ops = signer(Role::Operator, Some("ops1"), 1, 3, (true, true, true));
    let bms = signer(Role::Facility, Some("bms1"), 255, 5, (false, false, true));
    [
        vec![cdu.clone()],
        vec![cdu, rotated, ops.clone(), bms],
        vec![ops],
    ]
    .iter()
    .map(|signers| keyring_toml(&site, signers))
    .collect()
}

fn check_keyring(text: &str) -> Result<(), String> {
    let ring = match parse_keyring(text) {
        Err(e) => return says_something("parse_keyring", &e),
        Ok(ring) => ring,
    };
    for (i, s) in ring.signers.iter().enumerate() {
        if s.role == Role::Host || !(s.may.lease || s.may.release || s.may.resend) {
            return Err(format!("signer {} taken: {s:?}", i + 1));
        }
        if s.may.release && s.role != Role::Operator {
            return Err(format!("signer {} may release: {s:?}", i + 1));
        }
        if ring.signers[..i]
            .iter()
            .any(|o| (o.role, &o.name, o.key_id) == (s.role, &s.name, s.key_id) || o.key == s.key)
        {
            return Err(format!("signer {} taken twice: {s:?}", i + 1));
        }
    }
    let site = ring.site.clone().unwrap_or_else(|| ident("any"));
    let again = keyring_toml(&site, &ring.signers);
    match parse_keyring(&again) {
        Ok(back) if back.signers == ring.signers => Ok(()),
        Ok(back) => Err(format!(
            "reads as {ring:?}, written and read again as {back:?}"
        )),
        Err(e) => Err(format!("its own text is refused: {e}\n{again}")),
    }
}

#[test]
fn keyring() {
    let seeds = keyring_seeds();
    let mutator = TomlMutator::new(&seeds);
    fuzz(
        "keyring",
        &seeds,
        |rng, _| mutator.mutate(rng),
        |text| check_keyring(text),
    );
}

/// Sign keys of each signing role.
fn sign_key_seeds() -> Vec<String> {
    [
        (Role::Cdu, "cdu1", 1),
        (Role::Operator, "ops1", 2),
        (Role::Facility, "bms1", 255),
    ]
    .iter()
    .map(|(role, name, key_id)| {
        let key = SignKey {
            node: NodeId::new(*role, name).expect("a node"),
            key_id: *key_id,
            key: SigningKey::from_bytes(&[*key_id; 32]),
        };
        key.to_toml()
    })
    .collect()
}

fn check_sign_key(text: &str) -> Result<(), String> {
    let key = match parse_sign_key(text) {
        Err(e) => return says_something("parse_sign_key", &e),
        Ok(key) => key,
    };
    if key.node.role == Role::Host {
        return Err(format!("a host's sign key taken: {key:?}"));
    }
    match parse_sign_key(&key.to_toml()) {
        Ok(back)
            if (&back.node, back.key_id, back.key.as_bytes())
                == (&key.node, key.key_id, key.key.as_bytes()) =>
        {
            Ok(())
        }
        Ok(back) => Err(format!(
            "reads as {key:?}, written and read again as {back:?}"
        )),
        Err(e) => Err(format!("its own text is refused: {e}")),
    }
}

#[test]
fn sign_key() {
    let seeds = sign_key_seeds();
    let mutator = TomlMutator::new(&seeds);
    fuzz(
        "sign_key",
        &seeds,
        |rng, _| mutator.mutate(rng),
        |text| check_sign_key(text),
    );
}

/// Found by `keyring` and `sign_key`: a control character in a comment
/// made an error without words (the TOML parser's message is empty for
/// it); the error now names the line and the character.
#[test]
fn a_control_character_in_a_comment_is_named_with_its_line() {
    let ring = "# Who may command\nsite = \"hall-1\"\n# keys,\u{7f} safe\n";
    let e = parse_keyring(ring).unwrap_err();
    assert_eq!(e, "line 3: '\\u{7f}' is not valid TOML here");
    let key = "# Ed25519 signing key of facility/bms1: readable \u{1d}by its owner\n";
    let e = parse_sign_key(key).unwrap_err();
    assert_eq!(e, "line 1: '\\u{1d}' is not valid TOML here");
}

//! The check kept after a config record whose older copy must never be
//! read for it: the config store skips a copy whose own CRC fails and
//! returns the copy before it, so a damaged newest record (a quarantine,
//! a tightened limit) would otherwise read as the older one it replaced.
//! The record is kept, then its check under a key of its own; a read
//! compares them ([`checked`]).
//!
//! Glossary:
//! - *check*: a record's 64-bit FNV-1a hash ([`check_of`]), 8 bytes
//!   little-endian.

use std::format;
use std::string::String;
use std::vec::Vec;

/// The 64-bit FNV-1a hash of `parts`, one after the other: a record's
/// check, or what a config-store key holds of a name too long for it (a
/// GPU's UUID, a sender's role and name).
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// The check of a record's value: its 64-bit FNV-1a hash.
pub fn check_of(value: &[u8]) -> Vec<u8> {
    fnv1a(&[value]).to_le_bytes().to_vec()
}

/// The record read under `key` (`value`), against the check read after
/// it (`check`): an error when they disagree, or when the check is there
/// and the record is not (its newest copy damaged, or lost). No check (a
/// record an earlier version kept) believes the record.
pub fn checked(
    key: &str,
    value: Option<Vec<u8>>,
    check: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, String> {
    match (&value, check) {
        (Some(v), Some(c)) if c != check_of(v) => Err(format!(
            "{key}: the record read is not the one last kept (its newest copy is damaged)"
        )),
        (None, Some(_)) => Err(format!(
            "{key}: the record is missing though its check is kept (lost from flash)"
        )),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_the_published_hash() {
        // The FNV-1a 64 test vectors: "" and "a".
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(&[b"foo", b"bar"]), fnv1a(&[b"foobar"]));
    }

    #[test]
    fn a_record_is_believed_only_with_its_own_check_or_none() {
        let (new, old) = (vec![1u8, 2, 3], vec![9u8]);
        assert_eq!(
            checked("k", Some(new.clone()), Some(check_of(&new))),
            Ok(Some(new.clone()))
        );
        assert_eq!(checked("k", Some(old.clone()), None), Ok(Some(old.clone())));
        assert_eq!(checked("k", None, None), Ok(None));
        let older = checked("k", Some(old), Some(check_of(&new))).unwrap_err();
        assert!(
            older.starts_with("k: ") && older.contains("damaged"),
            "{older}"
        );
        let lost = checked("k", None, Some(check_of(&new))).unwrap_err();
        assert!(lost.contains("lost from flash"), "{lost}");
    }
}

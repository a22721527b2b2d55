//! Site keys: the secrets commands are signed with.
//!
//! A keys file holds one key per line, `<key id> <hex secret>` (at least
//! 16 bytes, 32 hex digits), with `#` comments; several keys coexist while
//! keys rotate. Both the agents (to verify) and the tools (to sign) read it.
//!
//! Glossary:
//! - *key id*: the number a command names in its `auth.key_id`.

use std::collections::BTreeMap;
use std::path::Path;

/// Reads a keys file: `<id> <hex secret>` per line, `#` comments.
pub fn read_keys(path: &Path) -> Result<BTreeMap<u8, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read keys file {}: {e}", path.display()))?;
    let mut keys = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let (id, hex) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{}: expected `<key id> <hex secret>`", at()))?;
        let id: u8 = id
            .parse()
            .map_err(|_| format!("{}: key id {id:?} is not 0 to 255", at()))?;
        let hex = hex.trim();
        if hex.len() < 32 || hex.len() % 2 != 0 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "{}: the secret must be hex, at least 16 bytes (32 digits)",
                at()
            ));
        }
        let secret = (0..hex.len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&hex[j..j + 2], 16).expect("checked hex"))
            .collect();
        if keys.insert(id, secret).is_some() {
            return Err(format!("{}: key id {id} appears twice", at()));
        }
    }
    if keys.is_empty() {
        return Err(format!("keys file {} holds no key", path.display()));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> Result<BTreeMap<u8, Vec<u8>>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("site.keys");
        std::fs::write(&path, text).unwrap();
        read_keys(&path)
    }

    #[test]
    fn reads_keys_and_says_what_is_wrong_where() {
        let k = keys("# site keys\n1 000102030405060708090a0b0c0d0e0f\n\n2 ffeeddccbbaa99887766554433221100aa # rotating in\n").unwrap();
        assert_eq!(k[&1][15], 0x0f);
        assert_eq!(k[&2].len(), 17);
        let e = keys("1 0001\n").unwrap_err();
        assert!(
            e.contains("line 1") && e.contains("at least 16 bytes"),
            "{e}"
        );
        let e = keys("1 000102030405060708090a0b0c0d0e0f\n1 000102030405060708090a0b0c0d0e0f\n")
            .unwrap_err();
        assert!(e.contains("line 2") && e.contains("twice"), "{e}");
        let e = keys("300 000102030405060708090a0b0c0d0e0f\n").unwrap_err();
        assert!(e.contains("0 to 255"), "{e}");
        assert!(keys("# nothing\n").unwrap_err().contains("holds no key"));
    }
}

//! Signing keys and keyrings: the files commands are signed and checked
//! with.
//!
//! A signer (a CDU controller, an operator, a facility system) holds a
//! *sign key* file, secret, readable by its owner only:
//!
//! ```toml
//! node = "cdu/cdu1"          # role/name the signer sends as
//! key_id = 1                  # which of its keys (two coexist while rotating)
//! secret_key = "…64 hex…"     # the Ed25519 secret (its 32-byte seed)
//! ```
//!
//! A host holds a *keyring*, public: who may command it and what each may do.
//!
//! ```toml
//! site = "hall-1"             # optional; checked against the host's site
//! [[signer]]
//! node = "cdu/cdu1"           # a CDU may lease only the hosts it cools
//! key_id = 1
//! public_key = "…64 hex…"
//! may = ["lease"]             # lease, release, resend
//! ```
//!
//! Every signer is named: `node = "cdu/*"` is refused. Only the twin's
//! built-in demonstration keyring (no keyring file) takes any signer of a
//! role, with the public demonstration key. `release` is an operator's
//! right alone, and a public key belongs to one entry only.
//!
//! Glossary:
//! - *seed*: the 32 secret bytes an Ed25519 key is derived from.

use std::path::Path;

use loopwarden_protocol::auth::{May, Signer, SigningKey, VerifyingKey};
use loopwarden_protocol::{Ident, NodeId, Role};
use serde::Deserialize;

/// A signer's key, as read from its sign key file.
#[derive(Clone)]
pub struct SignKey {
    /// Who signs.
    pub node: NodeId,
    /// Which of its keys.
    pub key_id: u8,
    /// The secret key.
    pub key: SigningKey,
}

impl std::fmt::Debug for SignKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SignKey {{ node: {}/{}, key_id: {}, public: {} }}",
            self.node.role.as_str(),
            self.node.id.as_str(),
            self.key_id,
            hex(self.key.verifying_key().as_bytes())
        )
    }
}

impl SignKey {
    /// The file's text (write it readable by its owner only).
    pub fn to_toml(&self) -> String {
        format!(
            "# Ed25519 signing key of {}/{}: secret, readable by its owner only.\n\
             node = \"{}/{}\"\nkey_id = {}\nsecret_key = \"{}\"\n",
            self.node.role.as_str(),
            self.node.id.as_str(),
            self.node.role.as_str(),
            self.node.id.as_str(),
            self.key_id,
            hex(self.key.as_bytes())
        )
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignKeyFile {
    node: String,
    key_id: u8,
    secret_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyringFile {
    site: Option<String>,
    #[serde(default)]
    signer: Vec<SignerFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignerFile {
    node: String,
    key_id: u8,
    public_key: String,
    may: Vec<String>,
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Result<[u8; 32], String> {
    let s = s.trim();
    if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "expected 64 hex digits (32 bytes), found {} characters",
            s.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

/// What a TOML error says. The TOML parser leaves some syntax errors
/// without words (a control character in a comment): for those, the line
/// and the character found there.
fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    if !message.is_empty() {
        return message.to_string();
    }
    let at = e.span().map_or(text.len(), |s| s.start.min(text.len()));
    let line = text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1;
    match text.get(at..).and_then(|rest| rest.chars().next()) {
        Some(c) => format!("line {line}: {c:?} is not valid TOML here"),
        None => format!("line {line}: not valid TOML"),
    }
}

/// Parses `role/name` (a signer: not a host). A name of `*` (any signer
/// of the role) is refused: with one shared key, anyone holding it could
/// sign in any name of the role (an operator's release in another's).
pub(crate) fn signer_node(s: &str) -> Result<(Role, Ident), String> {
    let (role, name) = s
        .split_once('/')
        .ok_or_else(|| format!("node = {s:?}: expected `<role>/<name>`, e.g. \"cdu/cdu1\""))?;
    let role = match role {
        "cdu" => Role::Cdu,
        "operator" => Role::Operator,
        "facility" => Role::Facility,
        "host" => {
            return Err(format!(
                "node = {s:?}: a host never signs commands; the role is cdu, operator or facility"
            ))
        }
        other => {
            return Err(format!(
                "node = {s:?}: role {other:?} is not cdu, operator or facility"
            ))
        }
    };
    if name == "*" {
        return Err(format!(
            "node = {s:?}: a signer of any name is for the twin's built-in demonstration \
             keyring only; name each signer (\"{}/<name>\")",
            role.as_str()
        ));
    }
    let name = Ident::new(name).map_err(|e| format!("node = {s:?}: {e}"))?;
    Ok((role, name))
}

fn read(path: &Path, what: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))
}

/// Refuses a secret file (`what`) that users other than its owner and
/// group can read: it may already be known.
pub fn check_private(path: &Path, what: &str) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
        let mode = meta.permissions().mode();
        if mode & 0o007 != 0 {
            return Err(format!(
                "{what} {} is readable by others (mode {:o}): `chmod 600` it (or 640 \
                 for a service's group), and replace it if others may have read it",
                path.display(),
                mode & 0o777
            ));
        }
    }
    Ok(())
}

/// Refuses a file that says who may command (`what`: a keyring, a sign
/// key) when users other than its owner may change it: writable by its
/// group or by others, or owned by someone other than root or the user
/// this process runs as. Anyone who can write a keyring can add a signer.
pub fn check_trusted(path: &Path, what: &str) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
        let mode = meta.mode();
        if mode & 0o022 != 0 {
            return Err(format!(
                "{what} {} is writable by {} (mode {:o}): `chmod go-w` it, and check \
                 that nobody changed it",
                path.display(),
                if mode & 0o002 != 0 {
                    "others"
                } else {
                    "its group"
                },
                mode & 0o777
            ));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != 0 && meta.uid() != me {
            return Err(format!(
                "{what} {} belongs to uid {}, neither root nor this process's user \
                 (uid {me}): `chown root` it (or this service's user)",
                path.display(),
                meta.uid()
            ));
        }
    }
    Ok(())
}

/// Reads a sign key file; others than its owner and group must not be
/// able to read it, nor others than its owner write it.
pub fn read_sign_key(path: &Path) -> Result<SignKey, String> {
    check_private(path, "sign key")?;
    check_trusted(path, "sign key")?;
    parse_sign_key(&read(path, "sign key")?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a sign key file's text.
pub fn parse_sign_key(text: &str) -> Result<SignKey, String> {
    let f: SignKeyFile = toml::from_str(text).map_err(|e| toml_message(text, &e))?;
    let (role, id) = signer_node(&f.node)?;
    let node = NodeId { role, id };
    let seed = unhex32(&f.secret_key).map_err(|e| format!("secret_key: {e}"))?;
    Ok(SignKey {
        node,
        key_id: f.key_id,
        key: SigningKey::from_bytes(&seed),
    })
}

/// A keyring: the site it is for (if it says) and its signers.
#[derive(Debug, Clone)]
pub struct Keyring {
    /// The site named in the file.
    pub site: Option<Ident>,
    /// Who may command, with what.
    pub signers: Vec<Signer>,
}

/// Reads a keyring file: public, but only its owner (root or this
/// process's user) may be able to change it ([`check_trusted`]).
pub fn read_keyring(path: &Path) -> Result<Keyring, String> {
    check_trusted(path, "keyring")?;
    parse_keyring(&read(path, "keyring")?).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the keyring at `path` for a node of `site` (`who`: "host",
/// "controller", as the refusal names it): its signers, or why not (the
/// file's checks, or a keyring of another site).
pub fn read_site_keyring(path: &Path, site: &Ident, who: &str) -> Result<Vec<Signer>, String> {
    let ring = read_keyring(path)?;
    match ring.site.as_ref().filter(|s| *s != site) {
        Some(other) => Err(format!(
            "{} is the keyring of site {other}, and this {who} is in site {site}",
            path.display()
        )),
        None => Ok(ring.signers),
    }
}

/// Parses a keyring's text. Each signer is checked: its node a signer's,
/// its key a valid Ed25519 point, its rights known and its role's
/// ([`check_rights`]), no key id twice, and no public key listed under
/// two entries (whoever held its secret would sign as both).
pub fn parse_keyring(text: &str) -> Result<Keyring, String> {
    let f: KeyringFile = toml::from_str(text).map_err(|e| toml_message(text, &e))?;
    let site = f
        .site
        .map(|s| Ident::new(&s).map_err(|e| format!("site = {s:?}: {e}")))
        .transpose()?;
    let mut signers: Vec<Signer> = Vec::new();
    for (i, s) in f.signer.iter().enumerate() {
        let at = |e: String| format!("signer {} ({}): {e}", i + 1, s.node);
        let (role, name) = signer_node(&s.node).map_err(at)?;
        let name = Some(name);
        let bytes = unhex32(&s.public_key).map_err(|e| at(format!("public_key: {e}")))?;
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|_| at("public_key is not an Ed25519 public key".into()))?;
        let mut may = parse_may(&s.may).map_err(|e| at(format!("may: {e}")))?;
        if may == May::default() {
            return Err(at("may is empty: the signer could do nothing".into()));
        }
        // A keyring an earlier `sign-key` wrote may give a facility or a
        // CDU `release`: the right is dropped and said, not the keyring
        // (a host refuses such a release whatever its keyring says).
        if let Err(e) = check_rights(role, may) {
            tracing::error!(
                "keyring: signer {} ({}): may: {e}: that right is dropped",
                i + 1,
                s.node
            );
            may.release = false;
        }
        let signer = Signer {
            role,
            name,
            key_id: s.key_id,
            key,
            may,
        };
        if signers
            .iter()
            .any(|o| o.role == role && o.name == signer.name && o.key_id == s.key_id)
        {
            return Err(at(format!("key id {} appears twice", s.key_id)));
        }
        if let Some(j) = signers.iter().position(|o| o.key == signer.key) {
            let (o, file) = (&signers[j], &f.signer[j]);
            return Err(at(if o.role == role && o.name == signer.name {
                format!(
                    "public_key is also that of key id {} of signer {} ({}): a rotated \
                     key is a new key (`lwbus pki sign-key`), or removing the old id \
                     revokes nothing",
                    o.key_id,
                    j + 1,
                    file.node
                )
            } else {
                format!(
                    "public_key is also that of signer {} ({}): whoever holds the \
                     secret could sign as either; give each signer its own key",
                    j + 1,
                    file.node
                )
            }));
        }
        signers.push(signer);
    }
    if signers.is_empty() {
        return Err("the keyring holds no signer: every command would be refused".into());
    }
    Ok(Keyring { site, signers })
}

/// Refuses rights a signer of `role` may never hold: `release` is an
/// operator's alone, since a quarantine is released only by an
/// authenticated operator.
pub(crate) fn check_rights(role: Role, may: May) -> Result<(), String> {
    if may.release && role != Role::Operator {
        return Err(format!(
            "release is an operator's right alone (a quarantine is released only by an \
             authenticated operator), not a {} signer's",
            role.as_str()
        ));
    }
    Ok(())
}

/// Rights as written: `lease`, `release`, `resend` (a reader's: ask for
/// logged events again).
pub(crate) fn parse_may(list: &[String]) -> Result<May, String> {
    let mut may = May::default();
    for m in list {
        match m.as_str() {
            "lease" => may.lease = true,
            "release" => may.release = true,
            "resend" => may.resend = true,
            other => return Err(format!("{other:?} is not lease, release or resend")),
        }
    }
    Ok(may)
}

/// A signer's rights as a keyring says them (`may = ["lease",
/// "resend"]`): in a keyring's entry, and where a log names a key's
/// rights.
pub fn may_toml(may: May) -> String {
    let named = [
        (may.lease, "\"lease\""),
        (may.release, "\"release\""),
        (may.resend, "\"resend\""),
    ];
    let list: Vec<&str> = named.iter().filter(|n| n.0).map(|n| n.1).collect();
    format!("may = [{}]", list.join(", "))
}

/// One `[[signer]]` entry of a keyring.
pub fn signer_toml(s: &Signer) -> String {
    let name = s.name.as_ref().map_or("*", |n| n.as_str());
    format!(
        "[[signer]]\nnode = \"{}/{name}\"\nkey_id = {}\npublic_key = \"{}\"\n{}\n",
        s.role.as_str(),
        s.key_id,
        hex(s.key.as_bytes()),
        may_toml(s.may)
    )
}

/// A keyring's text for `site`, one `[[signer]]` each.
pub fn keyring_toml(site: &Ident, signers: &[Signer]) -> String {
    let mut out = format!(
        "# Who may command the hosts of site {site}: public keys, safe to copy.\nsite = \"{site}\"\n"
    );
    for s in signers {
        out.push('\n');
        out.push_str(&signer_toml(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SignKey {
        SignKey {
            node: NodeId::new(Role::Cdu, "cdu1").unwrap(),
            key_id: 2,
            key: SigningKey::from_bytes(&[seed; 32]),
        }
    }

    /// A signer's rights as a keyring writes them, the one text the
    /// keyring and the agent's warnings use; each reads back as it was.
    #[test]
    fn rights_are_written_as_a_keyring_says_them_and_read_back() {
        assert_eq!(may_toml(May::default()), "may = []");
        let all = May {
            lease: true,
            release: true,
            resend: true,
        };
        assert_eq!(may_toml(all), r#"may = ["lease", "release", "resend"]"#);
        for bits in 0..8u8 {
            let may = May {
                lease: bits & 1 != 0,
                release: bits & 2 != 0,
                resend: bits & 4 != 0,
            };
            let text = may_toml(may);
            let list: Vec<String> = text["may = [".len()..text.len() - 1]
                .split(", ")
                .filter(|s| !s.is_empty())
                .map(|s| s.trim_matches('"').to_string())
                .collect();
            assert_eq!(parse_may(&list), Ok(may), "{text}");
        }
    }

    #[test]
    fn a_sign_key_round_trips_and_must_be_private() {
        let k = key(3);
        let back = parse_sign_key(&k.to_toml()).unwrap();
        assert_eq!(back.key.as_bytes(), k.key.as_bytes());
        assert_eq!((back.node, back.key_id), (k.node.clone(), 2));
        assert!(!format!("{k:?}").contains(&hex(k.key.as_bytes())));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdu1.sign.key");
        std::fs::write(&path, k.to_toml()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_sign_key(&path).unwrap_err();
        assert!(e.contains("readable by others") && e.contains("644"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_sign_key(&path).unwrap().key_id, 2);
        let e =
            parse_sign_key("node = \"host/h01\"\nkey_id = 1\nsecret_key = \"00\"\n").unwrap_err();
        assert!(e.contains("a host never signs"), "{e}");
    }

    /// CDU `cdu1`, key 1 of seed 1, which may lease.
    fn cdu1() -> Signer {
        Signer {
            role: Role::Cdu,
            name: Some(Ident::new("cdu1").unwrap()),
            key_id: 1,
            key: key(1).key.verifying_key(),
            may: May {
                lease: true,
                release: false,
                resend: false,
            },
        }
    }

    #[test]
    fn a_keyring_round_trips_and_says_what_is_wrong_where() {
        let site = Ident::new("hall-1").unwrap();
        let signers = vec![
            cdu1(),
            Signer {
                role: Role::Operator,
                name: Some(Ident::new("ops1").unwrap()),
                key_id: 1,
                key: key(2).key.verifying_key(),
                may: May {
                    lease: true,
                    release: true,
                    resend: true,
                },
            },
        ];
        let ring = parse_keyring(&keyring_toml(&site, &signers)).unwrap();
        assert_eq!(ring.site, Some(site));
        assert_eq!(ring.signers, signers);
        let pk = hex(key(1).key.verifying_key().as_bytes());
        let entry = |node: &str, pk: &str, may: &str| {
            format!(
                "[[signer]]\nnode = \"{node}\"\nkey_id = 1\npublic_key = \"{pk}\"\nmay = [{may}]\n"
            )
        };
        let e = parse_keyring(&entry("host/h01", &pk, "\"lease\"")).unwrap_err();
        assert!(e.contains("signer 1") && e.contains("never signs"), "{e}");
        let e = parse_keyring(&entry("cdu/cdu1", "abcd", "\"lease\"")).unwrap_err();
        assert!(e.contains("public_key") && e.contains("64 hex"), "{e}");
        let e = parse_keyring(&entry("cdu/cdu1", &pk, "\"reboot\"")).unwrap_err();
        assert!(
            e.contains("\"reboot\" is not lease, release or resend"),
            "{e}"
        );
        let e = parse_keyring(&entry("cdu/cdu1", &pk, "")).unwrap_err();
        assert!(e.contains("may is empty"), "{e}");
        let twice = format!(
            "{}{}",
            entry("cdu/cdu1", &pk, "\"lease\""),
            entry("cdu/cdu1", &pk, "\"lease\"")
        );
        let e = parse_keyring(&twice).unwrap_err();
        assert!(e.contains("signer 2") && e.contains("twice"), "{e}");
        assert!(parse_keyring("").unwrap_err().contains("no signer"));
        let e = parse_keyring(&entry("operator/*", &pk, "\"release\"")).unwrap_err();
        assert!(e.contains("demonstration keyring only"), "{e}");
    }

    /// One entry of a keyring: `node`, key id `id`, the key of `seed`.
    fn entry(node: &str, id: u8, seed: u8, may: &str) -> String {
        format!(
            "[[signer]]\nnode = \"{node}\"\nkey_id = {id}\npublic_key = \"{}\"\nmay = [{may}]\n",
            hex(key(seed).key.verifying_key().as_bytes())
        )
    }

    #[test]
    fn one_key_under_two_entries_is_refused_naming_both() {
        // A CDU's key listed as an operator's too: the CDU could release.
        let shared = format!(
            "{}{}",
            entry("cdu/cdu1", 1, 1, "\"lease\""),
            entry("operator/ops1", 1, 1, "\"lease\", \"release\"")
        );
        let e = parse_keyring(&shared).unwrap_err();
        assert!(
            e.starts_with(
                "signer 2 (operator/ops1): public_key is also that of signer 1 (cdu/cdu1)"
            ),
            "{e}"
        );
        // The same signer's key under a second id: not a rotation.
        let again = format!(
            "{}{}",
            entry("cdu/cdu1", 1, 1, "\"lease\""),
            entry("cdu/cdu1", 2, 1, "\"lease\"")
        );
        let e = parse_keyring(&again).unwrap_err();
        assert!(
            e.contains("signer 2 (cdu/cdu1)")
                && e.contains("also that of key id 1 of signer 1 (cdu/cdu1)"),
            "{e}"
        );
        // A rotation, a new key under a new id, is taken.
        let rotated = format!(
            "{}{}",
            entry("cdu/cdu1", 1, 1, "\"lease\""),
            entry("cdu/cdu1", 2, 2, "\"lease\"")
        );
        assert_eq!(parse_keyring(&rotated).unwrap().signers.len(), 2);
    }

    #[test]
    fn release_is_an_operators_right_alone() {
        // Given to a CDU or a facility (by an earlier sign-key): dropped,
        // the rest kept.
        for node in ["cdu/cdu1", "facility/bms1"] {
            let ring = parse_keyring(&entry(node, 1, 1, "\"lease\", \"release\"")).unwrap();
            let may = ring.signers[0].may;
            assert!(may.lease && !may.release, "{node}: {may:?}");
        }
        assert!(check_rights(
            Role::Cdu,
            May {
                release: true,
                ..May::default()
            }
        )
        .is_err());
        let ring = parse_keyring(&entry("operator/ops1", 1, 1, "\"release\"")).unwrap();
        assert!(ring.signers[0].may.release);
    }

    #[test]
    fn a_keyring_others_may_change_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyring.toml");
        let site = Ident::new("hall-1").unwrap();
        std::fs::write(&path, keyring_toml(&site, &[cdu1()])).unwrap();
        let mode = |m| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
        mode(0o666);
        let e = read_keyring(&path).unwrap_err();
        assert!(e.contains("writable by others") && e.contains("666"), "{e}");
        mode(0o664);
        let e = read_keyring(&path).unwrap_err();
        assert!(e.contains("writable by its group"), "{e}");
        mode(0o644);
        assert_eq!(read_keyring(&path).unwrap().signers.len(), 1, "public");
        // Owned by another user: only root can make the file so.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&path, Some(4321), None).unwrap();
            let e = read_keyring(&path).unwrap_err();
            assert!(e.contains("belongs to uid 4321"), "{e}");
        }
    }
}

//! The controller's keyring (`keyring`): the readers (operators, facility
//! systems) that may ask this CDU to publish its logged events again
//! (`docs/bus.md` §4.8), each with the key its requests are checked
//! against. The file is the hosts' keyring format
//! (`loopwarden_bus::keys::read_keyring`): refused when others than its
//! owner may change it, or when it names another site. Only its signers
//! with the `resend` right are served; the others' requests are answered
//! `forbidden`.
//!
//! Without a keyring, the demonstration key (`demo_key`) brings the
//! demonstration readers ([`demo_readers`]); with neither, no reader is
//! known and every request is refused as unauthenticated (the shell says
//! so at start).

use std::vec;
use std::vec::Vec;

use loopwarden_field::config::{ConfigError, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::auth::{May, Signer};
use loopwarden_protocol::{Ident, Role};

use super::{FileConfig, Overrides};

/// The readers that may ask for resends: the keyring's signers when one
/// is given (`keyring`, `--keyring`), else the demonstration readers with
/// the demonstration key (`demo`), else none.
pub(super) fn readers(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    site: &Ident,
    demo: bool,
) -> Result<Vec<Signer>, ConfigError> {
    match pick!(flags.keyring, file.keyring, "keyring") {
        (Some(path), flag) => loopwarden_bus::keys::read_site_keyring(&path, site, "controller")
            .map_err(|m| src.error(flag, "keyring", m)),
        (None, _) if demo => Ok(demo_readers()),
        (None, _) => Ok(Vec::new()),
    }
}

/// The simulated hall's readers: any operator and any facility system,
/// with the public demonstration key
/// ([`loopwarden_protocol::samples::demo_signing_key`]) as key 1, may ask
/// for resends, and nothing else.
pub fn demo_readers() -> Vec<Signer> {
    let key = loopwarden_protocol::samples::demo_signing_key().verifying_key();
    let reader = |role| Signer {
        role,
        name: None,
        key_id: 1,
        key,
        may: May {
            lease: false,
            release: false,
            resend: true,
        },
    };
    vec![reader(Role::Operator), reader(Role::Facility)]
}

#[cfg(test)]
mod tests {
    use super::super::{resolve, Config};
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::string::{String, ToString};

    use loopwarden_bus::keys::{keyring_toml, SignKey};
    use loopwarden_protocol::auth::SigningKey;
    use loopwarden_protocol::NodeId;

    const MIN: &str = "site = \"hall-1\"\ncdu = \"cdu-1\"\ndemo_key = true\n\
         cdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";

    fn from(text: &str) -> Result<Config, ConfigError> {
        resolve(Some(Path::new("cdu.toml")), text, &Overrides::default())
    }

    fn reader(role: Role, name: &str, seed: u8, may: May) -> Signer {
        Signer {
            role,
            name: Some(Ident::new(name).unwrap()),
            key_id: 2,
            key: SigningKey::from_bytes(&[seed; 32]).verifying_key(),
            may,
        }
    }

    fn resend() -> May {
        May {
            lease: false,
            release: false,
            resend: true,
        }
    }

    /// The keyring of `site` holding `signers`, at `dir/keyring.toml`,
    /// mode `mode`.
    fn keyring(dir: &Path, site: &str, signers: &[Signer], mode: u32) -> PathBuf {
        let path = dir.join("keyring.toml");
        let text = keyring_toml(&Ident::new(site).unwrap(), signers);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_keyring_gives_its_readers_and_must_be_this_sites() {
        let dir = tempfile::tempdir().unwrap();
        let signers = vec![
            reader(Role::Facility, "bms1", 7, resend()),
            reader(Role::Operator, "alice", 8, resend()),
            reader(
                Role::Cdu,
                "cdu-2",
                9,
                May {
                    lease: true,
                    ..May::default()
                },
            ),
        ];
        let ring = keyring(dir.path(), "hall-1", &signers, 0o644);
        let c = from(&format!("{MIN}keyring = {ring:?}\n")).expect("valid");
        assert_eq!(c.readers, signers, "the keyring's, not the demonstration's");
        // A flag gives it too, and is named in its errors.
        let flags = Overrides {
            keyring: Some(ring.clone()),
            ..Default::default()
        };
        let c = resolve(None, MIN, &flags).expect("valid");
        assert_eq!(c.readers, signers);
        let flags = Overrides {
            keyring: Some(dir.path().join("none.toml")),
            ..Default::default()
        };
        let e = resolve(None, MIN, &flags).unwrap_err();
        assert_eq!(e.origin, "flag --keyring", "{e}");
        assert!(e.message.contains("cannot read keyring"), "{e}");
        // Another site's keyring is refused at its line.
        let e = from(&format!(
            "{}keyring = {ring:?}\n",
            MIN.replace("hall-1", "hall-2")
        ))
        .unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("cdu.toml", Some(6)), "{e}");
        assert!(
            e.message
                .contains("is the keyring of site hall-1, and this controller is in site hall-2"),
            "{e}"
        );
        // Its own errors too.
        std::fs::write(&ring, "site = \"hall-1\"\n").unwrap();
        let e = from(&format!("{MIN}keyring = {ring:?}\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("holds no signer"), "{e}");
    }

    #[test]
    fn a_keyring_others_may_write_is_refused_naming_keyring() {
        let dir = tempfile::tempdir().unwrap();
        let signers = [reader(Role::Facility, "bms1", 7, resend())];
        let ring = keyring(dir.path(), "hall-1", &signers, 0o666);
        let e = from(&format!("{MIN}period_ms = 500\nkeyring = {ring:?}\n")).unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("cdu.toml", Some(7)), "{e}");
        assert!(e.message.starts_with("keyring "), "{e}");
        assert!(e.message.contains("writable by others (mode 666)"), "{e}");
        assert!(e.to_string().contains("cdu.toml line 7: keyring"), "{e}");
    }

    #[test]
    fn the_demonstration_key_without_a_keyring_brings_the_demonstration_readers() {
        let c = from(MIN).expect("valid");
        assert_eq!(c.readers, demo_readers());
        let demo = loopwarden_protocol::samples::demo_signing_key().verifying_key();
        for role in [Role::Operator, Role::Facility] {
            let r = c
                .readers
                .iter()
                .find(|r| r.role == role)
                .expect("a reader of the role");
            let anyone = NodeId::new(role, "anyone").unwrap();
            assert!(r.is(&anyone, 1), "any name, key id 1");
            assert_eq!(r.key, demo);
            assert_eq!(r.may, resend(), "resend, and no lease or release");
        }
        assert!(c.readers.iter().all(|r| r.role != Role::Cdu));
    }

    #[test]
    fn a_site_key_without_a_keyring_has_no_reader() {
        let dir = tempfile::tempdir().unwrap();
        let key = SignKey {
            node: NodeId::new(Role::Cdu, "cdu-1").unwrap(),
            key_id: 1,
            key: SigningKey::from_bytes(&[5; 32]),
        };
        let key_path = dir.path().join("cdu-1.sign.key");
        std::fs::write(&key_path, key.to_toml()).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let map = dir.path().join("map.toml");
        std::fs::write(&map, include_str!("../../../boards/cdus/sim-cdu.toml")).unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 2\nhosts_per_rack = 3\n").unwrap();
        let text: String = MIN.replace("demo_key = true", &format!("sign_key = {key_path:?}"))
            + &format!(
                "register_map = {map:?}\nsite_figures = {figures:?}\nvolatile_latch = true\n\
                 hosts_pattern = \"r{{rack}}h{{host}}\"\n"
            );
        let c = from(&text).expect("valid");
        assert!(!c.demo_key);
        assert!(c.readers.is_empty(), "every request refused");
        let signers = [reader(Role::Facility, "bms1", 7, resend())];
        let ring = keyring(dir.path(), "hall-1", &signers, 0o600);
        let c = from(&(text.to_string() + &format!("keyring = {ring:?}\n"))).expect("valid");
        assert_eq!(c.readers, signers);
    }
}

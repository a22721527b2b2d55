//! This controller's sign key, which cap leases are signed with: the
//! site's key file (`sign_key`), which must be this CDU's, or the public
//! demonstration key (`demo_key`, the twin only); one of the two.

use std::format;

use loopwarden_field::config::{ConfigError, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::{Ident, Role};

use super::{read_sign_key, FileConfig, Overrides};

/// The key cap leases are signed with.
pub(super) struct SiteKey {
    /// Its id.
    pub(super) id: u8,
    /// The key.
    pub(super) key: SigningKey,
    /// It is the public demonstration key.
    pub(super) demo: bool,
}

/// The sign key: from `sign_key`, which must be this CDU's, or the
/// demonstration key with `demo_key`; one of the two, not both.
pub(super) fn sign_key(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    cdu: &Ident,
) -> Result<SiteKey, ConfigError> {
    let demo_flag = flags.demo_key.then_some(true);
    let (demo, demo_from) = pick!(demo_flag, file.demo_key, "demo-key");
    let demo = demo.unwrap_or(false);
    match (pick!(flags.sign_key, file.sign_key, "sign-key"), demo) {
        ((Some(_), flag), true) => Err(src.error(
            flag.or(demo_from),
            "sign_key",
            "sign_key and demo_key exclude each other".into(),
        )),
        ((Some(p), flag), false) => {
            let k = read_sign_key(&p).map_err(|m| src.error(flag, "sign_key", m))?;
            if k.node.role != Role::Cdu || k.node.id != *cdu {
                return Err(src.error(
                    flag,
                    "sign_key",
                    format!(
                        "{} is the key of {}/{}, and this controller is cdu/{cdu}: hosts would refuse its leases",
                        p.display(),
                        k.node.role.as_str(),
                        k.node.id
                    ),
                ));
            }
            Ok(SiteKey {
                id: k.key_id,
                key: k.key,
                demo: false,
            })
        }
        ((None, _), true) => Ok(SiteKey {
            id: 1,
            key: loopwarden_protocol::samples::demo_signing_key(),
            demo: true,
        }),
        ((None, _), false) => Err(src.error(
            None,
            "sign_key",
            "no sign key: give sign_key (or --sign-key) to sign cap leases and the CDU state; \
             --demo-key signs with the public demonstration key, for the twin only"
                .into(),
        )),
    }
}

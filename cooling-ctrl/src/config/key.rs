//! This controller's sign key, which cap leases are signed with: the
//! site's key file (`sign_key`), which must be this CDU's, or the public
//! demonstration key (`demo_key`, the twin only); one of the two. A build
//! without the `twin` feature (the production build, the packages')
//! refuses `demo_key`: with it the controller would sign leases anyone can
//! forge and take the simulated CDU's register map and the twin's hall.

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
    if demo {
        demo_key_built_in(src, demo_from, cfg!(feature = "twin"))?;
    }
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

/// The demonstration key (given by `flag`, or the file's `demo_key`) is
/// refused by a build without the twin (`twin`: this build has it).
fn demo_key_built_in(src: &Sources, flag: Option<&str>, twin: bool) -> Result<(), ConfigError> {
    if twin {
        return Ok(());
    }
    Err(src.error(
        flag,
        "demo_key",
        "demo_key: this build has no twin (built without the `twin` feature, as the packages \
         are): the public demonstration key signs leases anyone can forge, and with it the \
         controller would drive the CDU with the simulated CDU's register map; give this CDU's \
         sign_key (`lwbus pki init`), or run a build with the twin for the simulated CDU"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_demonstration_key_is_refused_by_a_build_without_the_twin() {
        let text = "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"10.0.0.9:502\"\n";
        let src = Sources::new(Some(Path::new("cdu.toml")), text);
        assert!(demo_key_built_in(&src, None, true).is_ok());
        let e = demo_key_built_in(&src, None, false).unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("cdu.toml", Some(2)), "{e}");
        for said in ["no twin", "anyone can forge", "sign_key"] {
            assert!(e.message.contains(said), "{said}: {e}");
        }
        let e = demo_key_built_in(&src, Some("demo-key"), false).unwrap_err();
        assert_eq!(e.origin, "flag --demo-key", "{e}");
    }

    /// This build's answer: the twin's (the default features) takes the
    /// key, the production build's refuses it.
    #[test]
    fn this_build_answers_as_its_features_say() {
        let text = "cdu = \"cdu-1\"\ndemo_key = true\n";
        let src = Sources::new(Some(Path::new("cdu.toml")), text);
        let file: FileConfig = loopwarden_field::config::parse(None, text).unwrap();
        let got = sign_key(
            &src,
            &file,
            &Overrides::default(),
            &Ident::new("cdu-1").unwrap(),
        );
        assert_eq!(got.is_ok(), cfg!(feature = "twin"));
    }
}

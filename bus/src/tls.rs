//! TLS to the broker: the site's CA, the device's certificate and key, and
//! the broker's name checked.
//!
//! Every client of the bus (both agents and `lwbus`) takes the same four
//! settings: `tls_ca` (PEM, the CA that signed the broker's certificate),
//! `tls_cert` and `tls_key` (PEM, this device's identity; the broker takes
//! the certificate's CN as the user name), and `tls_server_name`, the name
//! the broker's certificate must carry when it differs from the host in
//! `broker` (an address, say). TLS 1.2 and 1.3 only, with the ring
//! provider; the broker's chain and name are always checked.
//!
//! The device's certificate must be made out to the node that uses it:
//! its subject's CN is the identity the site's ACL knows it by (the host
//! id, the CDU id, the operator's or reader's name), and a client that
//! knows whose it should be refuses another's ([`Tls::check_identity`]).
//!
//! Glossary:
//! - *CA*: certificate authority; here the site's own (`lwbus pki init`)
//!   or the site's existing PKI.
//! - *CN*: the common name of a certificate's subject ([`common_name`]);
//!   the broker's user name for a device certificate.
//! - *server name*: the DNS name or address the broker's certificate must
//!   name (its subject alternative names).

mod subject;
mod validity;
pub use subject::common_name;
pub use validity::{validity, Validity};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use loopwarden_protocol::TimestampMs;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Where the TLS files are, as configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s), PEM.
    pub ca: PathBuf,
    /// This device's certificate (chain), PEM, with its key.
    pub cert: Option<PathBuf>,
    /// This device's private key, PEM (PKCS#8, SEC1 or PKCS#1).
    pub key: Option<PathBuf>,
    /// The name the broker's certificate must carry; default: the host
    /// of the broker address.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// The files `lwbus pki init` wrote into `dir` for identity `who`:
    /// `ca.crt`, `who.crt`, `who.key`.
    pub fn of_identity(dir: &Path, who: &str) -> Self {
        Self {
            ca: dir.join("ca.crt"),
            cert: Some(dir.join(format!("{who}.crt"))),
            key: Some(dir.join(format!("{who}.key"))),
            server_name: None,
        }
    }
}

/// TLS settings, loaded and checked: ready for every connection.
#[derive(Clone)]
pub struct Tls {
    /// The rustls configuration.
    pub config: Arc<ClientConfig>,
    /// The files it came from.
    pub files: TlsFiles,
    /// When the CA's and this device's certificates are valid, with the
    /// file each is in.
    pub validity: Vec<Dated>,
    /// The CN of this device's certificate (the first of its file), or
    /// why none reads ([`common_name`]); `None` without a certificate.
    pub cert_cn: Option<Result<String, String>>,
}

/// Days before a certificate's end from which it is warned of.
pub const EXPIRY_WARN_DAYS: u64 = 30;

/// A certificate's validity, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dated {
    /// The file (and which certificate of it, in a file of several).
    pub what: String,
    /// When it is valid.
    pub validity: Validity,
    /// One of several roots of the file: out of date, it refuses nothing
    /// while another of them is valid (an intermediate, a link of the
    /// chain, is never one).
    pub in_bundle: bool,
}

impl Tls {
    /// What to say of the certificates at `now`: each one expired or not
    /// yet valid (an error: the broker refuses it, or this client refuses
    /// the broker's; a warning for one CA of several while another is
    /// valid), or ending within [`EXPIRY_WARN_DAYS`] (a warning).
    pub fn validity_notes(&self, now: TimestampMs) -> Vec<(bool, String)> {
        let warn_ms = EXPIRY_WARN_DAYS * 86_400_000;
        let valid = |v: &Validity| v.not_before <= now && now <= v.not_after;
        let bundle_valid = (self.validity.iter()).any(|d| d.in_bundle && valid(&d.validity));
        let mut notes = Vec::new();
        for d in &self.validity {
            let (what, v) = (&d.what, &d.validity);
            let error = !(d.in_bundle && bundle_valid);
            let others = if error {
                ""
            } else {
                " (another CA of the file is valid)"
            };
            if now > v.not_after {
                notes.push((
                    error,
                    format!(
                        "{what} expired on {}{others}: renew it (`lwbus pki`, or the site's PKI); the broker and this client refuse it",
                        day(v.not_after)
                    ),
                ));
            } else if now < v.not_before {
                notes.push((
                    error,
                    format!(
                        "{what} is not valid before {}{others}: is this machine's clock right (timedatectl)?",
                        day(v.not_before)
                    ),
                ));
            } else if v.not_after.0 - now.0 < warn_ms {
                notes.push((
                    false,
                    format!(
                        "{what} expires on {}, in {} days: renew it before",
                        day(v.not_after),
                        (v.not_after.0 - now.0) / 86_400_000
                    ),
                ));
            }
        }
        notes
    }

    /// Refuses a device certificate that is not made out to `who`, the
    /// identity this node is on the bus (a `role`: host, CDU, operator…):
    /// the broker would take its CN as the user, and the ACL would drop
    /// this node's publishes (while acknowledging them, so they leave the
    /// outbox for good) and deny its command subscriptions. One whose CN
    /// does not read is refused too. Without a device certificate there
    /// is nothing to check.
    pub fn check_identity(&self, role: &str, who: &str) -> Result<(), TlsError> {
        let Some(cert) = &self.files.cert else {
            return Ok(());
        };
        let found = match &self.cert_cn {
            Some(Ok(cn)) if cn == who => return Ok(()),
            Some(Ok(cn)) => format!("is made out to CN {cn:?}"),
            Some(Err(why)) => why.clone(),
            None => "was not read".to_string(),
        };
        Err(err(TlsPart::Cert)(format!(
            "TLS certificate {} {found}, but this node is {role} {who:?}: the broker takes \
             the CN as the user name, and the ACL would drop this node's frames and \
             commands; give this node its own certificate (CN {who:?})",
            cert.display()
        )))
    }

    /// Says [`Tls::validity_notes`] at `now` in the log.
    pub fn say_validity(&self, now: TimestampMs) {
        for (error, note) in self.validity_notes(now) {
            if error {
                tracing::error!("TLS: {note}");
            } else {
                tracing::warn!("TLS: {note}");
            }
        }
    }
}

/// `t` as a day and a minute, UTC.
fn day(t: TimestampMs) -> String {
    let u = t.utc();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        u.year, u.month, u.day, u.hour, u.minute
    )
}

/// The validity of each certificate of `certs` (from `path`, a `what`)
/// that reads; several of a CA file are a bundle.
fn validities(certs: &[CertificateDer<'_>], what: &str, path: &Path) -> Vec<Dated> {
    let many = certs.len() > 1;
    certs
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let validity = validity(c.as_ref())?;
            let which = if many {
                format!(" (certificate {} of the file)", i + 1)
            } else {
                String::new()
            };
            Some(Dated {
                what: format!("{what} {}{which}", path.display()),
                validity,
                // Roots are alternatives; an intermediate is a link of a
                // chain, needed as much as the root.
                in_bundle: many && what == "TLS CA" && validity.self_signed,
            })
        })
        .collect()
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls {:?}", self.files)
    }
}

/// Which setting a TLS error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPart {
    /// `tls_ca`.
    Ca,
    /// `tls_cert`.
    Cert,
    /// `tls_key`.
    Key,
    /// `tls_server_name`.
    ServerName,
}

/// Why the TLS settings were refused, and which one is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// The setting.
    pub part: TlsPart,
    /// What is wrong, naming the file.
    pub message: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TlsError {}

fn err(part: TlsPart) -> impl Fn(String) -> TlsError {
    move |message| TlsError { part, message }
}

/// The TLS flags of a command-line tool.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct TlsArgs {
    /// CA certificate (PEM) that signed the broker's: connect with TLS.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM).
    #[arg(long, requires = "tls_ca", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The name the broker's certificate must carry, if not the broker's
    /// host.
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// The settings, loaded; `None` without `--tls-ca`.
    pub fn load(&self) -> Result<Option<Tls>, String> {
        let Some(ca) = self.tls_ca.clone() else {
            return Ok(None);
        };
        Tls::load(TlsFiles {
            ca,
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            server_name: self.tls_server_name.clone(),
        })
        .map(Some)
        .map_err(|e| e.message)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let at = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| at(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| at(&e))?;
    if certs.is_empty() {
        return Err(at(&"holds no PEM certificate"));
    }
    Ok(certs)
}

/// A private key file, refused if others can read it.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    crate::keys::check_private(path, "TLS key")?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("TLS key {}: holds no PEM private key", path.display())
        }
        e => format!("TLS key {}: {e}", path.display()),
    })
}

/// The dates of the CA certificate `der` (the `i`th of the file, of `n`),
/// or why they cannot be read. The TLS library never checks a trust
/// anchor's dates, so each CA is trusted only within its own
/// ([`Anchored`], at each handshake).
fn ca_dates(der: &[u8], i: usize, n: usize, path: &Path) -> Result<Validity, String> {
    let which = if n > 1 {
        format!(" (certificate {} of the file)", i + 1)
    } else {
        String::new()
    };
    validity(der)
        .ok_or_else(|| format!("TLS CA {}{which}: its dates cannot be read", path.display()))
}

impl Tls {
    /// Reads and checks the files: the CA file may be changed by its owner
    /// only, as a keyring ([`crate::keys::check_trusted`]), and parses,
    /// its CAs' dates readable; the certificate and key belong together;
    /// the server name is a name or an address. Each handshake trusts
    /// only the CAs within their dates at its own time ([`Anchored`]); a
    /// CA out of its dates now is said at start ([`Tls::say_validity`]),
    /// not refused, so an agent whose clock is wrong at boot connects
    /// once it is right.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let ca_err = err(TlsPart::Ca);
        crate::keys::check_trusted(&files.ca, "TLS CA").map_err(&ca_err)?;
        let cas = certs(&files.ca, "TLS CA").map_err(&ca_err)?;
        let mut validity = validities(&cas, "TLS CA", &files.ca);
        let provider = provider();
        let mut roots = Vec::new();
        let mut left_out = Vec::new();
        let n = cas.len();
        for (i, c) in cas.into_iter().enumerate() {
            let dates = match ca_dates(c.as_ref(), i, n, &files.ca) {
                Ok(dates) => dates,
                Err(why) => {
                    left_out.push(why);
                    continue;
                }
            };
            let at =
                |e: &dyn std::fmt::Display| ca_err(format!("TLS CA {}: {e}", files.ca.display()));
            let mut root = RootCertStore::empty();
            root.add(c).map_err(|e| at(&e))?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(root), provider.clone())
                    .build()
                    .map_err(|e| at(&e))?;
            roots.push((dates, webpki));
        }
        // A CA out of its dates now is kept, and trusted only within them
        // (a machine whose clock is wrong at boot connects once it is
        // right); `validity` says it at start. One whose dates do not read
        // is never trusted.
        if roots.is_empty() {
            return Err(ca_err(format!(
                "{}: no CA of the file can be trusted",
                left_out.join("; ")
            )));
        }
        for why in &left_out {
            tracing::warn!("TLS: {why}: left out of the trusted CAs");
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ca_err(format!("TLS: {e}")))?;
        let name = match &files.server_name {
            Some(name) => Some(ServerName::try_from(name.clone()).map_err(|_| TlsError {
                part: TlsPart::ServerName,
                message: format!("tls_server_name {name:?} is not a DNS name or address"),
            })?),
            None => None,
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Anchored { roots, name }));
        let (cert_err, key_err) = (err(TlsPart::Cert), err(TlsPart::Key));
        let mut cert_cn = None;
        let config = match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                let chain = certs(cert, "TLS certificate").map_err(&cert_err)?;
                validity.extend(validities(&chain, "TLS certificate", cert));
                cert_cn = Some(common_name(chain[0].as_ref()));
                let secret = private_key(key).map_err(&key_err)?;
                builder.with_client_auth_cert(chain, secret).map_err(|e| {
                    cert_err(format!(
                        "TLS certificate {} and key {} do not go together: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => return Err(cert_err("tls_cert is given without tls_key".into())),
            (None, Some(_)) => return Err(key_err("tls_key is given without tls_cert".into())),
        };
        Ok(Tls {
            config: Arc::new(config),
            files,
            validity,
            cert_cn,
        })
    }
}

/// The web PKI verifier, one per trusted CA, each used only while its CA
/// is within its dates at the handshake (the library never checks a
/// trust anchor's dates: an agent that runs on past its CA's end would
/// otherwise go on trusting it); checking a configured name, when one is
/// given, instead of the host connected to.
#[derive(Debug)]
struct Anchored {
    /// Each CA's dates and its verifier; never empty.
    roots: Vec<(Validity, Arc<WebPkiServerVerifier>)>,
    name: Option<ServerName<'static>>,
}

impl ServerCertVerifier for Anchored {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        connected_to: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = match &self.name {
            Some(name) => name,
            None => connected_to,
        };
        let ms = now.as_secs().saturating_mul(1000);
        let mut refused = rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
            rustls::OtherError(Arc::new(std::io::Error::other(
                "no CA of tls_ca is within its dates now: renew it",
            ))),
        ));
        for (dates, verifier) in &self.roots {
            if dates.not_before.0 <= ms && ms <= dates.not_after.0 {
                match verifier.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
                    Ok(verified) => return Ok(verified),
                    Err(e) => refused = e,
                }
            }
        }
        Err(refused)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots[0].1.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.roots[0].1.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.roots[0].1.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn bad_files_say_what_is_wrong_and_where() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["h01".into()]).unwrap();
        let ca_path = write(dir.path(), "ca.crt", &ca.cert.pem(), 0o644);
        let files = |cert: Option<PathBuf>, key: Option<PathBuf>| TlsFiles {
            ca: ca_path.clone(),
            cert,
            key,
            server_name: None,
        };
        assert!(Tls::load(files(None, None)).is_ok());
        let empty = write(dir.path(), "empty.crt", "", 0o644);
        let e = Tls::load(TlsFiles {
            ca: empty,
            ..files(None, None)
        })
        .unwrap_err()
        .message;
        assert!(
            e.contains("TLS CA") && e.contains("no PEM certificate"),
            "{e}"
        );
        let cert = write(dir.path(), "h01.crt", &ca.cert.pem(), 0o644);
        let key = write(
            dir.path(),
            "h01.key",
            &other.key_pair.serialize_pem(),
            0o600,
        );
        let e = Tls::load(files(Some(cert.clone()), Some(key)))
            .unwrap_err()
            .message;
        assert!(e.contains("do not go together"), "{e}");
        let open = write(dir.path(), "open.key", &ca.key_pair.serialize_pem(), 0o644);
        let e = Tls::load(files(Some(cert.clone()), Some(open)))
            .unwrap_err()
            .message;
        assert!(e.contains("readable by others"), "{e}");
        let good = write(dir.path(), "good.key", &ca.key_pair.serialize_pem(), 0o600);
        assert!(Tls::load(files(Some(cert), Some(good))).is_ok());
        let e = Tls::load(TlsFiles {
            server_name: Some("not a name!".into()),
            ..files(None, None)
        })
        .unwrap_err()
        .message;
        assert!(e.contains("tls_server_name"), "{e}");
    }

    /// A certificate that expired, is not valid yet, or ends within 30
    /// days is said by file and date; one well within its time is not.
    #[test]
    fn certificates_out_of_their_time_or_ending_soon_are_said() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["h01".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2026, 1, 1);
        p.not_after = rcgen::date_time_ymd(2028, 4, 5);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        let ca = write(dir.path(), "ca.crt", &cert.pem(), 0o644);
        let crt = write(dir.path(), "h01.crt", &cert.pem(), 0o644);
        let k = write(dir.path(), "h01.key", &key.serialize_pem(), 0o600);
        let day = |y, m, d| {
            let v = validity::tests_day(y, m, d);
            TimestampMs(v)
        };
        let tls = Tls::load(TlsFiles {
            ca,
            cert: Some(crt),
            key: Some(k),
            server_name: None,
        })
        .expect("loads");
        assert_eq!(tls.validity.len(), 2, "the CA and the certificate");
        assert!(tls.validity_notes(day(2027, 1, 1)).is_empty());
        let soon = tls.validity_notes(day(2028, 3, 26));
        assert_eq!(soon.len(), 2);
        assert!(
            !soon[1].0
                && soon[1]
                    .1
                    .contains("h01.crt expires on 2028-04-05 00:00 UTC, in 10 days"),
            "{soon:?}"
        );
        let ended = tls.validity_notes(day(2028, 4, 6));
        assert!(
            ended[0].0
                && ended[0].1.starts_with("TLS CA ")
                && ended[0].1.contains("expired on 2028-04-05"),
            "{ended:?}"
        );
        // A CA file of two, one of them ended: a warning, not an error.
        let mut q = rcgen::CertificateParams::new(vec!["old-ca".into()]).unwrap();
        q.not_before = rcgen::date_time_ymd(2020, 1, 1);
        q.not_after = rcgen::date_time_ymd(2027, 1, 1);
        let old_ca = q.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
        let bundle = write(
            dir.path(),
            "bundle.crt",
            &format!("{}{}", cert.pem(), old_ca.pem()),
            0o644,
        );
        let both = Tls::load(TlsFiles {
            ca: bundle,
            cert: None,
            key: None,
            server_name: None,
        })
        .expect("loads: one CA is valid");
        let notes = both.validity_notes(day(2027, 6, 1));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            !notes[0].0
                && notes[0].1.contains("certificate 2 of the file) expired")
                && notes[0].1.contains("another CA of the file is valid"),
            "{notes:?}"
        );
        // A root and an intermediate it signed, ended: a link of the chain,
        // an error.
        let root_key = rcgen::KeyPair::generate().unwrap();
        let mut r = rcgen::CertificateParams::new(vec!["root".into()]).unwrap();
        r.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        r.not_before = rcgen::date_time_ymd(2020, 1, 1);
        r.not_after = rcgen::date_time_ymd(2040, 1, 1);
        r.distinguished_name = rcgen::DistinguishedName::new();
        r.distinguished_name
            .push(rcgen::DnType::CommonName, "site root");
        let root = r.self_signed(&root_key).unwrap();
        let mut m = rcgen::CertificateParams::new(vec!["intermediate".into()]).unwrap();
        m.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        m.not_before = rcgen::date_time_ymd(2020, 1, 1);
        m.not_after = rcgen::date_time_ymd(2027, 1, 1);
        m.distinguished_name = rcgen::DistinguishedName::new();
        m.distinguished_name
            .push(rcgen::DnType::CommonName, "site intermediate");
        let mid = m
            .signed_by(&rcgen::KeyPair::generate().unwrap(), &root, &root_key)
            .unwrap();
        let chain = write(
            dir.path(),
            "chain.crt",
            &format!("{}{}", root.pem(), mid.pem()),
            0o644,
        );
        let chained = Tls::load(TlsFiles {
            ca: chain,
            cert: None,
            key: None,
            server_name: None,
        })
        .expect("loads");
        let notes = chained.validity_notes(day(2027, 6, 1));
        assert!(notes.len() == 1 && notes[0].0, "an error: {notes:?}");
        let early = tls.validity_notes(day(1970, 1, 2));
        assert!(
            early[1].0 && early[1].1.contains("not valid before 2026-01-01"),
            "{early:?}"
        );
    }

    /// A CA certificate valid from `from` to `to` (years), and its key.
    fn ca_of(name: &str, from: i32, to: i32) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.not_before = rcgen::date_time_ymd(from, 1, 1);
        p.not_after = rcgen::date_time_ymd(to, 1, 1);
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        (p.self_signed(&key).unwrap(), key)
    }

    /// A broker certificate for `localhost`, valid 2020 to 2090, signed
    /// by `ca`: its chain and key.
    fn broker_of(
        ca: &(rcgen::Certificate, rcgen::KeyPair),
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2090, 1, 1);
        let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
        let der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        (vec![cert.der().clone()], der)
    }

    /// A TLS handshake in memory between a client of `tls` and a server
    /// with `chain` and `key`, connected to as `localhost`.
    fn handshake(
        tls: &Tls,
        server: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    ) -> Result<(), rustls::Error> {
        handshake_as(tls, server, "localhost")
    }

    /// [`handshake`], connected to as `to`.
    fn handshake_as(
        tls: &Tls,
        (chain, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
        to: &str,
    ) -> Result<(), rustls::Error> {
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        let name = ServerName::try_from(to.to_string()).unwrap();
        let mut c = rustls::ClientConnection::new(tls.config.clone(), name).unwrap();
        for _ in 0..8 {
            let mut wire = Vec::new();
            c.write_tls(&mut wire).unwrap();
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets()?;
            wire.clear();
            s.write_tls(&mut wire).unwrap();
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets()?;
            if !c.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake did not end");
    }

    /// The TLS library never checks a trust anchor's dates: an expired CA
    /// is kept out of the trusted roots, and a file of none valid is
    /// refused.
    #[test]
    fn an_out_of_date_ca_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let old = ca_of("old site CA", 2020, 2021);
        let path = write(dir.path(), "ca.crt", &old.0.pem(), 0o644);
        let files = |ca: &Path| TlsFiles {
            ca: ca.to_path_buf(),
            cert: None,
            key: None,
            server_name: None,
        };
        // Out of its dates now: it loads (an agent whose clock is wrong at
        // boot connects once it is right), is said, and a broker it signed
        // is refused (the handshake is at the wall clock's time).
        let tls = Tls::load(files(&path)).expect("loads");
        let notes = tls.validity_notes(TimestampMs(validity::tests_day(2026, 6, 1)));
        assert!(
            notes
                .iter()
                .any(|(error, n)| *error && n.contains("expired on 2021-01-01")),
            "{notes:?}"
        );
        let e = handshake(&tls, broker_of(&old)).unwrap_err();
        assert!(
            e.to_string()
                .contains("no CA of tls_ca is within its dates"),
            "{e}"
        );
        // Beside a valid CA: the file loads, and only the valid CA is
        // trusted.
        let new = ca_of("new site CA", 2020, 2090);
        let both = write(
            dir.path(),
            "both.crt",
            &format!("{}{}", old.0.pem(), new.0.pem()),
            0o644,
        );
        let tls = Tls::load(files(&both)).expect("one CA is valid");
        handshake(&tls, broker_of(&new)).expect("the valid CA's broker is trusted");
        let e = handshake(&tls, broker_of(&old)).unwrap_err();
        assert!(
            matches!(e, rustls::Error::InvalidCertificate(_)),
            "the expired CA's broker: {e:?}"
        );
        // Reached by an address: the name checked is tls_server_name.
        let e = handshake_as(&tls, broker_of(&new), "10.0.0.5").unwrap_err();
        assert!(matches!(e, rustls::Error::InvalidCertificate(_)), "{e:?}");
        let named = Tls::load(TlsFiles {
            server_name: Some("localhost".into()),
            ..files(&both)
        })
        .unwrap();
        handshake_as(&named, broker_of(&new), "10.0.0.5").expect("named localhost");
        let e = handshake_as(&named, broker_of(&old), "10.0.0.5").unwrap_err();
        assert!(matches!(e, rustls::Error::InvalidCertificate(_)), "{e:?}");
    }

    /// A CA file that others may change is refused, as a keyring is:
    /// whoever can write it chooses which broker is trusted.
    #[test]
    fn a_ca_file_others_may_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca_of("site CA", 2020, 2090);
        let path = write(dir.path(), "ca.crt", &ca.0.pem(), 0o666);
        let files = TlsFiles {
            ca: path.clone(),
            cert: None,
            key: None,
            server_name: None,
        };
        let e = Tls::load(files.clone()).unwrap_err();
        assert_eq!(e.part, TlsPart::Ca, "{e}");
        assert!(
            e.message.starts_with("TLS CA ")
                && e.message.contains("is writable by others (mode 666)"),
            "{e}"
        );
        write(dir.path(), "ca.crt", &ca.0.pem(), 0o620);
        let e = Tls::load(files.clone()).unwrap_err().message;
        assert!(e.contains("writable by its group"), "{e}");
        write(dir.path(), "ca.crt", &ca.0.pem(), 0o644);
        assert!(
            Tls::load(files).is_ok(),
            "public, written by its owner only"
        );
    }

    /// Every certificate of `tls_cert`'s chain is dated: an intermediate
    /// that expired is named by its place in the file.
    #[test]
    fn an_expired_intermediate_of_the_devices_chain_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = ca_of("site root", 2020, 2090);
        let mid_key = rcgen::KeyPair::generate().unwrap();
        let mut m = rcgen::CertificateParams::new(Vec::new()).unwrap();
        m.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        m.not_before = rcgen::date_time_ymd(2020, 1, 1);
        m.not_after = rcgen::date_time_ymd(2027, 1, 1);
        m.distinguished_name = rcgen::DistinguishedName::new();
        m.distinguished_name
            .push(rcgen::DnType::CommonName, "site intermediate");
        let mid = m.signed_by(&mid_key, &root.0, &root.1).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["h01".into()]).unwrap();
        p.not_before = rcgen::date_time_ymd(2020, 1, 1);
        p.not_after = rcgen::date_time_ymd(2090, 1, 1);
        let leaf = p.signed_by(&key, &mid, &mid_key).unwrap();
        let tls = Tls::load(TlsFiles {
            ca: write(dir.path(), "ca.crt", &root.0.pem(), 0o644),
            cert: Some(write(
                dir.path(),
                "h01.crt",
                &format!("{}{}", leaf.pem(), mid.pem()),
                0o644,
            )),
            key: Some(write(dir.path(), "h01.key", &key.serialize_pem(), 0o600)),
            server_name: None,
        })
        .expect("loads");
        assert_eq!(tls.validity.len(), 3, "the CA and both of the chain");
        let notes = tls.validity_notes(TimestampMs(validity::tests_day(2027, 6, 1)));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].0
                && notes[0]
                    .1
                    .contains("h01.crt (certificate 2 of the file) expired on 2027-01-01"),
            "{notes:?}"
        );
    }
}

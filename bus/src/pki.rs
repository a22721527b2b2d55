//! `lwbus pki init`: the certificates, keys, keyring and broker
//! configuration of a lab or a small site.
//!
//! One command writes, into one directory, everything a site needs to run
//! its bus over TLS with a certificate per device: a CA, a certificate and
//! key for the broker and for every identity (hosts, CDU controllers,
//! operators, facility readers), a sign key for every signer, the site's
//! keyring (hosts and CDU controllers), and a `mosquitto.conf` with its ACL that lets each identity
//! publish and read only its own topics. Nothing is overwritten: a
//! directory that already holds a CA is refused.
//!
//! Files (in `--out`):
//!
//! | file | what | mode |
//! |------|------|------|
//! | `ca.crt`, `ca.key` | the site CA (move the key offline) | 0644, 0600 |
//! | `broker.crt`, `broker.key` | the broker's identity | 0644, 0600 |
//! | `ID.crt`, `ID.key` | each identity's certificate and key | 0644, 0600 |
//! | `ID.sign.key` | each signer's Ed25519 key ([`crate::keys`]) | 0600 |
//! | `keyring.toml` | who may command the hosts, and ask hosts and controllers for resends (public) | 0644 |
//! | `mosquitto.conf`, `acl` | the broker's listener and ACL | 0644 |
//!
//! Glossary:
//! - *CA*: certificate authority; here the site's own, self-signed, the
//!   only one the broker and the clients trust.
//! - *CN*: common name, the name in a certificate's subject; the broker
//!   takes a client certificate's CN as its MQTT user name.
//! - *ACL*: access control list: the topics each user may write (publish)
//!   and read (receive), in mosquitto's `acl_file` format.
//! - *signer*: an identity whose commands hosts check against the keyring:
//!   a CDU controller (leases) or an operator (leases and releases).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use loopwarden_protocol::auth::{May, Signer, SigningKey};
use loopwarden_protocol::topic::ROOT;
use loopwarden_protocol::{Ident, NodeId, Role};
use rand::RngCore;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};

use crate::keys::{check_rights, keyring_toml, parse_may, signer_node, signer_toml, SignKey};

/// `lwbus pki …`.
#[derive(Debug, clap::Subcommand)]
pub enum PkiCommand {
    /// Write a site's CA, broker and device certificates, sign keys,
    /// keyring, mosquitto.conf and ACL into a directory.
    Init(InitArgs),
    /// Write one new sign key (to rotate a signer's key, or to add a
    /// signer to a site whose certificates come from its own PKI), and
    /// print the keyring entry that lets hosts accept it.
    SignKey(SignKeyArgs),
}

/// `lwbus pki sign-key`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SignKeyArgs {
    /// Who signs with it: `cdu/NAME`, `operator/NAME` or `facility/NAME`.
    #[arg(long)]
    pub node: String,
    /// Its key id (a rotation takes an id the signer does not use yet).
    #[arg(long)]
    pub key_id: u8,
    /// What hosts let it do: `lease`, `release`, `resend`
    /// (comma-separated); default: as `init` gives them, `lease` for a
    /// CDU, all three for an operator, `resend` for a facility reader. A
    /// CDU's must hold `lease` (hosts refuse its caps without it).
    #[arg(long, value_delimiter = ',')]
    pub may: Vec<String>,
    /// The file to write (mode 0600; never overwritten).
    #[arg(long)]
    pub out: PathBuf,
}

/// `lwbus pki init`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The site.
    #[arg(long)]
    pub site: String,
    /// The hosts, comma-separated; `h01@cdu1` names the CDU that cools a
    /// host (needed when there are several CDUs).
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    /// The CDU controllers, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub cdus: Vec<String>,
    /// The operators, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub operators: Vec<String>,
    /// The facility readers (read only), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub readers: Vec<String>,
    /// Where to write (created if absent; must hold no earlier output).
    #[arg(long)]
    pub out: PathBuf,
    /// The port of the broker's TLS listener on 127.0.0.1.
    #[arg(long, default_value_t = 8883)]
    pub broker_port: u16,
}

/// Runs a `pki` command.
pub fn run(command: PkiCommand) -> anyhow::Result<()> {
    match command {
        PkiCommand::Init(args) => {
            print!("{}", init(&args).map_err(|e| anyhow::anyhow!(e))?);
            Ok(())
        }
        PkiCommand::SignKey(args) => {
            print!("{}", sign_key(&args).map_err(|e| anyhow::anyhow!(e))?);
            Ok(())
        }
    }
}

/// Writes a new sign key for `args.node`; returns the keyring entry to
/// add to the hosts' keyrings (and the controllers', for a signer that
/// may ask for resends), with a note of what to do.
pub fn sign_key(args: &SignKeyArgs) -> Result<String, String> {
    let (role, name) = signer_node(&args.node).map_err(|e| format!("--node: {e}"))?;
    let name = ident("signer", name.as_str())?;
    // As `init` gives them: a CDU leases; an operator leases, releases and
    // asks for resends; a facility reader only asks for resends.
    let may = if args.may.is_empty() {
        May {
            lease: role != Role::Facility,
            release: role == Role::Operator,
            resend: role != Role::Cdu,
        }
    } else {
        let may = parse_may(&args.may).map_err(|e| format!("--may: {e}"))?;
        check_rights(role, may).map_err(|e| format!("--may: {e}"))?;
        if role == Role::Cdu && !may.lease {
            return Err(
                "--may: a CDU signer needs lease: hosts take its states with any of its keys, \
                 but refuse every cap lease signed with a key that may not lease, so a \
                 controller switched to this key would leave its hosts' GPUs uncapped when \
                 cooling falls short; give --may lease (or leave --may out)"
                    .into(),
            );
        }
        may
    };
    let key = new_sign_key(role, &name, args.key_id);
    write_new(&args.out, &key.to_toml(), 0o600)?;
    let signer = Signer {
        role,
        name: Some(name),
        key_id: args.key_id,
        key: key.key.verifying_key(),
        may,
    };
    let entry = signer_toml(&signer);
    // Controllers check resend requests against their keyring too.
    let keyrings = if may.resend {
        "every host's and every CDU controller's keyring.toml, restart them"
    } else {
        "every host's keyring.toml, restart the hosts"
    };
    let note = if role == Role::Facility && may.lease {
        "note: this facility signer may lease: it may cap any GPU of every host whose keyring \
         holds it, not only one CDU's; a reader needs only resend\n"
    } else {
        ""
    };
    Ok(format!(
        "wrote {} (keep it secret; mode 0600)\n{note}\
         add to {keyrings}, then switch the signer to it:\n\n{entry}",
        args.out.display()
    ))
}

/// Writes everything `args` asks for; returns what it wrote and what to
/// do next, for the operator to read.
pub fn init(args: &InitArgs) -> Result<String, String> {
    let plan = Plan::from_args(args)?;
    if args.out.join("ca.crt").exists() {
        return Err(format!(
            "{} already holds a CA (ca.crt): refusing to overwrite a site's keys; \
             choose another --out directory",
            args.out.display()
        ));
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let dir = args
        .out
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", args.out.display()))?;
    let files = output(&plan, &dir, args.broker_port)?;
    if let Some(f) = files.iter().find(|f| dir.join(&f.name).exists()) {
        return Err(format!(
            "{} already holds {}: refusing to overwrite; choose another --out directory",
            dir.display(),
            f.name
        ));
    }
    for f in &files {
        write_new(&dir.join(&f.name), &f.text, f.mode)?;
    }
    Ok(summary(&plan, &dir, args.broker_port))
}

/// The families a node publishes on its own subtree (all but `cmd`).
const OWN_FAMILIES: [&str; 6] = ["telemetry", "health", "event", "ack", "online", "resent"];

/// Names no identity may take: the broker's and the CA's files.
const RESERVED: [&str; 2] = ["broker", "ca"];

/// Who is who, checked.
#[derive(Debug)]
struct Plan {
    site: Ident,
    /// Each host with the CDU that cools it.
    hosts: Vec<(Ident, Ident)>,
    cdus: Vec<Ident>,
    operators: Vec<Ident>,
    readers: Vec<Ident>,
}

/// The non-empty items of a comma-separated list.
fn items(list: &[String]) -> impl Iterator<Item = &str> {
    list.iter().map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// `name` as a checked identity name of `kind`.
fn ident(kind: &str, name: &str) -> Result<Ident, String> {
    let id = Ident::new(name).map_err(|e| format!("{kind} {name:?}: {e}"))?;
    if RESERVED.contains(&name) {
        return Err(format!(
            "{kind} {name:?}: the name is reserved (it names the broker's or the CA's files)"
        ));
    }
    if name.ends_with(".sign") {
        return Err(format!(
            "{kind} {name:?}: a name may not end in \".sign\" (its key file would \
             clash with {name}.key of a signer)"
        ));
    }
    Ok(id)
}

impl Plan {
    fn from_args(args: &InitArgs) -> Result<Plan, String> {
        let site = Ident::new(&args.site).map_err(|e| format!("site {:?}: {e}", args.site))?;
        let cdus = items(&args.cdus)
            .map(|n| ident("CDU", n))
            .collect::<Result<Vec<_>, _>>()?;
        if cdus.is_empty() {
            return Err("no CDU: name at least one with --cdus".into());
        }
        let hosts = items(&args.hosts)
            .map(|h| host_item(h, &cdus))
            .collect::<Result<Vec<_>, _>>()?;
        if hosts.is_empty() {
            return Err("no host: name at least one with --hosts".into());
        }
        let operators = items(&args.operators)
            .map(|n| ident("operator", n))
            .collect::<Result<Vec<_>, _>>()?;
        let readers = items(&args.readers)
            .map(|n| ident("reader", n))
            .collect::<Result<Vec<_>, _>>()?;
        let plan = Plan {
            site,
            hosts,
            cdus,
            operators,
            readers,
        };
        plan.check_unique()?;
        Ok(plan)
    }

    /// Every identity with what it is, in file order.
    fn identities(&self) -> Vec<(&'static str, &Ident)> {
        let hosts = self.hosts.iter().map(|(h, _)| ("host", h));
        let cdus = self.cdus.iter().map(|c| ("CDU", c));
        let operators = self.operators.iter().map(|o| ("operator", o));
        let readers = self.readers.iter().map(|r| ("reader", r));
        hosts.chain(cdus).chain(operators).chain(readers).collect()
    }

    fn check_unique(&self) -> Result<(), String> {
        let all = self.identities();
        for (i, (kind, name)) in all.iter().enumerate() {
            if let Some((other, _)) = all[..i].iter().find(|(_, n)| n == name) {
                return Err(format!(
                    "{name:?} is named twice (as {other} and as {kind}): every identity \
                     needs its own name, it is its certificate's CN and MQTT user name"
                ));
            }
        }
        Ok(())
    }

    /// The hosts cooled by `cdu`.
    fn hosts_of<'a>(&'a self, cdu: &'a Ident) -> impl Iterator<Item = &'a Ident> + 'a {
        self.hosts
            .iter()
            .filter(move |(_, c)| c == cdu)
            .map(|(h, _)| h)
    }
}

/// A `--hosts` item, `NAME` or `NAME@CDU`, with the CDU that cools it.
fn host_item(item: &str, cdus: &[Ident]) -> Result<(Ident, Ident), String> {
    let (name, cdu) = match item.split_once('@') {
        Some((name, cdu)) => (name, Some(cdu)),
        None => (item, None),
    };
    let host = ident("host", name)?;
    let cdu = match (cdu, cdus) {
        (Some(c), _) => cdus.iter().find(|k| k.as_str() == c).ok_or_else(|| {
            format!(
                "host {item:?}: CDU {c:?} is not among --cdus ({})",
                list(cdus)
            )
        })?,
        (None, [only]) => only,
        (None, _) => {
            return Err(format!(
                "host {name:?}: there are several CDUs ({}), so say which one cools \
                 it, e.g. {name}@{}",
                list(cdus),
                cdus[0]
            ))
        }
    };
    Ok((host, cdu.clone()))
}

fn list(names: &[Ident]) -> String {
    names
        .iter()
        .map(|n| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One file to write.
struct OutFile {
    name: String,
    text: String,
    mode: u32,
}

impl OutFile {
    fn public(name: impl Into<String>, text: String) -> OutFile {
        OutFile {
            name: name.into(),
            text,
            mode: 0o644,
        }
    }

    fn secret(name: impl Into<String>, text: String) -> OutFile {
        OutFile {
            name: name.into(),
            text,
            mode: 0o600,
        }
    }
}

/// Everything to write, made in memory first so that a failure writes
/// nothing.
fn output(plan: &Plan, dir: &Path, port: u16) -> Result<Vec<OutFile>, String> {
    let ca_key = new_key()?;
    let ca = ca_cert(&plan.site, &ca_key)?;
    let mut files = vec![
        OutFile::public("ca.crt", ca.pem()),
        OutFile::secret("ca.key", ca_key.serialize_pem()),
    ];
    let (cert, key) = leaf("broker", true, &ca, &ca_key)?;
    files.push(OutFile::public("broker.crt", cert));
    files.push(OutFile::secret("broker.key", key));
    for (_, name) in plan.identities() {
        let (cert, key) = leaf(name, false, &ca, &ca_key)?;
        files.push(OutFile::public(format!("{name}.crt"), cert));
        files.push(OutFile::secret(format!("{name}.key"), key));
    }
    let mut signers = Vec::new();
    // CDUs lease; operators lease, release and ask for resends; readers
    // only ask for resends (of the events they read).
    let cdus = plan
        .cdus
        .iter()
        .map(|c| (Role::Cdu, c, (true, false, false)));
    let operators = (plan.operators.iter()).map(|o| (Role::Operator, o, (true, true, true)));
    let readers = (plan.readers.iter()).map(|r| (Role::Facility, r, (false, false, true)));
    for (role, name, (lease, release, resend)) in cdus.chain(operators).chain(readers) {
        let key = new_sign_key(role, name, 1);
        signers.push(Signer {
            role,
            name: Some(name.clone()),
            key_id: key.key_id,
            key: key.key.verifying_key(),
            may: May {
                lease,
                release,
                resend,
            },
        });
        files.push(OutFile::secret(format!("{name}.sign.key"), key.to_toml()));
    }
    files.push(OutFile::public(
        "keyring.toml",
        keyring_toml(&plan.site, &signers),
    ));
    files.push(OutFile::public("mosquitto.conf", mosquitto_conf(dir, port)));
    files.push(OutFile::public("acl", acl(plan)));
    Ok(files)
}

/// Writes `text` to a new file `path` with `mode`; never replaces one.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), String> {
    use std::io::Write;
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.mode(mode);
    }
    let mut file = open.open(path).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
            "it already exists (left from an earlier run? nothing is overwritten)".to_string()
        } else {
            e.to_string()
        };
        format!("cannot write {}: {why}", path.display())
    })?;
    // The umask may have taken bits off a public file: set the mode exactly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A new ECDSA P-256 key pair.
fn new_key() -> Result<KeyPair, String> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("cannot generate a key: {e}"))
}

/// A new Ed25519 sign key for `role`/`name` with id `key_id`.
fn new_sign_key(role: Role, name: &Ident, key_id: u8) -> SignKey {
    let mut seed = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut seed);
    let key = SigningKey::from_bytes(&seed);
    seed.fill(0);
    SignKey {
        node: NodeId {
            role,
            id: name.clone(),
        },
        key_id,
        key,
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// Certificate parameters with subject `cn`, a random serial, valid from a
/// day ago (clocks disagree) for `days`.
fn params(cn: &str, sans: Vec<String>, days: u64) -> Result<CertificateParams, String> {
    let mut p = CertificateParams::new(sans).map_err(|e| format!("certificate of {cn}: {e}"))?;
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.serial_number = Some(SerialNumber::from(rand::rngs::OsRng.next_u64() >> 1));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "the system clock is before 1970".to_string())?;
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    p.not_before = epoch + Duration::from_secs(now.as_secs()) - DAY;
    p.not_after = p.not_before + DAY * (days as u32 + 1);
    p.use_authority_key_identifier_extension = true;
    Ok(p)
}

/// The site CA: self-signed, ten years.
fn ca_cert(site: &Ident, key: &KeyPair) -> Result<Certificate, String> {
    let mut p = params(&format!("Loopwarden {site} CA"), Vec::new(), 3653)?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.use_authority_key_identifier_extension = false;
    p.self_signed(key)
        .map_err(|e| format!("cannot sign the CA certificate: {e}"))
}

/// A certificate (PEM) for `cn` signed by the CA, with its new key (PEM):
/// the broker's (server) or a client's, about 825 days.
fn leaf(
    cn: &str,
    server: bool,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> Result<(String, String), String> {
    let sans = if server {
        vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
    } else {
        Vec::new()
    };
    let mut p = params(cn, sans, 825)?;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![if server {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    let key = new_key()?;
    let cert = p
        .signed_by(&key, ca, ca_key)
        .map_err(|e| format!("cannot sign the certificate of {cn}: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Whether root owns `dir` (and so the keys written into it).
fn owned_by_root(dir: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir).is_ok_and(|m| m.uid() == 0)
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        false
    }
}

/// The broker's configuration: one TLS listener on loopback that requires
/// a client certificate and takes its CN as the user name. Mosquitto
/// started as root switches to user `mosquitto` before it reads its key,
/// so with root's private files it is told to stay root.
fn mosquitto_conf(dir: &Path, port: u16) -> String {
    let d = dir.display();
    let user = if owned_by_root(dir) {
        "# These files are root's and private: a broker started as root would\n\
         # switch to user mosquitto and fail to read broker.key, so it stays\n\
         # root. For a service, chown broker.key to its user and name it here.\n\
         user root\n"
    } else {
        "# Start the broker as the owner of these files (broker.key is private).\n"
    };
    format!(
        "# Mosquitto 2.x for the site in this directory (lwbus pki init).\n\
         # Clients connect with TLS and a certificate from ca.crt; the broker\n\
         # takes the certificate's CN as the user name, and `acl` says what\n\
         # each user may publish and read.\n\
         {user}\
         per_listener_settings false\n\
         allow_anonymous false\n\
         persistence false\n\
         # Nagle off: without it a TLS handshake waits tens of ms on small writes.\n\
         set_tcp_nodelay true\n\
         # No frame (nor its JSON mirror) needs more; a larger publish would be\n\
         # delivered to the agents, and a packet over their cap costs them the\n\
         # connection (again on every reconnection, if retained). Mosquitto\n\
         # drops the publisher's connection instead, and keeps nothing.\n\
         max_packet_size {max_packet}\n\
         listener {port} 127.0.0.1\n\
         cafile {d}/ca.crt\n\
         certfile {d}/broker.crt\n\
         keyfile {d}/broker.key\n\
         require_certificate true\n\
         use_identity_as_username true\n\
         acl_file {d}/acl\n",
        max_packet = crate::MAX_PACKET_SIZE,
    )
}

/// The `topic` lines giving `access` to `topics`.
fn topic_lines(out: &mut String, access: &str, topics: impl IntoIterator<Item = String>) {
    for t in topics {
        let _ = writeln!(out, "topic {access} {t}");
    }
}

/// `role/name`'s own families, as frames and as the JSON mirror.
fn own_topics(site: &Ident, role: Role, name: &Ident) -> Vec<String> {
    let role = role.as_str();
    let frames = OWN_FAMILIES.map(|f| format!("{ROOT}/{site}/{role}/{name}/{f}"));
    let json = OWN_FAMILIES.map(|f| format!("{ROOT}/{site}/json/{role}/{name}/{f}"));
    frames.into_iter().chain(json).collect()
}

/// The mosquitto ACL: a `user` section per identity.
fn acl(plan: &Plan) -> String {
    let s = &plan.site;
    let mut out = format!(
        "# Mosquitto ACL of site {s} (lwbus pki init). The user is the CN of the\n\
         # client's certificate. Frames are on {ROOT}/{s}/<role>/<node>/<family>,\n\
         # their JSON mirror on {ROOT}/{s}/json/<role>/<node>/<family>.\n\
         # Anything not allowed here is denied; denied publishes are dropped.\n"
    );
    for (host, cdu) in &plan.hosts {
        let _ = write!(
            out,
            "\n# Host {host}, cooled by CDU {cdu}: publishes its own telemetry, health,\n\
             # event, ack, online and resent (never a command); reads its own\n\
             # commands and resend requests, and its CDU's health.\nuser {host}\n"
        );
        topic_lines(&mut out, "write", own_topics(s, Role::Host, host));
        topic_lines(
            &mut out,
            "read",
            [
                format!("{ROOT}/{s}/host/{host}/cmd"),
                format!("{ROOT}/{s}/host/{host}/resend"),
                format!("{ROOT}/{s}/cdu/{cdu}/health"),
            ],
        );
    }
    for cdu in &plan.cdus {
        acl_cdu(&mut out, plan, cdu);
    }
    for op in &plan.operators {
        let _ = write!(
            out,
            "\n# Operator {op}: commands any host or CDU, asks any for resends; reads\n\
             # the whole site.\nuser {op}\n"
        );
        topic_lines(
            &mut out,
            "write",
            ["host", "cdu"].map(|r| format!("{ROOT}/{s}/{r}/+/cmd")),
        );
        topic_lines(&mut out, "write", resend_topics(s));
        topic_lines(&mut out, "read", [format!("{ROOT}/{s}/#")]);
    }
    for reader in &plan.readers {
        let _ = write!(
            out,
            "\n# Facility reader {reader}: reads the whole site; publishes only\n\
             # requests to resend events it missed.\nuser {reader}\n"
        );
        topic_lines(&mut out, "write", resend_topics(s));
        topic_lines(&mut out, "read", [format!("{ROOT}/{s}/#")]);
    }
    out
}

/// Every host's and CDU's `resend` topic (a reader's requests).
fn resend_topics(s: &Ident) -> [String; 2] {
    ["host", "cdu"].map(|r| format!("{ROOT}/{s}/{r}/+/resend"))
}

/// A CDU controller's section of the ACL.
fn acl_cdu(out: &mut String, plan: &Plan, cdu: &Ident) {
    let s = &plan.site;
    let hosts: Vec<&Ident> = plan.hosts_of(cdu).collect();
    let cooled = if hosts.is_empty() {
        "no host".to_string()
    } else {
        hosts
            .iter()
            .map(|h| h.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = write!(
        out,
        "\n# CDU controller {cdu}, cooling {cooled}: publishes its own telemetry,\n\
         # health, event, ack, online and resent, and commands to the hosts it\n\
         # cools; reads every host's telemetry and acks, its own commands and\n\
         # resend requests, and the other CDUs' states (a hall's facility\n\
         # water plan).\nuser {cdu}\n"
    );
    topic_lines(out, "write", own_topics(s, Role::Cdu, cdu));
    topic_lines(
        out,
        "write",
        hosts.iter().map(|h| format!("{ROOT}/{s}/host/{h}/cmd")),
    );
    topic_lines(
        out,
        "read",
        [
            format!("{ROOT}/{s}/host/+/telemetry"),
            format!("{ROOT}/{s}/host/+/ack"),
            format!("{ROOT}/{s}/cdu/{cdu}/cmd"),
            format!("{ROOT}/{s}/cdu/{cdu}/resend"),
            format!("{ROOT}/{s}/cdu/+/health"),
        ],
    );
}

/// What was written, and what to do next.
fn summary(plan: &Plan, dir: &Path, port: u16) -> String {
    let d = dir.display();
    let hosts: Vec<Ident> = plan.hosts.iter().map(|(h, _)| h.clone()).collect();
    let (hosts, cdus) = (list(&hosts), list(&plan.cdus));
    let (ops, readers) = (list(&plan.operators), list(&plan.readers));
    let mut out = format!(
        "Site {site}: wrote into {d}\n\
         \x20 ca.crt               the site CA (copy it to every device)\n\
         \x20 ca.key               the CA's private key: MOVE IT OFFLINE now; it is\n\
         \x20                      needed only to issue more certificates\n\
         \x20 broker.crt/.key      the broker's identity (localhost, 127.0.0.1, ::1)\n\
         \x20 ID.crt/.key          hosts: {hosts}; CDUs: {cdus}; operators: {ops}; \
         readers: {readers}\n\
         \x20 ID.sign.key          signing keys: CDUs and operators (commands), readers\n\
         \x20                      (requests to resend events they missed)\n\
         \x20 keyring.toml         who may command the hosts and ask for resends (public:\n\
         \x20                      copy to every host and controller)\n\
         \x20 mosquitto.conf, acl  TLS listener on 127.0.0.1:{port}, who may publish and \
         read what\n\
         Keys (*.key) are mode 0600: give each device only its own.\n",
        site = plan.site
    );
    out.push_str(&next_steps(plan, dir, port));
    out
}

/// The "next steps" part of the summary.
fn next_steps(plan: &Plan, dir: &Path, port: u16) -> String {
    let d = dir.display();
    let (host, host_cdu) = &plan.hosts[0];
    let cdu = &plan.cdus[0];
    let tls = |id: &Ident| {
        format!(
            "     tls_ca = \"{d}/ca.crt\"\n     tls_cert = \"{d}/{id}.crt\"\n     \
             tls_key = \"{d}/{id}.key\"\n"
        )
    };
    let mut out = format!(
        "Next:\n\
         \x20 1. start the broker: mosquitto -c {d}/mosquitto.conf\n\
         \x20 2. in each host agent's config ({host} shown):\n     broker = \"127.0.0.1:{port}\"\n{}\
         \x20    keyring = \"{d}/keyring.toml\"\n\
         \x20    site = \"{site}\"\n     cdu = \"{host_cdu}\"\n\
         \x20 3. in each cooling controller's config ({cdu} shown):\n     broker = \"127.0.0.1:{port}\"\n{}\
         \x20    keyring = \"{d}/keyring.toml\"\n\
         \x20    sign_key = \"{d}/{cdu}.sign.key\"\n     site = \"{site}\"\n     cdu = \"{cdu}\"\n",
        tls(host),
        tls(cdu),
        site = plan.site,
    );
    if let Some(op) = plan.operators.first() {
        let _ = write!(
            out,
            "  4. release a quarantined GPU as {op}:\n     lwbus release --broker 127.0.0.1:{port} \
             --site {site} --host {host} --gpu 0 --note \"…\" \\\n       \
             --sign-key {d}/{op}.sign.key --tls-ca {d}/ca.crt \\\n       \
             --tls-cert {d}/{op}.crt --tls-key {d}/{op}.key\n",
            site = plan.site
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{parse_keyring, parse_sign_key};

    fn args(out: &Path, hosts: &str, cdus: &str) -> InitArgs {
        let split = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
        InitArgs {
            site: "lab".into(),
            hosts: split(hosts),
            cdus: split(cdus),
            operators: vec!["ops1".into()],
            readers: vec!["bms1".into()],
            out: out.to_path_buf(),
            broker_port: 18883,
        }
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn init_writes_every_file_with_its_mode_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        init(&args(&out, "h01,h02", "cdu1")).unwrap();
        for public in ["ca.crt", "broker.crt", "h01.crt", "cdu1.crt", "bms1.crt"] {
            assert_eq!(mode(&out.join(public)), 0o644, "{public}");
        }
        for public in [
            "keyring.toml",
            "mosquitto.conf",
            "acl",
            "ops1.crt",
            "h02.crt",
        ] {
            assert!(out.join(public).is_file(), "{public}");
        }
        for secret in ["ca.key", "broker.key", "h01.key", "h02.key", "cdu1.key"] {
            assert_eq!(mode(&out.join(secret)), 0o600, "{secret}");
        }
        for secret in [
            "ops1.key",
            "bms1.key",
            "cdu1.sign.key",
            "ops1.sign.key",
            "bms1.sign.key",
        ] {
            assert_eq!(mode(&out.join(secret)), 0o600, "{secret}");
        }
        assert!(!out.join("h01.sign.key").exists(), "a host signs nothing");
        let ca = std::fs::read_to_string(out.join("ca.crt")).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        let conf = std::fs::read_to_string(out.join("mosquitto.conf")).unwrap();
        let abs = out.canonicalize().unwrap();
        assert!(conf.contains("listener 18883 127.0.0.1\n"), "{conf}");
        let limit = format!("\nmax_packet_size {}\n", crate::MAX_PACKET_SIZE);
        assert!(conf.contains(&limit), "{conf}");
        assert!(conf.contains(&format!("acl_file {}/acl\n", abs.display())));
        let e = init(&args(&out, "h01,h02", "cdu1")).unwrap_err();
        assert!(e.contains("already holds a CA"), "{e}");
        assert_eq!(std::fs::read_to_string(out.join("ca.crt")).unwrap(), ca);
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("h02.key"), "mine").unwrap();
        let e = init(&args(&other, "h01,h02", "cdu1")).unwrap_err();
        assert!(e.contains("already holds h02.key"), "{e}");
        assert!(!other.join("ca.crt").exists(), "nothing written");
    }

    #[test]
    fn names_must_be_valid_unique_and_hosts_placed_under_a_known_cdu() {
        let out = Path::new("/nonexistent/never-written");
        let err = |hosts: &str, cdus: &str| Plan::from_args(&args(out, hosts, cdus)).unwrap_err();
        let e = err("h01,h 02", "cdu1");
        assert!(e.contains("host \"h 02\""), "{e}");
        let e = err("h01,cdu1", "cdu1");
        assert!(e.contains("\"cdu1\" is named twice"), "{e}");
        let e = err("h01,ops1", "cdu1");
        assert!(e.contains("\"ops1\" is named twice"), "{e}");
        let e = err("broker", "cdu1");
        assert!(e.contains("reserved"), "{e}");
        let e = err("h01", "ca");
        assert!(e.contains("reserved"), "{e}");
        let e = err("h01,h02@cdu1", "cdu1,cdu2");
        assert!(e.contains("several CDUs") && e.contains("h01@cdu1"), "{e}");
        let e = err("h01@cdu9", "cdu1,cdu2");
        assert!(e.contains("\"cdu9\" is not among --cdus"), "{e}");
        let e = err("", "cdu1");
        assert!(e.contains("no host"), "{e}");
        let e = err("h01", "");
        assert!(e.contains("no CDU"), "{e}");
        let plan = Plan::from_args(&args(out, "h01@cdu2,h02@cdu1", "cdu1,cdu2")).unwrap();
        let names = plan.hosts_of(&plan.cdus[1]).map(|h| h.as_str());
        assert_eq!(names.collect::<Vec<_>>(), ["h01"]);
        let plan = Plan::from_args(&args(out, "h01,h02", "cdu1")).unwrap();
        assert_eq!(plan.hosts_of(&plan.cdus[0]).count(), 2);
    }

    #[test]
    fn the_keyring_holds_the_signers_and_their_sign_keys_match_it() {
        let dir = tempfile::tempdir().unwrap();
        init(&args(dir.path(), "h01,h02", "cdu1")).unwrap();
        let ring =
            parse_keyring(&std::fs::read_to_string(dir.path().join("keyring.toml")).unwrap())
                .unwrap();
        assert_eq!(ring.site.as_deref(), Some("lab"));
        let who: Vec<_> = ring
            .signers
            .iter()
            .map(|s| (s.role, s.name.as_deref().unwrap(), s.key_id, s.may))
            .collect();
        let may = |lease, release, resend| May {
            lease,
            release,
            resend,
        };
        assert_eq!(
            who,
            [
                (Role::Cdu, "cdu1", 1, may(true, false, false)),
                (Role::Operator, "ops1", 1, may(true, true, true)),
                (Role::Facility, "bms1", 1, may(false, false, true)),
            ]
        );
        for (i, name) in ["cdu1", "ops1", "bms1"].iter().enumerate() {
            let path = dir.path().join(format!("{name}.sign.key"));
            let key = parse_sign_key(&std::fs::read_to_string(path).unwrap()).unwrap();
            assert_eq!(key.node.id.as_str(), *name);
            assert_eq!(key.node.role, ring.signers[i].role);
            assert_eq!(key.key.verifying_key(), ring.signers[i].key);
        }
    }

    #[test]
    fn the_acl_lets_a_host_write_only_its_own_topics_and_never_a_command() {
        let plan = Plan::from_args(&args(Path::new("x"), "h01,h02", "cdu1")).unwrap();
        let acl = acl(&plan);
        let section = acl.split("\nuser h01\n").nth(1).unwrap();
        let section = section.split("\n\n").next().unwrap();
        let lines: Vec<&str> = section.lines().filter(|l| l.starts_with("topic")).collect();
        assert_eq!(lines.len(), 15, "{section}");
        assert!(lines.contains(&"topic read dc/v2/lab/host/h01/resend"));
        assert!(lines.contains(&"topic write dc/v2/lab/host/h01/resent"));
        assert!(lines.contains(&"topic write dc/v2/lab/host/h01/telemetry"));
        assert!(lines.contains(&"topic write dc/v2/lab/json/host/h01/online"));
        assert!(lines.contains(&"topic read dc/v2/lab/host/h01/cmd"));
        assert!(lines.contains(&"topic read dc/v2/lab/cdu/cdu1/health"));
        for l in &lines {
            assert!(!l.contains('+') && !l.contains('#'), "{l}");
            assert!(!l.contains("h02"), "{l}");
            assert!(
                !(l.starts_with("topic write") && l.ends_with("/cmd")),
                "{l}"
            );
        }
        assert!(acl.contains("user cdu1\n"));
        assert!(acl.contains("topic write dc/v2/lab/host/h02/cmd\n"));
        let reader = acl.split("\nuser bms1\n").nth(1).unwrap();
        assert_eq!(
            reader
                .lines()
                .filter(|l| l.starts_with("topic"))
                .collect::<Vec<_>>(),
            [
                "topic write dc/v2/lab/host/+/resend",
                "topic write dc/v2/lab/cdu/+/resend",
                "topic read dc/v2/lab/#"
            ],
            "a reader publishes nothing but resend requests"
        );
    }

    /// A CDU's caps are taken only from a key that may lease: a CDU key
    /// without it has its states taken and every cap refused (GPUs
    /// uncapped when cooling falls short), so none is written.
    #[test]
    fn a_cdu_sign_key_without_lease_is_refused_and_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cdu1.sign.key");
        let e = sign_key(&SignKeyArgs {
            node: "cdu/cdu1".into(),
            key_id: 2,
            may: vec!["resend".into()],
            out: out.clone(),
        })
        .unwrap_err();
        assert!(
            e.starts_with("--may: a CDU signer needs lease") && e.contains("every cap lease"),
            "{e}"
        );
        assert!(!out.exists(), "written");
        let text = sign_key(&SignKeyArgs {
            node: "cdu/cdu1".into(),
            key_id: 2,
            may: vec!["lease".into(), "resend".into()],
            out: dir.path().join("cdu1.b.sign.key"),
        })
        .unwrap();
        assert!(text.contains("may = [\"lease\", \"resend\"]"), "{text}");
    }

    /// A controller serves a reader's resend requests only with the
    /// keyring: the lines printed for it name it, as a host's do, and a
    /// new sign key that may resend is to go into the controllers'
    /// keyrings too.
    #[test]
    fn init_tells_each_controller_its_keyring() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        let text = init(&args(&out, "h01", "cdu1")).unwrap();
        let d = out.canonicalize().unwrap();
        let keyring = format!("keyring = \"{}/keyring.toml\"", d.display());
        let host = &text[text.find("2. in each host").unwrap()..];
        let cdu = &host[host.find("3. in each cooling controller").unwrap()..];
        let (host, cdu) = (
            &host[..host.find("3. ").unwrap()],
            &cdu[..cdu.find("4. ").unwrap()],
        );
        assert!(host.contains(&keyring), "{host}");
        assert!(cdu.contains(&keyring), "{cdu}");
        let note = |node: &str, file: &str| {
            sign_key(&SignKeyArgs {
                node: node.into(),
                key_id: 2,
                may: Vec::new(),
                out: dir.path().join(file),
            })
            .unwrap()
        };
        for (node, file) in [("facility/bms1", "bms1"), ("operator/ops1", "ops1")] {
            let text = note(node, file);
            assert!(
                text.contains("add to every host's and every CDU controller's keyring.toml"),
                "{text}"
            );
        }
        let text = note("cdu/cdu1", "cdu1");
        assert!(text.contains("add to every host's keyring.toml"), "{text}");
    }

    #[test]
    fn a_rotated_sign_key_comes_with_its_keyring_entry() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("cdu1.sign.key");
        let a = SignKeyArgs {
            node: "cdu/cdu1".into(),
            key_id: 2,
            may: Vec::new(),
            out: out.clone(),
        };
        let text = sign_key(&a).unwrap();
        let key = crate::keys::read_sign_key(&out).unwrap();
        assert_eq!((key.key_id, key.node.id.as_str()), (2, "cdu1"));
        let entry = &text[text.find("[[signer]]").expect("an entry")..];
        let ring = crate::keys::parse_keyring(entry).unwrap();
        assert_eq!(ring.signers[0].key, key.key.verifying_key());
        assert_eq!(ring.signers[0].key_id, 2);
        assert!(ring.signers[0].may.lease && !ring.signers[0].may.release);
        let e = sign_key(&a).unwrap_err();
        assert!(e.contains("already exists"), "{e}");
        // A facility reader's key rotated: resend only, as `init` gave it.
        let reader = |may: &[&str], file: &str| {
            let text = sign_key(&SignKeyArgs {
                node: "facility/bms1".into(),
                key_id: 2,
                may: may.iter().map(|m| m.to_string()).collect(),
                out: dir.path().join(file),
            })
            .unwrap();
            let entry = &text[text.find("[[signer]]").expect("an entry")..];
            (
                crate::keys::parse_keyring(entry).unwrap().signers[0].may,
                text,
            )
        };
        let (may, text) = reader(&[], "bms1.sign.key");
        assert!(may.resend && !may.lease && !may.release, "{may:?}");
        assert!(!text.contains("note:"), "{text}");
        let (may, text) = reader(&["lease", "resend"], "bms1.b.sign.key");
        assert!(may.lease && text.contains("may cap any GPU"), "{text}");
        // Release is an operator's alone: refused for a CDU or a reader,
        // and no key file is written.
        for (node, file) in [
            ("cdu/cdu1", "cdu1.r.sign.key"),
            ("facility/bms1", "bms1.r.sign.key"),
        ] {
            let e = sign_key(&SignKeyArgs {
                node: node.into(),
                key_id: 3,
                may: vec!["lease".into(), "release".into()],
                out: dir.path().join(file),
            })
            .unwrap_err();
            assert!(
                e.starts_with("--may: release is an operator's right alone"),
                "{e}"
            );
            assert!(!dir.path().join(file).exists(), "{file} written");
        }
        let text = sign_key(&SignKeyArgs {
            node: "operator/ops1".into(),
            key_id: 2,
            may: vec!["release".into()],
            out: dir.path().join("ops1.sign.key"),
        })
        .unwrap();
        assert!(text.contains("may = [\"release\"]"), "{text}");
        let e = sign_key(&SignKeyArgs {
            node: "host/h01".into(),
            ..a
        })
        .unwrap_err();
        assert!(e.contains("cdu, operator or facility"), "{e}");
    }
}

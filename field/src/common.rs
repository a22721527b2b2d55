//! The configuration every agent has: its site, its broker and the login
//! to it (user and password, or TLS with the device's certificate), its
//! flash file and its console socket (with its bounds: connections at
//! once and the idle time).
//! Both agents declare these fields once, here ([`agent_file!`](crate::agent_file!) for the
//! file, [`agent_flags!`](crate::agent_flags!) with [`CommonFlags`] for the flags), and check them with one function
//! ([`resolve`]); each agent adds its own fields and checks.
//!
//! Glossary:
//! - *common field*: a key both agents' files take, with the same meaning
//!   and the same check.
//! - *embedded broker*: the in-process broker an agent starts when no
//!   `broker` is given.

use std::path::PathBuf;

use loopwarden_bus::tls::{Tls, TlsFiles, TlsPart};
use loopwarden_bus::Brokers;
use loopwarden_protocol::Ident;

use crate::config::{credentials, ident, ConfigError, Sources};
use crate::listen::Limits;
use crate::pick;
use crate::serial::SerialConsole;

/// Declares an agent's file structure: every field optional, unknown keys
/// refused (with their line), the common fields first and then the
/// agent's own. The common fields are `site`, `broker`, `embedded_broker`,
/// `broker_user`, `broker_password_file`, `tls_ca`, `tls_cert`,
/// `tls_key`, `tls_server_name`, `keep_alive_s`, `json_presence`,
/// `flash`, `console`, `console_max_connections`, `console_socket_idle_s`,
/// and the serial console's `console_serial`, `console_serial_baud`,
/// `console_password_hash` and `console_idle_s`;
/// [`common`](CommonFile) borrows them for [`resolve`].
#[macro_export]
macro_rules! agent_file {
    ($(#[$attr:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$attr])*
        #[derive(Debug, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Site name.
            pub site: Option<String>,
            /// Broker address, or the nodes of a clustered broker
            /// (`host:port,host:port,…`, tried in turn); absent: the
            /// embedded broker.
            pub broker: Option<String>,
            /// Run the embedded broker here on purpose.
            pub embedded_broker: Option<bool>,
            /// Broker user name.
            pub broker_user: Option<String>,
            /// File holding the broker password.
            pub broker_password_file: Option<std::path::PathBuf>,
            /// CA certificate of the broker's (PEM): TLS.
            pub tls_ca: Option<std::path::PathBuf>,
            /// This device's certificate (PEM).
            pub tls_cert: Option<std::path::PathBuf>,
            /// This device's private key (PEM).
            pub tls_key: Option<std::path::PathBuf>,
            /// The name the broker's certificate must carry.
            pub tls_server_name: Option<String>,
            /// Flash file.
            pub flash: Option<std::path::PathBuf>,
            /// Console socket.
            pub console: Option<std::path::PathBuf>,
            /// Connections the console socket keeps open at once.
            pub console_max_connections: Option<usize>,
            /// Seconds before a console connection that sends no request
            /// (or takes no answer) is closed.
            pub console_socket_idle_s: Option<u64>,
            /// MQTT keep-alive, seconds.
            pub keep_alive_s: Option<u64>,
            /// The JSON `online` on a connection of its own, with a will.
            pub json_presence: Option<bool>,
            /// Serial console device (`/dev/ttyS1`).
            pub console_serial: Option<std::path::PathBuf>,
            /// Its speed (8N1).
            pub console_serial_baud: Option<u32>,
            /// The Argon2id hash (PHC string) of the serial console's
            /// password.
            pub console_password_hash: Option<String>,
            /// Seconds before an idle serial session is closed.
            pub console_idle_s: Option<u64>,
            $($body)*
        }

        impl $name {
            /// The common fields as written.
            pub fn common(&self) -> $crate::common::CommonFile<'_> {
                $crate::common::CommonFile {
                    site: &self.site,
                    broker: &self.broker,
                    embedded_broker: &self.embedded_broker,
                    broker_user: &self.broker_user,
                    broker_password_file: &self.broker_password_file,
                    tls_ca: &self.tls_ca,
                    tls_cert: &self.tls_cert,
                    tls_key: &self.tls_key,
                    tls_server_name: &self.tls_server_name,
                    flash: &self.flash,
                    console: &self.console,
                    console_max_connections: &self.console_max_connections,
                    console_socket_idle_s: &self.console_socket_idle_s,
                    keep_alive_s: &self.keep_alive_s,
                    json_presence: &self.json_presence,
                    console_serial: &self.console_serial,
                    console_serial_baud: &self.console_serial_baud,
                    console_password_hash: &self.console_password_hash,
                    console_idle_s: &self.console_idle_s,
                }
            }
        }
    };
}

/// Declares an agent's flags: the common fields ([`CommonFlags`], as
/// `common`) and then the agent's own, each overriding the file.
#[macro_export]
macro_rules! agent_flags {
    ($(#[$attr:meta])* pub struct $name:ident { $($body:tt)* }) => {
        $(#[$attr])*
        #[derive(Debug, Default, Clone, clap::Args)]
        pub struct $name {
            /// The fields every agent has.
            #[command(flatten)]
            pub common: $crate::common::CommonFlags,
            $($body)*
        }
    };
}

/// What every agent's `run` takes: its configuration file and flags that
/// override it (the agent's `Overrides`).
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs<F: clap::Args> {
    /// Configuration file (TOML).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The flags.
    #[command(flatten)]
    pub flags: F,
}

/// The common fields of a file, as written.
#[derive(Debug, Clone, Copy)]
pub struct CommonFile<'a> {
    /// Site name.
    pub site: &'a Option<String>,
    /// Broker address.
    pub broker: &'a Option<String>,
    /// Run the embedded broker here on purpose.
    pub embedded_broker: &'a Option<bool>,
    /// Broker user name.
    pub broker_user: &'a Option<String>,
    /// File holding the broker password.
    pub broker_password_file: &'a Option<PathBuf>,
    /// CA certificate (PEM).
    pub tls_ca: &'a Option<PathBuf>,
    /// Device certificate (PEM).
    pub tls_cert: &'a Option<PathBuf>,
    /// Device key (PEM).
    pub tls_key: &'a Option<PathBuf>,
    /// The broker certificate's name.
    pub tls_server_name: &'a Option<String>,
    /// Flash file.
    pub flash: &'a Option<PathBuf>,
    /// Console socket.
    pub console: &'a Option<PathBuf>,
    /// Connections the console socket keeps open at once.
    pub console_max_connections: &'a Option<usize>,
    /// Idle seconds before a console connection is closed.
    pub console_socket_idle_s: &'a Option<u64>,
    /// MQTT keep-alive, seconds.
    pub keep_alive_s: &'a Option<u64>,
    /// The JSON `online` on a connection of its own.
    pub json_presence: &'a Option<bool>,
    /// Serial console device.
    pub console_serial: &'a Option<PathBuf>,
    /// Its speed.
    pub console_serial_baud: &'a Option<u32>,
    /// The serial console's password hash.
    pub console_password_hash: &'a Option<String>,
    /// Idle seconds before a serial session is closed.
    pub console_idle_s: &'a Option<u64>,
}

/// The common fields given as flags (each overrides the file).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct CommonFlags {
    /// Site name (ident).
    #[arg(long)]
    pub site: Option<String>,
    /// Broker, `host[:port]`, or the nodes of a clustered broker,
    /// `host:port,host:port,…` (the first that answers; the next one when
    /// a connection fails or is lost). Without it, only an agent on
    /// simulated hardware starts the embedded broker on 127.0.0.1:1883 on
    /// its own; elsewhere give it, or --embedded-broker.
    #[arg(long)]
    pub broker: Option<String>,
    /// Run the embedded broker here on purpose (an agent on real hardware
    /// or with site keys does not start it on its own).
    #[arg(long)]
    pub embedded_broker: bool,
    /// Broker user name.
    #[arg(long)]
    pub broker_user: Option<String>,
    /// File holding the broker password.
    #[arg(long)]
    pub broker_password_file: Option<PathBuf>,
    /// CA certificate (PEM) that signed the broker's: connect with TLS.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// This device's certificate (PEM); the broker takes its CN as the
    /// user name.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// This device's private key (PEM; not readable by others).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The name the broker's certificate must carry, if not the host of
    /// `broker`.
    #[arg(long)]
    pub tls_server_name: Option<String>,
    /// Flash file (event log, outbox, config store); default: kept in
    /// memory only.
    #[arg(long)]
    pub flash: Option<PathBuf>,
    /// Console socket path.
    #[arg(long)]
    pub console: Option<PathBuf>,
    /// Connections the console socket keeps open at once, 1 to 256 (one
    /// more is closed at once); default 8.
    #[arg(long)]
    pub console_max_connections: Option<usize>,
    /// Seconds before a console connection that sends no request, or
    /// takes no answer, is closed, 1 to 3600; default 60.
    #[arg(long)]
    pub console_socket_idle_s: Option<u64>,
    /// MQTT keep-alive in seconds, 1 to 600; the broker declares the
    /// agent gone after 1.5 × this without a packet; default 5.
    #[arg(long)]
    pub keep_alive_s: Option<u64>,
    /// Keep the JSON `online` on a second connection whose last will
    /// says offline (`true`, the default), or on the one connection
    /// (`false`: one connection fewer, but the JSON tree keeps saying
    /// online after a crash).
    #[arg(long)]
    pub json_presence: Option<bool>,
    /// Serial console on this device (`/dev/ttyS1`); default: none.
    #[arg(long)]
    pub console_serial: Option<PathBuf>,
    /// The serial console's speed, 8N1; default 115200.
    #[arg(long)]
    pub console_serial_baud: Option<u32>,
    /// Seconds before an idle serial session is closed (a login ends
    /// after at most 300 s whatever this says); default 300.
    #[arg(long)]
    pub console_idle_s: Option<u64>,
}

/// The common fields, checked.
#[derive(Debug, Clone)]
pub struct Common {
    /// Site.
    pub site: Ident,
    /// Whether `site` was given (by the file or a flag); without it the
    /// site is the default `site` (see [`require_site`]).
    pub site_given: bool,
    /// Brokers, tried in turn; `None`: embedded.
    pub broker: Option<Brokers>,
    /// The embedded broker was asked for (`embedded_broker = true`), and
    /// the flag or line that asked.
    pub embedded_broker: (bool, Option<&'static str>),
    /// Broker credentials.
    pub credentials: Option<(String, String)>,
    /// The flag that gave `broker_user`, if one did (for errors).
    pub broker_user_flag: Option<&'static str>,
    /// TLS to the broker, loaded and checked.
    pub tls: Option<Tls>,
    /// The flag that gave `tls_ca`, if one did (for errors).
    pub tls_ca_flag: Option<&'static str>,
    /// The flag that gave `tls_cert`, if one did (for errors).
    pub tls_cert_flag: Option<&'static str>,
    /// Flash file; `None`: in memory only.
    pub flash: Option<PathBuf>,
    /// Console socket.
    pub console: PathBuf,
    /// Its bounds: connections at once, idle time.
    pub console_limits: Limits,
    /// MQTT keep-alive.
    pub keep_alive: std::time::Duration,
    /// The JSON `online` on a connection of its own
    /// (`BusConfig::json_presence`).
    pub json_presence: bool,
    /// The serial console, if one is configured.
    pub serial: Option<SerialConsole>,
}

/// Checks the common fields: the site is a name (default `site`), the
/// broker an address or a list of them, the login whole (the password file read), and the
/// console `default_console()` unless given.
pub fn resolve(
    src: &Sources,
    file: CommonFile<'_>,
    flags: &CommonFlags,
    default_console: impl FnOnce() -> PathBuf,
) -> Result<Common, ConfigError> {
    let site_picked = pick!(flags.site, *file.site, "site");
    let site_given = site_picked.0.is_some();
    let site = ident(src, site_picked, "site", Some("site".into()))?;
    let broker = match pick!(flags.broker, *file.broker, "broker") {
        (Some(b), flag) => Some(
            b.parse::<Brokers>()
                .map_err(|e| src.error(flag, "broker", format!("broker = {b:?}: {e}")))?,
        ),
        (None, _) => None,
    };
    let user = pick!(flags.broker_user, *file.broker_user, "broker-user");
    let broker_user_flag = user.1;
    let credentials = credentials(
        src,
        user,
        pick!(
            flags.broker_password_file,
            *file.broker_password_file,
            "broker-password-file"
        ),
    )?;
    let embedded = pick!(
        flags.embedded_broker.then_some(true),
        *file.embedded_broker,
        "embedded-broker"
    );
    let tls = tls(src, file, flags)?;
    // A broker given without a port: 8883 with TLS, 1883 without.
    let broker = broker.map(|b| b.with_tls(tls.is_some()));
    Ok(Common {
        site,
        site_given,
        broker,
        embedded_broker: (embedded.0.unwrap_or(false), embedded.1),
        credentials,
        broker_user_flag,
        tls,
        tls_ca_flag: pick!(flags.tls_ca, *file.tls_ca, "tls-ca").1,
        tls_cert_flag: pick!(flags.tls_cert, *file.tls_cert, "tls-cert").1,
        flash: pick!(flags.flash, *file.flash, "flash").0,
        console: pick!(flags.console, *file.console, "console")
            .0
            .unwrap_or_else(default_console),
        console_limits: listener_limits(
            src,
            (
                "console_max_connections",
                pick!(
                    flags.console_max_connections,
                    *file.console_max_connections,
                    "console-max-connections"
                ),
            ),
            (
                "console_socket_idle_s",
                pick!(
                    flags.console_socket_idle_s,
                    *file.console_socket_idle_s,
                    "console-socket-idle-s"
                ),
            ),
            Limits::CONSOLE,
        )?,
        keep_alive: std::time::Duration::from_secs(crate::config::range(
            src,
            pick!(flags.keep_alive_s, *file.keep_alive_s, "keep-alive-s"),
            "keep_alive_s",
            5,
            1,
            600,
            " s",
        )?),
        json_presence: pick!(flags.json_presence, *file.json_presence, "json-presence")
            .0
            .unwrap_or(true),
        serial: serial(src, file, flags)?,
    })
}

/// A listener's bounds from its two keys, each with its picked value:
/// the connections at once, 1 to 256, and the idle time, 1 to 3600 s;
/// `default`'s where not given.
pub fn listener_limits(
    src: &Sources,
    (max_key, max): (&str, (Option<usize>, Option<&str>)),
    (idle_key, idle): (&str, (Option<u64>, Option<&str>)),
    default: Limits,
) -> Result<Limits, ConfigError> {
    let max_connections =
        crate::config::range(src, max, max_key, default.max_connections, 1, 256, "")?;
    let idle_s = crate::config::range(src, idle, idle_key, default.idle.as_secs(), 1, 3600, " s")?;
    Ok(Limits {
        max_connections,
        idle: std::time::Duration::from_secs(idle_s),
    })
}

/// Speeds a serial console takes.
pub const BAUDS: [u32; 11] = [
    1200, 2400, 4800, 9600, 19_200, 38_400, 57_600, 115_200, 230_400, 460_800, 921_600,
];

/// The serial console: none without `console_serial`; the speed one of
/// [`BAUDS`] (default 115200), the password hash an Argon2id PHC string,
/// the idle timeout 10 s to 24 h (default 300 s). A speed, hash or timeout
/// without a port is refused: it would do nothing.
fn serial(
    src: &Sources,
    file: CommonFile<'_>,
    flags: &CommonFlags,
) -> Result<Option<SerialConsole>, ConfigError> {
    let port = pick!(flags.console_serial, *file.console_serial, "console-serial").0;
    let baud = pick!(
        flags.console_serial_baud,
        *file.console_serial_baud,
        "console-serial-baud"
    );
    let idle = pick!(flags.console_idle_s, *file.console_idle_s, "console-idle-s");
    let hash = file.console_password_hash.clone();
    let Some(port) = port else {
        for (given, flag, key) in [
            (baud.0.is_some(), baud.1, "console_serial_baud"),
            (idle.0.is_some(), idle.1, "console_idle_s"),
            (hash.is_some(), None, "console_password_hash"),
        ] {
            if given {
                return Err(src.error(
                    flag,
                    key,
                    format!("{key} without console_serial: give the serial console's device"),
                ));
            }
        }
        return Ok(None);
    };
    if let (Some(b), flag) = baud {
        if !BAUDS.contains(&b) {
            return Err(src.error(
                flag,
                "console_serial_baud",
                format!("console_serial_baud = {b} is not a serial speed ({BAUDS:?})"),
            ));
        }
    }
    if let Some(h) = &hash {
        crate::serial::password::check_hash(h).map_err(|e| {
            src.error(
                None,
                "console_password_hash",
                format!("console_password_hash: {e}"),
            )
        })?;
    }
    let idle_s = crate::config::range(src, idle, "console_idle_s", 300, 10, 86_400, " s")?;
    Ok(Some(SerialConsole {
        port,
        baud: baud.0.unwrap_or(115_200),
        password_hash: hash,
        idle: std::time::Duration::from_secs(idle_s),
    }))
}

/// The TLS settings: none without `tls_ca`; a certificate, key or server
/// name without it is refused, and the files are read and checked here.
fn tls(
    src: &Sources,
    file: CommonFile<'_>,
    flags: &CommonFlags,
) -> Result<Option<Tls>, ConfigError> {
    let ca = pick!(flags.tls_ca, *file.tls_ca, "tls-ca");
    let cert = pick!(flags.tls_cert, *file.tls_cert, "tls-cert");
    let key = pick!(flags.tls_key, *file.tls_key, "tls-key");
    let name = pick!(
        flags.tls_server_name,
        *file.tls_server_name,
        "tls-server-name"
    );
    let Some(ca_path) = ca.0 else {
        for (given, flag, field) in [
            (cert.0.is_some(), cert.1, "tls_cert"),
            (key.0.is_some(), key.1, "tls_key"),
            (name.0.is_some(), name.1, "tls_server_name"),
        ] {
            if given {
                return Err(src.error(
                    flag,
                    field,
                    format!(
                        "{field} without tls_ca: give the CA that signed the broker's certificate"
                    ),
                ));
            }
        }
        return Ok(None);
    };
    let files = TlsFiles {
        ca: ca_path,
        cert: cert.0,
        key: key.0,
        server_name: name.0,
    };
    Tls::load(files).map(Some).map_err(|e| {
        let (flag, field) = match e.part {
            TlsPart::Ca => (ca.1, "tls_ca"),
            TlsPart::Cert => (cert.1, "tls_cert"),
            TlsPart::Key => (key.1, "tls_key"),
            TlsPart::ServerName => (name.1, "tls_server_name"),
        };
        src.error(flag, field, e.message)
    })
}

/// Refuses a device certificate (`tls_cert`) not made out to this agent:
/// its CN must be `who`, the agent's identity on the bus (the host id of
/// a node agent, the CDU id of a controller), as `lwbus pki init` issues
/// it and a site's PKI must (docs/security.md section 6.2). The broker
/// takes the CN as the user name: with another device's certificate its
/// ACL would drop every frame of this agent, while acknowledging it, and
/// deny its commands. `role` names the identity (`host`, `CDU`). A
/// `broker_user` beside the certificate changes nothing (such a broker
/// ignores the login), and the refusal says so.
pub fn check_tls_identity(
    src: &Sources,
    common: &Common,
    role: &str,
    who: &Ident,
) -> Result<(), ConfigError> {
    let Some(tls) = &common.tls else {
        return Ok(());
    };
    tls.check_identity(role, who.as_str()).map_err(|e| {
        // A login does not make another certificate right: the broker
        // section 6.2 of docs/security.md asks for takes the CN as the user.
        let login = common
            .credentials
            .as_ref()
            .map_or(String::new(), |(user, _)| {
                format!(
                    ". broker_user {user:?} does not change it: a broker that takes the \
                 certificate's CN as the user name (use_identity_as_username) ignores the login"
                )
            });
        src.error(
            common.tls_cert_flag,
            "tls_cert",
            format!("{}{login}", e.message),
        )
    })
}

/// The longest loop period a configuration takes, ms.
pub const MOST_PERIOD_MS: u64 = 60_000;

/// The agent's loop period, ms (sampling on a host, control on a CDU):
/// the picked value in 100 ms to [`MOST_PERIOD_MS`], else 1 s.
pub fn period_ms(src: &Sources, picked: (Option<u64>, Option<&str>)) -> Result<u64, ConfigError> {
    crate::config::range(src, picked, "period_ms", 1000, 100, MOST_PERIOD_MS, " ms")
}

/// Refuses to run the embedded broker implicitly in production: an agent
/// for which `production` says why it is one (real GPUs, a real CDU, site
/// keys) needs a `broker`, or an explicit `embedded_broker = true`. Both
/// together are refused too: one broker or the other.
pub fn check_broker(
    src: &Sources,
    common: &Common,
    production: Option<&str>,
) -> Result<(), ConfigError> {
    let (embedded, flag) = common.embedded_broker;
    if common.broker.is_none() && common.tls.is_some() {
        return Err(src.error(
            common.tls_ca_flag,
            "tls_ca",
            "TLS is set but no broker: the embedded broker listens on plain loopback; \
             set broker = \"host:port\" (the site's TLS listener)"
                .into(),
        ));
    }
    if let (Some(brokers), Some(_)) = (&common.broker, &common.tls) {
        if let Some(zoned) = brokers.unreachable_with_tls() {
            return Err(src.error(
                None,
                "broker",
                format!(
                    "broker {zoned} has a zone (an interface), which no certificate can \
                     name, so TLS cannot reach it: give the broker's name or a \
                     global address"
                ),
            ));
        }
    }
    check_password_on_plain_tcp(src, common)?;
    match (&common.broker, embedded, production) {
        (Some(_), true, _) => Err(src.error(
            flag,
            "embedded_broker",
            "embedded_broker = true and a broker exclude each other".into(),
        )),
        (None, false, Some(why)) => Err(src.error(
            None,
            "broker",
            format!(
                "no broker: an agent on {why} does not start the embedded broker on its own; \
                 set broker = \"host:port\" (the site's broker), or embedded_broker = true to run one here"
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses a production agent without `site`: `production` says what
/// makes it one (`an agent on real GPUs`), `None` for the twin and the
/// demonstration, where the default `site` stays. A real device under
/// the default publishes under `dc/v2/site/…`, where the broker's
/// per-site rights let nobody hear it and nothing it hears comes.
pub fn require_site(
    src: &Sources,
    common: &Common,
    production: Option<&str>,
) -> Result<(), ConfigError> {
    match production {
        Some(why) if !common.site_given => Err(src.error(
            None,
            "site",
            format!(
                "site is required on {why}: without it the agent joins the site named \"site\" \
                 and publishes under dc/v2/site/…, where the site's broker lets nobody hear it; \
                 set site = \"NAME\", the site of its keyring and certificates"
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses a broker password sent in the clear to another machine: with
/// credentials and no TLS, every broker must be on this host's loopback
/// (`127.0.0.0/8`, `::1`, `localhost`), where nobody on the network can
/// read it.
fn check_password_on_plain_tcp(src: &Sources, common: &Common) -> Result<(), ConfigError> {
    let (Some(brokers), Some(_), None) = (&common.broker, &common.credentials, &common.tls) else {
        return Ok(());
    };
    let loopback = |host: &str| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    match brokers.iter().find(|b| !loopback(&b.host)) {
        None => Ok(()),
        Some(b) => Err(src.error(
            common.broker_user_flag,
            "broker_user",
            format!(
                "a broker password would cross the network in the clear to {b}: set \
                 tls_ca (and the device's certificate) for that broker, or reach it on \
                 this host's loopback"
            ),
        )),
    }
}

/// `metrics_listen` (or its flag), read: the address Prometheus's
/// `/metrics` is served on, if one is given.
pub fn metrics_listen(
    src: &Sources,
    (value, flag): (Option<String>, Option<&str>),
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    value
        .map(|a| {
            loopwarden_bus::prometheus::parse_listen(&a)
                .map_err(|m| src.error(flag, "metrics_listen", m))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    crate::agent_file! {
        /// An agent's file with one field of its own.
        #[allow(dead_code)]
        pub struct File {
            /// Its own.
            pub period_ms: Option<u64>,
        }
    }

    fn check(text: &str, flags: &CommonFlags) -> Result<Common, ConfigError> {
        let path = Path::new("a.toml");
        let file: File = crate::config::parse(Some(path), text)?;
        resolve(
            &Sources::new(Some(path), text),
            file.common(),
            flags,
            || PathBuf::from("/run/x.sock"),
        )
    }

    #[test]
    fn the_common_fields_are_read_checked_and_overridden_by_flags() {
        let text =
            "site = \"hall-1\"\nbroker = \"10.0.0.5:1883\"\nflash = \"/var/f\"\nperiod_ms = 5\n";
        let c = check(text, &CommonFlags::default()).unwrap();
        assert_eq!(c.site.as_str(), "hall-1");
        assert_eq!(c.broker.unwrap().to_string(), "10.0.0.5:1883");
        assert_eq!(c.flash.as_deref(), Some(Path::new("/var/f")));
        assert_eq!(c.console, PathBuf::from("/run/x.sock"));
        assert!(c.tls.is_none());
        let flags = CommonFlags {
            site: Some("hall-2".into()),
            broker: Some("10.0.0.5:1883,10.0.0.6:1883,10.0.0.7:1883".into()),
            ..CommonFlags::default()
        };
        let c = check(text, &flags).unwrap();
        assert_eq!(c.site.as_str(), "hall-2");
        let brokers = c.broker.unwrap();
        assert_eq!(brokers.len(), 3);
        assert_eq!(brokers.get(2).to_string(), "10.0.0.7:1883");
    }

    #[test]
    fn keep_alive_and_json_presence_default_read_and_refuse_with_their_line() {
        let c = check("site = \"a\"\n", &CommonFlags::default()).unwrap();
        assert_eq!((c.keep_alive.as_secs(), c.json_presence), (5, true));
        let text = "site = \"a\"\nkeep_alive_s = 2\njson_presence = false\n";
        let c = check(text, &CommonFlags::default()).unwrap();
        assert_eq!((c.keep_alive.as_secs(), c.json_presence), (2, false));
        let flags = CommonFlags {
            keep_alive_s: Some(30),
            json_presence: Some(true),
            ..CommonFlags::default()
        };
        let c = check(text, &flags).unwrap();
        assert_eq!((c.keep_alive.as_secs(), c.json_presence), (30, true));
        let e = check("site = \"a\"\nkeep_alive_s = 0\n", &CommonFlags::default()).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(
            e.message
                .contains("keep_alive_s = 0 is out of range (1 to 600 s)"),
            "{e}"
        );
        let e = check("json_presence = \"yes\"\n", &CommonFlags::default()).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
    }

    #[test]
    fn the_console_sockets_bounds_default_read_and_refuse_with_their_line() {
        let c = check("site = \"a\"\n", &CommonFlags::default()).unwrap();
        assert_eq!(c.console_limits, Limits::CONSOLE);
        assert_eq!(
            (
                c.console_limits.max_connections,
                c.console_limits.idle.as_secs()
            ),
            (8, 60)
        );
        let text = "console_max_connections = 2\nconsole_socket_idle_s = 5\n";
        let c = check(text, &CommonFlags::default()).unwrap();
        assert_eq!(
            (
                c.console_limits.max_connections,
                c.console_limits.idle.as_secs()
            ),
            (2, 5)
        );
        let flags = CommonFlags {
            console_max_connections: Some(3),
            ..CommonFlags::default()
        };
        assert_eq!(
            check(text, &flags).unwrap().console_limits.max_connections,
            3
        );
        let e = check(
            "site = \"a\"\nconsole_max_connections = 0\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.toml line 2: console_max_connections = 0 is out of range (1 to 256)"
        );
        let e = check("console_socket_idle_s = 7200\n", &CommonFlags::default()).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        assert!(e.message.contains("(1 to 3600 s)"), "{e}");
        let flags = CommonFlags {
            console_socket_idle_s: Some(0),
            ..CommonFlags::default()
        };
        let e = check("", &flags).unwrap_err();
        assert!(e.to_string().contains("console_socket_idle_s = 0"), "{e}");
    }

    #[test]
    fn a_broker_password_never_crosses_the_network_in_the_clear() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        // A password file others cannot read (`check_private`).
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&pw, private).unwrap();
        let with = |broker: &str| {
            let text = format!(
                "site = \"a\"\nbroker = \"{broker}\"\nbroker_user = \"h01\"\n\
                 broker_password_file = {pw:?}\n"
            );
            let src = Sources::new(Some(Path::new("a.toml")), &text);
            let c = check(&text, &CommonFlags::default()).unwrap();
            check_broker(&src, &c, None)
        };
        let e = with("10.0.0.5:1883").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("in the clear to 10.0.0.5:1883"), "{e}");
        let e = with("127.0.0.1:1883,broker.site:1883").unwrap_err();
        assert!(e.message.contains("broker.site:1883"), "{e}");
        for local in ["127.0.0.1:1883", "[::1]:1883", "localhost:1883"] {
            assert!(with(local).is_ok(), "{local}");
        }
        // The user given as a flag: the flag is named, not a default.
        let text =
            format!("site = \"a\"\nbroker = \"10.0.0.5:1883\"\nbroker_password_file = {pw:?}\n");
        let src = Sources::new(Some(Path::new("a.toml")), &text);
        let flags = CommonFlags {
            broker_user: Some("h01".into()),
            ..CommonFlags::default()
        };
        let c = check(&text, &flags).unwrap();
        let e = check_broker(&src, &c, None).unwrap_err();
        assert_eq!(e.origin, "flag --broker-user", "{e}");
    }

    #[test]
    fn a_zoned_broker_with_tls_is_refused_naming_the_broker() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "a".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: vec![],
            readers: vec![],
            out: out.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let with = |broker: &str| {
            let text = format!(
                "site = \"a\"\nbroker = \"{broker}\"\ntls_ca = {:?}\n",
                out.join("ca.crt")
            );
            let src = Sources::new(Some(Path::new("a.toml")), &text);
            let c = check(&text, &CommonFlags::default()).unwrap();
            check_broker(&src, &c, None)
        };
        let e = with("h1:8883,[fe80::1%eth0]:8883").unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("[fe80::1%eth0]:8883 has a zone"), "{e}");
        assert!(with("h1:8883,[fe80::1]:8883").is_ok());
    }

    /// A broker given without a port is on MQTT's TLS port (8883) with
    /// `tls_ca`, 1883 without; a port given is kept either way.
    #[test]
    fn a_broker_without_a_port_is_on_8883_with_tls_and_1883_without() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "a".into(),
            hosts: vec!["h01".into()],
            cdus: vec!["cdu1".into()],
            operators: vec![],
            readers: vec![],
            out: out.clone(),
            broker_port: 8883,
        })
        .unwrap();
        let ca = format!("tls_ca = {:?}\n", out.join("ca.crt"));
        let broker = |broker: &str, tls: &str| {
            let text = format!("site = \"a\"\nbroker = \"{broker}\"\n{tls}");
            let c = check(&text, &CommonFlags::default()).unwrap();
            c.broker.unwrap().to_string()
        };
        assert_eq!(broker("b.hall", &ca), "b.hall:8883");
        assert_eq!(broker("b.hall", ""), "b.hall:1883");
        assert_eq!(
            broker("b1,b2:1883,[::1]", &ca),
            "b1:8883,b2:1883,[::1]:8883"
        );
        assert_eq!(broker("b.hall:1884", &ca), "b.hall:1884");
    }

    #[test]
    fn a_production_agent_needs_its_site_written_and_the_twin_keeps_the_default() {
        let text = "broker = \"10.0.0.5:1883\"\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        let c = check(text, &CommonFlags::default()).unwrap();
        assert_eq!(c.site.as_str(), "site");
        let e = require_site(&src, &c, Some("an agent on real GPUs")).unwrap_err();
        assert!(
            e.message
                .starts_with("site is required on an agent on real GPUs"),
            "{e}"
        );
        assert!(e.message.contains("dc/v2/site/"), "{e}");
        assert!(require_site(&src, &c, None).is_ok(), "the twin's default");
        let text = "site = \"hall-1\"\nbroker = \"10.0.0.5:1883\"\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        let c = check(text, &CommonFlags::default()).unwrap();
        assert!(require_site(&src, &c, Some("an agent on real GPUs")).is_ok());
        let flags = CommonFlags {
            site: Some("site".into()),
            ..CommonFlags::default()
        };
        let c = check("", &flags).unwrap();
        assert!(
            require_site(&src, &c, Some("an agent on real GPUs")).is_ok(),
            "a site given as a flag, even one named site, is written down"
        );
    }

    #[test]
    fn the_serial_console_is_checked_with_its_line() {
        let none = check("site = \"a\"\n", &CommonFlags::default()).unwrap();
        assert_eq!(none.serial, None);
        let hash = crate::serial::password::hash("a long password").unwrap();
        let text = format!("console_serial = \"/dev/ttyS1\"\nconsole_password_hash = \"{hash}\"\n");
        let s = check(&text, &CommonFlags::default())
            .unwrap()
            .serial
            .unwrap();
        assert_eq!(s.port, PathBuf::from("/dev/ttyS1"));
        assert_eq!(s.baud, 115_200);
        assert_eq!(s.idle, std::time::Duration::from_secs(300));
        assert_eq!(s.password_hash.as_deref(), Some(hash.as_str()));
        let flags = CommonFlags {
            console_serial: Some("/dev/ttyUSB0".into()),
            console_serial_baud: Some(9600),
            console_idle_s: Some(60),
            ..CommonFlags::default()
        };
        let s = check("", &flags).unwrap().serial.unwrap();
        assert_eq!((s.baud, s.idle.as_secs()), (9600, 60));
        assert_eq!(s.password_hash, None);
        let e = check(
            "console_serial = \"/dev/ttyS1\"\nconsole_serial_baud = 115000\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("is not a serial speed"), "{e}");
        let e = check(
            "console_serial = \"/dev/ttyS1\"\nconsole_password_hash = \"hunter2\"\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("not a PHC string"), "{e}");
        let e = check("console_password_hash = \"x\"\n", &CommonFlags::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.toml line 1: console_password_hash without console_serial: give the serial console's device"
        );
    }

    #[test]
    fn tls_is_whole_or_refused_with_its_line() {
        let e = check(
            "site = \"a\"\ntls_cert = \"/x/h01.crt\"\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("without tls_ca"), "{e}");
        let e = check(
            "broker = \"h:8883\"\ntls_ca = \"/nonexistent/ca.crt\"\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("/nonexistent/ca.crt"), "{e}");
    }

    /// Another device's certificate (h02's copied onto h01) is refused at
    /// start, naming the file, the CN found and the one expected: the
    /// broker would take it for h02, and the ACL would drop h01's frames.
    #[test]
    fn a_certificate_of_another_identity_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        loopwarden_bus::pki::init(&loopwarden_bus::pki::InitArgs {
            site: "lab".into(),
            hosts: vec!["h01".into(), "h02".into()],
            cdus: vec!["cdu1".into()],
            operators: Vec::new(),
            readers: Vec::new(),
            out: pki.clone(),
            broker_port: 8883,
        })
        .expect("pki init");
        let d = pki.canonicalize().unwrap();
        let d = d.display();
        let of = |who: &str| {
            format!(
                "site = \"lab\"\nbroker = \"127.0.0.1:8883\"\ntls_ca = \"{d}/ca.crt\"\n\
                 tls_cert = \"{d}/{who}.crt\"\ntls_key = \"{d}/{who}.key\"\n"
            )
        };
        let id = |s: &str| Ident::new(s).unwrap();
        let resolved = |text: &str| {
            let path = Path::new("a.toml");
            let common = check(text, &CommonFlags::default()).expect("the files load");
            check_tls_identity(&Sources::new(Some(path), text), &common, "host", &id("h01"))
        };
        let e = resolved(&of("h02")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(
            e.message
                .contains(&format!("{d}/h02.crt is made out to CN \"h02\""))
                && e.message.contains("this node is host \"h01\""),
            "{e}"
        );
        resolved(&of("h01")).expect("h01's own certificate");
        // A CDU's is refused to a host of the same site too.
        assert!(resolved(&of("cdu1")).is_err());
        // The flag names itself.
        let text = of("h01");
        let common = check(
            &text,
            &CommonFlags {
                tls_cert: Some(pki.join("h02.crt")),
                tls_key: Some(pki.join("h02.key")),
                ..CommonFlags::default()
            },
        )
        .unwrap();
        let e = check_tls_identity(&Sources::new(None, &text), &common, "host", &id("h01"))
            .unwrap_err();
        assert!(e.to_string().contains("--tls-cert"), "{e}");
        // A login beside the certificate changes nothing: a broker that
        // takes the CN as the user name ignores it. Said so.
        let pw = pki.join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&pw, private).unwrap();
        let login = format!("broker_user = \"h01\"\nbroker_password_file = {pw:?}\n");
        let e = resolved(&format!("{}{login}", of("h02"))).unwrap_err();
        assert!(
            e.message.contains("is made out to CN \"h02\"")
                && e.message.contains("broker_user \"h01\" does not change it"),
            "{e}"
        );
        resolved(&format!("{}{login}", of("h01"))).expect("h01's own, with a login");
    }

    #[test]
    fn a_bad_common_field_points_at_its_line_and_an_unknown_key_is_refused() {
        let e = check(
            "period_ms = 5\nbroker = \"h:99999\"\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.starts_with("broker = \"h:99999\""), "{e}");
        let e = check(
            "site = \"a\"\nbroker = \"n1:4001,n2:4002,\"\n",
            &CommonFlags::default(),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(
            e.message
                .ends_with(r#"entry 3 of 3: broker address "": empty host"#),
            "{e}"
        );
        let e = check("site = \"a\"\nbrokr = \"x\"\n", &CommonFlags::default()).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("brokr"), "{e}");
    }
}

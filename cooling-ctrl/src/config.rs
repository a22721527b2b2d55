//! The controller's configuration for `cooling-ctrl run`: a TOML file,
//! every field overridable by a flag, checked as a whole at start.
//!
//! A key the controller does not know, a value of the wrong type or a
//! value out of its range stops the start with the file, the line and the
//! reason; nothing is guessed. The fields (flags are the same names with
//! `-` for `_`):
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `site` | `site` | the site (ident) |
//! | `cdu` | the machine's host name | this CDU's id (ident) |
//! | `broker` | none (required unless `embedded_broker = true`) | `host[:port]`, or the nodes of a broker cluster `host:port,host:port,…` (it fails over between them) |
//! | `embedded_broker` | false | run the embedded broker here on purpose (not with `broker`) |
//! | `broker_user`, `broker_password_file` | none | broker login, together |
//! | `tls_ca`, `tls_cert`, `tls_key` | none (plain MQTT) | TLS to the broker: the CA, this controller's certificate and key (PEM) |
//! | `tls_server_name` | the host of `broker` | the name the broker's certificate must carry |
//! | `keep_alive_s` | 5 | MQTT keep-alive, 1 to 600 s: the broker publishes the controller's last wills after 1.5 × this of silence |
//! | `json_presence` | true | keep the JSON `online` on a second connection whose last will says offline; `false` saves that connection, but the JSON tree then keeps saying online after a crash |
//! | `sign_key` | none (required) | this controller's Ed25519 sign key (`cdu1.sign.key` from `lwbus pki init`); it must be `cdu/<cdu>`'s |
//! | `demo_key` | false | sign with the public demonstration key (twin only) |
//! | `cdu_tcp` | — | the CDU on Modbus TCP, `host:port` |
//! | `cdu_serial` | — | the CDU on Modbus RTU, a serial device |
//! | `serial_baud` | 19200 | 300 to 1000000 |
//! | `serial_parity` | `none` | `none`, `even` or `odd` |
//! | `serial_data_bits` | 8 | 7 or 8 |
//! | `serial_stop_bits` | 1 | 1 or 2 |
//! | `register_map` | none (required with a site sign key; the simulated CDU's with `demo_key`) | a register map TOML |
//! | `site_figures` | none (required with a site sign key; the twin's hall with `demo_key`) | a site figures TOML (`SiteConfig`) |
//! | `hosts` | none | host ids, rack-major |
//! | `hosts_pattern` | none | host ids from `{rack}`, `{host}`, `{index}` (`{index:02}` pads) |
//! | `period_ms` | 1000 | control period, 100 to 60000 |
//! | `lease_ms` | 30000 | cap lease, at least 3 periods, at most 10 minutes (the hosts' default cap) |
//! | `modbus_timeout_ms` | 500 (at most the period) | one Modbus request, 10 ms to the period |
//! | `ambient_c` | none (the core's design day, 35 °C) | fallback outdoor temperature, -50 to 60 °C; used only when no sensor reads (the CDU's `outdoor_temp`, or a value the BMS wrote in the last 300 s), and then the controller raises an alarm |
//! | `console` | `/run/loopwarden/cooling-ctrl.sock` or under `$XDG_RUNTIME_DIR`/`/tmp` | console socket |
//! | `console_serial` | none (no serial console) | the serial console's device (`/dev/ttyS1`; docs/cooling.md "Serial console") |
//! | `console_serial_baud` | 115200 | its speed, 8N1 |
//! | `console_password_hash` | none (`clear-leak`, `clear-pump` refused on the serial console) | the Argon2id hash of its password (`cooling-ctrl console-password`) |
//! | `console_idle_s` | 300 | seconds before an idle serial session is closed |
//! | `flash` | none (required with a site sign key, unless `volatile_latch`) | flash file: the event log, the outbox and the latched state |
//! | `volatile_latch` | false (true with `demo_key` and no `flash`) | run without a flash file on purpose: latched leaks and failed pumps are lost at every restart (said at every start) |
//! | `northbound` | none (no server) | the BMS's Modbus TCP server, `address:port` |
//! | `northbound_writes` | false | the BMS may write the bounded holding registers |
//! | `northbound_unit_id` | 1 (the northbound map's) | the Modbus unit id the northbound server answers, 1 to 247 (255 always reaches it; other ids get no answer) |
//! | `facility_coordinator` | none (this CDU's setpoint sets its facility water) | a hall of several CDUs (site figures' `cdus`): the CDU whose facility water plan every CDU follows |
//! | `facility_cdus` | none | the hall's CDUs in order; on the coordinator, itself among them |
//! | `metrics_listen` | none (not served) | Prometheus's `/metrics`, `IP:PORT` or `:PORT` |
//! | `board_pins` | none (leaks from the CDU's register only) | the controller board's pin map TOML (`boards/pins/*.toml`) |
//! | `gpio_chip` | none | the GPIO character device of those pins, e.g. `/dev/gpiochip0` |
//! | `unprotected_racks` | none | racks run without a leak rope, by number; with `board_pins`, every other rack must have a rope in the pin map |
//!
//! `site`, `broker`, `embedded_broker`, `broker_user`,
//! `broker_password_file`, the `tls_` fields, `keep_alive_s`,
//! `json_presence`, `flash` and `console` are
//! the fields every agent has, declared and
//! checked in `loopwarden_field::common`; the rest are the controller's.
//! Exactly one of `cdu_tcp` and `cdu_serial`; at most one of `hosts` and
//! `hosts_pattern`; `board_pins` and `gpio_chip` together or neither. The
//! pin map is read and checked here; the chip is opened at start
//! (`crate::gpio`).
//!
//! Glossary:
//! - *origin*: where a value came from (a line of the file, a flag, the
//!   default), so an error points at it.

use std::format;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::time::Duration;
use std::vec::Vec;

use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_boards::pins::PinMap;
use loopwarden_boards::site::SiteConfig;
use loopwarden_field::common;
pub use loopwarden_field::config::ConfigError;
use loopwarden_field::config::{self as field, local_host_name, range, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::auth::SigningKey;
use loopwarden_protocol::{Ident, Role};

use crate::modbus::{DataBits, Link, Parity, SerialLine, StopBits};
use crate::shell::ShellConfig;
use cooling_core::{CoreConfig, MAX_HOSTS};

loopwarden_field::agent_file! {
    /// The file as written (every field optional): the common fields
    /// (`loopwarden_field::common`), then the controller's own.
    pub struct FileConfig {
        /// CDU id.
        pub cdu: Option<String>,
        /// This controller's sign key file.
        pub sign_key: Option<PathBuf>,
        /// The public demonstration key (twin only).
        pub demo_key: Option<bool>,
        /// The CDU on Modbus TCP.
        pub cdu_tcp: Option<String>,
        /// The CDU on Modbus RTU.
        pub cdu_serial: Option<String>,
        /// Baud rate.
        pub serial_baud: Option<u32>,
        /// Parity.
        pub serial_parity: Option<String>,
        /// Data bits.
        pub serial_data_bits: Option<u8>,
        /// Stop bits.
        pub serial_stop_bits: Option<u8>,
        /// Register map file.
        pub register_map: Option<PathBuf>,
        /// Site figures file.
        pub site_figures: Option<PathBuf>,
        /// Host ids, rack-major.
        pub hosts: Option<Vec<String>>,
        /// Host id pattern.
        pub hosts_pattern: Option<String>,
        /// Control period, ms.
        pub period_ms: Option<u64>,
        /// Cap lease duration, ms.
        pub lease_ms: Option<u64>,
        /// Modbus request timeout, ms.
        pub modbus_timeout_ms: Option<u64>,
        /// Fallback outdoor temperature, °C (used only when no sensor
        /// reads).
        pub ambient_c: Option<f32>,
        /// Northbound Modbus TCP server for the BMS, `address:port`.
        pub northbound: Option<String>,
        /// The BMS may write the northbound holding registers.
        pub northbound_writes: Option<bool>,
        /// The unit id the northbound server answers.
        pub northbound_unit_id: Option<u8>,
        /// Prometheus's `/metrics` on this address (`IP:PORT`).
        pub metrics_listen: Option<String>,
        /// The board's pin map file.
        pub board_pins: Option<PathBuf>,
        /// The GPIO chip of the board's pins.
        pub gpio_chip: Option<PathBuf>,
        /// Racks run without a leak rope, by number.
        pub unprotected_racks: Option<Vec<u8>>,
        /// Run without a flash file on purpose: what is latched (leaks,
        /// failed pumps) is lost at every restart.
        pub volatile_latch: Option<bool>,
        /// A hall of several CDUs: the CDU whose facility water plan
        /// every CDU follows (the hall's coordinator).
        pub facility_coordinator: Option<String>,
        /// The hall's CDUs, in order (needed on the coordinator).
        pub facility_cdus: Option<Vec<String>>,
    }
}

loopwarden_field::agent_flags! {
    /// Values given as flags, each overriding the file: the common fields,
    /// then the controller's own.
    pub struct Overrides {
        /// This CDU's id (ident); default: the machine's host name.
        #[arg(long)]
        pub cdu: Option<String>,
        /// This controller's sign key file (`ID.sign.key`), which cap
        /// leases are signed with.
        #[arg(long)]
        pub sign_key: Option<PathBuf>,
        /// Sign leases with the public demonstration key (the twin only:
        /// anyone can forge commands with it).
        #[arg(long)]
        pub demo_key: bool,
        /// The CDU on Modbus TCP, `host:port`.
        #[arg(long)]
        pub cdu_tcp: Option<String>,
        /// The CDU on Modbus RTU, a serial device such as /dev/ttyUSB0.
        #[arg(long)]
        pub cdu_serial: Option<String>,
        /// Serial baud rate.
        #[arg(long)]
        pub serial_baud: Option<u32>,
        /// Serial parity: none, even or odd.
        #[arg(long)]
        pub serial_parity: Option<String>,
        /// Serial data bits: 7 or 8.
        #[arg(long)]
        pub serial_data_bits: Option<u8>,
        /// Serial stop bits: 1 or 2.
        #[arg(long)]
        pub serial_stop_bits: Option<u8>,
        /// The CDU model's register map (TOML); required with a site sign
        /// key; with the demonstration key: the simulated CDU's.
        #[arg(long)]
        pub register_map: Option<PathBuf>,
        /// The hall's figures (site TOML); required with a site sign key;
        /// with the demonstration key: the twin's hall.
        #[arg(long)]
        pub site_figures: Option<PathBuf>,
        /// Run without a flash file on purpose: latched leaks and failed
        /// pumps are lost at every restart.
        #[arg(long)]
        pub volatile_latch: bool,
        /// Host ids in rack-major order, comma-separated.
        #[arg(long, value_delimiter = ',')]
        pub hosts: Vec<String>,
        /// Host ids from a pattern: `{rack}`, `{host}` (in its rack) and
        /// `{index}` (rack-major), `{index:02}` to pad.
        #[arg(long)]
        pub hosts_pattern: Option<String>,
        /// Control period in ms.
        #[arg(long)]
        pub period_ms: Option<u64>,
        /// Cap lease duration in ms.
        #[arg(long)]
        pub lease_ms: Option<u64>,
        /// Timeout of one Modbus request in ms.
        #[arg(long)]
        pub modbus_timeout_ms: Option<u64>,
        /// Fallback outdoor temperature, °C: used only when no sensor reads
        /// (the CDU's outdoor_temp, or a value the BMS wrote in the last
        /// 300 s), and then the controller raises an alarm.
        #[arg(long, allow_negative_numbers = true)]
        pub ambient_c: Option<f32>,
        /// Serve the northbound Modbus TCP map for the BMS here
        /// (`address:port`); default: no server.
        #[arg(long)]
        pub northbound: Option<String>,
        /// Let the BMS write the northbound holding registers (bounded
        /// setpoint ceiling, plan ceiling offset, alarm acknowledge).
        #[arg(long)]
        pub northbound_writes: Option<bool>,
        /// The Modbus unit id the northbound server answers, 1 to 247
        /// (255 always reaches it); default: 1.
        #[arg(long)]
        pub northbound_unit_id: Option<u8>,
        /// Serve Prometheus metrics at http://ADDR/metrics (`IP:PORT`, or
        /// `:PORT` for every interface); off by default.
        #[arg(long, value_name = "ADDR")]
        pub metrics_listen: Option<String>,
        /// The controller board's pin map (TOML): leak ropes and their fault
        /// inputs per rack, the controller-healthy relay, the alarm beacon;
        /// with --gpio-chip.
        #[arg(long)]
        pub board_pins: Option<PathBuf>,
        /// The GPIO character device of the board's pins, e.g. /dev/gpiochip0;
        /// with --board-pins.
        #[arg(long)]
        pub gpio_chip: Option<PathBuf>,
    }
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Site.
    pub site: Ident,
    /// This CDU.
    pub cdu: Ident,
    /// Broker; `None`: embedded.
    pub broker: Option<loopwarden_bus::Brokers>,
    /// Broker credentials.
    pub credentials: Option<(String, String)>,
    /// TLS to the broker.
    pub tls: Option<loopwarden_bus::tls::Tls>,
    /// MQTT keep-alive.
    pub keep_alive: Duration,
    /// The JSON `online` on a connection of its own, with a will.
    pub json_presence: bool,
    /// The id of the key leases are signed with.
    pub key_id: u8,
    /// That key.
    pub key: SigningKey,
    /// The key is the public demonstration key.
    pub demo_key: bool,
    /// How the CDU is reached.
    pub link: Link,
    /// Its register map.
    pub map: RegisterMap,
    /// The control core's configuration (from the site figures).
    pub core: CoreConfig,
    /// Host ids, rack-major.
    pub hosts: Vec<Ident>,
    /// Control period.
    pub period: Duration,
    /// Cap lease duration.
    pub lease: Duration,
    /// One Modbus request's timeout.
    pub modbus_timeout: Duration,
    /// Fallback outdoor temperature, °C (already in `core` as its
    /// `margins.design_ambient_c`); `None`: the core's design day.
    pub ambient_c: Option<f32>,
    /// Console socket.
    pub console: PathBuf,
    /// The serial console, if one is configured.
    pub serial: Option<loopwarden_field::serial::SerialConsole>,
    /// Flash file.
    pub flash: Option<PathBuf>,
    /// No flash file, on purpose (`volatile_latch = true`, or the
    /// demonstration key): the latched state is lost at every restart.
    pub volatile_latch: bool,
    /// Where the northbound Modbus server listens; `None`: no server.
    pub northbound: Option<std::net::SocketAddr>,
    /// The BMS may write the northbound holding registers.
    pub northbound_writes: bool,
    /// The unit id the northbound server answers.
    pub northbound_unit_id: u8,
    /// Where `/metrics` is served; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// The board's pins on a GPIO chip; `None`: no board pins.
    pub board: Option<BoardConfig>,
    /// This CDU's part in a hall of several CDUs; `None`: its setpoint
    /// alone sets its facility water.
    pub facility: Option<crate::facility::FacilityRole>,
}

/// The controller board's pins: a pin map on a GPIO chip.
#[derive(Debug, Clone)]
pub struct BoardConfig {
    /// The pin map, checked.
    pub pins: PinMap,
    /// Where it was read.
    pub pins_file: PathBuf,
    /// The GPIO character device.
    pub chip: PathBuf,
}

impl Config {
    /// The shell's configuration, on `broker`.
    pub fn shell_config(&self, broker: impl Into<loopwarden_bus::Brokers>) -> ShellConfig {
        let mut c = ShellConfig::new(self.site.clone(), self.cdu.clone(), broker, self.core);
        c.period = self.period;
        c.hosts = self.hosts.clone();
        c.tls = self.tls.clone();
        c.key_id = self.key_id;
        c.key = Some(self.key.clone());
        c.lease = self.lease;
        c
    }
}

/// Reads `path` (if any), applies `flags` and checks the result.
pub fn load(path: Option<&Path>, flags: &Overrides) -> Result<Config, ConfigError> {
    let text = field::read_optional(path)?;
    resolve(path, &text, flags)
}

/// Builds host ids from a pattern for `racks` × `per_rack` hosts.
pub fn expand_hosts(pattern: &str, racks: usize, per_rack: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for index in 0..racks * per_rack {
        let (rack, host) = (index / per_rack.max(1), index % per_rack.max(1));
        let mut id = String::new();
        let mut rest = pattern;
        while let Some(open) = rest.find('{') {
            id.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("unclosed placeholder in {pattern:?}"))?;
            let inner = &rest[open + 1..open + close];
            let (name, width) = match inner.split_once(':') {
                Some((n, w)) => {
                    let width: usize = w
                        .trim_start_matches('0')
                        .parse()
                        .ok()
                        .filter(|_| w.starts_with('0'))
                        .ok_or_else(|| format!("{{{inner}}}: the width is written :02, :03 ..."))?;
                    (n, width)
                }
                None => (inner, 0),
            };
            let value = match name {
                "rack" => rack,
                "host" => host,
                "index" => index,
                other => {
                    return Err(format!(
                        "unknown placeholder {{{other}}} in {pattern:?}; known: {{rack}} {{host}} {{index}}"
                    ))
                }
            };
            id.push_str(&format!("{value:0width$}"));
            rest = &rest[open + close + 1..];
        }
        id.push_str(rest);
        out.push(id);
    }
    if out.len() > 1 && out[0] == out[1] {
        return Err(format!(
            "{pattern:?} gives every host the same id: use {{index}}, or {{rack}} and {{host}}"
        ));
    }
    Ok(out)
}
/// Checks a configuration given as text (the file at `path`) and flags:
/// the common fields, then this CDU, its key, its link, the plant (register
/// map and site figures), the hosts, the timings, the northbound server and
/// the board's pins, each by its own function below.
pub fn resolve(path: Option<&Path>, text: &str, flags: &Overrides) -> Result<Config, ConfigError> {
    let file: FileConfig = field::parse(path, text)?;
    let src = Sources::new(path, text);

    let common = common::resolve(&src, file.common(), &flags.common, default_console)?;
    let cdu = field::ident(
        &src,
        pick!(flags.cdu, file.cdu, "cdu"),
        "cdu",
        local_host_name(),
    )?;
    let key = sign_key(&src, &file, flags, &cdu)?;
    // Whatever its key, a controller drives a CDU over Modbus, which may
    // be a real one: it never starts a broker unasked.
    let production = Some(if key.demo {
        "a CDU link (even with the demonstration key)"
    } else {
        "a CDU link with a site sign key"
    });
    common::check_broker(&src, &common, production)?;
    let link = cdu_link(&src, &file, flags)?;
    let map = register_map(&src, &file, flags, key.demo)?;
    let mut core = core_config(&src, &file, flags, key.demo)?;
    let volatile_latch = volatile_latch(&src, &file, flags, common.flash.is_some(), key.demo)?;
    core.layout.unprotected = unprotected(&src, &file, &core)?;
    let hosts = hosts(&src, &file, flags, &core)?;
    let timings = timings(&src, &file, flags)?;
    // The configured outdoor temperature is the fallback the core plans
    // with when no sensor reads, not a reading.
    if let Some(a) = timings.ambient_c {
        core.margins.design_ambient_c = a;
    }
    let Northbound {
        addr: northbound,
        writes: northbound_writes,
        unit_id: northbound_unit_id,
    } = northbound(&src, &file, flags)?;
    let facility = facility_role(&src, &file, &cdu, &core)?;
    let metrics_listen = metrics_listen(&src, &file, flags)?;
    let board = board_pins(&src, &file, flags, &core)?;

    Ok(Config {
        site: common.site,
        cdu,
        broker: common.broker,
        credentials: common.credentials,
        tls: common.tls,
        keep_alive: common.keep_alive,
        json_presence: common.json_presence,
        key_id: key.id,
        key: key.key,
        demo_key: key.demo,
        link,
        map,
        core,
        hosts,
        period: timings.period,
        lease: timings.lease,
        modbus_timeout: timings.modbus_timeout,
        ambient_c: timings.ambient_c,
        console: common.console,
        serial: common.serial,
        flash: common.flash,
        volatile_latch,
        northbound,
        northbound_writes,
        northbound_unit_id,
        facility,
        metrics_listen,
        board,
    })
}

/// `metrics_listen`: the address `/metrics` is served on, if any.
fn metrics_listen(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Option<SocketAddr>, ConfigError> {
    let given = pick!(flags.metrics_listen, file.metrics_listen, "metrics-listen");
    common::metrics_listen(src, given)
}

/// The key cap leases are signed with.
struct SiteKey {
    /// Its id.
    id: u8,
    /// The key.
    key: SigningKey,
    /// It is the public demonstration key.
    demo: bool,
}

/// The sign key: from `sign_key`, which must be this CDU's, or the
/// demonstration key with `demo_key`; one of the two, not both.
fn sign_key(
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
            "no sign key: give sign_key (or --sign-key) to sign cap leases; \
             --demo-key signs with the public demonstration key, for the twin only"
                .into(),
        )),
    }
}

/// The CDU link: exactly one of `cdu_tcp` and `cdu_serial`.
fn cdu_link(src: &Sources, file: &FileConfig, flags: &Overrides) -> Result<Link, ConfigError> {
    let serial = pick!(flags.cdu_serial, file.cdu_serial, "cdu-serial");
    match (pick!(flags.cdu_tcp, file.cdu_tcp, "cdu-tcp"), serial) {
        ((Some(_), flag), (Some(_), _)) => Err(src.error(
            flag,
            "cdu_tcp",
            "cdu_tcp and cdu_serial exclude each other: the CDU has one link".into(),
        )),
        ((None, _), (None, _)) => Err(src.error(
            None,
            "cdu_tcp",
            "a CDU link is required: cdu_tcp = \"host:port\" or cdu_serial = \"/dev/ttyUSB0\""
                .into(),
        )),
        ((Some(t), flag), _) => tcp_link(src, file, flags, &t, flag),
        (_, (Some(dev), _)) => serial_link(src, file, flags, dev),
    }
}

/// A CDU on Modbus TCP at `t`: an address, and no serial settings.
fn tcp_link(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    t: &str,
    flag: Option<&str>,
) -> Result<Link, ConfigError> {
    let serial_set = [
        (
            "serial_baud",
            file.serial_baud.is_some() || flags.serial_baud.is_some(),
        ),
        (
            "serial_parity",
            file.serial_parity.is_some() || flags.serial_parity.is_some(),
        ),
        (
            "serial_data_bits",
            file.serial_data_bits.is_some() || flags.serial_data_bits.is_some(),
        ),
        (
            "serial_stop_bits",
            file.serial_stop_bits.is_some() || flags.serial_stop_bits.is_some(),
        ),
    ];
    if let Some((key, _)) = serial_set.iter().find(|(_, set)| *set) {
        return Err(src.error(
            None,
            key,
            format!("{key} is for a CDU on cdu_serial, not cdu_tcp"),
        ));
    }
    let addr = t
        .to_socket_addrs()
        .map_err(|e| {
            src.error(
                flag,
                "cdu_tcp",
                format!("cdu_tcp = {t:?}: {e} (expected host:port)"),
            )
        })?
        .next()
        .ok_or_else(|| src.error(flag, "cdu_tcp", format!("cdu_tcp = {t:?}: no address")))?;
    Ok(Link::Tcp(addr))
}

/// A CDU on Modbus RTU at `dev`, with its line settings.
fn serial_link(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    dev: String,
) -> Result<Link, ConfigError> {
    let mut line = SerialLine::new(dev);
    line.baud = range(
        src,
        pick!(flags.serial_baud, file.serial_baud, "serial-baud"),
        "serial_baud",
        19_200,
        300,
        1_000_000,
        " baud",
    )?;
    line.parity = match pick!(flags.serial_parity, file.serial_parity, "serial-parity") {
        (None, _) => Parity::None,
        (Some(p), flag) => match p.as_str() {
            "none" => Parity::None,
            "even" => Parity::Even,
            "odd" => Parity::Odd,
            _ => {
                return Err(src.error(
                    flag,
                    "serial_parity",
                    format!("serial_parity = {p:?}: none, even or odd"),
                ))
            }
        },
    };
    line.data_bits = match range(
        src,
        pick!(
            flags.serial_data_bits,
            file.serial_data_bits,
            "serial-data-bits"
        ),
        "serial_data_bits",
        8,
        7,
        8,
        " bits",
    )? {
        7 => DataBits::Seven,
        _ => DataBits::Eight,
    };
    line.stop_bits = match range(
        src,
        pick!(
            flags.serial_stop_bits,
            file.serial_stop_bits,
            "serial-stop-bits"
        ),
        "serial_stop_bits",
        1,
        1,
        2,
        " bits",
    )? {
        2 => StopBits::Two,
        _ => StopBits::One,
    };
    Ok(Link::Rtu(line))
}

/// What a CDU link with a site sign key may not leave out: the
/// simulated CDU's map and the twin's figures describe no real CDU.
fn required_on_a_real_link(src: &Sources, field: &str, what: &str) -> ConfigError {
    src.error(
        None,
        field,
        format!(
            "{field}: required with a site sign key: give {what}; the default is the twin's, for the demonstration key only"
        ),
    )
}

/// `volatile_latch`: whether the controller runs without a flash file on
/// purpose. Without `flash`, a site-keyed controller must be told so; the
/// demonstration key runs the twin, where it is the default.
fn volatile_latch(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    flash: bool,
    demo: bool,
) -> Result<bool, ConfigError> {
    let flag = flags.volatile_latch.then_some(true);
    let (given, from) = pick!(flag, file.volatile_latch, "volatile-latch");
    match (given.unwrap_or(false), flash) {
        (true, true) => Err(src.error(
            from,
            "volatile_latch",
            "volatile_latch = true with a flash file: give one or the other".into(),
        )),
        (false, false) if !demo => Err(src.error(
            None,
            "flash",
            "flash: required with a site sign key: the latched state (leaks, failed pumps) must survive a restart; give a flash file, or volatile_latch = true to run without one on purpose".into(),
        )),
        (v, _) => Ok(v || !flash),
    }
}

/// The CDU's register map: the file given; with the demonstration key
/// only, the simulated CDU's.
fn register_map(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    demo: bool,
) -> Result<RegisterMap, ConfigError> {
    match pick!(flags.register_map, file.register_map, "register-map") {
        (None, _) if demo => Ok(RegisterMap::sim_cdu()),
        (None, _) => Err(required_on_a_real_link(
            src,
            "register_map",
            "this CDU model's register map (a TOML like boards/cdus/sim-cdu.toml)",
        )),
        (Some(p), flag) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "register_map",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            RegisterMap::from_toml(&t, &p.display().to_string()).map_err(|e| board_error(&p, &t, e))
        }
    }
}

/// The control core's configuration from the site figures (the file
/// given; with the demonstration key only, the twin's hall), checked; its
/// errors name that file.
fn core_config(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    demo: bool,
) -> Result<CoreConfig, ConfigError> {
    let (figures, figures_path) = match pick!(flags.site_figures, file.site_figures, "site-figures")
    {
        (None, _) if demo => (SiteConfig::default(), None),
        (None, _) => return Err(required_on_a_real_link(
            src,
            "site_figures",
            "the hall's figures (a site figures TOML: racks, hosts, GPUs, loop, heat rejection)",
        )),
        (Some(p), flag) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "site_figures",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            let figures: SiteConfig = field::parse(Some(&p), &t)?;
            (figures, Some(p))
        }
    };
    let figures_origin = || {
        figures_path
            .as_ref()
            .map_or("the twin's site figures".to_string(), |p| {
                p.display().to_string()
            })
    };
    let core = crate::site_figures::core_config(&figures).map_err(|e| ConfigError {
        origin: figures_origin(),
        line: None,
        message: format!("for the control core: {e}"),
    })?;
    core.validate().map_err(|e| ConfigError {
        origin: figures_origin(),
        line: None,
        message: format!("for the control core: {e}"),
    })?;
    Ok(core)
}

/// The racks declared without a leak rope, as a mask; each must be a rack
/// of the hall, named once.
fn unprotected(src: &Sources, file: &FileConfig, core: &CoreConfig) -> Result<u16, ConfigError> {
    let mut mask = 0u16;
    for &r in file.unprotected_racks.iter().flatten() {
        if r >= core.layout.racks {
            return Err(src.error(
                None,
                "unprotected_racks",
                format!(
                    "rack {r}: the hall has racks 0 to {}",
                    core.layout.racks - 1
                ),
            ));
        }
        if mask & (1 << r) != 0 {
            return Err(src.error(None, "unprotected_racks", format!("rack {r} appears twice")));
        }
        mask |= 1 << r;
    }
    Ok(mask)
}

/// The host ids: a list or a pattern (not both), at most the hall's
/// hosts, each a name, none twice.
fn hosts(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    core: &CoreConfig,
) -> Result<Vec<Ident>, ConfigError> {
    let layout_hosts = core.layout.hosts().min(MAX_HOSTS);
    let hosts_flag = (!flags.hosts.is_empty()).then(|| flags.hosts.clone());
    let (names, hosts_from, hosts_key) = match (
        pick!(hosts_flag, file.hosts, "hosts"),
        pick!(flags.hosts_pattern, file.hosts_pattern, "hosts-pattern"),
    ) {
        ((Some(_), flag), (Some(_), _)) => {
            return Err(src.error(
                flag,
                "hosts",
                "hosts and hosts_pattern exclude each other".into(),
            ))
        }
        ((Some(list), flag), _) => (list, flag, "hosts"),
        (_, (Some(pattern), flag)) => (
            expand_hosts(
                &pattern,
                usize::from(core.layout.racks),
                usize::from(core.layout.hosts_per_rack),
            )
            .map_err(|m| src.error(flag, "hosts_pattern", m))?,
            flag,
            "hosts_pattern",
        ),
        _ => (Vec::new(), None, "hosts"),
    };
    if names.len() > layout_hosts {
        return Err(src.error(
            hosts_from,
            hosts_key,
            format!(
                "{} host ids for a hall of {layout_hosts} hosts ({} racks of {})",
                names.len(),
                core.layout.racks,
                core.layout.hosts_per_rack
            ),
        ));
    }
    let mut hosts: Vec<Ident> = Vec::with_capacity(names.len());
    for n in &names {
        let h = Ident::new(n).map_err(|e| {
            src.error(
                hosts_from,
                hosts_key,
                format!("host id {n:?} is not a name: {e}"),
            )
        })?;
        if hosts.contains(&h) {
            return Err(src.error(
                hosts_from,
                hosts_key,
                format!("host id {n:?} appears twice"),
            ));
        }
        hosts.push(h);
    }
    Ok(hosts)
}

/// The control period, the lease, the Modbus timeout and the fallback
/// outdoor temperature.
struct Timings {
    /// Control period.
    period: Duration,
    /// Cap lease duration.
    lease: Duration,
    /// One Modbus request's timeout.
    modbus_timeout: Duration,
    /// Fallback outdoor temperature.
    ambient_c: Option<f32>,
}

/// The timings: the lease at least 3 periods and at most 10 minutes (what
/// hosts take by default), the Modbus timeout at most one period.
fn timings(src: &Sources, file: &FileConfig, flags: &Overrides) -> Result<Timings, ConfigError> {
    let period = common::period_ms(src, pick!(flags.period_ms, file.period_ms, "period-ms"))?;
    let lease = range(
        src,
        pick!(flags.lease_ms, file.lease_ms, "lease-ms"),
        "lease_ms",
        30_000.max(3 * period),
        3 * period,
        600_000,
        " ms, at least 3 periods, at most the hosts' 10-minute cap",
    )?;
    let modbus_timeout = range(
        src,
        pick!(
            flags.modbus_timeout_ms,
            file.modbus_timeout_ms,
            "modbus-timeout-ms"
        ),
        "modbus_timeout_ms",
        500.min(period),
        10,
        period,
        " ms, at most the period",
    )?;
    let ambient_c = match pick!(flags.ambient_c, file.ambient_c, "ambient-c") {
        (None, _) => None,
        p => Some(range(src, p, "ambient_c", 0.0, -50.0, 60.0, " °C")?),
    };
    Ok(Timings {
        period: Duration::from_millis(period),
        lease: Duration::from_millis(lease),
        modbus_timeout: Duration::from_millis(modbus_timeout),
        ambient_c,
    })
}

/// `facility_coordinator` and `facility_cdus`: this CDU's part in a hall of
/// several CDUs (the site figures' `cdus` above 1); the coordinator must
/// name the hall's CDUs, itself among them.
fn facility_role(
    src: &Sources,
    file: &FileConfig,
    me: &Ident,
    core: &CoreConfig,
) -> Result<Option<crate::facility::FacilityRole>, ConfigError> {
    let Some(coordinator) = file.facility_coordinator.clone() else {
        if file.facility_cdus.is_some() {
            return Err(src.error(
                None,
                "facility_cdus",
                "facility_cdus needs facility_coordinator (the CDU that plans the hall's water)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    let id = |key: &str, v: &str| {
        Ident::new(v).map_err(|e| src.error(None, key, format!("{key}: {v:?} is not an id ({e})")))
    };
    let coordinator = id("facility_coordinator", &coordinator)?;
    if core.facility.cdus < 2 {
        return Err(src.error(
            None,
            "facility_coordinator",
            format!(
                "facility_coordinator = \"{coordinator}\": the site figures give one CDU on the facility water (set cdus to the hall's CDUs)"
            ),
        ));
    }
    let cdus = file
        .facility_cdus
        .iter()
        .flatten()
        .map(|c| id("facility_cdus", c))
        .collect::<Result<Vec<_>, _>>()?;
    if &coordinator == me && !cdus.contains(me) {
        return Err(src.error(
            None,
            "facility_cdus",
            format!("this CDU ({me}) coordinates the hall: facility_cdus must list the hall's CDUs, itself among them"),
        ));
    }
    if cdus.len() > usize::from(core.facility.cdus) {
        return Err(src.error(
            None,
            "facility_cdus",
            format!(
                "facility_cdus names {} CDUs, the site figures {} (cdus)",
                cdus.len(),
                core.facility.cdus
            ),
        ));
    }
    Ok(Some(crate::facility::FacilityRole { coordinator, cdus }))
}

/// The northbound server's settings.
struct Northbound {
    /// Where it listens; `None`: no server.
    addr: Option<SocketAddr>,
    /// The BMS may write.
    writes: bool,
    /// The unit id it answers.
    unit_id: u8,
}

/// The northbound server's address (`None`: no server), whether the BMS
/// may write and the unit id it answers; the last two need an address.
fn northbound(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Northbound, ConfigError> {
    let northbound = match pick!(flags.northbound, file.northbound, "northbound") {
        (None, _) => None,
        (Some(a), flag) => Some(a.parse::<SocketAddr>().map_err(|e| {
            src.error(
                flag,
                "northbound",
                format!("northbound = {a:?} is not an address:port ({e})"),
            )
        })?),
    };
    let northbound_writes = pick!(
        flags.northbound_writes,
        file.northbound_writes,
        "northbound-writes"
    )
    .0
    .unwrap_or(false);
    if northbound_writes && northbound.is_none() {
        return Err(src.error(
            None,
            "northbound_writes",
            "northbound_writes = true needs a northbound address to serve".into(),
        ));
    }
    let unit = pick!(
        flags.northbound_unit_id,
        file.northbound_unit_id,
        "northbound-unit-id"
    );
    let given = unit.0.is_some();
    let default = crate::northbound::northbound_map().unit_id;
    let unit_id = range(src, unit, "northbound_unit_id", default, 1, 247, "")?;
    if given && northbound.is_none() {
        return Err(src.error(
            None,
            "northbound_unit_id",
            "northbound_unit_id needs a northbound address to serve".into(),
        ));
    }
    Ok(Northbound {
        addr: northbound,
        writes: northbound_writes,
        unit_id,
    })
}

/// The board's pins: `board_pins` and `gpio_chip` together or neither;
/// the pin map read, checked, and with no more leak ropes than racks.
fn board_pins(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    core: &CoreConfig,
) -> Result<Option<BoardConfig>, ConfigError> {
    match (
        pick!(flags.board_pins, file.board_pins, "board-pins"),
        pick!(flags.gpio_chip, file.gpio_chip, "gpio-chip"),
    ) {
        ((None, _), (None, _)) => Ok(None),
        ((Some(p), flag), (Some(chip), _)) => {
            let t = std::fs::read_to_string(&p).map_err(|e| {
                src.error(
                    flag,
                    "board_pins",
                    format!("cannot read {}: {e}", p.display()),
                )
            })?;
            let pins = PinMap::from_toml(&t, &p.display().to_string())
                .map_err(|e| board_error(&p, &t, e))?;
            let racks = usize::from(core.layout.racks);
            let bare = (0..racks)
                .find(|r| pins.rope(*r).is_none() && core.layout.unprotected & (1 << r) == 0);
            if let Some(r) = bare {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} gives rack {r} no leak rope: wire one, or name the rack in unprotected_racks to run it without leak sensing",
                        p.display()
                    ),
                ));
            }
            if let Some(r) = pins
                .ropes
                .iter()
                .find(|r| core.layout.unprotected & (1 << r.rack.min(15)) != 0)
            {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} gives rack {} a leak rope, but unprotected_racks names it",
                        p.display(),
                        r.rack
                    ),
                ));
            }
            if let Some(r) = pins.ropes.iter().find(|r| r.rack >= racks) {
                return Err(src.error(
                    flag,
                    "board_pins",
                    format!(
                        "{} has a leak rope for rack {}; the hall has racks 0 to {}",
                        p.display(),
                        r.rack,
                        racks - 1
                    ),
                ));
            }
            Ok(Some(BoardConfig {
                pins,
                pins_file: p,
                chip,
            }))
        }
        ((Some(_), flag), (None, _)) => Err(src.error(
            flag,
            "board_pins",
            "board_pins needs gpio_chip, the GPIO device of those pins (e.g. \"/dev/gpiochip0\")"
                .into(),
        )),
        ((None, _), (Some(_), flag)) => Err(src.error(
            flag,
            "gpio_chip",
            "gpio_chip needs board_pins, the pin map saying which line is which signal".into(),
        )),
    }
}

/// A register map's error, with the line when the TOML parser gave one.
fn board_error(path: &Path, _text: &str, e: loopwarden_boards::BoardError) -> ConfigError {
    let message = match &e {
        loopwarden_boards::BoardError::Syntax { message, .. }
        | loopwarden_boards::BoardError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    };
    // The TOML parser says "TOML parse error at line N, column M".
    let line = message
        .split_once("at line ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    ConfigError {
        origin: path.display().to_string(),
        line,
        message: message
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string(),
    }
}

pub use loopwarden_bus::keys::read_sign_key;

/// `/run/loopwarden/cooling-ctrl.sock` where it can be made (root), else
/// `loopwarden-cooling-ctrl.sock` under `$XDG_RUNTIME_DIR` or `/tmp`. The
/// same for `run` and `ctl`, so `ctl` finds the controller without flags.
pub fn default_console() -> PathBuf {
    field::default_socket("cooling-ctrl", ".probe-cooling-ctrl")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    fn from(text: &str) -> Result<Config, ConfigError> {
        resolve(Some(Path::new("cdu.toml")), text, &Overrides::default())
    }

    const MIN: &str =
        "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";

    #[test]
    fn the_northbound_unit_id_is_1_unless_set_and_1_to_247() {
        assert_eq!(from(MIN).unwrap().northbound_unit_id, 1);
        let nb = format!("{MIN}northbound = \"127.0.0.1:5502\"\n");
        assert_eq!(from(&nb).unwrap().northbound_unit_id, 1);
        let c = from(&format!("{nb}northbound_unit_id = 17\n")).unwrap();
        assert_eq!(c.northbound_unit_id, 17);
        for bad in [0, 248, 255] {
            let e = from(&format!("{nb}northbound_unit_id = {bad}\n")).unwrap_err();
            assert_eq!(e.line, Some(6), "{e}");
            assert!(e.message.contains("northbound_unit_id"), "{e}");
        }
        let e = from(&format!("{MIN}northbound_unit_id = 3\n")).unwrap_err();
        assert!(e.message.contains("needs a northbound address"), "{e}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_checked() {
        assert_eq!(from(MIN).unwrap().metrics_listen, None);
        let c = from(&format!("{MIN}metrics_listen = \"127.0.0.1:9410\"\n")).unwrap();
        assert_eq!(c.metrics_listen, Some(([127, 0, 0, 1], 9410).into()));
        let e = from(&format!("{MIN}metrics_listen = \"9410\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("is not an address"), "{e}");
    }

    #[test]
    fn a_broker_or_the_nodes_of_a_cluster_and_a_broken_entry_refused_with_its_line() {
        let base = "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\n";
        let c = from(&format!("{base}broker = \"10.0.0.5:1884\"\n")).unwrap();
        assert_eq!(c.broker.unwrap().to_string(), "10.0.0.5:1884");
        let c = from(&format!("{base}broker = \"n1:1883,n2:1884\"\n")).unwrap();
        let b = c.broker.clone().expect("a list");
        assert_eq!(b.len(), 2);
        assert_eq!(b.get(1).port, 1884);
        assert_eq!(c.shell_config(b.clone()).broker, b);
        let e = from(&format!("{base}broker = \"n1:1883,n2:0\"\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("entry 2 of 2"), "{e}");
    }

    #[test]
    fn defaults() {
        let c = from(MIN).expect("valid");
        assert_eq!(c.site.as_str(), "site");
        assert_eq!(c.cdu.as_str(), "cdu-1");
        assert!(c.broker.is_none());
        assert!(c.demo_key);
        assert_eq!(c.key_id, 1);
        assert_eq!(c.period, Duration::from_secs(1));
        assert_eq!(c.lease, Duration::from_secs(30));
        assert_eq!(c.modbus_timeout, Duration::from_millis(500));
        assert_eq!(c.link, Link::Tcp("127.0.0.1:5020".parse().unwrap()));
        assert_eq!(c.map, RegisterMap::sim_cdu());
        assert_eq!(
            c.core,
            crate::site_figures::core_config(&SiteConfig::default()).unwrap()
        );
        assert!(c.hosts.is_empty());
        assert!(c.flash.is_none());
        assert!(c.ambient_c.is_none());
        c.shell_config(loopwarden_bus::BrokerAddr {
            host: "127.0.0.1".into(),
            port: 1883,
        })
        .validate()
        .expect("a valid shell config");
    }

    #[test]
    fn a_full_file() {
        let dir = tempfile::tempdir().unwrap();
        let keys = sign_key_file(dir.path(), "cdu-2", 4);
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 2\nhosts_per_rack = 3\n").unwrap();
        let map = dir.path().join("map.toml");
        std::fs::write(
            &map,
            include_str!("../../boards/cdus/sim-cdu.toml").replace("unit_id = 1", "unit_id = 7"),
        )
        .unwrap();
        let text = format!(
            "site = \"hall-1\"\ncdu = \"cdu-2\"\nbroker = \"10.0.0.5:1884\"\n\
             sign_key = {keys:?}\n\
             cdu_serial = \"/dev/ttyUSB0\"\nserial_baud = 9600\nserial_parity = \"even\"\n\
             serial_data_bits = 8\nserial_stop_bits = 2\n\
             register_map = {map:?}\nsite_figures = {figures:?}\n\
             hosts_pattern = \"r{{rack}}h{{host:02}}\"\n\
             period_ms = 500\nlease_ms = 6000\nmodbus_timeout_ms = 200\nambient_c = -5\n\
             console = \"/tmp/x.sock\"\nflash = \"/tmp/x.flash\"\n"
        );
        let c = from(&text).expect("valid");
        assert_eq!(c.site.as_str(), "hall-1");
        assert_eq!(c.broker.as_ref().unwrap().get(0).port, 1884);
        assert_eq!(c.key_id, 4, "the key id is the sign key file's");
        assert_eq!(c.key.as_bytes(), &[4; 32]);
        assert!(!c.demo_key);
        let Link::Rtu(line) = &c.link else {
            panic!("{:?}", c.link)
        };
        assert_eq!(line.baud, 9600);
        assert_eq!(line.parity, Parity::Even);
        assert_eq!(line.stop_bits, StopBits::Two);
        assert_eq!(c.map.unit_id, 7);
        assert_eq!(c.core.layout.racks, 2);
        let hosts: Vec<&str> = c.hosts.iter().map(|h| h.as_str()).collect();
        assert_eq!(
            hosts,
            ["r0h00", "r0h01", "r0h02", "r1h00", "r1h01", "r1h02"]
        );
        assert_eq!(c.period, Duration::from_millis(500));
        assert_eq!(c.lease, Duration::from_secs(6));
        assert_eq!(c.modbus_timeout, Duration::from_millis(200));
        assert_eq!(c.ambient_c, Some(-5.0));
        assert_eq!(
            c.core.margins.design_ambient_c, -5.0,
            "the fallback the core plans with when no sensor reads"
        );
        assert_eq!(c.flash.as_deref(), Some(Path::new("/tmp/x.flash")));
        // A list, and another CDU's key refused.
        let text = format!(
            "cdu = \"c\"\nsign_key = {keys:?}\ncdu_tcp = \"127.0.0.1:502\"\nhosts = [\"a\", \"b\"]\nbroker = \"10.0.0.5\"\n"
        );
        let e = from(&text).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("key of cdu/cdu-2"), "{e}");
        // With the site's key, nothing of the twin's is taken silently:
        // the map, the figures and a flash file (or volatile on purpose).
        let mut text = text.replace("cdu = \"c\"", "cdu = \"cdu-2\"");
        for (missing, line) in [
            ("register_map", format!("register_map = {map:?}\n")),
            ("site_figures", format!("site_figures = {figures:?}\n")),
            ("flash", "volatile_latch = true\n".to_string()),
        ] {
            let e = from(&text).unwrap_err();
            assert!(
                e.message.starts_with(&format!("{missing}: required")),
                "{e}"
            );
            text.push_str(&line);
        }
        let c = from(&text).expect("valid");
        assert_eq!(c.hosts.len(), 2);
        assert!(c.volatile_latch && c.flash.is_none());
        let e = from(&format!("{text}flash = \"/tmp/x.flash\"\n")).unwrap_err();
        assert!(e.message.contains("give one or the other"), "{e}");
        assert!(
            from(MIN).unwrap().volatile_latch,
            "the demonstration key runs the twin without a flash file"
        );
    }

    /// A sign key file of `cdu/<cdu>` with key id `id` (its seed all `id`).
    fn sign_key_file(dir: &Path, cdu: &str, id: u8) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let key = loopwarden_bus::keys::SignKey {
            node: loopwarden_protocol::NodeId::new(Role::Cdu, cdu).unwrap(),
            key_id: id,
            key: SigningKey::from_bytes(&[id; 32]),
        };
        let path = dir.join(format!("{cdu}.sign.key"));
        std::fs::write(&path, key.to_toml()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_refused_with_their_line() {
        let e = from(&format!("{MIN}perod_ms = 5\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("perod_ms"), "{e}");
        let e = from(&format!("{MIN}\nperiod_ms = \"fast\"\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        let e = from(&format!("{MIN}hosts = \"h1\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused_with_their_line() {
        let e = from(&format!("{MIN}\nperiod_ms = 50\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("cdu.toml line 6: period_ms = 50 is out of range"),
            "{e}"
        );
        let e = from(&format!("{MIN}period_ms = 1000\nlease_ms = 2000\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        let e = from(&format!("{MIN}modbus_timeout_ms = 5000\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        let e = from(&format!("{MIN}serial_parity = \"even\"\n")).unwrap_err();
        assert!(e.message.contains("cdu_serial"), "{e}");
        assert_eq!(e.line, Some(5), "{e}");
        let e = from(
            "cdu = \"c\"\ndemo_key = true\ncdu_serial = \"/dev/x\"\nserial_parity = \"mark\"\nembedded_broker = true\n",
        )
        .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        let e = from(&format!("{MIN}ambient_c = 99.5\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        let e = from("cdu = \"a b\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:1\"\n").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let many: Vec<String> = (0..17).map(|i| format!("\"h{i}\"")).collect();
        let e = from(&format!("{MIN}hosts = [{}]\n", many.join(", "))).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.message.contains("16 hosts"), "{e}");
        let e = from(&format!("{MIN}hosts = [\"a\", \"a\"]\n")).unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        let e = from(&format!("{MIN}hosts_pattern = \"h{{slot}}\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        let e = from(&format!("{MIN}hosts_pattern = \"h\"\n")).unwrap_err();
        assert!(e.message.contains("same id"), "{e}");
    }

    #[test]
    fn a_site_key_and_a_link_are_required() {
        let e = from("cdu = \"c\"\ncdu_tcp = \"127.0.0.1:1\"\n").unwrap_err();
        assert!(e.message.contains("--demo-key"), "{e}");
        let e = from("cdu = \"c\"\ndemo_key = true\n").unwrap_err();
        assert!(e.message.contains("CDU link"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 2\n\nhostz = 3\n").unwrap();
        let e = from(&format!("{MIN}site_figures = {figures:?}\n")).unwrap_err();
        assert_eq!(e.origin, figures.display().to_string());
        assert_eq!(e.line, Some(3), "{e}");
    }

    #[test]
    fn flags_override_the_file_and_are_named_in_errors() {
        let flags = Overrides {
            period_ms: Some(2000),
            hosts: vec!["x".into(), "y".into()],
            ..Default::default()
        };
        let c = resolve(
            Some(Path::new("a.toml")),
            &format!("{MIN}period_ms = 500\nhosts = [\"a\"]\n"),
            &flags,
        )
        .expect("valid");
        assert_eq!(c.period, Duration::from_millis(2000));
        assert_eq!(c.hosts[1].as_str(), "y");
        let flags = Overrides {
            modbus_timeout_ms: Some(5),
            ..Default::default()
        };
        let e = resolve(None, MIN, &flags).unwrap_err();
        assert_eq!(e.origin, "flag --modbus-timeout-ms", "{e}");
        // The common fields' flags, and the sign key flag.
        let flags = Overrides {
            common: common::CommonFlags {
                site: Some("hall-9".into()),
                ..Default::default()
            },
            sign_key: Some("/nonexistent/cdu-1.sign.key".into()),
            ..Default::default()
        };
        let e = resolve(None, MIN, &flags).unwrap_err();
        assert_eq!(e.origin, "flag --sign-key", "{e}");
        assert!(e.message.contains("exclude each other"), "{e}");
        let e = resolve(None, &MIN.replace("demo_key = true\n", ""), &flags).unwrap_err();
        assert_eq!(e.origin, "flag --sign-key", "{e}");
        let flags = Overrides {
            common: common::CommonFlags {
                site: Some("hall-9".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let c = resolve(None, MIN, &flags).expect("valid");
        assert_eq!(c.site.as_str(), "hall-9");
    }

    #[test]
    fn board_pins_and_gpio_chip_go_together_and_the_pin_map_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let pins = dir.path().join("pins.toml");
        let shipped = include_str!("../../boards/pins/sim-controller.toml");
        std::fs::write(&pins, shipped).unwrap();
        let both = format!("{MIN}board_pins = {pins:?}\ngpio_chip = \"/dev/gpiochip0\"\n");
        let c = from(&both).expect("valid");
        let b = c.board.expect("board pins configured");
        assert_eq!(b.chip, Path::new("/dev/gpiochip0"));
        assert_eq!(b.pins_file, pins);
        assert_eq!(b.pins, PinMap::sim_controller());
        assert!(from(MIN).unwrap().board.is_none(), "neither: no board");

        // One without the other: refused at its line.
        let e = from(&format!("{MIN}board_pins = {pins:?}\n")).unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("cdu.toml", Some(5)), "{e}");
        assert!(e.message.contains("needs gpio_chip"), "{e}");
        let e = from(&format!(
            "{MIN}period_ms = 500\ngpio_chip = \"/dev/gpiochip0\"\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("gpio_chip needs board_pins"), "{e}");
        // A flag completes the file, or stands alone.
        let flags = Overrides {
            gpio_chip: Some("/dev/gpiochip1".into()),
            ..Default::default()
        };
        let c = resolve(
            Some(Path::new("cdu.toml")),
            &format!("{MIN}board_pins = {pins:?}\n"),
            &flags,
        )
        .expect("valid");
        assert_eq!(c.board.unwrap().chip, Path::new("/dev/gpiochip1"));
        let e = resolve(None, MIN, &flags).unwrap_err();
        assert_eq!(e.origin, "flag --gpio-chip", "{e}");

        // The pin map's own errors name it, with the line when there is one.
        std::fs::write(
            &pins,
            shipped.replace("active_low = true", "activ_low = true"),
        )
        .unwrap();
        let e = from(&both).unwrap_err();
        assert_eq!(e.origin, pins.display().to_string(), "{e}");
        assert_eq!(e.line, Some(15), "{e}");
        assert!(e.message.contains("activ_low"), "{e}");
        std::fs::write(&pins, shipped.replace("line = 9", "line = 8")).unwrap();
        let e = from(&both).unwrap_err();
        assert!(e.message.contains("line 8 carries both"), "{e}");
        let missing = dir.path().join("none.toml");
        let e = from(&format!(
            "{MIN}gpio_chip = \"/dev/gpiochip0\"\nboard_pins = {missing:?}\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("cannot read"), "{e}");
        // More ropes than the hall has racks.
        std::fs::write(&pins, shipped).unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "racks = 2\nhosts_per_rack = 3\n").unwrap();
        let e = from(&format!("{both}site_figures = {figures:?}\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.message
                .contains("a leak rope for rack 2; the hall has racks 0 to 1"),
            "{e}"
        );
        // A rack without a rope is refused unless declared unprotected.
        let three = shipped
            .replacen(
                "signal = \"leak\"\nrack = 3\nline = 3\nactive_low = true\n",
                "",
                1,
            )
            .replacen(
                "[[input]]\nsignal = \"rope_fault\"\nrack = 3\nline = 7\nactive_low = false\n",
                "",
                1,
            )
            .replacen("[[input]]\n\n[[input]]", "[[input]]", 1);
        std::fs::write(&pins, &three).unwrap();
        let e = from(&both).unwrap_err();
        assert!(e.message.contains("gives rack 3 no leak rope"), "{e}");
        let c = from(&format!("{both}unprotected_racks = [3]\n")).unwrap();
        assert_eq!(c.core.layout.unprotected, 0b1000);
        let e = from(&format!("{both}unprotected_racks = [9]\n")).unwrap_err();
        assert!(
            e.message.contains("rack 9: the hall has racks 0 to 3"),
            "{e}"
        );
    }

    #[test]
    fn host_patterns() {
        assert_eq!(
            expand_hosts("gpu-{index:03}", 2, 2).unwrap(),
            ["gpu-000", "gpu-001", "gpu-002", "gpu-003"]
        );
        assert!(expand_hosts("h{index", 1, 2).is_err());
        assert!(expand_hosts("h{index:2}", 1, 2).is_err());
    }
}

//! The controller's configuration for `cooling-ctrl run` and `gateway`: a
//! TOML file, most fields overridable by a flag (not
//! `console_password_hash`, `unprotected_racks`, `facility_coordinator`,
//! `facility_cdus`, `northbound_writes_any_address`), checked as a whole
//! at start. [`load_for`] logs the protections switched off on purpose
//! and the warnings the configuration gives.
//!
//! A key the controller does not know, a value of the wrong type or a
//! value out of its range stops the start with the file, the line and the
//! reason; nothing is guessed. The fields (flags are the same names with
//! `-` for `_`):
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `site` | `site` (required with a site sign key) | the site (ident) |
//! | `cdu` | the machine's host name | this CDU's id (ident) |
//! | `broker` | none (required unless `embedded_broker = true`) | `host[:port]`, or the nodes of a broker cluster `host:port,host:port,…` (it fails over between them) |
//! | `embedded_broker` | false | run the embedded broker here on purpose (not with `broker`) |
//! | `broker_user`, `broker_password_file` | none | broker login, together |
//! | `tls_ca`, `tls_cert`, `tls_key` | none (plain MQTT) | TLS to the broker: the CA, this controller's certificate and key (PEM) |
//! | `tls_server_name` | the host of `broker` | the name the broker's certificate must carry |
//! | `keep_alive_s` | 5 | MQTT keep-alive, 1 to 600 s: the broker publishes the controller's last wills after 1.5 × this of silence |
//! | `json_presence` | true | keep the JSON `online` on a second connection whose last will says offline; `false` saves that connection, but the JSON tree then keeps saying online after a crash |
//! | `sign_key` | none (required) | this controller's Ed25519 sign key (`cdu1.sign.key` from `lwbus pki init`); it must be `cdu/<cdu>`'s |
//! | `demo_key` | false | sign with the public demonstration key (twin only: a build without the `twin` feature, as the packages', refuses it) |
//! | `keyring` | none: with `demo_key` the demonstration readers (any operator or facility system, the demonstration key), else none (every request to resend refused, said at start) | a keyring TOML (the hosts' format, of this site; others may not write it): the readers (operators, facility systems) that may ask this CDU to resend its logged events, those with `may = ["resend"]` |
//! | `cdu_tcp` | — | the CDU on Modbus TCP, `host:port` (an IPv6 address in brackets); a name is looked up when connecting (its addresses kept; looked up again when none answers), so one that does not resolve yet is retried as a connection that failed |
//! | `cdu_serial` | — | the CDU on Modbus RTU, a serial device |
//! | `serial_baud` | 19200 | 300 to 1000000; fast enough that the longest exchange with the CDU (the map's longest read, or a write) fits `modbus_timeout_ms`, else refused naming both |
//! | `serial_parity` | `none` | `none`, `even` or `odd` |
//! | `serial_data_bits` | 8 | 8: Modbus RTU; 7 (Modbus ASCII, which the controller does not speak) is refused |
//! | `serial_stop_bits` | 1 | 1 or 2 |
//! | `register_map` | none (required with a site sign key; the simulated CDU's with `demo_key`; the gateway needs none: its microcontroller carries its map) | a register map TOML; its `supply_setpoint` range must meet the site's setpoints (the lowest its dew point allows to `max_setpoint_c`), else refused naming both |
//! | `site_figures` | none (required with a site sign key; the twin's hall with `demo_key`) | a site figures TOML (`SiteConfig`); its `[loop] heartbeat_timeout_s`, where given, a finite number of seconds above 0; left out on a real CDU, warned of at start (the wait after a start takes 10 s) |
//! | `hosts` | none (one of `hosts` and `hosts_pattern` required with a site sign key; fewer than the hall's hosts is said at start) | host ids, rack-major |
//! | `hosts_pattern` | none | host ids from `{rack}`, `{host}`, `{index}` (`{index:02}` pads) |
//! | `period_ms` | 1000 | control period, 100 to 60000, and at most a third of the CDU's heartbeat timeout where the site figures give it (`[loop] heartbeat_timeout_s`; the twin's: 10 s), so the CDU never falls back between two heartbeat writes |
//! | `lease_ms` | 30000 | cap lease, at least 3 periods, at most 10 minutes (the hosts' default cap) |
//! | `modbus_timeout_ms` | 375 at a 1 s period (500 at most; at most three eighths of the period) | one Modbus request, 10 ms to three eighths of the period; on `cdu_serial` at least the longest exchange's time on the line (its characters and the 3.5-character gap at the line's bits a character and `serial_baud`) and 50 ms for the CDU to turn round |
//! | `ambient_c` | none (the core's design day, 35 °C) | fallback outdoor temperature, -50 to 60 °C; used only when no sensor reads (the CDU's `outdoor_temp`, or a value the BMS wrote in the last 300 s), and then the controller raises an alarm |
//! | `console` | `/run/loopwarden/cooling-ctrl.sock` or under `$XDG_RUNTIME_DIR`/`/tmp` | console socket |
//! | `console_max_connections` | 8 | connections the console socket keeps open at once, 1 to 256; one more is closed at once |
//! | `console_socket_idle_s` | 60 | a console connection that sends no request (or takes no answer) this long is closed, 1 to 3600 s |
//! | `console_serial` | none (no serial console) | the serial console's device (`/dev/ttyS1`; docs/cooling.md "Serial console") |
//! | `console_serial_baud` | 115200 | its speed, 8N1 |
//! | `console_password_hash` | none (`clear-leak`, `clear-pump` refused on the serial console) | the Argon2id hash of its password (`cooling-ctrl console-password`) |
//! | `console_idle_s` | 300 | seconds before an idle serial session is closed |
//! | `flash` | none (required with a site sign key, unless `volatile_latch`) | flash file: the event log, the outbox and the latched state |
//! | `volatile_latch` | false (true with `demo_key` and no `flash`) | run without a flash file on purpose: latched leaks and failed pumps are lost at every restart (said at every start) |
//! | `northbound` | none (no server) | the BMS's Modbus TCP server, `address:port`; an unspecified address (`0.0.0.0`, `::`) is warned of at start |
//! | `northbound_writes` | false | the BMS may write the bounded holding registers; refused on an unspecified address unless `northbound_writes_any_address` |
//! | `northbound_writes_any_address` | false | writes on an unspecified address on purpose (every network may write: no Modbus login); said at every start |
//! | `northbound_unit_id` | 1 (the northbound map's) | the Modbus unit id the northbound server answers, 1 to 247 (255 always reaches it; other ids get no answer) |
//! | `northbound_max_connections` | 16 | connections the northbound server keeps open at once, 1 to 256; one more is closed at once |
//! | `northbound_idle_s` | 120 | a northbound connection that sends no request this long is closed, 1 to 3600 s |
//! | `facility_coordinator` | none (this CDU's setpoint sets its facility water) | a hall of several CDUs (site figures' `cdus`): the CDU whose facility water plan every CDU follows |
//! | `facility_cdus` | none | the hall's CDUs in order; on the coordinator, itself among them |
//! | `metrics_listen` | none (not served) | Prometheus's `/metrics`, `IP:PORT` or `:PORT` |
//! | `board_pins` | none (leaks from the CDU's register only: a register map without `leak_inputs` is then refused unless every rack is in `unprotected_racks`) | the controller board's pin map TOML (`boards/pins/*.toml`) |
//! | `gpio_chip` | none | the GPIO character device of those pins, e.g. `/dev/gpiochip0` |
//! | `rope_fault_active_high` | false | takes a pin map whose `rope_fault` lines are `active_low = false` (refused otherwise: an unplugged harness would read dry, supervised); the file only; said at every start |
//! | `unprotected_racks` | none | racks run without a leak rope, by number; with `board_pins`, every other rack must have a rope in the pin map |
//!
//! `site`, `broker`, `embedded_broker`, `broker_user`,
//! `broker_password_file`, the `tls_` fields, `keep_alive_s`,
//! `json_presence`, `flash`, `console` and its bounds are
//! the fields every agent has, declared and
//! checked in `loopwarden_field::common`; the rest are the controller's.
//! Exactly one of `cdu_tcp` and `cdu_serial` (for `cooling-ctrl gateway`,
//! whose microcontroller reaches the CDU: at most one, checked and not
//! used; [`Purpose`]); at most one of `hosts` and
//! `hosts_pattern`; `board_pins` and `gpio_chip` together or neither. The
//! pin map is read and checked here; the chip is opened at start
//! (`crate::gpio`).
//!
//! This file holds the checked [`Config`] and [`resolve`], which checks
//! the sections in turn, each in its own submodule: the file and flags as
//! written (`file`), the sign key (`key`), the readers' keyring
//! (`keyring`), the CDU link (`link`), the
//! plant: register map, site figures, hosts and the hall's CDUs (`plant`),
//! the timings (`timings`), the northbound server (`northbound`) and the
//! board's pins (`board`).
//!
//! Glossary:
//! - *origin*: where a value came from (a line of the file, a flag, the
//!   default), so an error points at it.

mod board;
mod file;
mod key;
mod keyring;
mod link;
mod northbound;
mod plant;
mod timings;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::string::String;
use std::time::Duration;
use std::vec::Vec;

use loopwarden_boards::modbus_map::fit::check_serial_unit_id;
use loopwarden_boards::modbus_map::RegisterMap;
use loopwarden_field::common;
pub use loopwarden_field::config::ConfigError;
use loopwarden_field::config::{self as field, local_host_name, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::auth::{Signer, SigningKey};
use loopwarden_protocol::Ident;

use crate::modbus::Link;
use crate::shell::ShellConfig;
use cooling_core::CoreConfig;

pub use board::BoardConfig;
pub use file::{FileConfig, Overrides};
pub use keyring::demo_readers;
pub use plant::expand_hosts;

use board::board_pins;
use key::sign_key;
use keyring::readers;
use link::{cdu_link, cdu_link_if_given, wire_fits};
use northbound::{northbound, Northbound};
use plant::{
    core_config, facility_role, hosts, hosts_cover, register_map, register_map_if_given,
    unprotected,
};
use timings::timings;

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
    /// The readers that may ask this CDU to resend its logged events:
    /// the keyring's signers, the demonstration readers with the
    /// demonstration key and no keyring, else none.
    pub readers: Vec<Signer>,
    /// How the CDU is reached; `None` only for the gateway, whose
    /// microcontroller reaches it ([`Purpose::Gateway`]).
    pub link: Option<Link>,
    /// Its register map; `None` only for the gateway given none (its
    /// microcontroller carries the map it was built with).
    pub map: Option<RegisterMap>,
    /// The control core's configuration (from the site figures).
    pub core: CoreConfig,
    /// Host ids, rack-major.
    pub hosts: Vec<Ident>,
    /// Control period.
    pub period: Duration,
    /// The CDU's heartbeat timeout where the site figures give it
    /// (`[loop] heartbeat_timeout_s`; the twin's with the demonstration
    /// key): after a start the heartbeat waits at most this long for a
    /// read-back that reads the safety settings held.
    pub heartbeat_timeout: Option<Duration>,
    /// Cap lease duration.
    pub lease: Duration,
    /// One Modbus request's timeout.
    pub modbus_timeout: Duration,
    /// Fallback outdoor temperature, °C (already in `core` as its
    /// `margins.design_ambient_c`); `None`: the core's design day.
    pub ambient_c: Option<f32>,
    /// Console socket.
    pub console: PathBuf,
    /// Its bounds: connections at once, idle time.
    pub console_limits: loopwarden_field::listen::Limits,
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
    /// The northbound server's bounds: connections at once, idle time.
    pub northbound_limits: loopwarden_field::listen::Limits,
    /// Where `/metrics` is served; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// The board's pins on a GPIO chip; `None`: no board pins.
    pub board: Option<BoardConfig>,
    /// This CDU's part in a hall of several CDUs; `None`: its setpoint
    /// alone sets its facility water.
    pub facility: Option<crate::facility::FacilityRole>,
    /// The protections switched off on purpose, as lines for the log at
    /// every start (`northbound_writes_any_address`,
    /// `rope_fault_active_high`).
    pub opt_outs: Vec<String>,
    /// What the configuration allows but says at start (fewer host ids
    /// than the hall's hosts, a northbound server on every interface).
    pub warnings: Vec<String>,
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
        c.heartbeat_timeout = self.heartbeat_timeout;
        c
    }
}

/// What a configuration is read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `cooling-ctrl run`: the controller drives the CDU over Modbus, so
    /// its link is required.
    Run,
    /// `cooling-ctrl gateway`: a microcontroller drives the CDU, and the
    /// gateway carries its words to the bus; a CDU link given is checked,
    /// none is needed.
    Gateway,
}

/// Reads `path` (if any), applies `flags` and checks the result, for
/// `cooling-ctrl run`.
pub fn load(path: Option<&Path>, flags: &Overrides) -> Result<Config, ConfigError> {
    load_for(path, flags, Purpose::Run)
}

impl Config {
    /// The protections switched off on purpose, each as its setting and
    /// what it costs: the opt-outs ([`Config::opt_outs`]), and running
    /// without a flash file (`volatile_latch`). `ctl status` and
    /// `/metrics` (`loopwarden_protection_off{key}`) show them.
    pub fn protections_off(&self) -> Vec<String> {
        let volatile = self.volatile_latch.then(|| {
            "volatile_latch = true: no flash file; latched leaks, failed pumps and the lead pump are lost at every restart".to_string()
        });
        self.opt_outs.iter().cloned().chain(volatile).collect()
    }
}

/// As [`load`], for `purpose`; the configuration's opt-outs and
/// warnings are logged.
pub fn load_for(
    path: Option<&Path>,
    flags: &Overrides,
    purpose: Purpose,
) -> Result<Config, ConfigError> {
    let text = field::read_optional(path)?;
    let config = resolve_for(path, &text, flags, purpose)?;
    for o in &config.opt_outs {
        tracing::warn!("protection switched off on purpose: {o}");
    }
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    Ok(config)
}

/// Checks a configuration given as text (the file at `path`) and flags:
/// the common fields, then this CDU, its key, its readers' keyring, its
/// link, the plant (register map and site figures), the hosts, the
/// timings, the northbound server and the board's pins, each by its own
/// function below.
pub fn resolve(path: Option<&Path>, text: &str, flags: &Overrides) -> Result<Config, ConfigError> {
    resolve_for(path, text, flags, Purpose::Run)
}

/// As [`resolve`], for `purpose`.
pub fn resolve_for(
    path: Option<&Path>,
    text: &str,
    flags: &Overrides,
    purpose: Purpose,
) -> Result<Config, ConfigError> {
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
    let readers = readers(&src, &file, flags, &common.site, key.demo)?;
    broker_and_site(&src, &common, purpose, key.demo)?;
    let (link, map) = link_and_map(&src, &file, flags, purpose, key.demo)?;
    console_apart(&src, &common, link.as_ref())?;
    let plant = core_config(&src, &file, flags, key.demo)?;
    let (mut core, heartbeat) = (plant.core, plant.heartbeat);
    let no_heartbeat = plant.no_heartbeat.filter(|_| purpose == Purpose::Run);
    if let Some(m) = &map {
        map_fits(&src, flags, m, &core)?;
    }
    let volatile_latch = volatile_latch(
        &src,
        &file,
        flags,
        purpose,
        common.flash.is_some(),
        key.demo,
    )?;
    core.layout.unprotected = unprotected(&src, &file, &core)?;
    let hosts = hosts(&src, &file, flags, &core)?;
    let hosts_warning = hosts_cover(&src, &hosts, &core, key.demo)?;
    let timings = timings(&src, &file, flags, heartbeat.as_ref())?;
    let timeout = timings.modbus_timeout;
    let wire = (link.as_ref(), map.as_ref());
    wire_fits(&src, &file, flags, wire, timeout, heartbeat.as_ref())?;
    // The configured outdoor temperature is the fallback the core plans
    // with when no sensor reads, not a reading.
    if let Some(a) = timings.ambient_c {
        core.margins.design_ambient_c = a;
    }
    let Northbound {
        addr: northbound,
        writes: northbound_writes,
        unit_id: northbound_unit_id,
        limits: northbound_limits,
        opt_out,
        warning,
    } = northbound(&src, &file, flags)?;
    if northbound.is_some() {
        northbound_ceiling(&src, &file, flags, &core)?;
    }
    let facility = facility_role(&src, &file, &cdu, &core)?;
    let metrics_listen = metrics_listen(&src, &file, flags)?;
    let run_map = map.as_ref().filter(|_| purpose == Purpose::Run);
    let (board, rope_opt_out) = board_pins(&src, &file, flags, (&core, purpose), run_map)?;

    let heartbeat_timeout =
        (heartbeat.as_ref()).map(|h| Duration::from_millis((h.s * 1000.0).max(0.0) as u64));
    // Last: a file not filled in yet is refused for what it lacks first.
    common::check_tls_identity(&src, &common, "CDU", &cdu)?;
    Ok(Config {
        heartbeat_timeout,
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
        readers,
        link,
        map,
        core,
        hosts,
        period: timings.period,
        lease: timings.lease,
        modbus_timeout: timings.modbus_timeout,
        ambient_c: timings.ambient_c,
        console: common.console,
        console_limits: common.console_limits,
        serial: common.serial,
        flash: common.flash,
        volatile_latch,
        northbound,
        northbound_writes,
        northbound_unit_id,
        northbound_limits,
        facility,
        metrics_listen,
        board,
        opt_outs: opt_out.into_iter().chain(rope_opt_out).collect(),
        warnings: (hosts_warning.into_iter().chain(warning))
            .chain(no_heartbeat)
            .collect(),
    })
}

/// The broker and the site a controller needs: whatever its key, a
/// controller drives a CDU over Modbus, which may be a real one, so it
/// never starts a broker unasked; the demonstration key runs the twin,
/// whose site is the default one, so only a site sign key needs `site`.
fn broker_and_site(
    src: &Sources,
    common: &common::Common,
    purpose: Purpose,
    demo: bool,
) -> Result<(), ConfigError> {
    let production = Some(match (purpose, demo) {
        (Purpose::Gateway, _) => "a CDU's gateway",
        (Purpose::Run, true) => "a CDU link (even with the demonstration key)",
        (Purpose::Run, false) => "a CDU link with a site sign key",
    });
    common::check_broker(src, common, production)?;
    let site_keyed = (!demo).then_some("a controller with a site sign key");
    common::require_site(src, common, site_keyed)
}

/// The link to the CDU and its register map: both required to run a CDU,
/// either or neither given to a gateway. On a serial line the map's unit
/// id must address the CDU alone.
/// The serial console and the CDU's Modbus RTU line on one device: the
/// first to open it holds it alone, so the controller would never reach
/// its CDU (or the console would write onto the RS-485 line). Refused,
/// naming `console_serial`.
fn console_apart(
    src: &Sources,
    common: &common::Common,
    link: Option<&Link>,
) -> Result<(), ConfigError> {
    let (Some(serial), Some(Link::Rtu(line))) = (&common.serial, link) else {
        return Ok(());
    };
    let (console, cdu) = (serial.port.as_path(), Path::new(&line.path));
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(console, cdu) {
        return Err(src.error(
            None,
            "console_serial",
            format!(
                "console_serial {} is the CDU's Modbus line (cdu_serial {}): the console and the CDU need a serial device each",
                console.display(),
                line.path
            ),
        ));
    }
    Ok(())
}

fn link_and_map(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    purpose: Purpose,
    demo_key: bool,
) -> Result<(Option<Link>, Option<RegisterMap>), ConfigError> {
    let link = match purpose {
        Purpose::Run => Some(cdu_link(src, file, flags)?),
        Purpose::Gateway => cdu_link_if_given(src, file, flags)?,
    };
    let map = match purpose {
        Purpose::Run => Some(register_map(src, file, flags, demo_key)?),
        Purpose::Gateway => register_map_if_given(src, file, flags)?,
    };
    if let (Some(Link::Rtu(_)), Some(m)) = (&link, &map) {
        check_serial_unit_id(m.unit_id).map_err(|e| {
            let flag = flags.register_map.is_some().then_some("register-map");
            let what = format!("the register map of {:?}: {e}", m.model);
            src.error(flag, "register_map", what)
        })?;
    }
    Ok((link, map))
}

/// A map the controller does not fit (a misspelt or missing safety
/// setting, a unit it does not take, a range that leaves out what it
/// writes, a setpoint range that misses the site's, the lowest its dew
/// point allows to its highest, so the core's limits tightened to the
/// map's leave no setpoint) is a bad file like any other: refused before
/// anything runs, naming both ranges, and not first at the start of the
/// decision path, which exits to be restarted.
fn map_fits(
    src: &Sources,
    flags: &Overrides,
    m: &RegisterMap,
    core: &CoreConfig,
) -> Result<(), ConfigError> {
    let refuse = |e: &dyn std::fmt::Display| {
        let flag = flags.register_map.is_some().then_some("register-map");
        let what = format!("the register map of {:?} does not fit: {e}", m.model);
        src.error(flag, "register_map", what)
    };
    crate::modbus::check_map(m, core.layout.racks).map_err(|e| refuse(&e))?;
    let limits = crate::modbus::map_limits(m);
    let mut tightened = *core;
    cooling_decide::writes::tighten(&mut tightened, &limits).map_err(|e| refuse(&e))?;
    Ok(())
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

/// `volatile_latch`: whether the controller runs without a flash file on
/// purpose. Without `flash`, a site-keyed controller must be told so; the
/// demonstration key runs the twin, where it is the default.
fn volatile_latch(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    purpose: Purpose,
    flash: bool,
    demo: bool,
) -> Result<bool, ConfigError> {
    let flag = flags.volatile_latch.then_some(true);
    let (given, from) = pick!(flag, file.volatile_latch, "volatile-latch");
    let kept = match purpose {
        Purpose::Run => "the latched state (leaks, failed pumps) must survive a restart",
        Purpose::Gateway => {
            "the gateway's event log, outbox and sequence floor must survive a restart (the microcontroller keeps the latched state in its own flash)"
        }
    };
    match (given.unwrap_or(false), flash) {
        (true, true) => Err(src.error(
            from,
            "volatile_latch",
            "volatile_latch = true with a flash file: give one or the other".into(),
        )),
        (false, false) if !demo => Err(src.error(
            None,
            "flash",
            format!("flash: required with a site sign key: {kept}; give a flash file, or volatile_latch = true to run without one on purpose"),
        )),
        (v, _) => Ok(v || !flash),
    }
}

pub use loopwarden_bus::keys::read_sign_key;

/// With a northbound server: every setpoint ceiling that can be in force
/// must fit the map's `setpoint_ceiling` register, else it reads the
/// nearest end of the register's range, not what is in force. In force
/// is the site's highest setpoint until the BMS writes one, and then the
/// written value held within the site's setpoints, so the highest
/// setpoint inside the register's range is what it takes.
fn northbound_ceiling(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    core: &CoreConfig,
) -> Result<(), ConfigError> {
    let map = crate::northbound::northbound_map();
    let Some(r) = map.get("setpoint_ceiling") else {
        return Ok(());
    };
    let (lo, hi) = (r.min.unwrap_or(f64::MIN), r.max.unwrap_or(f64::MAX));
    let (min, max) = (
        f64::from(core.cdu.min_setpoint_c),
        f64::from(core.cdu.max_setpoint_c),
    );
    if (lo..=hi).contains(&max) {
        return Ok(());
    }
    let (_, flag) = pick!(flags.northbound, file.northbound, "northbound");
    Err(src.error(
        flag,
        "northbound",
        format!(
            "the site's setpoint range, {min:.2} to {max:.2} °C (site_figures), does not fit \
             the northbound map's setpoint_ceiling register, {lo:.2} to {hi:.2} °C: the BMS \
             would read {:.2} °C while a ceiling of {max:.2} °C is in force; bring \
             max_setpoint_c in the site figures' [loop] within {lo:.2} to {hi:.2} °C, or \
             serve no northbound",
            max.clamp(lo, hi)
        ),
    ))
}

/// `/run/loopwarden/cooling-ctrl.sock` where it can be made (root), else
/// `loopwarden-cooling-ctrl.sock` under `$XDG_RUNTIME_DIR` or `/tmp`. The
/// same for `run` and `ctl`, so `ctl` finds the controller without flags.
pub fn default_console() -> PathBuf {
    field::default_socket("cooling-ctrl", ".probe-cooling-ctrl")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modbus::{Parity, StopBits};
    use loopwarden_boards::pins::PinMap;
    use loopwarden_boards::site::SiteConfig;
    use loopwarden_protocol::Role;
    use std::vec;

    fn from(text: &str) -> Result<Config, ConfigError> {
        resolve(Some(Path::new("cdu.toml")), text, &Overrides::default())
    }

    const MIN: &str =
        "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\nembedded_broker = true\n";

    #[test]
    fn the_gateway_needs_no_cdu_link_and_checks_one_given() {
        let bare = "cdu = \"cdu-1\"\ndemo_key = true\nembedded_broker = true\n";
        let e = from(bare).unwrap_err();
        assert!(e.message.contains("a CDU link is required"), "{e}");
        let gateway = |text: &str| {
            let path = Some(Path::new("cdu.toml"));
            resolve_for(path, text, &Overrides::default(), Purpose::Gateway)
        };
        assert_eq!(gateway(bare).unwrap().link, None);
        assert_eq!(gateway(MIN).unwrap().link, from(MIN).unwrap().link);
        let e = gateway(&format!("{bare}cdu_tcp = \"no port\"\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("expected host:port"), "{e}");
    }

    /// A name is looked up when connecting, not in the file: one that
    /// does not resolve yet (DNS not up after a power restore) is no bad
    /// file. Only the form is refused.
    #[test]
    fn the_cdus_tcp_address_is_checked_for_its_form_and_not_looked_up() {
        let bare = "cdu = \"cdu-1\"\ndemo_key = true\nembedded_broker = true\n";
        let with = |addr: &str| from(&format!("{bare}cdu_tcp = {addr:?}\n"));
        let c = with("no-such-host.invalid:502").expect("a name not resolving is fine");
        assert_eq!(
            c.link,
            Some(Link::Tcp("no-such-host.invalid:502".parse().unwrap()))
        );
        assert!(with("[fd00::20]:502").is_ok());
        assert!(
            with("[fe80::1%2]:502").is_ok(),
            "a link-local address with its scope"
        );
        for (bad, why) in [
            ("cdu1", "no port"),
            ("cdu1:0", "port \"0\" is not 1 to 65535"),
            ("cdu1:70000", "is not 1 to 65535"),
            ("fd00::20:502", "an IPv6 address goes in brackets"),
            ("[fd00::zz]:502", "is not an IPv6 address"),
            (
                "[fe80::1%eth0]:502",
                "give the scope as the interface's number",
            ),
            ("cdu 1:502", "is not a host name"),
            (":502", "is not a host name"),
        ] {
            let e = with(bad).expect_err(bad);
            assert!(e.message.contains(why) && e.line == Some(4), "{bad}: {e}");
        }
    }

    #[test]
    fn the_northbound_bounds_default_read_refuse_with_their_line_and_need_an_address() {
        let nb = format!("{MIN}northbound = \"127.0.0.1:5502\"\n");
        let c = from(&nb).unwrap();
        assert_eq!(c.northbound_limits, crate::northbound::LIMITS);
        let l = c.northbound_limits;
        assert_eq!((l.max_connections, l.idle.as_secs()), (16, 120));
        let c = from(&format!(
            "{nb}northbound_max_connections = 2\nnorthbound_idle_s = 5\n"
        ))
        .unwrap();
        let l = c.northbound_limits;
        assert_eq!((l.max_connections, l.idle.as_secs()), (2, 5));
        let e = from(&format!("{nb}northbound_max_connections = 0\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(
            e.message
                .contains("northbound_max_connections = 0 is out of range (1 to 256)"),
            "{e}"
        );
        let e = from(&format!("{nb}northbound_idle_s = 86400\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("(1 to 3600 s)"), "{e}");
        let e = from(&format!("{MIN}northbound_idle_s = 30\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert_eq!(
            e.message,
            "northbound_idle_s needs a northbound address to serve"
        );
        // The console's bounds are the common fields'.
        let c = from(&format!("{MIN}console_max_connections = 3\n")).unwrap();
        assert_eq!(c.console_limits.max_connections, 3);
    }

    #[test]
    fn northbound_writes_on_every_interface_need_their_opt_out_and_are_said() {
        // A named address: nothing to say.
        let c = from(&format!(
            "{MIN}northbound = \"127.0.0.1:5502\"\nnorthbound_writes = true\n"
        ))
        .unwrap();
        assert!(c.northbound_writes && c.opt_outs.is_empty() && c.warnings.is_empty());
        for every in ["0.0.0.0:502", "[::]:502"] {
            let nb = format!("{MIN}northbound = \"{every}\"\n");
            // Read only: allowed, and warned of.
            let c = from(&nb).unwrap();
            assert!(c.opt_outs.is_empty(), "{:?}", c.opt_outs);
            assert_eq!(c.warnings.len(), 1, "{every}");
            assert!(
                c.warnings[0].contains("every interface"),
                "{:?}",
                c.warnings
            );
            // Writes: refused at the address's line, naming the opt-out.
            let e = from(&format!("{nb}northbound_writes = true\n")).unwrap_err();
            assert_eq!(e.line, Some(5), "{e}");
            for said in ["no login", "northbound_writes_any_address = true"] {
                assert!(e.message.contains(said), "{said}: {e}");
            }
            // The opt-out: taken, and said as one.
            let c = from(&format!(
                "{nb}northbound_writes = true\nnorthbound_writes_any_address = true\n"
            ))
            .unwrap();
            assert!(c.northbound_writes && c.warnings.is_empty());
            assert_eq!(c.opt_outs.len(), 1, "{every}");
            assert!(
                c.opt_outs[0].starts_with("northbound_writes_any_address = true"),
                "{:?}",
                c.opt_outs
            );
        }
        // The opt-out where it opts out of nothing is refused.
        for text in [
            format!("{MIN}northbound_writes_any_address = true\n"),
            format!("{MIN}northbound = \"0.0.0.0:502\"\nnorthbound_writes_any_address = true\n"),
            format!(
                "{MIN}northbound = \"127.0.0.1:502\"\nnorthbound_writes = true\n\
                 northbound_writes_any_address = true\n"
            ),
        ] {
            let e = from(&text).unwrap_err();
            assert!(e.message.contains("goes only with"), "{e}");
            assert_eq!(e.line, text.lines().count().into(), "{e}");
        }
        // The writes flag over a file's address is refused too.
        let flags = Overrides {
            northbound_writes: Some(true),
            ..Default::default()
        };
        let nb = format!("{MIN}northbound = \"0.0.0.0:502\"\n");
        let e = resolve(Some(Path::new("cdu.toml")), &nb, &flags).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
    }

    #[test]
    fn a_site_setpoint_range_the_northbound_ceiling_register_cannot_hold_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let figures = dir.path().join("site.toml");
        std::fs::write(&figures, "[loop]\nmax_setpoint_c = 48.0\n").unwrap();
        let hot = format!("{MIN}site_figures = {figures:?}\n");
        // Without a northbound server, nothing reads the register.
        assert_eq!(from(&hot).unwrap().core.cdu.max_setpoint_c, 48.0);
        let e = from(&format!("{hot}northbound = \"127.0.0.1:5502\"\n")).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        for named in ["to 48.00 °C", "20.00 to 45.00 °C", "setpoint_ceiling"] {
            assert!(e.message.contains(named), "{named}: {e}");
        }
        // The shipped range fits.
        from(&format!("{MIN}northbound = \"127.0.0.1:5502\"\n")).unwrap();
    }

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
        assert_eq!(c.modbus_timeout, Duration::from_millis(375));
        assert_eq!(c.link, Some(Link::Tcp("127.0.0.1:5020".parse().unwrap())));
        assert_eq!(c.map, Some(RegisterMap::sim_cdu()));
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

    /// A map the controller does not fit is a bad file: refused with the
    /// line of `register_map` (exit 2, not restarted), not at the first
    /// connection (exit 1, restarted for ever).
    #[test]
    fn a_register_map_the_controller_does_not_fit_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("map.toml");
        let sim = include_str!("../../boards/cdus/sim-cdu.toml");
        let base = format!(
            "cdu = \"c\"\ndemo_key = true\nembedded_broker = true\nregister_map = {map:?}\ncdu_tcp = \"127.0.0.1:502\"\n"
        );
        std::fs::write(&map, sim).unwrap();
        assert!(from(&base).is_ok(), "the simulated CDU's map fits");
        std::fs::write(
            &map,
            sim.replace("name = \"heartbeat\"", "name = \"heartbeet\""),
        )
        .unwrap();
        let e = from(&base).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(
            e.message.contains("does not fit") && e.message.contains("heartbeet"),
            "{e}"
        );
    }

    /// A map whose setpoint range misses the site's (the lowest its dew
    /// point allows to its highest) leaves the core no setpoint: a bad
    /// file, refused at the line of `register_map` naming both ranges
    /// (exit 2), not at the start of the decision path (exit 1, restarted
    /// for ever).
    #[test]
    fn a_register_map_whose_setpoints_miss_the_sites_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let (figures, map) = (dir.path().join("site.toml"), dir.path().join("map.toml"));
        // Dew point 25 °C: the lowest setpoint is 27 °C.
        std::fs::write(&figures, "[loop]\ndew_point_c = 25.0\n").unwrap();
        let sim = include_str!("../../boards/cdus/sim-cdu.toml");
        let text = format!("{MIN}site_figures = {figures:?}\nregister_map = {map:?}\n");
        std::fs::write(&map, sim).unwrap();
        let c = from(&text).expect("the simulated CDU's map meets the site's setpoints");
        assert_eq!(c.core.cdu.min_setpoint_c, 27.0);
        let cool = "min = 17.0\nmax = 25.0\ndescription = \"supply temperature setpoint";
        let cool = sim.replacen(
            "min = 17.0\nmax = 45.0\ndescription = \"supply temperature setpoint",
            cool,
            1,
        );
        assert_ne!(cool, sim, "the map's setpoint range is changed");
        std::fs::write(&map, cool).unwrap();
        let e = from(&text).unwrap_err();
        assert_eq!(e.line, Some(6), "{e}");
        for named in [
            "register map of \"",
            "17.0 to 25.0 °C",
            "from 27.0 °C",
            "to 45.0 °C",
        ] {
            assert!(e.message.contains(named), "{named}: {e}");
        }
    }

    /// On a serial line, a map whose unit id is the broadcast (0) or a
    /// reserved one is refused, naming the map; over TCP the same map goes.
    #[test]
    fn a_serial_cdu_needs_a_unit_id_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("map.toml");
        let sim = include_str!("../../boards/cdus/sim-cdu.toml");
        let base = format!(
            "cdu = \"c\"\ndemo_key = true\nembedded_broker = true\nregister_map = {map:?}\n"
        );
        for (id, serial, refused) in [
            (0, true, true),
            (248, true, true),
            (0, false, false),
            (7, true, false),
        ] {
            std::fs::write(&map, sim.replace("unit_id = 1", &format!("unit_id = {id}"))).unwrap();
            let link = if serial {
                "cdu_serial = \"/dev/ttyUSB0\"\n"
            } else {
                "cdu_tcp = \"127.0.0.1:502\"\n"
            };
            let got = from(&format!("{base}{link}"));
            match (refused, got) {
                (true, Err(e)) => {
                    assert_eq!(e.line, Some(4), "{e}");
                    assert!(
                        e.message
                            .contains(&format!("unit_id {id}: on a serial line")),
                        "{e}"
                    );
                }
                (false, Ok(c)) => assert_eq!(c.map.map(|m| m.unit_id), Some(id)),
                (refused, got) => {
                    panic!("unit {id}, serial {serial}: refused {refused}, got {got:?}")
                }
            }
        }
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
             period_ms = 500\nlease_ms = 6000\nmodbus_timeout_ms = 150\nambient_c = -5\n\
             console = \"/tmp/x.sock\"\nflash = \"/tmp/x.flash\"\n"
        );
        let c = from(&text).expect("valid");
        assert_eq!(c.site.as_str(), "hall-1");
        assert_eq!(c.broker.as_ref().unwrap().get(0).port, 1884);
        assert_eq!(c.key_id, 4, "the key id is the sign key file's");
        assert_eq!(c.key.as_bytes(), &[4; 32]);
        assert!(!c.demo_key);
        let Some(Link::Rtu(line)) = &c.link else {
            panic!("{:?}", c.link)
        };
        assert_eq!(line.baud, 9600);
        assert_eq!(line.parity, Parity::Even);
        assert_eq!(line.stop_bits, StopBits::Two);
        assert_eq!(c.map.map(|m| m.unit_id), Some(7));
        assert_eq!(c.core.layout.racks, 2);
        let hosts: Vec<&str> = c.hosts.iter().map(|h| h.as_str()).collect();
        assert_eq!(
            hosts,
            ["r0h00", "r0h01", "r0h02", "r1h00", "r1h01", "r1h02"]
        );
        assert_eq!(c.period, Duration::from_millis(500));
        assert_eq!(c.lease, Duration::from_secs(6));
        assert_eq!(c.modbus_timeout, Duration::from_millis(150));
        assert_eq!(c.ambient_c, Some(-5.0));
        assert_eq!(
            c.core.margins.design_ambient_c, -5.0,
            "the fallback the core plans with when no sensor reads"
        );
        assert_eq!(c.flash.as_deref(), Some(Path::new("/tmp/x.flash")));
        // Figures that leave out the real CDU's heartbeat timeout: warned
        // of at start, naming the key, the file and the bound taken.
        let said: Vec<&String> = (c.warnings.iter())
            .filter(|w| w.contains("heartbeat_timeout_s"))
            .collect();
        assert_eq!(said.len(), 1, "{:?}", c.warnings);
        let said = said[0];
        assert!(
            said.contains(&figures.display().to_string()) && said.contains("at most 10 s"),
            "{said}"
        );
        std::fs::write(
            &figures,
            "racks = 2\nhosts_per_rack = 3\n[loop]\nheartbeat_timeout_s = 10\n",
        )
        .unwrap();
        let c = from(&text).expect("valid");
        assert!(!c.warnings.iter().any(|w| w.contains("heartbeat_timeout_s")));
        // A list, and another CDU's key refused.
        let text = format!(
            "site = \"hall-1\"\ncdu = \"c\"\nsign_key = {keys:?}\ncdu_tcp = \"127.0.0.1:502\"\nhosts = [\"a\", \"b\"]\nbroker = \"10.0.0.5\"\n"
        );
        let e = from(&text).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
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
        // The gateway needs no register map (its microcontroller carries
        // one), and its flash keeps its own log, not a latch.
        let gateway = |text: &str| {
            let path = Some(Path::new("cdu.toml"));
            resolve_for(path, text, &Overrides::default(), Purpose::Gateway)
        };
        let text = text
            .replace(&format!("register_map = {map:?}\n"), "")
            .replace("volatile_latch = true\n", "");
        let e = gateway(&text).unwrap_err();
        assert!(e.message.starts_with("flash: required"), "{e}");
        assert!(e.message.contains("the gateway's event log"), "{e}");
        let c = gateway(&format!("{text}flash = \"/tmp/x.flash\"\n")).expect("valid");
        assert_eq!(c.map, None);
        let c = gateway(&format!(
            "{text}flash = \"/tmp/x.flash\"\nregister_map = {map:?}\n"
        ))
        .expect("valid");
        assert_eq!(c.map.map(|m| m.unit_id), Some(7), "a map given is read");
    }

    /// A controller with the site's key publishes where the site's broker
    /// lets its hosts hear it, and leases the hosts it cools: without
    /// `site`, or without any host, it is refused; with fewer hosts than
    /// the hall's it starts and says so.
    #[test]
    fn a_site_keyed_controller_needs_its_site_and_its_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let keys = sign_key_file(dir.path(), "cdu-2", 4);
        let figures = dir.path().join("site.toml");
        let loop_ = "[loop]\nheartbeat_timeout_s = 10\n";
        std::fs::write(&figures, format!("racks = 2\nhosts_per_rack = 3\n{loop_}")).unwrap();
        let map = dir.path().join("map.toml");
        std::fs::write(&map, include_str!("../../boards/cdus/sim-cdu.toml")).unwrap();
        let base = format!(
            "cdu = \"cdu-2\"\nbroker = \"10.0.0.5\"\nsign_key = {keys:?}\n\
             cdu_tcp = \"127.0.0.1:502\"\nregister_map = {map:?}\nsite_figures = {figures:?}\n\
             volatile_latch = true\n"
        );
        let e = from(&base).unwrap_err();
        assert!(
            e.message
                .starts_with("site is required on a controller with a site sign key"),
            "{e}"
        );
        let sited = format!("site = \"hall-1\"\n{base}");
        let e = from(&sited).unwrap_err();
        assert!(
            e.message
                .starts_with("hosts: required with a site sign key")
                && e.message.contains("hosts_pattern"),
            "{e}"
        );
        let c = from(&format!("{sited}hosts = [\"a\", \"b\"]\n")).expect("valid");
        assert_eq!(c.hosts.len(), 2);
        assert!(
            c.warnings
                .iter()
                .any(|w| w.starts_with("hosts: 2 host ids for a hall of 6 hosts")),
            "{:?}",
            c.warnings
        );
        let c = from(&format!("{sited}hosts_pattern = \"r{{rack}}h{{host}}\"\n")).expect("valid");
        assert_eq!(c.hosts.len(), 6);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let demo = from(MIN).expect("the twin keeps its default site and needs no hosts");
        assert_eq!(demo.site.as_str(), "site");
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
        // The serial console on the CDU's Modbus line: refused at its line.
        let e = from(
            "cdu = \"c\"\ndemo_key = true\ncdu_serial = \"/dev/ttyUSB0\"\nembedded_broker = true\nconsole_serial = \"/dev/ttyUSB0\"\n",
        )
        .unwrap_err();
        assert!(
            e.message.contains("console_serial") && e.message.contains("CDU's Modbus line"),
            "{e}"
        );
        assert_eq!(e.line, Some(5), "{e}");
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
        // The simulated map's rope_fault lines are active high: taken with
        // the opt-out (see the next test).
        let both = format!(
            "{MIN}board_pins = {pins:?}\ngpio_chip = \"/dev/gpiochip0\"\nrope_fault_active_high = true\n"
        );
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
            &format!("{MIN}board_pins = {pins:?}\nrope_fault_active_high = true\n"),
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
        // The first `active_low` line of the shipped map, 1-based.
        let first = shipped
            .lines()
            .position(|l| l.starts_with("active_low = true"))
            .map(|i| i + 1);
        assert_eq!(e.line, first, "{e}");
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

    /// A `rope_fault` line active high on a real chip: an unplugged rope
    /// harness would read dry, supervised. Refused, naming the line and
    /// the opt-out; taken with the opt-out, which is said at start.
    #[test]
    fn an_active_high_rope_fault_is_refused_unless_the_site_opts_out() {
        let dir = tempfile::tempdir().unwrap();
        let pins = dir.path().join("pins.toml");
        let sim = include_str!("../../boards/pins/sim-controller.toml");
        std::fs::write(&pins, sim).unwrap();
        let both = format!("{MIN}board_pins = {pins:?}\ngpio_chip = \"/dev/gpiochip0\"\n");
        let e = from(&both).unwrap_err();
        assert_eq!(e.line, Some(5), "at board_pins: {e}");
        for said in [
            "rope_fault of racks [0, 1, 2, 3] has active_low = false",
            "unplugged rope harness",
            "rope_fault_active_high = true",
        ] {
            assert!(e.message.contains(said), "{said}: {e}");
        }
        let c = from(&format!("{both}rope_fault_active_high = true\n")).expect("opted out");
        assert_eq!(c.opt_outs.len(), 1, "{:?}", c.opt_outs);
        assert!(
            c.opt_outs[0].starts_with("rope_fault_active_high = true: ")
                && c.opt_outs[0].contains("dry, supervised"),
            "{:?}",
            c.opt_outs
        );
        // A real board's map: active low, nothing to opt out of.
        let real = sim.replace(
            "signal = \"rope_fault\"\nrack = 1\nline = 5\nactive_low = false",
            "signal = \"rope_fault\"\nrack = 1\nline = 5\nactive_low = true",
        );
        std::fs::write(&pins, &real).unwrap();
        let e = from(&both).unwrap_err();
        assert!(e.message.contains("racks [0, 2, 3]"), "{e}");
        let real = sim
            .replace(
                "line = 4\nactive_low = false",
                "line = 4\nactive_low = true",
            )
            .replace(
                "line = 6\nactive_low = false",
                "line = 6\nactive_low = true",
            )
            .replace(
                "line = 7\nactive_low = false",
                "line = 7\nactive_low = true",
            )
            .replace(
                "line = 5\nactive_low = false",
                "line = 5\nactive_low = true",
            );
        std::fs::write(&pins, &real).unwrap();
        let c = from(&both).expect("active low");
        assert!(c.opt_outs.is_empty(), "{:?}", c.opt_outs);
        // The opt-out with nothing to take is refused at its line.
        for text in [
            format!("{both}rope_fault_active_high = true\n"),
            format!("{MIN}rope_fault_active_high = true\n"),
        ] {
            let e = from(&text).unwrap_err();
            assert!(e.message.contains("remove it"), "{e}");
            assert!(e.line.is_some(), "{e}");
        }
    }
}

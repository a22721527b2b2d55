//! The northbound server's section: the BMS's Modbus TCP server
//! (`northbound`), whether the BMS may write its bounded holding registers
//! (`northbound_writes`), the unit id it answers (`northbound_unit_id`),
//! and its bounds: connections at once (`northbound_max_connections`) and
//! the idle time (`northbound_idle_s`); all but the first need an
//! address.
//!
//! Modbus TCP has no login: whoever reaches the address may read, and
//! with `northbound_writes` write. An unspecified address (`0.0.0.0`,
//! `::`: every interface) is said at start; with writes it is refused
//! unless `northbound_writes_any_address = true` (file only) switches that
//! protection off on purpose, which is then said at every start too.
//!
//! Glossary:
//! - *BMS*: the building management system, the northbound server's
//!   client.

use std::format;
use std::net::SocketAddr;

use loopwarden_field::common::listener_limits;
use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::listen::Limits;
use loopwarden_field::pick;

use super::{FileConfig, Overrides};

/// The northbound server's settings.
pub(super) struct Northbound {
    /// Where it listens; `None`: no server.
    pub(super) addr: Option<SocketAddr>,
    /// The BMS may write.
    pub(super) writes: bool,
    /// The unit id it answers.
    pub(super) unit_id: u8,
    /// Its bounds: connections at once, idle time.
    pub(super) limits: Limits,
    /// A protection switched off on purpose, as a line for the log.
    pub(super) opt_out: Option<String>,
    /// What is allowed but worth a warning at start.
    pub(super) warning: Option<String>,
}

/// The northbound server's address (`None`: no server), whether the BMS
/// may write, the unit id it answers and its bounds; all but the address
/// need an address.
pub(super) fn northbound(
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
    let (opt_out, warning) = any_address(src, file, flags, northbound, northbound_writes)?;
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
    let max = pick!(
        flags.northbound_max_connections,
        file.northbound_max_connections,
        "northbound-max-connections"
    );
    let idle = pick!(
        flags.northbound_idle_s,
        file.northbound_idle_s,
        "northbound-idle-s"
    );
    for (given, flag, key) in [
        (max.0.is_some(), max.1, "northbound_max_connections"),
        (idle.0.is_some(), idle.1, "northbound_idle_s"),
    ] {
        if given && northbound.is_none() {
            return Err(src.error(
                flag,
                key,
                format!("{key} needs a northbound address to serve"),
            ));
        }
    }
    let limits = listener_limits(
        src,
        ("northbound_max_connections", max),
        ("northbound_idle_s", idle),
        crate::northbound::LIMITS,
    )?;
    Ok(Northbound {
        addr: northbound,
        writes: northbound_writes,
        unit_id,
        limits,
        opt_out,
        warning,
    })
}

/// The opt-out key that lets the BMS write on every interface.
const ANY_ADDRESS: &str = "northbound_writes_any_address";

/// An unspecified address (every interface): with writes refused unless
/// `northbound_writes_any_address = true`, which then is the opt-out
/// said at start; without writes a warning. The opt-out anywhere else is
/// refused as contradicting the configuration.
fn any_address(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    addr: Option<SocketAddr>,
    writes: bool,
) -> Result<(Option<String>, Option<String>), ConfigError> {
    let opted = file.northbound_writes_any_address.unwrap_or(false);
    let every = addr.filter(|a| a.ip().is_unspecified());
    match (every, writes, opted) {
        (Some(a), true, true) => Ok((
            Some(format!(
                "{ANY_ADDRESS} = true: the BMS's writable registers (setpoint ceiling, plan \
                 ceiling offset, outdoor temperature, alarm acknowledge; Modbus has no login) are offered on every \
                 interface ({a}): only a firewall keeps other networks from writing them"
            )),
            None,
        )),
        (Some(a), true, false) => {
            let (_, flag) = pick!(flags.northbound, file.northbound, "northbound");
            Err(src.error(
                flag,
                "northbound",
                format!(
                    "northbound = \"{a}\" with northbound_writes = true: Modbus has no login, so \
                     every network this CDU is on could write the setpoint ceiling, the plan \
                     ceiling offset and the outdoor temperature, and acknowledge alarms; give the address of the BMS's \
                     network (e.g. \"10.0.3.5:{}\"), or set {ANY_ADDRESS} = true to offer \
                     the writes on every interface on purpose",
                    a.port()
                ),
            ))
        }
        (_, _, true) => Err(src.error(
            None,
            ANY_ADDRESS,
            format!(
                "{ANY_ADDRESS} = true goes only with northbound_writes = true on an unspecified \
                 northbound address (0.0.0.0 or ::), and this configuration has none: remove it"
            ),
        )),
        (Some(a), false, false) => Ok((
            None,
            Some(format!(
                "northbound = \"{a}\" listens on every interface: the BMS's registers can be \
                 read (Modbus has no login) from every network this CDU is on; give the address \
                 of the BMS's network to keep them there"
            )),
        )),
        (None, _, false) => Ok((None, None)),
    }
}

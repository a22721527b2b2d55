//! The northbound server's section: the BMS's Modbus TCP server
//! (`northbound`), whether the BMS may write its bounded holding registers
//! (`northbound_writes`), the unit id it answers (`northbound_unit_id`),
//! and its bounds: connections at once (`northbound_max_connections`) and
//! the idle time (`northbound_idle_s`); all but the first need an
//! address.
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
    })
}

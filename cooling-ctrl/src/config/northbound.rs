//! The northbound server's section: the BMS's Modbus TCP server
//! (`northbound`), whether the BMS may write its bounded holding registers
//! (`northbound_writes`) and the unit id it answers
//! (`northbound_unit_id`); the last two need an address.
//!
//! Glossary:
//! - *BMS*: the building management system, the northbound server's
//!   client.

use std::format;
use std::net::SocketAddr;

use loopwarden_field::config::{range, ConfigError, Sources};
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
}

/// The northbound server's address (`None`: no server), whether the BMS
/// may write and the unit id it answers; the last two need an address.
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
    Ok(Northbound {
        addr: northbound,
        writes: northbound_writes,
        unit_id,
    })
}

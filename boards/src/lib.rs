//! # loopwarden-boards: hardware as data
//!
//! Board differences live here as TOML, not as code, with what reads them:
//! the limits of each GPU model a node agent drives (`gpus/*.toml`), the
//! flash layout of a host (`flash/*.toml`), the Modbus register maps of
//! CDU models ([`modbus_map`], `cdus/`) and the controller's northbound
//! map (`northbound/`), the pin maps of controller boards ([`pins`],
//! `pins/`), and a site's figures ([`site`]: the hall a CDU serves, its
//! GPUs, loop and heat rejection). With the `modbus-server` feature,
//! `modbus_server` is the one register dispatch every Modbus server of
//! the project answers with.
//!
//! No runtime and no simulator: the production agents link this crate,
//! and the simulated hall (`loopwarden-twin`) builds on it.
//!
//! Glossary:
//! - *board definition*: one TOML file describing one model; unknown keys
//!   and impossible values are refused with the file, line and reason.
//! - *TDP*: the GPU's default power limit.
//! - *cap*: a power limit set below the default; never below `min_cap_w`.

#![warn(missing_docs)]

pub mod modbus_map;
#[cfg(feature = "modbus-server")]
pub mod modbus_server;
pub mod pins;
pub mod site;

use std::path::Path;

use loopwarden_protocol::{Watts, WholeCelsius};
use serde::Deserialize;

/// Power limits of a GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPower {
    /// Default power limit.
    pub tdp_w: Watts,
    /// Lowest settable power limit.
    pub min_cap_w: Watts,
    /// Highest settable power limit.
    pub max_cap_w: Watts,
}

/// Temperature limits of a GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuThermal {
    /// Highest temperature for sustained operation.
    pub max_operating_c: WholeCelsius,
    /// Hardware slowdown threshold.
    pub slowdown_c: WholeCelsius,
    /// Hardware shutdown threshold.
    pub shutdown_c: WholeCelsius,
    /// Highest memory (HBM) operating temperature.
    pub mem_max_c: WholeCelsius,
}

/// The definition of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuBoard {
    /// Model name as operators write it (`H200-SXM`).
    pub model: String,
    /// Power limits.
    pub power: GpuPower,
    /// Temperature limits.
    pub thermal: GpuThermal,
}

/// Why a board definition was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BoardError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML, an unknown key, a missing key or a value of the wrong type.
    #[error("{origin}: {message}")]
    Syntax {
        /// The file (or `<string>`).
        origin: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The values contradict each other.
    #[error("{origin}: {message}")]
    Invalid {
        /// The file (or `<string>`).
        origin: String,
        /// What is wrong.
        message: String,
    },
}

/// Parses a board definition and checks it; `origin` names it in errors.
fn parse_checked<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &str,
    check: impl FnOnce(&T) -> Result<(), String>,
) -> Result<T, BoardError> {
    let board: T = toml::from_str(text).map_err(|e| BoardError::Syntax {
        origin: origin.to_string(),
        message: e.to_string().trim_end().to_string(),
    })?;
    check(&board).map_err(|message| BoardError::Invalid {
        origin: origin.to_string(),
        message,
    })?;
    Ok(board)
}

impl GpuBoard {
    /// Parses and checks a definition; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, BoardError> {
        parse_checked(text, origin, Self::check)
    }

    /// Reads and checks a definition file.
    pub fn load(path: &Path) -> Result<Self, BoardError> {
        let text = std::fs::read_to_string(path).map_err(|source| BoardError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// A definition shipped with this crate, by model name (`H200-SXM`).
    pub fn builtin(model: &str) -> Option<Self> {
        BUILTIN_GPUS
            .iter()
            .map(|(name, text)| Self::from_toml(text, name).expect("shipped boards are valid"))
            .find(|b| b.model.eq_ignore_ascii_case(model))
    }

    fn check(&self) -> Result<(), String> {
        let p = &self.power;
        if p.min_cap_w.0 == 0 || p.min_cap_w > p.tdp_w || p.tdp_w > p.max_cap_w {
            return Err(format!(
                "power limits must satisfy 0 < min_cap_w ({}) <= tdp_w ({}) <= max_cap_w ({})",
                p.min_cap_w.0, p.tdp_w.0, p.max_cap_w.0
            ));
        }
        let t = &self.thermal;
        if !(t.max_operating_c < t.slowdown_c && t.slowdown_c < t.shutdown_c) {
            return Err(format!(
                "temperatures must satisfy max_operating_c ({}) < slowdown_c ({}) < shutdown_c ({})",
                t.max_operating_c.0, t.slowdown_c.0, t.shutdown_c.0
            ));
        }
        Ok(())
    }
}

/// A flash board: the part's geometry and how its sectors are shared
/// between the stores.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashBoard {
    /// `file` for the file-backed flash of a Linux host.
    pub part: String,
    /// The part's geometry.
    pub geometry: FlashGeometryToml,
    /// Sector ranges `[first, end)` of each store.
    pub layout: FlashLayoutToml,
}

/// `[geometry]` of a flash board.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashGeometryToml {
    /// Bytes per programmed word.
    pub write_size: u32,
    /// Bytes per erased sector.
    pub erase_size: u32,
    /// Bytes per program operation at most.
    pub program_page: u32,
    /// Sectors in the part.
    pub sectors: u32,
}

/// `[layout]` of a flash board, in sectors.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashLayoutToml {
    /// The event log.
    pub log: [u32; 2],
    /// The outbox's telemetry-class part.
    pub outbox_telemetry: [u32; 2],
    /// The outbox's normal part.
    pub outbox_normal: [u32; 2],
    /// The outbox's critical part.
    pub outbox_critical: [u32; 2],
    /// The config store.
    pub config: [u32; 2],
}

/// Byte ranges of each store on a flash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlashLayout {
    /// The event log.
    pub log: core::ops::Range<u32>,
    /// The outbox.
    pub outbox: loopwarden_flash::outbox::OutboxLayout,
    /// The config store.
    pub config: core::ops::Range<u32>,
}

impl FlashBoard {
    /// Parses and checks a definition; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, BoardError> {
        parse_checked(text, origin, Self::check)
    }

    /// The flash board of a Linux host agent shipped in `flash/host-file.toml`.
    pub fn host_file() -> Self {
        Self::from_toml(
            include_str!("../flash/host-file.toml"),
            "flash/host-file.toml",
        )
        .expect("the shipped flash board is valid")
    }

    /// The geometry for the flash crate.
    pub fn geometry(&self) -> loopwarden_flash::FlashGeometry {
        let g = self.geometry;
        loopwarden_flash::FlashGeometry {
            write_size: g.write_size,
            erase_size: g.erase_size,
            program_page: g.program_page,
            sectors: g.sectors,
        }
    }

    /// Byte ranges of the stores.
    pub fn layout(&self) -> FlashLayout {
        let bytes = |[a, b]: [u32; 2]| a * self.geometry.erase_size..b * self.geometry.erase_size;
        let l = &self.layout;
        FlashLayout {
            log: bytes(l.log),
            outbox: loopwarden_flash::outbox::OutboxLayout {
                telemetry: bytes(l.outbox_telemetry),
                normal: bytes(l.outbox_normal),
                critical: bytes(l.outbox_critical),
            },
            config: bytes(l.config),
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.part != "file" {
            return Err(format!(
                "part = {:?}: only \"file\" (the file-backed flash of a Linux host) is supported",
                self.part
            ));
        }
        let l = &self.layout;
        let mut parts = [
            ("log", l.log, 2),
            ("outbox_telemetry", l.outbox_telemetry, 1),
            ("outbox_normal", l.outbox_normal, 1),
            ("outbox_critical", l.outbox_critical, 1),
            ("config", l.config, 2),
        ];
        for (name, [a, b], min) in parts {
            if b < a + min || b > self.geometry.sectors {
                return Err(format!(
                    "layout.{name} = [{a}, {b}] must hold at least {min} sector(s) within the {} sectors",
                    self.geometry.sectors
                ));
            }
        }
        parts.sort_by_key(|p| p.1[0]);
        for w in parts.windows(2) {
            if w[0].1[1] > w[1].1[0] {
                return Err(format!("layout.{} overlaps layout.{}", w[0].0, w[1].0));
            }
        }
        Ok(())
    }
}

/// The GPU definitions shipped in `gpus/`.
pub const BUILTIN_GPUS: &[(&str, &str)] = &[
    ("gpus/h100-sxm.toml", include_str!("../gpus/h100-sxm.toml")),
    ("gpus/h200-sxm.toml", include_str!("../gpus/h200-sxm.toml")),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_boards_load() {
        let h200 = GpuBoard::builtin("h200-sxm").unwrap();
        assert_eq!(h200.power.tdp_w, Watts(700));
        assert_eq!(h200.power.min_cap_w, Watts(200));
        assert_eq!(h200.thermal.shutdown_c, WholeCelsius(92));
        assert!(GpuBoard::builtin("nonexistent").is_none());
    }

    #[test]
    fn unknown_key_is_refused_with_its_line() {
        let text = include_str!("../gpus/h200-sxm.toml").replace("mem_max_c", "mem_maxx_c");
        let e = GpuBoard::from_toml(&text, "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.toml: "), "{e}");
        assert!(e.contains("mem_maxx_c") && e.contains("line 15"), "{e}");
    }

    #[test]
    fn the_host_flash_board_loads_and_overlaps_are_refused() {
        let b = FlashBoard::host_file();
        assert_eq!(b.geometry().capacity(), 1 << 20);
        assert_eq!(b.layout().config, 248 * 4096..256 * 4096);
        let text =
            include_str!("../flash/host-file.toml").replace("log = [0, 160]", "log = [0, 170]");
        let e = FlashBoard::from_toml(&text, "f.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlaps"), "{e}");
    }

    #[test]
    fn contradictory_limits_are_refused() {
        let text =
            include_str!("../gpus/h200-sxm.toml").replace("min_cap_w = 200", "min_cap_w = 900");
        let e = GpuBoard::from_toml(&text, "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("min_cap_w (900) <= tdp_w (700)"), "{e}");
        let text =
            include_str!("../gpus/h200-sxm.toml").replace("slowdown_c = 89", "slowdown_c = 95");
        assert!(GpuBoard::from_toml(&text, "x.toml").is_err());
    }
}

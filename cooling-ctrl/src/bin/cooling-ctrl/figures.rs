//! `cooling-ctrl firmware-figures --site-figures FILE --out FILE`: writes
//! the figures record a CDU's firmware is built with
//! (`LOOPWARDEN_FIRMWARE_FIGURES`): the control core's configuration `run`
//! builds from that site figures file, checked as `run` checks it, and
//! the CDU's heartbeat timeout where the figures give it
//! (`cooling_ctrl::site_figures::firmware_figures`). The firmware decodes
//! it at start and refuses to run a record that is damaged or that the
//! core refuses.
//!
//! Glossary:
//! - *figures record*: the configuration as bytes, tagged, versioned and
//!   with a CRC-32 (`cooling_core::config::figures`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `cooling-ctrl firmware-figures`' arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The hall's site figures (the TOML `run`'s `site_figures` names).
    #[arg(long, value_name = "FILE.toml")]
    site_figures: PathBuf,
    /// Where the record goes (a file written whole).
    #[arg(long, value_name = "FILE.bin")]
    out: PathBuf,
}

/// Writes the record for `a.site_figures` to `a.out` and says what it
/// holds on standard error.
pub fn command(a: &Args) -> ExitCode {
    match write(&a.site_figures, &a.out) {
        Ok(said) => {
            eprintln!("cooling-ctrl firmware-figures: {said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cooling-ctrl firmware-figures: {e}");
            ExitCode::from(2)
        }
    }
}

fn write(site_figures: &Path, out: &Path) -> Result<String, String> {
    let bytes = cooling_ctrl::site_figures::firmware_figures(site_figures)?;
    let (cfg, heartbeat) = cooling_core::config::figures::decode_with(&bytes)
        .map_err(|e| format!("{}: the record made: {e}", site_figures.display()))?;
    std::fs::write(out, &bytes).map_err(|e| format!("{}: not written: {e}", out.display()))?;
    let l = &cfg.layout;
    let heartbeat = heartbeat.map_or(
        "the CDU's heartbeat timeout not given ([loop] heartbeat_timeout_s): the firmware \
         waits 10 s for a read-back after a start"
            .to_string(),
        |ms| {
            format!(
                "the CDU's heartbeat timeout {} s",
                f64::from(ms.get()) / 1000.0
            )
        },
    );
    Ok(format!(
        "{}: {} bytes from {}: {} racks of {} hosts of {} GPUs, {} CDU(s) on the facility water; {heartbeat}",
        out.display(),
        bytes.len(),
        site_figures.display(),
        l.racks,
        l.hosts_per_rack,
        l.gpus_per_host,
        cfg.facility.cdus
    ))
}

/// The configuration a figures record at `path` holds (`replay-trace
/// --figures`).
pub fn read(path: &Path) -> Result<cooling_core::CoreConfig, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    cooling_core::config::figures::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

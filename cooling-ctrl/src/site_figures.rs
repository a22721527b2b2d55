//! The control core's configuration from a site's figures
//! (`loopwarden_boards::site::SiteConfig`, the `site_figures` TOML): the
//! hall's datasheet constants narrowed to the core's `f32` parameters,
//! with the core's default margins and timings. Production and the twin
//! configure the core through this one function; a microcontroller's
//! firmware is built with its result as a figures record
//! ([`firmware_figures`], `cooling_core::config::figures`), with the
//! CDU's heartbeat timeout where the figures give it
//! ([`heartbeat_timeout_s`], the one check `run` and the record share).
//!
//! Glossary:
//! - *site figures*: the hall's datasheet constants (racks, hosts, GPUs,
//!   loop, heat rejection), which the core is configured with as a real
//!   site would be.
//! - *heartbeat timeout*: how long the CDU waits for its heartbeat
//!   register to be written before it falls back to its own control
//!   (`[loop] heartbeat_timeout_s`).

use std::num::NonZeroU32;
use std::path::Path;

use loopwarden_boards::site::SiteConfig;

use cooling_core::config::{CduParams, FacilityParams, GpuParams, HostParams, Layout};
use cooling_core::{ConfigError, CoreConfig};

/// The core's configuration for a hall described by `site`, with the
/// core's default margins and timings.
pub fn core_config(site: &SiteConfig) -> Result<CoreConfig, ConfigError> {
    let d = CoreConfig::default();
    let g = &site.gpu;
    let mut r_cp = d.gpu.r_cp;
    if g.r_cp.len() != r_cp.len() {
        return Err(ConfigError::Figure(
            "gpu.r_cp: the core takes exactly 6 points",
        ));
    }
    for (dst, src) in r_cp.iter_mut().zip(&g.r_cp) {
        *dst = [src[0] as f32, src[1] as f32];
    }
    let l = &site.secondary;
    let f = &site.facility;
    let narrow =
        |n: usize, what: &'static str| u8::try_from(n).map_err(|_| ConfigError::Layout(what));
    let cfg = CoreConfig {
        layout: Layout {
            racks: narrow(site.racks, "too many racks")?,
            hosts_per_rack: narrow(site.hosts_per_rack, "too many hosts per rack")?,
            gpus_per_host: narrow(site.gpus_per_host, "too many GPUs per host")?,
            unprotected: 0,
        },
        gpu: GpuParams {
            tdp_w: g.tdp_w as f32,
            min_cap_w: g.min_cap_w as f32,
            static_w: g.static_w as f32,
            leak_per_k: g.leak_per_k as f32,
            r_jc_k_per_w: g.r_jc as f32,
            r_cp,
            max_operating_c: g.max_operating_c as f32,
        },
        host: HostParams {
            full_w: site.host.full_w as f32,
            idle_w: site.host.idle_w as f32,
        },
        cdu: CduParams {
            design_lpm_per_gpu: l.design_lpm_per_gpu as f32,
            min_speed: l.min_speed as f32,
            pump_max_w: l.pump_max_w as f32,
            approach_k: l.approach_k as f32,
            min_setpoint_c: l.min_setpoint_c() as f32,
            max_setpoint_c: l.max_setpoint_c as f32,
            cp_j_per_kg_k: l.cp_j_per_kg_k as f32,
            density_kg_per_m3: l.density_kg_per_m3 as f32,
            design_dp_kpa: l.design_dp_kpa as f32,
        },
        facility: FacilityParams {
            water_kg_per_s: f.water_kg_per_s as f32,
            water_cp_j_per_kg_k: f.water_cp_j_per_kg_k as f32,
            dry_cooler_ua_w_per_k: f.dry_cooler_ua_w_per_k as f32,
            fan_max_w: f.fan_max_w as f32,
            pinch_k: f.pinch_k as f32,
            chiller_max_w: f.chiller_max_w as f32,
            cop_max: f.cop_max as f32,
            carnot_fraction: f.carnot_fraction as f32,
            pumps_w: f.pumps_w as f32,
            distribution_loss: f.distribution_loss as f32,
            fixed_w: f.fixed_w as f32,
            cdus: narrow(site.cdus, "cdus: more than 255 CDUs on one facility loop")?,
        },
        margins: d.margins,
        timing: d.timing,
    };
    if cfg.facility.cdus == 0 {
        return Err(ConfigError::Layout(
            "cdus: at least 1 (the CDUs on the facility loop, this one among them)",
        ));
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The site figures file at `path`, read and parsed as `run` reads it,
/// and its text; errors name the file.
fn site_of_file(path: &Path) -> Result<(SiteConfig, String), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let site: SiteConfig =
        loopwarden_field::config::parse(Some(path), &text).map_err(|e| e.to_string())?;
    Ok((site, text))
}

/// The core's configuration for `site`, read from `path`: [`core_config`],
/// its errors naming the file.
fn core_config_at(site: &SiteConfig, path: &Path) -> Result<CoreConfig, String> {
    core_config(site).map_err(|e| format!("{}: for the control core: {e}", path.display()))
}

/// The core's configuration `run` builds from the site figures file at
/// `path` (read, parsed and checked as `run` does); errors name the file.
pub fn core_config_of_file(path: &Path) -> Result<CoreConfig, String> {
    let (site, _) = site_of_file(path)?;
    core_config_at(&site, path)
}

/// The CDU's heartbeat timeout, s, as the site figures `site` (parsed
/// from `text`) give it (`[loop] heartbeat_timeout_s`): `None` where they
/// leave the key out (`site` then holds the default's, no real CDU's).
/// One given is refused unless a finite number of seconds above 0: it
/// bounds the control period and the wait for a read-back after a start.
/// The message names the key; the caller names the file.
pub fn heartbeat_timeout_s(text: &str, site: &SiteConfig) -> Result<Option<f64>, String> {
    let given = text.parse::<toml::Table>().is_ok_and(|table| {
        let secondary = table.get("loop").and_then(|l| l.as_table());
        secondary.is_some_and(|l| l.contains_key("heartbeat_timeout_s"))
    });
    let s = site.secondary.heartbeat_timeout_s;
    match given {
        false => Ok(None),
        true if s.is_finite() && s > 0.0 => Ok(Some(s)),
        true => Err(format!(
            "[loop] heartbeat_timeout_s = {s}: the CDU's heartbeat timeout must be a finite \
             number of seconds above 0 (it bounds the control period and the wait for a \
             read-back after a start)"
        )),
    }
}

/// The CDU's heartbeat timeout `s` (checked by [`heartbeat_timeout_s`]) in
/// the whole ms a figures record carries, rounded down (the firmware's
/// wait after a start then ends no later than the CDU's timeout); one
/// under 1 ms or past the record's `u32` is refused, naming the key.
fn heartbeat_timeout_ms(s: f64) -> Result<NonZeroU32, String> {
    let ms = (s * 1000.0).floor();
    (ms <= f64::from(u32::MAX))
        .then(|| NonZeroU32::new(ms as u32))
        .flatten()
        .ok_or_else(|| {
            format!(
                "[loop] heartbeat_timeout_s = {s}: a figures record carries the CDU's heartbeat \
                 timeout in whole ms, 1 ms to {} ms",
                u32::MAX
            )
        })
}

/// The figures record (`cooling_core::config::figures`) a CDU's firmware
/// is built with (`LOOPWARDEN_FIRMWARE_FIGURES`), from the site figures
/// file at `path`: the configuration [`core_config_of_file`] gives, and
/// the CDU's heartbeat timeout where the figures give it
/// ([`heartbeat_timeout_s`], refused as `run` refuses it), in ms.
pub fn firmware_figures(path: &Path) -> Result<Vec<u8>, String> {
    let (site, text) = site_of_file(path)?;
    let cfg = core_config_at(&site, path)?;
    let heartbeat = heartbeat_timeout_s(&text, &site)
        .and_then(|s| s.map(heartbeat_timeout_ms).transpose())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(cooling_core::config::figures::encode_with(&cfg, heartbeat).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_of_cdus_the_core_cannot_hold_is_refused_never_clamped() {
        let mut site = SiteConfig::default();
        for (cdus, said) in [(0, "at least 1"), (256, "more than 255")] {
            site.cdus = cdus;
            let err = core_config(&site).unwrap_err().to_string();
            assert!(err.contains("cdus") && err.contains(said), "{cdus}: {err}");
        }
        site.cdus = 255;
        assert_eq!(core_config(&site).unwrap().facility.cdus, 255);
    }

    /// The site figures `text` in a file of their own, and the record
    /// `firmware-figures` makes of them.
    fn record_of(
        text: &str,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        Result<Vec<u8>, String>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hall.toml");
        std::fs::write(&path, text).unwrap();
        let r = firmware_figures(&path);
        (dir, path, r)
    }

    #[test]
    fn the_record_carries_the_cdus_heartbeat_timeout_the_figures_give() {
        use cooling_core::config::figures::decode_with;
        let (_d, path, r) = record_of("racks = 2\n[loop]\nheartbeat_timeout_s = 30\n");
        let (cfg, heartbeat) = decode_with(&r.unwrap()).unwrap();
        assert_eq!(heartbeat, NonZeroU32::new(30_000));
        assert_eq!(Ok(cfg), core_config_of_file(&path));
        let (_d, _, r) = record_of("racks = 2\n[loop]\nheartbeat_timeout_s = 12.3456\n");
        assert_eq!(decode_with(&r.unwrap()).unwrap().1, NonZeroU32::new(12_345));
        // Left out: not given, though the figures' default is 10 s.
        let (_d, _, r) = record_of("racks = 2\n");
        assert_eq!(decode_with(&r.unwrap()).unwrap().1, None);
    }

    #[test]
    fn a_heartbeat_timeout_that_is_no_finite_time_writes_no_record_naming_the_key_and_the_file() {
        for bad in ["0", "-1", "inf", "nan", "0.0004", "5e6"] {
            let (_d, path, r) = record_of(&format!("[loop]\nheartbeat_timeout_s = {bad}\n"));
            let e = r.unwrap_err();
            assert!(
                e.starts_with(&path.display().to_string())
                    && e.contains("[loop] heartbeat_timeout_s"),
                "{bad}: {e}"
            );
        }
    }
}

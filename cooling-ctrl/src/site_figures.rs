//! The control core's configuration from a site's figures
//! (`loopwarden_boards::site::SiteConfig`, the `site_figures` TOML): the
//! hall's datasheet constants narrowed to the core's `f32` parameters,
//! with the core's default margins and timings. Production and the twin
//! configure the core through this one function; a microcontroller's
//! firmware is built with its result as a figures record
//! ([`firmware_figures`], `cooling_core::config::figures`).
//!
//! Glossary:
//! - *site figures*: the hall's datasheet constants (racks, hosts, GPUs,
//!   loop, heat rejection), which the core is configured with as a real
//!   site would be.

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

/// The core's configuration `run` builds from the site figures file at
/// `path` (read, parsed and checked as `run` does); errors name the file.
pub fn core_config_of_file(path: &Path) -> Result<CoreConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let site: SiteConfig =
        loopwarden_field::config::parse(Some(path), &text).map_err(|e| e.to_string())?;
    let cfg =
        core_config(&site).map_err(|e| format!("{}: for the control core: {e}", path.display()))?;
    Ok(cfg)
}

/// The figures record (`cooling_core::config::figures`) a CDU's firmware
/// is built with (`LOOPWARDEN_FIRMWARE_FIGURES`), from the site figures
/// file at `path`: the configuration [`core_config_of_file`] gives.
pub fn firmware_figures(path: &Path) -> Result<Vec<u8>, String> {
    let cfg = core_config_of_file(path)?;
    Ok(cooling_core::config::figures::encode(&cfg).to_vec())
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
}

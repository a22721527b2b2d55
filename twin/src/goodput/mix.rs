//! The failure mix: how often a job is interrupted and by what.
//!
//! The default is Llama 3 405B's: 419 unexpected interruptions in 54 days
//! on 16,384 GPUs, by the classes of the paper's Table 5 (arXiv
//! 2407.21783). Any other published mix can be given as a
//! `goodput-mix/1` TOML file ([`Mix::from_toml`]); `docs/goodput.md`
//! section 2 gives the format and why each default class is what it is.
//!
//! Glossary:
//! - *share*: a class's part of all interruptions; a mix's shares sum to 1.
//! - *rate*: interruptions per GPU-day of the job (Meta's cluster study
//!   counts per 1,000 node-days: divide by 1,000 and by 8).
//! - *other*: the part of Table 5's interruptions its printed shares leave
//!   out (its faulty-GPU row reads 148 interruptions, 35.3 % of 419, but
//!   30.1 %); kept apart so every named share is the paper's.

use std::path::Path;

use serde::Deserialize;

use super::{FailureClass, LeadTime, Onset, Precursor};

/// The file format this module reads.
pub const FORMAT: &str = "goodput-mix/1";

/// How much a mix's shares may miss 1 by.
pub const SHARE_TOLERANCE: f64 = 1e-6;

/// Llama 3 405B's rate: 419 interruptions in 54 days on 16,384 GPUs, per
/// GPU-day.
pub const LLAMA3_RATE_PER_GPU_DAY: f64 = 419.0 / (54.0 * 16_384.0);

/// A failure mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Where its figures come from.
    pub source: String,
    /// Interruptions per GPU-day of the job.
    pub rate_per_gpu_day: f64,
    /// Its classes; their shares sum to 1.
    pub classes: Vec<FailureClass>,
}

/// Why a mix was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MixError {
    /// The file could not be read.
    #[error("{file}: {reason}")]
    Read {
        /// The file.
        file: String,
        /// What failed.
        reason: String,
    },
    /// The TOML does not parse or has unknown fields.
    #[error("{file}: {reason}")]
    Syntax {
        /// The file.
        file: String,
        /// toml's message, with the line and column.
        reason: String,
    },
    /// It parses but a figure is wrong.
    #[error("{file}: {reason}")]
    Invalid {
        /// The file (`default` for the built-in mix).
        file: String,
        /// What is wrong, naming the class.
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MixFile {
    format: String,
    source: String,
    rate_per_gpu_day: f64,
    #[serde(rename = "class")]
    classes: Vec<FailureClass>,
}

/// One default class: name, share, seen by a host, onset, takes a host out.
fn class(name: &str, share: f64, host_visible: bool, onset: Onset, excludes: bool) -> FailureClass {
    FailureClass {
        name: name.to_string(),
        share,
        host_visible,
        onset,
        precursor: Precursor::none(),
        excludes_host: excludes,
    }
}

impl Default for Mix {
    /// Llama 3 405B's mix and rate (Table 5 of arXiv 2407.21783), every
    /// precursor none.
    fn default() -> Self {
        use Onset::{Crash, Hang};
        let mut classes = vec![
            class("faulty_gpu", 0.301, true, Crash, true),
            class("hbm3", 0.172, true, Crash, true),
            class("software_bug", 0.129, false, Crash, false),
            class("network_switch_cable", 0.084, false, Hang, false),
            class("host_maintenance", 0.076, false, Crash, true),
            class("gpu_sram", 0.045, true, Crash, true),
            class("gsp", 0.041, true, Hang, true),
            class("nic", 0.017, false, Hang, true),
            class("nccl_watchdog", 0.017, false, Hang, false),
            class("silent_data_corruption", 0.014, false, Hang, true),
            class("thermal", 0.014, true, Crash, true),
            class("ssd", 0.007, false, Crash, true),
            class("power_supply", 0.007, false, Crash, true),
            class("server_chassis", 0.005, false, Crash, true),
            class("io_expansion_board", 0.005, false, Crash, true),
            class("dependency", 0.005, false, Crash, false),
            class("cpu", 0.005, false, Crash, true),
            class("system_memory", 0.005, false, Crash, true),
        ];
        let named: f64 = classes.iter().map(|c| c.share).sum();
        classes.push(class("other", 1.0 - named, false, Crash, true));
        Mix {
            source: "Llama 3 405B, arXiv 2407.21783 Table 5: 419 unexpected interruptions \
                     in 54 days on 16,384 H100s"
                .to_string(),
            rate_per_gpu_day: LLAMA3_RATE_PER_GPU_DAY,
            classes,
        }
    }
}

impl Mix {
    /// Reads a `goodput-mix/1` file.
    pub fn load(path: &Path) -> Result<Mix, MixError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| MixError::Read {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        Mix::from_toml(&text, &file)
    }

    /// Parses and checks a `goodput-mix/1` text; `file` names it in errors.
    pub fn from_toml(text: &str, file: &str) -> Result<Mix, MixError> {
        let f: MixFile = toml::from_str(text).map_err(|e| MixError::Syntax {
            file: file.to_string(),
            reason: e.to_string().trim_end().to_string(),
        })?;
        let invalid = |reason: String| MixError::Invalid {
            file: file.to_string(),
            reason,
        };
        if f.format != FORMAT {
            return Err(invalid(format!(
                "format {:?}: expected {FORMAT:?}",
                f.format
            )));
        }
        let mix = Mix {
            source: f.source,
            rate_per_gpu_day: f.rate_per_gpu_day,
            classes: f.classes,
        };
        mix.validate().map_err(invalid)?;
        Ok(mix)
    }

    /// Checks the rate, the shares and every precursor.
    pub fn validate(&self) -> Result<(), String> {
        let r = self.rate_per_gpu_day;
        if !(r.is_finite() && (0.0..=1.0).contains(&r)) {
            return Err(format!("rate_per_gpu_day = {r}: from 0 to 1"));
        }
        if self.classes.is_empty() {
            return Err("no [[class]]: a mix needs at least one".to_string());
        }
        for (i, c) in self.classes.iter().enumerate() {
            if self.classes[..i].iter().any(|o| o.name == c.name) {
                return Err(format!("class {:?} appears twice", c.name));
            }
            check_class(c).map_err(|e| format!("class {:?}: {e}", c.name))?;
        }
        let sum: f64 = self.classes.iter().map(|c| c.share).sum();
        if (sum - 1.0).abs() > SHARE_TOLERANCE {
            return Err(format!(
                "the shares sum to {sum:.9}, not 1 (within {SHARE_TOLERANCE:e})"
            ));
        }
        Ok(())
    }

    /// The same mix with every host-visible class given `p`.
    pub fn with_precursor(&self, p: &Precursor) -> Mix {
        let mut m = self.clone();
        for c in m.classes.iter_mut().filter(|c| c.host_visible) {
            c.precursor = p.clone();
        }
        m
    }

    /// The same mix with these classes' precursors; a name the mix lacks
    /// is an error, a class not named keeps its own.
    pub fn with_precursors(&self, by_name: &[(String, Precursor)]) -> Result<Mix, String> {
        let mut m = self.clone();
        for (name, p) in by_name {
            let c = m
                .classes
                .iter_mut()
                .find(|c| &c.name == name)
                .ok_or_else(|| format!("the mix has no class {name:?}"))?;
            c.precursor = p.clone();
        }
        m.validate()?;
        Ok(m)
    }

    /// The share of interruptions a host agent sees.
    pub fn visible_share(&self) -> f64 {
        self.classes
            .iter()
            .filter(|c| c.host_visible)
            .map(|c| c.share)
            .sum()
    }
}

fn check_class(c: &FailureClass) -> Result<(), String> {
    if c.name.is_empty() {
        return Err("an empty name".to_string());
    }
    if !(c.share.is_finite() && (0.0..=1.0).contains(&c.share)) {
        return Err(format!("share = {}: from 0 to 1", c.share));
    }
    let p = &c.precursor;
    if !(p.coverage.is_finite() && (0.0..=1.0).contains(&p.coverage)) {
        return Err(format!("precursor coverage = {}: from 0 to 1", p.coverage));
    }
    if !(p.quarantined.is_finite() && (0.0..=1.0).contains(&p.quarantined)) {
        return Err(format!(
            "precursor quarantined = {}: from 0 to 1",
            p.quarantined
        ));
    }
    if p.coverage > 0.0 && !c.host_visible {
        return Err(format!(
            "precursor coverage = {} but host_visible = false: no host agent can flag it",
            p.coverage
        ));
    }
    check_lead(&p.lead)
}

fn check_lead(lead: &LeadTime) -> Result<(), String> {
    let ok = |h: f64| h.is_finite() && h >= 0.0;
    match lead {
        LeadTime::Fixed { hours } if !ok(*hours) => Err(format!("lead hours = {hours}: 0 or more")),
        LeadTime::Exponential { mean_hours } if !(ok(*mean_hours) && *mean_hours > 0.0) => {
            Err(format!("lead mean_hours = {mean_hours}: above 0"))
        }
        LeadTime::Empirical { hours } if hours.is_empty() => {
            Err("lead: an empirical lead time needs at least one observation".to_string())
        }
        LeadTime::Empirical { hours } => match hours.iter().find(|h| !ok(**h)) {
            Some(h) => Err(format!("lead hours: {h}: each 0 or more")),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

impl LeadTime {
    /// Its mean, hours.
    pub fn mean_hours(&self) -> f64 {
        match self {
            LeadTime::Fixed { hours } => *hours,
            LeadTime::Exponential { mean_hours } => *mean_hours,
            LeadTime::Empirical { hours } => hours.iter().sum::<f64>() / hours.len().max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_mix_is_llama3s_with_the_rest_in_other() {
        let m = Mix::default();
        m.validate().unwrap();
        assert_eq!(m.classes.len(), 19);
        let other = m.classes.iter().find(|c| c.name == "other").unwrap();
        // 30.1 % printed against 148 of 419 (35.3 %): the 5.1 points the
        // printed shares leave out.
        assert!((other.share - 0.051).abs() < 1e-9, "{}", other.share);
        // 419 in 54 days on 16,384 GPUs: one every 3.09 hours.
        let per_h = m.rate_per_gpu_day * 16_384.0 / 24.0;
        assert!((1.0 / per_h - 3.093).abs() < 0.001, "{}", 1.0 / per_h);
        assert!((m.visible_share() - 0.573).abs() < 1e-9);
    }

    const ONE: &str = r#"
format = "goodput-mix/1"
source = "a test"
rate_per_gpu_day = 0.001
[[class]]
name = "gpu"
share = 0.6
host_visible = true
onset = "crash"
precursor = { coverage = 0.5, lead = { kind = "exponential", mean_hours = 2.0 } }
[[class]]
name = "switch"
share = 0.4
host_visible = false
onset = "hang"
excludes_host = false
"#;

    #[test]
    fn a_mix_file_is_read_with_its_defaults() {
        let m = Mix::from_toml(ONE, "one.toml").unwrap();
        assert_eq!(m.classes[0].precursor.coverage, 0.5);
        assert!(m.classes[0].excludes_host);
        assert_eq!(m.classes[1].precursor, Precursor::none());
        assert!(!m.classes[1].excludes_host);
    }

    #[test]
    fn a_bad_mix_is_refused_with_the_file_and_the_class() {
        let e = |text: &str| Mix::from_toml(text, "m.toml").unwrap_err().to_string();
        assert_eq!(
            e(&ONE.replace("share = 0.4", "share = 0.3")),
            "m.toml: the shares sum to 0.900000000, not 1 (within 1e-6)"
        );
        assert!(e(&ONE.replace("0.4", "-0.4")).contains("class \"switch\": share = -0.4"));
        assert!(e(&ONE.replace("goodput-mix/1", "mix/0")).contains("expected \"goodput-mix/1\""));
        assert!(e(&ONE.replace("\"switch\"", "\"gpu\"")).contains("appears twice"));
        assert!(e(&ONE.replace("onset = \"hang\"", "onset = \"slow\"")).starts_with("m.toml: "));
        let hidden = ONE.replace("host_visible = true", "host_visible = false");
        assert!(e(&hidden).contains("no host agent can flag it"));
        let no_mean = ONE.replace("mean_hours = 2.0", "mean_hours = 0.0");
        assert!(e(&no_mean).contains("mean_hours = 0: above 0"));
    }
}

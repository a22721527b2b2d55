//! `[cooling_loss]`: the commands a host runs when its CDU says its rack
//! lost cooling, and when cooling is back (see `node_core::cooling_loss`
//! for the order and the grace period).
//!
//! ```toml
//! [cooling_loss]
//! drain = [["scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason={reason}"]]
//! power_down = [["ipmitool", "chassis", "power", "soft"]]
//! resume = [["scontrol", "update", "NodeName={host}", "State=RESUME"]]
//! grace_s = 30
//! ```
//!
//! Each step is a list of commands (argument vectors, run without a shell,
//! in order); a step left out does nothing. Placeholders:
//! [`COOLING_PLACEHOLDERS`].

use std::time::Duration;

use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;
use serde::Deserialize;

use super::protection::Programs;
use super::{actions, ActionsAt, FileConfig, Overrides};

/// Placeholders a cooling-loss command may use.
pub const COOLING_PLACEHOLDERS: [&str; 5] = ["{host}", "{site}", "{cdu}", "{rack}", "{reason}"];

/// `[cooling_loss]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoolingLossFile {
    /// Commands when the rack loses cooling (a scheduler drain).
    pub drain: Option<Vec<Vec<String>>>,
    /// Commands after the grace period (GPUs down, host off).
    pub power_down: Option<Vec<Vec<String>>>,
    /// Commands when cooling is back, if powered down.
    pub power_up: Option<Vec<Vec<String>>>,
    /// Commands when cooling is back (undo the drain).
    pub resume: Option<Vec<Vec<String>>>,
    /// Seconds between the drain and the power-down.
    pub grace_s: Option<u64>,
    /// Timeout per command, s.
    pub timeout_s: Option<u64>,
    /// `"none"`: no command on a cooling loss, on purpose (see
    /// `protection`).
    pub actions: Option<String>,
}

/// The cooling-loss actions, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoolingLossActions {
    /// When the rack loses cooling.
    pub drain: Vec<Vec<String>>,
    /// After the grace period.
    pub power_down: Vec<Vec<String>>,
    /// When cooling is back, if powered down.
    pub power_up: Vec<Vec<String>>,
    /// When cooling is back.
    pub resume: Vec<Vec<String>>,
    /// Between the drain and the power-down.
    pub grace: Duration,
    /// Per command.
    pub timeout: Duration,
}

impl CoolingLossActions {
    /// Whether any command is configured.
    pub fn any(&self) -> bool {
        !(self.drain.is_empty()
            && self.power_down.is_empty()
            && self.power_up.is_empty()
            && self.resume.is_empty())
    }
}

/// Where the step `key` is configured (replaced by flag `--FLAG`;
/// `setting`: `cooling_loss.key`).
const fn at(key: &'static str, flag: &'static str, setting: &'static str) -> ActionsAt {
    ActionsAt {
        section: "cooling_loss",
        key,
        flag,
        setting,
    }
}

/// One step's commands, the flag's replacing the file's.
fn step(
    src: &Sources,
    at: ActionsAt,
    given: (&[String], &Option<Vec<Vec<String>>>),
    programs: &mut Programs,
) -> Result<Vec<Vec<String>>, ConfigError> {
    actions(src, at, given, &COOLING_PLACEHOLDERS, programs)
}

/// `[cooling_loss]`, checked: commands need the host's CDU and rack,
/// since only the CDU's word about that rack starts them.
pub(super) fn cooling_loss(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    has_rack: bool,
    programs: &mut Programs,
) -> Result<CoolingLossActions, ConfigError> {
    let none = CoolingLossFile::default();
    let f = file.cooling_loss.as_ref().unwrap_or(&none);
    let drain = at("drain", "cooling-drain", "cooling_loss.drain");
    let power_down = at(
        "power_down",
        "cooling-power-down",
        "cooling_loss.power_down",
    );
    let power_up = at("power_up", "cooling-power-up", "cooling_loss.power_up");
    let resume = at("resume", "cooling-resume", "cooling_loss.resume");
    let actions = CoolingLossActions {
        drain: step(src, drain, (&flags.cooling_drain, &f.drain), programs)?,
        power_down: step(
            src,
            power_down,
            (&flags.cooling_power_down, &f.power_down),
            programs,
        )?,
        power_up: step(
            src,
            power_up,
            (&flags.cooling_power_up, &f.power_up),
            programs,
        )?,
        resume: step(src, resume, (&flags.cooling_resume, &f.resume), programs)?,
        grace: Duration::from_secs(range(
            &src.section("cooling_loss"),
            pick!(flags.cooling_grace_s, f.grace_s, "cooling-grace-s"),
            "grace_s",
            30,
            0,
            3600,
            " s",
        )?),
        timeout: Duration::from_secs(range(
            &src.section("cooling_loss"),
            pick!(flags.cooling_timeout_s, f.timeout_s, "cooling-timeout-s"),
            "timeout_s",
            60,
            1,
            600,
            " s",
        )?),
    };
    if actions.any() && !has_rack {
        return Err(src.section("cooling_loss").error(
            None,
            "drain",
            "cooling-loss actions need this host's `cdu` and `rack`: only its CDU's word about its rack starts them".into(),
        ));
    }
    Ok(actions)
}

#[cfg(test)]
mod tests {
    use crate::config::{resolve, Overrides};

    fn from(text: &str) -> Result<crate::config::Config, String> {
        resolve(None, text, &Overrides::default()).map_err(|e| e.to_string())
    }

    const BASE: &str = "host = \"h\"\ntwin_gpus = 2\ncdu = \"cdu-a\"\nrack = 2\n";

    #[test]
    fn steps_grace_and_timeout_are_read() {
        let c = from(&format!(
            "{BASE}[cooling_loss]\n\
             drain = [[\"scontrol\", \"update\", \"NodeName={{host}}\", \"State=DRAIN\", \"Reason={{reason}}\"]]\n\
             power_down = [[\"systemctl\", \"poweroff\"]]\n\
             resume = [[\"scontrol\", \"update\", \"NodeName={{host}}\", \"State=RESUME\"]]\n\
             grace_s = 90\n"
        ))
        .expect("valid");
        let a = &c.cooling_loss;
        assert_eq!(a.drain[0][2], "NodeName={host}");
        assert_eq!(
            a.power_down,
            vec![vec!["systemctl".to_string(), "poweroff".into()]]
        );
        assert!(a.power_up.is_empty());
        assert_eq!(a.grace.as_secs(), 90);
        assert_eq!(a.timeout.as_secs(), 60, "the default");
        assert!(!from(BASE).expect("valid").cooling_loss.any());
    }

    #[test]
    fn bad_cooling_loss_settings_say_what_is_wrong() {
        let e = from("host = \"h\"\ntwin_gpus = 2\n[cooling_loss]\ndrain = [[\"drain-me\"]]\n")
            .unwrap_err();
        assert!(e.contains("`cdu` and `rack`"), "{e}");
        let e = from(&format!(
            "{BASE}[cooling_loss]\ndrain = [[\"x\", \"{{gpu}}\"]]\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("unknown placeholder {gpu}") && e.contains("{rack}"),
            "{e}"
        );
        let e = from(&format!("{BASE}[cooling_loss]\nresume = [[]]\n")).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = from(&format!("{BASE}[cooling_loss]\ngrace_s = 7200\n")).unwrap_err();
        assert!(e.contains("grace_s"), "{e}");
        let e = from(&format!("{BASE}[cooling_loss]\npower_off = [[\"x\"]]\n")).unwrap_err();
        assert!(e.contains("power_off"), "{e}");
    }

    #[test]
    fn a_flag_replaces_the_files_step() {
        let flags = Overrides {
            cooling_power_down: vec!["ipmitool chassis power soft".into()],
            ..Default::default()
        };
        let text = format!("{BASE}[cooling_loss]\npower_down = [[\"systemctl\", \"poweroff\"]]\n");
        let c = resolve(None, &text, &flags).expect("valid");
        assert_eq!(
            c.cooling_loss.power_down[0],
            ["ipmitool", "chassis", "power", "soft"]
        );
    }
}

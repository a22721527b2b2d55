//! What keeps a host on real GPUs protected, checked at start: the site's
//! power ceiling, and the settings without which the host would take no
//! cap, never see its CDU, or leave powered GPUs on a rack that lost its
//! cooling.
//!
//! On real GPUs each of those is refused unless its opt-out is written
//! down (and then said in the log at every start):
//!
//! | missing | what it switches off | opt-out |
//! |---|---|---|
//! | `keyring` | every command: no CDU, facility or operator can cap the host | `commands = "none"` |
//! | `cdu` | the CDU's leases and its word about cooling | `cooling = "not_managed"` |
//! | the CDU's key in the keyring (`cdu` with `commands = "none"`, or a `cdu` no signer is) | the same: every state and lease of that CDU is refused | `cooling = "not_managed"` |
//! | `lease` on a key of the CDU (its keys all listed without it) | its caps: each cap lease of that CDU is refused as forbidden, though its states are taken (a key of it without `lease` beside one with it is said at start) | `cooling = "not_managed"` |
//! | `rack` (with `cdu`) | acting on the rack's loss of cooling | `[cooling_loss] actions = "none"` |
//! | `[cooling_loss]` `drain` and `power_down` | draining and powering down a rack without cooling | `[cooling_loss] actions = "none"` |
//! | `flash` | quarantines, leases and the limits the agent set, across a restart | `volatile_state = true` |
//! | `[quarantine]` `actions` | draining a quarantined GPU (an XID 79): jobs keep landing on it | `[quarantine] reported_only = true` (the scheduler reads the bus) |
//!
//! A GPU without persistence mode (`nvidia-smi -pm 1`, or
//! nvidia-persistenced) is never refused (a refused start would leave the
//! host with no agent at all): the shell says it as an error at every
//! start once the GPUs are described, and shows it as a protection that
//! is off ([`OptOut::persistence_off`]), unless `persistence =
//! "not_required"` is written (then said as the other opt-outs): the
//! driver deinitializes such a GPU when its last client (the agent)
//! exits, and the limits the agent left revert to the default.
//!
//! A `[cooling_loss] grace_s` longer than the safety case's
//! ([`SAFETY_GRACE_S`]) before a power-down is taken, and said as an
//! opt-out of its own (`cooling_loss.grace_s`).
//!
//! Each action's program is looked for at start as the action will run
//! it ([`Programs`]): on real GPUs one that would not start (not found on
//! the agent's `PATH`, not an executable file) is said as an error and
//! shown as a protection off of its key (`cooling_loss.power_down`), not
//! refused: a program on a file system not mounted yet at boot would
//! otherwise leave the host with no agent at all. Each run of the action
//! looks for it again. On simulated GPUs it is said as a warning.
//!
//! Simulated GPUs (a demonstration, a test) take the same keys but are
//! not held to them.
//!
//! Glossary:
//! - *site limit*: `site_limit_w`, the highest power limit the agent ever
//!   sets on this host's GPUs (see `node_core::node::limits`).
//! - *opt-out*: a key that switches a protection off on purpose; the
//!   console and `/metrics` list them, and beside them the protections
//!   found off at start rather than written off (persistence mode off,
//!   not opted out; an action's program not found).

use loopwarden_field::config::{range, ConfigError, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::auth::Signer;
use loopwarden_protocol::{Ident, Role, Watts};

use super::{CoolingLossActions, FileConfig, GpuSourceKind, Overrides};

/// `commands`'s one value: this host takes no command.
const NO_COMMANDS: &str = "none";
/// `cooling`'s one value: no CDU of this system cools this host.
const NOT_MANAGED: &str = "not_managed";
/// `[cooling_loss] actions`'s one value: no command on a cooling loss.
const NO_ACTIONS: &str = "none";
/// The opt-out's key of `volatile_state`: no flash file on purpose.
pub(super) const VOLATILE_STATE: &str = "volatile_state";
/// `persistence`'s one value: GPUs without persistence mode are taken.
const NOT_REQUIRED: &str = "not_required";
/// The opt-out's key of `persistence`, which the shell checks at start,
/// once the GPUs are described.
pub(super) const PERSISTENCE: &str = "persistence";
/// The grace between a rack's drain and its power-down that the safety
/// case counts on (docs/safety.md), s; a longer one is an opt-out.
pub const SAFETY_GRACE_S: u64 = 30;

/// `site_limit_w`: the highest limit ever set on this host's GPUs,
/// within the board's settable range; `None` when not configured.
pub(super) fn site_limit(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    board: &loopwarden_boards::GpuBoard,
) -> Result<Option<Watts>, ConfigError> {
    let p = &board.power;
    optional_watts(
        src,
        pick!(flags.site_limit_w, file.site_limit_w, "site-limit-w"),
        "site_limit_w",
        (p.min_cap_w, p.max_cap_w),
    )
}

/// `twin_admin_limit_w`: the limit simulated GPUs start at, as if an
/// administrator had set it (`nvidia-smi -pl`); only with simulated GPUs.
pub(super) fn twin_admin_limit(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    gpus: &GpuSourceKind,
    board: &loopwarden_boards::GpuBoard,
) -> Result<Option<Watts>, ConfigError> {
    #[cfg(feature = "twin")]
    let picked = pick!(
        flags.twin_admin_limit_w,
        file.twin_admin_limit_w,
        "twin-admin-limit-w"
    );
    #[cfg(not(feature = "twin"))]
    let picked = {
        let _ = flags;
        pick!(None::<u32>, file.twin_admin_limit_w, "twin-admin-limit-w")
    };
    if picked.0.is_some() && *gpus == GpuSourceKind::Nvml {
        return Err(src.error(
            picked.1,
            "twin_admin_limit_w",
            "twin_admin_limit_w is for simulated GPUs (twin_gpus); a real GPU starts at the limit it has".into(),
        ));
    }
    let p = &board.power;
    optional_watts(
        src,
        picked,
        "twin_admin_limit_w",
        (p.min_cap_w, p.max_cap_w),
    )
}

/// An optional power in watts within `lo..=hi`.
fn optional_watts(
    src: &Sources,
    picked: (Option<u32>, Option<&'static str>),
    key: &str,
    (lo, hi): (Watts, Watts),
) -> Result<Option<Watts>, ConfigError> {
    match picked.0 {
        Some(_) => Ok(Some(Watts(range(
            src,
            picked,
            key,
            lo.0,
            lo.0,
            hi.0,
            " W, the board's settable range",
        )?))),
        None => Ok(None),
    }
}

/// What the protection checks look at.
pub(super) struct Setting<'a> {
    /// Where the GPUs come from.
    pub gpus: &'a GpuSourceKind,
    /// Whether a keyring is configured.
    pub keyring: bool,
    /// The signers this host takes (the keyring's, the demonstration
    /// ones, or none).
    pub signers: &'a [Signer],
    /// The CDU that cools this host.
    pub cdu: &'a Option<Ident>,
    /// Its rack on that CDU.
    pub rack: Option<u8>,
    /// The cooling-loss commands.
    pub cooling_loss: &'a CoolingLossActions,
    /// Whether a flash file is configured.
    pub flash: bool,
    /// Whether a quarantine action is configured.
    pub quarantine_actions: bool,
}

/// A protection switched off on purpose: its key, and what that means
/// (or, from [`OptOut::persistence_off`] and [`Programs`], one found off
/// at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptOut {
    /// The setting that switched it off: `commands`, `cooling`,
    /// `cooling_loss.actions`, `cooling_loss.grace_s`, `volatile_state`,
    /// `persistence` or `quarantine.reported_only`; for an action's
    /// program not found, the action's key (`quarantine.actions`,
    /// `cooling_loss.drain`, `cooling_loss.power_down`,
    /// `cooling_loss.power_up`, `cooling_loss.resume`).
    pub key: &'static str,
    /// The setting as written and what it means, for the log and the
    /// console: `commands = "none": this host takes no command (...)`.
    pub said: String,
}

impl OptOut {
    /// The protection found off at start, not written off: persistence
    /// mode off on the real GPUs `gpus` with no `persistence =
    /// "not_required"` (key `persistence`, as its opt-out's).
    pub fn persistence_off(gpus: &[u8]) -> OptOut {
        let list: Vec<String> = gpus.iter().map(u8::to_string).collect();
        let (one, them) = match gpus.len() {
            1 => ("GPU", "it"),
            _ => ("GPUs", "them"),
        };
        OptOut {
            key: PERSISTENCE,
            said: format!(
                "persistence mode is off on {one} {}, not on purpose (no persistence = \"{NOT_REQUIRED}\"): when the agent, the last client, stops, the driver deinitializes {them} and the caps in force revert to the default, and the next start takes the default for the administrator's limit; start nvidia-persistenced or run `nvidia-smi -pm 1`",
                list.join(", ")
            ),
        }
    }
}

impl std::fmt::Display for OptOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.said)
    }
}

/// The opt-outs written down, each with what it means; on real GPUs a
/// protection that is off without its opt-out is refused, and on any GPUs
/// an opt-out that contradicts a setting is.
pub(super) fn opt_outs(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    s: &Setting<'_>,
) -> Result<Vec<OptOut>, ConfigError> {
    let commands = one_value(
        src,
        pick!(flags.commands, file.commands, "commands"),
        "commands",
        NO_COMMANDS,
    )?;
    let cooling = one_value(
        src,
        pick!(flags.cooling, file.cooling, "cooling"),
        "cooling",
        NOT_MANAGED,
    )?;
    let cl = src.section("cooling_loss");
    let actions = one_value(
        &cl,
        pick!(
            flags.cooling_loss_actions,
            file.cooling_loss.as_ref().and_then(|c| c.actions.clone()),
            "cooling-loss-actions"
        ),
        "actions",
        NO_ACTIONS,
    )?;
    let volatile = volatile_state(src, file, flags, s.flash)?;
    let persistence = one_value(
        src,
        pick!(flags.persistence, file.persistence, "persistence"),
        PERSISTENCE,
        NOT_REQUIRED,
    )?;
    let reported_only = reported_only(src, file, flags, s)?;
    contradictions(src, s, (commands, cooling, actions))?;
    if *s.gpus == GpuSourceKind::Nvml {
        required(src, s, (commands, cooling, actions))?;
        if !s.flash && !volatile {
            return Err(src.error(
                None,
                "flash",
                "real GPUs need a flash file: without one a quarantine, the leases in force and the limits the agent set are lost at every restart (a crash while capped leaves the cap as the GPUs' ceiling). Give flash = PATH, or write volatile_state = true to run without one on purpose".into(),
            ));
        }
        if !s.quarantine_actions && !reported_only {
            return Err(src.section("quarantine").error(
                None,
                "actions",
                "real GPUs need a quarantine action: without one a GPU quarantined (an XID 79, fallen off the bus) is drained by nothing and jobs keep landing on it. Give [quarantine] actions (docs/health.md, section 6), or write reported_only = true in [quarantine] when the site's scheduler reads the quarantine from the bus".into(),
            ));
        }
    }
    let mut off = Vec::new();
    let mut say = |on: bool, key: &'static str, said: String| {
        if on {
            off.push(OptOut { key, said });
        }
    };
    say(
        commands,
        "commands",
        format!("commands = \"{NO_COMMANDS}\": this host takes no command (no cap, no release)"),
    );
    say(
        cooling,
        "cooling",
        format!("cooling = \"{NOT_MANAGED}\": no CDU's leases or word about cooling are taken"),
    );
    say(actions, "cooling_loss.actions", format!("[cooling_loss] actions = \"{NO_ACTIONS}\": a rack that loses cooling is left to the CDU's caps, nothing drained or powered down"));
    let grace = s.cooling_loss.grace.as_secs();
    say(
        grace > SAFETY_GRACE_S && !s.cooling_loss.power_down.is_empty(),
        "cooling_loss.grace_s",
        format!("[cooling_loss] grace_s = {grace}: a rack that loses cooling is powered down {grace} s after its drain, not the {SAFETY_GRACE_S} s the safety case counts on (docs/safety.md): its GPUs stay powered, at their minimum caps, on a loop without flow that long"),
    );
    say(volatile, VOLATILE_STATE, "volatile_state = true: no flash file: quarantines, leases and the limits the agent set are lost at every restart, so a stop lifts the caps in force (leases' too) back to the ceilings unless the host's cooling is lost (then they stay, and the next start takes them as the GPUs' uncapped limits: the stop names each GPU's command to set its limit back), and a crash leaves a cap as the GPUs' uncapped limit".into());
    say(persistence, PERSISTENCE, format!("persistence = \"{NOT_REQUIRED}\": GPUs without persistence mode are taken: when the agent, their last client, stops, the driver deinitializes them and the limits it leaves revert to the default until it starts again, and a restart takes the default for the administrator's limit"));
    say(reported_only, "quarantine.reported_only", "[quarantine] reported_only = true: a quarantined GPU is not drained by this host; only the bus says it (the site's scheduler must read it)".into());
    Ok(off)
}

/// `[quarantine] reported_only`: no quarantine action on purpose;
/// refused beside actions.
fn reported_only(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    s: &Setting<'_>,
) -> Result<bool, ConfigError> {
    let flag = flags.quarantine_reported_only.then_some(true);
    let written = file.quarantine.as_ref().and_then(|q| q.reported_only);
    let (given, from) = pick!(flag, written, "quarantine-reported-only");
    let reported_only = given.unwrap_or(false);
    if reported_only && s.quarantine_actions {
        return Err(src.section("quarantine").error(
            from,
            "reported_only",
            "reported_only = true and quarantine actions: remove one or the other".into(),
        ));
    }
    Ok(reported_only)
}

/// `volatile_state`: no flash file on purpose; refused beside one.
fn volatile_state(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    flash: bool,
) -> Result<bool, ConfigError> {
    let flag = flags.volatile_state.then_some(true);
    let (given, from) = pick!(flag, file.volatile_state, "volatile-state");
    let volatile = given.unwrap_or(false);
    if volatile && flash {
        return Err(src.error(
            from,
            "volatile_state",
            "volatile_state = true with a flash file: remove one or the other".into(),
        ));
    }
    Ok(volatile)
}

/// Whether the opt-out `key` is given; its one allowed value is `value`.
fn one_value(
    src: &Sources,
    (given, flag): (Option<String>, Option<&'static str>),
    key: &str,
    value: &str,
) -> Result<bool, ConfigError> {
    match given {
        None => Ok(false),
        Some(v) if v == value => Ok(true),
        Some(v) => Err(src.error(
            flag,
            key,
            format!("{key} = {v:?}: the only value is \"{value}\" (switching a protection off on purpose)"),
        )),
    }
}

/// Opt-outs that contradict what is configured.
fn contradictions(
    src: &Sources,
    s: &Setting<'_>,
    (commands, cooling, actions): (bool, bool, bool),
) -> Result<(), ConfigError> {
    if commands && s.keyring {
        return Err(src.error(
            None,
            "commands",
            format!("commands = \"{NO_COMMANDS}\" and a keyring: remove one (with a keyring the host takes the commands it allows)"),
        ));
    }
    if cooling && (s.cdu.is_some() || s.rack.is_some() || s.cooling_loss.any() || actions) {
        return Err(src.error(
            None,
            "cooling",
            format!("cooling = \"{NOT_MANAGED}\" and a `cdu`, `rack` or `[cooling_loss]`: remove one or the other"),
        ));
    }
    if actions && s.cooling_loss.any() {
        return Err(src.section("cooling_loss").error(
            None,
            "actions",
            format!(
                "actions = \"{NO_ACTIONS}\" and cooling-loss commands: remove one or the other"
            ),
        ));
    }
    Ok(())
}

/// On real GPUs, the host's CDU must be one whose signed state it can
/// check and whose caps it takes: a CDU state is taken only with a key of
/// the keyring, so without a keyring (`commands = "none"`), or with a
/// `cdu` no signer of it is (a misspelt name, another hall's keyring),
/// every state of that CDU is refused: the rack's loss of cooling is never
/// seen (no drain, no power-down) and none of its caps is taken. A state
/// verifies with any key of the CDU, but a cap lease only with one that
/// may lease: with none that may, every cap is refused as forbidden, so
/// that is refused too, and a key without `lease` beside one with it (a
/// rotation's new key given the wrong rights) is said at start.
fn cdu_heard(
    src: &Sources,
    s: &Setting<'_>,
    commands: bool,
    cdu: &Ident,
) -> Result<(), ConfigError> {
    if commands {
        return Err(src.error(
            None,
            "commands",
            format!("commands = \"{NO_COMMANDS}\" and cdu = \"{cdu}\": without a keyring this host cannot check cdu/{cdu}'s signed state, so it never sees its rack lose cooling (no drain, no power-down) and takes none of its caps. Give keyring = PATH listing cdu/{cdu}, or write cooling = \"{NOT_MANAGED}\" in place of cdu, rack and [cooling_loss] to run this host unmanaged on purpose"),
        ));
    }
    let keys: Vec<&Signer> = s
        .signers
        .iter()
        .filter(|k| k.role == Role::Cdu && k.name.as_ref().is_none_or(|n| n == cdu))
        .collect();
    if keys.is_empty() {
        return Err(src.error(
            None,
            "cdu",
            format!("cdu = \"{cdu}\": the keyring holds no key of cdu/{cdu}, so every state and lease of that CDU would be refused: its rack's loss of cooling never seen (no drain, no power-down), none of its caps taken. Check the CDU's name, or add cdu/{cdu}'s key to the keyring (`lwbus pki sign-key --node cdu/{cdu} --key-id N --out FILE` prints its entry)"),
        ));
    }
    if !keys.iter().any(|k| k.may.lease) {
        let ids: Vec<String> = keys.iter().map(|k| k.key_id.to_string()).collect();
        return Err(src.error(
            None,
            "cdu",
            format!("cdu = \"{cdu}\": the keyring lists cdu/{cdu}'s key ids {} without the right `lease`, so every cap lease of that CDU would be refused as forbidden: when its cooling falls short, this host's GPUs stay uncapped. Give the CDU's entries may = [\"lease\"] (a CDU's `release` is dropped: only an operator releases), or write cooling = \"{NOT_MANAGED}\" in place of cdu, rack and [cooling_loss] to run this host unmanaged on purpose", ids.join(", ")),
        ));
    }
    for k in keys.iter().filter(|k| !k.may.lease) {
        tracing::warn!(
            "keyring: cdu/{cdu}'s key {} ({}) lacks the right `lease`: its states are taken but its cap leases refused as forbidden; a controller switched to it would have every cap refused. Give its entry may = [\"lease\"] before the controller signs with it (docs/security.md, section 7.2)",
            k.key_id,
            loopwarden_bus::keys::may_toml(k.may)
        );
    }
    Ok(())
}

/// On real GPUs: every protection on, or its opt-out written down.
fn required(
    src: &Sources,
    s: &Setting<'_>,
    (commands, cooling, actions): (bool, bool, bool),
) -> Result<(), ConfigError> {
    if !s.keyring && !commands {
        return Err(src.error(
            None,
            "keyring",
            format!("real GPUs need a keyring: without one every lease is refused, and no CDU, facility or operator can cap this host. Give keyring = PATH (`lwbus pki init` writes one), or write commands = \"{NO_COMMANDS}\" to run this host unmanaged on purpose"),
        ));
    }
    let Some(cdu) = s.cdu else {
        if cooling {
            return Ok(());
        }
        return Err(src.error(
            None,
            "cdu",
            format!("real GPUs need the CDU that cools this host: without `cdu` its leases are refused and a loss of cooling is never seen. Give cdu = NAME and rack = N, or write cooling = \"{NOT_MANAGED}\" when no CDU of this site's controllers cools this host"),
        ));
    };
    cdu_heard(src, s, commands, cdu)?;
    if actions {
        return Ok(());
    }
    if s.rack.is_none() {
        return Err(src.error(
            None,
            "rack",
            format!("cdu = \"{cdu}\" needs this host's rack on it: without `rack` a loss of cooling on the rack is never acted on. Give rack = 0 to 15, or write actions = \"{NO_ACTIONS}\" in [cooling_loss] to leave a rack without cooling to the CDU's caps"),
        ));
    }
    let cl = s.cooling_loss;
    for (key, missing) in [
        ("drain", cl.drain.is_empty()),
        ("power_down", cl.power_down.is_empty()),
    ] {
        if missing {
            return Err(src.section("cooling_loss").error(
                None,
                key,
                format!("no cooling-loss `{key}` command: a rack that loses cooling would stay powered (at its minimum caps) on a shut valve. Give [cooling_loss] drain and power_down commands (docs/node-agent.md, section 3.6), or write actions = \"{NO_ACTIONS}\" in [cooling_loss] to leave it to the CDU's caps on purpose"),
            ));
        }
    }
    Ok(())
}

/// The action programs looked for at start as each action will run them
/// ([`crate::actions::find_program`]).
pub(super) struct Programs {
    /// On real GPUs: a program not found is a protection off.
    real: bool,
    /// The protections off, one per key with a program not found.
    pub(super) missing: Vec<OptOut>,
}

impl Programs {
    /// For the GPUs `gpus`.
    pub(super) fn new(gpus: &GpuSourceKind) -> Programs {
        Programs {
            real: *gpus == GpuSourceKind::Nvml,
            missing: Vec::new(),
        }
    }

    /// Looks for `program`, an action of `setting`
    /// (`cooling_loss.power_down`); `said` gives the words as the error
    /// of that setting's line or flag. On real GPUs one that would not
    /// start is an error and a protection off of `setting` (the start goes
    /// on: a program on a file system not mounted yet at boot must not
    /// leave the host with no agent; each run looks for it again); on
    /// simulated GPUs, whose actions are often stand-ins, a warning.
    pub(super) fn look_for(
        &mut self,
        setting: &'static str,
        program: &str,
        said: impl FnOnce(String) -> ConfigError,
    ) {
        let path = crate::actions::search_path();
        let Err(why) = crate::actions::find_program(program, &path) else {
            return;
        };
        if !self.real {
            let said = said(why);
            tracing::warn!(
                "config: {said}: the action will fail when it runs (simulated GPUs: taken)"
            );
            return;
        }
        let said = said(format!("{why}: the action will fail when it is needed unless the program is there by then (each run looks for it again; shown as a protection off until the next start). Install the program or give its full path; on a file system mounted at boot, order the agent after it")).to_string();
        tracing::error!("config: {said}");
        match self.missing.iter_mut().find(|o| o.key == setting) {
            Some(o) => o.said = format!("{}; {said}", o.said),
            None => self.missing.push(OptOut { key: setting, said }),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{resolve, Config, Overrides};
    use crate::test_log::logged;
    use loopwarden_protocol::auth::{May, Signer, SigningKey};
    use loopwarden_protocol::{Ident, Role};

    /// A real host on the site's broker, with what the test adds.
    fn nvml(more: &str) -> Result<Config, String> {
        let text = format!("site = \"a\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\n{more}");
        resolve(None, &text, &Overrides::default()).map_err(|e| e.to_string())
    }

    fn twin(more: &str) -> Result<Config, String> {
        let text = format!("site = \"a\"\nhost = \"h\"\ntwin_gpus = 2\n{more}");
        resolve(None, &text, &Overrides::default()).map_err(|e| e.to_string())
    }

    /// Site a's keyring in `dir`, holding one key, `role/name`'s, as
    /// the line `keyring = …`.
    fn keyring(dir: &std::path::Path, role: Role, name: &str) -> String {
        let signer = Signer {
            role,
            name: Some(Ident::new(name).unwrap()),
            key_id: 1,
            key: SigningKey::from_bytes(&[3; 32]).verifying_key(),
            may: May {
                lease: role == Role::Cdu,
                release: role == Role::Operator,
                resend: role != Role::Cdu,
            },
        };
        let site = Ident::new("a").unwrap();
        let ring = dir.join(format!("{name}.keyring.toml"));
        let text = loopwarden_bus::keys::keyring_toml(&site, &[signer]);
        std::fs::write(&ring, text).unwrap();
        format!("keyring = {ring:?}\n")
    }

    /// Site a's keyring in `dir`, file `file`, holding cdu/cdu1's keys
    /// `(key id, rights)`, as the line `keyring = …`.
    fn cdu1_keys(dir: &std::path::Path, file: &str, keys: &[(u8, May)]) -> String {
        let signers: Vec<Signer> = keys
            .iter()
            .map(|&(key_id, may)| Signer {
                role: Role::Cdu,
                name: Some(Ident::new("cdu1").unwrap()),
                key_id,
                key: SigningKey::from_bytes(&[key_id; 32]).verifying_key(),
                may,
            })
            .collect();
        let site = Ident::new("a").unwrap();
        let ring = dir.join(file);
        std::fs::write(&ring, loopwarden_bus::keys::keyring_toml(&site, &signers)).unwrap();
        format!("keyring = {ring:?}\n")
    }

    const KEYRING_OFF: &str = "commands = \"none\"\n";
    const UNMANAGED: &str = "commands = \"none\"\ncooling = \"not_managed\"\n";
    const RACK: &str = "cdu = \"cdu1\"\nrack = 2\n";
    // Programs found on any PATH: on real GPUs each action's program
    // must be there at start.
    const DRAIN: &str = "[cooling_loss]\ndrain = [[\"true\", \"{host}\"]]\n";
    const BOTH: &str = "[cooling_loss]\ndrain = [[\"true\", \"{host}\"]]\npower_down = [[\"true\", \"poweroff\"]]\n";
    const FLASH: &str = "flash = \"/var/lib/loopwarden/node-agent.flash\"\n";
    const QUARANTINE: &str = "[quarantine]\nactions = [[\"true\", \"{host}\", \"{gpu}\"]]\n";
    const REPORTED_ONLY: &str = "[quarantine]\nreported_only = true\n";

    #[test]
    fn real_gpus_without_a_protection_are_refused_naming_its_opt_out() {
        let dir = tempfile::tempdir().unwrap();
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        let e = nvml(&format!("{RACK}{DRAIN}")).unwrap_err();
        assert!(
            e.contains("real GPUs need a keyring") && e.contains("commands = \"none\""),
            "{e}"
        );
        let e = nvml(KEYRING_OFF).unwrap_err();
        assert!(
            e.contains("`cdu`") && e.contains("cooling = \"not_managed\""),
            "{e}"
        );
        let e = nvml(&format!("{ring}cdu = \"cdu1\"\n")).unwrap_err();
        assert!(
            e.contains("rack") && e.contains("actions = \"none\""),
            "{e}"
        );
        let e = nvml(&format!("{ring}{RACK}")).unwrap_err();
        assert!(
            e.contains("no cooling-loss `drain` command") && e.contains("actions = \"none\""),
            "{e}"
        );
        let e = nvml(&format!("{ring}{RACK}{DRAIN}")).unwrap_err();
        assert!(e.contains("no cooling-loss `power_down` command"), "{e}");
        let e = nvml(&format!("{ring}{RACK}{BOTH}")).unwrap_err();
        assert!(
            e.contains("real GPUs need a flash file") && e.contains("volatile_state = true"),
            "{e}"
        );
        let c = nvml(&format!("{ring}{FLASH}{RACK}{QUARANTINE}{BOTH}")).expect("protected");
        assert!(c.opt_outs.is_empty(), "{:?}", c.opt_outs);
        assert_eq!(
            c.cooling_loss.grace.as_secs(),
            30,
            "the safety case's grace"
        );
    }

    /// A CDU state is taken only with a key of the keyring: a host whose
    /// keyring cannot check its CDU's would never act on its rack's loss
    /// of cooling, so it is refused, naming what to give.
    #[test]
    fn real_gpus_whose_keyring_cannot_check_their_cdu_are_refused() {
        let e = nvml(&format!("{KEYRING_OFF}{FLASH}{RACK}{BOTH}")).unwrap_err();
        assert!(
            e.contains("commands = \"none\" and cdu = \"cdu1\"")
                && e.contains("never sees its rack lose cooling")
                && e.contains("cooling = \"not_managed\""),
            "{e}"
        );
        // Not even for caps alone: no state, no lease of the CDU is taken.
        let caps_only = "cdu = \"cdu1\"\n[cooling_loss]\nactions = \"none\"\n";
        let e = nvml(&format!("{KEYRING_OFF}{FLASH}{caps_only}")).unwrap_err();
        assert!(e.contains("commands = \"none\" and cdu"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        for (role, name) in [(Role::Cdu, "cdu2"), (Role::Operator, "cdu1")] {
            let ring = keyring(dir.path(), role, name);
            let e = nvml(&format!("{ring}{FLASH}{RACK}{BOTH}")).unwrap_err();
            assert!(
                e.contains("cdu = \"cdu1\": the keyring holds no key of cdu/cdu1"),
                "{role:?}/{name}: {e}"
            );
        }
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        assert!(nvml(&format!("{ring}{FLASH}{RACK}{QUARANTINE}{BOTH}")).is_ok());
        // Simulated GPUs are not held to it.
        assert!(twin(&format!("{RACK}{BOTH}")).is_ok());
    }

    /// A CDU's state verifies with any of its keys, but its caps only
    /// with one that may lease: a keyring whose cdu/<cdu> keys none may
    /// lease would take the CDU's word about cooling and refuse every
    /// cap it sends (the GPUs stay uncapped when cooling falls short).
    #[test]
    fn real_gpus_whose_cdu_keys_none_may_lease_are_refused_naming_lease() {
        let dir = tempfile::tempdir().unwrap();
        let resend = May {
            resend: true,
            ..May::default()
        };
        // An earlier `sign-key` could give a CDU `release`: the keyring
        // drops it, and the key is left with no right.
        let release = May {
            release: true,
            ..May::default()
        };
        for (file, may) in [("resend.toml", resend), ("release.toml", release)] {
            let ring = cdu1_keys(dir.path(), file, &[(1, may), (2, may)]);
            let e = nvml(&format!("{ring}{FLASH}{RACK}{QUARANTINE}{BOTH}")).unwrap_err();
            assert!(
                e.contains("cdu = \"cdu1\"")
                    && e.contains("cdu/cdu1's key ids 1, 2")
                    && e.contains("`lease`")
                    && e.contains("cooling = \"not_managed\""),
                "{file}: {e}"
            );
        }
        // Simulated GPUs are not held to it.
        let ring = cdu1_keys(dir.path(), "twin.toml", &[(1, resend)]);
        let text = format!(
            "site = \"a\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\ntwin_gpus = 2\n{ring}{RACK}{BOTH}"
        );
        resolve(None, &text, &Overrides::default()).expect("simulated GPUs");
    }

    /// In a rotation, the key with lease lets the host start; the one
    /// without is said at start, before the controller moves to it and
    /// every cap of the CDU is refused.
    #[test]
    fn a_cdu_key_without_lease_beside_one_with_it_is_taken_and_warned_of() {
        let dir = tempfile::tempdir().unwrap();
        let lease = May {
            lease: true,
            ..May::default()
        };
        let resend = May {
            resend: true,
            ..May::default()
        };
        let ring = cdu1_keys(dir.path(), "rotation.toml", &[(1, lease), (2, resend)]);
        let (c, log) = logged(|| nvml(&format!("{ring}{FLASH}{RACK}{QUARANTINE}{BOTH}")));
        let c = c.expect("one key may lease");
        assert!(c.opt_outs.is_empty(), "{:?}", c.opt_outs);
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("cdu/cdu1's key 2"))
            .collect();
        assert_eq!(said.len(), 1, "{log}");
        assert!(said[0].contains("`lease`"), "{log}");
        assert!(!log.contains("key 1"), "key 1 may lease: {log}");
    }

    #[test]
    fn each_opt_out_is_said_and_twin_gpus_are_not_held_to_them() {
        let c = nvml(&format!(
            "{UNMANAGED}volatile_state = true\n{REPORTED_ONLY}"
        ))
        .expect("unmanaged");
        let keys: Vec<&str> = c.opt_outs.iter().map(|o| o.key).collect();
        assert_eq!(
            keys,
            [
                "commands",
                "cooling",
                "volatile_state",
                "quarantine.reported_only"
            ]
        );
        assert!(
            c.opt_outs[2].said.starts_with("volatile_state = true"),
            "{:?}",
            c.opt_outs
        );
        assert!(
            c.volatile_state(),
            "the node is told: a stop lifts the caps unless cooling is lost"
        );
        assert!(
            c.opt_outs[0].said.starts_with("commands = \"none\""),
            "{:?}",
            c.opt_outs
        );
        assert!(c.opt_outs[1].said.starts_with("cooling = \"not_managed\""));
        let dir = tempfile::tempdir().unwrap();
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        let c = nvml(&format!(
            "{ring}{FLASH}cdu = \"cdu1\"\n{QUARANTINE}[cooling_loss]\nactions = \"none\"\n"
        ))
        .expect("caps only");
        assert_eq!(c.opt_outs[0].key, "cooling_loss.actions");
        assert!(c.opt_outs[0]
            .said
            .starts_with("[cooling_loss] actions = \"none\""));
        assert!(!c.volatile_state());
        let c = twin("").expect("a demonstration");
        assert!(c.opt_outs.is_empty());
    }

    /// A power-down later than the safety case's 30 s is taken, and said
    /// as an opt-out: at start, in `ctl status` and on `/metrics`.
    #[test]
    fn a_grace_longer_than_the_safety_cases_is_an_opt_out() {
        let dir = tempfile::tempdir().unwrap();
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        let host = format!("{ring}{FLASH}{RACK}{QUARANTINE}{BOTH}");
        for grace in [0, 30] {
            let c = nvml(&format!("{host}grace_s = {grace}\n")).expect("valid");
            assert!(c.opt_outs.is_empty(), "{grace}: {:?}", c.opt_outs);
        }
        let c = nvml(&format!("{host}grace_s = 31\n")).expect("valid");
        assert_eq!(c.cooling_loss.grace.as_secs(), 31);
        let keys: Vec<&str> = c.opt_outs.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["cooling_loss.grace_s"]);
        assert!(
            c.opt_outs[0]
                .said
                .starts_with("[cooling_loss] grace_s = 31: a rack that loses cooling is powered down 31 s after its drain, not the 30 s"),
            "{:?}",
            c.opt_outs
        );
        let flags = Overrides {
            cooling_grace_s: Some(120),
            ..Overrides::default()
        };
        let text = format!("site = \"a\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\n{host}");
        let c = resolve(None, &text, &flags).expect("valid");
        assert_eq!(
            c.opt_outs[0].key, "cooling_loss.grace_s",
            "from the flag too"
        );
        let c = twin(&format!("{RACK}{BOTH}grace_s = 600\n")).expect("valid");
        assert_eq!(c.opt_outs[0].key, "cooling_loss.grace_s", "on any GPUs");
        // Nothing to delay without a power-down.
        let c = twin(&format!("{RACK}{DRAIN}grace_s = 600\n")).expect("valid");
        assert!(c.opt_outs.is_empty(), "{:?}", c.opt_outs);
    }

    /// XID 79 quarantines a GPU; without a quarantine action nothing
    /// drains it and jobs keep landing on it: refused on real GPUs unless
    /// the site's scheduler reads the quarantine from the bus, written
    /// as `reported_only = true`, which is then said at every start.
    #[test]
    fn real_gpus_without_a_quarantine_action_are_refused_unless_reported_only() {
        let dir = tempfile::tempdir().unwrap();
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        let host = format!("{ring}{FLASH}{RACK}");
        let e = nvml(&format!("{host}{BOTH}")).unwrap_err();
        assert!(
            e.contains("need a quarantine action") && e.contains("reported_only = true"),
            "{e}"
        );
        let c = nvml(&format!("{host}{REPORTED_ONLY}{BOTH}")).expect("reported only");
        let keys: Vec<&str> = c.opt_outs.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["quarantine.reported_only"]);
        assert!(
            c.opt_outs[0]
                .said
                .starts_with("[quarantine] reported_only = true: a quarantined GPU is not drained"),
            "{:?}",
            c.opt_outs
        );
        let flags = Overrides {
            quarantine_reported_only: true,
            ..Overrides::default()
        };
        let text = format!("site = \"a\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\n{host}{BOTH}");
        let c = resolve(None, &text, &flags).expect("from the flag");
        assert_eq!(c.opt_outs[0].key, "quarantine.reported_only");
        // Beside actions it is a contradiction, on any GPUs.
        let both = "[quarantine]\nactions = [[\"drain\"]]\nreported_only = true\n";
        let e = twin(both).unwrap_err();
        assert!(
            e.contains("reported_only = true and quarantine actions"),
            "{e}"
        );
        assert!(
            twin("").unwrap().opt_outs.is_empty(),
            "twins are not held to it"
        );
    }

    #[test]
    fn opt_outs_that_contradict_the_config_or_have_other_values_are_refused() {
        let e = twin("commands = \"off\"\n").unwrap_err();
        assert!(e.contains("the only value is \"none\""), "{e}");
        let e = twin(&format!("cooling = \"not_managed\"\n{RACK}")).unwrap_err();
        assert!(e.contains("remove one or the other"), "{e}");
        let e = twin(&format!("{FLASH}volatile_state = true\n")).unwrap_err();
        assert!(e.contains("volatile_state = true with a flash file"), "{e}");
        let e = twin(&format!("{RACK}{DRAIN}actions = \"none\"\n")).unwrap_err();
        assert!(
            e.contains("actions = \"none\" and cooling-loss commands"),
            "{e}"
        );
    }

    /// A misspelt or missing action program, or one on a file system not
    /// mounted yet at boot, would fail when the action is needed (a
    /// power-down at a cooling loss is not tried again). On real GPUs the
    /// start goes on (a refused start would leave the host with no guard
    /// at all): an error naming the section, the key, the line, the
    /// program and the PATH searched, and a protection off of that key
    /// (one per key); on simulated GPUs a warning only.
    #[test]
    fn an_action_program_not_found_at_start_is_a_protection_off_on_real_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let ring = keyring(dir.path(), Role::Cdu, "cdu1");
        let host = format!(
            "site = \"a\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\n{ring}{FLASH}{RACK}{QUARANTINE}"
        );
        let file = std::path::Path::new("/etc/loopwarden/node-agent.toml");
        let with_power_down = |program: &str| {
            let text = format!("{host}[cooling_loss]\ndrain = [[\"true\"]]\npower_down = [[{program:?}, \"chassis\"]]\n");
            let (c, log) = logged(|| resolve(Some(file), &text, &Overrides::default()));
            (c.expect("taken: the agent starts"), log)
        };
        let (c, log) = with_power_down("no-such-prog-xyz");
        let line = host.lines().count() + 3;
        let said = format!("/etc/loopwarden/node-agent.toml line {line}: [cooling_loss] power_down: program \"no-such-prog-xyz\" not found on PATH ({}): ", std::env::var("PATH").unwrap());
        let [off] = &c.programs_missing[..] else {
            panic!("one protection off: {:?}", c.programs_missing);
        };
        assert_eq!(off.key, "cooling_loss.power_down");
        assert!(off.said.starts_with(&said), "{off:?}");
        assert!(log.contains("ERROR") && log.contains(&said), "{log}");
        assert!(c.opt_outs.is_empty(), "not an opt-out: {:?}", c.opt_outs);
        let (c, _) = with_power_down("true");
        assert_eq!(c.programs_missing, [], "found on PATH");
        let not_executable = dir.path().join("power-off");
        std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
        let program = not_executable.to_str().unwrap();
        let (c, _) = with_power_down(program);
        let want = format!("[cooling_loss] power_down: program \"{program}\" is not executable");
        assert!(c.programs_missing[0].said.contains(&want), "{c:?}");
        let (c, _) = with_power_down(dir.path().to_str().unwrap());
        assert!(c.programs_missing[0].said.contains("is not a regular file"));
        // Two programs of one key: one entry (one series on /metrics).
        let c = nvml(&format!(
            "{ring}{FLASH}{RACK}{BOTH}[quarantine]\nactions = [[\"scontrl\", \"{{host}}\"], [\"tickit\"]]\n"
        ))
        .expect("taken");
        let [off] = &c.programs_missing[..] else {
            panic!("one per key: {:?}", c.programs_missing);
        };
        assert_eq!(off.key, "quarantine.actions");
        for program in ["scontrl", "tickit"] {
            let want = format!("[quarantine] actions: program \"{program}\" not found on PATH");
            assert!(off.said.contains(&want), "{off:?}");
        }
        // Simulated GPUs run stand-ins: said, and taken.
        let (c, log) = logged(|| {
            twin(&format!(
                "{RACK}[cooling_loss]\npower_down = [[\"no-such-prog-xyz\"]]\n"
            ))
        });
        assert_eq!(c.expect("simulated GPUs").programs_missing, []);
        assert!(
            log.contains("WARN")
                && log.contains("power_down: program \"no-such-prog-xyz\" not found"),
            "{log}"
        );
    }

    #[test]
    fn site_and_twin_limits_stay_in_the_boards_range() {
        let c = twin("site_limit_w = 500\ntwin_admin_limit_w = 450\n").expect("valid");
        assert_eq!(
            (c.site_limit, c.twin_admin_limit),
            (
                Some(loopwarden_protocol::Watts(500)),
                Some(loopwarden_protocol::Watts(450))
            )
        );
        let e = twin("site_limit_w = 50\n").unwrap_err();
        assert!(
            e.contains("site_limit_w") && e.contains("settable range"),
            "{e}"
        );
        let e = nvml(&format!(
            "{KEYRING_OFF}cooling = \"not_managed\"\ntwin_admin_limit_w = 500\n"
        ))
        .unwrap_err();
        assert!(e.contains("for simulated GPUs"), "{e}");
    }
}

//! The agent's configuration: a TOML file, every field overridable by a
//! flag, checked as a whole at start.
//!
//! A key the agent does not know, a value of the wrong type or a value out
//! of its range stops the start with the file, the line and the reason;
//! nothing is guessed. `docs/node-agent.md` lists every field.
//!
//! Glossary:
//! - *origin*: where a value came from (a line of the file, a flag, the
//!   default), so an error points at it.
//! - *twin*: simulated GPUs instead of NVML.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use loopwarden_field::common;
pub use loopwarden_field::config::ConfigError;
use loopwarden_field::config::{self as field, local_host_name, range, Sources};
use loopwarden_field::pick;
use loopwarden_protocol::{DurationMs, Ident, Watts};
use serde::Deserialize;

mod cooling_loss;
mod protection;
pub use protection::OptOut;
mod sampling;
pub use cooling_loss::{CoolingLossActions, CoolingLossFile, COOLING_PLACEHOLDERS};
use sampling::{guard, timings};

use loopwarden_protocol::auth::Signer;
use node_core::caps::LeaseLimits;
use node_core::commands::Authority;
use node_core::guard::GuardSettings;

loopwarden_field::agent_file! {
    /// The file as written (every field optional): the common fields
    /// (`loopwarden_field::common`), then the host agent's own.
    pub struct FileConfig {
        /// Host id.
        pub host: Option<String>,
        /// Simulated GPUs instead of NVML (0: NVML).
        pub twin_gpus: Option<u8>,
        /// How many GPUs this host has: fewer found at the start is said
        /// (a GPU that failed the driver's probe, or fell off the bus
        /// before it loaded).
        pub expected_gpus: Option<u8>,
        /// GPU board model (`H200-SXM`) or a board file.
        pub board: Option<String>,
        /// Sampling period, ms.
        pub period_ms: Option<u64>,
        /// JSON mirror period for telemetry, ms.
        pub json_period_ms: Option<u64>,
        /// Deadline of one GPU call, ms.
        pub deadline_ms: Option<u64>,
        /// Seconds between reads of the slow counters (aggregate ECC,
        /// retired pages, remapped rows, the recovery action, NVLink per
        /// link; PCIe replays only on a GPU that answers none of the
        /// per-sample field values, which reads them with these).
        pub slow_counters_s: Option<u64>,
        /// Missed samples in a row before a GPU is reported unresponsive.
        pub unresponsive_after: Option<u32>,
        /// The CDU whose loop cools this host (its state is the health
        /// engine's cooling context).
        pub cdu: Option<String>,
        /// This host's rack on that CDU (0 to 15).
        pub rack: Option<u8>,
        /// Thermal guard.
        pub guard: Option<GuardFile>,
        /// Health engine.
        pub health: Option<HealthFile>,
        /// Quarantine actions.
        pub quarantine: Option<QuarantineFile>,
        /// What to do when the rack loses cooling.
        pub cooling_loss: Option<CoolingLossFile>,
        /// The longest cap lease taken, ms.
        pub max_lease_ms: Option<u64>,
        /// The most cap leases held at once.
        pub max_leases: Option<u64>,
        /// Who may command this host (public keys and rights).
        pub keyring: Option<PathBuf>,
        /// Serve Prometheus metrics on this address (`IP:PORT`); off
        /// when absent.
        pub metrics_listen: Option<String>,
        /// The highest power limit ever set on this host's GPUs, W.
        pub site_limit_w: Option<u32>,
        /// Simulated GPUs start at this limit, W (as an administrator's).
        pub twin_admin_limit_w: Option<u32>,
        /// `"none"`: no keyring on purpose; the host takes no command.
        pub commands: Option<String>,
        /// `"not_managed"`: no CDU of this site cools this host.
        pub cooling: Option<String>,
        /// No flash file, on purpose: what the agent keeps is lost at
        /// every restart.
        pub volatile_state: Option<bool>,
        /// `"not_required"`: GPUs without persistence mode are taken.
        pub persistence: Option<String>,
    }
}

/// `[health]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthFile {
    /// Hours without new evidence before `degraded` falls back to healthy.
    pub quiet_period_h: Option<u32>,
}

/// `[guard]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardFile {
    /// Start capping at this temperature, °C.
    pub engage_c: Option<u8>,
    /// Start lifting at this temperature, °C.
    pub release_c: Option<u8>,
    /// Watts per sample.
    pub step_w: Option<u32>,
}

/// `[quarantine]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuarantineFile {
    /// Commands as argument vectors, with placeholders.
    pub actions: Option<Vec<Vec<String>>>,
    /// Timeout per command, s.
    pub timeout_s: Option<u64>,
    /// No action, on purpose: the site's scheduler reads the quarantine
    /// from the bus.
    pub reported_only: Option<bool>,
    /// Run the actions of every GPU still quarantined again at each
    /// start, known done or not (only where each is harmless run again).
    pub again_at_start: Option<bool>,
}

loopwarden_field::agent_flags! {
    /// Values given as flags, each overriding the file: the common fields,
    /// then the host agent's own.
    pub struct Overrides {
        /// Host id (ident); default: the machine's host name.
        #[arg(long)]
        pub host: Option<String>,
        /// Simulate this many GPUs instead of using NVML.
        #[cfg(feature = "twin")]
        #[arg(long)]
        pub twin_gpus: Option<u8>,
        /// GPU board model (`H200-SXM`, `H100-SXM`) or a board TOML file.
        #[arg(long)]
        pub board: Option<String>,
        /// Sampling period in ms.
        #[arg(long)]
        pub period_ms: Option<u64>,
        /// Period of the telemetry JSON mirror in ms.
        #[arg(long)]
        pub json_period_ms: Option<u64>,
        /// Deadline of one GPU call in ms.
        #[arg(long)]
        pub deadline_ms: Option<u64>,
        /// Seconds between reads of the slow counters (default 30).
        #[arg(long)]
        pub slow_counters_s: Option<u64>,
        /// The longest cap lease taken, in ms (default 600000: 10 minutes).
        #[arg(long)]
        pub max_lease_ms: Option<u64>,
        /// The most cap leases held at once (default 16).
        #[arg(long)]
        pub max_leases: Option<u64>,
        /// The keyring: who may command this host, with what (`lwbus pki
        /// init` writes one); without it, twin GPUs take the public demo
        /// key and real GPUs take no command.
        #[arg(long)]
        pub keyring: Option<PathBuf>,
        /// Missed samples in a row before a GPU counts as unresponsive.
        #[arg(long)]
        pub unresponsive_after: Option<u32>,
        /// How many GPUs this host has (1 to 16); fewer found is said.
        #[arg(long)]
        pub expected_gpus: Option<u8>,
        /// The CDU whose loop cools this host (ident).
        #[arg(long)]
        pub cdu: Option<String>,
        /// This host's rack on that CDU (0 to 15).
        #[arg(long)]
        pub rack: Option<u8>,
        /// Hours without new evidence before a degraded GPU is healthy again.
        #[arg(long)]
        pub health_quiet_period_h: Option<u32>,
        /// Thermal guard: engage at this temperature, °C.
        #[arg(long)]
        pub guard_engage_c: Option<u8>,
        /// Thermal guard: release at this temperature, °C.
        #[arg(long)]
        pub guard_release_c: Option<u8>,
        /// Thermal guard: watts per sample.
        #[arg(long)]
        pub guard_step_w: Option<u32>,
        /// A quarantine action, as one string split on white space (repeat
        /// for several; replaces the file's list).
        #[arg(long = "quarantine-action")]
        pub quarantine_actions: Vec<String>,
        /// Timeout of a quarantine action, s.
        #[arg(long)]
        pub quarantine_timeout_s: Option<u64>,
        /// No quarantine action on purpose: the site's scheduler reads the
        /// quarantine from the bus.
        #[arg(long)]
        pub quarantine_reported_only: bool,
        /// Run the actions of every GPU still quarantined again at each
        /// start, known done or not (only where each is harmless run
        /// again: a drain, never a scancel or a ticket).
        #[arg(long)]
        pub quarantine_again_at_start: bool,
        /// A command when the rack loses cooling, split on white space
        /// (repeat for several; replaces the file's `drain`).
        #[arg(long = "cooling-drain")]
        pub cooling_drain: Vec<String>,
        /// A command after the grace period (replaces `power_down`).
        #[arg(long = "cooling-power-down")]
        pub cooling_power_down: Vec<String>,
        /// A command when cooling is back, if powered down (replaces
        /// `power_up`).
        #[arg(long = "cooling-power-up")]
        pub cooling_power_up: Vec<String>,
        /// A command when cooling is back (replaces `resume`).
        #[arg(long = "cooling-resume")]
        pub cooling_resume: Vec<String>,
        /// Seconds between the drain and the power-down.
        #[arg(long)]
        pub cooling_grace_s: Option<u64>,
        /// Timeout of a cooling-loss command, s.
        #[arg(long)]
        pub cooling_timeout_s: Option<u64>,
        /// Serve Prometheus metrics at http://ADDR/metrics (`IP:PORT`, or
        /// `:PORT` for every interface); off by default.
        #[arg(long, value_name = "ADDR")]
        pub metrics_listen: Option<String>,
        /// The highest power limit ever set on this host's GPUs, W (the
        /// site's limit; default: the limit found on each GPU).
        #[arg(long)]
        pub site_limit_w: Option<u32>,
        /// Simulated GPUs start at this power limit, W, as if an
        /// administrator had set it.
        #[cfg(feature = "twin")]
        #[arg(long)]
        pub twin_admin_limit_w: Option<u32>,
        /// `none`: run without a keyring on purpose (no command taken).
        #[arg(long)]
        pub commands: Option<String>,
        /// `not_managed`: no CDU of this site cools this host.
        #[arg(long)]
        pub cooling: Option<String>,
        /// Run without a flash file on purpose (quarantines, leases and
        /// the limits set are lost at every restart).
        #[arg(long)]
        pub volatile_state: bool,
        /// `none`: no command when the rack loses cooling, on purpose.
        #[arg(long)]
        pub cooling_loss_actions: Option<String>,
        /// `not_required`: take GPUs without persistence mode, on purpose
        /// (the limits left at a stop may revert to the default).
        #[arg(long)]
        pub persistence: Option<String>,
    }
}

/// Where the GPUs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSourceKind {
    /// Real GPUs through NVML.
    Nvml,
    /// This many simulated GPUs.
    Twin(u8),
}

/// The checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Site.
    pub site: Ident,
    /// Host id.
    pub host: Ident,
    /// Brokers, tried in turn (see `loopwarden_bus::Brokers`); `None`:
    /// embedded.
    pub broker: Option<loopwarden_bus::Brokers>,
    /// Broker credentials.
    pub credentials: Option<(String, String)>,
    /// MQTT keep-alive.
    pub keep_alive: Duration,
    /// The JSON `online` on a connection of its own, with a will.
    pub json_presence: bool,
    /// GPU source.
    pub gpus: GpuSourceKind,
    /// Board model or file.
    pub board: loopwarden_boards::GpuBoard,
    /// Sampling period.
    pub period: Duration,
    /// Telemetry JSON mirror period.
    pub json_period: Duration,
    /// Deadline of one GPU call.
    pub deadline: Duration,
    /// Between reads of the slow counters (at least one period).
    pub slow_counters: Duration,
    /// Missed samples before unresponsive.
    pub unresponsive_after: u32,
    /// How many GPUs the host has, if configured.
    pub expected_gpus: Option<u8>,
    /// Flash file.
    pub flash: Option<PathBuf>,
    /// Console socket.
    pub console: PathBuf,
    /// Its bounds: connections at once, idle time.
    pub console_limits: loopwarden_field::listen::Limits,
    /// The serial console, if one is configured (read-only: see
    /// `console::SerialHost`).
    pub serial: Option<loopwarden_field::serial::SerialConsole>,
    /// TLS to the broker.
    pub tls: Option<loopwarden_bus::tls::Tls>,
    /// Who may command this host: the keyring's signers and its CDU.
    pub authority: Authority,
    /// Whether the keyring is the public demonstration one (twin only).
    pub demo_key: bool,
    /// The CDU whose loop cools this host.
    pub cdu: Option<Ident>,
    /// This host's rack on that CDU.
    pub rack: Option<u8>,
    /// Quiet time before `degraded` falls back to healthy.
    pub quiet_period: Duration,
    /// Thermal guard.
    pub guard: GuardSettings,
    /// Quarantine actions (argument vectors with placeholders).
    pub quarantine_actions: Vec<Vec<String>>,
    /// Timeout per action.
    pub quarantine_timeout: Duration,
    /// Whether the actions of a GPU still quarantined run again at each
    /// start though known done (`[quarantine] again_at_start`).
    pub quarantine_again_at_start: bool,
    /// What to do when the rack loses cooling, and when it is back.
    pub cooling_loss: CoolingLossActions,
    /// What the host takes of cap leases.
    pub lease_limits: LeaseLimits,
    /// Where `/metrics` is served; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// The highest power limit ever set on a GPU (`site_limit_w`).
    pub site_limit: Option<Watts>,
    /// The limit simulated GPUs start at (`twin_admin_limit_w`).
    pub twin_admin_limit: Option<Watts>,
    /// The protections switched off on purpose, each as its key and what
    /// it means: said in the log at start, and shown by `ctl status` and
    /// `/metrics` while the agent runs.
    pub opt_outs: Vec<OptOut>,
    /// On real GPUs, the action programs not found at start, one entry
    /// per key (`cooling_loss.power_down`): protections off, said as an
    /// error at start and shown beside the opt-outs.
    pub programs_missing: Vec<OptOut>,
}

/// Placeholders a quarantine action may use.
pub const PLACEHOLDERS: [&str; 5] = ["{host}", "{site}", "{gpu}", "{uuid}", "{reason}"];

impl Config {
    /// Whether a GPU without persistence mode is said as an error and
    /// shown as a protection off on real GPUs (the start goes on): unless
    /// `persistence = "not_required"` is written.
    pub fn persistence_required(&self) -> bool {
        !self
            .opt_outs
            .iter()
            .any(|o| o.key == protection::PERSISTENCE)
    }

    /// Whether `volatile_state = true` is written: no flash file on
    /// purpose, so the leases die with the agent and a stop puts the
    /// ceilings back even under one (`node_core::node::Setup`).
    pub fn volatile_state(&self) -> bool {
        self.opt_outs
            .iter()
            .any(|o| o.key == protection::VOLATILE_STATE)
    }

    /// Samples from one read of the slow counters to the next (at least
    /// 1): `slow_counters` rounded up to whole periods.
    pub fn slow_every(&self) -> u32 {
        let period = self.period.as_millis().max(1);
        self.slow_counters
            .as_millis()
            .div_ceil(period)
            .clamp(1, u128::from(u32::MAX)) as u32
    }
}

/// Reads `path` (if any), applies `flags` and checks the result.
pub fn load(path: Option<&Path>, flags: &Overrides) -> Result<Config, ConfigError> {
    let text = field::read_optional(path)?;
    resolve(path, &text, flags)
}

/// Checks a configuration given as text (the file at `path`) and flags:
/// the common fields, then this host, its GPUs and their board, the
/// timings, the thermal guard, the cooling context, health, the quarantine
/// actions and the keys, each by its own function below (in that order, so
/// the first error reported stays the same).
pub fn resolve(path: Option<&Path>, text: &str, flags: &Overrides) -> Result<Config, ConfigError> {
    let file: FileConfig = field::parse(path, text)?;
    let src = Sources::new(path, text);

    let common = common::resolve(&src, file.common(), &flags.common, default_console)?;
    let host = field::ident(
        &src,
        pick!(flags.host, file.host, "host"),
        "host",
        local_host_name(),
    )?;
    let gpus = gpu_source(&src, &file, flags)?;
    let board = board(&src, &file, flags)?;
    let timings = timings(&src, &file, flags)?;
    let guard = guard(&src, &file, flags, &board)?;
    let (cdu, rack) = cooling_context(&src, &file, flags)?;
    let quiet_period = quiet_period(&src, &file, flags)?;
    let mut programs = protection::Programs::new(&gpus);
    let quarantine = quarantine(&src, &file, flags, &mut programs)?;
    let has_rack = cdu.is_some() && rack.is_some();
    let cooling_loss = cooling_loss::cooling_loss(&src, &file, flags, has_rack, &mut programs)?;
    let keyring = pick!(flags.keyring, file.keyring, "keyring");
    let production = match (&gpus, &keyring.0) {
        (GpuSourceKind::Nvml, _) => Some("real GPUs"),
        (_, Some(_)) => Some("a site keyring"),
        _ => None,
    };
    common::check_broker(&src, &common, production)?;
    let production_agent = production.map(|why| format!("an agent on {why}"));
    common::require_site(&src, &common, production_agent.as_deref())?;
    let (signers, demo_key) = signers(&src, keyring.clone(), &gpus, &common.site)?;
    let site_limit = protection::site_limit(&src, &file, flags, &board)?;
    let twin_admin_limit = protection::twin_admin_limit(&src, &file, flags, &gpus, &board)?;
    let setting = protection::Setting {
        gpus: &gpus,
        keyring: keyring.0.is_some(),
        signers: &signers,
        cdu: &cdu,
        rack,
        cooling_loss: &cooling_loss,
        flash: common.flash.is_some(),
        quarantine_actions: !quarantine.actions.is_empty(),
    };
    let opt_outs = protection::opt_outs(&src, &file, flags, &setting)?;
    let lease_limits = lease_limits(&src, &file, flags)?;
    let metrics_listen = metrics_listen(&src, &file, flags)?;

    // Last: a file not filled in yet is refused for what it lacks first.
    common::check_tls_identity(&src, &common, "host", &host)?;
    Ok(Config {
        site: common.site,
        host,
        broker: common.broker,
        credentials: common.credentials,
        tls: common.tls,
        keep_alive: common.keep_alive,
        json_presence: common.json_presence,
        gpus,
        board,
        period: timings.period,
        json_period: timings.json_period,
        deadline: timings.deadline,
        slow_counters: timings.slow_counters,
        unresponsive_after: timings.unresponsive_after,
        expected_gpus: timings.expected_gpus,
        flash: common.flash,
        console: common.console,
        console_limits: common.console_limits,
        serial: common.serial,
        authority: Authority {
            signers,
            cdu: cdu.clone(),
        },
        demo_key,
        cdu,
        rack,
        quiet_period,
        guard,
        quarantine_actions: quarantine.actions,
        quarantine_timeout: quarantine.timeout,
        quarantine_again_at_start: quarantine.again_at_start,
        cooling_loss,
        lease_limits,
        metrics_listen,
        site_limit,
        twin_admin_limit,
        opt_outs,
        programs_missing: programs.missing,
    })
}

/// `metrics_listen`: the address `/metrics` is served on, if any.
fn metrics_listen(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Option<SocketAddr>, ConfigError> {
    let given = pick!(flags.metrics_listen, file.metrics_listen, "metrics-listen");
    common::metrics_listen(src, given)
}

/// What the host takes of cap leases: the longest (1 s to 1 h, 10 minutes
/// by default) and how many at once (1 to 256, 16 by default).
fn lease_limits(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<LeaseLimits, ConfigError> {
    let max_ms = range(
        src,
        pick!(flags.max_lease_ms, file.max_lease_ms, "max-lease-ms"),
        "max_lease_ms",
        600_000,
        1_000,
        3_600_000,
        " ms",
    )?;
    let max_leases = range(
        src,
        pick!(flags.max_leases, file.max_leases, "max-leases"),
        "max_leases",
        16,
        1,
        256,
        "",
    )?;
    Ok(LeaseLimits {
        max_duration: DurationMs(max_ms as u32),
        max_leases: max_leases as usize,
    })
}

/// Where the GPUs come from: NVML, or `twin_gpus` simulated ones (0 to 16;
/// 0 is NVML).
fn gpu_source(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<GpuSourceKind, ConfigError> {
    #[cfg(feature = "twin")]
    let picked = pick!(flags.twin_gpus, file.twin_gpus, "twin-gpus");
    #[cfg(not(feature = "twin"))]
    let picked = {
        let _ = flags;
        pick!(None::<u8>, file.twin_gpus, "twin-gpus")
    };
    let twin = range(src, picked, "twin_gpus", 0, 0, 16, " GPUs")?;
    if twin > 0 && cfg!(not(feature = "twin")) {
        return Err(src.error(
            None,
            "twin_gpus",
            "twin_gpus: this build has no simulated GPUs (built without the `twin` feature); remove it to read the GPUs through NVML".into(),
        ));
    }
    Ok(if twin == 0 {
        GpuSourceKind::Nvml
    } else {
        GpuSourceKind::Twin(twin)
    })
}

/// The GPU board: a known model, else a board file; the H200-SXM when
/// none is given.
fn board(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<loopwarden_boards::GpuBoard, ConfigError> {
    Ok(match pick!(flags.board, file.board, "board") {
        (None, _) => loopwarden_boards::GpuBoard::builtin("H200-SXM").expect("shipped board"),
        (Some(b), flag) => match loopwarden_boards::GpuBoard::builtin(&b) {
            Some(board) => board,
            None if Path::new(&b).exists() => loopwarden_boards::GpuBoard::load(Path::new(&b))
                .map_err(|e| src.error(flag, "board", e.to_string()))?,
            None => {
                return Err(src.error(
                    flag,
                    "board",
                    format!(
                        "board = {b:?} is neither a known model (H200-SXM, H100-SXM) nor a file"
                    ),
                ))
            }
        },
    })
}

/// The cooling context: the CDU whose loop cools this host (a name) and
/// the host's rack on it (0 to 15), each optional.
fn cooling_context(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<(Option<Ident>, Option<u8>), ConfigError> {
    let cdu = match pick!(flags.cdu, file.cdu, "cdu") {
        (Some(c), flag) => Some(
            Ident::new(&c)
                .map_err(|e| src.error(flag, "cdu", format!("cdu = {c:?} is not a name: {e}")))?,
        ),
        (None, _) => None,
    };
    let rack_pick = pick!(flags.rack, file.rack, "rack");
    let rack = match rack_pick.0 {
        Some(_) => Some(range(src, rack_pick, "rack", 0, 0, 15, "")?),
        None => None,
    };
    Ok((cdu, rack))
}

/// `[health]`: the quiet time before `degraded` falls back to healthy
/// (1 h to 90 days, 6 h by default).
fn quiet_period(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
) -> Result<Duration, ConfigError> {
    let none = HealthFile::default();
    let h = file.health.as_ref().unwrap_or(&none);
    let quiet_h = range(
        &src.section("health"),
        pick!(
            flags.health_quiet_period_h,
            h.quiet_period_h,
            "health-quiet-period-h"
        ),
        "quiet_period_h",
        6,
        1,
        24 * 90,
        " h",
    )?;
    Ok(Duration::from_secs(u64::from(quiet_h) * 3600))
}

/// The quarantine actions, checked.
struct Quarantine {
    actions: Vec<Vec<String>>,
    timeout: Duration,
    again_at_start: bool,
}

/// `[quarantine]`: the actions (the flags' list replaces the file's), each
/// checked by [`check_action`], the timeout per action, and whether they
/// run again at each start though known done (default: not).
fn quarantine(
    src: &Sources,
    file: &FileConfig,
    flags: &Overrides,
    programs: &mut protection::Programs,
) -> Result<Quarantine, ConfigError> {
    let none = QuarantineFile::default();
    let q = file.quarantine.as_ref().unwrap_or(&none);
    let at = ActionsAt {
        section: "quarantine",
        key: "actions",
        flag: "quarantine-action",
        setting: "quarantine.actions",
    };
    let actions = actions(
        src,
        at,
        (&flags.quarantine_actions, &q.actions),
        &PLACEHOLDERS,
        programs,
    )?;
    let timeout = range(
        &src.section("quarantine"),
        pick!(
            flags.quarantine_timeout_s,
            q.timeout_s,
            "quarantine-timeout-s"
        ),
        "timeout_s",
        30,
        1,
        600,
        " s",
    )?;
    let flag = flags.quarantine_again_at_start.then_some(true);
    let (again_at_start, _) = pick!(flag, q.again_at_start, "quarantine-again-at-start");
    Ok(Quarantine {
        actions,
        timeout: Duration::from_secs(timeout),
        again_at_start: again_at_start.unwrap_or(false),
    })
}

/// The keyring's signers; without a keyring, the public demonstration
/// ones for twin GPUs (`true`: they are those), else none (every command
/// refused). A keyring for another site is refused.
fn signers(
    src: &Sources,
    keyring: (Option<PathBuf>, Option<&'static str>),
    gpus: &GpuSourceKind,
    site: &Ident,
) -> Result<(Vec<Signer>, bool), ConfigError> {
    Ok(match keyring {
        (Some(p), flag) => (
            loopwarden_bus::keys::read_site_keyring(&p, site, "host")
                .map_err(|m| src.error(flag, "keyring", m))?,
            false,
        ),
        (None, _) if matches!(gpus, GpuSourceKind::Twin(_)) => {
            (Authority::demo(None).signers, true)
        }
        (None, _) => (Vec::new(), false),
    })
}

/// Where a list of actions is configured: its section, its key, the
/// flag that replaces it, and the two as one (`section.key`).
#[derive(Debug, Clone, Copy)]
struct ActionsAt {
    section: &'static str,
    key: &'static str,
    flag: &'static str,
    setting: &'static str,
}

/// A list of actions: the flag's (each string split on white space)
/// replaces the file's; each checked by [`check_action`] against `known`,
/// and its program looked for (`protection::Programs`).
fn actions(
    src: &Sources,
    at: ActionsAt,
    (flag, file): (&[String], &Option<Vec<Vec<String>>>),
    known: &[&str],
    programs: &mut protection::Programs,
) -> Result<Vec<Vec<String>>, ConfigError> {
    let (actions, from_flag) = if flag.is_empty() {
        (file.clone().unwrap_or_default(), None)
    } else {
        let split = flag
            .iter()
            .map(|a| a.split_whitespace().map(String::from).collect())
            .collect();
        (split, Some(at.flag))
    };
    let error = |m: String| src.section(at.section).error(from_flag, at.key, m);
    for a in &actions {
        check_action(a, known).map_err(error)?;
        let here = format!("[{}] {}", at.section, at.key);
        programs.look_for(at.setting, &a[0], |why| error(format!("{here}: {why}")));
    }
    Ok(actions)
}

/// An action is a non-empty argument vector whose placeholders are among
/// `known`.
fn check_action(action: &[String], known: &[&str]) -> Result<(), String> {
    let Some(program) = action.first() else {
        return Err("an action is empty: give the program and its arguments".into());
    };
    if program.contains('{') {
        return Err(format!(
            "the program of an action cannot be a placeholder: {program:?}"
        ));
    }
    for arg in action {
        let mut rest = arg.as_str();
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("unclosed placeholder in {arg:?}"))?;
            let name = &rest[open..open + close + 1];
            if !known.contains(&name) {
                return Err(format!(
                    "unknown placeholder {name} in {arg:?}; known: {}",
                    known.join(" ")
                ));
            }
            rest = &rest[open + close + 1..];
        }
    }
    Ok(())
}

pub use loopwarden_bus::keys::read_keyring;

/// `/run/loopwarden/node-agent.sock` where it can be made (root), else
/// `loopwarden-node-agent.sock` under `$XDG_RUNTIME_DIR` or `/tmp`. The
/// same for `run` and `ctl`, so `ctl` finds the agent without flags; a
/// second agent on the same machine needs `--console`.
pub fn default_console() -> PathBuf {
    field::default_socket("node-agent", ".probe")
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopwarden_protocol::WholeCelsius;

    fn from(text: &str) -> Result<Config, ConfigError> {
        resolve(Some(Path::new("agent.toml")), text, &Overrides::default())
    }

    #[test]
    fn defaults_and_a_full_file() {
        let c = from(
            "site = \"hall-1\"\nhost = \"h07\"\nbroker = \"10.0.0.5:1883\"\ntwin_gpus = 8\n\
             period_ms = 500\n[guard]\nengage_c = 84\nrelease_c = 78\n\
             [quarantine]\nactions = [[\"scontrol\", \"update\", \"NodeName={host}\", \"State=DRAIN\", \"Reason={reason}\"]]\n",
        )
        .expect("valid");
        assert_eq!(c.host.as_str(), "h07");
        assert_eq!(c.period, Duration::from_millis(500));
        assert_eq!(c.json_period, Duration::from_millis(5000));
        assert_eq!(c.deadline, Duration::from_millis(125));
        assert_eq!(c.guard.engage, WholeCelsius(84));
        assert_eq!(c.gpus, GpuSourceKind::Twin(8));
        assert!(c.demo_key, "twin without keys takes the demonstration key");
        assert_eq!(c.quarantine_actions[0][0], "scontrol");
    }

    /// A GPU's quarantine actions known done run again at a start only
    /// where the site says each is harmless run again: off by default,
    /// on from the file or the flag.
    #[test]
    fn quarantine_actions_run_again_at_start_only_when_asked() {
        let base = "site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\n[quarantine]\n";
        assert!(!from(base).expect("valid").quarantine_again_at_start);
        let c = from(&format!("{base}again_at_start = true\n")).expect("valid");
        assert!(c.quarantine_again_at_start);
        let flags = Overrides {
            quarantine_again_at_start: true,
            ..Overrides::default()
        };
        let c = resolve(Some(Path::new("agent.toml")), base, &flags).expect("valid");
        assert!(c.quarantine_again_at_start);
        let e = from(&format!("{base}again_at_start = \"yes\"\n")).unwrap_err();
        assert!(e.to_string().contains("line 5"), "{e}");
    }

    #[test]
    fn expected_gpus_is_optional_and_1_to_16() {
        let base = "site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\n";
        assert_eq!(from(base).expect("valid").expected_gpus, None);
        let c = from(&format!("{base}expected_gpus = 8\n")).expect("valid");
        assert_eq!(c.expected_gpus, Some(8));
        for bad in [0, 17] {
            let e = from(&format!("{base}expected_gpus = {bad}\n")).unwrap_err();
            assert_eq!(e.line, Some(4), "{e}");
            assert!(e.message.contains("expected_gpus = "), "{e}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_with_their_line() {
        let e = from("site = \"a\"\nhost = \"b\"\nperod_ms = 5\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("perod_ms"), "{e}");
        let e = from("site = \"a\"\nhost = \"b\"\n[guard]\nengage = 80\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused_with_their_line() {
        let e = from("site = \"a\"\nhost = \"b\"\n\nperiod_ms = 50\n").unwrap_err();
        assert_eq!(e.line, Some(4));
        assert!(
            e.to_string()
                .contains("agent.toml line 4: period_ms = 50 is out of range"),
            "{e}"
        );
        let e = from("site = \"a\"\nhost = \"b\"\n[guard]\nengage_c = 80\nrelease_c = 85\n")
            .unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        let e = from("site = \"a b\"\nhost = \"b\"\n").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let e = from("site = \"a\"\nhost = \"b\"\nperiod_ms = \"fast\"\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        // Leases: ten minutes and sixteen by default, an hour at most.
        let c = from("site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\n").unwrap();
        assert_eq!(c.lease_limits, node_core::caps::LeaseLimits::default());
        assert_eq!(c.lease_limits.max_duration, DurationMs(600_000));
        let c = from(
            "site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\nmax_lease_ms = 60000\nmax_leases = 4\n",
        )
        .unwrap();
        assert_eq!(
            (c.lease_limits.max_duration.0, c.lease_limits.max_leases),
            (60_000, 4)
        );
        let e = from("site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\nmax_lease_ms = 4233600000\n")
            .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("max_lease_ms"), "{e}");
        let e = from("site = \"a\"\nhost = \"b\"\ntwin_gpus = 2\nmax_leases = 0\n").unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
    }

    #[test]
    fn flags_override_the_file_and_are_named_in_errors() {
        let flags = Overrides {
            period_ms: Some(2000),
            ..Default::default()
        };
        let c = resolve(
            Some(Path::new("a.toml")),
            "site = \"s\"\nhost = \"h\"\nbroker = \"10.0.0.5\"\nperiod_ms = 500\ncommands = \"none\"\ncooling = \"not_managed\"\nvolatile_state = true\n[quarantine]\nreported_only = true\n",
            &flags,
        )
        .expect("valid");
        assert_eq!(c.period, Duration::from_millis(2000));
        let flags = Overrides {
            deadline_ms: Some(5),
            ..Default::default()
        };
        let e = resolve(
            None,
            "",
            &Overrides {
                host: Some("h".into()),
                ..flags
            },
        )
        .unwrap_err();
        assert_eq!(e.origin, "flag --deadline-ms", "{e}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_checked() {
        let base = "site = \"a\"\nhost = \"h\"\ntwin_gpus = 2\n";
        assert_eq!(from(base).unwrap().metrics_listen, None);
        let c = from(&format!("{base}metrics_listen = \":9400\"\n")).unwrap();
        assert_eq!(c.metrics_listen, Some(([0, 0, 0, 0], 9400).into()));
        let e = from(&format!("{base}metrics_listen = \"localhost\"\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("is not an address"), "{e}");
        let flags = Overrides {
            metrics_listen: Some("127.0.0.1:9401".into()),
            ..Default::default()
        };
        let c = resolve(None, base, &flags).unwrap();
        assert_eq!(c.metrics_listen, Some(([127, 0, 0, 1], 9401).into()));
    }

    #[test]
    fn actions_with_unknown_placeholders_are_refused() {
        let e = from("host = \"h\"\n[quarantine]\nactions = [[\"drain\", \"{hostname}\"]]\n")
            .unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("{hostname}"), "{e}");
        assert!(from("host = \"h\"\n[quarantine]\nactions = [[]]\n").is_err());
    }

    #[test]
    fn an_agent_on_real_gpus_or_site_keys_needs_a_broker_or_asks_for_the_embedded_one() {
        let e = from("site = \"a\"\nhost = \"b\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("an agent on real GPUs does not start the embedded broker"),
            "{e}"
        );
        let unmanaged = "commands = \"none\"\ncooling = \"not_managed\"\nvolatile_state = true\n\
                         [quarantine]\nreported_only = true\n";
        assert!(from(&format!(
            "site = \"a\"\nhost = \"b\"\nbroker = \"10.0.0.5\"\n{unmanaged}"
        ))
        .is_ok());
        let c = from(&format!(
            "site = \"a\"\nhost = \"b\"\nembedded_broker = true\n{unmanaged}"
        ))
        .unwrap();
        assert_eq!((c.broker, c.gpus), (None, GpuSourceKind::Nvml));
        // Simulated GPUs with the demo key: the embedded broker by default.
        assert!(from("site = \"a\"\nhost = \"b\"\ntwin_gpus = 8\n").is_ok());
        let e = from("site = \"a\"\nhost = \"b\"\nbroker = \"10.0.0.5\"\nembedded_broker = true\n")
            .unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.to_string().contains("exclude each other"), "{e}");
    }

    #[test]
    fn a_production_host_needs_its_site_written_and_a_twin_keeps_the_default() {
        let unmanaged = "commands = \"none\"\ncooling = \"not_managed\"\nvolatile_state = true\n\
                         [quarantine]\nreported_only = true\n";
        let e = from(&format!("host = \"b\"\nbroker = \"10.0.0.5\"\n{unmanaged}")).unwrap_err();
        assert!(
            e.message
                .starts_with("site is required on an agent on real GPUs"),
            "{e}"
        );
        let c = from("host = \"b\"\ntwin_gpus = 2\n").expect("a demonstration");
        assert_eq!(c.site.as_str(), "site");
    }

    #[test]
    fn a_keyring_makes_a_production_host_and_must_be_this_sites() {
        use loopwarden_protocol::auth::{May, SigningKey};
        let dir = tempfile::tempdir().unwrap();
        let ring = dir.path().join("keyring.toml");
        let signer = Signer {
            role: loopwarden_protocol::Role::Cdu,
            name: Some(Ident::new("cdu1").unwrap()),
            key_id: 1,
            key: SigningKey::from_bytes(&[3; 32]).verifying_key(),
            may: May {
                lease: true,
                release: false,
                resend: false,
            },
        };
        let site = Ident::new("hall-1").unwrap();
        let text = loopwarden_bus::keys::keyring_toml(&site, std::slice::from_ref(&signer));
        std::fs::write(&ring, text).unwrap();
        let twin = format!("site = \"hall-1\"\nhost = \"h\"\ntwin_gpus = 8\nkeyring = {ring:?}\n");
        let e = from(&twin).unwrap_err();
        assert!(e.to_string().contains("a site keyring"), "{e}");
        let c = from(&format!("{twin}broker = \"10.0.0.5\"\ncdu = \"cdu1\"\n")).unwrap();
        assert_eq!(c.authority.signers, vec![signer]);
        assert_eq!(c.authority.cdu.as_ref().map(Ident::as_str), Some("cdu1"));
        assert!(!c.demo_key);
        let other = twin.replace("hall-1", "hall-2") + "broker = \"10.0.0.5\"\n";
        let e = from(&other).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("keyring of site hall-1"), "{e}");
        let demo = from("site = \"a\"\nhost = \"h\"\ntwin_gpus = 8\n").unwrap();
        assert!(demo.demo_key && !demo.authority.signers.is_empty());
        let tls = from("site = \"a\"\nhost = \"h\"\ntwin_gpus = 8\ntls_ca = \"/etc/hostname\"\n");
        assert!(tls.is_err(), "a CA that is no certificate, or no broker");
        // A keyring others may write is refused, with its line.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ring, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = from(&format!("{twin}broker = \"10.0.0.5\"\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("writable by others"), "{e}");
    }
}

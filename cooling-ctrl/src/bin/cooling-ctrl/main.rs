//! `cooling-ctrl`: the CDU controller, and its tools.
//!
//! - `cooling-ctrl run [--config FILE] [flags]`: the controller in charge
//!   of one CDU over Modbus, on the bus (flags override the file; see
//!   `cooling-ctrl run --help` and `cooling_ctrl::config`). SIGTERM or
//!   ctrl-c stops it cleanly (exit 0). Under systemd (`Type=notify`) it
//!   sends READY=1 after its first control step, WATCHDOG=1 while steps
//!   complete and STOPPING=1 at shutdown (`cooling_ctrl::watchdog`).
//! - `cooling-ctrl gateway --link tcp:HOST:PORT|DEVICE [--baud B]
//!   [--link-any-address] [--config FILE] [flags]`: the bus's side of a
//!   controller that runs on a microcontroller, over the serial link to
//!   it (the same file and flags as `run`; a `tcp:` host off this host's
//!   loopback only with `--link-any-address`; `gateway.rs`).
//! - `cooling-ctrl replay-trace FILE [--register-map FILE] [--figures
//!   FILE.bin]`: replays a microcontroller's trace (its debug port captured to a file) through
//!   this machine's decision path and prints, as one JSON object, whether
//!   every digest agreed and what each step cost it
//!   (`cooling_ctrl::replay`); exit 1 when one did not, a frame was
//!   dropped or the capture ends inside one.
//! - `cooling-ctrl console-password`: reads the serial console's
//!   password from standard input and prints its hash (docs/cooling.md,
//!   "Serial console").
//! - `cooling-ctrl ctl [--console P] [--config FILE]
//!   status|sensors|loops|events [--since T]|caps [--json]`: the console
//!   of the controller on this machine; `clear-leak RACK` and `clear-pump
//!   A|B` with `--sign-key FILE --cdu NAME`: the operator's signed clear,
//!   to a gateway's console (`gateway.rs`).
//! - `cooling-ctrl firmware-keyring --cdu NAME --keyring FILE`: prints
//!   the operator keyring a CDU's firmware is built with, from the site's
//!   keyring (`gateway.rs`).
//! - `cooling-ctrl firmware-figures --site-figures FILE --out FILE.bin`:
//!   writes the control core's configuration a CDU's firmware is built
//!   with, from the hall's site figures, as `run` builds it (`figures.rs`).
//! - `cooling-ctrl simulate --scenario FILE --controller NAME [--trace
//!   FILE.csv]`: plays a `plant-scenario/1` on the simulated hall in
//!   simulated time with that controller in charge and prints the run's
//!   figures as one JSON object on standard output. Controllers: `ours`,
//!   the references `baseline-18` and `baseline-32`, and `oracle` (shown
//!   the true plant state; for calibration only).

use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use clap::{Parser, Subcommand};
use cooling_ctrl::config::{self, Overrides};
use cooling_ctrl::console::{self, Request};
#[cfg(target_os = "linux")]
use cooling_ctrl::gpio;
use cooling_ctrl::journal::ControllerFlash;
use cooling_ctrl::metrics::CduMetrics;
use cooling_ctrl::modbus::ModbusCdu;
use cooling_ctrl::northbound;
use cooling_ctrl::shell::{self, ShellOptions};
use cooling_ctrl::watchdog::{self, Notifier};
use loopwarden_field::common::RunArgs;
use loopwarden_field::console::{ctl_command, CtlArgs, EventsArgs};
use loopwarden_field::lifecycle::{self, Readers, StartError, Supervision};
use loopwarden_field::listen::{self, ListenStats};

mod figures;
mod gateway;
#[cfg(feature = "twin")]
mod simulate;

#[derive(Parser)]
#[command(
    name = "cooling-ctrl",
    version,
    about = "The Loopwarden CDU controller"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the controller in charge of one CDU.
    Run(RunArgs<Overrides>),
    /// Carry a microcontroller controller's words to the bus, and the
    /// bus's to it.
    Gateway(gateway::Args),
    /// Ask the running controller.
    Ctl {
        #[command(flatten)]
        target: CtlArgs,
        #[command(subcommand)]
        what: Ctl,
    },
    /// Read the serial console's password from standard input and print
    /// its Argon2id hash, for `console_password_hash`.
    ConsolePassword,
    /// Replay a microcontroller's trace through this machine's decision
    /// path and say whether every digest agreed, as JSON.
    ReplayTrace(ReplayArgs),
    /// Print the operator keyring a CDU's firmware is built with
    /// (LOOPWARDEN_FIRMWARE_OPERATORS), from the site's keyring.
    FirmwareKeyring(gateway::KeyringArgs),
    /// Write the control core's configuration a CDU's firmware is built
    /// with (LOOPWARDEN_FIRMWARE_FIGURES), from the hall's site figures.
    FirmwareFigures(figures::Args),
    /// Play a plant scenario in simulated time and print its figures.
    #[cfg(feature = "twin")]
    Simulate(simulate::Args),
}

/// `replay-trace`'s arguments.
#[derive(clap::Args)]
struct ReplayArgs {
    /// The trace: the firmware's debug port (UART3) captured to a file.
    file: PathBuf,
    /// The CDU's register map the firmware was built with [default: the
    /// simulated CDU's, boards/cdus/sim-cdu.toml].
    #[arg(long, value_name = "FILE.toml")]
    register_map: Option<PathBuf>,
    /// The figures record the firmware was built with
    /// (`firmware-figures`) [default: the reference hall's, a firmware
    /// built without one].
    #[arg(long, value_name = "FILE.bin")]
    figures: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Ctl {
    /// The CDU at a glance: mode, temperatures, flow, pumps, PUE, hosts,
    /// leaks, the CDU link.
    Status,
    /// Every supervised sensor, its reading and fault.
    Sensors,
    /// The optimiser's proposal and the trims.
    Loops,
    /// The event log.
    Events(EventsArgs),
    /// Caps per host: asked, why, the last ack and the limits in force.
    Caps,
    /// Reopen a rack whose leak is latched, after the repair (refused while
    /// its rope or the CDU's leak input reads wet, or read wet when last
    /// heard, or its leak sensing is lost).
    ClearLeak {
        /// The rack (0-based).
        rack: usize,
        #[command(flatten)]
        sign: gateway::SignArgs,
    },
    /// Put a tripped pump back in service after the repair.
    ClearPump {
        /// A or B.
        pump: String,
        #[command(flatten)]
        sign: gateway::SignArgs,
    },
}

/// What `ctl` asks: `run`'s console, or a gateway's (a signed clear).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Asked {
    Controller(Request),
    Gateway(cooling_ctrl::gateway::clears::GatewayRequest),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        #[cfg(feature = "twin")]
        Command::Simulate(a) => simulate::command(a),
        Command::Run(a) => run(a.config, a.flags),
        Command::Gateway(a) => gateway::command(a),
        Command::Ctl { target, what } => ctl_command(
            &target,
            &console::PEER,
            || request(what),
            |r, v| match r {
                Asked::Controller(req) => console::render(req, v),
                Asked::Gateway(_) => console::render_operator(v),
            },
        ),
        Command::FirmwareKeyring(a) => gateway::firmware_keyring(&a),
        Command::FirmwareFigures(a) => figures::command(&a),
        Command::ConsolePassword => loopwarden_field::serial::password::command("cooling-ctrl"),
        Command::ReplayTrace(a) => replay_trace(&a),
    }
}

/// Replays a trace for a firmware built with the figures given (the
/// reference hall's without) on the map given.
fn replay_trace(a: &ReplayArgs) -> ExitCode {
    let map = match &a.register_map {
        None => Ok(loopwarden_boards::modbus_map::RegisterMap::sim_cdu()),
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("{}: {e}", p.display()))
            .and_then(|t| {
                loopwarden_boards::modbus_map::RegisterMap::from_toml(&t, &p.display().to_string())
                    .map_err(|e| e.to_string())
            }),
    };
    let limits = match map {
        Ok(m) => cooling_ctrl::modbus::map_limits(&m),
        Err(e) => {
            eprintln!("cooling-ctrl replay-trace: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match &a.figures {
        None => Ok(cooling_core::CoreConfig::default()),
        Some(p) => figures::read(p),
    };
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cooling-ctrl replay-trace: {e}");
            return ExitCode::from(2);
        }
    };
    match cooling_ctrl::replay::replay_file(&a.file, cfg, limits) {
        Ok(r) => {
            println!(
                "{}",
                serde_json::to_string(&r).expect("a report serialises")
            );
            match r.why_not() {
                None => ExitCode::SUCCESS,
                Some(why) => {
                    eprintln!(
                        "cooling-ctrl replay-trace: not every digest is known to agree: {why}"
                    );
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("cooling-ctrl replay-trace: {e}");
            ExitCode::from(2)
        }
    }
}

/// What `ctl` asks the running controller (or, for a signed clear, a
/// gateway) for each subcommand.
fn request(what: Ctl) -> Result<Asked, String> {
    use cooling_ctrl::gateway::clears;
    let signed = match &what {
        Ctl::ClearLeak { rack, sign } => sign.request(|| clears::leak(*rack))?,
        Ctl::ClearPump { pump, sign } => sign.request(|| clears::pump(pump))?,
        _ => None,
    };
    if let Some(g) = signed {
        return Ok(Asked::Gateway(g));
    }
    Ok(Asked::Controller(match what {
        Ctl::Status => Request::Status,
        Ctl::Sensors => Request::Sensors,
        Ctl::Loops => Request::Loops,
        Ctl::Caps => Request::Caps,
        Ctl::ClearLeak { rack, .. } => Request::ClearLeak { rack },
        Ctl::ClearPump { pump, .. } => Request::ClearPump { pump },
        Ctl::Events(e) => Request::Events {
            since: e.since_ms(loopwarden_bus::now_ms().0)?,
        },
    }))
}

fn run(config_path: Option<PathBuf>, flags: Overrides) -> ExitCode {
    lifecycle::run("cooling-ctrl", || start(config_path, &flags), serve)
}

/// The configuration, and what it switches off said loudly.
fn start(config_path: Option<PathBuf>, flags: &Overrides) -> Result<config::Config, StartError> {
    let config = config::load(config_path.as_deref(), flags).map_err(StartError::config)?;
    if config.demo_key {
        demo_key_warning();
    }
    if config.volatile_latch {
        eprintln!(
            "cooling-ctrl: WARNING: no flash file (volatile_latch): latched leaks, failed pumps \
             and the lead pump are LOST AT EVERY RESTART; a restarted controller may reopen \
             a valve closed for a leak"
        );
        tracing::warn!("no flash file: the latched state is lost at every restart");
    }
    Ok(config)
}

/// Says loudly that leases are signed with the demonstration key.
fn demo_key_warning() {
    eprintln!(
        "cooling-ctrl: WARNING: cap leases are signed with the PUBLIC DEMONSTRATION KEY \
         (--demo-key): anyone can forge them; for the twin only, never on a real hall"
    );
    tracing::warn!("cap leases are signed with the public demonstration key");
}

/// The board's pins on their GPIO chip, when configured.
fn open_board(config: &config::Config) -> Result<Option<Box<dyn shell::BoardIo>>, String> {
    let board: Option<Box<dyn shell::BoardIo>> = match &config.board {
        None => None,
        #[cfg(not(target_os = "linux"))]
        Some(b) => {
            return Err(format!(
                "board pins ({}): GPIO character devices exist on Linux only",
                b.pins_file.display()
            ))
        }
        #[cfg(target_os = "linux")]
        Some(b) => {
            let pins = gpio::open(&b.chip, &b.pins)
                .map_err(|e| format!("board pins ({}): {e}", b.pins_file.display()))?;
            tracing::info!(
                "cooling-ctrl: board pins of {} ({}) on {}: {} leak ropes, controller-healthy relay line {}, beacon line {}",
                b.pins.board,
                b.pins_file.display(),
                b.chip.display(),
                b.pins.ropes.len(),
                b.pins.controller_healthy.line,
                b.pins.alarm_beacon.line
            );
            Some(Box::new(pins))
        }
    };
    Ok(board)
}

/// The northbound Modbus TCP server for the BMS, when configured: the
/// shell's link to it and its task. An address that cannot be bound (in
/// use, no longer on this machine) is logged and tried again in the
/// background, counted in `stats`: the controller drives the CDU
/// meanwhile, and the BMS is served once it binds. (Never an error now;
/// the gateway's start shares it.)
async fn start_northbound(
    config: &config::Config,
    stats: ListenStats,
) -> Result<
    (
        Option<shell::NorthboundLink>,
        Option<tokio::task::JoinHandle<()>>,
    ),
    String,
> {
    let Some(addr) = config.northbound else {
        return Ok((None, None));
    };
    let (snap_tx, snap_rx) = northbound::snapshot_channel_of(config.core.layout.racks);
    let (writes_tx, writes_rx) = if config.northbound_writes {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    tracing::info!(
        "cooling-ctrl: northbound Modbus TCP on {addr}, writes {}",
        if config.northbound_writes {
            "enabled"
        } else {
            "disabled"
        }
    );
    let map = served_map(config);
    let limits = config.northbound_limits;
    let task = listen::bind_retrying(
        "northbound Modbus server",
        addr,
        stats.clone(),
        move |listener| async move {
            let served =
                northbound::serve_within(listener, map, snap_rx, writes_tx, limits, stats).await;
            if let Err(e) = served {
                tracing::error!("cooling-ctrl: northbound Modbus server: {e}");
            }
        },
    );
    let link = shell::NorthboundLink {
        snapshots: snap_tx,
        writes: writes_rx,
    };
    Ok((Some(link), Some(task)))
}

/// The northbound map served: the shipped one at the configured unit, its
/// `setpoint_ceiling` held to the setpoints `run`'s core asks for (the
/// site's, tightened to the CDU's map) when the BMS may write. Not on a
/// gateway, whose microcontroller holds the ceiling to the figures it was
/// built with; a site whose setpoints miss the register's range is said,
/// and served the register as shipped (the core holds what is written).
fn served_map(config: &config::Config) -> loopwarden_boards::modbus_map::RegisterMap {
    let mut map = northbound::northbound_map();
    map.unit_id = config.northbound_unit_id;
    if !config.northbound_writes || config.link.is_none() {
        return map;
    }
    let mut core = config.core;
    if let Some(cdu_map) = &config.map {
        let limits = cooling_ctrl::modbus::map_limits(cdu_map);
        if cooling_decide::writes::tighten(&mut core, &limits).is_err() {
            // No setpoint meets both: the config refuses such a map.
            return map;
        }
    }
    let (lo, hi) = (core.cdu.min_setpoint_c, core.cdu.max_setpoint_c);
    match northbound::fit_setpoint_ceiling(&mut map, lo, hi) {
        Ok(None) => {}
        Ok(Some(note)) => tracing::warn!("cooling-ctrl: northbound: {note}"),
        Err(e) => tracing::error!(
            "cooling-ctrl: northbound: {e}: the register is served as shipped, and the controller holds a ceiling written to its setpoints"
        ),
    }
    map
}

/// What the controller's listeners refused and closed: the console
/// socket's and the northbound server's counts.
#[derive(Default)]
struct Listeners {
    console: ListenStats,
    northbound: ListenStats,
}

async fn serve(config: config::Config, notifier: Notifier) -> Result<(), String> {
    // `run` reads its file with the CDU link required (`config::load`).
    let Some(link) = config.link.clone() else {
        return Err("a CDU link is required: cdu_tcp or cdu_serial".into());
    };
    let Some(map) = config.map.clone() else {
        return Err("the CDU's register map is required: register_map".into());
    };
    // The map fits: the configuration refused one that does not.
    if let (cooling_ctrl::modbus::Link::Tcp(addr), 0) = (&link, map.unit_id) {
        tracing::warn!(
            "register map of {:?}: unit_id 0 over TCP to {addr}: a CDU reached directly may answer it, \
             but behind a Modbus TCP-to-RTU gateway it is the broadcast, and every device on the \
             gateway's line would carry out this controller's writes; give the CDU's own address (1 to 247), \
             or 255 for a device reached directly",
            map.model
        );
    }
    let (stats_tx, stats_rx) = shell::stats_channel();
    // READY=1 after the first completed step, then WATCHDOG=1 only while
    // steps complete; steps end at the signal, while the shell winds down.
    let (supervision, stop) = Supervision::start(
        notifier,
        watchdog::CONTROL_LOOP,
        config.period,
        stats_rx.clone(),
        |s| s.steps,
    )?;
    // The board's pins first: a chip or a line that cannot be had stops the
    // start before anything else is set up.
    let board = open_board(&config)?;
    let (broker, _embedded) =
        loopwarden_bus::embedded::configured_or_embedded(config.broker.clone())
            .map_err(|e| format!("broker: {e}"))?;
    let flash =
        ControllerFlash::open(config.flash.as_deref()).map_err(|e| format!("flash: {e}"))?;
    let recorder = flash.recorder.clone();
    let (operator_tx, operator_rx) = tokio::sync::mpsc::channel(4);
    let ctx = console::Context {
        site: config.site.to_string(),
        cdu: config.cdu.to_string(),
        hosts: config.hosts.iter().map(|h| h.to_string()).collect(),
        hosts_per_rack: usize::from(config.core.layout.hosts_per_rack),
        link: link.to_string(),
        map_model: map.model.clone(),
        broker: broker.to_string(),
        period: config.period,
        lease: config.lease,
        demo_key: config.demo_key,
        started: loopwarden_bus::now_ms(),
        protection_off: config.protections_off(),
        stats: stats_rx,
        recorder: recorder.clone(),
        operator: Some(operator_tx),
    };
    // What the console socket and the northbound server refuse and close,
    // for /metrics.
    let listeners = Listeners::default();
    let readers = start_readers(&config, Arc::new(ctx), &listeners).await?;
    tracing::info!(
        "cooling-ctrl: CDU {} on {} ({}), console {}",
        config.cdu,
        link,
        map.model,
        config.console.display()
    );
    let port = ModbusCdu::new(map, link).with_timeout(config.modbus_timeout);
    let unmapped = port.unmapped();
    if !unmapped.is_empty() {
        tracing::info!(
            "cooling-ctrl: the register map has no {}: read as unknown, not written",
            unmapped.join(", ")
        );
    }
    // The building management system's Modbus TCP server.
    let (northbound_link, northbound_task) =
        start_northbound(&config, listeners.northbound.clone()).await?;
    let opts = ShellOptions {
        stats: Some(stats_tx),
        bus: shell::BusOptions::of(&config, flash),
        northbound: northbound_link,
        // The board's pins on a GPIO chip when configured; the CDU's leak
        // register is read in any case.
        board,
        operator: Some(operator_rx),
        facility: config.facility.clone(),
    };
    let result = shell::run_with(config.shell_config(broker), opts, port, stop).await;
    supervision.finish(result.is_err());
    recorder.flush().await;
    readers.stop();
    if let Some(t) = northbound_task {
        t.abort();
    }
    tracing::info!("cooling-ctrl: stopped");
    result.map_err(|e| e.to_string())
}

/// The console socket, `/metrics` and the serial console, readers of what
/// the shell publishes.
async fn start_readers(
    config: &config::Config,
    ctx: Arc<console::Context>,
    listeners: &Listeners,
) -> Result<Readers, String> {
    let listener = console::bind(&config.console)
        .map_err(|e| format!("console socket {}: {e}", config.console.display()))?;
    let mut metrics = CduMetrics::new(ctx.clone(), &config.core.layout)
        .listener("console", listeners.console.clone());
    if config.northbound.is_some() {
        metrics = metrics.listener("northbound", listeners.northbound.clone());
    }
    // An address it cannot bind is in the log, and tried again.
    let metrics_task = cooling_ctrl::metrics::start_retrying(
        config.metrics_listen,
        metrics,
        ListenStats::default(),
    );
    let serial_task = console::start_serial(config.serial.clone(), ctx.clone());
    let (limits, stats) = (config.console_limits, listeners.console.clone());
    let console_task = tokio::spawn(console::serve(listener, ctx, limits, stats));
    Ok(Readers::new(
        config.console.clone(),
        console_task,
        [serial_task, metrics_task],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command};

    /// The long flags `gateway` takes besides `run`'s (which `[flags]`
    /// stands for in its usage), each as `--name`.
    fn gateway_flags() -> Vec<String> {
        let all = gateway::Args::augment_args(Command::new("gateway"));
        let run = Overrides::augment_args(Command::new("run"));
        let longs = |c: &Command| -> Vec<String> {
            c.get_arguments()
                .filter_map(|a| a.get_long())
                .map(|l| format!("--{l}"))
                .collect()
        };
        let shared = longs(&run);
        longs(&all)
            .into_iter()
            .filter(|f| !shared.contains(f))
            .collect()
    }

    /// The usage that begins with `start` in the `//!` lines of `source`,
    /// up to its closing "`:", its lines joined.
    fn usage(source: &str, start: &str) -> String {
        let doc: Vec<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .map(str::trim)
            .collect();
        let doc = doc.join(" ");
        let from = doc.find(start).expect("the usage line");
        let len = doc[from..].find("`:").expect("its end");
        doc[from..from + len].to_string()
    }

    /// Every flag of `cooling-ctrl gateway` is in its usage line here and
    /// in `gateway.rs`, and in the operators' doc of the gateway.
    #[test]
    fn the_gateways_usage_names_each_of_its_flags() {
        let flags = gateway_flags();
        for f in ["--link", "--baud", "--link-any-address", "--config"] {
            assert!(flags.iter().any(|g| g == f), "{f} in {flags:?}");
        }
        let start = "`cooling-ctrl gateway";
        let here = usage(include_str!("main.rs"), start);
        let there = usage(include_str!("gateway.rs"), start);
        let doc = include_str!("../../../../docs/cooling.md");
        let from = doc.find("## The gateway").expect("the gateway's section");
        let len = doc[from + 3..]
            .find("\n## ")
            .map_or(doc.len() - from, |n| n + 3);
        let section = &doc[from..from + len];
        for f in &flags {
            let word = format!("{f} ");
            assert!(
                here.contains(&word) || here.contains(&format!("{f}]")),
                "main.rs: {f} not in {here}"
            );
            assert!(
                there.contains(&word) || there.contains(&format!("{f}]")),
                "gateway.rs: {f} not in {there}"
            );
            assert!(
                section.contains(&format!("`{f}")),
                "docs/cooling.md: {f} not in the gateway's section"
            );
        }
    }
}

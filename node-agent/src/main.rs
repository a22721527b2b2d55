//! `node-agent`: run the host agent, or talk to a running one.
//!
//! - `node-agent run [--config FILE] [flags]`: the agent (flags override
//!   the file; see `node-agent run --help` and `docs/node-agent.md`).
//!   SIGTERM or ctrl-c stops it cleanly (exit 0). Under systemd
//!   (`Type=notify`) it sends READY=1 after its first sampling round,
//!   WATCHDOG=1 while rounds complete and STOPPING=1 at shutdown
//!   (`node_agent::watchdog`).
//! - `node-agent console-password`: reads the serial console's password
//!   from standard input and prints its hash (docs/node-agent.md,
//!   "Serial console").
//! - `node-agent ctl status|gpus|caps|events [--since]|why <gpu> [--json]`:
//!   the console of the agent on this host.
//! - `node-agent probe [--tries N] [--json]`: what each GPU supports of the
//!   NVML calls the agent makes, and each call's median and maximum
//!   latency (read only: nothing is set).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use loopwarden_field::common::RunArgs;
use loopwarden_field::console::{ctl_command, CtlArgs, EventsArgs};
use loopwarden_field::lifecycle::{self, StartError, Supervision};
use node_agent::config::{self, Config, GpuSourceKind, Overrides};
use node_agent::console::{self, Request};
use node_agent::gpu::GpuSource;
use node_agent::nvml::{NvmlSource, SystemNvml};
use node_agent::shell::RunHooks;
#[cfg(feature = "twin")]
use node_agent::sim_gpus::TwinSource;
use node_agent::watchdog::{self, Notifier};

#[derive(Parser)]
#[command(
    name = "node-agent",
    version,
    about = "The Loopwarden agent of one GPU host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the agent.
    Run(RunArgs<Overrides>),
    /// Run the health engine over a `gpu-trace/1` trace and print one JSON
    /// line per GPU state change.
    Replay {
        /// The trace (JSON Lines).
        trace: PathBuf,
        /// Read the slow counters (retired pages, row remaps, the recovery
        /// action) only every this many seconds, as the live agent does
        /// (`slow_counters_s`; PCIe replays are read every sample, as it
        /// does); 0: at every sample, as the trace gives them.
        #[arg(long, default_value_t = 0)]
        slow_counters_s: u64,
        /// Read the PCIe replay counter with the slow counters, held
        /// between their reads, as the agent does on a GPU that answers
        /// none of the per-sample field values (`node-agent probe` says
        /// which: "PCIe replays read with the slow counters").
        #[arg(long, requires = "slow_counters_s")]
        pcie_with_slow: bool,
    },
    /// Ask the running agent.
    Ctl {
        #[command(flatten)]
        target: CtlArgs,
        #[command(subcommand)]
        what: Ctl,
    },
    /// Read the serial console's password from standard input and print
    /// its Argon2id hash, for `console_password_hash`.
    ConsolePassword,
    /// What each GPU supports of the NVML calls the agent makes, and what
    /// each costs: its median and slowest latency over `--tries` (read
    /// only: no limit is set, no event registered).
    Probe {
        /// Tries of each call on each GPU, 1 to 10000.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=10_000))]
        tries: u16,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Ctl {
    /// The agent at a glance.
    Status,
    /// Every GPU's last sample.
    Gpus,
    /// Limits in force and the leases behind them.
    Caps,
    /// The event log.
    Events(EventsArgs),
    /// Why a GPU is in its state, its cap, its recent XIDs.
    Why {
        /// GPU index.
        gpu: u8,
    },
}

/// What to add to an NVML error: where simulated GPUs are built in, how
/// to use them.
#[cfg(feature = "twin")]
const NVML_HINT: &str = " (for simulated GPUs use --twin-gpus N)";
#[cfg(not(feature = "twin"))]
const NVML_HINT: &str = "";

/// `n` simulated GPUs of `board` at `limit` (else their default), where
/// this build has them.
#[cfg(feature = "twin")]
fn twin_source(
    board: &loopwarden_boards::GpuBoard,
    n: u8,
    limit: Option<loopwarden_protocol::Watts>,
) -> Option<Box<dyn GpuSource + Send>> {
    let twin = TwinSource::new(board, n as usize, 1);
    match limit {
        // The config checked it against the board's range.
        Some(w) => Some(Box::new(
            twin.at_limit(w).expect("a limit in the board's range"),
        )),
        None => Some(Box::new(twin)),
    }
}

/// A production build has no simulated GPUs.
#[cfg(not(feature = "twin"))]
fn twin_source(
    _board: &loopwarden_boards::GpuBoard,
    _n: u8,
    _limit: Option<loopwarden_protocol::Watts>,
) -> Option<Box<dyn GpuSource + Send>> {
    None
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(a) => run(a.config, a.flags),
        Command::Replay {
            trace,
            slow_counters_s,
            pcie_with_slow,
        } => replay(&trace, slow_counters_s.saturating_mul(1000), pcie_with_slow),
        Command::Ctl { target, what } => {
            ctl_command(&target, &console::PEER, || request(what), console::render)
        }
        Command::ConsolePassword => loopwarden_field::serial::password::command("node-agent"),
        Command::Probe { tries, json } => probe(usize::from(tries), json),
    }
}

/// `node-agent probe`: every NVML call the agent makes on every GPU, each
/// `tries` times, as a table or JSON.
fn probe(tries: usize, json: bool) -> ExitCode {
    use node_agent::nvml::NvmlApi;
    let nvml = match SystemNvml::init() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("node-agent probe: {e}");
            return ExitCode::from(2);
        }
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent probe: nvmlDeviceGetCount: {e:?}");
            return ExitCode::from(2);
        }
    };
    let probes: Vec<_> = (0..count)
        .flat_map(|gpu| node_agent::nvml::probe(&nvml, gpu, tries))
        .collect();
    if json {
        match serde_json::to_string_pretty(&probes) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("node-agent probe: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", node_agent::nvml::probe_table(&probes));
    }
    ExitCode::SUCCESS
}

/// What `ctl` asks the running agent for each subcommand.
fn request(what: Ctl) -> Result<Request, String> {
    Ok(match what {
        Ctl::Status => Request::Status,
        Ctl::Gpus => Request::Gpus,
        Ctl::Caps => Request::Caps,
        Ctl::Events(e) => Request::Events {
            since: e.since_ms(loopwarden_bus::now_ms().0)?,
        },
        Ctl::Why { gpu } => Request::Why { gpu },
    })
}

fn replay(trace: &std::path::Path, slow_ms: u64, pcie_with_slow: bool) -> ExitCode {
    let file = match std::fs::File::open(trace) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("node-agent replay: {}: {e}", trace.display());
            return ExitCode::from(2);
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut notes = std::io::stderr();
    let result = node_core::replay::replay_as_agent(
        std::io::BufReader::new(file),
        node_core::health::Policy::default(),
        slow_ms,
        pcie_with_slow,
        &mut out,
        &mut notes,
    );
    let flushed = std::io::Write::flush(&mut out);
    match (result, flushed) {
        (Ok(_), Ok(())) => ExitCode::SUCCESS,
        (Err(e), _) => {
            eprintln!("node-agent replay: {}: {e}", trace.display());
            ExitCode::from(2)
        }
        (_, Err(e)) => {
            eprintln!("node-agent replay: writing: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(config_path: Option<PathBuf>, flags: Overrides) -> ExitCode {
    // One thread for the agent's tasks: they wake a few times a period,
    // and a wake-up that crosses threads (a futex, an eventfd) costs more
    // than the work it wakes (docs/benchmarks.md). GPU calls, the flash
    // and the XID watch have threads of their own.
    lifecycle::run_on(
        "node-agent",
        lifecycle::Threads::Current,
        || start(config_path, &flags),
        serve,
    )
}

/// The configuration and the GPUs, before the runtime.
fn start(
    config_path: Option<PathBuf>,
    flags: &Overrides,
) -> Result<(Config, Box<dyn GpuSource + Send>), StartError> {
    let config = config::load(config_path.as_deref(), flags).map_err(StartError::config)?;
    let source: Box<dyn GpuSource + Send> = match config.gpus {
        GpuSourceKind::Twin(n) => twin_source(&config.board, n, config.twin_admin_limit).ok_or_else(|| {
            StartError::config(
                "twin_gpus: this build has no simulated GPUs (built without the `twin` feature); remove twin_gpus to read the GPUs through NVML",
            )
        })?,
        GpuSourceKind::Nvml => match SystemNvml::init() {
            Ok(nvml) => Box::new(NvmlSource::new(nvml).slow_every(config.slow_every())),
            Err(e) => return Err(StartError::failed(format!("{e}{NVML_HINT}"))),
        },
    };
    Ok((config, source))
}

/// Runs the agent under the watchdog: READY=1 after the first sampling
/// round, WATCHDOG=1 while rounds complete, STOPPING=1 when a signal (or a
/// failure) ends it.
async fn serve(
    (config, source): (Config, Box<dyn GpuSource + Send>),
    notifier: Notifier,
) -> Result<(), node_agent::shell::AgentError> {
    let (snapshots, snapshot_rx) = console::snapshot_channel();
    let (supervision, stop) = Supervision::start(
        notifier,
        watchdog::SAMPLING_LOOP,
        config.period,
        snapshot_rx,
        watchdog::rounds,
    )
    .map_err(node_agent::shell::AgentError::Signals)?;
    let hooks = RunHooks {
        snapshots: Some(snapshots),
        ..RunHooks::default()
    };
    let result = node_agent::shell::run_hooked(config, source, hooks, stop).await;
    supervision.finish(result.is_err());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn probe_takes_1_to_10000_tries() {
        let tries = |args: &[&str]| match Cli::try_parse_from(args) {
            Ok(Cli {
                command: Command::Probe { tries, .. },
            }) => Ok(tries),
            Ok(_) => panic!("not probe"),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(tries(&["node-agent", "probe"]), Ok(20));
        assert_eq!(
            tries(&["node-agent", "probe", "--tries", "10000"]),
            Ok(10_000)
        );
        for bad in ["0", "10001", "many"] {
            let e = tries(&["node-agent", "probe", "--tries", bad]).unwrap_err();
            assert!(e.contains("--tries"), "{bad}: {e}");
        }
    }
}

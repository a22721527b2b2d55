//! `loopwarden-hall`: the simulated hall's one-command run.
//!
//! - `loopwarden-hall play [--scenario F] [--speed X] [--out DIR]`: the
//!   whole system on one machine, live, then its report.
//! - `loopwarden-hall plot --trace FILE.csv [--summary FILE.json] --out DIR
//!   [--title T]`: the report of a run.
//! - `loopwarden-hall fleet --hosts N --cdus M --duration S [--broker
//!   HOST:PORT ...] [--json]`: N real host agents and M real cooling
//!   controllers in one process, measured (`docs/scale.md`).
//! - `loopwarden-hall cdu --modbus ADDR:PORT | --serial DEV [--baud B]
//!   [--turnaround-ms M] [--unit N] [--scenario F] [--speed X] [--record
//!   FILE]`: the simulated
//!   CDU alone, for `cooling-ctrl run`, `mbpoll` or a BMS, and what it was
//!   told and did (`docs/twin.md`).
//! - `loopwarden-hall goodput [--gpus G] [--checkpoint-min C] [--mix F]
//!   [--trials N] [--seed S] [--out DIR] [--json] ...`: a large training
//!   job's effective training time under failures, per way of handling
//!   them, and its report (`docs/goodput.md`).

mod goodput;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use loopwarden_hall::{read_trace, write_report};

#[derive(Debug, Parser)]
#[command(
    name = "loopwarden-hall",
    version,
    about = "The simulated hall's one-command run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Plays a scenario on the whole system (broker, simulated CDU on
    /// Modbus, a node agent per host, the cooling controller), live.
    Play(PlayArgs),
    /// Writes the report of a run: SVG charts of its trace and report.md.
    Plot(PlotArgs),
    /// Runs many real host agents and cooling controllers in one process
    /// at 1 Hz real time, injects GPU failures and a cooling shortfall,
    /// and measures the bus, the latencies, CPU and memory.
    Fleet(FleetArgs),
    /// Serves the simulated CDU alone on Modbus TCP or RTU, the hall of a
    /// scenario running behind its registers in real time, for
    /// `cooling-ctrl run`, `mbpoll` or a BMS to talk to.
    Cdu(CduArgs),
    /// Prices early quarantine, fast detection and drains in a large
    /// training job's effective training time (Monte Carlo), and writes
    /// the report: report.md and SVG charts.
    Goodput(goodput::GoodputArgs),
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("listen").required(true).args(["modbus", "serial"]))]
struct CduArgs {
    /// Serve Modbus TCP on this address (IP:PORT; port 0 picks a free one).
    #[arg(long, value_name = "IP:PORT")]
    modbus: Option<std::net::SocketAddr>,
    /// Serve Modbus RTU on this serial device (8N1).
    #[arg(long, value_name = "DEVICE")]
    serial: Option<String>,
    /// The serial line's baud rate.
    #[arg(long, default_value_t = 19_200, requires = "serial")]
    baud: u32,
    /// Over RTU, send each answer this many milliseconds (up to 1000)
    /// after its request, as a real CDU's controller takes tens of them.
    #[arg(long, default_value_t = 0, requires = "serial")]
    turnaround_ms: u64,
    /// The unit id to answer, 1 to 247 [default: the map's, 1].
    #[arg(long)]
    unit: Option<u8>,
    /// The scenario behind the registers (plant-scenario/1) [default: ten
    /// eventful minutes].
    #[arg(long, value_name = "FILE.toml")]
    scenario: Option<PathBuf>,
    /// Simulated seconds per wall-clock second.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Seconds between two status lines.
    #[arg(long, default_value_t = 5.0)]
    status_every: f64,
    /// Write every client write, scenario fault and change of the CDU's
    /// own state (fallback, pumps, valves) to this file, one JSON object
    /// a line, each flushed as written.
    #[arg(long, value_name = "FILE.jsonl")]
    record: Option<PathBuf>,
}

fn cdu(a: &CduArgs) -> Result<(), String> {
    let (scenario, name) = scenario_of(a.scenario.as_deref())?;
    let listen = match (&a.modbus, &a.serial) {
        (Some(addr), _) => loopwarden_hall::sim_side::Listen::Tcp(*addr),
        (None, Some(path)) => loopwarden_hall::sim_side::Listen::Rtu {
            path: path.clone(),
            baud: a.baud,
            turnaround: std::time::Duration::from_millis(a.turnaround_ms),
        },
        (None, None) => return Err("give --modbus IP:PORT or --serial DEVICE".into()),
    };
    if a.turnaround_ms > 1000 {
        return Err(format!(
            "--turnaround-ms {}: at most 1000 (a controller waits 200 ms for an answer)",
            a.turnaround_ms
        ));
    }
    if !(a.status_every > 0.0 && a.status_every <= 3600.0) {
        return Err(format!(
            "--status-every {}: between 0 and 3600 seconds",
            a.status_every
        ));
    }
    let cfg = loopwarden_hall::cdu::CduConfig {
        scenario,
        name,
        listen,
        unit: a.unit,
        speed: a.speed,
        status_every: std::time::Duration::from_secs_f64(a.status_every),
        record: a.record.clone(),
    };
    let rt = tokio::runtime::Runtime::new().map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(async {
        let stop = told_to_stop().map_err(|e| format!("signals: {e}"))?;
        loopwarden_hall::cdu::serve(cfg, stop, &mut std::io::stdout().lock())
            .await
            .map_err(|e| e.to_string())
    })
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM.
fn told_to_stop() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

#[derive(Debug, Args)]
struct FleetArgs {
    /// Host agents.
    #[arg(long)]
    hosts: usize,
    /// Cooling controllers (each with its own simulated CDU and hall).
    #[arg(long)]
    cdus: usize,
    /// Seconds the halls run once every agent is connected.
    #[arg(long = "duration", value_name = "SECONDS")]
    duration_s: u64,
    /// A broker (host:port); a cluster as `a,b,c` or by repeating the
    /// flag [default: the embedded broker].
    #[arg(long = "broker", value_name = "HOST:PORT[,HOST:PORT...]")]
    brokers: Vec<String>,
    /// The independent subscriber's broker [default: the last --broker,
    /// else the embedded one].
    #[arg(long, value_name = "HOST:PORT")]
    observer_broker: Option<String>,
    /// GPUs to fail (XID 79), one per host, at most --hosts [default: one
    /// host in ten, at least 2, at most --hosts].
    #[arg(long)]
    xids: Option<usize>,
    /// CDUs whose pumps fail, at most --cdus [default: the fewest that
    /// hold 128 hosts].
    #[arg(long)]
    shortfall_cdus: Option<usize>,
    /// When the pumps fail, seconds into the run [default: a tenth of it].
    #[arg(long = "shortfall-at", value_name = "SECONDS")]
    shortfall_at_s: Option<u64>,
    /// Worker threads of the agents' shared runtime.
    #[arg(long, default_value_t = 2)]
    agent_threads: usize,
    /// Each agent on its own thread and runtime with a thread per GPU and
    /// its own XID watch, as on hosts of their own (for comparison).
    #[arg(long)]
    isolated_agents: bool,
    /// Folder for the agents' flash files and console sockets; one that
    /// holds an earlier run's flash is refused (its quarantines would be
    /// restored), unless --flash-in-memory [default: a new one in the
    /// temporary folder, removed at the end].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Each agent's flash in memory (as an agent without a flash file)
    /// instead of a file each on this machine's one disk.
    #[arg(long)]
    flash_in_memory: bool,
    /// Outdoor temperature of every hall, °C.
    #[arg(long, default_value_t = loopwarden_hall::fleet::DEFAULT_AMBIENT_C)]
    ambient_c: f64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    json: bool,
}

/// The brokers of every `--broker`, each one address or a list `a,b,c`,
/// in order.
fn broker_list(flags: &[String]) -> Result<Vec<loopwarden_bus::BrokerAddr>, String> {
    let mut all = Vec::new();
    for b in flags {
        let list: loopwarden_bus::Brokers = b.parse().map_err(|e| format!("--broker {b}: {e}"))?;
        all.extend(list.iter().cloned());
    }
    Ok(all)
}

fn fleet(a: &FleetArgs) -> Result<String, String> {
    let addr = |b: &str| -> Result<loopwarden_bus::BrokerAddr, String> {
        b.parse().map_err(|e| format!("--broker {b}: {e}"))
    };
    let mut cfg = loopwarden_hall::fleet::FleetConfig::new(a.hosts, a.cdus, a.duration_s);
    cfg.brokers = broker_list(&a.brokers)?;
    cfg.observer_broker = a.observer_broker.as_deref().map(addr).transpose()?;
    cfg.xids = a.xids;
    cfg.shortfall_cdus = a.shortfall_cdus;
    cfg.shortfall_at_s = a.shortfall_at_s;
    cfg.agent_threads = a.agent_threads;
    cfg.isolated_agents = a.isolated_agents;
    cfg.flash_in_memory = a.flash_in_memory;
    cfg.ambient_c = a.ambient_c;
    cfg.out = a.out.clone();
    let r = loopwarden_hall::fleet::run(&cfg).map_err(|e| e.to_string())?;
    let out = if a.json { r.to_json() } else { r.summary() };
    if !r.whole() {
        // The figures are printed, and the run fails: they miss what the
        // parts that ended would have done.
        println!("{out}");
        return Err(format!("the run is not whole: {}", r.ended_early()));
    }
    Ok(out)
}

#[derive(Debug, Args)]
struct PlayArgs {
    /// The scenario (plant-scenario/1) [default: ten eventful minutes].
    #[arg(long, value_name = "FILE.toml")]
    scenario: Option<PathBuf>,
    /// Simulated seconds per wall-clock second (the default plays the
    /// demo's ten minutes in about three; 1 plays in real time).
    #[arg(long, default_value_t = DEFAULT_SPEED)]
    speed: f64,
    /// Play only this many simulated seconds.
    #[arg(long)]
    duration_s: Option<u64>,
    /// Folder for the report, the trace and the agents' flash.
    #[arg(long, default_value = "hall-run")]
    out: PathBuf,
    /// No live view.
    #[arg(long)]
    headless: bool,
    /// Use this MQTT broker (host:port) instead of the embedded one.
    #[arg(long)]
    broker: Option<String>,
    /// With --broker: speak TLS with the identities of this `lwbus pki
    /// init` folder (hosts r0h0, r0h1, …, cdu1 and the reader hall-run).
    #[arg(long, requires = "broker")]
    pki: Option<PathBuf>,
    /// An agent config file every host's agent reads (its `[quarantine]`
    /// and `[cooling_loss]` commands, say).
    #[arg(long)]
    agent_config: Option<PathBuf>,
    /// An operator clears a latched leak at this simulated second
    /// (`SECONDS:RACK`, repeatable), as `cooling-ctrl ctl clear-leak` would.
    #[arg(long = "clear-leak", value_parser = parse_clear_leak)]
    clear_leaks: Vec<(u64, usize)>,
    /// Print the run's summary (the JSON object `cooling-ctrl simulate`
    /// prints, `docs/plant-model.md` §8.3) as the last line of standard output.
    #[arg(long)]
    json: bool,
}

/// `SECONDS:RACK`.
fn parse_clear_leak(s: &str) -> Result<(u64, usize), String> {
    let (at, rack) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected SECONDS:RACK, for example 1200:2"))?;
    let at = at
        .parse()
        .map_err(|e| format!("{s:?}: seconds {at:?}: {e}"))?;
    let rack = rack
        .parse()
        .map_err(|e| format!("{s:?}: rack {rack:?}: {e}"))?;
    Ok((at, rack))
}

/// `play`'s default pace: the demo's 600 simulated seconds in about 3
/// minutes.
const DEFAULT_SPEED: f64 = 3.3;

/// The default scenario: ten eventful minutes.
const DEMO: &str = include_str!("../scenarios/demo.toml");

/// The scenario at `path` and its name, or the demo scenario.
fn scenario_of(
    path: Option<&Path>,
) -> Result<(loopwarden_twin::scenario::Scenario, String), String> {
    Ok(match path {
        Some(p) => (
            loopwarden_twin::scenario::Scenario::load(p)?,
            p.file_stem()
                .map_or("scenario".into(), |s| s.to_string_lossy().into_owned()),
        ),
        None => (
            loopwarden_twin::scenario::Scenario::from_toml(DEMO, "demo.toml")?,
            "demo".to_string(),
        ),
    })
}

fn play(a: &PlayArgs) -> Result<(), String> {
    let (scenario, name) = scenario_of(a.scenario.as_deref())?;
    if !(a.speed > 0.0 && a.speed <= 100.0) {
        return Err(format!("--speed {}: between 0 and 100", a.speed));
    }
    let broker = a
        .broker
        .as_deref()
        .map(|b| b.parse().map_err(|e| format!("--broker {b}: {e}")))
        .transpose()?;
    let cfg = loopwarden_hall::play::PlayConfig {
        scenario,
        name,
        out: a.out.clone(),
        speed: a.speed,
        duration_s: a.duration_s,
        headless: a.headless,
        broker,
        pki: a.pki.clone(),
        agent_config: a.agent_config.clone(),
        clear_leaks: a.clear_leaks.clone(),
    };
    // The controller steers the faster hall as it would in real time: the
    // same run, sooner.
    let opts = loopwarden_hall::play::PlayOptions {
        controller_pace: Some(a.speed),
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().map_err(|e| format!("runtime: {e}"))?;
    let o = rt
        .block_on(loopwarden_hall::play::play_with(cfg, opts))
        .map_err(|e| e.to_string())?;
    println!(
        "hosts heard: {}, CDU heard: {}, quarantined GPUs: {}, racks lost: {}",
        o.hosts_heard.len(),
        o.cdu_heard,
        o.quarantined.len(),
        o.racks_lost.len()
    );
    for e in &o.events {
        println!("  {e}");
    }
    for f in &o.report {
        println!("{}", f.display());
    }
    if a.json {
        let summary = o.summary.as_ref().ok_or("the run has no summary")?;
        let line = serde_json::to_string(summary).map_err(|e| format!("the summary: {e}"))?;
        println!("{line}");
    }
    Ok(())
}

#[derive(Debug, Args)]
struct PlotArgs {
    /// The run's trace (CSV, as `cooling-ctrl simulate --trace` writes it).
    #[arg(long, value_name = "FILE.csv")]
    trace: PathBuf,
    /// The run's summary (the JSON object `cooling-ctrl simulate` prints).
    #[arg(long, value_name = "FILE.json")]
    summary: Option<PathBuf>,
    /// Folder for the charts and report.md (made if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The report's title [default: scenario and controller from the
    /// summary, else the trace's file name].
    #[arg(long)]
    title: Option<String>,
}

fn plot(a: &PlotArgs) -> Result<Vec<PathBuf>, String> {
    let file = File::open(&a.trace).map_err(|e| format!("{}: {e}", a.trace.display()))?;
    let rows =
        read_trace(BufReader::new(file)).map_err(|e| format!("{}: {e}", a.trace.display()))?;
    let summary = match &a.summary {
        None => None,
        Some(p) => Some(read_summary(p)?),
    };
    let title = a
        .title
        .clone()
        .unwrap_or_else(|| default_title(&a.trace, summary.as_ref()));
    write_report(&a.out, &title, &rows, summary.as_ref()).map_err(|e| e.to_string())
}

fn read_summary(p: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    // serde_json's message ends with the line and column.
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", p.display()))?;
    if !v.is_object() {
        return Err(format!("{}: the summary is not a JSON object", p.display()));
    }
    Ok(v)
}

fn default_title(trace: &Path, summary: Option<&serde_json::Value>) -> String {
    let field = |k: &str| summary.and_then(|s| s.get(k)).and_then(|v| v.as_str());
    match (field("scenario"), field("controller")) {
        (Some(s), Some(c)) => format!("{s} ({c})"),
        (Some(s), None) => s.to_string(),
        _ => trace
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".to_string()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Play(a) => {
            loopwarden_hall::logging::init("warn");
            match play(&a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("loopwarden-hall play: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Fleet(a) => {
            // rumqttd reports every client that leaves as an error.
            loopwarden_bus::init_logging("error,rumqttd=off");
            match fleet(&a) {
                Ok(out) => {
                    println!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("loopwarden-hall fleet: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Cdu(a) => {
            loopwarden_bus::init_logging("warn");
            match cdu(&a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("loopwarden-hall cdu: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Goodput(a) => match goodput::run(&a) {
            Ok(lines) => {
                for l in lines {
                    println!("{l}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loopwarden-hall goodput: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Plot(a) => match plot(&a) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("loopwarden-hall plot: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brokers_are_taken_as_a_list_or_one_flag_each() {
        let list = |flags: &[&str]| {
            broker_list(&flags.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|v| v.iter().map(|b| b.to_string()).collect::<Vec<_>>())
        };
        let three = ["127.0.0.1:14221", "127.0.0.1:14222", "127.0.0.1:14223"];
        assert_eq!(
            list(&["127.0.0.1:14221,127.0.0.1:14222,127.0.0.1:14223"]).unwrap(),
            three
        );
        assert_eq!(list(&three).unwrap(), three);
        assert_eq!(
            list(&["127.0.0.1:14221", "127.0.0.1:14222,127.0.0.1:14223"]).unwrap(),
            three
        );
        // A name alone takes the default port.
        assert_eq!(list(&["127.0.0.1:14221,nope"]).unwrap()[1], "nope:1883");
        let e = list(&["127.0.0.1:14221,:1883"]).unwrap_err();
        assert!(e.starts_with("--broker 127.0.0.1:14221,:1883:"), "{e}");
    }
}

//! `cooling-ctrl`: the CDU controller's tools.
//!
//! - `cooling-ctrl simulate --scenario FILE --controller NAME [--trace
//!   FILE.csv]`: plays a `plant-scenario/1` on the simulated hall in
//!   simulated time with that controller in charge and prints the run's
//!   figures as one JSON object on standard output. Controllers: `ours`,
//!   the references `baseline-18` and `baseline-32`, and `oracle` (shown
//!   the true plant state; for calibration only).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cooling_ctrl::twin::Ours;
use loopwarden_boards::oracle::Oracle;
use loopwarden_boards::scenario::Scenario;
use loopwarden_boards::sim::{self, Baseline, Controller};

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

#[derive(Subcommand)]
enum Command {
    /// Play a plant scenario in simulated time and print its figures.
    Simulate {
        /// The scenario (plant-scenario/1 TOML).
        #[arg(long)]
        scenario: PathBuf,
        /// Who runs the CDU: ours, baseline-18, baseline-32 or oracle.
        #[arg(long, default_value = "ours")]
        controller: String,
        /// Write the time series here (CSV).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Seconds between two rows of the trace.
        #[arg(long, default_value_t = 10)]
        trace_every_s: u64,
    },
}

fn main() -> ExitCode {
    let Command::Simulate {
        scenario,
        controller,
        trace,
        trace_every_s,
    } = Cli::parse().command;
    let sc = match Scenario::load(&scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cooling-ctrl: {e}");
            return ExitCode::from(2);
        }
    };
    let racks = sc.site.racks;
    let mut ctl: Box<dyn Controller> = match controller.as_str() {
        "baseline-18" => Box::new(Baseline::new(18.0, racks)),
        "baseline-32" => Box::new(Baseline::new(32.0, racks)),
        "oracle" => Box::new(Oracle::new(&sc)),
        "ours" => match Ours::new(&sc.site) {
            Ok(o) => Box::new(o),
            Err(e) => {
                eprintln!("cooling-ctrl: the scenario's site: {e}");
                return ExitCode::from(2);
            }
        },
        other => {
            eprintln!(
                "cooling-ctrl: --controller {other:?}: ours, baseline-18, baseline-32 or oracle"
            );
            return ExitCode::from(2);
        }
    };
    let name = scenario
        .file_stem()
        .map_or("scenario".into(), |s| s.to_string_lossy().into_owned());
    let mut file = match trace.as_ref().map(std::fs::File::create).transpose() {
        Ok(f) => f.map(std::io::BufWriter::new),
        Err(e) => {
            eprintln!("cooling-ctrl: --trace: {e}");
            return ExitCode::from(2);
        }
    };
    let result = sim::run(
        &name,
        &sc,
        ctl.as_mut(),
        file.as_mut().map(|w| w as &mut dyn std::io::Write),
        trace_every_s,
    );
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cooling-ctrl: writing the trace: {e}");
            return ExitCode::from(1);
        }
    };
    let json = serde_json::to_value(&summary).expect("a summary serialises");
    println!("{json}");
    ExitCode::SUCCESS
}

//! `cooling-ctrl`: the CDU controller's tools.
//!
//! - `cooling-ctrl simulate --scenario FILE --controller NAME [--trace
//!   FILE.csv]`: plays a `plant-scenario/1` on the simulated hall in
//!   simulated time with that controller in charge and prints the run's
//!   figures as one JSON object on standard output.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
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
        /// Who runs the CDU: ours, baseline-18 or baseline-32.
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

/// `ours` while the controller is not built: static warm water.
struct Ours(Baseline);

impl Controller for Ours {
    fn name(&self) -> &str {
        "ours"
    }
    fn step(&mut self, r: &sim::Readings) -> sim::Decision {
        self.0.step(r)
    }
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
    let (mut ctl, note): (Box<dyn Controller>, Option<&str>) = match controller.as_str() {
        "baseline-18" => (Box::new(Baseline::new(18.0, racks)), None),
        "baseline-32" => (Box::new(Baseline::new(32.0, racks)), None),
        "ours" => (
            Box::new(Ours(Baseline::new(32.0, racks))),
            Some("ours is baseline-32 (static 32 C water, pumps at 100 %, no caps) until the controller is built"),
        ),
        other => {
            eprintln!(
                "cooling-ctrl: --controller {other:?}: ours, baseline-18 or baseline-32 (the oracle reference is not built yet)"
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
    let mut json = serde_json::to_value(&summary).expect("a summary serialises");
    if let Some(n) = note {
        json["note"] = n.into();
    }
    println!("{json}");
    ExitCode::SUCCESS
}

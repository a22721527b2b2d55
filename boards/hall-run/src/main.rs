//! `loopwarden-hall`: the simulated hall's one-command run.
//!
//! Today: `loopwarden-hall plot --trace FILE.csv [--summary FILE.json]
//! --out DIR [--title T]` writes the report of a run. `play` (start the
//! hall and its agents, play a scenario) comes next.

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
    /// Writes the report of a run: SVG charts of its trace and report.md.
    Plot(PlotArgs),
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

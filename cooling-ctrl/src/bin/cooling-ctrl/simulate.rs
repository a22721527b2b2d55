//! `cooling-ctrl simulate`: a plant scenario played in simulated time with
//! a controller in charge (ours through the decision path, a baseline, or
//! the oracle), on one CDU or on a hall of several; the figures as one
//! JSON line on standard output. Built with the `twin` feature only.

use std::path::PathBuf;
use std::process::ExitCode;

use cooling_ctrl::simulated::Ours;
use loopwarden_twin::oracle::Oracle;
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim::{self, Baseline, Controller};

/// What `simulate` takes.
#[derive(clap::Args)]
pub struct Args {
    /// The scenario (plant-scenario/1 TOML).
    #[arg(long)]
    pub scenario: PathBuf,
    /// Who runs the CDU: ours, baseline-18, baseline-32 or oracle.
    #[arg(long, default_value = "ours")]
    pub controller: String,
    /// Write the time series here (CSV).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Seconds between two rows of the trace.
    #[arg(long, default_value_t = 10)]
    pub trace_every_s: u64,
    /// A hall of several CDUs: how its facility water is set (fixed,
    /// follow-coldest or coordinated).
    #[arg(long, default_value = "coordinated")]
    pub facility: String,
}

/// `cooling-ctrl simulate`: plays the scenario and prints its figures
/// (exit status 2: a bad scenario or option; 1: the trace not written).
pub fn command(args: Args) -> ExitCode {
    let Args {
        scenario,
        controller,
        trace,
        trace_every_s,
        facility,
    } = args;
    let facility = facility.as_str();
    let sc = match Scenario::load(&scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cooling-ctrl: {e}");
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
    let trace = file.as_mut().map(|w| w as &mut dyn std::io::Write);
    if sc.site.cdus > 1 {
        return simulate_hall(&name, &sc, &controller, facility, trace, trace_every_s);
    }
    let mut ctl = match sim_controller(&sc, &controller) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cooling-ctrl: {e}");
            return ExitCode::from(2);
        }
    };
    let result = sim::run(&name, &sc, ctl.as_mut(), trace, trace_every_s);
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

/// The controller `name` for one CDU of `sc`.
fn sim_controller(sc: &Scenario, name: &str) -> Result<Box<dyn Controller>, String> {
    let racks = sc.site.racks;
    Ok(match name {
        "baseline-18" => Box::new(Baseline::new(18.0, racks)),
        "baseline-32" => Box::new(Baseline::new(32.0, racks)),
        "oracle" if sc.site.cdus > 1 => {
            return Err("--controller oracle: a hall of one CDU only".into())
        }
        "oracle" => Box::new(Oracle::new(sc)),
        "ours" => Box::new(Ours::new(&sc.site).map_err(|e| format!("the scenario's site: {e}"))?),
        other => {
            return Err(format!(
                "--controller {other:?}: ours, baseline-18, baseline-32 or oracle"
            ))
        }
    })
}

/// A hall of several CDUs: one controller `controller` per CDU, the
/// facility water set as `facility` says; prints the hall's figures
/// with each CDU's.
fn simulate_hall(
    name: &str,
    sc: &Scenario,
    controller: &str,
    facility: &str,
    trace: Option<&mut dyn std::io::Write>,
    trace_every_s: u64,
) -> ExitCode {
    let mut coordinator = match cooling_ctrl::simulated::SimCoordinator::new(&sc.site) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cooling-ctrl: the scenario's site: {e}");
            return ExitCode::from(2);
        }
    };
    let mut policy = match facility {
        "fixed" => sim::FacilityPolicy::Fixed,
        "follow-coldest" => sim::FacilityPolicy::FollowColdest,
        "coordinated" if controller == "ours" => sim::FacilityPolicy::Coordinated(&mut coordinator),
        "coordinated" => {
            eprintln!("cooling-ctrl: --facility coordinated needs --controller ours (the references offer nothing)");
            return ExitCode::from(2);
        }
        other => {
            eprintln!("cooling-ctrl: --facility {other:?}: fixed, follow-coldest or coordinated");
            return ExitCode::from(2);
        }
    };
    let controllers: Result<Vec<_>, _> = (0..sc.site.cdus)
        .map(|_| sim_controller(sc, controller))
        .collect();
    let mut controllers = match controllers {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cooling-ctrl: {e}");
            return ExitCode::from(2);
        }
    };
    match sim::run_hall(
        name,
        sc,
        &mut controllers,
        &mut policy,
        trace,
        trace_every_s,
    ) {
        Ok(summary) => {
            let json = serde_json::to_value(&summary).expect("a summary serialises");
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cooling-ctrl: writing the trace: {e}");
            ExitCode::from(1)
        }
    }
}

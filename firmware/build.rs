//! Boards are data: this script reads the board file
//! (`boards/mcu/mps2-an386.toml`) and the CDU's register map (the file
//! named by `LOOPWARDEN_FIRMWARE_CDU_MAP`, a path absolute or from
//! `firmware/`; without it `boards/cdus/sim-cdu.toml`, the simulated
//! CDU's; the same files the Linux controller reads) and writes, into
//! `OUT_DIR`:
//! - `memory.x`: the linker's memory regions (cortex-m-rt's `link.x`
//!   includes it);
//! - `board.rs`: the board's addresses, interrupts and figures as consts;
//! - `cdu_map.rs`: the register map as a const table, with the read spans;
//! - `operators.rs`: the operators whose signed clears the firmware acts
//!   on, from the file named by `LOOPWARDEN_FIRMWARE_OPERATORS` (a path
//!   absolute or from `firmware/`; none without it: every clear is
//!   refused);
//! - `figures.rs`: the hall's figures the core starts with, the figures
//!   record in the file named by `LOOPWARDEN_FIRMWARE_FIGURES` (a path
//!   absolute or from `firmware/`; without it the reference hall's, and a
//!   warning says so), with the bound of the wait after a start
//!   (`START_BOUND_MS`): the CDU's heartbeat timeout the record carries,
//!   else 10 s and a warning naming `[loop] heartbeat_timeout_s`.
//!
//! A file that cannot be read, parsed or believed stops the build with
//! the file and the reason; a map without a register the firmware needs
//! names it; figures the firmware would refuse at start, or a map whose
//! valve word cannot hold their racks or whose supply_setpoint range
//! leaves none of their setpoints (the firmware's check at start, and
//! `run`'s), stop it too, as does a control period above a third of the
//! CDU's heartbeat timeout the figures give (`run` refuses its
//! `period_ms` so).

use std::path::{Path, PathBuf};

#[path = "build/board.rs"]
mod board;
#[path = "build/figures.rs"]
mod figures;
#[path = "build/input.rs"]
mod input;
#[path = "build/map.rs"]
mod map;
#[path = "build/operators.rs"]
mod operators;

pub use input::read_toml;

/// The variable naming the CDU's register map.
const MAP_VAR: &str = "LOOPWARDEN_FIRMWARE_CDU_MAP";

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let board_file = here.join("../boards/mcu/mps2-an386.toml");
    println!("cargo:rerun-if-env-changed={MAP_VAR}");
    let map_file = std::env::var_os(MAP_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| here.join("../boards/cdus/sim-cdu.toml"));
    for f in [&board_file, &map_file] {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-env-changed={}", operators::VAR);
    let keyring = std::env::var_os(operators::VAR).map(PathBuf::from);
    if let Some(k) = &keyring {
        println!("cargo:rerun-if-changed={}", k.display());
    }
    println!("cargo:rerun-if-env-changed={}", figures::VAR);
    let figures = std::env::var_os(figures::VAR).map(PathBuf::from);
    if let Some(f) = &figures {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let given = Given {
        keyring: keyring.as_deref(),
        figures: figures.as_deref(),
    };
    if let Err(e) = generate(&board_file, &map_file, &given, &out) {
        // A build script's panic message is what cargo shows.
        panic!("{e}");
    }
    println!("cargo:rustc-link-search={}", out.display());
}

/// The files named at build time, if any.
struct Given<'a> {
    keyring: Option<&'a Path>,
    figures: Option<&'a Path>,
}

fn generate(board_file: &Path, map_file: &Path, given: &Given, out: &Path) -> Result<(), String> {
    let b = board::Board::load(board_file)?;
    write(&out.join("memory.x"), &b.memory_x())?;
    write(&out.join("board.rs"), &b.consts())?;
    let m = map::Map::load(map_file)?;
    write(&out.join("cdu_map.rs"), &m.table()?)?;
    write(&out.join("operators.rs"), &operators::table(given.keyring)?)?;
    let (table, cfg, heartbeat) = figures::table(given.figures, out)?;
    let source = given.figures.map_or_else(
        || "of the reference hall".to_string(),
        |f| format!("in {}", f.display()),
    );
    m.check_figures(&cfg, &source)?;
    figures::check_period(b.control_period_ms(), board_file, heartbeat, &source)?;
    write(&out.join("figures.rs"), &table)?;
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: not written: {e}", path.display()))
}

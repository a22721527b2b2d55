//! `cooling-ctrl firmware-figures`: the record it writes for a hall's
//! site figures holds exactly the configuration `run` builds from the
//! same file, and a damaged record is refused (by the decoder the
//! firmware runs, and by `replay-trace --figures`).
//!
//! Glossary:
//! - *figures record*: the core's configuration as the firmware is built
//!   with it (`cooling_core::config::figures`).

use std::path::Path;
use std::process::Command;

use cooling_core::config::figures::{self, FiguresError};
use cooling_ctrl::config::{self, Overrides};

const BIN: &str = env!("CARGO_BIN_EXE_cooling-ctrl");

/// A hall unlike the reference: 4 CDUs on the facility water, 6 racks of
/// 3 hosts of 4 GPUs, other GPUs and another loop.
const HALL: &str = "racks = 6\nhosts_per_rack = 3\ngpus_per_host = 4\ncdus = 4\n\
                    [gpu]\ntdp_w = 600.0\nmin_cap_w = 250.0\n\
                    [loop]\napproach_k = 3.5\ndew_point_c = 16.0\n\
                    [facility]\nwater_kg_per_s = 3.0\n";

fn firmware_figures(site: &Path, out: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["firmware-figures", "--site-figures"])
        .arg(site)
        .arg("--out")
        .arg(out)
        .output()
        .expect("cooling-ctrl runs")
}

#[test]
fn the_record_holds_what_run_builds_from_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("hall.toml");
    std::fs::write(&site, HALL).unwrap();
    let out = dir.path().join("figures.bin");
    let o = firmware_figures(&site, &out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{said}");
    assert!(
        said.contains("6 racks of 3 hosts of 4 GPUs, 4 CDU(s)"),
        "{said}"
    );

    let run = config::resolve(
        Some(Path::new("cdu.toml")),
        &format!(
            "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\n\
             embedded_broker = true\nsite_figures = {site:?}\n"
        ),
        &Overrides::default(),
    )
    .expect("run's configuration");
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), figures::RECORD_BYTES);
    let decoded = figures::decode(&bytes).expect("the record decodes");
    assert_eq!(decoded, run.core, "the firmware's core is run's");
    assert_eq!(decoded.facility.cdus, 4);
    assert_eq!(decoded.layout.racks, 6);
    assert_ne!(decoded, cooling_core::CoreConfig::reference());
}

#[test]
fn a_damaged_record_is_refused_by_its_crc() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("hall.toml");
    std::fs::write(&site, HALL).unwrap();
    let out = dir.path().join("figures.bin");
    assert!(firmware_figures(&site, &out).status.success());
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[40] ^= 0x01;
    assert!(matches!(
        figures::decode(&bytes),
        Err(FiguresError::Crc { .. })
    ));
    let bad = dir.path().join("bad.bin");
    std::fs::write(&bad, &bytes).unwrap();
    let trace = dir.path().join("trace.bin");
    std::fs::write(&trace, []).unwrap();
    let o = Command::new(BIN)
        .args(["replay-trace", "--figures"])
        .arg(&bad)
        .arg(&trace)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(
        said.contains("bad.bin") && said.contains("CRC-32"),
        "{said}"
    );
}

#[test]
fn figures_the_core_refuses_write_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("hall.toml");
    std::fs::write(&site, "racks = 17\n").unwrap();
    let out = dir.path().join("figures.bin");
    let o = firmware_figures(&site, &out);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(
        said.contains("hall.toml") && said.contains("racks"),
        "{said}"
    );
    assert!(!out.exists());
}

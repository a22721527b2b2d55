//! `cooling_ctrl_config`: the controller's configuration, read by its own
//! loader ([`config::resolve`], which reads the files it names too: the
//! sign key, the TLS files, the CDU's register map, the hall's figures,
//! the board's pins).
//!
//! Seeds: the example the package installs (as shipped and with every
//! setting uncommented, its site files in a folder of the test's own) and
//! demonstration-key controllers with the northbound server and metrics,
//! mutated as TOML (and one in four as bytes too). An error must say what
//! is wrong, where, and, if it names a line, one in the file.

use std::path::Path;

use cooling_ctrl::config::{self, Overrides};
use loopwarden_system_tests::{example_config, pki_dir, repo_root};

use crate::harness::fuzz;
use crate::toml_mutate::{error_is_placed, TomlMutator};

const NAME: &str = "cooling-ctrl.toml";

/// The site's files the example names, as `lwbus pki init` writes them
/// for hall-1 with cdu1, and the simulated CDU's map and board's pins.
fn site_files() -> tempfile::TempDir {
    let etc = pki_dir("hall-1", ["r0h0@cdu1", "cdu1", "ops1", "bms1"], 8883);
    let boards = repo_root().join("boards");
    let copy = |from: &str, to: &str| {
        std::fs::copy(boards.join(from), etc.path().join(to)).expect("copy a board file");
    };
    std::fs::create_dir(etc.path().join("cdus")).expect("a folder");
    copy("cdus/sim-cdu.toml", "cdus/cdu-model.toml");
    copy("pins/sim-controller.toml", "pins.toml");
    let figures = "racks = 4\nhosts_per_rack = 4\ngpus_per_host = 8\n";
    std::fs::write(etc.path().join("hall-1.toml"), figures).expect("the figures");
    etc
}

fn seeds(etc: &Path) -> Vec<String> {
    let shipped = example_config::read(NAME);
    let every = example_config::with_every_setting(&shipped);
    let demo = "cdu = \"cdu-1\"\ndemo_key = true\ncdu_tcp = \"127.0.0.1:5020\"\n\
                embedded_broker = true\n";
    vec![
        example_config::at(&shipped, etc),
        example_config::at(&every, etc),
        demo.to_string(),
        format!(
            "{demo}northbound = \"127.0.0.1:5502\"\nnorthbound_unit_id = 17\n\
             metrics_listen = \"127.0.0.1:9410\"\n"
        ),
    ]
}

fn check(text: &str) -> Result<(), String> {
    match config::resolve(None, text, &Overrides::default()) {
        Ok(_) => Ok(()),
        Err(e) => error_is_placed(text, &e.origin, e.line, &e.message),
    }
}

#[test]
fn cooling_ctrl_config() {
    let etc = site_files();
    let seeds = seeds(etc.path());
    let mutator = TomlMutator::new(&seeds);
    fuzz(
        "cooling_ctrl_config",
        &seeds,
        |rng, _| mutator.mutate(rng),
        |text| check(text),
    );
}

//! Fuzz target of the host agent's configuration, run for a time budget
//! (see `tests/fuzz/harness.rs`): the file an operator writes, read by the
//! agent's own loader ([`config::resolve`], which reads the files it
//! names too: the keyring, the TLS files, the broker's password).
//!
//! - `node_agent_config`: the example the package installs (as shipped
//!   and with every setting uncommented, its site files written by
//!   `lwbus pki init` into a folder of the test's own) and simulated-GPU
//!   configurations, mutated as TOML: values on boundaries or of another
//!   type, keys removed, moved or added, strings mutated, and one in four
//!   as bytes too. Random bytes seldom get past the TOML layer; these
//!   reach each setting's check. An error must say what is wrong, where
//!   (the file, a flag or the default) and, if it names a line, one in
//!   the file.

#[path = "../../tests/fuzz/harness.rs"]
mod harness;
#[path = "../../tests/fuzz/toml_mutate.rs"]
mod toml_mutate;

use harness::fuzz;
use loopwarden_system_tests::{example_config, pki_dir};
use node_agent::config::{self, Overrides};
use toml_mutate::{error_is_placed, TomlMutator};

const NAME: &str = "node-agent.toml";

/// The example as shipped and with every setting, pointed at `etc`, and
/// simulated hosts with and without the site's keyring.
fn seeds(etc: &std::path::Path) -> Vec<String> {
    let shipped = example_config::read(NAME);
    let every = example_config::with_every_setting(&shipped);
    let ring = etc.join("keyring.toml");
    vec![
        example_config::at(&shipped, etc),
        example_config::at(&every, etc),
        "site = \"a\"\nhost = \"h\"\ntwin_gpus = 8\nmetrics_listen = \":9400\"\n".into(),
        format!(
            "site = \"hall-1\"\nhost = \"h01\"\ntwin_gpus = 2\nkeyring = {ring:?}\n\
             broker = \"10.0.0.5\"\ncdu = \"cdu1\"\nrack = 3\n\
             [quarantine]\nactions = [[\"drain\", \"{{host}}\", \"{{gpu}}\"]]\n"
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
fn node_agent_config() {
    let etc = pki_dir("hall-1", ["h01@cdu1", "cdu1", "ops1", "bms1"], 8883);
    std::fs::write(etc.path().join("broker-password"), "secret\n").unwrap();
    let seeds = seeds(etc.path());
    let mutator = TomlMutator::new(&seeds);
    fuzz(
        "node_agent_config",
        &seeds,
        |rng, _| mutator.mutate(rng),
        |text| check(text),
    );
}

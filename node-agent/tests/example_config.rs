//! The example configuration the package installs as
//! `/etc/loopwarden/node-agent.toml` (`deploy/etc/loopwarden/`), loaded
//! with the agent's own loader: with a site's files where it names them
//! (a PKI written by `lwbus pki init`), as it is and with every commented
//! setting uncommented. A key renamed or a range narrowed in the agent
//! fails here, not on a host.

use std::path::Path;
use std::time::Duration;

use loopwarden_system_tests::{example_config, pki_dir};
use node_agent::config::{self, GpuSourceKind, Overrides};

const NAME: &str = "node-agent.toml";

/// The site's files the example names, as `lwbus pki init` writes them
/// for host h01 of hall-1 cooled by cdu1, plus the broker password file.
fn site_files() -> tempfile::TempDir {
    let etc = pki_dir("hall-1", ["h01@cdu1", "cdu1", "ops1", "bms1"], 8883);
    let password = etc.path().join("broker-password");
    std::fs::write(&password, "secret\n").unwrap();
    // Private, as the agent asks of a secret.
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&password, private).unwrap();
    etc
}

/// The programs the example's actions name, first on this test's PATH
/// (on real GPUs an action whose program the loader cannot find there is
/// a protection off, `programs_missing`, which the example must not
/// have): the package's loopwarden-slurm (`deploy/slurm`,
/// `/usr/bin` on a host) and, for a build machine without systemd, a
/// `systemctl` that fails if run.
fn with_the_examples_programs_on_path() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("example-config-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let systemctl = bin.join("systemctl");
        std::fs::write(&systemctl, "#!/bin/sh\nexit 1\n").unwrap();
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&systemctl, executable).unwrap();
        let slurm = loopwarden_system_tests::repo_root().join("deploy/slurm");
        let path = std::env::var("PATH").unwrap_or_default();
        std::env::set_var(
            "PATH",
            format!("{}:{}:{path}", slurm.display(), bin.display()),
        );
    });
}

/// Loads `text`, with the site's files in `etc`, through the agent's
/// loader (from a file, as `node-agent run --config` does), with the
/// programs its actions name on PATH.
fn load(text: &str, etc: &Path) -> Result<config::Config, config::ConfigError> {
    with_the_examples_programs_on_path();
    let file = example_config::write_at(etc, NAME, text);
    config::load(Some(&file), &Overrides::default())
}

/// The example with this host's settings written in, as an operator
/// does: its id, its CDU and its rack, which it ships without.
fn with_this_host(text: &str) -> String {
    let mut text = text.to_string();
    for line in ["host = \"h01\"", "cdu = \"cdu1\"", "rack = 0"] {
        let commented = format!("\n# {line}\n");
        assert!(text.contains(&commented), "the example has `# {line}`");
        text = text.replace(&commented, &format!("\n{line}\n"));
    }
    text
}

/// A rack is never taken from the example: with every site file there,
/// the file as shipped is refused until this host's CDU and rack are
/// written, naming them.
#[test]
fn the_example_as_shipped_is_refused_until_its_cdu_and_rack_are_set() {
    let etc = site_files();
    let e = load(&example_config::read(NAME), etc.path()).unwrap_err();
    assert!(
        e.message.contains("`cdu` and `rack`"),
        "the refusal names cdu and rack: {e}"
    );
    let text = example_config::read(NAME);
    for key in ["host", "cdu", "rack"] {
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{key} ="))),
            "{key} is set in the example as shipped"
        );
    }
}

#[test]
fn the_example_loads_with_this_hosts_settings_and_the_sites_files() {
    let etc = site_files();
    let text = with_this_host(&example_config::read(NAME));
    let c = load(&text, etc.path()).expect("the example loads");
    assert_eq!(c.site.as_str(), "hall-1");
    assert_eq!(c.host.as_str(), "h01");
    assert_eq!(c.gpus, GpuSourceKind::Nvml, "a real host reads NVML");
    assert!(c.tls.is_some(), "TLS to the broker");
    assert!(!c.demo_key);
    assert!(
        c.authority
            .signers
            .iter()
            .any(|s| s.name.as_ref().is_some_and(|n| n.as_str() == "cdu1")),
        "the keyring lists cdu1"
    );
    assert_eq!(c.cdu.as_ref().map(|c| c.as_str()), Some("cdu1"));
    assert_eq!(c.rack, Some(0));
    assert_eq!(c.period, Duration::from_secs(1));
    assert_eq!(
        c.flash.as_deref(),
        Some(Path::new("/var/lib/loopwarden/node-agent.flash"))
    );
    assert_eq!(
        c.quarantine_actions[0][..4],
        ["loopwarden-slurm", "drain", "{host}", "gpu{gpu}"],
        "a quarantined GPU is drained through the wrapper, tagged by GPU"
    );
    assert!(
        c.quarantine_again_at_start,
        "the drain, harmless run again, runs again at each start"
    );
    assert!(
        c.cooling_loss.any(),
        "a rack without cooling is drained and powered down"
    );
    // The cooling's resume lifts only the cooling's drain: never a
    // person's, nor a quarantined GPU's.
    assert_eq!(
        c.cooling_loss.resume,
        [["loopwarden-slurm", "resume", "{host}", "cooling"]]
    );
    assert_eq!(c.cooling_loss.grace, Duration::from_secs(30));
    assert!(c.opt_outs.is_empty(), "no protection switched off");
    assert!(
        c.programs_missing.is_empty(),
        "every program the example's actions name is found: {:?}",
        c.programs_missing
    );
    assert_eq!(c.site_limit, None, "the limit found on each GPU");
}

#[test]
fn every_commented_setting_is_one_the_agent_takes() {
    let etc = site_files();
    let text = example_config::with_every_setting(&example_config::read(NAME));
    let c = load(&text, etc.path()).expect("every setting loads");
    assert_eq!(c.credentials, Some(("h01".into(), "secret".into())));
    assert_eq!(c.deadline, Duration::from_millis(250));
    assert_eq!(c.guard.engage.0, 85);
    assert_eq!(c.quarantine_actions.len(), 1);
    assert_eq!(c.quarantine_actions[0][0], "loopwarden-slurm");
    assert!(c.cooling_loss.any());
    assert_eq!(c.metrics_listen, Some(([10, 0, 1, 7], 19400).into()));
    assert_eq!(c.console, Path::new("/run/loopwarden/node-agent.sock"));
    let l = c.console_limits;
    assert_eq!((l.max_connections, l.idle.as_secs()), (8, 60));
    assert_eq!(c.site_limit, Some(loopwarden_protocol::Watts(600)));
    assert!(c.programs_missing.is_empty(), "{:?}", c.programs_missing);
}

#[test]
fn without_the_sites_files_the_example_names_the_first_it_lacks() {
    // As installed on a host where nothing else is there yet.
    example_config::assert_names_the_missing_ca(NAME, |file| {
        config::load(Some(file), &Overrides::default())
    });
}

//! The example configuration the package installs as
//! `/etc/loopwarden/cooling-ctrl.toml` (`deploy/etc/loopwarden/`), loaded
//! with the controller's own loader: with a site's files where it names
//! them (a PKI written by `lwbus pki init`, a register map, the hall's
//! figures, a pin map), as it is and with every commented setting
//! uncommented; and as shipped, without them, it must not start. A key
//! renamed or a range narrowed in the controller fails here, not on a CDU.

use std::path::Path;
use std::time::Duration;

use cooling_ctrl::config::{self, Overrides};
use cooling_ctrl::modbus::Link;
use loopwarden_system_tests::{example_config, pki_dir, repo_root};

const NAME: &str = "cooling-ctrl.toml";

/// The site's files the example names: the PKI of hall-1 with cdu1, the
/// CDU model's register map and the controller board's pin map (the
/// simulated ones, as the package's examples), and the hall's figures.
fn site_files() -> tempfile::TempDir {
    let etc = pki_dir("hall-1", ["r0h0@cdu1", "cdu1", "ops1", "bms1"], 8883);
    let boards = repo_root().join("boards");
    std::fs::create_dir(etc.path().join("cdus")).unwrap();
    std::fs::copy(
        boards.join("cdus/sim-cdu.toml"),
        etc.path().join("cdus/cdu-model.toml"),
    )
    .unwrap();
    // The simulated map's rope_fault lines are active high (they play
    // the twin's lines); a real board's are active low, as the
    // controller requires on a GPIO chip.
    let sim = std::fs::read_to_string(boards.join("pins/sim-controller.toml")).unwrap();
    let real = sim.replace(
        "signal = \"rope_fault\"\nrack = 0\nline = 4\nactive_low = false",
        "signal = \"rope_fault\"\nrack = 0\nline = 4\nactive_low = true",
    );
    let real = ["1\nline = 5", "2\nline = 6", "3\nline = 7"]
        .iter()
        .fold(real, |t, at| {
            t.replace(
                &format!("rack = {at}\nactive_low = false"),
                &format!("rack = {at}\nactive_low = true"),
            )
        });
    let map = loopwarden_boards::pins::PinMap::from_toml(&real, "pins.toml").unwrap();
    assert!(map.ropes.iter().all(|r| r.fault.active_low), "{real}");
    std::fs::write(etc.path().join("pins.toml"), real).unwrap();
    std::fs::write(
        etc.path().join("hall-1.toml"),
        "racks = 4\nhosts_per_rack = 4\ngpus_per_host = 8\n",
    )
    .unwrap();
    etc
}

/// Loads `text`, with the site's files in `etc`, through the controller's
/// loader (from a file, as `cooling-ctrl run --config` does).
fn load(text: &str, etc: &Path) -> Result<config::Config, config::ConfigError> {
    let file = example_config::write_at(etc, NAME, text);
    config::load(Some(&file), &Overrides::default())
}

#[test]
fn the_example_loads_as_shipped_with_the_sites_files() {
    let etc = site_files();
    let c = load(&example_config::read(NAME), etc.path()).expect("the example loads");
    assert_eq!(c.site.as_str(), "hall-1");
    assert_eq!(c.cdu.as_str(), "cdu1");
    assert!(!c.demo_key, "signs with the site's key");
    assert!(c.tls.is_some(), "TLS to the broker");
    assert_eq!(c.link, Some(Link::Tcp("10.0.3.20:502".parse().unwrap())));
    assert_eq!(c.hosts.len(), 16);
    assert_eq!(c.hosts[0].as_str(), "r0h0");
    assert_eq!(c.hosts[15].as_str(), "r3h3");
    assert_eq!(c.period, Duration::from_secs(1));
    assert_eq!(
        c.flash.as_deref(),
        Some(Path::new("/var/lib/loopwarden/cooling-ctrl.flash"))
    );
    assert!(c.board.is_none() && c.northbound.is_none());
}

#[test]
fn every_commented_setting_is_one_the_controller_takes() {
    let etc = site_files();
    let text = example_config::with_every_setting(&example_config::read(NAME));
    let c = load(&text, etc.path()).expect("every setting loads");
    assert_eq!(c.lease, Duration::from_secs(30));
    assert_eq!(c.modbus_timeout, Duration::from_millis(375));
    assert_eq!(c.ambient_c, Some(35.0));
    let board = c.board.expect("the board's pins");
    assert_eq!(board.chip, Path::new("/dev/gpiochip0"));
    assert_eq!(c.northbound, Some(([10, 0, 3, 5], 502).into()));
    let northbound = c.northbound.unwrap();
    assert!(
        !northbound.ip().is_unspecified(),
        "the example binds the northbound server to the management address, never to every interface: {northbound}"
    );
    assert!(!c.northbound_writes);
    assert_eq!(c.metrics_listen, Some(([10, 0, 3, 5], 19401).into()));
    assert_eq!(c.console, Path::new("/run/loopwarden/cooling-ctrl.sock"));
    let l = c.console_limits;
    assert_eq!((l.max_connections, l.idle.as_secs()), (8, 60));
    let l = c.northbound_limits;
    assert_eq!((l.max_connections, l.idle.as_secs()), (16, 120));
}

#[test]
fn as_shipped_without_the_sites_files_it_does_not_start() {
    // As installed on a CDU where nothing else is there yet.
    example_config::assert_names_the_missing_ca(NAME, |file| {
        config::load(Some(file), &Overrides::default())
    });
}

#[test]
fn without_its_register_map_the_example_does_not_start() {
    // Every other file in place: the CDU model's map, which the example
    // names and no package ships, is still required.
    let etc = site_files();
    std::fs::remove_file(etc.path().join("cdus/cdu-model.toml")).unwrap();
    let text = example_config::read(NAME);
    let line = text
        .lines()
        .position(|l| l.starts_with("register_map = "))
        .expect("the example names a register map")
        + 1;
    let e = load(&text, etc.path()).unwrap_err();
    assert_eq!(e.line, Some(line), "{e}");
    assert!(e.to_string().contains("cdus/cdu-model.toml"), "{e}");
}

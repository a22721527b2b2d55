//! Behaviour goldens: what `cooling-ctrl simulate` reports for every plant
//! scenario under each of the four controllers, and what `node-agent
//! replay` writes for every health trace, recorded once and compared on
//! every run. A change of crate layout or of code structure must leave
//! them as they are: the replay output byte for byte, the simulate
//! figures to 4 significant figures. A change of behaviour that is meant
//! re-records them with `LOOPWARDEN_BLESS=1` and says so in its commit.
//!
//! The plant scenarios are the repository's demo and the public set,
//! copied into `goldens/plant/` so a clone alone checks them; the health
//! traces are the repository's own and, where `LOOPWARDEN_PUBLIC_TRACES`
//! names a directory of them, the public set (too large to copy: its
//! replay goldens are kept, and checked where the set is given).
//!
//! Glossary:
//! - *golden*: a recorded output that later runs must reproduce.
//! - *bless*: record the goldens anew from the code as it is.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use cooling_ctrl::simulated::Ours;
use loopwarden_twin::oracle::Oracle;
use loopwarden_twin::scenario::Scenario;
use loopwarden_twin::sim::{self, Baseline, Controller};
use serde_json::Value;

const CONTROLLERS: [&str; 4] = ["baseline-18", "baseline-32", "oracle", "ours"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("goldens")
}

fn blessing() -> bool {
    std::env::var_os("LOOPWARDEN_BLESS").is_some_and(|v| v == "1")
}

/// The files in `dir` ending in `ext`, sorted; none when `dir` is absent.
fn listed(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    v
}

fn stem(p: &Path, ext: &str) -> String {
    let name = p.file_name().unwrap().to_string_lossy();
    name.strip_suffix(ext).unwrap_or(&name).to_string()
}

/// One scenario under every controller, as `simulate` prints it: the
/// summary's JSON, or the error that stopped it.
fn simulate_all(path: &Path) -> Value {
    let name = stem(path, ".toml");
    let sc = match Scenario::load(path) {
        Ok(s) => s,
        // The error names the file by the name it has in every clone.
        Err(e) => {
            let e = e.replace(&path.display().to_string(), &format!("{name}.toml"));
            return serde_json::json!({ "error": e });
        }
    };
    let racks = sc.site.racks;
    let mut out = serde_json::Map::new();
    for which in CONTROLLERS {
        let mut ctl: Box<dyn Controller> = match which {
            "baseline-18" => Box::new(Baseline::new(18.0, racks)),
            "baseline-32" => Box::new(Baseline::new(32.0, racks)),
            "oracle" => Box::new(Oracle::new(&sc)),
            _ => match Ours::new(&sc.site) {
                Ok(o) => Box::new(o),
                Err(e) => {
                    out.insert(which.into(), serde_json::json!({ "error": e.to_string() }));
                    continue;
                }
            },
        };
        let summary = sim::run(&name, &sc, ctl.as_mut(), None, 60).unwrap();
        out.insert(which.into(), serde_json::to_value(&summary).unwrap());
    }
    Value::Object(out)
}

/// Equal, numbers to 4 significant figures; the path of each difference.
fn differences(at: &str, want: &Value, got: &Value, diffs: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let (x, y) = (a.get(k), b.get(k));
                match (x, y) {
                    (Some(x), Some(y)) => differences(&format!("{at}.{k}"), x, y, diffs),
                    _ => diffs.push(format!("{at}.{k}: {x:?} then {y:?}")),
                }
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            if (x - y).abs() > 5e-4 * x.abs().max(y.abs()) {
                diffs.push(format!("{at}: {x} then {y}"));
            }
        }
        _ if want != got => diffs.push(format!("{at}: {want} then {got}")),
        _ => {}
    }
}

#[test]
fn simulate_figures_match_their_goldens() {
    let mut scenarios = vec![root().join("hall/scenarios/demo.toml")];
    scenarios.extend(listed(&goldens().join("plant"), ".toml"));
    let mut diffs = Vec::new();
    for path in &scenarios {
        let name = stem(path, ".toml");
        let got = simulate_all(path);
        let file = goldens().join("simulate").join(format!("{name}.json"));
        if blessing() {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
            std::fs::write(&file, text).unwrap();
            continue;
        }
        let want: Value = match std::fs::read_to_string(&file) {
            Ok(t) => serde_json::from_str(&t).unwrap(),
            Err(e) => {
                diffs.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        differences(&name, &want, &got, &mut diffs);
    }
    assert!(
        diffs.is_empty(),
        "simulate differs from its goldens:\n{}",
        diffs.join("\n")
    );
}

/// What `node-agent replay` writes for one trace: the verdicts, then the
/// notes under a line of their own, or the error.
fn replayed(path: &Path) -> String {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    let result = node_core::replay::replay(
        file,
        node_core::health::Policy::default(),
        &mut out,
        &mut notes,
    );
    let mut text = String::from_utf8(out).unwrap();
    text.push_str("--- notes\n");
    text.push_str(&String::from_utf8(notes).unwrap());
    if let Err(e) = result {
        writeln!(text, "--- error\n{e}").unwrap();
    }
    text
}

#[test]
fn replay_output_matches_its_goldens() {
    let mut traces = listed(&root().join("node-core/tests/traces"), ".jsonl");
    match std::env::var_os("LOOPWARDEN_PUBLIC_TRACES") {
        Some(public) => {
            let found = listed(Path::new(&public), ".jsonl");
            assert!(!found.is_empty(), "no traces in LOOPWARDEN_PUBLIC_TRACES");
            traces.extend(found);
        }
        None => eprintln!("public health traces not replayed: LOOPWARDEN_PUBLIC_TRACES unset"),
    }
    let mut diffs = Vec::new();
    for path in &traces {
        let name = stem(path, ".jsonl");
        let got = replayed(path);
        let file = goldens().join("replay").join(format!("{name}.txt"));
        if blessing() {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, &got).unwrap();
            continue;
        }
        match std::fs::read_to_string(&file) {
            Ok(want) if want == got => {}
            Ok(want) => diffs.push(format!("{name}: was\n{want}\nnow\n{got}")),
            Err(e) => diffs.push(format!("{}: {e}", file.display())),
        }
    }
    assert!(
        diffs.is_empty(),
        "replay differs from its goldens:\n{}",
        diffs.join("\n")
    );
}

//! The crate graph drawn in `docs/architecture.md` ("The graph") is the
//! workspace's: for every crate, the workspace crates it depends on
//! (normal dependencies; optional ones on the drawing's `(+ … with the
//! feature …)` line) as `cargo metadata` reads them from the manifests.
//! The system-test harness is described in words there, not drawn.
//!
//! Glossary:
//! - *drawn*: a line `crate [(no_std)] → dep, -short, …` of the block,
//!   where `-short` is `loopwarden-short`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use loopwarden_system_tests::repo_root;

/// A crate's workspace dependencies: (always, only with a feature).
type Deps = (BTreeSet<String>, BTreeSet<String>);

/// The workspace crates and their workspace dependencies, by name.
fn from_metadata() -> BTreeMap<String, Deps> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = m["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    let mut graph = BTreeMap::new();
    for p in packages {
        let mut deps = Deps::default();
        for d in p["dependencies"].as_array().expect("dependencies") {
            let name = d["name"].as_str().expect("dependency name").to_string();
            if !names.contains(&name) || !d["kind"].is_null() {
                continue;
            }
            if d["optional"].as_bool() == Some(true) {
                deps.1.insert(name);
            } else {
                deps.0.insert(name);
            }
        }
        graph.insert(p["name"].as_str().expect("name").to_string(), deps);
    }
    graph
}

/// `-short` as `loopwarden-short`; any other name as it is.
fn full(name: &str) -> String {
    match name.strip_prefix('-') {
        Some(short) => format!("loopwarden-{short}"),
        None => name.to_string(),
    }
}

/// The graph as drawn in `text` (docs/architecture.md).
fn drawn(text: &str) -> BTreeMap<String, Deps> {
    let section = text
        .split("## The graph")
        .nth(1)
        .expect("docs/architecture.md has \"## The graph\"");
    let block = section
        .split("```")
        .nth(1)
        .expect("a fenced block under \"The graph\"");
    let mut graph: BTreeMap<String, Deps> = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with(' ') {
            // `(+ loopwarden-twin with the feature `twin`)`
            let inner = line.trim().trim_start_matches("(+").trim_end_matches(')');
            let dep = inner.split(" with ").next().expect("a dependency").trim();
            let owner = last.clone().expect("a continuation line follows a crate");
            graph.entry(owner).or_default().1.insert(full(dep));
            continue;
        }
        let (head, deps) = line.split_once('→').unwrap_or((line, ""));
        let name = head
            .split_whitespace()
            .next()
            .expect("a crate name")
            .to_string();
        let always = deps
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(full)
            .collect();
        graph.insert(name.clone(), (always, BTreeSet::new()));
        last = Some(name);
    }
    graph
}

#[test]
fn the_drawn_crate_graph_is_the_workspaces() {
    let doc = std::fs::read_to_string(repo_root().join("docs/architecture.md"))
        .expect("docs/architecture.md");
    let drawn = drawn(&doc);
    let mut real = from_metadata();
    real.remove("loopwarden-system-tests");
    let crates = |g: &BTreeMap<String, Deps>| g.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        crates(&drawn),
        crates(&real),
        "the crates drawn and the workspace's"
    );
    for (name, deps) in &real {
        assert_eq!(
            &drawn[name], deps,
            "{name}: drawn (always, with a feature) vs the manifests"
        );
    }
}

#[test]
fn a_drawn_line_reads_as_its_crate_and_dependencies() {
    let g = drawn(
        "## The graph\n```\na (no_std)  → b, -c\n            (+ -d with the feature `x`)\ne\n```\n",
    );
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        g["a"],
        (set(&["b", "loopwarden-c"]), set(&["loopwarden-d"]))
    );
    assert_eq!(g["e"], Deps::default());
}

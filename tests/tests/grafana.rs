//! `deploy/grafana/loopwarden-hall.json` against what the agents export:
//! every metric a panel or a variable asks for is one a running node agent
//! or cooling controller serves on `/metrics`, with the labels the query
//! filters on, so the dashboard cannot drift from the agents. With
//! `promtool` (installed with Prometheus) every query must also parse as
//! PromQL.
//!
//! The agents: the embedded broker, a node agent for host h07 on 8
//! simulated H200s and the cooling controller in charge of the simulated
//! CDU, both in this process with `metrics_listen` on a free loopback port,
//! scraped once each is up. The per-host cap series appear only while the
//! controller caps a host: the controller's metrics are rendered once more
//! from its own last counters with host h07 capped.
//!
//! Glossary:
//! - *expression*: a panel target's `expr` or a variable's query.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use loopwarden_system_tests::prometheus::http_get;
use loopwarden_system_tests::{repo_root, require_tool};

mod agents_rig;
use agents_rig::Rig;

const DASHBOARD: &str = "deploy/grafana/loopwarden-hall.json";

const SITE: &str = "hall-g";

/// Every expression of the dashboard: (where, expression).
fn expressions(dash: &serde_json::Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("?");
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without an expr: {t}"));
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
            walk(p["panels"].as_array().map_or(&[], |v| v), out);
        }
    }
    walk(dash["panels"].as_array().expect("a panels list"), &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str());
        let q = q.unwrap_or_else(|| panic!("variable {}: no query", v["name"]));
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.rsplit_once(','))
            .map_or(q, |(sel, _)| sel);
        out.push((format!("variable {}", v["name"]), inner.to_string()));
    }
    out
}

/// PromQL's keywords and aggregation operators (never metric names).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];
/// Keywords whose parenthesised list names labels.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names in `expr`, each with the label names its selectors
/// match on: identifiers that are no keyword, no function (followed by
/// `(`), no label (in `{…}` or a `by (…)` list), no string, no range and
/// no Grafana variable (`$x`, `${x}`).
fn metric_names(expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let b: Vec<char> = expr.chars().collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_group = |mut i: usize, open: char, close: char| -> usize {
        let mut depth = 0;
        while i < b.len() {
            if b[i] == open {
                depth += 1;
            } else if b[i] == close {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            i += 1;
        }
        panic!("{expr}: unbalanced {open}{close}");
    };
    while i < b.len() {
        let c = b[i];
        if c == '"' || c == '\'' {
            i += 1
                + b[i + 1..]
                    .iter()
                    .position(|x| *x == c)
                    .expect("a closed string")
                + 1;
        } else if c == '[' {
            i = skip_group(i, '[', ']');
        } else if c == '{' {
            i = skip_group(i, '{', '}');
        } else if c == '$' {
            i += 1;
            if b.get(i) == Some(&'{') {
                i = skip_group(i, '{', '}');
            } else {
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let mut j = i;
            while j < b.len() && b[j] == ' ' {
                j += 1;
            }
            let next = b.get(j).copied();
            if LABEL_LISTS.contains(&word.as_str()) && next == Some('(') {
                i = skip_group(j, '(', ')');
            } else if next == Some('(') || KEYWORDS.contains(&word.as_str()) {
                // A function, an operator or a keyword.
            } else {
                let labels = out.entry(word).or_default();
                if next == Some('{') {
                    let end = skip_group(j, '{', '}');
                    let inner: String = b[j + 1..end - 1].iter().collect();
                    for m in inner.split(',').filter(|m| !m.trim().is_empty()) {
                        let name = m.split(['=', '!', '~']).next().unwrap_or("").trim();
                        labels.insert(name.to_string());
                    }
                    i = end;
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn metric_names_are_told_from_functions_labels_and_variables() {
    let got = metric_names(
        r#"sum by (state) (rate(a_total{x=~"$cdu", y!="b c"}[$__rate_interval]) * on(Hostname) group_left() info_x{site=~"$site"}) / 87 - max(b) + count(c == 1) + ${v}"#,
    );
    let want: BTreeMap<String, BTreeSet<String>> = [
        ("a_total", vec!["x", "y"]),
        ("info_x", vec!["site"]),
        ("b", vec![]),
        ("c", vec![]),
    ]
    .into_iter()
    .map(|(n, l)| (n.to_string(), l.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(got, want);
}

/// `/metrics` of `addr` once it holds `family` (the agent's first loop
/// ran), within 30 s.
fn scrape_once_up(addr: SocketAddr, family: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((200, body)) = http_get(addr, "/metrics") {
            if body.contains(&format!("# TYPE {family} ")) {
                return body;
            }
        }
        assert!(
            Instant::now() < deadline,
            "/metrics on {addr} never held {family}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Per metric family in `text`: the label names its samples carry.
fn families(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, rest) = match l.find(['{', ' ']) {
            Some(i) => l.split_at(i),
            None => continue,
        };
        let labels = out.entry(name.to_string()).or_default();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            for pair in inner.0.split("\",") {
                if let Some((k, _)) = pair.split_once('=') {
                    labels.insert(k.trim().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn every_metric_of_the_dashboard_is_exported_with_the_labels_it_filters_on() {
    let path = repo_root().join(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dash: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
    let exprs = expressions(&dash);
    assert!(exprs.len() > 20, "{exprs:?}");

    let rig = Rig::start(SITE);
    let mut exported = families(&scrape_once_up(rig.agent_metrics, "DCGM_FI_DEV_GPU_TEMP"));
    let cdu = scrape_once_up(rig.cdu_metrics, "loopwarden_cdu_supply_temperature_celsius");
    for text in [cdu, rig.cdu_metrics_capped()] {
        for (name, labels) in families(&text) {
            exported.entry(name).or_default().extend(labels);
        }
    }
    drop(rig);
    // Prometheus adds these to every series it scrapes.
    let scrape_labels = ["job", "instance"];

    let mut wrong = Vec::new();
    for (place, expr) in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{place}: no metric in {expr}");
        for (name, labels) in names {
            let Some(has) = exported.get(&name) else {
                wrong.push(format!("{place}: {name} is not exported"));
                continue;
            };
            for l in labels {
                if !has.contains(&l) && !scrape_labels.contains(&l.as_str()) {
                    wrong.push(format!("{place}: {name} has no label {l} (it has {has:?})"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every expression, the Grafana variables given values, parses as
/// PromQL (`promtool check rules` on a rule per expression).
#[test]
fn every_expression_parses_as_promql() {
    let Some(promtool) = require_tool("promtool") else {
        return;
    };
    let text = std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, (_, expr)) in expressions(&dash).iter().enumerate() {
        let e = expr
            .replace("$__rate_interval", "1m")
            .replace("$site", ".*")
            .replace("$cdu", ".*");
        assert!(!e.contains('$'), "a variable left in {e}");
        rules.push_str(&format!(
            "      - record: dashboard:expr{n}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let out = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

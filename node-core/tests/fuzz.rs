//! Fuzz target of the health replay, run for a time budget (see
//! `tests/fuzz/harness.rs`): a `gpu-trace/1` file, as a field engineer
//! hands it to `node-agent replay`, read and judged by
//! `node_core::replay::replay`.
//!
//! - `health_replay`: the repository's generated traces (their first
//!   lines, so a run tries many), mutated as JSON records: a number set
//!   to a boundary (0, 1, the top of `u32` and `u64`, a negative, a huge
//!   float), a field removed, a record repeated or moved (time going
//!   back), a GPU out of range; and one in four as bytes too. The replay
//!   must answer with verdicts or an error naming a line of the input and
//!   what is wrong, never panic (an overflow included: the tests build
//!   with overflow checks).

#[path = "../../tests/fuzz/harness.rs"]
mod harness;

use harness::{fuzz, mutate_bytes, Rng};
use node_core::health::Policy;

/// Lines of each committed trace taken as a seed (the header and about
/// 25 rounds of an 8-GPU host).
const SEED_LINES: usize = 240;

/// The longest input tried, bytes.
const MAX_LEN: usize = 1 << 16;

fn seeds() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/traces")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no traces in {}", dir.display());
    names
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("a trace");
            let lines: Vec<&str> = text.lines().take(SEED_LINES).collect();
            lines.join("\n") + "\n"
        })
        .collect()
}

/// Values on the boundaries of what a record's fields hold.
const BOUNDARIES: [&str; 10] = [
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-0.0",
    "\"x\"",
];

/// One record-level mutation of `text`.
fn mutate_records(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let n = lines.len();
    let i = rng.below(n.max(1)).min(n.saturating_sub(1));
    match rng.below(6) {
        0 | 1 => lines[i] = set_a_number(rng, &lines[i]),
        2 => lines[i] = drop_a_field(rng, &lines[i]),
        // Repeated, at a place of its own: time may go back.
        3 => {
            let copy = lines[i].clone();
            lines.insert(rng.below(n + 1), copy);
        }
        // A GPU out of range (a 1 before its number).
        4 => lines[i] = lines[i].replacen("\"gpu\":", "\"gpu\":1", 1),
        // Every number of the record at once: counters that add up.
        _ => {
            let v: &str = BOUNDARIES[rng.below(BOUNDARIES.len())];
            lines[i] = set_every_value(&lines[i], v);
        }
    }
    lines.join("\n") + "\n"
}

/// `line` with one number (or string value) after a `":` set to a
/// boundary.
fn set_a_number(rng: &mut Rng, line: &str) -> String {
    let starts: Vec<usize> = line.match_indices("\":").map(|(at, _)| at + 2).collect();
    let Some(&at) = starts.get(rng.below(starts.len().max(1))) else {
        return line.to_string();
    };
    let end = line[at..]
        .find([',', '}', ']'])
        .map_or(line.len(), |e| at + e);
    if line[at..].starts_with(['{', '[']) {
        return line.to_string();
    }
    format!("{}{}{}", &line[..at], rng.pick(&BOUNDARIES), &line[end..])
}

/// `line` with every number set to `v`, but the record's time and GPU.
fn set_every_value(line: &str, v: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("\":") {
        let (head, tail) = rest.split_at(at + 2);
        out.push_str(head);
        let kept = head.ends_with("\"t_ms\":") || head.ends_with("\"gpu\":");
        if kept || !tail.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
            rest = tail;
            continue;
        }
        out.push_str(v);
        rest = &tail[tail.find([',', '}', ']']).unwrap_or(tail.len())..];
    }
    out.push_str(rest);
    out
}

/// `line` without one of its `"name":value` pairs of a plain value.
fn drop_a_field(rng: &mut Rng, line: &str) -> String {
    let commas: Vec<usize> = line.match_indices(",\"").map(|(at, _)| at).collect();
    let Some(&at) = commas.get(rng.below(commas.len().max(1))) else {
        return line.to_string();
    };
    match line[at + 1..].find([',', '}']) {
        Some(e) if !line[at + 1..at + 1 + e].contains(['{', '[']) => {
            format!("{}{}", &line[..at], &line[at + 1 + e..])
        }
        _ => line.to_string(),
    }
}

fn check(text: &str) -> Result<(), String> {
    let (mut out, mut notes) = (Vec::new(), Vec::new());
    let lines = text.lines().count().max(1);
    match node_core::replay::replay(text.as_bytes(), Policy::default(), &mut out, &mut notes) {
        Ok(_) => Ok(()),
        Err(e) if e.line == 0 || e.line > lines + 1 => {
            Err(format!("error at line {} of {lines}: {e}", e.line))
        }
        Err(e) => harness::says_something("the replay's error", &e.message),
    }
}

#[test]
fn health_replay() {
    let seeds = seeds();
    let bytes: Vec<Vec<u8>> = seeds.iter().map(|s| s.as_bytes().to_vec()).collect();
    fuzz(
        "health_replay",
        &seeds,
        |rng, seeds| {
            let seed = rng.pick(seeds).clone();
            let mut text = mutate_records(rng, &seed);
            for _ in 0..rng.below(3) {
                text = mutate_records(rng, &text);
            }
            if rng.one_in(4) {
                let mut b = text.into_bytes();
                mutate_bytes(rng, &mut b, &bytes, MAX_LEN);
                text = String::from_utf8_lossy(&b).into_owned();
            }
            text
        },
        |text| check(text),
    );
}

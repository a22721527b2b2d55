//! Structured mutations of TOML files for the fuzz targets of the
//! configuration, keyring and register-map parsers (included with
//! `#[path]` next to `harness.rs`). Random bytes seldom get past the TOML
//! layer; these keep the file TOML and change what the parser behind it
//! sees: a value replaced by one on a boundary or of another type, a key
//! removed, moved to another table or added where it does not belong, two
//! values swapped, a string's bytes mutated. One input in four also gets
//! byte mutations of its text, for the TOML layer itself.

#![allow(dead_code)] // each fuzz file uses its own part

use toml::{Table, Value};

use super::harness::{mutate_bytes, Rng};

/// Mutates TOML files from a set of valid seeds.
#[derive(Debug, Clone)]
pub struct TomlMutator {
    /// Each seed's text and its table.
    seeds: Vec<(String, Table)>,
    /// Every key the seeds use, at any depth.
    keys: Vec<String>,
}

impl TomlMutator {
    /// A mutator of `texts`, each valid TOML.
    pub fn new(texts: &[String]) -> Self {
        let seeds: Vec<(String, Table)> = texts
            .iter()
            .map(|t| {
                let table = t
                    .parse::<Table>()
                    .unwrap_or_else(|e| panic!("a seed must be TOML: {e}\n{t}"));
                (t.clone(), table)
            })
            .collect();
        let mut keys = Vec::new();
        seeds.iter().for_each(|(_, t)| key_names(t, &mut keys));
        TomlMutator { seeds, keys }
    }

    /// A mutated file from one of the seeds: structured mutations of its
    /// table and, once in four, byte mutations of the text written from it.
    pub fn mutate(&self, rng: &mut Rng) -> String {
        let (text, table) = rng.pick(&self.seeds);
        let mut table = table.clone();
        for _ in 0..rng.between(1, 4) {
            mutate_table(rng, &mut table, &self.keys, 0);
        }
        let mut out = if rng.one_in(8) {
            text.clone()
        } else {
            toml::to_string(&table).unwrap_or_else(|_| text.clone())
        };
        if rng.one_in(4) {
            let others: Vec<Vec<u8>> = self
                .seeds
                .iter()
                .map(|(t, _)| t.clone().into_bytes())
                .collect();
            let mut bytes = out.into_bytes();
            mutate_bytes(rng, &mut bytes, &others, 64 * 1024);
            out = String::from_utf8_lossy(&bytes).into_owned();
        }
        out
    }
}

/// Adds every key of `t`, at any depth, to `out`.
fn key_names(t: &Table, out: &mut Vec<String>) {
    for (k, v) in t {
        if !out.contains(k) {
            out.push(k.clone());
        }
        match v {
            Value::Table(t) => key_names(t, out),
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_table)
                .for_each(|t| key_names(t, out)),
            _ => {}
        }
    }
}

/// One mutation somewhere in `table`: at this level, or in a table or an
/// array of tables below it.
fn mutate_table(rng: &mut Rng, table: &mut Table, keys: &[String], depth: usize) {
    let names: Vec<String> = table.keys().cloned().collect();
    if !names.is_empty() && depth < 4 && rng.one_in(2) {
        let name = rng.pick(&names);
        match table.get_mut(name) {
            Some(Value::Table(t)) => return mutate_table(rng, t, keys, depth + 1),
            Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_table) => {
                let i = rng.below(a.len());
                if let Some(t) = a[i].as_table_mut() {
                    return mutate_table(rng, t, keys, depth + 1);
                }
            }
            _ => {}
        }
    }
    mutate_here(rng, table, &names, keys);
}

fn mutate_here(rng: &mut Rng, table: &mut Table, names: &[String], keys: &[String]) {
    let name = (!names.is_empty()).then(|| rng.pick(names).clone());
    match (rng.below(8), name) {
        (0..=2, Some(n)) => {
            let old = table[&n].clone();
            table.insert(n, replacement(rng, &old));
        }
        (3, Some(n)) => {
            table.remove(&n);
        }
        (4, Some(n)) if names.len() > 1 => {
            let other = rng.pick(names).clone();
            let (a, b) = (table[&n].clone(), table[&other].clone());
            table.insert(n, b);
            table.insert(other, a);
        }
        (5, Some(n)) => {
            if let Value::Array(a) = &mut table[&n] {
                mutate_array(rng, a);
            } else {
                let old = table[&n].clone();
                table.insert(n, Value::Array(vec![old]));
            }
        }
        (6, Some(n)) => {
            let v = table[&n].clone();
            table.insert(rng.pick(keys).clone(), v);
        }
        _ => {
            let v = interesting(rng);
            table.insert(rng.pick(keys).clone(), v);
        }
    }
}

fn mutate_array(rng: &mut Rng, a: &mut Vec<Value>) {
    match rng.below(4) {
        0 if !a.is_empty() => {
            a.remove(rng.below(a.len()));
        }
        1 if !a.is_empty() => {
            let v = a[rng.below(a.len())].clone();
            a.push(v);
        }
        2 if !a.is_empty() => {
            let i = rng.below(a.len());
            a[i] = replacement(rng, &a[i]);
        }
        _ => a.clear(),
    }
}

/// A value for a key that held `old`: a mutation of it or an
/// interesting value of any type.
fn replacement(rng: &mut Rng, old: &Value) -> Value {
    match old {
        Value::String(s) if rng.one_in(2) => Value::String(mutate_string(rng, s)),
        Value::Integer(i) if rng.one_in(2) => {
            let deltas = [-1i64, 1, -256, 256, 65_536, -65_536];
            Value::Integer(i.wrapping_add(*rng.pick(&deltas)))
        }
        Value::Float(f) if rng.one_in(2) => Value::Float(f * *rng.pick(&[-1.0, 0.5, 2.0, 1e6])),
        _ => interesting(rng),
    }
}

fn mutate_string(rng: &mut Rng, s: &str) -> String {
    let mut bytes = s.as_bytes().to_vec();
    if rng.one_in(3) {
        let grow = rng.pick(&["/", "*", "..", "é", "\u{0}", " ", "\n", ":", "{host}", "x"]);
        let times = *rng.pick(&[1usize, 2, 40, 300]);
        bytes.extend(grow.repeat(times).as_bytes());
    } else {
        mutate_bytes(rng, &mut bytes, &[], 4096);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A value of any type on a boundary.
fn interesting(rng: &mut Rng) -> Value {
    const INTS: [i64; 14] = [
        0,
        1,
        -1,
        2,
        255,
        256,
        65_535,
        65_536,
        i32::MAX as i64,
        u32::MAX as i64,
        u32::MAX as i64 + 1,
        i64::MAX,
        i64::MIN,
        -32_768,
    ];
    const FLOATS: [f64; 10] = [
        0.0,
        -0.0,
        0.5,
        -1.0,
        1e-300,
        1e300,
        f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    const STRINGS: [&str; 12] = [
        "",
        " ",
        "a",
        "*",
        "cdu/*",
        "cdu/cdu1",
        "host/h01",
        "operator/",
        "/",
        "0.0.0.0:0",
        "[::1]:65536",
        "é\u{200b}",
    ];
    match rng.below(7) {
        0 | 1 => Value::Integer(*rng.pick(&INTS)),
        2 => Value::Float(*rng.pick(&FLOATS)),
        3 | 4 => Value::String(rng.pick(&STRINGS).to_string()),
        5 => Value::Boolean(rng.one_in(2)),
        _ if rng.one_in(2) => Value::Array(Vec::new()),
        _ => Value::Table(Table::new()),
    }
}

/// What a configuration error must be: a message that says something,
/// an origin, and a line (if any) that is in the file.
pub fn error_is_placed(
    text: &str,
    origin: &str,
    line: Option<usize>,
    message: &str,
) -> Result<(), String> {
    if message.trim().is_empty() || origin.trim().is_empty() {
        return Err(format!(
            "error without words: origin {origin:?}, message {message:?}"
        ));
    }
    let lines = text.matches('\n').count() + 1;
    match line {
        Some(l) if l == 0 || l > lines => Err(format!("line {l} of a file of {lines}: {message}")),
        _ => Ok(()),
    }
}

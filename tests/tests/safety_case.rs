//! The safety case (`docs/safety.md`) names a test on every row of its
//! FMEA table, as `path: function`; each must be a function of that file,
//! so the table cannot drift from the tests that back it. (That the tests
//! pass is the rest of `cargo test --workspace`.)

use std::path::PathBuf;

/// `path: function` references in a line.
fn references(line: &str) -> Vec<(String, String)> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| {
            let (path, name) = code.split_once(".rs: ")?;
            Some((format!("{path}.rs"), name.to_string()))
        })
        .collect()
}

#[test]
fn every_fmea_row_names_a_test_that_exists() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/safety.md")).expect("docs/safety.md");
    let rows: Vec<&str> = doc
        .lines()
        .skip_while(|l| !l.starts_with("| fault |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(rows.len() >= 25, "the FMEA table has {} rows", rows.len());
    let mut missing = Vec::new();
    for row in &rows {
        let fault = row.split('|').nth(1).unwrap_or("").trim();
        let refs = references(row);
        if refs.is_empty() && !row.contains("as above") {
            missing.push(format!("{fault}: names no test"));
        }
        for (path, name) in refs {
            let text = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
            if !text.contains(&format!("fn {name}(")) {
                missing.push(format!("{fault}: {path} has no fn {name}"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

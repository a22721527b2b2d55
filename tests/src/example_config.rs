//! The example configurations the packages install under `/etc/loopwarden/`
//! (`deploy/etc/loopwarden/`), for the tests that load them with the
//! agents' own loaders so they never drift from the keys the agents take.
//!
//! Glossary:
//! - *site files*: what an example names under `/etc/loopwarden/` (keys,
//!   certificates, the keyring, a register map); a test puts them in a
//!   folder of its own and points the example there with [`at`].
//! - *commented setting*: a line `# key = value`, `# [table]` or the
//!   lines of a commented array, which an operator uncomments to use;
//!   [`with_every_setting`] uncomments them all.

use std::path::{Path, PathBuf};

/// Where the examples live in the repository.
pub fn dir() -> PathBuf {
    crate::repo_root().join("deploy/etc/loopwarden")
}

/// The text of the example `name` (`node-agent.toml`).
pub fn read(name: &str) -> String {
    let path = dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `text` with every path under `/etc/loopwarden/` moved under `etc`.
pub fn at(text: &str, etc: &Path) -> String {
    text.replace("/etc/loopwarden/", &format!("{}/", etc.display()))
}

/// `text` with every commented setting uncommented; prose stays a comment.
pub fn with_every_setting(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if is_setting(rest) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the text of a comment is a setting: `key = …`, `[table]`, an
/// element of an array (indented `[`), or the `]` that closes one.
fn is_setting(rest: &str) -> bool {
    let key = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    if let Some((k, _)) = rest.split_once(" = ") {
        return key(k);
    }
    if let Some(table) = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return key(table);
    }
    rest == "]" || rest.starts_with("  [")
}

/// Writes `text` as `name` in `etc`, its paths under `/etc/loopwarden/`
/// moved there ([`at`]), for an agent's loader to read.
pub fn write_at(etc: &Path, name: &str, text: &str) -> PathBuf {
    let path = etc.join(name);
    std::fs::write(&path, at(text, etc)).expect("write the configuration");
    path
}

/// The example `name` as shipped, read where it lies by an agent's
/// `load`, does not load on a machine without a site's files, and says
/// the first it lacks, the CA certificate. Skipped (and said) on a
/// machine that holds a real site's files.
pub fn assert_names_the_missing_ca<T, E: std::fmt::Display>(
    name: &str,
    load: impl FnOnce(&Path) -> Result<T, E>,
) {
    if Path::new("/etc/loopwarden/ca.crt").exists() {
        eprintln!("SKIP: /etc/loopwarden/ca.crt exists here");
        return;
    }
    match load(&dir().join(name)) {
        Ok(_) => panic!("{name} as shipped loads without the site's files"),
        Err(e) => assert!(e.to_string().contains("/etc/loopwarden/ca.crt"), "{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_uncommented_and_prose_is_not() {
        let text = "# The site.\nsite = \"a\"\n# period_ms = 500\n# [guard]\n\
                    # actions = [\n#   [\"x\", \"{host}\"],\n# ]\n# Or a list, as in `hosts = []`.\n\
                    # [guard] below caps a GPU.\n";
        assert_eq!(
            with_every_setting(text),
            "# The site.\nsite = \"a\"\nperiod_ms = 500\n[guard]\nactions = [\n  [\"x\", \"{host}\"],\n]\n\
             # Or a list, as in `hosts = []`.\n# [guard] below caps a GPU."
        );
    }

    #[test]
    fn paths_move_under_the_folder_given() {
        let moved = at(
            "tls_ca = \"/etc/loopwarden/ca.crt\"\nflash = \"/var/lib/loopwarden/a\"\n",
            Path::new("/tmp/x"),
        );
        assert_eq!(
            moved,
            "tls_ca = \"/tmp/x/ca.crt\"\nflash = \"/var/lib/loopwarden/a\"\n"
        );
    }
}

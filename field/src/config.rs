//! Configuration errors that point at their origin: the file and line, a
//! flag, or the default.
//!
//! An agent reads its TOML file into its own structure, picks each value
//! from the flag or else the file ([`pick!`](crate::pick)), and checks it;
//! an error names the flag (`flag --period-ms`), the file's line of the key
//! (`agent.toml line 4`) or, when neither gave the value, `default`.

use std::fmt;
use std::path::{Path, PathBuf};

use loopwarden_protocol::Ident;
use serde::de::DeserializeOwned;

/// A configuration that cannot be used, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, a flag or `default`.
    pub origin: String,
    /// The line in the file, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{} line {}: {}", self.origin, l, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Reads the file at `path`: `<path>: cannot read: …` when it cannot.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        origin: path.display().to_string(),
        line: None,
        message: format!("cannot read: {e}"),
    })
}

/// Reads the file at `path` if there is one; no file reads as empty.
pub fn read_optional(path: Option<&Path>) -> Result<String, ConfigError> {
    path.map_or(Ok(String::new()), read)
}

/// The line of a TOML error's span in `text`.
pub fn span_line(text: &str, e: &toml::de::Error) -> Option<usize> {
    e.span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
}

/// Parses `text` (the file at `path`; `config` without one) as a `T`,
/// with the line of a syntax error, a wrong type or an unknown key.
pub fn parse<T: DeserializeOwned>(path: Option<&Path>, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError {
        origin: path.map_or("config".into(), |p| p.display().to_string()),
        line: span_line(text, &e),
        message: match e.message() {
            m if m.trim().is_empty() => unexplained(text, &e),
            m => m.to_string(),
        },
    })
}

/// What the TOML parser leaves without words (a control character in a
/// comment): the character found where it points.
fn unexplained(text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map_or(text.len(), |s| s.start);
    match text.get(at..).and_then(|rest| rest.chars().next()) {
        Some(c) => format!("{c:?} is not valid TOML here"),
        None => "not valid TOML".into(),
    }
}

/// Where values came from, for error messages: the file's path and text,
/// and the `[section]` the keys are in (`None`: top-level).
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    path: Option<&'a Path>,
    text: &'a str,
    section: Option<&'a str>,
}

impl<'a> Sources<'a> {
    /// The file at `path` (none: every value is a flag or the default),
    /// read as `text`; top-level keys.
    pub fn new(path: Option<&'a Path>, text: &'a str) -> Self {
        Sources {
            path,
            text,
            section: None,
        }
    }

    /// The same file, for the keys of `[section]`.
    pub fn section(self, section: &'a str) -> Self {
        Sources {
            section: Some(section),
            ..self
        }
    }

    /// The line of `key` (in this section) in the file, written under
    /// its `[section]`, as a dotted key (`guard.period_ms = 6`) or in an
    /// inline table (`guard = { period_ms = 6 }`). The rows of an array
    /// written over several lines are values, not section headers, and a
    /// header may carry a comment.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        let target = joined(self.section.map(key_path).unwrap_or_default(), key);
        let mut current = String::new();
        // Brackets still open from a value that spans lines.
        let mut open = 0;
        for (i, raw) in self.text.lines().enumerate() {
            let line = raw.trim();
            if open > 0 {
                open = brackets_open(line, open);
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest.split(']').next().unwrap_or("");
                current = key_path(name.trim_start_matches('['));
                continue;
            }
            let Some((k, value)) = line.split_once('=') else {
                continue;
            };
            let path = joined(current.clone(), &key_path(k));
            if path == target || inline_holds(&path, value, &target) {
                return Some(i + 1);
            }
            open = brackets_open(value, 0);
        }
        None
    }

    /// `message` about `key`, from `flag` when a flag gave the value, else
    /// from the file's line of `key`, else from the default.
    pub fn error(&self, flag: Option<&str>, key: &str, message: String) -> ConfigError {
        if let Some(flag) = flag {
            return ConfigError {
                origin: format!("flag --{flag}"),
                line: None,
                message,
            };
        }
        match (self.path, self.line_of(key)) {
            (Some(p), Some(line)) => ConfigError {
                origin: p.display().to_string(),
                line: Some(line),
                message,
            },
            _ => ConfigError {
                origin: "default".into(),
                line: None,
                message,
            },
        }
    }
}

/// A dotted key or section name as written (`guard . "period_ms"`), as
/// one path without white space and quotes (`guard.period_ms`).
fn key_path(written: &str) -> String {
    written
        .split('.')
        .map(unquoted)
        .collect::<Vec<_>>()
        .join(".")
}

/// `prefix.key`, or `key` under no prefix.
fn joined(prefix: String, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Whether `value`, written for the key at `path`, is an inline table
/// that holds `target` (at any depth).
fn inline_holds(path: &str, value: &str, target: &str) -> bool {
    let Some(inner) = value.trim().strip_prefix('{') else {
        return false;
    };
    if !target.starts_with(path) {
        return false;
    }
    top_level_items(inner).into_iter().any(|item| {
        item.split_once('=').is_some_and(|(k, v)| {
            let at = joined(path.to_string(), &key_path(k));
            at == target || inline_holds(&at, v, target)
        })
    })
}

/// The comma-separated items of an inline table's text after its `{`, up
/// to its closing `}`: commas inside strings, arrays and nested tables
/// do not separate.
fn top_level_items(inner: &str) -> Vec<&str> {
    let (mut items, mut start, mut depth) = (Vec::new(), 0, 0usize);
    let mut closed = false;
    outside_strings(inner, |i, c| {
        match c {
            '{' | '[' => depth += 1,
            '}' if depth == 0 => {
                items.push(&inner[start..i]);
                closed = true;
                return false;
            }
            '}' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        true
    });
    if !closed {
        items.push(&inner[start..]);
    }
    items
}

/// A key or section name as written, without its white space and quotes
/// (`"keep_alive_s"`, `'keep_alive_s'`).
fn unquoted(written: &str) -> &str {
    let k = written.trim();
    ["\"", "'"]
        .iter()
        .find_map(|q| k.strip_prefix(q).and_then(|k| k.strip_suffix(q)))
        .unwrap_or(k)
}

/// The brackets left open after `text`, given `open` before it: strings
/// (`"…"` with its escapes, `'…'`) and a comment are passed over.
fn brackets_open(text: &str, mut open: usize) -> usize {
    outside_strings(text, |_, c| {
        match c {
            '#' => return false,
            '[' => open += 1,
            ']' => open = open.saturating_sub(1),
            _ => {}
        }
        true
    });
    open
}

/// Hands `each` the characters of `text` outside its strings (`"…"` with
/// its escapes, `'…'`), with their byte offsets, while it answers true.
fn outside_strings(text: &str, mut each: impl FnMut(usize, char) -> bool) {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some('"'), '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (Some(q), c) if c == q && !escaped => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, c) => {
                if !each(i, c) {
                    return;
                }
            }
        }
        escaped = false;
    }
}

/// Picks the flag, else the file: `(value, Some(flag name))` when the flag
/// gave it, `(value, None)` from the file, `(None, None)` from neither.
#[macro_export]
macro_rules! pick {
    ($flag:expr, $file:expr, $flagname:literal) => {
        match (&$flag, &$file) {
            (Some(v), _) => (Some(v.clone()), Some($flagname)),
            (None, Some(v)) => (Some(v.clone()), None),
            (None, None) => (None, None),
        }
    };
}

/// The picked value if it lies in `lo..=hi` (`key = v is out of range (lo
/// to hi<unit>)` otherwise), or `default` when none was given.
pub fn range<T: PartialOrd + fmt::Display + Copy>(
    src: &Sources,
    (value, flag): (Option<T>, Option<&str>),
    key: &str,
    default: T,
    lo: T,
    hi: T,
    unit: &str,
) -> Result<T, ConfigError> {
    let Some(v) = value else { return Ok(default) };
    // Written so that a NaN is out of range.
    if !(v >= lo && v <= hi) {
        return Err(src.error(
            flag,
            key,
            format!("{key} = {v} is out of range ({lo} to {hi}{unit})"),
        ));
    }
    Ok(v)
}

/// A required name (an [`Ident`]): the picked value, else `default`;
/// `key is required` without either.
pub fn ident(
    src: &Sources,
    (value, flag): (Option<String>, Option<&str>),
    key: &str,
    default: Option<String>,
) -> Result<Ident, ConfigError> {
    let v = value.or(default).ok_or_else(|| {
        src.error(
            None,
            key,
            format!("{key} is required (in the file or as --{key})"),
        )
    })?;
    Ident::new(&v).map_err(|e| {
        src.error(
            flag,
            key,
            format!("{key} = {v:?} is not a name: {e} (1 to 32 of A-Z a-z 0-9 _ - .)"),
        )
    })
}

/// The broker login from the picked `broker_user` and
/// `broker_password_file` (read here, trailing white space dropped): both
/// or neither. The password file is refused when others than its owner
/// and group can read it, as a key is
/// ([`check_private`](loopwarden_bus::keys::check_private)).
pub fn credentials(
    src: &Sources,
    user: (Option<String>, Option<&str>),
    password_file: (Option<PathBuf>, Option<&str>),
) -> Result<Option<(String, String)>, ConfigError> {
    match (user, password_file) {
        ((Some(user), _), (Some(pw), flag)) => {
            loopwarden_bus::keys::check_private(&pw, "broker password file")
                .map_err(|m| src.error(flag, "broker_password_file", m))?;
            let password = std::fs::read_to_string(&pw).map_err(|e| {
                src.error(
                    flag,
                    "broker_password_file",
                    format!("cannot read {}: {e}", pw.display()),
                )
            })?;
            Ok(Some((user, password.trim_end().to_string())))
        }
        ((None, _), (None, _)) => Ok(None),
        ((Some(_), flag), (None, _)) => Err(src.error(
            flag,
            "broker_user",
            "broker_user without broker_password_file: the two go together".into(),
        )),
        ((None, _), (Some(_), flag)) => Err(src.error(
            flag,
            "broker_password_file",
            "broker_password_file without broker_user: the two go together".into(),
        )),
    }
}

/// The machine's host name up to the first dot, if it has one.
pub fn local_host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or("").to_string())
        .filter(|h| !h.is_empty())
}

/// The default console socket of `program`: `/run/loopwarden/<program>.sock`
/// where that socket is (a running agent's, which `ctl` may reach as a
/// member of its group without writing the folder), or where that folder
/// can be made and written (checked by writing and removing the file
/// `probe` in it), else `loopwarden-<program>.sock` under
/// `$XDG_RUNTIME_DIR` or the temporary folder.
pub fn default_socket(program: &str, probe: &str) -> PathBuf {
    let run = Path::new("/run/loopwarden");
    socket_in(run, program, |dir| {
        std::fs::create_dir_all(dir).is_ok() && !is_read_only(dir, probe)
    })
}

/// [`default_socket`] in the folder `run`, which `writable` says whether
/// this process can write.
fn socket_in(run: &Path, program: &str, writable: impl FnOnce(&Path) -> bool) -> PathBuf {
    let socket = run.join(format!("{program}.sock"));
    if socket.exists() || writable(run) {
        return socket;
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("loopwarden-{program}.sock"))
}

fn is_read_only(dir: &Path, probe: &str) -> bool {
    let probe = dir.join(probe);
    let ok = std::fs::write(&probe, b"").is_ok();
    let _ = std::fs::remove_file(&probe);
    !ok
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "site = \"a\"\nperiod_ms = 5\n\n[guard]\nperiod_ms = 6\n";

    /// An array over several lines (its rows start with `[`) and a header
    /// with a comment: the keys after them are still found on their lines.
    #[test]
    fn keys_after_an_array_over_several_lines_are_found() {
        let text = "[quarantine]\nactions = [\n  [\"scontrol\", \"drain ]\"],\n  [\"echo\", '[x'],\n]\ntimeout_s = 3000\n[guard] # the host's own\nperiod_ms = 6\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        assert_eq!(src.section("quarantine").line_of("actions"), Some(2));
        assert_eq!(src.section("quarantine").line_of("timeout_s"), Some(6));
        assert_eq!(src.section("guard").line_of("period_ms"), Some(8));
        assert_eq!(brackets_open("[\"a\\\"]\", # ]", 0), 1);
    }

    /// An engineer in the agent's group: `/run/loopwarden` is not theirs
    /// to write, but the running agent's socket there is the one `ctl`
    /// reaches; with no socket there, one of their own.
    #[test]
    fn the_socket_of_a_running_agent_is_found_in_a_folder_not_writable() {
        let dir = tempfile::tempdir().unwrap();
        let none_writable = |_: &Path| false;
        let own = socket_in(dir.path(), "node-agent", none_writable);
        assert!(own.ends_with("loopwarden-node-agent.sock"), "{own:?}");
        assert!(!own.starts_with(dir.path()));
        std::fs::write(dir.path().join("node-agent.sock"), b"").unwrap();
        let found = socket_in(dir.path(), "node-agent", none_writable);
        assert_eq!(found, dir.path().join("node-agent.sock"));
        let writable = socket_in(dir.path(), "cooling-ctrl", |_| true);
        assert_eq!(writable, dir.path().join("cooling-ctrl.sock"));
    }

    /// Found by the configuration fuzz targets: the TOML parser says
    /// nothing of a control character in a comment, and the error was
    /// `a.toml line 2: ` and no more.
    #[test]
    fn a_control_character_in_a_comment_is_named() {
        let text = "site = \"a\"\n# the keys\u{2} of the site\n";
        let e = parse::<toml::Table>(Some(Path::new("a.toml")), text).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.toml line 2: '\\u{2}' is not valid TOML here"
        );
    }

    /// A key written as a dotted key or in an inline table is found on
    /// its line (its errors were blamed on `default`).
    #[test]
    fn dotted_keys_and_inline_tables_are_found() {
        let text = "guard.period_ms = 6\nquarantine = { reported_only = true, \"timeout_s\" = 9,\n  }\nlimits = { gpu = { site_limit_w = 500, x = [1, 2] }, y = \"a, b = c\" }\n[site]\nbus . \"keep_alive_s\" = 3\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        assert_eq!(src.section("guard").line_of("period_ms"), Some(1));
        assert_eq!(src.section("quarantine").line_of("reported_only"), Some(2));
        assert_eq!(src.section("quarantine").line_of("timeout_s"), Some(2));
        assert_eq!(src.section("limits.gpu").line_of("site_limit_w"), Some(4));
        assert_eq!(src.section("limits").line_of("y"), Some(4));
        assert_eq!(src.section("limits").line_of("b"), None, "inside a string");
        assert_eq!(src.section("site.bus").line_of("keep_alive_s"), Some(6));
        assert_eq!(src.line_of("period_ms"), None);
        assert_eq!(src.section("quarantine").line_of("x"), None);
        let e = src
            .section("quarantine")
            .error(None, "reported_only", "bad".into());
        assert_eq!(e.to_string(), "a.toml line 2: bad");
        assert_eq!(
            top_level_items(" a = 1, b = { c = 2, d = 3 } } tail"),
            [" a = 1", " b = { c = 2, d = 3 } "]
        );
    }

    #[test]
    fn quoted_keys_and_sections_are_found() {
        let text = "\"keep_alive_s\" = 0\n[ \"guard\" ]\n'period_ms' = 6\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        assert_eq!(src.line_of("keep_alive_s"), Some(1));
        assert_eq!(src.section("guard").line_of("period_ms"), Some(3));
        let e = src.error(None, "keep_alive_s", "bad".into());
        assert_eq!(e.to_string(), "a.toml line 1: bad");
    }

    #[test]
    fn keys_are_found_in_their_section() {
        let src = Sources::new(Some(Path::new("a.toml")), FILE);
        assert_eq!(src.line_of("period_ms"), Some(2));
        assert_eq!(src.section("guard").line_of("period_ms"), Some(5));
        assert_eq!(src.line_of("engage_c"), None);
        let e = src.section("guard").error(None, "period_ms", "bad".into());
        assert_eq!(e.to_string(), "a.toml line 5: bad");
        let e = src.error(Some("period-ms"), "period_ms", "bad".into());
        assert_eq!(e.to_string(), "flag --period-ms: bad");
        let e = src.error(None, "host", "bad".into());
        assert_eq!(e.to_string(), "default: bad");
        let e = Sources::new(None, FILE).error(None, "site", "bad".into());
        assert_eq!(e.origin, "default");
    }

    #[test]
    fn ranges_and_picks() {
        let src = Sources::new(Some(Path::new("a.toml")), FILE);
        let flag: Option<u64> = None;
        let file: Option<u64> = Some(5);
        let picked = pick!(flag, file, "period-ms");
        assert_eq!(picked, (Some(5), None));
        let e = range(&src, picked, "period_ms", 1000, 100, 60_000, " ms").unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.toml line 2: period_ms = 5 is out of range (100 to 60000 ms)"
        );
        assert_eq!(range(&src, (None, None), "x", 7, 1, 9, ""), Ok(7));
        assert!(range(&src, (Some(f32::NAN), None), "x", 0.0, -1.0, 1.0, "").is_err());
    }

    #[test]
    fn syntax_errors_have_their_line() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct F {
            site: Option<String>,
        }
        let e = parse::<F>(Some(Path::new("a.toml")), "site = \"a\"\nsit = 1\n").unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("a.toml", Some(2)));
        let e = parse::<F>(None, "site = 1\n").unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("config", Some(1)));
    }

    #[test]
    fn names_are_required_and_checked() {
        let src = Sources::new(Some(Path::new("a.toml")), "site = \"a b\"\n");
        let e = ident(&src, (Some("a b".into()), None), "site", None).unwrap_err();
        assert_eq!(e.line, Some(1));
        assert!(e.message.starts_with("site = \"a b\" is not a name"), "{e}");
        let e = ident(&src, (None, None), "host", None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "default: host is required (in the file or as --host)"
        );
        let n = ident(&src, (None, None), "site", Some("site".into())).unwrap();
        assert_eq!(n.as_str(), "site");
    }

    #[test]
    fn credentials_go_together() {
        let src = Sources::new(None, "");
        assert_eq!(credentials(&src, (None, None), (None, None)), Ok(None));
        let e =
            credentials(&src, (Some("u".into()), Some("broker-user")), (None, None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "flag --broker-user: broker_user without broker_password_file: the two go together"
        );
        // Keyed on what was given: the file's line of the password file.
        let text = "site = \"a\"\nbroker_password_file = \"/etc/pw\"\n";
        let src = Sources::new(Some(Path::new("a.toml")), text);
        let e = credentials(&src, (None, None), (Some("/etc/pw".into()), None)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.toml line 2: broker_password_file without broker_user: the two go together"
        );
        let src = Sources::new(None, "");
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        set_mode(&pw, 0o640);
        assert_eq!(
            credentials(&src, (Some("u".into()), None), (Some(pw), None)),
            Ok(Some(("u".into(), "secret".into())))
        );
    }

    #[test]
    fn a_password_file_others_can_read_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        set_mode(&pw, 0o604);
        let text = format!("broker_user = \"u\"\nbroker_password_file = {pw:?}\n");
        let src = Sources::new(Some(Path::new("a.toml")), &text);
        let e = credentials(&src, (Some("u".into()), None), (Some(pw.clone()), None)).unwrap_err();
        assert_eq!((e.origin.as_str(), e.line), ("a.toml", Some(2)), "{e}");
        assert!(
            e.message.contains("broker password file")
                && e.message.contains("readable by others (mode 604)"),
            "{e}"
        );
        let flag = Some("broker-password-file");
        let e = credentials(&src, (Some("u".into()), None), (Some(pw.clone()), flag)).unwrap_err();
        assert_eq!(e.origin, "flag --broker-password-file", "{e}");
        set_mode(&pw, 0o600);
        assert!(credentials(&src, (Some("u".into()), None), (Some(pw), None)).is_ok());
    }

    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

//! A build input read as TOML: the build script's (`build.rs`), and the
//! host tests' of its checks (`src/build_checks.rs`).

use std::path::Path;

/// The text of `path` parsed as TOML into `T`; errors name the file.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

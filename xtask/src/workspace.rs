//! Where things are: the workspace root, the target directory, and whether this is CI.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{self, Output};

/// The workspace root: xtask lives one level below it.
pub fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo that started us (`cargo xtask` sets `CARGO`), else the one on `PATH`.
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from)
}

/// Whether this is a CI run (`CI=true`, also `CI=1`): missing prerequisites and skipped cases
/// fail instead of warning.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| is_truthy(&v))
}

fn is_truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
}

/// Cargo's target directory for the workspace at `root`: asked of `cargo metadata` (which
/// honours `CARGO_TARGET_DIR` and `build.target-dir`), else `CARGO_TARGET_DIR`, else
/// `<root>/target` when the workspace cannot be loaded (e.g. a member's manifest is broken).
pub fn target_dir(root: &Path, cargo: &Path) -> PathBuf {
    let mut cmd = process::command(
        cargo,
        [
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ],
    );
    cmd.current_dir(root);
    let from_metadata =
        process::run_with_deadline(&mut cmd, Duration::from_secs(60), Output::Capture)
            .ok()
            .filter(|o| o.success())
            .and_then(|o| serde_json::from_str::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v.get("target_directory")?.as_str().map(PathBuf::from));
    if let Some(dir) = from_metadata {
        return dir;
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for v in ["true", "TRUE", "1", " yes "] {
            assert!(is_truthy(v), "{v}");
        }
        for v in ["", "false", "0", "no"] {
            assert!(!is_truthy(v), "{v}");
        }
    }

    #[test]
    fn root_holds_the_workspace_manifest() {
        assert!(root().join("xtask").join("Cargo.toml").is_file());
    }
}

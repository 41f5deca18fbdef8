//! The official E2B Python SDK as a test client: where its hashed lock is, where its venv goes,
//! and how xtask tells that a venv still matches the lock.
//!
//! The lock (`requirements.lock`, made by `pip-compile --generate-hashes` from
//! `requirements.in`) pins the SDK and every dependency with the hashes of their files, so
//! `pip install --require-hashes` installs exactly what was reviewed or fails. The venv lives in
//! the target directory and carries the SHA-256 of the lock it was made from: the same lock is a
//! venv to reuse, any other is a venv to make again.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// The SDK release the agent is proven against.
pub const SDK_VERSION: &str = "2.63.0";
/// The SDK's files, relative to the workspace root: the lock, its input, the scenario.
pub const SDK_DIR: &str = "crates/sandbox-agent/tests/sdk";
pub const LOCK_FILE: &str = "requirements.lock";
/// Tells the scenario driver which python to run: the venv's.
pub const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
/// The file in the venv that holds the lock's digest.
pub const STAMP_FILE: &str = "xtask-lock.sha256";

/// `<workspace>/crates/sandbox-agent/tests/sdk/requirements.lock`.
pub fn lock_path(root: &Path) -> PathBuf {
    root.join(SDK_DIR).join(LOCK_FILE)
}

/// `<target>/xtask/e2b-sdk-venv`.
pub fn venv_dir(target: &Path) -> PathBuf {
    target.join("xtask").join("e2b-sdk-venv")
}

/// The venv's interpreter.
pub fn python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The hex SHA-256 of the lock's bytes.
pub fn lock_digest(lock: &[u8]) -> String {
    Sha256::digest(lock).iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether the venv at `venv` was made from the lock whose digest is `digest` and still has
/// its interpreter.
pub fn venv_matches(venv: &Path, digest: &str) -> bool {
    python(venv).is_file()
        && std::fs::read_to_string(venv.join(STAMP_FILE)).is_ok_and(|s| s.trim() == digest)
}

/// Checks the lock's shape: every requirement pinned with `==` and at least one
/// `--hash=sha256:`, the SDK at [`SDK_VERSION`] among them. `pip --require-hashes` refuses a
/// lock that breaks the first rule too, but only after a venv was made; this says it at once,
/// naming the line.
pub fn check_lock(text: &str) -> Result<usize, String> {
    // Logical lines: a requirement continues over lines ending in `\`.
    let mut logical = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let line = raw.split(" #").next().unwrap_or("").trim_end();
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    logical.push(std::mem::take(&mut current));
                }
                current.clear();
            }
        }
    }
    let mut sdk = false;
    for req in &logical {
        let mut words = req.split_whitespace();
        let Some(spec) = words.next() else { continue };
        if spec.starts_with('-') {
            return Err(format!(
                "lock line `{spec} ...`: options do not belong in the lock"
            ));
        }
        let Some((name, version)) = spec.split_once("==") else {
            return Err(format!("`{spec}` is not pinned with =="));
        };
        if !words.any(|w| w.starts_with("--hash=sha256:")) {
            return Err(format!("`{spec}` has no --hash=sha256:"));
        }
        sdk |= name.eq_ignore_ascii_case("e2b") && version == SDK_VERSION;
    }
    if !sdk {
        return Err(format!("the lock does not pin e2b=={SDK_VERSION}"));
    }
    Ok(logical.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_lock_pins_the_sdk_and_hashes_everything() {
        let root = crate::workspace::root();
        let text = std::fs::read_to_string(lock_path(&root)).unwrap();
        let n = check_lock(&text).unwrap();
        assert!(n > 5, "{n} requirements");
        let input = std::fs::read_to_string(root.join(SDK_DIR).join("requirements.in")).unwrap();
        assert!(input.contains(&format!("e2b=={SDK_VERSION}")), "{input}");
    }

    #[test]
    fn a_bad_lock_is_refused_with_its_line() {
        let h = "--hash=sha256:0123";
        let ok =
            format!("e2b==2.63.0 \\\n    {h}\n    # via -r requirements.in\nhttpx==0.28.1 {h}\n");
        assert_eq!(check_lock(&ok), Ok(2));
        let unpinned = format!("e2b==2.63.0 {h}\nhttpx>=0.28 {h}\n");
        assert!(check_lock(&unpinned).unwrap_err().contains("httpx>=0.28"));
        let unhashed = format!("e2b==2.63.0 {h}\nhttpx==0.28.1\n");
        assert!(check_lock(&unhashed).unwrap_err().contains("no --hash"));
        let other = format!("e2b==2.62.0 {h}\n");
        assert!(
            check_lock(&other)
                .unwrap_err()
                .contains("does not pin e2b==2.63.0")
        );
        let option = format!("--index-url https://x.example/simple\ne2b==2.63.0 {h}\n");
        assert!(check_lock(&option).unwrap_err().contains("options"));
    }

    #[test]
    fn a_venv_matches_only_the_lock_it_was_made_from() {
        let venv = std::env::temp_dir().join(format!("xtask-venv-{}", std::process::id()));
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let digest = lock_digest(b"e2b==2.63.0\n");
        assert_eq!(digest.len(), 64);
        let before = venv_matches(&venv, &digest);
        std::fs::write(venv.join(STAMP_FILE), format!("{digest}\n")).unwrap();
        let no_python = venv_matches(&venv, &digest);
        std::fs::write(python(&venv), "").unwrap();
        let matches = venv_matches(&venv, &digest);
        let other = venv_matches(&venv, &lock_digest(b"e2b==2.62.0\n"));
        std::fs::remove_dir_all(&venv).unwrap();
        assert!(!before && !no_python && matches && !other);
    }
}

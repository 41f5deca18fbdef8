//! The official E2B Python SDKs as test clients: where their hashed locks are, where their
//! venvs go, and how xtask tells that a venv still matches its lock.
//!
//! Each lock (`requirements.lock`, made by `pip-compile --generate-hashes` from
//! `requirements.in`) pins the SDK and every dependency with the hashes of their files, so
//! `pip install --require-hashes` installs exactly what was reviewed or fails. A venv lives in
//! the target directory and carries the SHA-256 of the lock it was made from: the same lock is a
//! venv to reuse, any other is a venv to make again.
//!
//! Two SDK releases, each in a venv of its own because their dependency pins differ:
//! [`CURRENT`] (2.63.0, the agent's and the E2B API's client) and [`OLDER`] (2.45.1, which
//! creates through the legacy `POST /sandboxes`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// One SDK release: its lock's directory, its venv's name, the variable naming its python.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PySdk {
    /// The `e2b` release the lock pins.
    pub version: &'static str,
    /// The lock, its input and the scenario, relative to the workspace root.
    pub dir: &'static str,
    /// The venv's directory under `<target>/xtask`.
    pub venv: &'static str,
    /// Tells the tests which python to run: the venv's.
    pub env_python: &'static str,
}

/// The SDK release the agent and the E2B API are proven against.
pub const CURRENT: PySdk = PySdk {
    version: "2.63.0",
    dir: "crates/sandbox-agent/tests/sdk",
    venv: "e2b-sdk-venv",
    env_python: "SANDBOX_TEST_E2B_PYTHON",
};

/// An older release still in use, proven against the E2B API's legacy routes (issue 19).
pub const OLDER: PySdk = PySdk {
    version: "2.45.1",
    dir: "crates/sandbox-app/tests/e2b/older",
    venv: "e2b-sdk-older-venv",
    env_python: "SANDBOX_TEST_E2B_OLDER_PYTHON",
};

/// Every SDK release xtask makes a venv for.
pub const ALL: [PySdk; 2] = [CURRENT, OLDER];

/// [`CURRENT`]'s release.
pub const SDK_VERSION: &str = CURRENT.version;
/// [`CURRENT`]'s files, relative to the workspace root.
pub const SDK_DIR: &str = CURRENT.dir;
pub const LOCK_FILE: &str = "requirements.lock";
/// [`CURRENT`]'s python variable.
pub const ENV_PYTHON: &str = CURRENT.env_python;
/// The file in the venv that holds the lock's digest.
pub const STAMP_FILE: &str = "xtask-lock.sha256";

impl PySdk {
    /// `<workspace>/<dir>/requirements.lock`.
    pub fn lock_path(&self, root: &Path) -> PathBuf {
        root.join(self.dir).join(LOCK_FILE)
    }

    /// `<target>/xtask/<venv>`.
    pub fn venv_dir(&self, target: &Path) -> PathBuf {
        target.join("xtask").join(self.venv)
    }

    /// Checks the lock's shape for this release (see [`check_lock_for`]).
    pub fn check_lock(&self, text: &str) -> Result<usize, String> {
        check_lock_for(text, self.version)
    }
}

/// [`CURRENT`]'s lock: `<workspace>/crates/sandbox-agent/tests/sdk/requirements.lock`.
pub fn lock_path(root: &Path) -> PathBuf {
    CURRENT.lock_path(root)
}

/// [`CURRENT`]'s venv: `<target>/xtask/e2b-sdk-venv`.
pub fn venv_dir(target: &Path) -> PathBuf {
    CURRENT.venv_dir(target)
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

/// [`CURRENT`]'s lock check.
pub fn check_lock(text: &str) -> Result<usize, String> {
    check_lock_for(text, SDK_VERSION)
}

/// Checks a lock's shape: every requirement pinned with `==` and at least one
/// `--hash=sha256:`, the SDK at `sdk_version` among them. `pip --require-hashes` refuses a
/// lock that breaks the first rule too, but only after a venv was made; this says it at once,
/// naming the line.
pub fn check_lock_for(text: &str, sdk_version: &str) -> Result<usize, String> {
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
        sdk |= name.eq_ignore_ascii_case("e2b") && version == sdk_version;
    }
    if !sdk {
        return Err(format!("the lock does not pin e2b=={sdk_version}"));
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

    /// The pins of a lock other than the SDK's own: `name==version` of each requirement.
    fn other_pins(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|w| w.contains("==") && !w.starts_with("e2b=="))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn each_committed_lock_pins_its_own_release_and_their_pins_differ() {
        let root = crate::workspace::root();
        let mut pins = Vec::new();
        for sdk in ALL {
            let text = std::fs::read_to_string(sdk.lock_path(&root)).unwrap();
            let n = sdk.check_lock(&text).unwrap();
            assert!(n > 5, "{}: {n} requirements", sdk.version);
            let input =
                std::fs::read_to_string(root.join(sdk.dir).join("requirements.in")).unwrap();
            assert!(input.contains(&format!("e2b=={}", sdk.version)), "{input}");
            for other in ALL.iter().filter(|o| o.version != sdk.version) {
                assert!(
                    check_lock_for(&text, other.version).is_err(),
                    "{}'s lock passes as {}'s",
                    sdk.version,
                    other.version
                );
            }
            pins.push(other_pins(&text));
        }
        // The reason for two venvs: some dependency is pinned differently.
        assert_ne!(pins[0], pins[1], "the two locks pin the same dependencies");
        assert_ne!(CURRENT.venv, OLDER.venv, "two releases in one venv");
        assert_ne!(CURRENT.env_python, OLDER.env_python);
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

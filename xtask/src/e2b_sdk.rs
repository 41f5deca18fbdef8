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
//! creates through the legacy `POST /sandboxes`). The same machinery makes one venv that holds
//! no SDK: [`SCHEMATHESIS`] (4.32.5), the fuzzer the HTTP API's OpenAPI document is checked with.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// One Python package release in a venv of its own: the distribution and release its lock
/// pins, the lock's directory, the venv's name, and the variable naming the venv's program the
/// tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PySdk {
    /// The distribution the lock must pin, also the module the venv's probe imports (`e2b`).
    pub package: &'static str,
    /// The release of [`PySdk::package`] the lock pins.
    pub version: &'static str,
    /// The lock, its input and the scenario, relative to the workspace root.
    pub dir: &'static str,
    /// The venv's directory under `<target>/xtask`.
    pub venv: &'static str,
    /// The executable in the venv's `bin/` the tests are given (`python` for the SDKs).
    pub program: &'static str,
    /// Tells the tests which program to run: the venv's [`PySdk::program`].
    pub env_var: &'static str,
}

/// The SDK release the agent and the E2B API are proven against.
pub const CURRENT: PySdk = PySdk {
    package: "e2b",
    version: "2.63.0",
    dir: "crates/sandbox-agent/tests/sdk",
    venv: "e2b-sdk-venv",
    program: "python",
    env_var: "SANDBOX_TEST_E2B_PYTHON",
};

/// An older release still in use, proven against the E2B API's legacy routes (issue 19).
pub const OLDER: PySdk = PySdk {
    package: "e2b",
    version: "2.45.1",
    dir: "crates/sandbox-app/tests/e2b/older",
    venv: "e2b-sdk-older-venv",
    program: "python",
    env_var: "SANDBOX_TEST_E2B_OLDER_PYTHON",
};

/// Schemathesis, the third-party fuzzer the HTTP API's OpenAPI document is checked with (issue
/// 21). The tests are given its command-line program, `bin/schemathesis`, not the python.
pub const SCHEMATHESIS: PySdk = PySdk {
    package: "schemathesis",
    version: "4.32.5",
    dir: "crates/sandbox-app/tests/schemathesis",
    venv: "schemathesis-venv",
    program: "schemathesis",
    env_var: "SANDBOX_TEST_SCHEMATHESIS",
};

/// Every SDK release xtask makes a venv for.
pub const ALL: [PySdk; 2] = [CURRENT, OLDER];

/// Every venv xtask makes (`cargo xtask sdk-venv`): the SDK releases, then Schemathesis.
pub const VENVS: [PySdk; 3] = [CURRENT, OLDER, SCHEMATHESIS];

/// [`CURRENT`]'s release.
pub const SDK_VERSION: &str = CURRENT.version;
/// [`CURRENT`]'s files, relative to the workspace root.
pub const SDK_DIR: &str = CURRENT.dir;
pub const LOCK_FILE: &str = "requirements.lock";
/// [`CURRENT`]'s python variable.
pub const ENV_PYTHON: &str = CURRENT.env_var;
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

    /// `<venv>/bin/<program>`: what [`PySdk::env_var`] names.
    pub fn program_path(&self, venv: &Path) -> PathBuf {
        venv.join("bin").join(self.program)
    }

    /// Checks the lock's shape for this release (see [`check_lock_pins`]).
    pub fn check_lock(&self, text: &str) -> Result<usize, String> {
        check_lock_pins(text, self.package, self.version)
    }

    /// The python the venv's probe runs: prints the installed release of the distribution
    /// after importing its module, so a venv whose package does not import fails too.
    pub fn probe_script(&self) -> String {
        format!(
            "import importlib.metadata as m, {p}; print(m.version('{p}'))",
            p = self.package
        )
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

/// [`check_lock_pins`] for the `e2b` SDK at `sdk_version`.
pub fn check_lock_for(text: &str, sdk_version: &str) -> Result<usize, String> {
    check_lock_pins(text, "e2b", sdk_version)
}

/// Checks a lock's shape: every requirement pinned with `==` and at least one
/// `--hash=sha256:`, `package` at `version` among them. `pip --require-hashes` refuses a
/// lock that breaks the first rule too, but only after a venv was made; this says it at once,
/// naming the line.
pub fn check_lock_pins(text: &str, package: &str, version: &str) -> Result<usize, String> {
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
        let Some((name, pinned)) = spec.split_once("==") else {
            return Err(format!("`{spec}` is not pinned with =="));
        };
        if !words.any(|w| w.starts_with("--hash=sha256:")) {
            return Err(format!("`{spec}` has no --hash=sha256:"));
        }
        sdk |= same_distribution(name, package) && pinned == version;
    }
    if !sdk {
        return Err(format!("the lock does not pin {package}=={version}"));
    }
    Ok(logical.len())
}

/// Whether two distribution names are one (PEP 503: case, `-`, `_` and `.` do not matter).
fn same_distribution(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .map(|c| match c {
                '_' | '.' => '-',
                c => c.to_ascii_lowercase(),
            })
            .collect()
    };
    norm(a) == norm(b)
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
        assert_ne!(CURRENT.env_var, OLDER.env_var);
    }

    #[test]
    fn the_committed_schemathesis_lock_pins_schemathesis_and_hashes_everything() {
        let root = crate::workspace::root();
        let text = std::fs::read_to_string(SCHEMATHESIS.lock_path(&root)).unwrap();
        let n = SCHEMATHESIS.check_lock(&text).unwrap();
        assert!(n > 5, "{n} requirements");
        let input =
            std::fs::read_to_string(root.join(SCHEMATHESIS.dir).join("requirements.in")).unwrap();
        assert!(input.contains("schemathesis==4.32.5"), "{input}");
        // It is no SDK lock, and no SDK lock passes as it.
        for sdk in ALL {
            assert!(
                sdk.check_lock(&text).is_err(),
                "passes as e2b {}",
                sdk.version
            );
            let sdk_text = std::fs::read_to_string(sdk.lock_path(&root)).unwrap();
            assert!(SCHEMATHESIS.check_lock(&sdk_text).is_err());
        }
        let h = "--hash=sha256:0123";
        let other = format!("schemathesis==4.32.4 {h}\n");
        assert!(
            SCHEMATHESIS
                .check_lock(&other)
                .unwrap_err()
                .contains("does not pin schemathesis==4.32.5")
        );
        let spelled = format!("Schemathesis==4.32.5 {h}\n");
        assert_eq!(SCHEMATHESIS.check_lock(&spelled), Ok(1));
    }

    #[test]
    fn each_venv_has_its_own_place_variable_and_probe() {
        let venvs: std::collections::BTreeSet<_> = VENVS.iter().map(|v| v.venv).collect();
        let vars: std::collections::BTreeSet<_> = VENVS.iter().map(|v| v.env_var).collect();
        assert_eq!((venvs.len(), vars.len()), (VENVS.len(), VENVS.len()));
        assert_eq!(
            CURRENT.probe_script(),
            "import importlib.metadata as m, e2b; print(m.version('e2b'))"
        );
        assert_eq!(
            SCHEMATHESIS.probe_script(),
            "import importlib.metadata as m, schemathesis; print(m.version('schemathesis'))"
        );
        let venv = Path::new("/t/xtask/schemathesis-venv");
        assert_eq!(
            SCHEMATHESIS.program_path(venv),
            Path::new("/t/xtask/schemathesis-venv/bin/schemathesis")
        );
        assert_eq!(CURRENT.program_path(venv), python(venv));
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

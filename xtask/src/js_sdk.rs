//! The official E2B JS SDK (npm `e2b`) as a test client: its committed `package.json` and
//! `package-lock.json`, where `npm ci` installs it, and how xtask tells that an install still
//! matches the lock.
//!
//! CI installs only with `npm ci` (the lock is the whole truth: `npm ci` refuses a lock that
//! disagrees with `package.json`, and checks every file against its `integrity`), into a
//! directory under the target directory, never the repository. The install carries the
//! SHA-256 of the two files it was made from: the same files are an install to reuse, any
//! other is an install to make again.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The JS SDK release the E2B API is proven against.
pub const JS_SDK_VERSION: &str = "2.51.0";
/// `package.json`, `package-lock.json` and the scenario, relative to the workspace root.
pub const JS_DIR: &str = "crates/sandbox-app/tests/e2b/js";
pub const PACKAGE_FILE: &str = "package.json";
pub const LOCK_FILE: &str = "package-lock.json";
/// Tells the tests where the install is (the directory holding `node_modules`).
pub const ENV_JS_DIR: &str = "SANDBOX_TEST_E2B_JS_DIR";
/// The file in the install that holds the digest of the two files.
pub const STAMP_FILE: &str = "xtask-lock.sha256";
/// The oldest Node the SDK's `engines` accepts on the 20 line (`>=20.18.1 <21 || >=22`).
pub const MIN_NODE_20: (u32, u32, u32) = (20, 18, 1);

/// `<workspace>/crates/sandbox-app/tests/e2b/js`.
pub fn js_dir(root: &Path) -> PathBuf {
    root.join(JS_DIR)
}

/// `<target>/xtask/e2b-js-sdk`.
pub fn install_dir(target: &Path) -> PathBuf {
    target.join("xtask").join("e2b-js-sdk")
}

/// The installed SDK's `package.json`.
pub fn installed_package(install: &Path) -> PathBuf {
    install.join("node_modules").join("e2b").join(PACKAGE_FILE)
}

/// The hex SHA-256 of `package.json`'s bytes, a NUL, and the lock's.
pub fn files_digest(package: &[u8], lock: &[u8]) -> String {
    let mut all = package.to_vec();
    all.push(0);
    all.extend_from_slice(lock);
    crate::e2b_sdk::lock_digest(&all)
}

/// Whether the install at `install` was made from the files whose digest is `digest` and still
/// has the SDK.
pub fn install_matches(install: &Path, digest: &str) -> bool {
    installed_package(install).is_file()
        && std::fs::read_to_string(install.join(STAMP_FILE)).is_ok_and(|s| s.trim() == digest)
}

/// Checks the committed files: `package.json` depends on `e2b` at exactly [`JS_SDK_VERSION`]
/// (no range); the lock (lockfile version 2 or 3) records that same dependency at its root,
/// resolves `node_modules/e2b` to that version, and gives every package an `sha512-`
/// integrity. The number of locked packages.
pub fn check_files(package: &str, lock: &str) -> Result<usize, String> {
    let package: Value =
        serde_json::from_str(package).map_err(|e| format!("{PACKAGE_FILE} is not JSON: {e}"))?;
    let wanted = package.pointer("/dependencies/e2b").and_then(Value::as_str);
    if wanted != Some(JS_SDK_VERSION) {
        return Err(format!(
            "{PACKAGE_FILE} must depend on e2b at exactly {JS_SDK_VERSION}, not {wanted:?}"
        ));
    }
    let lock: Value =
        serde_json::from_str(lock).map_err(|e| format!("{LOCK_FILE} is not JSON: {e}"))?;
    let version = lock.get("lockfileVersion").and_then(Value::as_u64);
    if !matches!(version, Some(2 | 3)) {
        return Err(format!(
            "{LOCK_FILE}: lockfileVersion {version:?} (npm 7 or later writes 2 or 3)"
        ));
    }
    let packages = lock
        .get("packages")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{LOCK_FILE} has no `packages`"))?;
    let root = packages
        .get("")
        .and_then(|r| r.pointer("/dependencies/e2b"))
        .and_then(Value::as_str);
    if root != Some(JS_SDK_VERSION) {
        return Err(format!(
            "{LOCK_FILE} was made from another {PACKAGE_FILE}: its root depends on e2b {root:?}"
        ));
    }
    let sdk = packages
        .get("node_modules/e2b")
        .and_then(|p| p.get("version"))
        .and_then(Value::as_str);
    if sdk != Some(JS_SDK_VERSION) {
        return Err(format!(
            "{LOCK_FILE} resolves e2b to {sdk:?}, not {JS_SDK_VERSION}"
        ));
    }
    let mut n = 0;
    for (path, entry) in packages.iter().filter(|(path, _)| !path.is_empty()) {
        let integrity = entry.get("integrity").and_then(Value::as_str);
        if !integrity.is_some_and(|i| i.starts_with("sha512-")) {
            return Err(format!(
                "{LOCK_FILE}: {path} has no sha512 integrity ({integrity:?})"
            ));
        }
        n += 1;
    }
    Ok(n)
}

/// Checks `node --version`'s output (`v20.20.2`) against the SDK's `engines`: 20.18.1 or a
/// later 20, or 22 and later.
pub fn check_node_version(text: &str) -> Result<(u32, u32, u32), String> {
    let bad = || format!("`node --version` printed {:?}", text.trim());
    let digits = text.trim().strip_prefix('v').ok_or_else(bad)?;
    let mut parts = digits.splitn(3, '.').map(|p| {
        p.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse::<u32>().ok())
    });
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let v = (major, minor, patch);
    if (major == MIN_NODE_20.0 && v >= MIN_NODE_20) || major >= 22 {
        Ok(v)
    } else {
        Err(format!(
            "Node {major}.{minor}.{patch} is too old for the E2B JS SDK {JS_SDK_VERSION} \
             (it needs >=20.18.1 <21 or >=22; Debian 12's own nodejs is 18: use NodeSource's)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_files_pin_the_sdk_with_integrity() {
        let dir = js_dir(&crate::workspace::root());
        let package = std::fs::read_to_string(dir.join(PACKAGE_FILE)).unwrap();
        let lock = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        let n = check_files(&package, &lock).unwrap();
        assert!(n > 5, "{n} packages");
        assert!(dir.join("scenario.mjs").is_file());
    }

    #[test]
    fn bad_files_are_refused_saying_why() {
        let package = r#"{"dependencies": {"e2b": "2.51.0"}}"#;
        let entry = r#""node_modules/e2b": {"version": "2.51.0", "integrity": "sha512-AAAA"}"#;
        let lock = format!(
            r#"{{"lockfileVersion": 3, "packages": {{"": {{"dependencies": {{"e2b": "2.51.0"}}}}, {entry}}}}}"#
        );
        assert_eq!(check_files(package, &lock), Ok(1));
        let ranged = r#"{"dependencies": {"e2b": "^2.51.0"}}"#;
        assert!(check_files(ranged, &lock).unwrap_err().contains("exactly"));
        let other_root = lock.replacen(r#""e2b": "2.51.0""#, r#""e2b": "2.50.0""#, 1);
        assert!(
            check_files(package, &other_root)
                .unwrap_err()
                .contains("another package.json")
        );
        let other_sdk = lock.replace(r#""version": "2.51.0""#, r#""version": "2.52.0""#);
        assert!(
            check_files(package, &other_sdk)
                .unwrap_err()
                .contains("resolves e2b")
        );
        let no_integrity = lock.replace(r#", "integrity": "sha512-AAAA""#, "");
        assert!(
            check_files(package, &no_integrity)
                .unwrap_err()
                .contains("no sha512 integrity")
        );
        let old = lock.replace(r#""lockfileVersion": 3"#, r#""lockfileVersion": 1"#);
        assert!(
            check_files(package, &old)
                .unwrap_err()
                .contains("lockfileVersion")
        );
    }

    #[test]
    fn node_versions_follow_the_sdks_engines() {
        assert_eq!(check_node_version("v20.20.2\n"), Ok((20, 20, 2)));
        assert_eq!(check_node_version("v20.18.1"), Ok((20, 18, 1)));
        assert_eq!(check_node_version("v22.1.0"), Ok((22, 1, 0)));
        assert!(
            check_node_version("v20.18.0")
                .unwrap_err()
                .contains("too old")
        );
        assert!(
            check_node_version("v21.7.0")
                .unwrap_err()
                .contains("too old")
        );
        assert!(
            check_node_version("v18.20.4")
                .unwrap_err()
                .contains("too old")
        );
        assert!(check_node_version("20.20.2").is_err());
        assert!(check_node_version("vx").is_err());
    }

    #[test]
    fn an_install_matches_only_the_files_it_was_made_from() {
        let dir = std::env::temp_dir().join(format!("xtask-js-{}", std::process::id()));
        let sdk = installed_package(&dir);
        std::fs::create_dir_all(sdk.parent().unwrap()).unwrap();
        let digest = files_digest(b"{}", b"{}");
        assert_eq!(digest.len(), 64);
        assert_ne!(digest, files_digest(b"{}{", b"}"), "the boundary counts");
        let before = install_matches(&dir, &digest);
        std::fs::write(dir.join(STAMP_FILE), format!("{digest}\n")).unwrap();
        let no_sdk = install_matches(&dir, &digest);
        std::fs::write(&sdk, "{}").unwrap();
        let matches = install_matches(&dir, &digest);
        let other = install_matches(&dir, &files_digest(b"{}", b"[]"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!before && !no_sdk && matches && !other);
    }
}

//! The test-binary rule: a crate's integration tests that need a service (the Docker engine,
//! Redis) are modules of its one `tests/it/` binary, not files of their own under `tests/`.
//! Every file directly under `tests/` is a test binary that links the crate and its whole
//! dependency graph (axum, bollard, fred); one binary per service-needing file made linking the
//! bulk of a test build. A service-needing test is recognized by its `#[ignore]`: such tests are
//! ignored where the service is missing and run by the pipeline stage that starts it.
//!
//! Exceptions are listed in [`OWN_BINARY`] with the reason each needs a binary of its own.

use std::path::Path;

use crate::tidy::Violation;

/// Service-needing test files that stay binaries of their own, relative to the workspace root.
pub const OWN_BINARY: &[(&str, &str)] = &[(
    "crates/sandbox-app/tests/failover_docker.rs",
    "needs the store's failpoints: in tests/it/ it would rebuild the whole binary with them",
)];

/// Checks one file directly under a `tests/` directory; `path` is relative to the workspace
/// root and also used in messages.
pub fn check_test_file(path: &str, text: &str) -> Option<Violation> {
    if OWN_BINARY.iter().any(|(p, _)| *p == path) {
        return None;
    }
    let ignored = text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or("").trim();
        code.starts_with("#[ignore")
    });
    ignored.then(|| Violation {
        rule: "service-tests-binary",
        detail: format!(
            "{path} has #[ignore]d tests (they need a service) in a test binary of its own; \
             make it a module of the crate's tests/it/ binary (tests/it/main.rs) so the crate \
             links one such binary"
        ),
    })
}

/// Runs the rule over `<root>/crates/*/tests/*.rs` and `<root>/xtask/tests/*.rs`.
pub fn check_workspace(root: &Path) -> Result<Vec<Violation>, String> {
    let crates_dir = root.join("crates");
    let entries = std::fs::read_dir(&crates_dir)
        .map_err(|e| format!("cannot read {}: {e}", crates_dir.display()))?;
    let mut dirs: Vec<_> = entries.flatten().map(|e| e.path().join("tests")).collect();
    dirs.push(root.join("xtask").join("tests"));
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(files) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = files
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let rel = file.strip_prefix(root).unwrap_or(&file);
            out.extend(check_test_file(&rel.display().to_string(), &text));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const IGNORED: &str = "#[test]\n#[ignore = \"needs the Docker engine\"]\nfn runs() {}\n";

    #[test]
    fn a_service_test_in_a_binary_of_its_own_is_refused() {
        let v = check_test_file("crates/a/tests/engine_docker.rs", IGNORED).expect("violation");
        assert_eq!(v.rule, "service-tests-binary");
        assert!(
            v.detail.contains("crates/a/tests/engine_docker.rs"),
            "{}",
            v.detail
        );
    }

    #[test]
    fn hermetic_files_and_mentions_in_comments_pass() {
        assert!(check_test_file("crates/a/tests/props.rs", "#[test]\nfn t() {}\n").is_none());
        let commented = "// #[ignore] is not used here\n#[test]\nfn t() {}\n";
        assert!(check_test_file("crates/a/tests/props.rs", commented).is_none());
    }

    #[test]
    fn a_listed_exception_passes() {
        let (path, _) = OWN_BINARY[0];
        assert!(check_test_file(path, IGNORED).is_none());
    }

    /// The walk looks only at files directly under `tests/`: the modules of `tests/it/` are
    /// where service-needing tests belong.
    #[test]
    fn the_walk_skips_tests_it() {
        let root = std::env::temp_dir().join(format!("xtask-tidy-tests-{}", std::process::id()));
        let crate_tests = root.join("crates").join("a").join("tests");
        std::fs::create_dir_all(crate_tests.join("it")).expect("mkdir");
        std::fs::create_dir_all(root.join("xtask").join("tests")).expect("mkdir");
        std::fs::write(crate_tests.join("it").join("engine.rs"), IGNORED).expect("write");
        std::fs::write(crate_tests.join("props.rs"), "#[test]\nfn t() {}\n").expect("write");
        let clean = check_workspace(&root);
        std::fs::write(root.join("xtask").join("tests").join("svc.rs"), IGNORED).expect("write");
        let planted = check_workspace(&root);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(clean.expect("walk").len(), 0);
        let planted = planted.expect("walk");
        assert_eq!(planted.len(), 1, "{planted:?}");
        assert!(
            planted[0].detail.starts_with("xtask/tests/svc.rs"),
            "{}",
            planted[0].detail
        );
    }
}

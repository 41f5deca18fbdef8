//! The session workspace layout and the path rules built on it.
//!
//! `/workspace` is the session's writable root; `/workspace/input` holds attachments restored
//! from durable storage and is read-only to model-authored writes (an agent overwriting an
//! attachment would corrupt the user's own file); `/workspace/output` is where artifacts are
//! collected from.

use crate::error::{Error, ErrorCode};
use crate::path::SandboxPath;

/// The session's writable root.
pub const WORKSPACE_ROOT: &str = "/workspace";
/// Attachments (read-only to model-authored writes).
pub const INPUT_DIR: &str = "/workspace/input";
/// Artifacts to collect.
pub const OUTPUT_DIR: &str = "/workspace/output";

/// The roots one session may read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub root: SandboxPath,
    pub input: SandboxPath,
    pub output: SandboxPath,
}

impl WorkspaceLayout {
    /// The layout of a session-owned sandbox (`/workspace`, `/workspace/input`,
    /// `/workspace/output`).
    pub fn standard() -> Self {
        let path = |p: &str| SandboxPath::new(p).unwrap_or_else(|_| SandboxPath::root());
        WorkspaceLayout {
            root: path(WORKSPACE_ROOT),
            input: path(INPUT_DIR),
            output: path(OUTPUT_DIR),
        }
    }

    /// The layout with a configured artifact directory, when it passes
    /// [`validated_output_dir`](Self::validated_output_dir); otherwise the standard one.
    pub fn with_output_override(configured: Option<&str>) -> Self {
        let mut layout = WorkspaceLayout::standard();
        if let Some(dir) = configured.and_then(|d| layout.validated_output_dir(d)) {
            layout.output = dir;
        }
        layout
    }

    /// Normalizes a configured artifact directory and reports whether it may be used: inside
    /// the workspace root, not the root itself (that would deliver drafts as artifacts and reads
    /// as "collect nothing" to callers comparing the two), and not inside the input directory.
    pub fn validated_output_dir(&self, dir: &str) -> Option<SandboxPath> {
        let dir = SandboxPath::new(dir.trim()).ok()?;
        let ok = dir.is_strictly_under(&self.root) && !dir.starts_with(&self.input);
        ok.then_some(dir)
    }

    /// Anchors a relative path at the workspace root; absolute paths are taken as they are.
    pub fn resolve(&self, value: &str) -> Result<SandboxPath, Error> {
        if value.starts_with('/') {
            SandboxPath::new(value)
        } else {
            self.root.join(value)
        }
    }

    /// Checks a model-authored write: anywhere in the sandbox except the input directory and
    /// except a bare top-level directory (writing a file *as* `/etc` or `/workspace`).
    ///
    /// A *policy guard*, not a security boundary: the check is on the path as written, and
    /// code inside the sandbox owns its whole filesystem (it can symlink another directory to
    /// `/workspace/input`, or write there itself). What it keeps is the agent's own file tools
    /// from overwriting the user's attachments by accident; isolation between tenants comes
    /// from the sandbox, never from this rule.
    pub fn check_model_write(&self, path: &SandboxPath) -> Result<(), Error> {
        if path.starts_with(&self.input) {
            return Err(invalid_path(path, "is read-only: attachments live there"));
        }
        if path.components().count() < 2 {
            return Err(invalid_path(
                path,
                "must name a file below a top-level directory",
            ));
        }
        Ok(())
    }

    /// Checks an attachment write: only strictly below the input directory.
    pub fn check_attachment_write(&self, path: &SandboxPath) -> Result<(), Error> {
        if !path.is_strictly_under(&self.input) {
            return Err(invalid_path(
                path,
                &format!("attachments must be written under {}", self.input),
            ));
        }
        Ok(())
    }

    /// Whether `script` is a session-writable file under the workspace that may be executed
    /// (never from the input directory, whose contents came from outside).
    pub fn runnable_workspace_script(&self, script: &SandboxPath) -> bool {
        script.is_strictly_under(&self.root) && !script.starts_with(&self.input)
    }
}

fn invalid_path(path: &SandboxPath, why: &str) -> Error {
    Error::invalid_input(format!("path {path} {why}")).with_code(ErrorCode::InvalidPath)
}

/// How to run a script, chosen by its extension: the interpreter and the arguments before the
/// script path. `None` for extensions we do not run (refuse rather than guess).
pub fn interpreter_for(script: &SandboxPath) -> Option<(&'static str, &'static [&'static str])> {
    let name = script.file_name()?;
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
    match ext.as_str() {
        "py" => Some(("python3", &[])),
        "sh" => Some(("sh", &[])),
        "bash" => Some(("bash", &[])),
        "js" | "mjs" | "cjs" => Some(("node", &[])),
        "ts" => Some(("npx", &["--yes", "tsx"])),
        "rb" => Some(("ruby", &[])),
        "pl" => Some(("perl", &[])),
        _ => None,
    }
}

/// Whether `name` can name a script of `POST /v1/execute`: one path segment, not hidden (no
/// leading `.`), a valid path component, with an extension [`interpreter_for`] knows.
pub fn is_script_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && !name.starts_with('.')
        && SandboxPath::new(&format!("/{name}")).is_ok_and(|p| interpreter_for(&p).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SandboxPath {
        SandboxPath::new(s).unwrap()
    }

    #[test]
    fn output_dir_validation() {
        let l = WorkspaceLayout::standard();
        assert_eq!(
            l.validated_output_dir("/workspace/out/").unwrap().as_str(),
            "/workspace/out"
        );
        assert_eq!(
            l.validated_output_dir("/workspace/output")
                .unwrap()
                .as_str(),
            "/workspace/output"
        );
        for bad in [
            "/workspace",
            "/workspace/",
            "/tmp/out",
            "workspace/out",
            "/workspace/../etc",
            "/workspace/input",
            "/workspace/input/x",
            "",
        ] {
            assert!(l.validated_output_dir(bad).is_none(), "{bad:?}");
        }
        assert_eq!(
            WorkspaceLayout::with_output_override(Some("/etc"))
                .output
                .as_str(),
            OUTPUT_DIR
        );
        assert_eq!(
            WorkspaceLayout::with_output_override(Some("/workspace/art"))
                .output
                .as_str(),
            "/workspace/art"
        );
    }

    #[test]
    fn write_rules() {
        let l = WorkspaceLayout::standard();
        assert!(l.check_model_write(&p("/workspace/a.txt")).is_ok());
        assert!(l.check_model_write(&p("/tmp/x/y")).is_ok());
        assert!(l.check_model_write(&p("/workspace/inputs/x")).is_ok());
        for bad in [
            "/workspace/input/a",
            "/workspace/input",
            "/workspace",
            "/",
            "/etc",
        ] {
            let err = l.check_model_write(&p(bad)).unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::InvalidPath), "{bad}");
        }
        assert!(
            l.check_attachment_write(&p("/workspace/input/a.pdf"))
                .is_ok()
        );
        for bad in ["/workspace/input", "/workspace/a", "/workspace/inputs/a"] {
            assert!(l.check_attachment_write(&p(bad)).is_err(), "{bad}");
        }
        assert_eq!(l.resolve("a/b").unwrap().as_str(), "/workspace/a/b");
        assert!(l.resolve("../etc").is_err());
        assert!(l.runnable_workspace_script(&p("/workspace/run.py")));
        assert!(!l.runnable_workspace_script(&p("/workspace/input/run.py")));
        assert!(!l.runnable_workspace_script(&p("/tmp/run.py")));
    }

    #[test]
    fn interpreters() {
        assert_eq!(interpreter_for(&p("/workspace/a.py")).unwrap().0, "python3");
        assert_eq!(interpreter_for(&p("/workspace/a.SH")).unwrap().0, "sh");
        assert_eq!(interpreter_for(&p("/workspace/a.js")).unwrap().0, "node");
        assert!(interpreter_for(&p("/workspace/a")).is_none());
        assert!(interpreter_for(&p("/workspace/a.exe")).is_none());
    }
}

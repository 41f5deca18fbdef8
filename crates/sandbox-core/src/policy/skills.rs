//! Where installed skills live inside a sandbox image, and which names may address them.

use crate::error::{Error, Operation};
use crate::path::SandboxPath;

/// The root of installed skills inside the sandbox image. Outside `/workspace` on purpose:
/// the workspace is per-session scratch and is wiped before every snapshot.
pub const SKILLS_ROOT: &str = "/opt/sandbox/skills";

/// Whether `name` is one directory segment under the skills root: not empty, not `.`/`..`, no
/// separator or control character, at most 128 bytes. Anything else could walk out of the root.
pub fn is_valid_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control)
        && name.trim() == name
}

/// The image directory of skill `name` under `root`.
pub fn skill_dir_under(root: &SandboxPath, name: &str) -> Result<SandboxPath, Error> {
    if !is_valid_skill_name(name) {
        return Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "invalid skill name {:?}",
                name.chars().take(64).collect::<String>()
            ),
        ));
    }
    root.join(name)
}

/// The image directory of skill `name` under [`SKILLS_ROOT`].
pub fn skill_dir(name: &str) -> Result<SandboxPath, Error> {
    skill_dir_under(&skills_root(), name)
}

/// [`SKILLS_ROOT`] as a path.
pub fn skills_root() -> SandboxPath {
    // SKILLS_ROOT is a literal absolute path; this cannot fail, but stay panic-free anyway.
    SandboxPath::new(SKILLS_ROOT).unwrap_or_else(|_| SandboxPath::root())
}

/// Whether `dir` is exactly one skill directory directly under `root` (not the root itself, not
/// a file inside a skill), returning the normalized path.
pub fn validated_skill_dir_under(root: &SandboxPath, dir: &str) -> Option<SandboxPath> {
    let dir = SandboxPath::new(dir).ok()?;
    let parent = dir.parent()?;
    (parent == *root && dir.file_name().is_some_and(is_valid_skill_name)).then_some(dir)
}

/// For a script inside an installed skill, the skill's directory (so nested scripts still use
/// the environment installed beside the skill); `None` for paths outside the skills root.
pub fn skill_dir_for_image_script(script: &SandboxPath) -> Option<SandboxPath> {
    let root = skills_root();
    if !script.is_strictly_under(&root) {
        return None;
    }
    let name = script.components().nth(root.components().count())?;
    let dir = root.join(name).ok()?;
    script.is_strictly_under(&dir).then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_names() {
        for ok in ["pdf", "data-tools", "报告", "a.b"] {
            assert!(is_valid_skill_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a\\b", " a", "a\n", &"x".repeat(129)] {
            assert!(!is_valid_skill_name(bad), "{bad:?}");
        }
        assert_eq!(
            skill_dir("pdf").unwrap().as_str(),
            "/opt/sandbox/skills/pdf"
        );
        assert!(skill_dir("../etc").is_err());
    }

    #[test]
    fn skill_dirs() {
        let root = skills_root();
        assert_eq!(
            validated_skill_dir_under(&root, "/opt/sandbox/skills/pdf/")
                .unwrap()
                .as_str(),
            "/opt/sandbox/skills/pdf"
        );
        assert!(validated_skill_dir_under(&root, "/opt/sandbox/skills").is_none());
        assert!(validated_skill_dir_under(&root, "/opt/sandbox/skills/pdf/x").is_none());
        assert!(validated_skill_dir_under(&root, "/opt/sandbox/skills/../x").is_none());
        let script = SandboxPath::new("/opt/sandbox/skills/pdf/scripts/run.py").unwrap();
        assert_eq!(
            skill_dir_for_image_script(&script).unwrap().as_str(),
            "/opt/sandbox/skills/pdf"
        );
        assert!(
            skill_dir_for_image_script(&SandboxPath::new("/opt/sandbox/skills/pdf").unwrap())
                .is_none()
        );
        assert!(
            skill_dir_for_image_script(&SandboxPath::new("/workspace/run.py").unwrap()).is_none()
        );
    }
}

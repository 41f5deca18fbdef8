//! Paths inside a sandbox.
//!
//! Every file operation takes a [`SandboxPath`], so adapters never see a relative or traversing
//! path: resolution inside the sandbox would otherwise depend on each backend's working
//! directory, and `..` would let a lexical prefix check (e.g. "under /workspace/input") be
//! walked out of.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, ErrorCode};

/// Longest path accepted, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;

/// An absolute, lexically normalized path inside a sandbox: starts with `/`, no `..`
/// components, no NUL or other control characters; repeated slashes, `.` components and a
/// trailing slash are normalized away.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxPath(String);

fn invalid_path(raw: &str, why: &str) -> Error {
    let shown: String = raw.chars().take(120).collect();
    Error::invalid_input(format!("invalid path {shown:?}: {why}")).with_code(ErrorCode::InvalidPath)
}

impl SandboxPath {
    /// The filesystem root.
    pub fn root() -> Self {
        SandboxPath("/".to_owned())
    }

    /// Validates and normalizes `raw`.
    pub fn new(raw: &str) -> Result<Self, Error> {
        if raw.is_empty() {
            return Err(invalid_path(raw, "must not be empty"));
        }
        if raw.len() > MAX_PATH_LEN {
            return Err(invalid_path(
                raw,
                &format!("longer than {MAX_PATH_LEN} bytes"),
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(invalid_path(raw, "contains a control character"));
        }
        if !raw.starts_with('/') {
            return Err(invalid_path(raw, "must be absolute (start with '/')"));
        }
        let mut normalized = String::with_capacity(raw.len());
        for component in raw.split('/') {
            match component {
                "" | "." => {}
                ".." => return Err(invalid_path(raw, "must not contain '..' components")),
                name => {
                    normalized.push('/');
                    normalized.push_str(name);
                }
            }
        }
        if normalized.is_empty() {
            normalized.push('/');
        }
        Ok(SandboxPath(normalized))
    }

    /// The normalized path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is `/`.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The components after the root.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// The last component, `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.is_root() {
            None
        } else {
            self.0.rsplit('/').next()
        }
    }

    /// The parent directory, `None` for the root.
    pub fn parent(&self) -> Option<SandboxPath> {
        if self.is_root() {
            return None;
        }
        match self.0.rfind('/') {
            Some(0) => Some(SandboxPath::root()),
            Some(pos) => Some(SandboxPath(self.0[..pos].to_owned())),
            None => None,
        }
    }

    /// Appends one or more relative components (validated like [`SandboxPath::new`]).
    pub fn join(&self, relative: &str) -> Result<SandboxPath, Error> {
        if relative.starts_with('/') {
            return Err(invalid_path(relative, "must be relative when joined"));
        }
        SandboxPath::new(&format!("{}/{}", self.0, relative))
    }

    /// Whether `self` is `base` or lies below it, component-wise (`/workspace/inputs` is not
    /// under `/workspace/input`).
    pub fn starts_with(&self, base: &SandboxPath) -> bool {
        if base.is_root() {
            return true;
        }
        self.0 == base.0
            || (self.0.starts_with(&base.0) && self.0.as_bytes().get(base.0.len()) == Some(&b'/'))
    }

    /// Whether `self` lies strictly below `base`.
    pub fn is_strictly_under(&self, base: &SandboxPath) -> bool {
        self.starts_with(base) && self != base
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SandboxPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SandboxPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SandboxPath::new(s)
    }
}

impl Serialize for SandboxPath {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SandboxPath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        SandboxPath::new(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use proptest::prelude::*;

    fn check(raw: &str, expected: Result<&str, &str>) {
        match (SandboxPath::new(raw), expected) {
            (Ok(p), Ok(want)) => assert_eq!(p.as_str(), want, "{raw:?}"),
            (Err(e), Err(needle)) => {
                assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{raw:?}");
                assert_eq!(e.code(), Some(ErrorCode::InvalidPath));
                assert!(e.to_string().contains(needle), "{raw:?}: {e}");
            }
            (got, want) => panic!("{raw:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn path_table() {
        check("/", Ok("/"));
        check("/workspace", Ok("/workspace"));
        check("/workspace/", Ok("/workspace"));
        check("//workspace//a/./b/", Ok("/workspace/a/b"));
        check("/a/.../b", Ok("/a/.../b"));
        check("/a/..b/c", Ok("/a/..b/c"));
        check("/文件/报告.csv", Ok("/文件/报告.csv"));
        check("", Err("empty"));
        check("workspace/a", Err("absolute"));
        check("./a", Err("absolute"));
        check("../etc/passwd", Err("absolute"));
        check("/workspace/../etc/passwd", Err("'..'"));
        check("/..", Err("'..'"));
        check("/a/b/..", Err("'..'"));
        check("/a\0b", Err("control"));
        check("/a\nb", Err("control"));
        check(&format!("/{}", "a".repeat(MAX_PATH_LEN)), Err("longer"));
    }

    #[test]
    fn parent_join_and_prefix() {
        let p = SandboxPath::new("/workspace/input/a.txt").unwrap();
        assert_eq!(p.file_name(), Some("a.txt"));
        assert_eq!(p.parent().unwrap().as_str(), "/workspace/input");
        assert_eq!(
            SandboxPath::new("/a").unwrap().parent().unwrap(),
            SandboxPath::root()
        );
        assert_eq!(SandboxPath::root().parent(), None);
        let input = SandboxPath::new("/workspace/input").unwrap();
        assert!(p.starts_with(&input));
        assert!(p.is_strictly_under(&input));
        assert!(!input.is_strictly_under(&input));
        assert!(
            !SandboxPath::new("/workspace/inputs/x")
                .unwrap()
                .starts_with(&input)
        );
        assert!(input.join("../x").is_err());
        assert!(input.join("/x").is_err());
        assert_eq!(input.join("a/b").unwrap().as_str(), "/workspace/input/a/b");
    }

    proptest! {
        #[test]
        fn normalized_paths_are_fixed_points(raw in "(/[a-z.]{0,4}){0,6}/?") {
            if let Ok(p) = SandboxPath::new(&raw) {
                let again = SandboxPath::new(p.as_str()).unwrap();
                prop_assert_eq!(&again, &p);
                prop_assert!(!p.components().any(|c| c == ".." || c == "." || c.is_empty()));
                prop_assert!(p.as_str().starts_with('/'));
            } else {
                prop_assert!(raw.is_empty() || raw.split('/').any(|c| c == ".."));
            }
        }

        #[test]
        fn relative_paths_are_always_refused(raw in "[^/][^\\x00]{0,40}") {
            prop_assert!(SandboxPath::new(&raw).is_err());
        }
    }
}

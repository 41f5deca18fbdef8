//! Where a requested path points, and who owns what the agent creates.
//!
//! envd resolves every path the same way, for the RPCs and for `/files` alike: an empty path is
//! the default working directory (the user's home when none is configured), `~` and `~/…` are
//! the user's home, a relative path is taken from the home, and an absolute path is used as it
//! is. `~other` is refused rather than guessed at.

use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Component, Path, PathBuf};

use crate::users::User;

/// Why a path could not be resolved (the caller's error: `invalid_argument`, or 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError(pub String);

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PathError {}

/// The absolute path `path` names for `user` (see the module docs).
pub fn resolve(
    path: &str,
    user: &User,
    default_workdir: Option<&Path>,
) -> Result<PathBuf, PathError> {
    if path.contains('\0') {
        return Err(PathError(format!("path '{path}' contains a NUL byte")));
    }
    let requested: PathBuf = if path.is_empty() {
        default_workdir.map(Path::to_path_buf).unwrap_or_default()
    } else {
        PathBuf::from(path)
    };
    let bytes = requested.as_os_str().as_bytes();
    if let Some(rest) = bytes.strip_prefix(b"~") {
        if !rest.is_empty() && rest[0] != b'/' {
            return Err(PathError(format!(
                "failed to expand path '{path}' for user '{}': cannot expand user-specific home dir",
                user.name
            )));
        }
        let rest = Path::new(std::ffi::OsStr::from_bytes(rest));
        let rest = rest.strip_prefix("/").unwrap_or(rest);
        return Ok(clean(&user.home.join(rest)));
    }
    if requested.is_absolute() {
        return Ok(requested);
    }
    Ok(clean(&user.home.join(requested)))
}

/// `path` with `.` and repeated separators dropped and `..` applied lexically (never above the
/// root), as a join of a home and a relative path is normalized.
pub(crate) fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if out.as_os_str() != "/" && !out.pop() {
                    out.push("..");
                }
            }
            Component::Normal(name) => out.push(name),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// The last component of `path` as a name, the way Go's `filepath.Base` spells it (`/` for the
/// root, `..` for a path ending in `..`).
pub(crate) fn base_name(path: &Path) -> String {
    if let Some(name) = path.file_name() {
        return name.to_string_lossy().into_owned();
    }
    match path.components().next_back() {
        Some(Component::ParentDir) => "..".to_owned(),
        Some(Component::RootDir) | None if path.has_root() => "/".to_owned(),
        _ => ".".to_owned(),
    }
}

/// Who owns the files and directories the agent creates for a caller.
///
/// Created entries belong to the selected user, as envd makes them. Changing an owner needs
/// root; an agent running unprivileged (tests, a rootless sandbox) can only create entries as
/// itself, so it leaves ownership alone instead of failing every write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    /// Whether ownership is changed at all (the agent runs as root).
    pub chown: bool,
}

impl Owner {
    /// The owner for `user`, changing ownership only when the agent runs as root.
    pub fn of(user: &User) -> Self {
        Owner {
            uid: user.uid,
            gid: user.gid,
            chown: rustix::process::geteuid().is_root(),
        }
    }

    /// Gives the entry at `path` (not following a final symlink) to this owner.
    pub(crate) fn apply_to_path(&self, path: &Path) -> io::Result<()> {
        if self.chown {
            std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))?;
        }
        Ok(())
    }

    /// Gives an open file to this owner.
    pub(crate) fn apply_to_file(&self, file: &std::fs::File) -> io::Result<()> {
        if self.chown {
            std::os::unix::fs::fchown(file, Some(self.uid), Some(self.gid))?;
        }
        Ok(())
    }
}

/// Creates `dir` and every missing ancestor (mode 0755, given to `owner`); existing
/// directories are left as they are. An ancestor that exists and is not a directory is an
/// error of kind `NotADirectory`.
pub(crate) fn ensure_dirs(dir: &Path, owner: Owner) -> io::Result<()> {
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    for current in ancestors {
        if current.as_os_str().is_empty() {
            continue;
        }
        match std::fs::metadata(current) {
            Ok(meta) if meta.is_dir() => continue,
            Ok(_) => return Err(not_a_directory(current)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match std::fs::DirBuilder::new().mode(0o755).create(current) {
            Ok(()) => owner.apply_to_path(current)?,
            // Someone else made it in between: fine if it is a directory.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !std::fs::metadata(current)?.is_dir() {
                    return Err(not_a_directory(current));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn not_a_directory(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotADirectory,
        format!("path is a file: {}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: PathBuf::from("/home/user"),
            shell: PathBuf::from("/bin/sh"),
        }
    }

    #[test]
    fn paths_resolve_as_envd_resolves_them() {
        let u = user();
        let check = |path: &str, workdir: Option<&str>, expected: &str| {
            let got = resolve(path, &u, workdir.map(Path::new)).unwrap();
            assert_eq!(
                got,
                PathBuf::from(expected),
                "{path:?} with workdir {workdir:?}"
            );
        };
        check("", None, "/home/user");
        check("", Some("/work"), "/work");
        check("~", None, "/home/user");
        check("~/", None, "/home/user");
        check("~/a/../b", None, "/home/user/b");
        check("a.txt", Some("/work"), "/home/user/a.txt");
        check("./a//b/", None, "/home/user/a/b");
        check("../../../x", None, "/x");
        check("/abs/path", None, "/abs/path");
        // Absolute paths are used as given: the kernel, not a lexical rule, resolves `..`.
        check("/abs/../p", None, "/abs/../p");
        let err = resolve("~root/x", &u, None).unwrap_err();
        assert!(
            err.0.contains("cannot expand user-specific home dir"),
            "{err}"
        );
        assert!(resolve("a\0b", &u, None).is_err());
    }

    #[test]
    fn base_names_follow_go() {
        assert_eq!(base_name(Path::new("/a/b.txt")), "b.txt");
        assert_eq!(base_name(Path::new("/a/b/")), "b");
        assert_eq!(base_name(Path::new("/")), "/");
        assert_eq!(base_name(Path::new("/a/..")), "..");
    }

    #[test]
    fn ensure_dirs_creates_parents_and_refuses_a_file_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let owner = Owner {
            uid: 0,
            gid: 0,
            chown: false,
        };
        let deep = dir.path().join("a/b/c");
        ensure_dirs(&deep, owner).unwrap();
        assert!(deep.is_dir());
        // Existing directories are fine.
        ensure_dirs(&deep, owner).unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let err = ensure_dirs(&dir.path().join("f/g"), owner).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
        assert!(err.to_string().contains("path is a file"), "{err}");
    }
}

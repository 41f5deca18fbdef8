//! The unary filesystem calls, as blocking functions over resolved paths (the async methods of
//! [`super::Filesystem`] run them on the blocking pool).
//!
//! The agent runs as root and, like envd, checks no per-user permissions here: the caller is
//! the sandbox's owner, and the selected user decides only where relative paths start and who
//! owns what is created.

use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

use sandbox_envd::filesystem::EntryInfo;
use sandbox_envd::{Code, ConnectError};

use super::entry::{Names, entry_info};
use super::path::{Owner, ensure_dirs};
use super::reserved::Reserved;

pub(crate) fn internal(what: &str, e: &io::Error) -> ConnectError {
    ConnectError::new(Code::Internal, format!("{what}: {e}"))
}

/// An entry, or `not_found` for a missing path (also when a parent is a file: nothing can be
/// there).
pub(crate) fn stat(path: &Path, names: &mut Names) -> Result<EntryInfo, ConnectError> {
    entry_info(path, names).map_err(|e| {
        if matches!(
            e.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
        ) {
            ConnectError::new(
                Code::NotFound,
                format!("file not found: {}", path.display()),
            )
        } else {
            internal("error getting file info", &e)
        }
    })
}

/// Creates `path` and its parents; an existing directory is `already_exists`, anything else
/// in the way `invalid_argument`.
pub(crate) fn make_dir(
    path: &Path,
    owner: Owner,
    names: &mut Names,
) -> Result<EntryInfo, ConnectError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory already exists: {}", path.display()),
            ));
        }
        Ok(_) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!(
                    "path already exists but it is not a directory: {}",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("a parent of {} is not a directory", path.display()),
            ));
        }
        Err(e) => return Err(internal("error getting file info", &e)),
    }
    ensure_dirs(path, owner).map_err(|e| dir_error(&e))?;
    stat(path, names)
}

/// A parent that is a file is the caller's mistake; anything else is ours.
fn dir_error(e: &io::Error) -> ConnectError {
    if e.kind() == io::ErrorKind::NotADirectory {
        ConnectError::new(Code::InvalidArgument, e.to_string())
    } else {
        internal("error creating directories", e)
    }
}

/// Renames `source` to `destination`, creating the destination's parent.
pub(crate) fn move_path(
    source: &Path,
    destination: &Path,
    owner: Owner,
    names: &mut Names,
) -> Result<EntryInfo, ConnectError> {
    if let Some(parent) = destination.parent() {
        ensure_dirs(parent, owner).map_err(|e| dir_error(&e))?;
    }
    std::fs::rename(source, destination).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ConnectError::new(
                Code::NotFound,
                format!("source file not found: {}: {e}", source.display()),
            )
        } else {
            internal("error renaming", &e)
        }
    })?;
    stat(destination, names)
}

/// Removes `path`, a directory with everything in it; a missing path is not an error. A
/// symlink is removed itself, never what it points at.
pub(crate) fn remove(path: &Path) -> Result<(), ConnectError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(internal("error removing file or directory", &e)),
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal("error removing file or directory", &e)),
    }
}

/// [`remove`], with the parent pinned: it is opened `O_PATH`, judged by its real path
/// ([`Reserved::check_fd`]), and the entry removed through that descriptor
/// (`/proc/self/fd/N/<name>`), so a parent swapped for a symlink after the caller's check
/// cannot redirect the removal into a reserved tree. A missing parent means a missing path.
pub(crate) fn remove_pinned(path: &Path, reserved: &Reserved) -> Result<(), ConnectError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return remove(path);
    };
    if reserved.is_empty() {
        return remove(path);
    }
    let pinned = match rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(()),
        Err(e) => return Err(internal("error removing file or directory", &e.into())),
    };
    reserved.check_fd(&pinned, parent).map_err(super::refusal)?;
    let through = PathBuf::from(format!("/proc/self/fd/{}", pinned.as_raw_fd())).join(name);
    remove(&through)
}

/// The bounds of one listing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListBounds {
    pub(crate) max_entries: usize,
    pub(crate) max_bytes: usize,
}

/// The descendants of `requested` up to `depth` levels (0 means 1), the root excluded. A
/// symlink at the root is followed; below it nothing is. Entries are in the order of a
/// depth-first walk with each directory's names sorted bytewise, and their paths are built
/// from `requested`, not from where a root symlink points.
pub(crate) fn list_dir(
    requested: &Path,
    depth: u32,
    bounds: ListBounds,
    reserved: &Reserved,
    names: &mut Names,
) -> Result<Vec<EntryInfo>, ConnectError> {
    let depth = depth.max(1);
    let root = std::fs::canonicalize(requested).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ConnectError::new(
            Code::NotFound,
            format!("path not found: {}", requested.display()),
        ),
        _ if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => ConnectError::new(
            Code::FailedPrecondition,
            format!(
                "cyclic symlink or chain too long at {}",
                requested.display()
            ),
        ),
        _ => internal("error resolving symlink", &e),
    })?;
    // The root as it resolves now, judged again: it is what is walked.
    if let Some(refused) = reserved.tree_of(&root) {
        return Err(ConnectError::new(
            Code::PermissionDenied,
            format!(
                "{} resolves to {}, in the reserved tree {}, which file operations cannot use",
                requested.display(),
                root.display(),
                refused.display()
            ),
        ));
    }
    match std::fs::metadata(&root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path is not a directory: {}", requested.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ConnectError::new(
                Code::NotFound,
                format!("directory not found: {}", requested.display()),
            ));
        }
        Err(e) => return Err(internal("error getting file info", &e)),
    }

    let mut out = Vec::new();
    let mut bytes = 0usize;
    // Each frame: a directory on disk, its path relative to the root, its level, and its
    // remaining names (reversed, so `pop` yields them in order).
    let mut stack: Vec<(PathBuf, PathBuf, u32, Vec<Vec<u8>>)> = Vec::new();
    let first = sorted_names(&root, bounds.max_entries)?;
    stack.push((root.clone(), PathBuf::new(), 1, first));
    while let Some((dir, rel, level, remaining)) = stack.last_mut() {
        let Some(name) = remaining.pop() else {
            stack.pop();
            continue;
        };
        let name = std::ffi::OsStr::from_bytes(&name);
        let on_disk = dir.join(name);
        let rel_path = rel.join(name);
        let level = *level;
        let mut entry = match entry_info(&on_disk, names) {
            Ok(entry) => entry,
            // Removed while we walked: not an error, just not there any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(internal("error reading directory", &e)),
        };
        entry.path = requested.join(&rel_path).to_string_lossy().into_owned();
        bytes += entry_size(&entry);
        if out.len() >= bounds.max_entries || bytes > bounds.max_bytes {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "the listing of {} has more than {} entries or {} bytes; list with a smaller depth",
                    requested.display(),
                    bounds.max_entries,
                    bounds.max_bytes
                ),
            ));
        }
        out.push(entry);
        let is_real_dir = std::fs::symlink_metadata(&on_disk).is_ok_and(|m| m.is_dir());
        // A reserved tree is listed where it is, never walked (listing `/` shows `/proc`, not
        // every process).
        if level < depth && is_real_dir && reserved.tree_of(&on_disk).is_none() {
            match sorted_names(&on_disk, bounds.max_entries) {
                Ok(children) => stack.push((on_disk, rel_path, level + 1, children)),
                Err(e) if e.code == Code::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

/// What an entry adds to the answer's JSON, near enough: its text fields plus the fixed ones.
fn entry_size(entry: &EntryInfo) -> usize {
    const FIXED: usize = 256;
    FIXED
        + entry.name.len()
        + entry.path.len()
        + entry.owner.len()
        + entry.group.len()
        + entry.symlink_target.as_ref().map_or(0, String::len)
        + entry
            .metadata
            .iter()
            .map(|(k, v)| k.len() + v.len() + 6)
            .sum::<usize>()
}

/// The names in `dir`, sorted descending (popped in ascending order), at most `max` of them
/// (one more proves the listing would be too long anyway).
fn sorted_names(dir: &Path, max: usize) -> Result<Vec<Vec<u8>>, ConnectError> {
    let read = std::fs::read_dir(dir).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ConnectError::new(
                Code::NotFound,
                format!("directory not found: {}", dir.display()),
            )
        } else {
            internal(&format!("error reading directory {}", dir.display()), &e)
        }
    })?;
    let mut names = Vec::new();
    for item in read {
        let item = item.map_err(|e| internal("error reading directory", &e))?;
        names.push(item.file_name().as_bytes().to_vec());
        if names.len() > max {
            break;
        }
    }
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_goes_through_its_parent_judged_where_it_is() {
        // No path check first: the descriptor check alone refuses a parent that is a symlink
        // into a reserved tree (as one swapped in after the path check would be).
        let dir = tempfile::tempdir().unwrap();
        let res = dir.path().join("res");
        std::fs::create_dir(&res).unwrap();
        std::fs::write(res.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(&res, dir.path().join("link")).unwrap();
        let reserved = Reserved::new([res.clone()]);
        let e = remove_pinned(&dir.path().join("link/secret"), &reserved).unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied, "{e:?}");
        assert!(res.join("secret").exists());
        // Elsewhere it removes, files and trees, and a missing parent is a missing path.
        std::fs::create_dir_all(dir.path().join("ok/tree/deep")).unwrap();
        std::fs::write(dir.path().join("ok/f"), b"f").unwrap();
        remove_pinned(&dir.path().join("ok/f"), &reserved).unwrap();
        remove_pinned(&dir.path().join("ok/tree"), &reserved).unwrap();
        assert!(!dir.path().join("ok/f").exists());
        assert!(!dir.path().join("ok/tree").exists());
        remove_pinned(&dir.path().join("missing/x"), &reserved).unwrap();
    }
}

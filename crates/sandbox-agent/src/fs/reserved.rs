//! Reserved trees: paths no file operation may touch (`--reserved-path`, repeatable).
//!
//! The service that starts the agent names them: kernel interfaces (`/proc`, `/sys`, `/dev`),
//! the activity marker the idle sweeper trusts, the agent's own directory. The service cannot
//! see from outside where a path resolves inside the sandbox, so the agent judges it here, on
//! the real path, never on the path as given: a symlink `/tmp/x -> /proc/1/environ` is refused
//! like `/proc/1/environ` itself.
//!
//! Two checks, both on real paths:
//!
//! - [`Reserved::check_path`], before an operation: the entry's own location (its parent's real
//!   path and its name) and where it finally resolves (every symlink followed; for a path that
//!   does not exist yet, the real path of its deepest existing ancestor and the rest), so a
//!   creation through a symlinked parent or a dangling link is judged where it would land.
//! - [`Reserved::check_fd`], on a descriptor the operation opened, read back through
//!   `/proc/self/fd/N` before anything is read from it or written to it: a symlink swapped in
//!   between the first check and the open cannot redirect the operation.
//!
//! What is left between the two checks: a creation (an upload's new file, a directory) is judged
//! by where it would land, and a symlink swapped in after that check could make it land in a
//! reserved tree; the descriptor check then refuses the upload before a byte is written, but
//! the empty file or the directory stays. Nothing that exists there is read, truncated or
//! removed.
//!
//! What the path checks cannot see: a hard link made to a reserved file on the same filesystem
//! has a real path of its own. So a write also goes through [`Reserved::check_links`], on the
//! opened file before anything about it changes: a regular file with more than one link is
//! refused when a file of a reserved tree on its filesystem is the same inode (the trees are
//! small, so they are walked at check time, at most [`MAX_LINK_SCAN`] entries, and one too big
//! to walk refuses the write rather than guess).
//!
//! Code in the sandbox that can plant links already runs as root next to the agent, so these
//! checks keep honest callers (and a model's mistaken path) out of the reserved trees; they are
//! no wall against hostile code in the sandbox.

use std::os::fd::{AsFd, AsRawFd as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Symlinks followed at most while judging one path (the kernel's own bound).
const MAX_LINKS: usize = 40;

/// Entries of the reserved trees one [`Reserved::check_links`] looks at, at most.
pub const MAX_LINK_SCAN: usize = 4096;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is, or resolves into, a reserved tree (`/files`: 403; Connect: `permission_denied`).
    Reserved(String),
    /// Where it resolves could not be read back, so it is refused rather than guessed at
    /// (`/files`: 500; Connect: `internal`).
    Unknown(String),
}

impl Refusal {
    /// The message to answer with.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Reserved(m) | Refusal::Unknown(m) => m,
        }
    }
}

/// The reserved trees the agent was started with; empty by default (nothing is reserved).
/// Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    trees: Arc<[PathBuf]>,
}

impl Reserved {
    /// The trees `paths` name (each absolute; its real path is what is compared, so a reserved
    /// path that is itself reached through a symlink still holds).
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut trees: Vec<PathBuf> = Vec::new();
        for path in paths {
            let lexical = super::path::clean(&path);
            let real = resolve(&lexical);
            for p in [lexical, real] {
                if !trees.contains(&p) {
                    trees.push(p);
                }
            }
        }
        Reserved {
            trees: trees.into(),
        }
    }

    /// The trees, as given and as resolved.
    pub fn trees(&self) -> &[PathBuf] {
        &self.trees
    }

    /// Whether nothing is reserved.
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }

    /// The reserved tree `real` lies in (the tree itself or anything under it), if any.
    pub(crate) fn tree_of(&self, real: &Path) -> Option<&Path> {
        self.trees
            .iter()
            .find(|tree| real.starts_with(tree))
            .map(PathBuf::as_path)
    }

    fn judge(&self, shown: &Path, real: &Path) -> Result<(), Refusal> {
        match self.tree_of(real) {
            Some(tree) if real == shown => Err(Refusal::Reserved(format!(
                "{} is in the reserved tree {}, which file operations cannot use",
                shown.display(),
                tree.display()
            ))),
            Some(tree) => Err(Refusal::Reserved(format!(
                "{} resolves to {}, in the reserved tree {}, which file operations cannot use",
                shown.display(),
                real.display(),
                tree.display()
            ))),
            None => Ok(()),
        }
    }

    /// Refuses `path` when it, its own location or where it resolves lies in a reserved tree
    /// (see the module docs). Blocking: it reads the filesystem.
    pub fn check_path(&self, path: &Path) -> Result<(), Refusal> {
        if self.is_empty() {
            return Ok(());
        }
        let lexical = super::path::clean(path);
        self.judge(path, &lexical)?;
        // The entry itself: where its parent really is, and its name.
        if let (Some(parent), Some(name)) = (lexical.parent(), lexical.file_name()) {
            self.judge(path, &resolve(parent).join(name))?;
        }
        // Where it finally leads.
        self.judge(path, &resolve(&lexical))
    }

    /// Refuses an opened descriptor whose real path lies in a reserved tree; `path` is how the
    /// caller named it. A descriptor whose path cannot be read back is refused too.
    pub fn check_fd(&self, fd: impl AsFd, path: &Path) -> Result<(), Refusal> {
        if self.is_empty() {
            return Ok(());
        }
        let link = format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd());
        let real = std::fs::read_link(&link).map_err(|e| {
            Refusal::Unknown(format!(
                "cannot tell where {} resolves (reading {link}: {e}), so it is refused",
                path.display()
            ))
        })?;
        if !real.is_absolute() {
            // Not a path on a filesystem (a pipe, a socket): nothing a path names.
            return Err(Refusal::Unknown(format!(
                "{} opened {}, which is not a file",
                path.display(),
                real.display()
            )));
        }
        self.judge(path, &real)
    }

    /// Refuses a write to `opened` (the metadata of the descriptor the write opened; `path` is
    /// how the caller named it) when it is a regular file with more than one link and a file
    /// of a reserved tree is the same inode: a hard link into a reserved tree. Only the trees
    /// on the file's filesystem are walked (a hard link cannot cross one), never into another
    /// mount, at most [`MAX_LINK_SCAN`] entries; a tree too big to walk, or a directory in one
    /// that cannot be read, refuses the write. Blocking: it reads the filesystem.
    pub fn check_links(&self, opened: &std::fs::Metadata, path: &Path) -> Result<(), Refusal> {
        self.check_links_within(opened, path, MAX_LINK_SCAN)
    }

    fn check_links_within(
        &self,
        opened: &std::fs::Metadata,
        path: &Path,
        max_entries: usize,
    ) -> Result<(), Refusal> {
        use std::os::unix::fs::MetadataExt as _;
        if self.is_empty() || !opened.is_file() || opened.nlink() < 2 {
            return Ok(());
        }
        let (dev, ino) = (opened.dev(), opened.ino());
        let mut seen = 0usize;
        for tree in self.trees.iter() {
            let Ok(root) = std::fs::symlink_metadata(tree) else {
                continue;
            };
            if root.dev() != dev {
                continue;
            }
            let mut pending = vec![(tree.clone(), root)];
            while let Some((entry, meta)) = pending.pop() {
                if meta.is_file() && meta.dev() == dev && meta.ino() == ino {
                    return Err(Refusal::Reserved(format!(
                        "{} is a hard link to {}, in the reserved tree {}, which file operations cannot use",
                        path.display(),
                        entry.display(),
                        tree.display()
                    )));
                }
                if !meta.is_dir() || meta.dev() != dev {
                    continue;
                }
                let unreadable = |e: std::io::Error| {
                    Refusal::Unknown(format!(
                        "cannot tell whether {} is a hard link into the reserved tree {} \
                         (reading {}: {e}), so it is refused",
                        path.display(),
                        tree.display(),
                        entry.display()
                    ))
                };
                for child in std::fs::read_dir(&entry).map_err(unreadable)? {
                    let child = child.map_err(unreadable)?;
                    seen += 1;
                    if seen > max_entries {
                        return Err(Refusal::Unknown(format!(
                            "{} has other links, and the reserved trees on its filesystem hold \
                             more than {max_entries} entries to look through, so it is refused",
                            path.display()
                        )));
                    }
                    // The entry's own metadata: a symlink is not followed.
                    let meta = child.metadata().map_err(unreadable)?;
                    pending.push((child.path(), meta));
                }
            }
        }
        Ok(())
    }
}

/// Where `path` leads: its real path when it exists; else, a dangling final symlink followed
/// to its target; else the real path of the deepest existing ancestor joined with the rest.
fn resolve(path: &Path) -> PathBuf {
    let mut current = super::path::clean(path);
    for _ in 0..MAX_LINKS {
        if let Ok(real) = std::fs::canonicalize(&current) {
            return real;
        }
        let is_link = std::fs::symlink_metadata(&current).is_ok_and(|m| m.file_type().is_symlink());
        if is_link && let Ok(target) = std::fs::read_link(&current) {
            let base = current.parent().map(Path::to_path_buf).unwrap_or_default();
            current = super::path::clean(&base.join(target));
            continue;
        }
        break;
    }
    // The deepest ancestor that exists, really, and what is left below it.
    let mut rest: Vec<Component<'_>> = Vec::new();
    let mut ancestor = current.as_path();
    loop {
        if let Ok(real) = std::fs::canonicalize(ancestor) {
            let mut out = real;
            for c in rest.iter().rev() {
                out.push(c.as_os_str());
            }
            return super::path::clean(&out);
        }
        match (ancestor.parent(), ancestor.components().next_back()) {
            (Some(parent), Some(last)) => {
                rest.push(last);
                ancestor = parent;
            }
            _ => return current.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn reserved(dir: &Path) -> Reserved {
        Reserved::new([dir.join("res"), dir.join("marker")])
    }

    #[test]
    fn paths_are_judged_where_they_resolve() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("res")).unwrap();
        std::fs::write(d.join("res/secret"), b"s").unwrap();
        std::fs::write(d.join("marker"), b"").unwrap();
        std::fs::create_dir(d.join("ok")).unwrap();
        symlink(d.join("res/secret"), d.join("ok/to-secret")).unwrap();
        symlink(d.join("res"), d.join("ok/to-res")).unwrap();
        symlink("../marker", d.join("ok/to-marker")).unwrap();
        symlink(d.join("res/not-yet"), d.join("ok/dangling")).unwrap();
        symlink(d.join("ok"), d.join("res/to-ok")).unwrap();
        let r = reserved(d);
        for refused in [
            d.join("res"),
            d.join("res/secret"),
            d.join("marker"),
            d.join("ok/to-secret"),
            d.join("ok/to-res"),
            d.join("ok/to-res/new/deeper"),
            d.join("ok/to-marker"),
            d.join("ok/dangling"),
            d.join("ok/../res/x"),
            // A link inside a reserved tree, even one pointing out of it.
            d.join("res/to-ok"),
        ] {
            let e = r.check_path(&refused).unwrap_err();
            assert!(
                matches!(e, Refusal::Reserved(_)),
                "{}: {e:?}",
                refused.display()
            );
            assert!(e.message().contains("reserved tree"), "{e:?}");
        }
        for fine in [
            d.join("ok"),
            d.join("ok/new/file"),
            d.join("resx"),
            d.join("marker2"),
        ] {
            r.check_path(&fine).unwrap();
        }
        // Nothing reserved: nothing refused.
        Reserved::default()
            .check_path(&d.join("res/secret"))
            .unwrap();
    }

    #[test]
    fn hard_links_into_reserved_trees_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("res/deep/er")).unwrap();
        std::fs::write(d.join("res/deep/er/secret"), b"s").unwrap();
        std::fs::write(d.join("marker"), b"").unwrap();
        std::fs::create_dir(d.join("ok")).unwrap();
        std::fs::hard_link(d.join("res/deep/er/secret"), d.join("ok/to-secret")).unwrap();
        std::fs::hard_link(d.join("marker"), d.join("ok/to-marker")).unwrap();
        // Linked twice, but nowhere reserved.
        std::fs::write(d.join("ok/plain"), b"p").unwrap();
        std::fs::hard_link(d.join("ok/plain"), d.join("ok/plain2")).unwrap();
        std::fs::write(d.join("ok/single"), b"1").unwrap();
        // A symlink in a reserved tree to a file elsewhere is not that file.
        symlink(d.join("ok/plain"), d.join("res/to-plain")).unwrap();
        let r = reserved(d);
        let meta = |p: &str| std::fs::metadata(d.join(p)).unwrap();
        for (linked, target) in [
            ("ok/to-secret", "res/deep/er/secret"),
            ("ok/to-marker", "marker"),
        ] {
            // The path checks cannot see it: the link's own path is elsewhere.
            r.check_path(&d.join(linked)).unwrap();
            let e = r.check_links(&meta(linked), &d.join(linked)).unwrap_err();
            assert!(matches!(e, Refusal::Reserved(_)), "{linked}: {e:?}");
            assert!(
                e.message().contains("hard link") && e.message().contains(target),
                "{e:?}"
            );
        }
        for fine in ["ok/plain", "ok/plain2", "ok/single"] {
            r.check_links(&meta(fine), &d.join(fine)).unwrap();
        }
        // A directory is no file to write.
        r.check_links(&meta("ok"), &d.join("ok")).unwrap();
        Reserved::default()
            .check_links(&meta("ok/to-secret"), &d.join("ok/to-secret"))
            .unwrap();
        // A reserved tree too big to walk refuses a linked file rather than pass it.
        for i in 0..8 {
            std::fs::write(d.join(format!("res/f{i}")), b"").unwrap();
        }
        let e = r
            .check_links_within(&meta("ok/plain"), &d.join("ok/plain"), 5)
            .unwrap_err();
        assert!(matches!(e, Refusal::Unknown(_)), "{e:?}");
        // A file with one link is never walked for.
        r.check_links_within(&meta("ok/single"), &d.join("ok/single"), 0)
            .unwrap();
    }

    #[test]
    fn descriptors_are_judged_by_what_they_opened() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("res")).unwrap();
        std::fs::write(d.join("res/secret"), b"s").unwrap();
        std::fs::write(d.join("plain"), b"p").unwrap();
        symlink(d.join("res/secret"), d.join("link")).unwrap();
        let r = reserved(d);
        let through_link = std::fs::File::open(d.join("link")).unwrap();
        let e = r.check_fd(&through_link, &d.join("link")).unwrap_err();
        assert!(e.message().contains("resolves to"), "{e:?}");
        let plain = std::fs::File::open(d.join("plain")).unwrap();
        r.check_fd(&plain, &d.join("plain")).unwrap();
        // A pipe is no file a path names.
        let (reader, _writer) = std::io::pipe().unwrap();
        assert!(matches!(
            r.check_fd(&reader, Path::new("/x")),
            Err(Refusal::Unknown(_))
        ));
    }
}

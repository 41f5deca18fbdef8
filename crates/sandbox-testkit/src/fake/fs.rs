//! The fake's in-memory filesystem: a map from normalized path to node, and the directory
//! watches its mutations feed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sandbox_core::{
    DirEntry, EntryKind, Error, ErrorCode, Operation, SandboxPath, StatEntry, WatchEvent,
    WatchEventKind,
};
use time::OffsetDateTime;
use tokio::sync::mpsc;

/// One armed watch: where its events go and what it covers.
#[derive(Debug)]
pub(crate) struct Watcher {
    pub(crate) dir: SandboxPath,
    pub(crate) recursive: bool,
    pub(crate) tx: mpsc::Sender<WatchEvent>,
    /// Set when the queue was full: the stream ends with `watch_overflow` after what it holds.
    pub(crate) overflowed: Arc<AtomicBool>,
}

impl Watcher {
    fn covers(&self, path: &SandboxPath) -> bool {
        if self.recursive {
            path.is_strictly_under(&self.dir)
        } else {
            path.parent().as_ref() == Some(&self.dir)
        }
    }
}

/// The armed watches. A snapshot's copy of a filesystem starts with none: a watch belongs to
/// the sandbox it was armed on.
#[derive(Debug, Default)]
pub(crate) struct Watchers(Vec<Watcher>);

impl Clone for Watchers {
    fn clone(&self) -> Self {
        Watchers(Vec::new())
    }
}

#[derive(Debug, Clone)]
enum Node {
    File {
        content: Vec<u8>,
        modified: OffsetDateTime,
    },
    Dir {
        modified: OffsetDateTime,
    },
}

/// A tree of files and directories. `/` always exists.
#[derive(Debug, Clone)]
pub(crate) struct MemFs {
    nodes: BTreeMap<SandboxPath, Node>,
    watchers: Watchers,
}

fn not_found(op: Operation, path: &SandboxPath) -> Error {
    Error::not_found(op, format!("{path}: no such file or directory"))
}

impl MemFs {
    /// A filesystem holding `/`, `/workspace` and `/tmp`, like the images real adapters boot.
    pub(crate) fn new(now: OffsetDateTime) -> Self {
        let mut fs = MemFs {
            nodes: BTreeMap::new(),
            watchers: Watchers::default(),
        };
        fs.nodes
            .insert(SandboxPath::root(), Node::Dir { modified: now });
        for dir in ["/workspace", "/tmp"] {
            if let Ok(p) = SandboxPath::new(dir) {
                fs.nodes.insert(p, Node::Dir { modified: now });
            }
        }
        fs
    }

    pub(crate) fn read(&self, path: &SandboxPath) -> Result<&[u8], Error> {
        match self.nodes.get(path) {
            Some(Node::File { content, .. }) => Ok(content),
            Some(Node::Dir { .. }) => Err(Error::invalid_request(
                Operation::READ_FILE,
                format!("{path}: is a directory"),
            )),
            None => Err(not_found(Operation::READ_FILE, path)),
        }
    }

    pub(crate) fn is_dir(&self, path: &SandboxPath) -> bool {
        matches!(self.nodes.get(path), Some(Node::Dir { .. }))
    }

    /// Writes a file, creating missing parents (like the real adapters' `mkdir -p` + write).
    pub(crate) fn write(
        &mut self,
        path: &SandboxPath,
        content: Vec<u8>,
        now: OffsetDateTime,
    ) -> Result<(), Error> {
        if path.is_root() || self.is_dir(path) {
            return Err(Error::invalid_request(
                Operation::WRITE_FILE,
                format!("{path}: is a directory"),
            ));
        }
        if let Some(parent) = path.parent() {
            self.mkdir_p(&parent, now, Operation::WRITE_FILE)?;
        }
        let existed = self.nodes.contains_key(path);
        self.nodes.insert(
            path.clone(),
            Node::File {
                content,
                modified: now,
            },
        );
        if !existed {
            self.notify(WatchEventKind::Create, path);
        }
        self.notify(WatchEventKind::Write, path);
        Ok(())
    }

    /// `rename(2)` of a file or a directory with everything below it, creating `to`'s
    /// parents: a file at `to` is replaced; a directory at `to`, or `to` inside `from`, is
    /// `invalid_path`.
    pub(crate) fn rename(
        &mut self,
        from: &SandboxPath,
        to: &SandboxPath,
        now: OffsetDateTime,
    ) -> Result<(), Error> {
        let op = Operation::RENAME_PATH;
        let invalid =
            |why: String| Error::invalid_request(op, why).with_code(ErrorCode::InvalidPath);
        if from.is_root() || to.is_root() {
            return Err(invalid(
                "/ cannot be renamed, nor be a rename's target".to_owned(),
            ));
        }
        if !self.nodes.contains_key(from) {
            return Err(not_found(op, from));
        }
        if from == to {
            return Ok(());
        }
        if to.is_strictly_under(from) {
            return Err(invalid(format!("{to} is inside {from}")));
        }
        if self.is_dir(to) {
            return Err(invalid(format!("{to} is an existing directory")));
        }
        if let Some(parent) = to.parent() {
            self.mkdir_p(&parent, now, op)?;
        }
        let moved: Vec<SandboxPath> = self
            .nodes
            .keys()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        let prefix = from.as_str().len();
        for old in moved {
            let Some(node) = self.nodes.remove(&old) else {
                continue;
            };
            let rest = old.as_str()[prefix..].trim_start_matches('/');
            let new = if rest.is_empty() {
                to.clone()
            } else {
                to.join(rest)?
            };
            self.nodes.insert(new, node);
        }
        self.notify(WatchEventKind::Rename, from);
        self.notify(WatchEventKind::Create, to);
        self.end_watches_under(from);
        Ok(())
    }

    /// Arms a watch on `dir`, which must be a directory.
    pub(crate) fn watch(&mut self, watcher: Watcher) -> Result<(), Error> {
        let op = Operation::WATCH_DIR;
        match self.nodes.get(&watcher.dir) {
            None => Err(not_found(op, &watcher.dir)),
            Some(Node::File { .. }) => Err(Error::invalid_request(
                op,
                format!("{}: not a directory", watcher.dir),
            )
            .with_code(ErrorCode::NotADirectory)),
            Some(Node::Dir { .. }) => {
                self.watchers.0.push(watcher);
                Ok(())
            }
        }
    }

    /// Delivers one event to every watch covering `path`. A watch whose consumer is gone is
    /// dropped; one whose queue is full is marked overflowed and dropped, so its stream ends in
    /// `watch_overflow` instead of growing.
    fn notify(&mut self, kind: WatchEventKind, path: &SandboxPath) {
        self.watchers.0.retain(|w| {
            if !w.covers(path) {
                return !w.tx.is_closed();
            }
            let event = WatchEvent {
                kind,
                path: path.clone(),
            };
            match w.tx.try_send(event) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    w.overflowed.store(true, Ordering::SeqCst);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Ends the watches on `path` and below (the directory is gone); their streams end.
    fn end_watches_under(&mut self, path: &SandboxPath) {
        self.watchers.0.retain(|w| !w.dir.starts_with(path));
    }

    /// `mkdir -p`: existing directories are success; a file in the way is an error.
    pub(crate) fn mkdir_p(
        &mut self,
        path: &SandboxPath,
        now: OffsetDateTime,
        op: Operation,
    ) -> Result<(), Error> {
        let mut current = SandboxPath::root();
        for component in path.components() {
            current = current.join(component)?;
            match self.nodes.get(&current) {
                Some(Node::Dir { .. }) => {}
                Some(Node::File { .. }) => {
                    return Err(Error::invalid_request(
                        op,
                        format!("{current}: not a directory"),
                    ));
                }
                None => {
                    self.nodes
                        .insert(current.clone(), Node::Dir { modified: now });
                    self.notify(WatchEventKind::Create, &current);
                }
            }
        }
        Ok(())
    }

    /// Removes `path` and everything below it.
    pub(crate) fn remove(&mut self, path: &SandboxPath) -> Result<(), Error> {
        if path.is_root() {
            return Err(Error::invalid_request(
                Operation::REMOVE,
                "refusing to remove /",
            ));
        }
        if !self.nodes.contains_key(path) {
            return Err(not_found(Operation::REMOVE, path));
        }
        let removed: Vec<SandboxPath> = self
            .nodes
            .keys()
            .filter(|p| p.starts_with(path))
            .cloned()
            .collect();
        // Deepest first, as a recursive removal unlinks them.
        for p in removed.iter().rev() {
            self.nodes.remove(p);
            self.notify(WatchEventKind::Remove, p);
        }
        self.end_watches_under(path);
        Ok(())
    }

    pub(crate) fn stat(&self, path: &SandboxPath) -> Result<StatEntry, Error> {
        let node = self
            .nodes
            .get(path)
            .ok_or_else(|| not_found(Operation::STAT, path))?;
        let (kind, size, modified) = describe(node);
        Ok(StatEntry {
            path: path.clone(),
            kind,
            size,
            modified: Some(modified),
        })
    }

    /// One directory level.
    pub(crate) fn list(&self, path: &SandboxPath) -> Result<Vec<DirEntry>, Error> {
        match self.nodes.get(path) {
            None => return Err(not_found(Operation::LIST_DIR, path)),
            Some(Node::File { .. }) => {
                return Err(Error::invalid_request(
                    Operation::LIST_DIR,
                    format!("{path}: not a directory"),
                ));
            }
            Some(Node::Dir { .. }) => {}
        }
        let entries = self
            .nodes
            .iter()
            .filter(|(p, _)| p.parent().as_ref() == Some(path) && !p.is_root())
            .map(|(p, node)| {
                let (kind, size, modified) = describe(node);
                DirEntry {
                    name: p.file_name().unwrap_or_default().to_owned(),
                    path: p.clone(),
                    kind,
                    size,
                    modified: Some(modified),
                }
            })
            .collect();
        Ok(entries)
    }
}

fn describe(node: &Node) -> (EntryKind, u64, OffsetDateTime) {
    match node {
        Node::File { content, modified } => (EntryKind::File, content.len() as u64, *modified),
        Node::Dir { modified } => (EntryKind::Dir, 0, *modified),
    }
}

//! The fake's in-memory filesystem: a map from normalized path to node.

use std::collections::BTreeMap;

use sandbox_core::{DirEntry, EntryKind, Error, Operation, SandboxPath, StatEntry};
use time::OffsetDateTime;

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
}

fn not_found(op: Operation, path: &SandboxPath) -> Error {
    Error::not_found(op, format!("{path}: no such file or directory"))
}

impl MemFs {
    /// A filesystem holding `/`, `/workspace` and `/tmp`, like the images real adapters boot.
    pub(crate) fn new(now: OffsetDateTime) -> Self {
        let mut fs = MemFs {
            nodes: BTreeMap::new(),
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
        self.nodes.insert(
            path.clone(),
            Node::File {
                content,
                modified: now,
            },
        );
        Ok(())
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
        self.nodes.retain(|p, _| !p.starts_with(path));
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

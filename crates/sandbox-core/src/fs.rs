//! Directory entries and file metadata.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::path::SandboxPath;
use crate::timefmt;

/// The kind of a filesystem entry, as seen without following a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Symlinks, sockets, devices, FIFOs. Callers that accept only files or directories refuse
    /// these before reading, so a link cannot redirect a read.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub path: SandboxPath,
    pub kind: EntryKind,
    pub size: u64,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub modified: Option<OffsetDateTime>,
}

/// Metadata of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatEntry {
    pub path: SandboxPath,
    pub kind: EntryKind,
    pub size: u64,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub modified: Option<OffsetDateTime>,
}

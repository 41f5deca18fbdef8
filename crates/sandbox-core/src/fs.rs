//! Directory entries and file metadata.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::Error;
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

/// A file's bytes, pulled chunk by chunk.
///
/// Backpressure is the point: an adapter reads ahead of its consumer by at most a chunk or two,
/// so a slow client slows the reader inside the sandbox instead of filling the service's
/// memory. Dropping the stream stops the read, and the adapter kills whatever it started for it.
#[async_trait]
pub trait ByteStream: Send {
    /// The next chunk (never empty); `None` once the file is done. An error ends the stream:
    /// the bytes already delivered are not the whole file.
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>>;
}

/// A boxed [`ByteStream`], what [`crate::SandboxProvider::read_file_stream`] returns.
pub type ReadStream = Box<dyn ByteStream>;

/// A [`ByteStream`] over bytes already in memory (adapters whose backend answers whole files).
#[derive(Debug)]
pub struct BufferedStream(Option<Vec<u8>>);

impl BufferedStream {
    /// The stream of `bytes` (one chunk, none when empty).
    pub fn new(bytes: Vec<u8>) -> Self {
        BufferedStream((!bytes.is_empty()).then_some(bytes))
    }
}

#[async_trait]
impl ByteStream for BufferedStream {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        self.0.take().map(Ok)
    }
}

/// Bounds of a recursive listing: a hostile tree (a million entries, or a FUSE mount that
/// answers slowly) yields a truncated listing, never an unbounded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeLimits {
    /// Levels below the root: 1 lists the root's entries only.
    pub depth: usize,
    /// Entries returned at most.
    pub max_entries: usize,
    /// Time the walk may take.
    pub deadline: Duration,
}

impl TreeLimits {
    /// Entries a listing returns when nobody says otherwise.
    pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
    /// Time a listing may take when nobody says otherwise.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

    /// `depth` levels with the default entry and time caps.
    pub fn depth(depth: usize) -> Self {
        TreeLimits {
            depth,
            max_entries: TreeLimits::DEFAULT_MAX_ENTRIES,
            deadline: TreeLimits::DEFAULT_DEADLINE,
        }
    }
}

/// A recursive listing: entries sorted by path, and whether a cap cut it short.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeListing {
    pub entries: Vec<DirEntry>,
    /// The entry cap or the deadline was reached: more entries may exist.
    pub truncated: bool,
}

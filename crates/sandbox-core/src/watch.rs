//! Directory watches, in provider-neutral form (capability `watch`, [`crate::Watch`]).
//!
//! A watch is armed when [`crate::Watch::watch_dir`] returns: every change after the return is
//! delivered. The events stream through [`WatchEvents`], an object-safe trait with one
//! async-trait method (core keeps its dependency allow-list). An adapter queues at most
//! [`WATCH_QUEUE_EVENTS`] undelivered events; a watcher that falls further behind gets an
//! error with code `watch_overflow` and the stream ends, so a consumer never believes it saw
//! every change when it did not (it re-lists the directory and watches again).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Operation};
use crate::path::SandboxPath;

/// Events an adapter holds for a watcher that has not pulled them, at most.
pub const WATCH_QUEUE_EVENTS: usize = 1024;

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    /// The path was created (a file, a directory).
    Create,
    /// A file's content was written.
    Write,
    /// The path was removed.
    Remove,
    /// The path was renamed away (the new name gets a `Create`).
    Rename,
    /// Its permissions or ownership changed.
    Chmod,
}

impl WatchEventKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchEventKind::Create => "create",
            WatchEventKind::Write => "write",
            WatchEventKind::Remove => "remove",
            WatchEventKind::Rename => "rename",
            WatchEventKind::Chmod => "chmod",
        }
    }
}

/// One change below a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    /// The absolute path that changed.
    pub path: SandboxPath,
}

/// The reading half of a watch.
#[async_trait]
pub trait WatchEvents: Send + std::fmt::Debug {
    /// The next event; `None` once the watch ended (its directory was removed, or the sandbox
    /// went away). An error ends the stream. Cancel-safe. Dropping the stream stops the watch.
    async fn next_event(&mut self) -> Option<Result<WatchEvent, Error>>;
}

/// A boxed [`WatchEvents`], what [`crate::Watch::watch_dir`] returns.
pub type WatchStream = Box<dyn WatchEvents>;

/// The error a watcher gets once it fell more than [`WATCH_QUEUE_EVENTS`] behind (`capacity`,
/// code `watch_overflow`).
pub fn watch_overflow(dir: &SandboxPath) -> Error {
    Error::new(
        crate::error::ErrorKind::Capacity,
        Operation::WATCH_DIR,
        format!(
            "the watch on {dir} fell more than {WATCH_QUEUE_EVENTS} events behind and was \
             stopped; list the directory and watch again"
        ),
    )
    .with_code(ErrorCode::WatchOverflow)
}

//! File operations through the agent (agent mode): the kept channel's envd client instead of a
//! `docker exec` per operation.
//!
//! Each operation answers what exec mode (`crate::files`) answers, field by field and error
//! by error, so a caller cannot tell the data planes apart:
//!
//! - Paths are checked here as given (`crate::files::check_path`), and the agent judges them
//!   again where they resolve inside the container: it was started with `--reserved-path` for
//!   every reserved tree ([`super::entrypoint`]) and answers a path that is or resolves into
//!   one with 403 (`/files`) or `permission_denied` (the filesystem service), which becomes
//!   `invalid_path` here, as exec mode's reading script reports it.
//! - Writes stream the caller's buffer as one `application/octet-stream` upload; the agent
//!   creates missing parents, as exec mode's `mkdir -p` does.
//! - Reads stream `GET /files` chunk by chunk; passing the cap ends the stream with
//!   `file_too_large` and drops the download. Only a regular file is read (a directory, a FIFO
//!   or a device is `not_a_regular_file`), and the agent never opens one for reading, so
//!   nothing hangs a read.
//! - Listings and metadata come from the filesystem service and are filled as exec mode's
//!   `stat -c '%F|%s|%Y'` fills them: the entry's own type (a symlink is `Other`, with the
//!   link's own size), its size, its mtime in whole seconds.
//!
//! A lease on the channel is held for each call, and for a read stream's whole life.
//! Everything the agent answers is bounded by the envd client's limits and checked here: an
//! entry outside the listed directory or with a name no path can hold is refused.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sandbox_core::fs::{ByteStream, TreeLimits, TreeListing};
use sandbox_core::{
    DirEntry, EntryKind, Error, ErrorCode, ErrorKind, Operation, Provider, SandboxPath, StatEntry,
};
use sandbox_envd::filesystem::{EntryInfo, FileType};
use sandbox_transport::envd::{CallOptions, Download, StagedUploadError};
use time::OffsetDateTime;

use crate::channel::{Channel, Lease};
use crate::files::{FILE_TIMEOUT, MAX_FILE_BYTES, MAX_TREE_DEPTH, check_path};

/// The size of the chunks a write is sent in: each is copied from the caller's buffer only as
/// the body is pulled, so an upload never holds a second copy of the file.
const UPLOAD_CHUNK: usize = 256 * 1024;
/// Chunks copied ahead of the upload body (see [`write`]).
const UPLOAD_QUEUE: usize = 4;

async fn lease(channel: &Arc<Channel>, op: Operation) -> Result<Lease, Error> {
    channel
        .lease()
        .await
        .map_err(|e| e.with_operation(op).with_provider(Provider::Docker))
}

/// The agent's answer in exec mode's taxonomy (see the module docs).
fn classify(op: Operation, e: Error) -> Error {
    let e = e.with_operation(op).with_provider(Provider::Docker);
    let message = e.message().to_owned();
    let lower = message.to_ascii_lowercase();
    match e.http_status() {
        // The agent has no token on the channel: a 403 is only ever its reserved-tree refusal.
        Some(403) => Error::invalid_request(op, message)
            .with_code(ErrorCode::InvalidPath)
            .with_provider(Provider::Docker),
        Some(400)
            if op == Operation::READ_FILE
                && (lower.contains("is a directory") || lower.contains("not a regular file")) =>
        {
            Error::invalid_request(op, message)
                .with_code(ErrorCode::NotARegularFile)
                .with_provider(Provider::Docker)
        }
        _ => e,
    }
}

/// Writes a whole file, creating its parents.
pub(crate) async fn write(
    channel: &Arc<Channel>,
    path: &SandboxPath,
    content: &[u8],
) -> Result<(), Error> {
    let op = Operation::WRITE_FILE;
    check_path(op, path)?;
    if path.is_root() {
        return Err(Error::invalid_request(op, "/: is a directory").with_provider(Provider::Docker));
    }
    let lease = lease(channel, op).await?;
    // The upload body must own what it sends, but the caller's buffer is only borrowed: a
    // whole copy would hold every upload twice. So the chunks are copied as the body is
    // pulled, through a queue of UPLOAD_QUEUE chunks: an upload holds at most that much more
    // than the caller's buffer, however large the file.
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(UPLOAD_QUEUE);
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let max = u64::try_from(content.len()).unwrap_or(u64::MAX);
    let upload = lease.client().upload_stream(
        path.as_str(),
        body,
        max,
        CallOptions::new().timeout(FILE_TIMEOUT),
    );
    let feed = async move {
        for chunk in content.chunks(UPLOAD_CHUNK) {
            // A closed queue means the upload ended early; its own result says why.
            if tx.send(Ok(Bytes::copy_from_slice(chunk))).await.is_err() {
                break;
            }
        }
    };
    // The feed runs beside the upload and is dropped when the upload ends, whatever the
    // body's fate inside hyper: a refused upload can never leave it waiting on a full queue.
    tokio::pin!(upload, feed);
    let mut fed = false;
    let uploaded = loop {
        tokio::select! {
            result = &mut upload => break result,
            () = &mut feed, if !fed => fed = true,
        }
    };
    uploaded.map_err(|e| classify(op, e))?;
    Ok(())
}

/// A streamed write (`StreamedFiles::write_stream`): the envd client's staged upload
/// (`EnvdClient::upload_atomic`): the caller's source is uploaded, as it is pulled, to a hidden
/// sibling of the target, which is renamed over the target once the source ended cleanly within
/// `max_bytes`. So a reader of the target sees the old file or the new one, never a part; a
/// failed upload removes the sibling. (A call dropped mid-upload can leave the sibling,
/// `.<name>.sandbox-upload-<random>`, behind; never a partial target.)
pub(crate) async fn write_stream(
    channel: &Arc<Channel>,
    path: &SandboxPath,
    source: sandbox_core::ReadStream,
    max_bytes: u64,
) -> Result<u64, Error> {
    let op = Operation::WRITE_FILE_STREAM;
    check_path(op, path)?;
    if path.is_root() {
        return Err(Error::invalid_request(op, "/: is a directory").with_provider(Provider::Docker));
    }
    let lease = lease(channel, op).await?;
    lease
        .client()
        .upload_atomic(
            path,
            source,
            max_bytes,
            CallOptions::new().timeout(crate::files::STREAM_TIMEOUT),
            options(),
        )
        .await
        .map_err(|e| match e {
            StagedUploadError::Envd(e) => classify(op, e),
            // The source's own failure (or the bound) is the caller's error as it is.
            other => other.into_error().with_operation(op),
        })
}

/// A rename (`StreamedFiles::rename_path`), with the port's rules checked before the agent's
/// `Move` (a plain `rename(2)`): `/`, a target inside the source and an existing directory as
/// the target are `invalid_path`; a missing source is `not_found`.
pub(crate) async fn rename(
    channel: &Arc<Channel>,
    from: &SandboxPath,
    to: &SandboxPath,
) -> Result<(), Error> {
    let op = Operation::RENAME_PATH;
    check_path(op, from)?;
    check_path(op, to)?;
    let invalid = |why: String| {
        Error::invalid_request(op, why)
            .with_code(ErrorCode::InvalidPath)
            .with_provider(Provider::Docker)
    };
    if from.is_root() || to.is_root() {
        return Err(invalid(
            "/ cannot be renamed, nor be a rename's target".to_owned(),
        ));
    }
    if to.is_strictly_under(from) {
        return Err(invalid(format!("{to} is inside {from}")));
    }
    match stat(channel, to).await {
        Ok(entry) if entry.kind == EntryKind::Dir && from != to => {
            return Err(invalid(format!("{to} is an existing directory")));
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e.with_operation(op)),
    }
    let lease = lease(channel, op).await?;
    lease
        .client()
        .rename(from.as_str(), to.as_str(), options())
        .await
        .map(drop)
        .map_err(|e| classify(op, e))
}

/// How long the agent may take to arm a watch (its `start` event).
const WATCH_ARM_TIMEOUT: Duration = Duration::from_secs(30);

/// A directory watch (`Watch::watch_dir`) over the agent's `Filesystem/WatchDir` stream. The
/// path is judged first (a missing one is `not_found`, anything but a directory
/// `not_a_directory`), and the call returns only once the agent's `start` event said the
/// watch is armed. The stream is pulled by the caller, so the agent's bounded queue (and
/// inotify's) is the only buffer; an inotify overflow ends it with `watch_overflow`. It holds
/// its lease on the channel for as long as it lives.
pub(crate) async fn watch_dir(
    channel: &Arc<Channel>,
    dir: &SandboxPath,
    recursive: bool,
) -> Result<AgentWatch, Error> {
    use sandbox_envd::filesystem::watch_dir_response::Event;
    let op = Operation::WATCH_DIR;
    check_path(op, dir)?;
    let entry = stat(channel, dir).await.map_err(|e| e.with_operation(op))?;
    if entry.kind != EntryKind::Dir {
        return Err(
            Error::invalid_request(op, format!("{dir}: not a directory"))
                .with_code(ErrorCode::NotADirectory)
                .with_provider(Provider::Docker),
        );
    }
    let lease = lease(channel, op).await?;
    let request = sandbox_envd::filesystem::WatchDirRequest {
        path: dir.as_str().to_owned(),
        recursive,
        ..Default::default()
    };
    let mut stream = lease
        .client()
        .watch_dir(&request, CallOptions::new().no_timeout())
        .await
        .map_err(|e| classify(op, e))?;
    let first = tokio::time::timeout(WATCH_ARM_TIMEOUT, stream.message())
        .await
        .map_err(|_| {
            Error::timeout(
                op,
                format!("the agent did not arm the watch on {dir} in time"),
            )
            .with_provider(Provider::Docker)
        })?
        .map_err(|e| classify(op, e))?;
    match first.and_then(|m| m.event) {
        Some(Event::Start(_)) => {}
        other => {
            return Err(Error::internal(
                op,
                format!("the agent's watch on {dir} began with {other:?}, not start"),
            )
            .with_provider(Provider::Docker));
        }
    }
    Ok(AgentWatch {
        stream,
        _lease: lease,
        dir: dir.clone(),
        done: false,
    })
}

/// See [`watch_dir`].
pub(crate) struct AgentWatch {
    stream: sandbox_transport::envd::ServerStream<sandbox_envd::filesystem::WatchDirResponse>,
    _lease: Lease,
    dir: SandboxPath,
    done: bool,
}

impl std::fmt::Debug for AgentWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentWatch")
            .field("dir", &self.dir)
            .field("done", &self.done)
            .finish()
    }
}

impl AgentWatch {
    fn event(
        &self,
        change: sandbox_envd::filesystem::FilesystemEvent,
    ) -> Option<Result<sandbox_core::WatchEvent, Error>> {
        use sandbox_core::WatchEventKind as Kind;
        use sandbox_envd::filesystem::EventType;
        let kind = match change.r#type {
            EventType::Create => Kind::Create,
            EventType::Write => Kind::Write,
            EventType::Remove => Kind::Remove,
            EventType::Rename => Kind::Rename,
            EventType::Chmod => Kind::Chmod,
            // A kind this adapter does not know names nothing a caller could act on.
            EventType::Unspecified | EventType::Unrecognized(_) => return None,
        };
        // Names are relative to the watched directory; one that no path below it can hold
        // (absolute, traversing) is refused rather than reported somewhere else.
        let path = if change.name.is_empty() {
            Ok(self.dir.clone())
        } else {
            self.dir
                .join(&change.name)
                .ok()
                .filter(|p| p.is_strictly_under(&self.dir))
                .ok_or_else(|| {
                    Error::internal(
                        Operation::WATCH_DIR,
                        format!(
                            "the agent reported a change outside {}: {:?}",
                            self.dir,
                            change.name.chars().take(200).collect::<String>()
                        ),
                    )
                    .with_provider(Provider::Docker)
                })
        };
        Some(path.map(|path| sandbox_core::WatchEvent { kind, path }))
    }
}

#[async_trait]
impl sandbox_core::WatchEvents for AgentWatch {
    async fn next_event(&mut self) -> Option<Result<sandbox_core::WatchEvent, Error>> {
        use sandbox_envd::filesystem::watch_dir_response::Event;
        if self.done {
            return None;
        }
        loop {
            match self.stream.message().await {
                Ok(Some(message)) => match message.event {
                    Some(Event::Filesystem(change)) => {
                        if let Some(event) = self.event(change) {
                            if event.is_err() {
                                self.done = true;
                            }
                            return Some(event);
                        }
                    }
                    Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
                },
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    if e.message().contains("overflowed") {
                        return Some(Err(sandbox_core::watch::watch_overflow(&self.dir)
                            .with_provider(Provider::Docker)));
                    }
                    return Some(Err(classify(Operation::WATCH_DIR, e)));
                }
            }
        }
    }
}

/// A file's bytes as the agent sends them, pulled chunk by chunk; holds its lease on the
/// channel for as long as it lives.
pub(crate) struct AgentFileStream {
    /// `None` once the stream ended (dropping the download stops the agent's reader).
    download: Option<Download>,
    _lease: Lease,
    path: SandboxPath,
    max_bytes: u64,
    delivered: u64,
}

impl std::fmt::Debug for AgentFileStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentFileStream")
            .field("path", &self.path)
            .field("delivered", &self.delivered)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Opens a streamed read of `path`: answers once the agent has judged and opened the file, so
/// a missing, reserved or irregular file is an error here, before any chunk. `timeout` bounds
/// the whole read.
pub(crate) async fn read_stream(
    channel: &Arc<Channel>,
    path: &SandboxPath,
    max_bytes: u64,
    timeout: Duration,
) -> Result<AgentFileStream, Error> {
    let op = Operation::READ_FILE;
    check_path(op, path)?;
    let lease = lease(channel, op).await?;
    let download = lease
        .client()
        .download(path.as_str(), CallOptions::new().timeout(timeout))
        .await
        .map_err(|e| classify(op, e))?;
    Ok(AgentFileStream {
        download: Some(download),
        _lease: lease,
        path: path.clone(),
        max_bytes,
        delivered: 0,
    })
}

#[async_trait]
impl ByteStream for AgentFileStream {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        let download = self.download.as_mut()?;
        match download.chunk().await {
            Ok(Some(bytes)) => {
                let total = self
                    .delivered
                    .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
                if total > self.max_bytes {
                    self.download = None;
                    return Some(Err(sandbox_core::ports::provider::file_too_large(
                        &self.path,
                        self.max_bytes,
                    )
                    .with_provider(Provider::Docker)));
                }
                self.delivered = total;
                Some(Ok(bytes.to_vec()))
            }
            Ok(None) => {
                self.download = None;
                None
            }
            Err(e) => {
                self.download = None;
                Some(Err(classify(Operation::READ_FILE, e)))
            }
        }
    }
}

/// Reads a whole file: the stream, drained, under [`MAX_FILE_BYTES`].
pub(crate) async fn read(channel: &Arc<Channel>, path: &SandboxPath) -> Result<Vec<u8>, Error> {
    let max = u64::try_from(MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut stream = read_stream(channel, path, max, FILE_TIMEOUT).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next_chunk().await {
        let chunk = chunk?;
        if out.is_empty() {
            out = chunk;
        } else {
            out.extend_from_slice(&chunk);
        }
    }
    Ok(out)
}

fn options() -> CallOptions {
    CallOptions::new().timeout(FILE_TIMEOUT)
}

/// Exec mode's entry type: the entry's own, so a symlink is `Other` whatever it points at.
fn kind_of(entry: &EntryInfo) -> EntryKind {
    if entry.is_symlink {
        return EntryKind::Other;
    }
    match entry.r#type {
        FileType::File => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        _ => EntryKind::Other,
    }
}

/// Exec mode's mtime: whole seconds (`stat -c %Y`).
fn modified_of(entry: &EntryInfo) -> Option<OffsetDateTime> {
    entry
        .modified_time
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t.seconds).ok())
}

fn size_of(entry: &EntryInfo) -> u64 {
    u64::try_from(entry.size).unwrap_or(0)
}

fn unreadable(op: Operation, dir: &SandboxPath, what: &str) -> Error {
    Error::internal(op, format!("{dir}: unreadable listing entry {what:?}"))
        .with_provider(Provider::Docker)
}

/// Metadata of one path.
pub(crate) async fn stat(channel: &Arc<Channel>, path: &SandboxPath) -> Result<StatEntry, Error> {
    let op = Operation::STAT;
    check_path(op, path)?;
    let lease = lease(channel, op).await?;
    let entry = lease
        .client()
        .stat(path.as_str(), options())
        .await
        .map_err(|e| classify(op, e))?;
    Ok(StatEntry {
        path: path.clone(),
        kind: kind_of(&entry),
        size: size_of(&entry),
        modified: modified_of(&entry),
    })
}

/// One entry of a one-level listing of `dir`: named by the agent, placed under `dir` here.
fn dir_entry(dir: &SandboxPath, entry: &EntryInfo) -> Result<DirEntry, Error> {
    let op = Operation::LIST_DIR;
    if entry.name.is_empty() || entry.name.contains('/') || entry.name == "." || entry.name == ".."
    {
        return Err(unreadable(op, dir, &entry.name));
    }
    let path = dir
        .join(&entry.name)
        .map_err(|_| unreadable(op, dir, &entry.name))?;
    Ok(DirEntry {
        name: entry.name.clone(),
        path,
        kind: kind_of(entry),
        size: size_of(entry),
        modified: modified_of(entry),
    })
}

/// One directory level, hidden entries included; in exec mode's order (the shell's globs:
/// visible names, then hidden ones, each sorted).
pub(crate) async fn list(
    channel: &Arc<Channel>,
    path: &SandboxPath,
) -> Result<Vec<DirEntry>, Error> {
    let op = Operation::LIST_DIR;
    check_path(op, path)?;
    let lease = lease(channel, op).await?;
    let answer = lease
        .client()
        .list_dir(path.as_str(), 1, options())
        .await
        .map_err(|e| classify(op, e))?;
    let mut entries = answer
        .iter()
        .map(|e| dir_entry(path, e))
        .collect::<Result<Vec<_>, _>>()?;
    entries.sort_by(|a, b| {
        (a.name.starts_with('.'), a.name.as_bytes())
            .cmp(&(b.name.starts_with('.'), b.name.as_bytes()))
    });
    Ok(entries)
}

/// An entry of a deep listing of `dir`: the agent names it by its full path under `dir` as
/// the caller named it; anything else is refused.
fn tree_entry(dir: &SandboxPath, entry: &EntryInfo) -> Result<DirEntry, Error> {
    let op = Operation::LIST_DIR;
    let path = SandboxPath::new(&entry.path)
        .ok()
        .filter(|p| p.is_strictly_under(dir))
        .ok_or_else(|| unreadable(op, dir, &entry.path))?;
    Ok(DirEntry {
        name: path.file_name().unwrap_or_default().to_owned(),
        path,
        kind: kind_of(entry),
        size: size_of(entry),
        modified: modified_of(entry),
    })
}

/// Lists `dir` down to `limits.depth` levels: one `ListDir` call of that depth; when the agent
/// finds that listing too long for one answer, a walk of one-level calls, stopped once
/// `limits.max_entries` entries are in or `limits.deadline` has passed. Entries sorted by path,
/// as exec mode sorts them; `truncated` when a bound cut the listing.
pub(crate) async fn tree(
    channel: &Arc<Channel>,
    dir: &SandboxPath,
    limits: TreeLimits,
) -> Result<TreeListing, Error> {
    let op = Operation::LIST_DIR;
    check_path(op, dir)?;
    let depth = limits.depth.clamp(1, MAX_TREE_DEPTH);
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let lease = lease(channel, op).await?;
    let whole = lease
        .client()
        .list_dir(
            dir.as_str(),
            u32::try_from(depth).unwrap_or(u32::MAX),
            CallOptions::new().timeout(limits.deadline),
        )
        .await;
    let (mut entries, mut truncated) = match whole {
        Ok(answer) => (
            answer
                .iter()
                .map(|e| tree_entry(dir, e))
                .collect::<Result<Vec<_>, _>>()?,
            false,
        ),
        // The whole tree was more than one answer may carry, or took longer than allowed.
        Err(e) if matches!(e.kind(), ErrorKind::Capacity | ErrorKind::Timeout) => {
            walk(&lease, dir, depth, limits.max_entries, deadline).await?
        }
        Err(e) => return Err(classify(op, e)),
    };
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    if entries.len() > limits.max_entries {
        entries.truncate(limits.max_entries);
        truncated = true;
    }
    Ok(TreeListing { entries, truncated })
}

/// The tree one level per call, breadth first: stops at `max_entries` (one more proves the cut)
/// or the deadline. A directory that vanished or cannot be listed while walking is skipped, as
/// `find` skips what it cannot read.
async fn walk(
    lease: &Lease,
    dir: &SandboxPath,
    depth: usize,
    max_entries: usize,
    deadline: tokio::time::Instant,
) -> Result<(Vec<DirEntry>, bool), Error> {
    let op = Operation::LIST_DIR;
    let mut out = Vec::new();
    let mut level = vec![dir.clone()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for current in level {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok((out, true));
            }
            let answer = match lease
                .client()
                .list_dir(current.as_str(), 1, CallOptions::new().timeout(left))
                .await
            {
                Ok(answer) => answer,
                Err(e) if current == *dir => return Err(classify(op, e)),
                Err(e) if e.kind() == ErrorKind::Timeout => return Ok((out, true)),
                Err(_) => continue,
            };
            for entry in &answer {
                let entry = dir_entry(&current, entry)?;
                if entry.kind == EntryKind::Dir {
                    next.push(entry.path.clone());
                }
                out.push(entry);
                if out.len() > max_entries {
                    return Ok((out, true));
                }
            }
        }
        level = next;
    }
    Ok((out, false))
}

/// Creates a directory and its parents; an existing directory is success.
pub(crate) async fn make_dir(channel: &Arc<Channel>, path: &SandboxPath) -> Result<(), Error> {
    let op = Operation::MAKE_DIR;
    check_path(op, path)?;
    let lease = lease(channel, op).await?;
    match lease.client().make_dir(path.as_str(), options()).await {
        Ok(_) => Ok(()),
        // The agent answers `already_exists` only for a directory (anything else in the way is
        // `invalid_argument`), and exec mode's `mkdir -p` takes an existing directory as done.
        Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
        Err(e) => Err(classify(op, e)),
    }
}

/// Removes a path recursively; `/` is refused and a missing path is `not_found` (the agent's
/// `Remove` takes a missing path as done, so it is looked up first, as exec mode does).
pub(crate) async fn remove(channel: &Arc<Channel>, path: &SandboxPath) -> Result<(), Error> {
    let op = Operation::REMOVE;
    if path.is_root() {
        return Err(
            Error::invalid_request(op, "refusing to remove /").with_provider(Provider::Docker)
        );
    }
    check_path(op, path)?;
    let lease = lease(channel, op).await?;
    lease
        .client()
        .stat(path.as_str(), options())
        .await
        .map_err(|e| classify(op, e))?;
    lease
        .client()
        .remove(path.as_str(), options())
        .await
        .map_err(|e| classify(op, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, path: &str, r#type: FileType, symlink: bool) -> EntryInfo {
        EntryInfo {
            name: name.to_owned(),
            path: path.to_owned(),
            r#type,
            size: 7,
            is_symlink: symlink,
            modified_time: Some(sandbox_envd::Timestamp::new(1_700_000_000, 999_999_999).unwrap()),
            ..EntryInfo::default()
        }
    }

    #[test]
    fn entries_are_filled_as_exec_mode_fills_them() {
        let dir = SandboxPath::new("/w").unwrap();
        let file = dir_entry(&dir, &entry("a", "/w/a", FileType::File, false)).unwrap();
        assert_eq!(
            (file.kind, file.size, file.path.as_str()),
            (EntryKind::File, 7, "/w/a")
        );
        // Whole seconds, as `stat -c %Y` prints them.
        assert_eq!(
            file.modified,
            Some(OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap())
        );
        let d = dir_entry(&dir, &entry("d", "/w/d", FileType::Directory, false)).unwrap();
        assert_eq!(d.kind, EntryKind::Dir);
        // A symlink is its own type, whatever it points at.
        let link = dir_entry(&dir, &entry("l", "/w/l", FileType::Directory, true)).unwrap();
        assert_eq!(link.kind, EntryKind::Other);
        let fifo = dir_entry(&dir, &entry("p", "/w/p", FileType::Unspecified, false)).unwrap();
        assert_eq!(fifo.kind, EntryKind::Other);
        let mut no_time = entry("n", "/w/n", FileType::File, false);
        no_time.modified_time = None;
        no_time.size = -1;
        let n = dir_entry(&dir, &no_time).unwrap();
        assert_eq!((n.modified, n.size), (None, 0));
    }

    #[test]
    fn entries_the_agent_cannot_mean_are_refused() {
        let dir = SandboxPath::new("/w").unwrap();
        for bad in ["", ".", "..", "a/b", "bad\nname"] {
            let e = dir_entry(&dir, &entry(bad, "/w/x", FileType::File, false)).unwrap_err();
            assert!(
                e.to_string().contains("unreadable listing entry"),
                "{bad:?}: {e}"
            );
        }
        for outside in ["/w", "/elsewhere/x", "/wx/y", "relative", "/w/../etc"] {
            let e = tree_entry(&dir, &entry("x", outside, FileType::File, false)).unwrap_err();
            assert!(
                e.to_string().contains("unreadable listing entry"),
                "{outside}: {e}"
            );
        }
        let deep = tree_entry(&dir, &entry("z", "/w/a/z", FileType::File, false)).unwrap();
        assert_eq!((deep.name.as_str(), deep.path.as_str()), ("z", "/w/a/z"));
    }

    #[test]
    fn agent_refusals_read_as_exec_mode_reports_them() {
        let reserved = classify(
            Operation::READ_FILE,
            Error::new(
                ErrorKind::Authentication,
                Operation::new("download"),
                "in the reserved tree /proc",
            )
            .with_http_status(403),
        );
        assert_eq!(
            (reserved.kind(), reserved.code(), reserved.operation()),
            (
                ErrorKind::InvalidRequest,
                Some(ErrorCode::InvalidPath),
                Operation::READ_FILE
            )
        );
        for message in [
            "path '/w' is a directory",
            "path '/w/p' is not a regular file",
        ] {
            let e = classify(
                Operation::READ_FILE,
                Error::invalid_request(Operation::new("download"), message).with_http_status(400),
            );
            assert_eq!(e.code(), Some(ErrorCode::NotARegularFile), "{message}");
        }
        let missing = classify(
            Operation::STAT,
            Error::not_found(Operation::new("stat"), "not_found: file not found")
                .with_http_status(404),
        );
        assert_eq!(
            (missing.kind(), missing.code()),
            (ErrorKind::NotFound, None)
        );
    }
}

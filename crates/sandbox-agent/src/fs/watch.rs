//! Directory watching on inotify: the `WatchDir` stream and the polled watchers of
//! `CreateWatcher` / `GetWatcherEvents` / `RemoveWatcher`.
//!
//! One inotify instance per watcher. A recursive watcher adds a watch for every directory below
//! the root when it starts and for each directory created or moved in later; the contents of
//! such a new directory (made before its watch existed, as `mkdir -p a/b && touch a/b/c` does)
//! are reported as creations, so a client can miss nothing, at the price of a possible
//! duplicate. Event names are relative to the watched directory (`.` for the directory
//! itself). Events map onto envd's kinds as fsnotify, which envd uses, maps them: create and
//! moved-to are CREATE, moved-from and a move of the root are RENAME, attribute changes CHMOD,
//! modifications WRITE, deletions REMOVE. A lost event (inotify's queue overflowed) ends the
//! watch with an error rather than leaving the client believing it saw everything.

use std::collections::HashMap;
use std::ffi::OsString;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use sandbox_envd::filesystem::watch_dir_response::{Event, KeepAlive, StartEvent};
use sandbox_envd::filesystem::{EventType, FilesystemEvent, WatchDirResponse};
use sandbox_envd::{Code, ConnectError};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::entry::{Names, entry_info};
use crate::users::AccountFiles;

/// What each watch listens for.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

/// Room for many events per read (each is 16 bytes plus its name, at most 256).
const READ_BUFFER: usize = 64 * 1024;

/// Events a `WatchDir` stream holds for a client that reads slowly; past it the watcher waits,
/// inotify's own queue fills, and its overflow ends the stream.
pub(crate) const STREAM_BUFFER: usize = 64;

/// Filesystem magic numbers (`statfs` `f_type`) of network and FUSE mounts, whose events
/// inotify cannot see when they come from another machine.
const NETWORK_MAGICS: [u64; 5] = [
    0x6969,      // NFS
    0xFF53_4D42, // CIFS
    0x517B,      // SMB
    0xFE53_4D42, // SMB2
    0x6573_5546, // FUSE
];

/// One change, before an entry is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// Relative to the watched directory; empty for the directory itself.
    pub(crate) name: PathBuf,
    pub(crate) kind: EventType,
}

/// An inotify instance watching one directory (and, when recursive, its subdirectories).
#[derive(Debug)]
pub(crate) struct Watch {
    fd: OwnedFd,
    root: PathBuf,
    root_wd: i32,
    recursive: bool,
    /// Watch descriptor to the directory's path relative to the root.
    dirs: HashMap<i32, PathBuf>,
    max_watches: usize,
    buf: Box<[MaybeUninit<u8>]>,
}

/// Checks that `root` is a watchable directory: `not_found`, `invalid_argument` otherwise.
pub(crate) fn check_root(root: &Path, allow_network_mounts: bool) -> Result<(), ConnectError> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path {} not a directory", root.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ConnectError::new(
                Code::NotFound,
                format!("path {} not found", root.display()),
            ));
        }
        Err(e) => return Err(super::ops::internal("error statting path", &e)),
    }
    if !allow_network_mounts {
        let fs = rustix::fs::statfs(root).map_err(|e| {
            super::ops::internal("error checking mount status", &std::io::Error::from(e))
        })?;
        #[allow(
            clippy::cast_sign_loss,
            clippy::unnecessary_cast,
            reason = "f_type's width and sign differ by architecture; only the low 32 bits name a filesystem"
        )]
        let magic = (fs.f_type as u64) & 0xFFFF_FFFF;
        if NETWORK_MAGICS.contains(&magic) {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!(
                    "cannot watch path on network filesystem: {}",
                    root.display()
                ),
            ));
        }
    }
    Ok(())
}

impl Watch {
    /// Starts watching `root` (already checked by [`check_root`]). Blocking: a recursive
    /// watch walks the tree.
    pub(crate) fn open(
        root: PathBuf,
        recursive: bool,
        max_watches: usize,
    ) -> Result<Watch, ConnectError> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| watch_error("error creating watcher", e))?;
        let root_wd = inotify::add_watch(&fd, &root, MASK)
            .map_err(|e| watch_error("error adding path to watcher", e))?;
        let mut dirs = HashMap::from([(root_wd, PathBuf::new())]);
        if recursive {
            add_tree(&fd, &root, Path::new(""), &mut dirs, max_watches, None)?;
        }
        Ok(Watch {
            fd,
            root,
            root_wd,
            recursive,
            dirs,
            max_watches,
            buf: vec![MaybeUninit::uninit(); READ_BUFFER].into_boxed_slice(),
        })
    }

    /// The changes inotify has ready (none when it has nothing yet).
    fn read(&mut self) -> Result<Vec<Change>, ConnectError> {
        let mut raw = Vec::new();
        let mut reader = inotify::Reader::new(&self.fd, &mut self.buf);
        loop {
            match reader.next() {
                Ok(ev) => raw.push(RawEvent {
                    wd: ev.wd(),
                    mask: ev.events(),
                    name: ev
                        .file_name()
                        .map(|n| std::ffi::OsStr::from_bytes(n.to_bytes()).to_owned()),
                }),
                Err(Errno::AGAIN | Errno::INTR) => break,
                Err(e) => {
                    return Err(super::ops::internal(
                        "watcher error",
                        &std::io::Error::from(e),
                    ));
                }
            }
            // One read's worth at a time: the caller hands these on before reading more.
            if reader.is_buffer_empty() {
                break;
            }
        }
        self.translate(raw)
    }

    fn translate(&mut self, raw: Vec<RawEvent>) -> Result<Vec<Change>, ConnectError> {
        let mut out = Vec::new();
        for ev in raw {
            if ev.mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                return Err(ConnectError::new(
                    Code::Internal,
                    "watcher error: the inotify event queue overflowed and events were lost",
                ));
            }
            if ev.mask.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&ev.wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&ev.wd) else {
                continue;
            };
            let name = match &ev.name {
                Some(n) => dir.join(n),
                // A subdirectory's own events are reported by its parent's watch too, with a
                // name; only the root's are kept.
                None if ev.wd == self.root_wd => PathBuf::new(),
                None => continue,
            };
            let m = ev.mask;
            let kinds = [
                (
                    m.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO),
                    EventType::Create,
                ),
                (
                    m.intersects(ReadFlags::MOVED_FROM | ReadFlags::MOVE_SELF),
                    EventType::Rename,
                ),
                (m.contains(ReadFlags::ATTRIB), EventType::Chmod),
                (m.contains(ReadFlags::MODIFY), EventType::Write),
                (
                    m.intersects(ReadFlags::DELETE | ReadFlags::DELETE_SELF),
                    EventType::Remove,
                ),
            ];
            for (_, kind) in kinds.iter().filter(|(set, _)| *set) {
                out.push(Change {
                    name: name.clone(),
                    kind: *kind,
                });
            }
            if !self.recursive || !m.contains(ReadFlags::ISDIR) || ev.name.is_none() {
                continue;
            }
            if m.contains(ReadFlags::MOVED_FROM) {
                self.forget_tree(&name);
            }
            if m.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                let mut found = Vec::new();
                let on_disk = self.root.join(&name);
                match add_tree(
                    &self.fd,
                    &on_disk,
                    &name,
                    &mut self.dirs,
                    self.max_watches,
                    Some(&mut found),
                ) {
                    Ok(()) => {}
                    // Gone again before we could watch it: its removal follows.
                    Err(e) if e.code == Code::NotFound => {}
                    Err(e) => return Err(e),
                }
                out.extend(found.into_iter().map(|name| Change {
                    name,
                    kind: EventType::Create,
                }));
            }
        }
        Ok(out)
    }

    /// Stops watching the directory `rel` and everything below it (moved away: its watch would
    /// go on reporting under the old name).
    fn forget_tree(&mut self, rel: &Path) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(wd, p)| **wd != self.root_wd && p.starts_with(rel))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            // Already gone when the directory was removed; nothing to undo then.
            let _ = inotify::remove_watch(&self.fd, wd);
        }
    }
}

/// Batches of changes a watch thread may have handed on that nobody took yet; past it the
/// thread waits, and inotify's own queue takes the rest (its overflow ends the watch).
const BATCHES: usize = 16;

/// A watch running on a thread of its own, which waits on inotify (and on a stop signal) with
/// `poll` and hands changes over a bounded channel. A thread, not the async reactor: tokio
/// registers a raw descriptor only through an `unsafe` call, and a watcher is long-lived and
/// bounded in number ([`super::FsLimits::max_watchers`]). Dropping this stops the thread.
#[derive(Debug)]
pub(crate) struct Running {
    rx: mpsc::Receiver<Result<Vec<Change>, ConnectError>>,
    stop: OwnedFd,
    root: PathBuf,
}

impl Running {
    /// Moves `watch` onto its thread.
    pub(crate) fn start(watch: Watch) -> Result<Running, ConnectError> {
        let stop = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| watch_error("error creating the watcher's stop signal", e))?;
        let stop_seen = stop
            .try_clone()
            .map_err(|e| super::ops::internal("error creating the watcher's stop signal", &e))?;
        let (tx, rx) = mpsc::channel(BATCHES);
        let root = watch.root.clone();
        std::thread::Builder::new()
            .name("agent-watch".into())
            .stack_size(256 * 1024)
            .spawn(move || run(watch, &stop_seen, &tx))
            .map_err(|e| {
                ConnectError::new(
                    Code::ResourceExhausted,
                    format!("cannot start a watcher thread: {e}"),
                )
            })?;
        Ok(Running { rx, stop, root })
    }

    /// The watched directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The next changes. Cancel-safe.
    pub(crate) async fn changes(&mut self) -> Result<Vec<Change>, ConnectError> {
        match self.rx.recv().await {
            Some(batch) => batch,
            None => Err(ConnectError::new(Code::Internal, "the watcher stopped")),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Wakes the thread's poll; it then ends and closes the inotify instance. Failing to
        // write (the counter is full) means a stop is already pending.
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
    }
}

fn run(mut watch: Watch, stop: &OwnedFd, tx: &mpsc::Sender<Result<Vec<Change>, ConnectError>>) {
    use rustix::event::{PollFd, PollFlags};
    loop {
        let (ready, stopped) = {
            let mut fds = [
                PollFd::new(&watch.fd, PollFlags::IN),
                PollFd::new(stop, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => {
                    let _ = tx.blocking_send(Err(watch_error("watcher error", e)));
                    return;
                }
            }
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
        };
        if stopped || tx.is_closed() {
            return;
        }
        if !ready {
            continue;
        }
        match watch.read() {
            Ok(changes) if changes.is_empty() => {}
            Ok(changes) => {
                if tx.blocking_send(Ok(changes)).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    }
}

#[derive(Debug)]
struct RawEvent {
    wd: i32,
    mask: ReadFlags,
    name: Option<OsString>,
}

fn watch_error(what: &str, e: Errno) -> ConnectError {
    match e {
        // The per-user inotify instance or watch limit (`fs.inotify.max_user_*`).
        Errno::NOSPC | Errno::MFILE => ConnectError::new(
            Code::ResourceExhausted,
            format!("{what}: the system's inotify limit is reached: {e}"),
        ),
        Errno::NOENT => ConnectError::new(Code::NotFound, format!("{what}: {e}")),
        _ => ConnectError::new(Code::Internal, format!("{what}: {e}")),
    }
}

/// The most entries of a directory that appeared in a recursive watch reported as created
/// (a large tree moved in is otherwise reported by its top directory alone).
const MAX_FOUND: usize = 10_000;

/// Adds a watch for every directory below `dir` (whose path relative to the root is `rel`;
/// `dir` itself is already watched when it is the root, and is added here otherwise), without
/// following symlinks. With `found`, the entries below are pushed on it (relative paths, in
/// order, parents first), at most [`MAX_FOUND`].
fn add_tree(
    fd: &OwnedFd,
    dir: &Path,
    rel: &Path,
    dirs: &mut HashMap<i32, PathBuf>,
    max_watches: usize,
    mut found: Option<&mut Vec<PathBuf>>,
) -> Result<(), ConnectError> {
    let mut pending = vec![(dir.to_path_buf(), rel.to_path_buf())];
    while let Some((on_disk, rel)) = pending.pop() {
        if !rel.as_os_str().is_empty() {
            if dirs.len() >= max_watches {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("more than {max_watches} directories to watch"),
                ));
            }
            let wd = inotify::add_watch(fd, &on_disk, MASK | WatchFlags::DONT_FOLLOW)
                .map_err(|e| watch_error("error adding a subdirectory to the watcher", e))?;
            dirs.insert(wd, rel.clone());
        }
        let read = match std::fs::read_dir(&on_disk) {
            Ok(read) => read,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(super::ops::internal("error reading directory", &e)),
        };
        let mut children: Vec<_> = read.flatten().collect();
        children.sort_by_key(std::fs::DirEntry::file_name);
        for child in children.into_iter().rev() {
            let child_rel = rel.join(child.file_name());
            if let Some(found) = found.as_deref_mut()
                && found.len() < MAX_FOUND
            {
                found.push(child_rel.clone());
            }
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push((child.path(), child_rel));
            }
        }
    }
    if let Some(found) = found {
        found.sort();
    }
    Ok(())
}

/// The envd event for a change, with its entry when asked for (create, write and chmod only:
/// the path of a removed or renamed entry may already hold something else).
fn describe(root: &Path, changes: Vec<Change>, names: Option<&mut Names>) -> Vec<FilesystemEvent> {
    let mut names = names;
    changes
        .into_iter()
        .map(|c| {
            let entry = match (&mut names, c.kind) {
                (Some(names), EventType::Create | EventType::Write | EventType::Chmod) => {
                    entry_info(&root.join(&c.name), names).ok()
                }
                _ => None,
            };
            FilesystemEvent {
                name: if c.name.as_os_str().is_empty() {
                    ".".to_owned()
                } else {
                    c.name.to_string_lossy().into_owned()
                },
                r#type: c.kind,
                entry,
            }
        })
        .collect()
}

/// Turns changes into events on the blocking pool (attaching entries reads the disk).
async fn describe_blocking(
    root: PathBuf,
    changes: Vec<Change>,
    include_entry: Option<AccountFiles>,
) -> Vec<FilesystemEvent> {
    if let Some(accounts) = include_entry {
        let fallback = changes.clone();
        let root_for_fallback = root.clone();
        match tokio::task::spawn_blocking(move || {
            describe(&root, changes, Some(&mut Names::new(accounts)))
        })
        .await
        {
            Ok(events) => events,
            // The blocking pool is shutting down: the events without entries still tell the
            // truth.
            Err(_) => describe(&root_for_fallback, fallback, None),
        }
    } else {
        describe(&root, changes, None)
    }
}

/// A `WatchDir` stream: `start` first, then `filesystem` events and `keepalive`s, ending with
/// an error only when the watch breaks. Dropping it stops the watcher.
#[derive(Debug)]
pub struct WatchDirStream {
    rx: mpsc::Receiver<Result<WatchDirResponse, ConnectError>>,
}

impl WatchDirStream {
    /// The next message, or `None` once the watch ended (after its error, if any).
    pub async fn next(&mut self) -> Option<Result<WatchDirResponse, ConnectError>> {
        self.rx.recv().await
    }
}

impl futures_util::Stream for WatchDirStream {
    type Item = Result<WatchDirResponse, ConnectError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

fn message(event: Event) -> WatchDirResponse {
    WatchDirResponse { event: Some(event) }
}

/// Starts the task behind a [`WatchDirStream`].
pub(crate) fn stream(
    watch: Running,
    keepalive: Duration,
    include_entry: Option<AccountFiles>,
    permit: OwnedSemaphorePermit,
) -> WatchDirStream {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(run_stream(watch, tx, keepalive, include_entry, permit));
    WatchDirStream { rx }
}

async fn run_stream(
    mut watch: Running,
    tx: mpsc::Sender<Result<WatchDirResponse, ConnectError>>,
    keepalive: Duration,
    include_entry: Option<AccountFiles>,
    _permit: OwnedSemaphorePermit,
) {
    if tx
        .send(Ok(message(Event::Start(StartEvent {}))))
        .await
        .is_err()
    {
        return;
    }
    // A zero interval would spin; tokio refuses it outright.
    let keepalive = keepalive.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = tx.closed() => return,
            _ = ticker.tick() => {
                if tx.send(Ok(message(Event::Keepalive(KeepAlive {})))).await.is_err() {
                    return;
                }
            }
            changes = watch.changes() => match changes {
                Ok(changes) => {
                    let events =
                        describe_blocking(watch.root().to_path_buf(), changes, include_entry.clone())
                            .await;
                    for event in events {
                        if tx.send(Ok(message(Event::Filesystem(event)))).await.is_err() {
                            return;
                        }
                    }
                    ticker.reset();
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            },
        }
    }
}

/// What a polled watcher has gathered since it was last drained.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    events: Vec<FilesystemEvent>,
    dropped: usize,
    error: Option<ConnectError>,
}

impl Gathered {
    /// Everything since the last call. A broken watch answers its error on every call; a
    /// queue that overflowed answers `resource_exhausted` once (the events it held are
    /// discarded: the client must look again anyway), then gathers afresh.
    pub(crate) fn drain(
        &mut self,
        max_events: usize,
    ) -> Result<Vec<FilesystemEvent>, ConnectError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if self.dropped > 0 {
            let dropped = std::mem::take(&mut self.dropped);
            self.events.clear();
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "{dropped} events were dropped: a watcher keeps at most {max_events} between two calls"
                ),
            ));
        }
        Ok(std::mem::take(&mut self.events))
    }
}

/// A watcher started by `CreateWatcher`: its task gathers events until it is removed.
#[derive(Debug)]
pub(crate) struct Polled {
    pub(crate) gathered: Arc<Mutex<Gathered>>,
    task: tokio::task::JoinHandle<()>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Polled {
    fn drop(&mut self) {
        // The task owns the inotify instance; ending it closes the descriptor.
        self.task.abort();
    }
}

/// Starts a polled watcher over `watch`.
pub(crate) fn polled(
    mut watch: Running,
    include_entry: Option<AccountFiles>,
    max_events: usize,
    permit: OwnedSemaphorePermit,
) -> Polled {
    let gathered = Arc::new(Mutex::new(Gathered::default()));
    let sink = Arc::clone(&gathered);
    let task = tokio::spawn(async move {
        loop {
            let changes = watch.changes().await;
            let events = match changes {
                Ok(changes) => {
                    describe_blocking(watch.root().to_path_buf(), changes, include_entry.clone())
                        .await
                }
                Err(e) => {
                    if let Ok(mut g) = sink.lock() {
                        g.error = Some(e);
                    }
                    return;
                }
            };
            let Ok(mut g) = sink.lock() else {
                return;
            };
            for event in events {
                if g.events.len() < max_events {
                    g.events.push(event);
                } else {
                    g.dropped += 1;
                }
            }
        }
    });
    Polled {
        gathered,
        task,
        _permit: permit,
    }
}

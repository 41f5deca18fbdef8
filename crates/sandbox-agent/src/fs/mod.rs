//! envd's `filesystem.Filesystem` Connect service, as plain async methods over the
//! `sandbox-envd` message types. The HTTP server decodes a request, resolves the caller's user
//! (Basic auth, else the default user), and calls one of these; each answers the response
//! message or the Connect error to send.
//!
//! The calls the router makes (`fs` is one [`Filesystem`] shared by every request, `caller` a
//! [`Caller`] for the request's user, `keepalive` the `Keepalive-Ping-Interval` header's
//! seconds, 90 when absent or invalid):
//!
//! ```text
//! Stat             fs.stat(&caller, StatRequest)                      -> Result<StatResponse, ConnectError>
//! MakeDir          fs.make_dir(&caller, MakeDirRequest)               -> Result<MakeDirResponse, ConnectError>
//! Move             fs.move_entry(&caller, MoveRequest)                -> Result<MoveResponse, ConnectError>
//! ListDir          fs.list_dir(&caller, ListDirRequest)               -> Result<ListDirResponse, ConnectError>
//! Remove           fs.remove(&caller, RemoveRequest)                  -> Result<RemoveResponse, ConnectError>
//! WatchDir         fs.watch_dir(&caller, WatchDirRequest, keepalive)  -> Result<WatchDirStream, ConnectError>
//! CreateWatcher    fs.create_watcher(&caller, CreateWatcherRequest)   -> Result<CreateWatcherResponse, ConnectError>
//! GetWatcherEvents fs.get_watcher_events(GetWatcherEventsRequest)     -> Result<GetWatcherEventsResponse, ConnectError>
//! RemoveWatcher    fs.remove_watcher(RemoveWatcherRequest)            -> Result<RemoveWatcherResponse, ConnectError>
//! ```
//!
//! An `Err` from `watch_dir` is the stream's only message (sent as its end-of-stream error); a
//! [`WatchDirStream`] yields `start` first, then events and keep-alives, and at most one
//! `Err` as its last item. Dropping the stream stops its watcher.
//!
//! Semantics follow envd (the in-repo `docs/envd.md`, "Filesystem semantics"); paths resolve
//! as [`path::resolve`] says; what the agent creates belongs to the caller's user
//! ([`path::Owner`]). Every bound is a field of [`FsLimits`] with a named default.

mod entry;
pub mod metadata;
mod ops;
pub mod path;
pub mod reserved;
mod watch;

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_envd::filesystem::{
    CreateWatcherRequest, CreateWatcherResponse, GetWatcherEventsRequest, GetWatcherEventsResponse,
    ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse,
    RemoveRequest, RemoveResponse, RemoveWatcherRequest, RemoveWatcherResponse, StatRequest,
    StatResponse, WatchDirRequest,
};
use sandbox_envd::{Code, ConnectError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use self::entry::Names;
use self::path::Owner;
use self::reserved::{Refusal, Reserved};
pub use self::watch::WatchDirStream;
use crate::users::{AccountFiles, User};

/// Default for [`FsLimits::max_watchers`]: each watcher is an inotify instance, and Linux's
/// default allows 128 per user.
pub const DEFAULT_MAX_WATCHERS: usize = 64;
/// Default for [`FsLimits::max_watcher_events`].
pub const DEFAULT_MAX_WATCHER_EVENTS: usize = 10_000;
/// Default for [`FsLimits::max_watches_per_watcher`]: Linux's historical default of
/// `fs.inotify.max_user_watches`.
pub const DEFAULT_MAX_WATCHES_PER_WATCHER: usize = 8192;
/// Default for [`FsLimits::max_list_entries`].
pub const DEFAULT_MAX_LIST_ENTRIES: usize = 20_000;
/// Default for [`FsLimits::max_list_bytes`]: under the message size the envd client accepts,
/// so a listing the agent sends is one the client can read.
pub const DEFAULT_MAX_LIST_BYTES: usize = sandbox_envd::envelope::DEFAULT_MAX_MESSAGE_SIZE - 4096;
/// The keep-alive interval envd uses when a request names none.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// The bounds of the filesystem service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsLimits {
    /// Concurrent watchers, `WatchDir` streams and polled watchers together; one more is
    /// `resource_exhausted`.
    pub max_watchers: usize,
    /// Events a polled watcher keeps between two `GetWatcherEvents` calls.
    pub max_watcher_events: usize,
    /// Directories one recursive watcher watches.
    pub max_watches_per_watcher: usize,
    /// Entries in one `ListDir` answer.
    pub max_list_entries: usize,
    /// Approximate JSON size of one `ListDir` answer.
    pub max_list_bytes: usize,
}

impl Default for FsLimits {
    fn default() -> Self {
        FsLimits {
            max_watchers: DEFAULT_MAX_WATCHERS,
            max_watcher_events: DEFAULT_MAX_WATCHER_EVENTS,
            max_watches_per_watcher: DEFAULT_MAX_WATCHES_PER_WATCHER,
            max_list_entries: DEFAULT_MAX_LIST_ENTRIES,
            max_list_bytes: DEFAULT_MAX_LIST_BYTES,
        }
    }
}

/// Who a call runs as: the user selected for the request, and the agent's default working
/// directory (an empty path means it; without one, the user's home).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: User,
    pub default_workdir: Option<PathBuf>,
}

impl Caller {
    fn resolve(&self, path: &str) -> Result<PathBuf, ConnectError> {
        path::resolve(path, &self.user, self.default_workdir.as_deref())
            .map_err(|e| ConnectError::new(Code::InvalidArgument, e.0))
    }
}

/// The filesystem service: its limits, the account files owner names come from, and the
/// polled watchers. Cheap to clone; clones share the watchers.
#[derive(Debug, Clone)]
pub struct Filesystem {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    accounts: AccountFiles,
    limits: FsLimits,
    /// Trees no call touches, judged where a path resolves.
    reserved: Reserved,
    /// One permit per live watcher of either kind.
    watch_permits: Arc<Semaphore>,
    watchers: Mutex<HashMap<String, watch::Polled>>,
    ids: (std::collections::hash_map::RandomState, AtomicU64),
}

impl Filesystem {
    /// The service, naming owners from `accounts`, with nothing reserved.
    pub fn new(accounts: AccountFiles, limits: FsLimits) -> Self {
        Self::with_reserved(accounts, limits, Reserved::default())
    }

    /// The service, refusing every call on a path in `reserved` (`permission_denied`; see
    /// [`reserved`]).
    pub fn with_reserved(accounts: AccountFiles, limits: FsLimits, reserved: Reserved) -> Self {
        Filesystem {
            inner: Arc::new(Inner {
                accounts,
                limits,
                reserved,
                // A larger count than the semaphore holds would panic; no machine runs that many.
                watch_permits: Arc::new(Semaphore::new(
                    limits.max_watchers.min(Semaphore::MAX_PERMITS),
                )),
                watchers: Mutex::new(HashMap::new()),
                ids: Default::default(),
            }),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> FsLimits {
        self.inner.limits
    }

    /// Runs `f` on the blocking pool with a fresh owner-name cache.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Names) -> Result<T, ConnectError> + Send + 'static,
    ) -> Result<T, ConnectError> {
        let accounts = self.inner.accounts.clone();
        tokio::task::spawn_blocking(move || f(&mut Names::new(accounts)))
            .await
            .map_err(|e| ConnectError::new(Code::Internal, format!("the call was lost: {e}")))?
    }

    /// `Stat`: the entry at a path; `not_found` when there is none.
    pub async fn stat(
        &self,
        caller: &Caller,
        request: StatRequest,
    ) -> Result<StatResponse, ConnectError> {
        let path = caller.resolve(&request.path)?;
        let reserved = self.inner.reserved.clone();
        let entry = self
            .blocking(move |names| {
                check(&reserved, &path)?;
                ops::stat(&path, names)
            })
            .await?;
        Ok(StatResponse { entry: Some(entry) })
    }

    /// `MakeDir`: creates a directory and its parents, owned by the caller's user; an existing
    /// directory is `already_exists`, an existing non-directory `invalid_argument`.
    pub async fn make_dir(
        &self,
        caller: &Caller,
        request: MakeDirRequest,
    ) -> Result<MakeDirResponse, ConnectError> {
        let path = caller.resolve(&request.path)?;
        let owner = Owner::of(&caller.user);
        let reserved = self.inner.reserved.clone();
        let entry = self
            .blocking(move |names| {
                check(&reserved, &path)?;
                ops::make_dir(&path, owner, names)
            })
            .await?;
        Ok(MakeDirResponse { entry: Some(entry) })
    }

    /// `Move`: renames, creating the destination's parent; a missing source is `not_found`.
    pub async fn move_entry(
        &self,
        caller: &Caller,
        request: MoveRequest,
    ) -> Result<MoveResponse, ConnectError> {
        let source = caller.resolve(&request.source)?;
        let destination = caller.resolve(&request.destination)?;
        let owner = Owner::of(&caller.user);
        let reserved = self.inner.reserved.clone();
        let entry = self
            .blocking(move |names| {
                check(&reserved, &source)?;
                check(&reserved, &destination)?;
                ops::move_path(&source, &destination, owner, names)
            })
            .await?;
        Ok(MoveResponse { entry: Some(entry) })
    }

    /// `ListDir`: the descendants up to `depth` levels (0 means 1); `not_found` for a missing
    /// directory, `invalid_argument` for a non-directory, `resource_exhausted` past the
    /// listing bounds.
    pub async fn list_dir(
        &self,
        caller: &Caller,
        request: ListDirRequest,
    ) -> Result<ListDirResponse, ConnectError> {
        let path = caller.resolve(&request.path)?;
        let limits = self.inner.limits;
        let bounds = ops::ListBounds {
            max_entries: limits.max_list_entries,
            max_bytes: limits.max_list_bytes,
        };
        let reserved = self.inner.reserved.clone();
        let entries = self
            .blocking(move |names| {
                check(&reserved, &path)?;
                ops::list_dir(&path, request.depth, bounds, &reserved, names)
            })
            .await?;
        Ok(ListDirResponse { entries })
    }

    /// `Remove`: removes a path recursively; a missing path is not an error.
    pub async fn remove(
        &self,
        caller: &Caller,
        request: RemoveRequest,
    ) -> Result<RemoveResponse, ConnectError> {
        let path = caller.resolve(&request.path)?;
        let reserved = self.inner.reserved.clone();
        self.blocking(move |_| {
            check(&reserved, &path)?;
            ops::remove_pinned(&path, &reserved)
        })
        .await?;
        Ok(RemoveResponse {})
    }

    fn watch_permit(&self) -> Result<OwnedSemaphorePermit, ConnectError> {
        Arc::clone(&self.inner.watch_permits)
            .try_acquire_owned()
            .map_err(|_| {
                ConnectError::new(
                    Code::ResourceExhausted,
                    format!(
                        "{} watchers are running, the most the agent allows; remove one first",
                        self.inner.limits.max_watchers
                    ),
                )
            })
    }

    async fn open_watch(
        &self,
        caller: &Caller,
        path: &str,
        recursive: bool,
        allow_network_mounts: bool,
    ) -> Result<(watch::Running, OwnedSemaphorePermit), ConnectError> {
        let root = caller.resolve(path)?;
        let permit = self.watch_permit()?;
        let max = self.inner.limits.max_watches_per_watcher;
        let reserved = self.inner.reserved.clone();
        let running = self
            .blocking(move |_| {
                check(&reserved, &root)?;
                watch::check_root(&root, allow_network_mounts)?;
                watch::Running::start(watch::Watch::open(root, recursive, max)?)
            })
            .await?;
        Ok((running, permit))
    }

    /// `WatchDir`: a stream of the directory's changes (see the module docs). The watch is
    /// established before this returns, so a change made after it is seen.
    pub async fn watch_dir(
        &self,
        caller: &Caller,
        request: WatchDirRequest,
        keepalive: Duration,
    ) -> Result<WatchDirStream, ConnectError> {
        let (watch, permit) = self
            .open_watch(
                caller,
                &request.path,
                request.recursive,
                request.allow_network_mounts,
            )
            .await?;
        let include = request.include_entry.then(|| self.inner.accounts.clone());
        Ok(watch::stream(watch, keepalive, include, permit))
    }

    /// `CreateWatcher`: starts a polled watcher and answers its id. The watch is established
    /// before this returns.
    pub async fn create_watcher(
        &self,
        caller: &Caller,
        request: CreateWatcherRequest,
    ) -> Result<CreateWatcherResponse, ConnectError> {
        let (watch, permit) = self
            .open_watch(
                caller,
                &request.path,
                request.recursive,
                request.allow_network_mounts,
            )
            .await?;
        let include = request.include_entry.then(|| self.inner.accounts.clone());
        let polled = watch::polled(watch, include, self.inner.limits.max_watcher_events, permit);
        let mut watchers = self.watchers()?;
        let id = loop {
            let (keys, counter) = &self.inner.ids;
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let id = format!("w{:016x}", keys.hash_one(n));
            if !watchers.contains_key(&id) {
                break id;
            }
        };
        watchers.insert(id.clone(), polled);
        Ok(CreateWatcherResponse { watcher_id: id })
    }

    /// `GetWatcherEvents`: the events since the previous call (see [`FsLimits`] for the
    /// bound); an unknown id is `not_found`.
    pub async fn get_watcher_events(
        &self,
        request: GetWatcherEventsRequest,
    ) -> Result<GetWatcherEventsResponse, ConnectError> {
        let gathered = {
            let watchers = self.watchers()?;
            let polled = watchers
                .get(&request.watcher_id)
                .ok_or_else(|| unknown_watcher(&request.watcher_id))?;
            Arc::clone(&polled.gathered)
        };
        let mut gathered = gathered
            .lock()
            .map_err(|_| ConnectError::new(Code::Internal, "the watcher's state is poisoned"))?;
        let events = gathered.drain(self.inner.limits.max_watcher_events)?;
        Ok(GetWatcherEventsResponse { events })
    }

    /// `RemoveWatcher`: stops a polled watcher; an unknown id is `not_found`.
    pub async fn remove_watcher(
        &self,
        request: RemoveWatcherRequest,
    ) -> Result<RemoveWatcherResponse, ConnectError> {
        let removed = self.watchers()?.remove(&request.watcher_id);
        match removed {
            // Dropping it ends its task and frees its permit.
            Some(polled) => {
                drop(polled);
                Ok(RemoveWatcherResponse {})
            }
            None => Err(unknown_watcher(&request.watcher_id)),
        }
    }

    fn watchers(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<String, watch::Polled>>, ConnectError> {
        self.inner
            .watchers
            .lock()
            .map_err(|_| ConnectError::new(Code::Internal, "the watcher table is poisoned"))
    }
}

/// Refuses a path in a reserved tree: `permission_denied` (`internal` when where it resolves
/// cannot be read back).
fn check(reserved: &Reserved, path: &std::path::Path) -> Result<(), ConnectError> {
    reserved.check_path(path).map_err(refusal)
}

pub(crate) fn refusal(refusal: Refusal) -> ConnectError {
    match refusal {
        Refusal::Reserved(m) => ConnectError::new(Code::PermissionDenied, m),
        Refusal::Unknown(m) => ConnectError::new(Code::Internal, m),
    }
}

fn unknown_watcher(id: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("watcher with id {id} not found"))
}

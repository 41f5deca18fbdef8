//! The binding store port: the authoritative session → sandbox mapping and the per-session
//! lifecycle lock, plus the optional turn leases, rewind lock and background-activity registry.
//!
//! Stores fail closed: every backend error propagates as an [`Error`] (kind `unavailable` for a
//! store that cannot be reached); nothing ever degrades to "unbound", because an unbound
//! session gets a new sandbox, and a second sandbox for a session is exactly the bug this
//! component exists to prevent.
//!
//! - `[errors.origin]` Every error a store returns, from any method of these traits or of a
//!   lock it handed out, has origin [`Origin::Store`](crate::error::Origin::Store), whoever
//!   built it (core's binding validation included). That origin, not the operation's name, is
//!   what makes the service answer `store_unavailable` and count a store error.
//!
//! Contract bullets the store conformance suite in `sandbox-testkit` checks carry a tag in
//! brackets, cited by its cases; `cargo xtask tidy` (rule `contract-tags`) keeps both in step.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::binding::{Binding, BindingKey};
use crate::error::{Error, Operation};
use crate::ids::{ConfigId, SandboxId, SessionId, TenantId};
use crate::ownership::OwnershipToken;
use crate::provider::Provider;
use crate::secret::Secret;
use crate::timefmt;

/// Persists bindings and serialises lifecycle transitions of each session.
/// - `[tenant.isolated]` A tenant's operations never see, change or count another tenant's
///   bindings, even one under the same session ID.
#[async_trait]
pub trait BindingStore: Send + Sync + fmt::Debug {
    /// The current binding, `None` when the session is unbound.
    /// - `[get.malformed]` A stored value that fails to decode or validate against `key` is an
    ///   error, never `None`.
    /// - `[get.round_trip]` A stored binding reads back exactly, every field, timestamps to the
    ///   nanosecond.
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error>;

    /// Stores `binding` only if `key` is unbound (create-if-absent), with no expiry.
    /// Returns whether it was stored.
    /// - `[create.absent]` A second create for the same key returns `false` and changes
    ///   nothing.
    /// - `[create.validate]` A binding whose identity differs from `key` is refused with
    ///   `invalid_request`.
    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error>;

    /// Deletes the binding only while it names `provider` and `sandbox` (compare-and-delete).
    /// Returns whether it deleted.
    /// - `[delete.match]` A binding naming another provider or sandbox is left as it is, and
    ///   the call returns `false`.
    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error>;

    /// Patches the traffic token.
    /// - `[token.patch]` Only while the binding still names `expected`'s provider and sandbox,
    ///   touching no other field (a concurrent stale mark survives). An empty token, or one
    ///   equal to the stored token, changes nothing and returns `false`.
    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error>;

    /// Acquires the session's lifecycle lock, waiting (with jittered retries) until it is free.
    /// The caller's deadline is the future itself: drop it (or wrap it in a timeout) to stop
    /// waiting.
    /// - `[lock.exclusive]` At most one holder per key, across every process sharing the store;
    ///   different keys never wait for each other.
    /// - `[lock.ownership]` The returned lock's [`OwnershipToken`] trips if ownership is lost
    ///   (lease not renewed, key gone), and not merely because the caller went away.
    /// - `[lock.cancel]` Dropping the acquire future leaves no lock held beyond the store's lease.
    /// - `[lock.fail_closed]` A store that cannot be reached returns an error; no lock is
    ///   granted.
    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error>;

    /// Marks bindings of a config stale and reports what it did.
    /// - `[invalidate.marks]` Marks every binding of `(tenant, config)` stale (never deletes
    ///   anything, touches no other field) and reports how many it marked. Already-stale
    ///   bindings, other tenants, other configs and legacy bindings without a config are left
    ///   alone.
    /// - `[invalidate.locked]` Each session's lifecycle lock is waited for, up to a bounded
    ///   wait; a session whose lock could not be taken in it is reported in
    ///   [`InvalidationReport::failed`] and left unmarked, not silently skipped.
    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error>;

    /// Turn leases, when the store has them.
    /// - `[optional.fixed]` Each optional part is there or not for the store's whole life, and
    ///   alike on every instance sharing one backing.
    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        None
    }
    /// The rewind lock, when the store has it.
    fn rewind_locks(&self) -> Option<&dyn RewindLocks> {
        None
    }
    /// The background-activity registry, when the store has it.
    fn activities(&self) -> Option<&dyn ActivityRegistry> {
        None
    }
    /// Lock-free reads for the resolve fast path, when the store offers them.
    fn optimistic_reads(&self) -> Option<&dyn OptimisticReads> {
        None
    }
}

/// What the resolve fast path reads in one go, without the lifecycle lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolveSnapshot {
    /// The binding, `None` when unbound.
    pub binding: Option<Binding>,
    /// The locked path would write to the session's turn lease: its rebuild is unspent, or the
    /// lease is past half its life and a resolve would re-arm it.
    pub turn_needs_write: bool,
}

/// Reads that let a resolve of an already-bound session skip the lifecycle lock. They never
/// write; a caller uses the fast path only when the snapshot leaves nothing to write (bound, not
/// stale, no turn-lease write due) and falls back to the locked path on any doubt.
#[async_trait]
pub trait OptimisticReads: Send + Sync {
    /// The binding and the turn lease's state, read together (one round trip where the
    /// backing allows it) and without side effects.
    /// - Never writes, re-arms or creates anything. (Untagged: no port call can tell a write that
    ///   changed nothing from none; each store's own tests count its writes, as the Redis
    ///   store's `tests/redis_round_trips.rs` does.)
    /// - `[get.malformed]` As `get`: a stored value that fails to decode is an error.
    async fn read_for_resolve(&self, key: &BindingKey) -> Result<ResolveSnapshot, Error>;
}

/// A held lifecycle lock.
///
/// Release it with [`LifecycleLock::release`] to learn whether ownership held to the end.
/// Dropping it also releases (a store whose release needs I/O spawns it), so a cancelled holder
/// never keeps a session locked longer than the store's lease.
pub struct LifecycleLock {
    ownership: OwnershipToken,
    release: Box<dyn LockRelease>,
}

impl LifecycleLock {
    /// Wraps a store's release handle and the token that observes ownership.
    pub fn new(ownership: OwnershipToken, release: Box<dyn LockRelease>) -> Self {
        LifecycleLock { ownership, release }
    }
    /// The ownership token; clone it into cleanup that must outlive the caller.
    pub fn ownership(&self) -> &OwnershipToken {
        &self.ownership
    }
    /// Releases the lock. Errors when ownership had been lost while held (so the work done
    /// under it may have raced another holder) or the store could not release.
    pub async fn release(self) -> Result<(), Error> {
        self.ownership.check()?;
        self.release.release().await
    }
    /// Splits the lock into its parts, for decorators that wrap the release.
    pub fn into_parts(self) -> (OwnershipToken, Box<dyn LockRelease>) {
        (self.ownership, self.release)
    }
}

impl fmt::Debug for LifecycleLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LifecycleLock")
            .field("ownership", &self.ownership)
            .finish_non_exhaustive()
    }
}

/// A store's way of releasing one held lock. Implementations also release on `Drop` when
/// `release` was never called.
#[async_trait]
pub trait LockRelease: Send + Sync {
    /// Releases the lock (compare-and-delete on the holder's token).
    async fn release(self: Box<Self>) -> Result<(), Error>;
}

/// What [`BindingStore::invalidate_by_config`] did.
#[derive(Debug, Default)]
pub struct InvalidationReport {
    /// Bindings newly marked stale.
    pub marked: usize,
    /// Sessions that could not be marked, with why.
    pub failed: Vec<(SessionId, Error)>,
}

/// The state of a session's chat-turn lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TurnState {
    /// A turn (or live background work) holds the session.
    pub active: bool,
    /// The turn's one allowed rebuild of a stale sandbox has not been spent yet.
    pub may_rebuild: bool,
}

/// Chat-turn leases: a stale sandbox is rebuilt at most once per turn, at its first resolve, so
/// an image change landing mid-turn cannot tear the sandbox down under the running turn.
/// - `[turn.lease]` Holds nest: the first begin opens the turn with its one rebuild, consume
///   spends it, the last end closes the turn, and the next turn gets a rebuild again.
/// - `[turn.absent]` On a session without a lease, consume and end do nothing: they create no
///   lease and leave no count behind.
/// - `[turn.expiry]` A lease lives for the store's turn TTL after the last begin, state read
///   or consume (each re-arms it) and then lapses, so a turn whose caller vanished stops
///   blocking rebuilds.
#[async_trait]
pub trait TurnLeases: Send + Sync {
    /// Opens one turn hold (a counter). The first hold allows one rebuild.
    /// - `[turn.rewind_locked]` Refused with code `session_rewind_locked` while a rewind holds
    ///   the session, leaving no turn behind.
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error>;
    /// Releases one hold; the last release drops the lease.
    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error>;
    /// Whether a turn is open and may still rebuild. Live background work counts as an open
    /// turn that may not rebuild.
    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error>;
    /// Spends the turn's rebuild. On a session without a lease it does nothing (and creates no
    /// lease).
    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error>;
}

/// The exclusive rewind lock of a session.
#[async_trait]
pub trait RewindLocks: Send + Sync {
    /// Takes the rewind lock.
    /// - `[rewind.exclusive]` Refused with code `session_rewind_locked` when another rewind,
    ///   from any instance, holds it; `has_rewind_lock` sees it; it is free again after
    ///   `release` and after a drop.
    /// - `[rewind.refusals]` Refused with code `session_turn_active` while a turn is open (even
    ///   a spent one) and `session_work_active` while background work is live.
    /// - `[rewind.kept_alive]` The store keeps it alive (renewing it, re-acquiring it with the
    ///   same token after a transient error) until released, however long that is.
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error>;
    /// Whether a rewind holds the session.
    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error>;
}

/// A held rewind lock; released by [`RewindLock::release`] or on drop.
pub struct RewindLock {
    release: Box<dyn LockRelease>,
}

impl RewindLock {
    /// Wraps a store's release handle.
    pub fn new(release: Box<dyn LockRelease>) -> Self {
        RewindLock { release }
    }
    /// Releases the lock.
    pub async fn release(self) -> Result<(), Error> {
        self.release.release().await
    }
}

impl fmt::Debug for RewindLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RewindLock")
    }
}

/// One piece of background work running in a session outside any chat turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundActivity {
    /// Unique within the session.
    pub id: String,
    /// What kind of work (`shell_job`, `desktop`, ...); caps apply per kind.
    pub kind: String,
    pub started_at: OffsetDateTime,
}

impl BackgroundActivity {
    /// What every activity registry checks before it registers `self`: a non-blank id and
    /// kind, and a start time the wire format can carry. Refusals are `invalid_request` on
    /// operation `add_activity`; a store only adds its origin.
    pub fn validate(&self) -> Result<(), Error> {
        let operation = Operation::new("add_activity");
        if self.id.trim().is_empty() || self.kind.trim().is_empty() {
            return Err(Error::invalid_request(
                operation,
                "a background activity needs an id and a kind",
            ));
        }
        timefmt::format(self.started_at)
            .map_err(|e| Error::invalid_request(operation, e.message().to_owned()))?;
        Ok(())
    }
}

/// Leases on background work, visible to the turn state so live work blocks rebuilds and
/// rewinds.
/// - `[activities.hold]` Live background work counts as an open turn that may not rebuild,
///   with or without a chat turn, and refuses a rewind; once it is gone the session is idle.
#[async_trait]
pub trait ActivityRegistry: Send + Sync {
    /// Registers `activity` for `lease`.
    /// - `[activities.add]` Refused with `capacity` when the session already has `kind_cap`
    ///   live activities of the same kind (other kinds do not count); re-adding a registered
    ///   id renews it instead of taking a second slot.
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error>;
    /// Extends a lease.
    /// - `[activities.renew]` `false` when the activity is no longer registered.
    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error>;
    /// Removes an activity.
    /// - `[activities.remove]` Absent is success; a removed activity frees its slot.
    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error>;
    /// The live activities.
    /// - `[activities.list]` What was added and is still within its lease: an expired activity
    ///   is not listed, cannot be renewed and no longer counts against the cap.
    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn activity(id: &str, kind: &str) -> BackgroundActivity {
        BackgroundActivity {
            id: id.to_owned(),
            kind: kind.to_owned(),
            started_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn activity_validation_refuses_blank_names_and_unwritable_start() {
        assert!(activity("job-1", "shell_job").validate().is_ok());
        for (id, kind) in [
            ("", "shell_job"),
            ("job-1", ""),
            ("  ", "shell_job"),
            ("job-1", "\t"),
        ] {
            let err = activity(id, kind).validate().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{id:?} {kind:?}");
            assert_eq!(err.operation(), Operation::new("add_activity"));
            assert_eq!(
                err.message(),
                "a background activity needs an id and a kind"
            );
        }
        let mut far = activity("job-1", "shell_job");
        far.started_at = OffsetDateTime::new_utc(
            time::Date::from_calendar_date(-5, time::Month::January, 1).unwrap(),
            time::Time::MIDNIGHT,
        );
        let err = far.validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.operation(), Operation::new("add_activity"));
        assert_eq!(err.message(), "timestamp cannot be formatted as RFC 3339");
    }
}

//! [`MemoryBindingStore`]: the whole [`BindingStore`] port in one process, for tests and
//! explicitly configured single-process deployments.
//!
//! Its semantics mirror the Redis store's wherever they mean something in one process:
//! create-if-absent with no expiry, compare-and-delete, a token patch that
//! leaves a concurrent stale mark alone, turn leases with a refcount and one rebuild per turn,
//! an exclusive rewind lock, activity leases with a per-kind cap, and an invalidation that marks
//! under each session's lifecycle lock with a bounded wait. The binding suite in
//! `sandbox_testkit::conformance::store` holds it to the same cases as every other store.
//!
//! Clones share state: two clones are two "instances on the same backing", which is how the
//! conformance suite checks that the lock serialises across instances.
//!
//! Time: lease expiry (turn leases, rewind locks, activities) is judged by the injected
//! [`Clock`], so tests move it by hand; waits (the lifecycle lock wait of an invalidation) use
//! tokio's timer, so they follow a paused tokio clock instead.

mod lock_map;
mod state;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    ActivityRegistry, BackgroundActivity, Binding, BindingKey, BindingStore, Clock, ConfigId,
    Error, ErrorKind, InvalidationReport, LifecycleLock, LockRelease, Operation, OptimisticReads,
    Origin, OwnershipToken, Provider, ResolveSnapshot, RewindLock, RewindLocks, SandboxId, Secret,
    SystemClock, TenantId, TurnLeases, TurnState,
};
use time::OffsetDateTime;

use self::lock_map::{HeldLock, LockMap};
use self::state::{State, Ttls};

/// How long a chat-turn lease lives without being re-armed (reference: 30 min).
pub const DEFAULT_TURN_LEASE_TTL: Duration = Duration::from_secs(30 * 60);
/// The rewind lock's lease (reference: 2 min). See [`MemoryBindingStoreBuilder::rewind_ttl`].
pub const DEFAULT_REWIND_TTL: Duration = Duration::from_secs(2 * 60);
/// How long an invalidation waits for one session's lifecycle lock (reference: 2 s).
pub const DEFAULT_INVALIDATE_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Configures a [`MemoryBindingStore`].
#[derive(Debug, Clone)]
pub struct MemoryBindingStoreBuilder {
    clock: Arc<dyn Clock>,
    turn_lease_ttl: Duration,
    rewind_ttl: Duration,
    invalidate_lock_wait: Duration,
    optimistic_reads: bool,
}

impl Default for MemoryBindingStoreBuilder {
    fn default() -> Self {
        MemoryBindingStoreBuilder {
            clock: Arc::new(SystemClock),
            turn_lease_ttl: DEFAULT_TURN_LEASE_TTL,
            rewind_ttl: DEFAULT_REWIND_TTL,
            invalidate_lock_wait: DEFAULT_INVALIDATE_LOCK_WAIT,
            optimistic_reads: false,
        }
    }
}

impl MemoryBindingStoreBuilder {
    /// The clock lease expiry and stale marks are judged by (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long a turn lease lives after its last `begin_turn`, `turn_state` or
    /// `consume_turn_rebuild`. A turn whose caller vanished without `end_turn` stops blocking
    /// rebuilds and rewinds after this.
    pub fn turn_lease_ttl(mut self, ttl: Duration) -> Self {
        self.turn_lease_ttl = ttl;
        self
    }

    /// The rewind lock's lease. The Redis store renews it until unlock, so it lapses only when
    /// the holder's process dies; here the holder cannot die without the store, and dropping
    /// its [`RewindLock`] releases. So a held lock never lapses while its `RewindLock` lives
    /// (each look renews it, as the renewer would have) and this TTL only bounds a lock whose
    /// handle was leaked with `mem::forget`.
    pub fn rewind_ttl(mut self, ttl: Duration) -> Self {
        self.rewind_ttl = ttl;
        self
    }

    /// How long [`BindingStore::invalidate_by_config`] waits for each session's lifecycle lock
    /// before reporting the session in [`InvalidationReport::failed`] and moving on.
    pub fn invalidate_lock_wait(mut self, wait: Duration) -> Self {
        self.invalidate_lock_wait = wait;
        self
    }

    /// Offer [`OptimisticReads`] (the resolve fast path). Off by default: in one process a
    /// lock costs no round trip, so the fast path buys nothing; embedders and tests that want
    /// the same code path as a shared store turn it on.
    pub fn optimistic_reads(mut self, on: bool) -> Self {
        self.optimistic_reads = on;
        self
    }

    /// An empty store.
    pub fn build(self) -> MemoryBindingStore {
        MemoryBindingStore {
            inner: Arc::new(Inner {
                clock: self.clock,
                ttls: Ttls {
                    turn_lease: self.turn_lease_ttl,
                    rewind: self.rewind_ttl,
                },
                invalidate_lock_wait: self.invalidate_lock_wait,
                optimistic_reads: self.optimistic_reads,
                state: Mutex::default(),
                locks: Arc::default(),
            }),
        }
    }
}

/// The process-local binding store. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct MemoryBindingStore {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    ttls: Ttls,
    invalidate_lock_wait: Duration,
    optimistic_reads: bool,
    state: Mutex<State>,
    locks: Arc<LockMap>,
}

impl Inner {
    /// Every operation is one synchronous critical section with no await inside (the
    /// equivalent of a Lua script's atomicity). A panic inside one cannot leave a half-applied
    /// edit behind (each edit is a single map operation or field write), so a poisoned guard
    /// is recovered rather than turning one failed call into a dead store.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> OffsetDateTime {
        self.clock.now()
    }
}

impl Default for MemoryBindingStore {
    fn default() -> Self {
        MemoryBindingStore::new()
    }
}

impl MemoryBindingStore {
    /// An empty store with the default timings (those of a default builder) and the system
    /// clock.
    pub fn new() -> Self {
        MemoryBindingStoreBuilder::default().build()
    }

    /// A builder for a store with another clock or other timings.
    pub fn builder() -> MemoryBindingStoreBuilder {
        MemoryBindingStoreBuilder::default()
    }

    /// Keys whose lifecycle lock is currently held or awaited. Idle keys have no entry, so a
    /// long-lived store does not grow with every session it has ever seen.
    pub fn lock_entries(&self) -> usize {
        self.inner.locks.len()
    }

    /// Number of stored bindings.
    pub fn binding_count(&self) -> usize {
        self.inner.state().binding_count()
    }
}

impl fmt::Debug for MemoryBindingStore {
    // Sizes and settings only: bindings carry traffic tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [bindings, turn_leases, rewind_locks, activities] = self.inner.state().sizes();
        f.debug_struct("MemoryBindingStore")
            .field("bindings", &bindings)
            .field("lifecycle_locks", &self.inner.locks.len())
            .field("turn_leases", &turn_leases)
            .field("rewind_locks", &rewind_locks)
            .field("activities", &activities)
            .field("clock", &self.inner.clock)
            .field("turn_lease_ttl", &self.inner.ttls.turn_lease)
            .field("rewind_ttl", &self.inner.ttls.rewind)
            .field("invalidate_lock_wait", &self.inner.invalidate_lock_wait)
            .finish()
    }
}

/// Every error this store returns is the store's, whoever built it (core's binding
/// validation included): the service reports it as `store_*`.
fn stored(error: Error) -> Error {
    error.with_origin(Origin::Store)
}

#[async_trait]
impl BindingStore for MemoryBindingStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
        Ok(self.inner.state().get(key))
    }

    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
        // Core's storable check: the memory store refuses what a shared store could not store
        // or read back, so it is never the one place such a binding works.
        binding.check_storable(key).map_err(stored)?;
        Ok(self.inner.state().create(key, binding.clone()))
    }

    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        Ok(self.inner.state().delete_if_match(key, provider, sandbox))
    }

    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        Ok(self
            .inner
            .state()
            .replace_traffic_token(key, expected, token))
    }

    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
        let held = self.inner.locks.acquire(key).await;
        // A process-local lock has no lease to lose: it is held until released or dropped, so
        // its ownership never trips by itself.
        Ok(LifecycleLock::new(
            OwnershipToken::never_lost(),
            Box::new(LifecycleRelease { _held: held }),
        ))
    }

    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        // Listing first and re-checking under each lock is a shared store's shape too (SCAN,
        // then per key lock + get + compare); filtering here means a locked session of another
        // config is never waited for.
        let candidates = self.inner.state().invalidation_candidates(tenant, config);
        let wait = self.inner.invalidate_lock_wait;
        let mut report = InvalidationReport::default();
        for session in candidates {
            let key = BindingKey { tenant, session };
            // Marking under the lifecycle lock keeps it from landing in the middle of a
            // resolve that is rebuilding this very binding.
            let Ok(held) = tokio::time::timeout(wait, self.inner.locks.acquire(&key)).await else {
                report.failed.push((
                    key.session.clone(),
                    stored(Error::timeout(
                        Operation::new("invalidate_by_config"),
                        format!(
                            "the lifecycle lock of session {key} was still held after {} ms; its binding was not marked",
                            wait.as_millis()
                        ),
                    )),
                ));
                continue;
            };
            // The Redis store gives the mark its own 3 s budget so it never runs on the lock
            // wait's leftover time. Here the mark is one synchronous write that starts after
            // the wait is over, so no timer is needed to get the same guarantee.
            let now = self.inner.now();
            if self.inner.state().mark_stale(&key, config, now) {
                report.marked += 1;
            }
            drop(held);
        }
        Ok(report)
    }

    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        Some(self)
    }

    fn rewind_locks(&self) -> Option<&dyn RewindLocks> {
        Some(self)
    }

    fn activities(&self) -> Option<&dyn ActivityRegistry> {
        Some(self)
    }

    fn optimistic_reads(&self) -> Option<&dyn OptimisticReads> {
        self.inner
            .optimistic_reads
            .then_some(self as &dyn OptimisticReads)
    }
}

#[async_trait]
impl OptimisticReads for MemoryBindingStore {
    async fn read_for_resolve(&self, key: &BindingKey) -> Result<ResolveSnapshot, Error> {
        let now = self.inner.now();
        let (binding, turn_needs_write) = self.inner.state().snapshot(key, now, self.inner.ttls);
        Ok(ResolveSnapshot {
            binding,
            turn_needs_write,
        })
    }
}

/// Releases a lifecycle lock by being dropped (explicitly or with its [`LifecycleLock`]).
struct LifecycleRelease {
    _held: HeldLock,
}

#[async_trait]
impl LockRelease for LifecycleRelease {
    async fn release(self: Box<Self>) -> Result<(), Error> {
        drop(self);
        Ok(())
    }
}

#[async_trait]
impl TurnLeases for MemoryBindingStore {
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let now = self.inner.now();
        self.inner
            .state()
            .begin_turn(key, now, self.inner.ttls)
            .map_err(|refusal| refusal.into_error(Operation::new("begin_turn"), key))
    }

    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
        let now = self.inner.now();
        self.inner.state().end_turn(key, now);
        Ok(())
    }

    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
        let now = self.inner.now();
        Ok(self.inner.state().turn_state(key, now, self.inner.ttls))
    }

    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
        let now = self.inner.now();
        self.inner
            .state()
            .consume_turn_rebuild(key, now, self.inner.ttls);
        Ok(())
    }
}

#[async_trait]
impl RewindLocks for MemoryBindingStore {
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error> {
        let now = self.inner.now();
        // The store watches this through a weak reference: the lock counts as renewed for as
        // long as the returned handle holds it.
        let holder = Arc::new(());
        let id = self
            .inner
            .state()
            .try_lock_rewind(key, Arc::downgrade(&holder), now, self.inner.ttls)
            .map_err(|refusal| refusal.into_error(Operation::new("try_lock_rewind"), key))?;
        Ok(RewindLock::new(Box::new(RewindRelease {
            inner: self.inner.clone(),
            key: key.clone(),
            id,
            _holder: holder,
        })))
    }

    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error> {
        let now = self.inner.now();
        Ok(self.inner.state().rewind_held(key, now, self.inner.ttls))
    }
}

/// Releases one rewind hold on drop (compare-and-delete by hold id).
struct RewindRelease {
    inner: Arc<Inner>,
    key: BindingKey,
    id: u64,
    _holder: Arc<()>,
}

impl Drop for RewindRelease {
    fn drop(&mut self) {
        self.inner.state().release_rewind(&self.key, self.id);
    }
}

#[async_trait]
impl LockRelease for RewindRelease {
    async fn release(self: Box<Self>) -> Result<(), Error> {
        drop(self);
        Ok(())
    }
}

#[async_trait]
impl ActivityRegistry for MemoryBindingStore {
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error> {
        activity.validate().map_err(stored)?;
        let now = self.inner.now();
        self.inner
            .state()
            .add_activity(key, activity, lease, kind_cap, now, self.inner.ttls)
            .map_err(|live| {
                stored(Error::new(
                    ErrorKind::Capacity,
                    Operation::new("add_activity"),
                    format!(
                        "session {key} already has {live} live {:?} activities (cap {kind_cap})",
                        activity.kind
                    ),
                ))
            })
    }

    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error> {
        let now = self.inner.now();
        Ok(self.inner.state().renew_activity(key, id, lease, now))
    }

    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error> {
        self.inner.state().remove_activity(key, id);
        Ok(())
    }

    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error> {
        let now = self.inner.now();
        Ok(self.inner.state().list_activities(key, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{ErrorCode, ManualClock, TemplateId, timefmt};

    fn key(session: &str) -> BindingKey {
        BindingKey::new(9, session).unwrap()
    }

    fn binding(key: &BindingKey, sandbox: &str) -> Binding {
        Binding::new(
            key,
            Provider::Docker,
            SandboxId::new(sandbox).unwrap(),
            TemplateId::new("base").unwrap(),
            timefmt::parse("2026-05-06T07:08:09.123Z").unwrap(),
        )
    }

    #[tokio::test]
    async fn debug_never_prints_tokens() {
        let store = MemoryBindingStore::new();
        let k = key("s");
        let mut b = binding(&k, "sbx-1");
        b.traffic_token = Some(Secret::new("tok-very-secret"));
        assert!(store.create(&k, &b).await.unwrap());
        let dbg = format!("{store:?}");
        assert!(!dbg.contains("tok-very-secret"), "{dbg}");
        assert!(dbg.contains("bindings: 1"), "{dbg}");
    }

    #[tokio::test]
    async fn unstorable_bindings_are_refused() {
        let store = MemoryBindingStore::new();
        let k = key("s");
        let mut b = binding(&k, "sbx-1");
        b.created_at = OffsetDateTime::UNIX_EPOCH;
        let err = store.create(&k, &b).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        let err = store
            .create(&key("other"), &binding(&k, "sbx-1"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        assert_eq!(store.binding_count(), 0);
    }

    #[tokio::test]
    async fn idle_lock_entries_are_removed() {
        let store = MemoryBindingStore::new();
        for n in 0..100 {
            let lock = store.lock_lifecycle(&key(&format!("s{n}"))).await.unwrap();
            if n % 2 == 0 {
                lock.release().await.unwrap();
            } else {
                drop(lock);
            }
        }
        assert_eq!(store.lock_entries(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_sessions_hold_their_locks_at_once() {
        // Fifty holders meet at a barrier while holding their own session's lock: with one
        // store-wide lock this deadlocks.
        let store = MemoryBindingStore::new();
        let barrier = Arc::new(tokio::sync::Barrier::new(50));
        let tasks: Vec<_> = (0..50)
            .map(|n| {
                let store = store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let lock = store.lock_lifecycle(&key(&format!("s{n}"))).await.unwrap();
                    barrier.wait().await;
                    lock.release().await.unwrap();
                })
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(10), async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("per-key locks must not wait for each other");
        assert_eq!(store.lock_entries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_gives_up_on_a_held_lock_and_moves_on() {
        let clock = ManualClock::new(timefmt::parse("2026-06-01T00:00:00Z").unwrap());
        let store = MemoryBindingStore::builder()
            .clock(Arc::new(clock.clone()))
            .build();
        let cfg = ConfigId::new("cfg").unwrap();
        for s in ["a", "b"] {
            let k = key(s);
            let mut b = binding(&k, &format!("sbx-{s}"));
            b.config_id = Some(cfg.clone());
            store.create(&k, &b).await.unwrap();
        }
        let held = store.lock_lifecycle(&key("a")).await.unwrap();
        let started = tokio::time::Instant::now();
        let report = store
            .invalidate_by_config(TenantId::new(9).unwrap(), &cfg)
            .await
            .unwrap();
        // The paused clock auto-advances exactly through the 2 s wait.
        assert_eq!(started.elapsed(), DEFAULT_INVALIDATE_LOCK_WAIT);
        assert_eq!(report.marked, 1);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].0.as_str(), "a");
        assert_eq!(report.failed[0].1.kind(), ErrorKind::Timeout);
        assert_eq!(
            store.get(&key("b")).await.unwrap().unwrap().stale_at,
            Some(clock.now())
        );
        assert_eq!(store.get(&key("a")).await.unwrap().unwrap().stale_at, None);
        held.release().await.unwrap();
        assert_eq!(store.lock_entries(), 0);
    }

    #[tokio::test]
    async fn rewind_lock_outlives_its_ttl_while_held() {
        let clock = ManualClock::new(timefmt::parse("2026-06-01T00:00:00Z").unwrap());
        let store = MemoryBindingStore::builder()
            .clock(Arc::new(clock.clone()))
            .build();
        let k = key("s");
        let lock = store.try_lock_rewind(&k).await.unwrap();
        clock.advance(DEFAULT_REWIND_TTL * 5);
        assert!(store.has_rewind_lock(&k).await.unwrap());
        let err = store.try_lock_rewind(&k).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SessionRewindLocked));
        lock.release().await.unwrap();
        assert!(!store.has_rewind_lock(&k).await.unwrap());
        drop(store.try_lock_rewind(&k).await.unwrap());
        assert!(!store.has_rewind_lock(&k).await.unwrap());
    }
}

//! [`FaultyStore`]: a fault-injecting decorator for any [`BindingStore`].
//!
//! Lifecycle tests wrap a real store in it to prove the fail-closed rules: a store fault means
//! zero provider calls, a corrupt binding is an error and never "unbound", and a lost lifecycle
//! lock stops destructive cleanup. One wrapper serves every such test, instead of a hand-written
//! faulty store per test.
//!
//! Every call first counts itself and consults the fault table; an injected error is returned
//! *without* touching the inner store, so a test can assert that a failed call had no effect.
//! Everything else is delegated unchanged.
//!
//! An injected error is a store error whatever the test built: the wrapper sets its origin to
//! [`Origin::Store`] (`[errors.origin]`), as do the errors the wrapper makes itself (a served
//! malformed or foreign binding). Delegated errors keep the origin the inner store gave them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::error::ErrorCode;
use sandbox_core::ids::{ConfigId, SandboxId, TenantId};
use sandbox_core::ports::store::{
    ActivityRegistry, BackgroundActivity, BindingStore, InvalidationReport, LifecycleLock,
    LockRelease, RewindLock, RewindLocks, TurnLeases, TurnState,
};
use sandbox_core::{
    Binding, BindingKey, Error, Operation, Origin, OwnershipSource, Provider, Secret,
};

/// The reason a forced ownership loss reports.
const FORCED_REASON: &str = "forced by test";

/// One operation of the store port (or of its optional capabilities) that faults can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    Get,
    Create,
    DeleteIfMatch,
    ReplaceTrafficToken,
    LockLifecycle,
    /// An explicit [`LifecycleLock::release`] that reached the store (not a drop, and not a
    /// release refused earlier because ownership was already lost).
    ReleaseLifecycle,
    InvalidateByConfig,
    BeginTurn,
    EndTurn,
    TurnState,
    ConsumeTurnRebuild,
    TryLockRewind,
    HasRewindLock,
    ActivityAdd,
    ActivityRenew,
    ActivityRemove,
    ActivityList,
}

impl StoreOp {
    /// Every operation, in declaration order.
    pub const ALL: [StoreOp; 17] = [
        StoreOp::Get,
        StoreOp::Create,
        StoreOp::DeleteIfMatch,
        StoreOp::ReplaceTrafficToken,
        StoreOp::LockLifecycle,
        StoreOp::ReleaseLifecycle,
        StoreOp::InvalidateByConfig,
        StoreOp::BeginTurn,
        StoreOp::EndTurn,
        StoreOp::TurnState,
        StoreOp::ConsumeTurnRebuild,
        StoreOp::TryLockRewind,
        StoreOp::HasRewindLock,
        StoreOp::ActivityAdd,
        StoreOp::ActivityRenew,
        StoreOp::ActivityRemove,
        StoreOp::ActivityList,
    ];
}

/// What `get` finds for a key instead of asking the inner store.
#[derive(Debug, Clone)]
enum Served {
    Malformed,
    Binding(Binding),
}

/// A lifecycle lock currently held through this wrapper.
#[derive(Debug)]
struct Held {
    /// Distinguishes successive holders of the same key, so a late drop of an old holder never
    /// removes the entry of the next one.
    id: u64,
    source: OwnershipSource,
}

#[derive(Debug, Default)]
struct Faults {
    once: HashMap<StoreOp, VecDeque<Error>>,
    always: HashMap<StoreOp, Error>,
    calls: HashMap<StoreOp, usize>,
    served: HashMap<BindingKey, Served>,
    held: HashMap<BindingKey, Held>,
    lose_on_acquire: HashSet<BindingKey>,
    next_lock_id: u64,
}

impl Faults {
    /// Counts a call of `op` and returns the error injected for it, if any. One-shot errors go
    /// first, so `fail_next` can script a sequence on top of a standing `fail_always`.
    fn enter(&mut self, op: StoreOp) -> Result<(), Error> {
        *self.calls.entry(op).or_insert(0) += 1;
        if let Some(queue) = self.once.get_mut(&op)
            && let Some(err) = queue.pop_front()
        {
            if queue.is_empty() {
                self.once.remove(&op);
            }
            return Err(stored(err));
        }
        match self.always.get(&op) {
            Some(err) => Err(stored(err.clone())),
            None => Ok(()),
        }
    }

    /// Forgets the held lock `id` of `key`, if it is still the registered holder.
    fn forget_lock(&mut self, key: &BindingKey, id: u64) {
        if self.held.get(key).is_some_and(|h| h.id == id) {
            self.held.remove(key);
        }
    }
}

type Table = Arc<Mutex<Faults>>;

/// The fault table is only ever touched synchronously (never across an await), and a panic
/// while holding it can only come from a failing test thread; the table itself stays
/// consistent, so recover the guard instead of cascading the panic.
fn lock(table: &Table) -> MutexGuard<'_, Faults> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A [`BindingStore`] decorator that injects faults into any inner store.
pub struct FaultyStore {
    inner: Arc<dyn BindingStore>,
    table: Table,
    optimistic_reads: bool,
}

impl FaultyStore {
    /// Wraps `inner`; with no faults configured it behaves exactly like `inner`.
    pub fn new(inner: Arc<dyn BindingStore>) -> Self {
        FaultyStore {
            inner,
            table: Arc::default(),
            optimistic_reads: true,
        }
    }

    /// Hides the inner store's optimistic reads, so every resolve takes the locked path (what
    /// a store without the fast path does): for measuring or testing that path on a store that
    /// has one.
    pub fn without_optimistic_reads(mut self) -> Self {
        self.optimistic_reads = false;
        self
    }

    /// The wrapped store, for tests that need to observe or arrange state behind the faults.
    pub fn inner(&self) -> &Arc<dyn BindingStore> {
        &self.inner
    }

    /// The next call of `op` fails with `err` (queue: several `fail_next` calls fail successive
    /// calls).
    pub fn fail_next(&self, op: StoreOp, err: Error) {
        lock(&self.table).once.entry(op).or_default().push_back(err);
    }

    /// Every call of `op` fails with `err` until [`FaultyStore::clear`].
    pub fn fail_always(&self, op: StoreOp, err: Error) {
        lock(&self.table).always.insert(op, err);
    }

    /// Removes the injected errors (queued and standing) of `op`. Served bindings and
    /// ownership faults stay until [`FaultyStore::clear_all`].
    pub fn clear(&self, op: StoreOp) {
        let mut t = lock(&self.table);
        t.once.remove(&op);
        t.always.remove(&op);
    }

    /// Removes every fault: injected errors, served bindings and `lose_ownership_on_acquire`.
    /// Call counts and the bookkeeping of held locks are kept.
    pub fn clear_all(&self) {
        let mut t = lock(&self.table);
        t.once.clear();
        t.always.clear();
        t.served.clear();
        t.lose_on_acquire.clear();
    }

    /// `get(key)` behaves as a real store does when the stored value for `key` is corrupt: an
    /// error (kind `internal`, code `invalid_binding`), never `Ok(None)`.
    pub fn serve_malformed(&self, key: &BindingKey) {
        lock(&self.table)
            .served
            .insert(key.clone(), Served::Malformed);
    }

    /// `get(key)` finds `binding` stored under `key` even though its identity may differ; it
    /// is validated against `key` like a real store does, so a foreign binding yields
    /// [`Binding::validate`]'s error.
    pub fn serve_binding(&self, key: &BindingKey, binding: Binding) {
        lock(&self.table)
            .served
            .insert(key.clone(), Served::Binding(binding));
    }

    /// Trips the ownership token of the lifecycle lock currently held for `key` (reason
    /// "forced by test"); returns whether a held lock was found.
    pub fn force_ownership_loss(&self, key: &BindingKey) -> bool {
        let source = lock(&self.table).held.get(key).map(|h| h.source.clone());
        // Trip outside the table lock: tripping wakes the holder's waiters, which may call back
        // into this store.
        match source {
            Some(source) => {
                source.trip(FORCED_REASON);
                true
            }
            None => false,
        }
    }

    /// From now on every lock acquired for `key` has lost ownership the moment the caller gets
    /// it, until [`FaultyStore::clear_all`].
    pub fn lose_ownership_on_acquire(&self, key: &BindingKey) {
        lock(&self.table).lose_on_acquire.insert(key.clone());
    }

    /// Number of calls of `op` that reached the wrapper (injected failures included).
    pub fn calls(&self, op: StoreOp) -> usize {
        lock(&self.table).calls.get(&op).copied().unwrap_or(0)
    }

    fn enter(&self, op: StoreOp) -> Result<(), Error> {
        lock(&self.table).enter(op)
    }

    // The accessors below only hand out `self` as a capability when the inner store has it, so
    // these errors are unreachable through them; they exist so a direct call never panics.

    fn inner_turns(&self) -> Result<&dyn TurnLeases, Error> {
        self.inner
            .turn_leases()
            .ok_or_else(|| unsupported("turn_leases", "turn leases"))
    }

    fn inner_rewinds(&self) -> Result<&dyn RewindLocks, Error> {
        self.inner
            .rewind_locks()
            .ok_or_else(|| unsupported("rewind_locks", "rewind locks"))
    }

    fn inner_activities(&self) -> Result<&dyn ActivityRegistry, Error> {
        self.inner
            .activities()
            .ok_or_else(|| unsupported("activities", "background activities"))
    }
}

/// The wrapper stands for a store, so what it fails with is the store's error.
fn stored(error: Error) -> Error {
    error.with_origin(Origin::Store)
}

fn unsupported(op: &'static str, what: &str) -> Error {
    stored(Error::unsupported(
        Operation::new(op),
        format!("the wrapped store has no {what}"),
    ))
}

fn malformed(key: &BindingKey) -> Error {
    stored(
        Error::internal(
            Operation::new("get"),
            format!("malformed binding stored for {key} (injected by FaultyStore)"),
        )
        .with_code(ErrorCode::InvalidBinding),
    )
}

impl fmt::Debug for FaultyStore {
    // A summary of what is configured: ops, counts, keys and error kinds. Never the inner
    // store's state nor served bindings, which may carry traffic tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = lock(&self.table);
        let mut once: Vec<_> = t.once.iter().map(|(op, q)| (*op, q.len())).collect();
        once.sort_by_key(|(op, _)| format!("{op:?}"));
        let mut always: Vec<_> = t.always.iter().map(|(op, e)| (*op, e.kind())).collect();
        always.sort_by_key(|(op, _)| format!("{op:?}"));
        let mut served: Vec<_> = t
            .served
            .iter()
            .map(|(k, s)| {
                let what = match s {
                    Served::Malformed => "malformed",
                    Served::Binding(_) => "binding",
                };
                (k.to_string(), what)
            })
            .collect();
        served.sort();
        let mut held: Vec<_> = t.held.keys().map(ToString::to_string).collect();
        held.sort();
        let mut lose: Vec<_> = t.lose_on_acquire.iter().map(ToString::to_string).collect();
        lose.sort();
        f.debug_struct("FaultyStore")
            .field("fail_next", &once)
            .field("fail_always", &always)
            .field("served", &served)
            .field("held_locks", &held)
            .field("lose_ownership_on_acquire", &lose)
            .finish_non_exhaustive()
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl BindingStore for FaultyStore {
    async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
        let served = {
            let mut t = lock(&self.table);
            t.enter(StoreOp::Get)?;
            t.served.get(key).cloned()
        };
        match served {
            None => self.inner.get(key).await,
            Some(Served::Malformed) => Err(malformed(key)),
            Some(Served::Binding(binding)) => {
                binding.validate(key).map_err(stored)?;
                Ok(Some(binding))
            }
        }
    }

    async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
        self.enter(StoreOp::Create)?;
        self.inner.create(key, binding).await
    }

    async fn delete_if_match(
        &self,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        self.enter(StoreOp::DeleteIfMatch)?;
        self.inner.delete_if_match(key, provider, sandbox).await
    }

    async fn replace_traffic_token_if_match(
        &self,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        self.enter(StoreOp::ReplaceTrafficToken)?;
        self.inner
            .replace_traffic_token_if_match(key, expected, token)
            .await
    }

    async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
        self.enter(StoreOp::LockLifecycle)?;
        let acquired = self.inner.lock_lifecycle(key).await?;
        // Nothing below awaits, so a cancelled acquire either never got the inner lock or gets
        // it fully wrapped.
        let (token, release) = acquired.into_parts();
        // A child token follows the inner store's own loss and can additionally be tripped here,
        // without being able to trip the inner store's token.
        let (source, child) = token.child();
        let (id, lose_now) = {
            let mut t = lock(&self.table);
            let id = t.next_lock_id;
            t.next_lock_id = t.next_lock_id.wrapping_add(1);
            t.held.insert(
                key.clone(),
                Held {
                    id,
                    source: source.clone(),
                },
            );
            (id, t.lose_on_acquire.contains(key))
        };
        if lose_now {
            source.trip(FORCED_REASON);
        }
        let wrapper = FaultyRelease {
            table: self.table.clone(),
            key: key.clone(),
            id,
            inner: Some(release),
        };
        Ok(LifecycleLock::new(child, Box::new(wrapper)))
    }

    async fn invalidate_by_config(
        &self,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        self.enter(StoreOp::InvalidateByConfig)?;
        self.inner.invalidate_by_config(tenant, config).await
    }

    // A decorator must forward every optional capability and never invent one: callers
    // discover capabilities through these accessors and degrade differently without them.

    fn turn_leases(&self) -> Option<&dyn TurnLeases> {
        self.inner.turn_leases().map(|_| self as &dyn TurnLeases)
    }

    fn rewind_locks(&self) -> Option<&dyn RewindLocks> {
        self.inner.rewind_locks().map(|_| self as &dyn RewindLocks)
    }

    fn activities(&self) -> Option<&dyn ActivityRegistry> {
        self.inner
            .activities()
            .map(|_| self as &dyn ActivityRegistry)
    }

    fn optimistic_reads(&self) -> Option<&dyn sandbox_core::OptimisticReads> {
        if !self.optimistic_reads {
            return None;
        }
        self.inner
            .optimistic_reads()
            .map(|_| self as &dyn sandbox_core::OptimisticReads)
    }
}

/// The fast-path read is a read: `get`'s faults apply to it.
#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl sandbox_core::OptimisticReads for FaultyStore {
    async fn read_for_resolve(
        &self,
        key: &BindingKey,
    ) -> Result<sandbox_core::ResolveSnapshot, Error> {
        self.enter(StoreOp::Get)?;
        match self.inner.optimistic_reads() {
            Some(reads) => reads.read_for_resolve(key).await,
            None => Err(stored(Error::unsupported(
                sandbox_core::Operation::new("read_for_resolve"),
                "the wrapped store has no optimistic reads",
            ))),
        }
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl TurnLeases for FaultyStore {
    async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
        self.enter(StoreOp::BeginTurn)?;
        self.inner_turns()?.begin_turn(key).await
    }

    async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
        self.enter(StoreOp::EndTurn)?;
        self.inner_turns()?.end_turn(key).await
    }

    async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
        self.enter(StoreOp::TurnState)?;
        self.inner_turns()?.turn_state(key).await
    }

    async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
        self.enter(StoreOp::ConsumeTurnRebuild)?;
        self.inner_turns()?.consume_turn_rebuild(key).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl RewindLocks for FaultyStore {
    async fn try_lock_rewind(&self, key: &BindingKey) -> Result<RewindLock, Error> {
        self.enter(StoreOp::TryLockRewind)?;
        self.inner_rewinds()?.try_lock_rewind(key).await
    }

    async fn has_rewind_lock(&self, key: &BindingKey) -> Result<bool, Error> {
        self.enter(StoreOp::HasRewindLock)?;
        self.inner_rewinds()?.has_rewind_lock(key).await
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl ActivityRegistry for FaultyStore {
    async fn add(
        &self,
        key: &BindingKey,
        activity: &BackgroundActivity,
        lease: Duration,
        kind_cap: usize,
    ) -> Result<(), Error> {
        self.enter(StoreOp::ActivityAdd)?;
        self.inner_activities()?
            .add(key, activity, lease, kind_cap)
            .await
    }

    async fn renew(&self, key: &BindingKey, id: &str, lease: Duration) -> Result<bool, Error> {
        self.enter(StoreOp::ActivityRenew)?;
        self.inner_activities()?.renew(key, id, lease).await
    }

    async fn remove(&self, key: &BindingKey, id: &str) -> Result<(), Error> {
        self.enter(StoreOp::ActivityRemove)?;
        self.inner_activities()?.remove(key, id).await
    }

    async fn list(&self, key: &BindingKey) -> Result<Vec<BackgroundActivity>, Error> {
        self.enter(StoreOp::ActivityList)?;
        self.inner_activities()?.list(key).await
    }
}

/// Wraps the inner store's release so the wrapper learns when a lock stops being held (by
/// release or by drop) and can fail the release on request.
struct FaultyRelease {
    table: Table,
    key: BindingKey,
    id: u64,
    /// `None` once handed to the inner store's release.
    inner: Option<Box<dyn LockRelease>>,
}

#[async_trait]
impl LockRelease for FaultyRelease {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        let inner = self.inner.take();
        let injected = {
            let mut t = lock(&self.table);
            // Forget the holder before the inner lock is free, so the next holder's entry can
            // never be shadowed by ours.
            t.forget_lock(&self.key, self.id);
            t.enter(StoreOp::ReleaseLifecycle)
        };
        let released = match inner {
            Some(inner) => inner.release().await,
            None => Ok(()),
        };
        // An injected release failure still frees the inner lock: the fault models a store that
        // reported an error, not a lock that stays held forever and wedges the rest of the test.
        injected.and(released)
    }
}

impl Drop for FaultyRelease {
    fn drop(&mut self) {
        lock(&self.table).forget_lock(&self.key, self.id);
        // Dropping the inner release (if still there) releases the inner lock through its own
        // Drop, after our entry is gone.
        drop(self.inner.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::error::ErrorKind;
    use sandbox_core::ids::TemplateId;
    use sandbox_core::{OwnershipToken, timefmt};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A minimal in-memory store, just enough to wrap.
    #[derive(Debug, Default)]
    struct MiniStore {
        bindings: Mutex<HashMap<BindingKey, Binding>>,
        locks: Arc<Mutex<HashSet<BindingKey>>>,
        turns: Mutex<HashMap<BindingKey, (u32, bool)>>,
        with_turns: bool,
        gets: AtomicUsize,
    }

    impl MiniStore {
        fn with_turns() -> Self {
            MiniStore {
                with_turns: true,
                ..MiniStore::default()
            }
        }
    }

    struct MiniRelease {
        locks: Arc<Mutex<HashSet<BindingKey>>>,
        key: BindingKey,
    }

    impl Drop for MiniRelease {
        fn drop(&mut self) {
            self.locks.lock().unwrap().remove(&self.key);
        }
    }

    #[async_trait]
    impl LockRelease for MiniRelease {
        async fn release(self: Box<Self>) -> Result<(), Error> {
            // Drop does the work.
            Ok(())
        }
    }

    #[async_trait]
    impl BindingStore for MiniStore {
        async fn get(&self, key: &BindingKey) -> Result<Option<Binding>, Error> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            Ok(self.bindings.lock().unwrap().get(key).cloned())
        }
        async fn create(&self, key: &BindingKey, binding: &Binding) -> Result<bool, Error> {
            binding.validate(key)?;
            let mut m = self.bindings.lock().unwrap();
            if m.contains_key(key) {
                return Ok(false);
            }
            m.insert(key.clone(), binding.clone());
            Ok(true)
        }
        async fn delete_if_match(
            &self,
            key: &BindingKey,
            provider: Provider,
            sandbox: &SandboxId,
        ) -> Result<bool, Error> {
            let mut m = self.bindings.lock().unwrap();
            let hit = m
                .get(key)
                .is_some_and(|b| b.provider == provider && &b.sandbox_id == sandbox);
            if hit {
                m.remove(key);
            }
            Ok(hit)
        }
        async fn replace_traffic_token_if_match(
            &self,
            key: &BindingKey,
            expected: &Binding,
            token: &Secret,
        ) -> Result<bool, Error> {
            let mut m = self.bindings.lock().unwrap();
            match m.get_mut(key) {
                Some(b)
                    if !token.is_empty()
                        && b.provider == expected.provider
                        && b.sandbox_id == expected.sandbox_id
                        && b.traffic_token.as_ref() != Some(token) =>
                {
                    b.traffic_token = Some(token.clone());
                    Ok(true)
                }
                _ => Ok(false),
            }
        }
        async fn lock_lifecycle(&self, key: &BindingKey) -> Result<LifecycleLock, Error> {
            loop {
                if self.locks.lock().unwrap().insert(key.clone()) {
                    let release = MiniRelease {
                        locks: self.locks.clone(),
                        key: key.clone(),
                    };
                    return Ok(LifecycleLock::new(
                        OwnershipToken::never_lost(),
                        Box::new(release),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        async fn invalidate_by_config(
            &self,
            _tenant: TenantId,
            _config: &ConfigId,
        ) -> Result<InvalidationReport, Error> {
            Ok(InvalidationReport::default())
        }
        fn turn_leases(&self) -> Option<&dyn TurnLeases> {
            self.with_turns.then_some(self as &dyn TurnLeases)
        }
    }

    #[async_trait]
    impl TurnLeases for MiniStore {
        async fn begin_turn(&self, key: &BindingKey) -> Result<(), Error> {
            let mut m = self.turns.lock().unwrap();
            let e = m.entry(key.clone()).or_insert((0, false));
            e.0 += 1;
            if e.0 == 1 {
                e.1 = true;
            }
            Ok(())
        }
        async fn end_turn(&self, key: &BindingKey) -> Result<(), Error> {
            let mut m = self.turns.lock().unwrap();
            if let Some(e) = m.get_mut(key) {
                e.0 -= 1;
                if e.0 == 0 {
                    m.remove(key);
                }
            }
            Ok(())
        }
        async fn turn_state(&self, key: &BindingKey) -> Result<TurnState, Error> {
            let m = self.turns.lock().unwrap();
            Ok(m.get(key).map_or(TurnState::default(), |e| TurnState {
                active: e.0 > 0,
                may_rebuild: e.1,
            }))
        }
        async fn consume_turn_rebuild(&self, key: &BindingKey) -> Result<(), Error> {
            if let Some(e) = self.turns.lock().unwrap().get_mut(key) {
                e.1 = false;
            }
            Ok(())
        }
    }

    fn key(session: &str) -> BindingKey {
        BindingKey::new(7, session).unwrap()
    }

    fn binding(key: &BindingKey, sandbox: &str) -> Binding {
        Binding::new(
            key,
            Provider::E2b,
            SandboxId::new(sandbox).unwrap(),
            TemplateId::new("base").unwrap(),
            timefmt::parse("2026-01-02T03:04:05Z").unwrap(),
        )
    }

    fn down() -> Error {
        Error::unavailable(Operation::new("test"), "store down")
    }

    fn wrap(inner: MiniStore) -> (Arc<MiniStore>, FaultyStore) {
        let inner = Arc::new(inner);
        let store = FaultyStore::new(inner.clone());
        (inner, store)
    }

    /// The inner lock of `key` is free: acquiring it directly succeeds at once.
    async fn inner_lock_free(inner: &MiniStore, key: &BindingKey) {
        let held = tokio::time::timeout(Duration::from_secs(1), inner.lock_lifecycle(key))
            .await
            .expect("inner lock still held")
            .unwrap();
        held.release().await.unwrap();
    }

    #[tokio::test]
    async fn fail_next_fails_once_without_touching_inner() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        let b = binding(&k, "sbx-1");

        store.fail_next(StoreOp::Create, down());
        let err = store.create(&k, &b).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        // The test built an error without an origin; the wrapper injects it as the store's.
        assert_eq!(down().origin(), Origin::Unspecified);
        assert_eq!(err.origin(), Origin::Store);
        assert_eq!(inner.get(&k).await.unwrap(), None, "failed create leaked");
        assert!(store.create(&k, &b).await.unwrap());
        assert!(!store.create(&k, &b).await.unwrap());

        store.fail_next(StoreOp::Get, down());
        let before = inner.gets.load(Ordering::SeqCst);
        assert!(store.get(&k).await.is_err());
        assert_eq!(inner.gets.load(Ordering::SeqCst), before);
        assert_eq!(store.get(&k).await.unwrap(), Some(b.clone()));
        assert_eq!(inner.gets.load(Ordering::SeqCst), before + 1);

        // A queue fails successive calls, then delegates.
        store.fail_next(StoreOp::DeleteIfMatch, down());
        store.fail_next(
            StoreOp::DeleteIfMatch,
            Error::internal(Operation::new("test"), "second"),
        );
        let sbx = SandboxId::new("sbx-1").unwrap();
        let e1 = store.delete_if_match(&k, Provider::E2b, &sbx).await;
        let e2 = store.delete_if_match(&k, Provider::E2b, &sbx).await;
        assert_eq!(e1.unwrap_err().kind(), ErrorKind::Unavailable);
        assert_eq!(e2.unwrap_err().message(), "second");
        assert!(inner.get(&k).await.unwrap().is_some());
        assert!(
            store
                .delete_if_match(&k, Provider::E2b, &sbx)
                .await
                .unwrap()
        );
        assert_eq!(inner.get(&k).await.unwrap(), None);
    }

    #[tokio::test]
    async fn fail_always_until_clear_and_calls_count() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        let b = binding(&k, "sbx-1");
        inner.create(&k, &b).await.unwrap();
        let tok = Secret::new("tok-2");

        store.fail_always(StoreOp::ReplaceTrafficToken, down());
        for _ in 0..3 {
            assert!(
                store
                    .replace_traffic_token_if_match(&k, &b, &tok)
                    .await
                    .is_err()
            );
        }
        assert_eq!(inner.get(&k).await.unwrap().unwrap().traffic_token, None);
        store.clear(StoreOp::ReplaceTrafficToken);
        assert!(
            store
                .replace_traffic_token_if_match(&k, &b, &tok)
                .await
                .unwrap()
        );
        assert_eq!(store.calls(StoreOp::ReplaceTrafficToken), 4);
        assert_eq!(store.calls(StoreOp::Get), 0);

        // One-shot errors go before a standing one; clear_all removes both.
        store.fail_always(StoreOp::InvalidateByConfig, down());
        store.fail_next(
            StoreOp::InvalidateByConfig,
            Error::internal(Operation::new("test"), "first"),
        );
        let t = TenantId::new(7).unwrap();
        let cfg = ConfigId::new("cfg").unwrap();
        let e = store.invalidate_by_config(t, &cfg).await.unwrap_err();
        assert_eq!(e.message(), "first");
        let e = store.invalidate_by_config(t, &cfg).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(
            e.origin(),
            Origin::Store,
            "a standing fault is the store's too"
        );
        store.clear_all();
        assert_eq!(store.invalidate_by_config(t, &cfg).await.unwrap().marked, 0);
        assert_eq!(store.calls(StoreOp::InvalidateByConfig), 3);
        let dbg = format!("{store:?}");
        assert!(dbg.contains("FaultyStore"), "{dbg}");
    }

    #[tokio::test]
    async fn serve_malformed_is_an_error_never_unbound() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        store.serve_malformed(&k);
        let err = store.get(&k).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        assert_eq!(err.kind(), ErrorKind::Internal);
        assert_eq!(err.origin(), Origin::Store);
        assert!(err.message().contains("malformed binding"), "{err}");
        assert_eq!(inner.gets.load(Ordering::SeqCst), 0);
        // Other keys are untouched.
        assert_eq!(store.get(&key("s2")).await.unwrap(), None);
        assert_eq!(store.calls(StoreOp::Get), 2);
        store.clear_all();
        assert_eq!(store.get(&k).await.unwrap(), None);
    }

    #[tokio::test]
    async fn serve_binding_validates_identity() {
        let (_inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        let other = key("s2");
        store.serve_binding(&k, binding(&other, "sbx-x"));
        let err = store.get(&k).await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        // Core's validation says no origin; served by a store, it is the store's.
        assert_eq!(err.origin(), Origin::Store);

        let own = binding(&k, "sbx-1");
        store.serve_binding(&k, own.clone());
        assert_eq!(store.get(&k).await.unwrap(), Some(own));
    }

    #[tokio::test]
    async fn force_ownership_loss_trips_only_the_held_lock() {
        let (inner, store) = wrap(MiniStore::default());
        let (a, b) = (key("a"), key("b"));
        assert!(!store.force_ownership_loss(&a));

        let la = store.lock_lifecycle(&a).await.unwrap();
        let lb = store.lock_lifecycle(&b).await.unwrap();
        assert!(!la.ownership().is_lost());
        assert!(store.force_ownership_loss(&a));
        assert!(la.ownership().is_lost());
        assert_eq!(
            la.ownership().loss_reason().as_deref(),
            Some("forced by test")
        );
        assert!(!lb.ownership().is_lost());

        let err = la.release().await.unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::LockOwnershipLost));
        assert!(!store.force_ownership_loss(&a));
        inner_lock_free(&inner, &a).await;

        lb.release().await.unwrap();
        assert!(!store.force_ownership_loss(&b));
        inner_lock_free(&inner, &b).await;
        assert_eq!(store.calls(StoreOp::LockLifecycle), 2);
        // The lost lock's release was refused before it reached the store.
        assert_eq!(store.calls(StoreOp::ReleaseLifecycle), 1);

        // A dropped lock is forgotten and releases the inner lock too.
        let la = store.lock_lifecycle(&a).await.unwrap();
        drop(la);
        assert!(!store.force_ownership_loss(&a));
        inner_lock_free(&inner, &a).await;
    }

    #[tokio::test]
    async fn lose_ownership_on_acquire() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        store.lose_ownership_on_acquire(&k);
        for _ in 0..2 {
            let l = store.lock_lifecycle(&k).await.unwrap();
            assert!(l.ownership().is_lost());
            assert!(l.ownership().check().is_err());
            let err = l.release().await.unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::LockOwnershipLost));
            inner_lock_free(&inner, &k).await;
        }
        // Other keys are unaffected; clear_all ends it.
        let other = store.lock_lifecycle(&key("s2")).await.unwrap();
        assert!(!other.ownership().is_lost());
        other.release().await.unwrap();
        store.clear_all();
        let l = store.lock_lifecycle(&k).await.unwrap();
        assert!(!l.ownership().is_lost());
        l.release().await.unwrap();
    }

    #[tokio::test]
    async fn injected_lock_error_never_takes_the_inner_lock() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        store.fail_next(StoreOp::LockLifecycle, down());
        let err = store.lock_lifecycle(&k).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        inner_lock_free(&inner, &k).await;
        assert!(!store.force_ownership_loss(&k));
        assert_eq!(store.calls(StoreOp::LockLifecycle), 1);
    }

    #[tokio::test]
    async fn injected_release_error_still_releases_the_inner_lock() {
        let (inner, store) = wrap(MiniStore::default());
        let k = key("s1");
        store.fail_next(StoreOp::ReleaseLifecycle, down());
        let l = store.lock_lifecycle(&k).await.unwrap();
        let err = l.release().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(store.calls(StoreOp::ReleaseLifecycle), 1);
        assert!(!store.force_ownership_loss(&k));
        inner_lock_free(&inner, &k).await;
    }

    #[tokio::test]
    async fn wrapped_lock_still_serialises_holders() {
        let (_inner, store) = wrap(MiniStore::default());
        let store = Arc::new(store);
        let k = key("s1");
        let first = store.lock_lifecycle(&k).await.unwrap();
        let waiter = {
            let store = store.clone();
            let k = k.clone();
            tokio::spawn(async move { store.lock_lifecycle(&k).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        first.release().await.unwrap();
        waiter.await.unwrap().unwrap();
        // Successive holders each get their own entry: the previous ones' bookkeeping is gone
        // and the current holder is the one tripped.
        let second = store.lock_lifecycle(&k).await.unwrap();
        assert!(store.force_ownership_loss(&k));
        assert!(second.ownership().is_lost());
    }

    #[tokio::test]
    async fn capabilities_are_forwarded_never_invented() {
        let (_inner, bare) = wrap(MiniStore::default());
        assert!(bare.turn_leases().is_none());
        assert!(bare.rewind_locks().is_none());
        assert!(bare.activities().is_none());
        // Direct calls on a missing capability are errors, not panics.
        let k = key("s1");
        let err = TurnLeases::turn_state(&bare, &k).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        let err = RewindLocks::has_rewind_lock(&bare, &k).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        let err = ActivityRegistry::list(&bare, &k).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);

        let (inner, store) = wrap(MiniStore::with_turns());
        let turns = store.turn_leases().expect("forwarded");
        assert!(store.rewind_locks().is_none());
        turns.begin_turn(&k).await.unwrap();
        let state = turns.turn_state(&k).await.unwrap();
        assert!(state.active && state.may_rebuild);

        store.fail_next(StoreOp::TurnState, down());
        let err = turns.turn_state(&k).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);

        store.fail_next(StoreOp::ConsumeTurnRebuild, down());
        assert!(turns.consume_turn_rebuild(&k).await.is_err());
        let inner_state = inner.turn_state(&k).await.unwrap();
        assert!(inner_state.may_rebuild, "failed consume reached the inner");
        turns.consume_turn_rebuild(&k).await.unwrap();
        turns.end_turn(&k).await.unwrap();
        assert_eq!(turns.turn_state(&k).await.unwrap(), TurnState::default());
        assert_eq!(store.calls(StoreOp::TurnState), 3);
        assert_eq!(store.calls(StoreOp::BeginTurn), 1);
    }

    #[test]
    fn store_op_all_is_complete() {
        let set: HashSet<StoreOp> = StoreOp::ALL.into_iter().collect();
        assert_eq!(set.len(), StoreOp::ALL.len());
    }
}

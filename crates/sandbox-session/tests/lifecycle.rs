//! The lifecycle coordinator's rules (`ARCHITECTURE.md`, `sandbox-session` and "Invariants") on
//! the in-memory fake provider and the memory store, with the test kit's fault-injecting store
//! where a rule needs store faults or lost lock ownership. Each test's doc states the rule it
//! checks.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    BindingKey, BindingStore, Bootstrapper, Capability, ConfigId, CreateRequest, Error, ErrorCode,
    ErrorKind, ListFilter, Operation, Provider, SandboxHandle, SandboxProvider, SandboxState,
    Secret, SessionExistence, TemplateId, owner_metadata,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig, ResolveOptions};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::fake::{FakeCall, FakeProvider};
use sandbox_testkit::{FakeOp, FaultyStore, ForwardStore, StoreHooks, StoreOp};

/// Session existence a test can flip.
#[derive(Debug, Default)]
struct Existence {
    gone: AtomicBool,
    fail: AtomicBool,
    /// Answer "gone" from the Nth call on (0 = never).
    gone_from_call: AtomicUsize,
    /// Stall the Nth call (the re-check after create) for a while (0 = never).
    stall_call: AtomicUsize,
    calls: AtomicUsize,
}

#[async_trait]
impl SessionExistence for Existence {
    async fn session_exists(&self, _key: &BindingKey) -> Result<bool, Error> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.stall_call.load(Ordering::SeqCst) == n {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::unavailable(
                Operation::new("session_exists"),
                "session db down",
            ));
        }
        let from = self.gone_from_call.load(Ordering::SeqCst);
        Ok(!(self.gone.load(Ordering::SeqCst) || (from > 0 && n >= from)))
    }
}

struct Env {
    fake: sandbox_core::Checked<FakeProvider>,
    store: Arc<dyn BindingStore>,
    existence: Arc<Existence>,
    lifecycle: Lifecycle,
}

fn config(requires_token: bool) -> LifecycleConfig {
    LifecycleConfig {
        config_id: ConfigId::new("cfg-1").unwrap(),
        create_request: CreateRequest::new(FakeProvider::template()),
        requires_inbound_token: requires_token,
    }
}

fn env_with(fake: sandbox_core::Checked<FakeProvider>, store: Arc<dyn BindingStore>) -> Env {
    let existence = Arc::new(Existence::default());
    let lifecycle = Lifecycle::new(
        Arc::new(fake.clone()),
        store.clone(),
        existence.clone(),
        config(true),
    )
    .unwrap();
    Env {
        fake,
        store,
        existence,
        lifecycle,
    }
}

fn env() -> Env {
    env_with(FakeProvider::new(), Arc::new(MemoryBindingStore::new()))
}

fn key(n: u32) -> BindingKey {
    BindingKey::new(7, &format!("session-{n}")).unwrap()
}

fn unavailable() -> Error {
    Error::unavailable(Operation::CONNECT, "gateway timeout")
}

/// N concurrent resolves of one session create exactly one sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_resolves_of_one_session_create_one_sandbox() {
    let e = env();
    e.fake
        .set_latency(FakeOp::Create, Duration::from_millis(20));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let lifecycle = e.lifecycle.clone();
        tasks.spawn(async move { lifecycle.resolve(&key(1)).await.unwrap().id().clone() });
    }
    let mut ids = Vec::new();
    while let Some(id) = tasks.join_next().await {
        ids.push(id.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every resolve must return the same sandbox");
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
    assert_eq!(e.fake.sandbox_ids().len(), 1);
}

/// Distinct sessions run in parallel — a create that waits on a
/// 50-party barrier completes, which a global lock would deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_sessions_resolve_in_parallel() {
    let e = env();
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    e.fake.set_hook(
        FakeOp::Create,
        Arc::new(move |_call: FakeCall| {
            let barrier = barrier.clone();
            Box::pin(async move {
                barrier.wait().await;
                Ok(())
            })
        }),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..50 {
        let lifecycle = e.lifecycle.clone();
        tasks.spawn(async move { lifecycle.resolve(&key(n)).await.unwrap() });
    }
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        let mut n = 0;
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
            n += 1;
        }
        n
    })
    .await
    .expect("50 distinct sessions must not wait for each other");
    assert_eq!(all, 50);
    assert_eq!(e.fake.sandbox_ids().len(), 50);
}

/// Only not_found/terminal replace a binding; other errors keep it, create nothing.
#[tokio::test]
async fn only_gone_errors_replace_a_binding() {
    let e = env();
    let first = e.lifecycle.resolve(&key(1)).await.unwrap();
    for err in [
        unavailable(),
        Error::internal(Operation::CONNECT, "weird"),
        Error::new(ErrorKind::Authentication, Operation::CONNECT, "bad key"),
        Error::timeout(Operation::CONNECT, "slow"),
    ] {
        e.fake.fail_next(FakeOp::ConnectSession, err.clone());
        let got = e.lifecycle.resolve(&key(1)).await.unwrap_err();
        assert_eq!(got.kind(), err.kind());
        assert_eq!(
            e.store.get(&key(1)).await.unwrap().unwrap().sandbox_id,
            *first.id(),
            "binding kept after {err}"
        );
        assert_eq!(
            e.fake.calls(FakeOp::Create),
            1,
            "nothing created after {err}"
        );
    }
    e.fake.terminate(first.id());
    let second = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_ne!(second.id(), first.id());
    assert_eq!(
        e.store.get(&key(1)).await.unwrap().unwrap().sandbox_id,
        *second.id()
    );
}

/// A binding of another provider is dropped without asking this provider about
/// the other's sandbox.
#[tokio::test]
async fn provider_mismatch_replaces_the_binding_without_touching_the_old_id() {
    let store: Arc<dyn BindingStore> = Arc::new(MemoryBindingStore::new());
    let old = env_with(
        FakeProvider::builder().provider(Provider::Cube).build(),
        store.clone(),
    );
    let old_handle = old.lifecycle.resolve(&key(1)).await.unwrap();
    let new = env_with(FakeProvider::new(), store.clone());
    let h = new.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(h.provider(), Provider::E2b);
    assert_eq!(
        new.fake.calls(FakeOp::Connect)
            + new.fake.calls(FakeOp::ConnectSession)
            + new.fake.calls(FakeOp::Delete),
        0
    );
    assert!(
        old.fake.state_of(old_handle.id()).is_some(),
        "the old provider's sandbox is left for its reaper"
    );
    assert_eq!(
        store.get(&key(1)).await.unwrap().unwrap().provider,
        Provider::E2b
    );
}

async fn create_owned(e: &Env, k: &BindingKey, with_token: bool) -> SandboxHandle {
    let mut request = CreateRequest::new(FakeProvider::template());
    request.metadata =
        owner_metadata::for_session(k, Provider::E2b, &ConfigId::new("cfg-1").unwrap());
    let h = e.fake.create(request).await.unwrap();
    let _ = with_token;
    h
}

/// Recovery adopts the oldest metadata match and deletes the duplicates.
#[tokio::test]
async fn recovery_adopts_the_oldest_and_deletes_duplicates() {
    let clock = Arc::new(sandbox_core::ManualClock::new(
        time::OffsetDateTime::now_utc(),
    ));
    let fake = FakeProvider::builder().clock(clock.clone()).build();
    let e = env_with(fake, Arc::new(MemoryBindingStore::new()));
    let oldest = create_owned(&e, &key(1), true).await;
    clock.advance(Duration::from_secs(5));
    let dup = create_owned(&e, &key(1), true).await;
    // Recovery connects without a token; this config requires one, so give the adoptee one.
    e.fake
        .reissue_token_on_connect(oldest.id(), Secret::new("tok-adopted"));
    e.fake
        .reissue_token_on_connect(dup.id(), Secret::new("tok-dup"));
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(h.id(), oldest.id());
    assert_eq!(e.fake.state_of(dup.id()), None, "the duplicate is deleted");
    assert_eq!(e.fake.calls(FakeOp::Create), 2, "no third sandbox");
    let b = e.store.get(&key(1)).await.unwrap().unwrap();
    assert_eq!(b.sandbox_id, *oldest.id());
    assert_eq!(b.traffic_token, Some(Secret::new("tok-adopted")));
}

/// A lookup with nothing bound recovers the sandbox the session owns (a restart on the memory
/// store lost the binding) and binds it, but never creates: with nothing owned it is `None`
/// and no sandbox exists afterwards.
#[tokio::test]
async fn a_lookup_recovers_an_owned_sandbox_and_never_creates() {
    let e = env();
    let owned = create_owned(&e, &key(1), true).await;
    e.fake
        .reissue_token_on_connect(owned.id(), Secret::new("tok-looked-up"));
    let found = e.lifecycle.lookup(&key(1)).await.unwrap();
    assert_eq!(found.as_ref().map(SandboxHandle::id), Some(owned.id()));
    let b = e.store.get(&key(1)).await.unwrap().unwrap();
    assert_eq!(b.sandbox_id, *owned.id(), "the recovered sandbox is bound");

    assert!(e.lifecycle.lookup(&key(2)).await.unwrap().is_none());
    assert_eq!(
        e.fake.calls(FakeOp::Create),
        1,
        "only the test's own create"
    );
    assert!(e.store.get(&key(2)).await.unwrap().is_none());
}

/// Duplicate cleanup stops once lock ownership is lost.
#[tokio::test]
async fn duplicate_cleanup_stops_after_losing_the_lock() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryBindingStore::new())));
    let e = env_with(FakeProvider::new(), faulty.clone());
    let a = create_owned(&e, &key(1), true).await;
    let b = create_owned(&e, &key(1), true).await;
    e.fake.reissue_token_on_connect(a.id(), Secret::new("t"));
    e.fake.reissue_token_on_connect(b.id(), Secret::new("t"));
    faulty.lose_ownership_on_acquire(&key(1));
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::LockOwnershipLost), "{err}");
    assert_eq!(
        e.fake.calls(FakeOp::Delete),
        0,
        "no delete may run without lock ownership"
    );
    assert_eq!(e.fake.sandbox_ids().len(), 2);
}

/// A recovery listing failure creates nothing.
#[tokio::test]
async fn recovery_list_failure_creates_nothing() {
    let e = env();
    e.fake.fail_next(FakeOp::List, unavailable());
    assert_eq!(
        e.lifecycle.resolve(&key(1)).await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    assert_eq!(e.fake.calls(FakeOp::Create), 0);
    assert!(e.store.get(&key(1)).await.unwrap().is_none());
}

fn provider_calls(fake: &FakeProvider) -> usize {
    [
        FakeOp::Create,
        FakeOp::Connect,
        FakeOp::ConnectSession,
        FakeOp::Get,
        FakeOp::List,
        FakeOp::Delete,
    ]
    .into_iter()
    .map(|op| fake.calls(op))
    .sum()
}

/// Store faults (lock, get, malformed binding) make zero provider calls.
#[tokio::test]
async fn store_faults_make_no_provider_calls() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryBindingStore::new())));
    let e = env_with(FakeProvider::new(), faulty.clone());
    let store_down = || Error::unavailable(Operation::new("lock_lifecycle"), "redis down");
    faulty.fail_next(StoreOp::LockLifecycle, store_down());
    assert_eq!(
        e.lifecycle.resolve(&key(1)).await.unwrap_err().kind(),
        ErrorKind::Unavailable
    );
    faulty.fail_next(StoreOp::Get, store_down());
    assert!(e.lifecycle.resolve(&key(1)).await.is_err());
    faulty.serve_malformed(&key(1));
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
    assert_eq!(
        provider_calls(&e.fake),
        0,
        "a store fault must stop the resolve before the provider"
    );
}

/// A session deleted while its sandbox was being created gets the sandbox deleted.
#[tokio::test]
async fn session_vanishing_during_create_deletes_the_new_sandbox() {
    let e = env();
    // The first existence check passes, the re-check after create says gone.
    e.existence.gone_from_call.store(2, Ordering::SeqCst);
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SessionDeleted));
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
    assert!(
        e.fake.sandbox_ids().is_empty(),
        "the sandbox created for a deleted session is removed"
    );
    assert!(e.store.get(&key(1)).await.unwrap().is_none());
}

/// A caller dropped mid-create leaves no orphan after the next resolve: the cleanup outlives
/// the caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_dropped_mid_create_leaves_no_orphan() {
    let e = env();
    // The provider has created the sandbox; the caller goes away during the existence re-check,
    // before the binding is written.
    e.existence.stall_call.store(2, Ordering::SeqCst);
    let lifecycle = e.lifecycle.clone();
    let task = tokio::spawn(async move { lifecycle.resolve(&key(1)).await });
    while e.fake.sandbox_ids().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    task.abort();
    let _ = task.await;
    let orphan = e.fake.sandbox_ids();
    assert_eq!(orphan.len(), 1);
    assert!(
        e.store.get(&key(1)).await.unwrap().is_none(),
        "the caller went away before binding"
    );
    // The next resolve adopts it through its ownership metadata instead of creating another.
    e.fake
        .reissue_token_on_connect(&orphan[0], Secret::new("t"));
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(h.id(), &orphan[0]);
    assert_eq!(
        e.fake.sandbox_ids(),
        orphan,
        "no orphan left and no second sandbox"
    );
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
}

/// The loser of a create race deletes its own sandbox and uses the winner's; a
/// failed binding write deletes the created sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_race_loser_deletes_its_own_sandbox() {
    // Two coordinators on two store handles of one backing store, whose locks are *not*
    // shared, model two replicas whose locking failed open; only create-if-absent decides.
    let backing = MemoryBindingStore::new();
    let fake = FakeProvider::new();
    let a = env_with(fake.clone(), Arc::new(UnlockedStore::over(backing.clone())));
    let b = env_with(fake.clone(), Arc::new(UnlockedStore::over(backing.clone())));
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    fake.set_hook(
        FakeOp::Create,
        Arc::new(move |_| {
            let barrier = barrier.clone();
            Box::pin(async move {
                barrier.wait().await;
                Ok(())
            })
        }),
    );
    let k1 = key(1);
    let (ra, rb) = tokio::join!(a.lifecycle.resolve(&k1), b.lifecycle.resolve(&k1));
    let (ha, hb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ha.id(), hb.id(), "both use the winner");
    assert_eq!(fake.calls(FakeOp::Create), 2);
    assert_eq!(
        fake.sandbox_ids(),
        vec![ha.id().clone()],
        "the loser deleted its own sandbox"
    );

    // A failed binding write deletes what was created.
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryBindingStore::new())));
    let c = env_with(FakeProvider::new(), faulty.clone());
    faulty.fail_next(
        StoreOp::Create,
        Error::unavailable(Operation::new("create"), "down"),
    );
    assert!(c.lifecycle.resolve(&key(2)).await.is_err());
    assert_eq!(c.fake.calls(FakeOp::Create), 1);
    assert!(c.fake.sandbox_ids().is_empty());
}

/// A store whose lifecycle lock never excludes (everything else forwards, through the test
/// kit's forwarding helper): two coordinators on it race all the way to create-if-absent.
#[derive(Debug)]
struct UnlockedStore;

impl UnlockedStore {
    fn over(backing: MemoryBindingStore) -> ForwardStore<UnlockedStore> {
        ForwardStore::new(Arc::new(backing), UnlockedStore)
    }
}

#[async_trait]
impl StoreHooks for UnlockedStore {
    async fn lock_lifecycle(
        &self,
        _next: &dyn BindingStore,
        _key: &BindingKey,
    ) -> Result<sandbox_core::LifecycleLock, Error> {
        #[derive(Debug)]
        struct Noop;
        #[async_trait]
        impl sandbox_core::LockRelease for Noop {
            async fn release(self: Box<Self>) -> Result<(), Error> {
                Ok(())
            }
        }
        Ok(sandbox_core::LifecycleLock::new(
            sandbox_core::OwnershipToken::never_lost(),
            Box::new(Noop),
        ))
    }
}

/// Resolve and destroy serialize on the lifecycle lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resolve_and_destroy_serialize() {
    let e = env();
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    let in_connect = Arc::new(AtomicUsize::new(0));
    let seen_overlap = Arc::new(AtomicBool::new(false));
    let (c1, o1) = (in_connect.clone(), seen_overlap.clone());
    e.fake.set_hook(
        FakeOp::ConnectSession,
        Arc::new(move |_| {
            let (c, _o) = (c1.clone(), o1.clone());
            Box::pin(async move {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                c.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }),
    );
    let (c2, o2) = (in_connect.clone(), seen_overlap.clone());
    e.fake.set_hook(
        FakeOp::Delete,
        Arc::new(move |_| {
            let (c, o) = (c2.clone(), o2.clone());
            Box::pin(async move {
                if c.load(Ordering::SeqCst) > 0 {
                    o.store(true, Ordering::SeqCst);
                }
                Ok(())
            })
        }),
    );
    let k1 = key(1);
    let (r, d) = tokio::join!(e.lifecycle.resolve(&k1), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        e.lifecycle.destroy(&key(1)).await
    });
    assert_eq!(r.unwrap().id(), h.id());
    d.unwrap();
    assert!(
        !seen_overlap.load(Ordering::SeqCst),
        "destroy deleted while a resolve was connecting"
    );
    assert!(e.fake.sandbox_ids().is_empty());
}

/// A deleted session creates nothing and loses its binding and sandbox.
#[tokio::test]
async fn deleted_session_is_destroyed_and_never_created() {
    let e = env();
    e.existence.gone.store(true, Ordering::SeqCst);
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SessionDeleted));
    assert_eq!(e.fake.calls(FakeOp::Create), 0);

    e.existence.gone.store(false, Ordering::SeqCst);
    let h = e.lifecycle.resolve(&key(2)).await.unwrap();
    e.existence.gone.store(true, Ordering::SeqCst);
    assert_eq!(
        e.lifecycle.resolve(&key(2)).await.unwrap_err().code(),
        Some(ErrorCode::SessionDeleted)
    );
    assert_eq!(e.fake.state_of(h.id()), None);
    assert!(e.store.get(&key(2)).await.unwrap().is_none());
    // An existence check that fails is "cannot tell": no destroy, no create.
    e.existence.gone.store(false, Ordering::SeqCst);
    let h = e.lifecycle.resolve(&key(3)).await.unwrap();
    e.existence.fail.store(true, Ordering::SeqCst);
    assert!(e.lifecycle.resolve(&key(3)).await.is_err());
    assert!(e.fake.state_of(h.id()).is_some());
}

/// Destroy: a transient provider error keeps the binding; a sandbox already gone removes it;
/// destroy is idempotent; a binding of another provider is deleted without a provider call;
/// a binding-delete failure after the remote delete is reported.
#[tokio::test]
async fn destroy_keeps_the_binding_on_transient_errors() {
    let e = env();
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    e.fake.fail_next(FakeOp::Delete, unavailable());
    assert!(e.lifecycle.destroy(&key(1)).await.is_err());
    assert!(
        e.store.get(&key(1)).await.unwrap().is_some(),
        "transient provider error keeps the binding"
    );
    // A sandbox already gone: the binding goes.
    e.fake
        .fail_next(FakeOp::Delete, Error::not_found(Operation::DELETE, "gone"));
    e.lifecycle.destroy(&key(1)).await.unwrap();
    assert!(e.store.get(&key(1)).await.unwrap().is_none());
    assert!(
        e.fake.state_of(h.id()).is_some(),
        "the injected not_found skipped the real delete"
    );
    // Idempotent.
    e.lifecycle.destroy(&key(1)).await.unwrap();

    // Provider mismatch deletes the binding only.
    let store: Arc<dyn BindingStore> = Arc::new(MemoryBindingStore::new());
    let cube = env_with(
        FakeProvider::builder().provider(Provider::Cube).build(),
        store.clone(),
    );
    let cube_handle = cube.lifecycle.resolve(&key(1)).await.unwrap();
    let e2b = env_with(FakeProvider::new(), store.clone());
    e2b.lifecycle.destroy(&key(1)).await.unwrap();
    assert!(store.get(&key(1)).await.unwrap().is_none());
    assert_eq!(e2b.fake.calls(FakeOp::Delete), 0);
    assert!(cube.fake.state_of(cube_handle.id()).is_some());

    // A binding-delete failure after the remote delete is reported.
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryBindingStore::new())));
    let f = env_with(FakeProvider::new(), faulty.clone());
    let fh = f.lifecycle.resolve(&key(1)).await.unwrap();
    faulty.fail_next(StoreOp::DeleteIfMatch, unavailable());
    assert!(f.lifecycle.destroy(&key(1)).await.is_err());
    assert_eq!(f.fake.state_of(fh.id()), None, "the sandbox itself is gone");
}

/// Ownership metadata carries the config ID; the default config is `-`.
#[tokio::test]
async fn metadata_carries_the_config_and_the_default_sentinel() {
    let e = env();
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(
        h.metadata().get(owner_metadata::CONFIG).map(String::as_str),
        Some("cfg-1")
    );
    assert_eq!(
        e.store.get(&key(1)).await.unwrap().unwrap().config_id,
        Some(ConfigId::new("cfg-1").unwrap())
    );
    let mut c = config(true);
    c.config_id = ConfigId::new("").unwrap();
    let l = Lifecycle::new(
        Arc::new(e.fake.clone()),
        e.store.clone(),
        e.existence.clone(),
        c,
    )
    .unwrap();
    let h = l.resolve(&key(2)).await.unwrap();
    assert_eq!(
        h.metadata().get(owner_metadata::CONFIG).map(String::as_str),
        Some("-")
    );
    assert_eq!(
        h.metadata()
            .get(owner_metadata::SESSION)
            .map(String::as_str),
        Some("session-2")
    );
}

/// Stale bindings rebuild at most once per turn.
#[tokio::test]
async fn stale_bindings_rebuild_once_per_turn() {
    let e = env();
    let tenant = key(1).tenant;
    let cfg = ConfigId::new("cfg-1").unwrap();
    let first = e.lifecycle.resolve(&key(1)).await.unwrap();
    let report = e.store.invalidate_by_config(tenant, &cfg).await.unwrap();
    assert_eq!(report.marked, 1);
    assert!(
        e.fake.state_of(first.id()).is_some(),
        "invalidation leaves the sandbox running"
    );
    // No turn open: the next resolve rebuilds.
    let second = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_ne!(second.id(), first.id());
    assert_eq!(e.fake.state_of(first.id()), None);
    let b = e.store.get(&key(1)).await.unwrap().unwrap();
    assert!(b.stale_at.is_none());
    assert_eq!(b.config_id, Some(cfg.clone()));

    // Inside a turn that already resolved: kept.
    let leases = e
        .store
        .turn_leases()
        .expect("the memory store has turn leases");
    leases.begin_turn(&key(1)).await.unwrap();
    assert_eq!(
        e.lifecycle.resolve(&key(1)).await.unwrap().id(),
        second.id()
    );
    e.store.invalidate_by_config(tenant, &cfg).await.unwrap();
    assert_eq!(
        e.lifecycle.resolve(&key(1)).await.unwrap().id(),
        second.id(),
        "kept during the turn"
    );
    leases.end_turn(&key(1)).await.unwrap();
    // The first resolve of the next turn rebuilds, later ones keep.
    leases.begin_turn(&key(1)).await.unwrap();
    let third = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_ne!(third.id(), second.id());
    assert_eq!(e.lifecycle.resolve(&key(1)).await.unwrap().id(), third.id());
    leases.end_turn(&key(1)).await.unwrap();
}

/// The safety half of stale rebuilds: a turn-state read error keeps the stale sandbox.
#[tokio::test]
async fn a_turn_state_error_keeps_the_stale_sandbox() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(MemoryBindingStore::new())));
    let e = env_with(FakeProvider::new(), faulty.clone());
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    e.store
        .invalidate_by_config(key(1).tenant, &ConfigId::new("cfg-1").unwrap())
        .await
        .unwrap();
    faulty.fail_next(StoreOp::TurnState, unavailable());
    assert_eq!(e.lifecycle.resolve(&key(1)).await.unwrap().id(), h.id());
}

/// With closed inbound traffic, a sandbox without a token is deleted, not bound.
#[tokio::test]
async fn a_sandbox_without_a_required_token_is_deleted() {
    let e = env_with(
        FakeProvider::builder().issue_tokens(false).build(),
        Arc::new(MemoryBindingStore::new()),
    );
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert!(err.message().contains("inbound token"), "{err}");
    assert!(e.fake.sandbox_ids().is_empty());
    assert!(e.store.get(&key(1)).await.unwrap().is_none());
    // Adopted by recovery without a token: deleted too (the default fake connect has none).
    let r = env();
    let orphan = create_owned(&r, &key(2), false).await;
    let h = r.lifecycle.resolve(&key(2)).await.unwrap();
    assert_ne!(h.id(), orphan.id());
    assert_eq!(r.fake.state_of(orphan.id()), None);
}

/// A token reissued on connect is written back to the binding.
#[tokio::test]
async fn a_reissued_token_is_persisted() {
    let e = env();
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    let original = e.store.get(&key(1)).await.unwrap().unwrap().traffic_token;
    assert_eq!(original.as_ref(), h.traffic_token());
    e.fake
        .reissue_token_on_connect(h.id(), Secret::new("tok-reissued"));
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(
        e.store.get(&key(1)).await.unwrap().unwrap().traffic_token,
        Some(Secret::new("tok-reissued"))
    );
}

/// The combined probe is one call and no get; a terminal probe replaces.
#[tokio::test]
async fn connect_probe_is_one_call() {
    let e = env();
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    let (probes, gets) = (
        e.fake.calls(FakeOp::ConnectSession),
        e.fake.calls(FakeOp::Get),
    );
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(e.fake.calls(FakeOp::ConnectSession), probes + 1);
    assert_eq!(e.fake.calls(FakeOp::Get), gets);
    assert_eq!(e.fake.calls(FakeOp::Connect), 0);
    // Without the probe capability: get, then connect; a terminal summary replaces.
    let plain = env_with(
        FakeProvider::builder()
            .without(Capability::ConnectProbe)
            .build(),
        Arc::new(MemoryBindingStore::new()),
    );
    let p = plain.lifecycle.resolve(&key(1)).await.unwrap();
    plain.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(plain.fake.calls(FakeOp::Get), 1);
    assert_eq!(plain.fake.calls(FakeOp::Connect), 1);
    plain.fake.terminate(p.id());
    assert_ne!(plain.lifecycle.resolve(&key(1)).await.unwrap().id(), p.id());
    let _ = h;
}

#[derive(Debug, Default)]
struct Boot {
    template: Mutex<Option<TemplateId>>,
    fail_after: AtomicBool,
    after: AtomicUsize,
    failed: AtomicUsize,
}

#[async_trait]
impl Bootstrapper for Boot {
    async fn template_override(&self, _key: &BindingKey) -> Result<Option<TemplateId>, Error> {
        Ok(self.template.lock().unwrap().clone())
    }
    async fn after_create(
        &self,
        _key: &BindingKey,
        _p: &dyn SandboxProvider,
        _h: &SandboxHandle,
    ) -> Result<(), Error> {
        self.after.fetch_add(1, Ordering::SeqCst);
        if self.fail_after.load(Ordering::SeqCst) {
            return Err(Error::internal(
                Operation::new("bootstrap"),
                "rollback failed",
            ));
        }
        Ok(())
    }
    async fn on_create_failed(&self, _key: &BindingKey, _error: &Error) {
        self.failed.fetch_add(1, Ordering::SeqCst);
    }
}

/// The bootstrapper: its override is used, an after-create failure undoes the binding and the
/// sandbox, and a create failure calls its hook.
#[tokio::test]
async fn bootstrapper_hooks() {
    let e = env();
    let boot = Arc::new(Boot::default());
    let l = e.lifecycle.clone().with_bootstrapper(boot.clone());
    let seed = l.resolve(&key(1)).await.unwrap();
    let snap = sandbox_core::narrow::snapshots(&e.fake)
        .unwrap()
        .create_snapshot(seed.id(), None)
        .await
        .unwrap();
    *boot.template.lock().unwrap() = Some(TemplateId::new(snap.id.as_str()).unwrap());
    l.resolve(&key(2)).await.unwrap();
    assert_eq!(
        e.store
            .get(&key(2))
            .await
            .unwrap()
            .unwrap()
            .template
            .as_str(),
        snap.id.as_str()
    );
    assert_eq!(boot.after.load(Ordering::SeqCst), 2);

    boot.fail_after.store(true, Ordering::SeqCst);
    assert!(l.resolve(&key(3)).await.is_err());
    assert!(
        e.store.get(&key(3)).await.unwrap().is_none(),
        "binding removed after a failed bootstrap"
    );
    assert_eq!(e.fake.sandbox_ids().len(), 2, "and its sandbox");

    boot.fail_after.store(false, Ordering::SeqCst);
    *boot.template.lock().unwrap() = Some(TemplateId::new("snapshot-that-never-boots").unwrap());
    // A snapshot the provider does not hold for this tenant is `snapshot_not_found`
    // ([create.snapshot_owner]), whatever the reason.
    assert_eq!(
        l.resolve(&key(4)).await.unwrap_err().code(),
        Some(sandbox_core::ErrorCode::SnapshotNotFound)
    );
    assert_eq!(
        boot.failed.load(Ordering::SeqCst),
        1,
        "on_create_failed ran"
    );
    // A per-call override (restore) works without a bootstrapper too.
    let restored = e
        .lifecycle
        .resolve_with(
            &key(5),
            ResolveOptions {
                template_override: Some(TemplateId::new(snap.id.as_str()).unwrap()),
            },
        )
        .await
        .unwrap();
    assert!(e.fake.state_of(restored.id()).is_some());
}

/// Peeking never connects; a bound sandbox missing from the listing is unknown, not unbound.
#[tokio::test]
async fn peek_state_never_connects() {
    let e = env();
    assert_eq!(e.lifecycle.peek_state(&key(1)).await.unwrap(), None);
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    e.fake.pause(h.id());
    let connects = e.fake.calls(FakeOp::ConnectSession) + e.fake.calls(FakeOp::Connect);
    assert_eq!(
        e.lifecycle.peek_state(&key(1)).await.unwrap().unwrap().1,
        SandboxState::Paused
    );
    assert_eq!(
        e.fake.calls(FakeOp::ConnectSession) + e.fake.calls(FakeOp::Connect),
        connects
    );
    assert_eq!(
        e.fake.state_of(h.id()),
        Some(SandboxState::Paused),
        "peeking must not resume"
    );
    e.fake.terminate(h.id());
    assert_eq!(
        e.lifecycle.peek_state(&key(1)).await.unwrap().unwrap().1,
        SandboxState::Unknown
    );
    let _ = ListFilter::default();
}

/// Everything the observer heard, in order.
#[derive(Debug, Default)]
struct Recorder {
    events: Mutex<Vec<String>>,
}

impl sandbox_session::observer::LifecycleObserver for Recorder {
    fn resolved(&self, outcome: sandbox_session::observer::ResolveOutcome) {
        self.events
            .lock()
            .unwrap()
            .push(format!("resolved:{outcome:?}"));
    }
    fn sandbox_created(&self) {
        self.events.lock().unwrap().push("created".into());
    }
    fn sandbox_destroyed(&self) {
        self.events.lock().unwrap().push("destroyed".into());
    }
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

/// The observer hears each resolve's outcome and every sandbox the provider created or deleted,
/// including a recovered session's duplicate and a gone sandbox's replacement.
#[tokio::test]
async fn the_observer_hears_outcomes_creates_and_deletes() {
    let clock = Arc::new(sandbox_core::ManualClock::new(
        time::OffsetDateTime::now_utc(),
    ));
    let fake = FakeProvider::builder().clock(clock.clone()).build();
    let mut e = env_with(fake, Arc::new(MemoryBindingStore::new()));
    let recorder = Arc::new(Recorder::default());
    e.lifecycle = e.lifecycle.clone().with_observer(recorder.clone());

    let first = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(recorder.take(), ["created", "resolved:Created"]);
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(recorder.take(), ["resolved:Bound"]);

    e.fake.fail_next(FakeOp::ConnectSession, unavailable());
    e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(recorder.take(), ["resolved:Failed(Unavailable)"]);

    // A gone sandbox is replaced: the old one is not deleted by us (it is gone), a new one is.
    e.fake.terminate(first.id());
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(recorder.take(), ["created", "resolved:Created"]);

    let oldest = create_owned(&e, &key(2), true).await;
    clock.advance(Duration::from_secs(5));
    let dup = create_owned(&e, &key(2), true).await;
    e.fake
        .reissue_token_on_connect(oldest.id(), Secret::new("tok-a"));
    e.fake
        .reissue_token_on_connect(dup.id(), Secret::new("tok-b"));
    e.lifecycle.resolve(&key(2)).await.unwrap();
    assert_eq!(recorder.take(), ["destroyed", "resolved:Recovered"]);

    e.lifecycle.destroy(&key(1)).await.unwrap();
    assert_eq!(recorder.take(), ["destroyed"]);
    e.lifecycle.destroy(&key(1)).await.unwrap();
    assert!(
        recorder.take().is_empty(),
        "an unbound destroy deletes nothing"
    );
}

/// A lifecycle over a memory store that offers the fast path, behind a counting wrapper.
fn fast_env() -> (Env, Arc<FaultyStore>) {
    let memory = MemoryBindingStore::builder().optimistic_reads(true).build();
    let faulty = Arc::new(FaultyStore::new(Arc::new(memory)));
    (env_with(FakeProvider::new(), faulty.clone()), faulty)
}

/// A bound, clean session resolves without the lifecycle lock and without writing: one read,
/// one connect.
#[tokio::test]
async fn a_bound_session_resolves_without_the_lock() {
    let (e, store) = fast_env();
    let first = e.lifecycle.resolve(&key(1)).await.unwrap();
    let locks = store.calls(StoreOp::LockLifecycle);
    assert_eq!(locks, 1, "the first resolve creates under the lock");
    for _ in 0..5 {
        let again = e.lifecycle.resolve(&key(1)).await.unwrap();
        assert_eq!(again.id(), first.id());
    }
    assert_eq!(
        store.calls(StoreOp::LockLifecycle),
        locks,
        "no lock for bound resolves"
    );
    assert_eq!(
        store.calls(StoreOp::ConsumeTurnRebuild),
        1,
        "no turn write either"
    );
    assert_eq!(e.fake.calls(FakeOp::Create), 1);
}

/// Every doubt sends the resolve down the locked path, which then does what it always does.
#[tokio::test]
async fn the_fast_path_falls_back_on_any_doubt() {
    let (e, store) = fast_env();
    let first = e.lifecycle.resolve(&key(1)).await.unwrap();
    let locks = || store.calls(StoreOp::LockLifecycle);

    // A transient connect error: the locked path connects again and succeeds.
    let before = locks();
    e.fake.fail_next(FakeOp::ConnectSession, unavailable());
    let h = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(h.id(), first.id());
    assert_eq!(locks(), before + 1, "fell back after a connect error");

    // An unspent turn rebuild: the locked path spends it.
    let turns = e.store.turn_leases().unwrap();
    turns.begin_turn(&key(1)).await.unwrap();
    let before = locks();
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(locks(), before + 1, "fell back to spend the rebuild");
    assert!(!turns.turn_state(&key(1)).await.unwrap().may_rebuild);
    let before = locks();
    e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_eq!(locks(), before, "spent: the fast path again");
    turns.end_turn(&key(1)).await.unwrap();

    // A stale mark: the locked path rebuilds.
    let cfg = ConfigId::new("cfg-1").unwrap();
    let report = e
        .store
        .invalidate_by_config(key(1).tenant, &cfg)
        .await
        .unwrap();
    assert_eq!(report.marked, 1);
    let before = locks();
    let rebuilt = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_ne!(rebuilt.id(), first.id(), "the stale sandbox was rebuilt");
    assert_eq!(locks(), before + 1);

    // A gone sandbox: the locked path replaces the binding.
    e.fake.terminate(rebuilt.id());
    let replaced = e.lifecycle.resolve(&key(1)).await.unwrap();
    assert_ne!(replaced.id(), rebuilt.id());

    // A store read error: the locked path reads again and fails closed, calling no provider.
    store.fail_always(StoreOp::Get, unavailable());
    let calls = provider_calls(&e.fake);
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert_eq!(
        provider_calls(&e.fake),
        calls,
        "no provider call without the store"
    );
    store.clear_all();

    // A deleted session: the locked path destroys.
    e.existence.gone.store(true, Ordering::SeqCst);
    let err = e.lifecycle.resolve(&key(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SessionDeleted));
    assert!(e.store.get(&key(1)).await.unwrap().is_none());
}

//! The store suite must be able to fail: each defect below is planted in a decorator around the
//! memory store (the test kit's forwarding helper: only the changed methods are written), and the case that guards against it must reject it, while the healthy store
//! passes the same case. A case that passes a broken store is a case that checks nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    Binding, BindingKey, BindingStore, Clock, ConfigId, Error, ErrorCode, InvalidationReport,
    LifecycleLock, LockRelease, ManualClock, Origin, Provider, RewindLock, RewindLocks, SandboxId,
    Secret, SystemClock, TenantId, TurnLeases,
};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::conformance::store::{
    StoreFeature, StoreFeatures, StoreTarget, StoreTiming, find_store_case, run_store_case,
};
use sandbox_testkit::{ForwardStore, StoreHooks};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
    /// The decorator alone: proves a case fails the defect, not the wrapping.
    Nothing,
    CreateOverwrites,
    DeleteIgnoresSandbox,
    TokenPatchClearsStale,
    BeginTurnNeverArmsRebuild,
    ConsumeCreatesLease,
    RewindNotExclusive,
    InvalidateMarksOtherConfigs,
    GlobalLifecycleLock,
    /// Refusals that do not say they are the store's (`[errors.origin]`): the service would
    /// report a store outage as the provider's.
    ErrorsWithoutOrigin,
}

/// The memory store with one defect. Clones share the inner store and the decorator's own
/// state, like the store's own clones.
#[derive(Debug, Clone)]
struct Broken {
    inner: MemoryBindingStore,
    defect: Defect,
    /// Every key ever created through the decorator (the port cannot enumerate).
    created: Arc<Mutex<Vec<BindingKey>>>,
    /// One lock for every key, for `GlobalLifecycleLock`.
    global: Arc<tokio::sync::Mutex<()>>,
}

impl Broken {
    fn new(inner: MemoryBindingStore, defect: Defect) -> Self {
        Broken {
            inner,
            defect,
            created: Arc::default(),
            global: Arc::default(),
        }
    }

    /// The memory store with this defect planted, through the forwarding helper.
    fn store(inner: MemoryBindingStore, defect: Defect) -> ForwardStore<Broken> {
        ForwardStore::new(Arc::new(inner.clone()), Broken::new(inner, defect))
    }

    /// Overwrites `key`'s binding with `binding` (delete, then create).
    async fn overwrite(&self, key: &BindingKey, binding: &Binding) -> Result<(), Error> {
        if let Some(old) = self.inner.get(key).await? {
            self.inner
                .delete_if_match(key, old.provider, &old.sandbox_id)
                .await?;
        }
        self.inner.create(key, binding).await.map(drop)
    }
}

struct NoRelease;

#[async_trait]
impl LockRelease for NoRelease {
    async fn release(self: Box<Self>) -> Result<(), Error> {
        Ok(())
    }
}

/// The inner lock's release, then the global lock.
struct GlobalRelease {
    inner: Option<Box<dyn LockRelease>>,
    _global: tokio::sync::OwnedMutexGuard<()>,
}

#[async_trait]
impl LockRelease for GlobalRelease {
    async fn release(mut self: Box<Self>) -> Result<(), Error> {
        match self.inner.take() {
            Some(inner) => inner.release().await,
            None => Ok(()),
        }
    }
}

/// Only the methods a defect touches; the test kit's forwarding helper forwards the rest. The
/// hooks reach the store through `self.inner`, the same store `next` is.
#[async_trait]
impl StoreHooks for Broken {
    async fn create(
        &self,
        _next: &dyn BindingStore,
        key: &BindingKey,
        binding: &Binding,
    ) -> Result<bool, Error> {
        binding
            .validate(key)
            .map_err(|e| e.with_origin(Origin::Store))?;
        self.created.lock().unwrap().push(key.clone());
        if self.defect == Defect::CreateOverwrites {
            self.overwrite(key, binding).await?;
            return Ok(true);
        }
        self.inner.create(key, binding).await
    }

    async fn delete_if_match(
        &self,
        _next: &dyn BindingStore,
        key: &BindingKey,
        provider: Provider,
        sandbox: &SandboxId,
    ) -> Result<bool, Error> {
        if self.defect == Defect::DeleteIgnoresSandbox
            && let Some(b) = self.inner.get(key).await?
            && b.provider == provider
        {
            return self
                .inner
                .delete_if_match(key, provider, &b.sandbox_id)
                .await;
        }
        self.inner.delete_if_match(key, provider, sandbox).await
    }

    async fn replace_traffic_token_if_match(
        &self,
        _next: &dyn BindingStore,
        key: &BindingKey,
        expected: &Binding,
        token: &Secret,
    ) -> Result<bool, Error> {
        if self.defect == Defect::TokenPatchClearsStale {
            // Writes back the caller's copy with the new token: a whole-document replace.
            let Some(current) = self.inner.get(key).await? else {
                return Ok(false);
            };
            if token.is_empty()
                || current.provider != expected.provider
                || current.sandbox_id != expected.sandbox_id
                || current.traffic_token.as_ref() == Some(token)
            {
                return Ok(false);
            }
            let mut patched = expected.clone();
            patched.traffic_token = Some(token.clone());
            self.overwrite(key, &patched).await?;
            return Ok(true);
        }
        self.inner
            .replace_traffic_token_if_match(key, expected, token)
            .await
    }

    async fn lock_lifecycle(
        &self,
        _next: &dyn BindingStore,
        key: &BindingKey,
    ) -> Result<LifecycleLock, Error> {
        if self.defect == Defect::GlobalLifecycleLock {
            let global = self.global.clone().lock_owned().await;
            let (token, release) = self.inner.lock_lifecycle(key).await?.into_parts();
            return Ok(LifecycleLock::new(
                token,
                Box::new(GlobalRelease {
                    inner: Some(release),
                    _global: global,
                }),
            ));
        }
        self.inner.lock_lifecycle(key).await
    }

    async fn invalidate_by_config(
        &self,
        _next: &dyn BindingStore,
        tenant: TenantId,
        config: &ConfigId,
    ) -> Result<InvalidationReport, Error> {
        if self.defect != Defect::InvalidateMarksOtherConfigs {
            return self.inner.invalidate_by_config(tenant, config).await;
        }
        // Invalidates every config the tenant has a binding of.
        let keys: Vec<BindingKey> = self.created.lock().unwrap().clone();
        let mut configs = BTreeSet::from([config.clone()]);
        for key in keys.iter().filter(|k| k.tenant == tenant) {
            if let Some(c) = self.inner.get(key).await?.and_then(|b| b.config_id) {
                configs.insert(c);
            }
        }
        let mut report = InvalidationReport::default();
        for c in configs {
            let r = self.inner.invalidate_by_config(tenant, &c).await?;
            report.marked += r.marked;
            report.failed.extend(r.failed);
        }
        Ok(report)
    }

    async fn begin_turn(&self, _next: &dyn TurnLeases, key: &BindingKey) -> Result<(), Error> {
        self.inner.begin_turn(key).await?;
        if self.defect == Defect::BeginTurnNeverArmsRebuild {
            self.inner.consume_turn_rebuild(key).await?;
        }
        Ok(())
    }
    async fn consume_turn_rebuild(
        &self,
        _next: &dyn TurnLeases,
        key: &BindingKey,
    ) -> Result<(), Error> {
        if self.defect == Defect::ConsumeCreatesLease && !self.inner.turn_state(key).await?.active {
            self.inner.begin_turn(key).await?;
        }
        self.inner.consume_turn_rebuild(key).await
    }
    async fn try_lock_rewind(
        &self,
        _next: &dyn RewindLocks,
        key: &BindingKey,
    ) -> Result<RewindLock, Error> {
        match self.inner.try_lock_rewind(key).await {
            Err(e)
                if self.defect == Defect::RewindNotExclusive
                    && e.code() == Some(ErrorCode::SessionRewindLocked) =>
            {
                Ok(RewindLock::new(Box::new(NoRelease)))
            }
            Err(e) if self.defect == Defect::ErrorsWithoutOrigin => {
                Err(e.with_origin(Origin::Unspecified))
            }
            other => other,
        }
    }
}

const LOCK_WAIT: Duration = Duration::from_millis(500);

/// A target over `wrap(store)`, whose two handles share one memory store and one clock.
fn target(wrap: impl Fn(MemoryBindingStore) -> Arc<dyn BindingStore>) -> StoreTarget {
    let clock = ManualClock::new(SystemClock.now());
    let store = MemoryBindingStore::builder()
        .clock(Arc::new(clock.clone()))
        .invalidate_lock_wait(LOCK_WAIT)
        .build();
    let handle = wrap(store);
    StoreTarget::new(
        handle.clone(),
        handle,
        StoreFeatures::of(&[
            StoreFeature::TurnLeases,
            StoreFeature::RewindLock,
            StoreFeature::Activities,
        ]),
        StoreTiming {
            invalidate_lock_wait: LOCK_WAIT,
            ..StoreTiming::STANDARD
        },
    )
    .with_clock(Arc::new(move |by| clock.advance(by)))
}

async fn outcome(case: &str, target: StoreTarget) -> Result<(), String> {
    let case = find_store_case(case).unwrap_or_else(|| panic!("no store case named {case}"));
    run_store_case(&case, target, fastrand::u64(..))
        .await
        .map_err(|f| f.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_planted_defect_is_caught_by_its_case() {
    let table = [
        (Defect::CreateOverwrites, "store_create_if_absent"),
        (Defect::DeleteIgnoresSandbox, "store_delete_if_match_exact"),
        (
            Defect::TokenPatchClearsStale,
            "store_token_patch_keeps_concurrent_stale_mark",
        ),
        (
            Defect::BeginTurnNeverArmsRebuild,
            "store_turn_lease_lifecycle",
        ),
        (
            Defect::ConsumeCreatesLease,
            "store_turn_consume_without_lease_creates_none",
        ),
        (Defect::RewindNotExclusive, "store_rewind_lock_is_exclusive"),
        (
            Defect::InvalidateMarksOtherConfigs,
            "store_invalidate_marks_only_tenant_and_config",
        ),
        (
            Defect::GlobalLifecycleLock,
            "store_lock_different_keys_in_parallel",
        ),
        (
            Defect::ErrorsWithoutOrigin,
            "store_rewind_lock_is_exclusive",
        ),
    ];
    for (defect, case) in table {
        let healthy = outcome(case, target(|s| Arc::new(s))).await;
        assert!(
            healthy.is_ok(),
            "{case} fails the healthy store: {healthy:?}"
        );
        // The decorator without a defect must pass too: otherwise the case could be failing
        // the wrapping rather than the defect.
        let wrapped = outcome(
            case,
            target(|s| Arc::new(Broken::store(s, Defect::Nothing)) as _),
        )
        .await;
        assert!(
            wrapped.is_ok(),
            "{case} fails the bare decorator: {wrapped:?}"
        );
        let broken = outcome(case, target(|s| Arc::new(Broken::store(s, defect)) as _)).await;
        assert!(broken.is_err(), "{case} did not catch {defect:?}");
    }
}

#[tokio::test]
async fn declaring_a_feature_the_store_lacks_is_caught() {
    // A store that declares turn leases in its target but hands none out.
    #[derive(Debug)]
    struct NoTurns;
    impl StoreHooks for NoTurns {
        fn hides_turn_leases(&self) -> bool {
            true
        }
    }
    let case = find_store_case("store_declared_features_match").unwrap();
    let healthy = run_store_case(&case, target(|s| Arc::new(s)), 1).await;
    assert!(healthy.is_ok(), "{healthy:?}");
    let err = run_store_case(
        &case,
        target(|s| Arc::new(ForwardStore::new(Arc::new(s), NoTurns)) as _),
        2,
    )
    .await
    .unwrap_err()
    .0;
    assert!(
        err.contains("feature turn_leases: declared=true but callable=false"),
        "{err}"
    );
}

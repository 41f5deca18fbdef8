//! The binding-store conformance suite: plain async functions over `&dyn BindingStore` (and
//! its optional turn leases, rewind lock and activity registry), each registered only when the
//! store declares the features it needs.
//!
//! It checks every contract of `sandbox_core::ports::store` a port call can observe, each case
//! citing the tagged bullets it checks (`lock.exclusive`, `create.absent`, ...). Every run
//! draws random tenants, session IDs, sandbox IDs, configs and tokens, so no canned answer can
//! pass; `SANDBOX_CONFORMANCE_SEED` replays a run. The registration, describe and run
//! machinery is the provider suite's, through [`crate::conformance::harness`].
//!
//! A target is two handles on one backing ([`StoreTarget::store`] and [`StoreTarget::peer`]:
//! two clones of a memory store, two clients of one Redis), so the cases can check that the
//! lock and leases hold *across* instances, plus optional hooks for what the port cannot do:
//! planting raw bytes (malformed values), taking the backing down (fail-closed) and moving the
//! store's clock (lease expiry without real waiting).
//!
//! Trials are named `conformance::store_<case>`; the describe document has the provider
//! suite's shape, with store feature names in `declared`, `requires` and `missing`, so
//! `cargo xtask conformance <store adapter>` prints the same table.

mod cases;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_core::{
    ActivityRegistry, BackgroundActivity, Binding, BindingKey, BindingStore, ConfigId, Error,
    ErrorCode, ErrorKind, Origin, Provider, RewindLocks, SandboxId, Secret, SessionId, TemplateId,
    TenantId, TurnLeases,
};
use time::OffsetDateTime;

use super::harness::{CaseRun, Factory, SuiteCase, describe_suite, find, run_one, run_suite};
use super::{CaseResult, Failure, ensure_eq, within};

pub use cases::all_store_cases;

/// One optional part of a store, or a hook its target provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreFeature {
    /// [`BindingStore::turn_leases`] is implemented.
    TurnLeases,
    /// [`BindingStore::rewind_locks`] is implemented.
    RewindLock,
    /// [`BindingStore::activities`] is implemented.
    Activities,
    /// The target can plant raw bytes as a stored value ([`StoreTarget::plant_raw`]); a store
    /// that keeps typed values (the memory store) has no bytes to corrupt.
    RawValues,
    /// The target can take its backing down and bring it back ([`StoreTarget::take_down`],
    /// [`StoreTarget::bring_up`]); a process-local store cannot be unreachable.
    Outage,
}

impl StoreFeature {
    /// Every feature, in declaration order.
    pub const ALL: [StoreFeature; 5] = [
        StoreFeature::TurnLeases,
        StoreFeature::RewindLock,
        StoreFeature::Activities,
        StoreFeature::RawValues,
        StoreFeature::Outage,
    ];

    /// The name used in describe documents and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreFeature::TurnLeases => "turn_leases",
            StoreFeature::RewindLock => "rewind_lock",
            StoreFeature::Activities => "activities",
            StoreFeature::RawValues => "raw_values",
            StoreFeature::Outage => "outage",
        }
    }
}

impl fmt::Display for StoreFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`StoreFeature`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreFeatures {
    pub turn_leases: bool,
    pub rewind_lock: bool,
    pub activities: bool,
    pub raw_values: bool,
    pub outage: bool,
}

impl StoreFeatures {
    /// No feature.
    pub const NONE: StoreFeatures = StoreFeatures {
        turn_leases: false,
        rewind_lock: false,
        activities: false,
        raw_values: false,
        outage: false,
    };

    /// The set holding exactly `features`.
    pub fn of(features: &[StoreFeature]) -> Self {
        features
            .iter()
            .fold(StoreFeatures::NONE, |set, f| set.with(*f, true))
    }

    /// Whether `feature` is in the set.
    pub fn has(&self, feature: StoreFeature) -> bool {
        match feature {
            StoreFeature::TurnLeases => self.turn_leases,
            StoreFeature::RewindLock => self.rewind_lock,
            StoreFeature::Activities => self.activities,
            StoreFeature::RawValues => self.raw_values,
            StoreFeature::Outage => self.outage,
        }
    }

    /// The set with `feature` switched `on` or off.
    pub fn with(mut self, feature: StoreFeature, on: bool) -> Self {
        let flag = match feature {
            StoreFeature::TurnLeases => &mut self.turn_leases,
            StoreFeature::RewindLock => &mut self.rewind_lock,
            StoreFeature::Activities => &mut self.activities,
            StoreFeature::RawValues => &mut self.raw_values,
            StoreFeature::Outage => &mut self.outage,
        };
        *flag = on;
        self
    }
}

/// The timings the target's store was built with; cases size their waits from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreTiming {
    /// Lifetime of a turn lease that is not re-armed.
    pub turn_lease_ttl: Duration,
    /// Lease of the rewind lock (renewed while held).
    pub rewind_ttl: Duration,
    /// How long `invalidate_by_config` waits for one session's lifecycle lock.
    pub invalidate_lock_wait: Duration,
}

impl StoreTiming {
    /// The timings the workspace's stores default to: a 30 min turn lease, a 2 min rewind
    /// lease, a 2 s invalidation wait.
    pub const STANDARD: StoreTiming = StoreTiming {
        turn_lease_ttl: Duration::from_secs(30 * 60),
        rewind_ttl: Duration::from_secs(2 * 60),
        invalidate_lock_wait: Duration::from_secs(2),
    };
}

/// The future a target hook returns.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
/// Stores `bytes` as the raw value of `key`'s binding, bypassing every check.
pub type PlantRaw = Arc<dyn Fn(BindingKey, Vec<u8>) -> HookFuture + Send + Sync>;
/// Takes the backing down or brings it back.
pub type OutageHook = Arc<dyn Fn() -> HookFuture + Send + Sync>;
/// Moves the clock the store judges leases by.
pub type AdvanceClock = Arc<dyn Fn(Duration) + Send + Sync>;

/// What a store case runs against.
#[derive(Clone)]
pub struct StoreTarget {
    /// The store under test.
    pub store: Arc<dyn BindingStore>,
    /// A second instance on the same backing (another clone, another client).
    pub peer: Arc<dyn BindingStore>,
    /// What the target claims; the suite checks it against the pinned set and against what the
    /// store and hooks really offer.
    pub features: StoreFeatures,
    pub timing: StoreTiming,
    /// Feature `raw_values`.
    pub plant_raw: Option<PlantRaw>,
    /// Feature `outage` (with `bring_up`).
    pub take_down: Option<OutageHook>,
    /// Feature `outage` (with `take_down`).
    pub bring_up: Option<OutageHook>,
    /// Moves the store's clock. Without it, cases wait in real time, so a target without a
    /// clock hook must build its store with short TTLs (a case refuses to sleep for more than
    /// [`MAX_REAL_WAIT`] in one step).
    pub advance_clock: Option<AdvanceClock>,
}

/// The longest single real-time wait a case performs for a target without a clock hook.
pub const MAX_REAL_WAIT: Duration = Duration::from_secs(20);

impl StoreTarget {
    /// A target without hooks.
    pub fn new(
        store: Arc<dyn BindingStore>,
        peer: Arc<dyn BindingStore>,
        features: StoreFeatures,
        timing: StoreTiming,
    ) -> Self {
        StoreTarget {
            store,
            peer,
            features,
            timing,
            plant_raw: None,
            take_down: None,
            bring_up: None,
            advance_clock: None,
        }
    }

    /// Adds a clock hook.
    pub fn with_clock(mut self, advance: AdvanceClock) -> Self {
        self.advance_clock = Some(advance);
        self
    }

    /// Adds the raw-value hook.
    pub fn with_plant_raw(mut self, plant: PlantRaw) -> Self {
        self.plant_raw = Some(plant);
        self
    }

    /// Adds the outage hooks.
    pub fn with_outage(mut self, take_down: OutageHook, bring_up: OutageHook) -> Self {
        self.take_down = Some(take_down);
        self.bring_up = Some(bring_up);
        self
    }
}

impl fmt::Debug for StoreTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTarget")
            .field("store", &self.store)
            .field("features", &self.features)
            .field("timing", &self.timing)
            .field("plant_raw", &self.plant_raw.is_some())
            .field(
                "outage",
                &(self.take_down.is_some() && self.bring_up.is_some()),
            )
            .field("advance_clock", &self.advance_clock.is_some())
            .finish_non_exhaustive()
    }
}

/// One store conformance case; every name starts with `store_`.
pub type StoreCase = SuiteCase<StoreCtx, StoreFeature>;

/// The store suite, as the shared harness sees it.
#[derive(Debug, Clone, Copy)]
pub struct StoreSuite;

super::harness::subject! { StoreSuite: StoreTarget, StoreFeatures, StoreCtx;
"store adapter", "store"; cases::declaration_cases, all_store_cases; StoreCtx::new }

/// Builds the store under test inside the trial's runtime, given the run's namespace (a shared
/// backing such as Redis scopes its keys by it, so a run never sees another run's state).
pub type StoreTargetFactory = Factory<StoreTarget>;

/// Runs the store suite for `adapter` and returns the process exit code. `features` is the set
/// the adapter's test pins, known without contacting the backing. Runs when
/// `SANDBOX_CONFORMANCE_ADAPTER` names this adapter or is unset (hermetic stores such as the
/// memory store run in plain `cargo test`).
pub fn run_store_main(
    adapter: &'static str,
    features: StoreFeatures,
    factory: StoreTargetFactory,
) -> ExitCode {
    run_suite::<StoreSuite>(adapter, features, factory, false)
}

/// [`run_store_main`] for stores that need a service (a Redis server): unless
/// `SANDBOX_CONFORMANCE_ADAPTER` names this adapter, every case is registered as *ignored*.
pub fn run_store_main_when_selected(
    adapter: &'static str,
    features: StoreFeatures,
    factory: StoreTargetFactory,
) -> ExitCode {
    run_suite::<StoreSuite>(adapter, features, factory, true)
}

/// The store case named `name` (with its `store_` prefix, without `conformance::`), builtin
/// cases included.
pub fn find_store_case(name: &str) -> Option<StoreCase> {
    find::<StoreSuite>(name)
}

/// Runs one case against `target` and cleans up after it: the library form of a trial, for
/// tests that check the suite itself. The target's own `features` serve as the pinned set.
pub async fn run_store_case(case: &StoreCase, target: StoreTarget, seed: u64) -> CaseResult {
    let pinned = target.features;
    run_one::<StoreSuite>(case, target, pinned, seed).await
}

/// Per-case context: both store handles, the hooks, the run's namespace and RNG, and the
/// bindings to delete at the end.
pub struct StoreCtx {
    target: StoreTarget,
    pinned: StoreFeatures,
    run: CaseRun,
    created: Mutex<Vec<BindingKey>>,
}

impl fmt::Debug for StoreCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreCtx").field("run", &self.run).finish()
    }
}

impl StoreCtx {
    /// A context for `case` in the run `namespace`, with payloads drawn from `seed`; `pinned`
    /// is the feature set the adapter's test declares.
    pub fn new(
        target: StoreTarget,
        pinned: StoreFeatures,
        namespace: &str,
        case: &'static str,
        seed: u64,
    ) -> Self {
        StoreCtx {
            target,
            pinned,
            run: CaseRun::new(namespace, case, seed),
            created: Mutex::new(Vec::new()),
        }
    }

    /// The store under test.
    pub fn store(&self) -> &dyn BindingStore {
        &*self.target.store
    }
    /// The second instance on the same backing.
    pub fn peer(&self) -> &dyn BindingStore {
        &*self.target.peer
    }
    /// A shared handle to the store (for spawned tasks).
    pub fn store_arc(&self) -> Arc<dyn BindingStore> {
        self.target.store.clone()
    }
    /// A shared handle to the peer (for spawned tasks).
    pub fn peer_arc(&self) -> Arc<dyn BindingStore> {
        self.target.peer.clone()
    }
    /// The target (timings, hooks).
    pub fn target(&self) -> &StoreTarget {
        &self.target
    }
    /// The feature set the adapter's test pins.
    pub fn pinned(&self) -> StoreFeatures {
        self.pinned
    }
    /// The store's timings.
    pub fn timing(&self) -> StoreTiming {
        self.target.timing
    }
    super::harness::run_accessors!();

    // ---- random payloads ----------------------------------------------------------------

    /// A random tenant (wide enough that two draws practically never collide, so a tenant-wide
    /// operation in one case never sees another case's bindings).
    pub fn tenant(&self) -> Result<TenantId, Failure> {
        let raw = self.with_rng(|r| r.u64(1..=(1 << 53)));
        Ok(TenantId::new(raw)?)
    }
    /// A tenant different from `other`.
    pub fn other_tenant(&self, other: TenantId) -> Result<TenantId, Failure> {
        loop {
            let t = self.tenant()?;
            if t != other {
                return Ok(t);
            }
        }
    }
    /// A random session ID carrying the run's namespace.
    pub fn session(&self) -> Result<SessionId, Failure> {
        Ok(SessionId::new(format!(
            "{}-{}",
            self.run.namespace(),
            self.token()
        ))?)
    }
    /// A random key under a random tenant.
    pub fn key(&self) -> Result<BindingKey, Failure> {
        Ok(BindingKey {
            tenant: self.tenant()?,
            session: self.session()?,
        })
    }
    /// A random key under `tenant`.
    pub fn key_in(&self, tenant: TenantId) -> Result<BindingKey, Failure> {
        Ok(BindingKey {
            tenant,
            session: self.session()?,
        })
    }
    /// A random sandbox ID.
    pub fn sandbox_id(&self) -> Result<SandboxId, Failure> {
        Ok(SandboxId::new(format!("sbx-{}", self.token()))?)
    }
    /// A random traffic token.
    pub fn secret(&self) -> Secret {
        Secret::new(format!("tok-{}{}", self.token(), self.token()))
    }
    /// A random config ID.
    pub fn config(&self) -> Result<ConfigId, Failure> {
        Ok(ConfigId::new(format!("cfg-{}", self.token()))?)
    }
    /// A random provider.
    pub fn provider(&self) -> Provider {
        self.with_rng(|r| Provider::ALL[r.usize(..Provider::ALL.len())])
    }
    /// A provider other than `p`.
    pub fn other_provider(&self, p: Provider) -> Provider {
        let others: Vec<Provider> = Provider::ALL.into_iter().filter(|x| *x != p).collect();
        self.with_rng(|r| others[r.usize(..others.len())])
    }
    /// A random instant in 2024–2030 with a random nanosecond fraction (bindings must keep
    /// every digit).
    pub fn instant(&self) -> Result<OffsetDateTime, Failure> {
        let nanos = self.with_rng(|r| {
            i128::from(r.i64(1_704_067_200..1_893_456_000)) * 1_000_000_000
                + i128::from(r.u32(0..1_000_000_000))
        });
        OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .map_err(|e| Failure(format!("bad test instant: {e}")))
    }
    /// A random whole-second instant (for values stores may keep at second precision).
    pub fn whole_second(&self) -> Result<OffsetDateTime, Failure> {
        let secs = self.with_rng(|r| r.i64(1_704_067_200..1_893_456_000));
        OffsetDateTime::from_unix_timestamp(secs)
            .map_err(|e| Failure(format!("bad test instant: {e}")))
    }
    /// A fresh binding for `key`: random provider, sandbox, template and creation time, no
    /// config, no stale mark, no token.
    pub fn binding(&self, key: &BindingKey) -> Result<Binding, Failure> {
        Ok(Binding::new(
            key,
            self.provider(),
            self.sandbox_id()?,
            TemplateId::new(format!("tpl-{}", self.token()))?,
            self.instant()?,
        ))
    }
    /// A random background activity of `kind`.
    pub fn activity(&self, kind: &str) -> Result<BackgroundActivity, Failure> {
        Ok(BackgroundActivity {
            id: format!("act-{}", self.token()),
            kind: kind.to_owned(),
            started_at: self.whole_second()?,
        })
    }

    // ---- store helpers ------------------------------------------------------------------

    /// Creates `binding` under `key` through `store`, expecting it to be stored; it is deleted
    /// when the case ends.
    pub async fn create_on(
        &self,
        store: &dyn BindingStore,
        key: &BindingKey,
        binding: &Binding,
    ) -> CaseResult {
        let stored = within(OP_LIMIT, "create", store.create(key, binding)).await??;
        self.track(key.clone());
        ensure_eq(&format!("create {key} on an unbound key"), stored, true)
    }
    /// [`StoreCtx::create_on`] the store under test.
    pub async fn create(&self, key: &BindingKey, binding: &Binding) -> CaseResult {
        self.create_on(self.store(), key, binding).await
    }
    /// Registers a key whose binding is deleted when the case ends.
    pub fn track(&self, key: BindingKey) {
        let mut created = self.created.lock().unwrap_or_else(PoisonError::into_inner);
        if !created.contains(&key) {
            created.push(key);
        }
    }
    /// The binding stored under `key`, through `store`.
    pub async fn get_on(
        &self,
        store: &dyn BindingStore,
        key: &BindingKey,
    ) -> Result<Option<Binding>, Failure> {
        within(OP_LIMIT, "get", store.get(key))
            .await?
            .map_err(|e| Failure(format!("get {key}: {e}")))
    }
    /// The turn leases of `store`, which the case's requirements promise.
    pub fn turns<'a>(&self, store: &'a dyn BindingStore) -> Result<&'a dyn TurnLeases, Failure> {
        store
            .turn_leases()
            .ok_or_else(|| Failure("the store declares turn_leases but has none".to_owned()))
    }
    /// The rewind locks of `store`, which the case's requirements promise.
    pub fn rewinds<'a>(&self, store: &'a dyn BindingStore) -> Result<&'a dyn RewindLocks, Failure> {
        store
            .rewind_locks()
            .ok_or_else(|| Failure("the store declares rewind_lock but has none".to_owned()))
    }
    /// The activity registry of `store`, which the case's requirements promise.
    pub fn activities<'a>(
        &self,
        store: &'a dyn BindingStore,
    ) -> Result<&'a dyn ActivityRegistry, Failure> {
        store
            .activities()
            .ok_or_else(|| Failure("the store declares activities but has none".to_owned()))
    }

    /// Lets `d` pass for the store: moves its clock when the target can, else sleeps.
    pub async fn elapse(&self, d: Duration) -> CaseResult {
        match &self.target.advance_clock {
            Some(advance) => {
                advance(d);
                tokio::task::yield_now().await;
                Ok(())
            }
            None if d > MAX_REAL_WAIT => Err(Failure(format!(
                "the case must let {} ms pass, but the target has no clock hook and a real wait \
                 over {} s is refused: build the store with short TTLs or provide advance_clock",
                d.as_millis(),
                MAX_REAL_WAIT.as_secs()
            ))),
            None => {
                tokio::time::sleep(d).await;
                Ok(())
            }
        }
    }

    /// Plants `bytes` as the raw value of `key` (feature `raw_values`).
    pub async fn plant_raw(&self, key: &BindingKey, bytes: Vec<u8>) -> CaseResult {
        let plant =
            self.target.plant_raw.as_ref().ok_or_else(|| {
                Failure("the target declares raw_values but has no hook".to_owned())
            })?;
        within(OP_LIMIT, "plant_raw", plant(key.clone(), bytes))
            .await?
            .map_err(|e| Failure(format!("plant_raw {key}: {e}")))
    }

    /// Takes the backing down (feature `outage`).
    pub async fn take_down(&self) -> CaseResult {
        let hook =
            self.target.take_down.as_ref().ok_or_else(|| {
                Failure("the target declares outage but has no take_down".to_owned())
            })?;
        within(OP_LIMIT, "take_down", hook())
            .await?
            .map_err(|e| Failure(format!("take_down: {e}")))
    }

    /// Brings the backing back (feature `outage`).
    pub async fn bring_up(&self) -> CaseResult {
        let hook =
            self.target.bring_up.as_ref().ok_or_else(|| {
                Failure("the target declares outage but has no bring_up".to_owned())
            })?;
        within(OP_LIMIT, "bring_up", hook())
            .await?
            .map_err(|e| Failure(format!("bring_up: {e}")))
    }

    /// Deletes every binding the case created. Errors are reported, not fatal: cleanup of one
    /// key must not stop cleanup of the next.
    pub async fn cleanup(&self) -> Vec<String> {
        let keys =
            std::mem::take(&mut *self.created.lock().unwrap_or_else(PoisonError::into_inner));
        let mut problems = Vec::new();
        for key in keys {
            let found = within(OP_LIMIT, "cleanup get", self.store().get(&key)).await;
            match found {
                Ok(Ok(Some(b))) => {
                    let deleted = within(
                        OP_LIMIT,
                        "cleanup delete",
                        self.store()
                            .delete_if_match(&key, b.provider, &b.sandbox_id),
                    )
                    .await;
                    match deleted {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => problems.push(format!("cleanup: delete {key}: {e}")),
                        Err(f) => problems.push(format!("cleanup: {f}")),
                    }
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => problems.push(format!("cleanup: get {key}: {e}")),
                Err(f) => problems.push(format!("cleanup: {f}")),
            }
        }
        problems
    }
}

/// How long one store call may take before a case fails with its name.
pub const OP_LIMIT: Duration = Duration::from_secs(30);

/// `[errors.origin]`: asserts that `result` failed with an error the store says is its own,
/// and returns that error.
pub fn expect_store_error<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
) -> Result<Error, Failure> {
    match result {
        Err(e) if e.origin() == Origin::Store => Ok(e),
        Err(e) => Err(Failure(format!(
            "{what}: the error's origin is {:?}, not the store: {e} (errors.origin)",
            e.origin()
        ))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected an error, got success: {v:?}"
        ))),
    }
}

/// Asserts that `result` failed with a store error (`[errors.origin]`) with `code`.
pub fn expect_code<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    code: ErrorCode,
) -> CaseResult {
    let e = expect_store_error(what, result)?;
    if e.code() == Some(code) {
        return Ok(());
    }
    Err(Failure(format!(
        "{what}: expected an error with code {code}, got {e} (code {:?})",
        e.code()
    )))
}

/// Asserts that `result` failed with a store error (`[errors.origin]`) of `kind`.
pub fn expect_kind<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    kind: ErrorKind,
) -> CaseResult {
    let e = expect_store_error(what, result)?;
    if e.kind() == kind {
        return Ok(());
    }
    Err(Failure(format!("{what}: expected a {kind} error, got {e}")))
}

/// The describe document `cargo xtask` reads: which store cases apply to `declared`. Same
/// shape as the provider suite's, with feature names where that one has capability names.
pub fn describe(adapter: &str, declared: &StoreFeatures) -> serde_json::Value {
    describe_suite::<StoreSuite>(adapter, declared)
}

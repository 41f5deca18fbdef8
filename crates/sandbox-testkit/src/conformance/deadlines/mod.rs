//! The deadline-store conformance suite: plain async functions over `&dyn DeadlineStore`, each
//! registered only when the target declares the features it needs.
//!
//! It checks every contract of `sandbox_core::ports::deadlines` a port call can observe, each
//! case citing the tagged bullets it checks (`deadlines.set`, `deadlines.due`, ...). Keys and
//! instants are random per run (`SANDBOX_CONFORMANCE_SEED` replays one), so no canned answer
//! can pass. The registration, describe and run machinery is the provider suite's, through
//! [`crate::conformance::harness`]; a store's tests run the whole suite with
//! [`check_deadline_store`] inside one ordinary test (the stores live in crates whose tests are
//! unit tests or a service-needing `tests/it/` binary, not a conformance binary of their own).
//!
//! `due` answers about the whole store, so no two cases may share a backing: a target factory
//! builds a store on a fresh, empty backing on every call (a Redis target appends a random
//! suffix to the namespace it is given, a file target opens a new directory). Each case removes
//! the deadlines it set when it ends.
//!
//! A target is the store, optionally a second instance on the same backing
//! ([`DeadlineFeature::Peer`]: another client of one Redis) and optionally a hook that opens the
//! store afresh on the backing ([`DeadlineFeature::Reopen`]: what a restarted service does).

mod cases;
mod memory;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sandbox_core::{DeadlineStore, Error, ErrorCode, ErrorKind, Origin};
use time::OffsetDateTime;

use super::harness::{CaseRun, Declaration, Factory, SuiteCase, describe_suite, find, run_one};
use super::{CaseResult, Failure, within};

pub use cases::all_deadline_cases;
pub use memory::MemoryDeadlines;

/// One optional part of a deadline target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeadlineFeature {
    /// [`DeadlineTarget::peer`] is a second instance on the same backing.
    Peer,
    /// [`DeadlineTarget::reopen`] opens the store afresh on the same backing.
    Reopen,
}

impl DeadlineFeature {
    /// Every feature, in declaration order.
    pub const ALL: [DeadlineFeature; 2] = [DeadlineFeature::Peer, DeadlineFeature::Reopen];

    /// The name used in describe documents and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineFeature::Peer => "peer",
            DeadlineFeature::Reopen => "reopen",
        }
    }
}

impl fmt::Display for DeadlineFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`DeadlineFeature`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeadlineFeatures {
    pub peer: bool,
    pub reopen: bool,
}

impl DeadlineFeatures {
    /// No feature.
    pub const NONE: DeadlineFeatures = DeadlineFeatures {
        peer: false,
        reopen: false,
    };

    /// The set holding exactly `features`.
    pub fn of(features: &[DeadlineFeature]) -> Self {
        let mut set = DeadlineFeatures::NONE;
        for f in features {
            match f {
                DeadlineFeature::Peer => set.peer = true,
                DeadlineFeature::Reopen => set.reopen = true,
            }
        }
        set
    }

    /// Whether `feature` is in the set.
    pub fn has(&self, feature: DeadlineFeature) -> bool {
        match feature {
            DeadlineFeature::Peer => self.peer,
            DeadlineFeature::Reopen => self.reopen,
        }
    }
}

impl Declaration for DeadlineFeatures {
    type Item = DeadlineFeature;
    fn items() -> &'static [DeadlineFeature] {
        &DeadlineFeature::ALL
    }
    fn has(&self, item: DeadlineFeature) -> bool {
        DeadlineFeatures::has(self, item)
    }
    fn name(item: DeadlineFeature) -> &'static str {
        item.as_str()
    }
}

/// The future [`ReopenHook`] returns.
pub type ReopenFuture =
    Pin<Box<dyn Future<Output = Result<Arc<dyn DeadlineStore>, String>> + Send>>;
/// Opens the store afresh on the target's backing, as a restarted service would.
pub type ReopenHook = Arc<dyn Fn() -> ReopenFuture + Send + Sync>;

/// What a deadline case runs against.
#[derive(Clone)]
pub struct DeadlineTarget {
    /// The store under test, on a fresh, empty backing.
    pub store: Arc<dyn DeadlineStore>,
    /// Feature `peer`: a second instance on the same backing.
    pub peer: Option<Arc<dyn DeadlineStore>>,
    /// Feature `reopen`.
    pub reopen: Option<ReopenHook>,
    /// What the target claims; the declaration case checks it against the pinned set and
    /// against the hooks it carries.
    pub features: DeadlineFeatures,
}

impl DeadlineTarget {
    /// A target with neither a peer nor a reopen hook.
    pub fn new(store: Arc<dyn DeadlineStore>) -> Self {
        DeadlineTarget {
            store,
            peer: None,
            reopen: None,
            features: DeadlineFeatures::NONE,
        }
    }
    /// Adds a second instance on the same backing (feature `peer`).
    pub fn with_peer(mut self, peer: Arc<dyn DeadlineStore>) -> Self {
        self.peer = Some(peer);
        self.features.peer = true;
        self
    }
    /// Adds the reopen hook (feature `reopen`).
    pub fn with_reopen(mut self, reopen: ReopenHook) -> Self {
        self.reopen = Some(reopen);
        self.features.reopen = true;
        self
    }
}

impl fmt::Debug for DeadlineTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineTarget")
            .field("store", &self.store)
            .field("peer", &self.peer.is_some())
            .field("reopen", &self.reopen.is_some())
            .field("features", &self.features)
            .finish()
    }
}

/// One deadline conformance case; every name starts with `deadlines_`.
pub type DeadlineCase = SuiteCase<DeadlineCtx, DeadlineFeature>;

/// The deadline suite, as the shared harness sees it.
#[derive(Debug, Clone, Copy)]
pub struct DeadlineSuite;

super::harness::subject! { DeadlineSuite: DeadlineTarget, DeadlineFeatures, DeadlineCtx;
"deadline store adapter", "deadline store"; cases::declaration_cases, all_deadline_cases;
DeadlineCtx::new }

/// Builds the store under test inside the trial's runtime, on a fresh, empty backing at every
/// call, given the run's namespace.
pub type DeadlineTargetFactory = Factory<DeadlineTarget>;

/// The deadline case named `name` (with its `deadlines_` prefix, without `conformance::`).
pub fn find_deadline_case(name: &str) -> Option<DeadlineCase> {
    find::<DeadlineSuite>(name)
}

/// Runs one case against `target` and cleans up after it; the target's own `features` serve as
/// the pinned set.
pub async fn run_deadline_case(
    case: &DeadlineCase,
    target: DeadlineTarget,
    seed: u64,
) -> CaseResult {
    let pinned = target.features;
    run_one::<DeadlineSuite>(case, target, pinned, seed).await
}

/// Runs every applicable case (the declaration case first), each on a target `factory` builds
/// afresh, inside the caller's runtime: the suite as one ordinary `#[tokio::test]`, for stores
/// whose tests live in a crate's unit tests or in a service-needing `tests/it/` binary. `pinned`
/// is the feature set the caller declares. Every case runs; the failures are reported together,
/// each with its case name and the seed that replays it.
pub async fn check_deadline_store(
    pinned: DeadlineFeatures,
    factory: DeadlineTargetFactory,
) -> CaseResult {
    let seed = std::env::var("SANDBOX_CONFORMANCE_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let namespace = format!("conf-{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let mut failures = Vec::new();
    let mut ran = 0_usize;
    for case in <DeadlineSuite as super::harness::Subject>::cases() {
        if case.not_applicable(&pinned).is_some() {
            continue;
        }
        ran += 1;
        let target = match factory(namespace.clone()).await {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!(
                    "{}: cannot build the deadline store: {e}",
                    case.name
                ));
                continue;
            }
        };
        if let Err(f) = run_one::<DeadlineSuite>(&case, target, pinned, seed).await {
            failures.push(format!("{}: {f}", case.name));
        }
    }
    if ran == 0 {
        return Err(Failure("no deadline case applied".to_owned()));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure(format!(
            "{} of {ran} deadline cases failed (replay with SANDBOX_CONFORMANCE_SEED={seed}): {}",
            failures.len(),
            failures.join(" | ")
        )))
    }
}

/// The describe document of the deadline suite for `declared`.
pub fn describe(adapter: &str, declared: &DeadlineFeatures) -> serde_json::Value {
    describe_suite::<DeadlineSuite>(adapter, declared)
}

/// How long one store call may take before a case fails with its name.
pub const OP_LIMIT: Duration = Duration::from_secs(30);

/// Per-case context: the target, the run's namespace and RNG, and the keys to clean up.
pub struct DeadlineCtx {
    target: DeadlineTarget,
    pinned: DeadlineFeatures,
    run: CaseRun,
    set: Mutex<Vec<String>>,
}

impl fmt::Debug for DeadlineCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineCtx")
            .field("run", &self.run)
            .finish()
    }
}

impl DeadlineCtx {
    /// A context for `case` in the run `namespace`, with payloads drawn from `seed`.
    pub fn new(
        target: DeadlineTarget,
        pinned: DeadlineFeatures,
        namespace: &str,
        case: &'static str,
        seed: u64,
    ) -> Self {
        DeadlineCtx {
            target,
            pinned,
            run: CaseRun::new(namespace, case, seed),
            set: Mutex::new(Vec::new()),
        }
    }

    /// The store under test.
    pub fn store(&self) -> &dyn DeadlineStore {
        &*self.target.store
    }
    /// A shared handle to the store (for spawned tasks).
    pub fn store_arc(&self) -> Arc<dyn DeadlineStore> {
        self.target.store.clone()
    }
    /// The store, then the peer when the target has one: every instance a read must agree on.
    pub fn instances(&self) -> Vec<(&'static str, &dyn DeadlineStore)> {
        let mut out: Vec<(&'static str, &dyn DeadlineStore)> = vec![("store", self.store())];
        if let Some(peer) = &self.target.peer {
            out.push(("peer", &**peer));
        }
        out
    }
    /// The target.
    pub fn target(&self) -> &DeadlineTarget {
        &self.target
    }
    /// The feature set the caller pins.
    pub fn pinned(&self) -> DeadlineFeatures {
        self.pinned
    }
    super::harness::run_accessors!();

    /// A random key shaped like an E2B sandbox ID (`i` and 19 of `[a-z0-9]`).
    pub fn key(&self) -> String {
        let token = self.token();
        let tail = self.with_rng(|r| {
            (0..3)
                .map(|_| if r.bool() { r.lowercase() } else { r.digit(10) })
                .collect::<String>()
        });
        format!("i{token}{tail}")
    }

    /// A random instant in 2025–2035 with a random sub-millisecond part (stores keep whole
    /// milliseconds, rounded up).
    pub fn instant(&self) -> Result<OffsetDateTime, Failure> {
        let nanos = self.with_rng(|r| {
            i128::from(r.i64(1_735_689_600..2_051_222_400)) * 1_000_000_000
                + i128::from(r.u32(0..1_000_000_000))
        });
        OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .map_err(|e| Failure(format!("bad test instant: {e}")))
    }

    /// A random number in `range`.
    pub fn number(&self, range: std::ops::Range<i64>) -> i64 {
        self.with_rng(|r| r.i64(range))
    }

    /// A random whole-millisecond instant in 2025–2035.
    pub fn whole_ms(&self) -> Result<OffsetDateTime, Failure> {
        Ok(ms_floor(self.instant()?))
    }

    /// Sets `key`'s deadline through `store`; the key's deadline is removed when the case ends.
    pub async fn set_on(
        &self,
        store: &dyn DeadlineStore,
        key: &str,
        at: OffsetDateTime,
    ) -> CaseResult {
        self.track(key);
        within(OP_LIMIT, "set_deadline", store.set_deadline(key, at))
            .await?
            .map_err(|e| Failure(format!("set_deadline {key:?} {at}: {e}")))
    }
    /// [`DeadlineCtx::set_on`] the store under test.
    pub async fn set(&self, key: &str, at: OffsetDateTime) -> CaseResult {
        self.set_on(self.store(), key, at).await
    }
    /// Registers a key whose deadline is removed when the case ends.
    pub fn track(&self, key: &str) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        if !set.iter().any(|k| k == key) {
            set.push(key.to_owned());
        }
    }
    /// `key`'s deadline through `store`.
    pub async fn get_on(
        &self,
        store: &dyn DeadlineStore,
        key: &str,
    ) -> Result<Option<OffsetDateTime>, Failure> {
        within(OP_LIMIT, "deadline", store.deadline(key))
            .await?
            .map_err(|e| Failure(format!("deadline {key:?}: {e}")))
    }
    /// Removes `key`'s deadline through the store under test.
    pub async fn remove(&self, key: &str) -> CaseResult {
        within(
            OP_LIMIT,
            "remove_deadline",
            self.store().remove_deadline(key),
        )
        .await?
        .map_err(|e| Failure(format!("remove_deadline {key:?}: {e}")))
    }
    /// `due(now, limit)` through `store`.
    pub async fn due_on(
        &self,
        store: &dyn DeadlineStore,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Failure> {
        within(OP_LIMIT, "due", store.due(now, limit))
            .await?
            .map_err(|e| Failure(format!("due {now} limit {limit}: {e}")))
    }
    /// Opens the store afresh on the backing (feature `reopen`).
    pub async fn reopen(&self) -> Result<Arc<dyn DeadlineStore>, Failure> {
        let hook = self
            .target
            .reopen
            .as_ref()
            .ok_or_else(|| Failure("the target declares reopen but has no hook".to_owned()))?;
        within(OP_LIMIT, "reopen", hook())
            .await?
            .map_err(|e| Failure(format!("reopen: {e}")))
    }

    /// Removes every deadline the case set. Errors are reported, not fatal.
    pub async fn cleanup(&self) -> Vec<String> {
        let keys = std::mem::take(&mut *self.set.lock().unwrap_or_else(PoisonError::into_inner));
        let mut problems = Vec::new();
        for key in keys {
            match within(OP_LIMIT, "cleanup", self.store().remove_deadline(&key)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("cleanup: remove_deadline {key:?}: {e}")),
                Err(f) => problems.push(format!("cleanup: {f}")),
            }
        }
        problems
    }
}

/// `at` truncated to the whole millisecond.
pub fn ms_floor(at: OffsetDateTime) -> OffsetDateTime {
    let nanos = at.unix_timestamp_nanos();
    let floored = nanos - nanos.rem_euclid(1_000_000);
    OffsetDateTime::from_unix_timestamp_nanos(floored).unwrap_or(at)
}

/// `at` rounded up to the whole millisecond: what a store reads back for `at`.
pub fn ms_ceil(at: OffsetDateTime) -> OffsetDateTime {
    let floor = ms_floor(at);
    if floor == at {
        at
    } else {
        floor + time::Duration::MILLISECOND
    }
}

/// `[deadlines.origin]`: asserts `result` failed with an error of the store's origin, of
/// `kind` and with `code`.
pub fn expect_refusal<T: fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    kind: ErrorKind,
    code: ErrorCode,
) -> CaseResult {
    match result {
        Err(e) if e.origin() != Origin::Store => Err(Failure(format!(
            "{what}: the error's origin is {:?}, not the store: {e} (deadlines.origin)",
            e.origin()
        ))),
        Err(e) if e.kind() == kind && e.code() == Some(code) => Ok(()),
        Err(e) => Err(Failure(format!(
            "{what}: expected {kind} with code {code}, got {e} (code {:?})",
            e.code()
        ))),
        Ok(v) => Err(Failure(format!("{what}: expected a refusal, got {v:?}"))),
    }
}

//! The machinery both conformance suites share, generic over what a suite checks (a
//! [`Subject`]: the provider port, the binding-store port): the case type, which cases apply to
//! a declaration, the describe document `cargo xtask` reads, running one case with its cleanup,
//! and the test binary side.
//!
//! The test binary registers one libtest trial per applicable case, named `conformance::<case>`,
//! so nextest can run, list and filter them (one case alone:
//! `cargo nextest run -p <adapter crate> --test conformance conformance::exec_timeout_kills`).
//!
//! Environment:
//! - `SANDBOX_CONFORMANCE_ADAPTER`: the adapter `cargo xtask` selected. A binary serving another
//!   adapter registers nothing (and says so) — it is not the one being asked.
//! - `SANDBOX_CONFORMANCE_DESCRIBE=<path>`: write the describe document (which cases apply) to
//!   `<path>` and exit without running anything.
//! - `SANDBOX_CONFORMANCE_SEED=<u64>`: replay a run's payloads.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use sandbox_core::{Capabilities, Capability};

use super::store::{StoreFeature, StoreFeatures};
use super::{CaseFuture, CaseResult, Failure, ProviderSuite, Target};

/// How long one case may take before it fails with a name (generous: real backends on a
/// loaded 2-core machine are slow, and nextest's own slow-timeout is the outer bound).
pub const CASE_DEADLINE: Duration = Duration::from_secs(240);

/// What an adapter declares it offers, as a suite reads it: the capabilities of a provider, the
/// optional parts of a store. A case applies only when the declaration has what it requires and
/// lacks what it forbids.
pub trait Declaration: Copy + fmt::Debug + Send + Sync + 'static {
    /// One thing a declaration may hold.
    type Item: Copy + fmt::Debug + Send + Sync + 'static;
    /// Every item, in declaration order (the describe document lists them all).
    fn items() -> &'static [Self::Item];
    /// Whether the declaration holds `item`.
    fn has(&self, item: Self::Item) -> bool;
    /// The item's name in describe documents and tables.
    fn name(item: Self::Item) -> &'static str;
}

/// Both declarations are a set of flags over an enum with `ALL`, `as_str` and a `has` query.
macro_rules! flag_declaration {
    ($set:ty, $item:ty) => {
        impl Declaration for $set {
            type Item = $item;
            fn items() -> &'static [$item] {
                &<$item>::ALL
            }
            fn has(&self, item: $item) -> bool {
                <$set>::has(self, item)
            }
            fn name(item: $item) -> &'static str {
                item.as_str()
            }
        }
    };
}

flag_declaration!(Capabilities, Capability);
flag_declaration!(StoreFeatures, StoreFeature);

/// One conformance case of the suite whose per-case context is `C` and whose declarations hold
/// items `I`.
pub struct SuiteCase<C: 'static, I: 'static> {
    /// The trial name is `conformance::<name>`.
    pub name: &'static str,
    /// What the adapter must declare for the case to apply.
    pub requires: &'static [I],
    /// What the adapter must *not* declare (cases checking the refusal path).
    pub forbids: &'static [I],
    /// The port's contract tags the case checks (`cargo xtask tidy` holds them to the port).
    pub cites: &'static [&'static str],
    pub run: for<'a> fn(&'a C) -> CaseFuture<'a>,
}

// Written out: a derive would ask the context to be `Clone`, which it never is.
impl<C, I> Clone for SuiteCase<C, I> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C, I> Copy for SuiteCase<C, I> {}

impl<C, I: fmt::Debug> fmt::Debug for SuiteCase<C, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("requires", &self.requires)
            .finish()
    }
}

impl<C, I: Copy> SuiteCase<C, I> {
    /// The required items `declared` lacks.
    pub fn missing<D: Declaration<Item = I>>(&self, declared: &D) -> Vec<&'static str> {
        names::<D>(self.requires.iter().filter(|i| !declared.has(**i)))
    }

    /// Why the case does not apply to `declared`, or `None` when it does.
    pub fn not_applicable<D: Declaration<Item = I>>(&self, declared: &D) -> Option<String> {
        let missing = self.missing(declared);
        let present = names::<D>(self.forbids.iter().filter(|i| declared.has(**i)));
        match (missing.is_empty(), present.is_empty()) {
            (true, true) => None,
            (false, _) => Some(format!("needs {}", missing.join(", "))),
            (true, false) => Some(format!("checks the refusal without {}", present.join(", "))),
        }
    }
}

fn names<'a, D: Declaration>(items: impl Iterator<Item = &'a D::Item>) -> Vec<&'static str> {
    items.map(|i| D::name(*i)).collect()
}

/// What a suite checks, as the shared machinery needs to know it.
pub trait Subject: 'static {
    /// What a case runs against (the provider and its template; two store handles and hooks).
    type Target: Send + 'static;
    /// What the adapter declares.
    type Declared: Declaration;
    /// The per-case context handed to every case.
    type Ctx: Send + Sync + 'static;
    /// How messages name the adapter kind: "adapter", "store adapter".
    const KIND: &'static str;
    /// How messages name what the factory builds: "adapter", "store".
    const UNDER_TEST: &'static str;

    /// Every case, in registration order: the cases about the declaration itself first.
    fn cases() -> Vec<CaseOf<Self>>;
    /// A context for `case` in the run `namespace`, with payloads drawn from `seed`; `pinned`
    /// is the declaration the adapter's own test pins.
    fn context(
        target: Self::Target,
        pinned: Self::Declared,
        namespace: &str,
        case: &'static str,
        seed: u64,
    ) -> Self::Ctx;
    /// Deletes everything the case created; each problem is reported, none stops the rest.
    fn cleanup(ctx: &Self::Ctx) -> Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>>;
}

/// What every case context holds about its run: the run's namespace, the case's name and seed,
/// and the generator its random payloads are drawn from (so a seed replays them).
pub(crate) struct CaseRun {
    namespace: String,
    case: &'static str,
    seed: u64,
    rng: Mutex<fastrand::Rng>,
}

impl fmt::Debug for CaseRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaseRun")
            .field("namespace", &self.namespace)
            .field("case", &self.case)
            .field("seed", &self.seed)
            .finish()
    }
}

impl CaseRun {
    pub(crate) fn new(namespace: &str, case: &'static str, seed: u64) -> Self {
        CaseRun {
            namespace: namespace.to_owned(),
            case,
            seed,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }
    pub(crate) fn case(&self) -> &'static str {
        self.case
    }
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }
    pub(crate) fn with_rng<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        f(&mut self.rng.lock().unwrap_or_else(PoisonError::into_inner))
    }
    /// A random lower-case alphanumeric token.
    pub(crate) fn token(&self) -> String {
        self.with_rng(|r| {
            (0..16)
                .map(|_| if r.bool() { r.lowercase() } else { r.digit(10) })
                .collect()
        })
    }
}

/// Implements [`Subject`] for a suite, in one place for both suites: its target, declaration
/// and context types, how messages name it, where its cases come from (the declaration cases,
/// then the registered ones) and how a context is made. Every context cleans up with its own
/// `cleanup`.
macro_rules! subject {
    ($suite:ty: $target:ty, $declared:ty, $ctx:ty; $kind:literal, $under:literal;
     $first:path, $rest:path; $new:expr) => {
        impl $crate::conformance::harness::Subject for $suite {
            type Target = $target;
            type Declared = $declared;
            type Ctx = $ctx;
            const KIND: &'static str = $kind;
            const UNDER_TEST: &'static str = $under;

            fn cases() -> Vec<$crate::conformance::harness::CaseOf<Self>> {
                let mut cases = $first();
                cases.extend($rest());
                cases
            }
            fn context(
                target: $target,
                pinned: $declared,
                namespace: &str,
                case: &'static str,
                seed: u64,
            ) -> $ctx {
                ($new)(target, pinned, namespace, case, seed)
            }
            fn cleanup(
                ctx: &$ctx,
            ) -> ::std::pin::Pin<Box<dyn ::std::future::Future<Output = Vec<String>> + Send + '_>>
            {
                Box::pin(ctx.cleanup())
            }
        }
    };
}
pub(crate) use subject;

/// The accessors every case context (a type with a `run: CaseRun` field) offers over its run,
/// written once for both suites' contexts.
macro_rules! run_accessors {
    () => {
        /// The run's namespace.
        pub fn namespace(&self) -> &str {
            self.run.namespace()
        }
        /// The seed of this case's payloads.
        pub fn seed(&self) -> u64 {
            self.run.seed()
        }
        fn with_rng<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
            self.run.with_rng(f)
        }
        /// A random lower-case alphanumeric token.
        pub fn token(&self) -> String {
            self.run.token()
        }
    };
}
pub(crate) use run_accessors;

/// The case type of suite `S`.
pub type CaseOf<S> =
    SuiteCase<<S as Subject>::Ctx, <<S as Subject>::Declared as Declaration>::Item>;

/// Builds what a case runs against inside the trial's runtime, given the run's namespace (an
/// adapter that scopes its resources by namespace uses it, so everything a run creates is
/// countable and removable by that label; a shared backing such as Redis scopes its keys by it).
pub type Factory<T> =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<T, String>> + Send>> + Send + Sync>;

/// Builds the provider under test.
pub type TargetFactory = Factory<Target>;

/// The case of suite `S` named `name` (without the `conformance::` prefix).
pub fn find<S: Subject>(name: &str) -> Option<CaseOf<S>> {
    S::cases().into_iter().find(|c| c.name == name)
}

/// Runs `case` in `ctx` within [`CASE_DEADLINE`], then cleans up: the case's outcome, and the
/// cleanup's problems.
async fn run_in<S: Subject>(case: &CaseOf<S>, ctx: &S::Ctx) -> (CaseResult, Vec<String>) {
    let run: CaseFuture<'_> = (case.run)(ctx);
    let outcome = match tokio::time::timeout(CASE_DEADLINE, run).await {
        Ok(result) => result,
        Err(_) => Err(Failure(format!(
            "case did not finish within {}s",
            CASE_DEADLINE.as_secs()
        ))),
    };
    (outcome, S::cleanup(ctx).await)
}

/// Runs one case of suite `S` against `target` and cleans up after it: the library form of a
/// trial, for tests that check the suite itself.
pub async fn run_one<S: Subject>(
    case: &CaseOf<S>,
    target: S::Target,
    pinned: S::Declared,
    seed: u64,
) -> CaseResult {
    let ctx = S::context(target, pinned, &format!("conf-{seed:x}"), case.name, seed);
    let (outcome, problems) = run_in::<S>(case, &ctx).await;
    outcome?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failure(problems.join("; ")))
    }
}

/// The describe document `cargo xtask` reads: which cases of suite `S` apply to `declared`.
/// Both suites write this one shape (item names where a provider has capability names).
pub fn describe_suite<S: Subject>(adapter: &str, declared: &S::Declared) -> serde_json::Value {
    let mut cases: Vec<serde_json::Value> = S::cases()
        .iter()
        .map(|case| {
            let reason = case.not_applicable(declared);
            serde_json::json!({
                "name": format!("conformance::{}", case.name),
                "applicable": reason.is_none(),
                "requires": names::<S::Declared>(case.requires.iter()),
                "forbids": names::<S::Declared>(case.forbids.iter()),
                "missing": case.missing(declared),
                "reason": reason,
                "cites": case.cites,
            })
        })
        .collect();
    cases.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let declared_names: BTreeMap<&str, bool> = <S::Declared as Declaration>::items()
        .iter()
        .map(|i| (<S::Declared as Declaration>::name(*i), declared.has(*i)))
        .collect();
    serde_json::json!({ "adapter": adapter, "declared": declared_names, "cases": cases })
}

/// Runs suite `S` for `adapter` and returns the process exit code. `declared` must be known
/// without contacting the backend, so describing the suite needs no running service. The suite
/// runs when `SANDBOX_CONFORMANCE_ADAPTER` names this adapter or is unset; with
/// `needs_selection` (an adapter that needs a service: an engine, a server) and no selection,
/// every case is registered as *ignored* with the command that runs it, so a plain `cargo test`
/// on a machine without the service reports what it did not run instead of failing or passing
/// vacuously.
pub fn run_suite<S: Subject>(
    adapter: &'static str,
    declared: S::Declared,
    factory: Factory<S::Target>,
    needs_selection: bool,
) -> ExitCode {
    let kind = S::KIND;
    let selected = std::env::var("SANDBOX_CONFORMANCE_ADAPTER")
        .ok()
        .filter(|s| !s.is_empty());
    if let Some(selected) = &selected
        && selected != adapter
    {
        let _ = writeln!(
            std::io::stderr(),
            "conformance: this binary serves {kind} {adapter:?}; {selected:?} was selected, so it registers no cases"
        );
        return libtest_mimic::run(&Arguments::from_args(), Vec::new()).exit_code();
    }
    if let Ok(path) = std::env::var("SANDBOX_CONFORMANCE_DESCRIBE") {
        let doc = describe_suite::<S>(adapter, &declared);
        return match std::fs::write(&path, doc.to_string()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "conformance: cannot write describe document {path}: {e}"
                );
                ExitCode::FAILURE
            }
        };
    }
    let ignore_all = needs_selection && selected.is_none();
    let seed = std::env::var("SANDBOX_CONFORMANCE_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let namespace = format!("conf-{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let trials = S::cases()
        .into_iter()
        .filter(|case| case.not_applicable(&declared).is_none())
        .map(|case| {
            let factory = factory.clone();
            let namespace = namespace.clone();
            Trial::test(format!("conformance::{}", case.name), move || {
                run_trial::<S>(case, declared, &factory, &namespace, seed)
            })
            .with_ignored_flag(ignore_all)
        })
        .collect();
    if ignore_all {
        let _ = writeln!(
            std::io::stderr(),
            "conformance: {kind} {adapter:?} needs its service; its cases are ignored here. Run them with `cargo xtask conformance {adapter}`"
        );
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn run_trial<S: Subject>(
    case: CaseOf<S>,
    pinned: S::Declared,
    factory: &Factory<S::Target>,
    namespace: &str,
    seed: u64,
) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(format!("cannot start a runtime: {e}")))?;
    let target = runtime
        .block_on(factory(namespace.to_owned()))
        .map_err(|e| {
            Failed::from(format!(
                "cannot build the {} under test: {e}",
                S::UNDER_TEST
            ))
        })?;
    // Mix the case name into the seed so cases draw different payloads from one run seed.
    let case_seed = case
        .name
        .bytes()
        .fold(seed, |acc, b| acc.rotate_left(5) ^ u64::from(b));
    let ctx = S::context(target, pinned, namespace, case.name, case_seed);
    let (outcome, cleanup) = runtime.block_on(run_in::<S>(&case, &ctx));
    runtime.shutdown_timeout(Duration::from_secs(5));
    let context = format!(
        "(namespace {namespace}, seed {seed}; replay with SANDBOX_CONFORMANCE_SEED={seed})"
    );
    match (outcome, cleanup.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => Err(Failed::from(format!("{} {context}", cleanup.join("; ")))),
        (Err(failure), _) => {
            let mut message = format!("{failure} {context}");
            if !cleanup.is_empty() {
                message.push_str(&format!("; also: {}", cleanup.join("; ")));
            }
            Err(Failed::from(message))
        }
    }
}

/// The cases every provider runs about its declaration. Kept here under its old name for
/// callers that list them apart from the registered cases.
pub fn builtin_cases() -> Vec<super::Case> {
    super::cases::declaration_cases()
}

/// Runs the provider suite for `adapter` (see [`run_suite`]); hermetic adapters such as the
/// fake run in plain `cargo test`.
pub fn run_main(adapter: &'static str, declared: Capabilities, factory: TargetFactory) -> ExitCode {
    run_suite::<ProviderSuite>(adapter, declared, factory, false)
}

/// [`run_main`] for adapters that need a service: unless `SANDBOX_CONFORMANCE_ADAPTER` names
/// this adapter, every case is registered as *ignored*.
pub fn run_main_when_selected(
    adapter: &'static str,
    declared: Capabilities,
    factory: TargetFactory,
) -> ExitCode {
    run_suite::<ProviderSuite>(adapter, declared, factory, true)
}

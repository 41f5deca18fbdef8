//! The test binary side of the store suite, the twin of [`crate::conformance::harness`]: one
//! libtest trial per applicable case, named `conformance::store_<case>`.
//!
//! Environment (same variables as the provider suite):
//! - `SANDBOX_CONFORMANCE_ADAPTER`: the adapter `cargo xtask` selected; a binary serving another
//!   adapter registers nothing.
//! - `SANDBOX_CONFORMANCE_DESCRIBE=<path>`: write the describe document and exit.
//! - `SANDBOX_CONFORMANCE_SEED=<u64>`: replay a run's payloads.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

use super::{StoreCase, StoreCtx, StoreFeature, StoreFeatures, StoreTarget, all_store_cases};
use crate::conformance::harness::CASE_DEADLINE;
use crate::conformance::{CaseFuture, CaseResult, Failure, ensure, ensure_eq};

/// Builds the store under test inside the trial's runtime, given the run's namespace (a shared
/// backing such as Redis scopes its keys by it, so a run never sees another run's state).
pub type StoreTargetFactory = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<StoreTarget, String>> + Send>>
        + Send
        + Sync,
>;

/// Cases every store runs, about the declaration itself.
pub fn builtin_store_cases() -> Vec<StoreCase> {
    vec![StoreCase {
        name: "store_declared_features_match",
        requires: &[],
        cites: &["features"],
        run: |ctx| Box::pin(declared_features_match(ctx)),
    }]
}

/// The target claims exactly the pinned set, and each claim is backed: the store (and its
/// peer) hand out the optional part, the target carries the hook. A feature declared but not
/// callable, or callable but not declared, would make cases vanish or fail for the wrong reason.
async fn declared_features_match(ctx: &StoreCtx) -> CaseResult {
    let target = ctx.target();
    ensure_eq("declared store features", target.features, ctx.pinned())?;
    let f = target.features;
    for (which, store) in [("store", ctx.store()), ("peer", ctx.peer())] {
        let pairs = [
            (
                StoreFeature::TurnLeases,
                f.turn_leases,
                store.turn_leases().is_some(),
            ),
            (
                StoreFeature::RewindLock,
                f.rewind_lock,
                store.rewind_locks().is_some(),
            ),
            (
                StoreFeature::Activities,
                f.activities,
                store.activities().is_some(),
            ),
        ];
        for (feature, declared, callable) in pairs {
            ensure(declared == callable, || {
                format!("{which}: feature {feature}: declared={declared} but callable={callable}")
            })?;
        }
    }
    let hooks = [
        (
            StoreFeature::RawValues,
            f.raw_values,
            target.plant_raw.is_some(),
        ),
        (
            StoreFeature::Outage,
            f.outage,
            target.take_down.is_some() && target.bring_up.is_some(),
        ),
    ];
    for (feature, declared, hooked) in hooks {
        ensure(declared == hooked, || {
            format!("feature {feature}: declared={declared} but the target hook present={hooked}")
        })?;
    }
    Ok(())
}

/// Runs the store suite for `adapter` and returns the process exit code. `features` is the set
/// the adapter's test pins, known without contacting the backing. Runs when
/// `SANDBOX_CONFORMANCE_ADAPTER` names this adapter or is unset (hermetic stores such as the
/// memory store run in plain `cargo test`).
pub fn run_store_main(
    adapter: &'static str,
    features: StoreFeatures,
    factory: StoreTargetFactory,
) -> ExitCode {
    run(adapter, features, factory, false)
}

/// [`run_store_main`] for stores that need a service (a Redis server): unless
/// `SANDBOX_CONFORMANCE_ADAPTER` names this adapter, every case is registered as *ignored*.
pub fn run_store_main_when_selected(
    adapter: &'static str,
    features: StoreFeatures,
    factory: StoreTargetFactory,
) -> ExitCode {
    run(adapter, features, factory, true)
}

fn run(
    adapter: &'static str,
    features: StoreFeatures,
    factory: StoreTargetFactory,
    needs_selection: bool,
) -> ExitCode {
    let selected = std::env::var("SANDBOX_CONFORMANCE_ADAPTER")
        .ok()
        .filter(|s| !s.is_empty());
    if let Some(selected) = &selected
        && selected != adapter
    {
        let _ = writeln!(
            std::io::stderr(),
            "conformance: this binary serves store adapter {adapter:?}; {selected:?} was selected, so it registers no cases"
        );
        return libtest_mimic::run(&Arguments::from_args(), Vec::new()).exit_code();
    }
    if let Ok(path) = std::env::var("SANDBOX_CONFORMANCE_DESCRIBE") {
        let doc = super::describe(adapter, &features);
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
    let trials = builtin_store_cases()
        .into_iter()
        .chain(all_store_cases())
        .filter(|case| case.not_applicable(&features).is_none())
        .map(|case| {
            let factory = factory.clone();
            let namespace = namespace.clone();
            Trial::test(format!("conformance::{}", case.name), move || {
                run_trial(case, features, &factory, &namespace, seed)
            })
            .with_ignored_flag(ignore_all)
        })
        .collect();
    if ignore_all {
        let _ = writeln!(
            std::io::stderr(),
            "conformance: store adapter {adapter:?} needs its service; its cases are ignored here. Run them with `cargo xtask conformance {adapter}`"
        );
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn run_trial(
    case: StoreCase,
    pinned: StoreFeatures,
    factory: &StoreTargetFactory,
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
        .map_err(|e| Failed::from(format!("cannot build the store under test: {e}")))?;
    // Mix the case name into the seed so cases draw different payloads from one run seed.
    let case_seed = case
        .name
        .bytes()
        .fold(seed, |acc, b| acc.rotate_left(5) ^ u64::from(b));
    let ctx = StoreCtx::new(target, pinned, namespace, case.name, case_seed);
    let (outcome, cleanup) = runtime.block_on(async {
        let run: CaseFuture<'_> = (case.run)(&ctx);
        let outcome = match tokio::time::timeout(CASE_DEADLINE, run).await {
            Ok(result) => result,
            Err(_) => Err(Failure(format!(
                "case did not finish within {}s",
                CASE_DEADLINE.as_secs()
            ))),
        };
        (outcome, ctx.cleanup().await)
    });
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

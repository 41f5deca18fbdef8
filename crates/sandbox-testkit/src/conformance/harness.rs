//! The test binary side of the suite: one libtest trial per applicable case, named
//! `conformance::<case>`, so nextest can run, list and filter them (one case alone:
//! `cargo nextest run -p <adapter crate> --test conformance conformance::exec_timeout_kills`).
//!
//! Environment:
//! - `SANDBOX_CONFORMANCE_ADAPTER`: the adapter `cargo xtask` selected. A binary serving another
//!   adapter registers nothing (and says so) — it is not the one being asked.
//! - `SANDBOX_CONFORMANCE_DESCRIBE=<path>`: write the describe document (which cases apply) to
//!   `<path>` and exit without running anything.
//! - `SANDBOX_CONFORMANCE_SEED=<u64>`: replay a run's payloads.

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use sandbox_core::narrow;

use super::{Case, CaseFuture, Ctx, Failure, Target, all_cases, ensure, ensure_eq};

/// How long one case may take before it fails with a name (generous: real backends on a
/// loaded 2-core machine are slow, and nextest's own slow-timeout is the outer bound).
pub const CASE_DEADLINE: Duration = Duration::from_secs(240);

/// Builds the provider under test inside the trial's runtime, given the run's namespace (an
/// adapter that scopes its resources by namespace uses it, so everything a run creates is
/// countable and removable by that label).
pub type TargetFactory = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Target, String>> + Send>> + Send + Sync,
>;

/// Cases every adapter runs, about the declaration itself.
pub fn builtin_cases() -> Vec<Case> {
    vec![
        Case {
            name: "declared_capabilities_match",
            requires: &[],
            forbids: &[],
            cites: &["capabilities"],
            run: |ctx| Box::pin(declared_capabilities_match(ctx)),
        },
        Case {
            name: "declared_capabilities_are_callable",
            requires: &[],
            forbids: &[],
            cites: &["narrow"],
            run: |ctx| Box::pin(declared_capabilities_are_callable(ctx)),
        },
    ]
}

async fn declared_capabilities_match(ctx: &Ctx) -> Result<(), Failure> {
    ensure_eq("declared capabilities", ctx.caps(), ctx.pinned())
}

async fn declared_capabilities_are_callable(ctx: &Ctx) -> Result<(), Failure> {
    let p = ctx.provider();
    let caps = ctx.caps();
    let pairs = [
        ("snapshots", caps.snapshots, narrow::snapshots(p).is_some()),
        (
            "template_catalog",
            caps.template_catalog,
            narrow::template_catalog(p).is_some(),
        ),
        ("pty", caps.pty, narrow::terminals(p).is_some()),
        ("desktop", caps.desktop, narrow::desktop(p).is_some()),
        (
            "keep_alive",
            caps.keep_alive,
            narrow::keep_alive(p).is_some(),
        ),
        (
            "connect_probe",
            caps.connect_probe,
            narrow::connect_probe(p).is_some(),
        ),
    ];
    for (name, declared, callable) in pairs {
        ensure(declared == callable, || {
            format!(
                "capability {name}: declared={declared} but narrowing gives callable={callable}"
            )
        })?;
    }
    Ok(())
}

/// Runs the suite for `adapter` and returns the process exit code. `declared` must be known
/// without contacting the backend, so describing the suite needs no running service. The suite
/// runs when `SANDBOX_CONFORMANCE_ADAPTER` names this adapter or is unset (hermetic adapters such
/// as the fake run in plain `cargo test`).
pub fn run_main(
    adapter: &'static str,
    declared: sandbox_core::Capabilities,
    factory: TargetFactory,
) -> ExitCode {
    run(adapter, declared, factory, false)
}

/// [`run_main`] for adapters that need a service (an engine, a server): unless
/// `SANDBOX_CONFORMANCE_ADAPTER` names this adapter, every case is registered as *ignored* with
/// the command that runs it, so a plain `cargo test` on a machine without the service reports
/// what it did not run instead of failing or passing vacuously.
pub fn run_main_when_selected(
    adapter: &'static str,
    declared: sandbox_core::Capabilities,
    factory: TargetFactory,
) -> ExitCode {
    run(adapter, declared, factory, true)
}

fn run(
    adapter: &'static str,
    declared: sandbox_core::Capabilities,
    factory: TargetFactory,
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
            "conformance: this binary serves adapter {adapter:?}; {selected:?} was selected, so it registers no cases"
        );
        return libtest_mimic::run(&Arguments::from_args(), Vec::new()).exit_code();
    }
    if let Ok(path) = std::env::var("SANDBOX_CONFORMANCE_DESCRIBE") {
        let doc = super::describe(adapter, &declared);
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
    let trials = builtin_cases()
        .into_iter()
        .chain(all_cases())
        .filter(|case| case.not_applicable(&declared).is_none())
        .map(|case| {
            let factory = factory.clone();
            let namespace = namespace.clone();
            Trial::test(format!("conformance::{}", case.name), move || {
                run_case(case, &factory, &namespace, seed)
            })
            .with_ignored_flag(ignore_all)
        })
        .collect();
    if ignore_all {
        let _ = writeln!(
            std::io::stderr(),
            "conformance: adapter {adapter:?} needs its service; its cases are ignored here. Run them with `cargo xtask conformance {adapter}`"
        );
    }
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

fn run_case(case: Case, factory: &TargetFactory, namespace: &str, seed: u64) -> Result<(), Failed> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failed::from(format!("cannot start a runtime: {e}")))?;
    let target = runtime
        .block_on(factory(namespace.to_owned()))
        .map_err(|e| Failed::from(format!("cannot build the adapter under test: {e}")))?;
    // Mix the case name into the seed so cases draw different payloads from one run seed.
    let case_seed = case
        .name
        .bytes()
        .fold(seed, |acc, b| acc.rotate_left(5) ^ u64::from(b));
    let ctx = Ctx::new(target, namespace, case.name, case_seed);
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

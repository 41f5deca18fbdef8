//! Running the conformance suite against one adapter: describe, run under nextest, judge; once
//! per variant of the adapter (the Redis store: standalone, then cluster), one table each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use xtask::conformance::{self, Adapter, ENV_ADAPTER, ENV_DESCRIBE, NEXTEST_PROFILE, Variant};
use xtask::junit::{self, Counts};
use xtask::process::{self, Output};

use crate::Ctx;
use crate::fixtures::Fixtures;
use crate::prereq_stage::Availability;

/// Compiling the test target on a cold 2-core machine dominates both deadlines.
const DESCRIBE_DEADLINE: Duration = Duration::from_secs(1800);
const RUN_DEADLINE: Duration = Duration::from_secs(3600);

/// What became of one adapter's suite.
#[derive(Debug, Default)]
pub(crate) struct AdapterResult {
    /// Why it did not run (locally only: under strict rules that is a problem instead).
    pub(crate) not_run: Option<String>,
    pub(crate) problems: Vec<String>,
    pub(crate) warnings: Vec<String>,
    /// Totals from the JUnit reports (all variants), when nextest wrote one.
    pub(crate) counts: Option<Counts>,
}

/// Starts what `adapter` needs, runs its suite (once per variant) and prints a table per run.
/// `strict`: services that cannot start and skipped or vanished cases fail (CI, or an explicitly
/// requested adapter).
pub(crate) fn run_adapter(
    ctx: &Ctx,
    fixtures: &mut Fixtures,
    avail: &Availability,
    adapter: &Adapter,
    strict: bool,
) -> AdapterResult {
    let mut result = AdapterResult::default();
    let name = adapter.name;
    let unavailable = |why: String, result: &mut AdapterResult| {
        println!("conformance: {name}: not run: {why}");
        if strict {
            result.problems.push(format!("{name}: {why}"));
        } else {
            result.not_run = Some(format!("{name}: {why}"));
        }
    };

    if let Some(why) = avail.lacking(&conformance::tools(adapter)) {
        unavailable(why, &mut result);
        return result;
    }
    for service in conformance::services_in_order(adapter) {
        if let Err(e) = fixtures.ensure(service) {
            unavailable(format!("{} cannot start: {e}", service.name()), &mut result);
            return result;
        }
    }

    let work = ctx.target.join("xtask").join("conformance");
    if let Err(e) = std::fs::create_dir_all(&work) {
        result
            .problems
            .push(format!("cannot create {}: {e}", work.display()));
        return result;
    }
    let service_env = fixtures.test_env(adapter.services);
    for (var, value) in &service_env {
        println!("    test environment: {var}={value}");
    }
    for variant in adapter.runs() {
        let mut env: Vec<(&str, String)> = service_env.clone();
        env.extend(variant.env.iter().map(|&(k, v)| (k, v.to_owned())));
        run_variant(ctx, adapter, variant, &env, &work, strict, &mut result);
    }
    result
}

/// One run of `adapter`'s suite with `env` set on its commands; adds to `result`.
fn run_variant(
    ctx: &Ctx,
    adapter: &Adapter,
    variant: &Variant,
    env: &[(&str, String)],
    work: &Path,
    strict: bool,
    result: &mut AdapterResult,
) {
    let title = variant.title(adapter.name);
    let stem = variant.stem(adapter.name);
    let describe = match describe(
        ctx,
        adapter,
        env,
        &work.join(format!("{stem}.describe.json")),
    ) {
        Ok(d) => d,
        Err(e) => {
            result.problems.push(format!("{title}: {e}"));
            return;
        }
    };

    let (cases, nextest_error) =
        match run(ctx, adapter, env, &work.join(format!("{stem}.junit.xml"))) {
            Ok(found) => found,
            Err(e) => {
                result.problems.push(format!("{title}: {e}"));
                return;
            }
        };
    // Judged against the adapter's name (the describe document knows no variants), shown
    // under the variant's title.
    let mut report = conformance::evaluate(adapter.name, &describe, &cases);
    report.adapter = title.clone();
    print!("{}", report.table());
    result.counts.get_or_insert_default().add(report.counts);
    result.problems.extend(report.problems(strict));
    result.warnings.extend(report.warnings(strict));
    if let Some(e) = nextest_error
        && report.failed.is_empty()
    {
        // nextest failed for a reason the report does not show (a crash, a setup script).
        result.problems.push(format!("{title}: {e}"));
    }
}

/// `, VAR=value` for each of `env`, for the command lines we print.
fn show_env(env: &[(&str, String)]) -> String {
    env.iter().map(|(k, v)| format!(", {k}={v}")).collect()
}

/// Runs the test binary in describe mode and reads its document from `path`.
fn describe(
    ctx: &Ctx,
    adapter: &Adapter,
    env: &[(&str, String)],
    path: &Path,
) -> Result<conformance::Describe, String> {
    remove_stale(path)?;
    println!(
        "    describe: cargo test -q -p {} --test {} ({ENV_ADAPTER}={}{}, {ENV_DESCRIBE}=...)",
        adapter.package,
        adapter.test_target,
        adapter.name,
        show_env(env)
    );
    let mut cmd = ctx.cargo_cmd([
        "test",
        "-q",
        "-p",
        adapter.package,
        "--test",
        adapter.test_target,
    ]);
    cmd.env(ENV_ADAPTER, adapter.name)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(ENV_DESCRIBE, path);
    process::run_with_deadline(&mut cmd, DESCRIBE_DEADLINE, Output::Inherit)?
        .check()
        .map_err(|e| format!("the describe run failed: {e}"))?;
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "the test binary wrote no describe document to {} ({e}); it must honour {ENV_DESCRIBE}",
            path.display()
        )
    })?;
    conformance::parse_describe(&text)
}

/// Runs the applicable cases under nextest and reads the JUnit report, keeping a copy at
/// `keep`. The second value is nextest's own failure, if any (failed cases are also in the
/// report).
fn run(
    ctx: &Ctx,
    adapter: &Adapter,
    env: &[(&str, String)],
    keep: &Path,
) -> Result<(Vec<junit::TestCase>, Option<String>), String> {
    let junit_path = junit_path(&ctx.target, NEXTEST_PROFILE);
    remove_stale(&junit_path)?;
    let mut cmd = ctx.cargo_cmd([
        "nextest",
        "run",
        "-p",
        adapter.package,
        "--test",
        adapter.test_target,
        "--profile",
        NEXTEST_PROFILE,
    ]);
    cmd.env(ENV_ADAPTER, adapter.name)
        .envs(env.iter().map(|(k, v)| (k, v)));
    println!(
        "    run: {} ({ENV_ADAPTER}={}{})",
        process::render(&cmd),
        adapter.name,
        show_env(env)
    );
    let outcome = process::run_with_deadline(&mut cmd, RUN_DEADLINE, Output::Inherit)?;
    let nextest_error = outcome.check().err();
    let xml = std::fs::read_to_string(&junit_path).map_err(|e| {
        format!(
            "nextest wrote no JUnit report at {} ({e}){}",
            junit_path.display(),
            nextest_error
                .as_deref()
                .map(|n| format!("; {n}"))
                .unwrap_or_default()
        )
    })?;
    // Keep a copy per run: the next run overwrites nextest's file.
    let _ = std::fs::write(keep, &xml);
    let cases = junit::parse(&xml).map_err(|e| format!("{}: {e}", junit_path.display()))?;
    Ok((cases, nextest_error))
}

/// Where nextest writes a profile's JUnit report (`.config/nextest.toml` sets `junit.xml`).
pub(crate) fn junit_path(target: &Path, profile: &str) -> PathBuf {
    target.join("nextest").join(profile).join("junit.xml")
}

/// Removes a file left by an earlier run so it cannot be mistaken for this run's.
pub(crate) fn remove_stale(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

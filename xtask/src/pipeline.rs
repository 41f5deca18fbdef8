//! `cargo xtask test` (the README's test command, and CI's) and `cargo xtask conformance`.

use std::process::ExitCode;
use std::time::Duration;

use xtask::conformance::{self, Adapter};
use xtask::junit::{self, Counts};
use xtask::prereq::Tool;
use xtask::process::{self, Output};
use xtask::{netclean, tidy};

use crate::Ctx;
use crate::fixtures::Fixtures;
use crate::prereq_stage::{self, Availability};
use crate::suite::{self, AdapterResult};
use crate::ui::{Stages, Verdict};

const FMT_DEADLINE: Duration = Duration::from_secs(600);
/// Clippy and the test build compile the whole workspace; on a cold 2-core machine that is the
/// bulk of a run.
const CLIPPY_DEADLINE: Duration = Duration::from_secs(2400);
const NEXTEST_DEADLINE: Duration = Duration::from_secs(3000);
const DOCTEST_DEADLINE: Duration = Duration::from_secs(1800);

/// The hermetic tier: everything but the conformance binaries (run per adapter), the Docker
/// adapter's engine, registry, egress and `tcp://` TLS tests (ignored without the engine; run by
/// their own stages) and the tests that need Redis servers, so the hermetic run's counts hold
/// no skips. In `sandbox-app`, a test binary whose name ends in `_docker` needs the engine; in
/// `sandbox-store-redis`, one whose name starts with `redis_` needs Redis.
const HERMETIC_FILTER: &str = "not binary(conformance) and not (package(sandbox-provider-docker) and (binary(engine) | binary(registry) | binary(egress) | binary(tcp_tls))) and not (package(sandbox-session) and binary(docker)) and not (package(sandbox-app) and binary(*_docker)) and not (package(xtask) and binary(serve_docker)) and not (package(sandbox-store-redis) and (binary(conformance) | binary(redis_*))) and not (package(xtask) and binary(redis_fixture))";

/// The tests that need the Docker engine beyond conformance, run by the docker stage.
const DOCKER_ENGINE_FILTER: &str = "(package(sandbox-provider-docker) and (binary(engine) | binary(registry) | binary(tcp_tls))) | (package(sandbox-session) and binary(docker)) | (package(sandbox-app) and binary(*_docker))";

/// The tests that need the Redis fixtures beyond conformance, run by the redis stage: the Redis
/// store's `redis_*` binaries and xtask's own check of the fixtures.
const REDIS_FILTER: &str = "(package(sandbox-store-redis) and binary(redis_*)) | (package(xtask) and binary(redis_fixture))";

/// What the redis stage starts, and whose addresses its tests are given.
const REDIS_SERVICES: &[conformance::Service] = &[
    conformance::Service::Redis,
    conformance::Service::RedisCluster,
];

/// The nextest profile of the hermetic tier.
const CI_PROFILE: &str = "ci";

/// Everything the pipeline may need.
const ALL_TOOLS: &[Tool] = &[
    Tool::Docker,
    Tool::Busybox,
    Tool::Nextest,
    Tool::Rustfmt,
    Tool::Clippy,
    Tool::Registry,
    Tool::NetTools,
    Tool::Redis,
];

pub(crate) fn test(ctx: &Ctx) -> ExitCode {
    let mut stages = Stages::new();
    let mut fixtures = Fixtures::new(&ctx.target);
    let mut avail = Availability::default();
    let mut counts: Option<Counts> = None;
    println!(
        "xtask test: {} run in {}",
        if ctx.ci { "CI (CI=true)" } else { "local" },
        ctx.root.display()
    );

    stages.run("prerequisites", || {
        let (a, verdict) = prereq_stage::ensure(ctx, ALL_TOOLS, ctx.ci);
        avail = a;
        verdict
    });

    stages.run("fixtures", || fixtures_stage(ctx, &mut fixtures, &avail));

    stages.run("fmt", || {
        if let Some(why) = avail.lacking(&[Tool::Rustfmt]) {
            return Verdict::NotRun(why);
        }
        cargo_step(ctx, &["fmt", "--all", "--", "--check"], FMT_DEADLINE)
    });

    stages.run("clippy", || {
        if let Some(why) = avail.lacking(&[Tool::Clippy]) {
            return Verdict::NotRun(why);
        }
        cargo_step(
            ctx,
            &[
                "clippy",
                // The committed Cargo.lock must already match the manifests: a build that
                // would rewrite it is not the build that was reviewed.
                "--locked",
                "--workspace",
                "--all-targets",
                // Test-only features (the store's failpoints) are linted too.
                "--all-features",
                "--",
                "-D",
                "warnings",
            ],
            CLIPPY_DEADLINE,
        )
    });

    stages.run("tidy", || tidy_stage(ctx));

    stages.run("hermetic tests", || {
        if let Some(why) = avail.lacking(&[Tool::Nextest]) {
            return Verdict::NotRun(why);
        }
        hermetic_stage(ctx, &mut counts)
    });

    stages.run("conformance", || {
        let results: Vec<AdapterResult> = conformance::ADAPTERS
            .iter()
            .map(|a| suite::run_adapter(ctx, &mut fixtures, &avail, a, ctx.ci))
            .collect();
        for c in results.iter().filter_map(|r| r.counts) {
            counts.get_or_insert_default().add(c);
        }
        conformance_verdict(&results)
    });

    stages.run("redis tests", || {
        redis_stage(ctx, &mut fixtures, &avail, &mut counts)
    });

    stages.run("docker engine tests", || {
        docker_engine_stage(ctx, &mut fixtures, &avail, &mut counts)
    });

    stages.run("egress", || {
        egress_stage(ctx, &mut fixtures, &avail, &mut counts)
    });

    finish(ctx, stages, fixtures, counts)
}

/// `cargo xtask conformance <adapter>`: only what that adapter needs.
pub(crate) fn conformance_one(ctx: &Ctx, adapter: &Adapter) -> ExitCode {
    let mut stages = Stages::new();
    let mut fixtures = Fixtures::new(&ctx.target);
    let mut avail = Availability::default();
    let mut counts = None;

    // The adapter was asked for by name: anything that keeps it from running is a failure.
    stages.run("prerequisites", || {
        let (a, verdict) = prereq_stage::ensure(ctx, &conformance::tools(adapter), true);
        avail = a;
        verdict
    });
    stages.run("conformance", || {
        let r = suite::run_adapter(ctx, &mut fixtures, &avail, adapter, true);
        counts = r.counts;
        conformance_verdict(&[r])
    });
    finish(ctx, stages, fixtures, counts)
}

/// Cleanup (always), service logs (after a failure), the summary and the exit code.
fn finish(
    ctx: &Ctx,
    mut stages: Stages,
    mut fixtures: Fixtures,
    counts: Option<Counts>,
) -> ExitCode {
    stages.always("cleanup", || {
        let problems = fixtures.cleanup();
        if problems.is_empty() {
            Verdict::Passed
        } else {
            Verdict::Warned(problems)
        }
    });
    if stages.failed() || fixtures.any_failed() {
        fixtures.dump_logs();
    }
    stages.summary();
    let code = match stages.first_failure() {
        Some(stage) => {
            println!("xtask: FAILED at stage {stage}");
            ExitCode::FAILURE
        }
        None => {
            println!("xtask: ok{}", if ctx.ci { " (CI)" } else { "" });
            ExitCode::SUCCESS
        }
    };
    // Last, alone on a line: the totals of every nextest run (hermetic + conformance).
    if let Some(c) = counts {
        println!(
            "tests: {} passed, {} failed, {} skipped",
            c.passed, c.failed, c.skipped
        );
    }
    code
}

fn fixtures_stage(ctx: &Ctx, fixtures: &mut Fixtures, avail: &Availability) -> Verdict {
    if let Some(why) = avail.lacking(&[Tool::Docker, Tool::Busybox]) {
        return Verdict::NotRun(why);
    }
    // Started even when no registered adapter needs them yet: the image and engine are part of
    // the pipeline's contract, and a broken fixture should show up before the suites need it.
    let result = fixtures
        .ensure(conformance::Service::DockerEngine)
        .and_then(|()| fixtures.ensure(conformance::Service::TestImage));
    match result {
        Ok(()) => Verdict::Passed,
        Err(e) if ctx.ci => Verdict::Failed(e),
        Err(e) => Verdict::Warned(vec![format!(
            "{e} (the suites that need Docker will not run; under CI=true this fails)"
        )]),
    }
}

fn cargo_step(ctx: &Ctx, args: &[&str], deadline: Duration) -> Verdict {
    println!("    cargo {}", args.join(" "));
    let mut cmd = ctx.cargo_cmd(args);
    match process::run_with_deadline(&mut cmd, deadline, Output::Inherit) {
        Ok(o) if o.success() => Verdict::Passed,
        Ok(o) => Verdict::Failed(o.describe()),
        Err(e) => Verdict::Failed(e),
    }
}

pub(crate) fn tidy_stage(ctx: &Ctx) -> Verdict {
    match tidy::check_live(&ctx.root) {
        Ok(v) if v.is_empty() => {
            println!("    tidy: no violations");
            Verdict::Passed
        }
        Ok(v) => {
            for line in &v {
                println!("{line}");
            }
            Verdict::Failed(format!("{} violation(s)", v.len()))
        }
        Err(e) => Verdict::Failed(e),
    }
}

fn hermetic_stage(ctx: &Ctx, counts: &mut Option<Counts>) -> Verdict {
    let junit = suite::junit_path(&ctx.target, CI_PROFILE);
    if let Err(e) = suite::remove_stale(&junit) {
        return Verdict::Failed(e);
    }
    let nextest = cargo_step(
        ctx,
        &[
            "nextest",
            "run",
            "--workspace",
            "--profile",
            CI_PROFILE,
            "-E",
            HERMETIC_FILTER,
        ],
        NEXTEST_DEADLINE,
    );
    match std::fs::read_to_string(&junit).map(|xml| junit::parse(&xml)) {
        Ok(Ok(cases)) => {
            let c = Counts::of(&cases);
            println!(
                "    nextest: {} passed, {} failed, {} skipped",
                c.passed, c.failed, c.skipped
            );
            counts.get_or_insert_default().add(c);
        }
        Ok(Err(e)) => println!("    warning: cannot read {}: {e}", junit.display()),
        Err(_) => {}
    }
    if !matches!(nextest, Verdict::Passed) {
        return nextest;
    }
    cargo_step(ctx, &["test", "--workspace", "--doc"], DOCTEST_DEADLINE)
}

/// The Docker adapter's tests that need the real engine beyond conformance (isolation,
/// ownership, resume, the dropped-exec kill, the idle sweeper, bad input), the pull path
/// against a loopback `docker-registry`, and the session manager over the real adapter. They are `#[ignore]`d in a plain `cargo test` (no
/// engine there) and run here explicitly, so none is skipped silently.
fn docker_engine_stage(
    ctx: &Ctx,
    fixtures: &mut Fixtures,
    avail: &Availability,
    counts: &mut Option<Counts>,
) -> Verdict {
    let cannot = |why: String| {
        if ctx.ci {
            Verdict::Failed(why)
        } else {
            Verdict::NotRun(format!("{why} (under CI=true this fails)"))
        }
    };
    // The replica and failover tests start their own redis-server.
    if let Some(why) = avail.lacking(&[
        Tool::Nextest,
        Tool::Docker,
        Tool::Busybox,
        Tool::Registry,
        Tool::Redis,
    ]) {
        return cannot(why);
    }
    if let Err(e) = fixtures.ensure(conformance::Service::TestImage) {
        return cannot(e);
    }
    let main: &[&str] = &[
        "nextest",
        "run",
        "-p",
        "sandbox-provider-docker",
        "-p",
        "sandbox-session",
        "-p",
        "sandbox-app",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "-E",
        DOCKER_ENGINE_FILTER,
    ];
    // The failover test needs the store's failpoints compiled into `sandbox`. A run of its own,
    // after the others: building `sandbox` with other features while tests spawn it would swap
    // the binary under them.
    let failover: &[&str] = &[
        "nextest",
        "run",
        "-p",
        "sandbox-app",
        "--features",
        "sandbox-app/failpoints",
        "--test",
        "failover_docker",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
    ];
    // The README's run command builds `sandbox` itself (with the feature set of a plain
    // `cargo build`), which relinks `target/debug/sandbox`: last, alone.
    let serve: &[&str] = &[
        "nextest",
        "run",
        "-p",
        "xtask",
        "--test",
        "serve_docker",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
    ];
    let mut verdict = Verdict::Passed;
    for args in [main, failover, serve] {
        let junit = suite::junit_path(&ctx.target, CI_PROFILE);
        if let Err(e) = suite::remove_stale(&junit) {
            return Verdict::Failed(e);
        }
        println!("    cargo {}", args.join(" "));
        let mut cmd = ctx.cargo_cmd(args);
        let outcome = match process::run_with_deadline(&mut cmd, NEXTEST_DEADLINE, Output::Inherit)
        {
            Ok(o) if o.success() => Verdict::Passed,
            Ok(o) => Verdict::Failed(o.describe()),
            Err(e) => Verdict::Failed(e),
        };
        if let Ok(Ok(cases)) = std::fs::read_to_string(&junit).map(|xml| junit::parse(&xml)) {
            counts.get_or_insert_default().add(Counts::of(&cases));
        }
        if matches!(verdict, Verdict::Passed) {
            verdict = outcome;
        }
    }
    verdict
}

/// The tests that need real Redis servers beyond conformance: the Redis store's `redis_*` binaries
/// and xtask's own fixture test, given the standalone server and the cluster through
/// `SANDBOX_TEST_REDIS_URL` and `SANDBOX_TEST_REDIS_CLUSTER_NODES`. The servers are the ones the
/// conformance stage used, shared by every test of the run: tests keep to their own keys.
fn redis_stage(
    ctx: &Ctx,
    fixtures: &mut Fixtures,
    avail: &Availability,
    counts: &mut Option<Counts>,
) -> Verdict {
    if let Some(why) = avail.lacking(&[Tool::Nextest, Tool::Redis]) {
        return cannot_run(ctx, why);
    }
    for &service in REDIS_SERVICES {
        if let Err(e) = fixtures.ensure(service) {
            return cannot_run(ctx, format!("{} cannot start: {e}", service.name()));
        }
    }
    let junit = suite::junit_path(&ctx.target, CI_PROFILE);
    if let Err(e) = suite::remove_stale(&junit) {
        return Verdict::Failed(e);
    }
    // `--run-ignored all`: the Redis tests are ignored without the servers, so a plain `cargo
    // test` passes anywhere; here the servers are up. A filter that matches nothing fails: a
    // stage that silently runs no test is a skipped stage.
    let args = [
        "nextest",
        "run",
        "-p",
        "sandbox-store-redis",
        "-p",
        "xtask",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "all",
        "--no-tests",
        "fail",
        "-E",
        REDIS_FILTER,
    ];
    let env = fixtures.test_env(REDIS_SERVICES);
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("    {} cargo {}", shown.join(" "), args.join(" "));
    let mut cmd = ctx.cargo_cmd(args);
    cmd.envs(env);
    let verdict = match process::run_with_deadline(&mut cmd, NEXTEST_DEADLINE, Output::Inherit) {
        Ok(o) if o.success() => Verdict::Passed,
        Ok(o) => Verdict::Failed(o.describe()),
        Err(e) => Verdict::Failed(e),
    };
    if let Ok(Ok(cases)) = std::fs::read_to_string(&junit).map(|xml| junit::parse(&xml)) {
        counts.get_or_insert_default().add(Counts::of(&cases));
    }
    verdict
}

/// A stage that cannot run: a failure under CI, else said and not run.
fn cannot_run(ctx: &Ctx, why: String) -> Verdict {
    if ctx.ci {
        Verdict::Failed(why)
    } else {
        Verdict::NotRun(format!("{why} (under CI=true this fails)"))
    }
}

/// The Docker adapter's egress test (real iptables, a network namespace): root only, one test
/// at a time, after removing what a killed earlier run left.
fn egress_stage(
    ctx: &Ctx,
    fixtures: &mut Fixtures,
    avail: &Availability,
    counts: &mut Option<Counts>,
) -> Verdict {
    let cannot = |why: String| {
        if ctx.ci {
            Verdict::Failed(why)
        } else {
            Verdict::NotRun(format!("{why} (under CI=true this fails)"))
        }
    };
    if let Some(why) = avail.lacking(&[Tool::Nextest, Tool::Docker, Tool::Busybox, Tool::NetTools])
    {
        return cannot(why);
    }
    if !process::is_root() {
        return cannot("the egress test needs root (network namespaces, iptables)".into());
    }
    if let Some(tool) = ["iptables", "ip", "python3"]
        .into_iter()
        .find(|t| process::find_executable(t).is_none())
    {
        return cannot(format!(
            "the egress test needs {tool}, which is not installed"
        ));
    }
    if let Err(e) = fixtures.ensure(conformance::Service::TestImage) {
        return cannot(e);
    }
    let leftovers = netclean::clean(true);
    leftovers
        .removed
        .iter()
        .for_each(|l| println!("    removed leftover {l}"));
    if !leftovers.problems.is_empty() {
        return Verdict::Failed(leftovers.problems.join("\n"));
    }
    let junit = suite::junit_path(&ctx.target, CI_PROFILE);
    if let Err(e) = suite::remove_stale(&junit) {
        return Verdict::Failed(e);
    }
    let args = [
        "nextest",
        "run",
        "-p",
        "sandbox-provider-docker",
        "--test",
        "egress",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "-j",
        "1",
    ];
    println!("    SANDBOX_EGRESS_TEST=1 cargo {}", args.join(" "));
    let mut cmd = ctx.cargo_cmd(args);
    cmd.env("SANDBOX_EGRESS_TEST", "1");
    let verdict = match process::run_with_deadline(&mut cmd, NEXTEST_DEADLINE, Output::Inherit) {
        Ok(o) if o.success() => Verdict::Passed,
        Ok(o) => Verdict::Failed(o.describe()),
        Err(e) => Verdict::Failed(e),
    };
    if let Ok(Ok(cases)) = std::fs::read_to_string(&junit).map(|xml| junit::parse(&xml)) {
        counts.get_or_insert_default().add(Counts::of(&cases));
    }
    verdict
}

fn conformance_verdict(results: &[AdapterResult]) -> Verdict {
    let problems: Vec<&String> = results.iter().flat_map(|r| &r.problems).collect();
    if !problems.is_empty() {
        return Verdict::Failed(
            problems
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    let warnings: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.not_run
                .iter()
                .map(|n| format!("not run: {n}"))
                .chain(r.warnings.iter().cloned())
        })
        .collect();
    if warnings.is_empty() {
        Verdict::Passed
    } else {
        Verdict::Warned(warnings)
    }
}

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
use crate::ui::{CI_BUDGET, Stages, Steps, Verdict};

const FMT_DEADLINE: Duration = Duration::from_secs(600);
/// Clippy and the test build compile the whole workspace; on a cold 2-core machine that is the
/// bulk of a run.
const CLIPPY_DEADLINE: Duration = Duration::from_secs(2400);
const NEXTEST_DEADLINE: Duration = Duration::from_secs(3000);
const DOCTEST_DEADLINE: Duration = Duration::from_secs(1800);

/// The hermetic tier: everything but the conformance binaries (run per adapter) and the tests
/// that need a service, so the hermetic run's counts hold no skips. A crate's service-needing
/// tests live in its one `it` test binary (`tests/it/`, one module per topic: one link instead
/// of one per file), and the stages below select them by binary and module: the Docker
/// adapter's `it` also holds the hermetic `tcp_guard` module, which runs here. `sandbox-app`'s
/// `failover_docker` stays a binary of its own: it needs the store's failpoints, a feature set
/// of its own, and would otherwise rebuild the whole `it` binary a second time.
const HERMETIC_FILTER: &str = "not binary(conformance) and not binary(conformance_e2b) and not (package(sandbox-provider-docker) and binary(it) and not test(/^tcp_guard::/)) and not (package(sandbox-session) and binary(it)) and not (package(sandbox-app) and (binary(it) | binary(failover_docker))) and not (package(sandbox-store-redis) and binary(it)) and not (package(xtask) and binary(it)) and not (package(sandbox-agent) and binary(it))";

/// The tests that need the Docker engine beyond conformance, run by the docker stage: the
/// adapter's engine, registry and `tcp://` TLS modules (egress runs in a stage of its own), the
/// session manager over the real adapter and the service's engine tests.
const DOCKER_ENGINE_FILTER: &str = "(package(sandbox-provider-docker) and binary(it) and not test(/^egress::/) and not test(/^tcp_guard::/) and not test(/^sdk_channel::/)) | (package(sandbox-session) and binary(it)) | (package(sandbox-app) and binary(it) and not test(/^e2b_sdk::/) and not test(/^e2b_expiry::/) and not test(/^e2b_no_leaks::/) and not test(/^e2b_templates::/) and not test(/^e2b_preview::/) and not test(/^e2b_js::/) and not test(/^e2b_older::/) and not test(/^e2b_snapshots::/) and not test(/^e2b_provider_e2e::/) and not test(/^e2b_provider_faults::/) and not test(/^e2b_standard_template::/)) | (package(sandbox-agent) and binary(it) and test(/^pid1_docker::/))";

/// The tests that need the Redis fixtures beyond conformance, run by the redis stage: the Redis
/// store's `it` binary and xtask's own check of the fixtures.
const REDIS_FILTER: &str = "(package(sandbox-store-redis) and binary(it)) | (package(xtask) and binary(it) and test(/^redis_fixture::/))";

/// The egress module of the Docker adapter's `it` binary, run by the egress stage.
const EGRESS_FILTER: &str = "package(sandbox-provider-docker) and binary(it) and test(/^egress::/)";

/// xtask's check of the README's run command, last in the docker stage.
const SERVE_FILTER: &str = "package(xtask) and binary(it) and test(/^serve_docker::/)";

/// The official E2B Python SDK's scenario against the agent, on the host and as PID 1 of a
/// container of the Debian image, and through the Docker adapter's agent channel (a Debian
/// sandbox in agent mode behind a loopback router), and the service's E2B API in normal mode
/// (`sandbox serve` with `[e2b]` on, Debian sandboxes), with the E2B adapter's snapshot,
/// end-to-end and fault tests against that API, run by the e2b sdk stage.
const SDK_FILTER: &str = "(package(sandbox-agent) and binary(it) and (test(/^sdk::/) | test(/^sdk_debian::/))) | (package(sandbox-provider-docker) and binary(it) and test(/^sdk_channel::/)) | (package(sandbox-app) and binary(it) and (test(/^e2b_sdk::/) | test(/^e2b_expiry::/) | test(/^e2b_no_leaks::/) | test(/^e2b_templates::/) | test(/^e2b_preview::/) | test(/^e2b_js::/) | test(/^e2b_older::/) | test(/^e2b_snapshots::/) | test(/^e2b_provider_e2e::/) | test(/^e2b_provider_faults::/) | test(/^e2b_standard_template::/)))";

/// The agent's `/files` on real filesystems it mounts in a namespace of its own (root only),
/// run by the agent filesystems stage.
const AGENT_FS_FILTER: &str = "package(sandbox-agent) and binary(it) and test(/^fs_edges::/)";

/// The failover test, run alone with the store's failpoints compiled in.
const FAILOVER_FILTER: &str = "package(sandbox-app) and binary(failover_docker)";

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
    Tool::StaticLibc,
    Tool::Debootstrap,
    Tool::Python,
    Tool::Node,
];

pub(crate) fn test(ctx: &Ctx) -> ExitCode {
    let mut stages = Stages::new();
    let mut fixtures = Fixtures::new(&ctx.root, &ctx.target);
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

    stages.run_steps("fixtures", |steps| {
        fixtures_stage(ctx, steps, &mut fixtures, &avail)
    });

    stages.run("fmt", || {
        if let Some(why) = avail.lacking(&[Tool::Rustfmt]) {
            return Verdict::NotRun(why);
        }
        cargo_step(ctx, &["fmt", "--all", "--", "--check"], FMT_DEADLINE)
    });

    stages.run_steps("clippy", |steps| {
        if let Some(why) = avail.lacking(&[Tool::Clippy]) {
            return Verdict::NotRun(why);
        }
        for (name, args) in clippy_runs() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            steps.run(name, || cargo_step(ctx, &args, CLIPPY_DEADLINE));
        }
        let (args, env) = doc_run();
        steps.run("rustdoc, workspace", || {
            cargo_step_env(ctx, &args, &env, CLIPPY_DEADLINE)
        });
        Verdict::Passed
    });

    stages.run("tidy", || tidy_stage(ctx));

    // The static agent, checked; the docker engine stage hands its path to the tests that run
    // it in containers (`SANDBOX_AGENT_BIN`).
    let mut agent_bin = None;
    stages.run("agent static build", || {
        if let Some(why) = avail.lacking(crate::agent::TOOLS) {
            return cannot_run(ctx, why);
        }
        match crate::agent::build(ctx) {
            Ok(built) => {
                agent_bin = Some(built.path);
                Verdict::Passed
            }
            Err(e) => Verdict::Failed(e),
        }
    });

    stages.run_steps("hermetic tests", |steps| {
        if let Some(why) = avail.lacking(&[Tool::Nextest]) {
            return Verdict::NotRun(why);
        }
        hermetic_stage(ctx, steps, &mut counts);
        Verdict::Passed
    });

    stages.run_steps("conformance", |steps| {
        // One step per adapter, so each suite's time is in the summary.
        for adapter in conformance::ADAPTERS {
            steps.run(adapter.name, || {
                let r = suite::run_adapter(ctx, &mut fixtures, &avail, adapter, ctx.ci);
                if let Some(c) = r.counts {
                    counts.get_or_insert_default().add(c);
                }
                conformance_verdict(&[r])
            });
        }
        Verdict::Passed
    });

    stages.run("redis tests", || {
        redis_stage(ctx, &mut fixtures, &avail, &mut counts)
    });

    stages.run_steps("docker engine tests", |steps| {
        docker_engine_stage(
            ctx,
            steps,
            &mut fixtures,
            &avail,
            agent_bin.as_deref(),
            &mut counts,
        )
    });

    stages.run("egress", || {
        egress_stage(ctx, &mut fixtures, &avail, &mut counts)
    });

    stages.run("e2b sdk", || {
        sdk_stage(
            ctx,
            &mut fixtures,
            &avail,
            agent_bin.as_deref(),
            &mut counts,
        )
    });

    stages.run("agent filesystems", || {
        agent_fs_stage(ctx, &avail, &mut counts)
    });

    finish(ctx, stages, fixtures, counts)
}

/// `cargo xtask conformance <adapter>`: only what that adapter needs.
pub(crate) fn conformance_one(ctx: &Ctx, adapter: &Adapter) -> ExitCode {
    let mut stages = Stages::new();
    let mut fixtures = Fixtures::new(&ctx.root, &ctx.target);
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
    // Under CI=true a run past the budget fails; locally the same line is only a note, so a
    // slow machine can still run the pipeline to the end.
    let over_budget = stages.over_budget(CI_BUDGET);
    let mut code = match stages.first_failure() {
        Some(stage) => {
            println!("xtask: FAILED at stage {stage}");
            ExitCode::FAILURE
        }
        None if ctx.ci && over_budget.is_some() => ExitCode::FAILURE,
        None => {
            println!("xtask: ok{}", if ctx.ci { " (CI)" } else { "" });
            ExitCode::SUCCESS
        }
    };
    // Then, alone on a line: the totals of every nextest run (hermetic + conformance + the
    // service stages).
    if let Some(c) = counts {
        println!(
            "tests: {} passed, {} failed, {} skipped",
            c.passed, c.failed, c.skipped
        );
    }
    // Last: the budget's verdict, so a run that fails only on time says so on its final line.
    if let Some(line) = over_budget {
        if ctx.ci {
            println!("{line}");
            code = ExitCode::FAILURE;
        } else {
            println!("note: under CI=true this run would fail: {line}");
        }
    }
    code
}

fn fixtures_stage(
    ctx: &Ctx,
    steps: &mut Steps<'_>,
    fixtures: &mut Fixtures,
    avail: &Availability,
) -> Verdict {
    if let Some(why) = avail.lacking(&[Tool::Docker, Tool::Busybox]) {
        return Verdict::NotRun(why);
    }
    let judge = |result: Result<(), String>, what: &str| match result {
        Ok(()) => Verdict::Passed,
        Err(e) if ctx.ci => Verdict::Failed(e),
        Err(e) => Verdict::Warned(vec![format!(
            "{e} (the suites that need {what} will not run; under CI=true this fails)"
        )]),
    };
    // Started even when no registered adapter needs them yet: the images and engine are part
    // of the pipeline's contract, and a broken fixture should show up before the suites need
    // it.
    steps.run("engine and test image", || {
        let result = fixtures
            .ensure(conformance::Service::DockerEngine)
            .and_then(|()| fixtures.ensure(conformance::Service::TestImage));
        judge(result, "Docker")
    });
    // The image the SDKs expect of a sandbox; built once per recipe, then found by its tag.
    steps.run("Debian sandbox image", || {
        if let Some(why) = avail.lacking(&[Tool::Debootstrap]) {
            return cannot_run(ctx, why);
        }
        judge(
            fixtures.ensure(conformance::Service::DebianImage),
            "the Debian image",
        )
    });
    Verdict::Passed
}

fn cargo_step(ctx: &Ctx, args: &[&str], deadline: Duration) -> Verdict {
    cargo_step_env(ctx, args, &[], deadline)
}

/// [`cargo_step`] with `env` set on that one command (and shown with it).
fn cargo_step_env(ctx: &Ctx, args: &[&str], env: &[(&str, String)], deadline: Duration) -> Verdict {
    let shown: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    println!("    {shown}cargo {}", args.join(" "));
    let mut cmd = ctx.cargo_cmd(args);
    cmd.envs(env.iter().map(|(k, v)| (*k, v)));
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

/// The clippy runs, each a step of the clippy stage: the whole workspace with every feature
/// (test-only features such as the store's failpoints are linted too), then `sandbox-app` in
/// each of its feature sets, where the code under `cfg(not(feature = ...))` is compiled at all.
/// The feature-set runs are limited to `sandbox-app` and share the target directory, so they
/// check one crate again, not the workspace.
fn clippy_runs() -> Vec<(&'static str, Vec<String>)> {
    let run = |scope: &[&str]| -> Vec<String> {
        // The committed Cargo.lock must already match the manifests: a build that would
        // rewrite it is not the build that was reviewed.
        ["clippy", "--locked"]
            .iter()
            .chain(scope)
            .chain(&["--all-targets", "--", "-D", "warnings"])
            .map(|s| (*s).to_owned())
            .collect()
    };
    let mut runs = vec![(
        "workspace, all features",
        run(&["--workspace", "--all-features"]),
    )];
    for &(name, features) in APP_FEATURE_SETS {
        let scope: Vec<&str> = ["--workspace"]
            .into_iter()
            .chain(features.iter().copied())
            .collect();
        runs.push((name, run(&scope)));
    }
    runs
}

/// The rustdoc run of the clippy stage: every member's own docs with every feature, warnings
/// denied, so a broken or private intra-doc link fails the run instead of piling up. It reuses
/// the dependencies' metadata the clippy runs just built (`--no-deps`), so it costs the
/// members' doc generation only.
fn doc_run() -> (Vec<&'static str>, Vec<(&'static str, String)>) {
    (
        vec![
            "doc",
            "--locked",
            "--no-deps",
            "--workspace",
            "--all-features",
        ],
        vec![("RUSTDOCFLAGS", "-D warnings".to_owned())],
    )
}

/// `sandbox-app`'s feature sets, each checked alone by clippy: none, each feature alone, and
/// the default.
///
/// Each run names the whole workspace and sets only `sandbox-app`'s features (it is the one
/// member with default features, so `--no-default-features` changes nothing else). Cargo unifies
/// dependency features over the packages it builds: a `-p sandbox-app` run would see another
/// feature set of tokio, hyper or axum than the workspace run before it and re-check them all
/// (about 85 s of a cold CI run), while a workspace run re-checks only the crates whose
/// features really changed.
const APP_FEATURE_SETS: &[(&str, &[&str])] = &[
    (
        "sandbox-app, no default features",
        &["--no-default-features"],
    ),
    (
        "sandbox-app, docker alone",
        &["--no-default-features", "--features", "sandbox-app/docker"],
    ),
    (
        "sandbox-app, redis alone",
        &["--no-default-features", "--features", "sandbox-app/redis"],
    ),
    (
        "sandbox-app, e2b alone",
        &["--no-default-features", "--features", "sandbox-app/e2b"],
    ),
    (
        "sandbox-app, e2b-api alone",
        &["--no-default-features", "--features", "sandbox-app/e2b-api"],
    ),
    (
        "sandbox-app, failpoints alone",
        &[
            "--no-default-features",
            "--features",
            "sandbox-app/failpoints",
        ],
    ),
    ("sandbox-app, default features", &[]),
];

/// The hermetic runs, each a step: the workspace, `sandbox-app` once more with no default
/// features (the service without a backend or store compiled in must still pass its own tests),
/// and the doctests. The workspace run's failure stops the stage; the no-default-features run
/// uses the same filter, so the tests it selects are hermetic too.
fn hermetic_stage(ctx: &Ctx, steps: &mut Steps<'_>, counts: &mut Option<Counts>) {
    let workspace: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--profile",
        CI_PROFILE,
        "-E",
        HERMETIC_FILTER,
    ];
    // The whole workspace with only `sandbox-app`'s features changed, so nothing but
    // `sandbox-app` is rebuilt (see `APP_FEATURE_SETS`); the filter keeps its tests alone.
    let app_bare_filter = format!("package(sandbox-app) and ({HERMETIC_FILTER})");
    let app_bare: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--no-default-features",
        "--profile",
        CI_PROFILE,
        "-E",
        &app_bare_filter,
    ];
    if !steps.run("workspace", || counted_nextest(ctx, workspace, counts)) {
        return;
    }
    steps.run("sandbox-app, no default features", || {
        counted_nextest(ctx, app_bare, counts)
    });
    steps.run("doctests", || {
        cargo_step(ctx, &["test", "--workspace", "--doc"], DOCTEST_DEADLINE)
    });
}

/// One nextest run of the `ci` profile; its JUnit totals are printed and added to `counts`.
fn counted_nextest(ctx: &Ctx, args: &[&str], counts: &mut Option<Counts>) -> Verdict {
    counted_nextest_env(ctx, args, &[], counts)
}

/// [`counted_nextest`] with `env` set on the nextest command.
fn counted_nextest_env(
    ctx: &Ctx,
    args: &[&str],
    env: &[(&str, String)],
    counts: &mut Option<Counts>,
) -> Verdict {
    let junit = suite::junit_path(&ctx.target, CI_PROFILE);
    if let Err(e) = suite::remove_stale(&junit) {
        return Verdict::Failed(e);
    }
    let nextest = cargo_step_env(ctx, args, env, NEXTEST_DEADLINE);
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
    nextest
}

/// The Docker adapter's tests that need the real engine beyond conformance (isolation,
/// ownership, resume, the dropped-exec kill, the idle sweeper, bad input), the pull path
/// against a loopback `docker-registry`, the session manager over the real adapter, and the
/// service's engine tests. They are `#[ignore]`d in a plain `cargo test` (no engine there) and
/// run here explicitly, so none is skipped silently. Three steps, in this order: see each.
/// Every step fails when its selection matches no test: a renamed module must not turn a step
/// into one that silently runs nothing.
fn docker_engine_stage(
    ctx: &Ctx,
    steps: &mut Steps<'_>,
    fixtures: &mut Fixtures,
    avail: &Availability,
    agent_bin: Option<&std::path::Path>,
    counts: &mut Option<Counts>,
) -> Verdict {
    // The replica and failover tests start their own redis-server.
    if let Some(why) = avail.lacking(&[
        Tool::Nextest,
        Tool::Docker,
        Tool::Busybox,
        Tool::Registry,
        Tool::Redis,
    ]) {
        return cannot_run(ctx, why);
    }
    if let Err(e) = fixtures.ensure(conformance::Service::TestImage) {
        return cannot_run(ctx, e);
    }
    // Every run names the whole workspace, as the hermetic run did, so the test binaries it
    // built are reused as they are (a `-p` run unifies other dependency features and rebuilds;
    // see `APP_FEATURE_SETS`). The filters select the tests.
    let main: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
        "-E",
        DOCKER_ENGINE_FILTER,
    ];
    // The failover test needs the store's failpoints compiled into `sandbox`. A run of its own,
    // after the others: building `sandbox` with other features while tests spawn it would swap
    // the binary under them.
    let failover: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--features",
        "sandbox-app/failpoints",
        "-E",
        FAILOVER_FILTER,
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
    ];
    // The README's run command builds `sandbox` itself (with the feature set of a plain
    // `cargo build`), which relinks `target/debug/sandbox`: last, alone.
    let serve: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
        "-E",
        SERVE_FILTER,
    ];
    // Each step runs even after an earlier one failed: they test different things, and the
    // order only keeps the `sandbox` binary from being rebuilt under running tests.
    let agent_env: Vec<(&str, String)> = agent_bin
        .map(|p| (xtask::agent_build::ENV_AGENT_BIN, p.display().to_string()))
        .into_iter()
        .collect();
    steps.run("engine tests", || {
        counted_nextest_env(ctx, main, &agent_env, counts)
    });
    steps.run("failover (store failpoints)", || {
        counted_nextest_env(ctx, failover, &agent_env, counts)
    });
    // `cargo xtask serve` builds (here: finds up to date) the static agent itself.
    steps.run("README run command", || counted_nextest(ctx, serve, counts));
    Verdict::Passed
}

/// The official E2B Python SDK (PyPI `e2b`, from the hashed lock's venv) as a real client of the
/// agent: its scenario runs against the agent started on the host by the test, and against the
/// static agent (from the agent stage) as PID 1 of a container of the Debian image (from the
/// fixtures stage), and through the Docker adapter's production path: a Debian sandbox in agent
/// mode, reached only over its kept channel behind a loopback router. Then the SDK in normal
/// mode against `sandbox serve`'s E2B API (Debian sandboxes, the static agent), with that API's
/// tenant isolation and error bodies checked over raw HTTP, its timeout engine on both deadline
/// stores across restarts (`e2b_expiry`, which starts its own redis-server), and the idle
/// sweeper and session recovery leaving its sandboxes alone (`e2b_no_leaks`). The JS SDK
/// (`npm ci` from its lock, `e2b_js`) and the older Python SDK (its own venv, `e2b_older`) too.
fn sdk_stage(
    ctx: &Ctx,
    fixtures: &mut Fixtures,
    avail: &Availability,
    agent_bin: Option<&std::path::Path>,
    counts: &mut Option<Counts>,
) -> Verdict {
    if let Some(why) = avail.lacking(&[
        Tool::Nextest,
        Tool::Python,
        Tool::Node,
        Tool::Docker,
        Tool::Debootstrap,
        Tool::Redis,
    ]) {
        return cannot_run(ctx, why);
    }
    let Some(agent_bin) = agent_bin else {
        return cannot_run(ctx, "the static agent was not built (agent stage)".into());
    };
    for service in [
        conformance::Service::SdkVenv,
        conformance::Service::SdkVenvOlder,
        conformance::Service::JsSdk,
        conformance::Service::DebianImage,
    ] {
        if let Err(e) = fixtures.ensure(service) {
            return cannot_run(ctx, e);
        }
    }
    let mut env = fixtures.test_env(&[
        conformance::Service::SdkVenv,
        conformance::Service::SdkVenvOlder,
        conformance::Service::JsSdk,
        conformance::Service::DebianImage,
    ]);
    env.push((
        xtask::agent_build::ENV_AGENT_BIN,
        agent_bin.display().to_string(),
    ));
    let args: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
        "-E",
        SDK_FILTER,
    ];
    counted_nextest_env(ctx, args, &env, counts)
}

/// The agent's `/files` against a `ramfs` (no user xattrs) and a full `tmpfs`, which the test
/// mounts in a mount namespace of its own: root only. Not root is not a reason to skip: the
/// test itself fails saying it needs root.
fn agent_fs_stage(ctx: &Ctx, avail: &Availability, counts: &mut Option<Counts>) -> Verdict {
    if let Some(why) = avail.lacking(&[Tool::Nextest]) {
        return cannot_run(ctx, why);
    }
    let args: &[&str] = &[
        "nextest",
        "run",
        "--workspace",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
        "-E",
        AGENT_FS_FILTER,
    ];
    counted_nextest_env(ctx, args, &[], counts)
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
        "--workspace",
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

/// The Docker adapter's egress module (`tests/it/egress.rs`: real iptables, a network
/// namespace): root only, one test at a time, after removing what a killed earlier run left.
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
        "--workspace",
        "--profile",
        CI_PROFILE,
        "--run-ignored",
        "only",
        "--no-tests",
        "fail",
        "-E",
        EGRESS_FILTER,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustdoc_denies_warnings_on_every_member_without_rebuilding_dependencies() {
        let (args, env) = doc_run();
        assert_eq!(args[0], "doc");
        for flag in ["--no-deps", "--workspace", "--all-features", "--locked"] {
            assert!(args.contains(&flag), "{flag} missing from {args:?}");
        }
        assert_eq!(env, [("RUSTDOCFLAGS", "-D warnings".to_owned())]);
    }

    #[test]
    fn clippy_checks_the_workspace_then_each_feature_set_of_the_app() {
        let runs: Vec<(&str, String)> = clippy_runs()
            .into_iter()
            .map(|(name, args)| (name, args.join(" ")))
            .collect();
        let tail = "--all-targets -- -D warnings";
        let app = "clippy --locked --workspace";
        assert_eq!(
            runs,
            [
                (
                    "workspace, all features",
                    format!("clippy --locked --workspace --all-features {tail}")
                ),
                (
                    "sandbox-app, no default features",
                    format!("{app} --no-default-features {tail}")
                ),
                (
                    "sandbox-app, docker alone",
                    format!("{app} --no-default-features --features sandbox-app/docker {tail}")
                ),
                (
                    "sandbox-app, redis alone",
                    format!("{app} --no-default-features --features sandbox-app/redis {tail}")
                ),
                (
                    "sandbox-app, e2b alone",
                    format!("{app} --no-default-features --features sandbox-app/e2b {tail}")
                ),
                (
                    "sandbox-app, e2b-api alone",
                    format!("{app} --no-default-features --features sandbox-app/e2b-api {tail}")
                ),
                (
                    "sandbox-app, failpoints alone",
                    format!("{app} --no-default-features --features sandbox-app/failpoints {tail}")
                ),
                ("sandbox-app, default features", format!("{app} {tail}")),
            ]
        );
    }

    /// The feature-set runs name the whole workspace and say `--no-default-features`: that
    /// changes only `sandbox-app` as long as it is the one member with default features.
    #[test]
    fn only_the_app_has_default_features() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace root");
        let mut manifests = vec![root.join("xtask/Cargo.toml")];
        for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
            manifests.push(entry.expect("an entry").path().join("Cargo.toml"));
        }
        let with_defaults: Vec<String> = manifests
            .iter()
            .filter(|m| {
                let text = std::fs::read_to_string(m).expect("a manifest");
                // A line-based read is enough for the manifests this workspace writes: a
                // `default = [...]` line with a quoted feature, inside `[features]`.
                let mut in_features = false;
                text.lines().map(str::trim).any(|line| {
                    if line.starts_with('[') {
                        in_features = line == "[features]";
                        return false;
                    }
                    in_features && line.starts_with("default") && line.contains('"')
                })
            })
            .map(|m| m.display().to_string())
            .collect();
        assert_eq!(
            with_defaults,
            vec![
                root.join("crates/sandbox-app/Cargo.toml")
                    .display()
                    .to_string()
            ],
            "a member with default features is also switched by the feature-set runs"
        );
    }

    /// The service stages select modules of the `it` binaries by test path (`egress::...`):
    /// every module a filter names is a file under a `tests/it/` that its `main.rs` declares,
    /// so renaming a module without its filter fails here, not as a stage that runs nothing.
    #[test]
    fn module_filters_name_modules_that_exist() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace root");
        let docker = "crates/sandbox-provider-docker/tests/it";
        for (filter, dir, module) in [
            (EGRESS_FILTER, docker, "egress"),
            (DOCKER_ENGINE_FILTER, docker, "egress"),
            (DOCKER_ENGINE_FILTER, docker, "tcp_guard"),
            (HERMETIC_FILTER, docker, "tcp_guard"),
            (SERVE_FILTER, "xtask/tests/it", "serve_docker"),
            (REDIS_FILTER, "xtask/tests/it", "redis_fixture"),
            (SDK_FILTER, "crates/sandbox-agent/tests/it", "sdk"),
            (SDK_FILTER, "crates/sandbox-agent/tests/it", "sdk_debian"),
            (SDK_FILTER, docker, "sdk_channel"),
            (DOCKER_ENGINE_FILTER, docker, "sdk_channel"),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_sdk"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_sdk",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_expiry"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_expiry",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_no_leaks"),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_templates"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_templates",
            ),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_no_leaks",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_preview"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_preview",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_js"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_js",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_older"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_older",
            ),
            (SDK_FILTER, "crates/sandbox-app/tests/it", "e2b_snapshots"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_snapshots",
            ),
            (
                SDK_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_provider_e2e",
            ),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_provider_e2e",
            ),
            (
                SDK_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_provider_faults",
            ),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_provider_faults",
            ),
            (
                SDK_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_standard_template",
            ),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-app/tests/it",
                "e2b_standard_template",
            ),
            (AGENT_FS_FILTER, "crates/sandbox-agent/tests/it", "fs_edges"),
            (
                DOCKER_ENGINE_FILTER,
                "crates/sandbox-agent/tests/it",
                "pid1_docker",
            ),
        ] {
            assert!(
                filter.contains(&format!("test(/^{module}::/)")),
                "{filter} does not select {module}"
            );
            let file = root.join(dir).join(format!("{module}.rs"));
            assert!(file.is_file(), "{} is missing", file.display());
            let main = std::fs::read_to_string(root.join(dir).join("main.rs")).expect("main.rs");
            assert!(
                main.lines().any(|l| l.trim() == format!("mod {module};")),
                "{dir}/main.rs does not declare mod {module}"
            );
        }
    }
}

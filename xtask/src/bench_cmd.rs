//! `cargo xtask bench <suite> [--smoke]`.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;
use xtask::bench::{self, Suite};
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::ui::Verdict;

const FULL_DEADLINE: Duration = Duration::from_secs(3600);
const SMOKE_DEADLINE: Duration = Duration::from_secs(1200);
const METADATA_DEADLINE: Duration = Duration::from_secs(120);

pub(crate) fn run(ctx: &Ctx, suite: &Suite, smoke_flag: bool) -> ExitCode {
    // CI only ever runs benchmarks in smoke mode: numbers from a shared 2-core runner are noise.
    let smoke = smoke_flag || ctx.ci;
    for (package, bench) in suite.targets() {
        if let Err(e) = bench_target_exists(ctx, package, bench) {
            eprintln!("error: bench {}: {e}", suite.name);
            return ExitCode::FAILURE;
        }
    }

    let env = match suite_env(ctx, suite) {
        Ok(env) => env,
        Err(e) => {
            eprintln!("error: bench {}: {e}", suite.name);
            return ExitCode::FAILURE;
        }
    };
    let shown: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    let mut commands = Vec::new();
    let mut stdout = String::new();
    for (package, bench) in suite.targets() {
        let args = bench::cargo_args(package, bench, smoke);
        let command = format!("{shown}cargo {}", args.join(" "));
        println!("==> {command}");
        let mut cmd = ctx.cargo_cmd(&args);
        cmd.envs(env.iter().cloned());
        let mut echo = |stream: Stream, line: &str| match stream {
            Stream::Stdout => println!("{line}"),
            Stream::Stderr => eprintln!("{line}"),
        };
        let deadline = if smoke { SMOKE_DEADLINE } else { FULL_DEADLINE };
        let outcome =
            match process::run_with_deadline(&mut cmd, deadline, Output::Stream(&mut echo)) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            };
        if !outcome.success() {
            eprintln!("error: {}", outcome.describe());
            return ExitCode::FAILURE;
        }
        commands.push(command);
        stdout.push_str(&outcome.stdout);
    }
    let command = commands.join("\n");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let facts = bench::gather_facts(&ctx.root, &rustc);
    let report = bench::report(suite, smoke, &facts, &command, &stdout);
    let path = if smoke {
        ctx.target.join("bench")
    } else {
        ctx.root.join("docs").join("bench")
    }
    .join(format!("{}.md", suite.name));
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, report));
    if let Err(e) = written {
        eprintln!("error: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", path.display());

    let headlines = bench::headline_lines(&stdout);
    if headlines.is_empty() {
        eprintln!(
            "warning: bench {} printed no `BENCH {} <key>=<value>` line",
            suite.name, suite.name
        );
    }
    println!("==> headline ({})", if smoke { "smoke" } else { "full" });
    for line in headlines {
        println!("{line}");
    }
    ExitCode::SUCCESS
}

/// What a suite's bench binary needs made first, named in its environment. The docker and api
/// suites measure agent mode next to exec mode: they get the static agent, built as the
/// pipeline builds it (reused when up to date). The agent suite runs that agent in the Debian
/// image and drives it with the SDK: the same build, image and venv the pipeline makes. The e2b
/// and e2b-provider suites drive `sandbox serve` with the SDK (the latter with the E2B adapter
/// too): those three, and the service built in release.
fn suite_env(ctx: &Ctx, suite: &Suite) -> Result<Vec<(&'static str, String)>, String> {
    if !needs_agent(suite) {
        return Ok(Vec::new());
    }
    let (_, verdict) = crate::prereq_stage::ensure(ctx, crate::agent::TOOLS, true);
    if let Verdict::Failed(why) | Verdict::NotRun(why) = verdict {
        return Err(why);
    }
    let built = crate::agent::build(ctx)?;
    let mut env = vec![(
        xtask::agent_build::ENV_AGENT_BIN,
        built.path.display().to_string(),
    )];
    if matches!(suite.name, "agent" | "e2b" | "e2b-provider") {
        let image = crate::debian::ensure(&ctx.target.join("xtask"))?;
        let python = crate::sdk_venv::ensure(&ctx.root, &ctx.target)?;
        env.push((xtask::debian_image::ENV_IMAGE, image));
        env.push((xtask::e2b_sdk::ENV_PYTHON, python.display().to_string()));
    }
    if matches!(suite.name, "e2b" | "e2b-provider") {
        env.push((ENV_SANDBOX_BIN, build_service(ctx)?.display().to_string()));
    }
    Ok(env)
}

/// Names the `sandbox` binary to the e2b and e2b-provider suites.
const ENV_SANDBOX_BIN: &str = "SANDBOX_BENCH_SANDBOX_BIN";
/// A release build of the service, from cold, on a busy 2-core machine.
const SERVICE_BUILD_DEADLINE: Duration = Duration::from_secs(3600);

/// The service's `sandbox` binary, built in release (the profile the numbers are for): its
/// path.
fn build_service(ctx: &Ctx) -> Result<std::path::PathBuf, String> {
    let args = [
        "build",
        "--release",
        "-p",
        "sandbox-app",
        "--bin",
        "sandbox",
    ];
    println!("==> cargo {}", args.join(" "));
    let mut cmd = ctx.cargo_cmd(args);
    let mut echo = |_: Stream, line: &str| eprintln!("{line}");
    process::run_with_deadline(&mut cmd, SERVICE_BUILD_DEADLINE, Output::Stream(&mut echo))?
        .check()?;
    let bin = ctx.target.join("release").join("sandbox");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("cargo built no {}", bin.display()))
    }
}

/// The suites whose bench binary runs the static agent (`SANDBOX_AGENT_BIN`).
fn needs_agent(suite: &Suite) -> bool {
    matches!(
        suite.name,
        "agent" | "docker" | "api" | "e2b" | "e2b-provider"
    )
}

/// A clear error when the suite's package or bench target does not exist (yet).
fn bench_target_exists(ctx: &Ctx, package_name: &str, bench: &str) -> Result<(), String> {
    let mut cmd = ctx.cargo_cmd(["metadata", "--no-deps", "--format-version", "1"]);
    let out = process::run_with_deadline(&mut cmd, METADATA_DEADLINE, Output::Capture)?;
    out.check()
        .map_err(|e| format!("cannot load the workspace: {e}"))?;
    let md: Value = serde_json::from_str(&out.stdout)
        .map_err(|e| format!("cannot parse cargo metadata: {e}"))?;
    let package = md
        .get("packages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(package_name))
        .ok_or_else(|| format!("package {package_name} is not in the workspace"))?;
    let has_bench = package
        .get("targets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|t| {
            t.get("name").and_then(Value::as_str) == Some(bench)
                && t.get("kind")
                    .and_then(Value::as_array)
                    .is_some_and(|k| k.iter().any(|k| k.as_str() == Some("bench")))
        });
    if has_bench {
        Ok(())
    } else {
        Err(format!(
            "{} has no bench target `{}` yet (expected benches/{}.rs with \
             [[bench]] name = \"{}\", harness = false)",
            package_name, bench, bench, bench
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suites_that_measure_agent_mode_get_the_agent() {
        for name in ["agent", "docker", "api", "e2b", "e2b-provider"] {
            let suite = xtask::bench::find(name).unwrap();
            assert!(needs_agent(suite), "{name}");
        }
        for name in ["core", "session", "layers", "store", "transport"] {
            let suite = xtask::bench::find(name).unwrap();
            assert!(!needs_agent(suite), "{name}");
        }
    }
}

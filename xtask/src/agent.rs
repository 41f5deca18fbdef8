//! `cargo xtask agent`: the static build of `sandbox-agent` (see `xtask::agent_build`), checked,
//! with its size and build time. The pipeline's agent stage runs the same [`build`] and hands
//! the path to the docker engine stage's tests (`SANDBOX_AGENT_BIN`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use xtask::agent_build::{self, BUILD_ARGS, STATIC_RUSTFLAGS, TARGET_RUSTFLAGS_VAR};
use xtask::prereq::Tool;
use xtask::process::{self, Output};

use crate::Ctx;
use crate::prereq_stage;
use crate::ui::{Verdict, secs};

/// A cold LTO build of the agent and its dependencies on two cores.
const BUILD_DEADLINE: Duration = Duration::from_secs(1800);

/// The prerequisites of the static build.
pub(crate) const TOOLS: &[Tool] = &[Tool::StaticLibc];

/// A built and checked agent binary.
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) path: PathBuf,
    pub(crate) bytes: u64,
    pub(crate) elapsed: Duration,
}

/// Builds the static agent and checks it; prints the command, then the size and time.
pub(crate) fn build(ctx: &Ctx) -> Result<Built, String> {
    println!(
        "    {TARGET_RUSTFLAGS_VAR}=\"{STATIC_RUSTFLAGS}\" cargo {}",
        BUILD_ARGS.join(" ")
    );
    let mut cmd = ctx.cargo_cmd(BUILD_ARGS);
    agent_build::scope_rustflags(&mut cmd);
    let outcome = process::run_with_deadline(&mut cmd, BUILD_DEADLINE, Output::Inherit)?;
    if !outcome.success() {
        return Err(format!(
            "{} (the static link needs {}: `apt-get install libc6-dev`)",
            outcome.describe(),
            agent_build::STATIC_LIBC
        ));
    }
    let path = agent_build::binary_path(&ctx.target);
    let checked = agent_build::check_binary(&path)?;
    println!(
        "    {}: statically linked, {} bytes ({}, limit {}), built in {}",
        path.display(),
        checked.bytes,
        agent_build::mib(checked.bytes),
        agent_build::mib(agent_build::MAX_BYTES),
        secs(outcome.elapsed)
    );
    Ok(Built {
        path,
        bytes: checked.bytes,
        elapsed: outcome.elapsed,
    })
}

/// `cargo xtask agent`.
pub(crate) fn run(ctx: &Ctx) -> ExitCode {
    println!("xtask agent: the static sandbox-agent binary");
    let (_, verdict) = prereq_stage::ensure(ctx, TOOLS, true);
    if let Verdict::Failed(why) | Verdict::NotRun(why) = verdict {
        eprintln!("xtask agent: {why}");
        return ExitCode::FAILURE;
    }
    match build(ctx) {
        Ok(built) => {
            println!(
                "xtask agent: ok ({}, {} bytes, {})",
                built.path.display(),
                built.bytes,
                secs(built.elapsed)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask agent: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `cargo xtask serve`: the README's run command. Installs and starts what the service's
//! embedded defaults need (the local Docker engine, the locally built default image, with
//! progress), builds the static agent (agent mode, the default data plane, copies it into every
//! sandbox) and `sandbox`, then becomes `sandbox serve` with the Docker backend enabled.

use std::os::unix::process::CommandExt;
use std::process::{ExitCode, Stdio};

use xtask::conformance::Service;
use xtask::prereq::Tool;

use crate::Ctx;
use crate::fixtures::Fixtures;
use crate::prereq_stage;
use crate::ui::Verdict;

/// The service's defaults keep the Docker backend off (an operator's act); running this
/// command is that act for a development machine.
const ENABLE_DOCKER: (&str, &str) = ("SANDBOX_DOCKER_ENABLED", "true");

/// Which image sandboxes boot: the service's default unless the operator set one.
const IMAGE_VAR: &str = "SANDBOX_DOCKER_IMAGE";

/// The data plane the operator chose; agent mode (the default) needs the static agent.
const DATA_PLANE_VAR: &str = "SANDBOX_DOCKER_DATA_PLANE";
/// The agent agent mode installs: the static build this command makes, unless the operator
/// named one.
const AGENT_PATH_VAR: &str = "SANDBOX_DOCKER_AGENT_PATH";

/// Whether the service will run in agent mode: unless the operator chose exec (a config file
/// can choose too, and then the agent built here is simply unused).
fn wants_agent() -> bool {
    std::env::var(DATA_PLANE_VAR).map_or(true, |v| v.trim() != "exec")
}

pub(crate) fn serve(ctx: &Ctx, debian: bool) -> ExitCode {
    println!("xtask serve: preparing the local Docker engine and the default image");
    let mut tools = vec![Tool::Docker, Tool::Busybox];
    if debian {
        tools.push(Tool::Debootstrap);
    }
    let agent = wants_agent() && std::env::var_os(AGENT_PATH_VAR).is_none();
    if agent {
        tools.extend_from_slice(crate::agent::TOOLS);
    }
    let (_, verdict) = prereq_stage::ensure(ctx, &tools, true);
    match verdict {
        Verdict::Failed(why) | Verdict::NotRun(why) => return fail(&why),
        Verdict::Warned(notes) => notes.iter().for_each(|n| println!("    note: {n}")),
        Verdict::Passed => {}
    }
    let mut fixtures = Fixtures::kept(&ctx.root, &ctx.target);
    let mut ready = fixtures.ensure(Service::TestImage);
    if debian && ready.is_ok() {
        println!("xtask serve: the Debian sandbox image");
        ready = fixtures.ensure(Service::DebianImage);
    }
    let debian_tag = fixtures.debian_image().map(str::to_owned);
    for problem in fixtures.cleanup() {
        println!("    warning: {problem}");
    }
    if let Err(why) = ready {
        fixtures.dump_logs();
        return fail(&why);
    }

    // Agent mode copies the static agent into every sandbox: built (or found up to date)
    // before the service, which refuses to start without it.
    let agent_path = if agent {
        println!("xtask serve: building the static sandbox-agent");
        match crate::agent::build(ctx) {
            Ok(built) => Some(built.path),
            Err(why) => return fail(&why),
        }
    } else {
        None
    };

    println!("xtask serve: building sandbox");
    let built = ctx
        .cargo_cmd(["build", "-p", "sandbox-app", "--bin", "sandbox"])
        .stdin(Stdio::null())
        .status();
    match built {
        Ok(status) if status.success() => {}
        Ok(status) => return fail(&format!("cargo build ended with {status}")),
        Err(e) => return fail(&format!("cannot run cargo: {e}")),
    }

    let binary = ctx.target.join("debug").join("sandbox");
    let mut cmd = std::process::Command::new(&binary);
    cmd.arg("serve").current_dir(&ctx.root);
    if std::env::var_os(ENABLE_DOCKER.0).is_none() {
        cmd.env(ENABLE_DOCKER.0, ENABLE_DOCKER.1);
    }
    if let Some(path) = agent_path {
        println!(
            "xtask serve: sandboxes run {} as PID 1 ({AGENT_PATH_VAR})",
            path.display()
        );
        cmd.env(AGENT_PATH_VAR, path);
    }
    if let Some(tag) = debian_tag {
        if std::env::var_os(IMAGE_VAR).is_none() {
            println!("xtask serve: sandboxes boot {tag} ({IMAGE_VAR})");
            cmd.env(IMAGE_VAR, tag);
        } else {
            println!("xtask serve: {IMAGE_VAR} is set, so sandboxes do not boot {tag}");
        }
    }
    println!("xtask serve: exec {} serve", binary.display());
    // Only returns on failure: from here on the process is the service, so Ctrl-C and SIGTERM
    // reach it directly and it drains as it would under any supervisor.
    let e = cmd.exec();
    fail(&format!("cannot exec {}: {e}", binary.display()))
}

fn fail(why: &str) -> ExitCode {
    eprintln!("xtask serve: {why}");
    ExitCode::FAILURE
}

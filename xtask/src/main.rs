//! `cargo xtask`: the workspace's automation (see the usage text below).

// xtask is a command-line tool: what it prints on stdout and stderr is its interface, so the
// workspace's print_stdout/print_stderr lints (meant for library and service code) do not apply.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod agent;
mod api_golden;
mod bench_cmd;
mod debian;
mod fixtures;
mod js_sdk_install;
mod pipeline;
mod prereq_stage;
mod sdk_venv;
mod serve;
mod suite;
mod ui;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use xtask::{bench, conformance, workspace};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test                     the whole pipeline (the README's test command; CI runs it with CI=true):
                           prerequisites, fixtures, fmt, clippy (the workspace, then each feature
                           set of sandbox-app), tidy, the agent's static build, hermetic tests
                           (also sandbox-app with no default features), conformance, redis
                           tests, docker engine tests, egress, cleanup; each stage and step is
                           timed in the closing summary
  conformance <adapter>    start what one adapter needs, run its conformance suite, print its table
  serve [--debian]         run the service on its embedded defaults (memory store, the local
                           Docker engine, which it starts, and the locally built default image);
                           --debian: sandboxes boot the Debian sandbox image, built when missing
  agent                    build the static sandbox-agent binary (profile agent, +crt-static),
                           check it is static and under 5 MB, print its size and build time
  debian-image             build the Debian sandbox image (debootstrap from this machine's apt
                           mirror, then docker import) unless its recipe's tag exists; print it
  sdk-venv                 make the E2B Python SDKs' venvs (2.63.0 and the older 2.45.1) and
                           Schemathesis's (4.32.5), each from its hashed lock unless it
                           matches; print their programs
  js-sdk                   install the E2B JS SDK with npm ci from its committed lock into the
                           target directory unless it matches; print the directory
  tidy                     check the architecture's dependency lines on this workspace
  bench <suite> [--smoke]  run a benchmark suite and write its Markdown report
  api-golden [--bless]     replay the HTTP API's golden corpus (crates/sandbox-app/tests/golden/
                           api.jsonl) against the router; --bless rewrites it from the answers
  help                     this text

Under CI=true a missing prerequisite, a service that cannot start or a skipped conformance case
fails the run; locally they are warnings and the affected stages say they did not run. Under
CI=true a run longer than 75 minutes also fails, its last line naming the slowest stages.";

/// What every command needs to know.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) root: PathBuf,
    pub(crate) target: PathBuf,
    pub(crate) cargo: PathBuf,
    pub(crate) ci: bool,
}

impl Ctx {
    fn new() -> Self {
        let root = workspace::root();
        let cargo = workspace::cargo();
        let target = workspace::target_dir(&root, &cargo);
        Self {
            root,
            target,
            cargo,
            ci: workspace::is_ci(),
        }
    }

    /// `cargo <args>` in the workspace root. `DOCKER_HOST` is dropped so tests use the engine
    /// the fixtures checked (see `fixtures::docker`).
    pub(crate) fn cargo_cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(&self.cargo);
        cmd.args(args)
            .current_dir(&self.root)
            .env_remove("DOCKER_HOST");
        cmd
    }
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("error: {msg}\n\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [] => usage_error("no command given"),
        ["help" | "-h" | "--help"] => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["test"] => pipeline::test(&Ctx::new()),
        ["conformance", name] => match conformance::find(name) {
            Some(adapter) => pipeline::conformance_one(&Ctx::new(), adapter),
            None => {
                eprintln!(
                    "error: unknown adapter {name:?}; registered adapters: {}",
                    conformance::names()
                );
                ExitCode::from(2)
            }
        },
        ["conformance", ..] => usage_error(&format!(
            "conformance takes exactly one adapter (registered: {})",
            conformance::names()
        )),
        ["tidy"] => tidy(&Ctx::new()),
        ["serve"] => serve::serve(&Ctx::new(), false),
        ["serve", "--debian"] => serve::serve(&Ctx::new(), true),
        ["serve", ..] => usage_error("serve takes only --debian"),
        ["agent"] => agent::run(&Ctx::new()),
        ["debian-image"] => debian::run(&Ctx::new()),
        ["sdk-venv"] => sdk_venv::run(&Ctx::new()),
        ["js-sdk"] => js_sdk_install::run(&Ctx::new()),
        ["bench", rest @ ..] => {
            let smoke = rest.contains(&"--smoke");
            let names: Vec<&&str> = rest.iter().filter(|a| **a != "--smoke").collect();
            match names.as_slice() {
                [name] if !name.starts_with('-') => match bench::find(name) {
                    Some(suite) => bench_cmd::run(&Ctx::new(), suite, smoke),
                    None => {
                        eprintln!(
                            "error: unknown bench suite {name:?}; suites: {}",
                            bench::names()
                        );
                        ExitCode::from(2)
                    }
                },
                _ => usage_error(&format!(
                    "bench takes one suite and optionally --smoke (suites: {})",
                    bench::names()
                )),
            }
        }
        ["api-golden"] => api_golden::run(&Ctx::new(), false),
        ["api-golden", "--bless"] => api_golden::run(&Ctx::new(), true),
        ["api-golden", ..] => usage_error("api-golden takes only --bless"),
        [cmd, ..] => usage_error(&format!("unknown command or arguments: {cmd:?} ...")),
    }
}

/// `cargo xtask tidy`: one line per violation, exit 1 if any.
fn tidy(ctx: &Ctx) -> ExitCode {
    match xtask::tidy::check_live(&ctx.root) {
        Ok(violations) if violations.is_empty() => {
            println!("tidy: ok");
            ExitCode::SUCCESS
        }
        Ok(violations) => {
            for v in &violations {
                println!("{v}");
            }
            eprintln!("tidy: {} violation(s)", violations.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tidy: error: {e}");
            ExitCode::FAILURE
        }
    }
}

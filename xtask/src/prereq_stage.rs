//! The prerequisites stage: find what is missing, install what we can, name the rest.

use std::time::Duration;

use xtask::prereq::{self, Install, Prerequisite, Tool};
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::ui::Verdict;

const APT_UPDATE_DEADLINE: Duration = Duration::from_secs(600);
const APT_INSTALL_DEADLINE: Duration = Duration::from_secs(900);
const CARGO_INSTALL_DEADLINE: Duration = Duration::from_secs(1800);
/// Another apt-get or dpkg (unattended-upgrades on a fresh machine, a colleague's install) holds
/// the dpkg lock for a while; apt waits this long for it instead of failing at once.
const DPKG_LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=300";

/// Which tools are usable after the prerequisites stage.
#[derive(Debug, Default)]
pub(crate) struct Availability {
    /// (tool, why it is missing and how to get it).
    missing: Vec<(Tool, String)>,
}

impl Availability {
    /// `None` when all `tools` are usable, else why not.
    pub(crate) fn lacking(&self, tools: &[Tool]) -> Option<String> {
        let reasons: Vec<&str> = self
            .missing
            .iter()
            .filter(|(t, _)| tools.contains(t))
            .map(|(_, why)| why.as_str())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Checks the prerequisites of `tools`, installing missing ones where possible. `strict`: a
/// prerequisite that is still missing fails the stage (CI, or an explicitly requested adapter);
/// otherwise it is a warning and the stages that need it report themselves as not run.
pub(crate) fn ensure(ctx: &Ctx, tools: &[Tool], strict: bool) -> (Availability, Verdict) {
    let wanted = prereq::for_tools(tools);
    let mut missing = probe(ctx, &wanted);
    let mut notes = Vec::new();
    let mut attempted = false;

    let apt = prereq::apt_packages(&missing);
    if !apt.is_empty() {
        if !process::is_root() {
            notes.push(format!(
                "not root, so not installing Debian package(s) {}",
                apt.join(" ")
            ));
        } else if process::find_executable("apt-get").is_none() {
            notes.push(format!(
                "no apt-get, so not installing Debian package(s) {}",
                apt.join(" ")
            ));
        } else {
            attempted = true;
            if let Err(e) = apt_install(&apt) {
                notes.push(e);
            }
        }
    }
    for p in &missing {
        if let Install::CargoInstall(krate) = p.install {
            attempted = true;
            if let Err(e) = cargo_install(ctx, krate) {
                notes.push(e);
            }
        }
    }
    if attempted {
        println!("    checking again after installing");
        missing = probe(ctx, &missing);
    }

    let mut avail = Availability::default();
    let mut messages = notes;
    for p in &missing {
        let why = format!(
            "{} is missing ({}): install it with `{}`",
            p.what,
            p.reason,
            p.install.hint()
        );
        messages.push(why.clone());
        avail.missing.push((p.tool, why));
    }
    let verdict = if avail.missing.is_empty() {
        if messages.is_empty() {
            Verdict::Passed
        } else {
            Verdict::Warned(messages)
        }
    } else if strict {
        Verdict::Failed(messages.join("\n"))
    } else {
        Verdict::Warned(messages)
    };
    (avail, verdict)
}

/// The prerequisites among `list` that are absent, printing one line per prerequisite.
fn probe<'p>(ctx: &Ctx, list: &[&'p Prerequisite]) -> Vec<&'p Prerequisite> {
    let mut missing = Vec::new();
    for &p in list {
        let present = prereq::present(p, &ctx.cargo);
        println!(
            "    {:<14} {}",
            p.what,
            if present { "found" } else { "missing" }
        );
        if !present {
            missing.push(p);
        }
    }
    missing
}

fn apt_install(packages: &[&str]) -> Result<(), String> {
    let mut show = |_: Stream, line: &str| println!("    apt | {line}");
    println!("    apt-get update");
    let mut update = process::command("apt-get", ["-o", DPKG_LOCK_TIMEOUT, "update"]);
    update.env("DEBIAN_FRONTEND", "noninteractive");
    process::run_with_deadline(&mut update, APT_UPDATE_DEADLINE, Output::Stream(&mut show))?
        .check()?;
    println!("    apt-get install {}", packages.join(" "));
    let mut install = process::command(
        "apt-get",
        [
            "-o",
            DPKG_LOCK_TIMEOUT,
            "install",
            "-y",
            "--no-install-recommends",
        ],
    );
    install
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    process::run_with_deadline(
        &mut install,
        APT_INSTALL_DEADLINE,
        Output::Stream(&mut show),
    )?
    .check()
}

fn cargo_install(ctx: &Ctx, krate: &str) -> Result<(), String> {
    println!("    cargo install {krate} --locked");
    let mut cmd = process::command(&ctx.cargo, ["install", krate, "--locked"]);
    process::run_with_deadline(&mut cmd, CARGO_INSTALL_DEADLINE, Output::Inherit)?.check()
}

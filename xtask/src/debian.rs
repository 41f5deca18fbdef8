//! Builds the Debian sandbox image from its recipe (`xtask::debian_image`) when its tag is
//! missing: `debootstrap` into a directory under the target directory, `useradd` in the chroot,
//! `tar | docker import` under the recipe's tag, a smoke run, and the directory removed.
//! Progress: debootstrap's own lines, prefixed with the time since the build started.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use xtask::conformance::Service;
use xtask::debian_image::{self, CLEANUP, IMPORT_CHANGES, Recipe, USER, USER_HOME, USER_UID};
use xtask::prereq::Tool;
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::fixtures::{Fixtures, docker, smoke_run};
use crate::prereq_stage;
use crate::ui::{Verdict, secs};

/// debootstrap downloads and unpacks about 150 packages.
const DEBOOTSTRAP_DEADLINE: Duration = Duration::from_secs(1800);
const STEP_DEADLINE: Duration = Duration::from_secs(120);
const IMPORT_DEADLINE: Duration = Duration::from_secs(600);
const PROBE_DEADLINE: Duration = Duration::from_secs(20);

/// `cargo xtask debian-image`: the Debian sandbox image, built unless its tag exists.
pub(crate) fn run(ctx: &Ctx) -> ExitCode {
    println!("xtask debian-image: the Debian sandbox image");
    let fail = |why: &str| {
        eprintln!("xtask debian-image: {why}");
        ExitCode::FAILURE
    };
    let (_, verdict) = prereq_stage::ensure(ctx, &[Tool::Docker, Tool::Debootstrap], true);
    if let Verdict::Failed(why) | Verdict::NotRun(why) = verdict {
        return fail(&why);
    }
    let mut fixtures = Fixtures::kept(&ctx.root, &ctx.target);
    let ready = fixtures.ensure(Service::DebianImage);
    let tag = fixtures.debian_image().map(str::to_owned);
    for problem in fixtures.cleanup() {
        println!("    warning: {problem}");
    }
    match (ready, tag) {
        (Ok(()), Some(tag)) => {
            println!("{}={tag}", xtask::debian_image::ENV_IMAGE);
            ExitCode::SUCCESS
        }
        (Err(why), _) => {
            fixtures.dump_logs();
            fail(&why)
        }
        (Ok(()), None) => fail("the Debian image fixture gave no tag"),
    }
}

/// The recipe this machine's apt sources give.
pub(crate) fn recipe() -> Result<Recipe, String> {
    let sources = debian_image::read_sources(Path::new("/"))?;
    let read: Vec<String> = sources
        .iter()
        .map(|(file, _)| file.display().to_string())
        .collect();
    let all: Vec<_> = sources.into_iter().map(|(_, s)| s).collect();
    let mirror = debian_image::choose_mirror(&all).ok_or_else(|| {
        format!(
            "no apt source names a Debian mirror to bootstrap from (an enabled `deb` source \
             over http(s) with `main` and a release suite such as bookworm); read: {}",
            if read.is_empty() {
                format!(
                    "nothing (/{} and /{}/*.list, *.sources)",
                    debian_image::SOURCES_LIST,
                    debian_image::SOURCES_DIR
                )
            } else {
                read.join(", ")
            }
        )
    })?;
    Ok(Recipe::new(mirror))
}

fn image_exists(tag: &str) -> bool {
    let mut cmd = docker(["image", "inspect", "--format", "{{.Id}}", tag]);
    process::run_with_deadline(&mut cmd, PROBE_DEADLINE, Output::Capture).is_ok_and(|o| o.success())
}

/// The image's size in bytes, as the engine reports it.
fn image_size(tag: &str) -> Option<u64> {
    let mut cmd = docker(["image", "inspect", "--format", "{{.Size}}", tag]);
    let out = process::run_with_deadline(&mut cmd, PROBE_DEADLINE, Output::Capture).ok()?;
    out.stdout.trim().parse().ok()
}

/// The Debian image's tag, built first when it is missing. `work` is where the root
/// filesystem is made (under the target directory: a few hundred MB, removed afterwards).
pub(crate) fn ensure(work: &Path) -> Result<String, String> {
    let recipe = recipe()?;
    let tag = recipe.tag();
    if image_exists(&tag) {
        println!(
            "    {tag} exists (debootstrap {} from {})",
            recipe.mirror.suite, recipe.mirror.uri
        );
        return Ok(tag);
    }
    if !process::is_root() {
        return Err(format!(
            "{tag} is missing and building it needs root (debootstrap and chroot)"
        ));
    }
    if process::find_executable("debootstrap").is_none() {
        return Err(format!(
            "{tag} is missing and debootstrap is not installed (apt-get install debootstrap)"
        ));
    }
    let dir = work.join(format!("debian-rootfs-{}", recipe.hash()));
    remove_tree(&dir)?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let built = build(&recipe, &tag, &dir);
    let removed = remove_tree(&dir);
    built?;
    removed?;
    Ok(tag)
}

fn build(recipe: &Recipe, tag: &str, dir: &Path) -> Result<(), String> {
    let start = Instant::now();
    let mut cmd = process::command("debootstrap", recipe.debootstrap_args(dir));
    println!("    building {tag}: {}", process::render(&cmd));
    let mut show = |_: Stream, line: &str| {
        println!("    debootstrap {:>6} | {line}", secs(start.elapsed()));
    };
    process::run_with_deadline(&mut cmd, DEBOOTSTRAP_DEADLINE, Output::Stream(&mut show))?
        .check()?;
    println!("    root filesystem ready after {}", secs(start.elapsed()));

    let mut useradd = Command::new("chroot");
    useradd.arg(dir).arg("useradd").args(recipe.useradd_args());
    println!("    {}", process::render(&useradd));
    process::run_with_deadline(&mut useradd, STEP_DEADLINE, Output::Capture)?.check()?;
    let home = dir.join(USER_HOME.trim_start_matches('/'));
    if !home.is_dir() {
        return Err(format!("useradd made no {}", home.display()));
    }
    let mut cleanup = Command::new("chroot");
    cleanup.arg(dir).args(["/bin/sh", "-c", CLEANUP]);
    println!("    chroot {} /bin/sh -c '{CLEANUP}'", dir.display());
    process::run_with_deadline(&mut cleanup, STEP_DEADLINE, Output::Capture)?.check()?;

    // A pipe with pipefail: a tar that fails half-way must not import a half image.
    let mut import = Command::new("bash");
    import.args(["-c", "set -o pipefail; dir=$1; tag=$2; shift 2; tar --numeric-owner -C \"$dir\" -c . | docker import \"$@\" - \"$tag\"", "import"]);
    import.arg(dir).arg(tag);
    for change in IMPORT_CHANGES {
        import.arg("--change").arg(change);
    }
    import
        .arg("--change")
        .arg(format!("LABEL sandbox.recipe={}", recipe.hash()));
    import.env_remove("DOCKER_HOST");
    println!("    tar -C {} -c . | docker import - {tag}", dir.display());
    process::run_with_deadline(&mut import, IMPORT_DEADLINE, Output::Capture)?.check()?;

    smoke(tag)?;
    let size = image_size(tag).map_or_else(
        || "size unknown".to_owned(),
        |b| format!("{} bytes ({})", b, xtask::agent_build::mib(b)),
    );
    println!("    {tag} built in {}, {size}", secs(start.elapsed()));
    Ok(())
}

/// What the SDKs rely on: bash as a login shell, the `user` account with its home, python3,
/// git, curl and the CA bundle.
fn smoke(tag: &str) -> Result<(), String> {
    let script = format!(
        "set -e; test \"$(id -u {USER})\" = {USER_UID}; test -d {USER_HOME}; \
         test \"$(getent passwd {USER} | cut -d: -f7)\" = /bin/bash; \
         python3 -c 'print(1)' >/dev/null; git --version >/dev/null; curl --version >/dev/null; \
         test -s /etc/ssl/certs/ca-certificates.crt; ps -p 1 >/dev/null; echo debian-image-ok"
    );
    smoke_run(
        tag,
        &["/bin/bash", "-l", "-c", &script],
        "debian-image-ok",
        STEP_DEADLINE,
    )?;
    println!("    {tag} answers (bash -l, user {USER_UID}, python3, git, curl, CA bundle)");
    Ok(())
}

/// The mount points at or under `dir`, deepest first, from `/proc/self/mounts`.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mounts").map_or_else(|_| Vec::new(), |t| mounts_in(&t, dir))
}

/// [`mounts_under`] over a mounts table's text.
fn mounts_in(table: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        // Spaces in mount points are written as \040.
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Removes a root filesystem directory. debootstrap mounts `/proc` and `/sys` inside it while it
/// runs; an interrupted run leaves them mounted, and removing through a live mount would reach
/// the host's own files. So every mount under it is unmounted first, and nothing is removed
/// while one remains.
fn remove_tree(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    for mount in mounts_under(dir) {
        println!(
            "    unmounting {} (left by an interrupted debootstrap)",
            mount.display()
        );
        let mut cmd = process::command("umount", ["-l"]);
        cmd.arg(&mount);
        let _ = process::run_with_deadline(&mut cmd, STEP_DEADLINE, Output::Capture);
    }
    let left = mounts_under(dir);
    if !left.is_empty() {
        return Err(format!(
            "{} still has mounts ({}): unmount them, then remove it",
            dir.display(),
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_under_the_root_filesystem_are_found_deepest_first() {
        let table = "\
proc /proc proc rw 0 0
proc /t/rootfs/proc proc rw 0 0
sysfs /t/rootfs/sys sysfs rw 0 0
devpts /t/rootfs/dev/pts devpts rw 0 0
tmpfs /t/rootfs\\040x tmpfs rw 0 0
/dev/vda /t/rootfs-other ext4 rw 0 0
";
        let found = mounts_in(table, Path::new("/t/rootfs"));
        assert_eq!(
            found,
            [
                PathBuf::from("/t/rootfs/dev/pts"),
                PathBuf::from("/t/rootfs/proc"),
                PathBuf::from("/t/rootfs/sys"),
            ]
        );
        assert!(mounts_in(table, Path::new("/elsewhere")).is_empty());
        assert_eq!(
            mounts_in(table, Path::new("/t/rootfs x")),
            [PathBuf::from("/t/rootfs x")]
        );
    }
}

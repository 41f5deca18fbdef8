//! The venvs of the official E2B Python SDKs (`xtask::e2b_sdk`: the current release and the
//! older one, each with its own lock) and of Schemathesis: made in the target directory from
//! the hashed lock with `pip install --require-hashes`, and reused while the lock is unchanged.
//! `cargo xtask sdk-venv` makes all three and prints the programs they give the tests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xtask::e2b_sdk::{self, PySdk};
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::ui::secs;

const VENV_DEADLINE: Duration = Duration::from_secs(120);
const INSTALL_DEADLINE: Duration = Duration::from_secs(900);

/// The current SDK's venv python (see [`ensure_sdk`]).
pub(crate) fn ensure(root: &Path, target: &Path) -> Result<PathBuf, String> {
    ensure_sdk(root, target, e2b_sdk::CURRENT)
}

/// The older SDK's venv python (see [`ensure_sdk`]).
pub(crate) fn ensure_older(root: &Path, target: &Path) -> Result<PathBuf, String> {
    ensure_sdk(root, target, e2b_sdk::OLDER)
}

/// Schemathesis's venv program, `bin/schemathesis` (see [`ensure_sdk`]).
pub(crate) fn ensure_schemathesis(root: &Path, target: &Path) -> Result<PathBuf, String> {
    ensure_sdk(root, target, e2b_sdk::SCHEMATHESIS)
}

/// `sdk`'s venv program ([`PySdk::program`]: the python for the SDKs), made first when the venv
/// is missing or was made from another lock.
pub(crate) fn ensure_sdk(root: &Path, target: &Path, sdk: PySdk) -> Result<PathBuf, String> {
    let version = sdk.version;
    let package = sdk.package;
    let lock = sdk.lock_path(root);
    let bytes = std::fs::read(&lock).map_err(|e| format!("cannot read {}: {e}", lock.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    sdk.check_lock(&text)
        .map_err(|e| format!("{}: {e}", lock.display()))?;
    let digest = e2b_sdk::lock_digest(&bytes);
    let venv = sdk.venv_dir(target);
    let python = e2b_sdk::python(&venv);
    let program = sdk.program_path(&venv);
    if e2b_sdk::venv_matches(&venv, &digest) && program.is_file() {
        println!(
            "    {} matches the lock (sha256 {})",
            venv.display(),
            &digest[..12]
        );
        return Ok(program);
    }
    let start = Instant::now();
    if venv.exists() {
        println!(
            "    {} was made from another lock: making it again",
            venv.display()
        );
        std::fs::remove_dir_all(&venv)
            .map_err(|e| format!("cannot remove {}: {e}", venv.display()))?;
    }
    let interpreter = process::find_executable("python3")
        .ok_or("python3 is not installed (apt-get install python3-venv)")?;
    let mut make = process::command(&interpreter, ["-m", "venv"]);
    make.arg(&venv);
    println!("    {}", process::render(&make));
    process::run_with_deadline(&mut make, VENV_DEADLINE, Output::Capture)?
        .check()
        .map_err(|e| {
            format!("{e}\n(Debian's python3 needs python3-venv: apt-get install python3-venv)")
        })?;

    // Wheels only: the lock's hashes name the files, and a source build would run code from
    // the package at install time.
    let mut install = process::command(
        &python,
        [
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--require-hashes",
            "--only-binary=:all:",
            "-r",
        ],
    );
    install.arg(&lock);
    println!("    {}", process::render(&install));
    let mut show = |_: Stream, line: &str| println!("    pip | {line}");
    process::run_with_deadline(&mut install, INSTALL_DEADLINE, Output::Stream(&mut show))?
        .check()?;

    let mut probe = process::command(&python, ["-c".to_owned(), sdk.probe_script()]);
    let out = process::run_with_deadline(&mut probe, VENV_DEADLINE, Output::Capture)?;
    out.check()?;
    if out.stdout.trim() != version {
        return Err(format!(
            "the venv has {package} {:?}, not {version}",
            out.stdout.trim()
        ));
    }
    if !program.is_file() {
        return Err(format!(
            "installing {package} {version} left no {}",
            program.display()
        ));
    }
    std::fs::write(venv.join(e2b_sdk::STAMP_FILE), format!("{digest}\n"))
        .map_err(|e| format!("cannot write the venv's stamp: {e}"))?;
    println!(
        "    {package} {version} installed in {} in {}",
        venv.display(),
        secs(start.elapsed())
    );
    Ok(program)
}

/// `cargo xtask sdk-venv`: every SDK release's venv and Schemathesis's, each from its own
/// hashed lock.
pub(crate) fn run(ctx: &Ctx) -> ExitCode {
    let mut lines = Vec::new();
    for sdk in e2b_sdk::VENVS {
        if sdk.package == "e2b" {
            println!(
                "xtask sdk-venv: the official E2B Python SDK {} from its hashed lock",
                sdk.version
            );
        } else {
            println!(
                "xtask sdk-venv: {} {} from its hashed lock",
                sdk.package, sdk.version
            );
        }
        match ensure_sdk(&ctx.root, &ctx.target, sdk) {
            Ok(program) => lines.push(format!("{}={}", sdk.env_var, program.display())),
            Err(e) => {
                eprintln!("xtask sdk-venv: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    for line in lines {
        println!("{line}");
    }
    ExitCode::SUCCESS
}

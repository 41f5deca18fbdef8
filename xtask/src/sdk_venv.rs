//! The venv of the official E2B Python SDK (`xtask::e2b_sdk`): made in the target directory
//! from the hashed lock with `pip install --require-hashes`, and reused while the lock is
//! unchanged. `cargo xtask sdk-venv` makes it and prints its python.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xtask::e2b_sdk::{self, SDK_VERSION};
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::ui::secs;

const VENV_DEADLINE: Duration = Duration::from_secs(120);
const INSTALL_DEADLINE: Duration = Duration::from_secs(900);

/// The venv's python, made first when the venv is missing or was made from another lock.
pub(crate) fn ensure(root: &Path, target: &Path) -> Result<PathBuf, String> {
    let lock = e2b_sdk::lock_path(root);
    let bytes = std::fs::read(&lock).map_err(|e| format!("cannot read {}: {e}", lock.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    e2b_sdk::check_lock(&text).map_err(|e| format!("{}: {e}", lock.display()))?;
    let digest = e2b_sdk::lock_digest(&bytes);
    let venv = e2b_sdk::venv_dir(target);
    let python = e2b_sdk::python(&venv);
    if e2b_sdk::venv_matches(&venv, &digest) {
        println!(
            "    {} matches the lock (sha256 {})",
            venv.display(),
            &digest[..12]
        );
        return Ok(python);
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

    let mut probe = process::command(
        &python,
        [
            "-c",
            "import importlib.metadata as m, e2b; print(m.version('e2b'))",
        ],
    );
    let out = process::run_with_deadline(&mut probe, VENV_DEADLINE, Output::Capture)?;
    out.check()?;
    if out.stdout.trim() != SDK_VERSION {
        return Err(format!(
            "the venv has e2b {:?}, not {SDK_VERSION}",
            out.stdout.trim()
        ));
    }
    std::fs::write(venv.join(e2b_sdk::STAMP_FILE), format!("{digest}\n"))
        .map_err(|e| format!("cannot write the venv's stamp: {e}"))?;
    println!(
        "    e2b {SDK_VERSION} installed in {} in {}",
        venv.display(),
        secs(start.elapsed())
    );
    Ok(python)
}

/// `cargo xtask sdk-venv`.
pub(crate) fn run(ctx: &Ctx) -> ExitCode {
    println!("xtask sdk-venv: the official E2B Python SDK {SDK_VERSION} from its hashed lock");
    match ensure(&ctx.root, &ctx.target) {
        Ok(python) => {
            println!("{}={}", e2b_sdk::ENV_PYTHON, python.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask sdk-venv: {e}");
            ExitCode::FAILURE
        }
    }
}

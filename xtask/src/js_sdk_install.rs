//! The official E2B JS SDK's install (`xtask::js_sdk`): `npm ci` from the committed lock into
//! a directory under the target directory, reused while `package.json` and the lock are
//! unchanged. `cargo xtask js-sdk` makes it and prints the directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xtask::js_sdk::{self, JS_SDK_VERSION};
use xtask::process::{self, Output, Stream};

use crate::Ctx;
use crate::ui::secs;

const PROBE_DEADLINE: Duration = Duration::from_secs(60);
const INSTALL_DEADLINE: Duration = Duration::from_secs(900);

/// The install directory (holding `node_modules`), made first when it is missing or was made
/// from other files.
pub(crate) fn ensure(root: &Path, target: &Path) -> Result<PathBuf, String> {
    let node = process::find_executable("node")
        .ok_or("node is not installed (the E2B JS SDK needs Node 20.18.1+ or 22+)")?;
    let npm = process::find_executable("npm").ok_or("npm is not installed (it comes with Node)")?;
    let version = process::run_with_deadline(
        &mut process::command(&node, ["--version"]),
        PROBE_DEADLINE,
        Output::Capture,
    )?;
    version.check()?;
    js_sdk::check_node_version(&version.stdout)?;

    let dir = js_sdk::js_dir(root);
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let (package, lock) = (read(js_sdk::PACKAGE_FILE)?, read(js_sdk::LOCK_FILE)?);
    js_sdk::check_files(
        &String::from_utf8_lossy(&package),
        &String::from_utf8_lossy(&lock),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let digest = js_sdk::files_digest(&package, &lock);
    let install = js_sdk::install_dir(target);
    if js_sdk::install_matches(&install, &digest) {
        println!(
            "    {} matches the lock (sha256 {})",
            install.display(),
            &digest[..12]
        );
        return Ok(install);
    }
    let start = Instant::now();
    if install.exists() {
        println!(
            "    {} was made from other files: installing again",
            install.display()
        );
        std::fs::remove_dir_all(&install)
            .map_err(|e| format!("cannot remove {}: {e}", install.display()))?;
    }
    std::fs::create_dir_all(&install)
        .map_err(|e| format!("cannot make {}: {e}", install.display()))?;
    for (name, bytes) in [(js_sdk::PACKAGE_FILE, &package), (js_sdk::LOCK_FILE, &lock)] {
        let path = install.join(name);
        std::fs::write(&path, bytes)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    // `npm ci` only: it installs the lock as it is or fails. No install scripts: they would
    // run code from the packages at install time, and the SDK needs none.
    let mut ci = process::command(
        &npm,
        [
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
        ],
    );
    ci.current_dir(&install);
    println!("    (cd {}) {}", install.display(), process::render(&ci));
    let mut show = |_: Stream, line: &str| println!("    npm | {line}");
    process::run_with_deadline(&mut ci, INSTALL_DEADLINE, Output::Stream(&mut show))?.check()?;

    let installed = js_sdk::installed_package(&install);
    let text = std::fs::read_to_string(&installed)
        .map_err(|e| format!("npm ci installed no e2b ({}): {e}", installed.display()))?;
    let got: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not JSON: {e}", installed.display()))?;
    if got.get("version").and_then(serde_json::Value::as_str) != Some(JS_SDK_VERSION) {
        return Err(format!(
            "npm ci installed e2b {:?}, not {JS_SDK_VERSION}",
            got.get("version")
        ));
    }
    std::fs::write(install.join(js_sdk::STAMP_FILE), format!("{digest}\n"))
        .map_err(|e| format!("cannot write the install's stamp: {e}"))?;
    println!(
        "    e2b {JS_SDK_VERSION} (npm) installed in {} in {}",
        install.display(),
        secs(start.elapsed())
    );
    Ok(install)
}

/// `cargo xtask js-sdk`.
pub(crate) fn run(ctx: &Ctx) -> ExitCode {
    println!("xtask js-sdk: the official E2B JS SDK {JS_SDK_VERSION} with npm ci from its lock");
    match ensure(&ctx.root, &ctx.target) {
        Ok(dir) => {
            println!("{}={}", js_sdk::ENV_JS_DIR, dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("xtask js-sdk: {e}");
            ExitCode::FAILURE
        }
    }
}

//! The E2B-compatible API of `sandbox serve` proven with the official E2B JS SDK (npm `e2b`
//! 2.51.0, `tests/e2b/js/`), run by Node in normal mode.
//!
//! The SDK is installed by `npm ci` from the committed `package-lock.json` into a directory
//! under `target/` (`cargo xtask js-sdk` makes it and prints it; the e2b sdk stage of `cargo
//! xtask test` sets it), named by `SANDBOX_TEST_E2B_JS_DIR`; the scenario imports the SDK from
//! that directory's `node_modules`. Node is the `node` on `PATH`, the one xtask checked.
//!
//! The scenario (`tests/e2b/js/scenario.mjs`) asserts each SDK result itself; the driver asserts
//! its summary line, then that the engine holds none of the sandboxes it made.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`), the static agent
//! (`SANDBOX_AGENT_BIN`), Node 20 and the installed SDK: the e2b sdk stage.

// Needs the Docker backend and the E2B API compiled in.
#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_testkit::e2b_sdk::run_script;

use crate::support::e2b::E2bServe;

/// Where `npm ci` installed the SDK (the directory holding `node_modules`).
const ENV_JS_DIR: &str = "SANDBOX_TEST_E2B_JS_DIR";
/// One Debian sandbox created and killed, and a few MiB both ways, on a slow machine.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(300);

/// The install directory from [`ENV_JS_DIR`], checked: a clear panic when it is missing, in CI
/// as anywhere (the stage always sets it).
fn js_dir() -> PathBuf {
    let dir = PathBuf::from(std::env::var_os(ENV_JS_DIR).unwrap_or_else(|| {
        panic!("{ENV_JS_DIR} is not set: run `cargo xtask js-sdk`, which installs the JS SDK with npm ci and prints it")
    }));
    let sdk = dir.join("node_modules/e2b/package.json");
    assert!(
        dir.is_absolute() && sdk.is_file(),
        "{ENV_JS_DIR}={}: no {} (`cargo xtask js-sdk` installs it)",
        dir.display(),
        sdk.display()
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN), Node and the JS SDK (SANDBOX_TEST_E2B_JS_DIR): the e2b sdk stage"]
async fn the_official_js_sdk_passes_its_scenario_against_the_e2b_api() {
    let dir = js_dir();
    let serve = E2bServe::start("te2bjs").await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/js/scenario.mjs");
    let mut run = serve.sdk_command("node");
    run.arg(&script).env("SANDBOX_E2B_JS_DIR", &dir);
    let context = || serve.context();
    // The scenario blocks; the service is another process, so nothing here needs the runtime.
    let stdout = tokio::task::block_in_place(|| run_script(run, SCENARIO_DEADLINE, &context));
    println!("{stdout}");
    assert!(
        stdout.contains("ok   kill_then_not_found"),
        "the scenario did not reach its kill step\n{stdout}"
    );
    // The scenario killed every sandbox it made: the engine holds none of them.
    serve.wait_no_containers().await;
}

//! The E2B-compatible API of `sandbox serve` proven with an older official Python SDK (PyPI
//! `e2b` 2.45.1), which creates and connects through the legacy routes (`POST /sandboxes`,
//! `POST /sandboxes/{id}/connect`).
//!
//! Its dependency pins differ from 2.63.0's, so it has its own venv made from its own hashed
//! lock (`tests/e2b/older/requirements.lock`); `cargo xtask sdk-venv` makes both venvs and
//! prints their pythons, the e2b sdk stage of `cargo xtask test` sets this one's as
//! `SANDBOX_TEST_E2B_OLDER_PYTHON`. The scenario (`tests/e2b/older/scenario.py`: create, run,
//! read, kill) asserts each SDK result itself; the driver asserts its summary line, then that
//! the engine holds none of the sandboxes it made.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`), the static agent
//! (`SANDBOX_AGENT_BIN`) and the older SDK's venv: the e2b sdk stage.

// Needs the Docker backend and the E2B API compiled in.
#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_testkit::e2b_sdk::run_script;

use crate::support::e2b::E2bServe;

/// The older SDK's venv python, set by xtask.
const ENV_OLDER_PYTHON: &str = "SANDBOX_TEST_E2B_OLDER_PYTHON";
/// One Debian sandbox created and killed, on a slow machine.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(300);

/// The python from [`ENV_OLDER_PYTHON`], checked: a clear panic when it is missing, in CI as
/// anywhere (the stage always sets it).
fn older_python() -> PathBuf {
    let python = PathBuf::from(std::env::var_os(ENV_OLDER_PYTHON).unwrap_or_else(|| {
        panic!("{ENV_OLDER_PYTHON} is not set: run `cargo xtask sdk-venv`, which makes the venvs and prints them")
    }));
    assert!(
        python.is_absolute() && python.is_file(),
        "{ENV_OLDER_PYTHON}={}: not an absolute path to a file",
        python.display()
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the older SDK's venv (SANDBOX_TEST_E2B_OLDER_PYTHON): the e2b sdk stage"]
async fn the_older_python_sdk_creates_runs_reads_and_kills_through_the_legacy_routes() {
    let python = older_python();
    let serve = E2bServe::start("te2bold").await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/older/scenario.py");
    let mut run = serve.sdk_command(&python);
    run.arg(&script);
    let context = || serve.context();
    // The scenario blocks; the service is another process, so nothing here needs the runtime.
    let stdout = tokio::task::block_in_place(|| run_script(run, SCENARIO_DEADLINE, &context));
    println!("{stdout}");
    for step in [
        "create_through_the_legacy_route",
        "connect_through_the_legacy_route",
        "kill_then_not_found",
    ] {
        assert!(
            stdout.contains(&format!("ok   {step}")),
            "the scenario did not pass {step}\n{stdout}"
        );
    }
    // The scenario killed every sandbox it made: the engine holds none of them.
    serve.wait_no_containers().await;
}

//! Preview ports of the E2B-compatible API, through the official Python SDK, over the real
//! Docker engine: `tests/e2b/preview.py` against `sandbox serve` with `[e2b]` on.
//!
//! The sandbox is created with public traffic closed and runs `python3 -m http.server` bound
//! to its loopback, in network `none`: the only way in is the agent's tunnel extension on the
//! sandbox's channel. The script fetches a file of random bytes through the router's
//! `<port>-<id>` host with the traffic token, is refused without it or with a wrong one (403),
//! has an `Upgrade` switched by a server inside and carries 256 KiB through it both ways, and
//! fills the per-sandbox bound (set to [`BOUND`] here) with requests a silent server never
//! answers: one more is 429 with `Retry-After: 1`, and a place is free again once a caller
//! hangs up.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`), the static agent
//! (`SANDBOX_AGENT_BIN`) and the SDK's venv (`SANDBOX_TEST_E2B_PYTHON`): the e2b sdk stage.

#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::time::Duration;

use sandbox_testkit::e2b_sdk::{run_script, venv_python};

use crate::support::e2b::{E2bOptions, E2bServe};

/// `e2b.max_tunnels_per_sandbox` of this run: small, so the script reaches it cheaply.
const BOUND: usize = 3;
/// One Debian sandbox, a 3 MiB file and the bound's waits, on a slow machine.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (the e2b sdk stage)"]
async fn a_python_http_server_answers_through_its_preview_host_with_the_traffic_token_only() {
    let python = venv_python();
    let options = E2bOptions {
        env: vec![(
            "SANDBOX_E2B_MAX_TUNNELS_PER_SANDBOX".to_owned(),
            BOUND.to_string(),
        )],
        ..E2bOptions::default()
    };
    let serve = E2bServe::start_with("te2bprev", options).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b/preview.py");
    let mut run = serve.sdk_command(&python);
    run.arg(&script)
        .env("SANDBOX_PREVIEW_BOUND", BOUND.to_string());
    let context = || serve.context();
    let stdout = tokio::task::block_in_place(|| run_script(run, SCRIPT_DEADLINE, &context));
    println!("{stdout}");
    for step in [
        "serves_a_file_through_the_tunnel",
        "an_upgrade_is_relayed_both_ways",
        "the_bound_answers_429_and_frees_a_place",
    ] {
        assert!(stdout.contains(&format!("ok   {step}")), "{step}: {stdout}");
    }
    // The script killed its sandbox: the engine holds none.
    serve.wait_no_containers().await;
}

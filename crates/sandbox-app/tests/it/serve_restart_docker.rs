//! `sandbox serve` as a real process over the real Docker engine, in each data plane: killed
//! with SIGKILL mid-life (no drain, no cleanup, the memory store gone with it), a new process
//! (a new PID) on the same namespace adopts the session's container through its labels instead
//! of creating a second one, and the files written before the crash are still there. Then
//! SIGTERM drains and exits 0.
//!
//! In agent mode the new process also re-opens the agent channel: the service keeps no count
//! of channel opens it could show, so the engine says it. The channel is one exec running
//! `sandbox-agent relay` in the container; the engine's process list shows the dead process's
//! relay gone (the engine ended its exec with the connection) and a new relay serving the next
//! exec.
//!
//! Needs the engine and the `sandbox-busybox:test` image (agent mode: also the static agent,
//! `SANDBOX_AGENT_BIN`): ignored in a plain `cargo test`, run by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support;
use support::agent_mode::{self, relay_pids};
use support::container_ids;
use support::serve::{START_DEADLINE, Service, signal, temp_dir};

/// Generous: the engine notices the killed process's connection and ends its exec.
const RELAY_EXIT_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_restarted_service_adopts_the_sessions_container() {
    restart_adopts("trestart", &agent_mode::exec_env(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_restarted_service_reopens_the_agent_channel_to_the_same_sandbox() {
    restart_adopts("trestarta", &agent_mode::env(), true).await;
}

async fn start(namespace: &str, token_file: &Path, log: &Path, env: &[(&str, &str)]) -> Service {
    let mut service = Service::spawn(namespace, token_file, log, env);
    if let Err(status) = service.ready(START_DEADLINE).await {
        panic!(
            "sandbox serve exited with {status} before answering; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    service
}

async fn restart_adopts(prefix: &str, env: &[(&'static str, String)], agent: bool) {
    let env = agent_mode::borrowed(env);
    let namespace = format!("{prefix}-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let exec = "/v1/sessions/survivor/exec";

    let mut first = start(&namespace, &token_file, &log, &env).await;
    // The token file is created on first start, private, and reused by the next process.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim().to_owned();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the development token file is private");

    let (status, out) = first
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"echo before-crash > state.txt && cat state.txt","shell":true}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(out["stdout"], "before-crash\n");
    let before = container_ids(&namespace).await;
    assert_eq!(before.len(), 1, "one container for the session: {before:?}");
    let container = before[0].clone();
    let first_relays = relay_pids(&container);
    if agent {
        assert_eq!(first_relays.len(), 1, "one open channel: {first_relays:?}");
    } else {
        assert!(
            first_relays.is_empty(),
            "no channel in exec mode: {first_relays:?}"
        );
    }

    let first_pid = first.child.id();
    signal(&first.child, "KILL");
    let status = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the first service died of SIGKILL: {status}"
    );
    // The dead process's relay does not linger in the sandbox: its exec ends with the
    // connection.
    let start_wait = Instant::now();
    while !relay_pids(&container).is_empty() {
        assert!(
            start_wait.elapsed() < RELAY_EXIT_DEADLINE,
            "the killed service's relay still runs: {:?}",
            relay_pids(&container)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut second = start(&namespace, &token_file, &log, &env).await;
    assert_ne!(second.child.id(), first_pid, "a new process");
    let (status, out) = second
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"cat","args":["state.txt"]}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(
        out["stdout"], "before-crash\n",
        "the files written before the crash"
    );
    assert_eq!(
        container_ids(&namespace).await,
        before,
        "the same container was adopted, no second one created"
    );
    let second_relays = relay_pids(&container);
    if agent {
        assert_eq!(
            second_relays.len(),
            1,
            "the new process re-opened one channel: {second_relays:?}"
        );
        assert_ne!(
            second_relays, first_relays,
            "a new relay exec, not the old one"
        );
    } else {
        assert!(second_relays.is_empty(), "{second_relays:?}");
    }

    let (status, _) = second
        .call("DELETE", "/v1/sessions/survivor", &token, "")
        .await;
    assert_eq!(status, 204);
    assert!(
        container_ids(&namespace).await.is_empty(),
        "destroy removed it"
    );

    // SIGTERM drains and exits cleanly.
    signal(&second.child, "TERM");
    let status = second.wait();
    assert!(
        status.success(),
        "SIGTERM ends sandbox serve with 0: {status}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

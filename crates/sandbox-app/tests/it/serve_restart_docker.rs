//! `sandbox serve` as a real process over the real Docker engine: killed with SIGKILL mid-life
//! (no drain, no cleanup, the memory store gone with it), a new process (a new PID) on the same
//! namespace adopts the session's container through its labels instead of creating a second
//! one, and the files written before the crash are still there. Then SIGTERM drains and exits 0.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::container_ids;
use support::serve::{Service, signal, temp_dir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_restarted_service_adopts_the_sessions_container() {
    let namespace = format!("trestart-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let exec = "/v1/sessions/survivor/exec";

    let mut first = Service::start(&namespace, &token_file, &log).await;
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

    let first_pid = first.child.id();
    signal(&first.child, "KILL");
    let status = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the first service died of SIGKILL: {status}"
    );

    let mut second = Service::start(&namespace, &token_file, &log).await;
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

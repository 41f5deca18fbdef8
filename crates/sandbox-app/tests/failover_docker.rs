//! A replica killed with SIGKILL while it holds a session's lifecycle lock: the other replica
//! serves that session once the (short, test-configured) lease runs out — one container, one
//! binding naming it. The store's `failpoints` hook tells the test the exact moment replica A
//! holds the lock (and keeps it there), so the kill lands inside the critical section.
//!
//! A holds the lock of the session's *first* resolve (an already-bound session resolves on the
//! lock-free fast path and never takes it): B cannot serve without waiting out A's lease.
//!
//! Built only with the `failpoints` feature (`cargo xtask test` enables it for the engine
//! tests); needs the engine, the `sandbox-busybox:test` image and `redis-server`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

#[path = "it/support/mod.rs"]
mod support;
use support::container_ids;
use support::redis::RedisServer;
use support::serve::{START_DEADLINE, Service, temp_dir};

use std::time::{Duration, Instant};

const TOKEN: &str = "token-failover-0123456789";
/// The lock lease: short, so the survivor takes over quickly.
const LEASE_MS: &str = "3000";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and redis-server: cargo xtask test runs it"]
async fn a_replica_killed_holding_the_lock_hands_the_session_over_after_the_lease() {
    let redis = RedisServer::start();
    let namespace = format!("tfail-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let held_file = dir.join("lock-held");
    let url = redis.url();
    let held = held_file.to_str().unwrap().to_owned();
    // The development tenant is 1.
    let common = [
        ("SANDBOX_STORE", "redis"),
        ("SANDBOX_REDIS_URL", url.as_str()),
        ("SANDBOX_REDIS_NAMESPACE", namespace.as_str()),
        ("SANDBOX_REDIS_LOCK_LEASE_MS", LEASE_MS),
    ];
    let mut a_env = common.to_vec();
    a_env.extend([
        ("SANDBOX_FAILPOINT_SESSION", "1/victim"),
        ("SANDBOX_FAILPOINT_LOCK_HELD_FILE", held.as_str()),
        ("SANDBOX_FAILPOINT_LOCK_HELD_PAUSE_MS", "600000"),
    ]);
    let mut a = Service::spawn(&namespace, &token_file, &dir.join("a.log"), &a_env);
    assert!(a.ready(START_DEADLINE).await.is_ok());
    let mut b = Service::spawn(&namespace, &token_file, &dir.join("b.log"), &common);
    assert!(b.ready(START_DEADLINE).await.is_ok());

    let exec = "/v1/sessions/victim/exec";
    assert!(container_ids(&namespace).await.is_empty());

    // A takes the lock and stops there (the failpoint).
    let base = a.base.clone();
    let stuck = tokio::spawn(async move {
        let probe = Service::attach(base);
        probe
            .try_call("POST", exec, Some(TOKEN), r#"{"command":"true"}"#)
            .await
    });
    let start = Instant::now();
    let line = loop {
        if let Ok(text) = std::fs::read_to_string(&held_file)
            && let Some(line) = text.lines().next()
        {
            break line.to_owned();
        }
        assert!(
            start.elapsed() < START_DEADLINE,
            "replica A never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(line, format!("locked 1/victim pid {}", a.child.id()));

    // While A holds it, B cannot get in.
    let blocked = tokio::time::timeout(
        Duration::from_millis(500),
        b.call("POST", exec, TOKEN, r#"{"command":"true"}"#),
    )
    .await;
    assert!(
        blocked.is_err(),
        "B served while A held the lock: {blocked:?}"
    );

    // SIGKILL A inside its critical section.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &a.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = a.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert!(stuck.await.unwrap().is_err(), "A's request died with it");

    // B serves the session once the lease has run out: A died before creating anything, so B
    // creates the one container and binds it.
    let taken_over = Instant::now();
    let (status, out) = b
        .call(
            "POST",
            exec,
            TOKEN,
            r#"{"command":"sh","args":["-c","echo after > f && cat f"]}"#,
        )
        .await;
    assert_eq!(
        (status, out["stdout"].as_str()),
        (200, Some("after\n")),
        "{out}"
    );
    assert!(
        taken_over.elapsed() < START_DEADLINE,
        "the survivor waited out the lease, not forever"
    );
    let containers = container_ids(&namespace).await;
    assert_eq!(containers.len(), 1, "no duplicate: {containers:?}");
    let binding = redis.cli(&[
        "GET",
        &format!("sandbox:session:{{{namespace}:1:victim}}:binding"),
    ]);
    assert!(
        binding.contains(&containers[0][..12]),
        "the binding names the container: {binding}"
    );
    // And it stays the one: the next exec (fast path now) finds the same file.
    let (status, out) = b
        .call("POST", exec, TOKEN, r#"{"command":"cat","args":["f"]}"#)
        .await;
    assert_eq!(
        (status, out["stdout"].as_str()),
        (200, Some("after\n")),
        "{out}"
    );
    assert_eq!(container_ids(&namespace).await, containers);

    let (status, _) = b.call("DELETE", "/v1/sessions/victim", TOKEN, "").await;
    assert_eq!(status, 204);
    assert!(container_ids(&namespace).await.is_empty());
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

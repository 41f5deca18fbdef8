//! Two `sandbox serve` replicas sharing one Redis (a `redis-server` this test starts) and one
//! Docker engine, as real processes: concurrent first execs of one session spread over both
//! create exactly one container; distinct sessions get one container each; with Redis down the
//! API answers 503 `store_unavailable` and neither creates nor deletes anything, and once
//! Redis is back the same replicas serve again without being restarted.
//!
//! Needs the engine, the `sandbox-busybox:test` image and `redis-server`: ignored in a plain
//! `cargo test`, run by `cargo xtask test`.

// Needs the Docker backend and the Redis store compiled in.
#![cfg(all(feature = "docker", feature = "redis"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::container_ids;
use support::redis::RedisServer;
use support::serve::{START_DEADLINE, Service, temp_dir};

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

const TOKEN: &str = "token-replicas-0123456789";
/// How many requests are in flight at once when spreading many sessions.
const PARALLEL: usize = 16;

struct Cluster {
    replicas: Vec<Arc<Service>>,
    namespace: String,
    _dir: std::path::PathBuf,
}

/// A test that fails midway must not leave its sessions' containers running: they carry no
/// test label for the pipeline's final sweep.
impl Drop for Cluster {
    fn drop(&mut self) {
        support::remove_namespace(&self.namespace);
    }
}

async fn replicas(redis: &RedisServer, prefix: &str) -> Cluster {
    let namespace = format!("{prefix}-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let url = redis.url();
    let env = [
        ("SANDBOX_STORE", "redis"),
        ("SANDBOX_REDIS_URL", url.as_str()),
        ("SANDBOX_REDIS_NAMESPACE", namespace.as_str()),
        ("SANDBOX_REDIS_COMMAND_TIMEOUT_MS", "2000"),
        // These tests are about hundreds of sessions of one tenant: the per-tenant quotas,
        // which would refuse them, have tests of their own (hardening_docker).
        ("SANDBOX_QUOTA_MAX_SANDBOXES", "0"),
        ("SANDBOX_QUOTA_MAX_CONCURRENT_EXECS", "0"),
    ];
    let mut replicas = Vec::new();
    for n in 0..2 {
        let log = dir.join(format!("replica-{n}.log"));
        let mut service = Service::spawn(&namespace, &token_file, &log, &env);
        let ready = service.ready(START_DEADLINE).await;
        assert!(
            ready.is_ok(),
            "replica {n} did not start: {ready:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        replicas.push(Arc::new(service));
    }
    Cluster {
        replicas,
        namespace,
        _dir: dir,
    }
}

async fn exec(service: &Service, session: &str, body: &str) -> (u16, Value) {
    service
        .call("POST", &format!("/v1/sessions/{session}/exec"), TOKEN, body)
        .await
}

fn remove_containers(namespace: &str) {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=sandbox.namespace={namespace}"))
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if !ids.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .env_remove("DOCKER_HOST")
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and redis-server: cargo xtask test runs it"]
async fn concurrent_first_execs_over_two_replicas_create_one_container() {
    let redis = RedisServer::start();
    let c = replicas(&redis, "trepl1").await;
    let tasks: Vec<_> = (0..100)
        .map(|n| {
            let replica = c.replicas[n % 2].clone();
            tokio::spawn(async move {
                exec(&replica, "hot", r#"{"command":"echo","args":["served"]}"#).await
            })
        })
        .collect();
    for t in tasks {
        let (status, out) = t.await.unwrap();
        assert_eq!(
            (status, out["stdout"].as_str()),
            (200, Some("served\n")),
            "{out}"
        );
    }
    assert_eq!(
        container_ids(&c.namespace).await.len(),
        1,
        "one session, one container, whichever replica served"
    );
    remove_containers(&c.namespace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and redis-server: cargo xtask test runs it"]
async fn distinct_sessions_over_two_replicas_get_one_container_each() {
    const SESSIONS: usize = 200;
    let redis = RedisServer::start();
    let c = replicas(&redis, "trepl2").await;
    let semaphore = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let tasks: Vec<_> = (0..SESSIONS)
        .map(|n| {
            let replica = c.replicas[n % 2].clone();
            let semaphore = semaphore.clone();
            tokio::spawn(async move {
                let _permit = semaphore.acquire().await.unwrap();
                exec(&replica, &format!("s-{n}"), r#"{"command":"true"}"#).await
            })
        })
        .collect();
    for t in tasks {
        let (status, out) = t.await.unwrap();
        assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    }
    assert_eq!(container_ids(&c.namespace).await.len(), SESSIONS);
    // Every binding is in Redis, under this run's namespace.
    let bindings = redis.cli(&[
        "--scan",
        "--pattern",
        &format!("sandbox:session:{{{}:*}}:binding", c.namespace),
    ]);
    assert_eq!(bindings.lines().count(), SESSIONS, "{bindings}");
    remove_containers(&c.namespace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and redis-server: cargo xtask test runs it"]
async fn redis_down_fails_closed_and_the_replicas_recover_when_it_returns() {
    let mut redis = RedisServer::start();
    let c = replicas(&redis, "trepl3").await;
    let (a, b) = (c.replicas[0].clone(), c.replicas[1].clone());
    let (status, _) = exec(
        &a,
        "bound",
        r#"{"command":"sh","args":["-c","echo kept > f"]}"#,
    )
    .await;
    assert_eq!(status, 200);
    let before = container_ids(&c.namespace).await;
    assert_eq!(before.len(), 1);

    redis.stop();
    for (replica, session) in [(&a, "bound"), (&b, "bound"), (&a, "fresh"), (&b, "fresh")] {
        let (status, out) = exec(replica, session, r#"{"command":"true"}"#).await;
        assert_eq!(status, 503, "{session}: {out}");
        assert_eq!(out["error"]["code"], "store_unavailable", "{out}");
    }
    let (status, out) = a.call("DELETE", "/v1/sessions/bound", TOKEN, "").await;
    assert_eq!(
        (status, out["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "{out}"
    );
    let (status, health) = a.try_call("GET", "/healthz", None, "").await.unwrap();
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["store"], "redis");
    // A reason code, never the store's error text (addresses, client errors) to an anonymous
    // caller.
    assert_eq!(health["reason"], "store_unavailable", "{health}");
    assert_eq!(
        container_ids(&c.namespace).await,
        before,
        "nothing created, nothing deleted while Redis was down"
    );

    redis.restart();
    // The same processes, no restart: the client reconnects on its own.
    let deadline = std::time::Instant::now() + START_DEADLINE;
    loop {
        let (status, out) = exec(&b, "bound", r#"{"command":"cat","args":["f"]}"#).await;
        if status == 200 {
            assert_eq!(out["stdout"], "kept\n", "the same sandbox: {out}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no recovery: {status} {out}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (status, _) = exec(&a, "fresh", r#"{"command":"true"}"#).await;
    assert_eq!(status, 200);
    assert_eq!(
        container_ids(&c.namespace).await.len(),
        2,
        "one each for bound and fresh"
    );
    assert!(container_ids(&c.namespace).await.contains(&before[0]));
    remove_containers(&c.namespace);
    let _ = Path::new(&c._dir);
}

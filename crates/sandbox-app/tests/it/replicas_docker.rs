//! Two `sandbox serve` replicas sharing one Redis (a `redis-server` this test starts) and one
//! Docker engine, as real processes: concurrent first execs of one session spread over both
//! create exactly one container; distinct sessions get one container each; with Redis down the
//! API answers 503 `store_unavailable` and neither creates nor deletes anything, and once
//! Redis is back the same replicas serve again without being restarted. In each data plane,
//! the two replicas serve one session alternately, each answer checked whole (a token of its
//! own, output spanning many frames, stderr and exit code): in agent mode each replica has a
//! channel (an exec) of its own into the one sandbox, so neither can read the other's bytes.
//!
//! Needs the engine, the `sandbox-busybox:test` image and `redis-server`: ignored in a plain
//! `cargo test`, run by `cargo xtask test`.

// Needs the Docker backend and the Redis store compiled in.
#![cfg(all(feature = "docker", feature = "redis"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::agent_mode;
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
    replicas_with(redis, prefix, &[]).await
}

/// [`replicas`] with `mode` (the data plane's settings) on top.
async fn replicas_with(redis: &RedisServer, prefix: &str, mode: &[(&str, &str)]) -> Cluster {
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
    let env: Vec<(&str, &str)> = env.iter().chain(mode).copied().collect();
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

/// Execs per replica in the alternating test.
const ALTERNATING_EXECS: usize = 100;
/// Concurrent lanes in the alternating test; each alternates between the replicas.
const ALTERNATING_LANES: usize = 4;
/// Stdout of each alternating exec: many frames of the channel and of the envd stream.
const ALTERNATING_STDOUT_BYTES: usize = 64 * 1024;

/// What exec `token` prints on stdout: `token` and a newline, over and over, cut to the size.
fn pattern(token: &str) -> String {
    format!("{token}\n")
        .repeat(ALTERNATING_STDOUT_BYTES / (token.len() + 1) + 1)
        .chars()
        .take(ALTERNATING_STDOUT_BYTES)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image, redis-server and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn two_replicas_serve_one_session_alternately_through_the_agent() {
    alternate("trepl4", &agent_mode::env(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and redis-server: cargo xtask test runs it"]
async fn two_replicas_serve_one_session_alternately_through_exec() {
    alternate("trepl5", &agent_mode::exec_env(), false).await;
}

/// Two replicas serve one session alternately, [`ALTERNATING_EXECS`] execs each over
/// [`ALTERNATING_LANES`] concurrent lanes; every answer is the one its own command gives.
async fn alternate(prefix: &str, mode: &[(&'static str, String)], agent: bool) {
    let redis = RedisServer::start();
    let c = replicas_with(&redis, prefix, &agent_mode::borrowed(mode)).await;
    let run = format!("{:08x}", fastrand::u32(..));
    let per_lane = 2 * ALTERNATING_EXECS / ALTERNATING_LANES;
    let lanes: Vec<_> = (0..ALTERNATING_LANES)
        .map(|lane| {
            let replicas = c.replicas.clone();
            let run = run.clone();
            tokio::spawn(async move {
                let mut served = [0_usize; 2];
                for i in 0..per_lane {
                    // Lanes start on different replicas, so both serve at once too.
                    let r = (lane + i) % 2;
                    let token = format!("{run}-{lane}-{i}-r{r}");
                    let code = 1 + (lane * per_lane + i) % 100;
                    let body = serde_json::json!({
                        "command": "sh",
                        "args": [
                            "-c",
                            "yes \"$0\" | head -c $2; echo \"err-$0\" >&2; exit $1",
                            token,
                            code.to_string(),
                            ALTERNATING_STDOUT_BYTES.to_string(),
                        ],
                    });
                    let (status, out) = exec(&replicas[r], "shared", &body.to_string()).await;
                    assert_eq!(status, 200, "{token}: {out}");
                    let stdout = out["stdout"].as_str().unwrap_or_default();
                    assert!(
                        stdout == pattern(&token),
                        "{token}: stdout of {} bytes is not its own (starts {:?})",
                        stdout.len(),
                        stdout.chars().take(80).collect::<String>()
                    );
                    assert_eq!(
                        (out["stderr"].as_str(), out["exit_code"].as_u64()),
                        (Some(format!("err-{token}\n").as_str()), Some(code as u64)),
                        "{token}"
                    );
                    assert_ne!(out["truncated"], true, "{token}");
                    served[r] += 1;
                }
                served
            })
        })
        .collect();
    let mut served = [0_usize; 2];
    for lane in lanes {
        let lane = lane.await.unwrap();
        served[0] += lane[0];
        served[1] += lane[1];
    }
    assert_eq!(
        served,
        [ALTERNATING_EXECS, ALTERNATING_EXECS],
        "each replica answered its share, every answer its own"
    );
    let ids = container_ids(&c.namespace).await;
    assert_eq!(ids.len(), 1, "one session, one sandbox: {ids:?}");
    let relays = agent_mode::relay_pids(&ids[0]);
    if agent {
        // Each replica reached the sandbox through a channel of its own (never a shared one):
        // two relay execs, both still open.
        assert_eq!(relays.len(), 2, "one channel per replica: {relays:?}");
    } else {
        assert!(relays.is_empty(), "no channel in exec mode: {relays:?}");
    }
    remove_containers(&c.namespace);
}

//! The E2B API's timeout engine, on a real `sandbox serve` over the real engine, on both
//! deadline stores: the memory binding store (deadlines in `<data_dir>/e2b-deadlines.json`)
//! and Redis (a sorted set in a `redis-server` the test owns, persistent across its restart).
//!
//! One scenario per store, so the two run in parallel and each service starts twice only:
//! - a sandbox created with `timeout: 3` is killed: the engine's own view (`docker ps` by the
//!   namespace and E2B ID labels, never the API) is polled until its container is gone, the lag
//!   after its deadline (the create's send time + 3 s) is printed, and the API then answers 404;
//! - a create naming no timeout gets `SANDBOX_E2B_DEFAULT_TIMEOUT_SECONDS` (4 s here): killed;
//! - across a stop (SIGTERM, its exit) and a start on the same data directory, secret and Redis:
//!   - a sandbox whose deadline passed while the service was down is killed soon after the start;
//!   - a deadline extended by `POST /sandboxes/{id}/timeout` survives: alive past its original
//!     deadline, `endAt` about 600 s after the extension;
//!   - a sandbox whose deadline was removed from the store while the service was down is not
//!     killed: it gets at least its create-time deadline, and the log says so.
//!
//! Only generous bounds are asserted (60 s for a kill after its deadline or after the start);
//! the lags are printed. A kill before the deadline fails (1 s slack for rounding).
//!
//! And pause on timeout, with the official Python SDK: a sandbox created with
//! `lifecycle={"on_timeout": "pause"}` and a 4 s timeout is paused at its deadline (the engine
//! reports its container paused, not gone, and the API `state: "paused"` with no deadline), and
//! stays so; a connect resumes it (201), and the SDK finds the file and the background process
//! it left.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`), the static agent
//! (`SANDBOX_AGENT_BIN`), `redis-server` and the SDK's venv (`SANDBOX_TEST_E2B_PYTHON`): the e2b
//! sdk stage of `cargo xtask test`.

#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::time::{Duration, SystemTime};

use sandbox_app::e2b::expiry::LOG_ASSIGNED;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::support::e2b::{E2bOptions, E2bServe};
use crate::support::redis::RedisServer;

/// Generous: how long after its deadline (or after a start) a sandbox may still be there.
const KILL_BOUND: Duration = Duration::from_secs(60);
/// A kill this much before the deadline as the test reckons it is a kill too early (the
/// service's deadline is taken after the test's send time; this covers rounding only).
const EARLY_SLACK: Duration = Duration::from_secs(1);
/// The default timeout the service is given, for the create that names none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(4);
/// The extended sandbox's first timeout, in seconds.
const EXTENDED_FIRST: u64 = 10;
/// The Redis deadline set of the default Redis namespace.
const REDIS_DEADLINES: &str = "sandbox:e2b:{default}:deadlines";

/// Seconds since the Unix epoch, as a float.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// `endAt` of a get or create answer, as Unix seconds.
fn end_at(v: &Value) -> f64 {
    let s = v["endAt"]
        .as_str()
        .unwrap_or_else(|| panic!("no endAt: {v}"));
    let at = OffsetDateTime::parse(s, &Rfc3339).unwrap_or_else(|e| panic!("endAt {s:?}: {e}"));
    at.unix_timestamp_nanos() as f64 / 1e9
}

/// Creates a sandbox as tenant A with `timeout` (none: the service's default); its ID and the
/// Unix time the create was sent.
#[expect(
    clippy::print_stdout,
    reason = "the measured figures go to the test's output"
)]
async fn create(serve: &E2bServe, timeout: Option<u64>) -> (String, f64) {
    let mut body = json!({"templateID": "base", "metadata": {"test": "expiry"}, "envVars": {}});
    if let Some(t) = timeout {
        body["timeout"] = json!(t);
    }
    let sent = unix_now();
    let created = serve.create_body(&serve.key_a, body).await;
    let answered = unix_now();
    println!("e2b expiry: create answered in {:.2} s", answered - sent);
    // Seen in the engine while its deadline is ahead: the label the kill checks poll is right.
    let timeout = timeout.unwrap_or(DEFAULT_TIMEOUT.as_secs());
    let containers = serve.e2b_containers(&created.id).await;
    if unix_now() < sent + timeout as f64 - 1.0 {
        assert_eq!(
            containers.len(),
            1,
            "the engine has no container for {}",
            created.id
        );
    }
    (created.id, sent)
}

/// Polls the engine until `id`'s container is gone, at most `bound` after `from` (Unix
/// seconds); the Unix time it was first seen gone.
async fn wait_gone(serve: &E2bServe, id: &str, from: f64, bound: Duration) -> f64 {
    loop {
        if serve.e2b_containers(id).await.is_empty() {
            return unix_now();
        }
        assert!(
            unix_now() - from < bound.as_secs_f64(),
            "sandbox {id} still has its container {:.1} s after {from:.1}\n{}",
            unix_now() - from,
            serve.context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sandbox killed by the engine: `deadline` passed, its container gone, the API's 404.
#[expect(
    clippy::print_stdout,
    reason = "the measured figures go to the test's output"
)]
async fn expect_killed(serve: &E2bServe, id: &str, deadline: f64, what: &str) {
    let gone = wait_gone(serve, id, deadline.max(unix_now()), KILL_BOUND).await;
    let lag = gone - deadline;
    println!("e2b expiry lag: {lag:.2} s ({what}, store {})", serve.store);
    assert!(
        lag > -EARLY_SLACK.as_secs_f64(),
        "{what}: sandbox {id} was killed {:.2} s before its deadline\n{}",
        -lag,
        serve.context()
    );
    serve
        .cp("GET", &format!("/sandboxes/{id}"), &serve.key_a, "")
        .await
        .error(&[404], &format!("{what}: get after the kill"));
}

/// The get answer of a sandbox that must be alive: 200 and its container still there.
async fn expect_alive(serve: &E2bServe, id: &str, what: &str) -> Value {
    let got = serve
        .cp("GET", &format!("/sandboxes/{id}"), &serve.key_a, "")
        .await;
    assert_eq!(
        got.status,
        200,
        "{what}: get {id}: {}\n{}",
        got.text(),
        serve.context()
    );
    assert_eq!(
        serve.e2b_containers(id).await.len(),
        1,
        "{what}: {id}'s container is gone\n{}",
        serve.context()
    );
    got.json()
}

/// Sleeps until the Unix time `at`.
async fn sleep_until(at: f64) {
    let left = at - unix_now();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// The whole scenario on one service; `forget` removes a sandbox's deadline from the store
/// while the service is stopped.
#[expect(
    clippy::print_stdout,
    reason = "the measured figures go to the test's output"
)]
async fn scenario(mut serve: E2bServe, forget: impl Fn(&E2bServe, &str)) {
    // Long-lived ones first, so their creates are behind us when the short ones run.
    // 10 s rather than 5: the create's own time on a busy engine counts against it, and the
    // extension must land before the deadline.
    let (extended, extended_sent) = create(&serve, Some(EXTENDED_FIRST)).await;
    let set = serve
        .cp(
            "POST",
            &format!("/sandboxes/{extended}/timeout"),
            &serve.key_a,
            r#"{"timeout": 600}"#,
        )
        .await;
    let extended_at = unix_now();
    assert_eq!(set.status, 204, "set timeout: {}", set.text());
    let (lost, lost_sent) = create(&serve, Some(600)).await;

    // Killed on time, with its own timeout and with the default one.
    let (short, short_sent) = create(&serve, Some(3)).await;
    let (default, default_sent) = create(&serve, None).await;
    expect_killed(&serve, &short, short_sent + 3.0, "timeout 3 s").await;
    expect_killed(
        &serve,
        &default,
        default_sent + DEFAULT_TIMEOUT.as_secs_f64(),
        "the default timeout, 4 s",
    )
    .await;

    // One whose deadline passes while the service is down.
    let (expired, expired_sent) = create(&serve, Some(5)).await;
    serve.stop().await;
    let stopped_at = unix_now();
    forget(&serve, &lost);
    // Past the expiring one's deadline, and the extended one's original deadline, by seconds.
    sleep_until((expired_sent + 5.0).max(extended_sent + EXTENDED_FIRST as f64) + 3.0).await;
    assert!(
        !serve.e2b_containers(&expired).await.is_empty(),
        "nothing should kill a sandbox while the service is down"
    );
    println!(
        "e2b expiry: service down for {:.1} s (store {})",
        unix_now() - stopped_at,
        serve.store
    );
    serve.restart().await;
    let started = unix_now();

    let gone = wait_gone(&serve, &expired, started, KILL_BOUND).await;
    println!(
        "e2b expiry after a restart: killed {:.2} s after the start, {:.2} s past its deadline (store {})",
        gone - started,
        gone - (expired_sent + 5.0),
        serve.store
    );
    serve
        .cp("GET", &format!("/sandboxes/{expired}"), &serve.key_a, "")
        .await
        .error(
            &[404],
            "the sandbox that expired while the service was down",
        );

    // A few sweeps later, the extended one and the one without a stored deadline live on.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = expect_alive(&serve, &extended, "the extended deadline").await;
    let end = end_at(&v);
    assert!(
        (end - (extended_at + 600.0)).abs() < 30.0,
        "the extended sandbox's endAt is {:.0} s from its extension + 600 s: {v}",
        end - (extended_at + 600.0)
    );
    let v = expect_alive(&serve, &lost, "the lost deadline").await;
    let end = end_at(&v);
    assert!(
        end >= lost_sent + 600.0 - EARLY_SLACK.as_secs_f64(),
        "the sandbox whose deadline was lost got endAt {:.0} s before its create-time deadline: {v}",
        lost_sent + 600.0 - end
    );
    let log = serve.log_text();
    let assigned = log
        .lines()
        .any(|l| l.contains(LOG_ASSIGNED) && l.contains(&lost) && l.contains("WARN"));
    assert!(
        assigned,
        "the log does not say the sandbox {lost} was given a deadline\n{}",
        serve.context()
    );
    // Neither the extended nor the expired one was reconciled: their deadlines were stored.
    for id in [&extended, &expired] {
        assert!(
            !log.lines()
                .any(|l| l.contains(LOG_ASSIGNED) && l.contains(id.as_str())),
            "the log says {id} had no stored deadline\n{}",
            serve.context()
        );
    }
    for id in [&extended, &lost] {
        let gone = serve
            .cp("DELETE", &format!("/sandboxes/{id}"), &serve.key_a, "")
            .await;
        assert_eq!(gone.status, 204, "{}", gone.text());
    }
    serve.wait_no_containers().await;
}

fn options() -> E2bOptions {
    E2bOptions {
        env: vec![(
            "SANDBOX_E2B_DEFAULT_TIMEOUT_SECONDS".to_owned(),
            DEFAULT_TIMEOUT.as_secs().to_string(),
        )],
        ..E2bOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn sandboxes_expire_and_deadlines_survive_a_restart_with_the_deadline_file() {
    let serve = E2bServe::start_with("te2bexpm", options()).await;
    scenario(serve, |serve, id| {
        let path = serve.data_dir.join("e2b-deadlines.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut file: Value = serde_json::from_str(&text).unwrap();
        let removed = file["deadlines"]
            .as_object_mut()
            .unwrap_or_else(|| panic!("no deadlines in {text}"))
            .remove(id);
        assert!(removed.is_some(), "{id} has no deadline in {text}");
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and redis-server: the e2b sdk stage"]
async fn sandboxes_expire_and_deadlines_survive_a_restart_with_redis() {
    let redis = RedisServer::start();
    let serve = E2bServe::start_with(
        "te2bexpr",
        E2bOptions {
            redis_url: Some(redis.url()),
            ..options()
        },
    )
    .await;
    scenario(serve, |_, id| {
        let score = redis.cli(&["ZSCORE", REDIS_DEADLINES, id]);
        assert!(
            !score.is_empty(),
            "{id} has no deadline in {REDIS_DEADLINES}"
        );
        assert_eq!(redis.cli(&["ZREM", REDIS_DEADLINES, id]), "1");
    })
    .await;
}

/// The engine's state word of a container (`running`, `paused`...), asked of the engine.
async fn engine_status(container: &str) -> String {
    let out = tokio::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Status}}", container])
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "docker inspect: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs `code` with the SDK's venv against `serve` as tenant A; its stdout (the script ends on
/// the `scenario: 1 passed, 0 failed` line `run_script` wants).
fn sdk(serve: &E2bServe, code: &str) -> String {
    let mut run = serve.sdk_command(sandbox_testkit::e2b_sdk::venv_python());
    run.arg("-c").arg(code);
    let context = || serve.context();
    tokio::task::block_in_place(|| {
        sandbox_testkit::e2b_sdk::run_script(run, Duration::from_secs(180), &context)
    })
}

#[expect(
    clippy::print_stdout,
    reason = "the measured figures go to the test's output"
)]
fn print_pause_lag(after_send: f64) {
    println!(
        "e2b pause on timeout: paused {after_send:.2} s after the create was sent (timeout 4 s)"
    );
}

/// `key=value` of the line of `out` that starts with `key=`.
fn said<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the script did not say {key}:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (SANDBOX_TEST_E2B_PYTHON): the e2b sdk stage"]
async fn a_sandbox_that_pauses_on_timeout_is_paused_not_killed_and_resumes_on_connect() {
    let serve = E2bServe::start_with("te2bexpp", options()).await;
    let sent = unix_now();
    let out = sdk(
        &serve,
        r#"
from e2b import Sandbox
sbx = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause"}, metadata={"test": "pause-on-timeout"})
sbx.files.write("/home/user/kept.txt", "kept through the timeout's pause")
h = sbx.commands.run("sleep 600", background=True)
assert sbx.get_info().lifecycle["on_timeout"] == "pause", sbx.get_info().lifecycle
print(f"id={sbx.sandbox_id}")
print(f"pid={h.pid}")
print("scenario: 1 passed, 0 failed")
"#,
    );
    let id = said(&out, "id").to_owned();
    let pid = said(&out, "pid").to_owned();
    let containers = serve.e2b_containers(&id).await;
    assert_eq!(containers.len(), 1, "{id}: {containers:?}");
    let container = containers[0].clone();

    // Paused at the deadline, never killed.
    let paused_at = loop {
        let status = engine_status(&container).await;
        if status == "paused" {
            break unix_now();
        }
        assert_eq!(
            status,
            "running",
            "{id} before its pause\n{}",
            serve.context()
        );
        assert!(
            unix_now() - (sent + 4.0) < KILL_BOUND.as_secs_f64(),
            "{id} was not paused within {KILL_BOUND:?} of its deadline\n{}",
            serve.context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    print_pause_lag(paused_at - sent);
    assert!(
        paused_at > sent + 4.0 - EARLY_SLACK.as_secs_f64(),
        "paused {:.2} s before its deadline",
        sent + 4.0 - paused_at
    );
    let got = serve
        .cp("GET", &format!("/sandboxes/{id}"), &serve.key_a, "")
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let v = got.json();
    assert_eq!(v["state"], json!("paused"), "{v}");
    assert_eq!(v["lifecycle"]["onTimeout"], json!("pause"), "{v}");
    // Several sweeps later it is still paused: a paused sandbox has no deadline to kill it by.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(engine_status(&container).await, "paused");

    let connected = serve
        .cp(
            "POST",
            &format!("/v2/sandboxes/{id}/connect"),
            &serve.key_a,
            r#"{"timeout": 600}"#,
        )
        .await;
    assert_eq!(connected.status, 201, "resumed: {}", connected.text());
    assert_eq!(engine_status(&container).await, "running");
    let v = expect_alive(&serve, &id, "after the resume").await;
    assert_eq!(v["state"], json!("running"), "{v}");
    let end = end_at(&v);
    assert!(
        (end - (unix_now() + 600.0)).abs() < 30.0,
        "the resumed sandbox's endAt is {:.0} s from now + 600 s: {v}",
        end - (unix_now() + 600.0)
    );
    sdk(
        &serve,
        &format!(
            r#"
from e2b import Sandbox
sbx = Sandbox.connect("{id}")
assert sbx.files.read("/home/user/kept.txt") == "kept through the timeout's pause"
pids = {{p.pid for p in sbx.commands.list()}}
assert {pid} in pids, pids
assert sbx.commands.run("echo resumed").stdout == "resumed\n"
sbx.kill()
print("scenario: 1 passed, 0 failed")
"#
        ),
    );
    serve.wait_no_containers().await;
}

//! E2B-API sandboxes and the session machinery of the same `sandbox serve` leave each other
//! alone, on a real service over the real engine:
//! - the Docker idle sweeper (TTL 3 s, at most one sweep a second, started by session creates
//!   and connects through the main API) reaps a session sandbox left idle, and in the same
//!   sweeps never an E2B sandbox idle as long (its timeout engine owns it);
//! - a session's resolve never adopts an E2B sandbox: a lookup-only route of a session with
//!   nothing bound runs the recovery by ownership metadata and finds nothing
//!   (`no_live_sandbox`), an exec gets the session a new sandbox of its own, and destroying the
//!   session leaves the E2B sandbox running and reachable;
//! - the E2B sandbox carries no session ownership label.
//!
//! Session calls use the tenant's bearer token (the same token is its E2B API key).
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`) and the static agent
//! (`SANDBOX_AGENT_BIN`): the e2b sdk stage of `cargo xtask test`.

#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::e2b::{E2bOptions, E2bServe, labelled};

/// The Docker idle TTL of the service (whole seconds, at least 1).
const IDLE_TTL: Duration = Duration::from_secs(3);
/// Generous: how long the sweeps may take to reap the idle session sandbox.
const REAP_BOUND: Duration = Duration::from_secs(90);

/// The container `id` names (a session's `sandbox_id`), as the engine's full ID; `None` when
/// the engine has no such container.
async fn full_id(id: &str) -> Option<String> {
    let out = tokio::process::Command::new("docker")
        .args(["inspect", "--format", "{{.Id}}", id])
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The labels of container `id`.
async fn labels(id: &str) -> serde_json::Map<String, Value> {
    let out = tokio::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .Config.Labels}}", id])
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "docker inspect {id}: {out:?}");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Runs `true` in `session` through the main API; 200 or the test fails.
async fn exec(serve: &E2bServe, session: &str) {
    let a = serve
        .api_call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            &serve.key_a,
            r#"{"command":"true"}"#,
        )
        .await;
    assert_eq!(
        a.status,
        200,
        "exec in {session}: {}\n{}",
        a.text(),
        serve.context()
    );
}

/// The engine's full ID of the sandbox `session` is bound to.
async fn session_sandbox(serve: &E2bServe, session: &str) -> String {
    let a = serve
        .api_call("GET", &format!("/v1/sessions/{session}"), &serve.key_a, "")
        .await;
    assert_eq!(a.status, 200, "get {session}: {}", a.text());
    let v = a.json();
    let id = v["sandbox_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{session}: no sandbox_id: {v}"));
    full_id(id)
        .await
        .unwrap_or_else(|| panic!("{session}'s sandbox {id} is not in the engine"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn the_idle_sweeper_and_session_recovery_leave_e2b_sandboxes_alone() {
    let serve = E2bServe::start_with(
        "te2bleak",
        E2bOptions {
            docker: format!(
                "idle_ttl_seconds = {}\nsweep_interval_seconds = 1\n",
                IDLE_TTL.as_secs()
            ),
            ..E2bOptions::default()
        },
    )
    .await;
    let e2b = serve
        .create(&serve.key_a, json!({"test": "no-leaks"}))
        .await;
    let e2b_containers = serve.e2b_containers(&e2b.id).await;
    assert_eq!(e2b_containers.len(), 1, "{e2b_containers:?}");
    let e2b_container = e2b_containers[0].clone();
    let e2b_labels = labels(&e2b_container).await;
    // The tenant's ownership key (a snapshot of the sandbox is the tenant's), and no other:
    // no session, binding or config key, so no session's recovery can adopt it.
    let ownership: Vec<&String> = e2b_labels
        .keys()
        .filter(|k| k.starts_with("sandbox.meta.sandbox_"))
        .filter(|k| *k != "sandbox.meta.sandbox_tenant_id")
        .collect();
    assert!(
        ownership.is_empty(),
        "the E2B sandbox carries session ownership labels: {ownership:?}"
    );
    assert_eq!(
        e2b_labels.get("sandbox.meta.sandbox_tenant_id"),
        Some(&json!("1")),
        "the E2B sandbox names its tenant: {e2b_labels:?}"
    );
    assert_eq!(
        e2b_labels.get("sandbox.idle-ttl-seconds"),
        Some(&json!("0")),
        "the E2B sandbox is not exempt from the idle sweep: {e2b_labels:?}"
    );

    // A lookup-only route of a session with nothing bound recovers by ownership metadata:
    // the tenant's only sandbox is the E2B one, and it must not be found.
    let a = serve
        .api_call(
            "GET",
            "/v1/sessions/fresh/files/content?path=/etc/hostname",
            &serve.key_a,
            "",
        )
        .await;
    assert_eq!(
        (a.status, a.json()["error"]["code"].as_str()),
        (404, Some("no_live_sandbox")),
        "a lookup of an unbound session: {}",
        a.text()
    );

    // A session sandbox, then both left idle well past the TTL (the agent channel closes within
    // a quarter of it after the last call).
    exec(&serve, "idle").await;
    let idle_container = session_sandbox(&serve, "idle").await;
    assert_ne!(
        idle_container, e2b_container,
        "the session adopted the E2B sandbox"
    );
    let idle_since = Instant::now();
    tokio::time::sleep(IDLE_TTL * 3).await;

    // Session activity elsewhere starts sweeps (a create, then connects), at most one a second.
    let start = Instant::now();
    let mut busy_container = None;
    loop {
        exec(&serve, "busy").await;
        if busy_container.is_none() {
            let id = session_sandbox(&serve, "busy").await;
            assert!(
                id != e2b_container && id != idle_container,
                "the session got an existing sandbox: {id}"
            );
            busy_container = Some(id);
        }
        if full_id(&idle_container).await.is_none() {
            break;
        }
        assert!(
            start.elapsed() < REAP_BOUND,
            "the idle session sandbox was not reaped within {REAP_BOUND:?}\n{}",
            serve.context()
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    println!(
        "no leaks: the idle session sandbox was reaped {:.1} s after its last call (TTL {} s)",
        idle_since.elapsed().as_secs_f64(),
        IDLE_TTL.as_secs()
    );
    // A few more sweeps: the E2B sandbox, idle since its create, outlives them all.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        exec(&serve, "busy").await;
    }
    assert_eq!(
        serve.e2b_containers(&e2b.id).await,
        vec![e2b_container.clone()],
        "the idle sweeper reaped the E2B sandbox\n{}",
        serve.context()
    );
    let got = serve
        .cp("GET", &format!("/sandboxes/{}", e2b.id), &serve.key_a, "")
        .await;
    assert_eq!(got.status, 200, "{}", got.text());

    // Destroying the session removes its own sandbox only.
    let busy_container = busy_container.unwrap();
    let a = serve
        .api_call("DELETE", "/v1/sessions/busy", &serve.key_a, "")
        .await;
    assert_eq!(a.status, 204, "destroy: {}", a.text());
    assert!(
        full_id(&busy_container).await.is_none(),
        "the destroyed session's sandbox is still there"
    );
    // The recovery once more, now that the tenant's idle session sandbox is gone: nothing.
    let a = serve
        .api_call(
            "GET",
            "/v1/sessions/busy/files/content?path=/etc/hostname",
            &serve.key_a,
            "",
        )
        .await;
    assert_eq!(
        (a.status, a.json()["error"]["code"].as_str()),
        (404, Some("no_live_sandbox")),
        "a lookup of the destroyed session: {}",
        a.text()
    );
    assert_eq!(
        labelled(&serve.namespace, "sandbox.managed=true").await,
        vec![e2b_container.clone()],
        "the namespace should hold the E2B sandbox only"
    );
    let envd = serve.envd_list(&e2b.id, Some(&e2b.token)).await;
    assert_eq!(
        envd.status,
        200,
        "the E2B sandbox's envd after the session's destroy: {}",
        envd.text()
    );

    let gone = serve
        .cp(
            "DELETE",
            &format!("/sandboxes/{}", e2b.id),
            &serve.key_a,
            "",
        )
        .await;
    assert_eq!(gone.status, 204, "{}", gone.text());
    serve.wait_no_containers().await;
}

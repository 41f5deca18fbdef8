//! Snapshots and ephemeral script runs over HTTP, end to end over the real Docker engine:
//! snapshot a session, restore it into another session (the file is there), restoring over a
//! bound session is 409, `/v1/execute` runs a script in a sandbox that is gone afterwards, and a
//! dangerous script is 400 `security_violation`.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Containers are counted by this test's namespace label.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::code;

use sandbox_core::{SnapshotId, narrow};
use serde_json::json;

const TOKEN: &str = "token-snapshots";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn snapshots_restore_and_ephemeral_execute_over_http() {
    let s = support::start("thsnap", &[TOKEN]).await;
    assert_eq!(s.containers().await, 0);

    // Snapshotting a session with no sandbox provisions nothing.
    let (status, v) = s
        .call("POST", "/v1/sessions/src/snapshots", r#"{"name":"early"}"#)
        .await;
    assert_eq!((status, code(&v)), (404, "no_live_sandbox"), "{v}");
    assert_eq!(s.containers().await, 0);

    // A file written through exec, then a snapshot.
    let (status, r) = s
        .call(
            "POST",
            "/v1/sessions/src/exec",
            &json!({"command": "echo snap-content-42 > /workspace/marker.txt", "shell": true})
                .to_string(),
        )
        .await;
    assert_eq!((status, r["exit_code"].as_i64()), (200, Some(0)), "{r}");
    let (status, snap) = s
        .call(
            "POST",
            "/v1/sessions/src/snapshots",
            r#"{"name":"http test"}"#,
        )
        .await;
    assert_eq!(status, 201, "{snap}");
    let snapshot_id = snap["snapshot_id"].as_str().unwrap().to_owned();

    // Restore into a new session: its own container, with the file.
    let restore_body = json!({ "snapshot_id": snapshot_id }).to_string();
    let (status, restored) = s
        .call("POST", "/v1/sessions/dst/restore", &restore_body)
        .await;
    assert_eq!(status, 201, "{restored}");
    assert!(restored["sandbox_id"].as_str().is_some(), "{restored}");
    assert_eq!(s.containers().await, 2);
    let (status, r) = s
        .call(
            "POST",
            "/v1/sessions/dst/exec",
            r#"{"command":"cat","args":["/workspace/marker.txt"]}"#,
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "snap-content-42\n", "{r}");
    let (status, info) = s.call("GET", "/v1/sessions/dst", "").await;
    assert_eq!(
        (status, info["sandbox_id"].as_str()),
        (200, restored["sandbox_id"].as_str()),
        "{info}"
    );

    // Restoring over a bound session is refused and changes nothing.
    let (status, v) = s
        .call("POST", "/v1/sessions/src/restore", &restore_body)
        .await;
    assert_eq!((status, code(&v)), (409, "conflict"), "{v}");
    let (status, v) = s
        .call(
            "POST",
            "/v1/sessions/other/restore",
            r#"{"snapshot_id":""}"#,
        )
        .await;
    assert_eq!((status, code(&v)), (400, "invalid_snapshot"), "{v}");
    assert_eq!(s.containers().await, 2);

    // An ephemeral script: runs with its args and stdin, and its sandbox is gone afterwards.
    let (status, r) = s
        .call(
            "POST",
            "/v1/execute",
            &json!({
                "file_name": "job.sh",
                "content": "echo \"script-arg=$1\"\ncat\n",
                "args": ["a1"],
                "stdin": "from-stdin",
                "timeout_ms": 60000,
            })
            .to_string(),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "script-arg=a1\nfrom-stdin", "{r}");
    assert_eq!(
        s.containers().await,
        2,
        "the ephemeral sandbox was left behind"
    );

    // A dangerous script is refused before any sandbox exists.
    let (status, v) = s
        .call(
            "POST",
            "/v1/execute",
            r#"{"file_name":"evil.sh","content":"rm -rf / --no-preserve-root"}"#,
        )
        .await;
    assert_eq!((status, code(&v)), (400, "security_violation"), "{v}");
    let (status, v) = s
        .call("POST", "/v1/execute", r#"{"file_name":"job.sh"}"#)
        .await;
    assert_eq!((status, code(&v)), (400, "invalid_json"), "{v}");
    assert_eq!(s.containers().await, 2);

    // Clean up: the sessions and the snapshot image.
    for session in ["src", "dst"] {
        let (status, _) = s
            .call("DELETE", &format!("/v1/sessions/{session}"), "")
            .await;
        assert_eq!(status, 204);
    }
    assert_eq!(s.containers().await, 0);
    narrow::snapshots(&*s.state.provider)
        .expect("the Docker backend snapshots")
        .delete_snapshot(&SnapshotId::new(snapshot_id).unwrap())
        .await
        .unwrap();
}

//! Snapshots of the E2B API of `sandbox serve` over the real Docker engine, by raw HTTP as the
//! SDKs send it: a sandbox with a file is snapshotted, listed (filtered by its sandbox and
//! not), outlives its source, boots a sandbox that holds the file, refuses to be deleted while
//! that sandbox runs (the engine's conflict), and is deleted, a second delete answering as E2B
//! does for what is not there. Tenant B neither sees, boots, snapshots from nor deletes tenant
//! A's. Then the engine holds no sandbox and no snapshot image of the namespace.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`) and the static agent
//! (`SANDBOX_AGENT_BIN`): the e2b sdk stage of `cargo xtask test`.

#![cfg(all(feature = "docker", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::process::Command;

use hyper::body::Bytes;
use serde_json::{Value, json};

use crate::support::e2b::{Answer, Created, E2bServe, ENVD_PORT};

/// The images of the namespace's snapshot repository (`sandbox-snapshot-<namespace>`).
fn snapshot_images(namespace: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "images",
            "--quiet",
            &format!("sandbox-snapshot-{namespace}"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Removes the namespace's snapshot images, whatever the test left.
struct SnapshotImages(String);

impl Drop for SnapshotImages {
    fn drop(&mut self) {
        let images = snapshot_images(&self.0);
        if !images.is_empty() {
            let _ = Command::new("docker")
                .args(["rmi", "--force"])
                .args(&images)
                .output();
        }
    }
}

fn query(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// `POST /files` (octet-stream) on `sandbox`'s envd with its access token.
async fn write_file(serve: &E2bServe, sandbox: &Created, path: &str, content: &[u8]) {
    let headers = [
        ("e2b-sandbox-id", sandbox.id.as_str()),
        ("e2b-sandbox-port", ENVD_PORT),
        ("x-access-token", sandbox.token.as_str()),
        ("content-type", "application/octet-stream"),
    ];
    let written = serve
        .try_request(
            &serve.e2b,
            "POST",
            &format!("/files?path={}", query(path)),
            &headers,
            Bytes::from(content.to_vec()),
        )
        .await
        .unwrap();
    assert!(
        matches!(written.status, 200 | 204),
        "write {path}: {} {}\n{}",
        written.status,
        written.text(),
        serve.context()
    );
}

/// `GET /files` on `sandbox`'s envd with its access token.
async fn read_file(serve: &E2bServe, sandbox: &Created, path: &str) -> Answer {
    let headers = [
        ("e2b-sandbox-id", sandbox.id.as_str()),
        ("e2b-sandbox-port", ENVD_PORT),
        ("x-access-token", sandbox.token.as_str()),
    ];
    serve
        .e2b_call("GET", &format!("/files?path={}", query(path)), &headers, "")
        .await
}

/// The snapshot IDs `GET /snapshots` (with `query`) answers `key`'s tenant.
async fn listed(serve: &E2bServe, key: &str, query: &str) -> Vec<String> {
    let a = serve
        .cp("GET", &format!("/snapshots{query}"), key, "")
        .await;
    assert_eq!(a.status, 200, "GET /snapshots{query}: {}", a.text());
    let v: Value = a.json();
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| {
            assert!(s["names"].is_array(), "no names: {s}");
            s["snapshotID"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE) and the static agent (SANDBOX_AGENT_BIN): the e2b sdk stage"]
async fn e2b_snapshots_boot_list_delete_and_stay_their_tenants() {
    let serve = E2bServe::start("te2bsnap").await;
    let _cleanup = SnapshotImages(serve.namespace.clone());
    let (a, b) = (serve.key_a.clone(), serve.key_b.clone());
    let source = serve.create(&a, json!({})).await;
    let path = "/home/user/snapshot.txt";
    let content = format!("snapshotted {:016x}", fastrand::u64(..));
    write_file(&serve, &source, path, content.as_bytes()).await;

    // B cannot snapshot A's sandbox; A can.
    serve
        .cp(
            "POST",
            &format!("/sandboxes/{}/snapshots", source.id),
            &b,
            "{}",
        )
        .await
        .error(&[404], "B snapshots A's sandbox");
    let taken = serve
        .cp(
            "POST",
            &format!("/sandboxes/{}/snapshots", source.id),
            &a,
            r#"{"name":"my-snap"}"#,
        )
        .await;
    assert_eq!(
        taken.status,
        201,
        "snapshot: {}\n{}",
        taken.text(),
        serve.context()
    );
    let info = taken.json();
    let snap = info["snapshotID"].as_str().unwrap().to_owned();
    // The ID, then the name as given.
    assert_eq!(info["names"], json!([snap, "my-snap"]), "{info}");
    assert_eq!(snapshot_images(&serve.namespace).len(), 1);

    // Listed for A, filtered by its sandbox and not; never for B.
    assert!(listed(&serve, &a, "").await.contains(&snap));
    let all = serve.cp("GET", "/snapshots", &a, "").await.json();
    let shown = all
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["snapshotID"] == snap.as_str())
        .unwrap();
    assert_eq!(
        shown["names"],
        json!([snap, "my-snap"]),
        "the name is kept: {all}"
    );
    let by_source = listed(&serve, &a, &format!("?sandboxID={}", source.id)).await;
    assert_eq!(by_source, vec![snap.clone()]);
    assert!(listed(&serve, &b, "").await.is_empty());
    assert!(
        listed(&serve, &b, &format!("?sandboxID={}", source.id))
            .await
            .is_empty()
    );
    serve
        .cp("GET", "/snapshots?template=x", &a, "")
        .await
        .error(&[400], "an unknown filter");

    // The snapshot outlives its source.
    let killed = serve
        .cp("DELETE", &format!("/sandboxes/{}", source.id), &a, "")
        .await;
    assert_eq!(killed.status, 204, "{}", killed.text());
    assert!(listed(&serve, &a, "").await.contains(&snap));

    // B can neither boot nor delete it; it is not there for B.
    serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &b,
            &json!({"templateID": snap}).to_string(),
        )
        .await
        .error(&[404], "B boots A's snapshot");
    serve
        .cp("DELETE", &format!("/templates/{snap}"), &b, "")
        .await
        .error(&[404], "B deletes A's snapshot");
    assert!(listed(&serve, &a, "").await.contains(&snap));

    // A boots it: the file is there.
    let restored = serve
        .create_body(&a, json!({"templateID": snap, "timeout": 120}))
        .await;
    assert_eq!(restored.body["templateID"], snap.as_str());
    let back = read_file(&serve, &restored, path).await;
    assert_eq!(back.status, 200, "read back: {}", back.text());
    assert_eq!(back.text(), content);

    // Still used by the restored sandbox: the engine refuses, as a conflict.
    serve
        .cp("DELETE", &format!("/templates/{snap}"), &a, "")
        .await
        .error(&[409], "deleting a snapshot a sandbox runs from");
    assert!(listed(&serve, &a, "").await.contains(&snap));

    let killed = serve
        .cp("DELETE", &format!("/sandboxes/{}", restored.id), &a, "")
        .await;
    assert_eq!(killed.status, 204, "{}", killed.text());
    let deleted = serve
        .cp("DELETE", &format!("/templates/{snap}"), &a, "")
        .await;
    assert_eq!(
        deleted.status,
        204,
        "delete: {}\n{}",
        deleted.text(),
        serve.context()
    );
    // Gone: E2B's answer for a template that is not there, which the SDK reads as "deleted
    // already".
    serve
        .cp("DELETE", &format!("/templates/{snap}"), &a, "")
        .await
        .error(&[404], "a second delete");
    assert!(!listed(&serve, &a, "").await.contains(&snap));
    serve
        .cp(
            "POST",
            "/v2/sandboxes",
            &a,
            &json!({"templateID": snap}).to_string(),
        )
        .await
        .error(&[404], "booting a deleted snapshot");
    serve.wait_no_containers().await;
    assert_eq!(snapshot_images(&serve.namespace), Vec::<String>::new());
}

//! The file routes end to end over the real Docker engine: a 20 MiB upload round-trips
//! byte-exact, listings recurse to the asked depth, stat kinds, mkdir, removal, attachments only
//! under `/workspace/input` (and model writes refused there), the upload limit (413, nothing
//! written, declared and chunked bodies alike), path validation, and lookup-only routes that
//! never create a container.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Containers are counted by this test's namespace label.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::{ReqBody, code, full};

use std::convert::Infallible;

use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::Value;

const TOKEN_A: &str = "token-tenant-a";
const TOKEN_B: &str = "token-tenant-b";
const MIB: usize = 1024 * 1024;

/// A body without a length: hyper sends it chunked, so only the bounded read can stop it.
fn chunked(total: usize, chunk: usize) -> ReqBody {
    let frames = (0..total.div_ceil(chunk)).map(move |i| {
        let n = chunk.min(total - i * chunk);
        Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; n])))
    });
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

/// The entry of `path` in a listing answer.
fn entry<'a>(listing: &'a Value, path: &str) -> Option<&'a Value> {
    listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn files_over_http() {
    let s = support::start("thttpf", &[TOKEN_A, TOKEN_B]).await;
    const S: &str = "/v1/sessions/files-1";

    // Lookup-only routes on an unbound session answer without creating anything; so do
    // requests refused by validation, including writes the layout rules refuse.
    // (method, path, body, status, code)
    type Case<'a> = (&'a str, String, &'a str, u16, &'a str);
    let unbound: Vec<Case<'_>> = vec![
        (
            "GET",
            format!("{S}/files/content?path=/workspace/a.txt"),
            "",
            404,
            "no_live_sandbox",
        ),
        (
            "GET",
            format!("{S}/files/stat?path=/workspace"),
            "",
            404,
            "no_live_sandbox",
        ),
        (
            "DELETE",
            format!("{S}/files?path=/workspace/a.txt"),
            "",
            404,
            "no_live_sandbox",
        ),
        ("GET", format!("{S}/files/content"), "", 400, "invalid_path"),
        (
            "GET",
            format!("{S}/files/content?path=workspace/a.txt"),
            "",
            400,
            "invalid_path",
        ),
        (
            "GET",
            format!("{S}/files/content?path=/workspace/../etc/passwd"),
            "",
            400,
            "invalid_path",
        ),
        (
            "GET",
            format!("{S}/files/stat?path=../etc"),
            "",
            400,
            "invalid_path",
        ),
        (
            "PUT",
            format!("{S}/files/content?path=/workspace/../etc/x"),
            "x",
            400,
            "invalid_path",
        ),
        (
            "PUT",
            format!("{S}/files/content?path=a.txt"),
            "x",
            400,
            "invalid_path",
        ),
        (
            "PUT",
            format!("{S}/files/content?path=/workspace/input/a.txt"),
            "x",
            400,
            "invalid_path",
        ),
        (
            "PUT",
            format!("{S}/attachments?path=/workspace/a.txt"),
            "x",
            400,
            "invalid_path",
        ),
        (
            "PUT",
            format!("{S}/attachments?path=/workspace/input/../a.txt"),
            "x",
            400,
            "invalid_path",
        ),
        (
            "POST",
            format!("{S}/files/mkdir?path=/workspace/input/d"),
            "",
            400,
            "invalid_path",
        ),
        (
            "POST",
            format!("{S}/files/mkdir?path=/workspace/../d"),
            "",
            400,
            "invalid_path",
        ),
        (
            "GET",
            format!("{S}/files?path=/workspace&depth=0"),
            "",
            400,
            "invalid_depth",
        ),
        (
            "GET",
            format!("{S}/files?path=/workspace&depth=17"),
            "",
            400,
            "invalid_depth",
        ),
        (
            "GET",
            format!("{S}/files?path=/workspace&depth=deep"),
            "",
            400,
            "invalid_depth",
        ),
        (
            "GET",
            format!("{S}/files?path=/workspace&recursive=true"),
            "",
            400,
            "invalid_query",
        ),
        (
            "GET",
            format!("{S}/files/content?path=/workspace/a&x=1"),
            "",
            400,
            "invalid_query",
        ),
        (
            "GET",
            "/v1/sessions/a%7Bb%7D/files/content?path=/workspace/a".to_owned(),
            "",
            400,
            "invalid_session",
        ),
    ];
    for (method, path, body, want_status, want_code) in &unbound {
        let (status, v) = s.call_as(method, path, Some(TOKEN_A), body).await;
        assert_eq!(
            (status, code(&v)),
            (*want_status, *want_code),
            "{method} {path}: {v}"
        );
    }
    let (status, _) = s
        .call_as(
            "GET",
            &format!("{S}/files/content?path=/workspace/a.txt"),
            None,
            "",
        )
        .await;
    assert_eq!(status, 401);
    let (status, listing) = s
        .call_as(
            "GET",
            &format!("{S}/files?path=/workspace"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(listing["entries"], Value::Array(Vec::new()));
    let (status, v) = s
        .call_as(
            "DELETE",
            &format!("{S}/attachments?path=/workspace/input/a.txt"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(
        s.containers().await,
        0,
        "lookup-only routes created nothing"
    );

    // A 20 MiB random upload provisions the sandbox and round-trips byte-exact.
    let mut big = vec![0u8; 20 * MIB];
    fastrand::Rng::with_seed(7).fill(&mut big);
    let (status, v) = s
        .call_body(
            "PUT",
            &format!("{S}/files/content?path=/workspace/big.bin"),
            Some(TOKEN_A),
            full(big.clone()),
        )
        .await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(s.containers().await, 1);
    let (status, got) = s
        .raw(
            "GET",
            &format!("{S}/files/content?path=/workspace/big.bin"),
            Some(TOKEN_A),
            full(""),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(got.len(), big.len());
    assert!(got[..] == big[..], "the download differs from the upload");
    drop(big);

    // mkdir (parents included, existing is fine), nested files, listings by depth.
    for _ in 0..2 {
        let (status, v) = s
            .call_as(
                "POST",
                &format!("{S}/files/mkdir?path=/workspace/a/b/c"),
                Some(TOKEN_A),
                "",
            )
            .await;
        assert_eq!(status, 204, "{v}");
    }
    for (path, body) in [
        ("/workspace/a/top.txt", "top"),
        ("/workspace/a/b/c/deep.txt", "deeper"),
    ] {
        let (status, v) = s
            .call_as(
                "PUT",
                &format!("{S}/files/content?path={path}"),
                Some(TOKEN_A),
                body,
            )
            .await;
        assert_eq!(status, 204, "{path}: {v}");
    }
    let (status, shallow) = s
        .call_as(
            "GET",
            &format!("{S}/files?path=/workspace/a"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 200, "{shallow}");
    assert_eq!(entry(&shallow, "/workspace/a/b").unwrap()["kind"], "dir");
    let top = entry(&shallow, "/workspace/a/top.txt").unwrap();
    assert_eq!(
        (&top["kind"], &top["size"], &top["name"]),
        (
            &Value::from("file"),
            &Value::from(3),
            &Value::from("top.txt")
        ),
        "{top}"
    );
    assert!(entry(&shallow, "/workspace/a/b/c").is_none(), "{shallow}");
    let (status, deep) = s
        .call_as(
            "GET",
            &format!("{S}/files?path=/workspace/a&depth=3"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 200, "{deep}");
    assert_eq!(entry(&deep, "/workspace/a/b/c").unwrap()["kind"], "dir");
    let leaf = entry(&deep, "/workspace/a/b/c/deep.txt").unwrap();
    assert_eq!(
        (&leaf["kind"], &leaf["size"]),
        (&Value::from("file"), &Value::from(6))
    );
    let (status, middle) = s
        .call_as(
            "GET",
            &format!("{S}/files?path=/workspace/a&depth=2"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 200, "{middle}");
    assert!(entry(&middle, "/workspace/a/b/c").is_some(), "{middle}");
    assert!(
        entry(&middle, "/workspace/a/b/c/deep.txt").is_none(),
        "{middle}"
    );

    // Stat kinds; missing paths are not_found for stat and download.
    for (path, kind) in [
        ("/workspace/a", "dir"),
        ("/workspace/a/top.txt", "file"),
        ("/workspace/big.bin", "file"),
    ] {
        let (status, st) = s
            .call_as(
                "GET",
                &format!("{S}/files/stat?path={path}"),
                Some(TOKEN_A),
                "",
            )
            .await;
        assert_eq!(
            (status, st["kind"].as_str()),
            (200, Some(kind)),
            "{path}: {st}"
        );
        assert_eq!(st["path"], path);
    }
    let (status, st) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace/big.bin"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!((status, st["size"].as_u64()), (200, Some(20 * MIB as u64)));
    for route in ["files/content", "files/stat"] {
        let (status, v) = s
            .call_as(
                "GET",
                &format!("{S}/{route}?path=/workspace/missing.txt"),
                Some(TOKEN_A),
                "",
            )
            .await;
        assert_eq!((status, code(&v)), (404, "not_found"), "{route}: {v}");
    }

    // Attachments: only below /workspace/input, and model writes there are refused.
    let (status, v) = s
        .call_as(
            "PUT",
            &format!("{S}/attachments?path=/workspace/input/doc.txt"),
            Some(TOKEN_A),
            "original",
        )
        .await;
    assert_eq!(status, 204, "{v}");
    let attach_refusals = [
        (
            "PUT",
            format!("{S}/files/content?path=/workspace/input/doc.txt"),
        ),
        ("DELETE", format!("{S}/files?path=/workspace/input/doc.txt")),
        ("DELETE", format!("{S}/files?path=/workspace/input")),
        ("POST", format!("{S}/files/mkdir?path=/workspace/input/sub")),
        ("PUT", format!("{S}/attachments?path=/workspace/input")),
        (
            "PUT",
            format!("{S}/attachments?path=/workspace/inputs/doc.txt"),
        ),
        ("DELETE", format!("{S}/attachments?path=/workspace/doc.txt")),
    ];
    for (method, path) in &attach_refusals {
        let (status, v) = s.call_as(method, path, Some(TOKEN_A), "overwritten").await;
        assert_eq!(
            (status, code(&v)),
            (400, "invalid_path"),
            "{method} {path}: {v}"
        );
    }
    let (status, got) = s
        .raw(
            "GET",
            &format!("{S}/files/content?path=/workspace/input/doc.txt"),
            Some(TOKEN_A),
            full(""),
        )
        .await;
    assert_eq!((status, &got[..]), (200, &b"original"[..]));
    for _ in 0..2 {
        let (status, v) = s
            .call_as(
                "DELETE",
                &format!("{S}/attachments?path=/workspace/input/doc.txt"),
                Some(TOKEN_A),
                "",
            )
            .await;
        assert_eq!(status, 204, "{v}");
    }
    let (status, v) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace/input/doc.txt"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!((status, code(&v)), (404, "not_found"), "{v}");

    // Removal: recursive; missing is not_found; the root and top-level directories are refused.
    let (status, v) = s
        .call_as(
            "DELETE",
            &format!("{S}/files?path=/workspace/a"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(status, 204, "{v}");
    let (status, v) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace/a/b/c/deep.txt"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!((status, code(&v)), (404, "not_found"), "{v}");
    let (status, v) = s
        .call_as(
            "DELETE",
            &format!("{S}/files?path=/workspace/a"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!((status, code(&v)), (404, "not_found"), "{v}");
    for path in ["/", "/workspace", "/etc"] {
        let (status, v) = s
            .call_as(
                "DELETE",
                &format!("{S}/files?path={path}"),
                Some(TOKEN_A),
                "",
            )
            .await;
        assert_eq!((status, code(&v)), (400, "invalid_path"), "{path}: {v}");
    }
    let (status, st) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!((status, st["kind"].as_str()), (200, Some("dir")), "{st}");

    // Another tenant's same-named session is unbound: it sees nothing and creates nothing.
    let (status, v) = s
        .call_as(
            "GET",
            &format!("{S}/files/content?path=/workspace/big.bin"),
            Some(TOKEN_B),
            "",
        )
        .await;
    assert_eq!((status, code(&v)), (404, "no_live_sandbox"), "{v}");
    assert_eq!(s.containers().await, 1);

    // Cleanup destroys the session's container.
    let (status, _) = s.call_as("DELETE", S, Some(TOKEN_A), "").await;
    assert_eq!(status, 204);
    assert_eq!(s.containers().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn upload_limit_over_http() {
    let s = support::start_with(
        "thttpf",
        &[TOKEN_A, TOKEN_B],
        |c| c.limits.upload_max_bytes = MIB as u64,
        |_| {},
    )
    .await;
    const S: &str = "/v1/sessions/limits-1";

    // Over the limit before the sandbox exists: 413, nothing created.
    let (status, v) = s
        .call_body(
            "PUT",
            &format!("{S}/files/content?path=/workspace/over.bin"),
            Some(TOKEN_A),
            full(vec![b'x'; 2 * MIB]),
        )
        .await;
    assert_eq!((status, code(&v)), (413, "payload_too_large"), "{v}");
    assert_eq!(s.containers().await, 0);

    // Exactly the limit is accepted (and provisions).
    let (status, v) = s
        .call_body(
            "PUT",
            &format!("{S}/files/content?path=/workspace/exact.bin"),
            Some(TOKEN_A),
            full(vec![b'e'; MIB]),
        )
        .await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(s.containers().await, 1);
    let (status, st) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace/exact.bin"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(
        (status, st["size"].as_u64()),
        (200, Some(MIB as u64)),
        "{st}"
    );

    // Over the limit with a declared length, and chunked without one (only the bounded read can
    // stop that), for files and attachments: 413 and nothing written.
    type MakeBody = fn() -> ReqBody;
    let over: [(&str, MakeBody); 2] = [
        ("declared", || full(vec![b'x'; MIB + 1])),
        ("chunked", || chunked(3 * MIB, 64 * 1024)),
    ];
    for (how, body) in over {
        for path in [
            format!("{S}/files/content?path=/workspace/over.bin"),
            format!("{S}/attachments?path=/workspace/input/over.bin"),
        ] {
            let (status, v) = s.call_body("PUT", &path, Some(TOKEN_A), body()).await;
            assert_eq!(
                (status, code(&v)),
                (413, "payload_too_large"),
                "{how} {path}: {v}"
            );
        }
        for written in ["/workspace/over.bin", "/workspace/input/over.bin"] {
            let (status, v) = s
                .call_as(
                    "GET",
                    &format!("{S}/files/stat?path={written}"),
                    Some(TOKEN_A),
                    "",
                )
                .await;
            assert_eq!(
                (status, code(&v)),
                (404, "not_found"),
                "{how} {written}: {v}"
            );
        }
    }
    // A chunked upload under the limit is read whole.
    let (status, v) = s
        .call_body(
            "PUT",
            &format!("{S}/attachments?path=/workspace/input/chunked.bin"),
            Some(TOKEN_A),
            chunked(MIB - 1, 100_000),
        )
        .await;
    assert_eq!(status, 204, "{v}");
    let (status, st) = s
        .call_as(
            "GET",
            &format!("{S}/files/stat?path=/workspace/input/chunked.bin"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(
        (status, st["size"].as_u64()),
        (200, Some(MIB as u64 - 1)),
        "{st}"
    );

    let (status, _) = s.call_as("DELETE", S, Some(TOKEN_A), "").await;
    assert_eq!(status, 204);
    assert_eq!(s.containers().await, 0);
}

//! The HTTP API end to end over the real Docker engine: exec (buffered and streamed live),
//! session inspect, keep-alive, destroy, and malformed input answering each route's documented
//! status and code.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Containers are counted by this test's namespace label.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::code;

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Bytes;
use serde_json::{Value, json};

const TOKEN_A: &str = "token-tenant-a";
const TOKEN_B: &str = "token-tenant-b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn exec_sessions_and_errors_over_http() {
    let s = support::start("thttp", &[TOKEN_A, TOKEN_B]).await;
    let (status, health) = s.call_as("GET", "/healthz", None, "").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));

    // First exec creates the session's container.
    assert_eq!(s.containers().await, 0);
    let (status, r) = s
        .call_as(
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"echo","args":["first"]}"#,
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "first\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(s.containers().await, 1);

    // Streaming is live: the command blocks after the token until the test, having read the
    // token from the NDJSON stream, opens the gate.
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("{}/v1/sessions/chat-1/exec?stream=true", s.base))
        .header("authorization", format!("Bearer {TOKEN_A}"))
        .body(support::full(Bytes::from(
            json!({"command": "echo tok-live-7; while [ ! -e /workspace/gate ]; do sleep 0.1; done; echo after", "shell": true, "timeout_ms": 60000}).to_string(),
        )))
        .unwrap();
    let resp = s.client.request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body();
    let mut seen = String::new();
    let read_token = async {
        while !seen.contains("tok-live-7") {
            let frame = body
                .frame()
                .await
                .expect("stream ended before the token")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                seen.push_str(&String::from_utf8_lossy(&data));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_token)
        .await
        .expect("the token was not streamed while the command ran");
    let (status, _) = s
        .call_as(
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"touch","args":["/workspace/gate"]}"#,
        )
        .await;
    assert_eq!(status, 200);
    let rest = tokio::time::timeout(Duration::from_secs(30), body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    seen.push_str(&String::from_utf8_lossy(&rest));
    let last: Value = serde_json::from_str(seen.lines().last().unwrap()).unwrap();
    assert_eq!(last["exit_code"], 0, "{seen}");
    assert!(seen.contains("after"), "{seen}");

    // Output is never mangled: bytes that are not UTF-8 come back exactly (base64), buffered
    // and streamed, and multi-byte text streamed in many chunks arrives whole.
    let binary = r#"{"command":"printf 'caf\\303\\251 \\377\\376'","shell":true}"#;
    let (status, r) = s
        .call_as("POST", "/v1/sessions/chat-1/exec", Some(TOKEN_A), binary)
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout_utf8"], false, "{r}");
    let exact = b"caf\xc3\xa9 \xff\xfe".to_vec();
    assert_eq!(b64(r["stdout_b64"].as_str().unwrap()), exact, "{r}");
    let (lines, out) = stream_exec(&s, binary).await;
    assert_eq!(out, exact, "{lines}");
    assert!(lines.contains("data_b64"), "{lines}");
    let text = "日本語テキスト ".repeat(20_000);
    let spec = json!({"command": format!("i=0; while [ $i -lt 20000 ]; do printf '日本語テキスト '; i=$((i+1)); done"), "shell": true, "timeout_ms": 60000});
    let (lines, out) = stream_exec(&s, &spec.to_string()).await;
    assert!(
        lines.lines().count() > 3,
        "many chunks: {}",
        lines.lines().count()
    );
    assert!(
        !lines.contains("data_b64"),
        "text cut mid-character went out as binary"
    );
    assert!(
        String::from_utf8(out).unwrap() == text,
        "streamed text differs"
    );

    // Session inspect, keep-alive.
    let (status, info) = s
        .call_as("GET", "/v1/sessions/chat-1", Some(TOKEN_A), "")
        .await;
    assert_eq!(
        (status, info["state"].as_str()),
        (200, Some("running")),
        "{info}"
    );
    let (status, ka) = s
        .call_as("POST", "/v1/sessions/chat-1/keepalive", Some(TOKEN_A), "")
        .await;
    assert_eq!(
        (status, ka["refreshed"].as_bool()),
        (200, Some(true)),
        "{ka}"
    );

    // Malformed input: the documented status and code, and nothing created.
    // (method, path, token, body, status, code)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, &'a str, u16, &'a str);
    let cases: &[Case<'_>] = &[
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            "{not json",
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"args":["x"]}"#,
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"ls","args":["-l"],"shell":true}"#,
            400,
            "invalid_command",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"pwd","cwd":"workspace"}"#,
            400,
            "invalid_path",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"pwd","cwd":"/workspace/../etc"}"#,
            400,
            "invalid_path",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"true","timeout_ms":0}"#,
            400,
            "invalid_timeout",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_A),
            r#"{"command":"true","timeout_ms":-5}"#,
            400,
            "invalid_timeout",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec?stream=maybe",
            Some(TOKEN_A),
            r#"{"command":"true"}"#,
            400,
            "invalid_query",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            Some("wrong-token"),
            r#"{"command":"true"}"#,
            401,
            "unauthorized",
        ),
        (
            "POST",
            "/v1/sessions/chat-1/exec",
            None,
            r#"{"command":"true"}"#,
            401,
            "unauthorized",
        ),
        (
            "GET",
            "/v1/sessions/chat-1",
            Some(TOKEN_B),
            "",
            404,
            "no_live_sandbox",
        ),
        (
            "POST",
            "/v1/sessions/a%7Bb%7D/exec",
            Some(TOKEN_A),
            r#"{"command":"true"}"#,
            400,
            "invalid_session",
        ),
        ("GET", "/v1/nope", Some(TOKEN_A), "", 404, "route_not_found"),
    ];
    for (method, path, token, body, want_status, want_code) in cases {
        let (status, v) = s.call_as(method, path, *token, body).await;
        assert_eq!(
            (status, code(&v)),
            (*want_status, *want_code),
            "{method} {path} {body}: {v}"
        );
    }
    assert_eq!(
        s.containers().await,
        1,
        "malformed requests created nothing"
    );

    // Another tenant's same-named session is a different session: it cannot see tenant A's files.
    let (status, r) = s
        .call_as(
            "POST",
            "/v1/sessions/chat-1/exec",
            Some(TOKEN_B),
            r#"{"command":"cat","args":["/workspace/gate"]}"#,
        )
        .await;
    assert_eq!(status, 200);
    assert_ne!(r["exit_code"], 0, "tenant B saw tenant A's file: {r}");
    assert_eq!(s.containers().await, 2);

    // Metrics saw the traffic: both tenants' sandboxes were created by a resolve.
    let before = metrics(&s).await;
    assert!(before.contains("sandbox_http_requests_total"), "{before}");
    let created = sample(&before, "sandbox_sandboxes_created_total");
    assert!(created >= 2.0, "{before}");
    assert!(
        sample(
            &before,
            r#"sandbox_session_resolves_total{outcome="created"}"#
        ) >= 2.0,
        "{before}"
    );
    assert!(
        sample(
            &before,
            r#"sandbox_session_resolves_total{outcome="bound"}"#
        ) >= 1.0,
        "{before}"
    );

    // Destroy: the container goes; again is still 204.
    for token in [TOKEN_A, TOKEN_B] {
        let (status, _) = s
            .call_as("DELETE", "/v1/sessions/chat-1", Some(token), "")
            .await;
        assert_eq!(status, 204);
        let (status, _) = s
            .call_as("DELETE", "/v1/sessions/chat-1", Some(token), "")
            .await;
        assert_eq!(status, 204);
    }
    let after = metrics(&s).await;
    assert_eq!(
        sample(&after, "sandbox_sandboxes_destroyed_total")
            - sample(&before, "sandbox_sandboxes_destroyed_total"),
        2.0,
        "two destroys, each deleting one container: {after}"
    );
    assert_eq!(s.containers().await, 0);
}

async fn metrics(s: &support::Server) -> String {
    let (status, body) = s.call_as("GET", "/metrics", None, "").await;
    assert_eq!(status, 200);
    body.as_str().unwrap_or_default().to_owned()
}

/// The value of the sample whose name and labels are exactly `series` (0 when absent: a
/// counter never incremented is not rendered).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse::<f64>().unwrap())
        .next()
        .unwrap_or(0.0)
}

fn b64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// Runs a streamed exec; returns the NDJSON text and the stdout bytes it carried.
async fn stream_exec(s: &support::Server, spec: &str) -> (String, Vec<u8>) {
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("{}/v1/sessions/chat-1/exec?stream=true", s.base))
        .header("authorization", format!("Bearer {TOKEN_A}"))
        .body(support::full(Bytes::from(spec.to_owned())))
        .unwrap();
    let resp = s.client.request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let lines = String::from_utf8(body.to_vec()).unwrap();
    let mut out = Vec::new();
    for line in lines.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v["stream"] == "stdout" {
            match (v["data"].as_str(), v["data_b64"].as_str()) {
                (Some(text), None) => out.extend_from_slice(text.as_bytes()),
                (None, Some(b)) => out.extend(b64(b)),
                _ => panic!("an output line with neither or both: {line}"),
            }
        }
    }
    let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(last["exit_code"], 0, "{lines}");
    (lines, out)
}

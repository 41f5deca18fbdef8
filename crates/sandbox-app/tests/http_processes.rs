//! The issue-17 routes over the in-memory fake (hermetic: the real router, no Docker):
//! background processes (start, list, attach with replay offsets, stdin, signals), streamed
//! upload and download, rename, and the watch stream; each route's success and its error
//! answers, the 501s of a backend without the capabilities, the stream quota, and that a
//! process error never replaces the session's binding.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use sandbox_app::auth::{TenantAuth, digest, hex};
use sandbox_app::config::Limits;
use sandbox_app::http::metrics::Metrics;
use sandbox_app::http::{AppState, router};
use sandbox_core::{
    Capability, Checked, ConfigId, CreateRequest, PermissiveSessionExistence, SandboxProvider,
    TenantId,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::SessionManager;
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_session::quota::{QuotaGate, Quotas, TenantQuota};
use sandbox_testkit::fake::FakeProvider;
use serde_json::{Value, json};
use tower::ServiceExt as _;

const TOKEN: &str = "token-processes";
const TENANT: u64 = 5;

struct Setup {
    fake: Checked<FakeProvider>,
    limits: Limits,
    quota: TenantQuota,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            fake: FakeProvider::new(),
            limits: Limits::default(),
            quota: TenantQuota::UNLIMITED,
        }
    }
}

fn app_with(setup: Setup) -> Router {
    let provider: Arc<dyn SandboxProvider> = Arc::new(setup.fake);
    let quotas = Quotas {
        default: setup.quota,
        tenants: Default::default(),
    };
    let lifecycle = Lifecycle::new(
        provider.clone(),
        Arc::new(MemoryBindingStore::new()),
        Arc::new(PermissiveSessionExistence),
        LifecycleConfig {
            config_id: ConfigId::default_config(),
            create_request: CreateRequest::new(FakeProvider::template()),
            requires_inbound_token: false,
        },
    )
    .unwrap()
    .with_quotas(QuotaGate::new(quotas));
    let _ = TenantId::new(TENANT).unwrap();
    router(AppState {
        auth: Arc::new(TenantAuth::new([(TENANT, hex(&digest(TOKEN)).as_str())]).unwrap()),
        manager: SessionManager::new(lifecycle),
        provider,
        metrics: Arc::new(Metrics::new()),
        budget: sandbox_app::http::body::InflightBudget::new(setup.limits.inflight_max_bytes),
        limits: setup.limits,
        tickets: Arc::new(sandbox_app::tickets::TerminalTickets::default()),
        store: sandbox_app::http::StoreInfo::memory(),
    })
}

fn app() -> Router {
    app_with(Setup::default())
}

/// Sends a request and returns the response with its body unread.
async fn open(app: &Router, method: &str, uri: &str, body: Body) -> axum::response::Response {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(body)
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), app.clone().oneshot(request))
        .await
        .expect("an answer")
        .unwrap()
}

/// Sends a request; the status and the whole body.
async fn call(app: &Router, method: &str, uri: &str, body: impl Into<Body>) -> (u16, Vec<u8>) {
    let response = open(app, method, uri, body.into()).await;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(Duration::from_secs(20), response.into_body().collect())
        .await
        .expect("the body ends")
        .unwrap()
        .to_bytes();
    (status, body.to_vec())
}

async fn call_json(app: &Router, method: &str, uri: &str, body: Value) -> (u16, Value) {
    let (status, body) = call(app, method, uri, body.to_string()).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn code(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)));
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

/// Asserts the status and error code of an answer.
async fn refused(app: &Router, method: &str, uri: &str, body: impl Into<Body>, want: (u16, &str)) {
    let (status, body) = call(app, method, uri, body).await;
    assert_eq!(
        (status, code(&body).as_str()),
        want,
        "{method} {uri}: {}",
        String::from_utf8_lossy(&body)
    );
}

/// NDJSON lines of a streamed answer, read as they arrive.
struct Lines {
    body: Body,
    buf: Vec<u8>,
}

impl Lines {
    fn of(response: axum::response::Response) -> Self {
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/x-ndjson");
        Lines {
            body: response.into_body(),
            buf: Vec::new(),
        }
    }

    /// The next line; `None` when the body ended.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("a line within 10 s");
            match frame {
                None => {
                    assert!(self.buf.is_empty(), "a partial last line");
                    return None;
                }
                Some(frame) => {
                    if let Ok(data) = frame.unwrap().into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    async fn all(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(line) = self.next().await {
            out.push(line);
        }
        out
    }
}

async fn start(app: &Router, session: &str, spec: Value) -> Value {
    let (status, body) = call_json(
        app,
        "POST",
        &format!("/v1/sessions/{session}/processes"),
        spec.clone(),
    )
    .await;
    assert_eq!(status, 201, "{spec}: {body}");
    body
}

async fn sandbox_id(app: &Router, session: &str) -> String {
    let (status, body) = call_json(app, "GET", &format!("/v1/sessions/{session}"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    body["sandbox_id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_background_process_is_started_listed_and_replayed_exactly() {
    let app = app();
    let p = start(
        &app,
        "s1",
        json!({ "command": "echo", "args": ["hello", "world"], "tag": "greet" }),
    )
    .await;
    let pid = p["pid"].as_u64().unwrap();
    assert_eq!(p["tag"], "greet");
    assert_eq!(p["argv"], json!(["echo", "hello", "world"]));
    let bound = sandbox_id(&app, "s1").await;

    // Attach from 0, by pid and by tag: the whole output at its offsets, then the status.
    for name in [pid.to_string(), "greet".to_owned()] {
        let response = open(
            &app,
            "GET",
            &format!("/v1/sessions/s1/processes/{name}/attach?from=0"),
            Body::empty(),
        )
        .await;
        let lines = Lines::of(response).all().await;
        let mut output = String::new();
        let mut next = 0;
        for line in &lines[..lines.len() - 1] {
            assert_eq!(line["type"], "data", "{line}");
            assert_eq!(line["offset"], next, "{line}");
            let data = line["data"].as_str().unwrap();
            next += data.len() as u64;
            output.push_str(data);
        }
        assert_eq!(output, "hello world\n");
        let last = lines.last().unwrap();
        assert_eq!(
            last,
            &json!({ "type": "exited", "offset": 12, "exit_code": 0 })
        );
        // Resuming mid-way replays exactly the rest.
        let response = open(
            &app,
            "GET",
            &format!("/v1/sessions/s1/processes/{name}/attach?from=6"),
            Body::empty(),
        )
        .await;
        let rest: String = Lines::of(response)
            .all()
            .await
            .iter()
            .filter_map(|l| l["data"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(rest, "world\n");
    }

    let (status, list) = call_json(&app, "GET", "/v1/sessions/s1/processes", json!({})).await;
    assert_eq!(status, 200);
    let listed = &list["processes"][0];
    assert_eq!(listed["pid"], pid);
    assert_eq!(listed["state"], "exited");
    assert_eq!(listed["exit_code"], 0);
    assert_eq!(listed["output_bytes"], 12);

    // Errors: an unknown pid or tag, an offset past the output or not a number, a name that
    // is neither a pid nor a tag.
    for (uri, want) in [
        (
            "/v1/sessions/s1/processes/4242/attach",
            (404, "process_not_found"),
        ),
        (
            "/v1/sessions/s1/processes/nope/attach",
            (404, "process_not_found"),
        ),
        (
            "/v1/sessions/s1/processes/greet/attach?from=13",
            (400, "invalid_offset"),
        ),
        (
            "/v1/sessions/s1/processes/greet/attach?from=-1",
            (400, "invalid_offset"),
        ),
        (
            "/v1/sessions/s1/processes/greet/attach?from=x",
            (400, "invalid_offset"),
        ),
        (
            "/v1/sessions/s1/processes/a%20b/attach",
            (400, "invalid_process"),
        ),
        (
            "/v1/sessions/s1/processes/99999999999/attach",
            (400, "invalid_process"),
        ),
        (
            "/v1/sessions/s1/processes/greet/attach?bogus=1",
            (400, "invalid_query"),
        ),
    ] {
        refused(&app, "GET", uri, Body::empty(), want).await;
    }
    // A missing process says nothing about the sandbox: the binding stays.
    assert_eq!(sandbox_id(&app, "s1").await, bound);
}

#[tokio::test]
async fn stdin_is_fed_closed_and_refused_once_closed() {
    let app = app();
    start(
        &app,
        "s2",
        json!({ "command": "cat", "tag": "reader", "stdin": true }),
    )
    .await;
    let response = open(
        &app,
        "GET",
        "/v1/sessions/s2/processes/reader/attach?from=0",
        Body::empty(),
    )
    .await;
    let mut lines = Lines::of(response);
    let (status, _) = call(
        &app,
        "POST",
        "/v1/sessions/s2/processes/reader/stdin",
        "ping\n",
    )
    .await;
    assert_eq!(status, 204);
    let line = lines.next().await.unwrap();
    assert_eq!(
        line,
        json!({ "type": "data", "stream": "stdout", "offset": 0, "data": "ping\n" })
    );
    let (status, _) = call(
        &app,
        "DELETE",
        "/v1/sessions/s2/processes/reader/stdin",
        Body::empty(),
    )
    .await;
    assert_eq!(status, 204);
    // cat reads end of file and exits.
    assert_eq!(
        lines.next().await.unwrap(),
        json!({ "type": "exited", "offset": 5, "exit_code": 0 })
    );
    assert_eq!(lines.next().await, None);
    refused(
        &app,
        "POST",
        "/v1/sessions/s2/processes/reader/stdin",
        "late",
        (409, "process_exited"),
    )
    .await;

    // A running process whose stdin was never kept open.
    start(
        &app,
        "s2",
        json!({ "command": "sleep", "args": ["30"], "tag": "sleeper" }),
    )
    .await;
    refused(
        &app,
        "POST",
        "/v1/sessions/s2/processes/sleeper/stdin",
        "x",
        (409, "stdin_closed"),
    )
    .await;
    refused(
        &app,
        "POST",
        "/v1/sessions/s2/processes/4242/stdin",
        "x",
        (404, "process_not_found"),
    )
    .await;
    // The tag of a running process is taken.
    let (status, body) = call_json(
        &app,
        "POST",
        "/v1/sessions/s2/processes",
        json!({ "command": "sleep", "args": ["30"], "tag": "sleeper" }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("process_tag_in_use"))
    );
}

#[tokio::test]
async fn signals_end_processes_and_bad_ones_are_refused() {
    let app = app();
    let p = start(
        &app,
        "s3",
        json!({ "command": "sleep", "args": ["30"], "tag": "long" }),
    )
    .await;
    let pid = p["pid"].as_u64().unwrap();
    assert_eq!(p["state"], "running");
    refused(
        &app,
        "POST",
        "/v1/sessions/s3/processes/long/signal",
        r#"{"signal":"STOP"}"#,
        (400, "invalid_signal"),
    )
    .await;
    refused(
        &app,
        "POST",
        "/v1/sessions/s3/processes/long/signal",
        "{",
        (400, "invalid_json"),
    )
    .await;
    let (status, body) = call(
        &app,
        "POST",
        &format!("/v1/sessions/s3/processes/{pid}/signal"),
        r#"{"signal":"sigkill"}"#,
    )
    .await;
    assert_eq!(status, 204, "{}", String::from_utf8_lossy(&body));
    let (_, list) = call_json(&app, "GET", "/v1/sessions/s3/processes", json!({})).await;
    let listed = &list["processes"][0];
    assert_eq!(listed["state"], "exited", "{list}");
    assert_eq!(listed["signal"], "KILL", "{list}");
    assert!(listed.get("exit_code").is_none(), "{list}");
    // Once ended: process_exited; an empty body is TERM.
    refused(
        &app,
        "POST",
        "/v1/sessions/s3/processes/long/signal",
        Body::empty(),
        (409, "process_exited"),
    )
    .await;
    refused(
        &app,
        "POST",
        "/v1/sessions/s3/processes/77/signal",
        Body::empty(),
        (404, "process_not_found"),
    )
    .await;
}

#[tokio::test]
async fn only_a_start_provisions() {
    let app = app();
    let (status, list) = call_json(&app, "GET", "/v1/sessions/fresh/processes", json!({})).await;
    assert_eq!((status, list), (200, json!({ "processes": [] })));
    for (method, uri, body) in [
        ("GET", "/v1/sessions/fresh/processes/1/attach?from=0", ""),
        ("POST", "/v1/sessions/fresh/processes/1/stdin", "x"),
        ("DELETE", "/v1/sessions/fresh/processes/1/stdin", ""),
        ("POST", "/v1/sessions/fresh/processes/1/signal", ""),
        ("GET", "/v1/sessions/fresh/watch?path=/workspace", ""),
        (
            "GET",
            "/v1/sessions/fresh/files/stream?path=/workspace/a",
            "",
        ),
        (
            "POST",
            "/v1/sessions/fresh/files/rename",
            r#"{"from":"/workspace/a","to":"/workspace/b"}"#,
        ),
    ] {
        refused(&app, method, uri, body, (404, "no_live_sandbox")).await;
    }
    // Still nothing bound.
    refused(
        &app,
        "GET",
        "/v1/sessions/fresh",
        "",
        (404, "no_live_sandbox"),
    )
    .await;
    // A start with a bad spec creates nothing either.
    for (spec, want) in [
        (json!({ "command": "" }), "invalid_command"),
        (json!({ "command": "ls", "tag": "a b" }), "invalid_command"),
        (
            json!({ "command": "ls -l", "shell": true, "args": ["x"] }),
            "invalid_command",
        ),
        (json!({ "command": "ls", "cwd": "rel" }), "invalid_path"),
        (json!({ "command": "ls", "extra": 1 }), "invalid_json"),
    ] {
        let (status, body) =
            call_json(&app, "POST", "/v1/sessions/fresh/processes", spec.clone()).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(want)),
            "{spec}"
        );
    }
    refused(
        &app,
        "GET",
        "/v1/sessions/fresh",
        "",
        (404, "no_live_sandbox"),
    )
    .await;
    // A start provisions; env applies.
    let p = start(
        &app,
        "fresh",
        json!({ "command": "env", "env": { "GREETING": "hi" }, "cwd": "/workspace" }),
    )
    .await;
    assert!(!sandbox_id(&app, "fresh").await.is_empty());
    let response = open(
        &app,
        "GET",
        &format!("/v1/sessions/fresh/processes/{}/attach?from=0", p["pid"]),
        Body::empty(),
    )
    .await;
    let output: String = Lines::of(response)
        .all()
        .await
        .iter()
        .filter_map(|l| l["data"].as_str().map(str::to_owned))
        .collect();
    assert!(output.contains("GREETING=hi"), "{output}");
    // The shell form needs a backend with a POSIX shell, which the fake is not.
    let (status, body) = call_json(
        &app,
        "POST",
        "/v1/sessions/fresh/processes",
        json!({ "command": "echo $GREETING", "shell": true }),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (501, Some("unsupported"))
    );
}

#[tokio::test]
async fn a_backend_without_the_capabilities_answers_501() {
    let fake = FakeProvider::builder()
        .without(Capability::Processes)
        .without(Capability::StreamedFiles)
        .without(Capability::Watch)
        .build();
    let app = app_with(Setup {
        fake,
        ..Setup::default()
    });
    // Bound, so nothing but the capability can refuse.
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/b/files/content?path=/workspace/a.txt",
        "x",
    )
    .await;
    assert_eq!(status, 204);
    for (method, uri, body, want) in [
        (
            "POST",
            "/v1/sessions/b/processes",
            r#"{"command":"ls"}"#,
            "processes_unsupported",
        ),
        (
            "GET",
            "/v1/sessions/b/processes",
            "",
            "processes_unsupported",
        ),
        (
            "GET",
            "/v1/sessions/b/processes/1/attach",
            "",
            "processes_unsupported",
        ),
        (
            "POST",
            "/v1/sessions/b/processes/1/stdin",
            "x",
            "processes_unsupported",
        ),
        (
            "DELETE",
            "/v1/sessions/b/processes/1/stdin",
            "",
            "processes_unsupported",
        ),
        (
            "POST",
            "/v1/sessions/b/processes/1/signal",
            "",
            "processes_unsupported",
        ),
        (
            "GET",
            "/v1/sessions/b/files/stream?path=/workspace/a.txt",
            "",
            "streamed_files_unsupported",
        ),
        (
            "PUT",
            "/v1/sessions/b/files/stream?path=/workspace/a.txt",
            "y",
            "streamed_files_unsupported",
        ),
        (
            "POST",
            "/v1/sessions/b/files/rename",
            r#"{"from":"/workspace/a.txt","to":"/workspace/b.txt"}"#,
            "streamed_files_unsupported",
        ),
        (
            "GET",
            "/v1/sessions/b/watch?path=/workspace",
            "",
            "watch_unsupported",
        ),
    ] {
        refused(&app, method, uri, body, (501, want)).await;
    }
    // The refused upload wrote nothing.
    let (_, content) = call(
        &app,
        "GET",
        "/v1/sessions/b/files/content?path=/workspace/a.txt",
        "",
    )
    .await;
    assert_eq!(content, b"x");
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[tokio::test]
async fn streamed_files_round_trip_and_keep_their_limit() {
    let app = app_with(Setup {
        limits: Limits {
            stream_file_max_bytes: 3 * 1024 * 1024,
            // Below the streamed limit: the streamed route must not be bounded by it.
            upload_max_bytes: 1024 * 1024,
            ..Limits::default()
        },
        ..Setup::default()
    });
    let content = pattern(2 * 1024 * 1024 + 17);
    // A chunked body (no Content-Length), in pieces.
    let pieces: Vec<Result<Bytes, std::io::Error>> = content
        .chunks(100_000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let response = open(
        &app,
        "PUT",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        Body::from_stream(futures_util::stream::iter(pieces)),
    )
    .await;
    assert_eq!(response.status(), 200);
    let written: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        written,
        json!({ "path": "/workspace/big.bin", "bytes": content.len() })
    );
    let (status, back) = call(
        &app,
        "GET",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(back == content, "the bytes differ");

    // Past the limit: a declared length is refused unread, a chunked body mid-way; either way
    // the old file stays.
    let over = pattern(3 * 1024 * 1024 + 1);
    refused(
        &app,
        "PUT",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        over.clone(),
        (413, "payload_too_large"),
    )
    .await;
    let pieces: Vec<Result<Bytes, std::io::Error>> = over
        .chunks(65_536)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    refused(
        &app,
        "PUT",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        Body::from_stream(futures_util::stream::iter(pieces)),
        (413, "payload_too_large"),
    )
    .await;
    // A body that fails mid-way is the client's error, and leaves the old file too.
    let failing: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"partial")),
        Err(std::io::Error::other("the client went away")),
    ];
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        Body::from_stream(futures_util::stream::iter(failing)),
    )
    .await;
    assert_eq!(status, 400);
    let (_, back) = call(
        &app,
        "GET",
        "/v1/sessions/f/files/stream?path=/workspace/big.bin",
        "",
    )
    .await;
    assert!(back == content, "a refused upload changed the file");

    for (method, uri, body, want) in [
        (
            "PUT",
            "/v1/sessions/f/files/stream?path=/workspace/input/x",
            "x",
            (400, "invalid_path"),
        ),
        (
            "PUT",
            "/v1/sessions/f/files/stream?path=rel",
            "x",
            (400, "invalid_path"),
        ),
        (
            "GET",
            "/v1/sessions/f/files/stream?path=/workspace/none",
            "",
            (404, "not_found"),
        ),
        (
            "GET",
            "/v1/sessions/f/files/stream?path=/workspace",
            "",
            (400, "not_a_regular_file"),
        ),
    ] {
        refused(&app, method, uri, body, want).await;
    }
}

#[tokio::test]
async fn rename_moves_a_path_under_the_write_rule() {
    let app = app();
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/r/files/content?path=/workspace/a.txt",
        "moved",
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = call(
        &app,
        "POST",
        "/v1/sessions/r/files/rename",
        r#"{"from":"/workspace/a.txt","to":"/workspace/sub/b.txt"}"#,
    )
    .await;
    assert_eq!(status, 204, "{}", String::from_utf8_lossy(&body));
    let (status, content) = call(
        &app,
        "GET",
        "/v1/sessions/r/files/content?path=/workspace/sub/b.txt",
        "",
    )
    .await;
    assert_eq!((status, content.as_slice()), (200, b"moved".as_slice()));
    for (body, want) in [
        (
            r#"{"from":"/workspace/a.txt","to":"/workspace/c.txt"}"#,
            (404, "not_found"),
        ),
        (
            r#"{"from":"/workspace/sub/b.txt","to":"/workspace/input/b.txt"}"#,
            (400, "invalid_path"),
        ),
        (
            r#"{"from":"/workspace/sub","to":"/workspace/sub/inner"}"#,
            (400, "invalid_path"),
        ),
        (
            r#"{"from":"rel","to":"/workspace/x"}"#,
            (400, "invalid_path"),
        ),
        (r#"{"from":"/workspace/x"}"#, (400, "invalid_json")),
    ] {
        refused(&app, "POST", "/v1/sessions/r/files/rename", body, want).await;
    }
}

#[tokio::test]
async fn a_watch_reports_changes_and_ends_on_overflow() {
    let app = app();
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/w/files/content?path=/workspace/seed.txt",
        "x",
    )
    .await;
    assert_eq!(status, 204);
    let response = open(
        &app,
        "GET",
        "/v1/sessions/w/watch?path=/workspace",
        Body::empty(),
    )
    .await;
    let mut lines = Lines::of(response);
    assert_eq!(
        lines.next().await.unwrap(),
        json!({ "type": "started", "path": "/workspace", "recursive": false })
    );
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/w/files/content?path=/workspace/new.txt",
        "y",
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(
        lines.next().await.unwrap(),
        json!({ "type": "event", "kind": "create", "path": "/workspace/new.txt" })
    );
    drop(lines);

    // A watcher that does not read: past the backend's queue the stream ends with
    // watch_overflow, after the events it held.
    let response = open(
        &app,
        "GET",
        "/v1/sessions/w/watch?path=/workspace",
        Body::empty(),
    )
    .await;
    let mut lines = Lines::of(response);
    assert_eq!(lines.next().await.unwrap()["type"], "started");
    for i in 0..sandbox_core::watch::WATCH_QUEUE_EVENTS {
        let (status, _) = call(
            &app,
            "PUT",
            &format!("/v1/sessions/w/files/content?path=/workspace/f{i}"),
            "z",
        )
        .await;
        assert_eq!(status, 204);
    }
    let rest = lines.all().await;
    let last = rest.last().unwrap();
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["code"], "watch_overflow", "{last}");
    assert!(rest.len() > 1, "the held events came first");

    for (uri, want) in [
        (
            "/v1/sessions/w/watch?path=/workspace/seed.txt",
            (400, "not_a_directory"),
        ),
        (
            "/v1/sessions/w/watch?path=/workspace/none",
            (404, "not_found"),
        ),
        ("/v1/sessions/w/watch", (400, "invalid_path")),
        (
            "/v1/sessions/w/watch?path=/workspace&recursive=maybe",
            (400, "invalid_query"),
        ),
    ] {
        refused(&app, "GET", uri, Body::empty(), want).await;
    }
}

#[tokio::test]
async fn attach_and_watch_streams_count_against_the_tenant_quota() {
    let app = app_with(Setup {
        quota: TenantQuota {
            max_streams: Some(1),
            ..TenantQuota::UNLIMITED
        },
        ..Setup::default()
    });
    start(
        &app,
        "q",
        json!({ "command": "sleep", "args": ["30"], "tag": "bg" }),
    )
    .await;
    let first = open(
        &app,
        "GET",
        "/v1/sessions/q/processes/bg/attach",
        Body::empty(),
    )
    .await;
    assert_eq!(first.status(), 200);
    refused(
        &app,
        "GET",
        "/v1/sessions/q/watch?path=/workspace",
        Body::empty(),
        (429, "quota_exceeded"),
    )
    .await;
    refused(
        &app,
        "GET",
        "/v1/sessions/q/processes/bg/attach",
        Body::empty(),
        (429, "quota_exceeded"),
    )
    .await;
    // The slot is the response body's: dropping it frees the slot.
    drop(first);
    let watch = open(
        &app,
        "GET",
        "/v1/sessions/q/watch?path=/workspace",
        Body::empty(),
    )
    .await;
    assert_eq!(watch.status(), 200);
}

#[test]
fn the_document_declares_every_new_route() {
    let doc = sandbox_app::http::openapi::document();
    for (path, methods) in [
        ("/v1/sessions/{session}/processes", &["get", "post"][..]),
        (
            "/v1/sessions/{session}/processes/{process}/attach",
            &["get"],
        ),
        (
            "/v1/sessions/{session}/processes/{process}/stdin",
            &["post", "delete"],
        ),
        (
            "/v1/sessions/{session}/processes/{process}/signal",
            &["post"],
        ),
        ("/v1/sessions/{session}/files/stream", &["get", "put"]),
        ("/v1/sessions/{session}/files/rename", &["post"]),
        ("/v1/sessions/{session}/watch", &["get"]),
    ] {
        for method in methods {
            let op = &doc["paths"][path][method];
            assert!(op.is_object(), "{method} {path} is not in the document");
            assert_eq!(op["security"], json!([{ "bearer": [] }]), "{method} {path}");
        }
    }
    let attach = &doc["paths"]["/v1/sessions/{session}/processes/{process}/attach"]["get"];
    assert!(
        attach["responses"]["200"]["content"]["application/x-ndjson"].is_object(),
        "{attach}"
    );
    let codes = &attach["responses"]["404"]["x-error-codes"];
    assert!(
        codes
            .as_array()
            .unwrap()
            .contains(&json!("process_not_found")),
        "{codes}"
    );
}

/// The router on a loopback port, for the CLI.
async fn listen(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sandbox_app::server::serve(
        listener,
        app,
        sandbox_app::server::ServerLimits::default(),
        std::future::pending(),
    ));
    addr
}

/// Runs the `sandbox` binary against `addr`; its status and output.
async fn cli(addr: std::net::SocketAddr, args: &[&str]) -> (i32, String, String) {
    // std's process API on the blocking pool: tokio's needs a feature this crate's minimal
    // builds do not enable.
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_sandbox"))
            .args(&args)
            .env("SANDBOX_SERVER", format!("http://{addr}"))
            .env("SANDBOX_TOKEN", TOKEN)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_drives_background_processes_and_watches() {
    let app = app();
    let addr = listen(app.clone()).await;

    let (status, pid, err) = cli(
        addr,
        &[
            "exec",
            "--background",
            "--tag",
            "job",
            "c",
            "echo",
            "from",
            "cli",
        ],
    )
    .await;
    assert_eq!(status, 0, "{err}");
    let pid = pid.trim().to_owned();
    assert!(pid.parse::<u32>().is_ok(), "{pid:?}");

    let (status, table, err) = cli(addr, &["ps", "c"]).await;
    assert_eq!(status, 0, "{err}");
    assert!(table.starts_with(" PID"), "{table}");
    assert!(table.contains(&format!("{pid}  job")), "{table}");
    assert!(table.contains("exited(0)"), "{table}");
    assert!(table.contains("echo from cli"), "{table}");

    // Replayed exactly, from the start and from an offset; the exit status is the process's.
    let (status, out, err) = cli(addr, &["attach", "--from", "0", "c", "job"]).await;
    assert_eq!((status, out.as_str()), (0, "from cli\n"), "{err}");
    let (status, out, _) = cli(addr, &["attach", "--from", "5", "c", &pid]).await;
    assert_eq!((status, out.as_str()), (0, "cli\n"));
    let (status, _, err) = cli(addr, &["attach", "--from", "99", "c", "job"]).await;
    assert_eq!(status, 1);
    assert!(err.contains("invalid_offset (400)"), "{err}");
    let (status, _, err) = cli(addr, &["attach", "c", "4242"]).await;
    assert_eq!(status, 1);
    assert!(err.contains("process_not_found (404)"), "{err}");

    // kill: a bad signal is refused, TERM ends the process, which attach then reports the
    // way a shell does (128 + 15).
    let (status, _, err) = cli(
        addr,
        &["exec", "--background", "--tag", "long", "c", "sleep", "60"],
    )
    .await;
    assert_eq!(status, 0, "{err}");
    let (status, _, err) = cli(addr, &["kill", "--signal", "STOP", "c", "long"]).await;
    assert_eq!(status, 1);
    assert!(err.contains("invalid_signal (400)"), "{err}");
    let (status, _, err) = cli(addr, &["kill", "c", "long"]).await;
    assert_eq!(status, 0, "{err}");
    let (status, out, err) = cli(addr, &["attach", "--from", "0", "c", "long"]).await;
    assert_eq!((status, out.as_str()), (143, ""), "{err}");
    let (status, _, err) = cli(addr, &["exec", "--timeout", "3", "--background", "c", "ls"]).await;
    assert_eq!(status, 1);
    assert!(err.contains("--timeout"), "{err}");

    // Streamed upload and download, and a rename.
    let dir = std::env::temp_dir().join(format!("sbx-cli-streams-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let local = dir.join("up.bin");
    let content = pattern(300_000);
    std::fs::write(&local, &content).unwrap();
    let local_text = local.to_str().unwrap();
    let (status, _, err) = cli(
        addr,
        &[
            "files",
            "put",
            "--stream",
            "c",
            local_text,
            "/workspace/up.bin",
        ],
    )
    .await;
    assert_eq!(status, 0, "{err}");
    let (status, _, err) = cli(
        addr,
        &[
            "files",
            "mv",
            "c",
            "/workspace/up.bin",
            "/workspace/moved.bin",
        ],
    )
    .await;
    assert_eq!(status, 0, "{err}");
    let back = dir.join("back.bin");
    let (status, _, err) = cli(
        addr,
        &[
            "files",
            "get",
            "--stream",
            "-o",
            back.to_str().unwrap(),
            "c",
            "/workspace/moved.bin",
        ],
    )
    .await;
    assert_eq!(status, 0, "{err}");
    assert!(std::fs::read(&back).unwrap() == content, "the bytes differ");
    std::fs::remove_dir_all(&dir).unwrap();

    // watch prints a change made by someone else.
    let mut watch = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_sandbox"))
            .args(["watch", "c", "/workspace"])
            .env("SANDBOX_SERVER", format!("http://{addr}"))
            .env("SANDBOX_TOKEN", TOKEN)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = watch.0.stdout.take().unwrap();
    let (tx, mut printed) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let seen = async {
        // The watch is armed once the service answered; until then a write may go unseen, so
        // write until one is reported.
        let mut i = 0u32;
        loop {
            i += 1;
            let (status, _) = call(
                &app,
                "PUT",
                &format!("/v1/sessions/c/files/content?path=/workspace/w{i}.txt"),
                "x",
            )
            .await;
            assert_eq!(status, 204);
            if let Ok(Some(line)) =
                tokio::time::timeout(Duration::from_millis(300), printed.recv()).await
            {
                return line;
            }
        }
    };
    let line = tokio::time::timeout(Duration::from_secs(20), seen)
        .await
        .expect("the watch printed a change");
    assert!(
        line.starts_with("create /workspace/w") && line.ends_with(".txt"),
        "{line:?}"
    );
}

/// Ends a child process however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_new_routes_are_counted_by_route_template() {
    let app = app();
    start(
        &app,
        "m",
        json!({ "command": "echo", "args": ["x"], "tag": "t" }),
    )
    .await;
    let (status, _) = call(&app, "GET", "/v1/sessions/m/processes/t/attach?from=0", "").await;
    assert_eq!(status, 200);
    refused(
        &app,
        "GET",
        "/v1/sessions/m/processes/9999/attach",
        "",
        (404, "process_not_found"),
    )
    .await;
    let (status, _) = call(
        &app,
        "PUT",
        "/v1/sessions/m/files/stream?path=/workspace/s",
        "s",
    )
    .await;
    assert_eq!(status, 200);
    let (status, text) = call(&app, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(text).unwrap();
    for series in [
        r#"method="POST",route="/v1/sessions/{session}/processes",status="201""#,
        r#"method="GET",route="/v1/sessions/{session}/processes/{process}/attach",status="200""#,
        r#"method="GET",route="/v1/sessions/{session}/processes/{process}/attach",status="404""#,
        r#"method="PUT",route="/v1/sessions/{session}/files/stream",status="200""#,
    ] {
        assert!(text.contains(series), "no {series} in:\n{text}");
    }
}

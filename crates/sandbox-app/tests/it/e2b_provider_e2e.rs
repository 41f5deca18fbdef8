//! Sessions on the E2B backend, end to end through two real processes: A is `sandbox serve`
//! with `provider = "e2b"` (`support::e2b_backend`), B is `sandbox serve` serving the
//! E2B-compatible API over the Docker engine (`support::e2b::E2bServe`, Debian containers in
//! a namespace of its own). Everything a test asks goes through A's own HTTP API; B's engine
//! is asked directly how many sandboxes exist.
//!
//! - One session: an exec, a streamed upload and download of a few MiB (the bytes compared on
//!   both sides), a background process started, listed and its output attached to, a
//!   terminal over A's WebSocket echoing a marker. A second session gets a second sandbox on
//!   B (one per session), and destroying both sessions leaves B none.
//! - 50 concurrent first execs of one new session all succeed and make exactly one sandbox on
//!   B: the session layer's lifecycle lock holds across the E2B adapter too.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`)
//! and the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`).

// Needs the Docker backend (B), the E2B backend (A) and the E2B API (B) compiled in.
#![cfg(all(feature = "docker", feature = "e2b", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::support::e2b::E2bServe;
use crate::support::e2b_backend::{E2bBacked, metric_with};
use crate::support::{ReqBody, container_ids};

/// Generous: B's engine removes a deleted sandbox's container before its delete answers, but
/// a busy machine may lag.
const GONE_DEADLINE: Duration = Duration::from_secs(60);
/// A stream's next line or frame, on a busy machine.
const READ_DEADLINE: Duration = Duration::from_secs(60);
/// The streamed file: a few MiB and an odd tail, so no chunking lines up with it.
const FILE_BYTES: usize = 3 * 1024 * 1024 + 4099;
const CONCURRENT: usize = 50;

type Ws = WebSocketStream<TcpStream>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits until B's engine holds no container of B's namespace.
async fn wait_no_containers(b: &E2bServe, a: &E2bBacked) {
    let start = Instant::now();
    loop {
        let left = container_ids(&b.namespace).await;
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < GONE_DEADLINE,
            "B still holds {left:?} {GONE_DEADLINE:?} after both sessions were destroyed\n{}\n{}",
            a.context(),
            b.context()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `bytes` as a request body of many frames of uneven sizes.
fn streamed(bytes: &[u8]) -> ReqBody {
    let mut frames = Vec::new();
    let mut at = 0;
    let mut size = 1000;
    while at < bytes.len() {
        let end = (at + size).min(bytes.len());
        frames.push(Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(
            &bytes[at..end],
        ))));
        at = end;
        size = size * 3 + 7;
        if size > 512 * 1024 {
            size = 65_537;
        }
    }
    BodyExt::boxed(StreamBody::new(futures_util::stream::iter(frames)))
}

/// Dials A's terminal route with `ticket`.
async fn terminal(a: &E2bBacked, session: &str, ticket: &str) -> Ws {
    // A test client dialling the loopback service it spawned, not a tenant-supplied endpoint.
    #[allow(clippy::disallowed_methods)]
    let tcp = TcpStream::connect(a.addr).await.unwrap();
    let url = format!(
        "ws://{}/v1/sessions/{session}/terminal?ticket={ticket}",
        a.addr
    );
    match tokio_tungstenite::client_async(url, tcp).await {
        Ok((ws, _)) => ws,
        Err(e) => panic!("terminal handshake: {e}\n{}", a.context()),
    }
}

/// Reads the terminal's output until it holds `marker`; panics after [`READ_DEADLINE`] or
/// when the socket ends first.
async fn read_until(ws: &mut Ws, marker: &str) -> String {
    let mut output = String::new();
    let read = async {
        while !output.contains(marker) {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => output.push_str(&String::from_utf8_lossy(&b)),
                Some(Ok(Message::Close(frame))) => {
                    panic!("the terminal closed ({frame:?}) before {marker:?}: {output:?}")
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => panic!("the terminal ended before {marker:?}: {output:?}"),
            }
        }
    };
    tokio::time::timeout(READ_DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("no {marker:?} from the terminal within {READ_DEADLINE:?}"));
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn sessions_on_the_e2b_backend_exec_stream_files_run_processes_and_terminals() {
    let b = E2bServe::start("te2bpe").await;
    let a = E2bBacked::start(&b, &b.e2b, &[], "").await;
    assert!(
        container_ids(&b.namespace).await.is_empty(),
        "B holds nothing before the first call"
    );

    // ---- exec: the first call makes the session's sandbox on B ------------------------------
    assert_eq!(a.exec_ok("one", "echo", &["hi"]).await, "hi\n");
    let first = container_ids(&b.namespace).await;
    assert_eq!(
        first.len(),
        1,
        "one sandbox on B for the session: {first:?}"
    );
    let sandbox_one = a.bound_sandbox("one").await;
    let labelled = b.e2b_containers(&sandbox_one).await;
    assert!(
        labelled.len() == 1 && labelled[0].starts_with(&first[0]),
        "B's one container is the E2B sandbox {sandbox_one} A bound: {labelled:?} vs {first:?}"
    );

    // ---- a streamed upload and download round trip ------------------------------------------
    let content: Vec<u8> = (0..FILE_BYTES).map(|_| fastrand::u8(..)).collect();
    let sent = hex(&Sha256::digest(&content));
    let path = "/v1/sessions/one/files/stream?path=/workspace/big.bin";
    let (status, written) = a.raw("PUT", path, streamed(&content)).await;
    let written: Value = serde_json::from_slice(&written).unwrap_or(Value::Null);
    assert_eq!(status, 200, "upload: {written}\n{}", a.context());
    assert_eq!(written["bytes"], FILE_BYTES as u64, "{written}");
    let inside = a.exec_ok("one", "sha256sum", &["/workspace/big.bin"]).await;
    assert_eq!(
        inside.split_whitespace().next(),
        Some(sent.as_str()),
        "the sandbox's file differs from what was uploaded"
    );
    let (status, back) = a.raw("GET", path, crate::support::full(Bytes::new())).await;
    assert_eq!(status, 200, "download\n{}", a.context());
    assert_eq!(back.len(), FILE_BYTES, "the download's length");
    assert!(
        back.as_ref() == content.as_slice(),
        "the downloaded bytes differ from the uploaded ones"
    );

    // ---- a background process: started, listed, its output attached to ---------------------
    let (status, started) = a
        .call(
            "POST",
            "/v1/sessions/one/processes",
            &json!({"command": "echo proc-out-7; exec sleep 600", "shell": true, "tag": "bg"})
                .to_string(),
        )
        .await;
    assert_eq!(status, 201, "start: {started}\n{}", a.context());
    let pid = started["pid"].as_u64().unwrap();
    assert_eq!(started["tag"], "bg", "{started}");
    let (status, list) = a.call("GET", "/v1/sessions/one/processes", "").await;
    assert_eq!(status, 200, "list: {list}");
    let listed = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("process {pid} is not listed: {list}"));
    assert_eq!(
        (listed["tag"].as_str(), listed["state"].as_str()),
        (Some("bg"), Some("running")),
        "{listed}"
    );
    let request = hyper::Request::get(format!(
        "{}/v1/sessions/one/processes/bg/attach?from=0",
        a.base
    ))
    .header("authorization", format!("Bearer {}", a.token))
    .body(crate::support::full(Bytes::new()))
    .unwrap();
    let response = tokio::time::timeout(READ_DEADLINE, a.client.request(request))
        .await
        .expect("attach answered")
        .unwrap();
    assert_eq!(response.status(), 200, "attach");
    let mut body = response.into_body();
    let mut seen = String::new();
    let read = async {
        while !seen.contains("proc-out-7") {
            let frame = body
                .frame()
                .await
                .expect("the attach stream ended before the output")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                seen.push_str(&String::from_utf8_lossy(&data));
            }
        }
    };
    tokio::time::timeout(READ_DEADLINE, read)
        .await
        .unwrap_or_else(|_| panic!("no output attached within {READ_DEADLINE:?}: {seen:?}"));
    let line: Value = serde_json::from_str(seen.lines().next().unwrap()).unwrap();
    assert_eq!(
        (line["type"].as_str(), line["offset"].as_u64()),
        (Some("data"), Some(0)),
        "the replay starts at offset 0: {seen}"
    );
    drop(body);
    // Detaching left it running.
    let (_, list) = a.call("GET", "/v1/sessions/one/processes", "").await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"].as_u64() == Some(pid) && p["state"] == "running"),
        "the process runs on after the attach: {list}"
    );

    // ---- a terminal over A's WebSocket -------------------------------------------------------
    let (status, ticket) = a.call("POST", "/v1/sessions/one/terminal/ticket", "").await;
    assert_eq!(status, 200, "ticket: {ticket}\n{}", a.context());
    let mut ws = terminal(&a, "one", ticket["ticket"].as_str().unwrap()).await;
    // The quotes keep the echoed typed line from matching the marker.
    ws.send(Message::binary(b"echo ter\"\"m-mark-5\n".to_vec()))
        .await
        .unwrap();
    read_until(&mut ws, "term-mark-5").await;
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
    drop(ws);

    // ---- a second session: a second sandbox --------------------------------------------------
    assert_eq!(a.exec_ok("two", "echo", &["there"]).await, "there\n");
    let both = container_ids(&b.namespace).await;
    assert_eq!(both.len(), 2, "one sandbox per session on B: {both:?}");
    let sandbox_two = a.bound_sandbox("two").await;
    assert_ne!(sandbox_one, sandbox_two, "each session has its own sandbox");
    assert_eq!(
        a.bound_sandbox("one").await,
        sandbox_one,
        "the first session kept its sandbox"
    );
    let metrics = a.metrics().await;
    assert_eq!(
        metric_with(
            &metrics,
            "sandbox_session_resolves_total",
            "outcome",
            "created"
        ),
        2.0,
        "A created two sandboxes, no more: {metrics}"
    );

    // ---- destroy both: B holds none ----------------------------------------------------------
    for session in ["one", "two"] {
        let (status, v) = a
            .call("DELETE", &format!("/v1/sessions/{session}"), "")
            .await;
        assert_eq!(status, 204, "destroy {session}: {v}\n{}", a.context());
    }
    wait_no_containers(&b, &a).await;
    for session in ["one", "two"] {
        let (status, v) = a.call("GET", &format!("/v1/sessions/{session}"), "").await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (404, Some("no_live_sandbox")),
            "{session} is unbound: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn fifty_concurrent_first_execs_of_one_session_make_one_sandbox_on_b() {
    let b = E2bServe::start("te2bpc").await;
    // The default quota admits 32 commands at once per tenant; this test is about the
    // lifecycle lock, not the quota.
    let a = E2bBacked::start(&b, &b.e2b, &[], "[quotas]\nmax_concurrent_execs = 0\n").await;
    let before = container_ids(&b.namespace).await;
    assert!(before.is_empty(), "B holds nothing yet: {before:?}");

    let calls = (0..CONCURRENT).map(|i| {
        let a = &a;
        async move {
            let body = json!({"command": "echo", "args": [format!("n{i}")]}).to_string();
            (i, a.call("POST", "/v1/sessions/crowd/exec", &body).await)
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    for (i, (status, out)) in &answers {
        assert_eq!(
            (*status, out["exit_code"].as_i64()),
            (200, Some(0)),
            "exec {i}: {out}\n{}",
            a.context()
        );
        assert_eq!(out["stdout"], format!("n{i}\n"), "exec {i}: {out}");
    }
    let after = container_ids(&b.namespace).await;
    assert_eq!(
        after.len(),
        before.len() + 1,
        "{CONCURRENT} concurrent first execs made exactly one sandbox on B: {after:?}"
    );
    let listed = b.cp("GET", "/v2/sandboxes", &b.key_a, "").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let listed = listed.json();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "B's own listing holds one sandbox: {listed}"
    );
    let sandbox = a.bound_sandbox("crowd").await;
    assert_eq!(listed[0]["sandboxID"], sandbox.as_str(), "{listed}");
    let metrics = a.metrics().await;
    assert_eq!(
        metric_with(
            &metrics,
            "sandbox_session_resolves_total",
            "outcome",
            "created"
        ),
        1.0,
        "one resolve created, the others found it bound: {metrics}"
    );

    let (status, v) = a.call("DELETE", "/v1/sessions/crowd", "").await;
    assert_eq!(status, 204, "{v}");
    wait_no_containers(&b, &a).await;
}

//! The listener's limits and the in-flight budget, hermetic (the in-memory fake provider behind
//! the real router and the real listener on a loopback port): a stalled body is 408, a
//! keep-alive connection carries at most its request limit, connections beyond the cap wait,
//! a spent budget is 503 with `Retry-After`, and an unauthenticated body is refused unread.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sandbox_app::auth::{TenantAuth, digest, hex};
use sandbox_app::config::Limits;
use sandbox_app::http::body::InflightBudget;
use sandbox_app::http::metrics::Metrics;
use sandbox_app::http::{AppState, router};
use sandbox_app::server::{ServerLimits, serve};
use sandbox_core::{ConfigId, CreateRequest, PermissiveSessionExistence, SandboxProvider};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::SessionManager;
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::fake::FakeProvider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "token-limits";

fn state(limits: Limits) -> AppState {
    state_on(limits, FakeProvider::new())
}

fn state_on(limits: Limits, fake: sandbox_core::Checked<FakeProvider>) -> AppState {
    let provider: Arc<dyn SandboxProvider> = Arc::new(fake);
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
    .unwrap();
    AppState {
        auth: Arc::new(TenantAuth::new([(3, hex(&digest(TOKEN)).as_str())]).unwrap()),
        manager: SessionManager::new(lifecycle),
        provider,
        metrics: Arc::new(Metrics::new()),
        budget: InflightBudget::new(limits.inflight_max_bytes),
        limits,
        tickets: Arc::new(sandbox_app::tickets::TerminalTickets::default()),
        store: sandbox_app::http::StoreInfo::memory(),
    }
}

async fn start(limits: Limits, server: ServerLimits) -> SocketAddr {
    start_state(state(limits), server).await
}

async fn start_state(state: AppState, server: ServerLimits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        router(state),
        server,
        std::future::pending(),
    ));
    addr
}

#[expect(
    clippy::disallowed_methods,
    reason = "a test dialling its own loopback service"
)]
async fn dial(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// Reads until the peer closes (or `within` passes); everything read.
async fn read_to_close(c: &mut TcpStream, within: Duration) -> (String, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = tokio::time::timeout(within, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

fn exec_head(len: usize, token: Option<&str>) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST /v1/sessions/s/exec HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_stalled_body_is_408() {
    let server = ServerLimits {
        body_idle_timeout: Duration::from_secs(1),
        ..ServerLimits::default()
    };
    let addr = start(Limits::default(), server).await;
    let mut c = dial(addr).await;
    c.write_all(exec_head(100, Some(TOKEN)).as_bytes())
        .await
        .unwrap();
    c.write_all(br#"{"command":"#).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
        .await
        .expect("a stalled body was never answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
}

#[tokio::test]
async fn a_connection_carries_at_most_its_request_limit() {
    let server = ServerLimits {
        max_requests_per_connection: 3,
        ..ServerLimits::default()
    };
    let addr = start(Limits::default(), server).await;
    let mut c = dial(addr).await;
    for _ in 0..4 {
        // Pipelined: the fourth is never answered, the connection closes after the third.
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
    }
    let (answers, closed) = read_to_close(&mut c, Duration::from_secs(20)).await;
    assert!(closed, "the connection stayed open past its limit");
    assert_eq!(answers.matches("HTTP/1.1 200").count(), 3, "{answers}");
    assert!(
        answers.to_ascii_lowercase().contains("connection: close"),
        "{answers}"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let server = ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    };
    let addr = start(Limits::default(), server).await;
    let (mut a, _b) = (dial(addr).await, dial(addr).await);
    // Both slots are taken by silent connections; the third's request waits in the backlog.
    let mut third = dial(addr).await;
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(800), third.read(&mut buf))
            .await
            .is_err(),
        "a connection beyond the cap was served"
    );
    a.shutdown().await.unwrap();
    drop(a);
    let (answer, _) = read_to_close(&mut third, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_spent_budget_is_503_with_retry_after() {
    let limits = Limits {
        upload_max_bytes: 1 << 20,
        json_max_bytes: 1 << 20,
        inflight_max_bytes: 2 << 20,
        ..Limits::default()
    };
    let addr = start(limits, ServerLimits::default()).await;
    let upload = |session: &str| {
        format!(
            "PUT /v1/sessions/{session}/files/content?path=/workspace/f HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
            1 << 20
        )
    };
    // Two uploads that declared a whole MiB each hold the budget while their bodies trickle.
    let mut held = Vec::new();
    for session in ["a", "b"] {
        let mut c = dial(addr).await;
        c.write_all(upload(session).as_bytes()).await.unwrap();
        c.write_all(b"some").await.unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = dial(addr).await;
    c.write_all(upload("c").as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("server_busy"), "{answer}");
    // When they are done (here: gone), the budget is back.
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = dial(addr).await;
    c.write_all(upload("d").as_bytes()).await.unwrap();
    c.write_all(&vec![b'x'; 1 << 20]).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
}

#[tokio::test]
async fn an_unauthenticated_body_is_refused_unread() {
    let addr = start(Limits::default(), ServerLimits::default()).await;
    for token in [None, Some("wrong")] {
        let mut c = dial(addr).await;
        // The head alone: the answer must come without the body being sent.
        c.write_all(exec_head(7 << 20, token).as_bytes())
            .await
            .unwrap();
        let (answer, closed) = read_to_close(&mut c, Duration::from_secs(20)).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(answer.contains("\"unauthorized\""), "{answer}");
        assert!(closed, "the connection of an unread body must close");
    }
    // A lower-case scheme is the same credential.
    let mut c = dial(addr).await;
    c.write_all(
        format!(
            "GET /v1/sessions/s HTTP/1.1\r\nHost: x\r\nAuthorization: bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (answer, _) = read_to_close(&mut c, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains("no_live_sandbox"), "{answer}");
}

#[tokio::test]
async fn health_answers_reason_codes_only() {
    let fake = FakeProvider::new();
    // An engine error with an address in it: it must reach the log, never an anonymous caller.
    fake.fail_always(
        sandbox_testkit::fake::FakeOp::Health,
        sandbox_core::Error::unavailable(
            sandbox_core::Operation::HEALTH,
            "connect unix:///var/run/docker.sock: connection refused (10.1.2.3)",
        ),
    );
    let addr = start_state(state_on(Limits::default(), fake), ServerLimits::default()).await;
    let mut c = dial(addr).await;
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_to_close(&mut c, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["reason"], "backend_unavailable", "{v}");
    assert!(
        !body.contains("docker.sock") && !body.contains("10.1.2.3"),
        "{body}"
    );
}

//! The pooled, guarded client against a loopback server this test runs: control-plane requests
//! go where they say, data-plane requests reach the gateway (never the host they name, which
//! does not even resolve) with Host kept and the inbound token added; a refusal by the guard
//! comes back as `unsafe_outbound_url`; a redirect is handed back, not followed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use http_body_util::Empty;
use hyper::Request;
use hyper::body::Bytes;
use sandbox_core::{ErrorCode, Secret};
use sandbox_transport::gateway::{Gateway, GatewayTarget, InboundTokens, TRAFFIC_TOKEN_HEADER};
use sandbox_transport::{GuardedClient, GuardedConnector, OutboundPolicy, Resolve, TcpDialer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Any DNS lookup fails the test: every host here is a literal or routed to the gateway.
#[derive(Debug)]
struct NoDns;

#[async_trait]
impl Resolve for NoDns {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        panic!("unexpected DNS lookup of {host}")
    }
}

/// A loopback HTTP/1.1 server recording each request head; `/redirect` answers 302 to the
/// metadata address.
async fn server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).to_lowercase();
                let reply: &[u8] = if head.starts_with("get /redirect") {
                    b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                };
                seen.lock().unwrap().push(head);
                let _ = s.write_all(reply).await;
            });
        }
    });
    (port, heads)
}

fn client(policy: OutboundPolicy, port: u16) -> GuardedClient<Empty<Bytes>> {
    let target = GatewayTarget::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let tokens = InboundTokens::default();
    tokens.put("sbx1", &Secret::new("tok-sbx1"));
    let gateway = Gateway::new(Some("api.sandboxes.test"), Some(target.clone()), tokens);
    let guard = GuardedConnector::with(policy, Arc::new(NoDns), Arc::new(TcpDialer::default()));
    GuardedClient::new(guard, gateway, Some(target))
}

fn get(uri: &str) -> Request<Empty<Bytes>> {
    Request::builder().uri(uri).body(Empty::new()).unwrap()
}

#[tokio::test]
async fn planes_reach_the_right_place_and_the_guard_has_the_last_word() {
    let (port, heads) = server().await;
    let c = client(OutboundPolicy::allow_private(), port);

    // Control plane: where the URL says.
    let resp = c
        .request(&get(&format!("http://127.0.0.1:{port}/health")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // Data plane: the host does not resolve anywhere; the gateway gets it, Host intact, token
    // added.
    let original = get("http://49983-sbx1.sandboxes.test/files?path=%2Fworkspace%2Fa");
    let resp = c.request(&original).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        original.headers().is_empty(),
        "the caller's request is untouched"
    );
    {
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 2);
        assert!(heads[0].starts_with("get /health "), "{}", heads[0]);
        assert!(
            heads[1].starts_with("get /files?path=%2fworkspace%2fa "),
            "{}",
            heads[1]
        );
        assert!(
            heads[1].contains("host: 49983-sbx1.sandboxes.test\r\n"),
            "{}",
            heads[1]
        );
        assert!(
            heads[1].contains(&format!("{TRAFFIC_TOKEN_HEADER}: tok-sbx1\r\n")),
            "{}",
            heads[1]
        );
    }

    // A redirect is the caller's to judge: not followed to the metadata address.
    let resp = c
        .request(&get(&format!("http://127.0.0.1:{port}/redirect")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 302);
    assert_eq!(heads.lock().unwrap().len(), 3);

    // Deny-private: the same requests are refused before any connection.
    let denied = client(OutboundPolicy::deny_private(), port);
    for uri in [
        format!("http://127.0.0.1:{port}/health"),
        "http://49983-sbx1.sandboxes.test/files".to_owned(),
    ] {
        let e = denied.request(&get(&uri)).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{uri}: {e}");
    }
    assert_eq!(heads.lock().unwrap().len(), 3, "nothing reached the server");
}

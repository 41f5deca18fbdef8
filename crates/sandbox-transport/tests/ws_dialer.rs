//! The WebSocket dialer against loopback servers this test runs: a data-plane URL reaches the
//! gateway with its Host kept and the inbound token added (a caller's header wins), the
//! subprotocol is `binary` and a server that does not agree to it is refused, and the guard
//! refuses before any connection under deny-private.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures_util::{SinkExt as _, StreamExt as _};
use hyper::header::HeaderMap;
use sandbox_core::{ErrorCode, Secret};
use sandbox_transport::gateway::{Gateway, GatewayTarget, InboundTokens};
use sandbox_transport::{
    GuardedConnector, OutboundPolicy, Resolve, TcpDialer, WsDialer, tls_config,
};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

#[derive(Debug)]
struct NoDns;

#[async_trait]
impl Resolve for NoDns {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        panic!("unexpected DNS lookup of {host}")
    }
}

/// A WebSocket echo server recording each upgrade's headers; it agrees to `binary` only when
/// `agree` is set.
async fn ws_server(agree: bool) -> (u16, Arc<Mutex<Vec<HeaderMap>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                // tungstenite's callback signature returns its large error type by value.
                #[allow(clippy::result_large_err)]
                let callback = |req: &Request, mut resp: Response| {
                    record.lock().unwrap().push(req.headers().clone());
                    if agree {
                        resp.headers_mut()
                            .insert("sec-websocket-protocol", "binary".parse().unwrap());
                    }
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
                    return;
                };
                while let Some(Ok(msg)) = ws.next().await {
                    if msg.is_binary() && ws.send(msg).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

fn dialer(policy: OutboundPolicy, gateway_port: u16) -> WsDialer {
    let target = GatewayTarget::parse(&format!("http://127.0.0.1:{gateway_port}")).unwrap();
    let tokens = InboundTokens::default();
    tokens.put("sbx1", &Secret::new("tok-sbx1"));
    let gateway = Gateway::new(Some("api.sandboxes.test"), Some(target.clone()), tokens);
    let guard = GuardedConnector::with(policy, Arc::new(NoDns), Arc::new(TcpDialer::default()));
    // Plain ws only here; a CA nobody uses keeps the config valid without system roots.
    let ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap()
        .pem();
    WsDialer::new(
        guard,
        gateway,
        Some(target),
        tls_config(false, &[ca.as_bytes()]).unwrap(),
    )
}

#[tokio::test]
async fn a_data_plane_socket_reaches_the_gateway_with_binary_and_the_token() {
    let (port, seen) = ws_server(true).await;
    let d = dialer(OutboundPolicy::allow_private(), port);
    let mut ws = d
        .dial("ws://49983-sbx1.sandboxes.test/desktop", &HeaderMap::new())
        .await
        .unwrap();
    ws.send(Message::Binary(vec![1u8, 2, 3].into()))
        .await
        .unwrap();
    let echo = ws.next().await.unwrap().unwrap();
    assert_eq!(echo.into_data().as_ref(), [1, 2, 3]);
    {
        let seen = seen.lock().unwrap();
        let h = &seen[0];
        assert_eq!(h["host"], "49983-sbx1.sandboxes.test");
        assert_eq!(h["sec-websocket-protocol"], "binary");
        assert_eq!(h["e2b-traffic-access-token"], "tok-sbx1");
    }

    // The caller's own token wins.
    let mut mine = HeaderMap::new();
    mine.insert("e2b-traffic-access-token", "callers".parse().unwrap());
    d.dial("ws://49983-sbx1.sandboxes.test/desktop", &mine)
        .await
        .unwrap();
    assert_eq!(
        seen.lock().unwrap()[1]["e2b-traffic-access-token"],
        "callers"
    );
}

#[tokio::test]
async fn a_server_that_does_not_agree_to_binary_is_refused() {
    let (port, _) = ws_server(false).await;
    let d = dialer(OutboundPolicy::allow_private(), port);
    let e = d
        .dial(&format!("ws://127.0.0.1:{port}/"), &HeaderMap::new())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("binary") || e.to_string().to_lowercase().contains("protocol"),
        "{e}"
    );
}

#[tokio::test]
async fn the_guard_refuses_before_any_connection() {
    let (port, seen) = ws_server(true).await;
    let d = dialer(OutboundPolicy::deny_private(), port);
    for url in [
        format!("ws://127.0.0.1:{port}/"),
        "ws://49983-sbx1.sandboxes.test/desktop".to_owned(),
        "ws://[::ffff:169.254.169.254]/".to_owned(),
    ] {
        let e = d.dial(&url, &HeaderMap::new()).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::UnsafeOutboundUrl), "{url}: {e}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

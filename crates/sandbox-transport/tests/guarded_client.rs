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
use sandbox_core::{ErrorCode, Origin, Secret};
use sandbox_transport::gateway::{Gateway, GatewayTarget, InboundTokens, TRAFFIC_TOKEN_HEADER};
use sandbox_transport::{
    GuardedClient, GuardedConnector, OutboundPolicy, Resolve, TcpDialer, tls_config,
};
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
    // No system roots: nothing here is public, and the test must not depend on the host's.
    let tls = tls_config(false, &[TEST_CA_UNUSED.as_bytes()]).unwrap();
    GuardedClient::new(guard, gateway, Some(target), tls)
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
        // No provider claimed it here: the refusal is the transport's.
        assert_eq!(e.origin(), Origin::Transport, "{uri}: {e}");
    }
    assert_eq!(heads.lock().unwrap().len(), 3, "nothing reached the server");
}

/// A CA nobody signed anything with, for clients that speak plain HTTP only.
static TEST_CA_UNUSED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| make_ca().0);

/// A CA (its PEM and its issuer).
fn make_ca() -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sandbox-transport test CA");
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), rcgen::Issuer::new(params, key))
}

/// A loopback TLS server with a certificate for 127.0.0.1 and `*.sandboxes.test`, signed by
/// `ca`; it records request heads and answers 200.
async fn tls_server(ca: &rcgen::Issuer<'static, rcgen::KeyPair>) -> (u16, Arc<Mutex<Vec<String>>>) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "*.sandboxes.test".to_owned()])
            .unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    seen.lock().unwrap().push("tls handshake failed".to_owned());
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).to_lowercase());
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, heads)
}

#[tokio::test]
async fn tls_to_the_control_plane_and_through_an_https_gateway() {
    let (ca_pem, ca) = make_ca();
    let (port, heads) = tls_server(&ca).await;
    let target = GatewayTarget::parse(&format!("https://127.0.0.1:{port}")).unwrap();
    let tokens = InboundTokens::default();
    tokens.put("sbx1", &Secret::new("tok-sbx1"));
    let gateway = Gateway::new(Some("api.sandboxes.test"), Some(target.clone()), tokens);
    let guard = || {
        GuardedConnector::with(
            OutboundPolicy::allow_private(),
            Arc::new(NoDns),
            Arc::new(TcpDialer::default()),
        )
    };
    let trusted = GuardedClient::new(
        guard(),
        gateway.clone(),
        Some(target.clone()),
        tls_config(false, &[ca_pem.as_bytes()]).unwrap(),
    );
    let resp = trusted
        .request(&get(&format!("https://127.0.0.1:{port}/health")))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // The data host is verified against the gateway's certificate (SNI is the data host).
    let resp = trusted
        .request(&get("https://49983-sbx1.sandboxes.test/files"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    {
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(
            heads[1].contains("host: 49983-sbx1.sandboxes.test\r\n"),
            "{}",
            heads[1]
        );
        assert!(
            heads[1].contains("e2b-traffic-access-token: tok-sbx1\r\n"),
            "{}",
            heads[1]
        );
    }

    // A client that does not trust the CA refuses the server.
    let (other_pem, _) = make_ca();
    let untrusting = GuardedClient::new(
        guard(),
        gateway,
        Some(target),
        tls_config(false, &[other_pem.as_bytes()]).unwrap(),
    );
    let e = untrusting
        .request(&get(&format!("https://127.0.0.1:{port}/health")))
        .await
        .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    assert_eq!(
        heads
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h.starts_with("get "))
            .count(),
        2,
        "nothing was sent over the refused connection"
    );
}

#[test]
fn tls_settings_refuse_empty_trust() {
    assert!(tls_config(false, &[]).is_err());
    assert!(tls_config(false, &[b"not a pem".as_slice()]).is_err());
}

//! The process-wide pool: configs naming the same gateway share one connection pool, each
//! gateway endpoint gets its own, and every client of a pool reads the pool's one token
//! registry (a second pool's registry is separate). Loopback servers only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{Empty, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sandbox_core::Secret;
use sandbox_transport::gateway::{GatewayTarget, TRAFFIC_TOKEN_HEADER};
use sandbox_transport::{GatewayPool, GuardedConnector, OutboundPolicy, tls_config};

/// `(Host, inbound token)` of each request, in order.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// A loopback HTTP/1.1 server counting connections and recording `(host, token)` per request.
struct Counted {
    port: u16,
    connections: Arc<AtomicUsize>,
    seen: Seen,
}

async fn server() -> Counted {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let (c, s) = (connections.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let header = |name: &str| {
                            req.headers()
                                .get(name)
                                .map(|v| v.to_str().unwrap().to_owned())
                        };
                        s.lock()
                            .unwrap()
                            .push((header("host").unwrap(), header(TRAFFIC_TOKEN_HEADER)));
                        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok")))) }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Counted {
        port,
        connections,
        seen,
    }
}

fn new_pool() -> GatewayPool<Empty<Bytes>> {
    // No system roots (nothing here is public); a throwaway CA keeps the TLS config valid.
    let ca = rcgen::generate_simple_self_signed(vec!["unused.test".to_owned()]).unwrap();
    let tls = tls_config(false, &[ca.cert.pem().as_bytes()]).unwrap();
    GatewayPool::new(GuardedConnector::new(OutboundPolicy::allow_private()), tls)
}

/// Sends `uri` and reads the answer to its end (an unread body keeps its connection out of
/// the pool).
async fn fetch(client: &sandbox_transport::GuardedClient<Empty<Bytes>>, uri: &str) -> u16 {
    use http_body_util::BodyExt;
    let r = client.request(&get(uri)).await.unwrap();
    let status = r.status().as_u16();
    r.into_body().collect().await.unwrap();
    status
}

fn get(uri: &str) -> Request<Empty<Bytes>> {
    Request::builder().uri(uri).body(Empty::new()).unwrap()
}

fn target(port: u16) -> GatewayTarget {
    GatewayTarget::parse(&format!("http://127.0.0.1:{port}")).unwrap()
}

#[tokio::test]
async fn configs_on_one_gateway_share_its_pool_and_the_pools_tokens() {
    let (a, b) = (server().await, server().await);
    let pool = new_pool();
    pool.tokens().put("sbx1", &Secret::new("tok-1"));

    // Two tenants' configs naming the same gateway.
    let first = pool.client_for(Some("api.one.test"), Some(&target(a.port)));
    let second = pool.client_for(Some("api.two.test"), Some(&target(a.port)));
    assert_eq!(pool.gateway_pools(), 1);
    assert_eq!(fetch(&first, "http://49983-sbx1.cube.test/x").await, 200);
    assert_eq!(fetch(&second, "http://49983-sbx1.cube.test/y").await, 200);
    // The second config's request to the same sandbox rode the first's connection. (Within a
    // gateway's pool, connections are kept per sandbox host: over TLS the host is the SNI name,
    // and on HTTP/2 the authority, so they cannot be shared across sandboxes.)
    assert_eq!(a.connections.load(Ordering::SeqCst), 1);
    assert_eq!(fetch(&second, "http://49983-sbx2.cube.test/z").await, 200);
    assert_eq!(a.connections.load(Ordering::SeqCst), 2);
    assert_eq!(
        a.seen.lock().unwrap().clone(),
        [
            ("49983-sbx1.cube.test".to_owned(), Some("tok-1".to_owned())),
            ("49983-sbx1.cube.test".to_owned(), Some("tok-1".to_owned())),
            ("49983-sbx2.cube.test".to_owned(), None),
        ]
    );

    // A token put after the clients were made is still seen: one registry per pool.
    pool.tokens().put("sbx2", &Secret::new("tok-2"));
    assert_eq!(fetch(&first, "http://49983-sbx2.cube.test/z").await, 200);
    assert_eq!(a.seen.lock().unwrap()[3].1.as_deref(), Some("tok-2"));
    assert_eq!(a.connections.load(Ordering::SeqCst), 2);

    // Another gateway endpoint gets its own pool.
    let third = pool.client_for(Some("api.one.test"), Some(&target(b.port)));
    assert_eq!(pool.gateway_pools(), 2);
    assert_eq!(fetch(&third, "http://49983-sbx1.cube.test/w").await, 200);
    assert_eq!(b.connections.load(Ordering::SeqCst), 1);
    assert_eq!(b.seen.lock().unwrap()[0].1.as_deref(), Some("tok-1"));

    // A second pool (the other outbound policy) has a registry of its own.
    let other = new_pool();
    let stranger = other.client_for(Some("api.one.test"), Some(&target(a.port)));
    assert_eq!(fetch(&stranger, "http://49983-sbx1.cube.test/v").await, 200);
    assert_eq!(a.seen.lock().unwrap().last().unwrap().1, None);
    assert_eq!(
        a.connections.load(Ordering::SeqCst),
        3,
        "pools never share connections"
    );
}

#[tokio::test]
async fn without_a_gateway_everything_rides_the_control_pool() {
    let a = server().await;
    let pool = new_pool();
    let client = pool.client_for(None, None);
    let url = format!("http://127.0.0.1:{}/v1/sandboxes", a.port);
    assert_eq!(fetch(&client, &url).await, 200);
    assert_eq!(fetch(&client, &url).await, 200);
    assert_eq!(pool.gateway_pools(), 0);
    assert_eq!(a.connections.load(Ordering::SeqCst), 1);
}

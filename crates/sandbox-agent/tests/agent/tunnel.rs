//! The tunnel extension against a loopback echo server: the HTTP/1.1 upgrade and the HTTP/2
//! duplex stream carry bytes exactly and honour half-close; the limit, bad ports, closed ports
//! and the token are refused with their codes.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sandbox_agent::connect::BoxError;
use sandbox_transport::envd::HttpVersion;
use sandbox_transport::{GuardedConnector, OutboundPolicy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::{BOTH, TOKEN, TestAgent, body_bytes, eventually, raw_client};

const WAIT: Duration = Duration::from_secs(20);

/// A loopback server that sends back what it reads, and closes its side once the client has
/// closed its own (so a half-close must reach it for the echo to end).
async fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.into_split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
                let _ = write.shutdown().await;
            });
        }
    });
    port
}

#[expect(
    clippy::disallowed_methods,
    reason = "a test dialling its own loopback agent"
)]
async fn dial(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// Sends an upgrade request for `/sandbox-agent/tunnel/<port>` and reads the answer's head.
/// Returns the status, the head, and the connection (positioned after the head).
async fn upgrade(addr: SocketAddr, port: &str, token: Option<&str>) -> (u16, String, TcpStream) {
    let mut stream = dial(addr).await;
    let token = token.map_or(String::new(), |t| format!("X-Access-Token: {t}\r\n"));
    let head = format!(
        "GET /sandbox-agent/tunnel/{port} HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\n\
         Upgrade: sandbox-tunnel\r\n{token}\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Byte by byte: nothing past the head may be consumed here.
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\n") {
        let b = stream.read_u8().await.unwrap();
        got.push(b);
        assert!(got.len() < 16 * 1024, "an endless head");
    }
    let head = String::from_utf8(got).unwrap();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    (status, head, stream)
}

/// The Connect-style error body after an upgrade was refused (its length from the head).
async fn refused_body(head: &str, stream: &mut TcpStream) -> serde_json::Value {
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .expect("a content-length");
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i >> 11) as u8)
        .collect()
}

/// Writes `data` then half-closes, while reading everything back until the far end closes.
async fn round_trip(stream: TcpStream, data: &[u8]) -> Vec<u8> {
    let (mut read, mut write) = stream.into_split();
    let data = data.to_vec();
    let writer = tokio::spawn(async move {
        write.write_all(&data).await.unwrap();
        write.shutdown().await.unwrap();
        write
    });
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, read.read_to_end(&mut back))
        .await
        .expect("the echo ends after the half-close")
        .unwrap();
    drop(writer.await.unwrap());
    back
}

#[tokio::test]
async fn an_upgraded_tunnel_carries_4_mib_exactly_and_passes_the_half_close() {
    let port = echo_server().await;
    let agent = TestAgent::start().await;
    let (status, head, stream) = upgrade(agent.addr, &port.to_string(), Some(TOKEN)).await;
    assert_eq!(status, 101, "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("upgrade: sandbox-tunnel"), "{head}");
    assert_eq!(agent.agent.tunnels().open(), 1);
    let data = pattern(4 << 20);
    let back = round_trip(stream, &data).await;
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the bytes differ");
    eventually(WAIT, "the tunnel to close", || {
        agent.agent.tunnels().open() == 0
    })
    .await;
}

/// An HTTP/2 client whose request bodies are fed through a channel.
fn streaming_client() -> Client<GuardedConnector, http_body_util::channel::Channel<Bytes, BoxError>>
{
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(true);
    builder.build(GuardedConnector::new(OutboundPolicy::allow_private()))
}

#[tokio::test]
async fn an_h2_tunnel_is_full_duplex() {
    let port = echo_server().await;
    let agent = TestAgent::start().await;
    let client = streaming_client();
    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
    let request = Request::post(format!("{}/sandbox-agent/tunnel/{port}", agent.url()))
        .header("x-access-token", TOKEN)
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(WAIT, client.request(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    let mut answer = response.into_body();
    let data = pattern(4 << 20);
    // Each chunk's echo is read before the next chunk is sent: the answer streams while the
    // request is still open.
    for chunk in data.chunks(64 * 1024) {
        sender
            .send_data(Bytes::copy_from_slice(chunk))
            .await
            .unwrap();
        let mut echoed = Vec::new();
        while echoed.len() < chunk.len() {
            let frame = tokio::time::timeout(WAIT, answer.frame())
                .await
                .expect("the echo arrives while the request is open")
                .expect("the answer goes on")
                .unwrap();
            if let Ok(bytes) = frame.into_data() {
                echoed.extend_from_slice(&bytes);
            }
        }
        assert!(echoed == chunk, "a chunk came back different");
    }
    assert_eq!(agent.agent.tunnels().open(), 1);
    // A last chunk, and at once the end of the request body (a half-close toward the port):
    // its echo still comes back, then the echo server closes, which ends the answer.
    let last = pattern(100_000);
    sender.send_data(Bytes::from(last.clone())).await.unwrap();
    drop(sender);
    let rest = tokio::time::timeout(WAIT, answer.collect())
        .await
        .expect("the answer ends after the half-close")
        .unwrap()
        .to_bytes();
    assert_eq!(rest.len(), last.len());
    assert!(rest == last, "the last chunk came back different");
    eventually(WAIT, "the tunnel to close", || {
        agent.agent.tunnels().open() == 0
    })
    .await;
}

#[tokio::test]
async fn the_limit_answers_429_until_a_tunnel_closes() {
    let port = echo_server().await.to_string();
    let agent = TestAgent::with(|c| c.max_tunnels = 2).await;
    let (s1, _, first) = upgrade(agent.addr, &port, Some(TOKEN)).await;
    let (s2, _, second) = upgrade(agent.addr, &port, Some(TOKEN)).await;
    assert_eq!((s1, s2), (101, 101));
    let (status, head, mut third) = upgrade(agent.addr, &port, Some(TOKEN)).await;
    assert_eq!(status, 429, "{head}");
    let body = refused_body(&head, &mut third).await;
    assert_eq!(body["code"], "resource_exhausted", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("--max-tunnels"),
        "{body}"
    );
    // Over HTTP/2 too.
    let raw = raw_client(HttpVersion::Http2);
    let response = raw.request(post(&agent, &port, Some(TOKEN))).await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);

    // The first one ends (both halves closed): a new tunnel fits again.
    assert_eq!(round_trip(first, b"bye").await, b"bye");
    eventually(WAIT, "a tunnel to close", || {
        agent.agent.tunnels().open() == 1
    })
    .await;
    let (status, head, again) = upgrade(agent.addr, &port, Some(TOKEN)).await;
    assert_eq!(status, 101, "{head}");
    assert_eq!(round_trip(again, b"again").await, b"again");
    assert_eq!(round_trip(second, b"two").await, b"two");
    eventually(WAIT, "every tunnel to close", || {
        agent.agent.tunnels().open() == 0
    })
    .await;
}

fn post(agent: &TestAgent, port: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::post(format!("{}/sandbox-agent/tunnel/{port}", agent.url()));
    if let Some(token) = token {
        request = request.header("x-access-token", token);
    }
    request.body(Full::default()).unwrap()
}

async fn error_of(response: hyper::Response<hyper::body::Incoming>) -> (StatusCode, String) {
    let status = response.status();
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    assert!(body["message"].is_string(), "{body}");
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn bad_ports_closed_ports_and_missing_tokens_are_refused() {
    let agent = TestAgent::start().await;
    // A port nobody listens on: bound, then released.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    };
    let own = agent.agent.config().listen.port().to_string();
    for http in BOTH {
        let raw = raw_client(http);
        for port in ["0", "65536", "http", "-1", "", own.as_str()] {
            let response = raw.request(post(&agent, port, Some(TOKEN))).await.unwrap();
            assert_eq!(
                error_of(response).await,
                (StatusCode::BAD_REQUEST, "invalid_argument".to_owned()),
                "port {port:?}"
            );
        }
        let response = raw
            .request(post(&agent, &closed.to_string(), Some(TOKEN)))
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (StatusCode::BAD_GATEWAY, "unavailable".to_owned())
        );
        // Without the token: envd's 401, before anything is dialled.
        let response = raw.request(post(&agent, "80", None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        // A GET that asks for no upgrade, and another method.
        let response = raw
            .request(
                Request::get(format!("{}/sandbox-agent/tunnel/80", agent.url()))
                    .header("x-access-token", TOKEN)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(
            error_of(response).await,
            (StatusCode::BAD_REQUEST, "invalid_argument".to_owned())
        );
        let response = raw
            .request(
                Request::put(format!("{}/sandbox-agent/tunnel/80", agent.url()))
                    .header("x-access-token", TOKEN)
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    // The upgrade path refuses the same way.
    let (status, _, _) = upgrade(agent.addr, "1234", None).await;
    assert_eq!(status, 401);
    let (status, head, mut stream) = upgrade(agent.addr, &closed.to_string(), Some(TOKEN)).await;
    assert_eq!(status, 502, "{head}");
    assert_eq!(
        refused_body(&head, &mut stream).await["code"],
        "unavailable"
    );
    assert_eq!(agent.agent.tunnels().open(), 0, "refusals hold no tunnel");
}

/// A loopback server that writes as fast as it is let to, counting the bytes it got rid of.
async fn flood_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&sent);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = std::sync::Arc::clone(&counter);
            tokio::spawn(async move {
                let chunk = vec![7u8; 64 * 1024];
                while stream.write_all(&chunk).await.is_ok() {
                    counter.fetch_add(chunk.len(), Ordering::Relaxed);
                }
            });
        }
    });
    (port, sent)
}

/// Far below what an unbounded queue would take in on loopback within the wait, far above
/// what the socket buffers, the HTTP/2 windows and the tunnel's own chunks hold.
const HELD_BOUND: usize = 48 << 20;

#[tokio::test]
async fn a_client_that_never_reads_holds_the_port_back_and_leaving_ends_the_tunnel() {
    use std::sync::atomic::Ordering;
    let agent = TestAgent::start().await;

    // HTTP/2: the answer is never read.
    let (port, sent) = flood_server().await;
    let raw = raw_client(HttpVersion::Http2);
    let response = raw
        .request(post(&agent, &port.to_string(), Some(TOKEN)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = sent.load(Ordering::Relaxed);
    assert!(held > 0 && held < HELD_BOUND, "{held} bytes left the port");
    // Reading lets it flow again.
    let mut body = response.into_body();
    let mut read = 0;
    while read < 2 * held {
        let frame = tokio::time::timeout(WAIT, body.frame())
            .await
            .unwrap()
            .unwrap();
        read += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    // Leaving (dropping the answer) ends the tunnel, though the port never stops.
    drop(body);
    eventually(WAIT, "the h2 tunnel to close", || {
        agent.agent.tunnels().open() == 0
    })
    .await;

    // HTTP/1.1 upgrade: the connection is never read.
    let (port, sent) = flood_server().await;
    let (status, head, stream) = upgrade(agent.addr, &port.to_string(), Some(TOKEN)).await;
    assert_eq!(status, 101, "{head}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = sent.load(Ordering::Relaxed);
    assert!(held > 0 && held < HELD_BOUND, "{held} bytes left the port");
    drop(stream);
    eventually(WAIT, "the upgraded tunnel to close", || {
        agent.agent.tunnels().open() == 0
    })
    .await;
}

//! `EnvdClient::forward` against an in-process HTTP/2 server reached over in-memory pipes (a
//! relay stream's stand-in, as the Docker channel's h2c): bodies larger than every flow-control
//! window arrive exact both ways, a reader that does not read stalls the writer, hop-by-hop
//! headers stay behind, trailers come back, and refused forms never reach the server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test file: a failed unwrap is a failed test.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sandbox_core::Secret;
use sandbox_transport::RelayConnector;
use sandbox_transport::connector::BoxError;
use sandbox_transport::envd::{EnvdClient, EnvdConfig, ForwardBody, HttpVersion};
use tokio::io::DuplexStream;
use tokio::sync::{Notify, mpsc};

type Client = EnvdClient<RelayConnector<DuplexStream>>;

/// The test server's state: how many requests reached it, and the gate `/hold` waits on.
#[derive(Default)]
struct State {
    requests: AtomicUsize,
    release: Notify,
}

type ServerBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

fn boxed<B>(body: B) -> ServerBody
where
    B: hyper::body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// The server's routes:
/// - `/echo`: the request body back, streamed as it arrives;
/// - `/headers`: the request's version, authority and headers, one `name: value` a line;
/// - `/trailers`: a body, then trailers;
/// - `/hold`: waits for [`State::release`] before reading the body, then answers its length.
async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
) -> Result<Response<ServerBody>, Infallible> {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let answer = match request.uri().path() {
        "/echo" => Response::new(boxed(request.into_body())),
        "/headers" => {
            let mut text = format!(
                "version: {:?}\nauthority: {}\n",
                request.version(),
                request.uri().authority().map_or("", |a| a.as_str())
            );
            for (name, value) in request.headers() {
                text.push_str(&format!("{name}: {}\n", value.to_str().unwrap_or("?")));
            }
            Response::new(boxed(Full::new(Bytes::from(text))))
        }
        "/sandbox-agent/processes" => {
            Response::new(boxed(Full::new(Bytes::from_static(b"{\"processes\":[]}"))))
        }
        "/trailers" => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from_static(b"body"))),
                Ok(Frame::trailers(trailers)),
            ];
            Response::new(boxed(StreamBody::new(futures_util::stream::iter(frames))))
        }
        "/hold" => {
            state.release.notified().await;
            let mut body = request.into_body();
            let mut total = 0usize;
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.unwrap().into_data() {
                    total += data.len();
                }
            }
            Response::new(boxed(Full::new(Bytes::from(total.to_string()))))
        }
        _ => {
            let mut r = Response::new(boxed(Empty::new()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    Ok(answer)
}

/// A client whose every connection is a fresh pipe to a fresh HTTP/2 server connection.
fn client(state: &Arc<State>, token: Option<&str>) -> Client {
    let state = Arc::clone(state);
    let connector = RelayConnector::new(move || {
        let (client_end, server_end) = tokio::io::duplex(64 * 1024);
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(Arc::clone(&state), r));
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(server_end), service)
                .await;
        });
        async move { Ok(client_end) }
    });
    let mut config = EnvdConfig::new("http://agent.internal")
        .unwrap()
        .with_http(HttpVersion::Http2);
    if let Some(token) = token {
        config = config.with_access_token(Secret::new(token));
    }
    EnvdClient::new(connector, config).unwrap()
}

/// The `i`-th byte of the test pattern (not periodic in any power of two).
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// A request body fed from a task: `total` bytes of the pattern in 64 KiB pieces, counting
/// in `sent` what the body has handed over.
fn pattern_body(total: usize, sent: Arc<AtomicUsize>) -> ForwardBodyIn {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, io::Error>>(1);
    tokio::spawn(async move {
        let mut at = 0;
        while at < total {
            let n = (64 * 1024).min(total - at);
            let piece: Vec<u8> = (at..at + n).map(pattern).collect();
            if tx.send(Ok(Frame::data(Bytes::from(piece)))).await.is_err() {
                return;
            }
            at += n;
            sent.store(at, Ordering::SeqCst);
        }
    });
    StreamBody::new(tokio_stream(rx))
}

type ForwardBodyIn =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, io::Error>>>;

fn tokio_stream(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, io::Error>>,
) -> futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, io::Error>> {
    Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

async fn json_error(response: Response<ForwardBody>) -> (StatusCode, serde_json::Value) {
    let status = response.status();
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "application/json"
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn bodies_larger_than_every_window_stream_both_ways_exactly() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    // 24 MiB: far over HTTP/2's 64 KiB default windows and hyper's larger ones, and over the
    // pipe's 64 KiB, so every byte passes through flow control many times over.
    let total = 24 * 1024 * 1024;
    let request = Request::builder()
        .method(Method::POST)
        .uri("/echo")
        .body(pattern_body(total, Arc::new(AtomicUsize::new(0))))
        .unwrap();
    let response = client.forward(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut at = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        let Ok(data) = frame.into_data() else {
            continue;
        };
        for (k, b) in data.iter().enumerate() {
            assert_eq!(*b, pattern(at + k), "byte {} differs", at + k);
        }
        at += data.len();
    }
    assert_eq!(at, total, "every byte came back, and no more");
}

#[tokio::test]
async fn a_reader_that_does_not_read_stalls_the_writer() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    let total = 32 * 1024 * 1024;
    let sent = Arc::new(AtomicUsize::new(0));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/hold")
        .body(pattern_body(total, Arc::clone(&sent)))
        .unwrap();
    let forwarding = tokio::spawn(async move { client.forward(request).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let stalled_at = sent.load(Ordering::SeqCst);
    // What may be in flight: the server's windows (hyper's default connection and stream
    // windows are a few MiB at most), the pipe and one piece in the channel. Nothing near the
    // whole body.
    assert!(
        stalled_at < 8 * 1024 * 1024,
        "{stalled_at} bytes were taken while the server read none: the body is buffered"
    );
    state.release.notify_one();
    let response = tokio::time::timeout(Duration::from_secs(60), forwarding)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], total.to_string().as_bytes());
    assert_eq!(sent.load(Ordering::SeqCst), total);
}

#[tokio::test]
async fn hop_by_hop_headers_stay_behind_and_the_request_goes_out_as_h2() {
    let state = Arc::new(State::default());
    let client = client(&state, Some("the-service-token"));
    let request = Request::builder()
        .method(Method::GET)
        .uri("/headers")
        .version(Version::HTTP_11)
        .header("host", "elsewhere.example")
        .header("connection", "keep-alive, x-named-by-connection")
        .header("x-named-by-connection", "1")
        .header("keep-alive", "timeout=5")
        .header("upgrade", "websocket")
        .header("te", "trailers, deflate;q=0.5")
        .header("proxy-authorization", "Basic eA==")
        .header("proxy-connection", "keep-alive")
        .header("transfer-encoding", "chunked")
        .header("x-access-token", "the-callers-guess")
        .header("authorization", "Basic dXNlcjo=")
        .header("x-kept", "yes")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = client.forward(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.version(),
        Version::HTTP_11,
        "answered on the caller's HTTP"
    );
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let seen: Vec<&str> = text.lines().collect();
    assert!(seen.contains(&"version: HTTP/2.0"), "{text}");
    // The destination is the client's envd, whatever the caller's Host said.
    assert!(seen.contains(&"authority: agent.internal"), "{text}");
    for gone in [
        "connection:",
        "x-named-by-connection:",
        "keep-alive:",
        "upgrade:",
        "proxy-authorization:",
        "proxy-connection:",
        "transfer-encoding:",
        "host:",
    ] {
        assert!(
            !seen.iter().any(|l| l.starts_with(gone)),
            "{gone} reached the server:\n{text}"
        );
    }
    for kept in [
        "te: trailers",
        "x-kept: yes",
        "authorization: Basic dXNlcjo=",
        // The configured token replaces the caller's.
        "x-access-token: the-service-token",
    ] {
        assert!(seen.contains(&kept), "{kept} missing:\n{text}");
    }
    assert!(!text.contains("the-callers-guess"), "{text}");
}

#[tokio::test]
async fn the_callers_token_passes_when_none_is_configured() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    let request = Request::builder()
        .uri("/headers")
        .header("x-access-token", "sdk-token")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let text = client
        .forward(request)
        .await
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.lines().any(|l| l == "x-access-token: sdk-token"),
        "{text}"
    );
}

/// The one extension forwarded: the agent's read-only process listing, as a `GET` spelt
/// exactly so (every other spelling and method is refused in
/// `refused_forms_never_reach_the_server`).
#[tokio::test]
async fn the_process_listing_is_the_one_extension_forwarded() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    let request = Request::builder()
        .uri(sandbox_transport::envd::AGENT_PROCESS_LISTING)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = client.forward(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"processes\":[]}");
    assert_eq!(state.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn trailers_come_back() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    let request = Request::builder()
        .uri("/trailers")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let collected = client
        .forward(request)
        .await
        .into_body()
        .collect()
        .await
        .unwrap();
    let trailers = collected.trailers().cloned().unwrap();
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(&collected.to_bytes()[..], b"body");
}

#[tokio::test]
async fn refused_forms_never_reach_the_server() {
    let state = Arc::new(State::default());
    let client = client(&state, None);
    let cases: Vec<(Method, &str, Version, StatusCode, &str)> = vec![
        (
            Method::GET,
            "http://elsewhere.example/files",
            Version::HTTP_11,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::CONNECT,
            "elsewhere.example:443",
            Version::HTTP_11,
            StatusCode::METHOD_NOT_ALLOWED,
            "unsupported",
        ),
        (
            Method::CONNECT,
            "http://elsewhere.example/",
            Version::HTTP_2,
            StatusCode::METHOD_NOT_ALLOWED,
            "unsupported",
        ),
        (
            Method::OPTIONS,
            "*",
            Version::HTTP_11,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::GET,
            "/sandbox-agent/version",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::POST,
            "/sandbox-agent/tunnel/22",
            Version::HTTP_2,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/%73andbox-agent/version",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "//Sandbox-Agent/version",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/files/../sandbox-agent/tunnel/80",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        // The process listing passes only as a GET spelt exactly so.
        (
            Method::POST,
            "/sandbox-agent/processes",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/Sandbox-Agent/processes",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/sandbox-agent/processes/../tunnel/22",
            Version::HTTP_11,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
    ];
    for (method, uri, version, status, code) in cases {
        let request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .version(version)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let (got, body) = json_error(client.forward(request).await).await;
        assert_eq!(got, status, "{method} {uri}: {body}");
        assert_eq!(body["error"]["code"], code, "{method} {uri}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    assert_eq!(state.requests.load(Ordering::SeqCst), 0, "nothing was sent");

    // HTTP/2 always names an authority: its requests are forwarded, to this client's envd.
    let request = Request::builder()
        .uri("http://whatever.example/headers")
        .version(Version::HTTP_2)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = client.forward(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("authority: agent.internal"));
    // A path that merely mentions the prefix elsewhere is an ordinary path.
    let request = Request::builder()
        .uri("/files?path=/sandbox-agent/x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(
        client.forward(request).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(state.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_channel_that_cannot_be_reached_is_a_json_503() {
    let connector = RelayConnector::new(|| async {
        Err::<DuplexStream, _>(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the relay is gone",
        ))
    });
    let config = EnvdConfig::new("http://agent.internal")
        .unwrap()
        .with_http(HttpVersion::Http2)
        .with_provider(sandbox_core::Provider::Docker);
    let client = EnvdClient::new(connector, config).unwrap();
    let request = Request::builder()
        .method(Method::POST)
        .uri("/process.Process/Start")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let (status, body) = json_error(client.forward(request).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "provider_unavailable");
    let err = client
        .try_forward(Request::new(Empty::<Bytes>::new()))
        .await
        .unwrap_err();
    assert_eq!(err.provider(), Some(sandbox_core::Provider::Docker));
}

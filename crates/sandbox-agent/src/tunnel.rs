//! Our tunnel extension: a request on the agent's own listener becomes a byte stream to
//! `127.0.0.1:<port>` inside the sandbox (for preview ports), at most `--max-tunnels` at once.
//!
//! - HTTP/1.1: `GET /sandbox-agent/tunnel/<port>` with `Connection: Upgrade` and
//!   `Upgrade: sandbox-tunnel` is answered `101 Switching Protocols`; then the connection
//!   carries raw bytes both ways.
//! - HTTP/2 (h2c): `POST /sandbox-agent/tunnel/<port>`; the request body streams to the port
//!   and the response body streams back, full duplex.
//!
//! The port is dialled before the answer, so a refusal is an HTTP error, not a stream that
//! ends at once: 400 `invalid_argument` for a bad port, 429 `resource_exhausted` over the
//! limit, 502 `unavailable` when nothing accepts. Each direction copies through one fixed
//! buffer ([`COPY_BUFFER`]) and the HTTP/2 answer through a channel of [`CHANNEL_CHUNKS`]
//! chunks, so a tunnel holds a bounded amount of memory whatever either side does. A side
//! that finishes sending (FIN, or the end of the request body) is passed on as a half-close;
//! the tunnel ends when both directions have, or when either side breaks.

use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::rt::TokioIo;
use sandbox_envd::{Code, ConnectError};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::connect::{self, Body, BoxError};

/// The `Upgrade` protocol token of an HTTP/1.1 tunnel.
pub const UPGRADE_PROTOCOL: &str = "sandbox-tunnel";
/// Bytes each direction of a tunnel copies at a time.
pub const COPY_BUFFER: usize = 16 * 1024;
/// Chunks of [`COPY_BUFFER`] an HTTP/2 answer may have in flight before reading the port waits.
pub const CHANNEL_CHUNKS: usize = 2;
/// How long dialling the port may take (loopback answers at once; this only bounds a port
/// whose listener's backlog is full).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The open tunnels, bounded.
#[derive(Debug)]
pub struct Tunnels {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Tunnels {
    pub fn new(max: usize) -> Tunnels {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Tunnels {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Tunnels open now.
    pub fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }
}

fn error(status: StatusCode, code: Code, message: String) -> Response<Body> {
    let mut response = connect::unary_error(&ConnectError::new(code, message));
    *response.status_mut() = status;
    response
}

/// The port of `/sandbox-agent/tunnel/<port>`: decimal, 1 to 65535, not the agent's own.
pub fn parse_port(text: &str, own_port: Option<u16>) -> Result<u16, ConnectError> {
    let bad = |why: &str| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("tunnel port {text:?}: {why}"),
        )
    };
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("expected a decimal port from 1 to 65535"));
    }
    let port: u32 = text.parse().map_err(|_| bad("not a number"))?;
    let port = u16::try_from(port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("expected a decimal port from 1 to 65535"))?;
    if Some(port) == own_port {
        return Err(bad("the agent's own port cannot be tunnelled to"));
    }
    Ok(port)
}

/// Whether a comma-separated header holds `token` (case-insensitive).
fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(token))
        })
    })
}

/// Answers `/sandbox-agent/tunnel/<port_text>` (the token was checked by the router).
pub async fn handle(
    tunnels: &Tunnels,
    own_port: Option<u16>,
    port_text: &str,
    mut request: Request<Body>,
) -> Response<Body> {
    let method = request.method().clone();
    if method != Method::GET && method != Method::POST {
        let mut response = error(
            StatusCode::METHOD_NOT_ALLOWED,
            Code::Unimplemented,
            format!(
                "method {method} is not allowed on a tunnel; use GET (HTTP/1.1 upgrade) or POST (HTTP/2)"
            ),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        return response;
    }
    let port = match parse_port(port_text, own_port) {
        Ok(port) => port,
        Err(e) => return connect::unary_error(&e),
    };
    if method == Method::GET {
        let upgrade = request.version() == Version::HTTP_11
            && header_has(request.headers(), header::CONNECTION, "upgrade")
            && header_has(request.headers(), header::UPGRADE, UPGRADE_PROTOCOL);
        if !upgrade {
            return error(
                StatusCode::BAD_REQUEST,
                Code::InvalidArgument,
                format!(
                    "a tunnel is GET over HTTP/1.1 with Connection: Upgrade and Upgrade: \
                     {UPGRADE_PROTOCOL}, or POST over HTTP/2"
                ),
            );
        }
    }
    let Ok(permit) = Arc::clone(&tunnels.permits).try_acquire_owned() else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            Code::ResourceExhausted,
            format!(
                "{} tunnels are open, the most --max-tunnels allows; close one first",
                tunnels.max
            ),
        );
    };
    let target = match dial(port).await {
        Ok(target) => target,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                Code::Unavailable,
                format!("connecting to 127.0.0.1:{port}: {e}"),
            );
        }
    };
    if method == Method::GET {
        let on_upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let _permit = permit;
            // No upgrade (the client left, or no connection under the request): the
            // target is closed by dropping it.
            if let Ok(upgraded) = on_upgrade.await {
                let mut client = TokioIo::new(upgraded);
                let mut target = target;
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut client,
                    &mut target,
                    COPY_BUFFER,
                    COPY_BUFFER,
                )
                .await;
            }
        });
        let mut response = Response::new(connect::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static(UPGRADE_PROTOCOL));
        return response;
    }
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    tokio::spawn(duplex(request.into_body(), target, tx, permit));
    let mut response = Response::new(Downstream { rx }.boxed_unsync());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// Dials the port on loopback, in the agent's own network namespace: nothing else is ever
/// reachable through a tunnel.
#[expect(
    clippy::disallowed_methods,
    reason = "the tunnel's whole purpose: a loopback port inside the sandbox, never an address a tenant names"
)]
async fn dial(port: u16) -> std::io::Result<TcpStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Why the port-to-client direction of an HTTP/2 tunnel stopped.
enum DownEnd {
    /// The port finished sending (or broke, which the client was told).
    TargetDone,
    /// The client no longer reads the answer.
    ClientGone,
}

/// Carries an HTTP/2 tunnel: the request body to the port, the port's bytes to `tx`.
async fn duplex(
    mut body: Body,
    target: TcpStream,
    tx: mpsc::Sender<Result<Bytes, BoxError>>,
    permit: OwnedSemaphorePermit,
) {
    let _permit = permit;
    let (mut read, mut write) = target.into_split();
    let up = async move {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Err(());
            };
            if let Ok(data) = frame.into_data()
                && write.write_all(&data).await.is_err()
            {
                return Err(());
            }
        }
        // The client ended its body: the port reads EOF, and may still answer.
        let _ = write.shutdown().await;
        Ok(())
    };
    let down = async move {
        let mut buf = vec![0u8; COPY_BUFFER];
        loop {
            let n = tokio::select! {
                () = tx.closed() => return DownEnd::ClientGone,
                n = read.read(&mut buf) => n,
            };
            let chunk = match n {
                Ok(0) => return DownEnd::TargetDone,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                // Passed on as a body error, so the client sees a broken stream, not an end.
                Err(e) => Err(BoxError::from(e)),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() {
                return DownEnd::ClientGone;
            }
            if failed {
                return DownEnd::TargetDone;
            }
        }
    };
    tokio::pin!(up, down);
    tokio::select! {
        sent = &mut up => {
            // A broken request stream ends the tunnel; a finished one leaves the answer to
            // run until the port closes or the client stops reading.
            if sent.is_ok() {
                let _ = down.await;
            }
        }
        end = &mut down => {
            // The port has finished: keep passing the client's bytes until its body ends,
            // unless nobody reads the answer any more.
            if matches!(end, DownEnd::TargetDone) {
                let _ = up.await;
            }
        }
    }
}

/// The answer body of an HTTP/2 tunnel: what the port sends, as it arrives.
struct Downstream {
    rx: mpsc::Receiver<Result<Bytes, BoxError>>,
}

impl hyper::body::Body for Downstream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_decimal_nonzero_and_not_our_own() {
        assert_eq!(parse_port("8080", None).unwrap(), 8080);
        assert_eq!(parse_port("1", Some(49983)).unwrap(), 1);
        assert_eq!(parse_port("65535", None).unwrap(), 65535);
        for bad in [
            "", "0", "65536", "99999", "123456", "-1", "+80", "8o", " 80", "0x50",
        ] {
            let e = parse_port(bad, None).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
        }
        let e = parse_port("49983", Some(49983)).unwrap_err();
        assert!(e.message.contains("own port"), "{e:?}");
    }

    #[test]
    fn header_tokens_are_found_in_lists() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("Sandbox-Tunnel"));
        assert!(header_has(&h, header::CONNECTION, "upgrade"));
        assert!(header_has(&h, header::UPGRADE, UPGRADE_PROTOCOL));
        assert!(!header_has(&h, header::UPGRADE, "websocket"));
        assert!(!header_has(
            &HeaderMap::new(),
            header::CONNECTION,
            "upgrade"
        ));
    }

    #[test]
    fn the_limit_is_counted_by_permits() {
        let tunnels = Tunnels::new(2);
        assert_eq!(tunnels.open(), 0);
        let a = Arc::clone(&tunnels.permits).try_acquire_owned().unwrap();
        let _b = Arc::clone(&tunnels.permits).try_acquire_owned().unwrap();
        assert_eq!(tunnels.open(), 2);
        assert!(Arc::clone(&tunnels.permits).try_acquire_owned().is_err());
        drop(a);
        assert_eq!(tunnels.open(), 1);
        assert_eq!(Tunnels::new(0).max, 1);
    }
}

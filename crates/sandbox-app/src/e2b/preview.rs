//! Preview ports: a request addressed to `<port>-<id>.<domain>` (or the routing headers) for
//! a port other than envd's is relayed, as HTTP/1.1, to `127.0.0.1:<port>` inside the
//! sandbox, over a byte tunnel of the provider port ([`sandbox_core::Tunnels`]; for Docker,
//! the agent's tunnel extension on its channel, so it works with network `none`).
//!
//! - **Nothing a tenant names is dialled.** The only destination is the port inside the
//!   sandbox the route names, reached through the backend's own channel; the `Host` header is
//!   passed on as the caller sent it (the program may read it), never resolved.
//! - **Authorisation.** A sandbox created with `network.allowPublicTraffic: false` (metadata
//!   `sandbox.e2b.public=false`) answers only requests carrying its traffic token in
//!   `e2b-traffic-access-token` ([`Keys::traffic_token`](super::ids::Keys::traffic_token));
//!   a missing or wrong one is 403. An open sandbox's ports answer anyone who knows its host
//!   (E2B's public URLs). The token, the envd token and the routing headers are stripped
//!   before the request is relayed.
//! - **A bound.** At most `e2b.max_tunnels_per_sandbox` relayed requests of one sandbox are in
//!   flight at once in this process (each holds its tunnel until its answer's body is over);
//!   past it 429 with `Retry-After: 1`. The backend bounds its own tunnels too (`tunnel_limit`,
//!   also 429).
//! - **One request per tunnel.** Each relayed request opens its own tunnel and HTTP/1.1
//!   connection, closed once the answer's body is over: no connection is shared between
//!   callers. Bodies stream both ways (hyper's client on the tunnel's halves); hop-by-hop
//!   headers stay on their hop.
//! - **Upgrades.** A request with `Upgrade` (WebSocket's, or any other protocol) is relayed
//!   with `Connection: upgrade` and its `Upgrade` header; when the program answers `101`, the
//!   caller's connection and the tunnel are joined byte for byte until either side ends.
//!   `CONNECT` is refused with 501: it names a destination, and a preview port is one.
//! - **Errors.** A sandbox that does not exist is 404 (as the envd router answers); nothing
//!   listening on the port is 502 (`port_closed`); a program that answers no HTTP is 502.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, Version, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use sandbox_core::{SandboxHandle, SandboxId, Tunnel, narrow};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::envd::{
    ACCESS_TOKEN_HEADER, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER, TRAFFIC_TOKEN_HEADER,
};
use super::ids::E2bId;
use super::{ApiError, Inner, is_gone, meta};

/// Bytes the in-process pipe between hyper and a tunnel holds each way.
const PIPE_BYTES: usize = 64 * 1024;
/// Bytes read from the pipe per chunk sent into the tunnel.
const CHUNK: usize = 16 * 1024;

/// Headers that describe one connection, never relayed (and every header `Connection` names).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// The relayed requests in flight, by sandbox (the per-sandbox bound).
#[derive(Debug, Default)]
pub(crate) struct TunnelCounts {
    open: Mutex<HashMap<SandboxId, usize>>,
}

/// One relayed request's place under the bound; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct TunnelHold {
    counts: Arc<TunnelCounts>,
    sandbox: SandboxId,
}

impl TunnelCounts {
    /// A place for one more tunnel of `sandbox`, unless `max` are open.
    pub(crate) fn try_hold(
        self: &Arc<Self>,
        sandbox: &SandboxId,
        max: usize,
    ) -> Option<TunnelHold> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(sandbox.clone()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(TunnelHold {
            counts: Arc::clone(self),
            sandbox: sandbox.clone(),
        })
    }

    /// Tunnels of `sandbox` open now.
    #[cfg(test)]
    pub(crate) fn open(&self, sandbox: &SandboxId) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sandbox)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for TunnelHold {
    fn drop(&mut self) {
        let mut open = self
            .counts
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.sandbox) {
            *count = count.saturating_sub(1);
            // Forgotten at zero, so the map holds only sandboxes with open tunnels.
            if *count == 0 {
                open.remove(&self.sandbox);
            }
        }
    }
}

fn forbidden(message: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

fn bad_gateway(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, message)
}

/// Relays `request` to `port` of sandbox `id` (module docs).
pub(crate) async fn relay(
    inner: &Inner,
    id: &E2bId,
    port: u16,
    request: Request,
) -> Result<Response, ApiError> {
    let absent = || ApiError::sandbox_not_found(id.as_str());
    if port == 0 {
        return Err(ApiError::bad_request("port 0 is not a port of a sandbox"));
    }
    let located = inner
        .locate(id)
        .await
        .map_err(ApiError::from_core)?
        .ok_or_else(absent)?;
    let summary = match inner.provider.get(&located.sandbox).await {
        Ok(summary) => summary,
        Err(e) if is_gone(&e) => {
            inner.index.forget(id);
            return Err(absent());
        }
        Err(e) => return Err(ApiError::from_core(e)),
    };
    if !meta::public_of(&summary.metadata) {
        let presented = request
            .headers()
            .get(TRAFFIC_TOKEN_HEADER)
            .map(|v| v.to_str().unwrap_or("").trim());
        match presented {
            None => {
                return Err(forbidden(
                    "this sandbox's public traffic is closed: send its traffic access token in e2b-traffic-access-token",
                ));
            }
            Some(token) if !inner.keys.verify_traffic(located.tenant, id, token) => {
                return Err(forbidden("invalid traffic access token for this sandbox"));
            }
            Some(_) => {}
        }
    }
    if request.method() == Method::CONNECT {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "CONNECT is not relayed to a sandbox's port: the port is the destination",
        ));
    }
    let tunnels = narrow::tunnels(&*inner.provider).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server's backend cannot reach a sandbox's ports",
        )
    })?;
    let max = inner.settings.max_tunnels_per_sandbox;
    let hold = inner
        .tunnels
        .try_hold(&located.sandbox, max)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "sandbox {id} already has {max} requests to its ports in flight, its bound"
                ),
            )
        })?;
    let handle = SandboxHandle::new(located.sandbox.clone(), inner.provider.provider());
    let tunnel = tunnels
        .open_tunnel(&handle, port)
        .await
        .map_err(ApiError::from_core)?;
    let mut request = request;
    let upgrade = request.headers().get(header::UPGRADE).cloned();
    // Taken before the request is handed on: the caller's side of a `101`.
    let caller_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let mut outgoing = outgoing(request)?;
    if let Some(protocol) = &upgrade {
        let headers = outgoing.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    tokio::spawn(pump(tunnel, theirs, hold));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(ours))
        .await
        .map_err(|e| bad_gateway(format!("port {port} of sandbox {id}: {e}")))?;
    // The connection runs until the answer's body is over (or either side breaks). It is
    // aborted when the caller goes away first (this future or the answer's body dropped),
    // which closes hyper's end of the pipe, so the pump drops the tunnel and its place under
    // the bound even when the program never answers.
    let connection = AbortOnDrop(tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    }));
    let mut answer = sender.send_request(outgoing).await.map_err(|e| {
        bad_gateway(format!(
            "port {port} of sandbox {id} did not answer an HTTP request: {e}"
        ))
    })?;
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(caller_upgrade) = caller_upgrade else {
            return Err(bad_gateway(format!(
                "port {port} of sandbox {id} switched protocols unasked"
            )));
        };
        let port_upgrade = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            // The connection task hands over its end of the pipe, then ends; held until then.
            let _connection = connection;
            let (Ok(caller), Ok(program)) = tokio::join!(caller_upgrade, port_upgrade) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(
                &mut TokioIo::new(caller),
                &mut TokioIo::new(program),
            )
            .await;
        });
        let (mut parts, _) = answer.into_parts();
        let protocol = parts.headers.get(header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(protocol) = protocol {
            parts.headers.insert(header::UPGRADE, protocol);
        }
        parts.version = Version::HTTP_11;
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = answer.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::HTTP_11;
    let body = Holding {
        body,
        _connection: connection,
    };
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Aborts its task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The answer's body, holding the connection task until the body is over or dropped.
struct Holding {
    body: hyper::body::Incoming,
    _connection: AbortOnDrop,
}

impl hyper::body::Body for Holding {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The request as the program on the port receives it: origin form, HTTP/1.1, without the
/// routing and credential headers and the hop-by-hop ones, with the caller's `Host`.
fn outgoing(request: Request) -> Result<hyper::Request<Body>, ApiError> {
    let (mut parts, body) = request.into_parts();
    let host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    for name in [
        ACCESS_TOKEN_HEADER,
        SANDBOX_ID_HEADER,
        SANDBOX_PORT_HEADER,
        TRAFFIC_TOKEN_HEADER,
    ] {
        parts.headers.remove(name);
    }
    strip_hop_by_hop(&mut parts.headers);
    if let Some(host) = host {
        parts.headers.insert(header::HOST, host);
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = target
        .parse::<Uri>()
        .map_err(|e| ApiError::bad_request(format!("the request target is not valid: {e}")))?;
    parts.version = Version::HTTP_11;
    Ok(hyper::Request::from_parts(parts, body))
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in HOP_BY_HOP
        .iter()
        .copied()
        .chain(named.iter().map(String::as_str))
    {
        headers.remove(name);
    }
}

/// Why the caller-to-port direction of a pump stopped.
enum UpEnd {
    /// hyper's end of the pipe is gone: it never half-closes, so the connection is over.
    CallerGone,
    /// The port stopped taking bytes; its answer may still be coming.
    PortStopped,
}

/// Carries bytes between hyper's end of the pipe and the tunnel, both ways, until the
/// connection is over; then the tunnel is dropped, which closes the connection to the port,
/// and `hold` frees its place under the bound.
async fn pump(tunnel: Tunnel, pipe: tokio::io::DuplexStream, hold: TunnelHold) {
    let _hold = hold;
    let Tunnel {
        mut sink,
        mut source,
    } = tunnel;
    let (mut read, mut write) = tokio::io::split(pipe);
    let up = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = sink.finish().await;
                    return UpEnd::CallerGone;
                }
                Ok(n) => {
                    if sink.send(buf[..n].to_vec()).await.is_err() {
                        return UpEnd::PortStopped;
                    }
                }
            }
        }
    };
    let down = async move {
        while let Some(Ok(chunk)) = source.recv().await {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = write.shutdown().await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        end = &mut up => {
            // A port that stopped reading may still be answering; a caller that is gone
            // reads nothing more.
            if matches!(end, UpEnd::PortStopped) {
                down.await;
            }
        }
        () = &mut down => {
            // The port closed: hyper reads the end of its answer and closes the pipe.
            let _ = up.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_counts_open_tunnels_per_sandbox() {
        let counts = Arc::new(TunnelCounts::default());
        let a = SandboxId::new("a").unwrap();
        let b = SandboxId::new("b").unwrap();
        let first = counts.try_hold(&a, 2).unwrap();
        let _second = counts.try_hold(&a, 2).unwrap();
        assert!(counts.try_hold(&a, 2).is_none(), "past the bound");
        // Another sandbox has its own bound.
        let _other = counts.try_hold(&b, 2).unwrap();
        drop(first);
        assert_eq!(counts.open(&a), 1);
        let _third = counts.try_hold(&a, 2).unwrap();
        assert_eq!(counts.open(&a), 2);
        drop(_third);
        drop(_second);
        assert_eq!(counts.open(&a), 0);
        assert!(
            counts.open.lock().unwrap().get(&a).is_none(),
            "forgotten at zero"
        );
    }

    #[test]
    fn routing_credentials_and_hop_by_hop_headers_are_not_relayed() {
        let request = Request::builder()
            .method(Method::POST)
            .uri("http://8000-iabc.sbx.test/a/b?x=1")
            .header("host", "8000-iabc.sbx.test")
            .header("x-access-token", "t")
            .header("e2b-sandbox-id", "i")
            .header("e2b-sandbox-port", "8000")
            .header("e2b-traffic-access-token", "et1.x")
            .header("connection", "keep-alive, x-private")
            .header("x-private", "1")
            .header("keep-alive", "timeout=5")
            .header("te", "trailers")
            .header("content-type", "text/plain")
            .body(Body::empty())
            .unwrap();
        let out = outgoing(request).unwrap();
        assert_eq!(out.uri().to_string(), "/a/b?x=1");
        assert_eq!(out.version(), Version::HTTP_11);
        for gone in [
            "x-access-token",
            "e2b-sandbox-id",
            "e2b-sandbox-port",
            "e2b-traffic-access-token",
            "connection",
            "x-private",
            "keep-alive",
            "te",
        ] {
            assert!(out.headers().get(gone).is_none(), "{gone}");
        }
        assert_eq!(out.headers()["host"], "8000-iabc.sbx.test");
        assert_eq!(out.headers()["content-type"], "text/plain");
    }
}

//! The WebSocket dialer: the same routing, guard and token registry as the HTTP client. A
//! data-plane URL (`ws[s]://<port>-<id>.<domain>/...`) is dialled at the gateway with its Host
//! kept; anything else at its own host, through the guard. TLS is rustls on aws-lc-rs
//! (tungstenite's own TLS features stay off, so nothing can dial around the guard). The
//! subprotocol is pinned to `binary` and verified after the handshake; message and frame sizes
//! are bounded.

use std::sync::Arc;

use hyper::Request;
use hyper::header::{HeaderMap, HeaderValue, SEC_WEBSOCKET_PROTOCOL};
use sandbox_core::{Error, Operation};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::connector::GuardedConnector;
use crate::gateway::{Gateway, GatewayTarget, Plane};
use crate::transported;

const OP_WS: Operation = Operation::new("dial_websocket");

/// The only subprotocol spoken.
pub const SUBPROTOCOL: &str = "binary";

/// The largest message and frame accepted (the defaults, 64 MiB and 16 MiB, are far more than
/// a terminal or a desktop stream needs).
const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A connection the WebSocket runs on: plain TCP or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + std::fmt::Debug> Io for T {}

/// An open WebSocket.
pub type Socket = WebSocketStream<Box<dyn Io>>;

fn failed(message: String) -> Error {
    transported(Error::unavailable(OP_WS, message))
}

/// Dials WebSockets for one pool.
#[derive(Clone, Debug)]
pub struct WsDialer {
    guard: GuardedConnector,
    gateway: Gateway,
    target: Option<GatewayTarget>,
    tls: Arc<rustls::ClientConfig>,
}

impl WsDialer {
    pub fn new(
        guard: GuardedConnector,
        gateway: Gateway,
        target: Option<GatewayTarget>,
        tls: rustls::ClientConfig,
    ) -> Self {
        WsDialer {
            guard,
            gateway,
            target,
            tls: Arc::new(tls),
        }
    }

    /// Opens `url` (`ws://` or `wss://`) with the caller's `headers` (they win over anything
    /// the dialer would add, except the subprotocol, which is always `binary`).
    pub async fn dial(&self, url: &str, headers: &HeaderMap) -> Result<Socket, Error> {
        let mut request = url.into_client_request().map_err(|e| {
            transported(Error::invalid_request(
                OP_WS,
                format!("websocket URL {url:?}: {e}"),
            ))
        })?;
        for (name, value) in headers {
            request.headers_mut().insert(name, value.clone());
        }
        request.headers_mut().insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(SUBPROTOCOL),
        );
        let secure = request.uri().scheme_str() == Some("wss");
        let host = request
            .uri()
            .host()
            .ok_or_else(|| {
                transported(Error::invalid_request(
                    OP_WS,
                    format!("websocket URL {url:?} has no host"),
                ))
            })?
            .to_owned();
        let port = request
            .uri()
            .port_u16()
            .unwrap_or(if secure { 443 } else { 80 });

        // Routing decides the dial target and adds the token; the upgrade request keeps its
        // own URI (tungstenite needs ws/wss) and Host.
        let probe = Request::builder()
            .uri(request.uri().to_string().replacen("ws", "http", 1).as_str())
            .body(())
            .map_err(|e| {
                transported(Error::invalid_request(
                    OP_WS,
                    format!("websocket URL {url:?}: {e}"),
                ))
            })?;
        let mut probe_with_headers = probe;
        *probe_with_headers.headers_mut() = request.headers().clone();
        let routed = self.gateway.route(&probe_with_headers)?;
        for (name, value) in routed.request.headers() {
            if !request.headers().contains_key(name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        let (dial_host, dial_port, tls) = match (&routed.plane, &self.target) {
            (Plane::Data { .. }, Some(gw)) => (gw.host.clone(), gw.port, gw.scheme == "https"),
            _ => (host.clone(), port, secure),
        };

        let tcp = self.guard.connect(&dial_host, dial_port).await?;
        let stream: Box<dyn Io> = if tls {
            let name =
                rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .map_err(|e| {
                    transported(Error::invalid_request(
                        OP_WS,
                        format!("server name {host:?}: {e}"),
                    ))
                })?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| failed(format!("TLS to {dial_host}:{dial_port}: {e}")))?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (socket, response) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(config))
                .await
                .map_err(|e| failed(format!("websocket handshake with {url}: {e}")))?;
        let agreed = response
            .headers()
            .get(SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok());
        if agreed != Some(SUBPROTOCOL) {
            return Err(failed(format!(
                "websocket {url}: the server agreed to subprotocol {agreed:?}, not {SUBPROTOCOL:?}"
            )));
        }
        Ok(socket)
    }
}

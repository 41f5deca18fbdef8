//! The sandbox agent's tunnel extension, as a client: `POST /sandbox-agent/tunnel/<port>` on
//! this client's connection (the agent's h2c channel), the request body streaming to the port
//! and the answer body streaming back, full duplex (`docs/envd.md`, "Our extensions").
//!
//! The agent dials the port before it answers, so a refusal is an answer, not a stream that
//! ends at once: its Connect error body is read into the workspace's error, with the HTTP
//! status kept ([`Error::http_status`]) so an adapter can tell the agent's "nothing listens"
//! (502) and "too many tunnels" (429) from a channel that failed (no status). Only this
//! client's envd is ever dialled; the port inside the sandbox is the agent's to reach.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, StatusCode};
use hyper_util::client::legacy::connect::Connect;
use sandbox_core::{Error, Operation};
use tokio::sync::mpsc;

use super::call::{Deadline, EnvdClient, error_answer};
use super::forward::AGENT_EXTENSION_PREFIX;
use crate::connector::BoxError;
use crate::transported;

/// Request-body chunks queued for the agent before [`TunnelUpstream::send`] waits.
const UPSTREAM_CHUNKS: usize = 4;

/// The sending half of an open tunnel: bytes for the port.
#[derive(Debug)]
pub struct TunnelUpstream {
    op: Operation,
    /// `None` once finished.
    tx: Option<mpsc::Sender<Bytes>>,
}

impl TunnelUpstream {
    /// Sends `data` to the port, waiting while the connection's flow control holds it back.
    pub async fn send(&mut self, data: Bytes) -> Result<(), Error> {
        let Some(tx) = &self.tx else {
            return Err(transported(Error::invalid_request(
                self.op,
                "the tunnel's sending side was already finished",
            )));
        };
        if data.is_empty() {
            return Ok(());
        }
        tx.send(data).await.map_err(|_| {
            transported(Error::unavailable(
                self.op,
                "the tunnel's connection is closed",
            ))
        })
    }

    /// Ends the request body: the program on the port reads end of file. Idempotent.
    pub fn finish(&mut self) {
        self.tx = None;
    }
}

/// The receiving half of an open tunnel: the agent's answer body, the port's bytes.
#[derive(Debug)]
pub struct TunnelDownstream {
    op: Operation,
    body: Incoming,
}

impl TunnelDownstream {
    /// The next bytes from the port; `None` once it closed its side. Cancel-safe: a frame is
    /// taken from the body only by a poll that returns it.
    pub async fn recv(&mut self) -> Option<Result<Bytes, Error>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => match frame.into_data() {
                    Ok(data) if data.is_empty() => {}
                    Ok(data) => return Some(Ok(data)),
                    // Trailers carry nothing of the port's.
                    Err(_) => {}
                },
                Err(e) => {
                    return Some(Err(transported(Error::unavailable(
                        self.op,
                        format!("the tunnel broke: {}", crate::client::chain(&e)),
                    ))));
                }
            }
        }
    }
}

/// The request body: what [`TunnelUpstream`] sends, as it is sent.
struct Upstream {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for Upstream {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|chunk| Ok(Frame::data(chunk))))
    }
}

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Opens a tunnel to `port` inside the sandbox through the agent's extension (module
    /// docs). The open is bounded by the client's unary deadline; the tunnel itself is not.
    pub async fn open_tunnel(
        &self,
        op: Operation,
        port: u16,
    ) -> Result<(TunnelUpstream, TunnelDownstream), Error> {
        let deadline = Deadline::start(self.inner.config.unary_timeout);
        let call = async {
            let (tx, rx) = mpsc::channel(UPSTREAM_CHUNKS);
            let path = format!("{AGENT_EXTENSION_PREFIX}tunnel/{port}");
            let mut request =
                self.request(op, Method::POST, &path, Upstream { rx }.boxed_unsync())?;
            request.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            let response = self.send(op, request).await?;
            if response.status() != StatusCode::OK {
                return Err(error_answer(op, response, false).await);
            }
            Ok((
                TunnelUpstream { op, tx: Some(tx) },
                TunnelDownstream {
                    op,
                    body: response.into_body(),
                },
            ))
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }
}

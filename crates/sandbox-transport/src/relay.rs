//! A connector over byte streams the caller opens: any `AsyncRead + AsyncWrite` (a relay
//! stream into a container, an exec'd `socat`, an in-memory pipe) becomes a hyper connection,
//! so the envd client and every other hyper client here run over it unchanged.
//!
//! The caller's opener decides where the bytes go; no socket is opened here, so nothing
//! bypasses the guard: a relay into a sandbox reaches exactly that sandbox.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::connector::BoxError;

type Opening<S> = Pin<Box<dyn Future<Output = io::Result<S>> + Send>>;

/// Opens a fresh stream per connection the pool wants (see the module docs).
pub struct RelayConnector<S> {
    open: Arc<dyn Fn() -> Opening<S> + Send + Sync>,
}

impl<S> Clone for RelayConnector<S> {
    fn clone(&self) -> Self {
        RelayConnector {
            open: Arc::clone(&self.open),
        }
    }
}

impl<S> fmt::Debug for RelayConnector<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayConnector").finish_non_exhaustive()
    }
}

impl<S> RelayConnector<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    /// A connector calling `open` for each new connection (the request's URI is not
    /// consulted: the stream is the destination).
    pub fn new<F, Fut>(open: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<S>> + Send + 'static,
    {
        RelayConnector {
            open: Arc::new(move || Box::pin(open()) as Opening<S>),
        }
    }
}

impl<S> tower_service::Service<Uri> for RelayConnector<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    type Response = Relayed<S>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let opening = (self.open)();
        Box::pin(async move {
            let stream = opening.await?;
            Ok(Relayed(TokioIo::new(stream)))
        })
    }
}

/// One relayed stream as a hyper connection.
#[derive(Debug)]
pub struct Relayed<S>(TokioIo<S>);

impl<S> Connection for Relayed<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Read for Relayed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Write for Relayed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

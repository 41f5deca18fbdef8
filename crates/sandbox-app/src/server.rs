//! The HTTP listener: accepting connections and serving them with limits, instead of
//! `axum::serve`, which sets none.
//!
//! What a hostile or broken client can hold is bounded here, before any handler runs:
//! - a connection that has not sent a complete request head within the header timeout (after
//!   connecting, or after its previous response) is closed, so unfinished heads cannot pile up;
//! - a request body that stalls, or takes longer than the body deadline, fails with 408
//!   `body_timeout` (see [`TimedBody`]);
//! - at most `max_connections` connections are served at once; the rest wait in the kernel's
//!   listen backlog instead of taking descriptors from the requests being served;
//! - a keep-alive connection carries at most `max_requests_per_connection` requests, then the
//!   server closes it after the answer;
//! - on shutdown the listener closes at once, in-flight requests get the grace period, and the
//!   process then exits whatever is still open (a half-open connection cannot keep it alive).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, header};
use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use crate::config::ServerSection;

/// The limits the listener applies, from the `[server]` config section.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_connections: usize,
    pub max_requests_per_connection: u64,
    pub shutdown_grace: Duration,
}

impl ServerLimits {
    /// The limits a config section names.
    pub fn from_config(section: &ServerSection) -> Self {
        ServerLimits {
            header_read_timeout: Duration::from_secs(section.header_read_timeout_seconds),
            body_idle_timeout: Duration::from_secs(section.body_idle_timeout_seconds),
            body_read_timeout: Duration::from_secs(section.body_read_timeout_seconds),
            max_connections: section.max_connections,
            max_requests_per_connection: section.max_requests_per_connection,
            shutdown_grace: Duration::from_secs(section.shutdown_grace_seconds),
        }
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits::from_config(&ServerSection::default())
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains for at most the grace
/// period. Returns once the listener is closed and the drain is over (or cut short).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Flipped once on shutdown; every connection task watches it and asks hyper to finish the
    // request in flight and close.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // listener itself is fine, so wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = ConnectionService {
            app: app.clone(),
            limits,
            served: Arc::new(AtomicU64::new(0)),
        };
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            // A connection ending in an error (a client gone mid-request, a header timeout) is
            // the client's business, not the service's: nothing to report.
            let stopped = async move {
                // The guard `wait_for` answers with must not live across the drain below.
                let _ = stop.wait_for(|stopping| *stopping).await.map(|_| ());
            };
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    match tokio::time::timeout(limits.shutdown_grace, slots.acquire_many(all)).await {
        Ok(_) => tracing::info!("every connection finished"),
        Err(_) => tracing::warn!(
            grace_seconds = limits.shutdown_grace.as_secs(),
            open = limits.max_connections - slots.available_permits(),
            "connections still open after the shutdown grace period; exiting anyway"
        ),
    }
}

/// The per-connection service: the router, with the body wrapped in its timeouts and the
/// request count of the connection kept.
#[derive(Clone)]
struct ConnectionService {
    app: Router,
    limits: ServerLimits,
    served: Arc<AtomicU64>,
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let limits = self.limits;
        let last =
            self.served.fetch_add(1, Ordering::Relaxed) + 1 >= limits.max_requests_per_connection;
        let request = request.map(|body| {
            Body::new(TimedBody::new(
                body,
                limits.body_idle_timeout,
                limits.body_read_timeout,
            ))
        });
        let app = self.app.clone();
        Box::pin(async move {
            let mut response = app.oneshot(request).await?;
            if last {
                // hyper closes the connection after an answer that says so.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// The error a [`TimedBody`] ends with when its client stalls or is too slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTimeout {
    /// The whole-body deadline passed (rather than one stall).
    pub total: bool,
}

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.total {
            f.write_str("the request body was not complete within the body deadline")
        } else {
            f.write_str("the request body stalled longer than the body idle timeout")
        }
    }
}

impl std::error::Error for BodyTimeout {}

/// Whether `error` (or anything in its source chain) is a [`BodyTimeout`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<BodyTimeout>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// A request body that fails with [`BodyTimeout`] when no frame arrives for `idle`, or when it
/// is not complete `total` after the request head. The clocks only matter while a handler is
/// reading: a body nobody polls costs nothing but its connection.
#[derive(Debug)]
pub struct TimedBody {
    inner: Incoming,
    idle: Duration,
    stall: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
}

impl TimedBody {
    fn new(inner: Incoming, idle: Duration, total: Duration) -> Self {
        TimedBody {
            inner,
            idle,
            stall: Box::pin(tokio::time::sleep(idle)),
            deadline: Box::pin(tokio::time::sleep(total)),
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            let next = Instant::now() + this.idle;
            this.stall.as_mut().reset(next);
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout { total: true }))));
        }
        if this.stall.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout { total: false }))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

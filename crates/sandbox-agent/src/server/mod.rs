//! The agent's HTTP server: HTTP/1.1 (chunked bodies) and h2c by prior knowledge on one
//! listener, with bounded request heads and HTTP/2 streams, routing envd's endpoints.
//!
//! Routing and authentication, in the order applied (envd's, `docs/envd.md`):
//! 1. With an access token configured, every request except `GET /health`, `GET /files` and
//!    `POST /files` needs `X-Access-Token`, else a plain JSON 401 (envd's middleware answer).
//! 2. `GET /health` is 204, `GET /metrics` envd's figures (`crate::metrics`), paths under
//!    `/sandbox-agent/` our extensions (`crate::extension`). `/files` goes to the files
//!    service. A Connect path of `sandbox_envd::service` must be `POST`; anything else on a
//!    known path is 405, an unknown path a Connect-style 404.
//! 3. A Connect call's user comes from `Authorization: Basic base64("<user>:")` (else the
//!    default user); an unknown user is `unauthenticated`. All of this happens before any
//!    body is read, and every body is then read bounded.

mod router;
mod services;

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;

pub use self::router::UNAUTHORIZED_MESSAGE;
pub use self::services::{
    BoxFuture, CallContext, FilesContext, FilesService, FilesystemService, Services,
};
use crate::config::Config;
use crate::connect::{Body, BoxError};
use crate::log;
use crate::pid1::Children;
use crate::process::ProcessService;

/// Everything a request can reach. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Agent {
    config: Arc<Config>,
    process: ProcessService,
    services: Services,
    token: Option<Arc<str>>,
    metrics: crate::metrics::CpuSampler,
    tunnels: crate::tunnel::Tunnels,
}

impl Agent {
    /// An agent serving `services` next to its own process service, whose processes are
    /// waited for through `children`.
    pub fn new(config: Config, services: Services, children: Arc<Children>) -> Arc<Agent> {
        let config = Arc::new(config);
        Arc::new(Agent {
            process: ProcessService::new(Arc::clone(&config), children),
            token: config.access_token.as_deref().map(Arc::from),
            metrics: crate::metrics::CpuSampler::new(),
            tunnels: crate::tunnel::Tunnels::new(config.max_tunnels),
            config,
            services,
        })
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn process(&self) -> &ProcessService {
        &self.process
    }

    /// The open tunnels (`/sandbox-agent/tunnel/`).
    pub fn tunnels(&self) -> &crate::tunnel::Tunnels {
        &self.tunnels
    }

    /// Answers one request (what the server calls for each; tests call it directly).
    pub async fn handle(self: Arc<Self>, request: Request<Body>) -> Response<Body> {
        router::route(self, request).await
    }
}

/// Accepts connections on `listener` and serves them until the task is dropped.
pub async fn serve(agent: Arc<Agent>, listener: TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: wait instead of spinning.
                log::warning!(agent.config.log, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let config = Arc::clone(agent.config());
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let agent = Arc::clone(&agent);
                async move {
                    let request = request.map(|body| {
                        http_body_util::BodyExt::boxed_unsync(http_body_util::BodyExt::map_err(
                            body,
                            |e| -> BoxError { Box::new(e) },
                        ))
                    });
                    Ok::<_, std::convert::Infallible>(agent.handle(request).await)
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .max_buf_size(config.max_header_bytes)
                // A client that opens a connection and never sends a head is dropped.
                .header_read_timeout(Duration::from_secs(30));
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(config.h2_max_streams)
                .max_header_list_size(u32::try_from(config.max_header_bytes).unwrap_or(u32::MAX));
            // A cut connection is the client's business: nothing to log per request. Upgrades
            // are on for the HTTP/1.1 tunnel extension.
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .await;
        });
    }
}

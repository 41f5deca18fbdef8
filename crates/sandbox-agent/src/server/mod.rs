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
//!
//! The same server answers on TCP ([`serve`]) and on a unix socket ([`serve_unix`], what the
//! service's channel reaches through `sandbox-agent relay`). Every request served touches the
//! activity marker when one is configured (`activity.rs`). The agent's own extensions live
//! under `/sandbox-agent/` (`crate::extension`).

mod activity;
mod router;
mod services;

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

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
    activity: Option<activity::Activity>,
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
            activity: config
                .activity_marker
                .clone()
                .map(|path| activity::Activity::new(path, config.log.clone())),
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
        if let Some(activity) = &self.activity {
            activity.served();
        }
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
        tokio::spawn(serve_connection(Arc::clone(&agent), stream));
    }
}

/// Binds the unix socket at `path` (mode 0600; the parent directory must exist). A socket file
/// left there by an earlier agent is replaced; any other file is refused, never deleted.
pub fn bind_unix(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
    let named = |e: std::io::Error, what: &str| {
        std::io::Error::new(
            e.kind(),
            format!("--listen-unix {}: {what}: {e}", path.display()),
        )
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| named(e, "removing the stale socket"))?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "--listen-unix {}: the path exists and is not a socket",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e, "inspecting the path")),
    }
    let listener = UnixListener::bind(path).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "binding (does the parent directory exist?)"
        } else {
            "binding"
        };
        named(e, what)
    })?;
    // Only root (who runs the agent and the relay) may connect: processes of other users in
    // the sandbox must not reach the agent around its access token.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| named(e, "setting mode 0600"))?;
    Ok(listener)
}

/// Accepts connections on the unix socket `listener` until the task is dropped.
pub async fn serve_unix(agent: Arc<Agent>, listener: UnixListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warning!(agent.config.log, "accept on the unix socket failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(serve_connection(Arc::clone(&agent), stream));
    }
}

/// Serves one connection, HTTP/1.1 or h2c by prior knowledge, until it closes.
async fn serve_connection<S>(agent: Arc<Agent>, stream: S)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
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
    // A cut connection is the client's business: nothing to log per request. Upgrades are on
    // for the HTTP/1.1 tunnel extension, on the unix socket as on TCP.
    let _ = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), service)
        .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Empty};

    /// GETs `path` over h2c on a fresh connection to the unix socket at `socket`.
    async fn get(socket: &std::path::Path, path: &str, token: Option<&str>) -> (u16, Bytes) {
        let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut request = Request::get(format!("http://agent{path}"));
        if let Some(t) = token {
            request = request.header("x-access-token", t);
        }
        let response = send
            .send_request(request.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    }

    #[tokio::test]
    async fn the_unix_socket_serves_h2c_the_version_and_touches_the_marker() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let marker = dir.path().join("activity");
        // A socket left by an earlier agent is replaced.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let config = Config {
            listen_unix: Some(socket.clone()),
            activity_marker: Some(marker.clone()),
            access_token: Some("t0ken".into()),
            ..Config::default()
        };
        let agent = Agent::new(config, Services::default(), Children::new(false));
        let listener = bind_unix(&socket).unwrap();
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let server = tokio::spawn(serve_unix(agent, listener));

        let (status, _) = get(&socket, "/health", None).await;
        assert_eq!(status, 204);
        // The marker exists once a request was served (the touch runs on the blocking pool).
        for _ in 0..100 {
            if marker.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(marker.is_file(), "the request did not create the marker");

        // The version needs the token like every extension.
        let (status, _) = get(&socket, "/sandbox-agent/version", None).await;
        assert_eq!(status, 401);
        let (status, body) = get(&socket, "/sandbox-agent/version", Some("t0ken")).await;
        assert_eq!(status, 200);
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["agent"], env!("CARGO_PKG_VERSION"));
        assert_eq!(answer["envd"], crate::version::ENVD_VERSION);
        server.abort();
    }

    #[tokio::test]
    async fn a_request_moves_the_markers_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("activity");
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::write(&marker, b"").unwrap();
        std::fs::File::options()
            .append(true)
            .open(&marker)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let config = Config {
            activity_marker: Some(marker.clone()),
            ..Config::default()
        };
        let agent = Agent::new(config, Services::default(), Children::new(false));
        let request = Request::get("/health")
            .body(crate::connect::empty())
            .unwrap();
        assert_eq!(agent.handle(request).await.status().as_u16(), 204);
        let mut moved = false;
        for _ in 0..100 {
            let now = std::fs::metadata(&marker).unwrap().modified().unwrap();
            if now > old + Duration::from_secs(3000) {
                moved = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(moved, "serving a request did not touch the marker");
    }

    #[tokio::test]
    async fn binding_refuses_a_regular_file_and_names_a_missing_parent() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-socket");
        std::fs::write(&file, b"keep me").unwrap();
        let e = bind_unix(&file).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        let e = bind_unix(&dir.path().join("missing/agent.sock"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("parent directory"), "{e}");
    }
}

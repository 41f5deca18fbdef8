//! The hook other services mount into the router: the filesystem service and `/files`.
//!
//! The router does what every call needs before a service sees it: the access token, the
//! user (Basic auth, or the default user), the Connect headers, and the bounded reading of the
//! request message. A service gets a [`CallContext`] and the message, and answers. Until a
//! service is mounted, its methods answer Connect `unimplemented` (and `/files` HTTP 501),
//! saying so, rather than pretending.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;
use hyper::{Request, Response};
use sandbox_envd::{ConnectError, Method};

use crate::config::Config;
use crate::connect::{Body, ResponseStream};
use crate::users::User;

/// A boxed future, for the dyn-compatible service traits.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the router resolved about a Connect call before reading its body.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The Unix user the call acts as (`Authorization: Basic`, else `--default-user`).
    pub user: User,
    /// `Connect-Timeout-Ms`, when the call has a deadline.
    pub timeout: Option<Duration>,
    /// `Keepalive-Ping-Interval` (envd's 90 s by default), for streams that send keepalives.
    pub keepalive: Duration,
    /// The request headers (extensions such as the replay offset are read from here).
    pub headers: HeaderMap,
    /// The agent's start flags (default workdir and env, account files, limits).
    pub config: Arc<Config>,
}

/// The `filesystem.Filesystem` service.
pub trait FilesystemService: Send + Sync {
    /// A unary method: the request message's JSON in, the answer's JSON out.
    fn unary(
        &self,
        call: CallContext,
        method: Method,
        request: Bytes,
    ) -> BoxFuture<'_, Result<Bytes, ConnectError>>;

    /// A server-streaming method (`WatchDir`): sends messages on `out`, keepalives included,
    /// and ends it with [`ResponseStream::end`].
    fn server_stream(
        &self,
        call: CallContext,
        method: Method,
        request: Bytes,
        out: ResponseStream,
    ) -> BoxFuture<'_, ()>;
}

/// What the router resolved about a `/files` request. `/files` is exempt from the access-token
/// check because envd also accepts a signed URL there: the handler decides.
#[derive(Debug, Clone)]
pub struct FilesContext {
    /// Whether the request may proceed without a signature: no token is configured, or its
    /// `X-Access-Token` matched. When false, a valid `signature` query is required.
    pub token_ok: bool,
    /// The configured token, to verify signatures with.
    pub access_token: Option<Arc<str>>,
    /// The agent's start flags (`default_user`, account files, limits).
    pub config: Arc<Config>,
}

/// `GET /files` and `POST /files`.
pub trait FilesService: Send + Sync {
    /// Answers one request (the method is GET or POST).
    fn handle(&self, ctx: FilesContext, request: Request<Body>) -> BoxFuture<'_, Response<Body>>;
}

/// The mounted services; `None` answers `unimplemented`.
#[derive(Clone, Default)]
pub struct Services {
    pub filesystem: Option<Arc<dyn FilesystemService>>,
    pub files: Option<Arc<dyn FilesService>>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("filesystem", &self.filesystem.is_some())
            .field("files", &self.files.is_some())
            .finish()
    }
}

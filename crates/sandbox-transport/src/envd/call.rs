//! The three call shapes on the wire: unary, server streaming and client streaming.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use sandbox_core::{Error, ErrorKind, Operation};
use sandbox_envd::{
    CONTENT_TYPE_CONNECT_JSON, CONTENT_TYPE_JSON, ConnectError, Envelope, HEADER_ACCEPT_ENCODING,
    HEADER_CONTENT_ENCODING, HEADER_KEEPALIVE_PING_INTERVAL, HEADER_PROTOCOL_VERSION,
    HEADER_TIMEOUT_MS, Method, PROTOCOL_VERSION, Rpc, filesystem, process,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::config::{ENVD_PORT, EnvdConfig, HttpVersion};
use super::stream::ServerStream;
use crate::client::outbound_error;
use crate::connector::BoxError;
use crate::transported;

/// A request body: a whole buffer, or the channel a client stream writes into.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Longest error body read from a failed answer: enough for any Connect error with details,
/// bounded so a misbehaving server cannot make an error cost memory.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// envd's edge routing headers (`docs/envd.md`, "Addressing").
const HEADER_SANDBOX_ID: HeaderName = HeaderName::from_static("e2b-sandbox-id");
const HEADER_SANDBOX_PORT: HeaderName = HeaderName::from_static("e2b-sandbox-port");
const HEADER_ACCESS_TOKEN: HeaderName = HeaderName::from_static("x-access-token");
const USER_AGENT: &str = concat!("sandbox-transport/", env!("CARGO_PKG_VERSION"));

/// The streaming calls envd keeps alive with ping events (`docs/envd.md`, "Headers and
/// authentication").
const KEPT_ALIVE: [Method; 4] = [
    process::method::START,
    process::method::CONNECT,
    filesystem::method::WATCH_DIR,
    filesystem::method::CREATE_WATCHER,
];

/// Per-call settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    timeout: Option<Option<Duration>>,
    /// Overrides the config's `Keepalive-Ping-Interval` for this call.
    keepalive: Option<Duration>,
    /// Extension request headers with a numeric value (the agent's `sandbox-*` headers);
    /// fixed slots keep the options `Copy`.
    extensions: [Option<(&'static str, u64)>; 2],
}

impl CallOptions {
    /// The defaults of the client's config.
    pub fn new() -> Self {
        CallOptions::default()
    }

    /// The call must be over within `timeout` (zero: no deadline). Sent to envd as
    /// `Connect-Timeout-Ms`; for `Start` it also bounds the process's life.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some((!timeout.is_zero()).then_some(timeout));
        self
    }

    /// The call has no deadline, whatever the client's default.
    pub fn no_timeout(mut self) -> Self {
        self.timeout = Some(None);
        self
    }

    /// Asks the server to ping this stream every `interval` (whole seconds, at least one),
    /// instead of the config's interval: a server learns that a client went away only when it
    /// next sends, so a shorter interval makes that known sooner.
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.keepalive = Some(interval.max(Duration::from_secs(1)));
        self
    }

    /// Sends the extension header `name: value` (an agent extension such as
    /// `sandbox-replay-offset`; plain envd ignores it). At most two per call: a third replaces
    /// the second.
    pub fn extension(mut self, name: &'static str, value: u64) -> Self {
        let slot = match self.extensions.iter().position(Option::is_none) {
            Some(free) => free,
            None => self.extensions.len() - 1,
        };
        self.extensions[slot] = Some((name, value));
        self
    }

    pub(crate) fn budget(self, default: Option<Duration>) -> Option<Duration> {
        self.timeout.unwrap_or(default)
    }
}

/// When a call must be over, and how long it was given (for the error message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    budget: Option<Duration>,
    at: Option<Instant>,
}

impl Deadline {
    pub(crate) fn start(budget: Option<Duration>) -> Self {
        Deadline {
            budget,
            at: budget.map(|b| Instant::now() + b),
        }
    }

    pub(crate) fn at(self) -> Option<Instant> {
        self.at
    }

    /// The `Connect-Timeout-Ms` value: what is left of the budget, at least 1 ms (0 would mean
    /// "no deadline" to envd).
    fn header(self) -> Option<HeaderValue> {
        let left = self.at?.saturating_duration_since(Instant::now());
        let ms = left.as_millis().clamp(1, 9_999_999_999);
        HeaderValue::from_str(&ms.to_string()).ok()
    }

    pub(crate) fn exceeded(self, op: Operation) -> Error {
        let ms = self.budget.map_or(0, |b| b.as_millis());
        transported(Error::timeout(
            op,
            format!("the call's deadline of {ms} ms passed"),
        ))
    }

    /// Runs `work`, failing with a timeout if the deadline passes first.
    pub(crate) async fn bound<T>(
        self,
        op: Operation,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match self.at {
            None => work.await,
            Some(at) => tokio::time::timeout_at(at, work)
                .await
                .unwrap_or_else(|_| Err(self.exceeded(op))),
        }
    }
}

pub(crate) struct Inner<C> {
    pub(crate) http: Client<C, Body>,
    pub(crate) config: EnvdConfig,
    token: Option<HeaderValue>,
    basic_auth: Option<HeaderValue>,
    sandbox_id: Option<HeaderValue>,
}

/// The envd client (see the module docs). Cheap to clone; clones share the connection pool.
pub struct EnvdClient<C> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C> Clone for EnvdClient<C> {
    fn clone(&self) -> Self {
        EnvdClient {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C> std::fmt::Debug for EnvdClient<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvdClient")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// A client dialling through `connector` (which decides what may be dialled: pass the
    /// guarded connector, or TLS around it, for any tenant-supplied envd).
    pub fn new(connector: C, config: EnvdConfig) -> Result<Self, Error> {
        let op = Operation::new("configure");
        let provider = config.provider;
        let header = |what: &str, value: &str| {
            HeaderValue::from_str(value).map_err(|_| {
                let refused = transported(Error::invalid_request(
                    op,
                    format!("the {what} cannot be sent in a header"),
                ));
                super::claim(provider, refused)
            })
        };
        let mut token = config
            .access_token
            .as_ref()
            .map(|t| header("access token", t.expose()))
            .transpose()?;
        if let Some(t) = &mut token {
            // Sensitive header values are kept out of HTTP/2 header compression tables.
            t.set_sensitive(true);
        }
        let basic_auth = config
            .user
            .as_ref()
            .map(|u| {
                let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{u}:"));
                header("user", &format!("Basic {credentials}"))
            })
            .transpose()?;
        let sandbox_id = config
            .sandbox_id
            .as_deref()
            .map(|id| header("sandbox id", id))
            .transpose()?;

        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new());
        if config.http == HttpVersion::Http2 {
            // One connection carries every call; pings notice a dead peer between calls.
            builder
                .http2_only(true)
                .http2_keep_alive_interval(Some(Duration::from_secs(30)))
                .http2_keep_alive_timeout(Duration::from_secs(10));
        }
        Ok(EnvdClient {
            inner: Arc::new(Inner {
                http: builder.build(connector),
                config,
                token,
                basic_auth,
                sandbox_id,
            }),
        })
    }

    /// The same client acting as the Unix `user` (RPCs and file transfers run as that user):
    /// it shares this client's connection pool, so on a one-connection transport (a relay
    /// stream) every user's calls are streams on the same connection.
    pub fn as_user(&self, user: &str) -> Result<Self, Error> {
        let config = self
            .inner
            .config
            .clone()
            .with_user(user)
            .map_err(|e| self.tag(e))?;
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        let basic_auth = HeaderValue::from_str(&format!("Basic {credentials}")).map_err(|_| {
            self.tag(transported(Error::invalid_request(
                Operation::new("configure"),
                "the user cannot be sent in a header",
            )))
        })?;
        Ok(EnvdClient {
            inner: Arc::new(Inner {
                http: self.inner.http.clone(),
                config,
                token: self.inner.token.clone(),
                basic_auth: Some(basic_auth),
                sandbox_id: self.inner.sandbox_id.clone(),
            }),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &EnvdConfig {
        &self.inner.config
    }

    /// Hands `error` to the configured provider, if any ([`super::claim`]).
    pub(crate) fn tag(&self, error: Error) -> Error {
        super::claim(self.inner.config.provider, error)
    }

    /// A request to `path_and_query` on envd with the headers every request carries.
    pub(crate) fn request(
        &self,
        op: Operation,
        method: hyper::Method,
        path_and_query: &str,
        body: Body,
    ) -> Result<Request<Body>, Error> {
        let base = &self.inner.config.base;
        let uri = hyper::Uri::builder()
            .scheme(base.scheme_str().unwrap_or("http"))
            .authority(base.authority().map_or("", |a| a.as_str()))
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| transported(Error::invalid_request(op, format!("request path: {e}"))))?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .map_err(|e| transported(Error::internal(op, format!("building the request: {e}"))))?;
        let headers = request.headers_mut();
        headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        if let Some(token) = &self.inner.token {
            headers.insert(HEADER_ACCESS_TOKEN, token.clone());
        }
        if let Some(id) = &self.inner.sandbox_id {
            headers.insert(HEADER_SANDBOX_ID, id.clone());
            headers.insert(HEADER_SANDBOX_PORT, HeaderValue::from(ENVD_PORT));
        }
        Ok(request)
    }

    fn rpc_request(
        &self,
        method: Method,
        body: Body,
        deadline: Deadline,
        options: CallOptions,
    ) -> Result<Request<Body>, Error> {
        let op = method.operation;
        let mut request = self.request(op, hyper::Method::POST, method.path, body)?;
        let headers = request.headers_mut();
        let identity = HeaderValue::from_static("identity");
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(method.content_type()),
        );
        headers.insert(
            HEADER_PROTOCOL_VERSION,
            HeaderValue::from_static(PROTOCOL_VERSION),
        );
        if method.is_enveloped() {
            headers.insert(HEADER_CONTENT_ENCODING, identity.clone());
            headers.insert(HEADER_ACCEPT_ENCODING, identity);
        } else {
            headers.insert(header::CONTENT_ENCODING, identity.clone());
            headers.insert(header::ACCEPT_ENCODING, identity);
        }
        if let Some(ms) = deadline.header() {
            headers.insert(HEADER_TIMEOUT_MS, ms);
        }
        if KEPT_ALIVE.contains(&method) {
            let interval = options
                .keepalive
                .unwrap_or(self.inner.config.keepalive_interval);
            headers.insert(
                HEADER_KEEPALIVE_PING_INTERVAL,
                HeaderValue::from(interval.as_secs()),
            );
        }
        for (name, value) in options.extensions.into_iter().flatten() {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                transported(Error::invalid_request(
                    op,
                    format!("{name:?} is not a header name"),
                ))
            })?;
            headers.insert(name, HeaderValue::from(value));
        }
        if let Some(auth) = &self.inner.basic_auth {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        Ok(request)
    }

    /// Sends `request`, mapping a transport failure (a guard refusal included) to the
    /// workspace's errors.
    pub(crate) async fn send(
        &self,
        op: Operation,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, Error> {
        send(&self.inner.http, op, request).await
    }

    /// Calls a unary method.
    pub async fn unary<R: Rpc>(
        &self,
        request: &R::Request,
        options: CallOptions,
    ) -> Result<R::Response, Error> {
        let method = R::METHOD;
        let op = method.operation;
        if method.is_enveloped() {
            return Err(self.tag(wrong_shape(op, "unary")));
        }
        let deadline = Deadline::start(options.budget(self.inner.config.unary_timeout));
        let body = serde_json::to_vec(request).map_err(|e| self.tag(encode_error(op, &e)))?;
        let call = async {
            let request = self.rpc_request(method, full(body), deadline, options)?;
            let response = self.send(op, request).await?;
            let response = ok_response(op, response, CONTENT_TYPE_JSON, false).await?;
            let limit = self.inner.config.max_message_size;
            let body = read_limited(op, response.into_body(), limit).await?;
            serde_json::from_slice(&body).map_err(|e| {
                transported(Error::internal(
                    op,
                    format!("envd answered a malformed message: {e}"),
                ))
            })
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }

    /// Calls a server-streaming method; the stream's messages are read from the result.
    /// Without a deadline in `options`, the stream is unbounded in time (its liveness is
    /// watched by the idle limit instead).
    pub async fn server_stream<R: Rpc>(
        &self,
        request: &R::Request,
        options: CallOptions,
    ) -> Result<ServerStream<R::Response>, Error> {
        let (stream, _) = self
            .server_stream_with_headers::<R>(request, options, hyper::HeaderMap::new())
            .await?;
        Ok(stream)
    }

    /// [`server_stream`](Self::server_stream) with extra request headers (a server's own
    /// extension, such as the sandbox agent's replay offset), answering the response's
    /// headers beside the stream. An extra header never replaces one the protocol sets.
    pub async fn server_stream_with_headers<R: Rpc>(
        &self,
        request: &R::Request,
        options: CallOptions,
        extra: hyper::HeaderMap,
    ) -> Result<(ServerStream<R::Response>, hyper::HeaderMap), Error> {
        let method = R::METHOD;
        let op = method.operation;
        if !method.server_streams() {
            return Err(self.tag(wrong_shape(op, "server-streaming")));
        }
        let deadline = Deadline::start(options.budget(None));
        let envelope = envelope_bytes(op, request).map_err(|e| self.tag(e))?;
        let open = async {
            let mut request = self.rpc_request(method, full(envelope), deadline, options)?;
            let headers = request.headers_mut();
            for (name, value) in &extra {
                if !headers.contains_key(name) {
                    headers.insert(name, value.clone());
                }
            }
            let response = self.send(op, request).await?;
            ok_response(op, response, CONTENT_TYPE_CONNECT_JSON, false).await
        };
        let response = deadline.bound(op, open).await.map_err(|e| self.tag(e))?;
        let (parts, body) = response.into_parts();
        Ok((
            ServerStream::new(op, body, deadline, &self.inner.config),
            parts.headers,
        ))
    }

    /// Opens a client-streaming call: send messages with [`ClientStream::send`], then read the
    /// one answer with [`ClientStream::finish`].
    pub fn client_stream<R: Rpc>(&self, options: CallOptions) -> Result<ClientStream<R>, Error>
    where
        R::Response: Send + 'static,
    {
        let method = R::METHOD;
        let op = method.operation;
        if !method.client_streams() {
            return Err(self.tag(wrong_shape(op, "client-streaming")));
        }
        let deadline = Deadline::start(options.budget(None));
        // A small buffer: a sender that outruns envd waits instead of queueing without bound.
        let (sender, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
        let request = self
            .rpc_request(method, body.boxed_unsync(), deadline, options)
            .map_err(|e| self.tag(e))?;
        let http = self.inner.http.clone();
        // The request runs on its own task: on HTTP/1.1 the answer's head may only come once
        // the whole request body is sent, which is after `finish` ends it.
        let response = tokio::spawn(async move { send(&http, op, request).await });
        Ok(ClientStream {
            op,
            sender: Some(sender),
            response: Some(response),
            deadline,
            config: self.inner.config.clone(),
            provider: self.inner.config.provider,
            _rpc: PhantomData,
        })
    }
}

async fn send<C>(
    http: &Client<C, Body>,
    op: Operation,
    request: Request<Body>,
) -> Result<Response<Incoming>, Error>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    http.request(request)
        .await
        .map_err(|e| outbound_error(op, &e))
}

/// A client-streaming call in progress (see [`EnvdClient::client_stream`]). Dropping it
/// without [`finish`](Self::finish) abandons the call.
pub struct ClientStream<R: Rpc> {
    op: Operation,
    sender: Option<http_body_util::channel::Sender<Bytes, BoxError>>,
    response: Option<JoinHandle<Result<Response<Incoming>, Error>>>,
    deadline: Deadline,
    config: EnvdConfig,
    provider: Option<sandbox_core::Provider>,
    _rpc: PhantomData<fn(R)>,
}

impl<R: Rpc> std::fmt::Debug for ClientStream<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientStream")
            .field("method", &R::METHOD.path)
            .field("open", &self.sender.is_some())
            .finish()
    }
}

impl<R: Rpc> ClientStream<R> {
    fn tag(&self, error: Error) -> Error {
        super::claim(self.provider, error)
    }

    /// Sends one message. If envd has already ended the call (an error answer), that error
    /// is returned.
    pub async fn send(&mut self, message: &R::Request) -> Result<(), Error> {
        let op = self.op;
        let bytes = envelope_bytes(op, message).map_err(|e| self.tag(e))?;
        let Some(sender) = self.sender.as_mut() else {
            return Err(self.tag(transported(Error::invalid_request(
                op,
                "the input stream is already closed",
            ))));
        };
        let deadline = self.deadline;
        let sent = deadline
            .bound(op, async {
                sender.send_data(bytes).await.map_err(|_| {
                    transported(Error::unavailable(
                        op,
                        "envd stopped reading the input stream",
                    ))
                })
            })
            .await;
        match sent {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::Timeout => Err(self.tag(e)),
            Err(e) => {
                // The request is over: its answer says why, if there is one.
                self.sender = None;
                match self.answer().await {
                    Err(reason) => Err(reason),
                    Ok(_) => Err(self.tag(e)),
                }
            }
        }
    }

    /// Ends the input and reads envd's answer.
    pub async fn finish(mut self) -> Result<R::Response, Error> {
        // Dropping the sender ends the request body.
        self.sender = None;
        self.answer().await
    }

    async fn answer(&mut self) -> Result<R::Response, Error> {
        let op = self.op;
        let Some(task) = self.response.take() else {
            return Err(self.tag(transported(Error::invalid_request(
                op,
                "the call's answer was already read",
            ))));
        };
        let deadline = self.deadline;
        let config = self.config.clone();
        let read = async move {
            let response = task.await.map_err(|e| {
                transported(Error::internal(op, format!("the request task failed: {e}")))
            })??;
            let response = ok_response(op, response, CONTENT_TYPE_CONNECT_JSON, false).await?;
            let mut stream =
                ServerStream::<R::Response>::new(op, response.into_body(), deadline, &config);
            let Some(answer) = stream.message().await? else {
                return Err(transported(Error::internal(
                    op,
                    "envd ended a client-streaming call without its answer",
                )));
            };
            if stream.message().await?.is_some() {
                return Err(transported(Error::internal(
                    op,
                    "envd answered a client-streaming call with more than one message",
                )));
            }
            Ok(answer)
        };
        deadline.bound(op, read).await.map_err(|e| self.tag(e))
    }
}

impl<R: Rpc> Drop for ClientStream<R> {
    fn drop(&mut self) {
        if let Some(task) = self.response.take() {
            task.abort();
        }
    }
}

pub(crate) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn envelope_bytes<T: serde::Serialize>(op: Operation, message: &T) -> Result<Bytes, Error> {
    Envelope::from_message(message)
        .map_err(|e| encode_error(op, &e))?
        .to_bytes()
        .map_err(|e| encode_error(op, &e))
}

fn encode_error(op: Operation, e: &dyn std::error::Error) -> Error {
    transported(Error::internal(op, format!("encoding the request: {e}")))
}

fn wrong_shape(op: Operation, shape: &str) -> Error {
    transported(Error::invalid_request(
        op,
        format!("{} is not a {shape} method", op.as_str()),
    ))
}

/// Reads at most `limit` bytes of `body`.
pub(crate) async fn read_limited(
    op: Operation,
    body: Incoming,
    limit: usize,
) -> Result<Bytes, Error> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(transported(Error::internal(
            op,
            format!("envd's answer is larger than {limit} bytes"),
        ))),
        Err(e) => Err(transported(Error::unavailable(
            op,
            format!("reading envd's answer: {}", crate::client::chain(&*e)),
        ))),
    }
}

/// The answer if it is a success of the expected content type; otherwise the error it
/// carries (a Connect error body, envd's HTTP error body on `/files`, or a proxy's page).
pub(crate) async fn ok_response(
    op: Operation,
    response: Response<Incoming>,
    content_type: &str,
    files: bool,
) -> Result<Response<Incoming>, Error> {
    let status = response.status();
    if status != StatusCode::OK {
        return Err(error_answer(op, response, files).await);
    }
    let got = media_type(response.headers());
    if !got.eq_ignore_ascii_case(content_type) {
        return Err(transported(Error::internal(
            op,
            format!("envd answered with content type {got:?}, expected {content_type:?}"),
        )));
    }
    Ok(response)
}

/// The error a non-success answer carries.
///
/// On the RPC paths only a Connect error body is believed; a bare status came from something
/// in front of envd and is classified the Connect way (a proxy's 404 is `unimplemented`, never
/// `not_found`). On `/files` (`files`), envd's own HTTP error body (`{"code": <the status>,
/// "message": ...}`) is believed too, so a missing file is `not_found`.
pub(crate) async fn error_answer(
    op: Operation,
    response: Response<Incoming>,
    files: bool,
) -> Error {
    let status = response.status().as_u16();
    // A body that cannot be read is no reason to lose the status.
    let body = read_limited(op, response.into_body(), ERROR_BODY_LIMIT)
        .await
        .unwrap_or_default();
    if files
        && let Ok(envd) = serde_json::from_slice::<sandbox_envd::files::HttpError>(&body)
        && envd.code == status
    {
        let kind = ErrorKind::from_http_status(op, status);
        return transported(Error::new(kind, op, envd.message)).with_http_status(status);
    }
    let error = ConnectError::from_unary_response(status, &body);
    transported(error.to_core_error(op)).with_http_status(status)
}

/// The media type of a `Content-Type` header, without parameters (`charset=utf-8`).
fn media_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map_or("", str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_pick_the_budget() {
        let default = Some(Duration::from_secs(60));
        assert_eq!(CallOptions::new().budget(default), default);
        assert_eq!(CallOptions::new().no_timeout().budget(default), None);
        assert_eq!(
            CallOptions::new().timeout(Duration::ZERO).budget(default),
            None
        );
        assert_eq!(
            CallOptions::new()
                .timeout(Duration::from_millis(5))
                .budget(None),
            Some(Duration::from_millis(5))
        );
    }

    #[test]
    fn media_types_ignore_parameters_and_case() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("Application/JSON; charset=utf-8"),
        );
        assert!(media_type(&h).eq_ignore_ascii_case(CONTENT_TYPE_JSON));
        assert_eq!(media_type(&HeaderMap::new()), "");
    }

    #[tokio::test]
    async fn deadlines_bound_work_and_header_what_is_left() {
        let d = Deadline::start(Some(Duration::from_millis(20)));
        let header: u64 = d.header().unwrap().to_str().unwrap().parse().unwrap();
        assert!((1..=20).contains(&header));
        let op = Operation::new("t");
        let err = d
            .bound(op, std::future::pending::<Result<(), Error>>())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        assert!(Deadline::start(None).header().is_none());
    }
}

//! Forwarding one HTTP request, as a client sent it, to envd over this client's connection:
//! the piece a router in front of sandboxes needs (an SDK's request in, the sandbox's agent's
//! answer out), shared by every provider whose envd this client reaches.
//!
//! - **Streamed both ways.** The request body is handed to hyper as it arrives and the
//!   response body is handed back unread, so neither is ever whole in memory. Back-pressure
//!   is hyper's: over HTTP/2 a body is polled only for as much as the peer's flow-control
//!   window allows, so a slow reader on either side stalls its writer instead of growing a
//!   buffer here. A Connect server stream stays open for as long as both ends keep it.
//! - **Hop-by-hop headers stay on their hop** ([`HOP_BY_HOP`], and every header a
//!   `Connection` header names). `TE` passes only as `trailers`, the one value HTTP/2 allows.
//!   The request goes out on whatever this client speaks (the channel's h2c), whichever HTTP
//!   the caller spoke; response trailers pass back.
//! - **Only origin-form requests** (`/path?query`) are forwarded. An absolute URI from an
//!   HTTP/1 client (a proxy request to elsewhere), `CONNECT`, an asterisk (`OPTIONS *`) or an
//!   authority alone are refused with a 4xx before anything is sent. The destination is
//!   always this client's envd: the URI's authority, and the `Host` header, are not consulted.
//! - **The agent's own extensions are not forwarded.** Paths under `/sandbox-agent/` (the
//!   version check and the TCP tunnel) are the service's means of managing a sandbox's agent:
//!   the tunnel dials any port inside the sandbox, which only the service's own port policy
//!   may open, and no envd client (the SDKs included) ever asks for them. A router exposing
//!   them would hand the caller a way around that policy, so they answer 404 here, also when
//!   spelt with percent-escapes, a different case or dot segments, so the agent's literal
//!   matching cannot be reached around. One is read-only and reveals nothing a caller who may
//!   run commands cannot see with `ps`: `GET` [`AGENT_PROCESS_LISTING`] (the processes with
//!   their output counts and exit statuses), which an envd client of this workspace's own
//!   (the E2B adapter) reads to attach exactly and list ended processes. It passes, spelt
//!   exactly so and with no other method.
//! - **Credentials.** The caller's headers pass (its `Authorization` picks the Unix user, as
//!   envd defines). When this client has an access token or edge routing headers configured,
//!   they replace whatever the caller sent: the router decided the caller may reach this
//!   sandbox, and the upstream credential is the service's, never the caller's guess.
//! - **Errors are answers.** A refused form, a channel that cannot be reached or a cut
//!   connection come back as an HTTP answer whose JSON body carries a machine-readable code,
//!   in the service's error shape ([`error_response`]); nothing here panics on any input.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::client::legacy::connect::Connect;
use sandbox_core::{Error, ErrorKind, Operation};

use super::call::EnvdClient;
use crate::connector::BoxError;
use crate::transported;

/// The operation of a forwarded request, in errors.
pub const OP_FORWARD: Operation = Operation::new("forward");

/// The body of a forwarded answer: envd's, streamed, or an error's JSON.
pub type ForwardBody = UnsyncBoxBody<Bytes, BoxError>;

/// The path prefix of the agent's own endpoints, which are never forwarded (module docs).
pub const AGENT_EXTENSION_PREFIX: &str = "/sandbox-agent/";

/// The agent's process listing: the one extension forwarded (`GET`, this exact spelling; module
/// docs).
pub const AGENT_PROCESS_LISTING: &str = "/sandbox-agent/processes";

/// Headers that describe one connection, not the message: never forwarded, either way.
pub const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
];

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Forwards `request` to envd and returns its answer, streamed (module docs). Never
    /// fails: a refusal or a failure is an answer of its own ([`error_response`]).
    pub async fn forward<B>(&self, request: Request<B>) -> Response<ForwardBody>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        self.forward_holding(request, ()).await
    }

    /// [`forward`](Self::forward), keeping `hold` alive until the answer's body is over (read
    /// to its end or dropped): a lease on the connection, which must not be closed as idle
    /// while a stream on it is still being read.
    pub async fn forward_holding<B, H>(&self, request: Request<B>, hold: H) -> Response<ForwardBody>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
        H: Send + 'static,
    {
        let version = request.version();
        let mut response = match self.try_forward(request).await {
            Ok(answer) => answer.map(|body| {
                Holding {
                    body: body.map_err(BoxError::from),
                    _hold: hold,
                }
                .boxed_unsync()
            }),
            Err(e) => error_response(&e),
        };
        // The answer goes back on the caller's HTTP, whatever envd's was.
        *response.version_mut() = version;
        response
    }

    /// Forwards `request`, or says why it was not forwarded or failed: a refused form is
    /// `invalid_request` (`unsupported` for `CONNECT`, `not_found` for the agent's
    /// extensions), a failed connection `unavailable`, all of them with
    /// [`Origin::Transport`](sandbox_core::Origin) or this client's provider.
    pub async fn try_forward<B>(
        &self,
        request: Request<B>,
    ) -> Result<Response<hyper::body::Incoming>, Error>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let path_and_query = origin_form(&request).map_err(|e| self.tag(e))?;
        let (parts, body) = request.into_parts();
        let body = body.map_err(Into::into).boxed_unsync();
        let mut outgoing = self.request(OP_FORWARD, parts.method.clone(), &path_and_query, body)?;
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers, true);
        headers.remove(header::HOST);
        // What `request` set (the user agent, the configured token and routing headers) wins
        // over what the caller sent; the caller's user agent is kept when none is configured.
        for (name, value) in outgoing.headers() {
            if name == header::USER_AGENT && headers.contains_key(header::USER_AGENT) {
                continue;
            }
            headers.insert(name.clone(), value.clone());
        }
        *outgoing.headers_mut() = headers;
        let mut response = self
            .send(OP_FORWARD, outgoing)
            .await
            .map_err(|e| self.tag(e))?;
        strip_hop_by_hop(response.headers_mut(), false);
        Ok(response)
    }
}

/// The request's origin-form target (`/path?query`), or why it is refused (module docs).
fn origin_form<B>(request: &Request<B>) -> Result<String, Error> {
    let refuse = |why: String| transported(Error::invalid_request(OP_FORWARD, why));
    if request.method() == Method::CONNECT {
        return Err(transported(Error::unsupported(
            OP_FORWARD,
            "CONNECT is not forwarded: only origin-form requests reach a sandbox",
        )));
    }
    let uri = request.uri();
    // HTTP/2 always carries a scheme and an authority (its pseudo-headers, the Host of
    // HTTP/1); an HTTP/1 request with them is in absolute form, a proxy request to elsewhere.
    let http1 = matches!(
        request.version(),
        Version::HTTP_09 | Version::HTTP_10 | Version::HTTP_11
    );
    if http1 && (uri.scheme().is_some() || uri.authority().is_some()) {
        return Err(refuse(format!(
            "an absolute request target ({}) is not forwarded: send an origin-form path",
            printable(&uri.to_string())
        )));
    }
    let Some(target) = uri.path_and_query() else {
        return Err(refuse("the request has no path".to_owned()));
    };
    let path = target.path();
    if !path.starts_with('/') {
        return Err(refuse(format!(
            "the request target {} is not an origin-form path",
            printable(target.as_str())
        )));
    }
    let listing = request.method() == Method::GET && path == AGENT_PROCESS_LISTING;
    if reaches_agent_extension(path) && !listing {
        return Err(transported(Error::not_found(
            OP_FORWARD,
            format!(
                "{} is the sandbox agent's own endpoint, which is not forwarded",
                printable(path)
            ),
        )));
    }
    Ok(target.as_str().to_owned())
}

/// Whether `path` names the agent's extensions under any spelling the agent, or something
/// between, could read as [`AGENT_EXTENSION_PREFIX`]: percent-escapes decoded, case folded,
/// empty and `.` segments dropped and `..` applied.
fn reaches_agent_extension(path: &str) -> bool {
    let decoded = percent_decode(path);
    let mut segments: Vec<&[u8]> = Vec::new();
    for segment in decoded.split(|b| *b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let prefix = AGENT_EXTENSION_PREFIX.trim_matches('/').as_bytes();
    segments
        .first()
        .is_some_and(|first| first.eq_ignore_ascii_case(prefix))
}

/// `%XX` escapes decoded (an invalid escape stays as it is).
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// At most 200 characters of `s`, for an error message.
fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(200).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    format!("{out:?}")
}

/// Removes the hop-by-hop headers ([`HOP_BY_HOP`] and those `Connection` names). A request's
/// `TE: trailers` is kept (`keep_te_trailers`): it says the caller reads trailers, which a
/// Connect or gRPC server may depend on, and is the one `TE` HTTP/2 carries.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_te_trailers: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let trailers = keep_te_trailers
        && headers
            .get_all(header::TE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| {
                t.split(';')
                    .next()
                    .is_some_and(|t| t.trim().eq_ignore_ascii_case("trailers"))
            });
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// The answer that stands for `error`: the status and machine-readable code the service gives
/// such an error, in its error shape `{"error":{"code":"...","message":"..."}}`.
pub fn error_response(error: &Error) -> Response<ForwardBody> {
    let (status, code) = status_and_code(error);
    let body = serde_json::json!({
        "error": { "code": code, "message": error.message() }
    });
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    let mut response = Response::new(
        Full::new(Bytes::from(bytes))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The service's status and code for `error`: core's one table
/// (`Error::status_and_code`, which the service's API answers with too), except that a
/// `CONNECT`, the one `unsupported` a forward makes itself, is 405.
pub fn status_and_code(error: &Error) -> (StatusCode, &'static str) {
    if error.kind() == ErrorKind::Unsupported
        && error.code().is_none()
        && error.operation() == OP_FORWARD
    {
        return (StatusCode::METHOD_NOT_ALLOWED, "unsupported");
    }
    let (status, code) = error.status_and_code();
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        code,
    )
}

/// A body that keeps `_hold` alive for as long as it is.
struct Holding<B, H> {
    body: B,
    _hold: H,
}

impl<B: HttpBody + Unpin, H> HttpBody for Holding<B, H> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B, H> Unpin for Holding<B, H> where B: Unpin {}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorCode;

    #[test]
    fn agent_extensions_are_found_under_any_spelling() {
        for path in [
            "/sandbox-agent/version",
            "/sandbox-agent",
            "/SANDBOX-AGENT/tunnel/22",
            "/%73andbox-agent/version",
            "/sandbox%2Dagent/version",
            "//sandbox-agent/version",
            "/./sandbox-agent/version",
            "/files/../sandbox-agent/version",
            "/../../sandbox-agent/version",
        ] {
            assert!(reaches_agent_extension(path), "{path}");
        }
        for path in [
            "/files",
            "/health",
            "/process.Process/Start",
            "/sandbox-agents/version",
            "/files/sandbox-agent/x",
            "/%zz/sandbox-agent",
            "/",
        ] {
            assert!(!reaches_agent_extension(path), "{path}");
        }
    }

    #[test]
    fn hop_by_hop_headers_go_and_te_trailers_stays_on_requests_only() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "x-a, Keep-Alive"),
            ("x-a", "1"),
            ("keep-alive", "5"),
            ("te", "gzip, trailers;q=1"),
            ("upgrade", "h2c"),
            ("proxy-authenticate", "Basic"),
            ("x-b", "2"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let mut response = h.clone();
        strip_hop_by_hop(&mut h, true);
        let mut names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "x-b"]);
        assert_eq!(
            h.get(header::TE).map(HeaderValue::as_bytes),
            Some(&b"trailers"[..])
        );
        strip_hop_by_hop(&mut response, false);
        assert_eq!(
            response.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-b"]
        );
        // A TE without trailers goes entirely.
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h, true);
        assert!(h.is_empty());
    }

    #[test]
    fn errors_answer_with_the_services_status_and_code() {
        let paused = Error::unavailable(Operation::new("open_channel"), "paused")
            .with_code(ErrorCode::SandboxPaused);
        assert_eq!(
            status_and_code(&paused),
            (StatusCode::CONFLICT, "session_sandbox_paused")
        );
        let down = Error::unavailable(OP_FORWARD, "cut");
        assert_eq!(
            status_and_code(&down),
            (StatusCode::SERVICE_UNAVAILABLE, "provider_unavailable")
        );
        let slow = Error::timeout(OP_FORWARD, "slow");
        assert_eq!(
            status_and_code(&slow),
            (StatusCode::GATEWAY_TIMEOUT, "provider_timeout")
        );
        let connect = Error::unsupported(OP_FORWARD, "CONNECT");
        assert_eq!(status_and_code(&connect).0, StatusCode::METHOD_NOT_ALLOWED);
        let response = error_response(&paused);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response
                .headers()
                .get(header::CONTENT_TYPE)
                .map(HeaderValue::as_bytes),
            Some(&b"application/json"[..])
        );
    }

    #[test]
    fn long_targets_are_cut_in_messages() {
        let long = "x".repeat(1000);
        let shown = printable(&long);
        assert!(shown.chars().count() < 210, "{shown}");
        assert!(shown.contains('…'));
    }
}

//! The client side of the `sandbox` CLI: `exec`, `files get|put|ls|mv`, `shell`, and the
//! background-process and watch commands (`ps`, `attach`, `kill`, `watch`) talk to a running
//! `sandbox serve` over its HTTP API, as any other client would.
//!
//! The bearer token comes from `SANDBOX_TOKEN` or a token file (default: the development token
//! file `sandbox serve` creates), never from a command-line argument, which other users of the
//! machine could read in the process list.

pub mod exec;
pub mod files;
pub mod processes;
pub mod shell;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use url::Url;

use crate::api;

/// A request body: whole or streamed from a file.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// How long connecting to the service may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an error answer the client reads.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why a client command failed.
#[derive(Debug)]
pub enum ClientError {
    /// The command line or local input is wrong.
    Usage(String),
    /// The service could not be reached or the connection broke.
    Connect(String),
    /// The service answered with an error.
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// A local file or terminal operation failed.
    Local(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Usage(m) | ClientError::Connect(m) | ClientError::Local(m) => {
                f.write_str(m)
            }
            ClientError::Api {
                status,
                code,
                message,
            } => write!(f, "{code} ({status}): {message}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl ClientError {
    fn local(what: impl fmt::Display, e: impl fmt::Display) -> Self {
        ClientError::Local(format!("{what}: {e}"))
    }
}

/// Where the service is and who the caller is.
#[derive(Clone)]
pub struct Client {
    base: Url,
    token: String,
    http: HttpClient<HttpConnector, Body>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("Client")
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

/// Where the token comes from, in order: `SANDBOX_TOKEN`, `--token-file`, the development token
/// file.
pub fn load_token(env_token: Option<&str>, file: Option<&Path>) -> Result<String, ClientError> {
    if let Some(t) = env_token.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(t.to_owned());
    }
    let path: PathBuf = file.map_or_else(crate::serve::default_dev_token_file, Path::to_path_buf);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ClientError::Usage(format!(
            "no API token: set SANDBOX_TOKEN or --token-file (cannot read {}: {e})",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ClientError::Usage(format!("{} is empty", path.display())));
    }
    Ok(token.to_owned())
}

impl Client {
    /// A client of the service at `server` (`http://host:port`).
    pub fn new(server: &str, token: String) -> Result<Self, ClientError> {
        let base = Url::parse(server)
            .map_err(|e| ClientError::Usage(format!("server {server:?} is not a URL: {e}")))?;
        match base.scheme() {
            "http" => {}
            "https" => {
                return Err(ClientError::Usage(
                    "the CLI speaks plain HTTP to the service (loopback or a private network); \
                     https is not supported yet"
                        .to_owned(),
                ));
            }
            other => {
                return Err(ClientError::Usage(format!(
                    "server scheme {other:?}: use http://host:port"
                )));
            }
        }
        if base.host_str().is_none() {
            return Err(ClientError::Usage(format!("server {server:?} has no host")));
        }
        if token.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            return Err(ClientError::Usage(
                "the API token must be printable ASCII without spaces".to_owned(),
            ));
        }
        // The CLI dials the server its user named, never a tenant-supplied endpoint, so the
        // guarded connector does not apply.
        #[expect(
            clippy::disallowed_methods,
            reason = "the operator's own service, not a tenant-supplied endpoint"
        )]
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        let http = HttpClient::builder(TokioExecutor::new()).build(connector);
        Ok(Client { base, token, http })
    }

    /// The URL of `segments` below the server (each percent-encoded as one path segment) with
    /// `query` pairs.
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// The URL of a session route: `/v1/sessions/{session}/{rest...}`.
    pub fn session_url(&self, session: &str, rest: &[&str], query: &[(&str, &str)]) -> Url {
        let mut segments = vec!["v1", "sessions", session];
        segments.extend_from_slice(rest);
        self.url(&segments, query)
    }

    /// Sends a request; an error status becomes [`ClientError::Api`] with the service's code.
    pub async fn send(
        &self,
        method: Method,
        url: &Url,
        content_type: Option<&str>,
        body: Body,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(url.as_str())
            .header("authorization", format!("Bearer {}", self.token));
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let request = request
            .body(body)
            .map_err(|e| ClientError::Usage(format!("cannot build the request: {e}")))?;
        let response = self.http.request(request).await.map_err(|e| {
            ClientError::Connect(format!(
                "cannot reach the service at {} ({}); is `sandbox serve` running there?",
                self.base,
                error_chain(&e)
            ))
        })?;
        if response.status().is_client_error() || response.status().is_server_error() {
            return Err(api_error(response).await);
        }
        Ok(response)
    }

    /// Sends a JSON body (one of the API's request types) and reads the JSON answer as one of
    /// its response types (an empty answer is read as `null`).
    pub async fn json<B, T>(
        &self,
        method: Method,
        url: &Url,
        body: Option<&B>,
    ) -> Result<T, ClientError>
    where
        B: serde::Serialize + ?Sized,
        T: serde::de::DeserializeOwned,
    {
        let (ct, bytes) =
            match body {
                Some(v) => (
                    Some("application/json"),
                    Bytes::from(serde_json::to_vec(v).map_err(|e| {
                        ClientError::Usage(format!("cannot encode the request: {e}"))
                    })?),
                ),
                None => (None, Bytes::new()),
            };
        let response = self.send(method, url, ct, full(bytes)).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Connect(format!("the answer broke off: {e}")))?
            .to_bytes();
        let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        serde_json::from_slice(bytes)
            .map_err(|e| ClientError::Connect(format!("the service answered unexpected JSON: {e}")))
    }
}

/// A whole body.
pub fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// The error answer as `{code, message}`; anything else is described by its status.
async fn api_error(response: Response<Incoming>) -> ClientError {
    let status = response.status().as_u16();
    let limited = http_body_util::Limited::new(response.into_body(), MAX_ERROR_BODY);
    let bytes = limited
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let (code, message) = error_body(&bytes).unwrap_or_else(|| {
        (
            format!("http_{status}"),
            String::from_utf8_lossy(&bytes).trim().to_owned(),
        )
    });
    ClientError::Api {
        status,
        code,
        message,
    }
}

/// The `{code, message}` of an error answer in the API's error shape.
pub(crate) fn error_body(bytes: &[u8]) -> Option<(String, String)> {
    serde_json::from_slice::<api::ErrorResponse>(bytes)
        .ok()
        .map(|e| (e.error.code, e.error.message))
}

/// An error and its sources on one line (hyper's top-level message alone says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn client(server: &str) -> Result<Client, ClientError> {
        Client::new(server, "tok".to_owned())
    }

    #[test]
    fn session_and_path_are_encoded_as_data() {
        let c = client("http://127.0.0.1:8080").unwrap();
        let url = c.session_url(
            "a b/../c?d",
            &["files", "content"],
            &[("path", "/workspace/x y&z=1")],
        );
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:8080/v1/sessions/a%20b%2F..%2Fc%3Fd/files/content?path=%2Fworkspace%2Fx+y%26z%3D1"
        );
        // A base with a path prefix (a reverse proxy) keeps it.
        let c = client("http://proxy.internal/sandbox/").unwrap();
        assert_eq!(
            c.url(&["healthz"], &[]).as_str(),
            "http://proxy.internal/sandbox/healthz"
        );
    }

    #[test]
    fn bad_servers_and_tokens_are_usage_errors() {
        for (server, needle) in [
            ("not a url", "not a URL"),
            ("https://example.com", "https is not supported"),
            ("ftp://h", "use http://"),
        ] {
            let e = client(server).unwrap_err();
            assert!(matches!(e, ClientError::Usage(_)), "{server}");
            assert!(e.to_string().contains(needle), "{server}: {e}");
        }
        let e = Client::new("http://h", "two words".to_owned()).unwrap_err();
        assert!(e.to_string().contains("printable ASCII"), "{e}");
    }

    #[test]
    fn the_token_comes_from_the_environment_then_the_file() {
        assert_eq!(load_token(Some(" abc "), None).unwrap(), "abc");
        let dir = std::env::temp_dir().join(format!("sbx-client-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        assert_eq!(load_token(None, Some(&file)).unwrap(), "from-file");
        assert_eq!(load_token(Some(""), Some(&file)).unwrap(), "from-file");
        let e = load_token(None, Some(&dir.join("missing"))).unwrap_err();
        assert!(e.to_string().contains("SANDBOX_TOKEN"), "{e}");
        std::fs::write(&file, "  \n").unwrap();
        assert!(load_token(None, Some(&file)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

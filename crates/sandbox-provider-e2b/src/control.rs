//! The control-plane client: one JSON call at a time over the guarded, pooled client.
//!
//! - **Every byte through the guard.** Calls ride a [`GuardedClient`] from the process's
//!   [`GatewayPool`](sandbox_transport::GatewayPool): the SSRF guard judges the address each
//!   connection dials, so a control plane that resolves to a metadata address is refused at
//!   connect time, redirects are never followed.
//! - **Authenticated.** `X-API-Key` on every call; the key is never logged or echoed.
//! - **Per-route deadlines.** A call is bounded as a whole, answer body included, by its
//!   route's deadline (create 60 s, connect 130 s, snapshot 250 s, the rest the config's HTTP
//!   timeout). A passed deadline is `timeout`; a refused or reset connection `unavailable`.
//! - **Retries.** Only a call marked [`Retry::Idempotent`] is sent again, and only after an
//!   answer that says when (429 or 503 with `Retry-After`, at most [`MAX_ATTEMPTS`] times,
//!   each wait capped by [`MAX_RETRY_WAIT`] and the deadline). A create is never retried here:
//!   the provider decides with its own idempotency check (`provider.rs`).
//! - **Bounded answers.** A body over [`ANSWER_LIMIT`] fails the call instead of being
//!   buffered.
//! - **Cancellation.** Dropping a call's future drops its request; nothing is recorded, and
//!   the pool discards the half-used connection.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, StatusCode};
use sandbox_core::{Error, Operation, Secret};
use sandbox_transport::GuardedClient;
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;

use crate::errors::{self, provider_error};

/// The largest control-plane answer read (a page of 100 listed sandboxes with metadata is
/// far below it).
pub const ANSWER_LIMIT: usize = 4 * 1024 * 1024;
/// How many times an idempotent call is sent at most.
pub const MAX_ATTEMPTS: u32 = 3;
/// The longest wait a `Retry-After` may ask for before a retry.
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);
const USER_AGENT: &str = concat!("sandbox-provider-e2b/", env!("CARGO_PKG_VERSION"));
const API_KEY: &str = "x-api-key";

/// Whether a call may be sent again after an answer that asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Never: the call changes state, and a second one could do it twice.
    Never,
    /// After a 429 or 503 with `Retry-After`.
    Idempotent,
}

/// One call.
#[derive(Debug, Clone)]
pub struct Call {
    pub op: Operation,
    pub method: Method,
    /// Below the API URL: `/sandboxes/{id}`, already escaped.
    pub path: String,
    pub query: Vec<(String, String)>,
    pub body: Option<Bytes>,
    pub deadline: Duration,
    pub retry: Retry,
}

impl Call {
    /// A call with no query or body, not retried.
    pub fn new(op: Operation, method: Method, path: impl Into<String>, deadline: Duration) -> Self {
        Call {
            op,
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            deadline,
            retry: Retry::Never,
        }
    }

    /// With `body` as its JSON.
    pub fn json(mut self, body: &impl Serialize) -> Result<Self, Error> {
        let bytes = serde_json::to_vec(body).map_err(|e| {
            provider_error(Error::internal(
                self.op,
                format!("encoding the request: {e}"),
            ))
        })?;
        self.body = Some(Bytes::from(bytes));
        Ok(self)
    }

    /// With the query parameter `name=value` (escaped when sent).
    pub fn param(mut self, name: &str, value: impl Into<String>) -> Self {
        self.query.push((name.to_owned(), value.into()));
        self
    }

    /// Marked idempotent.
    pub fn idempotent(mut self) -> Self {
        self.retry = Retry::Idempotent;
        self
    }
}

/// An answer: its status, headers and whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub op: Operation,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// This answer as an error unless its status is one of `ok`.
    pub fn expect(self, ok: &[u16]) -> Result<Answer, Error> {
        if ok.contains(&self.status.as_u16()) {
            Ok(self)
        } else {
            Err(errors::http_error(
                self.op,
                self.status.as_u16(),
                &self.body,
            ))
        }
    }

    /// The body as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| errors::unreadable(self.op, e))
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct Control {
    client: GuardedClient<Full<Bytes>>,
    base: Url,
    key: HeaderValue,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl Control {
    /// A client of the plane at `api_url`, sending `key`, over `client`.
    pub fn new(
        client: GuardedClient<Full<Bytes>>,
        api_url: &str,
        key: &Secret,
    ) -> Result<Self, Error> {
        let base = parse_api_url(api_url)?;
        let mut key = HeaderValue::from_str(key.expose()).map_err(|_| {
            provider_error(Error::invalid_request(
                Operation::VALIDATE,
                "e2b_provider.api_key holds characters a header cannot carry",
            ))
        })?;
        key.set_sensitive(true);
        Ok(Control { client, base, key })
    }

    /// The plane's host, as routing tells it from sandbox hosts.
    pub fn host(&self) -> Option<&str> {
        self.base.host_str()
    }

    /// The URL of `call`.
    pub fn url(&self, call: &Call) -> String {
        let mut url = self.base.clone();
        let path = format!("{}{}", self.base.path().trim_end_matches('/'), call.path);
        url.set_path(&path);
        if !call.query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(call.query.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
        url.into()
    }

    fn request(&self, call: &Call) -> Result<Request<Full<Bytes>>, Error> {
        let mut builder = Request::builder()
            .method(call.method.clone())
            .uri(self.url(call))
            .header(API_KEY, self.key.clone())
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::ACCEPT, "application/json");
        if call.body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        builder
            .body(Full::new(call.body.clone().unwrap_or_default()))
            .map_err(|e| {
                provider_error(Error::internal(
                    call.op,
                    format!("building the request: {e}"),
                ))
            })
    }

    /// Sends `call` until it has an answer to hand back (any status), within its deadline.
    pub async fn send(&self, call: &Call) -> Result<Answer, Error> {
        let started = tokio::time::Instant::now();
        let mut attempt = 1;
        loop {
            let left = call.deadline.saturating_sub(started.elapsed());
            let answer = match tokio::time::timeout(left, self.once(call)).await {
                Ok(answer) => answer?,
                Err(_) => {
                    return Err(provider_error(Error::timeout(
                        call.op,
                        format!(
                            "the control plane did not answer {} {} within {:?}",
                            call.method, call.path, call.deadline
                        ),
                    )));
                }
            };
            let wait = match (call.retry, retry_after(&answer)) {
                (Retry::Idempotent, Some(wait)) if attempt < MAX_ATTEMPTS => wait,
                _ => return Ok(answer),
            };
            if started.elapsed() + wait >= call.deadline {
                return Ok(answer);
            }
            tracing::debug!(
                op = call.op.as_str(),
                status = answer.status.as_u16(),
                wait_ms = wait.as_millis() as u64,
                attempt,
                "the control plane asked for a retry"
            );
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn once(&self, call: &Call) -> Result<Answer, Error> {
        let request = self.request(call)?;
        let response = self
            .client
            .request(&request)
            .await
            .map_err(|e| provider_error(e.with_operation(call.op)))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|e| {
                provider_error(Error::unavailable(
                    call.op,
                    format!("reading the control plane's answer: {e}"),
                ))
            })?
            .to_bytes();
        Ok(Answer {
            op: call.op,
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
}

/// How long an answer asks to be waited for before a retry: a 429 or 503 with
/// `Retry-After` in whole seconds, capped by [`MAX_RETRY_WAIT`].
fn retry_after(answer: &Answer) -> Option<Duration> {
    if !matches!(answer.status.as_u16(), 429 | 503) {
        return None;
    }
    let seconds: u64 = answer.header("retry-after")?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_WAIT))
}

/// The API URL, checked: `http` or `https`, a host, no credentials, query or fragment.
pub fn parse_api_url(raw: &str) -> Result<Url, Error> {
    let bad = |why: &str| {
        provider_error(Error::invalid_request(
            Operation::VALIDATE,
            format!("e2b_provider.api_url {raw:?}: {why}"),
        ))
    };
    let url = Url::parse(raw.trim()).map_err(|_| bad("not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("credentials belong in api_key, not the URL"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a query or fragment is not allowed"));
    }
    Ok(url)
}

/// One path segment, escaped (an ID or a template name in a route).
pub fn segment(raw: &str) -> String {
    url::form_urlencoded::byte_serialize(raw.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_urls_are_checked() {
        assert!(parse_api_url("https://api.e2b.app").is_ok());
        assert!(parse_api_url("http://127.0.0.1:3000/prefix").is_ok());
        for bad in ["ftp://h", "http://u:p@h", "http://h/?a=1", "nope", ""] {
            let e = parse_api_url(bad).unwrap_err();
            assert!(e.to_string().contains("e2b_provider.api_url"), "{bad}: {e}");
        }
    }

    #[test]
    fn segments_are_escaped() {
        assert_eq!(segment("i1abc"), "i1abc");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
        assert_eq!(segment("../x"), "..%2Fx");
    }

    fn answer(status: u16, retry: Option<&str>) -> Answer {
        let mut headers = HeaderMap::new();
        if let Some(r) = retry {
            headers.insert("retry-after", HeaderValue::from_str(r).unwrap());
        }
        Answer {
            op: Operation::GET,
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            body: Bytes::new(),
        }
    }

    #[test]
    fn only_a_dated_429_or_503_asks_for_a_retry() {
        assert_eq!(
            retry_after(&answer(503, Some("2"))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&answer(429, Some("1"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry_after(&answer(503, Some("3600"))),
            Some(MAX_RETRY_WAIT)
        );
        assert_eq!(retry_after(&answer(503, None)), None);
        assert_eq!(retry_after(&answer(500, Some("1"))), None);
        assert_eq!(retry_after(&answer(503, Some("soon"))), None);
    }
}

//! Reading request bodies, bounded three ways: in size (a route's limit, 413 beyond it), in
//! time (the listener's [`crate::server::TimedBody`], 408 `body_timeout`), and in what the
//! whole process holds at once ([`InflightBudget`], 503 `server_busy` with `Retry-After`).
//!
//! Bodies are read only by handlers, and handlers run only after the authentication layer, so
//! no byte of an unauthenticated body is ever buffered. A body is held once, as the `Bytes` it
//! was read into; callers pass slices of it on and never copy it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use futures_util::StreamExt as _;
use serde::de::DeserializeOwned;

use super::AppState;
use super::error::ApiError;

/// How much of an over-limit or refused body is read and discarded before answering, and for
/// how long. A client still writing when the server stops reading gets a broken pipe instead of
/// the answer; draining a modest remainder lets ordinary clients read it. A bigger body is cut
/// off at once: the service never reads unbounded input to be polite.
pub const DRAIN_MAX_BYTES: u64 = 8 * 1024 * 1024;
const DRAIN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Seconds a client is told to wait when the budget is spent.
const BUSY_RETRY_SECONDS: u32 = 1;

/// The bytes of request bodies the process holds at once, across every request.
#[derive(Debug)]
pub struct InflightBudget {
    max: u64,
    used: AtomicU64,
}

impl InflightBudget {
    /// A budget of `max` bytes.
    pub fn new(max: u64) -> Arc<Self> {
        Arc::new(InflightBudget {
            max,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes held right now.
    pub fn in_use(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// An empty hold that can grow.
    pub fn hold(self: &Arc<Self>) -> BudgetHold {
        BudgetHold {
            budget: self.clone(),
            held: 0,
        }
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= self.max)
            })
            .is_ok()
    }
}

/// Bytes of the budget held by one request; given back on drop.
#[derive(Debug)]
pub struct BudgetHold {
    budget: Arc<InflightBudget>,
    held: u64,
}

impl BudgetHold {
    /// Takes `n` more bytes, or answers 503 `server_busy` when the budget cannot give them.
    pub fn grow(&mut self, n: u64) -> Result<(), ApiError> {
        if n == 0 || self.budget.take(n) {
            self.held = self.held.saturating_add(n);
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_busy",
            format!(
                "the service holds its limit of {} bytes of request bodies; retry shortly",
                self.budget.max
            ),
        )
        .retry_after(BUSY_RETRY_SECONDS))
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// A body read whole, with the budget it holds.
#[derive(Debug)]
pub struct HeldBytes {
    pub bytes: Bytes,
    _hold: BudgetHold,
}

impl std::ops::Deref for HeldBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The body's declared length, when it declares one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// What a body read that failed on the wire answers: 408 when the listener's timeouts cut it,
/// 400 otherwise.
pub(super) fn read_error(error: &axum::Error) -> ApiError {
    if crate::server::is_body_timeout(error) {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("reading the request body: {error}"),
        )
    } else {
        ApiError::bad_request("invalid_body", format!("reading the request body: {error}"))
    }
}

/// Reads the whole body within `limit` bytes (`too_large` beyond it, with the rest drained as
/// politely as [`DRAIN_MAX_BYTES`] allows) and within the in-flight budget.
pub async fn read_limited(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    too_large: impl Fn(u64) -> ApiError,
) -> Result<HeldBytes, ApiError> {
    let declared = declared_length(headers);
    let mut stream = body.into_data_stream();
    if let Some(n) = declared.filter(|n| *n > limit) {
        // Unread: a client that sent `Expect: 100-continue` gets the answer without sending
        // the body at all. Others get it after a drain when the body is small enough.
        if n <= DRAIN_MAX_BYTES {
            drain(&mut stream, n).await;
        }
        return Err(too_large(limit));
    }
    let mut hold = state.budget.hold();
    let expected = declared.unwrap_or(0).min(limit);
    hold.grow(expected)?;
    let mut buf = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| read_error(&e))?;
        let total = (buf.len() as u64).saturating_add(chunk.len() as u64);
        if total > limit {
            drop(buf);
            drain(&mut stream, DRAIN_MAX_BYTES).await;
            return Err(too_large(limit));
        }
        if total > expected.max(hold.held) {
            hold.grow(total - hold.held)?;
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(HeldBytes {
        bytes: Bytes::from(buf),
        _hold: hold,
    })
}

/// A JSON request body within `limits.json_max_bytes`: 413 `payload_too_large` beyond it, 400
/// `invalid_json` when it does not parse. `empty_default` lets an empty body stand for the
/// default value.
pub async fn read_json<T: DeserializeOwned + Default>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    what: &str,
    empty_default: bool,
) -> Result<T, ApiError> {
    let bytes = read_json_bytes(state, headers, body).await?;
    if empty_default && bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("{what} body: {e}")))
}

/// The raw bytes of a JSON request body within `limits.json_max_bytes`.
pub async fn read_json_bytes(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<HeldBytes, ApiError> {
    read_limited(state, headers, body, state.limits.json_max_bytes, |limit| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body exceeds {limit} bytes"),
        )
    })
    .await
}

/// Discards up to `max` more bytes of `stream`, for at most `DRAIN_DEADLINE`.
pub async fn drain(stream: &mut axum::body::BodyDataStream, max: u64) {
    let discard = async {
        let mut seen = 0u64;
        while seen < max {
            match stream.next().await {
                Some(Ok(chunk)) => seen = seen.saturating_add(chunk.len() as u64),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_DEADLINE, discard).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_limit_and_frees_on_drop() {
        let budget = InflightBudget::new(100);
        let mut a = budget.hold();
        a.grow(60).unwrap();
        let mut b = budget.hold();
        let busy = b.grow(41).unwrap_err();
        assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.code, "server_busy");
        assert_eq!(busy.retry_after, Some(BUSY_RETRY_SECONDS));
        b.grow(40).unwrap();
        assert_eq!(budget.in_use(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 40);
        b.grow(60).unwrap();
        drop(b);
        assert_eq!(budget.in_use(), 0);
    }
}

//! Connect (JSON codec) on the server side, over hyper's types: reading requests, writing
//! answers and streams, and the protocol's headers. Framing and the wire types are
//! `sandbox-envd`'s; this module adds HTTP.
//!
//! - Unary: `application/json` in and out; an error is the Connect code's HTTP status with
//!   `{"code","message"}`.
//! - Streams (both directions `application/connect+json`): enveloped messages, always HTTP
//!   200, ended by an end-of-stream envelope that is `{}` or `{"error":{...}}`; an error of a
//!   streaming call, even one found before its first message, travels only there.
//! - Nothing is ever compressed: a request that names another encoding is refused.
//! - Every body is bounded: a unary body and each envelope by the message limit, which by
//!   default equals our envd client's (`sandbox_envd::envelope::DEFAULT_MAX_MESSAGE_SIZE`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode};
use sandbox_envd::{
    CONTENT_TYPE_CONNECT_JSON, CONTENT_TYPE_JSON, Code, ConnectError, DecoderConfig,
    EndStreamMessage, Envelope, EnvelopeDecoder, EnvelopeError, HEADER_CONTENT_ENCODING,
    HEADER_KEEPALIVE_PING_INTERVAL, HEADER_PROTOCOL_VERSION, HEADER_TIMEOUT_MS, Method,
    PROTOCOL_VERSION,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Errors of bodies (the client's request body, or a streamed answer's channel).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every answer, and of requests once the server has taken them from hyper.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// envd's keepalive interval when a request names none (or an unusable one).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// The longest keepalive interval honoured; a larger one is taken as this.
const MAX_KEEPALIVE: Duration = Duration::from_secs(24 * 60 * 60);
/// Messages a streamed answer may have in flight before its writer waits for the client.
const STREAM_BUFFER: usize = 4;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// No body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_JSON),
    );
    response
}

/// A unary success.
pub fn unary_ok<T: Serialize>(message: &T) -> Response<Body> {
    match serde_json::to_vec(message) {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => unary_error(&ConnectError::new(
            Code::Internal,
            format!("encoding the answer: {e}"),
        )),
    }
}

/// A unary success whose message is already JSON.
pub fn unary_json(message: Bytes) -> Response<Body> {
    json_response(StatusCode::OK, message)
}

/// A unary error: the code's status and `{"code","message"}`.
pub fn unary_error(error: &ConnectError) -> Response<Body> {
    let status =
        StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // A ConnectError always encodes; the fallback keeps the answer well-formed regardless.
    let body = error
        .to_json()
        .unwrap_or_else(|_| br#"{"code":"internal"}"#.to_vec());
    json_response(status, body)
}

/// A streaming call's error answer: HTTP 200 and an end-of-stream envelope carrying it.
pub fn stream_error(error: ConnectError) -> Response<Body> {
    let payload = end_stream_bytes(&EndStreamMessage::failed(error));
    stream_response(full(payload))
}

/// The error answer for `method`'s shape.
pub fn error_for(method: Method, error: ConnectError) -> Response<Body> {
    if method.is_enveloped() {
        stream_error(error)
    } else {
        unary_error(&error)
    }
}

/// envd's plain HTTP error (its auth middleware and `/files`): `{"code":<status>,"message"}`.
pub fn http_error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"code": status.as_u16(), "message": message}).to_string();
    let mut response = json_response(status, body.into_bytes());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

fn stream_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_CONNECT_JSON),
    );
    response
}

fn end_stream_bytes(end: &EndStreamMessage) -> Bytes {
    Envelope::from_end_stream(end)
        .ok()
        .and_then(|e| e.to_bytes().ok())
        // `{}` always encodes; this only keeps the type total.
        .unwrap_or_else(|| Bytes::from_static(b"\x02\x00\x00\x00\x02{}"))
}

/// The media type of `Content-Type`, without parameters.
fn media_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map_or("", str::trim)
}

/// Checks the protocol headers of a call to `method`: content type, protocol version and
/// compression. The error is already the answer to send.
#[expect(
    clippy::result_large_err,
    reason = "the refusal is the answer itself, built only when a request is refused"
)]
pub fn check_headers(method: Method, headers: &HeaderMap) -> Result<(), Response<Body>> {
    let want = method.content_type();
    let got = media_type(headers);
    if !got.eq_ignore_ascii_case(want) {
        let error = ConnectError::new(
            Code::Unimplemented,
            format!(
                "content type {got:?} is not served; {} takes {want}",
                method.path
            ),
        );
        let mut response = unary_error(&error);
        *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        if let Ok(v) = HeaderValue::from_str(want) {
            response.headers_mut().insert("accept-post", v);
        }
        return Err(response);
    }
    if let Some(v) = headers.get(HEADER_PROTOCOL_VERSION)
        && v.as_bytes() != PROTOCOL_VERSION.as_bytes()
    {
        return Err(error_for(
            method,
            ConnectError::new(
                Code::InvalidArgument,
                format!("connect-protocol-version {v:?} is not supported; use 1"),
            ),
        ));
    }
    let encoding = if method.is_enveloped() {
        headers.get(HEADER_CONTENT_ENCODING)
    } else {
        headers.get(header::CONTENT_ENCODING)
    };
    if let Some(v) = encoding
        && !v.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        return Err(error_for(
            method,
            ConnectError::new(
                Code::Unimplemented,
                format!("compression {v:?} is not supported; the agent speaks identity only"),
            ),
        ));
    }
    Ok(())
}

/// `Connect-Timeout-Ms`: `None` when absent or 0 (no deadline, as envd reads it).
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(value) = headers.get(HEADER_TIMEOUT_MS) else {
        return Ok(None);
    };
    let bad = || {
        ConnectError::new(
            Code::InvalidArgument,
            format!("connect-timeout-ms {value:?}: expected 1 to 10 digits"),
        )
    };
    let text = value.to_str().map_err(|_| bad())?;
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let ms: u64 = text.parse().map_err(|_| bad())?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// `Keepalive-Ping-Interval` (seconds); envd's 90 s when absent, zero or not a number.
pub fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get(HEADER_KEEPALIVE_PING_INTERVAL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_KEEPALIVE, |s| {
            Duration::from_secs(s).min(MAX_KEEPALIVE)
        })
}

/// Parses a message's JSON.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("malformed request message: {e}"),
        )
    })
}

fn too_large(limit: usize) -> ConnectError {
    ConnectError::new(
        Code::ResourceExhausted,
        format!("the request is larger than the message limit of {limit} bytes"),
    )
}

fn body_error(e: &BoxError) -> ConnectError {
    ConnectError::new(Code::Canceled, format!("reading the request failed: {e}"))
}

/// Reads a unary request (the whole body, at most `limit` bytes).
pub async fn read_unary<T: DeserializeOwned>(body: Body, limit: usize) -> Result<T, ConnectError> {
    let bytes = read_bounded(body, limit).await?;
    decode(&bytes)
}

/// Reads a whole body of at most `limit` bytes (refused as soon as it grows past them).
pub async fn read_bounded(mut body: Body, limit: usize) -> Result<Bytes, ConnectError> {
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| body_error(&e))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

fn envelope_error(e: &EnvelopeError) -> ConnectError {
    let code = match e {
        EnvelopeError::TooLarge { .. } => Code::ResourceExhausted,
        _ => Code::InvalidArgument,
    };
    ConnectError::new(code, format!("malformed request stream: {e}"))
}

/// The enveloped request stream of a streaming call.
#[derive(Debug)]
pub struct RequestStream {
    body: Body,
    decoder: EnvelopeDecoder,
    done: bool,
}

impl RequestStream {
    pub fn new(body: Body, limit: usize) -> Self {
        RequestStream {
            body,
            decoder: EnvelopeDecoder::new(DecoderConfig::request().with_max_message_size(limit)),
            done: false,
        }
    }

    /// The next message's payload, or `None` once the client has ended its stream.
    pub async fn next_payload(&mut self) -> Result<Option<Bytes>, ConnectError> {
        loop {
            if let Some(envelope) = self.decoder.decode().map_err(|e| envelope_error(&e))? {
                return Ok(Some(envelope.payload));
            }
            if self.done {
                self.decoder.finish().map_err(|e| envelope_error(&e))?;
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => return Err(body_error(&e)),
                None => self.done = true,
            }
        }
    }

    /// The next message.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ConnectError> {
        match self.next_payload().await? {
            Some(payload) => decode(&payload).map(Some),
            None => Ok(None),
        }
    }

    /// The one message of a server-streaming call's request.
    pub async fn single<T: DeserializeOwned>(self) -> Result<T, ConnectError> {
        decode(&self.single_payload().await?)
    }

    /// The payload of the one message of a server-streaming call's request.
    pub async fn single_payload(mut self) -> Result<Bytes, ConnectError> {
        let Some(payload) = self.next_payload().await? else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "the request stream carried no message",
            ));
        };
        if self.next_payload().await?.is_some() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "a server-streaming request carries exactly one message",
            ));
        }
        Ok(payload)
    }
}

/// The writing half of a streamed answer.
#[derive(Debug)]
pub struct ResponseStream {
    sender: http_body_util::channel::Sender<Bytes, BoxError>,
}

/// The client went away: nothing more can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

impl ResponseStream {
    /// A stream and the answer that carries it (HTTP 200, `application/connect+json`).
    pub fn open() -> (ResponseStream, Response<Body>) {
        let (sender, body) =
            http_body_util::channel::Channel::<Bytes, BoxError>::new(STREAM_BUFFER);
        (
            ResponseStream { sender },
            stream_response(body.boxed_unsync()),
        )
    }

    /// Sends one message.
    pub async fn send<T: Serialize>(&mut self, message: &T) -> Result<(), Gone> {
        match Envelope::from_message(message).map(|e| e.to_bytes()) {
            Ok(Ok(bytes)) => self.sender.send_data(bytes).await.map_err(|_| Gone),
            // Our own messages always encode; failing to is a bug worth ending the stream.
            _ => {
                let end = EndStreamMessage::failed(ConnectError::new(
                    Code::Internal,
                    "a message failed to encode",
                ));
                let _ = self.sender.send_data(end_stream_bytes(&end)).await;
                Err(Gone)
            }
        }
    }

    /// Ends the stream: `{}` on success, or the error.
    pub async fn end(mut self, result: Result<(), ConnectError>) {
        let end = match result {
            Ok(()) => EndStreamMessage::ok(),
            Err(e) => EndStreamMessage::failed(e),
        };
        let _ = self.sender.send_data(end_stream_bytes(&end)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn timeouts_follow_the_connect_grammar() {
        let check = |v: &'static str, want: Result<Option<u64>, ()>| {
            let got = timeout(&headers(&[("connect-timeout-ms", v)]))
                .map(|d| d.map(|d| d.as_millis() as u64))
                .map_err(|_| ());
            assert_eq!(got, want, "{v:?}");
        };
        check("1500", Ok(Some(1500)));
        check("0", Ok(None));
        check("9999999999", Ok(Some(9_999_999_999)));
        check("12345678901", Err(()));
        check("-1", Err(()));
        check("1.5", Err(()));
        check("", Err(()));
        assert_eq!(timeout(&HeaderMap::new()).unwrap(), None);
    }

    #[test]
    fn keepalive_intervals_default_to_envds() {
        let check = |v: &'static str, secs: u64| {
            let got = keepalive_interval(&headers(&[("keepalive-ping-interval", v)]));
            assert_eq!(got, Duration::from_secs(secs), "{v:?}");
        };
        check("50", 50);
        check("0", 90);
        check("x", 90);
        check("99999999999", 24 * 60 * 60);
        assert_eq!(keepalive_interval(&HeaderMap::new()), DEFAULT_KEEPALIVE);
    }

    #[test]
    fn protocol_headers_are_checked() {
        use sandbox_envd::process::method::{LIST, START};
        assert!(
            check_headers(
                LIST,
                &headers(&[("content-type", "application/json; charset=utf-8")])
            )
            .is_ok()
        );
        assert!(
            check_headers(
                START,
                &headers(&[("content-type", "application/connect+json")])
            )
            .is_ok()
        );
        let r =
            check_headers(LIST, &headers(&[("content-type", "application/proto")])).unwrap_err();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let r = check_headers(
            LIST,
            &headers(&[
                ("content-type", "application/json"),
                ("content-encoding", "gzip"),
            ]),
        )
        .unwrap_err();
        assert_eq!(r.status(), StatusCode::NOT_IMPLEMENTED);
        // A streaming call's refusal is a 200 with the error in the end-of-stream envelope.
        let r = check_headers(
            START,
            &headers(&[
                ("content-type", "application/connect+json"),
                ("connect-content-encoding", "gzip"),
            ]),
        )
        .unwrap_err();
        assert_eq!(r.status(), StatusCode::OK);
        let r = check_headers(
            LIST,
            &headers(&[
                ("content-type", "application/json"),
                ("connect-protocol-version", "2"),
            ]),
        )
        .unwrap_err();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn request_streams_are_bounded_and_framed() {
        let env = |payload: &'static [u8]| Envelope::message(payload).to_bytes().unwrap();
        let mut two = env(b"{}").to_vec();
        two.extend_from_slice(&env(b"{\"a\":1}"));
        let mut s = RequestStream::new(full(two), 1024);
        assert_eq!(
            s.next_payload().await.unwrap().unwrap(),
            Bytes::from_static(b"{}")
        );
        assert_eq!(
            s.next_payload().await.unwrap().unwrap(),
            Bytes::from_static(b"{\"a\":1}")
        );
        assert_eq!(s.next_payload().await.unwrap(), None);

        let too_big = RequestStream::new(full(env(&[b' '; 64])), 16);
        let e = too_big.single::<serde_json::Value>().await.unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
        let cut = env(b"{}");
        let e = RequestStream::new(full(cut.slice(..4)), 1024)
            .single::<serde_json::Value>()
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        let end_flag = Envelope::end_stream(&b"{}"[..]).to_bytes().unwrap();
        let e = RequestStream::new(full(end_flag), 1024)
            .single::<serde_json::Value>()
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        let e = read_unary::<serde_json::Value>(full(vec![b' '; 100]), 10)
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);
    }
}

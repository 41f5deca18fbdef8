//! Reading a stream of enveloped messages off a response body.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Body as _;
use hyper::body::Incoming;
use sandbox_core::{Error, Operation, Provider};
use sandbox_envd::{DecoderConfig, EnvelopeDecoder, EnvelopeError};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::call::Deadline;
use super::config::EnvdConfig;
use crate::transported;

/// How long the body may take to end after the end-of-stream message.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// The messages of a streaming answer, in order, ending with envd's end-of-stream verdict.
///
/// [`message`](Self::message) yields each message, then `Ok(None)` once the stream ended
/// successfully, or the error that ended it: a Connect error from the end-of-stream message, the
/// call's deadline, an idle limit passed without a message or keepalive, a connection cut (also
/// one inside an envelope), or a malformed envelope. Errors are sticky: once failed, the stream
/// keeps answering the same error.
///
/// Dropping the stream cancels the call (HTTP/2: the stream is reset; HTTP/1.1: the connection
/// is closed rather than reused half-read).
pub struct ServerStream<T> {
    op: Operation,
    body: Incoming,
    decoder: EnvelopeDecoder,
    deadline: Deadline,
    idle_timeout: Duration,
    provider: Option<Provider>,
    state: State,
    messages: u64,
    _message: PhantomData<fn() -> T>,
}

enum State {
    Open,
    Ended(BTreeMap<String, Vec<String>>),
    Failed(Error),
}

impl<T> std::fmt::Debug for ServerStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Open => "open",
            State::Ended(_) => "ended",
            State::Failed(_) => "failed",
        };
        f.debug_struct("ServerStream")
            .field("method", &self.op.as_str())
            .field("state", &state)
            .field("messages", &self.messages)
            .finish()
    }
}

impl<T: DeserializeOwned> ServerStream<T> {
    pub(crate) fn new(
        op: Operation,
        body: Incoming,
        deadline: Deadline,
        config: &EnvdConfig,
    ) -> Self {
        let decoder = EnvelopeDecoder::new(
            DecoderConfig::response().with_max_message_size(config.max_message_size),
        );
        ServerStream {
            op,
            body,
            decoder,
            deadline,
            idle_timeout: config.idle_timeout,
            provider: config.provider,
            state: State::Open,
            messages: 0,
            _message: PhantomData,
        }
    }

    /// The next message; `Ok(None)` after a successful end of stream.
    pub async fn message(&mut self) -> Result<Option<T>, Error> {
        match &self.state {
            State::Open => {}
            State::Ended(_) => return Ok(None),
            State::Failed(e) => return Err(e.clone()),
        }
        match self.advance().await {
            Ok(next) => Ok(next),
            Err(e) => {
                let e = super::claim(self.provider, e);
                self.state = State::Failed(e.clone());
                Err(e)
            }
        }
    }

    /// The end-of-stream metadata (Connect trailers), once the stream ended successfully.
    pub fn trailers(&self) -> Option<&BTreeMap<String, Vec<String>>> {
        match &self.state {
            State::Ended(trailers) => Some(trailers),
            _ => None,
        }
    }

    /// The same messages as a `futures` [`Stream`](futures_util::Stream), for `select!` and
    /// the stream combinators: each item is a message or the error that ended the stream, and
    /// the stream ends after the successful end of stream or the first error.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<T, Error>> + Send
    where
        T: Send + 'static,
    {
        futures_util::stream::unfold(Some(self), |stream| async move {
            let mut stream = stream?;
            match stream.message().await {
                Ok(Some(message)) => Some((Ok(message), Some(stream))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }

    /// How many messages have been handed out.
    pub fn messages_read(&self) -> u64 {
        self.messages
    }

    async fn advance(&mut self) -> Result<Option<T>, Error> {
        let op = self.op;
        loop {
            if let Some(envelope) = self.decoder.decode().map_err(|e| malformed(op, &e))? {
                if envelope.end_stream {
                    let end = envelope.parse_end_stream().map_err(|e| {
                        transported(Error::internal(
                            op,
                            format!("envd sent a malformed end of stream: {e}"),
                        ))
                    })?;
                    let trailers = end
                        .into_result()
                        .map_err(|e| transported(e.to_core_error(op)))?;
                    self.read_to_end().await?;
                    self.state = State::Ended(trailers);
                    return Ok(None);
                }
                let message = envelope.parse_message::<T>().map_err(|e| {
                    transported(Error::internal(
                        op,
                        format!("envd sent a malformed message: {e}"),
                    ))
                })?;
                self.messages += 1;
                return Ok(Some(message));
            }
            self.read_more().await?;
        }
    }

    /// Reads the body past the end-of-stream message to its end: nothing may follow it, and on
    /// HTTP/1.1 only a body read to its end lets the connection go back to the pool. The call's
    /// answer is complete already, so a body that does not end promptly (or breaks) only costs
    /// the connection, never the answer.
    async fn read_to_end(&mut self) -> Result<(), Error> {
        loop {
            if self.decoder.buffered() > 0 {
                return Err(malformed(self.op, &EnvelopeError::DataAfterEndStream));
            }
            if self.body.is_end_stream() {
                return Ok(());
            }
            match tokio::time::timeout(DRAIN_LIMIT, self.next_frame()).await {
                Ok(Ok(Some(data))) => self.decoder.push(&data),
                Ok(Ok(None) | Err(_)) | Err(_) => return Ok(()),
            }
        }
    }

    /// Feeds the decoder the body's next chunk.
    async fn read_more(&mut self) -> Result<(), Error> {
        match self.next_frame().await? {
            Some(data) => {
                self.decoder.push(&data);
                Ok(())
            }
            None => {
                // The body is over: whatever is buffered must be whole envelopes (decoded by
                // the caller's loop), and the end-of-stream message must have come.
                if let Err(e) = self.decoder.finish() {
                    return Err(malformed(self.op, &e));
                }
                if self.decoder.buffered() > 0 {
                    return Ok(());
                }
                Err(transported(Error::unavailable(
                    self.op,
                    format!(
                        "the stream ended after {} messages without envd's end-of-stream message",
                        self.messages
                    ),
                )))
            }
        }
    }

    /// The body's next data (`None` at its end), watching the deadline and the idle limit.
    async fn next_frame(&mut self) -> Result<Option<bytes::Bytes>, Error> {
        let op = self.op;
        loop {
            let idle_at = Instant::now() + self.idle_timeout;
            let (wake_at, is_deadline) = match self.deadline.at() {
                Some(at) if at <= idle_at => (at, true),
                _ => (idle_at, false),
            };
            let frame = tokio::select! {
                frame = self.body.frame() => frame,
                () = tokio::time::sleep_until(wake_at) => {
                    return Err(if is_deadline {
                        self.deadline.exceeded(op)
                    } else {
                        transported(Error::unavailable(op, format!(
                            "envd sent nothing, not even a keepalive, for {} ms",
                            self.idle_timeout.as_millis()
                        )))
                    });
                }
            };
            match frame {
                // Trailer frames carry nothing Connect needs: its trailers are in the
                // end-of-stream message.
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
                Some(Err(e)) => {
                    return Err(transported(Error::unavailable(
                        op,
                        format!(
                            "the stream broke after {} messages: {}",
                            self.messages,
                            crate::client::chain(&e)
                        ),
                    )));
                }
                None => return Ok(None),
            }
        }
    }
}

/// A framing error. A stream cut inside an envelope is a connection problem (`unavailable`:
/// the call's outcome is unknown); anything else is envd breaking the protocol (`internal`).
fn malformed(op: Operation, e: &EnvelopeError) -> Error {
    match e {
        EnvelopeError::Truncated { .. } => {
            transported(Error::unavailable(op, format!("the stream was cut: {e}")))
        }
        _ => transported(Error::internal(
            op,
            format!("envd sent a malformed stream: {e}"),
        )),
    }
}

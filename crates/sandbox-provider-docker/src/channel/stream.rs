//! One hijacked exec as one byte stream: the relay's stdout frames are the bytes read, the
//! stream's writes go to its stdin, and its stderr frames (the relay's diagnostics) are kept
//! apart, bounded, and logged — never mixed into the bytes.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bollard::container::LogOutput;
use bytes::{Buf, Bytes};
use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most of the relay's stderr kept for an error message (the newest bytes win).
pub const STDERR_TAIL_BYTES: usize = 4 * 1024;
/// The most of one stderr frame written to the service's log.
const STDERR_LOG_BYTES: usize = 512;
/// The most stderr frames of one exec written to the service's log: a relay replaced by hostile
/// code in the container must not flood the service's log (the tail is still kept).
const STDERR_LOG_FRAMES: u32 = 16;
/// Frames read in one poll without producing a byte (stderr, stdin echoes) before yielding, so
/// a flood of them cannot hold the runtime's thread.
const FRAMES_PER_POLL: u32 = 32;

type Frames = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// What the channel knows of its exec from outside the stream: whether it still runs, and
/// what the relay said on stderr.
#[derive(Debug, Default)]
pub(crate) struct ExecState {
    ended: AtomicBool,
    stderr: Mutex<Vec<u8>>,
    stderr_frames: std::sync::atomic::AtomicU32,
}

impl ExecState {
    /// The exec's output ended, failed, or the stream was dropped.
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// The newest bytes of the relay's stderr, as text.
    pub(crate) fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&kept).trim().to_owned()
    }

    fn record_stderr(&self, container: &str, message: &[u8]) {
        let frame = self.stderr_frames.fetch_add(1, Ordering::Relaxed);
        if frame < STDERR_LOG_FRAMES {
            let shown = &message[..message.len().min(STDERR_LOG_BYTES)];
            tracing::warn!(
                container,
                stderr = %String::from_utf8_lossy(shown).trim(),
                "the agent channel's relay wrote to stderr"
            );
        } else if frame == STDERR_LOG_FRAMES {
            tracing::warn!(
                container,
                "the agent channel's relay keeps writing to stderr; no more of it is logged"
            );
        }
        if let Ok(mut kept) = self.stderr.lock() {
            kept.extend_from_slice(message);
            let over = kept.len().saturating_sub(STDERR_TAIL_BYTES);
            kept.drain(..over);
        }
    }
}

/// The exec's stream (see the module docs).
pub struct ExecStream {
    container: String,
    frames: Frames,
    input: Pin<Box<dyn AsyncWrite + Send>>,
    /// What is left of the last stdout frame.
    pending: Bytes,
    state: Arc<ExecState>,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream")
            .field("container", &self.container)
            .field("ended", &self.state.ended())
            .finish_non_exhaustive()
    }
}

impl ExecStream {
    pub(crate) fn new(
        container: &str,
        frames: Frames,
        input: Pin<Box<dyn AsyncWrite + Send>>,
        state: Arc<ExecState>,
    ) -> Self {
        ExecStream {
            container: container.to_owned(),
            frames,
            input,
            pending: Bytes::new(),
            state,
        }
    }
}

impl Drop for ExecStream {
    fn drop(&mut self) {
        self.state.end();
    }
}

impl AsyncRead for ExecStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let mut frames = 0u32;
        loop {
            frames += 1;
            if frames > FRAMES_PER_POLL {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match this.frames.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.state.end();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Some(Err(e))) => {
                    this.state.end();
                    return Poll::Ready(Err(io::Error::other(e)));
                }
                Poll::Ready(Some(Ok(frame))) => match frame {
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        this.pending = message;
                    }
                    LogOutput::StdErr { message } => {
                        this.state.record_stderr(&this.container, &message);
                    }
                    LogOutput::StdIn { .. } => {}
                },
            }
        }
    }
}

impl AsyncWrite for ExecStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.input.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.input.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.input.as_mut().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn stream_of(frames: Vec<LogOutput>) -> (ExecStream, Arc<ExecState>, tokio::io::DuplexStream) {
        let items: Vec<Result<LogOutput, bollard::errors::Error>> =
            frames.into_iter().map(Ok).collect();
        let (input, far) = tokio::io::duplex(64);
        let state = Arc::new(ExecState::default());
        let stream = ExecStream::new(
            "c1",
            Box::pin(futures_util::stream::iter(items)),
            Box::pin(input),
            Arc::clone(&state),
        );
        (stream, state, far)
    }

    #[tokio::test]
    async fn stdout_is_the_stream_and_stderr_stays_apart_bounded() {
        let big = vec![b'e'; 3 * STDERR_TAIL_BYTES];
        let (mut stream, state, mut far) = stream_of(vec![
            LogOutput::StdOut {
                message: Bytes::from_static(b"hel"),
            },
            LogOutput::StdErr {
                message: Bytes::from(big),
            },
            LogOutput::StdErr {
                message: Bytes::from_static(b"relay: boom"),
            },
            LogOutput::StdOut {
                message: Bytes::from_static(b"lo"),
            },
        ]);
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        assert!(state.ended(), "the end of the output ends the exec");
        let tail = state.stderr_tail();
        assert!(tail.len() <= STDERR_TAIL_BYTES);
        assert!(tail.ends_with("relay: boom"), "{tail}");
        stream.write_all(b"in").await.unwrap();
        let mut two = [0u8; 2];
        far.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"in");
    }

    #[tokio::test]
    async fn a_flood_of_stderr_frames_is_bounded_and_the_bytes_still_arrive() {
        let mut frames: Vec<LogOutput> = (0..10_000)
            .map(|_| LogOutput::StdErr {
                message: Bytes::from_static(b"spam spam spam "),
            })
            .collect();
        frames.push(LogOutput::StdOut {
            message: Bytes::from_static(b"ok"),
        });
        let (mut stream, state, _far) = stream_of(frames);
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ok");
        assert!(state.stderr_tail().len() <= STDERR_TAIL_BYTES);
        assert_eq!(state.stderr_frames.load(Ordering::Relaxed), 10_000);
    }

    #[tokio::test]
    async fn dropping_the_stream_ends_the_exec() {
        let (stream, state, _far) = stream_of(Vec::new());
        assert!(!state.ended());
        drop(stream);
        assert!(state.ended());
    }
}

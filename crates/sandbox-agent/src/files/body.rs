//! The bodies the file endpoints stream: a download's, fed chunk by chunk from a blocking
//! reader over a bounded channel, and an upload's, read frame by frame from the request and
//! decompressed on the way when it is gzip.

use std::fmt::Display;
use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, Bytes};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::FilesBody;

/// A body holding `bytes`.
pub(crate) fn full(bytes: impl Into<Bytes>) -> FilesBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body whose chunks come over a channel; an `Err` aborts the response (the client sees a
/// cut connection, never a short file that looks whole).
#[derive(Debug)]
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    length: Option<u64>,
}

impl ChannelBody {
    pub(crate) fn new(rx: mpsc::Receiver<io::Result<Bytes>>, length: Option<u64>) -> Self {
        ChannelBody { rx, length }
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        self.length
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// Why an upload's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UploadError {
    /// The request body broke off.
    Read(String),
    /// `Content-Encoding: gzip`, but not gzip.
    Decode(String),
    /// More than the limit (the number of bytes allowed).
    TooLarge(u64),
    /// A multipart part's headers did not end within the bound (in bytes).
    Headers(usize),
}

impl Display for UploadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UploadError::Read(e) => write!(f, "error reading the request body: {e}"),
            UploadError::Decode(e) => write!(f, "error decompressing request body: {e}"),
            UploadError::TooLarge(limit) => {
                write!(f, "the upload is larger than the {limit} bytes allowed")
            }
            UploadError::Headers(limit) => write!(
                f,
                "a multipart part's headers did not end within {limit} bytes"
            ),
        }
    }
}

impl std::error::Error for UploadError {}

/// The data of a request body as a stream of chunks, gunzipped when asked, refusing more than
/// `limit` bytes (counted after decompression). Every chunk it yields is at most [`PACE`]
/// bytes of one body frame or one step of the decoder's output, so nothing accumulates here
/// and a writer's queue of chunks is bounded in bytes too.
pub(crate) struct UploadStream<B> {
    body: Pin<Box<B>>,
    gunzip: Option<flate2::write::MultiGzDecoder<Vec<u8>>>,
    /// Compressed input not yet fed to the decoder.
    pending: Bytes,
    done: bool,
    total: u64,
    limit: u64,
}

impl<B> std::fmt::Debug for UploadStream<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadStream")
            .field("gzip", &self.gunzip.is_some())
            .field("total", &self.total)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<B> UploadStream<B> {
    pub(crate) fn new(body: B, gzip: bool, limit: u64) -> Self {
        UploadStream {
            body: Box::pin(body),
            gunzip: gzip.then(|| flate2::write::MultiGzDecoder::new(Vec::new())),
            pending: Bytes::new(),
            done: false,
            total: 0,
            limit,
        }
    }

    fn emit(&mut self, chunk: Bytes) -> Poll<Option<Result<Bytes, UploadError>>> {
        self.total += chunk.len() as u64;
        if self.total > self.limit {
            self.done = true;
            return Poll::Ready(Some(Err(UploadError::TooLarge(self.limit))));
        }
        Poll::Ready(Some(Ok(chunk)))
    }

    fn fail(&mut self, e: UploadError) -> Poll<Option<Result<Bytes, UploadError>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }
}

impl<B> futures_util::Stream for UploadStream<B>
where
    B: Body<Data = Bytes>,
    B::Error: Display,
{
    type Item = Result<Bytes, UploadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if this.gunzip.is_none() && !this.pending.is_empty() {
                let piece = this.pending.split_to(this.pending.len().min(PACE));
                return this.emit(piece);
            }
            if let Some(decoder) = &mut this.gunzip
                && !this.pending.is_empty()
            {
                // One step of the decoder: it takes what input it can and produces at most
                // its internal buffer's worth of output.
                match decoder.write(&this.pending) {
                    Ok(0) => {
                        return this.fail(UploadError::Decode(
                            "data after the end of the gzip stream".into(),
                        ));
                    }
                    Ok(used) => this.pending.advance(used),
                    Err(e) => return this.fail(UploadError::Decode(e.to_string())),
                }
                let out = std::mem::take(decoder.get_mut());
                if !out.is_empty() {
                    return this.emit(Bytes::from(out));
                }
                continue;
            }
            match ready!(this.body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers carry no file data.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    // Plain data is handed on in pieces of at most `PACE`, compressed data
                    // goes through the decoder first.
                    this.pending = data;
                }
                Some(Err(e)) => return this.fail(UploadError::Read(e.to_string())),
                None => {
                    this.done = true;
                    let Some(decoder) = &mut this.gunzip else {
                        return Poll::Ready(None);
                    };
                    if let Err(e) = decoder.try_finish() {
                        return this.fail(UploadError::Decode(e.to_string()));
                    }
                    let out = std::mem::take(decoder.get_mut());
                    if out.is_empty() {
                        return Poll::Ready(None);
                    }
                    return this.emit(Bytes::from(out));
                }
            }
        }
    }
}

/// The most bytes one chunk handed to the multipart parser holds.
pub(crate) const PACE: usize = 64 * 1024;

/// The most bytes the multipart parser may take while it looks for the next part's headers
/// (the boundary, the headers, and one chunk it reads ahead). The parser buffers everything
/// until the blank line that ends the headers, so without this bound a body that never sends
/// one would be buffered whole.
pub(crate) const MAX_PART_HEADER_BYTES: usize = 2 * PACE + 16 * 1024;

/// Whether the multipart parser is between parts, and how much it took since.
#[derive(Debug, Default)]
pub(crate) struct HeaderPhase {
    active: std::sync::atomic::AtomicBool,
    taken: std::sync::atomic::AtomicUsize,
}

impl HeaderPhase {
    /// Starts (or ends) a look for part headers.
    pub(crate) fn set(&self, active: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.taken.store(0, Relaxed);
        self.active.store(active, Relaxed);
    }
}

/// A stream for the multipart parser: chunks of at most [`PACE`] bytes, and a pause after each
/// one. The parser drains its input whenever it is polled, for as long as the input is ready;
/// pausing makes it parse (and the writer write) what it has before it takes more, so its
/// buffer stays at about one chunk however fast the client sends.
pub(crate) struct Paced<S> {
    inner: S,
    rest: Bytes,
    paused: bool,
    phase: std::sync::Arc<HeaderPhase>,
}

impl<S> std::fmt::Debug for Paced<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paced")
            .field("rest", &self.rest.len())
            .finish_non_exhaustive()
    }
}

impl<S> Paced<S> {
    pub(crate) fn new(inner: S, phase: std::sync::Arc<HeaderPhase>) -> Self {
        Paced {
            inner,
            rest: Bytes::new(),
            paused: false,
            phase,
        }
    }
}

impl<S> futures_util::Stream for Paced<S>
where
    S: futures_util::Stream<Item = Result<Bytes, UploadError>> + Unpin,
{
    type Item = Result<Bytes, UploadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use std::sync::atomic::Ordering::Relaxed;
        let this = &mut *self;
        if this.paused {
            this.paused = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if this.rest.is_empty() {
            match ready!(Pin::new(&mut this.inner).poll_next(cx)) {
                Some(Ok(chunk)) => this.rest = chunk,
                other => return Poll::Ready(other),
            }
        }
        let piece = this.rest.split_to(this.rest.len().min(PACE));
        this.paused = true;
        if this.phase.active.load(Relaxed) {
            let taken = this.phase.taken.fetch_add(piece.len(), Relaxed) + piece.len();
            if taken > MAX_PART_HEADER_BYTES {
                return Poll::Ready(Some(Err(UploadError::Headers(MAX_PART_HEADER_BYTES))));
            }
        }
        Poll::Ready(Some(Ok(piece)))
    }
}

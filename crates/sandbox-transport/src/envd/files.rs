//! envd's `/files` endpoints: multipart upload and streamed download (`docs/envd.md`, "HTTP
//! endpoints"), and the staged upload every adapter's atomic streamed write is
//! ([`EnvdClient::upload_atomic`]: an octet-stream upload to a hidden sibling, then
//! `Filesystem/Move` over the target).

use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use hyper_util::client::legacy::connect::Connect;
use sandbox_core::{Error, ErrorCode, Operation, Provider, ReadStream, SandboxPath};
use sandbox_envd::files::{self, WriteInfo};

use super::call::{
    Body, CallOptions, Deadline, EnvdClient, error_answer, full, ok_response, read_limited,
};
use crate::transported;

const OP_UPLOAD: Operation = Operation::new("upload");
const OP_DOWNLOAD: Operation = Operation::new("download");
const OP_HEALTH: Operation = Operation::new("health");

/// The official SDK's bound on a health probe, kept so both give up alike (`docs/envd.md`,
/// "Errors").
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest upload answer read: one short JSON object per file.
const UPLOAD_ANSWER_LIMIT: usize = 1024 * 1024;

/// One file of an upload: where it goes and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadFile {
    /// The target path (absolute, `~/…`, or relative to the user's home).
    pub path: String,
    /// The content.
    pub data: Bytes,
}

impl UploadFile {
    /// A file for `path` holding `data`.
    pub fn new(path: impl Into<String>, data: impl Into<Bytes>) -> Self {
        UploadFile {
            path: path.into(),
            data: data.into(),
        }
    }
}

/// A download in progress: the file's bytes, read chunk by chunk.
#[derive(Debug)]
pub struct Download {
    body: Incoming,
    length: Option<u64>,
    deadline: Deadline,
    received: u64,
    /// Who claims the download's errors ([`super::claim`]).
    provider: Option<Provider>,
}

impl Download {
    /// The length envd announced, if it did.
    pub fn content_length(&self) -> Option<u64> {
        self.length
    }

    /// The next chunk; `Ok(None)` at the end. A connection cut before the announced length
    /// is an error, never a short file.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        let provider = self.provider;
        self.next_chunk()
            .await
            .map_err(|e| super::claim(provider, e))
    }

    async fn next_chunk(&mut self) -> Result<Option<Bytes>, Error> {
        let op = OP_DOWNLOAD;
        let deadline = self.deadline;
        loop {
            let frame = deadline.bound(op, async {
                self.body.frame().await.transpose().map_err(|e| {
                    transported(Error::unavailable(
                        op,
                        format!(
                            "the download broke after {} bytes: {}",
                            self.received,
                            crate::client::chain(&e)
                        ),
                    ))
                })
            });
            match frame.await? {
                Some(frame) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        self.received += data.len() as u64;
                        return Ok(Some(data));
                    }
                }
                None => {
                    if let Some(length) = self.length
                        && length != self.received
                    {
                        return Err(transported(Error::unavailable(
                            op,
                            format!("the download ended at {} of {length} bytes", self.received),
                        )));
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// The whole file, refusing one longer than `limit` bytes.
    pub async fn bytes(mut self, limit: u64) -> Result<Bytes, Error> {
        let provider = self.provider;
        let too_long = |size: u64| {
            let refused = transported(Error::invalid_request(
                OP_DOWNLOAD,
                format!("the file is {size} bytes or more, over the limit of {limit}"),
            ));
            super::claim(provider, refused)
        };
        if let Some(length) = self.length
            && length > limit
        {
            return Err(too_long(length));
        }
        let mut out = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            if self.received > limit {
                return Err(too_long(self.received));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }
}

impl<C> EnvdClient<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Whether envd answers its health check (`GET /health`, 204; no token needed). A
    /// sandbox that is gone answers 502 from the edge: `unavailable`, like a refused
    /// connection.
    pub async fn health(&self, options: CallOptions) -> Result<(), Error> {
        let op = OP_HEALTH;
        let deadline = Deadline::start(options.budget(Some(HEALTH_TIMEOUT)));
        let call = async {
            let request = self.request(op, hyper::Method::GET, "/health", full(Bytes::new()))?;
            let response = self.send(op, request).await?;
            if response.status().is_success() {
                return Ok(());
            }
            Err(error_answer(op, response, true).await)
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }

    /// Writes `files` in one multipart request (missing parent directories are created, an
    /// existing file is overwritten) and returns what envd wrote.
    pub async fn upload(
        &self,
        files: &[UploadFile],
        options: CallOptions,
    ) -> Result<Vec<WriteInfo>, Error> {
        let op = OP_UPLOAD;
        let [first, rest @ ..] = files else {
            return Err(self.tag(transported(Error::invalid_request(
                op,
                "an upload needs at least one file",
            ))));
        };
        // One file names its target in the query; several name theirs in each part's filename.
        let query = if rest.is_empty() {
            self.files_query(Some(&first.path))
        } else {
            self.files_query(None)
        };
        let (content_type, body) = multipart(files).map_err(|e| self.tag(e))?;
        let deadline = Deadline::start(options.budget(self.inner.config.unary_timeout));
        let call = async {
            let mut request = self.request(op, hyper::Method::POST, &query, full(body))?;
            request
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type);
            let response = self.send(op, request).await?;
            let response = ok_response(op, response, "application/json", true).await?;
            let body = read_limited(op, response.into_body(), UPLOAD_ANSWER_LIMIT).await?;
            serde_json::from_slice::<Vec<WriteInfo>>(&body).map_err(|e| {
                transported(Error::internal(
                    op,
                    format!("envd answered the upload with malformed JSON: {e}"),
                ))
            })
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }

    /// Writes one file.
    pub async fn write_file(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        options: CallOptions,
    ) -> Result<WriteInfo, Error> {
        let written = self.upload(&[UploadFile::new(path, data)], options).await?;
        written.into_iter().next().ok_or_else(|| {
            self.tag(transported(Error::internal(
                OP_UPLOAD,
                "envd reported no file written",
            )))
        })
    }

    /// Writes one file at `path` from `data`, sent as an `application/octet-stream` body
    /// (`POST /files?path=…`) as the stream yields it: hyper asks for the next chunk only when
    /// the connection has taken the last, so the client holds a chunk or two of the file, never
    /// the file. A stream that yields more than `max_bytes` ends the request with
    /// `file_too_large` (envd keeps no partial answer for it); a chunk that fails ends it with
    /// that error. The deadline covers sending the whole body.
    pub async fn upload_stream<S>(
        &self,
        path: &str,
        data: S,
        max_bytes: u64,
        options: CallOptions,
    ) -> Result<WriteInfo, Error>
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        let op = OP_UPLOAD;
        if path.is_empty() || path.chars().any(char::is_control) {
            return Err(self.tag(transported(Error::invalid_request(
                op,
                format!("upload path {path:?}: empty or with control characters"),
            ))));
        }
        let query = self.files_query(Some(path));
        let (body, failure) = bounded_body(data, max_bytes);
        let deadline = Deadline::start(options.budget(self.inner.config.unary_timeout));
        let call = async {
            let mut request = self.request(op, hyper::Method::POST, &query, body)?;
            request.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            let sent = self.send(op, request).await;
            // The body's own failure (over the limit, a source error) is the cause of whatever
            // the connection reports; say that, not "the connection broke".
            if let Some(cause) = failure.lock().ok().and_then(|mut f| f.take()) {
                return Err(transported(cause));
            }
            let response = ok_response(op, sent?, "application/json", true).await?;
            let body = read_limited(op, response.into_body(), UPLOAD_ANSWER_LIMIT).await?;
            let written = serde_json::from_slice::<Vec<WriteInfo>>(&body).map_err(|e| {
                transported(Error::internal(
                    op,
                    format!("envd answered the upload with malformed JSON: {e}"),
                ))
            })?;
            written
                .into_iter()
                .next()
                .ok_or_else(|| transported(Error::internal(op, "envd reported no file written")))
        };
        deadline.bound(op, call).await.map_err(|e| self.tag(e))
    }

    /// Writes `path` atomically from `source`, pulled as the upload is sent, and returns the
    /// bytes written: the bytes go to a hidden sibling ([`staging_path`]) through
    /// [`upload_stream`](Self::upload_stream) with `upload`'s deadline, and once the source
    /// ended cleanly within `max_bytes` the sibling is moved over `path` (`Filesystem/Move`,
    /// with `calls`' deadline). A reader of `path` sees the old file or the new one, never a
    /// part. Any failure after the upload began removes the sibling (best effort: it is hidden
    /// and never the target, so a failed removal leaves litter, not a wrong file); a call
    /// dropped mid-upload can leave it behind, never a partial `path`.
    ///
    /// A source that fails or passes `max_bytes` ends the upload's body cleanly instead of
    /// resetting its stream: envd then answers only once its writer has closed the sibling, so
    /// the removal that follows cannot run before envd creates the file (after a reset envd's
    /// writer may still be opening it, and a removal sent at once finds nothing and leaves the
    /// sibling behind).
    pub async fn upload_atomic(
        &self,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
        upload: CallOptions,
        calls: CallOptions,
    ) -> Result<u64, StagedUploadError> {
        let staging = staging_path(path).map_err(|e| StagedUploadError::Refused(self.tag(e)))?;
        let failure: Arc<Mutex<Option<StagedUploadError>>> = Arc::default();
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let body = source_body(source, max_bytes, Arc::clone(&sent), Arc::clone(&failure));
        let uploaded = self
            .upload_stream(staging.as_str(), body, max_bytes, upload)
            .await;
        let cause = failure.lock().ok().and_then(|mut f| f.take());
        let outcome = match (uploaded, cause) {
            // The source's failure (or the bound) is the cause of whatever envd answered.
            (_, Some(StagedUploadError::Refused(e))) => {
                Err(StagedUploadError::Refused(self.tag(e)))
            }
            (_, Some(cause)) => Err(cause),
            (Err(e), None) => Err(StagedUploadError::Envd(e)),
            (Ok(_), None) => self
                .rename(staging.as_str(), path.as_str(), calls)
                .await
                .map(drop)
                .map_err(StagedUploadError::Envd),
        };
        if outcome.is_err() {
            // Best effort; see the doc comment.
            let _ = self.remove(staging.as_str(), calls).await;
        }
        outcome?;
        Ok(sent.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Opens a download of `path`. The deadline covers reading the whole file.
    pub async fn download(&self, path: &str, options: CallOptions) -> Result<Download, Error> {
        let op = OP_DOWNLOAD;
        let query = self.files_query(Some(path));
        let deadline = Deadline::start(options.budget(self.inner.config.unary_timeout));
        let open = async {
            let request = self.request(op, hyper::Method::GET, &query, full(Bytes::new()))?;
            let response: Response<Incoming> = self.send(op, request).await?;
            if response.status() != StatusCode::OK {
                return Err(error_answer(op, response, true).await);
            }
            Ok(response)
        };
        let response = deadline.bound(op, open).await.map_err(|e| self.tag(e))?;
        let length = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok(Download {
            body: response.into_body(),
            length,
            deadline,
            received: 0,
            provider: self.inner.config.provider,
        })
    }

    /// Reads a whole file of at most `limit` bytes.
    pub async fn read_file(
        &self,
        path: &str,
        limit: u64,
        options: CallOptions,
    ) -> Result<Bytes, Error> {
        let download = self.download(path, options).await?;
        download.bytes(limit).await.map_err(|e| self.tag(e))
    }

    fn files_query(&self, path: Option<&str>) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if let Some(path) = path {
            query.append_pair(files::QUERY_PATH, path);
        }
        if let Some(user) = &self.inner.config.user {
            query.append_pair(files::QUERY_USERNAME, user);
        }
        let query = query.finish();
        if query.is_empty() {
            files::PATH.to_owned()
        } else {
            format!("{}?{query}", files::PATH)
        }
    }
}

/// Why [`EnvdClient::upload_atomic`] failed. The target is as it was in every case.
#[derive(Debug)]
pub enum StagedUploadError {
    /// The source passed the byte bound (`file_too_large`, the client's provider's), or the
    /// path cannot be staged (`/`): nothing about the sandbox.
    Refused(Error),
    /// The source's own error, untouched: whoever made it keeps it.
    Source(Error),
    /// envd refused or failed the upload, or the move: the adapter classifies it.
    Envd(Error),
}

impl StagedUploadError {
    /// The error, whichever side it came from.
    pub fn into_error(self) -> Error {
        match self {
            StagedUploadError::Refused(e)
            | StagedUploadError::Source(e)
            | StagedUploadError::Envd(e) => e,
        }
    }
}

/// The hidden sibling a staged upload of `path` is written to first:
/// `.<name>.sandbox-upload-<64 random bits>` in `path`'s directory, so the move over `path`
/// stays on one filesystem, and two uploads of one path never share a sibling. `/` has none
/// (`invalid_request`).
pub fn staging_path(path: &SandboxPath) -> Result<SandboxPath, Error> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(transported(Error::invalid_request(
            OP_UPLOAD,
            format!("{path}: is a directory"),
        )));
    };
    parent
        .join(&format!(
            ".{name}.sandbox-upload-{:016x}",
            fastrand::u64(..)
        ))
        .map_err(transported)
}

/// `source` as an upload body: its chunks as they are pulled, counted into `sent`. The body
/// ends cleanly (see [`EnvdClient::upload_atomic`]) when the source fails or passes
/// `max_bytes`, the reason left in `failure`.
fn source_body(
    source: ReadStream,
    max_bytes: u64,
    sent: Arc<std::sync::atomic::AtomicU64>,
    failure: Arc<Mutex<Option<StagedUploadError>>>,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    futures_util::stream::unfold(source, move |mut source| {
        let sent = Arc::clone(&sent);
        let failure = Arc::clone(&failure);
        async move {
            let fail = |cause: StagedUploadError| {
                if let Ok(mut slot) = failure.lock() {
                    slot.get_or_insert(cause);
                }
            };
            match source.next_chunk().await? {
                Ok(chunk) => {
                    let len = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
                    let total = sent
                        .fetch_add(len, std::sync::atomic::Ordering::Relaxed)
                        .saturating_add(len);
                    if total > max_bytes {
                        fail(StagedUploadError::Refused(transported(
                            Error::invalid_request(
                                OP_UPLOAD,
                                format!("the upload is over the limit of {max_bytes} bytes"),
                            )
                            .with_code(ErrorCode::FileTooLarge),
                        )));
                        return None;
                    }
                    Some((Ok(Bytes::from(chunk)), source))
                }
                Err(e) => {
                    fail(StagedUploadError::Source(e));
                    None
                }
            }
        }
    })
}

/// `data` as a request body that fails once more than `max_bytes` have passed, with the error
/// that ended it (if the body ended it) left in the second value.
fn bounded_body<S>(data: S, max_bytes: u64) -> (Body, Arc<Mutex<Option<Error>>>)
where
    S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let failure: Arc<Mutex<Option<Error>>> = Arc::default();
    let record = Arc::clone(&failure);
    let mut sent: u64 = 0;
    let frames = data.map(move |chunk| {
        let cause = match chunk {
            Ok(chunk) => {
                sent = sent.saturating_add(chunk.len() as u64);
                if sent <= max_bytes {
                    return Ok(Frame::data(chunk));
                }
                Error::invalid_request(
                    OP_UPLOAD,
                    format!("the upload is over the limit of {max_bytes} bytes"),
                )
                .with_code(ErrorCode::FileTooLarge)
            }
            Err(e) => Error::unavailable(
                OP_UPLOAD,
                format!("reading the upload's content after {sent} bytes: {e}"),
            ),
        };
        let message = cause.message().to_owned();
        if let Ok(mut slot) = record.lock() {
            slot.get_or_insert(cause);
        }
        Err(crate::connector::BoxError::from(message))
    });
    (StreamBody::new(frames).boxed_unsync(), failure)
}

/// A `multipart/form-data` body with one `file` part per file (RFC 7578), and its content type.
fn multipart(files: &[UploadFile]) -> Result<(HeaderValue, Bytes), Error> {
    // 128 random bits: content cannot contain the delimiter by accident, and the content's
    // author never sees it in advance, so it cannot be planted either.
    let boundary = format!(
        "sandbox-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    );
    let size: usize = files
        .iter()
        .map(|f| f.data.len() + f.path.len() + 200)
        .sum();
    let mut body = BytesMut::with_capacity(size + boundary.len() + 8);
    for file in files {
        if file.path.is_empty() || file.path.chars().any(char::is_control) {
            return Err(transported(Error::invalid_request(
                OP_UPLOAD,
                format!(
                    "upload path {:?}: empty or with control characters",
                    file.path
                ),
            )));
        }
        // A quoted-string: backslash and quote are escaped (Go's mime parser unescapes them).
        let filename = file.path.replace('\\', "\\\\").replace('"', "\\\"");
        body.put_slice(b"--");
        body.put_slice(boundary.as_bytes());
        body.put_slice(b"\r\nContent-Disposition: form-data; name=\"");
        body.put_slice(files::MULTIPART_FIELD.as_bytes());
        body.put_slice(b"\"; filename=\"");
        body.put_slice(filename.as_bytes());
        body.put_slice(b"\"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.put_slice(&file.data);
        body.put_slice(b"\r\n");
    }
    body.put_slice(b"--");
    body.put_slice(boundary.as_bytes());
    body.put_slice(b"--\r\n");
    let content_type = HeaderValue::from_str(&format!("multipart/form-data; boundary={boundary}"))
        .map_err(|_| transported(Error::internal(OP_UPLOAD, "multipart boundary")))?;
    Ok((content_type, body.freeze()))
}

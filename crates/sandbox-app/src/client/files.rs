//! `sandbox files get|put|ls|mv`: streaming download and upload (through the whole-buffer
//! routes, or with `--stream` the streamed ones, which have the larger
//! `limits.stream_file_max_bytes` and need a backend with `streamed_files`), listings and
//! renames.

use http_body_util::{BodyExt, StreamBody};
use hyper::Method;
use hyper::body::{Bytes, Frame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Body, Client, ClientError, full};
use crate::api::{DirEntry, EntryKind, Listing};

/// Upload chunk size.
const CHUNK: usize = 64 * 1024;

/// Streams the file at `path` in `session` into `sink`; the number of bytes written.
pub async fn get<W: AsyncWrite + Unpin>(
    client: &Client,
    session: &str,
    path: &str,
    sink: &mut W,
) -> Result<u64, ClientError> {
    get_from(client, session, path, false, sink).await
}

/// [`get`], through the streamed route (`…/files/stream`) when `streamed`.
pub async fn get_from<W: AsyncWrite + Unpin>(
    client: &Client,
    session: &str,
    path: &str,
    streamed: bool,
    sink: &mut W,
) -> Result<u64, ClientError> {
    let route = if streamed { "stream" } else { "content" };
    let url = client.session_url(session, &["files", route], &[("path", path)]);
    let response = client
        .send(Method::GET, &url, None, full(Bytes::new()))
        .await?;
    let mut body = response.into_body();
    let mut written = 0u64;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ClientError::Connect(format!("the download broke off: {e}")))?;
        if let Ok(data) = frame.into_data() {
            sink.write_all(&data)
                .await
                .map_err(|e| ClientError::local("cannot write the download", e))?;
            written += data.len() as u64;
        }
    }
    sink.flush()
        .await
        .map_err(|e| ClientError::local("cannot write the download", e))?;
    Ok(written)
}

/// Where an upload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A file the model may write (anywhere but `/workspace/input`).
    Workspace,
    /// A user attachment (only below `/workspace/input`).
    Attachment,
    /// A file the model may write, through the streamed route (never held whole by the
    /// service; up to `limits.stream_file_max_bytes`).
    Streamed,
}

/// Streams `source` (of `length` bytes when known) to `path` in `session`.
pub async fn put<R>(
    client: &Client,
    session: &str,
    path: &str,
    target: Target,
    source: R,
    length: Option<u64>,
) -> Result<(), ClientError>
where
    R: AsyncRead + Send + Sync + Unpin + 'static,
{
    let rest: &[&str] = match target {
        Target::Workspace => &["files", "content"],
        Target::Attachment => &["attachments"],
        Target::Streamed => &["files", "stream"],
    };
    let url = client.session_url(session, rest, &[("path", path)]);
    let chunks = futures_util::stream::unfold(Some(source), |state| async move {
        let mut source = state?;
        let mut buf = vec![0u8; CHUNK];
        match source.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buf))), Some(source)))
            }
            // Ends the body with the error: the upload fails rather than arriving short.
            Err(e) => Some((Err(e), None)),
        }
    });
    let body: Body = StreamBody::new(chunks).boxed();
    let mut request_body = body;
    if let Some(len) = length {
        // A declared length lets the service refuse an oversized upload before any transfer.
        request_body = SizedBody::new(request_body, len).boxed();
    }
    client
        .send(
            Method::PUT,
            &url,
            Some("application/octet-stream"),
            request_body,
        )
        .await?;
    Ok(())
}

/// A streamed body that reports its exact size, so hyper sends `Content-Length`.
struct SizedBody {
    inner: Body,
    len: u64,
}

impl SizedBody {
    fn new(inner: Body, len: u64) -> Self {
        SizedBody { inner, len }
    }
}

impl hyper::body::Body for SizedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.len)
    }
}

/// Renames (moves) `from` to `to` in `session`.
pub async fn rename(
    client: &Client,
    session: &str,
    from: &str,
    to: &str,
) -> Result<(), ClientError> {
    let url = client.session_url(session, &["files", "rename"], &[]);
    let body = crate::api::RenameRequest {
        from: from.to_owned(),
        to: to.to_owned(),
    };
    let _: serde_json::Value = client.json(Method::POST, &url, Some(&body)).await?;
    Ok(())
}

/// The entries below `path` in `session`, `depth` levels deep.
pub async fn list(
    client: &Client,
    session: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<DirEntry>, ClientError> {
    let depth = depth.to_string();
    let url = client.session_url(session, &["files"], &[("path", path), ("depth", &depth)]);
    let listing: Listing = client.json::<(), _>(Method::GET, &url, None).await?;
    Ok(listing.entries)
}

/// One line per entry: kind, size, path (like `ls -l` reduced to what the API knows).
pub fn render(entries: &[DirEntry]) -> String {
    let width = entries
        .iter()
        .map(|e| e.size.to_string().len())
        .max()
        .unwrap_or(1);
    let mut out = String::new();
    for e in entries {
        let kind = match e.kind {
            EntryKind::Dir => 'd',
            EntryKind::File => '-',
            EntryKind::Other => '?',
        };
        let suffix = if e.kind == EntryKind::Dir { "/" } else { "" };
        out.push_str(&format!(
            "{kind} {size:>width$} {path}{suffix}\n",
            size = e.size,
            path = e.path
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn listings_render_one_line_per_entry() {
        let entries: Vec<DirEntry> = serde_json::from_str(
            r#"[{"name":"src","path":"/workspace/src","kind":"dir","size":4096},
                {"name":"a.txt","path":"/workspace/a.txt","kind":"file","size":12},
                {"name":"l","path":"/workspace/l","kind":"other","size":0}]"#,
        )
        .unwrap();
        assert_eq!(
            render(&entries),
            "d 4096 /workspace/src/\n-   12 /workspace/a.txt\n?    0 /workspace/l\n"
        );
        assert_eq!(render(&[]), "");
    }
}

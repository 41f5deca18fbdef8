//! `POST /files`: files written to disk as their bytes arrive.
//!
//! Each file is written by a blocking task fed over a bounded channel, so a fast client waits
//! for the disk instead of filling memory. Before any byte is written the target is checked:
//! a target in a reserved tree is a 403 (judged where it would land, and again on the opened
//! file before anything about it changes), missing parents are created (owned by the user), a
//! directory in the way is a 400, and only a regular file is ever opened for writing (opened non-blocking, so a FIFO cannot hang the
//! upload, then checked with `fstat`). Metadata is stored before the content, so a filesystem
//! without extended attributes refuses the upload before anything is written.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt as _;
use hyper::header::{self, HeaderMap};
use hyper::{Request, StatusCode};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use sandbox_envd::files::{MULTIPART_FIELD, WriteInfo};
use tokio::sync::mpsc;

use super::body::{HeaderPhase, Paced, UploadError, UploadStream};
use super::query::FilesQuery;
use super::{FileOperation, FilesContext, FilesError, METADATA_HEADER_PREFIX};
use crate::fs::metadata;
use crate::fs::path::{Owner, base_name, ensure_dirs};
use crate::fs::reserved::Reserved;
use crate::users::User;

/// Chunks received ahead of the disk: what a fast client makes the agent hold, per upload.
pub(crate) const WRITE_BEHIND_CHUNKS: usize = 4;

pub(crate) async fn post<B>(
    request: Request<B>,
    ctx: &FilesContext,
) -> Result<Vec<WriteInfo>, FilesError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    let (parts, body) = request.into_parts();
    let query = FilesQuery::parse(parts.uri.query())?;
    let user =
        super::authorize_and_resolve_user(&parts.headers, &query, FileOperation::Write, ctx)?;
    let gzip = content_encoding(&parts.headers)?;
    let metadata = metadata_headers(&parts.headers)?;
    let owner = Owner::of(&user);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let stream = UploadStream::new(body, gzip, ctx.limits.max_upload_bytes);
    let target = Target {
        user: &user,
        default_workdir: ctx.default_workdir.as_deref(),
        owner,
        metadata: Arc::new(metadata),
        reserved: ctx.reserved.clone(),
    };

    if media == "application/octet-stream" {
        let Some(path) = &query.path else {
            return Err(FilesError::bad_request(
                "path query parameter is required for raw body upload",
            ));
        };
        let path = target.resolve(path)?;
        let written = write_file(path, stream.map(|r| r.map_err(upload_error)), &target).await?;
        return Ok(vec![written]);
    }
    if !media.starts_with("multipart/") {
        return Err(FilesError::bad_request(format!(
            "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
        )));
    }
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| FilesError::bad_request(format!("error parsing multipart form: {e}")))?;
    let phase = Arc::new(HeaderPhase::default());
    let mut form = multer::Multipart::new(Paced::new(stream, Arc::clone(&phase)), boundary);
    let mut written: Vec<WriteInfo> = Vec::new();
    loop {
        phase.set(true);
        let next = form.next_field().await;
        phase.set(false);
        let mut field = match next {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => return Err(multipart_error(e)),
        };
        if field.name() != Some(MULTIPART_FIELD) {
            // Other parts carry nothing envd writes; their data is read and dropped here, so
            // the look for the next part's headers starts at its boundary.
            while let Some(chunk) = field.chunk().await.transpose() {
                chunk.map_err(multipart_error)?;
            }
            continue;
        }
        let requested = match (&query.path, field.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => {
                return Err(FilesError::bad_request(
                    "error getting multipart custom part file name: filename not found in Content-Disposition header",
                ));
            }
        };
        let path = target.resolve(&requested)?;
        let shown = path.to_string_lossy().into_owned();
        if written.iter().any(|w| w.path == shown) {
            let others: Vec<&str> = written
                .iter()
                .map(|w| w.path.as_str())
                .filter(|p| *p != shown)
                .collect();
            let mut message = format!(
                "you cannot upload multiple files to the same path '{shown}' in one upload request, only the first specified file was uploaded"
            );
            if !others.is_empty() {
                message.push_str(&format!(
                    ", also the following files were uploaded: {}",
                    others.join(", ")
                ));
            }
            return Err(FilesError::bad_request(message));
        }
        let source = field.map(|r| r.map_err(multipart_error));
        written.push(write_file(path, source, &target).await?);
    }
    Ok(written)
}

/// Where and as whom the files of one request are written.
struct Target<'a> {
    user: &'a User,
    default_workdir: Option<&'a Path>,
    owner: Owner,
    metadata: Arc<BTreeMap<String, String>>,
    reserved: Reserved,
}

impl Target<'_> {
    fn resolve(&self, path: &str) -> Result<PathBuf, FilesError> {
        crate::fs::path::resolve(path, self.user, self.default_workdir)
            .map_err(|e| FilesError::bad_request(format!("error resolving path: {e}")))
    }
}

/// `Content-Encoding` of the body: identity or gzip.
fn content_encoding(headers: &HeaderMap) -> Result<bool, FilesError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let text = value.to_str().unwrap_or("");
    let coding = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match coding.as_str() {
        "" | "identity" => Ok(false),
        "gzip" => Ok(true),
        _ => Err(FilesError::bad_request(format!(
            "error decompressing request body: unsupported Content-Encoding: {text}, supported: [gzip]"
        ))),
    }
}

/// The `X-Metadata-<key>` headers, keys lower-cased (the first value of a repeated one),
/// validated.
fn metadata_headers(headers: &HeaderMap) -> Result<BTreeMap<String, String>, FilesError> {
    let mut out = BTreeMap::new();
    for name in headers.keys() {
        // Header names arrive lower-cased.
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        let value = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                FilesError::bad_request(format!(
                    "invalid metadata: the value for key {key:?} is not printable ASCII"
                ))
            })?;
        out.insert(key.to_owned(), value.to_owned());
        if out.len() > metadata::MAX_KEYS {
            break;
        }
    }
    metadata::validate(&out)
        .map_err(|e| FilesError::bad_request(format!("invalid metadata: {e}")))?;
    Ok(out)
}

fn upload_error(e: UploadError) -> FilesError {
    match e {
        UploadError::TooLarge(_) => FilesError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        UploadError::Read(_) | UploadError::Decode(_) | UploadError::Headers(_) => {
            FilesError::bad_request(e.to_string())
        }
    }
}

fn multipart_error(e: multer::Error) -> FilesError {
    if let multer::Error::StreamReadFailed(inner) = &e
        && let Some(upload) = inner.downcast_ref::<UploadError>()
    {
        return upload_error(upload.clone());
    }
    FilesError::bad_request(format!("error reading form: {e}"))
}

/// Writes one file from `source`; answers what was written.
async fn write_file<S>(
    path: PathBuf,
    source: S,
    target: &Target<'_>,
) -> Result<WriteInfo, FilesError>
where
    S: futures_util::Stream<Item = Result<Bytes, FilesError>>,
{
    let (tx, mut rx) = mpsc::channel::<Bytes>(WRITE_BEHIND_CHUNKS);
    let owner = target.owner;
    let metadata = Arc::clone(&target.metadata);
    let reserved = target.reserved.clone();
    let writer = tokio::task::spawn_blocking(move || {
        write_blocking(&path, owner, &metadata, &reserved, &mut rx)
    });
    let mut source = std::pin::pin!(source);
    let mut failed = None;
    while let Some(chunk) = source.next().await {
        match chunk {
            Ok(chunk) => {
                // The writer stopped early: its answer says why.
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let written = writer
        .await
        .map_err(|e| FilesError::internal(format!("the upload was lost: {e}")))?;
    match failed {
        Some(e) => Err(e),
        None => written,
    }
}

fn no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw_os_error),
        Some(Errno::NOSPC | Errno::DQUOT)
    )
}

/// How a failed write is answered: 507 when the disk (or the user's quota) is full.
pub(crate) fn write_error(what: &str, e: &io::Error) -> FilesError {
    if no_space(e) {
        FilesError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("{what}: not enough disk space available"),
        )
    } else {
        FilesError::internal(format!("{what}: {e}"))
    }
}

/// What a failure to store metadata means for an upload: `None` to go on writing.
///
/// A filesystem without extended attributes cannot keep metadata: with some to store the
/// upload is refused (400) before any content is written, and a file it created is removed
/// again; with none, there is nothing to keep and nothing stale to clear. A full disk is 507.
fn metadata_failure(
    e: &io::Error,
    metadata: &BTreeMap<String, String>,
    path: &Path,
    existed: bool,
) -> Option<FilesError> {
    if !metadata::is_unsupported(e) {
        return Some(write_error("error writing file metadata", e));
    }
    if metadata.is_empty() {
        return None;
    }
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Some(FilesError::bad_request(format!(
        "the filesystem of {} does not support extended attributes, so the file metadata cannot be stored",
        path.display()
    )))
}

fn write_blocking(
    path: &Path,
    owner: Owner,
    metadata: &BTreeMap<String, String>,
    reserved: &Reserved,
    rx: &mut mpsc::Receiver<Bytes>,
) -> Result<WriteInfo, FilesError> {
    let shown = path.display();
    // Where the file would land, before any parent is created.
    reserved.check_path(path).map_err(FilesError::refused)?;
    if let Some(parent) = path.parent() {
        ensure_dirs(parent, owner).map_err(|e| {
            if e.kind() == io::ErrorKind::NotADirectory {
                FilesError::bad_request(format!("error ensuring directories: {e}"))
            } else {
                write_error("error ensuring directories", &e)
            }
        })?;
    }
    let existed = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(FilesError::bad_request(format!(
                "path is a directory: {shown}"
            )));
        }
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => {
            return Err(FilesError::internal(format!(
                "error getting file info: {e}"
            )));
        }
    };
    let not_regular = || FilesError::bad_request(format!("path is not a regular file: {shown}"));
    let fd = rustix::fs::open(
        path,
        OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::from_raw_mode(0o666),
    )
    .map_err(|e| match e {
        // A FIFO nobody reads, or a device without a driver.
        Errno::NXIO | Errno::NODEV => not_regular(),
        Errno::ISDIR => FilesError::bad_request(format!("path is a directory: {shown}")),
        _ => write_error("error opening file", &e.into()),
    })?;
    let mut file = File::from(fd);
    // What was opened, before anything about it changes: a symlink swapped in since the first
    // check cannot redirect the write into a reserved tree.
    reserved
        .check_fd(&file, path)
        .map_err(FilesError::refused)?;
    let meta = file
        .metadata()
        .map_err(|e| FilesError::internal(format!("error getting file info: {e}")))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    // A hard link elsewhere to a reserved file has a path of its own: judged by its inode,
    // before its owner, metadata or contents change.
    reserved
        .check_links(&meta, path)
        .map_err(FilesError::refused)?;
    owner
        .apply_to_file(&file)
        .map_err(|e| FilesError::internal(format!("error changing file ownership: {e}")))?;
    if let Err(e) = metadata::replace(&file, metadata)
        && let Some(refused) = metadata_failure(&e, metadata, path, existed)
    {
        return Err(refused);
    }
    file.set_len(0)
        .map_err(|e| write_error("error truncating file", &e))?;
    while let Some(chunk) = rx.blocking_recv() {
        file.write_all(&chunk)
            .map_err(|e| write_error("error writing file", &e))?;
    }
    let stored = metadata::read(path).unwrap_or_default();
    Ok(WriteInfo {
        path: path.to_string_lossy().into_owned(),
        name: base_name(path),
        kind: "file".to_owned(),
        metadata: (!stored.is_empty()).then_some(stored),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_507_anything_else_500() {
        let full = io::Error::from_raw_os_error(Errno::NOSPC.raw_os_error());
        assert_eq!(write_error("w", &full).status, 507);
        let quota = io::Error::from_raw_os_error(Errno::DQUOT.raw_os_error());
        assert_eq!(write_error("w", &quota).status, 507);
        let other = io::Error::from_raw_os_error(Errno::IO.raw_os_error());
        assert_eq!(write_error("w", &other).status, 500);
    }

    #[test]
    fn a_filesystem_without_attributes_refuses_metadata_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new");
        std::fs::write(&path, b"").unwrap();
        let unsupported = io::Error::from_raw_os_error(Errno::OPNOTSUPP.raw_os_error());
        let some: BTreeMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
        assert!(metadata_failure(&unsupported, &BTreeMap::new(), &path, false).is_none());
        let existing = metadata_failure(&unsupported, &some, &path, true).unwrap();
        assert_eq!(existing.status, 400);
        assert!(
            existing.message.contains("extended attributes"),
            "{}",
            existing.message
        );
        assert!(path.exists(), "a file that was there stays");
        assert_eq!(
            metadata_failure(&unsupported, &some, &path, false)
                .unwrap()
                .status,
            400
        );
        assert!(!path.exists(), "a file the upload created is removed again");
        let full = io::Error::from_raw_os_error(Errno::NOSPC.raw_os_error());
        assert_eq!(
            metadata_failure(&full, &some, &path, true).unwrap().status,
            507
        );
        let other = io::Error::from_raw_os_error(Errno::IO.raw_os_error());
        assert_eq!(
            metadata_failure(&other, &BTreeMap::new(), &path, true)
                .unwrap()
                .status,
            500
        );
    }

    #[test]
    fn encodings_and_metadata_headers_are_read() {
        let mut h = HeaderMap::new();
        assert!(!content_encoding(&h).unwrap());
        h.insert(header::CONTENT_ENCODING, "GZIP".parse().unwrap());
        assert!(content_encoding(&h).unwrap());
        h.insert(header::CONTENT_ENCODING, "br".parse().unwrap());
        assert_eq!(content_encoding(&h).unwrap_err().status, 400);

        let mut h = HeaderMap::new();
        h.insert("X-Metadata-Owner", "alice".parse().unwrap());
        h.append("x-metadata-owner", "bob".parse().unwrap());
        h.insert("x-metadata-Kind", "report".parse().unwrap());
        h.insert("x-other", "ignored".parse().unwrap());
        let m = metadata_headers(&h).unwrap();
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![
                ("kind".to_owned(), "report".to_owned()),
                ("owner".to_owned(), "alice".to_owned())
            ]
        );
        let mut h = HeaderMap::new();
        h.insert(
            "x-metadata-k",
            hyper::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(metadata_headers(&h).unwrap_err().status, 400);
        let mut h = HeaderMap::new();
        for i in 0..=metadata::MAX_KEYS {
            h.insert(
                hyper::header::HeaderName::from_bytes(format!("x-metadata-k{i}").as_bytes())
                    .unwrap(),
                "v".parse().unwrap(),
            );
        }
        assert_eq!(metadata_headers(&h).unwrap_err().status, 400);
    }
}

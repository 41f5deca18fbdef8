//! `GET /files`: a regular file's bytes, streamed from disk.
//!
//! Only a regular file outside the reserved trees is ever read. The path is first opened
//! `O_PATH` and that descriptor judged, by its real path and its type (so a device is never
//! even opened for reading: opening some has side effects); the file is then opened,
//! non-blocking, through that descriptor, and checked again with `fstat` on what was opened. Exactly the size `fstat` reported is sent: a file that grows meanwhile is cut at
//! that size, one that shrinks aborts the response rather than pass for whole.

use std::fs::File;
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::Path;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Response, StatusCode, Uri};
use rustix::fs::{Mode, OFlags};
use tokio::sync::mpsc;

use super::body::ChannelBody;
use super::query::FilesQuery;
use super::{FileOperation, FilesBody, FilesContext, FilesError, mime};
use crate::fs::reserved::Reserved;

/// The size of each chunk read from disk.
pub(crate) const CHUNK: usize = 64 * 1024;

/// Chunks read ahead of the client: what a slow reader makes the agent hold, per download.
pub(crate) const READ_AHEAD_CHUNKS: usize = 4;

pub(crate) async fn get(
    headers: &HeaderMap,
    uri: &Uri,
    ctx: &FilesContext,
) -> Result<Response<FilesBody>, FilesError> {
    let query = FilesQuery::parse(uri.query())?;
    let user = super::authorize_and_resolve_user(headers, &query, FileOperation::Read, ctx)?;
    let requested = query.path.clone().unwrap_or_default();
    let path = crate::fs::path::resolve(&requested, &user, ctx.default_workdir.as_deref())
        .map_err(|e| {
            FilesError::bad_request(format!(
                "error expanding and resolving path '{requested}': {e}"
            ))
        })?;

    let ranged = headers.contains_key(header::RANGE);
    let encoding = choose_encoding(headers.get(header::ACCEPT_ENCODING))?;
    // A range is of the file's bytes, not of a compressed stream: ranges are served plain.
    let gzip = encoding == Encoding::Gzip && !ranged;
    if ranged && encoding == Encoding::Gzip && identity_refused(headers) {
        return Err(FilesError::new(
            StatusCode::NOT_ACCEPTABLE,
            "identity encoding not acceptable for a range request",
        ));
    }

    let opened_path = path.clone();
    let reserved = ctx.reserved.clone();
    let (file, size) = tokio::task::spawn_blocking(move || open_regular(&opened_path, &reserved))
        .await
        .map_err(|e| FilesError::internal(format!("the download was lost: {e}")))??;

    // If-Range names a version we cannot compare against cheaply: the whole file is always
    // right, a range of a changed file would not be.
    let range = match headers.get(header::RANGE) {
        Some(value) if !headers.contains_key(header::IF_RANGE) => {
            parse_range(value.to_str().unwrap_or(""), size)?
        }
        _ => None,
    };

    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    let name = crate::fs::path::clean(&path);
    let name = crate::fs::path::base_name(&name);
    let mut response = if gzip {
        tokio::task::spawn_blocking(move || pump_gzip(file, size, &tx));
        Response::new(ChannelBody::new(rx, None).boxed())
    } else {
        let (start, len) = range.unwrap_or((0, size));
        tokio::task::spawn_blocking(move || pump(file, start, len, &tx));
        let mut response = Response::new(ChannelBody::new(rx, Some(len)).boxed());
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        if let Some((start, len)) = range {
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
            let last = start + len - 1;
            response.headers_mut().insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes {start}-{last}/{size}")),
            );
        }
        response
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(mime::content_type(&requested_name(&requested, &path))),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        header_value(&mime::content_disposition(&name)),
    );
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    Ok(response)
}

/// The name the type is judged by: the path as asked for (a symlink `a.txt` is text whatever
/// it points at), else the resolved one.
fn requested_name(requested: &str, resolved: &Path) -> String {
    if requested.is_empty() {
        resolved.to_string_lossy().into_owned()
    } else {
        requested.to_owned()
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("inline"))
}

/// Opens `path` for reading if, and only if, it is a regular file outside the reserved trees;
/// answers it and its size.
///
/// The path is first opened `O_PATH` (which opens no device and cannot block on a FIFO), and
/// that descriptor is judged: where it really is ([`Reserved::check_fd`]) and what it is. The
/// file is then opened for reading through that same descriptor (`/proc/self/fd/N`), so what
/// is read is what was judged.
fn open_regular(path: &Path, reserved: &Reserved) -> Result<(File, u64), FilesError> {
    let shown = path.display();
    let not_found = || {
        FilesError::new(
            StatusCode::NOT_FOUND,
            format!("path '{shown}' does not exist"),
        )
    };
    reserved.check_path(path).map_err(FilesError::refused)?;
    let pinned = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(
        |e| match e {
            rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR => not_found(),
            _ => FilesError::internal(format!("error checking if path exists '{shown}': {e}")),
        },
    )?;
    reserved
        .check_fd(&pinned, path)
        .map_err(FilesError::refused)?;
    let meta = rustix::fs::fstat(&pinned)
        .map_err(|e| FilesError::internal(format!("error checking file '{shown}': {e}")))?;
    let kind = rustix::fs::FileType::from_raw_mode(meta.st_mode);
    if kind == rustix::fs::FileType::Directory {
        return Err(FilesError::bad_request(format!(
            "path '{shown}' is a directory"
        )));
    }
    let not_regular = || FilesError::bad_request(format!("path '{shown}' is not a regular file"));
    if kind != rustix::fs::FileType::RegularFile {
        return Err(not_regular());
    }
    let reopen = format!("/proc/self/fd/{}", pinned.as_raw_fd());
    let fd = rustix::fs::open(
        reopen.as_str(),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::NOENT => not_found(),
        _ => FilesError::internal(format!("error opening file '{shown}': {e}")),
    })?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| FilesError::internal(format!("error checking file '{shown}': {e}")))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    Ok((file, meta.len()))
}

/// Sends `len` bytes of `file` from `start`, chunk by chunk, until done or the client is gone.
fn pump(mut file: File, start: u64, len: u64, tx: &mpsc::Sender<io::Result<Bytes>>) {
    if let Err(e) = file.seek(SeekFrom::Start(start)) {
        let _ = tx.blocking_send(Err(e));
        return;
    }
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        let mut buf = vec![0u8; want];
        match file.read(&mut buf) {
            Ok(0) => {
                let _ = tx.blocking_send(Err(shrank()));
                return;
            }
            Ok(n) => {
                buf.truncate(n);
                left -= n as u64;
                if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return;
            }
        }
    }
}

fn shrank() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the file shrank while it was read",
    )
}

/// Sends `size` bytes of `file`, gzip-compressed, in chunks of about [`CHUNK`].
fn pump_gzip(mut file: File, size: u64, tx: &mpsc::Sender<io::Result<Bytes>>) {
    let writer = ChunkWriter {
        tx: tx.clone(),
        buf: Vec::with_capacity(CHUNK),
    };
    let mut encoder = flate2::write::GzEncoder::new(writer, flate2::Compression::default());
    let mut left = size;
    let mut buf = vec![0u8; CHUNK];
    let result = (|| {
        while left > 0 {
            let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
            let n = match file.read(&mut buf[..want]) {
                Ok(0) => return Err(shrank()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            left -= n as u64;
            encoder.write_all(&buf[..n])?;
        }
        encoder.try_finish()?;
        encoder.get_mut().send()
    })();
    if let Err(e) = result {
        // When the client is gone this cannot arrive either; nothing else to do.
        let _ = tx.blocking_send(Err(e));
    }
}

/// Collects compressed output and sends it in chunks of [`CHUNK`].
struct ChunkWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl io::Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Identity,
    Gzip,
}

/// One `Accept-Encoding` entry: the coding, lower-cased, and its quality.
fn entries(header: &str) -> Vec<(String, f32)> {
    header
        .split(',')
        .map(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| {
                    let p = p.trim();
                    p.strip_prefix("q=").or_else(|| p.strip_prefix("Q="))
                })
                .find_map(|v| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            (coding, q)
        })
        .filter(|(c, _)| !c.is_empty())
        .collect()
}

/// Whether the client refuses an unencoded answer (`identity;q=0`, or `*;q=0` without an
/// `identity` entry above zero).
fn identity_refused(headers: &HeaderMap) -> bool {
    let Some(header) = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    refused(&entries(header))
}

fn refused(list: &[(String, f32)]) -> bool {
    let identity = list.iter().find(|(c, _)| c == "identity");
    let wildcard_zero = list.iter().any(|(c, q)| c == "*" && *q == 0.0);
    match identity {
        Some((_, q)) => *q == 0.0,
        None => wildcard_zero,
    }
}

/// The best coding the client accepts: gzip or identity by quality, identity when it names
/// nothing we speak and does not refuse it, 406 when it refuses everything we have.
fn choose_encoding(header: Option<&HeaderValue>) -> Result<Encoding, FilesError> {
    let Some(header) = header.and_then(|v| v.to_str().ok()) else {
        return Ok(Encoding::Identity);
    };
    let mut list = entries(header);
    let identity_refused = refused(&list);
    list.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (coding, q) in &list {
        if *q == 0.0 {
            continue;
        }
        match coding.as_str() {
            "identity" => return Ok(Encoding::Identity),
            "gzip" => return Ok(Encoding::Gzip),
            "*" if identity_refused => return Ok(Encoding::Gzip),
            "*" => return Ok(Encoding::Identity),
            _ => {}
        }
    }
    if identity_refused {
        return Err(FilesError::new(
            StatusCode::NOT_ACCEPTABLE,
            "no acceptable encoding found, supported: gzip",
        ));
    }
    Ok(Encoding::Identity)
}

/// One byte range of a file of `size` bytes, as `(start, length)`. Several ranges are answered
/// with the whole file (which HTTP allows); a range past the end is 416.
fn parse_range(value: &str, size: u64) -> Result<Option<(u64, u64)>, FilesError> {
    let unsatisfiable = || {
        FilesError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            format!("invalid range: failed to overlap (the file has {size} bytes)"),
        )
    };
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Err(FilesError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "invalid range: failed to parse",
        ));
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let bad = || {
        FilesError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "invalid range: failed to parse",
        )
    };
    let (first, last) = spec.trim().split_once('-').ok_or_else(bad)?;
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        let suffix: u64 = last.parse().map_err(|_| bad())?;
        if suffix == 0 || size == 0 {
            return Err(unsatisfiable());
        }
        let len = suffix.min(size);
        (size - len, len)
    } else {
        let start: u64 = first.parse().map_err(|_| bad())?;
        if start >= size {
            return Err(unsatisfiable());
        }
        let end = if last.is_empty() {
            size - 1
        } else {
            let end: u64 = last.parse().map_err(|_| bad())?;
            if end < start {
                return Err(bad());
            }
            end.min(size - 1)
        };
        (start, end - start + 1)
    };
    Ok(Some(range))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(dir: &Path, name: &str, content: &[u8]) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    #[test]
    fn encodings_are_chosen_by_quality() {
        let check = |header: &str, expected: Result<Encoding, u16>| {
            let value = HeaderValue::from_str(header).unwrap();
            let got = choose_encoding(Some(&value)).map_err(|e| e.status.as_u16());
            assert_eq!(got, expected, "{header}");
        };
        check("gzip", Ok(Encoding::Gzip));
        check("gzip, deflate, br", Ok(Encoding::Gzip));
        check("deflate", Ok(Encoding::Identity));
        check("identity;q=1, gzip;q=0.5", Ok(Encoding::Identity));
        check("identity;q=0.5, GZIP", Ok(Encoding::Gzip));
        check("gzip;q=0", Ok(Encoding::Identity));
        check("*", Ok(Encoding::Identity));
        check("*;q=0, gzip", Ok(Encoding::Gzip));
        check("identity;q=0, *", Ok(Encoding::Gzip));
        check("br, identity;q=0", Err(406));
        check("*;q=0", Err(406));
        assert_eq!(choose_encoding(None).unwrap(), Encoding::Identity);
    }

    #[test]
    fn ranges_parse_and_clamp() {
        let check = |spec: &str, expected: Result<Option<(u64, u64)>, u16>| {
            let got = parse_range(spec, 100).map_err(|e| e.status.as_u16());
            assert_eq!(got, expected, "{spec}");
        };
        check("bytes=0-9", Ok(Some((0, 10))));
        check("bytes=90-", Ok(Some((90, 10))));
        check("bytes=-5", Ok(Some((95, 5))));
        check("bytes=-500", Ok(Some((0, 100))));
        check("bytes=50-1000", Ok(Some((50, 50))));
        check("bytes=0-1,5-6", Ok(None));
        check("bytes=100-", Err(416));
        check("bytes=-0", Err(416));
        check("bytes=9-3", Err(416));
        check("items=0-1", Err(416));
        check("bytes=a-b", Err(416));
    }

    #[test]
    fn only_regular_files_open() {
        let dir = tempfile::tempdir().unwrap();
        let f = temp_file(dir.path(), "f", b"hello");
        let none = Reserved::default();
        let (_, size) = open_regular(&f, &none).unwrap();
        assert_eq!(size, 5);
        assert_eq!(open_regular(dir.path(), &none).unwrap_err().status, 400);
        assert_eq!(
            open_regular(&dir.path().join("missing"), &none)
                .unwrap_err()
                .status,
            404
        );
        let zero = open_regular(Path::new("/dev/zero"), &none).unwrap_err();
        assert_eq!(zero.status, 400);
        assert!(
            zero.message.contains("not a regular file"),
            "{}",
            zero.message
        );
        // Reserved: refused before the type is judged, through a link too, and a FIFO (opened
        // O_PATH only) never blocks the check.
        let dev = Reserved::new([std::path::PathBuf::from("/dev")]);
        assert_eq!(
            open_regular(Path::new("/dev/zero"), &dev)
                .unwrap_err()
                .status,
            403
        );
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero")).unwrap();
        assert_eq!(
            open_regular(&dir.path().join("zero"), &dev)
                .unwrap_err()
                .status,
            403
        );
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let e = open_regular(&fifo, &dev).unwrap_err();
        assert_eq!(e.status, 400, "{}", e.message);
        // A file in a reserved tree that is a regular file (as /proc's are) is refused too.
        let held = Reserved::new([dir.path().to_path_buf()]);
        assert_eq!(open_regular(&f, &held).unwrap_err().status, 403);
    }
}

//! 50 MiB through `POST /files` and `GET /files`, proving both stream: the upload body is
//! never more than a bounded amount ahead of what is on disk (octet-stream and multipart,
//! from a client that is always ready), the download never reads more than a bounded amount
//! ahead of a client that stops reading, and the process's peak memory stays far below the
//! file's size.
//!
//! One test in a binary of its own: it reads process-wide counters (`/proc/self/io`,
//! `/proc/self/status`) that another test running alongside would disturb.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod support;

use std::io::Read as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame};
use hyper::{Request, StatusCode};
use sandbox_agent::files::{FilesContext, FilesLimits, get_files, post_files};
use support::Env;

const SIZE: u64 = 50 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;
/// The most an upload may be ahead of the disk, or a download ahead of its reader.
const BOUND: u64 = 1024 * 1024;
const MIB: u64 = 1024 * 1024;

/// The byte at `offset` of the test content (varied enough that a shifted or repeated chunk
/// shows).
fn byte_at(offset: u64) -> u8 {
    ((offset / 7) ^ offset.wrapping_mul(31) ^ (offset >> 16)) as u8
}

fn content(from: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| byte_at(from + i)).collect()
}

/// A request body that makes `SIZE` bytes of content on the fly, always ready, between an
/// optional prefix and suffix, and records how far its content got ahead of `target`'s size on
/// disk.
struct Producer {
    prefix: Option<Bytes>,
    suffix: Option<Bytes>,
    produced: u64,
    target: PathBuf,
    max_ahead: Arc<AtomicU64>,
}

impl Producer {
    fn new(target: PathBuf, prefix: &[u8], suffix: &[u8]) -> (Self, Arc<AtomicU64>) {
        let max_ahead = Arc::new(AtomicU64::new(0));
        let p = Producer {
            prefix: (!prefix.is_empty()).then(|| Bytes::copy_from_slice(prefix)),
            suffix: (!suffix.is_empty()).then(|| Bytes::copy_from_slice(suffix)),
            produced: 0,
            target,
            max_ahead: Arc::clone(&max_ahead),
        };
        (p, max_ahead)
    }
}

impl Body for Producer {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        let on_disk = std::fs::metadata(&self.target).map_or(0, |m| m.len());
        let ahead = self.produced.saturating_sub(on_disk);
        self.max_ahead.fetch_max(ahead, Ordering::Relaxed);
        if self.produced >= SIZE {
            return Poll::Ready(self.suffix.take().map(|s| Ok(Frame::data(s))));
        }
        let len = CHUNK.min((SIZE - self.produced) as usize);
        let chunk = content(self.produced, len);
        self.produced += len as u64;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }
}

fn check_file(path: &std::path::Path) {
    let mut file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = file.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(
            buf[..n] == content(offset, n)[..],
            "content differs near offset {offset}"
        );
        offset += n as u64;
    }
    assert_eq!(offset, SIZE);
}

fn proc_field(file: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(file).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key} not in {file}"));
    line[key.len()..]
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

/// Peak resident memory so far, in bytes.
fn peak_rss() -> u64 {
    proc_field("/proc/self/status", "VmHWM:") * 1024
}

/// Bytes this process has read with read(2) and friends so far.
fn bytes_read() -> u64 {
    proc_field("/proc/self/io", "rchar:")
}

#[tokio::test]
async fn fifty_mib_stream_both_ways_in_bounded_memory() {
    let env = Env::new();
    let ctx = FilesContext {
        accounts: env.accounts.clone(),
        default_user: Some("me".into()),
        default_workdir: None,
        access_token: None,
        limits: FilesLimits::default(),
        reserved: Default::default(),
    };
    let rss_before = peak_rss();

    // Upload, octet-stream.
    let target = env.home().join("big.bin");
    let (body, ahead) = Producer::new(target.clone(), b"", b"");
    let request = Request::post("/files?path=big.bin")
        .header("content-type", "application/octet-stream")
        .body(body)
        .unwrap();
    let response = post_files(request, &ctx).await;
    assert_eq!(response.status(), StatusCode::OK);
    let max_ahead = ahead.load(Ordering::Relaxed);
    assert!(
        max_ahead <= BOUND,
        "the octet-stream upload got {max_ahead} bytes ahead of the disk"
    );
    eprintln!("octet-stream upload: at most {max_ahead} bytes ahead of the disk");
    check_file(&target);

    // Upload, multipart.
    let boundary = "stream-boundary";
    let prefix = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"multi.bin\"\r\n\r\n"
    );
    let suffix = format!("\r\n--{boundary}--\r\n");
    let multi = env.home().join("multi.bin");
    let (body, ahead) = Producer::new(multi.clone(), prefix.as_bytes(), suffix.as_bytes());
    let request = Request::post("/files")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .unwrap();
    let response = post_files(request, &ctx).await;
    assert_eq!(response.status(), StatusCode::OK);
    let max_ahead = ahead.load(Ordering::Relaxed);
    assert!(
        max_ahead <= BOUND,
        "the multipart upload got {max_ahead} bytes ahead of the disk"
    );
    eprintln!("multipart upload: at most {max_ahead} bytes ahead of the disk");
    check_file(&multi);

    // Download: take one chunk, stop reading, and see how much the agent read meanwhile.
    let read_before = bytes_read();
    let request = Request::get("/files?path=big.bin")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let response = get_files(request, &ctx).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-length"], SIZE.to_string());
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read_ahead = bytes_read() - read_before;
    assert!(
        read_ahead <= BOUND,
        "the download read {read_ahead} bytes for a client that took {}",
        first.len()
    );
    eprintln!("download: read {read_ahead} bytes ahead of a stopped client");
    let mut offset = first.len() as u64;
    assert!(first[..] == content(0, first.len())[..]);
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        assert!(
            data[..] == content(offset, data.len())[..],
            "download differs near {offset}"
        );
        offset += data.len() as u64;
    }
    assert_eq!(offset, SIZE);

    let growth = peak_rss().saturating_sub(rss_before);
    eprintln!("peak RSS growth: {} KiB", growth / 1024);
    assert!(
        growth < 16 * MIB,
        "peak memory grew by {} MiB moving {} MiB files",
        growth / MIB,
        SIZE / MIB
    );
}

//! The streamed file routes and the watch stream through `sandbox serve` (a real process, its
//! default agent data plane) over the real Docker engine, proven to stream rather than buffer:
//!
//! - a 200 MiB upload and a 200 MiB download round-trip the bytes exactly (SHA-256 on both
//!   sides: the sandbox's `sha256sum` for the upload, the client's for the download);
//! - the service's resident memory (`VmRSS` of the serve process, sampled every 20 ms from
//!   `/proc`) grows by less than 64 MiB over its warmed-up baseline throughout;
//! - upload: the client sends 16 MiB and then waits (with a deadline that fails the test)
//!   until the staging file inside the sandbox (`.<name>.sandbox-upload-<random>`, asked with
//!   an exec) holds 16 MiB, before it sends the rest: the bytes reached the sandbox while the
//!   request was still open;
//! - download: the client takes the first 16 MiB and stops reading; while it holds them, the
//!   sandbox-side reader (the process in the container with the file open, found from the
//!   host's `/proc`) is seen still open on the file short of its end: the file is read as
//!   the client takes it, not before;
//! - meanwhile no file under the service's temp directory (`TMPDIR`) or its data directory
//!   (the home its dev token lives in) grows past 1 MiB;
//! - a watch through the API sees a file created by a separate exec;
//! - on the exec data plane, which declares none of the three capabilities, every one of
//!   these routes answers its 501 code and the refused upload writes nothing.
//!
//! Needs the engine, the `sandbox-busybox:test` image and the static agent: ignored in a plain
//! `cargo test`, run by `cargo xtask test`'s docker engine stage.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::support;
use support::ReqBody;
use support::serve::{START_DEADLINE, Service};

const MIB: u64 = 1024 * 1024;
const TOTAL: u64 = 200 * MIB;
const FIRST: u64 = 16 * MIB;
/// The most the service's resident memory may grow over its baseline.
const RSS_GROWTH_MAX: u64 = 64 * MIB;
/// The most any file under the service's temp or data directories may hold.
const SPILL_MAX: u64 = MIB;
/// Generous: a busy engine, a debug build.
const STAGE_DEADLINE: Duration = Duration::from_secs(25);
const WATCH_DEADLINE: Duration = Duration::from_secs(30);
const TARGET: &str = "/workspace/big.bin";

/// Chunk `i` of the content: a random MiB with its index in the first 8 bytes, so every MiB
/// differs and generating 200 of them costs nothing.
fn chunk(base: &[u8], i: u64) -> Bytes {
    let mut c = base.to_vec();
    c[..8].copy_from_slice(&i.to_le_bytes());
    Bytes::from(c)
}

fn http() -> Client<HttpConnector, ReqBody> {
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    client
}

/// Resident and peak memory of `pid`, in bytes (`VmRSS`, `VmHWM`).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The largest regular file below `dir` (0 when none), and its path.
fn largest_file(dir: &Path) -> (u64, Option<PathBuf>) {
    let mut best = (0, None);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return best;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        let found = if meta.is_dir() {
            largest_file(&entry.path())
        } else {
            (meta.len(), Some(entry.path()))
        };
        if found.0 > best.0 {
            best = found;
        }
    }
    best
}

/// Samples the service's memory and the size of what it keeps on disk until stopped.
struct Monitor {
    stop: Arc<AtomicBool>,
    max_rss: Arc<AtomicU64>,
    max_file: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Option<PathBuf>>,
}

impl Monitor {
    fn start(pid: u32, dirs: Vec<PathBuf>) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let max_rss = Arc::new(AtomicU64::new(0));
        let max_file = Arc::new(AtomicU64::new(0));
        let (s, r, f) = (stop.clone(), max_rss.clone(), max_file.clone());
        let task = tokio::task::spawn_blocking(move || {
            let mut worst = None;
            let mut tick = 0u32;
            while !s.load(Ordering::Acquire) {
                r.fetch_max(memory(pid).0, Ordering::AcqRel);
                if tick.is_multiple_of(10) {
                    for dir in &dirs {
                        let (size, path) = largest_file(dir);
                        if size > f.fetch_max(size, Ordering::AcqRel) {
                            worst = path;
                        }
                    }
                }
                tick += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            worst
        });
        Monitor {
            stop,
            max_rss,
            max_file,
            task,
        }
    }

    /// The largest resident size, the largest file and its path.
    async fn finish(self) -> (u64, u64, Option<PathBuf>) {
        self.stop.store(true, Ordering::Release);
        let worst = self.task.await.unwrap();
        (
            self.max_rss.load(Ordering::Acquire),
            self.max_file.load(Ordering::Acquire),
            worst,
        )
    }
}

/// Runs a shell command in the session's sandbox; its stdout.
async fn sh(service: &Service, token: &str, session: &str, script: &str) -> String {
    let body = serde_json::json!({ "command": script, "shell": true }).to_string();
    let (status, out) = service
        .call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            token,
            &body,
        )
        .await;
    assert_eq!(status, 200, "{script}: {out}");
    assert_eq!(out["exit_code"], 0, "{script}: {out}");
    out["stdout"].as_str().unwrap().to_owned()
}

/// The size of the upload's staging sibling in the sandbox, if it is there.
async fn staged_size(service: &Service, token: &str, session: &str) -> Option<u64> {
    let out = sh(
        service,
        token,
        session,
        "for f in /workspace/.big.bin.sandbox-upload-*; do [ -f \"$f\" ] && stat -c %s \"$f\"; done; true",
    )
    .await;
    out.lines().filter_map(|l| l.trim().parse().ok()).max()
}

/// The host pids of the container's processes.
async fn container_pids(namespace: &str) -> Vec<u32> {
    let ids = support::container_ids(namespace).await;
    assert_eq!(ids.len(), 1, "one sandbox: {ids:?}");
    let out = tokio::process::Command::new("docker")
        .args(["top", &ids[0], "-o", "pid"])
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "docker top: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Positions of every open descriptor on the target file among `pids` (from `fdinfo`).
fn reader_positions(pids: &[u32]) -> Vec<u64> {
    let mut out = Vec::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if !link.to_string_lossy().ends_with(TARGET) {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            if let Some(pos) = info
                .lines()
                .find_map(|l| l.strip_prefix("pos:"))
                .and_then(|p| p.trim().parse().ok())
            {
                out.push(pos);
            }
        }
    }
    out
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sbx-streams-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and the static agent: cargo xtask test runs it"]
async fn streamed_files_stream_through_the_service_and_a_watch_sees_an_exec() {
    let namespace = format!("tstream-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let (tmp, data) = (dir.join("tmp"), dir.join("data"));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let token_file = data.join("dev-token");
    let log = dir.join("serve.log");
    let tmp_text = tmp.display().to_string();
    let data_text = data.display().to_string();
    let mut service = Service::spawn(
        &namespace,
        &token_file,
        &log,
        &[
            ("TMPDIR", tmp_text.as_str()),
            ("HOME", data_text.as_str()),
            ("XDG_CONFIG_HOME", data_text.as_str()),
        ],
    );
    if let Err(status) = service.ready(START_DEADLINE).await {
        panic!(
            "sandbox serve exited with {status}; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let cleanup = Cleanup(namespace.clone());
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    let pid = service.child.id();
    let session = "streams";
    let base = service.base.clone();
    let url = format!("{base}/v1/sessions/{session}/files/stream?path={TARGET}");
    let client = http();
    let auth = format!("Bearer {token}");

    // Warm up: the sandbox exists, and one small streamed round trip has run, so the
    // baseline holds the service's steady allocations.
    sh(&service, &token, session, "true").await;
    let warm: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    let request = hyper::Request::put(format!(
        "{base}/v1/sessions/{session}/files/stream?path=/workspace/warm.bin"
    ))
    .header("authorization", &auth)
    .body(support::full(warm.clone()))
    .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let request = hyper::Request::get(format!(
        "{base}/v1/sessions/{session}/files/stream?path=/workspace/warm.bin"
    ))
    .header("authorization", &auth)
    .body(support::full(Bytes::new()))
    .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let back = response.into_body().collect().await.unwrap().to_bytes();
    assert!(back == warm, "the warm-up round trip differs");
    let (baseline, _) = memory(pid);

    let monitor = Monitor::start(pid, vec![tmp.clone(), data.clone()]);

    // ---- upload: 16 MiB, wait for the sandbox to hold them, then the rest ----------------
    let mut seed = vec![0u8; MIB as usize];
    for b in seed.iter_mut() {
        *b = fastrand::u8(..);
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let bytes = rx.recv().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), rx))
    });
    let body: ReqBody = BodyExt::boxed(StreamBody::new(frames));
    let request = hyper::Request::put(&url)
        .header("authorization", &auth)
        .header("content-length", TOTAL.to_string())
        .body(body)
        .unwrap();
    let upload = tokio::spawn({
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
            )
        }
    });
    let mut sent = Sha256::new();
    let chunks = TOTAL / MIB;
    for i in 0..FIRST / MIB {
        let c = chunk(&seed, i);
        sent.update(&c);
        tx.send(c).await.unwrap();
    }
    let waited = Instant::now();
    loop {
        let staged = staged_size(&service, &token, session).await;
        if staged.is_some_and(|n| n >= FIRST) {
            break;
        }
        assert!(
            waited.elapsed() < STAGE_DEADLINE,
            "the sandbox's staging file did not reach {FIRST} bytes within {STAGE_DEADLINE:?} \
             of the client sending them (it holds {staged:?}): the upload is not streamed through"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !upload.is_finished(),
        "the upload answered before its body was sent"
    );
    for i in FIRST / MIB..chunks {
        let c = chunk(&seed, i);
        sent.update(&c);
        tx.send(c).await.unwrap();
    }
    drop(tx);
    let (status, written) = upload.await.unwrap();
    assert_eq!(status, 200, "{written}");
    assert_eq!(written["bytes"], TOTAL, "{written}");
    let sent = hex(&sent.finalize());
    let inside = sh(&service, &token, session, &format!("sha256sum {TARGET}")).await;
    assert_eq!(
        inside.split_whitespace().next(),
        Some(sent.as_str()),
        "the sandbox's file differs from what was sent"
    );
    assert_eq!(
        staged_size(&service, &token, session).await,
        None,
        "the staging file is gone"
    );

    // ---- download: take 16 MiB, hold, see the sandbox's reader mid-file, then the rest -----
    let request = hyper::Request::get(&url)
        .header("authorization", &auth)
        .body(support::full(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut got = Sha256::new();
    let mut received = 0u64;
    while received < FIRST {
        let frame = body.frame().await.expect("more of the download").unwrap();
        if let Ok(data) = frame.into_data() {
            received += data.len() as u64;
            got.update(&data);
        }
    }
    // Holding the first 16 MiB: the reader in the sandbox has the file open and has not
    // reached its end (socket buffers and the channel's window hold a bounded amount).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let positions = reader_positions(&container_pids(&namespace).await);
    assert!(
        !positions.is_empty(),
        "no process in the sandbox has {TARGET} open while the client holds the first {FIRST} \
         bytes: the file was read to its end before the client took it"
    );
    assert!(
        positions.iter().all(|p| *p < TOTAL),
        "the sandbox-side reader is at {positions:?} of {TOTAL} while the client holds {received}"
    );
    let (held_rss, _) = memory(pid);
    assert!(
        held_rss.saturating_sub(baseline) < RSS_GROWTH_MAX,
        "the service grew by {} bytes while the client held the download",
        held_rss.saturating_sub(baseline)
    );
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            received += data.len() as u64;
            got.update(&data);
        }
    }
    assert_eq!(received, TOTAL);
    assert_eq!(
        hex(&got.finalize()),
        sent,
        "the download differs from the upload"
    );

    let (max_rss, max_file, worst) = monitor.finish().await;
    let (_, peak) = memory(pid);
    eprintln!(
        "streams: baseline VmRSS {} MiB, max VmRSS {} MiB (growth {} MiB), VmHWM {} MiB, largest spilled file {max_file} bytes",
        baseline / MIB,
        max_rss / MIB,
        max_rss.saturating_sub(baseline) / MIB,
        peak / MIB,
    );
    assert!(
        max_rss.saturating_sub(baseline) < RSS_GROWTH_MAX,
        "the service's VmRSS grew from {baseline} to {max_rss} bytes over 200 MiB each way"
    );
    assert!(
        max_file <= SPILL_MAX,
        "{worst:?} under the service's temp or data directory grew to {max_file} bytes"
    );

    // ---- watch: a file created by a separate exec is reported -----------------------------
    let request = hyper::Request::get(format!(
        "{base}/v1/sessions/{session}/watch?path=/workspace"
    ))
    .header("authorization", &auth)
    .body(support::full(Bytes::new()))
    .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut lines = Lines {
        body: response.into_body(),
        buf: Vec::new(),
    };
    let started = lines.next().await;
    assert_eq!(started["type"], "started", "{started}");
    sh(
        &service,
        &token,
        session,
        "echo hi > /workspace/watched.txt",
    )
    .await;
    let seen = tokio::time::timeout(WATCH_DEADLINE, async {
        loop {
            let line = lines.next().await;
            if line["type"] == "event" && line["path"] == "/workspace/watched.txt" {
                return line;
            }
            assert_eq!(line["type"], "event", "{line}");
        }
    })
    .await
    .expect("the watch reported the exec's file");
    assert!(
        seen["kind"] == "create" || seen["kind"] == "write",
        "{seen}"
    );
    drop(lines);

    drop(service);
    drop(cleanup);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// NDJSON lines of a response body.
struct Lines {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

impl Lines {
    async fn next(&mut self) -> Value {
        loop {
            if let Some(at) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let frame = self
                .body
                .frame()
                .await
                .expect("the stream goes on")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }
}

/// Removes the test's containers however the test ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        support::remove_namespace(&self.0);
    }
}

/// The exec data plane declares neither `streamed_files`, `watch` nor `processes`: through the
/// real service each route says so with its own 501 code, and nothing falls back to buffering
/// (the refused upload wrote nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn the_exec_plane_refuses_the_streamed_routes_with_their_codes() {
    let namespace = format!("tstreamx-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let env = support::agent_mode::exec_env();
    let mut service = Service::spawn(
        &namespace,
        &token_file,
        &log,
        &support::agent_mode::borrowed(&env),
    );
    if let Err(status) = service.ready(START_DEADLINE).await {
        panic!(
            "sandbox serve exited with {status}; its log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let cleanup = Cleanup(namespace.clone());
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    let session = "plain";
    sh(&service, &token, session, "true").await;
    let s = format!("/v1/sessions/{session}");
    for (method, path, body, want) in [
        (
            "PUT",
            format!("{s}/files/stream?path=/workspace/x.bin"),
            "data",
            "streamed_files_unsupported",
        ),
        (
            "GET",
            format!("{s}/files/stream?path=/etc/hostname"),
            "",
            "streamed_files_unsupported",
        ),
        (
            "POST",
            format!("{s}/files/rename"),
            r#"{"from":"/workspace/a","to":"/workspace/b"}"#,
            "streamed_files_unsupported",
        ),
        (
            "GET",
            format!("{s}/watch?path=/workspace"),
            "",
            "watch_unsupported",
        ),
        (
            "POST",
            format!("{s}/processes"),
            r#"{"command":"sleep","args":["30"]}"#,
            "processes_unsupported",
        ),
        ("GET", format!("{s}/processes"), "", "processes_unsupported"),
    ] {
        let (status, out) = service.call(method, &path, &token, body).await;
        assert_eq!(
            (status, support::code(&out)),
            (501, want),
            "{method} {path}: {out}"
        );
    }
    let listed = sh(&service, &token, session, "ls -a /workspace").await;
    assert!(
        !listed.contains("x.bin"),
        "a refused upload wrote: {listed}"
    );
    drop(service);
    drop(cleanup);
    std::fs::remove_dir_all(&dir).unwrap();
}

//! The service against a hostile tenant and hostile code inside its sandbox, over the real
//! Docker engine: each test is one finding of a red-team pass, and fails on the code that had
//! it.
//!
//! Memory figures are the service's own: the tests that measure run `sandbox serve` as a child
//! process and read its `/proc/<pid>/status` (the peak, `VmHWM`, after resetting it through
//! `clear_refs`), so the test's own buffers never count.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`. Every container is in a namespace of the test's, removed at the end.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::code;
use support::serve::Service;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN_A: &str = "token-hardening-a";
const TOKEN_B: &str = "token-hardening-b";
const MIB: u64 = 1024 * 1024;

// ---- helpers ---------------------------------------------------------------------------------

/// A test client dialling its own loopback server, not a tenant-supplied endpoint.
#[expect(
    clippy::disallowed_methods,
    reason = "a test dialling its own loopback service"
)]
async fn dial(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// A `sandbox serve` child in its own namespace, removed with its containers on drop.
struct Child {
    service: Service,
    namespace: String,
    dir: PathBuf,
    token: String,
}

impl Child {
    async fn start(tag: &str, env: &[(&str, &str)]) -> Child {
        let namespace = format!("{tag}-{:08x}", fastrand::u32(..));
        let dir = support::serve::temp_dir();
        let token_file = dir.join("token");
        let log = dir.join("serve.log");
        let mut service = Service::spawn(&namespace, &token_file, &log, env);
        if let Err(status) = service.ready(support::serve::START_DEADLINE).await {
            panic!(
                "sandbox serve exited with {status}; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let token = std::fs::read_to_string(&token_file)
            .unwrap()
            .trim()
            .to_owned();
        Child {
            service,
            namespace,
            dir,
            token,
        }
    }

    fn pid(&self) -> u32 {
        self.service.child.id()
    }

    fn addr(&self) -> SocketAddr {
        self.service
            .base
            .trim_start_matches("http://")
            .parse()
            .unwrap()
    }

    async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.service.call(method, path, &self.token, body).await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.service.child.kill();
        let _ = self.service.child.wait();
        support::remove_namespace(&self.namespace);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Resets the process's peak RSS to its current RSS, and returns that.
fn reset_peak(pid: u32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    status_kib(pid, "VmRSS")
}

/// How far the peak RSS rose above `baseline` (KiB), in MiB.
fn peak_growth_mib(pid: u32, baseline_kib: u64) -> u64 {
    status_kib(pid, "VmHWM").saturating_sub(baseline_kib) / 1024
}

fn shell(script: &str) -> String {
    json!({ "command": script, "shell": true }).to_string()
}

/// A request whose body is streamed, answered with its status, the answer's byte count and its
/// last 4 KiB (the answer is counted as it arrives, never held).
async fn counted(
    base: &str,
    method: &str,
    path: &str,
    token: &str,
    body: support::ReqBody,
) -> (u16, u64, Bytes) {
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client: hyper_util::client::legacy::Client<_, support::ReqBody> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(body)
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let (mut total, mut tail) = (0u64, Vec::new());
    while let Some(frame) = resp.body_mut().frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            total += data.len() as u64;
            tail.extend_from_slice(&data[data.len().saturating_sub(4096)..]);
            let excess = tail.len().saturating_sub(4096);
            tail.drain(..excess);
        }
    }
    (status, total, Bytes::from(tail))
}

/// A shell command of tenant A in `session`, running in the background: its status and answer.
fn exec_in_background(
    s: &support::Server,
    session: &str,
    script: &str,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let (base, client) = (s.base.clone(), s.client.clone());
    let (uri, body) = (format!("{base}/v1/sessions/{session}/exec"), shell(script));
    tokio::spawn(async move {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(uri)
            .header("authorization", format!("Bearer {TOKEN_A}"))
            .body(support::full(body))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    })
}

fn docker(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

// ---- H1: restore ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn restore_takes_only_this_tenants_snapshots_of_this_namespace() {
    let s = support::start("thrst", &[TOKEN_A, TOKEN_B]).await;
    let other = support::start("thrso", &[TOKEN_A]).await;
    let run = async {
        // Tenant A keeps a secret and snapshots it; so does A in another deployment.
        for server in [&s, &other] {
            let (status, v) = server
                .call_as(
                    "POST",
                    "/v1/sessions/src/exec",
                    Some(TOKEN_A),
                    &shell("echo a-secret > /workspace/secret.txt"),
                )
                .await;
            assert_eq!(status, 200, "{v}");
        }
        let (status, mine) = s
            .call_as("POST", "/v1/sessions/src/snapshots", Some(TOKEN_A), "")
            .await;
        assert_eq!(status, 201, "{mine}");
        let mine = mine["snapshot_id"].as_str().unwrap().to_owned();
        let (status, foreign_ns) = other
            .call_as("POST", "/v1/sessions/src/snapshots", Some(TOKEN_A), "")
            .await;
        assert_eq!(status, 201, "{foreign_ns}");
        let foreign_ns = foreign_ns["snapshot_id"].as_str().unwrap().to_owned();
        // 128 random bits in every name, never a 32-bit suffix.
        let tag = mine.rsplit(':').next().unwrap();
        let suffix = tag.rsplit('-').next().unwrap();
        assert!(
            suffix.len() >= 32 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
            "snapshot tag {tag:?} does not end in 128 random bits"
        );
        let before = s.containers().await;

        let restore = |token: &'static str, session: &'static str, id: String| {
            let s = &s;
            async move {
                s.call_body(
                    "POST",
                    &format!("/v1/sessions/{session}/restore"),
                    Some(token),
                    support::full(json!({ "snapshot_id": id }).to_string()),
                )
                .await
            }
        };
        let missing = format!("sandbox-snapshot-{}:s-{}", s.namespace, "0".repeat(32));
        let mut bodies = Vec::new();
        for (what, token, id) in [
            ("tenant A's snapshot, as tenant B", TOKEN_B, mine.clone()),
            (
                "a local image that is no snapshot",
                TOKEN_B,
                support::IMAGE.to_owned(),
            ),
            ("another deployment's snapshot", TOKEN_A, foreign_ns.clone()),
            ("a missing snapshot", TOKEN_B, missing),
        ] {
            let (status, v) = restore(token, "dst", id).await;
            println!("restore {what}: {status} {v}");
            assert_eq!(
                (status, code(&v)),
                (404, "snapshot_not_found"),
                "{what}: {v}"
            );
            bodies.push(v);
        }
        assert!(
            bodies.windows(2).all(|w| w[0] == w[1]),
            "the refusals differ, which tells a tenant what exists: {bodies:?}"
        );
        assert_eq!(
            s.containers().await,
            before,
            "a refused restore created a container"
        );

        // A's own snapshot still restores, with A's file.
        let (status, v) = restore(TOKEN_A, "dst", mine.clone()).await;
        assert_eq!(status, 201, "{v}");
        let (status, v) = s
            .call_as(
                "POST",
                "/v1/sessions/dst/exec",
                Some(TOKEN_A),
                r#"{"command":"cat","args":["/workspace/secret.txt"]}"#,
            )
            .await;
        assert_eq!(
            (status, v["stdout"].as_str()),
            (200, Some("a-secret\n")),
            "{v}"
        );
    };
    run.await;
    // The snapshots go with each server's namespace when it drops (support::remove_namespace).
}

// ---- H2: connections --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn unfinished_headers_are_closed_and_the_service_keeps_answering() {
    let child = Child::start(
        "thflood",
        &[("SANDBOX_SERVER_HEADER_READ_TIMEOUT_SECONDS", "3")],
    )
    .await;
    let addr = child.addr();
    let mut flood = Vec::new();
    for _ in 0..1000 {
        let mut c = dial(addr).await;
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        flood.push(c);
    }
    // During the flood a real request is served.
    let (status, v) = child
        .call(
            "POST",
            "/v1/sessions/flood/exec",
            r#"{"command":"echo","args":["alive"]}"#,
        )
        .await;
    assert_eq!(
        (status, v["stdout"].as_str()),
        (200, Some("alive\n")),
        "{v}"
    );
    // Every flood connection is closed by the server within the header timeout (3 s), with
    // generous slack for a busy machine.
    let started = Instant::now();
    let closed = futures_util::future::join_all(flood.into_iter().map(|mut c| async move {
        let mut buf = [0u8; 512];
        matches!(
            tokio::time::timeout(Duration::from_secs(30), c.read(&mut buf)).await,
            Ok(Ok(_) | Err(_))
        )
    }))
    .await;
    let open = closed.iter().filter(|c| !**c).count();
    println!(
        "1000 unfinished heads: {} closed by the server within {:?}",
        1000 - open,
        started.elapsed()
    );
    assert_eq!(
        open, 0,
        "connections with unfinished headers were left open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn unauthenticated_bodies_are_never_buffered() {
    let child = Child::start("thunauth", &[]).await;
    let (addr, pid) = (child.addr(), child.pid());
    let baseline = reset_peak(pid);
    let chunk = vec![b'{'; 256 * 1024];
    let mut held = Vec::new();
    for i in 0..300 {
        let mut c = dial(addr).await;
        let head = format!(
            "POST /v1/sessions/s{i}/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            7 * MIB
        );
        c.write_all(head.as_bytes()).await.unwrap();
        // Half the body, as far as the server lets us write it.
        for _ in 0..14 {
            if tokio::time::timeout(Duration::from_secs(2), c.write_all(&chunk))
                .await
                .map_or(true, |r| r.is_err())
            {
                break;
            }
        }
        held.push(c);
    }
    let grown = peak_growth_mib(pid, baseline);
    println!("300 unauthenticated half-sent 7 MiB bodies: peak RSS growth {grown} MiB");
    assert!(grown < 64, "the service grew by {grown} MiB");
    // Each got its 401 without its body being read.
    let mut answered = 0;
    for mut c in held.into_iter().take(20) {
        let mut buf = vec![0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await
            && String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 401")
        {
            answered += 1;
        }
    }
    assert_eq!(
        answered, 20,
        "unauthenticated requests must be answered 401"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn sigterm_exits_within_the_grace_period_despite_a_held_request() {
    let mut child = Child::start("thterm", &[("SANDBOX_SERVER_SHUTDOWN_GRACE_SECONDS", "2")]).await;
    // An authenticated upload whose body never completes: a request in flight, held open.
    let mut c = dial(child.addr()).await;
    let head = format!(
        "PUT /v1/sessions/held/files/content?path=/workspace/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: 1000000\r\n\r\npartial",
        child.token
    );
    c.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    support::serve::signal(&child.service.child, "TERM");
    let status = child.service.wait();
    println!("exited {status} {:?} after SIGTERM", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the service took {:?} to exit; its log:\n{}",
        started.elapsed(),
        child.log()
    );
    drop(c);
}

// ---- H3: memory -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn downloads_stream_and_take_only_regular_files() {
    let child = Child::start("thdl", &[]).await;
    let pid = child.pid();
    let (status, v) = child
        .call(
            "POST",
            "/v1/sessions/dl/exec",
            &shell(
                "dd if=/dev/zero of=/workspace/sparse bs=1 count=0 seek=1000M 2>/dev/null \
                 && ln -s /dev/zero /workspace/zero && mkfifo /workspace/fifo \
                 && ln -s fifo /workspace/to-fifo && ls -l /workspace",
            ),
        )
        .await;
    assert_eq!((status, v["exit_code"].as_i64()), (200, Some(0)), "{v}");

    let baseline = reset_peak(pid);
    let started = Instant::now();
    let (status, total, _) = counted(
        &child.service.base,
        "GET",
        "/v1/sessions/dl/files/content?path=/workspace/sparse",
        &child.token,
        support::full(""),
    )
    .await;
    let grown = peak_growth_mib(pid, baseline);
    println!(
        "1000 MiB sparse download: {status}, {} MiB in {:?}, peak RSS growth {grown} MiB",
        total / MIB,
        started.elapsed()
    );
    assert_eq!((status, total), (200, 1000 * MIB));
    assert!(grown < 64, "the service grew by {grown} MiB");

    for leaf in ["zero", "fifo", "to-fifo"] {
        let started = Instant::now();
        let (status, v) = child
            .call(
                "GET",
                &format!("/v1/sessions/dl/files/content?path=/workspace/{leaf}"),
                "",
            )
            .await;
        println!(
            "download of {leaf}: {status} {v} in {:?}",
            started.elapsed()
        );
        // A symlink into /dev is refused for where it leads (`invalid_path`), a FIFO for what
        // it is (`not_a_regular_file`): either way before a byte is read.
        let expected = if leaf == "zero" {
            "invalid_path"
        } else {
            "not_a_regular_file"
        };
        assert_eq!((status, code(&v)), (400, expected), "{leaf}: {v}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{leaf} waited on the file"
        );
    }
    // Nothing is left reading inside the sandbox.
    let (_, v) = child
        .call(
            "POST",
            "/v1/sessions/dl/exec",
            &shell("ps -o comm | grep -c '^cat$' || true"),
        )
        .await;
    assert_eq!(v["stdout"].as_str().map(str::trim), Some("0"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn buffered_output_is_capped_and_streamed_output_is_not_repeated() {
    let child = Child::start("thout", &[]).await;
    let pid = child.pid();
    let (status, _) = child
        .call("POST", "/v1/sessions/out/exec", r#"{"command":"true"}"#)
        .await;
    assert_eq!(status, 200);

    // 64 MiB of control bytes, buffered: a truncated result, and a small service.
    let baseline = reset_peak(pid);
    let (status, total, tail) = counted(
        &child.service.base,
        "POST",
        "/v1/sessions/out/exec",
        &child.token,
        support::full(shell("head -c 67108864 /dev/zero | tr '\\000' '\\001'")),
    )
    .await;
    let grown = peak_growth_mib(pid, baseline);
    println!(
        "64 MiB of \\x01, buffered: {status}, answer {} KiB, peak RSS growth {grown} MiB",
        total / 1024
    );
    let tail = String::from_utf8_lossy(&tail);
    assert_eq!(status, 200, "{tail}");
    assert!(grown < 64, "the service grew by {grown} MiB");
    assert!(total < 64 * MIB, "the answer was {total} bytes");
    assert!(
        tail.contains(r#""truncated":true"#),
        "not a truncated result: …{tail}"
    );

    // 20 MB streamed: every byte once, and the last line carries no copy of it.
    let (status, total, _) = counted(
        &child.service.base,
        "POST",
        "/v1/sessions/out/exec?stream=true",
        &child.token,
        support::full(shell("head -c 20000000 /dev/zero | tr '\\000' 'a'")),
    )
    .await;
    println!("20 MB streamed: {status}, {total} bytes in all");
    assert_eq!(status, 200);
    assert!(total >= 20_000_000, "only {total} bytes came back");
    assert!(
        total < 21_000_000,
        "{total} bytes came back for 20 MB of output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn concurrent_uploads_are_held_once() {
    let child = Child::start("thup", &[]).await;
    let pid = child.pid();
    let (status, _) = child
        .call("POST", "/v1/sessions/up/exec", r#"{"command":"true"}"#)
        .await;
    assert_eq!(status, 200);
    let payload = Bytes::from(vec![7u8; (100 * MIB) as usize]);
    let baseline = reset_peak(pid);
    let uploads = (0..4).map(|i| {
        let (base, token, payload) = (
            child.service.base.clone(),
            child.token.clone(),
            payload.clone(),
        );
        tokio::spawn(async move {
            counted(
                &base,
                "PUT",
                &format!("/v1/sessions/up/files/content?path=/workspace/u{i}"),
                &token,
                support::full(payload),
            )
            .await
            .0
        })
    });
    let statuses: Vec<u16> = futures_util::future::join_all(uploads)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let grown = peak_growth_mib(pid, baseline);
    println!("four concurrent 100 MiB uploads: {statuses:?}, peak RSS growth {grown} MiB");
    assert_eq!(statuses, vec![204; 4]);
    assert!(grown < 512, "the service grew by {grown} MiB");
    let (_, v) = child
        .call(
            "POST",
            "/v1/sessions/up/exec",
            &shell("wc -c < /workspace/u3"),
        )
        .await;
    assert_eq!(
        v["stdout"].as_str().map(str::trim),
        Some("104857600"),
        "{v}"
    );
}

// ---- M6: listings ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn listings_walk_once_and_are_capped() {
    let s = support::start("thls", &[TOKEN_A]).await;
    let (status, v) = s
        .call(
            "POST",
            "/v1/sessions/ls/exec",
            &shell(
                "mkdir -p /workspace/dirs /workspace/files && cd /workspace/dirs && \
                 for i in $(seq 1 1000); do mkdir d$i; done && cd /workspace/files && \
                 for i in $(seq 1 10500); do : > f$i; done && echo made",
            ),
        )
        .await;
    assert_eq!((status, v["stdout"].as_str()), (200, Some("made\n")), "{v}");
    let started = Instant::now();
    let (status, v) = s
        .call(
            "GET",
            "/v1/sessions/ls/files?path=/workspace/dirs&depth=3",
            "",
        )
        .await;
    let took = started.elapsed();
    let entries = v["entries"].as_array().map_or(0, Vec::len);
    println!(
        "1000 directories, depth 3: {status}, {entries} entries, truncated {}, in {took:?}",
        v["truncated"]
    );
    assert_eq!(
        (status, entries, &v["truncated"]),
        (200, 1000, &json!(false))
    );
    // Generous: one walk of 1000 directories, where one exec per directory took 49 s.
    assert!(
        took < Duration::from_secs(20),
        "listing 1000 directories took {took:?}"
    );
    let (status, v) = s
        .call("GET", "/v1/sessions/ls/files?path=/workspace/files", "")
        .await;
    let entries = v["entries"].as_array().map_or(0, Vec::len);
    println!(
        "10500 files: {status}, {entries} entries, truncated {}",
        v["truncated"]
    );
    assert_eq!(
        (status, entries, &v["truncated"]),
        (200, 10_000, &json!(true))
    );
}

// ---- H4: live work --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn live_work_keeps_its_sandbox_and_a_vanished_one_says_so() {
    let s = support::start_with(
        "thlive",
        &[TOKEN_A],
        |c| c.docker.idle_ttl = std::time::Duration::from_secs(2),
        |_| {},
    )
    .await;
    let (status, _) = s
        .call("POST", "/v1/sessions/live/exec", r#"{"command":"true"}"#)
        .await;
    assert_eq!(status, 200);
    // A command that runs for several idle TTLs, while the sweeper runs over and over. It
    // outlasts the four sweeps below by seconds: one that ran after it ended would rightly
    // reap the then idle sandbox (a loaded machine delays the sweeps).
    let long = exec_in_background(&s, "live", "sleep 12; echo finished");
    let mut config = sandbox_provider_docker::DockerConfig::new(
        sandbox_core::TemplateId::new(support::IMAGE).unwrap(),
        &s.namespace,
    );
    config.enabled = true;
    config.agent_path = Some(support::agent_bin());
    config.network = sandbox_provider_docker::NetworkMode::None;
    config.idle_sweep = false;
    let sweeper = sandbox_provider_docker::DockerProvider::connect(config)
        .await
        .unwrap();
    let mut reaped = 0;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let report = sandbox_provider_docker::sweeper::sweep(&sweeper)
            .await
            .unwrap();
        reaped += report.reaped.len();
    }
    let (_, result) = long.await.unwrap();
    println!("a command past its idle TTL under 4 sweeps: {result}; reaped {reaped}");
    assert_eq!(
        reaped, 0,
        "the sweeper deleted a sandbox with a command running"
    );
    assert_eq!(
        (result["exit_code"].as_i64(), result["stdout"].as_str()),
        (Some(0), Some("finished\n")),
        "{result}"
    );

    // The container removed under a running command: `sandbox_gone`, then a fresh sandbox.
    let (status, v) = s.call("GET", "/v1/sessions/live", "").await;
    assert_eq!(status, 200, "{v}");
    let first = v["sandbox_id"].as_str().unwrap().to_owned();
    let pending = exec_in_background(&s, "live", "sleep 30");
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker(&["rm", "-f", &first]);
    let (status, v) = tokio::time::timeout(Duration::from_secs(60), pending)
        .await
        .expect("the exec did not end when its container went")
        .unwrap();
    println!("exec while its container is removed: {status} {v}");
    assert_eq!((status, code(&v)), (404, "sandbox_gone"), "{v}");
    let (status, v) = s
        .call("POST", "/v1/sessions/live/exec", r#"{"command":"true"}"#)
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, v) = s.call("GET", "/v1/sessions/live", "").await;
    assert_ne!(v["sandbox_id"].as_str(), Some(first.as_str()), "{v}");
}

// ---- H5: disk -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn sandbox_stdout_cannot_fill_the_host_disk() {
    let s = support::start("thlog", &[TOKEN_A]).await;
    let (status, v) = s
        .call(
            "POST",
            "/v1/sessions/log/exec",
            &shell("head -c 50000000 /dev/zero | tr '\\000' 'x' > /proc/1/fd/1; echo written"),
        )
        .await;
    assert_eq!(
        (status, v["stdout"].as_str()),
        (200, Some("written\n")),
        "{v}"
    );
    let (_, v) = s.call("GET", "/v1/sessions/log", "").await;
    let id = v["sandbox_id"].as_str().unwrap();
    let log_path = docker(&["inspect", "--format", "{{.LogPath}}", id]);
    let size = if log_path.is_empty() {
        0
    } else {
        std::fs::metadata(Path::new(&log_path)).map_or(0, |m| m.len())
    };
    println!("50 MB to PID 1's stdout: the container log ({log_path:?}) holds {size} bytes");
    // The configured bound (1 MiB by default) plus one log record.
    assert!(size <= 2 * MIB, "the container log grew to {size} bytes");
}

// ---- M1, M2: quotas -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn quotas_refuse_with_429_and_create_nothing() {
    let s = support::start_with(
        "thquota",
        &[TOKEN_A, TOKEN_B],
        |c| {
            c.quotas.max_sandboxes = 2;
            c.quotas.max_concurrent_execs = 2;
            c.quotas.max_snapshots = 1;
            c.limits.tickets_per_tenant = 2;
        },
        |_| {},
    )
    .await;
    let exec = r#"{"command":"true"}"#;
    for session in ["q1", "q2"] {
        let (status, v) = s
            .call("POST", &format!("/v1/sessions/{session}/exec"), exec)
            .await;
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = s.call("POST", "/v1/sessions/q3/exec", exec).await;
    println!("a third sandbox: {status} {v}");
    assert_eq!((status, code(&v)), (429, "quota_exceeded"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_sandboxes"),
        "{v}"
    );
    assert_eq!(s.containers().await, 2);
    // Another tenant has its own allowance.
    let (status, v) = s
        .call_as("POST", "/v1/sessions/q1/exec", Some(TOKEN_B), exec)
        .await;
    assert_eq!(status, 200, "{v}");

    // Two commands running: a third waits for nobody, it is refused.
    let running: Vec<_> = ["q1", "q2"]
        .into_iter()
        .map(|session| exec_in_background(&s, session, "sleep 4"))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, v) = s.call("POST", "/v1/sessions/q1/exec", exec).await;
    println!("a third concurrent exec: {status} {v}");
    assert_eq!((status, code(&v)), (429, "quota_exceeded"), "{v}");
    for r in futures_util::future::join_all(running).await {
        assert_eq!(r.unwrap().0, 200);
    }
    let (status, _) = s.call("POST", "/v1/sessions/q1/exec", exec).await;
    assert_eq!(status, 200, "the slots came back");

    // Tickets: per tenant, and only for a running sandbox.
    for _ in 0..2 {
        let (status, v) = s.call("POST", "/v1/sessions/q1/terminal/ticket", "").await;
        assert_eq!(status, 200, "{v}");
    }
    let (status, v) = s.call("POST", "/v1/sessions/q1/terminal/ticket", "").await;
    assert_eq!((status, code(&v)), (429, "quota_exceeded"), "{v}");
    let (status, v) = s
        .call_as("POST", "/v1/sessions/q1/terminal/ticket", Some(TOKEN_B), "")
        .await;
    assert_eq!(status, 200, "tenant B is not locked out by A: {v}");
    let (status, v) = s
        .call("POST", "/v1/sessions/nothing/terminal/ticket", "")
        .await;
    assert_eq!((status, code(&v)), (404, "no_live_sandbox"), "{v}");

    // Snapshots: one kept, the second refused.
    let (status, v) = s.call("POST", "/v1/sessions/q1/snapshots", "").await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = s.call("POST", "/v1/sessions/q2/snapshots", "").await;
    assert_eq!((status, code(&v)), (429, "quota_exceeded"), "{v}");
}

// ---- M3: metrics ----------------------------------------------------------------------------

fn request_series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|l| l.starts_with("sandbox_http_requests_total{"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn made_up_methods_do_not_grow_the_metrics() {
    let s = support::start("thmet", &[TOKEN_A]).await;
    let paths = ["/v1/sessions/m/exec", "/nowhere", "/healthz"];
    let method = |i: usize| format!("X{:08X}", fastrand::u32(..) ^ i as u32);
    // One of each shape first: the series they need exist afterwards.
    for path in paths {
        s.call(&method(0), path, "").await;
    }
    let (_, text) = s.raw("GET", "/metrics", None, support::full("")).await;
    let before = request_series(&String::from_utf8_lossy(&text));
    for i in 0..3000 {
        let _ = s
            .raw(
                &method(i),
                paths[i % paths.len()],
                Some(TOKEN_A),
                support::full(""),
            )
            .await;
    }
    let (_, text) = s.raw("GET", "/metrics", None, support::full("")).await;
    let after = request_series(&String::from_utf8_lossy(&text));
    println!(
        "series of sandbox_http_requests_total: {before} before 3000 made-up methods, {after} after"
    );
    assert!(before > 0);
    // `/metrics` itself may add its own GET series once.
    assert!(after <= before + 1, "{before} series became {after}");
}

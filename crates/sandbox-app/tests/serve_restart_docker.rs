//! `sandbox serve` as a real process over the real Docker engine: killed with SIGKILL mid-life
//! (no drain, no cleanup, the memory store gone with it), a new process (a new PID) on the same
//! namespace adopts the session's container through its labels instead of creating a second
//! one, and the files written before the crash are still there. Then SIGTERM drains and exits 0.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod support;
use support::container_ids;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

/// Generous: the first start compiles nothing but may wait on a busy engine.
const START_DEADLINE: Duration = Duration::from_secs(60);
const EXIT_DEADLINE: Duration = Duration::from_secs(30);

struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// Starts `sandbox serve` on a free loopback port and waits for `/healthz`.
    async fn start(namespace: &str, token_file: &Path, log: &Path) -> Service {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sandbox"))
            .arg("serve")
            .env_remove("SANDBOX_CONFIG")
            .env_remove("DOCKER_HOST")
            .env("SANDBOX_LISTEN", format!("127.0.0.1:{port}"))
            .env("SANDBOX_DOCKER_ENABLED", "true")
            .env("SANDBOX_DOCKER_NETWORK", "none")
            .env("SANDBOX_DOCKER_NAMESPACE", namespace)
            .env("SANDBOX_DEV_TOKEN_FILE", token_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let service = Service {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let start = Instant::now();
        loop {
            if let Ok((200, _)) = service.try_call("GET", "/healthz", None, "").await {
                return service;
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "sandbox serve did not answer /healthz within {START_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> Result<(u16, Value), String> {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = client
            .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok((status, value))
    }

    async fn call(&self, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
        self.try_call(method, path, Some(token), body)
            .await
            .unwrap()
    }

    /// Waits for the process to end; its exit status.
    fn wait(&mut self) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < EXIT_DEADLINE,
                "sandbox serve did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {}", child.id());
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sbx-restart-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_restarted_service_adopts_the_sessions_container() {
    let namespace = format!("trestart-{:08x}", fastrand::u32(..));
    let dir = temp_dir();
    let token_file = dir.join("dev-token");
    let log = dir.join("serve.log");
    let exec = "/v1/sessions/survivor/exec";

    let mut first = Service::start(&namespace, &token_file, &log).await;
    // The token file is created on first start, private, and reused by the next process.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim().to_owned();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the development token file is private");

    let (status, out) = first
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"echo before-crash > state.txt && cat state.txt","shell":true}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(out["stdout"], "before-crash\n");
    let before = container_ids(&namespace).await;
    assert_eq!(before.len(), 1, "one container for the session: {before:?}");

    let first_pid = first.child.id();
    signal(&first.child, "KILL");
    let status = first.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "the first service died of SIGKILL: {status}"
    );

    let mut second = Service::start(&namespace, &token_file, &log).await;
    assert_ne!(second.child.id(), first_pid, "a new process");
    let (status, out) = second
        .call(
            "POST",
            exec,
            &token,
            r#"{"command":"cat","args":["state.txt"]}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(
        out["stdout"], "before-crash\n",
        "the files written before the crash"
    );
    assert_eq!(
        container_ids(&namespace).await,
        before,
        "the same container was adopted, no second one created"
    );

    let (status, _) = second
        .call("DELETE", "/v1/sessions/survivor", &token, "")
        .await;
    assert_eq!(status, 204);
    assert!(
        container_ids(&namespace).await.is_empty(),
        "destroy removed it"
    );

    // SIGTERM drains and exits cleanly.
    signal(&second.child, "TERM");
    let status = second.wait();
    assert!(
        status.success(),
        "SIGTERM ends sandbox serve with 0: {status}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

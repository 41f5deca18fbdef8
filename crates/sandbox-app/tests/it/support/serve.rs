//! `sandbox serve` as a child process: started on a free loopback port with the Docker backend
//! on, in a namespace of the test's, with its log in a file the test can read.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

/// Generous: the first start compiles nothing but may wait on a busy engine.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(60);
pub(crate) const EXIT_DEADLINE: Duration = Duration::from_secs(30);

pub(crate) struct Service {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Service {
    /// Starts `sandbox serve` on a free loopback port and waits for `/healthz`.
    pub(crate) async fn start(namespace: &str, token_file: &Path, log: &Path) -> Service {
        let mut service = Service::spawn(namespace, token_file, log, &[]);
        if let Err(status) = service.ready(START_DEADLINE).await {
            panic!(
                "sandbox serve exited with {status} before answering; its log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        service
    }

    /// Spawns `sandbox serve` on a free loopback port with `env` on top of the test defaults,
    /// without waiting for it.
    pub(crate) fn spawn(
        namespace: &str,
        token_file: &Path,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Service {
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
            .env("SANDBOX_DOCKER_AGENT_PATH", super::agent_bin())
            .env("SANDBOX_DEV_TOKEN_FILE", token_file)
            // Plain text: the tests read the log.
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Service {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// A client of a service that another handle owns (no child process to kill on drop).
    pub(crate) fn attach(base: String) -> Probe {
        Probe { base }
    }

    /// Waits until `/healthz` answers 200 (`Ok`) or the process exits (`Err` with its status).
    pub(crate) async fn ready(
        &mut self,
        deadline: Duration,
    ) -> Result<(), std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(status);
            }
            if let Ok((200, _)) = self.try_call("GET", "/healthz", None, "").await {
                return Ok(());
            }
            assert!(
                start.elapsed() < deadline,
                "sandbox serve neither answered /healthz nor exited within {deadline:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> Result<(u16, Value), String> {
        request(&self.base, method, path, token, body).await
    }

    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: &str,
    ) -> (u16, Value) {
        self.try_call(method, path, Some(token), body)
            .await
            .unwrap()
    }

    /// Waits for the process to end; its exit status.
    pub(crate) fn wait(&mut self) -> std::process::ExitStatus {
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

pub(crate) fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {}", child.id());
}

pub(crate) fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sbx-restart-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A client of a running service, without its process.
pub(crate) struct Probe {
    base: String,
}

impl Probe {
    pub(crate) async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> Result<(u16, Value), String> {
        request(&self.base, method, path, token, body).await
    }
}

async fn request(
    base: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Result<(u16, Value), String> {
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"));
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

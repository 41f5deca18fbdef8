//! `sandbox serve` with `provider = "e2b"` as a child process, its E2B backend pointed at
//! another `sandbox serve`'s E2B-compatible API ([`E2bServe`]), for the `e2b_provider_*` tests.
//!
//! The two processes are called A (this one: sessions on the E2B backend) and B (the E2B
//! stand-in: its own namespace of Debian containers on the real engine). A's adapter speaks
//! to B exactly as to a self-hosted E2B plane: the control plane at `api_url`, every envd
//! request dialled at B's listener (`proxy_url`), routed there by `Host:
//! 49983-<id>.localhost`. `api_url` is B's listener too unless a test puts something between
//! them (the faults test's proxy).
//!
//! A is configured by the environment alone (`SANDBOX_PROVIDER=e2b`, the
//! `SANDBOX_E2B_PROVIDER_*` variables), with every `SANDBOX_*` of the test's own environment
//! removed first, plus an optional config file for what has no variable (`[quotas]`). Its
//! development token file, data directory and log live in a temp directory removed on drop.

#![cfg(all(feature = "docker", feature = "e2b", feature = "e2b-api"))]
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::Value;

use super::e2b::{DOMAIN, E2bServe, START_DEADLINE, free_port};
use super::{ReqBody, full};

/// A request must end, and with an answer; a hang fails the test with its route.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(120);
/// The template B's `[e2b.templates]` names for the Debian image.
pub(crate) const TEMPLATE: &str = "base";

/// `sandbox serve` on the E2B backend, as a child process; killed and its files removed when
/// dropped (B's containers are B's to remove).
pub(crate) struct E2bBacked {
    child: Option<Child>,
    pub(crate) base: String,
    pub(crate) addr: SocketAddr,
    /// The development tenant's token (tenant 1).
    pub(crate) token: String,
    pub(crate) dir: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) client: Client<HttpConnector, ReqBody>,
}

impl Drop for E2bBacked {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl E2bBacked {
    /// A on its own loopback port, its control plane at `api_url` (B's listener or something in
    /// front of it), envd through B's listener, B's tenant A key; `env` on top, then `toml` as
    /// its config file (empty: none). Waits until `/healthz` answers 200, which asks B's
    /// control plane through `api_url`.
    pub(crate) async fn start(
        b: &E2bServe,
        api_url: &str,
        env: &[(&str, &str)],
        toml: &str,
    ) -> E2bBacked {
        let dir = std::env::temp_dir().join(format!("sbx-e2bbacked-{:08x}", fastrand::u32(..)));
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let token_file = dir.join("dev-token");
        let log = dir.join("serve.log");
        let port = free_port();
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
        command.arg("serve");
        if !toml.is_empty() {
            let path = dir.join("sandbox.toml");
            std::fs::write(&path, toml).unwrap();
            command.arg("--config").arg(path);
        }
        // Only what this helper sets reaches the service: the test's own `SANDBOX_*` (the agent
        // path, the image) are not A's settings.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SANDBOX_") {
                command.env_remove(name);
            }
        }
        command
            .env_remove("DOCKER_HOST")
            .env("SANDBOX_LISTEN", format!("127.0.0.1:{port}"))
            .env("SANDBOX_PROVIDER", "e2b")
            .env("SANDBOX_E2B_PROVIDER_API_URL", api_url)
            .env("SANDBOX_E2B_PROVIDER_API_KEY", &b.key_a)
            .env("SANDBOX_E2B_PROVIDER_SANDBOX_DOMAIN", DOMAIN)
            .env("SANDBOX_E2B_PROVIDER_PROXY_URL", &b.e2b)
            .env("SANDBOX_E2B_PROVIDER_TEMPLATE", TEMPLATE)
            // B listens on loopback; the test is the operator who allows it.
            .env("SANDBOX_E2B_PROVIDER_ALLOW_PRIVATE_ENDPOINTS", "true")
            .env("SANDBOX_DEV_TOKEN_FILE", &token_file)
            .env("SANDBOX_DATA_DIR", &data)
            // Plain text: the failure messages carry the log.
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        let child = command.spawn().unwrap();
        #[expect(
            clippy::disallowed_methods,
            reason = "a test dialling the loopback service it spawned, not a tenant-supplied endpoint"
        )]
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut a = E2bBacked {
            child: Some(child),
            base: format!("http://{addr}"),
            addr,
            token: String::new(),
            dir,
            log,
            client,
        };
        a.wait_ready().await;
        a.token = std::fs::read_to_string(&token_file)
            .unwrap()
            .trim()
            .to_owned();
        a
    }

    async fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "sandbox serve (provider e2b) exited with {status} before answering; its log:\n{}",
                    self.log_text()
                );
            }
            if let Ok(Ok((200, _))) = tokio::time::timeout(
                Duration::from_secs(10),
                self.try_raw("GET", "/healthz", None, full(Bytes::new())),
            )
            .await
            {
                return;
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "sandbox serve (provider e2b) did not answer /healthz 200 within {START_DEADLINE:?}; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What a failure report needs: A's log.
    pub(crate) fn context(&self) -> String {
        format!(
            "--- sandbox serve (provider e2b, {}) log\n{}",
            self.base,
            self.log_text()
        )
    }

    async fn try_raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: ReqBody,
    ) -> Result<(u16, Bytes), String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let resp = self
            .client
            .request(req.body(body).map_err(|e| e.to_string())?)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, bytes))
    }

    /// One request as the development tenant; the status and the raw answer.
    pub(crate) async fn raw(&self, method: &str, path: &str, body: ReqBody) -> (u16, Bytes) {
        let call = self.try_raw(method, path, Some(&self.token), body);
        match tokio::time::timeout(REQUEST_DEADLINE, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => panic!("{method} {path}: {e}\n{}", self.context()),
            Err(_) => panic!("{method} {path} did not answer\n{}", self.context()),
        }
    }

    /// One request with a text body as the development tenant; the answer as JSON (`Null`
    /// when empty, a string when not JSON).
    pub(crate) async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, bytes) = self.raw(method, path, full(body.to_owned())).await;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    /// Runs `command` with `args` in `session`'s sandbox; panics unless it answers 200 with
    /// exit code 0. Its stdout.
    pub(crate) async fn exec_ok(&self, session: &str, command: &str, args: &[&str]) -> String {
        let body = serde_json::json!({ "command": command, "args": args }).to_string();
        let (status, out) = self
            .call("POST", &format!("/v1/sessions/{session}/exec"), &body)
            .await;
        assert_eq!(
            (status, out["exit_code"].as_i64()),
            (200, Some(0)),
            "{command} {args:?} in {session}: {out}\n{}",
            self.context()
        );
        out["stdout"].as_str().unwrap_or_default().to_owned()
    }

    /// The sandbox ID `GET /v1/sessions/{session}` says is bound (panics unless it answers 200
    /// for the E2B backend).
    pub(crate) async fn bound_sandbox(&self, session: &str) -> String {
        let (status, info) = self
            .call("GET", &format!("/v1/sessions/{session}"), "")
            .await;
        assert_eq!(status, 200, "session {session}: {info}\n{}", self.context());
        assert_eq!(info["provider"], "e2b", "{info}");
        info["sandbox_id"].as_str().unwrap().to_owned()
    }

    /// `GET /metrics` (no credential).
    pub(crate) async fn metrics(&self) -> String {
        let (status, bytes) = self.raw("GET", "/metrics", full(Bytes::new())).await;
        assert_eq!(status, 200, "/metrics");
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The sum over every series of the metric `name` (`sandbox_provider_errors_total`, whatever
/// its labels) in a text exposition; 0 when it has none.
pub(crate) fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// The value of the one series of `name` with the label `label="value"`; 0 when absent.
pub(crate) fn metric_with(text: &str, name: &str, label: &str, value: &str) -> f64 {
    let wanted = format!("{label}=\"{value}\"");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let labelled = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, rest) = labelled.split_once("} ")?;
            labels
                .split(',')
                .any(|p| p == wanted)
                .then(|| rest.split_whitespace().next()?.parse::<f64>().ok())?
        })
        .sum()
}

//! `sandbox serve` with the E2B API on, as a real child process over the real Docker engine,
//! for the `e2b_*` tests.
//!
//! [`E2bServe::start_with`] writes a config file (a namespace of its own, network `none`, agent
//! mode, a data directory in a temp dir, two tenants whose tokens only the test knows, `[e2b]`
//! on a free loopback port with the Debian image as the `base` template), spawns the `sandbox`
//! binary with `serve`, and waits for both listeners. [`E2bOptions`] adds what a test needs: the
//! Redis store (with a fixed `e2b.secret`, which that store requires), extra `[docker]` lines,
//! environment variables. [`E2bServe::stop`] ends the process as an operator would (SIGTERM,
//! then its exit) and [`E2bServe::restart`] starts it again on the same ports, config, data
//! directory and secret.
//!
//! Whatever happens, the namespace's containers and the test's files are removed on drop.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`)
//! and the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`).

#![cfg(all(feature = "docker", feature = "e2b-api"))]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use sandbox_app::auth::{digest, hex};
use serde_json::{Value, json};

use super::{container_ids, remove_namespace};

/// Tells the test which image the `base` template boots (the tag is a hash of its recipe).
pub(crate) const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
/// Generous: the first start may wait on a busy engine.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(60);
/// A stopped service drains its listeners and exits; generous for a busy machine.
pub(crate) const STOP_DEADLINE: Duration = Duration::from_secs(60);
/// A request must end, and with an answer; a hang fails the test with its route.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(120);
/// The engine removes a killed sandbox's container before the delete answers; a slack for a
/// busy engine all the same.
pub(crate) const GONE_DEADLINE: Duration = Duration::from_secs(30);
/// The port the SDK names in `E2b-Sandbox-Port` for envd.
pub(crate) const ENVD_PORT: &str = "49983";
/// The Host routing form's domain (the `[e2b]` default).
pub(crate) const DOMAIN: &str = "localhost";

/// A free loopback port (bound, then released for the service to bind).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A token no other run uses, shaped like an E2B key.
pub(crate) fn token() -> String {
    format!("e2b_{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

pub(crate) fn debian_image() -> String {
    std::env::var(ENV_IMAGE).unwrap_or_else(|_| {
        panic!(
            "{ENV_IMAGE} is not set: `cargo xtask debian-image` builds the image and prints its tag"
        )
    })
}

/// A TOML basic string holding `s`.
pub(crate) fn toml_str(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One answer: status, content type, body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: String,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.text()))
    }

    /// Asserts an error answer the SDK can type: one of `statuses`, `application/json`, a
    /// body `{"code": <the status>, "message": <non-empty>}`. Its message.
    pub(crate) fn error(&self, statuses: &[u16], what: &str) -> String {
        assert!(
            statuses.contains(&self.status),
            "{what}: answered {} (expected one of {statuses:?}): {}",
            self.status,
            self.text()
        );
        assert!(
            self.content_type.starts_with("application/json"),
            "{what}: content type {:?}: {}",
            self.content_type,
            self.text()
        );
        let body: Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{what}: the error body is not JSON ({e}): {}", self.text())
        });
        assert_eq!(
            body["code"].as_u64(),
            Some(u64::from(self.status)),
            "{what}: `code` is not the status as an integer: {body}"
        );
        let message = body["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{what}: no `message`: {body}");
        message.to_owned()
    }
}

/// A sandbox as create answers it.
#[derive(Debug)]
pub(crate) struct Created {
    pub(crate) id: String,
    pub(crate) token: String,
    /// The whole answer (`endAt`, `startedAt`...).
    pub(crate) body: Value,
}

/// What a test adds to the service's config.
#[derive(Debug, Default, Clone)]
pub(crate) struct E2bOptions {
    /// `store = "redis"` with `[redis] url` this, and a fixed `e2b.secret` (the Redis store
    /// requires one).
    pub(crate) redis_url: Option<String>,
    /// Extra lines of the `[docker]` section (`idle_ttl_seconds = 3`...).
    pub(crate) docker: String,
    /// Environment variables of the service (after every `SANDBOX_*` of the test's own
    /// environment is removed).
    pub(crate) env: Vec<(String, String)>,
}

/// `sandbox serve` with the E2B API on, as a child process; its containers and files removed
/// when dropped.
pub(crate) struct E2bServe {
    child: Option<Child>,
    pub(crate) namespace: String,
    pub(crate) dir: PathBuf,
    /// The service's data directory (the deadline file, the generated secret).
    pub(crate) data_dir: PathBuf,
    config_path: PathBuf,
    pub(crate) log: PathBuf,
    env: Vec<(String, String)>,
    /// Which deadline store the service uses: `memory` (the file) or `redis`.
    pub(crate) store: &'static str,
    /// The service's own API (`/healthz`, `/v1/sessions/...`).
    pub(crate) api: String,
    /// The E2B listener: control plane and envd router.
    pub(crate) e2b: String,
    /// Tenant 1's and tenant 2's tokens (their E2B API keys, and their bearer tokens on the
    /// service's own API).
    pub(crate) key_a: String,
    pub(crate) key_b: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Drop for E2bServe {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_namespace(&self.namespace);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl E2bServe {
    /// `program` set up as an E2B SDK client of this service: tenant A's key, both planes at
    /// the E2B listener, none of the environment's E2B or proxy settings (so it reaches
    /// loopback only, in normal, non-debug mode).
    pub(crate) fn sdk_command(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> std::process::Command {
        let mut run = std::process::Command::new(program);
        run.env("E2B_API_KEY", &self.key_a)
            .env("E2B_API_URL", &self.e2b)
            .env("E2B_SANDBOX_URL", &self.e2b)
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_ACCESS_TOKEN")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost");
        run
    }

    /// The service with the memory store and nothing added.
    pub(crate) async fn start(prefix: &str) -> E2bServe {
        Self::start_with(prefix, E2bOptions::default()).await
    }

    /// The service in a namespace `<prefix>-<random>`, with `options` added to its config.
    pub(crate) async fn start_with(prefix: &str, options: E2bOptions) -> E2bServe {
        let namespace = format!("{prefix}-{:08x}", fastrand::u32(..));
        let dir = std::env::temp_dir().join(format!("sbx-{namespace}"));
        let data_dir = dir.join("data");
        std::fs::create_dir_all(&data_dir).unwrap();
        let (key_a, key_b) = (token(), token());
        let (api_port, e2b_port) = (free_port(), free_port());
        let agent = super::agent_bin();
        let (store, store_lines, secret_line) = match &options.redis_url {
            Some(url) => (
                "redis",
                format!("store = \"redis\"\n\n[redis]\nurl = {}\n", toml_str(url)),
                // Fixed, as replicas over one Redis need; 32 bytes at least.
                format!(
                    "secret = \"{:016x}{:016x}{:016x}{:016x}\"\n",
                    fastrand::u64(..),
                    fastrand::u64(..),
                    fastrand::u64(..),
                    fastrand::u64(..)
                ),
            ),
            None => ("memory", String::new(), String::new()),
        };
        let config = format!(
            r#"listen = "127.0.0.1:{api_port}"
data_dir = {data_dir}
{store_lines}
[docker]
enabled = true
# The Debian image for sessions too, so the service needs no other image and builds none.
image = {image}
build_missing_image = false
namespace = {namespace_str}
network = "none"
data_plane = "agent"
agent_path = {agent}
{docker_extra}
[e2b]
enabled = true
listen = "127.0.0.1:{e2b_port}"
{secret_line}
[e2b.templates]
base = {image}

[[tenants]]
id = 1
token_sha256 = "{a}"

[[tenants]]
id = 2
token_sha256 = "{b}"
"#,
            data_dir = toml_str(&data_dir.display().to_string()),
            namespace_str = toml_str(&namespace),
            agent = toml_str(&agent.display().to_string()),
            image = toml_str(&debian_image()),
            docker_extra = options.docker,
            a = hex(&digest(&key_a)),
            b = hex(&digest(&key_b)),
        );
        let config_path = dir.join("sandbox.toml");
        std::fs::write(&config_path, config).unwrap();
        #[expect(
            clippy::disallowed_methods,
            reason = "a test dialling the loopback service it spawned, not a tenant-supplied endpoint"
        )]
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let mut serve = E2bServe {
            child: None,
            namespace,
            dir: dir.clone(),
            data_dir,
            config_path,
            log: dir.join("serve.log"),
            env: options.env,
            store,
            api: format!("http://127.0.0.1:{api_port}"),
            e2b: format!("http://127.0.0.1:{e2b_port}"),
            key_a,
            key_b,
            client,
        };
        serve.restart().await;
        serve
    }

    /// Starts the service (again): the same config, ports, data directory and secret; its
    /// output appended to the same log. Waits until it is ready.
    pub(crate) async fn restart(&mut self) {
        assert!(self.child.is_none(), "sandbox serve is already running");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sandbox"));
        command.arg("serve").arg("--config").arg(&self.config_path);
        // The config file says everything: no setting of the test's environment leaks in.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SANDBOX_") {
                command.env_remove(name);
            }
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = command
            .env_remove("DOCKER_HOST")
            // Plain text: the failure messages carry the log.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_ready().await;
    }

    /// Stops the service as an operator would: SIGTERM, then waits for it to exit (panics
    /// with the log when it does not within [`STOP_DEADLINE`]).
    pub(crate) async fn stop(&mut self) {
        let mut child = self.child.take().expect("sandbox serve is not running");
        let term = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success(), "kill -TERM {}: {term}", child.id());
        let start = Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                return;
            }
            if start.elapsed() > STOP_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "sandbox serve did not exit within {STOP_DEADLINE:?} of SIGTERM; its log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the service's API answers `/healthz` 200 and the E2B listener answers HTTP
    /// at all; panics with the log when the process exits first or the deadline passes.
    async fn wait_ready(&mut self) {
        let start = Instant::now();
        let (api, e2b) = (self.api.clone(), self.e2b.clone());
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "sandbox serve exited with {status} before answering; its log:\n{}",
                    self.log_text()
                );
            }
            let healthy = matches!(
                self.try_request(&api, "GET", "/healthz", &[], Bytes::new())
                    .await,
                Ok(Answer { status: 200, .. })
            );
            if healthy
                && self
                    .try_request(&e2b, "GET", "/health", &[], Bytes::new())
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "sandbox serve did not answer on both listeners within {START_DEADLINE:?}; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What a failure report needs: where the service ran and its log.
    pub(crate) fn context(&self) -> String {
        format!(
            "--- sandbox serve (namespace {}, store {}, E2B listener {}) log\n{}",
            self.namespace,
            self.store,
            self.e2b,
            self.log_text()
        )
    }

    pub(crate) async fn try_request(
        &self,
        base: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Answer, String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Answer {
                status,
                content_type,
                body,
            })
        };
        tokio::time::timeout(REQUEST_DEADLINE, call)
            .await
            .unwrap_or_else(|_| panic!("{method} {path} did not answer"))
    }

    /// One request to the E2B listener.
    pub(crate) async fn e2b_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut all = headers.to_vec();
        if !body.is_empty() {
            all.push(("content-type", "application/json"));
        }
        self.try_request(&self.e2b, method, path, &all, Bytes::from(body.to_owned()))
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.context()))
    }

    /// A control-plane request with `key` as `X-API-Key` (as the SDK sends it).
    pub(crate) async fn cp(&self, method: &str, path: &str, key: &str, body: &str) -> Answer {
        self.e2b_call(method, path, &[("x-api-key", key)], body)
            .await
    }

    /// A request to the service's own API with `token` as the bearer token.
    pub(crate) async fn api_call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: &str,
    ) -> Answer {
        let bearer = format!("Bearer {token}");
        let mut headers = vec![("authorization", bearer.as_str())];
        if !body.is_empty() {
            headers.push(("content-type", "application/json"));
        }
        self.try_request(
            &self.api,
            method,
            path,
            &headers,
            Bytes::from(body.to_owned()),
        )
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.context()))
    }

    /// `POST /v2/sandboxes` as `key`'s tenant with a 600 s timeout; panics unless it answers
    /// 201 with an ID and a token.
    pub(crate) async fn create(&self, key: &str, metadata: Value) -> Created {
        self.create_body(
            key,
            json!({"templateID": "base", "timeout": 600, "metadata": metadata, "envVars": {}}),
        )
        .await
    }

    /// `POST /v2/sandboxes` with `body` as `key`'s tenant; panics unless it answers 201 with
    /// an ID and a token.
    pub(crate) async fn create_body(&self, key: &str, body: Value) -> Created {
        let a = self
            .cp("POST", "/v2/sandboxes", key, &body.to_string())
            .await;
        assert_eq!(a.status, 201, "create: {}\n{}", a.text(), self.context());
        let v = a.json();
        let id = v["sandboxID"].as_str().unwrap_or_default().to_owned();
        let token = v["envdAccessToken"].as_str().unwrap_or_default().to_owned();
        assert!(
            id.len() == 20 && id.starts_with('i'),
            "sandboxID {id:?}: {v}"
        );
        assert!(!token.is_empty(), "no envdAccessToken: {v}");
        Created { id, token, body: v }
    }

    /// `POST /process.Process/List` (unary Connect, JSON) on `sandbox`'s envd, addressed by
    /// the routing headers, with `token` as `X-Access-Token` when given.
    pub(crate) async fn envd_list(&self, sandbox: &str, token: Option<&str>) -> Answer {
        let mut headers = vec![
            ("e2b-sandbox-id", sandbox),
            ("e2b-sandbox-port", ENVD_PORT),
            ("connect-protocol-version", "1"),
        ];
        if let Some(t) = token {
            headers.push(("x-access-token", t));
        }
        self.e2b_call("POST", "/process.Process/List", &headers, "{}")
            .await
    }

    /// The engine's containers of this namespace that carry E2B sandbox `id` (asked of the
    /// engine directly, never of the API).
    pub(crate) async fn e2b_containers(&self, id: &str) -> Vec<String> {
        labelled(
            &self.namespace,
            &format!("sandbox.meta.sandbox.e2b.id={id}"),
        )
        .await
    }

    /// Waits until the engine has no container left in this service's namespace.
    pub(crate) async fn wait_no_containers(&self) {
        let start = Instant::now();
        loop {
            let left = container_ids(&self.namespace).await;
            if left.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < GONE_DEADLINE,
                "containers still in {}: {left:?}\n{}",
                self.namespace,
                self.context()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// IDs of the containers of `namespace` that also carry `label` (`key=value`).
pub(crate) async fn labelled(namespace: &str, label: &str) -> Vec<String> {
    let out = tokio::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--no-trunc",
            "--filter",
            &format!("label=sandbox.namespace={namespace}"),
            "--filter",
            &format!("label={label}"),
        ])
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "docker ps: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

//! Shared by the `*_docker` tests: the service in-process on a loopback port over the real
//! engine (its own namespace, network `none`), an HTTP client for it, and the engine's own view
//! of the containers in that namespace. Each test binary uses a part of it.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod agent_mode;
pub(crate) mod e2b;
pub(crate) mod e2b_backend;
pub(crate) mod redis;
pub(crate) mod serve;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use sandbox_app::auth::{digest, hex};
use sandbox_app::config::{ServiceConfig, TenantEntry};
use sandbox_app::http::AppState;
use serde_json::Value;

/// The image the service's test sandboxes boot (built locally by xtask, never pulled).
pub(crate) const IMAGE: &str = sandbox_app::image::DEFAULT_IMAGE;

pub(crate) use sandbox_testkit::static_agent::agent_bin;

/// A request body: whole (`full`) or streamed.
pub(crate) type ReqBody = BoxBody<Bytes, Infallible>;

/// Generous: a request must end, and with an answer; a hang fails the test with its route.
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

pub(crate) struct Server {
    pub(crate) base: String,
    pub(crate) addr: SocketAddr,
    pub(crate) client: Client<HttpConnector, ReqBody>,
    pub(crate) namespace: String,
    /// The state the router serves (its provider, tickets, limits).
    pub(crate) state: AppState,
    /// The token `call` sends: the first tenant's.
    pub(crate) token: String,
}

/// The service with one tenant per token (IDs 1, 2, ... in order), in a namespace named
/// `<prefix>-<random>`. `config` adjusts the config before the state is built, `state` the
/// state before it is served.
pub(crate) async fn start_with(
    prefix: &str,
    tokens: &[&str],
    config: impl FnOnce(&mut ServiceConfig),
    state: impl FnOnce(&mut AppState),
) -> Server {
    let namespace = format!("{prefix}-{:08x}", fastrand::u32(..));
    let mut cfg = ServiceConfig::load(None, &BTreeMap::new()).unwrap();
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.docker.enabled = true;
    cfg.docker.agent_path = Some(agent_bin());
    cfg.docker.network = sandbox_provider_docker::NetworkMode::None;
    cfg.docker.namespace = namespace.clone();
    cfg.tenants = (1..)
        .zip(tokens)
        .map(|(id, t)| TenantEntry {
            id,
            token_sha256: hex(&digest(t)),
            quotas: Default::default(),
        })
        .collect();
    config(&mut cfg);
    let mut app = sandbox_app::serve::build_state(&cfg).await.unwrap();
    state(&mut app);
    let addr = serve(app.clone()).await;
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    Server {
        base: format!("http://{addr}"),
        addr,
        client,
        namespace,
        state: app,
        token: tokens.first().map(|t| (*t).to_owned()).unwrap_or_default(),
    }
}

/// [`start_with`] without adjustments.
pub(crate) async fn start(prefix: &str, tokens: &[&str]) -> Server {
    start_with(prefix, tokens, |_| {}, |_| {}).await
}

/// Serves `state` on a fresh loopback port.
pub(crate) async fn serve(state: AppState) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(sandbox_app::server::serve(
        listener,
        sandbox_app::http::router(state),
        sandbox_app::server::ServerLimits::default(),
        std::future::pending(),
    ));
    addr
}

/// A whole body.
pub(crate) fn full(body: impl Into<Bytes>) -> ReqBody {
    Full::new(body.into()).boxed()
}

impl Server {
    /// One request; the status and the raw answer.
    pub(crate) async fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: ReqBody,
    ) -> (u16, Bytes) {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let call = async {
            let resp = self.client.request(req.body(body).unwrap()).await.unwrap();
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, bytes)
        };
        tokio::time::timeout(REQUEST_DEADLINE, call)
            .await
            .unwrap_or_else(|_| panic!("{method} {path} did not answer"))
    }

    /// One request; the answer as JSON (`Null` when empty, a string when not JSON).
    pub(crate) async fn call_body(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: ReqBody,
    ) -> (u16, Value) {
        let (status, bytes) = self.raw(method, path, token, body).await;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    /// A request with a text body as `token`'s tenant (or none).
    pub(crate) async fn call_as(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> (u16, Value) {
        self.call_body(method, path, token, full(body.to_owned()))
            .await
    }

    /// A request with a text body as the first tenant.
    pub(crate) async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.call_as(method, path, Some(&self.token.clone()), body)
            .await
    }

    /// How many containers the engine has in this test's namespace.
    pub(crate) async fn containers(&self) -> usize {
        container_ids(&self.namespace).await.len()
    }
}

/// Removes the namespace's containers however the test ends (a test that panics, or one that
/// leaves sessions bound on purpose, would otherwise leak them: the service's containers carry
/// no test label for the pipeline's final sweep).
impl Drop for Server {
    fn drop(&mut self) {
        remove_namespace(&self.namespace);
    }
}

/// Force-removes every container and snapshot image labelled with `namespace` (blocking; for
/// `Drop`): a test that panics between a snapshot and its own cleanup leaves nothing behind.
pub(crate) fn remove_namespace(namespace: &str) {
    remove_containers(namespace);
    let images = std::process::Command::new("docker")
        .args([
            "images",
            "-q",
            "--filter",
            &format!("label=sandbox.namespace={namespace}"),
        ])
        .env_remove("DOCKER_HOST")
        .output();
    if let Ok(images) = images {
        let ids: Vec<String> = String::from_utf8_lossy(&images.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f"])
                .args(&ids)
                .env_remove("DOCKER_HOST")
                .output();
        }
    }
}

fn remove_containers(namespace: &str) {
    let listed = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandbox.namespace={namespace}"),
        ])
        .env_remove("DOCKER_HOST")
        .output();
    let Ok(listed) = listed else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if ids.is_empty() {
        return;
    }
    let _ = std::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(&ids)
        .env_remove("DOCKER_HOST")
        .output();
}

/// IDs of the containers labelled with `namespace`, asked of the engine directly (never all of
/// `docker ps`).
pub(crate) async fn container_ids(namespace: &str) -> Vec<String> {
    let out = tokio::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=sandbox.namespace={namespace}"),
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

/// The machine-readable code of an error answer.
pub(crate) fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<no code>")
}

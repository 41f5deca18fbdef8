//! The Docker engine going away under the service: the service talks to the real engine through
//! a unix-socket proxy this test can cut. While it is cut, requests answer 503
//! `provider_unavailable` (never a panic, a hang or a 404), the session's binding survives the
//! ambiguity, and once the proxy is restored the same sandbox — with its files — answers again;
//! no second container is created.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use sandbox_app::auth::{digest, hex};
use sandbox_app::config::{ServiceConfig, TenantEntry};
use serde_json::Value;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

const TOKEN: &str = "token-fault";
const ENGINE: &str = "/var/run/docker.sock";
/// Generous: a request against a cut engine must end, and with a clear answer.
const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

/// A unix-socket proxy to the engine. `cut(true)` closes every open connection and refuses new
/// ones (accepted, then closed at once, as a restarting daemon's socket does).
struct Proxy {
    path: PathBuf,
    cut: watch::Sender<bool>,
}

impl Proxy {
    fn start(dir: &Path) -> Proxy {
        let path = dir.join("docker.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (cut, watch) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let mut watch = watch.clone();
                tokio::spawn(async move {
                    if *watch.borrow_and_update() {
                        return; // dropped: the client sees the connection closed
                    }
                    let Ok(engine) = UnixStream::connect(ENGINE).await else {
                        return;
                    };
                    let (mut client, mut engine) = (client, engine);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut engine) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Proxy { path, cut }
    }

    fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

struct Server {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Server {
    async fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let call = async {
            let resp = self.client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        };
        tokio::time::timeout(REQUEST_DEADLINE, call)
            .await
            .unwrap_or_else(|_| panic!("{method} {path} did not answer"))
    }
}

/// Container IDs labelled with this test's namespace, asked of the engine directly.
async fn containers(namespace: &str) -> Vec<String> {
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
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<no code>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_cut_engine_answers_503_and_keeps_the_binding() {
    let dir = std::env::temp_dir().join(format!("sbx-fault-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = Proxy::start(&dir);
    let namespace = format!("tfault-{:08x}", fastrand::u32(..));

    let mut config = ServiceConfig::load(None, &BTreeMap::new()).unwrap();
    config.docker.enabled = true;
    config.docker.network = "none".to_owned();
    config.docker.namespace = namespace.clone();
    config.docker.host = Some(format!("unix://{}", proxy.path.display()));
    config.tenants = vec![TenantEntry {
        id: 1,
        token_sha256: hex(&digest(TOKEN)),
    }];
    let state = sandbox_app::serve::build_state(&config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, sandbox_app::http::router(state)).await });
    let s = Server {
        base: format!("http://{addr}"),
        client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
    };
    let exec = "/v1/sessions/steady/exec";

    let (status, out) = s
        .call(
            "POST",
            exec,
            r#"{"command":"echo kept > state.txt","shell":true}"#,
        )
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    let (status, before) = s.call("GET", "/v1/sessions/steady", "").await;
    assert_eq!(status, 200, "{before}");
    let sandbox = before["sandbox_id"].clone();
    assert!(sandbox.is_string(), "the session is bound: {before}");
    let created = containers(&namespace).await;
    assert_eq!(created.len(), 1, "{created:?}");

    proxy.cut(true);
    for _ in 0..3 {
        let (status, out) = s
            .call("POST", exec, r#"{"command":"cat","args":["state.txt"]}"#)
            .await;
        assert_eq!((status, code(&out)), (503, "provider_unavailable"), "{out}");
    }
    let (status, out) = s.call("GET", "/v1/sessions/steady", "").await;
    assert!(
        status == 503 || (status == 200 && out["sandbox_id"] == sandbox),
        "inspect during the outage: never another sandbox or a 404: {status} {out}"
    );

    proxy.cut(false);
    let (status, out) = s
        .call("POST", exec, r#"{"command":"cat","args":["state.txt"]}"#)
        .await;
    assert_eq!((status, out["exit_code"].as_i64()), (200, Some(0)), "{out}");
    assert_eq!(
        out["stdout"], "kept\n",
        "the same sandbox, its files intact"
    );
    let (status, after) = s.call("GET", "/v1/sessions/steady", "").await;
    assert_eq!((status, &after["sandbox_id"]), (200, &sandbox), "{after}");
    assert_eq!(containers(&namespace).await, created, "no second container");

    let (status, _) = s.call("DELETE", "/v1/sessions/steady", "").await;
    assert_eq!(status, 204);
    assert!(containers(&namespace).await.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

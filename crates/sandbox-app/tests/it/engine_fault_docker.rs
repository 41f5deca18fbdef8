//! The Docker engine going away under the service: the service talks to the real engine through
//! a unix-socket proxy this test can cut. While it is cut, requests answer 503
//! `provider_unavailable` (never a panic, a hang or a 404), the session's binding survives the
//! ambiguity, and once the proxy is restored the same sandbox — with its files — answers again;
//! no second container is created.
//!
//! Needs the engine and the `sandbox-busybox:test` image: ignored in a plain `cargo test`, run
//! by `cargo xtask test`.

// Needs the Docker backend compiled in.
#![cfg(feature = "docker")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use crate::support;
use support::{code, container_ids};

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

const TOKEN: &str = "token-fault";
const ENGINE: &str = "/var/run/docker.sock";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine and the sandbox-busybox:test image: cargo xtask test runs it"]
async fn a_cut_engine_answers_503_and_keeps_the_binding() {
    let dir = std::env::temp_dir().join(format!("sbx-fault-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let proxy = Proxy::start(&dir);
    let socket = format!("unix://{}", proxy.path.display());
    let s = support::start_with("tfault", &[TOKEN], |c| c.docker.host = Some(socket), |_| {}).await;
    let namespace = s.namespace.clone();
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
    let created = container_ids(&namespace).await;
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
    assert_eq!(
        container_ids(&namespace).await,
        created,
        "no second container"
    );

    let (status, _) = s.call("DELETE", "/v1/sessions/steady", "").await;
    assert_eq!(status, 204);
    assert!(container_ids(&namespace).await.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

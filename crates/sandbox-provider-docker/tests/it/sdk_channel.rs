//! The official E2B Python SDK's scenario (`crates/sandbox-agent/tests/sdk/scenario.py`, the one
//! the agent's own `sdk` and `sdk_debian` tests run) through the production path: a
//! [`DockerProvider`] in agent mode creates a sandbox of the Debian image through the provider
//! port (network `none`, no port published), and the SDK's `E2B_SANDBOX_URL` is a loopback
//! HTTP/1.1 listener this test runs, which hands every request it accepts to
//! `provider.channel(id)` and `Channel::forward`: the kept exec channel to the agent, h2c on it.
//! Every byte between the SDK and the agent passes through the channel; nothing dials the
//! container.
//!
//! The sandbox is the Docker adapter's: its agent runs with no `--default-user`, so commands
//! run as root with root's home. The provider's engine client goes through the counting proxy
//! of `channel.rs`, so the test also sees that the whole scenario made no exec-create beyond
//! the channel's own. Afterwards, through the same router, the agent's `/sandbox-agent/`
//! endpoints answer 404 and a paused sandbox answers 409 `session_sandbox_paused`.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`),
//! the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`) and the SDK's venv
//! (`SANDBOX_TEST_E2B_PYTHON`, `cargo xtask sdk-venv`): the e2b sdk stage of `cargo xtask test`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sandbox_core::{CreateRequest, ExecRequest, ListFilter, SandboxProvider, TemplateId};
use sandbox_provider_docker::channel::AGENT_PATH;
use sandbox_provider_docker::{DataPlane, DockerProvider};
use sandbox_testkit::e2b_sdk::{Expected, run_scenario, venv_python};
use sandbox_transport::envd::ForwardBody;
use tokio::net::TcpListener;

use crate::channel::{CountingProxy, agent_binary};
use crate::support::{config, namespace};

/// Tells the test which image to run (the tag is a hash of the image's recipe).
const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
/// The scenario's directory inside the sandbox.
const WORK: &str = "/workspace/sdk-scenario";
/// Who the Docker adapter's agent runs commands as when a request names no user.
const USER: &str = "root";
const HOME: &str = "/root";
/// The channel's execs for the whole scenario: the first open, and at most a few re-opens
/// (an agent still binding its socket at the first lease, an idle close). One exec per request
/// would be hundreds.
const MAX_CHANNEL_EXECS: u64 = 3;

/// The loopback router: every request it accepts goes to the sandbox's agent through the
/// provider's channel. Answers on HTTP/1.1, as the SDK speaks to a plain `http://` URL.
async fn serve(
    listener: TcpListener,
    provider: DockerProvider,
    id: String,
    served: Arc<AtomicUsize>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        // Small answers leave at once: with Nagle on, one waits for the SDK's delayed ACK.
        let _ = stream.set_nodelay(true);
        let (provider, id, served) = (provider.clone(), id.clone(), Arc::clone(&served));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (provider, id, served) = (provider.clone(), id.clone(), Arc::clone(&served));
                async move {
                    served.fetch_add(1, Ordering::SeqCst);
                    let channel = provider.channel(&id).expect("agent mode has channels");
                    Ok::<Response<ForwardBody>, Infallible>(channel.forward(request).await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// What the engine says of the container's published ports and network.
fn published(id: &str) -> (String, String, String) {
    let inspect = |format: &str| {
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", format, id])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker inspect: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    (
        inspect("{{json .HostConfig.PortBindings}}"),
        inspect("{{json .NetworkSettings.Ports}}"),
        inspect("{{.HostConfig.NetworkMode}}"),
    )
}

fn docker_cli(args: &[&str]) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "docker {args:?}: {out:?}");
}

/// One `GET path` to the router over a fresh connection: the status and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling the loopback router it just bound, not a tenant-supplied endpoint"
    )]
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("the router answers")
    .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Docker engine, the Debian image (SANDBOX_TEST_DEBIAN_IMAGE), the static agent (SANDBOX_AGENT_BIN) and the SDK venv (the e2b sdk stage)"]
async fn the_official_python_sdk_passes_its_scenario_through_the_agent_channel() {
    venv_python();
    let image = std::env::var(ENV_IMAGE).unwrap_or_else(|_| {
        panic!(
            "{ENV_IMAGE} is not set: `cargo xtask debian-image` builds the image and prints its tag"
        )
    });
    let proxy = CountingProxy::start().await;
    let mut c = config(&namespace("sdkc"));
    c.data_plane = DataPlane::Agent;
    c.agent_path = Some(agent_binary());
    c.host = Some(format!("unix://{}", proxy.path().display()));
    let provider = DockerProvider::connect(c)
        .await
        .expect("connect in agent mode");
    let provider: DockerProvider = (*provider).clone();
    let handle = provider
        .create(CreateRequest::new(TemplateId::new(&image).unwrap()))
        .await
        .unwrap();
    let id = handle.id().as_str().to_owned();
    // Removed however the test ends.
    struct Remove(String);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", "-v", &self.0])
                .output();
        }
    }
    let _remove = Remove(id.clone());

    let init = provider
        .exec(
            &handle,
            ExecRequest::shell("tr '\\000' ' ' < /proc/1/cmdline"),
        )
        .await
        .unwrap();
    assert!(
        init.stdout_lossy().starts_with(AGENT_PATH),
        "PID 1 is {:?}, not the agent",
        init.stdout_lossy()
    );
    let made = provider
        .exec(&handle, ExecRequest::shell(format!("mkdir -p {WORK}")))
        .await
        .unwrap();
    assert_eq!(made.exit_code, 0, "{}", made.stderr_lossy());

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let url = format!("http://{addr}");
    let served = Arc::new(AtomicUsize::new(0));
    let router = tokio::spawn(serve(
        listener,
        provider.clone(),
        id.clone(),
        Arc::clone(&served),
    ));

    let channel = provider.channel(&id).unwrap();
    let context = {
        let (channel, id) = (Arc::clone(&channel), id.clone());
        move || {
            let stderr = tokio::runtime::Handle::current().block_on(channel.relay_stderr());
            let logs = std::process::Command::new("docker")
                .args(["logs", "--tail", "60", &id])
                .output()
                .map(|o| {
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default();
            format!(
                "sandbox {id}, channel execs {}, relay stderr: {stderr}\n--- agent log (last lines)\n{logs}",
                channel.execs_opened()
            )
        }
    };
    let stdout = tokio::task::spawn_blocking(move || {
        let expected = Expected {
            user: USER,
            home: Some(HOME),
        };
        run_scenario(&url, Path::new(WORK), &expected, &context)
    })
    .await
    .unwrap();

    // All 15 steps, and the summary line says so.
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(last, "scenario: 15 passed, 0 failed", "{stdout}");
    // The SDK's traffic was the router's: dozens of requests (74 in a run here: the steps, the
    // 50 MiB both ways, the round trips), and every one of them on the kept channel.
    let requests = served.load(Ordering::SeqCst);
    assert!(
        requests >= 40,
        "only {requests} requests reached the router"
    );
    let execs = channel.execs_opened();
    assert!(
        (1..=MAX_CHANNEL_EXECS).contains(&execs),
        "{execs} channel execs for {requests} requests"
    );
    assert_eq!(
        proxy.exec_creates() as u64,
        execs,
        "every exec-create of the scenario was the channel's"
    );
    // Nothing was published, and there is no network to dial the container on.
    let (bindings, ports, network) = published(&id);
    assert!(
        matches!(bindings.as_str(), "null" | "{}"),
        "port bindings {bindings}"
    );
    assert!(matches!(ports.as_str(), "null" | "{}"), "ports {ports}");
    assert_eq!(network, "none");

    // Through the same router: the agent's own endpoints are not reachable, and a paused
    // sandbox is an answer saying so (the next lease reopens the channel, which the engine
    // refuses while paused), not a hang.
    let (status, body) = http_get(addr, "/sandbox-agent/version").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("\"code\":\"not_found\""), "{body}");
    channel.invalidate().await;
    docker_cli(&["pause", &id]);
    let (status, body) = http_get(addr, "/health").await;
    docker_cli(&["unpause", &id]);
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("\"code\":\"session_sandbox_paused\""),
        "{body}"
    );
    let (status, _) = http_get(addr, "/health").await;
    assert!(
        (200..300).contains(&status),
        "unpaused, the agent answers again"
    );
    router.abort();

    for s in provider
        .list(&ListFilter::default())
        .await
        .unwrap_or_default()
    {
        let _ = provider.delete(&s.id).await;
    }
    // Shown with --nocapture: the SDK's round trip through the channel.
    println!("{stdout}");
    println!(
        "router: {requests} requests, {execs} channel exec(s), {} exec-create(s) in all",
        proxy.exec_creates()
    );
}

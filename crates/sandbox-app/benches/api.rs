//! `cargo xtask bench api`: what the HTTP API adds to an exec, as a ratio against the baseline
//! measured in the same run.
//!
//! - Baseline (`direct`): the Docker provider called in-process — `SandboxProvider::exec` of
//!   argv `true` on a handle connected to the session's container.
//! - Ours (`http`): `POST /v1/sessions/{session}/exec` with `{"command":"true"}` to the service
//!   (the real router, auth, lifecycle resolve under the lock, memory store, the same provider
//!   code) over loopback TCP with a kept-alive hyper connection, response body read in full.
//!
//! Both sides run in the same container (the session's, created by a first untimed HTTP exec),
//! alternating sample by sample and which goes first, so machine drift affects both. p50/p90
//! nearest rank.
//!
//! The run measures both data planes, one after the other, each with a service and a provider
//! of its own on a namespace of its own:
//! - exec mode (`docker.data_plane = "exec"`): every command an exec of its own. Goal: at most
//!   2 ms added at p50 and a ratio of at most 1.1.
//! - agent mode (`docker.data_plane = "agent"`, the agent named by `SANDBOX_AGENT_BIN`, which
//!   `cargo xtask bench api` builds and sets): every command one envd call over the kept
//!   channel. The service and the direct provider each keep their own channel to the session's
//!   container. Goal (issue 16): at most 1 ms added at p50.
//!
//! Needs a running Docker engine, the local image `sandbox-busybox:test` (`cargo xtask test`
//! provides both) and `SANDBOX_AGENT_BIN`; fails at once with a message otherwise. The
//! session's container lives in a namespace of its own and is destroyed at the end, also when a
//! sample fails.
//!
//! Prints raw lines, then one `BENCH api <key>=<value>` line per figure: the exec-mode keys
//! `exec_*`, the agent-mode keys `agent_*`. `--smoke` (or `CI=true`) runs 3 samples a side.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)] // A bench binary reports on stdout and stderr.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use sandbox_app::auth::{digest, hex};
use sandbox_app::config::{ServiceConfig, TenantEntry};
use sandbox_core::{ConnectRequest, ExecRequest, SandboxHandle, SandboxId, SandboxProvider};
use sandbox_provider_docker::DataPlane;
use serde_json::Value;

const TOKEN: &str = "bench-api-token";
const SESSION: &str = "bench";
const SAMPLES: usize = 200;
const SMOKE_SAMPLES: usize = 3;
const WARMUP: usize = 10;
const GOAL_ADDED_MS: f64 = 2.0;
const GOAL_RATIO: f64 = 1.1;
/// Issue 16's goal for what the API adds to a command through the agent.
const GOAL_AGENT_ADDED_MS: f64 = 1.0;
/// Where the agent binary comes from (`cargo xtask bench api` builds it and sets this).
const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";

type Res<T> = Result<T, String>;

struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    async fn call(&self, method: &str, path: &str, body: &str) -> Res<(u16, Value)> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| e.to_string())?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{method} {path}: body: {e}"))?
            .to_bytes();
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    async fn exec_true(&self) -> Res<()> {
        let (status, out) = self
            .call(
                "POST",
                &format!("/v1/sessions/{SESSION}/exec"),
                r#"{"command":"true"}"#,
            )
            .await?;
        if status != 200 || out["exit_code"] != 0 || out["stdout"] != "" || out["stderr"] != "" {
            return Err(format!("http exec true: {status} {out}"));
        }
        Ok(())
    }
}

async fn direct_true(provider: &Arc<dyn SandboxProvider>, handle: &SandboxHandle) -> Res<()> {
    let r = provider
        .exec(handle, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .map_err(|e| format!("direct exec true: {e}"))?;
    if r.exit_code != 0 || !r.stdout.is_empty() || !r.stderr.is_empty() {
        return Err(format!(
            "direct exec true exited {} with {} bytes of stdout and {} of stderr",
            r.exit_code,
            r.stdout.len(),
            r.stderr.len()
        ));
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile, in milliseconds.
fn percentile(samples: &[Duration], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    ms(sorted[rank - 1])
}

/// One data plane's measurement: its own service, provider and namespace.
async fn run(samples: usize, plane: DataPlane, agent_bin: &std::path::Path) -> Res<()> {
    let namespace = format!("bench-api-{:08x}", fastrand::u32(..));
    let mut config = ServiceConfig::load(None, &BTreeMap::new()).map_err(|e| e.to_string())?;
    config.docker.enabled = true;
    config.docker.network = sandbox_provider_docker::NetworkMode::None;
    config.docker.namespace = namespace.clone();
    config.docker.data_plane = plane;
    config.docker.agent_path = Some(agent_bin.to_path_buf());
    config.tenants = vec![TenantEntry {
        id: 1,
        token_sha256: hex(&digest(TOKEN)),
        quotas: Default::default(),
    }];
    let state = sandbox_app::serve::build_state(&config)
        .await
        .map_err(|e| format!("the service (is the engine up, the image built?): {e}"))?;
    let provider = sandbox_app::serve::backend(&config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move { axum::serve(listener, sandbox_app::http::router(state)).await });
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark dialling its own loopback service, not a tenant-supplied endpoint"
    )]
    let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let http = Http {
        client,
        base: format!("http://{addr}"),
    };

    let outcome = measure(&http, &provider, samples, plane).await;
    let destroyed = http
        .call("DELETE", &format!("/v1/sessions/{SESSION}"), "")
        .await;
    match (outcome, destroyed) {
        (Ok(()), Ok((204 | 404, _))) => Ok(()),
        (Ok(()), Ok((status, out))) => Err(format!("destroy: {status} {out}")),
        (Ok(()), Err(e)) => Err(e),
        (Err(e), _) => Err(e),
    }
}

async fn measure(
    http: &Http,
    provider: &Arc<dyn SandboxProvider>,
    samples: usize,
    plane: DataPlane,
) -> Res<()> {
    // The first exec creates the session's container (untimed); the baseline connects to it.
    http.exec_true().await?;
    let (status, session) = http
        .call("GET", &format!("/v1/sessions/{SESSION}"), "")
        .await?;
    let id = session["sandbox_id"]
        .as_str()
        .ok_or_else(|| format!("session inspect: {status} {session}"))?;
    let id = SandboxId::new(id).map_err(|e| e.to_string())?;
    let handle = provider
        .connect(ConnectRequest::new(id))
        .await
        .map_err(|e| format!("connect: {e}"))?;

    let warmup = WARMUP.min(samples);
    for _ in 0..warmup {
        http.exec_true().await?;
        direct_true(provider, &handle).await?;
    }
    let (mut direct, mut ours) = (Vec::new(), Vec::new());
    for i in 0..samples {
        for side in [i % 2, (i + 1) % 2] {
            let start = Instant::now();
            if side == 0 {
                direct_true(provider, &handle).await?;
                direct.push(start.elapsed());
            } else {
                http.exec_true().await?;
                ours.push(start.elapsed());
            }
        }
    }

    let (d50, d90) = (percentile(&direct, 0.5), percentile(&direct, 0.9));
    let (h50, h90) = (percentile(&ours, 0.5), percentile(&ours, 0.9));
    let added = h50 - d50;
    let ratio = h50 / d50;
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    println!("data plane: {plane}");
    println!("samples per side: {samples} (after {warmup} warm-up pairs)");
    println!("all figures in ms; p50/p90 nearest rank; ratio = http / direct");
    println!("exec true  direct  p50 {d50:8.3}  p90 {d90:8.3}");
    println!("exec true  http    p50 {h50:8.3}  p90 {h90:8.3}");
    match plane {
        DataPlane::Exec => {
            println!(
                "added at p50 {added:.3} ms (goal <= {GOAL_ADDED_MS} ms: {}), ratio {ratio:.3} (goal <= {GOAL_RATIO}: {})",
                verdict(added <= GOAL_ADDED_MS),
                verdict(ratio <= GOAL_RATIO),
            );
            println!("BENCH api exec_direct_ms_p50={d50:.3}");
            println!("BENCH api exec_http_ms_p50={h50:.3}");
            println!("BENCH api exec_added_ms_p50={added:.3}");
            println!("BENCH api exec_ratio={ratio:.3}");
        }
        DataPlane::Agent => {
            println!(
                "added at p50 {added:.3} ms (goal <= {GOAL_AGENT_ADDED_MS} ms: {}), ratio {ratio:.3}",
                verdict(added <= GOAL_AGENT_ADDED_MS),
            );
            println!("BENCH api agent_direct_ms_p50={d50:.3}");
            println!("BENCH api agent_direct_ms_p90={d90:.3}");
            println!("BENCH api agent_http_ms_p50={h50:.3}");
            println!("BENCH api agent_http_ms_p90={h90:.3}");
            println!("BENCH api agent_added_ms_p50={added:.3}");
            println!("BENCH api agent_ratio={ratio:.3}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let smoke =
        std::env::args().any(|a| a == "--smoke") || std::env::var("CI").is_ok_and(|v| v == "true");
    let samples = if smoke { SMOKE_SAMPLES } else { SAMPLES };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench api: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(agent_bin) = std::env::var_os(ENV_AGENT_BIN).map(std::path::PathBuf::from) else {
        eprintln!(
            "bench api: {ENV_AGENT_BIN} is not set: the agent-mode run needs the static agent \
             (run this suite with `cargo xtask bench api`, which builds it and sets the variable)"
        );
        return ExitCode::FAILURE;
    };
    let both = async {
        run(samples, DataPlane::Exec, &agent_bin).await?;
        run(samples, DataPlane::Agent, &agent_bin).await
    };
    match rt.block_on(both) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench api: {e}");
            ExitCode::FAILURE
        }
    }
}

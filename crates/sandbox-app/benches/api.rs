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
//! nearest rank. Goal from the issue: at most 2 ms added at p50 and a ratio of at most 1.1.
//!
//! Needs a running Docker engine and the local image `sandbox-busybox:test` (`cargo xtask test`
//! provides both); fails at once with a message otherwise. The session's container lives in a
//! namespace of its own and is destroyed at the end, also when a sample fails.
//!
//! Prints raw lines, then one `BENCH api <key>=<value>` line per figure. `--smoke` runs 3
//! samples a side.

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
use serde_json::Value;

const TOKEN: &str = "bench-api-token";
const SESSION: &str = "bench";
const SAMPLES: usize = 200;
const SMOKE_SAMPLES: usize = 3;
const WARMUP: usize = 10;
const GOAL_ADDED_MS: f64 = 2.0;
const GOAL_RATIO: f64 = 1.1;

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
        if status != 200 || out["exit_code"] != 0 {
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
    if r.exit_code != 0 {
        return Err(format!("direct exec true exited {}", r.exit_code));
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

async fn run(samples: usize) -> Res<()> {
    let namespace = format!("bench-api-{:08x}", fastrand::u32(..));
    let mut config = ServiceConfig::load(None, &BTreeMap::new()).map_err(|e| e.to_string())?;
    config.docker.enabled = true;
    config.docker.network = sandbox_provider_docker::NetworkMode::None;
    config.docker.namespace = namespace.clone();
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

    let outcome = measure(&http, &provider, samples).await;
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

async fn measure(http: &Http, provider: &Arc<dyn SandboxProvider>, samples: usize) -> Res<()> {
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
    println!("samples per side: {samples} (after {warmup} warm-up pairs)");
    println!("all figures in ms; p50/p90 nearest rank; ratio = http / direct");
    println!("exec true  direct  p50 {d50:8.3}  p90 {d90:8.3}");
    println!("exec true  http    p50 {h50:8.3}  p90 {h90:8.3}");
    println!(
        "added at p50 {added:.3} ms (goal <= {GOAL_ADDED_MS} ms: {}), ratio {ratio:.3} (goal <= {GOAL_RATIO}: {})",
        if added <= GOAL_ADDED_MS {
            "met"
        } else {
            "missed"
        },
        if ratio <= GOAL_RATIO { "met" } else { "missed" },
    );
    println!("BENCH api exec_direct_ms_p50={d50:.3}");
    println!("BENCH api exec_http_ms_p50={h50:.3}");
    println!("BENCH api exec_added_ms_p50={added:.3}");
    println!("BENCH api exec_ratio={ratio:.3}");
    Ok(())
}

fn main() -> ExitCode {
    let smoke = std::env::args().any(|a| a == "--smoke");
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
    match rt.block_on(run(samples)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench api: {e}");
            ExitCode::FAILURE
        }
    }
}

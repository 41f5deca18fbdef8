//! Part of `cargo xtask bench docker`: a streamed 100 MiB round trip through the service
//! against a raw `docker cp` of the same bytes, measured in the same run.
//!
//! - Baseline (`docker_cp`): `docker cp <host file> <container>:/workspace/raw.bin`, then
//!   `docker cp <container>:/workspace/raw.bin <host file>` — the engine's archive endpoint
//!   both ways, through the CLI as an operator would copy a file.
//! - Ours (`stream`): `PUT /v1/sessions/{session}/files/stream?path=/workspace/stream.bin`
//!   with the bytes as a chunked request body (64 KiB frames from memory), then `GET` of the
//!   same path, its body read frame by frame and hashed, over loopback TCP to the real router
//!   (auth, lookup, the agent channel) in agent mode, the default.
//!
//! Both sides use the session's container (created by a first untimed exec), alternating
//! sample by sample and which goes first, so machine drift affects both. Each round trip is
//! checked: the bytes that came back hash to the bytes sent. Medians of the samples.
//!
//! Needs a running Docker engine, the local image `sandbox-busybox:test` and
//! `SANDBOX_AGENT_BIN` (`cargo xtask bench docker` builds the agent and sets it); fails at once
//! with a message otherwise. The session's container is destroyed at the end, also when a
//! sample fails.
//!
//! Prints raw lines, then one `BENCH docker <key>=<value>` line per figure (`stream_*`,
//! `docker_cp_*`). `--smoke` (or `CI=true`) runs one sample a side.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)] // A bench binary reports on stdout and stderr.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use sandbox_app::auth::{digest, hex};
use sandbox_app::config::{ServiceConfig, TenantEntry};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

const TOKEN: &str = "bench-streams-token";
const SESSION: &str = "bench-streams";
const BYTES: usize = 100 << 20;
const FRAME: usize = 64 << 10;
const SAMPLES: usize = 5;
const SMOKE_SAMPLES: usize = 1;
const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";

type Res<T> = Result<T, String>;
type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

struct Http {
    client: Client<HttpConnector, Body>,
    base: String,
}

impl Http {
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Body,
    ) -> Res<hyper::Response<hyper::body::Incoming>> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(body)
            .map_err(|e| e.to_string())?;
        self.client
            .request(req)
            .await
            .map_err(|e| format!("{method} {path}: {e}"))
    }

    async fn call(&self, method: &str, path: &str, body: &str) -> Res<(u16, Value)> {
        let resp = self
            .send(
                method,
                path,
                Full::new(Bytes::from(body.to_owned())).boxed(),
            )
            .await?;
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

    /// The streamed upload and download of `data`; their times, the download's bytes checked.
    async fn round_trip(&self, data: &Bytes, digest: &[u8]) -> Res<(Duration, Duration)> {
        let path = format!("/v1/sessions/{SESSION}/files/stream?path=/workspace/stream.bin");
        let frames = (0..data.len())
            .step_by(FRAME)
            .map(|at| Ok(Frame::data(data.slice(at..(at + FRAME).min(data.len())))))
            .collect::<Vec<Result<_, std::convert::Infallible>>>();
        let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
        let started = Instant::now();
        let resp = self.send("PUT", &path, body).await?;
        let status = resp.status().as_u16();
        let answer = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("upload answer: {e}"))?
            .to_bytes();
        let up = started.elapsed();
        if status != 200 {
            return Err(format!(
                "streamed upload: {status} {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        let started = Instant::now();
        let resp = self
            .send("GET", &path, Full::new(Bytes::new()).boxed())
            .await?;
        if resp.status() != 200 {
            return Err(format!("streamed download: {}", resp.status()));
        }
        let mut body = resp.into_body();
        let mut hash = Sha256::new();
        let mut got = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("download body: {e}"))?;
            if let Ok(chunk) = frame.into_data() {
                got += chunk.len();
                hash.update(&chunk);
            }
        }
        let down = started.elapsed();
        if got != data.len() || hash.finalize().as_slice() != digest {
            return Err(format!("the streamed download differs: {got} bytes"));
        }
        Ok((up, down))
    }
}

fn docker(args: &[&str]) -> Res<()> {
    let out = std::process::Command::new("docker")
        .args(args)
        .env_remove("DOCKER_HOST")
        .output()
        .map_err(|e| format!("docker {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `docker cp` of `source` into the container and back out; both times, the bytes checked.
fn docker_cp_round_trip(
    container: &str,
    dir: &Path,
    source: &Path,
    digest: &[u8],
) -> Res<(Duration, Duration)> {
    let inside = format!("{container}:/workspace/raw.bin");
    let back = dir.join("back.bin");
    let _ = std::fs::remove_file(&back);
    let started = Instant::now();
    docker(&["cp", &source.display().to_string(), &inside])?;
    let up = started.elapsed();
    let started = Instant::now();
    docker(&["cp", &inside, &back.display().to_string()])?;
    let down = started.elapsed();
    let bytes = std::fs::read(&back).map_err(|e| e.to_string())?;
    if Sha256::digest(&bytes).as_slice() != digest {
        return Err("the docker cp copy differs".to_owned());
    }
    Ok((up, down))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(samples: &[Duration]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    ms(sorted[(sorted.len() - 1) / 2])
}

async fn run(samples: usize, agent_bin: &Path) -> Res<()> {
    let namespace = format!("bench-str-{:08x}", fastrand::u32(..));
    let mut config = ServiceConfig::load(None, &BTreeMap::new()).map_err(|e| e.to_string())?;
    config.docker.enabled = true;
    config.docker.network = sandbox_provider_docker::NetworkMode::None;
    config.docker.namespace = namespace;
    config.docker.agent_path = Some(agent_bin.to_path_buf());
    config.tenants = vec![TenantEntry {
        id: 1,
        token_sha256: hex(&digest(TOKEN)),
        quotas: Default::default(),
    }];
    let state = sandbox_app::serve::build_state(&config)
        .await
        .map_err(|e| format!("the service (is the engine up, the image built?): {e}"))?;
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
    let dir = std::env::temp_dir().join(format!("bench-streams-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let outcome = measure(&http, &dir, samples).await;
    let _ = std::fs::remove_dir_all(&dir);
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

async fn measure(http: &Http, dir: &Path, samples: usize) -> Res<()> {
    let (status, out) = http
        .call(
            "POST",
            &format!("/v1/sessions/{SESSION}/exec"),
            r#"{"command":"true"}"#,
        )
        .await?;
    if status != 200 {
        return Err(format!("the first exec: {status} {out}"));
    }
    let (status, session) = http
        .call("GET", &format!("/v1/sessions/{SESSION}"), "")
        .await?;
    let container = session["sandbox_id"]
        .as_str()
        .ok_or_else(|| format!("session inspect: {status} {session}"))?
        .to_owned();
    let mut data = vec![0u8; BYTES];
    fastrand::Rng::with_seed(17).fill(&mut data);
    let digest = Sha256::digest(&data).to_vec();
    let source: PathBuf = dir.join("source.bin");
    std::fs::write(&source, &data).map_err(|e| e.to_string())?;
    let data = Bytes::from(data);

    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for i in 0..samples {
        let mut one = async || -> Res<()> {
            if i % 2 == 0 {
                ours.push(http.round_trip(&data, &digest).await?);
                raw.push(docker_cp_round_trip(&container, dir, &source, &digest)?);
            } else {
                raw.push(docker_cp_round_trip(&container, dir, &source, &digest)?);
                ours.push(http.round_trip(&data, &digest).await?);
            }
            Ok(())
        };
        one().await?;
        let (u, d) = ours[i];
        let (ru, rd) = raw[i];
        println!(
            "sample {i}: stream up {:.1} ms down {:.1} ms; docker cp in {:.1} ms out {:.1} ms",
            ms(u),
            ms(d),
            ms(ru),
            ms(rd)
        );
    }
    let total = |v: &[(Duration, Duration)]| v.iter().map(|(u, d)| *u + *d).collect::<Vec<_>>();
    let ups = |v: &[(Duration, Duration)]| v.iter().map(|(u, _)| *u).collect::<Vec<_>>();
    let downs = |v: &[(Duration, Duration)]| v.iter().map(|(_, d)| *d).collect::<Vec<_>>();
    let (ours_rt, raw_rt) = (median(&total(&ours)), median(&total(&raw)));
    let mib = (BYTES >> 20) as f64;
    println!("BENCH docker stream_100mib_round_trip_ms={ours_rt:.1}");
    println!("BENCH docker docker_cp_100mib_round_trip_ms={raw_rt:.1}");
    println!(
        "BENCH docker stream_vs_docker_cp_ratio={:.3}",
        ours_rt / raw_rt
    );
    println!("BENCH docker stream_upload_ms={:.1}", median(&ups(&ours)));
    println!(
        "BENCH docker stream_download_ms={:.1}",
        median(&downs(&ours))
    );
    println!("BENCH docker docker_cp_in_ms={:.1}", median(&ups(&raw)));
    println!("BENCH docker docker_cp_out_ms={:.1}", median(&downs(&raw)));
    println!(
        "BENCH docker stream_round_trip_mib_per_s={:.1}",
        2.0 * mib / (ours_rt / 1e3)
    );
    println!("BENCH docker stream_samples={samples}");
    Ok(())
}

fn main() -> ExitCode {
    let smoke =
        std::env::args().any(|a| a == "--smoke") || std::env::var("CI").is_ok_and(|v| v == "true");
    let samples = if smoke { SMOKE_SAMPLES } else { SAMPLES };
    let Some(agent_bin) = std::env::var_os(ENV_AGENT_BIN).map(PathBuf::from) else {
        eprintln!(
            "error: {ENV_AGENT_BIN} must name the static agent (`cargo xtask bench docker` sets it)"
        );
        return ExitCode::FAILURE;
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(samples, &agent_bin)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

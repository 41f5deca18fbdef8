//! `cargo xtask bench docker`: what the Docker adapter costs over speaking the Engine API
//! directly, in both data planes, as ratios against raw baselines measured in the same run.
//!
//! Three sides, measured in one run on one engine:
//!
//! - **raw**: hyper over the same unix socket, with a warm (pooled, kept-alive) connection,
//!   speaking the API version the adapter negotiated, JSON bodies by hand.
//! - **ours** (exec mode, `docker.data_plane = "exec"`): every command and file operation is an
//!   exec of its own.
//! - **agent** (agent mode, `docker.data_plane = "agent"`): the agent (`SANDBOX_AGENT_BIN`,
//!   which `cargo xtask bench docker` builds and names) is copied into each created container
//!   and runs as its PID 1; commands and files go as envd calls over the one kept exec channel.
//!
//! The scenarios:
//!
//! - (a) `create_first_exec`: raw `POST /containers/create` (the adapter's own host config,
//!   labels and entrypoint, read back from a container it created), `POST
//!   /containers/{id}/start` and exec `true`, vs the adapter's `create` then its first
//!   `exec(true)`. In agent mode the create adds the archive upload of the agent and the first
//!   exec opens the channel (the relay's exec, the h2c handshake, the version exchange). Each
//!   container is removed after its sample, untimed.
//! - (b) `exec_true`: raw exec create + start + inspect of argv `["true"]`, vs the adapter's
//!   `exec` of argv `true` (in exec mode wrapped in `sh -c ... timeout -s KILL ...`, with a kill
//!   marker in its environment and the activity marker touched; in agent mode one envd `Start`
//!   on the warm channel). Also measured, as a decomposition of exec mode: raw exec of the very
//!   argv and env the adapter sends (`raw_wrapped`), which separates the in-container cost of
//!   the wrapper from the client-side cost.
//! - (c) `file_1mib`: raw exec `sh -c 'cat > /tmp/f'` with 1 MiB on stdin (hijacked connection)
//!   plus raw exec `cat /tmp/f` reading it back, vs the adapter's `write_file` + `read_file` of
//!   the same 1 MiB. Every side's bytes are checked; a mismatch aborts the bench.
//! - (d) `parallel`: [`PARALLEL`] execs at once on one sandbox, each `echo <n>` with its own `n`
//!   and its answer checked (a crossed or lost answer aborts the bench); the throughput is
//!   execs over the wall time of the burst, and p50/p99 are over every exec of every burst.
//!
//! Raw and exec mode share one reference sandbox; agent mode has its own (its container runs
//! the agent). The sides rotate sample by sample (which goes first rotates too), so drift on
//! the machine affects all of them. p50 and p90 (nearest rank) over the runs of each side.
//! Every exec's exit code is checked; `true`'s output must be empty.
//!
//! Needs a running Docker engine, the local image `sandbox-busybox:test` (`cargo xtask test`
//! starts the one and builds the other) and `SANDBOX_AGENT_BIN`; without them it fails at once
//! with a message saying so. Every container it creates is in a namespace of its own, labelled
//! `sandbox.test=1`, and removed at the end, also when the bench fails.
//!
//! Prints raw lines, then one `BENCH docker <key>=<value>` line per headline figure. `--smoke`
//! (or `CI=true`) runs 3 samples a side and one burst (CI only checks that the bench works).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)] // A bench binary reports on stdout and stderr.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use hyperlocal::{UnixClientExt, UnixConnector};
use sandbox_core::{
    CreateRequest, ExecRequest, ListFilter, SandboxHandle, SandboxPath, SandboxProvider, TemplateId,
};
use sandbox_provider_docker::engine::{self, Endpoint};
use sandbox_provider_docker::exec::{ACTIVITY_MARKER, EXEC_MARKER_ENV};
use sandbox_provider_docker::{
    DataPlane, DockerConfig, DockerProvider, NetworkMode, PullPolicy, labels,
};
use sandbox_transport::envd::CallOptions;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IMAGE: &str = "sandbox-busybox:test";
const FILE_SIZE: usize = 1 << 20;
const RAW_FILE: &str = "/tmp/f";
const OUR_FILE: &str = "/tmp/g";
/// The adapter's default exec timeout in whole seconds, as its wrapper spells it.
const WRAPPER_TIMEOUT_SECS: u64 = 60;
/// Execs at once in one burst of scenario (d), and bursts per side (full run, smoke run).
const PARALLEL: usize = 100;
const BURSTS: usize = 5;
const SMOKE_BURSTS: usize = 1;
/// Where the agent binary comes from (`cargo xtask bench docker` builds it and sets this).
const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";

/// Goals from the issue: ours/raw at most this much.
const GOAL_CREATE: f64 = 1.2;
const GOAL_EXEC: f64 = 1.15;
const GOAL_FILE: f64 = 1.2;
/// Issue 16's goal for exec `true` through the agent, in milliseconds at p50.
const GOAL_AGENT_EXEC_MS: f64 = 2.0;

type Res<T> = Result<T, String>;

/// The baseline: hyper straight onto the engine's socket, one pooled client for the whole run.
struct Raw {
    client: Client<UnixConnector, Full<Bytes>>,
    socket: PathBuf,
    /// `/v1.41`.
    prefix: String,
    /// How often an exec inspect still said "running" and was asked again.
    inspect_retries: AtomicUsize,
}

struct RawExec {
    exit_code: i64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Raw {
    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        upgrade: bool,
    ) -> Res<Request<Full<Bytes>>> {
        let uri: hyper::Uri =
            hyperlocal::Uri::new(&self.socket, &format!("{}{path}", self.prefix)).into();
        let mut builder = Request::builder().method(method).uri(uri);
        if upgrade {
            builder = builder.header(CONNECTION, "Upgrade").header(UPGRADE, "tcp");
        }
        let body = match body {
            Some(v) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(v).map_err(|e| e.to_string())?)
            }
            None => Bytes::new(),
        };
        builder.body(Full::new(body)).map_err(|e| e.to_string())
    }

    /// One plain API call; the answer's JSON (`Null` for an empty body).
    async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Res<Value> {
        let what = format!("raw {method} {path}");
        let request = self.request(method, path, body, false)?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{what}: reading the body: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "{what}: {status}: {}",
                String::from_utf8_lossy(&bytes).trim()
            ));
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("{what}: bad JSON: {e}"))
    }

    async fn create_container(&self, template: &Value, name: &str) -> Res<String> {
        let created = self
            .call(
                Method::POST,
                &format!("/containers/create?name={name}"),
                Some(template),
            )
            .await?;
        id_of(&created, "container create")
    }

    async fn start_container(&self, id: &str) -> Res<()> {
        self.call(Method::POST, &format!("/containers/{id}/start"), None)
            .await
            .map(drop)
    }

    async fn remove_container(&self, id: &str) -> Res<()> {
        self.call(
            Method::DELETE,
            &format!("/containers/{id}?force=true&v=true"),
            None,
        )
        .await
        .map(drop)
    }

    /// Exec create + start (hijacked, stdin written while output is read) + inspect.
    async fn exec(&self, container: &str, spec: &Value, stdin: Option<&[u8]>) -> Res<RawExec> {
        let created = self
            .call(
                Method::POST,
                &format!("/containers/{container}/exec"),
                Some(spec),
            )
            .await?;
        let id = id_of(&created, "exec create")?;
        let path = format!("/exec/{id}/start");
        let start = json!({ "Detach": false, "Tty": false });
        let request = self.request(Method::POST, &path, Some(&start), true)?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("raw POST {path}: {e}"))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(format!(
                "raw POST {path}: expected 101, got {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ));
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| format!("raw POST {path}: upgrade: {e}"))?;
        let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
        let write = async {
            if let Some(data) = stdin {
                writer.write_all(data).await?;
            }
            writer.shutdown().await
        };
        let mut muxed = Vec::new();
        let (written, read) = tokio::join!(write, reader.read_to_end(&mut muxed));
        read.map_err(|e| format!("raw exec {id}: reading output: {e}"))?;
        let (stdout, stderr) = demux(&muxed)?;
        let exit_code = self.exit_code(&id).await?;
        if stdin.is_some()
            && let Err(e) = written
        {
            return Err(format!(
                "raw exec {id}: writing stdin: {e} (exit {exit_code}, stderr {:?})",
                String::from_utf8_lossy(&stderr).trim()
            ));
        }
        Ok(RawExec {
            exit_code,
            stdout,
            stderr,
        })
    }

    /// Same policy as the adapter: the stream can end a moment before the engine records the
    /// exit, so a still-running answer is asked again after 20 ms.
    async fn exit_code(&self, exec_id: &str) -> Res<i64> {
        for _ in 0..50 {
            let inspect = self
                .call(Method::GET, &format!("/exec/{exec_id}/json"), None)
                .await?;
            if inspect["Running"] != Value::Bool(true)
                && let Some(code) = inspect["ExitCode"].as_i64()
            {
                return Ok(code);
            }
            self.inspect_retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("raw exec {exec_id}: never reported its exit code"))
    }
}

fn id_of(answer: &Value, what: &str) -> Res<String> {
    answer["Id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what} answered no Id: {answer}"))
}

/// Splits Docker's multiplexed stream (Tty=false): 8-byte headers `[stream, 0, 0, 0, len BE]`.
fn demux(mut raw: &[u8]) -> Res<(Vec<u8>, Vec<u8>)> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while !raw.is_empty() {
        if raw.len() < 8 {
            return Err(format!("truncated stream header ({} bytes)", raw.len()));
        }
        let len = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]) as usize;
        let frame = raw
            .get(8..8 + len)
            .ok_or_else(|| format!("truncated frame: {len} announced, {} left", raw.len() - 8))?;
        match raw[0] {
            1 => stdout.extend_from_slice(frame),
            2 => stderr.extend_from_slice(frame),
            _ => {}
        }
        raw = &raw[8 + len..];
    }
    Ok((stdout, stderr))
}

fn exec_spec(argv: &[&str], stdin: bool) -> Value {
    json!({
        "AttachStdin": stdin,
        "AttachStdout": true,
        "AttachStderr": true,
        "Tty": false,
        "Cmd": argv,
    })
}

/// What the adapter sends for `exec(argv true)` (see `exec::wrapper`): the same script, a kill
/// marker in the environment, uid 0. Used only to split our overhead into in-container and
/// client-side parts.
fn wrapped_true_spec() -> Value {
    let script = format!(
        "touch {ACTIVITY_MARKER} 2>/dev/null || true; exec timeout -s KILL {WRAPPER_TIMEOUT_SECS} \"$@\""
    );
    json!({
        "AttachStdin": false,
        "AttachStdout": true,
        "AttachStderr": true,
        "Tty": false,
        "Cmd": ["/bin/sh", "-c", script, "sandbox-exec", "true"],
        "Env": [format!("{EXEC_MARKER_ENV}={:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))],
        "User": "0",
    })
}

fn ensure_ok(what: &str, exit_code: i64, stderr: &[u8]) -> Res<()> {
    if exit_code == 0 {
        Ok(())
    } else {
        Err(format!(
            "{what} exited {exit_code}: {}",
            String::from_utf8_lossy(stderr).trim()
        ))
    }
}

fn check_bytes(what: &str, got: &[u8], want: &[u8]) -> Res<()> {
    if got == want {
        return Ok(());
    }
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    Err(format!(
        "correctness check failed: {what} returned {} bytes, expected {} (first difference at {:?})",
        got.len(),
        want.len(),
        first_diff
    ))
}

/// Named timing series: headline sides and their parts.
#[derive(Default)]
struct Samples(BTreeMap<&'static str, Vec<Duration>>);

impl Samples {
    fn push(&mut self, key: &'static str, d: Duration) {
        self.0.entry(key).or_default().push(d);
    }

    fn get(&self, key: &str) -> &[Duration] {
        self.0.get(key).map_or(&[], Vec::as_slice)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile, in milliseconds.
fn percentile(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    ms(sorted[rank - 1])
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Raw,
    /// The adapter in exec mode.
    Ours,
    /// The adapter in agent mode.
    Agent,
}

/// The sides rotated by one per sample, so each goes first, second and last in turn.
fn order(i: usize) -> [Side; 3] {
    let mut sides = [Side::Raw, Side::Ours, Side::Agent];
    sides.rotate_left(i % 3);
    sides
}

/// `true` must exit 0 and say nothing.
fn ensure_silent_ok(what: &str, exit_code: i64, stdout: &[u8], stderr: &[u8]) -> Res<()> {
    ensure_ok(what, exit_code, stderr)?;
    if stdout.is_empty() && stderr.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "correctness check failed: {what} printed {} bytes on stdout and {} on stderr",
            stdout.len(),
            stderr.len()
        ))
    }
}

/// One burst of scenario (d): per-exec latencies and the burst's wall time.
#[derive(Default)]
struct Bursts {
    latencies: Vec<Duration>,
    wall: Duration,
    execs: usize,
}

impl Bursts {
    fn execs_per_s(&self) -> f64 {
        self.execs as f64 / self.wall.as_secs_f64()
    }
}

struct Bench<'a> {
    provider: &'a DockerProvider,
    agent: &'a DockerProvider,
    raw: Raw,
    namespace: String,
    /// Body of a raw container create, copied from the adapter's own container.
    template: Value,
    /// The exec-mode sandbox raw and exec mode share.
    reference: SandboxHandle,
    /// The agent-mode sandbox.
    agent_reference: SandboxHandle,
    data: Vec<u8>,
    samples: Samples,
    bursts: BTreeMap<&'static str, Bursts>,
}

impl Bench<'_> {
    async fn create_raw(&mut self, record: bool) -> Res<()> {
        let name = format!("sbx-{}-raw{:08x}", self.namespace, fastrand::u32(..));
        let t0 = Instant::now();
        let id = self.raw.create_container(&self.template, &name).await?;
        let outcome = async {
            self.raw.start_container(&id).await?;
            let t1 = Instant::now();
            let out = self
                .raw
                .exec(&id, &exec_spec(&["true"], false), None)
                .await?;
            let t2 = Instant::now();
            ensure_silent_ok(
                "raw first exec true",
                out.exit_code,
                &out.stdout,
                &out.stderr,
            )?;
            Ok::<_, String>((t1, t2))
        }
        .await;
        let removed = self.raw.remove_container(&id).await;
        let (t1, t2) = outcome?;
        removed?;
        if record {
            self.samples.push("a_raw", t2 - t0);
            self.samples.push("a_raw_create_start", t1 - t0);
            self.samples.push("a_raw_first_exec", t2 - t1);
        }
        Ok(())
    }

    /// The adapter's create then first exec, in the data plane of `side`.
    async fn create_adapter(&mut self, side: Side, record: bool) -> Res<()> {
        let (provider, keys) = match side {
            Side::Agent => (
                self.agent,
                ["a_agent", "a_agent_create", "a_agent_first_exec"],
            ),
            _ => (
                self.provider,
                ["a_ours", "a_ours_create", "a_ours_first_exec"],
            ),
        };
        let what = side_name(side);
        let request = CreateRequest::new(TemplateId::new(IMAGE).map_err(|e| e.to_string())?);
        let t0 = Instant::now();
        let handle = provider
            .create(request)
            .await
            .map_err(|e| format!("{what} create: {e}"))?;
        let t1 = Instant::now();
        let out = provider
            .exec(&handle, ExecRequest::argv("true", Vec::<String>::new()))
            .await;
        let t2 = Instant::now();
        let removed = provider.delete(handle.id()).await;
        let out = out.map_err(|e| format!("{what} first exec: {e}"))?;
        ensure_silent_ok(
            &format!("{what} first exec true"),
            out.exit_code.into(),
            &out.stdout,
            &out.stderr,
        )?;
        removed.map_err(|e| format!("{what} delete: {e}"))?;
        if record {
            self.samples.push(keys[0], t2 - t0);
            self.samples.push(keys[1], t1 - t0);
            self.samples.push(keys[2], t2 - t1);
        }
        Ok(())
    }

    async fn exec_raw(&mut self, record: bool) -> Res<()> {
        let id = self.reference.id().as_str().to_owned();
        let t0 = Instant::now();
        let out = self
            .raw
            .exec(&id, &exec_spec(&["true"], false), None)
            .await?;
        let d = t0.elapsed();
        ensure_silent_ok("raw exec true", out.exit_code, &out.stdout, &out.stderr)?;
        // The decomposition: the adapter's argv and env, sent raw.
        let spec = wrapped_true_spec();
        let t0 = Instant::now();
        let wrapped = self.raw.exec(&id, &spec, None).await?;
        let dw = t0.elapsed();
        ensure_silent_ok(
            "raw wrapped exec true",
            wrapped.exit_code,
            &wrapped.stdout,
            &wrapped.stderr,
        )?;
        if record {
            self.samples.push("b_raw", d);
            self.samples.push("b_raw_wrapped", dw);
        }
        Ok(())
    }

    async fn exec_adapter(&mut self, side: Side, record: bool) -> Res<()> {
        let (provider, handle, key) = match side {
            Side::Agent => (self.agent, &self.agent_reference, "b_agent"),
            _ => (self.provider, &self.reference, "b_ours"),
        };
        let what = side_name(side);
        let t0 = Instant::now();
        let out = provider
            .exec(handle, ExecRequest::argv("true", Vec::<String>::new()))
            .await
            .map_err(|e| format!("{what} exec: {e}"))?;
        let d = t0.elapsed();
        ensure_silent_ok(
            &format!("{what} exec true"),
            out.exit_code.into(),
            &out.stdout,
            &out.stderr,
        )?;
        if record {
            self.samples.push(key, d);
        }
        if side == Side::Agent {
            self.channel_round_trip(record).await?;
        }
        Ok(())
    }

    /// The agent channel's own round trip, no process started: `GET /health` on the warm
    /// channel (through the engine's hijacked exec stream, the relay and the agent's socket).
    /// The gap between it and the exec is the agent's process start, wait and events.
    async fn channel_round_trip(&mut self, record: bool) -> Res<()> {
        let id = self.agent_reference.id().as_str();
        let channel = self
            .agent
            .channel(id)
            .ok_or("the agent-mode adapter has no channel")?;
        let t0 = Instant::now();
        let lease = channel
            .lease()
            .await
            .map_err(|e| format!("agent channel lease: {e}"))?;
        lease
            .client()
            .health(CallOptions::new())
            .await
            .map_err(|e| format!("agent channel health: {e}"))?;
        let d = t0.elapsed();
        if record {
            self.samples.push("b_agent_channel_health", d);
        }
        Ok(())
    }

    async fn file_raw(&mut self, record: bool) -> Res<()> {
        let id = self.reference.id().as_str().to_owned();
        let write_script = format!("cat > {RAW_FILE}");
        let t0 = Instant::now();
        let written = self
            .raw
            .exec(
                &id,
                &exec_spec(&["sh", "-c", &write_script], true),
                Some(&self.data),
            )
            .await?;
        let t1 = Instant::now();
        let read = self
            .raw
            .exec(&id, &exec_spec(&["cat", RAW_FILE], false), None)
            .await?;
        let t2 = Instant::now();
        ensure_ok("raw cat > file", written.exit_code, &written.stderr)?;
        ensure_ok("raw cat file", read.exit_code, &read.stderr)?;
        check_bytes("raw cat", &read.stdout, &self.data)?;
        if record {
            self.samples.push("c_raw", t2 - t0);
            self.samples.push("c_raw_write", t1 - t0);
            self.samples.push("c_raw_read", t2 - t1);
        }
        Ok(())
    }

    async fn file_adapter(&mut self, side: Side, record: bool) -> Res<()> {
        let (provider, handle, keys) = match side {
            Side::Agent => (
                self.agent,
                &self.agent_reference,
                ["c_agent", "c_agent_write", "c_agent_read"],
            ),
            _ => (
                self.provider,
                &self.reference,
                ["c_ours", "c_ours_write", "c_ours_read"],
            ),
        };
        let what = side_name(side);
        let path = SandboxPath::new(OUR_FILE).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        provider
            .write_file(handle, &path, &self.data)
            .await
            .map_err(|e| format!("{what} write_file: {e}"))?;
        let t1 = Instant::now();
        let back = provider
            .read_file(handle, &path)
            .await
            .map_err(|e| format!("{what} read_file: {e}"))?;
        let t2 = Instant::now();
        check_bytes(&format!("{what} read_file"), &back, &self.data)?;
        if record {
            self.samples.push(keys[0], t2 - t0);
            self.samples.push(keys[1], t1 - t0);
            self.samples.push(keys[2], t2 - t1);
        }
        Ok(())
    }

    /// One burst of [`PARALLEL`] execs of `echo <n>` at once on the side's sandbox, every
    /// answer checked against its own `n`.
    async fn parallel(&mut self, side: Side, record: bool) -> Res<()> {
        let what = side_name(side);
        let this = &*self;
        let one = |n: usize| {
            let word = format!("{n}");
            async move {
                let t0 = Instant::now();
                let (exit_code, stdout, stderr) = match side {
                    Side::Raw => {
                        let id = this.reference.id().as_str();
                        let out = this
                            .raw
                            .exec(id, &exec_spec(&["echo", &word], false), None)
                            .await?;
                        (out.exit_code, out.stdout, out.stderr)
                    }
                    Side::Ours | Side::Agent => {
                        let (provider, handle) = if side == Side::Agent {
                            (this.agent, &this.agent_reference)
                        } else {
                            (this.provider, &this.reference)
                        };
                        let out = provider
                            .exec(handle, ExecRequest::argv("echo", [word.clone()]))
                            .await
                            .map_err(|e| format!("{what} parallel exec {n}: {e}"))?;
                        (out.exit_code.into(), out.stdout, out.stderr)
                    }
                };
                let d = t0.elapsed();
                ensure_ok(&format!("{what} parallel echo {n}"), exit_code, &stderr)?;
                check_bytes(
                    &format!("{what} parallel echo {n}"),
                    &stdout,
                    format!("{word}\n").as_bytes(),
                )?;
                Ok::<_, String>(d)
            }
        };
        let t0 = Instant::now();
        let answers = join_all((0..PARALLEL).map(one)).await;
        let wall = t0.elapsed();
        let latencies = answers.into_iter().collect::<Res<Vec<Duration>>>()?;
        if record {
            let key = match side {
                Side::Raw => "d_raw",
                Side::Ours => "d_ours",
                Side::Agent => "d_agent",
            };
            let b = self.bursts.entry(key).or_default();
            b.execs += latencies.len();
            b.latencies.extend(latencies);
            b.wall += wall;
        }
        Ok(())
    }

    /// `warmup` unrecorded then `runs` recorded samples of one scenario, the sides rotating.
    async fn scenario(&mut self, which: char, warmup: usize, runs: usize) -> Res<()> {
        for i in 0..warmup + runs {
            let record = i >= warmup;
            for side in order(i) {
                match (which, side) {
                    ('a', Side::Raw) => self.create_raw(record).await?,
                    ('a', _) => self.create_adapter(side, record).await?,
                    ('b', Side::Raw) => self.exec_raw(record).await?,
                    ('b', _) => self.exec_adapter(side, record).await?,
                    ('c', Side::Raw) => self.file_raw(record).await?,
                    ('c', _) => self.file_adapter(side, record).await?,
                    ('d', _) => self.parallel(side, record).await?,
                    _ => return Err(format!("unknown scenario {which}")),
                }
            }
        }
        Ok(())
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Raw => "raw",
        Side::Ours => "exec mode",
        Side::Agent => "agent mode",
    }
}

/// Builds the raw create body from the adapter's own container, so both sides ask the engine
/// for the same thing.
async fn template_from(raw: &Raw, id: &str) -> Res<Value> {
    let inspect = raw
        .call(Method::GET, &format!("/containers/{id}/json"), None)
        .await?;
    let config = &inspect["Config"];
    let host = &inspect["HostConfig"];
    if !host.is_object() || !config["Labels"].is_object() {
        return Err(format!("inspect of {id} has no HostConfig or Labels"));
    }
    Ok(json!({
        "Image": config["Image"],
        "User": config["User"],
        "Entrypoint": config["Entrypoint"],
        "Cmd": [],
        "WorkingDir": config["WorkingDir"],
        "Env": [],
        "Labels": config["Labels"],
        "HostConfig": host,
    }))
}

/// What a run measured.
struct Measured {
    samples: Samples,
    bursts: BTreeMap<&'static str, Bursts>,
}

async fn bench(
    provider: &DockerProvider,
    agent: &DockerProvider,
    raw: Raw,
    namespace: &str,
    smoke: bool,
) -> Res<Measured> {
    let (warmup, runs) = if smoke { (1, 3) } else { (3, 40) };
    let bursts = if smoke { SMOKE_BURSTS } else { BURSTS };
    let reference = provider
        .create(CreateRequest::new(
            TemplateId::new(IMAGE).map_err(|e| e.to_string())?,
        ))
        .await
        .map_err(|e| format!("our create (reference sandbox): {e}"))?;
    let agent_reference = agent
        .create(CreateRequest::new(
            TemplateId::new(IMAGE).map_err(|e| e.to_string())?,
        ))
        .await
        .map_err(|e| format!("agent-mode create (reference sandbox): {e}"))?;
    let template = template_from(&raw, reference.id().as_str()).await?;
    // A scratch image has no /tmp; our write_file creates parents itself, the raw `cat > /tmp/f`
    // needs it made once (untimed).
    let made = raw
        .exec(
            reference.id().as_str(),
            &exec_spec(&["mkdir", "-p", "/tmp"], false),
            None,
        )
        .await?;
    ensure_ok("raw mkdir -p /tmp", made.exit_code, &made.stderr)?;
    println!(
        "raw create body (from the adapter's container): network {}, init {}, cap_drop {}, labels {}",
        template["HostConfig"]["NetworkMode"],
        template["HostConfig"]["Init"],
        template["HostConfig"]["CapDrop"],
        template["Labels"].as_object().map_or(0, |l| l.len()),
    );
    let mut data = vec![0u8; FILE_SIZE];
    fastrand::fill(&mut data);
    let mut b = Bench {
        provider,
        agent,
        raw,
        namespace: namespace.to_owned(),
        template,
        reference,
        agent_reference,
        data,
        samples: Samples::default(),
        bursts: BTreeMap::new(),
    };
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "samples per side: {runs} (after {warmup} warm-up), raw, exec mode and agent mode rotating; \
         parallel: {bursts} burst(s) of {PARALLEL} execs per side (after 1 warm-up burst)"
    );
    for (which, what, warmup, runs) in [
        ('a', "create + first exec", warmup, runs),
        ('b', "exec true", warmup, runs),
        ('c', "1 MiB write + read", warmup, runs),
        ('d', "parallel execs", 1, bursts),
    ] {
        let started = Instant::now();
        b.scenario(which, warmup, runs).await?;
        println!(
            "({which}) {what}: done in {:.1?}",
            started.elapsed().max(Duration::from_millis(1))
        );
    }
    println!(
        "raw exec inspects that still said running and were retried: {}",
        b.raw.inspect_retries.load(Ordering::Relaxed)
    );
    Ok(Measured {
        samples: b.samples,
        bursts: b.bursts,
    })
}

/// Removes every container of the bench's namespace (the raw ones carry the same labels).
async fn cleanup(provider: &DockerProvider, raw: &Raw, namespace: &str) -> Res<usize> {
    let filters = json!({ "label": [format!("{}={namespace}", labels::NAMESPACE)] }).to_string();
    let mut encoded = String::new();
    for b in filters.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            encoded.push(char::from(b));
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    let listed = raw
        .call(
            Method::GET,
            &format!("/containers/json?all=true&filters={encoded}"),
            None,
        )
        .await?;
    let mut ids: Vec<String> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["Id"].as_str().map(str::to_owned))
        .collect();
    // The adapter's own view too, in case the engine's filter and ours ever disagree.
    for s in provider
        .list(&ListFilter::default())
        .await
        .unwrap_or_default()
    {
        if !ids.iter().any(|i| i == s.id.as_str()) {
            ids.push(s.id.as_str().to_owned());
        }
    }
    let mut failures = Vec::new();
    for id in &ids {
        if let Err(e) = raw.remove_container(id).await
            && !e.contains("404")
        {
            failures.push(e);
        }
    }
    if failures.is_empty() {
        Ok(ids.len())
    } else {
        Err(failures.join("; "))
    }
}

fn config(namespace: &str, data_plane: DataPlane, agent_bin: Option<PathBuf>) -> Res<DockerConfig> {
    let mut c = DockerConfig::new(
        TemplateId::new(IMAGE).map_err(|e| e.to_string())?,
        namespace,
    );
    c.enabled = true;
    c.pull_policy = PullPolicy::Never;
    c.network = NetworkMode::None;
    c.idle_sweep = false;
    c.data_plane = data_plane;
    c.agent_path = agent_bin;
    c.extra_labels
        .insert("sandbox.test".to_owned(), "1".to_owned());
    Ok(c)
}

const NEEDS: &str = "the docker bench needs a running Docker engine (on DOCKER_HOST or \
/var/run/docker.sock), the local image sandbox-busybox:test and the static agent named by \
SANDBOX_AGENT_BIN; `cargo xtask bench docker` builds the agent and sets the variable, \
`cargo xtask test` starts the engine and builds the image, or start dockerd yourself and build \
the image (FROM scratch + busybox, see xtask/src/fixtures.rs)";

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn report(measured: &Measured) {
    let samples = &measured.samples;
    println!("all figures in ms; p50/p90 nearest rank; ratio = adapter / raw");
    for (key, series) in samples.0.iter() {
        let line: Vec<String> = series.iter().map(|d| format!("{:.1}", ms(*d))).collect();
        println!(
            "{key}: p50 {:.2} p90 {:.2} min {:.2} max {:.2} | samples: {}",
            percentile(series, 0.5),
            percentile(series, 0.9),
            percentile(series, 0.0),
            percentile(series, 1.0),
            line.join(" ")
        );
    }
    let mut headline = Vec::new();
    let figures = [
        ("create_first_exec", "a", GOAL_CREATE),
        ("exec_true", "b", GOAL_EXEC),
        ("file_1mib", "c", GOAL_FILE),
    ];
    for (key, tag, goal) in figures {
        let raw = samples.get(&format!("{tag}_raw"));
        let ours = samples.get(&format!("{tag}_ours"));
        let agent = samples.get(&format!("{tag}_agent"));
        for (p, pname) in [(0.5, "p50"), (0.9, "p90")] {
            let (r, o, a) = (
                percentile(raw, p),
                percentile(ours, p),
                percentile(agent, p),
            );
            let ratio = o / r;
            println!(
                "{key} {pname}: raw {r:.2} ms, exec mode {o:.2} ms, ratio {ratio:.2} (goal <= {goal}: {}); \
                 agent mode {a:.2} ms, ratio {:.3}",
                met(ratio <= goal),
                a / r
            );
            headline.push(format!("{key}_raw_{pname}_ms={r:.2}"));
            headline.push(format!("{key}_ours_{pname}_ms={o:.2}"));
            headline.push(format!("{key}_ratio_{pname}={ratio:.2}"));
            // Exec `true` through the agent carries the issue's own key names.
            if tag == "b" {
                headline.push(format!("agent_exec_{pname}_ms={a:.2}"));
                headline.push(format!("agent_exec_ratio_{pname}={:.3}", a / r));
            } else {
                headline.push(format!("{key}_agent_{pname}_ms={a:.2}"));
                headline.push(format!("{key}_agent_ratio_{pname}={:.3}", a / r));
            }
        }
    }
    let wrapped = samples.get("b_raw_wrapped");
    let raw_b = percentile(samples.get("b_raw"), 0.5);
    let ours_b = percentile(samples.get("b_ours"), 0.5);
    let agent_b = percentile(samples.get("b_agent"), 0.5);
    let wrapped_b = percentile(wrapped, 0.5);
    println!(
        "exec true decomposition (p50): raw {raw_b:.2} ms -> raw with our wrapper argv/env {wrapped_b:.2} ms \
         (in-container wrapper {:+.2} ms) -> ours {ours_b:.2} ms (client side {:+.2} ms)",
        wrapped_b - raw_b,
        ours_b - wrapped_b
    );
    println!(
        "exec true through the agent (p50): {agent_b:.2} ms (goal <= {GOAL_AGENT_EXEC_MS} ms: {}), \
         {:.1}x faster than raw exec {raw_b:.2} ms",
        met(agent_b <= GOAL_AGENT_EXEC_MS),
        raw_b / agent_b
    );
    headline.push(format!("exec_true_raw_wrapped_p50_ms={wrapped_b:.2}"));
    let health = samples.get("b_agent_channel_health");
    let (h50, h90) = (percentile(health, 0.5), percentile(health, 0.9));
    println!(
        "agent channel round trip (GET /health on the warm channel): p50 {h50:.2} ms p90 {h90:.2} ms; \
         exec true through the agent adds {:+.2} ms at p50 (process start, wait, events)",
        agent_b - h50
    );
    headline.push(format!("agent_channel_rtt_p50_ms={h50:.2}"));
    headline.push(format!("agent_channel_rtt_p90_ms={h90:.2}"));

    let raw_d = measured.bursts.get("d_raw");
    for (side, name) in [
        ("raw", "raw"),
        ("ours", "exec mode"),
        ("agent", "agent mode"),
    ] {
        let Some(b) = measured.bursts.get(format!("d_{side}").as_str()) else {
            continue;
        };
        let (p50, p99) = (
            percentile(&b.latencies, 0.5),
            percentile(&b.latencies, 0.99),
        );
        let rate = b.execs_per_s();
        println!(
            "parallel {PARALLEL} execs, {name}: {} execs in {:.2} s of bursts, {rate:.1} execs/s; \
             per exec p50 {p50:.2} ms p99 {p99:.2} ms",
            b.execs,
            b.wall.as_secs_f64()
        );
        headline.push(format!("parallel{PARALLEL}_{side}_execs_per_s={rate:.1}"));
        headline.push(format!("parallel{PARALLEL}_{side}_p50_ms={p50:.2}"));
        headline.push(format!("parallel{PARALLEL}_{side}_p99_ms={p99:.2}"));
        if let Some(r) = raw_d
            && side != "raw"
        {
            let throughput = rate / r.execs_per_s();
            let ratio_p50 = p50 / percentile(&r.latencies, 0.5);
            println!(
                "parallel {PARALLEL} execs, {name} against raw: throughput x{throughput:.2}, p50 ratio {ratio_p50:.3}"
            );
            headline.push(format!(
                "parallel{PARALLEL}_{side}_throughput_ratio={throughput:.2}"
            ));
            headline.push(format!(
                "parallel{PARALLEL}_{side}_ratio_p50={ratio_p50:.3}"
            ));
        }
    }
    for line in headline {
        println!("BENCH docker {line}");
    }
}

async fn run(smoke: bool) -> ExitCode {
    let namespace = format!("bench-{:08x}", fastrand::u32(..));
    let Some(agent_bin) = std::env::var_os(ENV_AGENT_BIN).map(PathBuf::from) else {
        eprintln!(
            "error: {ENV_AGENT_BIN} is not set: the agent-mode side needs the static agent \
             (run this suite with `cargo xtask bench docker`, which builds it and sets the variable)\n{NEEDS}"
        );
        return ExitCode::FAILURE;
    };
    let configs = config(&namespace, DataPlane::Exec, None).and_then(|exec| {
        Ok((
            exec,
            config(&namespace, DataPlane::Agent, Some(agent_bin.clone()))?,
        ))
    });
    let (exec_config, agent_config) = match configs {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let provider = match DockerProvider::connect(exec_config).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot reach the Docker engine: {e}\n{NEEDS}");
            return ExitCode::FAILURE;
        }
    };
    // The agent-mode adapter checks the agent (a static ELF of this version) as it starts.
    let agent = match DockerProvider::connect(agent_config).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: the agent-mode adapter cannot start: {e}\n{NEEDS}");
            return ExitCode::FAILURE;
        }
    };
    let socket =
        match engine::resolve_endpoint(None, std::env::var("DOCKER_HOST").ok().as_deref(), None) {
            Ok(Endpoint::Unix(path)) => path,
            Ok(other) => {
                eprintln!(
                    "error: the bench speaks raw HTTP over a unix socket only, not {other:?}"
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
    let api = provider.api_version();
    let raw = Raw {
        client: Client::unix(),
        socket,
        prefix: format!("/v{api}"),
        inspect_retries: AtomicUsize::new(0),
    };
    println!(
        "engine {} (API {}), negotiated API {api}, socket {}, image {IMAGE}, namespace {namespace}",
        provider.engine().version,
        provider.engine().api_version,
        raw.socket.display()
    );
    println!(
        "agent mode: agent {} ({} bytes)",
        agent_bin.display(),
        std::fs::metadata(&agent_bin).map_or(0, |m| m.len())
    );
    if let Err(e) = raw
        .call(Method::GET, &format!("/images/{IMAGE}/json"), None)
        .await
    {
        eprintln!("error: image {IMAGE} is not usable: {e}\n{NEEDS}");
        return ExitCode::FAILURE;
    }

    let cleanup_raw = Raw {
        client: raw.client.clone(),
        socket: raw.socket.clone(),
        prefix: raw.prefix.clone(),
        inspect_retries: AtomicUsize::new(0),
    };
    let outcome = AssertUnwindSafe(bench(&provider, &agent, raw, &namespace, smoke))
        .catch_unwind()
        .await;
    let cleaned = cleanup(&provider, &cleanup_raw, &namespace).await;
    match &cleaned {
        Ok(n) => println!("cleanup: removed {n} container(s) of namespace {namespace}"),
        Err(e) => eprintln!("warning: cleanup of namespace {namespace} failed: {e}"),
    }
    match outcome {
        Ok(Ok(measured)) => {
            report(&measured);
            if cleaned.is_err() {
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("error: bench aborted: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("error: bench panicked (containers cleaned up)");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let smoke =
        std::env::args().any(|a| a == "--smoke") || std::env::var("CI").is_ok_and(|v| v == "true");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(smoke))
}

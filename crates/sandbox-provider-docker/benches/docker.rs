//! `cargo xtask bench docker`: what the Docker adapter costs over speaking the Engine API
//! directly, as ratios against raw baselines measured in the same run.
//!
//! The baseline is raw hyper over the same unix socket, with a warm (pooled, kept-alive)
//! connection, speaking the API version the adapter negotiated, JSON bodies by hand:
//!
//! - (a) `create_first_exec`: raw `POST /containers/create` (the adapter's own host config,
//!   labels and entrypoint, read back from a container it created), `POST
//!   /containers/{id}/start` and exec `true`, vs the adapter's `create` then its first
//!   `exec(true)`. Each container is removed after its sample, untimed.
//! - (b) `exec_true`: raw exec create + start + inspect of argv `["true"]`, vs the adapter's
//!   `exec` of argv `true` (which wraps the command in `sh -c ... timeout -s KILL ...`, adds a
//!   kill marker to its environment and touches the activity marker). Also measured, as a
//!   decomposition: raw exec of the very argv and env the adapter sends (`raw_wrapped`), which
//!   separates the in-container cost of the wrapper from the client-side cost.
//! - (c) `file_1mib`: raw exec `sh -c 'cat > /tmp/f'` with 1 MiB on stdin (hijacked connection)
//!   plus raw exec `cat /tmp/f` reading it back, vs the adapter's `write_file` + `read_file` of
//!   the same 1 MiB. Both sides' bytes are checked; a mismatch aborts the bench.
//!
//! Raw and ours alternate sample by sample (and which goes first alternates too), so drift on
//! the machine affects both. p50 and p90 (nearest rank) over the runs of each side.
//!
//! Needs a running Docker engine and the local image `sandbox-busybox:test` (`cargo xtask test`
//! starts the one and builds the other); without them it fails at once with a message saying so.
//! Every container it creates is in a namespace of its own, labelled `sandbox.test=1`, and
//! removed at the end, also when the bench fails.
//!
//! Prints raw lines, then one `BENCH docker <key>=<value>` line per headline figure. `--smoke`
//! runs 3 samples a side (CI only checks that the bench works).

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
use std::time::{Duration, Instant};

use futures_util::FutureExt;
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
use sandbox_provider_docker::{DockerConfig, DockerProvider, NetworkMode, PullPolicy, labels};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IMAGE: &str = "sandbox-busybox:test";
const FILE_SIZE: usize = 1 << 20;
const RAW_FILE: &str = "/tmp/f";
const OUR_FILE: &str = "/tmp/g";
/// The adapter's default exec timeout in whole seconds, as its wrapper spells it.
const WRAPPER_TIMEOUT_SECS: u64 = 60;

/// Goals from the issue: ours/raw at most this much.
const GOAL_CREATE: f64 = 1.2;
const GOAL_EXEC: f64 = 1.15;
const GOAL_FILE: f64 = 1.2;

type Res<T> = Result<T, String>;

/// The baseline: hyper straight onto the engine's socket, one pooled client for the whole run.
struct Raw {
    client: Client<UnixConnector, Full<Bytes>>,
    socket: PathBuf,
    /// `/v1.41`.
    prefix: String,
    /// How often an exec inspect still said "running" and was asked again.
    inspect_retries: usize,
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
    async fn exec(&mut self, container: &str, spec: &Value, stdin: Option<&[u8]>) -> Res<RawExec> {
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
    async fn exit_code(&mut self, exec_id: &str) -> Res<i64> {
        for _ in 0..50 {
            let inspect = self
                .call(Method::GET, &format!("/exec/{exec_id}/json"), None)
                .await?;
            if inspect["Running"] != Value::Bool(true)
                && let Some(code) = inspect["ExitCode"].as_i64()
            {
                return Ok(code);
            }
            self.inspect_retries += 1;
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Raw,
    Ours,
}

/// Raw first on even samples, ours first on odd ones.
fn order(i: usize) -> [Side; 2] {
    if i.is_multiple_of(2) {
        [Side::Raw, Side::Ours]
    } else {
        [Side::Ours, Side::Raw]
    }
}

struct Bench<'a> {
    provider: &'a DockerProvider,
    raw: Raw,
    namespace: String,
    /// Body of a raw container create, copied from the adapter's own container.
    template: Value,
    reference: SandboxHandle,
    data: Vec<u8>,
    samples: Samples,
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
            ensure_ok("raw first exec true", out.exit_code, &out.stderr)?;
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

    async fn create_ours(&mut self, record: bool) -> Res<()> {
        let request = CreateRequest::new(TemplateId::new(IMAGE).map_err(|e| e.to_string())?);
        let t0 = Instant::now();
        let handle = self
            .provider
            .create(request)
            .await
            .map_err(|e| format!("our create: {e}"))?;
        let t1 = Instant::now();
        let out = self
            .provider
            .exec(&handle, ExecRequest::argv("true", Vec::<String>::new()))
            .await;
        let t2 = Instant::now();
        let removed = self.provider.delete(handle.id()).await;
        let out = out.map_err(|e| format!("our first exec: {e}"))?;
        ensure_ok("our first exec true", out.exit_code.into(), &out.stderr)?;
        removed.map_err(|e| format!("our delete: {e}"))?;
        if record {
            self.samples.push("a_ours", t2 - t0);
            self.samples.push("a_ours_create", t1 - t0);
            self.samples.push("a_ours_first_exec", t2 - t1);
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
        ensure_ok("raw exec true", out.exit_code, &out.stderr)?;
        // The decomposition: the adapter's argv and env, sent raw.
        let spec = wrapped_true_spec();
        let t0 = Instant::now();
        let wrapped = self.raw.exec(&id, &spec, None).await?;
        let dw = t0.elapsed();
        ensure_ok("raw wrapped exec true", wrapped.exit_code, &wrapped.stderr)?;
        if record {
            self.samples.push("b_raw", d);
            self.samples.push("b_raw_wrapped", dw);
        }
        Ok(())
    }

    async fn exec_ours(&mut self, record: bool) -> Res<()> {
        let t0 = Instant::now();
        let out = self
            .provider
            .exec(
                &self.reference,
                ExecRequest::argv("true", Vec::<String>::new()),
            )
            .await
            .map_err(|e| format!("our exec: {e}"))?;
        let d = t0.elapsed();
        ensure_ok("our exec true", out.exit_code.into(), &out.stderr)?;
        if record {
            self.samples.push("b_ours", d);
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

    async fn file_ours(&mut self, record: bool) -> Res<()> {
        let path = SandboxPath::new(OUR_FILE).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        self.provider
            .write_file(&self.reference, &path, &self.data)
            .await
            .map_err(|e| format!("our write_file: {e}"))?;
        let t1 = Instant::now();
        let back = self
            .provider
            .read_file(&self.reference, &path)
            .await
            .map_err(|e| format!("our read_file: {e}"))?;
        let t2 = Instant::now();
        check_bytes("our read_file", &back, &self.data)?;
        if record {
            self.samples.push("c_ours", t2 - t0);
            self.samples.push("c_ours_write", t1 - t0);
            self.samples.push("c_ours_read", t2 - t1);
        }
        Ok(())
    }

    /// `warmup` unrecorded then `runs` recorded samples of one scenario, raw and ours
    /// alternating.
    async fn scenario(&mut self, which: char, warmup: usize, runs: usize) -> Res<()> {
        for i in 0..warmup + runs {
            let record = i >= warmup;
            for side in order(i) {
                match (which, side) {
                    ('a', Side::Raw) => self.create_raw(record).await?,
                    ('a', Side::Ours) => self.create_ours(record).await?,
                    ('b', Side::Raw) => self.exec_raw(record).await?,
                    ('b', Side::Ours) => self.exec_ours(record).await?,
                    ('c', Side::Raw) => self.file_raw(record).await?,
                    (_, Side::Ours) => self.file_ours(record).await?,
                    (_, Side::Raw) => return Err(format!("unknown scenario {which}")),
                }
            }
        }
        Ok(())
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

async fn bench(provider: &DockerProvider, raw: Raw, namespace: &str, smoke: bool) -> Res<Samples> {
    let (warmup, runs) = if smoke { (1, 3) } else { (3, 40) };
    let reference = provider
        .create(CreateRequest::new(
            TemplateId::new(IMAGE).map_err(|e| e.to_string())?,
        ))
        .await
        .map_err(|e| format!("our create (reference sandbox): {e}"))?;
    let mut raw = raw;
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
        raw,
        namespace: namespace.to_owned(),
        template,
        reference,
        data,
        samples: Samples::default(),
    };
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!("samples per side: {runs} (after {warmup} warm-up), raw and ours interleaved");
    for (which, what) in [
        ('a', "create + first exec"),
        ('b', "exec true"),
        ('c', "1 MiB write + read"),
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
        b.raw.inspect_retries
    );
    Ok(b.samples)
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

fn config(namespace: &str) -> Res<DockerConfig> {
    let mut c = DockerConfig::new(
        TemplateId::new(IMAGE).map_err(|e| e.to_string())?,
        namespace,
    );
    c.enabled = true;
    c.pull_policy = PullPolicy::Never;
    c.network = NetworkMode::None;
    c.idle_sweep = false;
    c.extra_labels
        .insert("sandbox.test".to_owned(), "1".to_owned());
    Ok(c)
}

const NEEDS: &str = "the docker bench needs a running Docker engine (on DOCKER_HOST or \
/var/run/docker.sock) and the local image sandbox-busybox:test; `cargo xtask test` starts the \
engine and builds the image, or start dockerd yourself and build the image (FROM scratch + \
busybox, see xtask/src/fixtures.rs)";

fn report(samples: &Samples) {
    let figures = [
        ("create_first_exec", "a", GOAL_CREATE),
        ("exec_true", "b", GOAL_EXEC),
        ("file_1mib", "c", GOAL_FILE),
    ];
    println!("all figures in ms; p50/p90 nearest rank; ratio = ours / raw");
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
    for (key, tag, goal) in figures {
        let raw = samples.get(&format!("{tag}_raw"));
        let ours = samples.get(&format!("{tag}_ours"));
        for (p, pname) in [(0.5, "p50"), (0.9, "p90")] {
            let (r, o) = (percentile(raw, p), percentile(ours, p));
            let ratio = o / r;
            println!(
                "{key} {pname}: raw {r:.2} ms, ours {o:.2} ms, ratio {ratio:.2} (goal <= {goal}: {})",
                if ratio <= goal { "met" } else { "NOT met" }
            );
            headline.push(format!("{key}_raw_{pname}_ms={r:.2}"));
            headline.push(format!("{key}_ours_{pname}_ms={o:.2}"));
            headline.push(format!("{key}_ratio_{pname}={ratio:.2}"));
        }
    }
    let wrapped = samples.get("b_raw_wrapped");
    let raw_b = percentile(samples.get("b_raw"), 0.5);
    let ours_b = percentile(samples.get("b_ours"), 0.5);
    let wrapped_b = percentile(wrapped, 0.5);
    println!(
        "exec true decomposition (p50): raw {raw_b:.2} ms -> raw with our wrapper argv/env {wrapped_b:.2} ms \
         (in-container wrapper {:+.2} ms) -> ours {ours_b:.2} ms (client side {:+.2} ms)",
        wrapped_b - raw_b,
        ours_b - wrapped_b
    );
    headline.push(format!("exec_true_raw_wrapped_p50_ms={wrapped_b:.2}"));
    for line in headline {
        println!("BENCH docker {line}");
    }
}

async fn run(smoke: bool) -> ExitCode {
    let namespace = format!("bench-{:08x}", fastrand::u32(..));
    let config = match config(&namespace) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let provider = match DockerProvider::connect(config).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot reach the Docker engine: {e}\n{NEEDS}");
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
        inspect_retries: 0,
    };
    println!(
        "engine {} (API {}), negotiated API {api}, socket {}, image {IMAGE}, namespace {namespace}",
        provider.engine().version,
        provider.engine().api_version,
        raw.socket.display()
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
        inspect_retries: 0,
    };
    let outcome = AssertUnwindSafe(bench(&provider, raw, &namespace, smoke))
        .catch_unwind()
        .await;
    let cleaned = cleanup(&provider, &cleanup_raw, &namespace).await;
    match &cleaned {
        Ok(n) => println!("cleanup: removed {n} container(s) of namespace {namespace}"),
        Err(e) => eprintln!("warning: cleanup of namespace {namespace} failed: {e}"),
    }
    match outcome {
        Ok(Ok(samples)) => {
            report(&samples);
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
    let smoke = std::env::args().any(|a| a == "--smoke");
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

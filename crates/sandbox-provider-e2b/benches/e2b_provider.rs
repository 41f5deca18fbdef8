//! `cargo xtask bench e2b-provider`: what the E2B adapter costs over the wire it sends, and
//! how it compares with the official Python SDK, against one `sandbox serve` in one run.
//!
//! The bench starts `sandbox serve` (`SANDBOX_BENCH_SANDBOX_BIN`, built in release by xtask)
//! with `[e2b]` on, on free loopback ports: the Debian image as the `base` template
//! (`SANDBOX_TEST_DEBIAN_IMAGE`), agent mode with the static agent (`SANDBOX_AGENT_BIN`),
//! network `none`, a namespace of its own, one tenant. The adapter points at the E2B listener
//! as the conformance suite does (gateway mode, `sandbox_domain = "localhost"`, private
//! endpoints allowed) and creates one sandbox; every side then works on that sandbox.
//!
//! - `exec_true`: `true` in argv form through `SandboxProvider::exec`, against the same
//!   `process.Process/Start` request made with a plain hyper client (routing `Host` and
//!   headers, `X-Access-Token`, Basic root, the body read to its end), against the SDK's
//!   `commands.run("true")`. The SDK runs `/bin/bash -l -c true` (the shell form), so the
//!   adapter's shell form is timed too (`exec_true_adapter_shell`), for the SDK ratio that
//!   compares like with like.
//! - `file_1mib`: a 1 MiB write then read. The adapter's `read_file` stats the path before
//!   the download (a link or a FIFO is never opened), so the raw side sends the same three
//!   requests (`POST /files` multipart, `filesystem.Filesystem/Stat`, `GET /files`);
//!   `file_1mib_raw_nostat` is its POST and GET alone. The SDK: `files.write` then
//!   `files.read(format="bytes")`. The bytes read are checked after the clock stops.
//!
//! Sides take turns in blocks, the first side rotating, so a change in the shared machine's
//! load reaches all alike; each side is warmed up untimed first. The SDK runs as one
//! `e2b_provider_sdk.py` process per block (its start and connect untimed). The namespace's
//! containers are removed at the end, whatever failed. Prints raw lines, then one
//! `BENCH e2b-provider <key>=<value>` line per figure. `--smoke` (or `CI=true`): 3 samples a
//! side: CI only checks that the bench works.

#![allow(clippy::print_stdout, clippy::print_stderr)] // A bench binary reports on stdout and stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)] // A bench binary: a failed unwrap fails the run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sandbox_core::{
    Checked, CreateRequest, ExecRequest, IdleTimeout, SandboxHandle, SandboxPath, SandboxProvider,
    Secret, TemplateId,
};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

type Res<T> = Result<T, String>;

const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";
const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
const ENV_SANDBOX_BIN: &str = "SANDBOX_BENCH_SANDBOX_BIN";
const TEMPLATE: &str = "base";
const DOMAIN: &str = "localhost";
const ENVD_PORT: u16 = 49983;
/// The adapter's default user, which the raw side names as it does.
const BASIC_ROOT: &str = "Basic cm9vdDo=";
const FILE_BYTES: usize = 1024 * 1024;
/// How long the service gets to answer.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// One SDK driver process (a block of samples).
const DRIVER_DEADLINE: Duration = Duration::from_secs(600);
/// Long enough for the whole run: the sandbox must not time out under the bench.
const SANDBOX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Untimed calls per side before the timed ones (connections opened, caches warm).
const WARMUP: usize = 3;

type Raw = Client<HttpConnector, Full<Bytes>>;
type Adapter = Checked<E2bProvider>;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile.
fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn env(name: &str) -> Res<String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run this suite with `cargo xtask bench e2b-provider`, which builds the service, the agent, the Debian image and the SDK venv and sets it")
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex() -> String {
    hex(&fastrand::u128(..).to_le_bytes())
}

fn free_port() -> Res<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Removes the containers of `namespace` with the docker CLI; how many.
fn remove_namespace(namespace: &str) -> usize {
    let listed = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=sandbox.namespace={namespace}"))
        .output();
    let ids: Vec<String> = listed
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&ids)
            .stdout(Stdio::null())
            .status();
    }
    ids.len()
}

/// `sandbox serve` with `[e2b]` on, as a child; stopped and its namespace emptied on drop.
struct Serve {
    child: Child,
    namespace: String,
    dir: PathBuf,
    /// The E2B listener's address (`127.0.0.1:<port>`).
    e2b: String,
    key: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let removed = remove_namespace(&self.namespace);
        println!(
            "cleanup: stopped sandbox serve, removed {removed} container(s) of namespace {}",
            self.namespace
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Serve {
    async fn start(raw: &Raw, bin: &Path, agent: &Path, image: &str) -> Res<Serve> {
        let namespace = format!("bench-e2bp-{}", &random_hex()[..8]);
        let dir = std::env::temp_dir().join(format!("sbx-{namespace}"));
        let data_dir = dir.join("data");
        std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
        let key = format!("e2b_{}", random_hex());
        let (api_port, e2b_port) = (free_port()?, free_port()?);
        let config = format!(
            r#"listen = "127.0.0.1:{api_port}"
data_dir = {data_dir}

[docker]
enabled = true
image = {image}
build_missing_image = false
namespace = {namespace_str}
network = "none"
data_plane = "agent"
agent_path = {agent}

[e2b]
enabled = true
listen = "127.0.0.1:{e2b_port}"

[e2b.templates]
{TEMPLATE} = {image}

[[tenants]]
id = 1
token_sha256 = "{digest}"
"#,
            data_dir = toml_str(&data_dir.display().to_string()),
            image = toml_str(image),
            namespace_str = toml_str(&namespace),
            agent = toml_str(&agent.display().to_string()),
            digest = hex(&Sha256::digest(key.as_bytes())),
        );
        let config_path = dir.join("sandbox.toml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("serve.log")).map_err(|e| e.to_string())?;
        let mut command = Command::new(bin);
        command.arg("serve").arg("--config").arg(&config_path);
        // The bench's own environment (SANDBOX_AGENT_BIN...) is not the service's config.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SANDBOX_") {
                command.env_remove(name);
            }
        }
        let child = command
            .env_remove("DOCKER_HOST")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut serve = Serve {
            child,
            namespace,
            dir,
            e2b: format!("127.0.0.1:{e2b_port}"),
            key,
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = serve.child.try_wait() {
                return Err(format!(
                    "sandbox serve exited with {status}; its log:\n{}",
                    serve.log()
                ));
            }
            let up = |port: u16, path: &'static str| async move {
                let request = Request::get(format!("http://127.0.0.1:{port}{path}"))
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| e.to_string())?;
                let answer = raw.request(request).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(answer.status().as_u16() < 500)
            };
            if up(api_port, "/healthz").await == Ok(true)
                && up(e2b_port, "/health").await == Ok(true)
            {
                return Ok(serve);
            }
            if start.elapsed() > READY_DEADLINE {
                return Err(format!(
                    "sandbox serve did not answer; its log:\n{}",
                    serve.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    fn url(&self) -> String {
        format!("http://{}", self.e2b)
    }

    /// Runs one SDK driver process on `sandbox`; its samples by key, its lines echoed.
    fn sdk(
        &self,
        python: &str,
        mode: &str,
        n: usize,
        sandbox: &str,
    ) -> Res<Vec<(String, Vec<f64>)>> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/e2b_provider_sdk.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args([mode, &n.to_string(), sandbox])
            .env("E2B_API_KEY", &self.key)
            .env("E2B_API_URL", self.url())
            .env("E2B_SANDBOX_URL", self.url())
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{python}: {e}"))?;
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                break status;
            }
            if start.elapsed() > DRIVER_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the SDK driver ({mode} {n}) did not end in time"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&output.stdout);
        if !status.success() {
            return Err(format!(
                "the SDK driver ({mode} {n}) failed ({status}):\n{out}\n{}\n--- sandbox serve log (tail)\n{}",
                String::from_utf8_lossy(&output.stderr),
                tail(&self.log(), 40)
            ));
        }
        let mut found = Vec::new();
        for line in out.lines() {
            println!("sdk | {line}");
            if let Some((key, values)) = line
                .strip_prefix("samples ")
                .and_then(|l| l.split_once(" ms: "))
            {
                let values = values
                    .split_whitespace()
                    .map(|s| s.parse::<f64>().map_err(|e| format!("{s:?}: {e}")))
                    .collect::<Res<Vec<f64>>>()?;
                found.push((key.to_owned(), values));
            }
        }
        Ok(found)
    }
}

/// The raw side: envd requests as the adapter sends them, on a plain pooled hyper client
/// dialling the listener (the gateway), routed by `Host` and the routing headers.
struct RawEnvd<'a> {
    client: &'a Raw,
    gateway: String,
    host: HeaderValue,
    id: HeaderValue,
    token: HeaderValue,
}

impl RawEnvd<'_> {
    fn request(&self, method: Method, path: &str, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.gateway))
            .body(Full::new(body))
            .expect("a request from fixed parts");
        let headers = request.headers_mut();
        headers.insert(header::HOST, self.host.clone());
        headers.insert("e2b-sandbox-id", self.id.clone());
        headers.insert("e2b-sandbox-port", HeaderValue::from(ENVD_PORT));
        headers.insert("x-access-token", self.token.clone());
        request
    }

    /// A Connect request (`application/connect+json` envelopes, or unary `application/json`).
    fn rpc(&self, path: &str, content_type: &'static str, body: Bytes) -> Request<Full<Bytes>> {
        let mut request = self.request(Method::POST, path, body);
        let headers = request.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        headers.insert("connect-timeout-ms", HeaderValue::from_static("60000"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static(BASIC_ROOT));
        request
    }

    /// One request; its status and whole body.
    async fn call(&self, request: Request<Full<Bytes>>) -> Res<(u16, Bytes)> {
        let answer = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("raw request: {e}"))?;
        let status = answer.status().as_u16();
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("raw body: {e}"))?
            .to_bytes();
        Ok((status, body))
    }

    async fn exec_true(&self) -> Res<()> {
        let message = json!({"process": {"cmd": "true", "args": []}, "stdin": false}).to_string();
        let mut body = BytesMut::with_capacity(message.len() + 5);
        body.put_u8(0);
        body.put_u32(u32::try_from(message.len()).expect("a short message"));
        body.put_slice(message.as_bytes());
        let mut request = self.rpc(
            "/process.Process/Start",
            "application/connect+json",
            body.freeze(),
        );
        let headers = request.headers_mut();
        headers.insert(
            "connect-content-encoding",
            HeaderValue::from_static("identity"),
        );
        headers.insert(
            "connect-accept-encoding",
            HeaderValue::from_static("identity"),
        );
        headers.insert("keepalive-ping-interval", HeaderValue::from_static("50"));
        let (status, body) = self.call(request).await?;
        if status != 200 {
            return Err(format!("Start answered {status}"));
        }
        match end_of_start(&body)? {
            0 => Ok(()),
            code => Err(format!("true exited {code}")),
        }
    }

    /// Write, stat, read (timed each): the read's bytes.
    async fn file_round_trip(&self, path: &str, data: &Bytes) -> Res<([Duration; 3], Bytes)> {
        // From before the multipart body is made: any client has to make it.
        let start = Instant::now();
        let query = format!("/files?path={path}&username=root");
        let boundary = format!("sandbox-{}", random_hex());
        let mut body = BytesMut::with_capacity(data.len() + 256);
        body.put_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        body.put_slice(data);
        body.put_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let content_type =
            HeaderValue::from_str(&format!("multipart/form-data; boundary={boundary}"))
                .map_err(|e| e.to_string())?;
        let mut upload = self.request(Method::POST, &query, body.freeze());
        upload
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type);
        let (status, answer) = self.call(upload).await?;
        if status != 200 {
            return Err(format!(
                "POST /files answered {status}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        let wrote = start.elapsed();
        let mut stat = self.rpc(
            "/filesystem.Filesystem/Stat",
            "application/json",
            Bytes::from(json!({"path": path}).to_string()),
        );
        let headers = stat.headers_mut();
        // The adapter's file calls are bounded at 120 s, its commands at 60 s.
        headers.insert("connect-timeout-ms", HeaderValue::from_static("120000"));
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let (status, answer) = self.call(stat).await?;
        if status != 200 {
            return Err(format!(
                "Stat answered {status}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        let statted = start.elapsed();
        let (status, read) = self
            .call(self.request(Method::GET, &query, Bytes::new()))
            .await?;
        if status != 200 {
            return Err(format!("GET /files answered {status}"));
        }
        let end = start.elapsed();
        Ok(([wrote, statted - wrote, end - statted], read))
    }
}

/// The exit code in a `process.Process/Start` stream's envelopes, which must close cleanly.
fn end_of_start(mut body: &[u8]) -> Res<i64> {
    let (mut exit, mut closed) = (None, false);
    while body.len() >= 5 {
        let flags = body[0];
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let message = body.get(5..5 + len).ok_or("a truncated Connect envelope")?;
        let v: Value =
            serde_json::from_slice(message).map_err(|e| format!("an envelope's JSON: {e}"))?;
        if flags & 0x02 != 0 {
            if let Some(err) = v.get("error") {
                return Err(format!("the stream ended with an error: {err}"));
            }
            closed = true;
        } else if let Some(end) = v.pointer("/event/end") {
            exit = Some(end.get("exitCode").and_then(Value::as_i64).unwrap_or(0));
        }
        body = &body[5 + len..];
    }
    match (exit, closed) {
        (Some(code), true) => Ok(code),
        _ => Err("the Start stream had no end event or no end-of-stream message".into()),
    }
}

async fn adapter_exec(adapter: &Adapter, handle: &SandboxHandle, request: ExecRequest) -> Res<()> {
    let result = adapter
        .exec(handle, request)
        .await
        .map_err(|e| format!("adapter exec: {e}"))?;
    match result.exit_code {
        0 => Ok(()),
        code => Err(format!("adapter: true exited {code}")),
    }
}

async fn adapter_file(
    adapter: &Adapter,
    handle: &SandboxHandle,
    path: &SandboxPath,
    data: &Bytes,
) -> Res<Vec<u8>> {
    adapter
        .write_file(handle, path, data)
        .await
        .map_err(|e| format!("adapter write_file: {e}"))?;
    adapter
        .read_file(handle, path)
        .await
        .map_err(|e| format!("adapter read_file: {e}"))
}

fn same(what: &str, read: &[u8], data: &[u8]) -> Res<()> {
    if read == data {
        Ok(())
    } else {
        Err(format!(
            "{what}: read {} bytes, not the {} written",
            read.len(),
            data.len()
        ))
    }
}

fn take(found: &mut Vec<(String, Vec<f64>)>, key: &str) -> Res<Vec<f64>> {
    let at = found
        .iter()
        .position(|(k, _)| k == key)
        .ok_or_else(|| format!("the SDK driver printed no {key} samples"))?;
    Ok(found.remove(at).1)
}

fn show(key: &str, samples: &[f64]) {
    let line: Vec<String> = samples.iter().map(|s| format!("{s:.2}")).collect();
    println!(
        "{key}: n {} p50 {:.2} p90 {:.2} min {:.2} max {:.2} | samples: {}",
        samples.len(),
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.0),
        percentile(samples, 1.0),
        line.join(" ")
    );
}

/// Every side's samples.
#[derive(Default)]
struct Samples {
    exec_adapter: Vec<f64>,
    exec_adapter_shell: Vec<f64>,
    exec_raw: Vec<f64>,
    exec_sdk: Vec<f64>,
    file_adapter: Vec<f64>,
    file_raw: Vec<f64>,
    file_raw_nostat: Vec<f64>,
    file_raw_stat: Vec<f64>,
    file_sdk: Vec<f64>,
}

struct Bench<'a> {
    serve: &'a Serve,
    python: &'a str,
    adapter: &'a Adapter,
    handle: &'a SandboxHandle,
    raw: RawEnvd<'a>,
    data: Bytes,
    block: usize,
}

impl Bench<'_> {
    async fn exec_block(&self, side: usize, n: usize, s: &mut Samples) -> Res<()> {
        let argv = || ExecRequest::argv("true", Vec::<String>::new());
        match side {
            0 => {
                for _ in 0..n {
                    let start = Instant::now();
                    adapter_exec(self.adapter, self.handle, argv()).await?;
                    s.exec_adapter.push(ms(start.elapsed()));
                }
                for _ in 0..n {
                    let start = Instant::now();
                    adapter_exec(self.adapter, self.handle, ExecRequest::shell("true")).await?;
                    s.exec_adapter_shell.push(ms(start.elapsed()));
                }
            }
            1 => {
                for _ in 0..n {
                    let start = Instant::now();
                    self.raw.exec_true().await?;
                    s.exec_raw.push(ms(start.elapsed()));
                }
            }
            _ => {
                let id = self.handle.id().as_str();
                let mut found = self.serve.sdk(self.python, "exec", n, id)?;
                s.exec_sdk.extend(take(&mut found, "exec_true")?);
            }
        }
        Ok(())
    }

    async fn file_block(&self, side: usize, n: usize, s: &mut Samples) -> Res<()> {
        match side {
            0 => {
                let path =
                    SandboxPath::new("/tmp/bench-adapter-1mib.bin").map_err(|e| e.to_string())?;
                for _ in 0..n {
                    let start = Instant::now();
                    let read = adapter_file(self.adapter, self.handle, &path, &self.data).await?;
                    s.file_adapter.push(ms(start.elapsed()));
                    same("adapter", &read, &self.data)?;
                }
            }
            1 => {
                for _ in 0..n {
                    let ([wrote, statted, read_in], read) = self
                        .raw
                        .file_round_trip("/tmp/bench-raw-1mib.bin", &self.data)
                        .await?;
                    s.file_raw.push(ms(wrote + statted + read_in));
                    s.file_raw_nostat.push(ms(wrote + read_in));
                    s.file_raw_stat.push(ms(statted));
                    same("raw", &read, &self.data)?;
                }
            }
            _ => {
                let id = self.handle.id().as_str();
                let mut found = self.serve.sdk(self.python, "files", n, id)?;
                s.file_sdk.extend(take(&mut found, "file_1mib")?);
            }
        }
        Ok(())
    }

    async fn warm_up(&self) -> Res<()> {
        let path = SandboxPath::new("/tmp/bench-adapter-1mib.bin").map_err(|e| e.to_string())?;
        for _ in 0..WARMUP {
            adapter_exec(
                self.adapter,
                self.handle,
                ExecRequest::argv("true", Vec::<String>::new()),
            )
            .await?;
            adapter_exec(self.adapter, self.handle, ExecRequest::shell("true")).await?;
            self.raw.exec_true().await?;
            same(
                "adapter",
                &adapter_file(self.adapter, self.handle, &path, &self.data).await?,
                &self.data,
            )?;
            let (_, read) = self
                .raw
                .file_round_trip("/tmp/bench-raw-1mib.bin", &self.data)
                .await?;
            same("raw", &read, &self.data)?;
        }
        Ok(())
    }

    /// `total` samples a side of one figure, in blocks, the first side rotating.
    async fn figure(&self, file: bool, total: usize, s: &mut Samples) -> Res<()> {
        let (mut done, mut first) = (0, 0);
        while done < total {
            let n = self.block.min(total - done);
            for k in 0..3 {
                let side = (first + k) % 3;
                if file {
                    self.file_block(side, n, s).await?;
                } else {
                    self.exec_block(side, n, s).await?;
                }
            }
            done += n;
            first += 1;
        }
        Ok(())
    }
}

async fn run(smoke: bool) -> Res<()> {
    let agent = PathBuf::from(env(ENV_AGENT_BIN)?);
    let image = env(ENV_IMAGE)?;
    let python = env(ENV_PYTHON)?;
    let bin = PathBuf::from(env(ENV_SANDBOX_BIN)?);
    let (exec_n, file_n, block) = if smoke { (3, 3, 3) } else { (200, 100, 20) };
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "service {}, agent {}, image {image}, python {python}",
        bin.display(),
        agent.display()
    );
    println!(
        "samples per side: exec_true {exec_n}, file_1mib {file_n}; sides in turn in blocks of {block}, the first side rotating; {WARMUP} untimed warm-ups a side"
    );
    #[expect(
        clippy::disallowed_methods,
        reason = "the unguarded baseline the adapter is measured against, on loopback"
    )]
    let mut connector = HttpConnector::new();
    // As the adapter's guarded connector does: requests are not held back by Nagle.
    connector.set_nodelay(true);
    let raw_client: Raw = Client::builder(TokioExecutor::new()).build(connector);
    let serve = Serve::start(&raw_client, &bin, &agent, &image).await?;
    println!(
        "sandbox serve: E2B listener {}, namespace {}",
        serve.url(),
        serve.namespace
    );

    let mut config = E2bConfig::new(serve.url(), Secret::new(serve.key.clone()), TEMPLATE);
    config.proxy_url = serve.url();
    config.sandbox_domain = DOMAIN.to_owned();
    // The stand-in listens on loopback; the bench is the operator who allows it.
    config.allow_private_endpoints = true;
    let adapter = E2bProvider::new(config).map_err(|e| e.to_string())?;
    let mut create = CreateRequest::new(TemplateId::new(TEMPLATE).map_err(|e| e.to_string())?);
    create.timeout.idle = IdleTimeout::after(SANDBOX_TIMEOUT).map_err(|e| e.to_string())?;
    let handle = adapter
        .create(create)
        .await
        .map_err(|e| format!("adapter create: {e}"))?;
    let id = handle.id().as_str().to_owned();
    println!("sandbox {id}");

    let result = async {
        // The raw side needs the sandbox's envd token: the control plane's detail has it.
        let detail = Request::get(format!("{}/sandboxes/{id}", serve.url()))
            .header("x-api-key", &serve.key)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let answer = raw_client
            .request(detail)
            .await
            .map_err(|e| e.to_string())?;
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let detail: Value =
            serde_json::from_slice(&body).map_err(|e| format!("sandbox detail: {e}"))?;
        let token = detail
            .get("envdAccessToken")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the sandbox detail has no envdAccessToken: {detail}"))?;
        let header = |s: &str| HeaderValue::from_str(s).map_err(|e| e.to_string());
        let bench = Bench {
            serve: &serve,
            python: &python,
            adapter: &adapter,
            handle: &handle,
            raw: RawEnvd {
                client: &raw_client,
                gateway: serve.e2b.clone(),
                host: header(&format!("{ENVD_PORT}-{id}.{DOMAIN}"))?,
                id: header(&id)?,
                token: header(token)?,
            },
            data: Bytes::from(
                (0..FILE_BYTES)
                    .map(|_| fastrand::u8(..))
                    .collect::<Vec<u8>>(),
            ),
            block,
        };
        bench.warm_up().await?;
        let mut samples = Samples::default();
        let started = Instant::now();
        bench.figure(false, exec_n, &mut samples).await?;
        bench.figure(true, file_n, &mut samples).await?;
        println!("timed part took {:.0} s", started.elapsed().as_secs_f64());
        Ok::<_, String>(samples)
    }
    .await;
    if let Err(e) = adapter.delete(handle.id()).await {
        eprintln!("cleanup: adapter delete {id}: {e}");
    }
    drop(serve);
    let s = result?;

    println!("all figures in ms; p50/p90 nearest rank");
    show("exec_true_adapter", &s.exec_adapter);
    show("exec_true_adapter_shell", &s.exec_adapter_shell);
    show("exec_true_raw", &s.exec_raw);
    show("exec_true_sdk", &s.exec_sdk);
    show("file_1mib_adapter", &s.file_adapter);
    show("file_1mib_raw", &s.file_raw);
    show("file_1mib_raw_nostat", &s.file_raw_nostat);
    show("file_1mib_raw_stat_only", &s.file_raw_stat);
    show("file_1mib_sdk", &s.file_sdk);
    let mut lines = Vec::new();
    let figures: [(&str, &[f64]); 7] = [
        ("exec_true_adapter", &s.exec_adapter),
        ("exec_true_adapter_shell", &s.exec_adapter_shell),
        ("exec_true_raw", &s.exec_raw),
        ("exec_true_sdk", &s.exec_sdk),
        ("file_1mib_adapter", &s.file_adapter),
        ("file_1mib_raw", &s.file_raw),
        ("file_1mib_raw_nostat", &s.file_raw_nostat),
    ];
    let figures = figures
        .into_iter()
        .chain([("file_1mib_sdk", &s.file_sdk[..])]);
    for (key, samples) in figures {
        for (q, name) in [(0.5, "p50"), (0.9, "p90")] {
            lines.push(format!("{key}_{name}_ms={:.2}", percentile(samples, q)));
        }
    }
    let ratios: [(&str, &[f64], &[f64]); 5] = [
        ("exec_true_adapter_over_raw", &s.exec_adapter, &s.exec_raw),
        ("exec_true_sdk_over_adapter", &s.exec_sdk, &s.exec_adapter),
        (
            "exec_true_sdk_over_adapter_shell",
            &s.exec_sdk,
            &s.exec_adapter_shell,
        ),
        ("file_1mib_adapter_over_raw", &s.file_adapter, &s.file_raw),
        ("file_1mib_sdk_over_adapter", &s.file_sdk, &s.file_adapter),
    ];
    for (key, over, under) in ratios {
        for (q, name) in [(0.5, "p50"), (0.9, "p90")] {
            lines.push(format!(
                "{key}_{name}={:.2}",
                percentile(over, q) / percentile(under, q)
            ));
        }
    }
    for line in lines {
        println!("BENCH e2b-provider {line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let smoke =
        std::env::args().any(|a| a == "--smoke") || std::env::var("CI").is_ok_and(|v| v == "true");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(smoke)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

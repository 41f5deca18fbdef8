//! `cargo xtask bench e2b`: time to first command through the E2B-compatible API, with the
//! official Python SDK, against a raw baseline on the Engine API, in one run.
//!
//! The bench starts `sandbox serve` (`SANDBOX_BENCH_SANDBOX_BIN`, which `cargo xtask bench e2b`
//! builds in release first) with `[e2b]` on, on free loopback ports: the Debian image as the
//! `base` template (`SANDBOX_TEST_DEBIAN_IMAGE`), agent mode with the static agent
//! (`SANDBOX_AGENT_BIN`), network `none`, a namespace of its own, the memory store, one tenant.
//! The SDK is the 2.63.0 venv's (`SANDBOX_TEST_E2B_PYTHON`), driven by `e2b_sdk.py` in normal
//! mode (`E2B_API_URL` = `E2B_SANDBOX_URL` = the E2B listener).
//!
//! - `create_first_cmd`: `Sandbox.create()` then the first `commands.run("true")`, together;
//!   `create` the create alone. Each sandbox is killed after, untimed.
//! - `warm_run_true`: `commands.run("true")` on a sandbox that already ran three.
//! - `raw_first_cmd`: the baseline, straight on the Engine API over its unix socket: container
//!   create (the Debian image, the agent bind-mounted read-only as PID 1 listening on the
//!   bridge), start, inspect for the address, `GET /health` until the agent answers
//!   (`raw_first_answer` stops there), then `process.Process/Start` of the SDK's own
//!   `/bin/bash -l -c true` read to its end. The container is removed after, untimed.
//! - `ratio_*`: the SDK's figure over the baseline's, at p50 and p90.
//! - `concurrent_create`: 20 `Sandbox.create()` released together from 20 threads of one
//!   process: each create's own latency. `raw_concurrent_first_cmd`: 20 baseline samples
//!   released together from 20 threads, which tells the engine's share of that figure.
//!
//! The sequential SDK runs and the baseline alternate in blocks of 10, so a change in the
//! (shared) machine's load affects both alike. Every container is removed at the end: the
//! service's namespace and the baseline's label, whatever failed. Prints raw lines, then one
//! `BENCH e2b <key>=<value>` line per figure. `--smoke` (or `CI=true`) takes 3 samples a side
//! and 3 concurrent creates: CI only checks that the bench works.

#![allow(clippy::print_stdout, clippy::print_stderr)] // A bench binary reports on stdout and stderr.

use std::io::{BufRead, BufReader, Read as _};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

type Res<T> = Result<T, String>;

const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";
const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
const ENV_SANDBOX_BIN: &str = "SANDBOX_BENCH_SANDBOX_BIN";
const AGENT_PATH: &str = "/.sandbox/sandbox-agent";
const PORT: u16 = 49983;
const DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// The engine API version the other benches use on this machine's engine (20.10).
const DOCKER_API: &str = "v1.41";
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the service and each baseline agent get to answer.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// Sequential samples per block, SDK and baseline alternating.
const BLOCK: usize = 10;
/// The SDK driver's calls, per python process.
const DRIVER_DEADLINE: Duration = Duration::from_secs(600);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of samples in milliseconds.
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
        format!("{name} is not set: run this suite with `cargo xtask bench e2b`, which builds the service, the agent, the Debian image and the SDK venv and sets it")
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex() -> String {
    let mut seed = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed));
    if read.is_err() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        seed = (now ^ u128::from(std::process::id())).to_le_bytes();
    }
    hex(&seed)
}

/// One HTTP/1.1 answer off a connection: status and body (`Content-Length` or chunked).
struct Answer {
    status: u16,
    body: Vec<u8>,
}

fn read_answer<R: BufRead>(r: &mut R) -> Res<Answer> {
    let io = |e: std::io::Error| format!("reading the answer: {e}");
    let mut line = String::new();
    r.read_line(&mut line).map_err(io)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an HTTP status line: {line:?}"))?;
    let (mut length, mut chunked) = (None, false);
    loop {
        line.clear();
        r.read_line(&mut line).map_err(io)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "content-length" {
                length = v.parse::<usize>().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).map_err(io)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| format!("bad chunk size {line:?}"))?;
            if size == 0 {
                loop {
                    line.clear();
                    r.read_line(&mut line).map_err(io)?;
                    if line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..]).map_err(io)?;
            line.clear();
            r.read_line(&mut line).map_err(io)?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body).map_err(io)?;
    }
    Ok(Answer { status, body })
}

/// One request on a fresh connection to `stream`; its answer.
fn request<S: std::io::Read + std::io::Write>(
    stream: S,
    method: &str,
    host: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> Res<Answer> {
    let mut reader = BufReader::new(stream);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    reader
        .get_mut()
        .write_all(&bytes)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    read_answer(&mut reader)
}

/// One call to the Docker engine over its unix socket.
fn engine(method: &str, path: &str, body: Option<&Value>) -> Res<Answer> {
    let stream = UnixStream::connect(DOCKER_SOCKET).map_err(|e| format!("{DOCKER_SOCKET}: {e}"))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let text = body.map(Value::to_string).unwrap_or_default();
    request(
        stream,
        method,
        "docker",
        &format!("/{DOCKER_API}{path}"),
        "Content-Type: application/json\r\n",
        text.as_bytes(),
    )
}

fn engine_json(method: &str, path: &str, body: Option<&Value>, want: u16) -> Res<Value> {
    let answer = engine(method, path, body)?;
    if answer.status != want {
        return Err(format!(
            "engine {method} {path} answered {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ));
    }
    if answer.body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&answer.body).map_err(|e| format!("engine {method} {path}: {e}"))
}

/// Removes every container carrying `label` (`key=value`); how many.
fn remove_labelled(label: &str) -> usize {
    let filters = json!({"label": [label]}).to_string();
    let query: String = url_encode(&filters);
    let Ok(listed) = engine_json(
        "GET",
        &format!("/containers/json?all=1&filters={query}"),
        None,
        200,
    ) else {
        return 0;
    };
    let ids: Vec<String> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("Id").and_then(Value::as_str).map(str::to_owned))
        .collect();
    for id in &ids {
        if let Err(e) = engine("DELETE", &format!("/containers/{id}?force=1&v=1"), None) {
            eprintln!("cleanup: {id}: {e}");
        }
    }
    ids.len()
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The exit code in a `process.Process/Start` stream's envelopes.
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

fn agent_call(ip: Ipv4Addr, method: &str, path: &str, headers: &str, body: &[u8]) -> Res<Answer> {
    #[expect(
        clippy::disallowed_methods,
        reason = "the baseline container's address on Docker's local bridge, which the bench just read"
    )]
    let stream = TcpStream::connect((ip, PORT)).map_err(|e| format!("connect {ip}:{PORT}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    request(stream, method, &format!("{ip}:{PORT}"), path, headers, body)
}

/// One baseline sample: (first answer, first command) in ms, from before the create.
fn raw_sample(image: &str, agent: &Path, label: &(String, String)) -> Res<(f64, f64)> {
    let spec = json!({
        "Image": image,
        "Entrypoint": [AGENT_PATH],
        "Cmd": ["--listen", format!("0.0.0.0:{PORT}"), "--default-user", "user", "--default-workdir", "/home/user"],
        "Labels": {label.0.clone(): label.1.clone()},
        "HostConfig": {"Binds": [format!("{}:{AGENT_PATH}:ro", agent.display())]},
    });
    let start = Instant::now();
    let created = engine_json("POST", "/containers/create", Some(&spec), 201)?;
    let id = created
        .get("Id")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("container create answered {created}"))?
        .to_owned();
    let timed = (|| {
        engine_json("POST", &format!("/containers/{id}/start"), None, 204)?;
        let inspect = engine_json("GET", &format!("/containers/{id}/json"), None, 200)?;
        let ip: Ipv4Addr = inspect
            .pointer("/NetworkSettings/IPAddress")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .ok_or("the baseline container has no bridge address")?;
        loop {
            match agent_call(ip, "GET", "/health", "", b"") {
                Ok(a) if a.status == 204 || a.status == 200 => break,
                _ if start.elapsed() > READY_DEADLINE => {
                    return Err("the baseline agent never answered /health".to_owned());
                }
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        let first_answer = ms(start.elapsed());
        let json =
            json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]}}).to_string();
        let mut body = vec![0u8];
        body.extend_from_slice(&(json.len() as u32).to_be_bytes());
        body.extend_from_slice(json.as_bytes());
        let answer = agent_call(
            ip,
            "POST",
            "/process.Process/Start",
            "Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n",
            &body,
        )?;
        if answer.status != 200 {
            return Err(format!("Start answered {}", answer.status));
        }
        match end_of_start(&answer.body)? {
            0 => Ok((first_answer, ms(start.elapsed()))),
            code => Err(format!("bash -l -c true exited {code}")),
        }
    })();
    if let Err(e) = engine("DELETE", &format!("/containers/{id}?force=1&v=1"), None) {
        eprintln!("cleanup: {id}: {e}");
    }
    timed
}

/// `n` baseline samples released together from `n` threads: each one's first command, in ms.
fn raw_concurrent(image: &str, agent: &Path, label: &(String, String), n: usize) -> Res<Vec<f64>> {
    let barrier = std::sync::Barrier::new(n);
    let results: Vec<Res<(f64, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    raw_sample(image, agent, label)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a baseline thread panicked".to_owned()))
            })
            .collect()
    });
    results.into_iter().map(|r| r.map(|(_, cmd)| cmd)).collect()
}

/// `sandbox serve` with `[e2b]` on, as a child; stopped and its namespace emptied on drop.
struct Serve {
    child: Child,
    namespace: String,
    dir: PathBuf,
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
        let removed = remove_labelled(&format!("sandbox.namespace={}", self.namespace));
        println!(
            "cleanup: stopped sandbox serve, removed {removed} container(s) of namespace {}",
            self.namespace
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

impl Serve {
    fn start(bin: &Path, agent: &Path, image: &str, run: &str) -> Res<Serve> {
        let namespace = format!("bench-e2b-{run}");
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
base = {image}

[[tenants]]
id = 1
token_sha256 = "{digest}"
# 20 concurrent creates, past the default of 16 live sandboxes.
quotas = {{ max_sandboxes = 64 }}
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
            e2b: format!("http://127.0.0.1:{e2b_port}"),
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
            let up = |port: u16, path: &str| {
                #[expect(
                    clippy::disallowed_methods,
                    reason = "the loopback service the bench spawned"
                )]
                let stream = TcpStream::connect(("127.0.0.1", port));
                stream
                    .map_err(|e| e.to_string())
                    .and_then(|s| request(s, "GET", "127.0.0.1", path, "", b""))
                    .is_ok_and(|a| a.status < 500)
            };
            if up(api_port, "/healthz") && up(e2b_port, "/health") {
                return Ok(serve);
            }
            if start.elapsed() > READY_DEADLINE {
                return Err(format!(
                    "sandbox serve did not answer; its log:\n{}",
                    serve.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// Runs the SDK driver; its samples by key, and its other lines echoed.
    fn sdk(&self, python: &str, mode: &str, n: usize) -> Res<Vec<(String, Vec<f64>)>> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/e2b_sdk.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args([mode, &n.to_string()])
            .env("E2B_API_KEY", &self.key)
            .env("E2B_API_URL", &self.e2b)
            .env("E2B_SANDBOX_URL", &self.e2b)
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
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut s) = child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        if !status.success() {
            return Err(format!(
                "the SDK driver ({mode} {n}) failed ({status}):\n{out}\n{err}\n--- sandbox serve log (tail)\n{}",
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

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn take(found: &mut Vec<(String, Vec<f64>)>, key: &str) -> Res<Vec<f64>> {
    let at = found
        .iter()
        .position(|(k, _)| k == key)
        .ok_or_else(|| format!("the SDK driver printed no {key} samples"))?;
    Ok(found.remove(at).1)
}

fn show(key: &str, samples: &[f64]) {
    let line: Vec<String> = samples.iter().map(|s| format!("{s:.1}")).collect();
    println!(
        "{key}: n {} p50 {:.1} p90 {:.1} min {:.1} max {:.1} | samples: {}",
        samples.len(),
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.0),
        percentile(samples, 1.0),
        line.join(" ")
    );
}

fn run(smoke: bool) -> Res<()> {
    let agent = PathBuf::from(env(ENV_AGENT_BIN)?);
    let image = env(ENV_IMAGE)?;
    let python = env(ENV_PYTHON)?;
    let bin = PathBuf::from(env(ENV_SANDBOX_BIN)?);
    let (runs, warm, concurrent) = if smoke { (3, 3, 3) } else { (30, 30, 20) };
    let run_id = random_hex()[..8].to_owned();
    let label = ("sandbox.bench".to_owned(), format!("e2b-{run_id}"));
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "service {}, agent {}, image {image}, python {python}",
        bin.display(),
        agent.display()
    );
    println!(
        "sequential samples per figure: {runs}, SDK and baseline alternating in blocks of {BLOCK}; warm runs {warm}; concurrent creates {concurrent}"
    );
    let started = Instant::now();
    let result = (|| {
        let serve = Serve::start(&bin, &agent, &image, &run_id)?;
        println!(
            "sandbox serve: E2B listener {}, namespace {}",
            serve.e2b, serve.namespace
        );
        // One of each first, untimed: the image's first container and the SDK's first process.
        raw_sample(&image, &agent, &label)?;
        serve.sdk(&python, "sequential", 1)?;
        let (mut first_cmd, mut create, mut raw_answer, mut raw_cmd) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        while first_cmd.len() < runs {
            let block = BLOCK.min(runs - first_cmd.len());
            let mut found = serve.sdk(&python, "sequential", block)?;
            first_cmd.extend(take(&mut found, "create_first_cmd")?);
            create.extend(take(&mut found, "create")?);
            for _ in 0..block {
                let (answer, cmd) = raw_sample(&image, &agent, &label)?;
                raw_answer.push(answer);
                raw_cmd.push(cmd);
            }
        }
        let warm_true = take(&mut serve.sdk(&python, "warm", warm)?, "warm_run_true")?;
        let concurrent_create = take(
            &mut serve.sdk(&python, "concurrent", concurrent)?,
            "concurrent_create",
        )?;
        let raw_concurrent = raw_concurrent(&image, &agent, &label, concurrent)?;
        Ok::<_, String>((
            first_cmd,
            create,
            raw_answer,
            raw_cmd,
            warm_true,
            concurrent_create,
            raw_concurrent,
        ))
    })();
    let removed = remove_labelled(&format!("{}={}", label.0, label.1));
    println!("cleanup: {removed} baseline container(s) left to remove");
    let (first_cmd, create, raw_answer, raw_cmd, warm_true, concurrent_create, raw_concurrent) =
        result?;
    println!("run took {:.0} s", started.elapsed().as_secs_f64());

    println!("all figures in ms; p50/p90 nearest rank");
    show("create_first_cmd", &first_cmd);
    show("create", &create);
    show("raw_first_answer", &raw_answer);
    show("raw_first_cmd", &raw_cmd);
    show("warm_run_true", &warm_true);
    show("concurrent_create", &concurrent_create);
    show("raw_concurrent_first_cmd", &raw_concurrent);
    let p = |s: &[f64], q| percentile(s, q);
    let lines = [
        format!("create_first_cmd_p50_ms={:.1}", p(&first_cmd, 0.5)),
        format!("create_first_cmd_p90_ms={:.1}", p(&first_cmd, 0.9)),
        format!("create_p50_ms={:.1}", p(&create, 0.5)),
        format!("create_p90_ms={:.1}", p(&create, 0.9)),
        format!("warm_run_true_p50_ms={:.2}", p(&warm_true, 0.5)),
        format!("warm_run_true_p90_ms={:.2}", p(&warm_true, 0.9)),
        format!("raw_first_answer_p50_ms={:.1}", p(&raw_answer, 0.5)),
        format!("raw_first_answer_p90_ms={:.1}", p(&raw_answer, 0.9)),
        format!("raw_first_cmd_p50_ms={:.1}", p(&raw_cmd, 0.5)),
        format!("raw_first_cmd_p90_ms={:.1}", p(&raw_cmd, 0.9)),
        format!(
            "ratio_first_cmd_p50={:.2}",
            p(&first_cmd, 0.5) / p(&raw_cmd, 0.5)
        ),
        format!(
            "ratio_first_cmd_p90={:.2}",
            p(&first_cmd, 0.9) / p(&raw_cmd, 0.9)
        ),
        format!("concurrent_creates={}", concurrent_create.len()),
        format!("concurrent_create_p50_ms={:.1}", p(&concurrent_create, 0.5)),
        format!("concurrent_create_p90_ms={:.1}", p(&concurrent_create, 0.9)),
        format!(
            "raw_concurrent_first_cmd_p50_ms={:.1}",
            p(&raw_concurrent, 0.5)
        ),
        format!(
            "raw_concurrent_first_cmd_p90_ms={:.1}",
            p(&raw_concurrent, 0.9)
        ),
    ];
    for line in lines {
        println!("BENCH e2b {line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let smoke =
        std::env::args().any(|a| a == "--smoke") || std::env::var("CI").is_ok_and(|v| v == "true");
    match run(smoke) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

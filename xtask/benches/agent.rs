//! `cargo xtask bench agent`: the figures of sandbox-agent's closing note, against the static
//! agent as PID 1 of a container of the Debian sandbox image.
//!
//! - `binary_bytes`: the size of the static release build (`SANDBOX_AGENT_BIN`, which `cargo
//!   xtask bench agent` builds first with `cargo xtask agent`'s command).
//! - `sdk_run_true`: `commands.run("true")` through the official E2B Python SDK (the venv of
//!   `SANDBOX_TEST_E2B_PYTHON`, the hashed lock's e2b 2.63.0), timed by the SDK scenario
//!   itself (`tests/sdk/scenario.py`: its `run_as_the_default_user` and `run_output` steps,
//!   then its round trips). The SDK runs `/bin/bash -l -c true` and reads the stream to its end.
//! - `raw_true`: `/bin/true` through `process.Process/Start` from a raw HTTP/1.1 client on one
//!   keep-alive connection (Connect JSON envelopes, chunked answer read to its end-of-stream
//!   message and the exit checked); `raw_bash_true` the same with the SDK's `/bin/bash -l -c
//!   true`, which tells the SDK's own cost from the login shell's.
//! - `exec_true`: the Docker baseline, raw exec create + start + inspect of `/bin/true` over the
//!   engine's unix socket, in the same container; `sdk_vs_exec_ratio_p50` and
//!   `raw_vs_exec_ratio_p50` are agent / exec.
//!
//! No port is published: the bench dials the container's address on Docker's local bridge.
//! Prints raw lines, then one `BENCH agent <key>=<value>` line per figure. `--smoke` (or
//! `CI=true`) takes 3 samples a side: CI only checks that the bench works.

#![allow(clippy::print_stdout, clippy::print_stderr)] // A bench binary reports on stdout and stderr.

use std::io::{BufReader, Write as _};
use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

type Res<T> = Result<T, String>;

const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";
const ENV_IMAGE: &str = "SANDBOX_TEST_DEBIAN_IMAGE";
const ENV_PYTHON: &str = "SANDBOX_TEST_E2B_PYTHON";
const AGENT_DIR: &str = ".sandbox";
const AGENT_PATH: &str = "/.sandbox/sandbox-agent";
const PORT: u16 = 49983;
const DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// The engine API version the docker bench negotiates on this machine's engine (20.10).
const DOCKER_API: &str = "v1.41";
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// SDK round trips per python process.
const SDK_BLOCK: usize = 10;

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
        format!("{name} is not set: run this suite with `cargo xtask bench agent`, which builds the agent, the Debian image and the SDK venv and sets it")
    })
}

fn docker(args: &[&str]) -> Res<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| format!("docker: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The Debian container whose PID 1 is the agent; removed on drop.
struct Container {
    id: String,
    ip: Ipv4Addr,
}

impl Drop for Container {
    fn drop(&mut self) {
        match docker(&["rm", "-f", "-v", &self.id]) {
            Ok(_) => println!("cleanup: removed container {}", short(&self.id)),
            Err(e) => eprintln!("cleanup: {e}"),
        }
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

impl Container {
    fn start(image: &str, bin: &Path) -> Res<Container> {
        let listen = format!("0.0.0.0:{PORT}");
        let id = docker(&[
            "create",
            "--label",
            "sandbox.bench=agent",
            image,
            AGENT_PATH,
            "--listen",
            &listen,
            "--default-user",
            "user",
            "--default-workdir",
            "/home/user",
        ])?;
        let mut c = Container {
            id,
            ip: Ipv4Addr::UNSPECIFIED,
        };
        // `docker cp` of a directory named `.sandbox` makes `/.sandbox` in the container.
        let staging = std::env::temp_dir().join(format!("agent-bench-{}", std::process::id()));
        let dir = staging.join(AGENT_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let copied = std::fs::copy(bin, dir.join("sandbox-agent"))
            .map_err(|e| format!("copy {}: {e}", bin.display()))
            .and_then(|_| docker(&["cp", &dir.display().to_string(), &format!("{}:/", c.id)]));
        let _ = std::fs::remove_dir_all(&staging);
        copied?;
        docker(&["start", &c.id])?;
        let ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &c.id,
        ])?;
        c.ip = ip
            .parse()
            .map_err(|_| format!("no bridge address for the container: {ip:?}"))?;
        Ok(c)
    }
}

/// An answer read off a keep-alive connection: status, headers (lower-cased names), body.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

/// Reads one HTTP/1.1 answer: `Content-Length` or chunked; `to_eof` for a hijacked stream.
fn read_answer<R: std::io::BufRead>(r: &mut R, to_eof: bool) -> Res<Answer> {
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
                // Trailers (none expected), then the blank line.
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
    } else if to_eof {
        r.read_to_end(&mut body).map_err(io)?;
    }
    Ok(Answer { status, body })
}

/// A raw envd client: one keep-alive HTTP/1.1 connection to the agent.
struct RawAgent {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    host: String,
}

impl RawAgent {
    fn connect(ip: Ipv4Addr) -> Res<RawAgent> {
        #[expect(
            clippy::disallowed_methods,
            reason = "the container's address on Docker's local bridge, which the bench just read"
        )]
        let stream =
            TcpStream::connect((ip, PORT)).map_err(|e| format!("connect {ip}:{PORT}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(RawAgent {
            reader: BufReader::new(stream),
            writer,
            host: format!("{ip}:{PORT}"),
        })
    }

    fn health(&mut self) -> Res<u16> {
        let head = format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.writer
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(read_answer(&mut self.reader, false)?.status)
    }

    /// `process.Process/Start` of `cmd args`, read to its end; the exit code.
    fn start(&mut self, cmd: &str, args: &[&str]) -> Res<i64> {
        let json = serde_json::json!({"process": {"cmd": cmd, "args": args}}).to_string();
        let mut body = vec![0u8];
        body.extend_from_slice(&(json.len() as u32).to_be_bytes());
        body.extend_from_slice(json.as_bytes());
        let head = format!(
            "POST /process.Process/Start HTTP/1.1\r\nHost: {}\r\nContent-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(&body);
        self.writer.write_all(&request).map_err(|e| e.to_string())?;
        let answer = read_answer(&mut self.reader, false)?;
        if answer.status != 200 {
            return Err(format!(
                "Start answered {}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        }
        end_of_start(&answer.body)
    }
}

/// The exit code in a Start stream's envelopes; an error when the stream did not end cleanly.
fn end_of_start(mut body: &[u8]) -> Res<i64> {
    let mut exit = None;
    let mut closed = false;
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

/// One HTTP/1.1 call to the Docker engine on a fresh unix connection.
fn engine(method: &str, path: &str, body: Option<&Value>, to_eof: bool) -> Res<Answer> {
    let stream = UnixStream::connect(DOCKER_SOCKET).map_err(|e| format!("{DOCKER_SOCKET}: {e}"))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().map_err(|e| e.to_string())?;
    let text = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} /{DOCKER_API}{path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    );
    writer
        .write_all(head.as_bytes())
        .map_err(|e| e.to_string())?;
    read_answer(&mut BufReader::new(stream), to_eof)
}

/// Raw exec create + start (attached, read to its end) + inspect of `/bin/true`.
fn raw_exec_true(container: &str) -> Res<()> {
    let spec =
        serde_json::json!({"Cmd": ["/bin/true"], "AttachStdout": true, "AttachStderr": true});
    let created = engine(
        "POST",
        &format!("/containers/{container}/exec"),
        Some(&spec),
        false,
    )?;
    let created: Value = serde_json::from_slice(&created.body).map_err(|e| e.to_string())?;
    let id = created
        .get("Id")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("exec create answered {created}"))?
        .to_owned();
    let start = serde_json::json!({"Detach": false, "Tty": false});
    let started = engine("POST", &format!("/exec/{id}/start"), Some(&start), true)?;
    if started.status != 200 {
        return Err(format!("exec start answered {}", started.status));
    }
    // The attached stream ends when the process does; the inspect can still lag a moment.
    for _ in 0..100 {
        let inspect = engine("GET", &format!("/exec/{id}/json"), None, false)?;
        let v: Value = serde_json::from_slice(&inspect.body).map_err(|e| e.to_string())?;
        if v.get("Running") == Some(&Value::Bool(false)) {
            return match v.get("ExitCode").and_then(Value::as_i64) {
                Some(0) => Ok(()),
                other => Err(format!("exec /bin/true exited {other:?}")),
            };
        }
    }
    Err(format!("exec {id} never reported its exit"))
}

/// The SDK scenario's first two steps, then `runs` timed `commands.run("true")`.
fn sdk_round_trips(python: &str, url: &str, runs: usize) -> Res<Vec<f64>> {
    let scenario =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/sandbox-agent/tests/sdk/scenario.py");
    let out = Command::new(python)
        .arg(&scenario)
        .env("E2B_DEBUG", "true")
        .env("E2B_SANDBOX_URL", url)
        .env("SANDBOX_SCENARIO_DIR", "/home/user")
        .env("SANDBOX_SCENARIO_USER", "user")
        .env("SANDBOX_SCENARIO_HOME", "/home/user")
        .env(
            "SANDBOX_SCENARIO_STEPS",
            "run_as_the_default_user,run_output",
        )
        .env("SANDBOX_SCENARIO_ROUND_TRIPS", runs.to_string())
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_ACCESS_TOKEN")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the SDK scenario failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for line in stdout.lines() {
        println!("sdk | {line}");
    }
    let samples = stdout
        .lines()
        .find_map(|l| l.strip_prefix("round trip samples ms: "))
        .ok_or("the scenario printed no round trip samples")?;
    samples
        .split_whitespace()
        .map(|s| s.parse::<f64>().map_err(|e| format!("{s:?}: {e}")))
        .collect()
}

/// One timed call, in milliseconds.
fn time_one<F: FnMut() -> Res<()>>(what: &str, mut f: F) -> Res<f64> {
    let start = Instant::now();
    f().map_err(|e| format!("{what}: {e}"))?;
    Ok(ms(start.elapsed()))
}

fn show(key: &str, samples: &[f64]) {
    let line: Vec<String> = samples.iter().map(|s| format!("{s:.2}")).collect();
    println!(
        "{key}: p50 {:.2} p90 {:.2} min {:.2} max {:.2} | samples: {}",
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.0),
        percentile(samples, 1.0),
        line.join(" ")
    );
}

fn run(smoke: bool) -> Res<()> {
    let bin = PathBuf::from(env(ENV_AGENT_BIN)?);
    let image = env(ENV_IMAGE)?;
    let python = env(ENV_PYTHON)?;
    let bytes = std::fs::metadata(&bin)
        .map_err(|e| format!("{}: {e}", bin.display()))?
        .len();
    let (warmup, runs) = if smoke { (1, 3) } else { (5, 100) };
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!("agent {} ({bytes} bytes), image {image}", bin.display());
    println!(
        "samples per figure: {runs} (after {warmup} warm-up), interleaved in blocks of {SDK_BLOCK}"
    );

    let container = Container::start(&image, &bin)?;
    println!(
        "container {} at {}:{PORT} (bridge, no published port)",
        short(&container.id),
        container.ip
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut raw = loop {
        match RawAgent::connect(container.ip).and_then(|mut a| a.health().map(|s| (a, s))) {
            Ok((a, 204)) => break a,
            Ok((_, s)) if Instant::now() > deadline => return Err(format!("/health answered {s}")),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the agent never answered: {e}"));
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };

    let check = |code: i64| {
        if code == 0 {
            Ok(())
        } else {
            Err(format!("exit {code}"))
        }
    };
    let url = format!("http://{}:{PORT}", container.ip);
    let mut raw_sample = |cmd: &str, args: &[&str]| {
        time_one(&format!("raw {cmd} {args:?}"), || {
            raw.start(cmd, args).and_then(check)
        })
    };
    for _ in 0..warmup {
        raw_sample("/bin/true", &[])?;
        raw_sample("/bin/bash", &["-l", "-c", "true"])?;
        time_one("exec /bin/true (warm-up)", || raw_exec_true(&container.id))?;
    }
    // Interleaved, so a change in the machine's load (it is shared) affects every figure
    // alike: blocks of SDK round trips (one python process each, whose scenario steps warm it
    // up), each followed by as many rounds of raw true, raw bash and exec.
    let (mut sdk, mut raw_true, mut raw_bash, mut exec_true) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    while sdk.len() < runs {
        let block = SDK_BLOCK.min(runs - sdk.len());
        sdk.extend(sdk_round_trips(&python, &url, block)?);
        for _ in 0..block {
            raw_true.push(raw_sample("/bin/true", &[])?);
            raw_bash.push(raw_sample("/bin/bash", &["-l", "-c", "true"])?);
            exec_true.push(time_one("exec /bin/true", || raw_exec_true(&container.id))?);
        }
    }
    drop(container);

    println!("all figures in ms; p50/p90 nearest rank");
    show("sdk_run_true", &sdk);
    show("raw_true", &raw_true);
    show("raw_bash_true", &raw_bash);
    show("exec_true", &exec_true);
    let p = |s: &[f64], q| percentile(s, q);
    let exec50 = p(&exec_true, 0.5);
    let lines = [
        format!("binary_bytes={bytes}"),
        format!("sdk_run_true_p50_ms={:.2}", p(&sdk, 0.5)),
        format!("sdk_run_true_p90_ms={:.2}", p(&sdk, 0.9)),
        format!("raw_true_p50_ms={:.2}", p(&raw_true, 0.5)),
        format!("raw_true_p90_ms={:.2}", p(&raw_true, 0.9)),
        format!("raw_bash_true_p50_ms={:.2}", p(&raw_bash, 0.5)),
        format!("raw_bash_true_p90_ms={:.2}", p(&raw_bash, 0.9)),
        format!("exec_true_p50_ms={exec50:.2}"),
        format!("exec_true_p90_ms={:.2}", p(&exec_true, 0.9)),
        format!("sdk_vs_exec_ratio_p50={:.2}", p(&sdk, 0.5) / exec50),
        format!("raw_vs_exec_ratio_p50={:.2}", p(&raw_true, 0.5) / exec50),
    ];
    for line in lines {
        println!("BENCH agent {line}");
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

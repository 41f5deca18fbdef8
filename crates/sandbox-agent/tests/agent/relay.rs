//! `sandbox-agent relay` as the binary runs it: real pipes on its stdin and stdout, the agent
//! itself (also the binary) on a unix socket at the other end.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

/// The agent serving only on `socket`; killed on drop.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent_on(socket: &Path) -> Agent {
    let child = Command::new(BIN)
        .args(["--listen-unix", socket.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent = Agent(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "the agent never bound its socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    agent
}

#[test]
fn the_relay_carries_a_request_to_the_agent_and_exits_0_when_it_closes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let _agent = agent_on(&socket);
    let mut relay = Command::new(BIN)
        .args(["relay", socket.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = relay.stdin.take().unwrap();
    stdin
        .write_all(
            b"GET /sandbox-agent/version HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    // Stdin stays open: the agent's close of the connection alone ends the relay.
    let mut answer = String::new();
    relay
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut answer)
        .unwrap();
    let status = relay.wait().unwrap();
    drop(stdin);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let version = format!(
        "{{\"agent\":\"{}\",\"envd\":\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        sandbox_agent::version::ENVD_VERSION
    );
    assert!(answer.ends_with(&version), "{answer}");
    let mut stderr = String::new();
    relay
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    assert_eq!(stderr, "", "stderr carries only failures");
}

#[test]
fn the_end_of_stdin_half_closes_and_the_relay_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let _agent = agent_on(&socket);
    let mut relay = Command::new(BIN)
        .args(["relay", socket.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A keep-alive request and its answer; then the end of stdin: the agent sees the end of
    // the connection, closes it, and the relay ends.
    let mut stdin = relay.stdin.take().unwrap();
    stdin
        .write_all(b"GET /health HTTP/1.1\r\nHost: agent\r\n\r\n")
        .unwrap();
    let mut stdout = relay.stdout.take().unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "the answer was cut: {head:?}"
        );
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 204"), "{head:?}");
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    assert!(relay.wait().unwrap().success());
}

#[test]
fn a_relay_that_cannot_connect_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["relay", dir.path().join("missing.sock").to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.sock"), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

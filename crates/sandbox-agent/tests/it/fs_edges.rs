//! `POST /files` on real filesystems that refuse what the agent is asked to do, not only the
//! error mappings' unit tests:
//!
//! - a `ramfs` keeps no `user.*` extended attributes (`setxattr` is `EOPNOTSUPP`): an upload
//!   with `X-Metadata-*` answers 400 saying so, before any content is written; a file the
//!   upload created is removed again, an existing one keeps its content;
//! - a full `tmpfs` (`size=256k`): an upload larger than what is free answers 507 `not enough
//!   disk space available`. What fit stays in the file, a prefix of the body: envd opens the
//!   file with `O_TRUNC`, copies until `ENOSPC` and answers 507 without removing it, and the
//!   agent does the same, so a client sees the same filesystem after a failed upload to either.
//!
//! The agent runs as this test's child inside a mount namespace of its own (`unshare -m` from
//! util-linux, with private propagation), where the shell that execs it first mounts both
//! filesystems under the temporary home: nothing is mounted on the host, and the mounts go
//! with the agent. The test reads the agent's view of the files through `/proc/<pid>/root`,
//! which resolves paths in the agent's mount namespace.
//!
//! Mounting needs root (CI runs the pipeline as root): run by the agent filesystems stage of `cargo xtask
//! test`; as any other user the test fails saying so, never skips.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills and reaps the agent (its mount namespace, and both mounts, go with it), then removes
/// the temporary home.
struct Agent {
    child: Child,
    port: u16,
    home: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A finished HTTP exchange.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Agent {
    fn start() -> Agent {
        let uid = current_uid();
        assert_eq!(
            uid, "0",
            "fs_edges mounts a ramfs and a tmpfs in a mount namespace of its own, which needs \
             root (the pipeline runs it as root); this test runs as uid {uid}"
        );
        let home = tempfile::tempdir().unwrap();
        for dir in ["ramfs", "tiny"] {
            std::fs::create_dir(home.path().join(dir)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // `mount` and the agent see the same namespace: `unshare` makes it, `sh` mounts, then
        // becomes the agent (so the child's pid is the agent's).
        let script = r#"set -e
mount -t ramfs -o mode=0755 fs-edges-ramfs "$1/ramfs"
mount -t tmpfs -o size=256k,mode=0755 fs-edges-tmpfs "$1/tiny"
shift
exec "$@""#;
        let log = std::fs::File::create(home.path().join("agent.log")).unwrap();
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(home.path())
            .arg(env!("CARGO_BIN_EXE_sandbox-agent"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--default-user")
            .arg("root")
            .arg("--default-workdir")
            .arg(home.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut agent = Agent { child, port, home };
        agent.wait_healthy();
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.home.path().join("agent.log")).unwrap_or_default()
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the agent (or its mounts) failed ({status}):\n{}",
                    self.log()
                );
            }
            if self
                .request("GET", "/health", &[], &[])
                .is_ok_and(|a| a.status == 204)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agent never answered /health:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A path of the agent's temporary home, as the agent names it.
    fn path(&self, rel: &str) -> PathBuf {
        self.home.path().join(rel)
    }

    /// The same path as this test reaches it: through the agent's root, in its namespace.
    fn seen(&self, rel: &str) -> PathBuf {
        let inside = self.path(rel);
        Path::new(&format!("/proc/{}/root", self.child.id()))
            .join(inside.strip_prefix("/").unwrap())
    }

    /// `POST /files?path=<abs>` with an octet-stream body and `headers`.
    fn upload(&self, rel: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
        let target = format!("/files?path={}", self.path(rel).display());
        let mut all = vec![("Content-Type", "application/octet-stream")];
        all.extend_from_slice(headers);
        self.request("POST", &target, &all, body).unwrap()
    }

    /// One HTTP/1.1 exchange on a fresh connection (`Connection: close`). The body is written
    /// on a thread of its own: the agent may answer (507) before it has read it all.
    fn request(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Answer> {
        #[expect(
            clippy::disallowed_methods,
            reason = "the agent this test started, on loopback"
        )]
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut head = format!(
            "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        let mut writer = stream.try_clone()?;
        let body = body.to_vec();
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(&body);
        });
        let mut raw = Vec::new();
        let read = stream.read_to_end(&mut raw);
        let _ = sender.join();
        // A reset after a complete answer (the agent closed with body bytes unread) is fine.
        if raw.is_empty() {
            read?;
        }
        Ok(parse_answer(&raw))
    }
}

/// The uid of this process, from `/proc/self/status` (no `unsafe` here: tests use no libc).
fn current_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap_or("unknown")
        .to_owned()
}

/// Status and body of a raw HTTP/1.1 answer (a chunked body decoded).
fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer head in {text:?}"));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_owned()
    };
    Answer { status, body }
}

/// envd's error body: `{"code": <status>, "message": "..."}`.
fn error_message(answer: &Answer) -> String {
    let v: serde_json::Value = serde_json::from_str(answer.body.trim())
        .unwrap_or_else(|e| panic!("not an envd error body ({e}): {answer:?}"));
    assert_eq!(v["code"], answer.status, "{answer:?}");
    v["message"].as_str().unwrap().to_owned()
}

#[test]
#[ignore = "needs root to mount a ramfs and a tmpfs in a mount namespace (the agent filesystems stage)"]
fn metadata_on_a_filesystem_without_user_xattrs_is_400_and_writes_nothing() {
    let agent = Agent::start();

    // Without metadata, a ramfs takes the upload: the 400 below is about the attributes.
    let plain = agent.upload("ramfs/plain.txt", &[], b"no metadata");
    assert_eq!(plain.status, 200, "{plain:?}\n{}", agent.log());
    assert_eq!(
        std::fs::read(agent.seen("ramfs/plain.txt")).unwrap(),
        b"no metadata"
    );

    let refused = agent.upload(
        "ramfs/new.txt",
        &[("X-Metadata-Purpose", "edge-test")],
        b"must not be written",
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    let message = error_message(&refused);
    assert!(
        message.contains("does not support extended attributes")
            && message.contains(&agent.path("ramfs/new.txt").display().to_string()),
        "{message}"
    );
    // The file the upload created was removed again.
    assert!(
        !agent.seen("ramfs/new.txt").exists(),
        "a refused upload left {}",
        agent.path("ramfs/new.txt").display()
    );

    // An existing file is refused before it is truncated: its content stays.
    let over = agent.upload(
        "ramfs/plain.txt",
        &[("X-Metadata-Purpose", "edge-test")],
        b"replacement",
    );
    assert_eq!(over.status, 400, "{over:?}");
    assert_eq!(
        std::fs::read(agent.seen("ramfs/plain.txt")).unwrap(),
        b"no metadata"
    );
}

#[test]
#[ignore = "needs root to mount a ramfs and a tmpfs in a mount namespace (the agent filesystems stage)"]
fn a_write_to_a_full_filesystem_is_507() {
    let agent = Agent::start();
    // What fits is written: the 507 below is about space.
    let small = agent.upload("tiny/small.bin", &[], &[7u8; 4096]);
    assert_eq!(small.status, 200, "{small:?}\n{}", agent.log());

    // 1 MiB into the 256 KiB filesystem; no two 4 KiB blocks alike, so a prefix is checkable.
    let body: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i / 4096 + i % 251) as u8)
        .collect();
    let full = agent.upload("tiny/big.bin", &[], &body);
    assert_eq!(full.status, 507, "{full:?}\n{}", agent.log());
    let message = error_message(&full);
    assert!(
        message.contains("not enough disk space available"),
        "{message}"
    );

    // What is left, as envd leaves it: the part that fit, a prefix of the body.
    let left = std::fs::read(agent.seen("tiny/big.bin")).unwrap();
    assert!(
        left.len() < body.len() && left.len() <= 256 * 1024,
        "{} bytes left of {}",
        left.len(),
        body.len()
    );
    assert_eq!(left[..], body[..left.len()], "what is left is not a prefix");
    println!(
        "507: {message:?}; {} of {} bytes left in the file",
        left.len(),
        body.len()
    );
    // The earlier file is untouched.
    assert_eq!(
        std::fs::read(agent.seen("tiny/small.bin")).unwrap(),
        vec![7u8; 4096]
    );

    // Multipart answers the same.
    let boundary = "fs-edges-boundary";
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"form.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(&body);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let target = format!("/files?path={}", agent.path("tiny/form.bin").display());
    let multipart = agent
        .request("POST", &target, &[("Content-Type", &content_type)], &form)
        .unwrap();
    assert_eq!(multipart.status, 507, "{multipart:?}");
    assert!(error_message(&multipart).contains("not enough disk space available"));
}

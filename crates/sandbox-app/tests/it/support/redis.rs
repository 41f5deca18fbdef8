//! A `redis-server` the test owns: on a free loopback port, its append-only file fsynced on
//! every write in the test's directory (so a kill and restart keeps the data, as a production
//! Redis with persistence would), stoppable and restartable on the same port (Debian's
//! `redis-server`, installed by `cargo xtask test`).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const READY_DEADLINE: Duration = Duration::from_secs(20);

pub(crate) struct RedisServer {
    pub(crate) port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    pub(crate) fn start() -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("sbx-redis-{port}-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = RedisServer {
            port,
            dir,
            child: None,
        };
        server.restart();
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port and waits until it answers PING.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::File::create(self.dir.join("redis.log")).unwrap();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("redis-server (Debian package redis-server; cargo xtask test installs it)");
        self.child = Some(child);
        let start = Instant::now();
        loop {
            let pong = Command::new("redis-cli")
                .args(["-p", &self.port.to_string(), "ping"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
                .unwrap_or(false);
            if pong {
                return;
            }
            assert!(
                start.elapsed() < READY_DEADLINE,
                "redis-server did not come up: {}",
                std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (SIGKILL; the append-only file keeps every acknowledged write).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A `redis-cli` command's output.
    pub(crate) fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

//! PID 1 duties, on the binary: orphans are reaped (and are not when the test flag turns the
//! reaper off), SIGTERM stops the process groups before the agent exits, and started processes
//! do not share the agent's stdout or stderr.
//!
//! The agent runs as this test's child. It makes itself the subreaper of its descendants, so
//! the orphans of its processes are reparented to it exactly as they would be to a PID 1.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_envd::process::ProcessSelector;
use sandbox_transport::envd::{CallOptions, EnvdConfig};

use crate::{Accounts, BOTH, TOKEN, client_with, drain, pid_of, sh};

struct AgentProcess {
    child: Child,
    addr: SocketAddr,
    _accounts: Accounts,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    fn start(flags: &[&str]) -> AgentProcess {
        let accounts = Accounts::new();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
            .args(["--listen", "127.0.0.1:0", "--default-user", "user"])
            .arg("--passwd")
            .arg(&accounts.files.passwd)
            .arg("--group")
            .arg(&accounts.files.group)
            .args(flags)
            // The token from the environment, as an operator would pass it out of `ps`.
            .env(sandbox_agent::config::ACCESS_TOKEN_ENV, TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the agent says where it listens")
                .unwrap();
            if let Some(rest) = line.split(" listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().parse().unwrap();
            }
        };
        // Keep draining the log so the agent never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        AgentProcess {
            child,
            addr,
            _accounts: accounts,
        }
    }

    fn client(&self) -> sandbox_transport::envd::EnvdClient<sandbox_transport::GuardedConnector> {
        client_with(
            EnvdConfig::new(&format!("http://{}", self.addr))
                .unwrap()
                .with_http(BOTH[0])
                .with_access_token(sandbox_core::Secret::new(TOKEN)),
        )
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `(pid, state, ppid)` of every process, read from `/proc/*/stat`.
fn processes() -> Vec<(u32, char, u32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        out.push((pid, state, ppid));
    }
    out
}

fn zombies_of(parent: u32) -> usize {
    processes()
        .iter()
        .filter(|(_, state, ppid)| *ppid == parent && *state == 'Z')
        .count()
}

/// Runs `count` commands that each leave an orphan behind, ten at a time.
async fn run_orphan_makers(agent: &AgentProcess, count: usize) {
    const PARALLEL: usize = 10;
    let workers: Vec<_> = (0..PARALLEL)
        .map(|w| {
            let client = agent.client();
            let mine = (w..count).step_by(PARALLEL).count();
            tokio::spawn(async move {
                for _ in 0..mine {
                    let mut stream = client
                        .start(&sh("sleep 0.05 & exit 0"), CallOptions::new())
                        .await
                        .unwrap();
                    pid_of(&mut stream).await;
                    assert_eq!(drain(&mut stream).await.end.unwrap().exit_code, 0);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
}

#[tokio::test]
async fn orphans_are_reaped_and_stay_zombies_without_the_reaper() {
    const COMMANDS: usize = 200;
    let agent = AgentProcess::start(&[]);
    run_orphan_makers(&agent, COMMANDS).await;
    // Every `sleep 0.05` has ended by now; each was reaped as it did.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while zombies_of(agent.pid()) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} zombies remain",
            zombies_of(agent.pid())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(agent);

    // The same with the reaper limited to the agent's own children: the orphans stay zombies.
    let agent = AgentProcess::start(&["--no-reap-orphans"]);
    run_orphan_makers(&agent, 20).await;
    // Each orphan becomes a zombie as its `sleep 0.05` ends (later on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    while zombies_of(agent.pid()) < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        zombies_of(agent.pid()),
        20,
        "every adopted orphan is left a zombie"
    );
}

#[tokio::test]
async fn sigterm_stops_every_process_group_within_the_grace() {
    let agent = AgentProcess::start(&["--shutdown-grace-ms", "1500"]);
    let client = agent.client();
    let mut polite = client
        .start(&sh("sleep 30"), CallOptions::new())
        .await
        .unwrap();
    let polite = pid_of(&mut polite).await;
    // This one ignores SIGTERM (and so does its child): only the SIGKILL after the grace ends it.
    let mut stubborn = client
        .start(
            &sh("trap '' TERM; echo ready; sleep 30; true"),
            CallOptions::new(),
        )
        .await
        .unwrap();
    let stubborn_pid = pid_of(&mut stubborn).await;
    // The trap must be set before the agent is stopped.
    let mut ready = Vec::new();
    while !ready.ends_with(b"ready\n") {
        if let sandbox_envd::process::process_event::Event::Data(d) =
            crate::next_event(&mut stubborn).await
            && let Some(sandbox_envd::process::process_event::data_event::Output::Stdout(b)) =
                d.output
        {
            ready.extend(b);
        }
    }
    let stubborn = stubborn_pid;
    let listed = client.list(CallOptions::new()).await.unwrap();
    assert_eq!(listed.len(), 2);

    let began = Instant::now();
    let agent_pid = rustix::process::Pid::from_raw(agent.pid() as i32).unwrap();
    rustix::process::kill_process(agent_pid, rustix::process::Signal::TERM).unwrap();
    let mut agent = agent;
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the agent did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "the grace was not waited: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Both are gone, reaped by the agent before it exited.
    let alive = |pid: u32| processes().iter().any(|(p, _, _)| *p == pid);
    assert!(!alive(polite) && !alive(stubborn));
}

#[tokio::test]
async fn processes_do_not_share_the_agents_stdout_or_stderr() {
    let agent = AgentProcess::start(&[]);
    let client = agent.client();
    let mut stream = client
        .start(
            &sh("readlink /proc/self/fd/1 /proc/self/fd/2"),
            CallOptions::new(),
        )
        .await
        .unwrap();
    pid_of(&mut stream).await;
    let out = String::from_utf8(drain(&mut stream).await.stdout).unwrap();
    let agents_stderr = std::fs::read_link(format!("/proc/{}/fd/2", agent.pid())).unwrap();
    for line in out.lines() {
        assert_ne!(line, agents_stderr.to_str().unwrap(), "{out}");
        assert!(line.starts_with("pipe:"), "{out}");
    }
    // And the agent's own SendSignal path works on the binary too.
    let mut sleeper = client
        .start(&sh("sleep 30"), CallOptions::new())
        .await
        .unwrap();
    let pid = pid_of(&mut sleeper).await;
    client
        .send_signal(
            ProcessSelector::pid(pid),
            sandbox_envd::process::Signal::Sigkill,
            CallOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        drain(&mut sleeper).await.end.unwrap().status,
        "signal: killed"
    );
}

/// The agent's resident memory, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test]
async fn floods_and_stalled_readers_cannot_grow_the_agents_memory() {
    const MIB: u64 = 1024 * 1024;
    let agent = AgentProcess::start(&[
        "--output-ring-bytes",
        "1048576",
        "--stdin-buffer-bytes",
        "1048576",
    ]);
    let client = agent.client();
    // Warm up (the first requests allocate the runtime's and hyper's buffers).
    for _ in 0..3 {
        let mut s = client
            .start(&sh("echo warm"), CallOptions::new())
            .await
            .unwrap();
        pid_of(&mut s).await;
        drain(&mut s).await;
    }
    let baseline = rss_bytes(agent.pid());

    // 1. A process writing 500 MB to a client that never reads its stream.
    let mut stalled = client
        .start(&sh("head -c 500000000 /dev/zero"), CallOptions::new())
        .await
        .unwrap();
    let producer = pid_of(&mut stalled).await;
    // 2. Input flooding a process that never reads it, until the agent refuses more.
    let mut deaf = client
        .start(&sh("sleep 60"), CallOptions::new())
        .await
        .unwrap();
    let deaf_pid = pid_of(&mut deaf).await;
    let chunk = vec![b'x'; 64 * 1024];
    let mut refused = false;
    for _ in 0..200 {
        let sent = client
            .send_input(
                ProcessSelector::pid(deaf_pid),
                sandbox_envd::process::ProcessInput::stdin(chunk.clone()),
                CallOptions::new(),
            )
            .await;
        if let Err(e) = sent {
            assert_eq!(e.kind(), sandbox_core::ErrorKind::Capacity, "{e}");
            refused = true;
            break;
        }
    }
    assert!(refused, "12.5 MiB of input were all accepted");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss_bytes(agent.pid()).saturating_sub(baseline);
    // The ring (1 MiB), the input buffer (1 MiB), a few stream messages and socket buffers.
    assert!(grown < 16 * MIB, "the agent grew by {} MiB", grown / MIB);
    // The producer is held by back-pressure, not finished: most of its output is unread.
    assert!(processes().iter().any(|(p, _, _)| *p == producer));
    drop(stalled);
    drop(deaf);
}

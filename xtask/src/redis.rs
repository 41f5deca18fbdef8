//! Local Redis servers for tests: a standalone server and a three-primary Redis Cluster, each
//! `redis-server` a child of this process on loopback ports picked at start, with no persistence
//! and its working files in a temporary directory.
//!
//! Tests find them through the `SANDBOX_TEST_REDIS_*` variables below, which xtask sets on the
//! test commands it runs; nothing here listens on, or talks to, anything but 127.0.0.1.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::process::{self, Output};

/// `redis://127.0.0.1:<port>`, the standalone server.
pub const ENV_URL: &str = "SANDBOX_TEST_REDIS_URL";
/// `127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>`, the cluster's primaries (seed nodes).
pub const ENV_CLUSTER_NODES: &str = "SANDBOX_TEST_REDIS_CLUSTER_NODES";

/// The only address the servers bind and the clients dial.
pub const LOOPBACK: &str = "127.0.0.1";
/// Primaries of the test cluster: the fewest Redis Cluster accepts without replicas.
pub const CLUSTER_PRIMARIES: usize = 3;

/// A server that has not answered by then is not going to; cold starts take milliseconds.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// One `redis-cli` call against a local server.
const CLI_DEADLINE: Duration = Duration::from_secs(10);
/// One readiness probe: a local server answers in milliseconds, and a socket that accepts but
/// never answers (another program on the port) must not eat the start deadline.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);
/// `redis-cli --cluster create` assigns slots and waits for the nodes to agree.
const CLUSTER_CREATE_DEADLINE: Duration = Duration::from_secs(60);
/// After `create`, gossip must bring every node to `cluster_state:ok`.
const CLUSTER_READY_DEADLINE: Duration = Duration::from_secs(60);
/// Without persistence a SIGTERM'd server exits at once; the rest is margin for a loaded host.
const STOP_DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(100);
/// Picking a free port and binding it are two steps; another process may take the port in
/// between, and then the start is retried on fresh ports.
const PORT_ATTEMPTS: usize = 5;
/// The failure `redis-server` logs when a port was taken in that window.
const ADDRESS_IN_USE: &str = "Address already in use";
/// How many lines of a server's log an error quotes.
const ERROR_LOG_TAIL: usize = 20;
const CLUSTER_NODE_TIMEOUT_MS: &str = "5000";

/// One `redis-server` child.
#[derive(Debug)]
pub struct Node {
    /// `None` once stopped.
    child: Option<Child>,
    pid: u32,
    port: u16,
    /// The cluster bus port of a cluster node.
    bus: Option<u16>,
    log: PathBuf,
}

impl Node {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("{LOOPBACK}:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn bus_port(&self) -> Option<u16> {
        self.bus
    }

    /// Where the server's stdout and stderr go (outside the temporary directory, so it outlives
    /// the server for the failure report).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// SIGTERM, then SIGKILL after a deadline. Idempotent.
    pub fn stop(&mut self) -> Result<(), String> {
        match self.child.take() {
            Some(mut child) => process::terminate(&mut child, STOP_DEADLINE)
                .map_err(|e| format!("redis-server on {}: {e}", self.addr())),
            None => Ok(()),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A panic between start and stop must not leave a server running.
        if let Some(mut child) = self.child.take() {
            process::kill_tree(&mut child);
        }
    }
}

/// A temporary directory, removed by [`ScratchDir::remove`] or on drop.
#[derive(Debug)]
struct ScratchDir(Option<PathBuf>);

impl ScratchDir {
    fn create(kind: &str) -> Result<Self, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("xtask-{kind}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self(Some(dir)))
    }

    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    fn remove(&mut self) -> Result<(), String> {
        match self.0.take() {
            Some(dir) => std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("cannot remove {}: {e}", dir.display())),
            None => Ok(()),
        }
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// One standalone server.
#[derive(Debug)]
pub struct Standalone {
    node: Node,
    dir: ScratchDir,
}

impl Standalone {
    /// Starts a server and waits until it answers; its log is [`Standalone::log`].
    pub fn start(logs_dir: &Path) -> Result<Self, String> {
        let dir = ScratchDir::create("redis")?;
        let node = start_node(dir.path(), &Self::log(logs_dir), false)?;
        Ok(Self { node, dir })
    }

    /// Where the server started with `logs_dir` logs (known before it starts, so a failed start
    /// can still be shown).
    pub fn log(logs_dir: &Path) -> PathBuf {
        logs_dir.join("redis.log")
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Its working directory (removed by [`Standalone::stop`]).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The value of [`ENV_URL`].
    pub fn url(&self) -> String {
        format!("redis://{}", self.node.addr())
    }

    /// Stops the server and removes its directory; returns what could not be undone.
    pub fn stop(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        problems.extend(self.node.stop().err());
        // The directory goes only once the server that writes there is gone.
        problems.extend(self.dir.remove().err());
        problems
    }
}

/// A Redis Cluster of [`CLUSTER_PRIMARIES`] primaries and no replicas.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<Node>,
    dir: ScratchDir,
}

impl Cluster {
    /// Starts the nodes, joins them with `redis-cli --cluster create` and waits until every node
    /// reports `cluster_state:ok` and knows all the others. Logs are [`Cluster::logs`].
    pub fn start(logs_dir: &Path) -> Result<Self, String> {
        let mut cluster = Self {
            nodes: Vec::new(),
            dir: ScratchDir::create("redis-cluster")?,
        };
        for log in Self::logs(logs_dir) {
            // On error `cluster` drops here, taking the nodes already started with it.
            let node = start_node(cluster.dir.path(), &log, true)?;
            cluster.nodes.push(node);
        }
        cluster.create()?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// Where the nodes started with `logs_dir` log, one file per node.
    pub fn logs(logs_dir: &Path) -> Vec<PathBuf> {
        (1..=CLUSTER_PRIMARIES)
            .map(|n| logs_dir.join(format!("redis-cluster-{n}.log")))
            .collect()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Its working directory, holding the nodes' `nodes-<port>.conf` (removed by
    /// [`Cluster::stop`]).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The value of [`ENV_CLUSTER_NODES`].
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(Node::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    fn create(&self) -> Result<(), String> {
        let mut cmd = redis_cli(["--cluster", "create"]);
        cmd.args(self.nodes.iter().map(Node::addr)).args([
            "--cluster-replicas",
            "0",
            "--cluster-yes",
        ]);
        let out = process::run_with_deadline(&mut cmd, CLUSTER_CREATE_DEADLINE, Output::Capture)?;
        // redis-cli reports some refusals ("[ERR] Node ... is not empty") on stdout, status 1.
        out.check().map_err(|e| {
            format!(
                "{e}\n{}\n{}",
                process::tail_lines(out.stdout.trim_end(), ERROR_LOG_TAIL),
                self.log_tails()
            )
        })
    }

    fn wait_ready(&self) -> Result<(), String> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            let mut ready = true;
            for node in &self.nodes {
                let info = cli_query_within(node.port, &["cluster", "info"], PROBE_DEADLINE)
                    .unwrap_or_else(|e| e);
                let ok = info_field(&info, "cluster_state") == Some("ok")
                    && info_field(&info, "cluster_known_nodes")
                        == Some(CLUSTER_PRIMARIES.to_string().as_str());
                if !ok {
                    last = format!("{}: {}", node.addr(), info.trim());
                    ready = false;
                    break;
                }
            }
            if ready {
                return Ok(());
            }
            if start.elapsed() >= CLUSTER_READY_DEADLINE {
                return Err(format!(
                    "the Redis Cluster did not reach cluster_state:ok with {CLUSTER_PRIMARIES} \
                     known nodes within {}s; last CLUSTER INFO from {last}\n{}",
                    CLUSTER_READY_DEADLINE.as_secs(),
                    self.log_tails()
                ));
            }
            thread::sleep(POLL);
        }
    }

    fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(log_tail)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops every node and removes the directory; returns what could not be undone.
    pub fn stop(&mut self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.stop().err())
            .collect();
        problems.extend(self.dir.remove().err());
        problems
    }
}

/// `redis-cli -h 127.0.0.1 <args>`. The host is explicit so no `REDISCLI_*` default or
/// configuration can point it elsewhere.
fn redis_cli<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = process::command("redis-cli", ["-h", LOOPBACK]);
    cmd.args(args).env_remove("REDISCLI_AUTH");
    cmd
}

/// `redis-cli -p <port> <args>`: its stdout, or why it failed.
pub fn cli_query(port: u16, args: &[&str]) -> Result<String, String> {
    cli_query_within(port, args, CLI_DEADLINE)
}

fn cli_query_within(port: u16, args: &[&str], deadline: Duration) -> Result<String, String> {
    let mut cmd = redis_cli(["-p", port.to_string().as_str()]);
    cmd.args(args);
    let out = process::run_with_deadline(&mut cmd, deadline, Output::Capture)?;
    out.check()?;
    Ok(out.stdout)
}

/// The value of `field` in an `INFO` / `CLUSTER INFO` answer (`field:value` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.trim_end_matches('\r')
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// A port nobody listens on right now (the kernel's pick for 127.0.0.1:0), distinct from
/// `avoid`. Released before returning: the server binds it next.
fn free_port(avoid: &[u16]) -> Result<u16, String> {
    // Held together so the kernel cannot hand out the same port twice.
    let mut held = Vec::new();
    loop {
        let listener = TcpListener::bind((LOOPBACK, 0))
            .map_err(|e| format!("cannot bind {LOOPBACK}:0 to find a free port: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("cannot read the address of a bound socket: {e}"))?
            .port();
        if !avoid.contains(&port) {
            return Ok(port);
        }
        held.push(listener);
    }
}

/// Starts one `redis-server` in `dir` and waits until it answers; retries on fresh ports when
/// another process took one of them first. A cluster node also needs a free bus port
/// (`--cluster-port`, instead of the default port + 10000, which may be taken or above 65535).
fn start_node(dir: &Path, log: &Path, cluster: bool) -> Result<Node, String> {
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let mut last_error = String::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port(&[])?;
        let bus = if cluster {
            Some(free_port(&[port])?)
        } else {
            None
        };
        match spawn_and_wait(dir, log, port, bus) {
            Ok(node) => return Ok(node),
            Err(Start::PortTaken(e)) => last_error = e,
            Err(Start::Failed(e)) => return Err(e),
        }
    }
    Err(format!(
        "redis-server could not bind a free port in {PORT_ATTEMPTS} attempts; last: {last_error}"
    ))
}

enum Start {
    /// Lost the race for a port: worth another try.
    PortTaken(String),
    Failed(String),
}

fn spawn_and_wait(dir: &Path, log_path: &Path, port: u16, bus: Option<u16>) -> Result<Node, Start> {
    let log = File::create(log_path)
        .map_err(|e| Start::Failed(format!("cannot create {}: {e}", log_path.display())))?;
    let log_err = log
        .try_clone()
        .map_err(|e| Start::Failed(format!("cannot reopen {}: {e}", log_path.display())))?;
    let port_arg = port.to_string();
    let mut cmd = Command::new("redis-server");
    // Loopback only, nothing written to disk but the cluster's node table, in the foreground
    // so the child is the server and SIGTERM reaches it.
    cmd.args(["--bind", LOOPBACK, "--port", &port_arg])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ])
        .arg("--dir")
        .arg(dir)
        .args(["--daemonize", "no"]);
    if let Some(bus) = bus {
        cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(dir.join(format!("nodes-{port}.conf")))
            .args(["--cluster-node-timeout", CLUSTER_NODE_TIMEOUT_MS])
            .args(["--cluster-port", &bus.to_string()]);
    }
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    let child = cmd.spawn().map_err(|e| {
        Start::Failed(format!(
            "cannot start redis-server: {e} (apt-get install redis-server)"
        ))
    })?;
    let mut node = Node {
        pid: child.id(),
        child: Some(child),
        port,
        bus,
        log: log_path.to_path_buf(),
    };

    let start = Instant::now();
    loop {
        if let Some(child) = node.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            node.child = None;
            let text = std::fs::read_to_string(log_path).unwrap_or_default();
            let why = format!(
                "redis-server on {} exited ({status}) before answering\n{}",
                node.addr(),
                log_tail(&node)
            );
            return Err(if text.contains(ADDRESS_IN_USE) {
                Start::PortTaken(why)
            } else {
                Start::Failed(why)
            });
        }
        // The answer must come from our child: a server someone else started on the port
        // between our pick and our bind would answer PING too.
        if let Ok(info) = cli_query_within(port, &["info", "server"], PROBE_DEADLINE)
            && info_field(&info, "process_id") == Some(node.pid.to_string().as_str())
        {
            return Ok(node);
        }
        if start.elapsed() >= START_DEADLINE {
            let why = format!(
                "redis-server on {} did not answer within {}s\n{}",
                node.addr(),
                START_DEADLINE.as_secs(),
                log_tail(&node)
            );
            let _ = node.stop();
            return Err(Start::Failed(why));
        }
        thread::sleep(POLL);
    }
}

/// The last lines of a node's log, framed for an error message.
fn log_tail(node: &Node) -> String {
    let text = match std::fs::read(&node.log) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("(cannot read it: {e})"),
    };
    format!(
        "last lines of {}:\n{}",
        node.log.display(),
        process::tail_lines(text.trim_end(), ERROR_LOG_TAIL)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_known_nodes:3\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_known_nodes"), Some("3"));
        // A prefix of another field's name is not that field.
        assert_eq!(info_field(info, "cluster_slots"), None);
        assert_eq!(info_field(info, "missing"), None);
    }

    #[test]
    fn free_ports_avoid_what_is_taken() {
        let a = free_port(&[]).unwrap();
        let b = free_port(&[a]).unwrap();
        assert_ne!(a, b);
    }
}

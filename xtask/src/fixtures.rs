//! Services the suites need: the Docker engine, the local test image, the Debian sandbox image,
//! the E2B Python SDKs' venvs, Schemathesis's venv, and loopback Redis servers (one standalone, one cluster). Each is started at most once per run, remembered, and undone by
//! [`Fixtures::cleanup`] (what we started, we stop).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use xtask::conformance::Service;
use xtask::process::{self, Output, Stream};
use xtask::redis;

/// The image the Docker adapter's tests run: busybox and nothing else, built locally so tests
/// never pull from a registry.
pub(crate) const TEST_IMAGE: &str = "sandbox-busybox:test";
/// Every container a test creates carries this label, so cleanup can find leftovers.
pub(crate) const TEST_LABEL: &str = "sandbox.test=1";
const BUSYBOX: &str = "/bin/busybox";
const DOCKER_SOCKET: &str = "unix:///var/run/docker.sock";

const DOCKER_PROBE_DEADLINE: Duration = Duration::from_secs(20);
const DOCKERD_START_DEADLINE: Duration = Duration::from_secs(60);
const DOCKERD_STOP_DEADLINE: Duration = Duration::from_secs(20);
const IMAGE_BUILD_DEADLINE: Duration = Duration::from_secs(300);
const SMOKE_RUN_DEADLINE: Duration = Duration::from_secs(60);
const DOCKER_CLEANUP_DEADLINE: Duration = Duration::from_secs(120);

/// How many lines of each service log to show when a run fails.
const LOG_TAIL: usize = 200;

pub(crate) struct Fixtures {
    logs_dir: PathBuf,
    engine: Option<Result<(), String>>,
    image: Option<Result<(), String>>,
    /// dockerd, when this run started it.
    dockerd: Option<Child>,
    /// Whether the test image did not exist before this run built it.
    remove_image: bool,
    /// The standalone Redis server (always started by this run: never a system one, whose
    /// data and configuration are not ours).
    redis: Option<Result<redis::Standalone, String>>,
    redis_cluster: Option<Result<redis::Cluster, String>>,
    /// The Debian image's tag. Never removed at cleanup: it is slow to build and its tag
    /// changes with its recipe, so a kept one is never stale.
    debian: Option<Result<String, String>>,
    /// The SDK venv's python (kept in the target directory, reused while the lock matches).
    sdk_venv: Option<Result<PathBuf, String>>,
    /// The older SDK venv's python (the same, from its own lock).
    sdk_venv_older: Option<Result<PathBuf, String>>,
    /// Schemathesis's venv program, `bin/schemathesis` (the same, from its own lock).
    schemathesis_venv: Option<Result<PathBuf, String>>,
    /// The JS SDK's install directory (kept in the target directory, reused while its
    /// `package.json` and lock match).
    js_sdk: Option<Result<PathBuf, String>>,
    /// The static agent's path (built in the target directory; cargo rebuilds only what
    /// changed, so after the pipeline's agent stage this is a check).
    agent: Option<Result<PathBuf, String>>,
    /// The workspace root, where the SDK's lock is.
    root: PathBuf,
    /// Where the Debian root filesystem is made.
    work_dir: PathBuf,
    target: PathBuf,
    temp_dirs: Vec<PathBuf>,
    /// (service, log file) for every service this run started.
    logs: Vec<(String, PathBuf)>,
    cleaned: bool,
    /// `cargo xtask serve`: the engine and image outlive this process (dockerd in its own
    /// process group, so the service's Ctrl-C does not reach it), and cleanup leaves them.
    keep: bool,
}

/// `docker <args>` against the default socket. `DOCKER_HOST` is dropped: the engine xtask checks,
/// starts and cleans up is the local one, and the tests must see the same one.
pub(crate) fn docker<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = process::command("docker", args);
    cmd.env_remove("DOCKER_HOST");
    cmd
}

impl Fixtures {
    pub(crate) fn new(root: &Path, target: &Path) -> Self {
        Self {
            logs_dir: target.join("xtask").join("logs"),
            debian: None,
            sdk_venv: None,
            sdk_venv_older: None,
            schemathesis_venv: None,
            js_sdk: None,
            agent: None,
            root: root.to_path_buf(),
            work_dir: target.join("xtask"),
            target: target.to_path_buf(),
            engine: None,
            image: None,
            dockerd: None,
            remove_image: false,
            redis: None,
            redis_cluster: None,
            temp_dirs: Vec::new(),
            logs: Vec::new(),
            cleaned: false,
            keep: false,
        }
    }

    /// Fixtures for running the service: what they start is left running and in place.
    pub(crate) fn kept(root: &Path, target: &Path) -> Self {
        let mut fixtures = Self::new(root, target);
        fixtures.keep = true;
        fixtures
    }

    /// Starts `service` (and what it needs) unless this run already did; the result is cached.
    pub(crate) fn ensure(&mut self, service: Service) -> Result<(), String> {
        match service {
            Service::DockerEngine => {
                if self.engine.is_none() {
                    self.engine = Some(self.start_engine());
                }
                self.engine.clone().unwrap_or(Ok(()))
            }
            Service::TestImage => {
                self.ensure(Service::DockerEngine)
                    .map_err(|e| format!("no Docker engine: {e}"))?;
                if self.image.is_none() {
                    self.image = Some(self.build_image());
                }
                self.image.clone().unwrap_or(Ok(()))
            }
            Service::Redis => {
                if self.redis.is_none() {
                    self.redis = Some(self.start_redis());
                }
                match &self.redis {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::RedisCluster => {
                if self.redis_cluster.is_none() {
                    self.redis_cluster = Some(self.start_redis_cluster());
                }
                match &self.redis_cluster {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::DebianImage => {
                self.ensure(Service::DockerEngine)
                    .map_err(|e| format!("no Docker engine: {e}"))?;
                if self.debian.is_none() {
                    self.debian = Some(crate::debian::ensure(&self.work_dir));
                }
                match &self.debian {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::SdkVenv => {
                if self.sdk_venv.is_none() {
                    self.sdk_venv = Some(crate::sdk_venv::ensure(&self.root, &self.target));
                }
                match &self.sdk_venv {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::SdkVenvOlder => {
                if self.sdk_venv_older.is_none() {
                    self.sdk_venv_older =
                        Some(crate::sdk_venv::ensure_older(&self.root, &self.target));
                }
                match &self.sdk_venv_older {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::SchemathesisVenv => {
                if self.schemathesis_venv.is_none() {
                    self.schemathesis_venv = Some(crate::sdk_venv::ensure_schemathesis(
                        &self.root,
                        &self.target,
                    ));
                }
                match &self.schemathesis_venv {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::JsSdk => {
                if self.js_sdk.is_none() {
                    self.js_sdk = Some(crate::js_sdk_install::ensure(&self.root, &self.target));
                }
                match &self.js_sdk {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
            Service::Agent => {
                if self.agent.is_none() {
                    self.agent = Some(build_agent(&self.root, &self.target));
                }
                match &self.agent {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                }
            }
        }
    }

    /// The Debian image's tag, once [`Fixtures::ensure`] built or found it.
    pub(crate) fn debian_image(&self) -> Option<&str> {
        self.debian.as_ref()?.as_ref().ok().map(String::as_str)
    }

    /// Whether a service failed to start (its logs are then worth showing).
    pub(crate) fn any_failed(&self) -> bool {
        [&self.engine, &self.image]
            .iter()
            .any(|r| matches!(r, Some(Err(_))))
            || matches!(self.redis, Some(Err(_)))
            || matches!(self.redis_cluster, Some(Err(_)))
            || matches!(self.debian, Some(Err(_)))
            || matches!(self.sdk_venv, Some(Err(_)))
            || matches!(self.sdk_venv_older, Some(Err(_)))
            || matches!(self.schemathesis_venv, Some(Err(_)))
            || matches!(self.js_sdk, Some(Err(_)))
            || matches!(self.agent, Some(Err(_)))
    }

    /// The environment telling test processes where `services` are (see
    /// [`Service::env_var`]), for those of them this run has running. Set it on every test
    /// command of a suite that needs the services, and on no other: a test that finds no
    /// address must not find a stale one either.
    pub(crate) fn test_env(&self, services: &[Service]) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        for &service in services {
            let Some(var) = service.env_var() else {
                continue;
            };
            let value = match service {
                Service::Redis => self
                    .redis
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(redis::Standalone::url),
                Service::RedisCluster => self
                    .redis_cluster
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(redis::Cluster::seeds),
                Service::DebianImage => self.debian_image().map(str::to_owned),
                Service::SdkVenv => self
                    .sdk_venv
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(|p| p.display().to_string()),
                Service::SdkVenvOlder => self
                    .sdk_venv_older
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(|p| p.display().to_string()),
                Service::SchemathesisVenv => self
                    .schemathesis_venv
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(|p| p.display().to_string()),
                Service::JsSdk => self
                    .js_sdk
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(|p| p.display().to_string()),
                Service::Agent => self
                    .agent
                    .as_ref()
                    .and_then(|r| r.as_ref().ok())
                    .map(|p| p.display().to_string()),
                Service::DockerEngine | Service::TestImage => None,
            };
            if let Some(value) = value
                && !env.iter().any(|(v, _)| *v == var)
            {
                env.push((var, value));
            }
        }
        env
    }

    fn start_redis(&mut self) -> Result<redis::Standalone, String> {
        let log = redis::Standalone::log(&self.logs_dir);
        println!(
            "    starting redis-server on {} (log: {})",
            redis::LOOPBACK,
            log.display()
        );
        self.logs.push(("redis-server".into(), log));
        let start = Instant::now();
        let server = redis::Standalone::start(&self.logs_dir)?;
        println!(
            "    Redis up after {} at {} (pid {})",
            crate::ui::secs(start.elapsed()),
            server.url(),
            server.node().pid()
        );
        Ok(server)
    }

    fn start_redis_cluster(&mut self) -> Result<redis::Cluster, String> {
        let logs = redis::Cluster::logs(&self.logs_dir);
        println!(
            "    starting a Redis Cluster of {} primaries on {} (logs: {})",
            redis::CLUSTER_PRIMARIES,
            redis::LOOPBACK,
            self.logs_dir.join("redis-cluster-*.log").display()
        );
        for (n, log) in logs.into_iter().enumerate() {
            self.logs
                .push((format!("redis cluster node {}", n + 1), log));
        }
        let start = Instant::now();
        let cluster = redis::Cluster::start(&self.logs_dir)?;
        println!(
            "    Redis Cluster up after {} (cluster_state:ok) at {}",
            crate::ui::secs(start.elapsed()),
            cluster.seeds()
        );
        Ok(cluster)
    }

    fn start_engine(&mut self) -> Result<(), String> {
        if let Some(host) = std::env::var_os("DOCKER_HOST") {
            println!(
                "    note: ignoring DOCKER_HOST={}: xtask uses the default socket {DOCKER_SOCKET}",
                host.to_string_lossy()
            );
        }
        if let Some(version) = engine_version(DOCKER_PROBE_DEADLINE) {
            println!("    Docker engine already running (server {version})");
            return Ok(());
        }
        let dockerd = process::find_executable("dockerd")
            .ok_or("the Docker engine is not running and dockerd is not installed (apt-get install docker.io)")?;
        if !process::is_root() {
            return Err(
                "the Docker engine is not running and starting dockerd needs root \
                 (start it yourself, e.g. `sudo dockerd`)"
                    .into(),
            );
        }
        std::fs::create_dir_all(&self.logs_dir)
            .map_err(|e| format!("cannot create {}: {e}", self.logs_dir.display()))?;
        let log_path = self.logs_dir.join("dockerd.log");
        let log = File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .map_err(|e| format!("cannot reopen {}: {e}", log_path.display()))?;
        println!(
            "    starting {} --host {DOCKER_SOCKET} (log: {})",
            dockerd.display(),
            log_path.display()
        );
        let mut cmd = Command::new(&dockerd);
        cmd.args(["--host", DOCKER_SOCKET])
            .env_remove("DOCKER_HOST")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if self.keep {
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", dockerd.display()))?;
        self.logs.push(("dockerd".into(), log_path));
        let dockerd = self.dockerd.insert(child);

        let start = Instant::now();
        while start.elapsed() < DOCKERD_START_DEADLINE {
            if let Ok(Some(status)) = dockerd.try_wait() {
                return Err(format!("dockerd exited ({status}) before answering"));
            }
            // Short probes: a daemon that is still starting may accept and not answer yet.
            if let Some(version) = engine_version(Duration::from_secs(5)) {
                println!(
                    "    Docker engine up after {} (server {version})",
                    crate::ui::secs(start.elapsed())
                );
                return Ok(());
            }
            thread::sleep(Duration::from_millis(500));
        }
        Err(format!(
            "dockerd did not answer `docker version` within {}s",
            DOCKERD_START_DEADLINE.as_secs()
        ))
    }

    fn build_image(&mut self) -> Result<(), String> {
        if !Path::new(BUSYBOX).is_file() {
            return Err(format!(
                "{BUSYBOX} is missing (apt-get install busybox-static)"
            ));
        }
        let existed = run_quiet(
            docker(["image", "inspect", TEST_IMAGE]),
            DOCKER_PROBE_DEADLINE,
        )
        .is_ok();

        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("xtask-test-image-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        self.temp_dirs.push(dir.clone());
        std::fs::copy(BUSYBOX, dir.join("busybox"))
            .map_err(|e| format!("cannot copy {BUSYBOX}: {e}"))?;
        // busybox-static needs no loader or libraries, so the image is that one file plus its
        // applet links; the legacy builder (no BuildKit) needs no registry for `FROM scratch`.
        let dockerfile = "FROM scratch\n\
                          COPY busybox /bin/busybox\n\
                          RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n";
        std::fs::write(dir.join("Dockerfile"), dockerfile)
            .map_err(|e| format!("cannot write the Dockerfile: {e}"))?;

        let mut build = docker(["build", "-t", TEST_IMAGE]);
        build.arg(&dir).env("DOCKER_BUILDKIT", "0");
        let mut show = |_: Stream, line: &str| println!("    build | {line}");
        let outcome = process::run_with_deadline(
            &mut build,
            IMAGE_BUILD_DEADLINE,
            Output::Stream(&mut show),
        )?;
        outcome.check()?;
        if !existed {
            self.remove_image = true;
        }

        smoke_run(
            TEST_IMAGE,
            &["sh", "-c", "echo sandbox-image-ok"],
            "sandbox-image-ok",
            SMOKE_RUN_DEADLINE,
        )?;
        println!("    {TEST_IMAGE} built and answers (sandbox-image-ok)");
        Ok(())
    }

    /// Undoes what this run did: test containers, the test image if we created it, dockerd if
    /// we started it, the Redis servers, temporary directories. Returns what could not be
    /// undone.
    pub(crate) fn cleanup(&mut self) -> Vec<String> {
        self.cleaned = true;
        let mut problems = Vec::new();
        if self.keep {
            if let Some(child) = self.dockerd.take() {
                println!(
                    "    leaving dockerd (pid {}, log {}) running",
                    child.id(),
                    self.logs_dir.join("dockerd.log").display()
                );
            }
            self.remove_image = false;
        }
        if matches!(self.engine, Some(Ok(()))) && !self.keep {
            match run_quiet(
                docker(["ps", "-aq", "--filter", &format!("label={TEST_LABEL}")]),
                DOCKER_PROBE_DEADLINE,
            ) {
                Ok(out) => {
                    let ids: Vec<&str> = out.split_whitespace().collect();
                    if !ids.is_empty() {
                        println!("    removing {} test container(s)", ids.len());
                        let mut rm = docker(["rm", "-f"]);
                        rm.args(&ids);
                        if let Err(e) = run_quiet(rm, DOCKER_CLEANUP_DEADLINE) {
                            problems.push(e);
                        }
                    }
                }
                Err(e) => problems.push(e),
            }
            if self.remove_image {
                println!("    removing {TEST_IMAGE} (built by this run)");
                if let Err(e) = run_quiet(docker(["rmi", TEST_IMAGE]), DOCKER_CLEANUP_DEADLINE) {
                    problems.push(e);
                }
                self.remove_image = false;
            }
        }
        // What a killed egress test leaves (netns, veths, routing, test networks and chains).
        if !self.keep {
            let net = xtask::netclean::clean(matches!(self.engine, Some(Ok(()))));
            net.removed.iter().for_each(|l| println!("    removed {l}"));
            problems.extend(net.problems);
        }
        if let Some(mut child) = self.dockerd.take() {
            println!(
                "    stopping dockerd (pid {}), which this run started",
                child.id()
            );
            if let Err(e) = process::terminate(&mut child, DOCKERD_STOP_DEADLINE) {
                problems.push(e);
            }
        }
        // Never kept, even for `serve`: nothing outside a test run uses them.
        if let Some(Ok(mut server)) = self.redis.take() {
            println!("    stopping redis-server (pid {})", server.node().pid());
            problems.extend(server.stop());
        }
        if let Some(Ok(mut cluster)) = self.redis_cluster.take() {
            let pids: Vec<String> = cluster
                .nodes()
                .iter()
                .map(|n| n.pid().to_string())
                .collect();
            println!("    stopping the Redis Cluster (pids {})", pids.join(", "));
            problems.extend(cluster.stop());
        }
        for dir in self.temp_dirs.drain(..) {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                problems.push(format!("cannot remove {}: {e}", dir.display()));
            }
        }
        problems
    }

    /// Prints the last lines of every service log this run started.
    pub(crate) fn dump_logs(&self) {
        for (name, path) in &self.logs {
            println!(
                "==> last {LOG_TAIL} lines of the {name} log ({})",
                path.display()
            );
            match std::fs::read(path) {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    println!("{}", process::tail_lines(&text, LOG_TAIL));
                }
                Err(e) => println!("(cannot read it: {e})"),
            }
            println!("<== {name} log");
        }
    }
}

impl Drop for Fixtures {
    fn drop(&mut self) {
        // A panic between start and cleanup must not leave a daemon running.
        if !self.cleaned {
            for p in self.cleanup() {
                eprintln!("warning: cleanup: {p}");
            }
        }
    }
}

/// Runs `argv` in a throwaway container of `image` (never pulled, no network, labelled for
/// cleanup) and checks that it printed exactly `expected`.
pub(crate) fn smoke_run(
    image: &str,
    argv: &[&str],
    expected: &str,
    deadline: Duration,
) -> Result<(), String> {
    let mut cmd = docker([
        "run",
        "--rm",
        "--pull=never",
        "--network",
        "none",
        "--label",
        TEST_LABEL,
        image,
    ]);
    cmd.args(argv);
    let outcome = process::run_with_deadline(&mut cmd, deadline, Output::Capture)?;
    outcome.check()?;
    if outcome.stdout.trim() != expected {
        return Err(format!(
            "the smoke run of {image} printed {:?} instead of {expected:?}",
            outcome.stdout.trim()
        ));
    }
    Ok(())
}

/// The server version when an engine answers on the default socket.
fn engine_version(deadline: Duration) -> Option<String> {
    run_quiet(
        docker(["version", "--format", "{{.Server.Version}}"]),
        deadline,
    )
    .ok()
    .map(|v| v.trim().to_owned())
}

/// Runs `cmd` capturing output; stdout on success, else a one-paragraph error.
fn run_quiet(mut cmd: Command, deadline: Duration) -> Result<String, String> {
    let out = process::run_with_deadline(&mut cmd, deadline, Output::Capture)?;
    out.check()?;
    Ok(out.stdout)
}

/// The static agent, built with the one command `cargo xtask agent` runs and checked.
fn build_agent(root: &Path, target: &Path) -> Result<PathBuf, String> {
    use xtask::agent_build::{self, BUILD_ARGS};
    const BUILD_DEADLINE: Duration = Duration::from_secs(1800);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = process::command(cargo, BUILD_ARGS);
    cmd.current_dir(root).env_remove("DOCKER_HOST");
    agent_build::scope_rustflags(&mut cmd);
    let outcome = process::run_with_deadline(&mut cmd, BUILD_DEADLINE, Output::Inherit)?;
    if !outcome.success() {
        return Err(format!(
            "building the static agent: {} (`cargo xtask agent` shows the whole build)",
            outcome.describe()
        ));
    }
    let path = agent_build::binary_path(target);
    agent_build::check_binary(&path)?;
    Ok(path)
}

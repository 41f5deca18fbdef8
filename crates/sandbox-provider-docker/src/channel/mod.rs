//! The channel: one kept exec stream from the service to the agent inside a container, carrying
//! h2c, with the envd client of `sandbox-transport` on top.
//!
//! - **One exec per channel.** The exec runs `sandbox-agent relay <socket>` ([`RELAY_ARGV`])
//!   with `Tty=false` and stdin/stdout/stderr attached; the engine's stdcopy frames are
//!   demultiplexed into one byte stream (`stream.rs`: stdout is the bytes, stderr the relay's
//!   bounded diagnostics). Never an attach stream: an attach is shared by every attacher, so two
//!   replicas would corrupt each other's bytes; an exec is this process's own.
//! - **h2c on it.** The envd client runs HTTP/2 only over a [`RelayConnector`] whose opener
//!   hands out this one exec and refuses any other, so one pooled h2 connection is one exec and
//!   every call is a stream multiplexed on it. A second exec is only ever opened by the channel
//!   itself, deliberately, as a new generation.
//! - **Lifecycle.** Opened lazily by the first [`Channel::lease`]; its first exchange is
//!   `GET /sandbox-agent/version`, and an agent of another version than the service's is refused
//!   with the fix named. Closed after [`ChannelConfig::idle_timeout`] without a lease. Re-opened
//!   when its exec ended (the relay died, the engine cut the stream, the container restarted) or
//!   after [`Channel::invalidate`]; nothing persists, so a restarted service opens a new one.
//!   A channel idle for [`ChannelConfig::health_after`] is checked with `GET /health` before it
//!   is leased again.
//! - **Paused containers.** The engine refuses exec on a paused container (409 "is paused"):
//!   that is reported at once as `unavailable` with code `sandbox_paused`, never retried. A
//!   channel that was open when its container was paused fails its idle health check within
//!   [`ChannelConfig::health_timeout`] and the reopen then reports the pause.
//! - **The agent is untrusted** (root code in the container can replace or ptrace it). Every
//!   answer is bounded by the envd client's limits: messages ([`EnvdConfig`]'s 4 MiB), error
//!   bodies (64 KiB), a silent stream's idle limit, a unary deadline; hyper's HTTP/2 client
//!   bounds a response head to 16 KiB and its flow-control windows bound what is buffered. The
//!   version answer is read up to [`VERSION_ANSWER_LIMIT`]. The relay's stderr is kept up to
//!   [`stream::STDERR_TAIL_BYTES`]. Nothing the agent says leaves this channel's sandbox.
//! - **Forwarding.** [`Channel::forward`] relays a caller's own HTTP request (an envd SDK's,
//!   through a router) to the agent on the kept channel, streamed both ways: the router in
//!   front of Docker sandboxes needs nothing else.
//! - **Tunnels.** `tunnel.rs`: byte tunnels to ports inside the container over the agent's
//!   tunnel extension on the same channel (the port's `Tunnels`).
//! - **Bounded memory.** [`Channels`] keeps at most [`ChannelConfig::max_channels`] channels,
//!   one per container, evicting the least recently used.
//! - **Observed.** A [`ChannelObserver`] in the config hears every open (with why it opened and
//!   whether it worked) and the round trip of every health call, so the service's metrics show
//!   channel churn and the agent's latency without the adapter knowing about Prometheus.

mod map;
mod stream;
pub mod tunnel;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use sandbox_core::{Error, ErrorCode, ErrorKind, Operation, Provider, SandboxHandle};
use sandbox_transport::envd::{
    CallOptions, EnvdClient, EnvdConfig, ForwardBody, HttpVersion, error_response,
};
use sandbox_transport::relay::RelayConnector;

pub use self::map::Channels;
use self::stream::ExecState;
pub use self::stream::ExecStream;
pub use self::stream::STDERR_TAIL_BYTES;
use crate::errors::{self, provider_error};

pub use crate::agent::{AGENT_PATH, AGENT_SOCKET};

/// The channel's exec.
pub const RELAY_ARGV: [&str; 3] = [AGENT_PATH, "relay", AGENT_SOCKET];
/// The agent's version endpoint.
pub const VERSION_PATH: &str = "/sandbox-agent/version";
/// The longest version answer read.
pub const VERSION_ANSWER_LIMIT: usize = 4 * 1024;

/// A channel with no lease for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The channel of an idle TTL closes after at most this share of it ([`idle_timeout_for`]).
pub const IDLE_TTL_SHARE: u32 = 4;
/// A channel unused for this long is health-checked before its next lease.
pub const DEFAULT_HEALTH_AFTER: Duration = Duration::from_secs(5);
/// The health check's bound.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// The bound of opening a channel: the exec, the h2c handshake and the version exchange.
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The most channels one process keeps (each holds one exec and one h2 connection).
pub const DEFAULT_MAX_CHANNELS: usize = 256;

const OP_CHANNEL: Operation = Operation::new("open_channel");

/// The envd client of a channel.
pub type ChannelClient = EnvdClient<RelayConnector<ExecStream>>;

/// Why a channel opened an exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpenReason {
    /// The channel's first open in this process.
    First,
    /// The previous exec ended (the relay died, the engine cut it, the container restarted).
    ExecEnded,
    /// The previous exec failed its idle health check.
    HealthFailed,
    /// The previous exec was closed: idle, or dropped as suspect after a failed call.
    Closed,
}

impl OpenReason {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            OpenReason::First => "first",
            OpenReason::ExecEnded => "exec_ended",
            OpenReason::HealthFailed => "health_failed",
            OpenReason::Closed => "closed",
        }
    }
}

/// Hears what channels do, for metrics. Calls are synchronous and must be cheap: they run on
/// the channel's own path.
pub trait ChannelObserver: Send + Sync + std::fmt::Debug {
    /// A channel tried to open an exec for `reason`; `opened` says whether it worked (the exec
    /// and the version exchange).
    fn channel_opened(&self, reason: OpenReason, opened: bool);
    /// A health call on a channel was answered (or failed) after `elapsed`: the agent's round
    /// trip through the engine's exec stream.
    fn agent_round_trip(&self, elapsed: Duration);
}

/// How channels open, idle and close.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    pub idle_timeout: Duration,
    pub health_after: Duration,
    pub health_timeout: Duration,
    pub open_timeout: Duration,
    pub max_channels: usize,
    /// Hears opens and round trips (see [`ChannelObserver`]); `None` hears nothing.
    pub observer: Option<Arc<dyn ChannelObserver>>,
    /// The agent version the channel accepts: the service's own.
    expected_agent_version: String,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            health_after: DEFAULT_HEALTH_AFTER,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            max_channels: DEFAULT_MAX_CHANNELS,
            observer: None,
            expected_agent_version: crate::agent::VERSION.to_owned(),
        }
    }
}

impl ChannelConfig {
    /// Accepts agents of `version` instead of the service's own. For tests, which show a
    /// mismatch refused without building a second agent.
    #[doc(hidden)]
    pub fn with_expected_agent_version(mut self, version: impl Into<String>) -> Self {
        self.expected_agent_version = version.into();
        self
    }
}

/// An open channel's client and the exec under it.
#[derive(Debug)]
struct Generation {
    client: ChannelClient,
    /// The envd protocol version the agent said it speaks, in its version answer.
    envd_version: Arc<str>,
    exec: Arc<ExecState>,
    /// Held by every [`Lease`]: the idle close waits for the last one.
    leases: Arc<()>,
    last_used: Mutex<Instant>,
}

impl Generation {
    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .map(|t| t.elapsed())
            .unwrap_or_default()
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }
}

/// The right to make calls on a channel: the envd client and a hold on its exec. Keep it for
/// as long as a call (or a stream) runs: a channel is not closed as idle while a lease lives.
#[derive(Debug, Clone)]
pub struct Lease {
    client: ChannelClient,
    envd_version: Arc<str>,
    _hold: Arc<()>,
}

impl Lease {
    /// The envd client on the channel.
    pub fn client(&self) -> &ChannelClient {
        &self.client
    }

    /// The envd version the agent reported when this channel opened (what an E2B control
    /// plane answers as the sandbox's `envdVersion`: the SDKs gate features on it).
    pub fn envd_version(&self) -> &str {
        &self.envd_version
    }

    /// Forwards a caller's own HTTP request (an SDK's) to the agent over this channel,
    /// streamed both ways ([`EnvdClient::forward`]: origin form only, hop-by-hop headers
    /// dropped, the agent's `/sandbox-agent/` endpoints refused, failures as JSON answers).
    /// The answer's body holds a clone of this lease until it is over, so a long stream keeps
    /// the channel from being closed as idle under it.
    pub async fn forward<B>(&self, request: hyper::Request<B>) -> hyper::Response<ForwardBody>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<sandbox_transport::connector::BoxError>,
    {
        self.client.forward_holding(request, self.clone()).await
    }
}

/// The channel to one container's agent (see the module docs). Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Channel {
    docker: Docker,
    container: String,
    config: ChannelConfig,
    slot: tokio::sync::Mutex<Option<Arc<Generation>>>,
    /// Execs this channel created, for diagnostics and tests.
    opened: std::sync::atomic::AtomicU64,
    /// The handle of the last full connect (see [`Channel::remember_connected`]).
    connected: Mutex<Option<SandboxHandle>>,
    /// The container's working directory, once known (see [`Channel::workdir`]).
    workdir: tokio::sync::OnceCell<String>,
}

impl Channel {
    /// A channel to the agent in `container` (nothing is opened yet).
    pub fn new(docker: Docker, container: impl Into<String>, config: ChannelConfig) -> Arc<Self> {
        Arc::new(Channel {
            docker,
            container: container.into(),
            config,
            slot: tokio::sync::Mutex::new(None),
            opened: std::sync::atomic::AtomicU64::new(0),
            connected: Mutex::new(None),
            workdir: tokio::sync::OnceCell::new(),
        })
    }

    /// Where a process that names no `cwd` starts: the container's working directory, as for
    /// exec mode's processes (the engine's default). The create sets it to the sandbox user's
    /// workdir, else to the workspace root, so it is the sandbox's default workdir on every
    /// container, including those made before the agent was told one (`--default-workdir`).
    /// A container's configuration never changes, so it is read once (or given by the create,
    /// [`Channel::remember_workdir`]) and kept.
    pub async fn workdir(&self) -> Result<String, Error> {
        self.workdir
            .get_or_try_init(|| async {
                let inspect = self
                    .docker
                    .inspect_container(
                        &self.container,
                        None::<bollard::query_parameters::InspectContainerOptions>,
                    )
                    .await
                    .map_err(|e| errors::map(OP_CHANNEL, e))?;
                Ok::<_, Error>(
                    inspect
                        .config
                        .and_then(|c| c.working_dir)
                        .filter(|dir| dir.starts_with('/'))
                        .unwrap_or_else(|| {
                            sandbox_core::policy::workspace::WORKSPACE_ROOT.to_owned()
                        }),
                )
            })
            .await
            .cloned()
    }

    /// Records the working directory the create gave the container, so the first call need
    /// not ask the engine. A second value is ignored: the first was the container's.
    pub fn remember_workdir(&self, dir: &str) {
        let _ = self.workdir.set(dir.to_owned());
    }

    /// The container this channel reaches.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// How many execs this channel has opened.
    pub fn execs_opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether an exec is open and has not ended.
    pub async fn is_open(&self) -> bool {
        self.slot
            .lock()
            .await
            .as_ref()
            .is_some_and(|g| !g.exec.ended())
    }

    /// What the relay last wrote on stderr (bounded), empty when nothing or no exec.
    pub async fn relay_stderr(&self) -> String {
        self.slot
            .lock()
            .await
            .as_ref()
            .map(|g| g.exec.stderr_tail())
            .unwrap_or_default()
    }

    /// A lease on the channel, opening it (or a new generation of it) when needed: none yet,
    /// its exec ended, or its idle health check failed.
    pub async fn lease(self: &Arc<Self>) -> Result<Lease, Error> {
        let mut slot = self.slot.lock().await;
        let mut reason = if self.execs_opened() == 0 {
            OpenReason::First
        } else {
            OpenReason::Closed
        };
        if let Some(current) = slot.as_ref() {
            if current.exec.ended() {
                tracing::debug!(container = %self.container, stderr = %current.exec.stderr_tail(), "the agent channel's exec ended; reopening");
                *slot = None;
                reason = OpenReason::ExecEnded;
            } else if current.idle_for() >= self.config.health_after
                && let Err(e) = self.health(&current.client).await
            {
                tracing::debug!(container = %self.container, error = %e, "the agent channel failed its health check; reopening");
                *slot = None;
                reason = OpenReason::HealthFailed;
            }
        }
        if slot.is_none() {
            let opened = self.open().await;
            if let Some(observer) = &self.config.observer {
                observer.channel_opened(reason, opened.is_ok());
            }
            let opened = opened?;
            *slot = Some(Arc::new(opened));
            if let Some(generation) = slot.as_ref() {
                self.watch_idle(Arc::downgrade(generation));
            }
        }
        let Some(current) = slot.as_ref() else {
            return Err(provider_error(
                ErrorKind::Internal,
                OP_CHANNEL,
                "the channel has no generation after opening",
            ));
        };
        current.touch();
        Ok(Lease {
            client: current.client.clone(),
            envd_version: Arc::clone(&current.envd_version),
            _hold: Arc::clone(&current.leases),
        })
    }

    /// Remembers `handle` (its traffic token dropped: the caller's own rides along on each
    /// connect) as the answer of a full connect of this container: the engine's inspect showed
    /// it exists, runs, and carries this adapter's labels. Labels never change after create
    /// and a container ID is never reused, so from here on only "does it still run" is in
    /// question, which [`Channel::connected`] answers with a health call instead of another
    /// inspect.
    pub fn remember_connected(&self, handle: &SandboxHandle) {
        if handle.id().as_str() != self.container {
            return;
        }
        if let Ok(mut slot) = self.connected.lock() {
            *slot = Some(handle.clone().with_traffic_token(None));
        }
    }

    /// The remembered connect (see [`Channel::remember_connected`]) when the agent answers a
    /// health call on this channel within [`ChannelConfig::health_timeout`]: an answer from
    /// PID 1 through an exec proves the container runs and is not paused (the engine refuses
    /// exec on a stopped or paused container, and a frozen agent answers nothing). `None`
    /// means the caller must connect the full way: nothing remembered, the channel cannot
    /// open (stopped, paused, deleted), or the check failed, in which case the channel's exec
    /// is dropped as suspect.
    pub async fn connected(self: &Arc<Self>) -> Option<SandboxHandle> {
        let remembered = self.connected.lock().ok()?.clone()?;
        let lease = self.lease().await.ok()?;
        match self.health(&lease.client).await {
            Ok(()) => Some(remembered),
            Err(e) => {
                tracing::debug!(container = %self.container, error = %e, "the agent channel failed the connect's health check");
                drop(lease);
                self.invalidate().await;
                None
            }
        }
    }

    /// Forwards a caller's HTTP request to this container's agent: a lease (opening the
    /// channel when needed), then [`Lease::forward`]. A channel that cannot be opened is an
    /// answer too, in the service's error shape: a paused container is 409
    /// `session_sandbox_paused`, an agent that cannot be reached 503 `provider_unavailable`.
    pub async fn forward<B>(
        self: &Arc<Self>,
        request: hyper::Request<B>,
    ) -> hyper::Response<ForwardBody>
    where
        B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<sandbox_transport::connector::BoxError>,
    {
        match self.lease().await {
            Ok(lease) => lease.forward(request).await,
            Err(e) => {
                let mut answer = error_response(&e);
                *answer.version_mut() = request.version();
                answer
            }
        }
    }

    /// `GET /health` on `client` within the health timeout, its round trip told to the observer.
    async fn health(&self, client: &ChannelClient) -> Result<(), Error> {
        let check = CallOptions::new().timeout(self.config.health_timeout);
        let started = Instant::now();
        let answered = client.health(check).await;
        if let Some(observer) = &self.config.observer {
            observer.agent_round_trip(started.elapsed());
        }
        answered
    }

    /// Drops the current exec (a call on it failed in a way that leaves it suspect); the next
    /// lease opens a new one. Calls holding a lease finish on the old one.
    pub async fn invalidate(&self) {
        *self.slot.lock().await = None;
    }

    /// Opens a generation: the exec, then the version exchange on it.
    async fn open(&self) -> Result<Generation, Error> {
        let opening = async {
            let exec = Arc::new(ExecState::default());
            let stream = self.start_relay(Arc::clone(&exec)).await?;
            self.opened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let client = one_exec_client(&self.container, stream)?;
            let version = client
                .get_json::<AgentVersion>(
                    OP_CHANNEL,
                    VERSION_PATH,
                    VERSION_ANSWER_LIMIT,
                    CallOptions::new(),
                )
                .await
                .map_err(|e| self.explain_failed_open(e, &exec))?;
            check_version(
                &self.container,
                &version.agent,
                &self.config.expected_agent_version,
            )?;
            Ok(Generation {
                client,
                envd_version: Arc::from(version.envd.as_str()),
                exec,
                leases: Arc::new(()),
                last_used: Mutex::new(Instant::now()),
            })
        };
        match tokio::time::timeout(self.config.open_timeout, opening).await {
            Ok(done) => done,
            Err(_) => Err(provider_error(
                ErrorKind::Timeout,
                OP_CHANNEL,
                format!(
                    "the agent channel to sandbox {} did not open within {} ms",
                    self.container,
                    self.config.open_timeout.as_millis()
                ),
            )),
        }
    }

    /// The exec running the relay, as one byte stream.
    async fn start_relay(&self, state: Arc<ExecState>) -> Result<ExecStream, Error> {
        let options = CreateExecOptions {
            cmd: Some(RELAY_ARGV.iter().map(|s| (*s).to_owned()).collect()),
            user: Some("0".to_owned()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(&self.container, options)
            .await
            .map_err(|e| self.engine_refusal(errors::map(OP_CHANNEL, e)))?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| self.engine_refusal(errors::map(OP_CHANNEL, e)))?;
        let StartExecResults::Attached { output, input } = started else {
            return Err(provider_error(
                ErrorKind::Internal,
                OP_CHANNEL,
                "the channel's exec started detached",
            ));
        };
        Ok(ExecStream::new(&self.container, output, input, state))
    }

    /// A paused container is reported as paused; anything else as the engine said it.
    fn engine_refusal(&self, err: Error) -> Error {
        if errors::is_paused(&err) {
            return paused(&self.container);
        }
        err
    }

    /// A failed version exchange: with the relay's own words when it said any (a missing
    /// socket, a missing agent binary), which say more than a cut connection.
    fn explain_failed_open(&self, err: Error, exec: &ExecState) -> Error {
        let said = exec.stderr_tail();
        if said.is_empty() {
            return err;
        }
        provider_error(
            ErrorKind::Unavailable,
            OP_CHANNEL,
            format!(
                "the agent channel to sandbox {} failed ({}); the relay said: {said}",
                self.container,
                err.message()
            ),
        )
    }

    /// Closes `generation` once it has been idle for the idle timeout with no lease left.
    fn watch_idle(self: &Arc<Self>, generation: Weak<Generation>) {
        let channel = Arc::downgrade(self);
        let idle = self.config.idle_timeout;
        tokio::spawn(async move {
            let mut wait = idle;
            loop {
                tokio::time::sleep(wait).await;
                let (Some(channel), Some(current)) = (channel.upgrade(), generation.upgrade())
                else {
                    return;
                };
                if current.exec.ended() {
                    return;
                }
                let idle_for = current.idle_for();
                let leased = Arc::strong_count(&current.leases) > 1;
                if idle_for >= idle && !leased {
                    let mut slot = channel.slot.lock().await;
                    if slot.as_ref().is_some_and(|g| Arc::ptr_eq(g, &current)) {
                        *slot = None;
                        tracing::debug!(container = %channel.container, "closed the idle agent channel");
                    }
                    return;
                }
                wait = idle
                    .saturating_sub(idle_for)
                    .max(Duration::from_millis(100));
            }
        });
    }
}

/// How long a channel of a sandbox with idle TTL `idle_ttl` stays open without a lease: the
/// default, or a quarter of the TTL when that is shorter. An open channel is a running exec,
/// which the idle sweep counts as work in progress (it keeps a container with a running exec,
/// whatever its activity marker says), so a channel kept open past the TTL would hold an idle
/// sandbox for as long again: closed after a fraction of the TTL, the sandbox is judged by
/// its marker (which the agent touches on every request) soon after its last request. The
/// provider passes its configured TTL (every sandbox `sandbox serve` creates has it); a sandbox
/// created with a shorter TTL of its own is still held up to this timeout past it.
pub fn idle_timeout_for(idle_ttl: Duration) -> Duration {
    DEFAULT_IDLE_TIMEOUT.min(idle_ttl / IDLE_TTL_SHARE)
}

/// The version answer's fields the channel reads: the agent's own version, checked, and the
/// envd version it speaks, kept for [`Lease::envd_version`].
#[derive(Debug, serde::Deserialize)]
struct AgentVersion {
    agent: String,
    envd: String,
}

/// Refuses an agent whose version is not `expected`, naming the fix.
fn check_version(container: &str, agent: &str, expected: &str) -> Result<(), Error> {
    if agent == expected {
        return Ok(());
    }
    // The answer is the agent's: bounded already, and quoted, never trusted as text.
    let shown: String = agent.chars().take(64).collect();
    Err(provider_error(
        ErrorKind::Unavailable,
        OP_CHANNEL,
        format!(
            "the agent in sandbox {container} is version {shown:?}, this service is {expected}: \
             build the agent of this version (`cargo xtask agent`, or the `sandbox-agent` \
             shipped beside `sandbox`) and recreate the sandbox so the current agent is copied in"
        ),
    ))
}

/// The error of a paused container: the engine refuses exec until it is unpaused.
pub fn paused(container: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        OP_CHANNEL,
        format!(
            "sandbox {container} is paused: the engine refuses exec until it is unpaused \
             (docker unpause), so its agent cannot be reached"
        ),
    )
    .with_code(ErrorCode::SandboxPaused)
    .with_http_status(409)
    .with_provider(Provider::Docker)
}

/// An envd client whose only connection is `stream`: its connector hands the stream out once
/// and refuses every later connection (the channel opens a new generation instead).
fn one_exec_client(container: &str, stream: ExecStream) -> Result<ChannelClient, Error> {
    let once = Arc::new(Mutex::new(Some(stream)));
    let container = container.to_owned();
    let connector = RelayConnector::new(move || {
        let taken = once.lock().ok().and_then(|mut s| s.take());
        let container = container.clone();
        async move {
            taken.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    format!(
                        "the agent channel's exec into sandbox {container} ended; the next call opens a new one"
                    ),
                )
            })
        }
    });
    // The base is never dialled (the stream is the destination); it names the peer in logs.
    let config = EnvdConfig::new("http://sandbox-agent")?
        .with_http(HttpVersion::Http2)
        .with_provider(Provider::Docker);
    EnvdClient::new(connector, config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_version_mismatch_names_both_versions_and_the_fix() {
        assert!(check_version("c1", "1.2.3", "1.2.3").is_ok());
        let e = check_version("c1", "0.0.1", "1.2.3").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.provider(), Some(Provider::Docker));
        for needle in [
            "0.0.1",
            "1.2.3",
            "cargo xtask agent",
            "recreate the sandbox",
        ] {
            assert!(e.message().contains(needle), "{needle}: {}", e.message());
        }
        // A hostile agent's long version is cut, not echoed whole.
        let long = "9".repeat(10_000);
        let e = check_version("c1", &long, "1.2.3").unwrap_err();
        assert!(e.message().len() < 600, "{}", e.message().len());
    }

    #[test]
    fn paused_is_unavailable_with_the_paused_code() {
        let e = paused("c1");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.code(), Some(ErrorCode::SandboxPaused));
        assert!(!e.can_replace_binding());
        let engine = errors::map(
            OP_CHANNEL,
            bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message: "Container c1 is paused, unpause the container before exec".into(),
            },
        );
        assert!(errors::is_paused(&engine));
        let not_running = errors::map(
            OP_CHANNEL,
            bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message: "Container c1 is not running".into(),
            },
        );
        assert!(!errors::is_paused(&not_running));
    }

    #[test]
    fn a_short_idle_ttl_closes_the_channel_within_a_share_of_it() {
        let ttl = |s| Duration::from_secs(s);
        assert_eq!(idle_timeout_for(ttl(1800)), DEFAULT_IDLE_TIMEOUT);
        assert_eq!(idle_timeout_for(ttl(240)), DEFAULT_IDLE_TIMEOUT);
        assert_eq!(idle_timeout_for(ttl(4)), ttl(1));
        assert!(idle_timeout_for(ttl(1)) < ttl(1));
    }

    #[test]
    fn the_relay_runs_the_agent_against_its_socket() {
        assert_eq!(
            RELAY_ARGV,
            ["/.sandbox/sandbox-agent", "relay", "/.sandbox/agent.sock"]
        );
        let c = ChannelConfig::default();
        assert_eq!(c.expected_agent_version, env!("CARGO_PKG_VERSION"));
        assert!(c.idle_timeout > c.health_after);
    }
}

//! `DockerProvider`: the `SandboxProvider` on one Docker engine.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, ContainerSummaryStateEnum, HostConfig,
    HostConfigLogConfig, ImageInspect,
};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, InspectContainerOptions, ListContainersOptions,
    RemoveContainerOptions, StartContainerOptions,
};
use futures_util::StreamExt;
use sandbox_core::{
    Capabilities, Capability, Checked, ConnectProbe, ConnectRequest, CreateRequest, DirEntry,
    Error, ErrorCode, ErrorKind, ExecRequest, ExecResult, IdleTimeout, KeepAlive, ListFilter,
    NetworkField, NetworkFields, Operation, ProcessInfo, ProcessSelector, ProcessSpec,
    ProcessStream, Processes, Provider, ReadStream, SandboxHandle, SandboxId, SandboxPath,
    SandboxProvider, SandboxState, SandboxSummary, Signal, Snapshots, StatEntry, StreamedFiles,
    TemplateCatalog, TemplateId, Terminals, TimeoutAction, TreeLimits, TreeListing, Tunnel,
    Tunnels, Watch, WatchStream, owner_metadata,
};

use crate::agent::{self, AgentBinary};
use crate::channel::{Channel, ChannelConfig, ChannelObserver, Channels};
use crate::config::{DataPlane, DockerConfig, NetworkMode, PullPolicy};
use crate::egress::{EgressGuard, EgressPolicy};
use crate::engine::{self, Dialing, Endpoint, EngineVersion};
use crate::errors::{self, no_such_sandbox, provider_error};
use crate::exec::{self, ACTIVITY_MARKER};
use crate::isolation::StorageState;
use crate::{files, isolation, labels, snapshots, template_builds};

/// Capabilities linux containers on a Docker engine give: everything but `timeout_refresh` (the
/// daemon has no TTL to refresh; idle reclamation is the adapter's own sweep), `volumes` (not
/// mapped onto named volumes yet: advertising it would let a tenant configure mounts that never
/// appear), `desktop` (no gateway to the container's websockify port yet), and `processes`,
/// `streamed_files` and `watch` (issue 17: the exec fallback cannot serve them honestly; the
/// agent plane adds them, [`docker_capabilities_for`]), and `terminal_reattach` and
/// `default_user`, which only the agent plane serves.
pub fn docker_capabilities() -> Capabilities {
    Capabilities::from_slice(&[
        Capability::Reconnect,
        Capability::Metadata,
        Capability::List,
        Capability::PauseResume,
        Capability::FsEnumeration,
        Capability::Snapshots,
        Capability::TemplateCatalog,
        Capability::ConnectProbe,
        Capability::KeepAlive,
        Capability::Pty,
        Capability::PosixShell,
        Capability::TemplateBuilds,
    ])
}

/// The capabilities of one data plane: [`docker_capabilities`], plus `processes`,
/// `streamed_files`, `watch`, `terminal_reattach` and `default_user` on the agent plane, whose
/// agent keeps background processes and their output, whose channel streams files both ways
/// and carries the agent's inotify watches, which reaches the PTY processes the agent keeps
/// (with their output rings) after their stream is gone, and whose agent is told the sandbox's
/// default user (`--default-user`), so its file calls act as it too. The exec plane cannot
/// reattach: a `docker exec` PTY dies with its stream; nor does it declare `default_user`:
/// each of its execs (file operations included) names its engine user, root unless the call
/// names one, and it keeps no per-sandbox default to name instead.
pub fn docker_capabilities_for(plane: DataPlane) -> Capabilities {
    let base = docker_capabilities();
    match plane {
        DataPlane::Exec => base,
        DataPlane::Agent => base
            .with(Capability::Processes, true)
            .with(Capability::StreamedFiles, true)
            .with(Capability::Watch, true)
            .with(Capability::TerminalReattach, true)
            .with(Capability::DefaultUser, true)
            .with(Capability::Tunnels, true),
    }
}

/// The network-policy fields this backend enforces: only the internet switch (off: no network at
/// all; on: the adapter's protected bridge). A Docker network cannot allow-list or deny-list
/// destinations, so `allow_out` and `deny_out` would be accepted and not applied; there is no
/// inbound exposure to open (`allow_public_traffic`), and the Cube and E2B rules are theirs.
pub fn docker_network_fields() -> NetworkFields {
    NetworkFields::from_slice(&[NetworkField::AllowInternetAccess])
}

/// Capabilities dropped from the default set are all of them except these: what package
/// managers and ordinary file ownership changes need, and `KILL` so a shell can signal its jobs.
const CAP_ADD: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "SETGID",
    "SETUID",
    "KILL",
];

/// How long a fresh container may take to report running.
const START_DEADLINE: Duration = Duration::from_secs(15);

pub(crate) struct Inner {
    pub(crate) docker: Docker,
    pub(crate) config: DockerConfig,
    pub(crate) engine: EngineVersion,
    egress: Option<EgressGuard>,
    /// The resolved daemon endpoint, the key of the sweep throttle.
    pub(crate) endpoint: String,
    /// Whether this engine enforces the writable-layer limit, once known.
    pub(crate) storage: StorageState,
    /// Agent mode's checked agent, read once at start (`None` in exec mode).
    agent: Option<AgentBinary>,
    /// Agent mode's kept channels to the agents, one per container (`None` in exec mode).
    channels: Option<Arc<Channels>>,
}

/// The Docker backend. Cheap to clone; safe for concurrent use (the engine client is, and the
/// provider holds no mutable state).
///
/// The constructors hand it out wrapped in the checking layer ([`Checked`]), which refuses
/// what [`docker_capabilities`] and [`docker_network_fields`] do not allow; the wrapper
/// dereferences to the provider for the Docker-specific methods (the engine client, the
/// sweep, isolation).
#[derive(Clone)]
pub struct DockerProvider {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for DockerProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DockerProvider")
            .field("namespace", &self.inner.config.namespace)
            .field("engine", &self.inner.engine.version)
            .field("api", &self.inner.docker.client_version())
            .finish()
    }
}

impl DockerProvider {
    /// Connects to the engine the config names (after the operator gate and validation) and
    /// negotiates the API version. A TCP daemon is dialled through the guarded connector with
    /// the system resolver ([`engine::connect`]).
    pub async fn connect(config: DockerConfig) -> Result<Checked<Self>, Error> {
        let dialing = Dialing::system(config.rpc_timeout);
        DockerProvider::connect_with(config, dialing).await
    }

    /// [`DockerProvider::connect`], with a TCP daemon's name resolution and dialling injected;
    /// the guard and its policy are the same.
    pub async fn connect_with(
        config: DockerConfig,
        dialing: Dialing,
    ) -> Result<Checked<Self>, Error> {
        DockerProvider::start(config, dialing, None).await
    }

    /// [`DockerProvider::connect`], with `observer` hearing every agent channel's opens and
    /// round trips (the service's metrics).
    pub async fn connect_observed(
        config: DockerConfig,
        observer: Arc<dyn ChannelObserver>,
    ) -> Result<Checked<Self>, Error> {
        let dialing = Dialing::system(config.rpc_timeout);
        DockerProvider::start(config, dialing, Some(observer)).await
    }

    async fn start(
        config: DockerConfig,
        dialing: Dialing,
        observer: Option<Arc<dyn ChannelObserver>>,
    ) -> Result<Checked<Self>, Error> {
        config.validate()?;
        // Before the engine: an agent-mode start without a usable agent fails here, with the
        // fix named, and never goes on in exec mode.
        let agent = match config.data_plane {
            DataPlane::Agent => Some(AgentBinary::load(config.agent_path.as_deref()).await?),
            DataPlane::Exec => None,
        };
        let endpoint = engine::resolve_endpoint(
            config.host.as_deref(),
            std::env::var("DOCKER_HOST").ok().as_deref(),
            config.tls_cert_path.as_deref(),
        )?;
        if config.network == NetworkMode::Bridge
            && let Endpoint::Tcp(tcp) = &endpoint
            && !endpoint.is_on_this_host()
        {
            // Fail closed: rules installed here would leave a remote daemon's sandboxes open.
            return Err(Error::unsupported(
                Operation::VALIDATE,
                format!(
                    "network bridge needs the Docker daemon on this host (its egress rules are \
                     iptables chains installed where the adapter runs), and tcp://{} may be \
                     elsewhere: use network none, or reach a local daemon by a unix socket or \
                     tcp://127.0.0.1",
                    tcp.authority()
                ),
            )
            .with_code(ErrorCode::EgressProtectionUnavailable));
        }
        let (docker, version) =
            engine::connect_with(&endpoint, config.rpc_timeout, dialing).await?;
        let egress = match config.network {
            NetworkMode::Bridge => Some(EgressGuard::new(docker.clone(), &config.namespace)?),
            NetworkMode::None => None,
        };
        // A channel open past the idle TTL would keep an idle sandbox from the sweep.
        let mut channel_config = ChannelConfig::default();
        channel_config.idle_timeout = crate::channel::idle_timeout_for(config.idle_ttl);
        channel_config.observer = observer;
        let channels = agent
            .is_some()
            .then(|| Channels::new(docker.clone(), channel_config));
        Ok(Checked::new(DockerProvider {
            inner: Arc::new(Inner {
                docker,
                config,
                engine: version,
                egress,
                endpoint: format!("{endpoint:?}"),
                storage: StorageState::default(),
                agent,
                channels,
            }),
        }))
    }

    /// The kept channel to the agent of container `id`, in agent mode (`None` in exec mode).
    /// Opening it is lazy: the first [`Channel::lease`] runs the relay exec and checks the
    /// agent's version. The id must be one this provider resolved for the caller's namespace
    /// (a handle's id): the channel trusts it.
    pub fn channel(&self, id: &str) -> Option<Arc<Channel>> {
        self.inner.channels.as_ref().map(|c| c.get(id))
    }

    /// Forgets container `id`'s channel (after the container is deleted).
    pub(crate) fn forget_channel(&self, id: &str) {
        if let Some(c) = &self.inner.channels {
            c.remove(id);
        }
    }

    /// The engine's version answer.
    pub fn engine(&self) -> &EngineVersion {
        &self.inner.engine
    }

    /// The negotiated Engine API version, e.g. `1.41`.
    pub fn api_version(&self) -> String {
        let v = self.inner.docker.client_version();
        format!("{}.{}", v.major_version, v.minor_version)
    }

    /// How commands, files and terminals reach containers (`docker.data_plane`).
    pub fn data_plane(&self) -> DataPlane {
        self.inner.config.data_plane
    }

    /// Agent mode's checked agent binary; `None` in exec mode.
    pub fn agent(&self) -> Option<&AgentBinary> {
        self.inner.agent.as_ref()
    }

    /// The underlying engine client.
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// The adapter's namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    fn docker_ref(&self) -> &Docker {
        &self.inner.docker
    }

    /// Inspects a container this namespace owns; anything else is `not_found`.
    pub(crate) async fn inspect_owned(
        &self,
        op: Operation,
        id: &str,
    ) -> Result<bollard::models::ContainerInspectResponse, Error> {
        let inspect = self
            .docker_ref()
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .map_err(|e| errors::map(op, e))?;
        let owned = labels::owned_by(
            inspect.config.as_ref().and_then(|c| c.labels.as_ref()),
            &self.inner.config.namespace,
        );
        if !owned {
            return Err(no_such_sandbox(op, id));
        }
        Ok(inspect)
    }

    /// Makes sure `image` is present, pulling it per the pull policy, and returns what the
    /// engine knows of it (its labels say whether it is a snapshot). Snapshot images are local
    /// commits and never pulled.
    pub(crate) async fn ensure_image(
        &self,
        op: Operation,
        image: &str,
    ) -> Result<ImageInspect, Error> {
        let present = match self.docker_ref().inspect_image(image).await {
            Ok(inspect) => Some(inspect),
            Err(e) => {
                let mapped = errors::map(op, e);
                if mapped.http_status() != Some(404) {
                    return Err(mapped);
                }
                None
            }
        };
        let policy = self.inner.config.pull_policy;
        let must_pull = match policy {
            PullPolicy::Never => false,
            PullPolicy::Missing => present.is_none(),
            PullPolicy::Always => true,
        };
        if snapshots::is_snapshot_ref(image) || !must_pull {
            if let Some(inspect) = present {
                return Ok(inspect);
            }
            let why = if snapshots::is_snapshot_ref(image) {
                "snapshot images are local and never pulled".to_owned()
            } else {
                "the pull policy is never".to_owned()
            };
            return Err(Error::invalid_request(
                op,
                format!("image {image} is not present on the Docker engine and {why}"),
            )
            .with_code(ErrorCode::ImageNotPresent)
            .with_provider(Provider::Docker));
        }
        self.pull(op, image).await?;
        self.docker_ref()
            .inspect_image(image)
            .await
            .map_err(|e| errors::map(op, e))
    }

    async fn pull(&self, op: Operation, image: &str) -> Result<(), Error> {
        let options = CreateImageOptions {
            from_image: Some(image.to_owned()),
            ..Default::default()
        };
        let mut progress = self.docker_ref().create_image(Some(options), None, None);
        tracing::info!(image, "pulling image");
        let mut last_status = String::new();
        while let Some(update) = progress.next().await {
            match update {
                Ok(info) => {
                    // Progress for operators watching a first start: one line per status
                    // change, not one per byte-count update.
                    let status = info.status.unwrap_or_default();
                    if status != last_status {
                        tracing::info!(image, layer = info.id.as_deref().unwrap_or(""), %status, "pull progress");
                        last_status = status;
                    }
                }
                Err(e) => {
                    let mapped = errors::map(op, e);
                    let text = mapped.message().to_ascii_lowercase();
                    // A registry that answers "no such image" is the caller's bad template; a
                    // registry that cannot be reached may come back.
                    let kind = if text.contains("manifest unknown")
                        || text.contains("not found")
                        || text.contains("does not exist")
                        || text.contains("repository does not exist")
                        || text.contains("pull access denied")
                    {
                        ErrorKind::InvalidRequest
                    } else {
                        ErrorKind::Unavailable
                    };
                    return Err(Error::new(
                        kind,
                        op,
                        format!("pulling {image}: {}", mapped.message()),
                    )
                    .with_provider(Provider::Docker)
                    .with_code(ErrorCode::ImageNotPresent));
                }
            }
        }
        Ok(())
    }

    /// Starts or unpauses a container that is not running, then waits until it runs.
    pub(crate) async fn ensure_running(&self, op: Operation, id: &str) -> Result<(), Error> {
        let inspect = self.inspect_owned(op, id).await?;
        let status = inspect.state.as_ref().and_then(|s| s.status);
        match status {
            Some(ContainerStateStatusEnum::RUNNING) => return Ok(()),
            Some(ContainerStateStatusEnum::DEAD) => {
                return Err(provider_error(
                    ErrorKind::Terminal,
                    op,
                    format!("sandbox {id} is dead"),
                ));
            }
            Some(ContainerStateStatusEnum::PAUSED) => {
                self.docker_ref()
                    .unpause_container(id)
                    .await
                    .map_err(|e| errors::map(op, e))?;
            }
            _ => {
                // A stopped agent-mode container boots the agent file it holds: the current one
                // is copied in first, so code that replaced or removed it while the container
                // ran cannot decide what PID 1 is after a restart. A container created in exec
                // mode keeps its entrypoint, and gets nothing.
                let runs_agent = inspect
                    .config
                    .as_ref()
                    .and_then(|c| c.entrypoint.as_ref())
                    .and_then(|e| e.first())
                    .is_some_and(|first| first == agent::AGENT_PATH);
                if let (Some(binary), true) = (&self.inner.agent, runs_agent) {
                    agent::install::install(self.docker_ref(), op, id, binary).await?;
                }
                self.docker_ref()
                    .start_container(id, None::<StartContainerOptions>)
                    .await
                    .map_err(|e| errors::map(op, e))?;
            }
        }
        self.wait_running(op, id).await
    }

    async fn wait_running(&self, op: Operation, id: &str) -> Result<(), Error> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let inspect = self.inspect_owned(op, id).await?;
            match inspect.state.as_ref().and_then(|s| s.status) {
                Some(ContainerStateStatusEnum::RUNNING) => return Ok(()),
                Some(ContainerStateStatusEnum::DEAD) => {
                    return Err(provider_error(
                        ErrorKind::Terminal,
                        op,
                        format!("sandbox {id} died while starting"),
                    ));
                }
                Some(ContainerStateStatusEnum::EXITED) => {
                    let detail = inspect.state.and_then(|s| s.error).unwrap_or_default();
                    return Err(provider_error(
                        ErrorKind::Conflict,
                        op,
                        format!("sandbox {id} exited while starting {detail}"),
                    ));
                }
                _ => {}
            }
            if Instant::now() > deadline {
                return Err(provider_error(
                    ErrorKind::Timeout,
                    op,
                    format!("sandbox {id} did not start within 15s"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn handle(
        &self,
        id: &str,
        labels: Option<&HashMap<String, String>>,
    ) -> Result<SandboxHandle, Error> {
        Ok(SandboxHandle::new(SandboxId::new(id)?, Provider::Docker)
            .with_metadata(labels::labels_to_metadata(labels)))
    }

    async fn connect_inner(
        &self,
        op: Operation,
        request: ConnectRequest,
    ) -> Result<SandboxHandle, Error> {
        let id = request.sandbox_id.as_str();
        self.ensure_running(op, id).await?;
        let inspect = self.inspect_owned(op, id).await?;
        let full_id = inspect.id.clone().unwrap_or_else(|| id.to_owned());
        // Docker issues no traffic token; the caller's stored one (if any) rides along unchanged.
        Ok(self
            .handle(
                &full_id,
                inspect.config.as_ref().and_then(|c| c.labels.as_ref()),
            )?
            .with_traffic_token(request.traffic_token))
    }

    /// Runs an exec (through the agent in agent mode), retrying once when the container had stopped in between (an idle daemon
    /// restart, a host reboot): the handle is still good, the container just needs starting.
    /// The engine refuses the exec before anything runs, so the same request (borrowed, stdin
    /// and all) is simply run again.
    async fn exec_with_retry(&self, id: &str, request: &ExecRequest) -> Result<ExecResult, Error> {
        if let Some(channel) = self.channel(id) {
            return agent::exec::run(self, &channel, request).await;
        }
        let default_timeout = self.inner.config.default_exec_timeout;
        let max_output = self.inner.config.max_output_bytes;
        match exec::run(self.docker_ref(), id, request, default_timeout, max_output).await {
            Err(e) if errors::is_not_running(&e) => {
                self.ensure_running(Operation::EXEC, id).await?;
                exec::run(self.docker_ref(), id, request, default_timeout, max_output).await
            }
            other => other,
        }
    }
}

impl DockerProvider {
    /// Creates a container from `body` under a fresh name in this namespace.
    async fn create_container_named(
        &self,
        op: Operation,
        body: ContainerCreateBody,
    ) -> Result<bollard::models::ContainerCreateResponse, Error> {
        let name = format!(
            "sbx-{}-{:012x}",
            self.inner.config.namespace,
            fastrand::u64(..) & 0xffff_ffff_ffff
        );
        self.docker_ref()
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| errors::map(op, e))
    }
}

/// The log a container keeps on the engine's disk: one json-file rotated at `max_bytes` (so
/// it never holds more than that plus one message), or none at all for 0. Set on every
/// container rather than left to the daemon's default, which keeps everything.
pub(crate) fn log_config(max_bytes: u64) -> HostConfigLogConfig {
    if max_bytes == 0 {
        return HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        };
    }
    HostConfigLogConfig {
        typ: Some("json-file".to_owned()),
        config: Some(HashMap::from([
            ("max-size".to_owned(), max_bytes.to_string()),
            ("max-file".to_owned(), "1".to_owned()),
        ])),
    }
}

/// The writable layer's size limit, as the engine's storage drivers spell it.
fn storage_opt(bytes: u64) -> HashMap<String, String> {
    HashMap::from([("size".to_owned(), bytes.to_string())])
}

fn state_of(status: Option<ContainerStateStatusEnum>) -> SandboxState {
    match status {
        Some(ContainerStateStatusEnum::RUNNING) => SandboxState::Running,
        // A stopped container keeps its filesystem and a connect restarts it: paused, not gone.
        Some(
            ContainerStateStatusEnum::PAUSED
            | ContainerStateStatusEnum::EXITED
            | ContainerStateStatusEnum::CREATED,
        ) => SandboxState::Paused,
        Some(
            ContainerStateStatusEnum::RESTARTING
            | ContainerStateStatusEnum::REMOVING
            | ContainerStateStatusEnum::STOPPING,
        ) => SandboxState::Transitioning,
        Some(ContainerStateStatusEnum::DEAD) => SandboxState::Terminal,
        _ => SandboxState::Unknown,
    }
}

fn summary_state_of(status: Option<ContainerSummaryStateEnum>) -> SandboxState {
    match status {
        Some(ContainerSummaryStateEnum::RUNNING) => SandboxState::Running,
        Some(
            ContainerSummaryStateEnum::PAUSED
            | ContainerSummaryStateEnum::EXITED
            | ContainerSummaryStateEnum::CREATED,
        ) => SandboxState::Paused,
        Some(
            ContainerSummaryStateEnum::RESTARTING
            | ContainerSummaryStateEnum::REMOVING
            | ContainerSummaryStateEnum::STOPPING,
        ) => SandboxState::Transitioning,
        Some(ContainerSummaryStateEnum::DEAD) => SandboxState::Terminal,
        _ => SandboxState::Unknown,
    }
}

fn parse_created(raw: Option<&str>) -> Option<time::OffsetDateTime> {
    raw.and_then(|s| sandbox_core::timefmt::parse(s).ok())
}

#[async_trait]
impl SandboxProvider for DockerProvider {
    fn provider(&self) -> Provider {
        Provider::Docker
    }

    fn capabilities(&self) -> Capabilities {
        docker_capabilities_for(self.data_plane())
    }

    fn network_fields(&self) -> NetworkFields {
        docker_network_fields()
    }

    async fn health(&self) -> Result<(), Error> {
        self.docker_ref()
            .ping()
            .await
            .map(drop)
            .map_err(|e| errors::map(Operation::HEALTH, e))
    }

    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error> {
        // Validation, volumes and network-policy fields are the checking layer's.
        let op = Operation::CREATE;
        // `on_timeout = pause` makes the idle sweep pause the container instead of deleting
        // it; `auto_resume` needs nothing more, since every connect resumes a paused container.
        let pause_on_idle = request.timeout.on_timeout == TimeoutAction::Pause;
        let ttl_secs = match request.timeout.idle {
            IdleTimeout::ServerDefault => self.inner.config.idle_ttl.as_secs(),
            IdleTimeout::After(d) => d.as_secs().max(1),
            IdleTimeout::Never => 0,
        };
        let config = &self.inner.config;
        let mut container_labels = labels::metadata_labels(&request.metadata)?;
        for (k, v) in &config.extra_labels {
            container_labels.insert(k.clone(), v.clone());
        }
        container_labels.insert(labels::MANAGED.to_owned(), "true".to_owned());
        container_labels.insert(labels::NAMESPACE.to_owned(), config.namespace.clone());
        container_labels.insert(labels::IDLE_TTL.to_owned(), ttl_secs.to_string());
        if pause_on_idle {
            container_labels.insert(labels::ON_IDLE.to_owned(), labels::ON_IDLE_PAUSE.to_owned());
        }

        // A restore, or any template in a snapshot repository, boots only this tenant's
        // snapshot of this namespace ([create.snapshot_owner]); it is never pulled.
        let restore =
            request.from_snapshot || snapshots::is_snapshot_ref(request.template.as_str());
        // With the image's `ENV`, which agent mode hands to the agent (`agent::sandbox_env`).
        let template_build = template_builds::is_template_ref(request.template.as_str());
        let (image, image_env) = if template_build && !request.from_snapshot {
            // [template_builds.owner]: the tenant's own built template, by its checked ID.
            let tenant = request
                .metadata
                .get(sandbox_core::TEMPLATE_TENANT)
                .map(String::as_str);
            self.bootable_template(request.template.as_str(), tenant)
                .await?
        } else if restore {
            let tenant = request
                .metadata
                .get(owner_metadata::TENANT)
                .map(String::as_str);
            self.restorable_image(request.template.as_str(), tenant)
                .await?
        } else {
            let image = request.template.as_str();
            let inspect = self.ensure_image(op, image).await?;
            let config = inspect.config.unwrap_or_default();
            Self::refuse_snapshot_image(config.labels.as_ref())?;
            Self::refuse_template_image(config.labels.as_ref())?;
            (image.to_owned(), config.env.unwrap_or_default())
        };

        // No egress at all when the policy denies it by default (a Docker network cannot
        // allow-list destinations), else the adapter's own protected bridge — never docker0.
        let network_mode = match (
            config.network,
            request.network.denies_egress_by_default(),
            &self.inner.egress,
        ) {
            (NetworkMode::None, _, _) | (_, true, _) => "none".to_owned(),
            (NetworkMode::Bridge, false, Some(guard)) => {
                guard
                    .ensure(EgressPolicy {
                        allow_private: config.allow_private_endpoints,
                    })
                    .await?
                    .name
            }
            (NetworkMode::Bridge, false, None) => {
                return Err(provider_error(
                    ErrorKind::Internal,
                    op,
                    "bridge mode without an egress guard",
                ));
            }
        };
        let env: Vec<String> = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let storage_limit = self.storage_limit_for_create().await;
        // The entrypoint replaces the image's, so any image becomes a sandbox, and is the
        // container's long-running process. Exec mode: a shell that creates the activity marker
        // (world-writable, so commands under other accounts still record activity) and idles
        // until commands arrive through exec, under the engine's init, which reaps the zombies
        // agents' background jobs leave behind. Agent mode: the agent installed below, as PID 1
        // (it reaps orphans itself, so no init); the install also creates the marker.
        let (entrypoint, init) = match &self.inner.agent {
            // The agent starts processes with an environment of its own making, so the
            // sandbox's environment (the image's `ENV` under the request's, as the engine gives
            // exec mode's processes) is handed to it as its defaults.
            Some(_) => (
                agent::entrypoint_with_env(
                    &agent::sandbox_env(&image_env, &request.env),
                    self.inner.config.processes_per_sandbox,
                    request.user.as_ref(),
                ),
                false,
            ),
            None => (
                vec![
                    "/bin/sh".to_owned(),
                    "-c".to_owned(),
                    format!(
                        "mkdir -p /var/lib 2>/dev/null; touch {ACTIVITY_MARKER}; chmod 666 {ACTIVITY_MARKER} 2>/dev/null; exec sleep infinity"
                    ),
                ],
                true,
            ),
        };
        // The default workdir: where exec mode's processes start (the engine's default), and
        // what agent mode's channel reads as the cwd of a call naming none. The engine creates
        // it when the image lacks it.
        let workdir = request
            .user
            .as_ref()
            .map_or(sandbox_core::policy::workspace::WORKSPACE_ROOT, |u| {
                u.workdir.as_str()
            });
        let mut body = ContainerCreateBody {
            image: Some(image),
            user: Some("0".to_owned()),
            entrypoint: Some(entrypoint),
            cmd: Some(Vec::new()),
            working_dir: Some(workdir.to_owned()),
            env: Some(env),
            labels: Some(container_labels),
            host_config: Some(HostConfig {
                // Memory = memory + swap: swap would let a sandbox trade the host's disk I/O for
                // a memory limit it is not supposed to exceed.
                memory: Some(config.memory_bytes),
                memory_swap: Some(config.memory_bytes),
                nano_cpus: Some((config.cpu_limit * 1e9) as i64),
                pids_limit: Some(config.pids_limit),
                cap_drop: Some(vec!["ALL".to_owned()]),
                cap_add: Some(CAP_ADD.iter().map(|c| (*c).to_owned()).collect()),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                init: Some(init),
                runtime: config.runtime.clone(),
                network_mode: Some(network_mode),
                // Code in the sandbox can write to PID 1's stdout (in agent mode, the agent's
                // log goes there too); without a bound the engine would copy all of it onto the
                // host's disk.
                log_config: Some(log_config(config.log_max_bytes)),
                storage_opt: storage_limit.map(storage_opt),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut created = self.create_container_named(op, body.clone()).await;
        if let (Some(_), Err(e)) = (storage_limit, &created)
            && isolation::is_storage_refusal(e.message())
        {
            // This engine cannot hold a container to a size (overlay2 without xfs pquota, say):
            // remembered, warned about once, and never a reason to fail the create.
            self.storage_refused(e.message());
            if let Some(host) = body.host_config.as_mut() {
                host.storage_opt = None;
            }
            created = self.create_container_named(op, body).await;
        } else if storage_limit.is_some() && created.is_ok() {
            self.storage_accepted();
        }
        let created = match created {
            // The checked image went away before the container could be made from it.
            Err(e) if restore && e.http_status() == Some(404) => {
                return Err(snapshots::snapshot_not_found());
            }
            other => other?,
        };
        let id = created.id;
        let started = async {
            // Into the created container, before it starts: its entrypoint is this file. A
            // restore gets the current agent too, over whatever its snapshot carried.
            if let Some(agent) = &self.inner.agent {
                agent::install::install(self.docker_ref(), op, &id, agent).await?;
            }
            self.docker_ref()
                .start_container(&id, None::<StartContainerOptions>)
                .await
                .map_err(|e| errors::map(op, e))?;
            self.wait_running(op, &id).await?;
            // The agent resolves the default user per request, from the image's accounts:
            // an image without the account fails each call naming no user ("invalid default
            // user"), not the create, so an account provisioned after the create is honoured.
            if let Some(channel) = self.channel(&id) {
                channel.remember_workdir(workdir);
            }
            Ok::<_, Error>(())
        };
        if let Err(err) = started.await {
            // A container that cannot start is removed, not left for the sweeper.
            let _ = self
                .docker_ref()
                .remove_container(
                    &id,
                    Some(RemoveContainerOptions {
                        force: true,
                        v: true,
                        ..Default::default()
                    }),
                )
                .await;
            return Err(err);
        }
        tracing::debug!(sandbox = %id, namespace = %config.namespace, "created sandbox container");
        crate::sweeper::trigger(self);
        let handle = SandboxHandle::new(SandboxId::new(&id)?, Provider::Docker)
            .with_metadata(request.metadata);
        Ok(handle)
    }

    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let handle = self.connect_inner(Operation::CONNECT, request).await?;
        crate::sweeper::trigger(self);
        Ok(handle)
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        let inspect = self.inspect_owned(Operation::GET, id.as_str()).await?;
        let labels = inspect.config.as_ref().and_then(|c| c.labels.as_ref());
        let status = inspect.state.as_ref().and_then(|s| s.status);
        Ok(SandboxSummary {
            id: SandboxId::new(inspect.id.clone().unwrap_or_else(|| id.as_str().to_owned()))?,
            template: inspect
                .config
                .as_ref()
                .and_then(|c| c.image.clone())
                .and_then(|i| TemplateId::new(i).ok()),
            state: state_of(status),
            raw_state: status.map(|s| s.to_string()).unwrap_or_default(),
            metadata: labels::labels_to_metadata(labels),
            started_at: parse_created(inspect.created.as_deref()),
            ended_at: None,
        })
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        let config = &self.inner.config;
        let mut label_filters = vec![
            format!("{}=true", labels::MANAGED),
            format!("{}={}", labels::NAMESPACE, config.namespace),
        ];
        for (k, v) in &filter.metadata {
            labels::validate_label_key(k)?;
            label_filters.push(format!("{}{k}={v}", labels::META_PREFIX));
        }
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), label_filters)])),
            ..Default::default()
        };
        let containers = self
            .docker_ref()
            .list_containers(Some(options))
            .await
            .map_err(|e| errors::map(Operation::LIST, e))?;
        let mut out = Vec::with_capacity(containers.len());
        for c in containers {
            let Some(id) = c.id.as_deref().and_then(|i| SandboxId::new(i).ok()) else {
                continue;
            };
            // The engine filtered by label; re-check ownership so a filter bug can never hand a
            // foreign container to the caller.
            if !labels::owned_by(c.labels.as_ref(), &config.namespace) {
                continue;
            }
            let summary = SandboxSummary {
                id,
                template: c.image.clone().and_then(|i| TemplateId::new(i).ok()),
                state: summary_state_of(c.state),
                raw_state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                metadata: labels::labels_to_metadata(c.labels.as_ref()),
                started_at: c
                    .created
                    .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok()),
                ended_at: None,
            };
            if filter.matches(&summary) {
                out.push(summary);
            }
        }
        Ok(out)
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        // Ownership first: a tenant-supplied ID must never remove a container this namespace
        // does not own.
        self.inspect_owned(Operation::DELETE, id.as_str()).await?;
        // The channel's exec dies with the container; its entry would only hold memory.
        self.forget_channel(id.as_str());
        self.docker_ref()
            .remove_container(
                id.as_str(),
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| errors::map(Operation::DELETE, e))
    }

    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        self.exec_with_retry(sandbox.id().as_str(), &request).await
    }

    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::write(&channel, path, content).await;
        }
        files::write(self.docker_ref(), sandbox.id().as_str(), path, content).await
    }

    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::read(&channel, path).await;
        }
        files::read(self.docker_ref(), sandbox.id().as_str(), path).await
    }

    async fn read_file_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            let stream =
                agent::files::read_stream(&channel, path, max_bytes, files::STREAM_TIMEOUT).await?;
            return Ok(Box::new(stream));
        }
        let stream = files::read_stream(
            self.docker_ref(),
            sandbox.id().as_str(),
            path,
            max_bytes,
            files::STREAM_TIMEOUT,
        )
        .await?;
        Ok(Box::new(stream))
    }

    async fn list_tree(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        limits: TreeLimits,
    ) -> Result<TreeListing, Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::tree(&channel, dir, limits).await;
        }
        files::tree(self.docker_ref(), sandbox.id().as_str(), dir, limits).await
    }

    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::list(&channel, path).await;
        }
        files::list(self.docker_ref(), sandbox.id().as_str(), path).await
    }

    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::make_dir(&channel, path).await;
        }
        files::make_dir(self.docker_ref(), sandbox.id().as_str(), path).await
    }

    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::remove(&channel, path).await;
        }
        files::remove(self.docker_ref(), sandbox.id().as_str(), path).await
    }

    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        if let Some(channel) = self.channel(sandbox.id().as_str()) {
            return agent::files::stat(&channel, path).await;
        }
        files::stat(self.docker_ref(), sandbox.id().as_str(), path).await
    }

    fn as_template_builds(&self) -> Option<&dyn sandbox_core::TemplateBuilds> {
        Some(self)
    }
    fn as_snapshots(&self) -> Option<&dyn Snapshots> {
        Some(self)
    }
    fn as_template_catalog(&self) -> Option<&dyn TemplateCatalog> {
        Some(self)
    }
    fn as_terminals(&self) -> Option<&dyn Terminals> {
        Some(self)
    }
    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        Some(self)
    }
    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        Some(self)
    }
    fn as_streamed_files(&self) -> Option<&dyn StreamedFiles> {
        (self.data_plane() == DataPlane::Agent).then_some(self as &dyn StreamedFiles)
    }
    fn as_watch(&self) -> Option<&dyn Watch> {
        (self.data_plane() == DataPlane::Agent).then_some(self as &dyn Watch)
    }
    fn as_terminal_reattach(&self) -> Option<&dyn sandbox_core::TerminalReattach> {
        (self.data_plane() == DataPlane::Agent)
            .then_some(self as &dyn sandbox_core::TerminalReattach)
    }
    fn as_pause_resume(&self) -> Option<&dyn sandbox_core::PauseResume> {
        Some(self)
    }
    fn as_processes(&self) -> Option<&dyn Processes> {
        (self.data_plane() == DataPlane::Agent).then_some(self as &dyn Processes)
    }
    fn as_tunnels(&self) -> Option<&dyn Tunnels> {
        (self.data_plane() == DataPlane::Agent).then_some(self as &dyn Tunnels)
    }
}

/// Tunnels to ports inside the container over the agent's channel (agent plane only;
/// `channel::tunnel`).
#[async_trait]
impl Tunnels for DockerProvider {
    async fn open_tunnel(&self, sandbox: &SandboxHandle, port: u16) -> Result<Tunnel, Error> {
        let op = Operation::OPEN_TUNNEL;
        let channel = self.agent_channel(sandbox, op)?;
        let lease = agent::exec::lease(self, op, &channel).await?;
        match crate::channel::tunnel::open(lease, port).await {
            Ok(tunnel) => Ok(tunnel),
            // A refusal by the agent is its answer; a channel failure may be a container
            // that was paused or removed meanwhile, which is said as such.
            Err(e) if e.code().is_some() => Err(e),
            Err(e) => Err(agent::exec::explain(&self.inner.docker, channel.container(), e).await),
        }
    }
}

/// Background processes through the agent (agent plane only; `agent::process`).
#[async_trait]
impl Processes for DockerProvider {
    async fn start_process(
        &self,
        sandbox: &SandboxHandle,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, Error> {
        let channel = self.agent_channel(sandbox, Operation::START_PROCESS)?;
        agent::process::start(self, &channel, spec).await
    }

    async fn list_processes(&self, sandbox: &SandboxHandle) -> Result<Vec<ProcessInfo>, Error> {
        let channel = self.agent_channel(sandbox, Operation::LIST_PROCESSES)?;
        agent::process::list(self, &channel).await
    }

    async fn attach_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        from: Option<u64>,
    ) -> Result<ProcessStream, Error> {
        let channel = self.agent_channel(sandbox, Operation::ATTACH_PROCESS)?;
        let attach = agent::process::attach(self, &channel, target, from).await?;
        Ok(Box::new(attach))
    }

    async fn send_input(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        data: &[u8],
    ) -> Result<(), Error> {
        let channel = self.agent_channel(sandbox, Operation::SEND_INPUT)?;
        agent::process::send_input(self, &channel, target, data).await
    }

    async fn close_stdin(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
    ) -> Result<(), Error> {
        let channel = self.agent_channel(sandbox, Operation::CLOSE_STDIN)?;
        agent::process::close_stdin(self, &channel, target).await
    }

    async fn signal_process(
        &self,
        sandbox: &SandboxHandle,
        target: &ProcessSelector,
        signal: Signal,
    ) -> Result<(), Error> {
        let channel = self.agent_channel(sandbox, Operation::SIGNAL_PROCESS)?;
        agent::process::signal(self, &channel, target, signal).await
    }
}

/// Directory watches over the agent's channel (agent plane only).
#[async_trait]
impl Watch for DockerProvider {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        let channel = self.agent_channel(sandbox, Operation::WATCH_DIR)?;
        let watch = agent::files::watch_dir(&channel, dir, recursive).await?;
        Ok(Box::new(watch))
    }
}

/// Streamed files over the agent's channel (agent plane only; see [`docker_capabilities_for`]).
#[async_trait]
impl StreamedFiles for DockerProvider {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        let channel = self.agent_channel(sandbox, Operation::READ_FILE_STREAM)?;
        let stream =
            agent::files::read_stream(&channel, path, max_bytes, files::STREAM_TIMEOUT).await?;
        Ok(Box::new(stream))
    }

    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        let channel = self.agent_channel(sandbox, Operation::WRITE_FILE_STREAM)?;
        agent::files::write_stream(&channel, path, source, max_bytes).await
    }

    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        let channel = self.agent_channel(sandbox, Operation::RENAME_PATH)?;
        agent::files::rename(&channel, from, to).await
    }
}

impl DockerProvider {
    /// The sandbox's agent channel, for the capabilities only the agent plane serves.
    fn agent_channel(&self, sandbox: &SandboxHandle, op: Operation) -> Result<Arc<Channel>, Error> {
        self.channel(sandbox.id().as_str()).ok_or_else(|| {
            Error::unsupported(op, "this capability needs the agent data plane")
                .with_provider(Provider::Docker)
        })
    }
}

#[async_trait]
impl KeepAlive for DockerProvider {
    /// A no-op exec: the wrapper touches the activity marker, which is all the idle sweeper
    /// reads, so `ttl` is not needed.
    async fn keep_alive(&self, sandbox: &SandboxHandle, _ttl: Duration) -> Result<(), Error> {
        let result = self
            .exec_with_retry(
                sandbox.id().as_str(),
                &ExecRequest::argv("true", Vec::<String>::new()),
            )
            .await?;
        if result.exit_code != 0 {
            return Err(provider_error(
                ErrorKind::Internal,
                Operation::KEEP_ALIVE,
                format!("keep-alive exec exited {}", result.exit_code),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl ConnectProbe for DockerProvider {
    /// Connect already inspects the container (dead ⇒ terminal, missing ⇒ not_found) and resumes
    /// a stopped one, so the probe is the connect itself. It starts the idle sweep as a connect
    /// does: every request to a bound session comes through here, so without it a service
    /// whose traffic goes to existing sessions only would never reclaim an abandoned one.
    ///
    /// In agent mode a container connected once before is probed by the channel's health call
    /// instead of an inspect ([`Channel::connected`]): the answer proves what the inspect
    /// would (it runs, unpaused; its labels were checked and cannot change). Anything short of
    /// an answer falls back to the full connect, which starts, unpauses or refuses it.
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        crate::sweeper::trigger(self);
        let channel = self.channel(request.sandbox_id.as_str());
        if let Some(channel) = &channel
            && let Some(handle) = channel.connected().await
        {
            return Ok(handle.with_traffic_token(request.traffic_token));
        }
        let handle = self
            .connect_inner(Operation::CONNECT_SESSION, request)
            .await?;
        if let Some(channel) = channel {
            channel.remember_connected(&handle);
        }
        Ok(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declares_every_capability_but_timeout_refresh_volumes_desktop_and_issue_17s() {
        let expected = Capability::ALL
            .into_iter()
            .filter(|c| {
                !matches!(
                    c,
                    Capability::TimeoutRefresh
                        | Capability::Volumes
                        | Capability::Desktop
                        | Capability::Processes
                        | Capability::StreamedFiles
                        | Capability::Watch
                        | Capability::TerminalReattach
                        | Capability::DefaultUser
                        | Capability::Tunnels
                )
            })
            .fold(Capabilities::NONE, |set, c| set.with(c, true));
        assert_eq!(docker_capabilities(), expected);
        assert_eq!(docker_capabilities_for(DataPlane::Exec), expected);
        // The agent plane keeps background processes, streams files, watches directories,
        // reattaches terminals and runs as the create's default user; nothing else differs.
        assert_eq!(
            docker_capabilities_for(DataPlane::Agent),
            expected
                .with(Capability::Processes, true)
                .with(Capability::StreamedFiles, true)
                .with(Capability::Watch, true)
                .with(Capability::TerminalReattach, true)
                .with(Capability::DefaultUser, true)
                .with(Capability::Tunnels, true)
        );
    }

    #[test]
    fn enforces_only_the_internet_switch_of_a_network_policy() {
        let fields: Vec<NetworkField> = docker_network_fields().iter().collect();
        assert_eq!(fields, [NetworkField::AllowInternetAccess]);
        // A deny list is refused by name before any engine call (the Docker network cannot
        // apply it), and the internet switch alone passes the policy.
        let policy = sandbox_core::NetworkPolicy {
            allow_internet_access: Some(false),
            deny_out: vec!["10.0.0.0/8".to_owned()],
            ..sandbox_core::NetworkPolicy::default()
        };
        let refused: Vec<NetworkField> = docker_network_fields().unenforced(&policy).collect();
        assert_eq!(refused, [NetworkField::DenyOut]);
    }

    #[test]
    fn logs_are_one_bounded_json_file_or_off() {
        let bounded = log_config(1024 * 1024);
        assert_eq!(bounded.typ.as_deref(), Some("json-file"));
        let opts = bounded.config.unwrap();
        assert_eq!(opts.get("max-size").map(String::as_str), Some("1048576"));
        assert_eq!(opts.get("max-file").map(String::as_str), Some("1"));
        let off = log_config(0);
        assert_eq!((off.typ.as_deref(), off.config), (Some("none"), None));
        assert_eq!(
            storage_opt(10).get("size").map(String::as_str),
            Some("10"),
            "plain bytes: every driver parses them"
        );
    }

    #[test]
    fn states_normalize_exited_to_paused_and_dead_to_terminal() {
        assert_eq!(
            state_of(Some(ContainerStateStatusEnum::EXITED)),
            SandboxState::Paused
        );
        assert_eq!(
            state_of(Some(ContainerStateStatusEnum::CREATED)),
            SandboxState::Paused
        );
        assert_eq!(
            state_of(Some(ContainerStateStatusEnum::PAUSED)),
            SandboxState::Paused
        );
        assert_eq!(
            state_of(Some(ContainerStateStatusEnum::DEAD)),
            SandboxState::Terminal
        );
        assert_eq!(
            state_of(Some(ContainerStateStatusEnum::REMOVING)),
            SandboxState::Transitioning
        );
        assert_eq!(state_of(None), SandboxState::Unknown);
        assert_eq!(
            summary_state_of(Some(ContainerSummaryStateEnum::EXITED)),
            SandboxState::Paused
        );
    }
}

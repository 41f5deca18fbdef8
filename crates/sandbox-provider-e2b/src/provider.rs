//! The provider: its constructor, its capabilities, and the lifecycle on the control plane
//! (health, create, connect, get, list, delete, pause, resume, keep-alive).
//!
//! - **Health** is a v2 list with `limit=1`: compatible planes implement only the v2 list, and
//!   it proves the key too.
//! - **Create** sends the template (the request's), the timeout in whole seconds rounded up
//!   (the config's TTL for the server default; below a second, or never, is refused), kill or
//!   pause at the timeout (auto-resume asks for a memory pause), the network policy (internet
//!   on unless denied, allow and deny lists, per-host header rules, and public traffic closed
//!   unless opened, so the plane issues a traffic token, registered at once), the metadata
//!   (escaped, `metadata.rs`) and the env. It carries a random create marker in its metadata,
//!   so a create the plane refused with 429 or 503 is sent again only after a list by that
//!   marker found nothing: a create the plane did make is adopted, never made twice. A create
//!   that timed out or lost its connection is not retried at all (whether it happened cannot
//!   be known); the session layer's orphan recovery finds it by its ownership metadata.
//! - **Connect** resumes a paused sandbox (`/connect` with the TTL), then reads it (`GET`) for
//!   its metadata; a traffic token the answer lacks is restored from the request. **Get** only
//!   reads: it never resumes.
//! - **List** asks the plane to match one metadata pair (`metadata::server_pair`) and the
//!   states it has words for, pages with `nextToken` (a token seen twice, or one that would
//!   need escaping, is an error rather than a loop), and applies the whole filter locally.
//! - **Delete** kills; the traffic token and the envd client are forgotten.
//!
//! The data plane is envd, reached per sandbox through `envd.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Method;
use sandbox_core::{
    Capabilities, Capability, Checked, ConnectProbe, ConnectRequest, CreateRequest, DirEntry,
    Error, ErrorCode, ErrorKind, ExecRequest, ExecResult, IdleTimeout, KeepAlive, ListFilter,
    Metadata, NetworkField, NetworkFields, Operation, PauseResume, Provider, SandboxHandle,
    SandboxId, SandboxPath, SandboxProvider, SandboxState, SandboxSummary, Secret, StatEntry,
    TemplateId, TimeoutAction, TimeoutPolicy,
};
use sandbox_transport::gateway::GatewayTarget;
use sandbox_transport::{GatewayPool, GuardedConnector, OutboundPolicy};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::E2bConfig;
use crate::control::{Answer, Call, Control, segment};
use crate::envd::{Envds, SandboxEnvd};
use crate::errors::{self, provider_error};
use crate::metadata;
use crate::wire;

/// The metadata key (port form) of a create's idempotency marker; never shown to callers.
pub const CREATE_MARKER: &str = "sandbox_e2b_create";
/// How many times a create the plane refused with 429 or 503 is sent at most.
pub const CREATE_ATTEMPTS: u32 = 3;
/// The wait before a create is sent again when the refusal named no `Retry-After`.
pub const CREATE_RETRY_WAIT: Duration = Duration::from_secs(1);
/// The most pages one list reads: a plane that keeps handing out new tokens is cut off.
pub const MAX_LIST_PAGES: usize = 1000;
/// A list page's size (the v2 list's maximum).
pub const LIST_PAGE: u32 = 100;

/// The capabilities this adapter declares. Left out, and why:
/// - `volumes`: E2B's volume mounts are a separate product with their own lifecycle, not built
///   here;
/// - `desktop`: no desktop image exists for this adapter yet (the crate README says so);
/// - `default_user`: commands and files act as root unless the call names a user; E2B's
///   create has no field for a default user, so a create's user could not be honoured;
/// - `tunnels`: E2B reaches ports through its own public URLs, not a byte tunnel;
/// - `template_builds`: E2B builds templates from its own build system, which this adapter
///   does not drive;
/// - `timeout_refresh` is declared with `keep_alive`: both are the plane's `/timeout`.
pub fn e2b_capabilities() -> Capabilities {
    Capabilities::from_slice(&[
        Capability::Reconnect,
        Capability::Metadata,
        Capability::List,
        Capability::PauseResume,
        Capability::TimeoutRefresh,
        Capability::ConnectProbe,
        Capability::KeepAlive,
        Capability::FsEnumeration,
        Capability::PosixShell,
        Capability::Processes,
        Capability::Pty,
        Capability::TerminalReattach,
        Capability::StreamedFiles,
        Capability::Watch,
        Capability::Snapshots,
        Capability::TemplateCatalog,
    ])
}

/// The network-policy fields E2B enforces: every field of its `network` object.
pub fn e2b_network_fields() -> NetworkFields {
    NetworkFields::from_slice(&[
        NetworkField::AllowInternetAccess,
        NetworkField::AllowPublicTraffic,
        NetworkField::AllowOut,
        NetworkField::DenyOut,
        NetworkField::E2bHostRules,
    ])
}

/// The E2B backend. See the module docs.
#[derive(Debug)]
pub struct E2bProvider {
    config: E2bConfig,
    control: Control,
    pool: Arc<GatewayPool<Full<Bytes>>>,
    gateway: Option<GatewayTarget>,
    envds: Envds,
    /// Held across one `ensure_standard_template`, so two callers of this process never both
    /// build the standard template: the second finds the first's build.
    ensuring: tokio::sync::Mutex<()>,
}

impl E2bProvider {
    /// The adapter for `config`, on a pool of its own, wrapped in the checking layer.
    pub fn new(config: E2bConfig) -> Result<Checked<Self>, Error> {
        let policy = if config.allow_private_endpoints {
            OutboundPolicy::allow_private()
        } else {
            OutboundPolicy::deny_private()
        };
        let tls = sandbox_transport::tls_config(true, &[]).map_err(provider_error)?;
        let pool = Arc::new(GatewayPool::new(GuardedConnector::new(policy), tls));
        Self::with_pool(config, pool)
    }

    /// The adapter for `config` on `pool` (the process's pool for its outbound policy, whose
    /// token registry the service's other clients read), wrapped in the checking layer.
    pub fn with_pool(
        config: E2bConfig,
        pool: Arc<GatewayPool<Full<Bytes>>>,
    ) -> Result<Checked<Self>, Error> {
        config.validate().map_err(provider_error)?;
        let api = crate::control::parse_api_url(&config.api_url)?;
        let gateway = match config.proxy_url.trim() {
            "" => None,
            raw => Some(GatewayTarget::parse(raw).map_err(provider_error)?),
        };
        let client = pool.client_for(api.host_str(), gateway.as_ref());
        let control = Control::new(client, &config.api_url, &config.api_key)?;
        let envds = Envds::new(&config, gateway.clone(), pool.clone());
        Ok(Checked::new(E2bProvider {
            config,
            control,
            pool,
            gateway,
            envds,
            ensuring: tokio::sync::Mutex::new(()),
        }))
    }

    /// The adapter's config.
    pub fn config(&self) -> &E2bConfig {
        &self.config
    }

    /// The lock one `ensure_standard_template` holds (see the field).
    pub(crate) async fn ensuring(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.ensuring.lock().await
    }

    /// The control-plane client (for the capability files beside this one).
    pub(crate) fn control(&self) -> &Control {
        &self.control
    }

    /// The gateway data-plane requests are dialled at, if any.
    pub fn gateway(&self) -> Option<&GatewayTarget> {
        self.gateway.as_ref()
    }

    /// The envd of `sandbox`: the one its handle carries, or the one a connect finds.
    pub(crate) async fn envd(&self, sandbox: &SandboxHandle) -> Result<SandboxEnvd, Error> {
        if let Some(envd) = sandbox.adapter_state::<SandboxEnvd>() {
            return Ok(envd.clone());
        }
        if let Some(envd) = self.envds.get(sandbox.id().as_str()) {
            return Ok(envd);
        }
        let handle = self
            .connect(ConnectRequest::new(sandbox.id().clone()))
            .await?;
        handle
            .adapter_state::<SandboxEnvd>()
            .cloned()
            .ok_or_else(|| {
                provider_error(Error::internal(Operation::CONNECT, "connect gave no envd"))
            })
    }

    /// What a failed data-plane call on `id` means, asked of the control plane: a sandbox that
    /// is gone is `not_found` with code `sandbox_gone`, a paused one `unavailable` with code
    /// `session_sandbox_paused`; otherwise `error` as it is. The question is bounded by the
    /// HTTP timeout and its own failure leaves `error` alone.
    pub(crate) async fn explain(&self, id: &SandboxId, error: Error) -> Error {
        // A caller's mistake or a refused credential says nothing about the sandbox. Anything
        // else may be the router in front of envd answering for a sandbox that is paused or
        // gone (a 404 there reads as `unsupported` to a Connect client, a 409 as unknown).
        if matches!(
            error.kind(),
            ErrorKind::InvalidRequest | ErrorKind::Authentication
        ) && error.http_status().is_none_or(|s| s != 409)
        {
            return error;
        }
        let op = error.operation();
        match self.get(id).await {
            Ok(summary) if summary.state == SandboxState::Paused => {
                provider_error(Error::unavailable(op, format!("sandbox '{id}' is paused")))
                    .with_code(ErrorCode::SandboxPaused)
            }
            Ok(_) => error,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                provider_error(Error::not_found(op, format!("sandbox '{id}' is gone")))
                    .with_code(ErrorCode::SandboxGone)
            }
            Err(_) => error,
        }
    }

    fn timeout_seconds(&self, policy: &TimeoutPolicy) -> Result<u64, Error> {
        match policy.idle {
            IdleTimeout::ServerDefault => Ok(self.config.ttl().as_secs()),
            IdleTimeout::After(d) if d < Duration::from_secs(1) => {
                Err(provider_error(Error::invalid_request(
                    Operation::CREATE,
                    format!("an E2B timeout is whole seconds; {d:?} is below one"),
                )))
            }
            IdleTimeout::After(d) => Ok(d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            IdleTimeout::Never => Err(provider_error(Error::unsupported(
                Operation::CREATE,
                "an E2B sandbox always has a timeout; keep it alive with keep_alive instead",
            ))),
        }
    }

    fn new_sandbox(
        &self,
        request: &CreateRequest,
        marker: &str,
    ) -> Result<wire::NewSandbox, Error> {
        let timeout = self.timeout_seconds(&request.timeout)?;
        let pause = request.timeout.on_timeout == TimeoutAction::Pause;
        let network = &request.network;
        let rules = network
            .e2b_host_rules
            .iter()
            .map(|rule| {
                let headers = rule
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.expose().to_owned()))
                    .collect();
                let transform = wire::Transform { headers };
                (rule.host.clone(), vec![wire::NetworkRule { transform }])
            })
            .collect();
        let mut metadata = metadata::to_wire(&request.metadata);
        metadata.insert(metadata::wire_key(CREATE_MARKER), marker.to_owned());
        Ok(wire::NewSandbox {
            template_id: request.template.as_str().to_owned(),
            timeout,
            auto_pause: pause,
            auto_pause_memory: request.timeout.auto_resume.then_some(true),
            auto_resume: request
                .timeout
                .auto_resume
                .then_some(wire::AutoResume { enabled: true }),
            secure: true,
            allow_internet_access: network.allow_internet_access.unwrap_or(true),
            network: wire::Network {
                allow_public_traffic: network.allow_public_traffic.unwrap_or(false),
                allow_out: network.allow_out.clone(),
                deny_out: network.deny_out.clone(),
                rules,
            },
            metadata,
            env_vars: request.env.clone(),
        })
    }

    /// A handle for the plane's answer about sandbox `id`, with `metadata` (port form) and the
    /// traffic token the answer has, or else `restored`.
    fn handle(
        &self,
        op: Operation,
        answer: &wire::SandboxAnswer,
        metadata: Metadata,
        restored: Option<Secret>,
    ) -> Result<SandboxHandle, Error> {
        let id = SandboxId::new(answer.sandbox_id.clone()).map_err(|e| {
            errors::unreadable(op, format!("sandbox ID {:?}: {e}", answer.sandbox_id))
        })?;
        let token = answer
            .traffic_access_token
            .clone()
            .filter(|t| !t.is_empty())
            .map(Secret::new)
            .or(restored);
        if let Some(token) = &token {
            self.pool.tokens().put(id.as_str(), token);
        }
        let envd_token = answer.envd_access_token.clone().map(Secret::new);
        let envd = self
            .envds
            .put(id.as_str(), envd_token, &answer.envd_version)?;
        Ok(SandboxHandle::new(id, Provider::E2b)
            .with_metadata(metadata)
            .with_traffic_token(token)
            .with_adapter_state(Arc::new(envd)))
    }

    async fn find_marker(&self, marker: &str) -> Result<Option<SandboxId>, Error> {
        let filter = ListFilter {
            metadata: Metadata::from([(CREATE_MARKER.to_owned(), marker.to_owned())]),
            states: Vec::new(),
        };
        Ok(self
            .list_raw(&filter)
            .await?
            .into_iter()
            .next()
            .map(|s| s.id))
    }

    /// Every sandbox passing `filter`, create markers included.
    async fn list_raw(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        let mut states: Vec<&str> = filter
            .states
            .iter()
            .filter_map(|s| metadata::wire_state(*s))
            .collect();
        states.sort_unstable();
        states.dedup();
        if !filter.states.is_empty() && states.is_empty() {
            // Only states the plane never reports: nothing can match.
            return Ok(Vec::new());
        }
        if states.is_empty() {
            states = vec!["paused", "running"];
        }
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut call = Call::new(
                Operation::LIST,
                Method::GET,
                "/v2/sandboxes",
                self.config.http_timeout(),
            )
            .idempotent()
            .param("limit", LIST_PAGE.to_string())
            .param("state", states.join(","));
            if let Some((k, v)) = metadata::server_pair(&filter.metadata) {
                call = call.param("metadata", format!("{k}={v}"));
            }
            if let Some(token) = &next {
                call = call.param("nextToken", token.clone());
            }
            let answer = self.control.send(&call).await?.expect(&[200])?;
            let page: Vec<wire::ListedSandbox> = answer.decode()?;
            for listed in page {
                let summary = summary_of(Operation::LIST, listed)?;
                if filter.matches(&summary) {
                    out.push(summary);
                }
            }
            match answer.header("x-next-token").map(str::trim) {
                None | Some("") => return Ok(out),
                Some(token) => {
                    let safe = token.len() <= 4096
                        && token
                            .bytes()
                            .all(|b| b.is_ascii_graphic() && !matches!(b, b'&' | b'#' | b'%'));
                    if !safe || !seen.insert(token.to_owned()) {
                        return Err(errors::unreadable(
                            Operation::LIST,
                            "a next-page token that repeats or cannot be sent back",
                        ));
                    }
                    next = Some(token.to_owned());
                }
            }
        }
        Err(errors::unreadable(
            Operation::LIST,
            format!("more than {MAX_LIST_PAGES} pages"),
        ))
    }

    async fn connect_answer(&self, id: &SandboxId) -> Result<wire::SandboxAnswer, Error> {
        let call = Call::new(
            Operation::CONNECT,
            Method::POST,
            format!("/sandboxes/{}/connect", segment(id.as_str())),
            self.config.connect_timeout(),
        )
        .json(&wire::TimeoutBody {
            timeout: self.config.ttl().as_secs(),
        })?
        .idempotent();
        let answer: wire::SandboxAnswer = self
            .control
            .send(&call)
            .await?
            .expect(&[200, 201])?
            .decode()?;
        if answer.sandbox_id != id.as_str() {
            return Err(errors::unreadable(
                Operation::CONNECT,
                format!("asked for {id}, answered {:?}", answer.sandbox_id),
            ));
        }
        Ok(answer)
    }

    async fn detail(&self, op: Operation, id: &SandboxId) -> Result<wire::ListedSandbox, Error> {
        let call = Call::new(
            op,
            Method::GET,
            format!("/sandboxes/{}", segment(id.as_str())),
            self.config.http_timeout(),
        )
        .idempotent();
        let listed: wire::ListedSandbox =
            self.control.send(&call).await?.expect(&[200])?.decode()?;
        if listed.sandbox_id != id.as_str() {
            return Err(errors::unreadable(
                op,
                format!("asked for {id}, answered {:?}", listed.sandbox_id),
            ));
        }
        Ok(listed)
    }

    async fn send_create(&self, body: &wire::NewSandbox) -> Result<Answer, Error> {
        let call = Call::new(
            Operation::CREATE,
            Method::POST,
            "/sandboxes",
            self.config.create_timeout(),
        )
        .json(body)?;
        self.control.send(&call).await
    }
}

/// A listed sandbox in the port's terms; an entry without a usable ID is unreadable.
fn summary_of(op: Operation, listed: wire::ListedSandbox) -> Result<SandboxSummary, Error> {
    let id = SandboxId::new(listed.sandbox_id.clone())
        .map_err(|e| errors::unreadable(op, format!("sandbox ID {:?}: {e}", listed.sandbox_id)))?;
    let time = |raw: &Option<String>| {
        raw.as_deref()
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
    };
    let stored = listed.metadata.unwrap_or_default();
    let metadata = metadata::from_wire(&stored);
    Ok(SandboxSummary {
        id,
        template: TemplateId::new(listed.template_id.clone()).ok(),
        state: metadata::state_of(&listed.state),
        raw_state: listed.state.chars().take(64).collect(),
        metadata,
        started_at: time(&listed.started_at),
        ended_at: None,
    })
}

/// `summary` as callers see it: without the create marker.
fn shown(mut summary: SandboxSummary) -> SandboxSummary {
    summary.metadata.remove(CREATE_MARKER);
    summary
}

fn marker() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

#[async_trait]
impl SandboxProvider for E2bProvider {
    fn provider(&self) -> Provider {
        Provider::E2b
    }

    fn capabilities(&self) -> Capabilities {
        e2b_capabilities()
    }

    fn network_fields(&self) -> NetworkFields {
        e2b_network_fields()
    }

    async fn health(&self) -> Result<(), Error> {
        let call = Call::new(
            Operation::HEALTH,
            Method::GET,
            "/v2/sandboxes",
            self.config.http_timeout(),
        )
        .param("limit", "1")
        .idempotent();
        self.control.send(&call).await?.expect(&[200])?;
        Ok(())
    }

    async fn create(&self, request: CreateRequest) -> Result<SandboxHandle, Error> {
        if request.from_snapshot {
            self.check_restore(&request).await?;
        }
        let marker = marker();
        let body = self.new_sandbox(&request, &marker)?;
        let mut attempt = 1;
        loop {
            let answer = self.send_create(&body).await?;
            let status = answer.status.as_u16();
            if matches!(status, 200 | 201) {
                let answer: wire::SandboxAnswer = answer.decode()?;
                if answer.sandbox_id.is_empty() {
                    return Err(errors::unreadable(Operation::CREATE, "no sandbox ID"));
                }
                return self.handle(Operation::CREATE, &answer, request.metadata.clone(), None);
            }
            let refused = matches!(status, 429 | 503);
            if !refused || attempt >= CREATE_ATTEMPTS {
                return Err(errors::http_error(Operation::CREATE, status, &answer.body));
            }
            let wait = answer
                .header("retry-after")
                .and_then(|r| r.trim().parse::<u64>().ok())
                .map_or(CREATE_RETRY_WAIT, Duration::from_secs)
                .min(crate::control::MAX_RETRY_WAIT);
            tokio::time::sleep(wait).await;
            // The refusal said nothing was made; believe it only once a list agrees.
            if let Some(id) = self.find_marker(&marker).await? {
                tracing::info!(sandbox = %id, "a refused create had made its sandbox: adopted");
                let answer = self.connect_answer(&id).await?;
                return self.handle(Operation::CREATE, &answer, request.metadata.clone(), None);
            }
            attempt += 1;
        }
    }

    async fn connect(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let answer = self.connect_answer(&request.sandbox_id).await?;
        let listed = self.detail(Operation::CONNECT, &request.sandbox_id).await?;
        let metadata = metadata::from_wire(&listed.metadata.unwrap_or_default());
        let mut metadata = metadata;
        metadata.remove(CREATE_MARKER);
        self.handle(Operation::CONNECT, &answer, metadata, request.traffic_token)
    }

    async fn get(&self, id: &SandboxId) -> Result<SandboxSummary, Error> {
        let listed = self.detail(Operation::GET, id).await?;
        Ok(shown(summary_of(Operation::GET, listed)?))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SandboxSummary>, Error> {
        Ok(self
            .list_raw(filter)
            .await?
            .into_iter()
            .map(shown)
            .collect())
    }

    async fn delete(&self, id: &SandboxId) -> Result<(), Error> {
        let call = Call::new(
            Operation::DELETE,
            Method::DELETE,
            format!("/sandboxes/{}", segment(id.as_str())),
            self.config.http_timeout(),
        )
        .idempotent();
        let outcome = self.control.send(&call).await?.expect(&[200, 204]);
        if outcome.is_ok()
            || outcome
                .as_ref()
                .is_err_and(|e| e.kind() == ErrorKind::NotFound)
        {
            self.pool.tokens().remove(id.as_str());
            self.envds.remove(id.as_str());
        }
        outcome.map(|_| ())
    }

    async fn exec(
        &self,
        sandbox: &SandboxHandle,
        request: ExecRequest,
    ) -> Result<ExecResult, Error> {
        crate::exec::run(self, sandbox, request).await
    }

    async fn write_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        content: &[u8],
    ) -> Result<(), Error> {
        crate::files::write(self, sandbox, path, content).await
    }

    async fn read_file(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<u8>, Error> {
        crate::files::read(self, sandbox, path).await
    }

    async fn read_file_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<sandbox_core::ReadStream, Error> {
        let stream = crate::files::read_stream(self, sandbox, path, max_bytes).await?;
        Ok(Box::new(stream))
    }

    async fn list_dir(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
    ) -> Result<Vec<DirEntry>, Error> {
        crate::files::list_dir(self, sandbox, path).await
    }

    async fn make_dir(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        crate::files::make_dir(self, sandbox, path).await
    }

    async fn remove(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<(), Error> {
        crate::files::remove(self, sandbox, path).await
    }

    async fn stat(&self, sandbox: &SandboxHandle, path: &SandboxPath) -> Result<StatEntry, Error> {
        crate::files::stat(self, sandbox, path).await
    }

    fn as_keep_alive(&self) -> Option<&dyn KeepAlive> {
        Some(self)
    }

    fn as_connect_probe(&self) -> Option<&dyn ConnectProbe> {
        Some(self)
    }

    fn as_pause_resume(&self) -> Option<&dyn PauseResume> {
        Some(self)
    }

    fn as_processes(&self) -> Option<&dyn sandbox_core::Processes> {
        Some(self)
    }

    fn as_terminals(&self) -> Option<&dyn sandbox_core::Terminals> {
        Some(self)
    }

    fn as_terminal_reattach(&self) -> Option<&dyn sandbox_core::TerminalReattach> {
        Some(self)
    }

    fn as_streamed_files(&self) -> Option<&dyn sandbox_core::StreamedFiles> {
        Some(self)
    }

    fn as_watch(&self) -> Option<&dyn sandbox_core::Watch> {
        Some(self)
    }

    fn as_snapshots(&self) -> Option<&dyn sandbox_core::Snapshots> {
        Some(self)
    }

    fn as_template_catalog(&self) -> Option<&dyn sandbox_core::TemplateCatalog> {
        Some(self)
    }
}

#[async_trait]
impl KeepAlive for E2bProvider {
    async fn keep_alive(&self, sandbox: &SandboxHandle, ttl: Duration) -> Result<(), Error> {
        let seconds = ttl.as_secs().max(1) + u64::from(ttl.subsec_nanos() > 0 && ttl.as_secs() > 0);
        let call = Call::new(
            Operation::KEEP_ALIVE,
            Method::POST,
            format!("/sandboxes/{}/timeout", segment(sandbox.id().as_str())),
            self.config.http_timeout(),
        )
        .json(&wire::TimeoutBody { timeout: seconds })?
        .idempotent();
        self.control.send(&call).await?.expect(&[200, 204])?;
        Ok(())
    }
}

#[async_trait]
impl ConnectProbe for E2bProvider {
    async fn connect_session(&self, request: ConnectRequest) -> Result<SandboxHandle, Error> {
        let id = request.sandbox_id.clone();
        let handle = self.connect(request).await?;
        let summary = self
            .get(&id)
            .await
            .map_err(|e| e.with_operation(Operation::CONNECT_SESSION))?;
        match summary.state {
            SandboxState::Terminal => Err(provider_error(Error::new(
                ErrorKind::Terminal,
                Operation::CONNECT_SESSION,
                format!("sandbox '{id}' is {}", summary.raw_state),
            ))),
            _ => Ok(handle),
        }
    }
}

#[async_trait]
impl PauseResume for E2bProvider {
    async fn pause(&self, id: &SandboxId) -> Result<(), Error> {
        let call = Call::new(
            Operation::PAUSE,
            Method::POST,
            format!("/sandboxes/{}/pause", segment(id.as_str())),
            self.config.snapshot_timeout(),
        )
        .json(&serde_json::json!({}))?;
        match self.control.send(&call).await?.expect(&[200, 204]) {
            Ok(_) => {
                self.envds.remove(id.as_str());
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::Conflict => Err(provider_error(Error::conflict(
                Operation::PAUSE,
                format!("sandbox '{id}' is already paused"),
            ))
            .with_code(ErrorCode::SandboxPaused)
            .with_http_status(409)),
            Err(e) => Err(e),
        }
    }

    async fn resume(&self, id: &SandboxId) -> Result<(), Error> {
        self.connect(ConnectRequest::new(id.clone()))
            .await
            .map_err(|e| e.with_operation(Operation::RESUME))?;
        Ok(())
    }
}

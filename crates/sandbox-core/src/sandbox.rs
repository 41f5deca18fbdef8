//! Lifecycle DTOs: handles, create/connect requests, timeout and network policies, listings.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::{Error, ErrorCode, Operation};
use crate::ids::{SandboxId, TemplateId};
use crate::path::SandboxPath;
use crate::provider::Provider;
use crate::secret::Secret;
use crate::timefmt;

/// The small key/value bag a provider stores beside a sandbox. Ownership metadata in it is what
/// lets a restarted process find the sandboxes it created (see [`crate::binding::owner_metadata`]).
pub type Metadata = BTreeMap<String, String>;

/// An opaque, provider-issued reference to a live sandbox.
///
/// Adapters may attach private state (an SDK handle, an envd access token) with
/// [`SandboxHandle::with_adapter_state`]; callers read only the stable identifiers.
#[derive(Clone)]
pub struct SandboxHandle {
    id: SandboxId,
    provider: Provider,
    metadata: Metadata,
    traffic_token: Option<Secret>,
    adapter_state: Option<Arc<dyn Any + Send + Sync>>,
}

impl SandboxHandle {
    /// A handle for sandbox `id` of `provider`.
    pub fn new(id: SandboxId, provider: Provider) -> Self {
        SandboxHandle {
            id,
            provider,
            metadata: Metadata::new(),
            traffic_token: None,
            adapter_state: None,
        }
    }
    /// Records the metadata the sandbox was created with.
    #[must_use]
    pub fn with_metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = metadata;
        self
    }
    /// Records the per-sandbox inbound credential. An empty token is treated as none.
    #[must_use]
    pub fn with_traffic_token(mut self, token: Option<Secret>) -> Self {
        self.traffic_token = token.filter(|t| !t.is_empty());
        self
    }
    /// Attaches adapter-private state, retrievable with [`SandboxHandle::adapter_state`].
    #[must_use]
    pub fn with_adapter_state(mut self, state: Arc<dyn Any + Send + Sync>) -> Self {
        self.adapter_state = Some(state);
        self
    }

    /// The provider-scoped sandbox ID.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }
    /// The backend that issued the handle.
    pub fn provider(&self) -> Provider {
        self.provider
    }
    /// The metadata recorded at creation (empty when the provider keeps none).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// The inbound credential, when the provider issues one. Callers persist it in the binding
    /// so a reconnect after a restart can restore it.
    pub fn traffic_token(&self) -> Option<&Secret> {
        self.traffic_token.as_ref()
    }
    /// The adapter-private state, if it is a `T`.
    pub fn adapter_state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.adapter_state
            .as_deref()
            .and_then(|s| s.downcast_ref::<T>())
    }
}

impl fmt::Debug for SandboxHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxHandle")
            .field("id", &self.id)
            .field("provider", &self.provider)
            .field("metadata", &self.metadata)
            .field(
                "traffic_token",
                &self.traffic_token.as_ref().map(|_| "[redacted]"),
            )
            .field("adapter_state", &self.adapter_state.is_some())
            .finish()
    }
}

/// What happens when a sandbox's idle timeout elapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    /// Pause and keep the filesystem, resumable later.
    Pause,
    /// Destroy and release everything.
    #[default]
    Kill,
}

/// The idle timeout a sandbox is created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdleTimeout {
    /// Leave it to the provider's configured default.
    #[default]
    ServerDefault,
    /// Act after this long without activity (never zero).
    After(Duration),
    /// Never time out (adapters whose provider cannot do this return `unsupported` at create).
    Never,
}

/// The longest idle timeout accepted; anything longer is almost certainly a unit mistake.
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(366 * 24 * 3600);

impl IdleTimeout {
    /// An explicit timeout of `seconds`, refusing zero, negative and absurd values.
    pub fn after_secs(seconds: i64) -> Result<IdleTimeout, Error> {
        let secs = u64::try_from(seconds)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                invalid_timeout(format!(
                    "idle timeout must be a positive number of seconds, got {seconds}"
                ))
            })?;
        IdleTimeout::after(Duration::from_secs(secs))
    }

    /// An explicit timeout, refusing zero and durations above [`MAX_IDLE_TIMEOUT`].
    pub fn after(duration: Duration) -> Result<IdleTimeout, Error> {
        if duration.is_zero() {
            return Err(invalid_timeout("idle timeout must not be zero".to_owned()));
        }
        if duration > MAX_IDLE_TIMEOUT {
            return Err(invalid_timeout(format!(
                "idle timeout {}s exceeds the maximum of {}s",
                duration.as_secs(),
                MAX_IDLE_TIMEOUT.as_secs()
            )));
        }
        Ok(IdleTimeout::After(duration))
    }
}

pub(crate) fn invalid_timeout(message: String) -> Error {
    Error::invalid_input(message).with_code(ErrorCode::InvalidTimeout)
}

/// How the provider treats an idle sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "TimeoutPolicySpec", into = "TimeoutPolicySpec")]
pub struct TimeoutPolicy {
    /// When the action fires.
    pub idle: IdleTimeout,
    /// What happens then.
    pub on_timeout: TimeoutAction,
    /// Resume a paused sandbox on the next connect. Requires [`TimeoutAction::Pause`].
    pub auto_resume: bool,
}

impl TimeoutPolicy {
    /// Refuses combinations no provider can honour: auto-resume of a killed sandbox, and an
    /// explicit timeout of zero or beyond [`MAX_IDLE_TIMEOUT`] built by hand.
    pub fn validate(&self) -> Result<(), Error> {
        if let IdleTimeout::After(d) = self.idle {
            IdleTimeout::after(d)?;
        }
        if self.auto_resume && self.on_timeout != TimeoutAction::Pause {
            return Err(invalid_timeout(
                "auto_resume requires on_timeout = pause".to_owned(),
            ));
        }
        Ok(())
    }
}

/// The wire form of [`TimeoutPolicy`]: `{"mode":"explicit","seconds":300,"on_timeout":"pause",
/// "auto_resume":true}`; `mode` is `server` (default), `explicit` or `never`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutPolicySpec {
    #[serde(default = "server_mode")]
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<i64>,
    #[serde(default)]
    pub on_timeout: TimeoutAction,
    #[serde(default)]
    pub auto_resume: bool,
}

fn server_mode() -> String {
    "server".to_owned()
}

impl TryFrom<TimeoutPolicySpec> for TimeoutPolicy {
    type Error = Error;
    fn try_from(spec: TimeoutPolicySpec) -> Result<Self, Error> {
        let idle = match (spec.mode.as_str(), spec.seconds) {
            ("server", None) => IdleTimeout::ServerDefault,
            ("never", None) => IdleTimeout::Never,
            ("explicit", Some(seconds)) => IdleTimeout::after_secs(seconds)?,
            ("explicit", None) => {
                return Err(invalid_timeout("explicit timeout needs seconds".to_owned()));
            }
            ("server" | "never", Some(_)) => {
                return Err(invalid_timeout(format!(
                    "timeout mode {:?} takes no seconds",
                    spec.mode
                )));
            }
            (other, _) => {
                return Err(invalid_timeout(format!(
                    "unknown timeout mode {:?}: expected server, explicit or never",
                    other.chars().take(32).collect::<String>()
                )));
            }
        };
        let policy = TimeoutPolicy {
            idle,
            on_timeout: spec.on_timeout,
            auto_resume: spec.auto_resume,
        };
        policy.validate()?;
        Ok(policy)
    }
}

impl From<TimeoutPolicy> for TimeoutPolicySpec {
    fn from(policy: TimeoutPolicy) -> Self {
        let (mode, seconds) = match policy.idle {
            IdleTimeout::ServerDefault => ("server", None),
            IdleTimeout::Never => ("never", None),
            IdleTimeout::After(d) => (
                "explicit",
                Some(i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            ),
        };
        TimeoutPolicySpec {
            mode: mode.to_owned(),
            seconds,
            on_timeout: policy.on_timeout,
            auto_resume: policy.auto_resume,
        }
    }
}

/// One credential header the Cube egress proxy injects.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HeaderInject {
    pub name: String,
    pub secret: Secret,
    /// Template of the header value; empty means the provider's default (`${SECRET}`).
    #[serde(default)]
    pub format: String,
}

/// One CubeEgress L7 rule. `allow` is phrased positively: stored configs say "deny", and the
/// negation happens exactly once, when the config is resolved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CubeEgressRule {
    pub name: String,
    #[serde(default)]
    pub scheme: String,
    #[serde(default)]
    pub sni: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub methods: Vec<String>,
    #[serde(default)]
    pub path: String,
    pub allow: bool,
    #[serde(default)]
    pub audit: String,
    #[serde(default)]
    pub inject: Vec<HeaderInject>,
}

/// One E2B per-host request transform (headers added to requests to `host`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct E2bHostRule {
    pub host: String,
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
}

/// The provider-neutral network policy of a new sandbox.
///
/// `None` switches mean "not specified"; adapters materialise `allow_internet_access` as `true`
/// and `allow_public_traffic` as `false` (credential-required inbound), because provider
/// defaults differ per template and an open inbound default would expose the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// CIDR blocks or domain names reachable even when egress is denied by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    /// CIDR blocks or domain names refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cube_rules: Vec<CubeEgressRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub e2b_host_rules: Vec<E2bHostRule>,
}

impl NetworkPolicy {
    /// Whether outbound traffic falls back to deny, leaving only `allow_out` reachable.
    ///
    /// Both spellings count: the top-level switch turned off, or a deny-all CIDR (any `/0`) in
    /// `deny_out`. Checking only the switch misreads a strict-but-valid policy as an open one.
    pub fn denies_egress_by_default(&self) -> bool {
        self.allow_internet_access == Some(false) || self.deny_out.iter().any(|e| is_deny_all(e))
    }
}

impl NetworkPolicy {
    /// The fields this policy sets (a switch that is `Some`, a list that is non-empty), in
    /// declaration order. An unset field asks nothing of the backend, so only these need to be
    /// among the fields it enforces ([`NetworkFields`]).
    pub fn set_fields(&self) -> impl Iterator<Item = NetworkField> + '_ {
        NetworkField::ALL.into_iter().filter(|f| match f {
            NetworkField::AllowInternetAccess => self.allow_internet_access.is_some(),
            NetworkField::AllowPublicTraffic => self.allow_public_traffic.is_some(),
            NetworkField::AllowOut => !self.allow_out.is_empty(),
            NetworkField::DenyOut => !self.deny_out.is_empty(),
            NetworkField::CubeRules => !self.cube_rules.is_empty(),
            NetworkField::E2bHostRules => !self.e2b_host_rules.is_empty(),
        })
    }
}

/// One field of [`NetworkPolicy`], named as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NetworkField {
    AllowInternetAccess,
    AllowPublicTraffic,
    AllowOut,
    DenyOut,
    CubeRules,
    E2bHostRules,
}

impl NetworkField {
    /// Every field, in declaration order.
    pub const ALL: [NetworkField; 6] = [
        NetworkField::AllowInternetAccess,
        NetworkField::AllowPublicTraffic,
        NetworkField::AllowOut,
        NetworkField::DenyOut,
        NetworkField::CubeRules,
        NetworkField::E2bHostRules,
    ];

    /// The field's name in [`NetworkPolicy`]'s serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkField::AllowInternetAccess => "allow_internet_access",
            NetworkField::AllowPublicTraffic => "allow_public_traffic",
            NetworkField::AllowOut => "allow_out",
            NetworkField::DenyOut => "deny_out",
            NetworkField::CubeRules => "cube_rules",
            NetworkField::E2bHostRules => "e2b_host_rules",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for NetworkField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The network-policy fields a backend enforces, declared beside its capabilities
/// ([`SandboxProvider::network_fields`](crate::SandboxProvider::network_fields)). A request
/// setting any other field is refused with `unsupported` by the checking layer, because a
/// policy that is accepted and not applied is worse than one refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NetworkFields(u8);

impl NetworkFields {
    /// No field enforced: every policy but the empty one is refused.
    pub const NONE: NetworkFields = NetworkFields(0);

    /// A set holding exactly `fields`.
    pub fn from_slice(fields: &[NetworkField]) -> Self {
        NetworkFields(fields.iter().fold(0, |bits, f| bits | f.bit()))
    }

    /// Whether `field` is enforced.
    pub fn has(&self, field: NetworkField) -> bool {
        self.0 & field.bit() != 0
    }

    /// The enforced fields, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = NetworkField> + '_ {
        NetworkField::ALL.into_iter().filter(|&f| self.has(f))
    }

    /// The fields `policy` sets that are not enforced here, in declaration order.
    pub fn unenforced<'a>(
        &'a self,
        policy: &'a NetworkPolicy,
    ) -> impl Iterator<Item = NetworkField> + 'a {
        policy.set_fields().filter(|&f| !self.has(f))
    }
}

/// Whether `entry` is a CIDR with prefix length 0 (`0.0.0.0/0`, `::/0`, `10.0.0.0/0`).
fn is_deny_all(entry: &str) -> bool {
    let Some((addr, prefix)) = entry.trim().split_once('/') else {
        return false;
    };
    prefix.trim() == "0" && addr.trim().parse::<std::net::IpAddr>().is_ok()
}

/// A named volume mounted at creation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    name: String,
    path: SandboxPath,
}

impl VolumeMount {
    /// Validates the volume name (1–255 of `[A-Za-z0-9._-]`, not starting with `.` or `-`).
    pub fn new(name: impl Into<String>, path: SandboxPath) -> Result<Self, Error> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= 255
            && !name.starts_with(['.', '-'])
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(Error::invalid_request(
                Operation::VALIDATE,
                format!(
                    "invalid volume name {:?}",
                    name.chars().take(64).collect::<String>()
                ),
            ));
        }
        Ok(VolumeMount { name, path })
    }
    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Where it is mounted.
    pub fn path(&self) -> &SandboxPath {
        &self.path
    }
}

/// The account a sandbox's processes, files and terminals act as when a call names no user,
/// and the directory its processes start in when a call names no `cwd`.
///
/// The fields are public for reading; build one with [`SandboxUser::new`], which validates.
/// [`CreateRequest::validate`] checks a hand-built one again, so a bad name never reaches an
/// adapter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxUser {
    /// A POSIX portable user name: `[a-z_][a-z0-9_-]{0,31}`.
    pub name: String,
    pub workdir: SandboxPath,
}

impl SandboxUser {
    /// The longest name accepted (what `useradd` accepts by default).
    pub const MAX_NAME_LEN: usize = 32;

    /// Validates `name`: lower-case ASCII letters, digits, `_` and `-`, starting with a letter
    /// or `_`, at most [`SandboxUser::MAX_NAME_LEN`] bytes. Narrower than what some systems
    /// allow, on purpose: the name travels in container flags, HTTP headers and `/etc/passwd`
    /// lookups, and a portable name means the same in each.
    pub fn new(name: impl Into<String>, workdir: SandboxPath) -> Result<Self, Error> {
        let user = SandboxUser {
            name: name.into(),
            workdir,
        };
        user.validate()?;
        Ok(user)
    }

    /// Checks the name (a user built field by field has not been).
    pub fn validate(&self) -> Result<(), Error> {
        let bytes = self.name.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= Self::MAX_NAME_LEN
            && matches!(bytes[0], b'a'..=b'z' | b'_')
            && bytes
                .iter()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'));
        if !ok {
            return Err(Error::invalid_request(
                Operation::VALIDATE,
                format!(
                    "invalid sandbox user {:?}: expected a POSIX user name ([a-z_][a-z0-9_-]{{0,31}})",
                    self.name.chars().take(64).collect::<String>()
                ),
            ));
        }
        Ok(())
    }
}

/// Parameters for spawning a new sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The template (image, snapshot) to boot.
    pub template: TemplateId,
    /// `template` is a snapshot rather than a base template (some providers refuse env
    /// overrides on snapshots).
    pub from_snapshot: bool,
    pub timeout: TimeoutPolicy,
    /// Stored beside the sandbox. Providers without metadata support refuse non-empty metadata
    /// with `unsupported` rather than dropping it.
    pub metadata: Metadata,
    pub env: BTreeMap<String, String>,
    pub network: NetworkPolicy,
    /// Providers without the `volumes` capability refuse non-empty mounts with `unsupported`.
    pub volumes: Vec<VolumeMount>,
    /// Who processes, files and terminals that name no user act as, and where processes that
    /// name no `cwd` start. `None`: the backend's default (root and `/workspace` on Docker).
    /// Providers without the `default_user` capability refuse `Some` with `unsupported`.
    pub user: Option<SandboxUser>,
}

impl CreateRequest {
    /// A request for `template` with every other field at its default.
    pub fn new(template: TemplateId) -> Self {
        CreateRequest {
            template,
            from_snapshot: false,
            timeout: TimeoutPolicy::default(),
            metadata: Metadata::new(),
            env: BTreeMap::new(),
            network: NetworkPolicy::default(),
            volumes: Vec::new(),
            user: None,
        }
    }

    /// Checks what can be checked without a provider: the timeout policy, env names and the
    /// user's name.
    pub fn validate(&self) -> Result<(), Error> {
        self.timeout.validate()?;
        for name in self.env.keys() {
            crate::exec::validate_env_name(name)?;
        }
        if let Some(user) = &self.user {
            user.validate()?;
        }
        Ok(())
    }
}

/// Re-attaches to an existing sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub sandbox_id: SandboxId,
    /// The inbound credential recovered from the binding; adapters apply it when the provider's
    /// connect answer omits it, which is the normal case (tokens are issued only at create).
    pub traffic_token: Option<Secret>,
}

impl ConnectRequest {
    /// A connect request without a stored token.
    pub fn new(sandbox_id: SandboxId) -> Self {
        ConnectRequest {
            sandbox_id,
            traffic_token: None,
        }
    }
}

/// The normalized lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Up and reachable.
    Running,
    /// Paused (or a stopped container); resumable with its filesystem intact.
    Paused,
    /// Between states (pausing, resuming, provisioning). Still owned, not yet usable.
    Transitioning,
    /// Gone for good. A binding naming it may be replaced.
    Terminal,
    /// The adapter could not classify the raw state. Treated as transient: never replaces a
    /// binding.
    Unknown,
}

impl SandboxState {
    /// Every state.
    pub const ALL: [SandboxState; 5] = [
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Transitioning,
        SandboxState::Terminal,
        SandboxState::Unknown,
    ];
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Transitioning => "transitioning",
            SandboxState::Terminal => "terminal",
            SandboxState::Unknown => "unknown",
        }
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The neutral view of one sandbox in a listing or probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSummary {
    pub id: SandboxId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateId>,
    pub state: SandboxState,
    /// The provider's own state string, for diagnostics only; never branch on it.
    #[serde(default)]
    pub raw_state: String,
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<OffsetDateTime>,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub ended_at: Option<OffsetDateTime>,
}

/// Narrows a listing. Empty fields mean "no filter".
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListFilter {
    /// Only sandboxes whose metadata contains all these pairs.
    #[serde(default)]
    pub metadata: Metadata,
    /// Only sandboxes in one of these states.
    #[serde(default)]
    pub states: Vec<SandboxState>,
}

impl ListFilter {
    /// Whether `summary` passes the filter. Adapters that cannot filter server-side apply this
    /// client-side and so return exactly the same set.
    pub fn matches(&self, summary: &SandboxSummary) -> bool {
        let states_ok = self.states.is_empty() || self.states.contains(&summary.state);
        let metadata_ok = self
            .metadata
            .iter()
            .all(|(k, v)| summary.metadata.get(k) == Some(v));
        states_ok && metadata_ok
    }
}

/// Which end of the creation order a page of a listing starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    /// The most recently started first.
    #[default]
    NewestFirst,
    /// The earliest started first.
    OldestFirst,
}

impl ListOrder {
    fn tag(self) -> char {
        match self {
            ListOrder::NewestFirst => 'n',
            ListOrder::OldestFirst => 'o',
        }
    }
}

/// An opaque position in a listing: it names the last item a page returned, so the next page
/// resumes after that item wherever it now stands (items created or deleted meanwhile do not
/// shift the pages).
///
/// Its text is hex with a checksum, safe in a header or a query string. [`ListCursor::parse`]
/// refuses anything this type did not write; it is not a secret (it names a sandbox the
/// caller was shown, and a crafted one only moves the caller's own page).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListCursor(String);

/// What a cursor says: the order it was written for and the last item's sort key.
struct CursorKey {
    order: ListOrder,
    started_at: Option<OffsetDateTime>,
    id: SandboxId,
}

impl ListCursor {
    /// The longest cursor text accepted (an ID of a few hundred bytes, hex-encoded).
    pub const MAX_LEN: usize = 2048;
    const PREFIX: &'static str = "c1";

    /// A cursor this type wrote, from its text; anything else is `invalid_request` with code
    /// `invalid_cursor`.
    pub fn parse(raw: &str) -> Result<ListCursor, Error> {
        Self::decode(raw)?;
        Ok(ListCursor(raw.to_owned()))
    }

    /// The cursor's text, to hand to a client.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn encode(order: ListOrder, item: &SandboxSummary) -> ListCursor {
        let started = item
            .started_at
            .map_or_else(|| "-".to_owned(), |t| t.unix_timestamp_nanos().to_string());
        let payload = format!("{}{started}:{}", order.tag(), item.id);
        let mut text = String::with_capacity(Self::PREFIX.len() + payload.len() * 2 + 17);
        text.push_str(Self::PREFIX);
        for b in payload.as_bytes() {
            text.push_str(&format!("{b:02x}"));
        }
        text.push_str(&format!(".{:016x}", checksum(payload.as_bytes())));
        ListCursor(text)
    }

    fn decode(raw: &str) -> Result<CursorKey, Error> {
        let refused = || invalid_cursor("the listing did not write this cursor");
        if raw.len() > Self::MAX_LEN {
            return Err(invalid_cursor("the cursor is too long"));
        }
        let body = raw.strip_prefix(Self::PREFIX).ok_or_else(refused)?;
        let (hex, sum) = body.split_once('.').ok_or_else(refused)?;
        if hex.len() % 2 != 0 || sum.len() != 16 {
            return Err(refused());
        }
        let payload = (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .filter(|pair| pair.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(refused)?;
        let sum_ok = sum.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && u64::from_str_radix(sum, 16).ok() == Some(checksum(&payload));
        if !sum_ok {
            return Err(refused());
        }
        let text = String::from_utf8(payload).map_err(|_| refused())?;
        let mut chars = text.chars();
        let order = match chars.next() {
            Some('n') => ListOrder::NewestFirst,
            Some('o') => ListOrder::OldestFirst,
            _ => return Err(refused()),
        };
        let (started, id) = chars.as_str().split_once(':').ok_or_else(refused)?;
        let started_at = match started {
            "-" => None,
            nanos => Some(
                nanos
                    .parse::<i128>()
                    .ok()
                    .and_then(|n| OffsetDateTime::from_unix_timestamp_nanos(n).ok())
                    .ok_or_else(refused)?,
            ),
        };
        let id = SandboxId::new(id).map_err(|_| refused())?;
        Ok(CursorKey {
            order,
            started_at,
            id,
        })
    }
}

/// FNV-1a: detects a garbled or hand-edited cursor (not a forgery by someone who read this).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn invalid_cursor(why: &str) -> Error {
    Error::invalid_request(Operation::LIST, format!("invalid paging cursor: {why}"))
        .with_code(ErrorCode::InvalidCursor)
}

/// Which page of a listing to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The most items the page holds (at least 1).
    pub limit: usize,
    /// Where the previous page ended (`None`: the first page).
    pub cursor: Option<ListCursor>,
    pub order: ListOrder,
}

impl ListPage {
    /// The first page of at most `limit` items, newest first.
    pub fn first(limit: usize) -> Self {
        ListPage {
            limit,
            cursor: None,
            order: ListOrder::default(),
        }
    }

    /// The page of `items` (a whole listing, in any order) this request names: sorted by
    /// `started_at` then id in the page's order (a sandbox with no start time sorts before
    /// every other when oldest first), after the cursor's item, at most `limit` of them, with
    /// `next` only when more remain. A limit of 0 is `invalid_request`; a cursor written for
    /// the other order is `invalid_cursor`.
    pub fn apply(&self, mut items: Vec<SandboxSummary>) -> Result<SandboxPage, Error> {
        if self.limit == 0 {
            return Err(Error::invalid_request(
                Operation::LIST,
                "a page holds at least one item (limit 0)",
            ));
        }
        let key = |s: &SandboxSummary| (s.started_at, s.id.clone());
        items.sort_by_key(key);
        if self.order == ListOrder::NewestFirst {
            items.reverse();
        }
        let start = match &self.cursor {
            None => 0,
            Some(cursor) => {
                let at = ListCursor::decode(cursor.as_str())?;
                if at.order != self.order {
                    return Err(invalid_cursor("it was written for the other order"));
                }
                let last = (at.started_at, at.id);
                // The first item past the cursor's, whether or not that item still exists.
                items.partition_point(|s| match self.order {
                    ListOrder::OldestFirst => key(s) <= last,
                    ListOrder::NewestFirst => key(s) >= last,
                })
            }
        };
        let rest = items.len().saturating_sub(start);
        let items: Vec<SandboxSummary> = items.into_iter().skip(start).take(self.limit).collect();
        let next = (rest > items.len())
            .then(|| {
                items
                    .last()
                    .map(|last| ListCursor::encode(self.order, last))
            })
            .flatten();
        Ok(SandboxPage { items, next })
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPage {
    pub items: Vec<SandboxSummary>,
    /// The cursor of the next page; `None` on the last one.
    pub next: Option<ListCursor>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn spec(json: &str) -> Result<TimeoutPolicy, String> {
        serde_json::from_str::<TimeoutPolicy>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn timeout_policy_wire_forms() {
        assert_eq!(spec("{}").unwrap(), TimeoutPolicy::default());
        let p =
            spec(r#"{"mode":"explicit","seconds":300,"on_timeout":"pause","auto_resume":true}"#)
                .unwrap();
        assert_eq!(p.idle, IdleTimeout::After(Duration::from_secs(300)));
        assert!(p.auto_resume);
        assert_eq!(
            spec(r#"{"mode":"never"}"#).unwrap().idle,
            IdleTimeout::Never
        );
        for (json, needle) in [
            (r#"{"mode":"explicit","seconds":0}"#, "positive"),
            (r#"{"mode":"explicit","seconds":-5}"#, "positive"),
            (r#"{"mode":"explicit","seconds":999999999999}"#, "exceeds"),
            (r#"{"mode":"explicit"}"#, "needs seconds"),
            (r#"{"mode":"never","seconds":3}"#, "takes no seconds"),
            (r#"{"mode":"sometimes"}"#, "unknown timeout mode"),
            (r#"{"auto_resume":true}"#, "requires on_timeout = pause"),
            (r#"{"mode":"explicit","seconds":1e3}"#, "invalid type"),
        ] {
            let err = spec(json).unwrap_err();
            assert!(err.contains(needle), "{json}: {err}");
        }
        let round = serde_json::to_string(&p).unwrap();
        assert_eq!(spec(&round).unwrap(), p);
    }

    #[test]
    fn idle_timeout_constructors_refuse_zero_negative_overflow() {
        for bad in [0, -1, i64::MIN, i64::MAX] {
            let err = IdleTimeout::after_secs(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert_eq!(err.code(), Some(ErrorCode::InvalidTimeout));
        }
        assert!(IdleTimeout::after(Duration::ZERO).is_err());
        assert!(IdleTimeout::after(MAX_IDLE_TIMEOUT + Duration::from_secs(1)).is_err());
        assert!(IdleTimeout::after(Duration::from_millis(1)).is_ok());
    }

    #[test]
    fn set_fields_and_unenforced_name_each_field() {
        let empty = NetworkPolicy::default();
        assert_eq!(empty.set_fields().count(), 0);
        let p = NetworkPolicy {
            allow_internet_access: Some(true),
            allow_public_traffic: Some(false),
            allow_out: vec!["10.1.0.0/16".to_owned()],
            deny_out: vec!["10.0.0.0/8".to_owned()],
            cube_rules: vec![CubeEgressRule::default()],
            e2b_host_rules: vec![E2bHostRule::default()],
        };
        let names: Vec<&str> = p.set_fields().map(NetworkField::as_str).collect();
        assert_eq!(
            names,
            [
                "allow_internet_access",
                "allow_public_traffic",
                "allow_out",
                "deny_out",
                "cube_rules",
                "e2b_host_rules"
            ]
        );
        // The names are the serde names of the policy's fields.
        let json = serde_json::to_value(&p).unwrap();
        for f in NetworkField::ALL {
            assert!(json.get(f.as_str()).is_some(), "{f}");
        }
        let docker_like = NetworkFields::from_slice(&[NetworkField::AllowInternetAccess]);
        assert!(docker_like.has(NetworkField::AllowInternetAccess));
        assert!(!docker_like.has(NetworkField::DenyOut));
        assert_eq!(
            docker_like.iter().collect::<Vec<_>>(),
            [NetworkField::AllowInternetAccess]
        );
        let refused: Vec<NetworkField> = docker_like.unenforced(&p).collect();
        assert_eq!(refused.len(), 5);
        assert!(!refused.contains(&NetworkField::AllowInternetAccess));
        assert_eq!(NetworkFields::NONE.unenforced(&empty).count(), 0);
    }

    #[test]
    fn denies_egress_by_default_accepts_both_spellings() {
        let mut p = NetworkPolicy::default();
        assert!(!p.denies_egress_by_default());
        p.allow_internet_access = Some(false);
        assert!(p.denies_egress_by_default());
        for deny in ["0.0.0.0/0", " 0.0.0.0/0 ", "10.1.2.3/0", "::/0"] {
            let p = NetworkPolicy {
                deny_out: vec![deny.to_owned()],
                ..NetworkPolicy::default()
            };
            assert!(p.denies_egress_by_default(), "{deny}");
        }
        for not_all in ["0.0.0.0/8", "example.com", "::/1", "garbage/0"] {
            let p = NetworkPolicy {
                deny_out: vec![not_all.to_owned()],
                ..NetworkPolicy::default()
            };
            assert!(!p.denies_egress_by_default(), "{not_all}");
        }
    }

    #[test]
    fn list_filter_matches_metadata_and_state() {
        let summary = SandboxSummary {
            id: SandboxId::new("s1").unwrap(),
            template: None,
            state: SandboxState::Paused,
            raw_state: "exited".into(),
            metadata: [
                ("a".to_owned(), "1".to_owned()),
                ("b".to_owned(), "2".to_owned()),
            ]
            .into(),
            started_at: None,
            ended_at: None,
        };
        assert!(ListFilter::default().matches(&summary));
        let mut f = ListFilter {
            metadata: [("a".to_owned(), "1".to_owned())].into(),
            states: vec![],
        };
        assert!(f.matches(&summary));
        f.states = vec![SandboxState::Running];
        assert!(!f.matches(&summary));
        f.states.push(SandboxState::Paused);
        assert!(f.matches(&summary));
        f.metadata.insert("a".into(), "other".into());
        assert!(!f.matches(&summary));
    }

    #[test]
    fn sandbox_user_names_are_posix_portable() {
        let home = SandboxPath::new("/home/user").unwrap();
        for good in [
            "user",
            "_x",
            "a",
            "nobody",
            "www-data",
            "u_1-2",
            &"a".repeat(32),
        ] {
            let u = SandboxUser::new(good, home.clone()).unwrap();
            assert_eq!(u.name, good);
            assert_eq!(u.workdir, home);
        }
        for bad in [
            "",
            "User",
            "1user",
            "-user",
            "a:b",
            "a b",
            "a/b",
            "a.b",
            "us\0er",
            "é",
            "root\n",
            &"a".repeat(33),
        ] {
            let err = SandboxUser::new(bad, home.clone()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad:?}");
            assert!(err.message().contains("invalid sandbox user"), "{bad:?}");
        }
        // A user built field by field is checked again by the request's validation.
        let mut request = CreateRequest::new(TemplateId::new("t").unwrap());
        assert_eq!(request.user, None);
        request.validate().unwrap();
        request.user = Some(SandboxUser {
            name: "Root".to_owned(),
            workdir: home.clone(),
        });
        assert_eq!(
            request.validate().unwrap_err().kind(),
            ErrorKind::InvalidRequest
        );
        request.user = Some(SandboxUser::new("user", home).unwrap());
        request.validate().unwrap();
        // Its wire form names both fields.
        let json = serde_json::to_value(request.user.as_ref().unwrap()).unwrap();
        assert_eq!(json["name"], "user");
        assert_eq!(json["workdir"], "/home/user");
    }

    fn summary(id: &str, started: Option<i64>) -> SandboxSummary {
        SandboxSummary {
            id: SandboxId::new(id).unwrap(),
            template: None,
            state: SandboxState::Running,
            raw_state: String::new(),
            metadata: Metadata::new(),
            started_at: started.map(|s| OffsetDateTime::from_unix_timestamp(s).unwrap()),
            ended_at: None,
        }
    }

    /// Every page of `items` under `order` and `limit`, checking each page's shape.
    fn all_pages(items: &[SandboxSummary], order: ListOrder, limit: usize) -> Vec<SandboxId> {
        let mut page = ListPage {
            limit,
            cursor: None,
            order,
        };
        let mut out = Vec::new();
        for _ in 0..=items.len() {
            let got = page.apply(items.to_vec()).unwrap();
            assert!(got.items.len() <= limit);
            out.extend(got.items.iter().map(|s| s.id.clone()));
            match got.next {
                Some(next) => {
                    // More remain, so the page was full; the cursor parses back.
                    assert_eq!(got.items.len(), limit);
                    assert_eq!(ListCursor::parse(next.as_str()).unwrap(), next);
                    page.cursor = Some(next);
                }
                None => return out,
            }
        }
        panic!("paging did not end after {} pages", items.len() + 1);
    }

    #[test]
    fn pages_follow_start_time_then_id_and_end() {
        let items = vec![
            summary("b", Some(10)),
            summary("a", Some(10)),
            summary("c", Some(5)),
            summary("d", None),
            summary("e", Some(20)),
        ];
        let ids = |v: &[&str]| -> Vec<SandboxId> {
            v.iter().map(|s| SandboxId::new(*s).unwrap()).collect()
        };
        assert_eq!(
            all_pages(&items, ListOrder::OldestFirst, 2),
            ids(&["d", "c", "a", "b", "e"])
        );
        assert_eq!(
            all_pages(&items, ListOrder::NewestFirst, 2),
            ids(&["e", "b", "a", "c", "d"])
        );
        assert_eq!(ListOrder::default(), ListOrder::NewestFirst);
        // An exact fit ends without a trailing empty page.
        let first = ListPage::first(5).apply(items.clone()).unwrap();
        assert_eq!(first.items.len(), 5);
        assert!(first.next.is_none());
        // The cursor's item may be gone: the next page starts after where it stood.
        let one = ListPage::first(2).apply(items.clone()).unwrap();
        let mut shrunk = items.clone();
        shrunk.retain(|s| s.id.as_str() != "b");
        let two = ListPage {
            cursor: one.next,
            ..ListPage::first(2)
        }
        .apply(shrunk)
        .unwrap();
        let names: Vec<&str> = two.items.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        // Empty listings and a zero limit.
        let empty = ListPage::first(3).apply(Vec::new()).unwrap();
        assert!(empty.items.is_empty() && empty.next.is_none());
        let err = ListPage::first(0).apply(items).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    }

    #[test]
    fn cursors_not_written_here_are_refused() {
        let items = vec![summary("a", Some(1)), summary("b", Some(2))];
        let next = ListPage::first(1)
            .apply(items.clone())
            .unwrap()
            .next
            .unwrap();
        let text = next.as_str().to_owned();
        assert!(
            text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'),
            "{text}"
        );
        let refused = |raw: &str| {
            let err = ListCursor::parse(raw).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{raw:?}");
            assert_eq!(err.code(), Some(ErrorCode::InvalidCursor), "{raw:?}");
        };
        // Tampered: a flipped payload digit, a flipped checksum digit, cut short, extended.
        let mut flipped = text.clone().into_bytes();
        flipped[3] = if flipped[3] == b'0' { b'1' } else { b'0' };
        refused(std::str::from_utf8(&flipped).unwrap());
        let mut flipped = text.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        refused(std::str::from_utf8(&flipped).unwrap());
        refused(&text[..text.len() - 1]);
        refused(&format!("{text}0"));
        refused(&text.to_uppercase());
        for foreign in [
            "",
            "c1",
            "c1.",
            "abc",
            "c1zz.0000000000000000",
            "eyJpZCI6MX0=",
            "é",
        ] {
            refused(foreign);
        }
        refused(&"c1".repeat(ListCursor::MAX_LEN));
        // Written for the other order: refused when applied.
        let page = ListPage {
            limit: 1,
            cursor: Some(next),
            order: ListOrder::OldestFirst,
        };
        let err = page.apply(items).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidCursor));
    }

    proptest::proptest! {
        #[test]
        fn pages_concatenate_to_the_ordered_listing(
            starts in proptest::collection::vec(proptest::option::of(0_i64..8), 0..30),
            limit in 1_usize..7,
            oldest in proptest::bool::ANY,
        ) {
            // Few distinct times, so ties (broken by id) are common.
            let items: Vec<SandboxSummary> = starts
                .iter()
                .enumerate()
                .map(|(i, s)| summary(&format!("s{:02}", (i * 7) % 31), *s))
                .collect();
            let order = if oldest { ListOrder::OldestFirst } else { ListOrder::NewestFirst };
            let got = all_pages(&items, order, limit);
            let mut expected: Vec<(Option<OffsetDateTime>, SandboxId)> =
                items.iter().map(|s| (s.started_at, s.id.clone())).collect();
            expected.sort();
            if !oldest {
                expected.reverse();
            }
            let expected: Vec<SandboxId> = expected.into_iter().map(|(_, id)| id).collect();
            let unique: std::collections::BTreeSet<&SandboxId> = got.iter().collect();
            proptest::prop_assert_eq!(unique.len(), got.len(), "no item twice");
            proptest::prop_assert_eq!(got, expected);
        }

        #[test]
        fn arbitrary_text_is_never_a_cursor(raw in "\\PC{0,80}") {
            // Only the encoder's output parses; random text (even with the prefix) does not.
            let raw = format!("c1{raw}");
            if let Err(e) = ListCursor::parse(&raw) {
                proptest::prop_assert_eq!(e.code(), Some(ErrorCode::InvalidCursor));
            } else {
                proptest::prop_assert!(false, "{raw:?} parsed");
            }
        }
    }

    #[test]
    fn volume_names_and_handles() {
        let p = SandboxPath::new("/data").unwrap();
        assert!(VolumeMount::new("cache-1", p.clone()).is_ok());
        for bad in ["", "-x", ".x", "a/b", "a b"] {
            assert!(VolumeMount::new(bad, p.clone()).is_err(), "{bad}");
        }
        let h = SandboxHandle::new(SandboxId::new("x").unwrap(), Provider::E2b)
            .with_traffic_token(Some(Secret::new("")))
            .with_adapter_state(Arc::new(42_u32));
        assert!(h.traffic_token().is_none());
        assert_eq!(h.adapter_state::<u32>(), Some(&42));
        assert_eq!(h.adapter_state::<String>(), None);
        let h = h.with_traffic_token(Some(Secret::new("tok")));
        assert!(!format!("{h:?}").contains("tok\""));
    }
}

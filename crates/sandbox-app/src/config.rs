//! Service configuration: a TOML file, then environment overrides, then validation.
//!
//! Two levels, each written once: the adapters own their operator configs (`[docker]` is
//! [`sandbox_provider_docker::DockerConfig`], `[redis]` is
//! [`sandbox_store_redis::RedisStoreConfig`]) and this file embeds them; the stored,
//! provider-neutral tenant record is [`sandbox_core::config::TenantSandboxConfig`].
//!
//! The environment overlay is the table [`ENV_VARS`]: each `SANDBOX_*` variable sets exactly
//! one file key, written into the parsed file before it is deserialized, so a variable and its
//! key are read by the same code and can never disagree. The README's list is that table
//! (`config::tests::the_readme_lists_the_env_table` checks it).
//!
//! Every field has a safe default except the opt-ins that are the operator's act: the Docker
//! backend stays disabled unless the file or `SANDBOX_DOCKER_ENABLED=true` says otherwise.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole service config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// Where the HTTP API listens. Loopback by default: exposing it is a deliberate act.
    pub listen: SocketAddr,
    /// `memory` (one process) or `redis` (shared by every replica; see `redis`).
    pub store: String,
    /// Which backend sessions' sandboxes run on: `docker` (the `[docker]` section) or `e2b`
    /// (an E2B control plane, the `[e2b_provider]` section).
    pub provider: Backend,
    /// The Redis binding store (`store = "redis"`); absent until configured.
    #[cfg(feature = "redis")]
    pub redis: Option<sandbox_store_redis::RedisStoreConfig>,
    /// The Docker backend's operator settings.
    #[cfg(feature = "docker")]
    pub docker: sandbox_provider_docker::DockerConfig,
    /// The E2B backend's operator settings (`provider = "e2b"`). Not the `[e2b]` section, which
    /// is this service's own E2B-compatible API.
    #[cfg(feature = "e2b")]
    pub e2b_provider: sandbox_provider_e2b::E2bConfig,
    pub limits: Limits,
    /// How the listener treats connections (timeouts, caps, shutdown).
    pub server: ServerSection,
    /// What each tenant may hold at once (a tenant entry may override any of them).
    pub quotas: Quotas,
    /// Tenants and their API tokens (stored as SHA-256 hex digests, never in clear).
    pub tenants: Vec<TenantEntry>,
    /// A file holding one clear token for a development tenant, created on first start when no
    /// tenant is configured (mode 0600), so `sandbox serve` works out of the box without the
    /// token ever being printed.
    pub dev_token_file: Option<PathBuf>,
    /// Where the service keeps what must outlive a restart on one machine (the E2B API's
    /// generated secret, and its sandbox deadlines with the memory store). Unset:
    /// `$XDG_DATA_HOME/sandbox`, else `~/.local/share/sandbox` ([`ServiceConfig::data_dir`]).
    pub data_dir: Option<PathBuf>,
    /// The E2B-compatible API (its own listener; off unless enabled).
    #[cfg(feature = "e2b-api")]
    pub e2b: E2bSection,
}

/// The backend sessions' sandboxes run on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The Docker engine (`[docker]`).
    #[default]
    Docker,
    /// An E2B control plane (`[e2b_provider]`): E2B's cloud, a self-hosted plane, or another
    /// `sandbox serve`'s E2B-compatible API.
    E2b,
}

impl Backend {
    /// The name the config spells, and the cargo feature that builds the backend in.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Docker => "docker",
            Backend::E2b => "e2b",
        }
    }
}

/// The E2B-compatible API: the control plane the official E2B SDKs call, and the envd router
/// that relays their data-plane requests to each sandbox's agent, both on one listener.
#[cfg(feature = "e2b-api")]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct E2bSection {
    /// Off by default: a second listener is the operator's act.
    pub enabled: bool,
    /// Where both planes listen (`E2B_API_URL` and `E2B_SANDBOX_URL` are `http://<listen>`).
    pub listen: SocketAddr,
    /// Sandbox hosts are `<port>-<sandboxID>.<domain>`; the create answer names it.
    pub domain: String,
    /// The key every envd access token is derived from. With `store = "redis"` it must be
    /// set (replicas that generated their own would refuse each other's tokens); otherwise
    /// it is generated once into `<data_dir>/e2b-secret` (0600) when unset.
    pub secret: Option<sandbox_core::Secret>,
    /// A create that names no timeout gets this many seconds.
    pub default_timeout_seconds: u64,
    /// The longest timeout a create, connect or set-timeout may ask for.
    pub max_timeout_seconds: u64,
    /// Template names the API accepts, each the engine image it boots. `base` (the SDKs'
    /// default) boots [`DEFAULT_E2B_BASE_IMAGE`] unless named here.
    pub templates: BTreeMap<String, String>,
    /// The images tenants' template builds may start from (`fromImage`), each an image
    /// reference or a prefix ending in `*`. Unset: every image of `templates`, `base`'s
    /// included. Builds never pull: the image must also be on the engine.
    pub build_images: Option<Vec<String>>,
    /// The most requests to one sandbox's preview ports in flight at once (429 beyond).
    pub max_tunnels_per_sandbox: usize,
}

#[cfg(feature = "e2b-api")]
impl Default for E2bSection {
    fn default() -> Self {
        E2bSection {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
            domain: "localhost".to_owned(),
            secret: None,
            default_timeout_seconds: 300,
            max_timeout_seconds: 24 * 60 * 60,
            templates: BTreeMap::new(),
            build_images: None,
            max_tunnels_per_sandbox: 16,
        }
    }
}

/// The image the E2B template `base` boots unless `e2b.templates.base` names another: the
/// Debian sandbox image `cargo xtask debian-image` builds, whose tag is a hash of its recipe.
/// This is the tag of the recipe from Debian's own mirror (`deb.debian.org`, bookworm); a
/// machine whose apt sources name another mirror builds another tag (the command prints it),
/// which `e2b.templates.base` must then name. xtask's tests pin this to the recipe's hash.
#[cfg(feature = "e2b-api")]
pub const DEFAULT_E2B_BASE_IMAGE: &str = "sandbox-debian:2b89ca47ae36";

/// The shortest secret `e2b.secret` may be: tokens derived from less are guessable.
#[cfg(feature = "e2b-api")]
pub const E2B_SECRET_MIN_BYTES: usize = 32;

/// Request limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest upload, in bytes (413 beyond).
    pub upload_max_bytes: u64,
    /// Largest JSON request body, in bytes.
    pub json_max_bytes: u64,
    /// Largest file a download streams (the reader inside the sandbox is stopped at it).
    pub download_max_bytes: u64,
    /// Bytes of request bodies held in memory at once by the whole process (uploads and JSON
    /// bodies): past it, requests answer 503 `server_busy` with `Retry-After` instead of
    /// growing the heap.
    pub inflight_max_bytes: u64,
    /// An interactive terminal idle this long (no keystrokes, no output) is disconnected, and
    /// one with no client attached this long is killed (where the backend keeps detached
    /// terminals: the agent's detach timer). `0` is the default, 15 min; otherwise from 60 s
    /// to 24 h ([`TERMINAL_IDLE_RANGE`]): a value outside is refused at start.
    pub terminal_idle_seconds: u64,
    /// Terminal tickets one tenant may hold unused at once.
    pub tickets_per_tenant: usize,
    /// Largest file the streamed file routes (`…/files/stream`) move in either direction.
    /// Larger than `upload_max_bytes`: these bodies are never held whole, only passed on chunk
    /// by chunk, so their size costs the service no memory.
    pub stream_file_max_bytes: u64,
}

/// The listener's connection handling. Every timeout and cap has a default because a server
/// without them is one slow client away from running out of descriptors or memory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// A connection that has not sent a complete request head this long after connecting (or
    /// after its previous response) is closed.
    pub header_read_timeout_seconds: u64,
    /// A request body that delivers no byte for this long fails with 408 `body_timeout`.
    pub body_idle_timeout_seconds: u64,
    /// A request body not complete this long after its head fails with 408 `body_timeout`.
    pub body_read_timeout_seconds: u64,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Requests one keep-alive connection may carry before the server closes it.
    pub max_requests_per_connection: u64,
    /// On SIGTERM, how long in-flight requests may take before the process exits anyway.
    pub shutdown_grace_seconds: u64,
}

/// Per-tenant ceilings. Each refusal is 429 `quota_exceeded` naming the limit, and creates
/// nothing. `0` means no limit.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Live sandboxes (running or paused) of the tenant's sessions.
    pub max_sandboxes: u32,
    /// Commands running at once: execs, streamed execs and ephemeral executes.
    pub max_concurrent_execs: u32,
    /// Interactive terminals open at once.
    pub max_terminals: u32,
    /// Snapshots kept.
    pub max_snapshots: u32,
    /// Process attach and directory watch streams open at once.
    pub max_streams: u32,
}

/// A tenant's overrides of [`Quotas`]; an absent field keeps the service-wide value.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct QuotaOverrides {
    pub max_sandboxes: Option<u32>,
    pub max_concurrent_execs: Option<u32>,
    pub max_terminals: Option<u32>,
    pub max_snapshots: Option<u32>,
    pub max_streams: Option<u32>,
}

impl Quotas {
    /// These quotas with `overrides` applied.
    pub fn with(self, overrides: &QuotaOverrides) -> Quotas {
        Quotas {
            max_sandboxes: overrides.max_sandboxes.unwrap_or(self.max_sandboxes),
            max_concurrent_execs: overrides
                .max_concurrent_execs
                .unwrap_or(self.max_concurrent_execs),
            max_terminals: overrides.max_terminals.unwrap_or(self.max_terminals),
            max_snapshots: overrides.max_snapshots.unwrap_or(self.max_snapshots),
            max_streams: overrides.max_streams.unwrap_or(self.max_streams),
        }
    }
}

/// One tenant.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    pub id: u64,
    /// Lower-case hex SHA-256 of the bearer token.
    pub token_sha256: String,
    /// This tenant's quotas, where they differ from `[quotas]`.
    #[serde(default)]
    pub quotas: QuotaOverrides,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            store: "memory".to_owned(),
            provider: Backend::Docker,
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "docker")]
            docker: sandbox_provider_docker::DockerConfig::default(),
            #[cfg(feature = "e2b")]
            e2b_provider: sandbox_provider_e2b::E2bConfig::default(),
            limits: Limits::default(),
            server: ServerSection::default(),
            quotas: Quotas::default(),
            tenants: Vec::new(),
            dev_token_file: None,
            data_dir: None,
            #[cfg(feature = "e2b-api")]
            e2b: E2bSection::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            upload_max_bytes: 100 * 1024 * 1024,
            json_max_bytes: 8 * 1024 * 1024,
            download_max_bytes: 4 * 1024 * 1024 * 1024,
            // Ten maximal uploads at once.
            inflight_max_bytes: 1024 * 1024 * 1024,
            terminal_idle_seconds: 15 * 60,
            tickets_per_tenant: 16,
            stream_file_max_bytes: 4 * 1024 * 1024 * 1024,
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            header_read_timeout_seconds: 10,
            body_idle_timeout_seconds: 30,
            body_read_timeout_seconds: 600,
            max_connections: 4096,
            max_requests_per_connection: 1000,
            shutdown_grace_seconds: 30,
        }
    }
}

impl Default for Quotas {
    /// Sized for one Docker host: a tenant can hold a working set of sessions, never the
    /// machine (each sandbox may take 2 CPUs and 2 GiB).
    fn default() -> Self {
        Quotas {
            max_sandboxes: 16,
            max_concurrent_execs: 32,
            max_terminals: 8,
            max_snapshots: 32,
            max_streams: 32,
        }
    }
}

/// Why a config cannot be used.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl ServiceConfig {
    /// Reads `path` (when given), applies the environment overlay from `env` ([`ENV_VARS`]),
    /// and validates.
    pub fn load(path: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut table = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read config {}: {e}", path.display()))
                })?;
                let table: toml::Table = toml::from_str(&text)
                    .map_err(|e| ConfigError(format!("config {}: {e}", path.display())))?;
                // The file alone first, so its own mistakes are reported as the file's.
                refuse_compiled_out(&table, &[])
                    .map_err(|e| ConfigError(format!("config {}: {e}", path.display())))?;
                deserialize(table.clone())
                    .map_err(|e| ConfigError(format!("config {}: {e}", path.display())))?;
                table
            }
            None => toml::Table::new(),
        };
        let applied = overlay(&mut table, env)?;
        refuse_compiled_out(&table, &applied).map_err(ConfigError)?;
        let config = deserialize(table).map_err(|e| ConfigError(blame(&applied, &e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Refuses configs that cannot work, with the field to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.store.as_str() {
            "memory" => {}
            "redis" => {
                // The section checks its own fields when it is read; here only its presence.
                #[cfg(feature = "redis")]
                if self.redis.is_none() {
                    return Err(ConfigError(
                        "store \"redis\" needs exactly one of redis.url (SANDBOX_REDIS_URL) and redis.cluster_nodes (SANDBOX_REDIS_CLUSTER_NODES)".to_owned(),
                    ));
                }
            }
            other => {
                return Err(ConfigError(format!(
                    "store {other:?} is not known; use \"memory\" or \"redis\""
                )));
            }
        }
        for t in &self.tenants {
            if t.id == 0 {
                return Err(ConfigError("tenants: id must not be 0".to_owned()));
            }
            let ok = t.token_sha256.len() == 64
                && t.token_sha256
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
            if !ok {
                return Err(ConfigError(format!(
                    "tenants: tenant {} token_sha256 must be 64 lower-case hex digits",
                    t.id
                )));
            }
        }
        let l = &self.limits;
        if l.terminal_idle_seconds != 0 && !TERMINAL_IDLE_RANGE.contains(&l.terminal_idle_seconds) {
            return Err(ConfigError(format!(
                "limits.terminal_idle_seconds (SANDBOX_TERMINAL_IDLE_SECONDS) is {}: use 0 for the default (900) or {} to {} seconds (1 min to 24 h); a shorter limit would kill terminals between keystrokes, a longer one keeps abandoned shells for days",
                l.terminal_idle_seconds,
                TERMINAL_IDLE_RANGE.start(),
                TERMINAL_IDLE_RANGE.end()
            )));
        }
        if l.upload_max_bytes == 0
            || l.json_max_bytes == 0
            || l.download_max_bytes == 0
            || l.tickets_per_tenant == 0
            || l.stream_file_max_bytes == 0
        {
            return Err(ConfigError("limits must be positive".to_owned()));
        }
        if l.inflight_max_bytes < l.upload_max_bytes.max(l.json_max_bytes) {
            return Err(ConfigError(
                "limits.inflight_max_bytes must hold at least one maximal upload and one maximal JSON body".to_owned(),
            ));
        }
        #[cfg(feature = "e2b-api")]
        self.validate_e2b()?;
        self.validate_backend()?;
        let s = &self.server;
        if s.header_read_timeout_seconds == 0
            || s.body_idle_timeout_seconds == 0
            || s.body_read_timeout_seconds == 0
            || s.max_connections == 0
            || s.max_connections > MAX_CONNECTIONS
            || s.max_requests_per_connection == 0
        {
            return Err(ConfigError(format!(
                "server: timeouts and max_requests_per_connection must be positive, max_connections from 1 to {MAX_CONNECTIONS}"
            )));
        }
        Ok(())
    }
}

impl ServiceConfig {
    /// The data directory: `data_dir`, else `$XDG_DATA_HOME/sandbox`, else
    /// `~/.local/share/sandbox` (the temporary directory when there is no home).
    pub fn data_dir(&self) -> PathBuf {
        if let Some(dir) = &self.data_dir {
            return dir.clone();
        }
        std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("share"))
            })
            .unwrap_or_else(std::env::temp_dir)
            .join("sandbox")
    }

    /// The E2B backend's section must be complete (every missing key named at once). A
    /// backend this build lacks is not refused here: `doctor` reports it as a failed check and
    /// `serve` refuses to start, each naming the feature that adds it.
    fn validate_backend(&self) -> Result<(), ConfigError> {
        #[cfg(feature = "e2b")]
        if self.provider == Backend::E2b {
            self.e2b_provider
                .validate()
                .map_err(|e| ConfigError(e.message().to_owned()))?;
        }
        Ok(())
    }

    #[cfg(feature = "e2b-api")]
    fn validate_e2b(&self) -> Result<(), ConfigError> {
        let e = &self.e2b;
        if !e.enabled {
            return Ok(());
        }
        if self.store == "redis" && e.secret.is_none() {
            return Err(ConfigError(
                "e2b.secret (SANDBOX_E2B_SECRET) must be set with store \"redis\": every replica derives the sandboxes' envd tokens from it, and secrets generated per replica would refuse each other's tokens".to_owned(),
            ));
        }
        if let Some(secret) = &e.secret
            && secret.expose().len() < E2B_SECRET_MIN_BYTES
        {
            return Err(ConfigError(format!(
                "e2b.secret (SANDBOX_E2B_SECRET) must be at least {E2B_SECRET_MIN_BYTES} bytes: `openssl rand -hex 32` makes one"
            )));
        }
        let domain_ok = !e.domain.is_empty()
            && e.domain.len() <= 253
            && e.domain.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            });
        if !domain_ok {
            return Err(ConfigError(format!(
                "e2b.domain {:?} is not a lower-case DNS name",
                e.domain.chars().take(64).collect::<String>()
            )));
        }
        let max = e.max_timeout_seconds;
        if max == 0 || max > MAX_E2B_TIMEOUT_SECONDS {
            return Err(ConfigError(format!(
                "e2b.max_timeout_seconds must be from 1 to {MAX_E2B_TIMEOUT_SECONDS}"
            )));
        }
        if e.default_timeout_seconds == 0 || e.default_timeout_seconds > max {
            return Err(ConfigError(
                "e2b.default_timeout_seconds must be from 1 to e2b.max_timeout_seconds".to_owned(),
            ));
        }
        if e.max_tunnels_per_sandbox == 0 {
            return Err(ConfigError(
                "e2b.max_tunnels_per_sandbox must be at least 1".to_owned(),
            ));
        }
        for (name, image) in &e.templates {
            let name_ok = !name.is_empty()
                && name.len() <= 128
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.:/".contains(&b));
            if !name_ok {
                return Err(ConfigError(format!(
                    "e2b.templates: the name {:?} must be lower-case letters, digits and -_.:/",
                    name.chars().take(64).collect::<String>()
                )));
            }
            let image_ok = !image.is_empty()
                && image.len() <= 255
                && image
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b));
            if !image_ok {
                return Err(ConfigError(format!(
                    "e2b.templates.{name}: {:?} is not an image reference (letters, digits and ._/:@-)",
                    image.chars().take(64).collect::<String>()
                )));
            }
            sandbox_core::TemplateId::new(image)
                .map_err(|e| ConfigError(format!("e2b.templates.{name}: {}", e.message())))?;
        }
        for image in e.build_images.iter().flatten() {
            let reference = image.strip_suffix('*').unwrap_or(image);
            let ok = !image.is_empty()
                && image.len() <= 255
                && reference
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b));
            if !ok {
                return Err(ConfigError(format!(
                    "e2b.build_images: {:?} is not an image reference or a prefix ending in * (letters, digits and ._/:@-)",
                    image.chars().take(64).collect::<String>()
                )));
            }
        }
        Ok(())
    }
}

/// The longest E2B sandbox timeout an operator may allow: the core's idle-timeout ceiling.
#[cfg(feature = "e2b-api")]
pub const MAX_E2B_TIMEOUT_SECONDS: u64 = sandbox_core::sandbox::MAX_IDLE_TIMEOUT.as_secs();

/// The values `limits.terminal_idle_seconds` may take besides `0` (the default): [60 s, 24 h].
pub const TERMINAL_IDLE_RANGE: std::ops::RangeInclusive<u64> = 60..=24 * 60 * 60;

/// The most connections `server.max_connections` may name.
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// The config sections that exist only when their cargo feature is built in. Without the
/// feature serde would say "unknown field `docker`", which reads like a typo; the operator
/// needs to hear that this build lacks the backend or store, and which feature adds it.
const FEATURE_SECTIONS: &[(&str, &str, bool)] = &[
    ("docker", "docker", cfg!(feature = "docker")),
    ("redis", "redis", cfg!(feature = "redis")),
    ("e2b", "e2b-api", cfg!(feature = "e2b-api")),
    ("e2b_provider", "e2b", cfg!(feature = "e2b")),
];

/// Refuses a section of `table` whose feature this build lacks, naming the feature and, when
/// the environment put it there, the variables that did.
fn refuse_compiled_out(table: &toml::Table, applied: &[&EnvVar]) -> Result<(), String> {
    for (section, feature, built) in FEATURE_SECTIONS {
        if *built || !table.contains_key(*section) {
            continue;
        }
        let prefix = format!("{section}.");
        let from_env: Vec<&str> = applied
            .iter()
            .filter(|row| row.key.starts_with(&prefix))
            .map(|row| row.name)
            .collect();
        let source = if from_env.is_empty() {
            format!("the section [{section}]")
        } else {
            from_env.join(", ")
        };
        return Err(format!(
            "{source} configures {section}, but this build has no {section} support; \
             rebuild with the cargo feature `{feature}` (the `sandbox` binary has it by default)"
        ));
    }
    Ok(())
}

/// `table` as the service config; the error on one line, ending with the key at fault.
fn deserialize(table: toml::Table) -> Result<ServiceConfig, String> {
    ServiceConfig::deserialize(toml::Value::Table(table)).map_err(|e| {
        e.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    })
}

/// Names the variable behind a refusal of the overlaid config: the one that set the key the
/// error ends with, else every variable applied (the file alone was already accepted).
fn blame(applied: &[&EnvVar], error: &str) -> String {
    let culprit = applied.iter().find(|row| {
        error.ends_with(&format!("in `{}`", row.key))
            || row
                .key
                .split_once('.')
                .is_some_and(|(section, _)| error.ends_with(&format!("in `{section}`")))
    });
    match culprit {
        Some(row) => format!("{} ({}): {error}", row.name, row.key),
        None => {
            let names: Vec<&str> = applied.iter().map(|row| row.name).collect();
            format!("with {} from the environment: {error}", names.join(", "))
        }
    }
}

/// How an environment value becomes a file value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvKind {
    /// On or off, through [`parse_flag`].
    Flag,
    /// A non-negative whole number. The next three are the same in a unit, named in errors
    /// and in the README so `10G` or `5s` is refused in the operator's terms.
    Count,
    /// A size in bytes.
    Bytes,
    /// A duration in whole seconds.
    Seconds,
    /// A duration in milliseconds.
    Millis,
    /// A string, parsed by the key's own type (address, path, enum, URL...).
    Text,
    /// Comma-separated strings; blanks dropped.
    List,
}

impl EnvKind {
    /// What the value is, in the README's words.
    pub fn describe(self) -> &'static str {
        match self {
            EnvKind::Flag => "on/off",
            EnvKind::Count => "number",
            EnvKind::Bytes => "bytes",
            EnvKind::Seconds => "seconds",
            EnvKind::Millis => "milliseconds",
            EnvKind::Text => "text",
            EnvKind::List => "list",
        }
    }

    fn value(self, name: &str, raw: &str) -> Result<toml::Value, ConfigError> {
        let number = |what: &str| {
            raw.parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(toml::Value::Integer)
                .ok_or_else(|| ConfigError(format!("{name}={raw:?} is not {what}")))
        };
        Ok(match self {
            EnvKind::Flag => toml::Value::Boolean(parse_flag(name, raw)?),
            EnvKind::Count => number("a non-negative whole number")?,
            EnvKind::Bytes => number("a byte count")?,
            EnvKind::Seconds => number("a number of seconds")?,
            EnvKind::Millis => number("a number of milliseconds")?,
            EnvKind::Text => toml::Value::String(raw.to_owned()),
            EnvKind::List => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|item| !item.is_empty())
                    .map(|item| toml::Value::String(item.to_owned()))
                    .collect(),
            ),
        })
    }
}

/// One environment variable: the file key it sets, how its value is read, and what it means.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    pub name: &'static str,
    /// The dotted file key (`docker.enabled`).
    pub key: &'static str,
    pub kind: EnvKind,
    /// The value when neither the file nor the environment sets the key, as the variable
    /// would spell it; empty when unset means absent. A test proves each is the real default.
    pub default: &'static str,
    pub description: &'static str,
}

const fn var(
    name: &'static str,
    key: &'static str,
    kind: EnvKind,
    default: &'static str,
    description: &'static str,
) -> EnvVar {
    EnvVar {
        name,
        key,
        kind,
        default,
        description,
    }
}

use EnvKind::{Bytes, Count, Flag, List, Millis, Seconds, Text};

/// Every `SANDBOX_*` variable the service reads for its config, one per file key (the
/// structured `[[tenants]]` list is file-only). Adding a key means adding its row: the tests
/// fail for a key without one.
pub const ENV_VARS: &[EnvVar] = &[
    var(
        "SANDBOX_LISTEN",
        "listen",
        Text,
        "127.0.0.1:8080",
        "address:port the HTTP API listens on (loopback: exposing it is a deliberate act)",
    ),
    var(
        "SANDBOX_STORE",
        "store",
        Text,
        "memory",
        "binding store: `memory` (one process) or `redis` (shared by replicas)",
    ),
    var(
        "SANDBOX_PROVIDER",
        "provider",
        Text,
        "docker",
        "the backend sandboxes run on: `docker` (`[docker]`) or `e2b` (an E2B control plane, `[e2b_provider]`)",
    ),
    var(
        "SANDBOX_DEV_TOKEN_FILE",
        "dev_token_file",
        Text,
        "",
        "the development tenant's token file (unset: ~/.config/sandbox/dev-token)",
    ),
    var(
        "SANDBOX_DATA_DIR",
        "data_dir",
        Text,
        "",
        "what must outlive a restart on this machine: the E2B API's generated secret and, with the memory store, its sandbox deadlines (unset: ~/.local/share/sandbox)",
    ),
    var(
        "SANDBOX_E2B_ENABLED",
        "e2b.enabled",
        Flag,
        "false",
        "serve the E2B-compatible API (control plane and envd router) on `e2b.listen`",
    ),
    var(
        "SANDBOX_E2B_LISTEN",
        "e2b.listen",
        Text,
        "127.0.0.1:3000",
        "address:port of the E2B API; point `E2B_API_URL` and `E2B_SANDBOX_URL` at `http://` it",
    ),
    var(
        "SANDBOX_E2B_DOMAIN",
        "e2b.domain",
        Text,
        "localhost",
        "sandbox hosts are `<port>-<sandboxID>.<domain>`",
    ),
    var(
        "SANDBOX_E2B_SECRET",
        "e2b.secret",
        Text,
        "",
        "the key envd access tokens are derived from, at least 32 bytes (a secret; required with the Redis store; unset: generated into the data directory)",
    ),
    var(
        "SANDBOX_E2B_BASE_TEMPLATE",
        "e2b.templates.base",
        Text,
        "",
        "the image the SDKs' default template `base` boots (unset: `sandbox-debian:2b89ca47ae36`, what `cargo xtask debian-image` builds from deb.debian.org bookworm); it needs a `user` account and `/bin/bash`, as the Debian image has",
    ),
    var(
        "SANDBOX_E2B_BUILD_IMAGES",
        "e2b.build_images",
        List,
        "",
        "images E2B template builds may start from (`fromImage`), references or prefixes ending in `*` (unset: the images of `e2b.templates`); never pulled",
    ),
    var(
        "SANDBOX_E2B_DEFAULT_TIMEOUT_SECONDS",
        "e2b.default_timeout_seconds",
        Seconds,
        "300",
        "an E2B sandbox created without a timeout is killed this long after its create",
    ),
    var(
        "SANDBOX_E2B_MAX_TIMEOUT_SECONDS",
        "e2b.max_timeout_seconds",
        Seconds,
        "86400",
        "the longest timeout an E2B create, connect or set-timeout may ask for",
    ),
    var(
        "SANDBOX_E2B_MAX_TUNNELS_PER_SANDBOX",
        "e2b.max_tunnels_per_sandbox",
        Count,
        "16",
        "the most requests to one E2B sandbox's preview ports (`<port>-<id>` hosts) in flight at once (429 with `Retry-After: 1` beyond)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_API_URL",
        "e2b_provider.api_url",
        Text,
        "https://api.e2b.app",
        "the E2B control plane: E2B's cloud, a self-hosted plane, or another `sandbox serve`'s `[e2b]` listener",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_API_KEY",
        "e2b_provider.api_key",
        Text,
        "",
        "sent as `X-API-Key` (a secret: never logged or returned)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_SANDBOX_DOMAIN",
        "e2b_provider.sandbox_domain",
        Text,
        "e2b.app",
        "the domain of sandbox hosts: envd of sandbox `<id>` is `49983-<id>.<domain>`",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_PROXY_URL",
        "e2b_provider.proxy_url",
        Text,
        "",
        "a gateway every data-plane request is dialled at, routed by `Host` (self-hosted planes; unset: sandbox hosts resolved by DNS)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_TEMPLATE",
        "e2b_provider.template",
        Text,
        "",
        "the template sessions' sandboxes boot (required with `provider = \"e2b\"`)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_TEMPLATE_FROM_IMAGE",
        "e2b_provider.template_from_image",
        Text,
        "",
        "the image the standard template is built from (E2B's `fromImage`) when the plane lacks a ready build of its tag (unset: only checked, never built)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_TEMPLATE_BUILD_TIMEOUT_SECONDS",
        "e2b_provider.template_build_timeout_seconds",
        Seconds,
        "600",
        "the bound of one build of the standard template, from its request until it is ready",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_TTL_SECONDS",
        "e2b_provider.ttl_seconds",
        Seconds,
        "300",
        "a sandbox's idle lifetime on the plane",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_ALLOW_PRIVATE_ENDPOINTS",
        "e2b_provider.allow_private_endpoints",
        Flag,
        "false",
        "let the plane, gateway and envd resolve to private or loopback addresses (link-local and metadata addresses stay refused)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_HTTP_TIMEOUT_SECONDS",
        "e2b_provider.http_timeout_seconds",
        Seconds,
        "30",
        "the bound of a control-plane call without a route deadline of its own",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_CREATE_TIMEOUT_SECONDS",
        "e2b_provider.create_timeout_seconds",
        Seconds,
        "60",
        "the bound of a create (never resent after it passes)",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_CONNECT_TIMEOUT_SECONDS",
        "e2b_provider.connect_timeout_seconds",
        Seconds,
        "130",
        "the bound of a connect or resume",
    ),
    var(
        "SANDBOX_E2B_PROVIDER_SNAPSHOT_TIMEOUT_SECONDS",
        "e2b_provider.snapshot_timeout_seconds",
        Seconds,
        "250",
        "the bound of a snapshot",
    ),
    var(
        "SANDBOX_REDIS_URL",
        "redis.url",
        Text,
        "",
        "standalone Redis: `redis://[user:password@]host:port[/db]` (`rediss://` for TLS)",
    ),
    var(
        "SANDBOX_REDIS_CLUSTER_NODES",
        "redis.cluster_nodes",
        List,
        "",
        "Redis Cluster seed nodes, `host:port,host:port`",
    ),
    var(
        "SANDBOX_REDIS_NAMESPACE",
        "redis.namespace",
        Text,
        "default",
        "scopes every key, so deployments can share one Redis",
    ),
    var(
        "SANDBOX_REDIS_USERNAME",
        "redis.username",
        Text,
        "",
        "ACL user",
    ),
    var(
        "SANDBOX_REDIS_PASSWORD",
        "redis.password",
        Text,
        "",
        "ACL password (a secret: never logged; better here than in a file)",
    ),
    var(
        "SANDBOX_REDIS_LOCK_LEASE_MS",
        "redis.lock_lease_ms",
        Millis,
        "60000",
        "the lifecycle lock's lease (at least 30; renewed at a third of it)",
    ),
    var(
        "SANDBOX_REDIS_COMMAND_TIMEOUT_MS",
        "redis.command_timeout_ms",
        Millis,
        "5000",
        "every Redis command's deadline",
    ),
    var(
        "SANDBOX_REDIS_TLS_CA_FILE",
        "redis.tls_ca_file",
        Text,
        "",
        "PEM CA of the server's certificate; turns TLS on",
    ),
    var(
        "SANDBOX_REDIS_TLS_CLIENT_CERT_FILE",
        "redis.tls_client_cert_file",
        Text,
        "",
        "PEM client certificate chain, for `tls-auth-clients yes`",
    ),
    var(
        "SANDBOX_REDIS_TLS_CLIENT_KEY_FILE",
        "redis.tls_client_key_file",
        Text,
        "",
        "PEM key of the client certificate",
    ),
    var(
        "SANDBOX_DOCKER_ENABLED",
        "docker.enabled",
        Flag,
        "false",
        "enable the Docker backend (a Docker socket is host root, so it is an opt-in)",
    ),
    var(
        "SANDBOX_DOCKER_HOST",
        "docker.host",
        Text,
        "",
        "engine endpoint in `DOCKER_HOST` form (unset: `DOCKER_HOST`, then the local socket)",
    ),
    var(
        "SANDBOX_DOCKER_TLS_CERT_PATH",
        "docker.tls_cert_path",
        Text,
        "",
        "directory with `ca.pem`, `cert.pem`, `key.pem`; required for `tcp://` engines",
    ),
    var(
        "SANDBOX_DOCKER_IMAGE",
        "docker.image",
        Text,
        "sandbox-busybox:test",
        "the image sandboxes boot",
    ),
    var(
        "SANDBOX_DOCKER_NAMESPACE",
        "docker.namespace",
        Text,
        "default",
        "scopes containers, networks and snapshots on the engine",
    ),
    var(
        "SANDBOX_DOCKER_PULL_POLICY",
        "docker.pull_policy",
        Text,
        "never",
        "`never`, `missing` or `always`",
    ),
    var(
        "SANDBOX_DOCKER_NETWORK",
        "docker.network",
        Text,
        "bridge",
        "`bridge` (behind egress rules) or `none`",
    ),
    var(
        "SANDBOX_DOCKER_ALLOW_PRIVATE_ENDPOINTS",
        "docker.allow_private_endpoints",
        Flag,
        "false",
        "let sandboxes reach private and loopback ranges (link-local stays blocked)",
    ),
    var(
        "SANDBOX_DOCKER_RUNTIME",
        "docker.runtime",
        Text,
        "",
        "OCI runtime for sandboxes, e.g. `runsc` (unset: the engine's)",
    ),
    var(
        "SANDBOX_DOCKER_IDLE_TTL_SECONDS",
        "docker.idle_ttl_seconds",
        Seconds,
        "1800",
        "an idle sandbox is reclaimed after this long",
    ),
    var(
        "SANDBOX_DOCKER_SWEEP_INTERVAL_SECONDS",
        "docker.sweep_interval_seconds",
        Seconds,
        "60",
        "the idle sweep runs at most this often (on a create or connect)",
    ),
    var(
        "SANDBOX_DOCKER_LOG_MAX_BYTES",
        "docker.log_max_bytes",
        Bytes,
        "1048576",
        "bound on each container's log on the engine's disk (0 = no log)",
    ),
    var(
        "SANDBOX_DOCKER_STORAGE_LIMIT_BYTES",
        "docker.storage_limit_bytes",
        Bytes,
        "10737418240",
        "bound on each sandbox's writable layer where the engine enforces one (0 = none)",
    ),
    var(
        "SANDBOX_DOCKER_BUILD_IMAGE",
        "docker.build_missing_image",
        Flag,
        "true",
        "build a missing `sandbox-busybox:<tag>` image on start",
    ),
    var(
        "SANDBOX_DOCKER_BUSYBOX",
        "docker.busybox_path",
        Text,
        "/bin/busybox",
        "the static busybox that image is built from",
    ),
    var(
        "SANDBOX_DOCKER_DATA_PLANE",
        "docker.data_plane",
        Text,
        "agent",
        "`agent`: sandbox-agent is copied into every sandbox as its PID 1, and commands, files and terminals travel over one kept exec channel to it; `exec`: the declared fallback, a `docker exec` for each (no silent switch between them: an unusable agent fails the start)",
    ),
    var(
        "SANDBOX_DOCKER_AGENT_PATH",
        "docker.agent_path",
        Text,
        "",
        "the static sandbox-agent agent mode installs (unset: `sandbox-agent` beside the running binary; `cargo xtask agent` builds it, and `cargo xtask serve` builds it and sets this)",
    ),
    var(
        "SANDBOX_DOCKER_PROCESSES_PER_SANDBOX",
        "docker.processes_per_sandbox",
        Count,
        "256",
        "agent mode: the most processes one sandbox runs at once (background processes, commands and terminals; `process_limit` beyond)",
    ),
    var(
        "SANDBOX_UPLOAD_MAX_BYTES",
        "limits.upload_max_bytes",
        Bytes,
        "104857600",
        "largest upload (413 beyond)",
    ),
    var(
        "SANDBOX_JSON_MAX_BYTES",
        "limits.json_max_bytes",
        Bytes,
        "8388608",
        "largest JSON request body",
    ),
    var(
        "SANDBOX_DOWNLOAD_MAX_BYTES",
        "limits.download_max_bytes",
        Bytes,
        "4294967296",
        "largest file a download streams",
    ),
    var(
        "SANDBOX_INFLIGHT_MAX_BYTES",
        "limits.inflight_max_bytes",
        Bytes,
        "1073741824",
        "request-body bytes held at once by the process (503 `server_busy` beyond)",
    ),
    var(
        "SANDBOX_TERMINAL_IDLE_SECONDS",
        "limits.terminal_idle_seconds",
        Seconds,
        "900",
        "an idle terminal is disconnected, and a detached one killed, after this long (0: 900; else 60 to 86400)",
    ),
    var(
        "SANDBOX_TICKETS_PER_TENANT",
        "limits.tickets_per_tenant",
        Count,
        "16",
        "unused terminal tickets one tenant may hold",
    ),
    var(
        "SANDBOX_STREAM_FILE_MAX_BYTES",
        "limits.stream_file_max_bytes",
        Bytes,
        "4294967296",
        "largest file the streamed file routes move (never held whole; 413 or a cut answer beyond)",
    ),
    var(
        "SANDBOX_SERVER_HEADER_READ_TIMEOUT_SECONDS",
        "server.header_read_timeout_seconds",
        Seconds,
        "10",
        "a connection must send a request head within this",
    ),
    var(
        "SANDBOX_SERVER_BODY_IDLE_TIMEOUT_SECONDS",
        "server.body_idle_timeout_seconds",
        Seconds,
        "30",
        "a body silent this long fails with 408",
    ),
    var(
        "SANDBOX_SERVER_BODY_READ_TIMEOUT_SECONDS",
        "server.body_read_timeout_seconds",
        Seconds,
        "600",
        "a body not complete this long after its head fails with 408",
    ),
    var(
        "SANDBOX_SERVER_MAX_CONNECTIONS",
        "server.max_connections",
        Count,
        "4096",
        "connections served at once",
    ),
    var(
        "SANDBOX_SERVER_MAX_REQUESTS_PER_CONNECTION",
        "server.max_requests_per_connection",
        Count,
        "1000",
        "requests per keep-alive connection",
    ),
    var(
        "SANDBOX_SERVER_SHUTDOWN_GRACE_SECONDS",
        "server.shutdown_grace_seconds",
        Seconds,
        "30",
        "how long in-flight requests may take after SIGTERM",
    ),
    var(
        "SANDBOX_QUOTA_MAX_SANDBOXES",
        "quotas.max_sandboxes",
        Count,
        "16",
        "live sandboxes per tenant (0 = no limit, as for every quota)",
    ),
    var(
        "SANDBOX_QUOTA_MAX_CONCURRENT_EXECS",
        "quotas.max_concurrent_execs",
        Count,
        "32",
        "commands running at once per tenant",
    ),
    var(
        "SANDBOX_QUOTA_MAX_TERMINALS",
        "quotas.max_terminals",
        Count,
        "8",
        "terminals open at once per tenant",
    ),
    var(
        "SANDBOX_QUOTA_MAX_SNAPSHOTS",
        "quotas.max_snapshots",
        Count,
        "32",
        "snapshots kept per tenant",
    ),
    var(
        "SANDBOX_QUOTA_MAX_STREAMS",
        "quotas.max_streams",
        Count,
        "32",
        "process attach and directory watch streams open at once per tenant",
    ),
];

/// Writes every variable of [`ENV_VARS`] that `env` sets (blank counts as unset) into `table`
/// at its key; returns the rows applied.
fn overlay(
    table: &mut toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<Vec<&'static EnvVar>, ConfigError> {
    let mut applied = Vec::new();
    for row in ENV_VARS {
        let Some(raw) = env
            .get(row.name)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
        else {
            continue;
        };
        let value = row.kind.value(row.name, raw)?;
        let mut at = &mut *table;
        let mut parts = row.key.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                at.insert(part.to_owned(), value);
                break;
            }
            let entry = at
                .entry(part.to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            at = entry.as_table_mut().ok_or_else(|| {
                ConfigError(format!(
                    "{}: the file's `{part}` is not a section",
                    row.name
                ))
            })?;
        }
        applied.push(row);
    }
    Ok(applied)
}

/// The one on/off parser: `1`, `true`, `yes`, `on` are on; `0`, `false`, `no`, `off` are off
/// (any case). Anything else is an error naming the variable rather than a silent off, so an
/// operator who typed `ture` learns it at start; it never turns anything on.
pub fn parse_flag(name: &str, raw: &str) -> Result<bool, ConfigError> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(ConfigError(format!(
            "{name}={:?} is neither on nor off: use true or false",
            raw.chars().take(40).collect::<String>()
        ))),
    }
}

/// The README's configuration table, generated from [`ENV_VARS`].
pub fn env_table_markdown() -> String {
    let mut out = String::from(
        "| variable | file key | value | default | what it sets |\n| --- | --- | --- | --- | --- |\n",
    );
    for row in ENV_VARS {
        let default = match row.default {
            "" => "unset".to_owned(),
            d => format!("`{d}`"),
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {default} | {} |\n",
            row.name,
            row.key,
            row.kind.describe(),
            row.description
        ));
    }
    out
}

// Built in every feature set: it checks what a build without a section says.
#[cfg(test)]
mod feature_section_tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A section whose feature is not built is refused naming the feature, from a file and from
    /// the environment alike; a built one passes. Runs in both the default build and the
    /// `--no-default-features` hermetic step, so each side of the check is exercised.
    #[test]
    fn a_section_of_a_feature_not_built_names_the_feature() {
        for (section, variable, built) in [
            ("docker", "SANDBOX_DOCKER_ENABLED", cfg!(feature = "docker")),
            ("redis", "SANDBOX_REDIS_URL", cfg!(feature = "redis")),
        ] {
            let value = if section == "docker" {
                "true"
            } else {
                "redis://127.0.0.1:6379"
            };
            let from_env = ServiceConfig::load(None, &env(&[(variable, value)]));
            let dir = std::env::temp_dir().join(format!(
                "sandbox-config-feature-{section}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("config.toml");
            std::fs::write(&file, format!("[{section}]\n")).unwrap();
            let from_file = ServiceConfig::load(Some(&file), &BTreeMap::new());
            std::fs::remove_dir_all(&dir).unwrap();
            if built {
                assert!(from_env.is_ok(), "{section}: {:?}", from_env.err());
                assert!(
                    from_file
                        .as_ref()
                        .map_err(|e| e.0.clone())
                        .err()
                        .is_none_or(|e| !e.contains("cargo feature")),
                    "{section}: a built feature's section is never refused as missing"
                );
                continue;
            }
            let e = from_env.err().map(|e| e.0).unwrap_or_default();
            assert!(
                e.contains(variable) && e.contains(&format!("cargo feature `{section}`")),
                "{section} from the environment: {e}"
            );
            assert!(!e.contains("unknown field"), "{e}");
            let e = from_file.err().map(|e| e.0).unwrap_or_default();
            assert!(
                e.contains(&format!("[{section}]"))
                    && e.contains(&format!("cargo feature `{section}`")),
                "{section} from the file: {e}"
            );
        }
    }
}

// The tests read the Docker and Redis sections, which exist with the default features.
#[cfg(all(test, feature = "docker", feature = "redis"))]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_terminal_idle_limit_is_refused_outside_its_range() {
        let idle = |v: &str| {
            ServiceConfig::load(None, &env(&[("SANDBOX_TERMINAL_IDLE_SECONDS", v)]))
                .map(|c| c.limits.terminal_idle_seconds)
        };
        assert_eq!(idle("0").unwrap(), 0, "0 is the default");
        assert_eq!(idle("60").unwrap(), 60);
        assert_eq!(idle("86400").unwrap(), 86_400);
        for bad in ["59", "1", "86401"] {
            let e = idle(bad).unwrap_err().to_string();
            assert!(
                e.contains("limits.terminal_idle_seconds") && e.contains("60 to 86400"),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            ServiceConfig::load(None, &BTreeMap::new())
                .unwrap()
                .limits
                .terminal_idle_seconds,
            900
        );
    }

    #[cfg(feature = "e2b-api")]
    #[test]
    fn the_e2b_section_refuses_what_cannot_work() {
        let load = |pairs: &[(&str, &str)]| ServiceConfig::load(None, &env(pairs));
        let off = load(&[]).unwrap();
        assert!(!off.e2b.enabled, "a second listener is the operator's act");
        assert_eq!(off.e2b.listen.ip().to_string(), "127.0.0.1");
        let on = [("SANDBOX_E2B_ENABLED", "true")];
        let c = load(&on).unwrap();
        assert_eq!(c.e2b.default_timeout_seconds, 300);
        assert_eq!(c.e2b.max_tunnels_per_sandbox, 16);
        let secret = "0123456789abcdef0123456789abcdef";
        for (pairs, needle) in [
            (
                vec![
                    ("SANDBOX_STORE", "redis"),
                    ("SANDBOX_REDIS_URL", "redis://127.0.0.1:1"),
                ],
                "e2b.secret",
            ),
            (vec![("SANDBOX_E2B_SECRET", "short")], "at least 32 bytes"),
            (vec![("SANDBOX_E2B_DOMAIN", "Not A Domain")], "e2b.domain"),
            (
                vec![("SANDBOX_E2B_MAX_TIMEOUT_SECONDS", "0")],
                "max_timeout",
            ),
            (
                vec![("SANDBOX_E2B_DEFAULT_TIMEOUT_SECONDS", "90000")],
                "default_timeout",
            ),
            (
                vec![("SANDBOX_E2B_BASE_TEMPLATE", "bad image name!")],
                "e2b.templates.base",
            ),
            (
                vec![("SANDBOX_E2B_BUILD_IMAGES", "ok:1,bad image*")],
                "e2b.build_images",
            ),
            (
                vec![("SANDBOX_E2B_MAX_TUNNELS_PER_SANDBOX", "0")],
                "e2b.max_tunnels_per_sandbox",
            ),
        ] {
            let mut all = on.to_vec();
            all.extend(pairs.iter().copied());
            let err = load(&all).unwrap_err();
            assert!(err.0.contains(needle), "{pairs:?}: {err}");
        }
        // With a secret the Redis store is fine, and the secret is never printed.
        let c = load(&[
            on[0],
            ("SANDBOX_STORE", "redis"),
            ("SANDBOX_REDIS_URL", "redis://127.0.0.1:1"),
            ("SANDBOX_E2B_SECRET", secret),
        ])
        .unwrap();
        assert!(!format!("{c:?}").contains(secret));
        // Disabled, nothing of it is judged.
        assert!(load(&[("SANDBOX_E2B_SECRET", "short")]).is_ok());
    }

    #[test]
    fn defaults_are_safe_and_env_overrides_apply() {
        let c = ServiceConfig::load(None, &BTreeMap::new()).unwrap();
        assert!(c.listen.ip().is_loopback());
        assert!(
            !c.docker.enabled,
            "the Docker backend is the operator's opt-in"
        );
        assert_eq!(c.limits.upload_max_bytes, 100 * 1024 * 1024);
        let c = ServiceConfig::load(
            None,
            &env(&[
                ("SANDBOX_DOCKER_ENABLED", "true"),
                ("SANDBOX_LISTEN", "127.0.0.1:9999"),
            ]),
        )
        .unwrap();
        assert!(c.docker.enabled);
        assert_eq!(c.listen.port(), 9999);
        assert!(ServiceConfig::load(None, &env(&[("SANDBOX_LISTEN", "nowhere")])).is_err());
        assert!(ServiceConfig::load(None, &env(&[("SANDBOX_STORE", "etcd")])).is_err());
    }

    #[test]
    fn files_are_strict() {
        let dir = std::env::temp_dir().join(format!("sbx-cfg-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(&good, "listen = \"127.0.0.1:7000\"\n[docker]\nenabled = true\n[[tenants]]\nid = 1\ntoken_sha256 = \"".to_owned() + &"a".repeat(64) + "\"\n").unwrap();
        let c = ServiceConfig::load(Some(&good), &BTreeMap::new()).unwrap();
        assert_eq!(c.tenants.len(), 1);
        let typo = dir.join("typo.toml");
        std::fs::write(&typo, "listn = \"x\"\n").unwrap();
        assert!(
            ServiceConfig::load(Some(&typo), &BTreeMap::new())
                .unwrap_err()
                .0
                .contains("unknown field")
        );
        let bad_hash = dir.join("hash.toml");
        std::fs::write(
            &bad_hash,
            "[[tenants]]\nid = 1\ntoken_sha256 = \"secret\"\n",
        )
        .unwrap();
        assert!(ServiceConfig::load(Some(&bad_hash), &BTreeMap::new()).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_on_off_parser_is_strict_and_never_enables_by_accident() {
        for on in ["1", "true", "YES", " on "] {
            assert!(parse_flag("X", on).unwrap(), "{on}");
        }
        for off in ["0", "false", "No", "OFF"] {
            assert!(!parse_flag("X", off).unwrap(), "{off}");
        }
        let err =
            ServiceConfig::load(None, &env(&[("SANDBOX_DOCKER_ENABLED", "ture")])).unwrap_err();
        assert!(err.0.contains("SANDBOX_DOCKER_ENABLED=\"ture\""), "{err}");
        for unset in ["", "   "] {
            let c = ServiceConfig::load(None, &env(&[("SANDBOX_DOCKER_ENABLED", unset)])).unwrap();
            assert!(!c.docker.enabled, "{unset:?} must not enable Docker");
        }
        let c = ServiceConfig::load(
            None,
            &env(&[
                ("SANDBOX_DOCKER_BUILD_IMAGE", "off"),
                ("SANDBOX_DOCKER_NETWORK", "none"),
            ]),
        )
        .unwrap();
        assert!(!c.docker.build_missing_image);
        assert_eq!(c.docker.network, sandbox_provider_docker::NetworkMode::None);
    }

    #[test]
    fn env_values_are_typed_and_errors_name_the_variable() {
        let err =
            ServiceConfig::load(None, &env(&[("SANDBOX_UPLOAD_MAX_BYTES", "-1")])).unwrap_err();
        assert!(err.0.contains("SANDBOX_UPLOAD_MAX_BYTES"), "{err}");
        let err = ServiceConfig::load(None, &env(&[("SANDBOX_DOCKER_PULL_POLICY", "sometimes")]))
            .unwrap_err();
        assert!(err.0.contains("SANDBOX_DOCKER_PULL_POLICY"), "{err}");
        let c = ServiceConfig::load(
            None,
            &env(&[
                ("SANDBOX_STORE", "redis"),
                (
                    "SANDBOX_REDIS_CLUSTER_NODES",
                    "10.0.0.5:7000, ,10.0.0.6:7000",
                ),
                ("SANDBOX_REDIS_PASSWORD", "hunter2"),
                ("SANDBOX_DOCKER_IDLE_TTL_SECONDS", "90"),
                ("SANDBOX_DOCKER_SWEEP_INTERVAL_SECONDS", "7"),
            ]),
        )
        .unwrap();
        let redis = c.redis.as_ref().unwrap();
        assert_eq!(
            redis.topology,
            sandbox_store_redis::Topology::Cluster {
                nodes: vec!["10.0.0.5:7000".to_owned(), "10.0.0.6:7000".to_owned()]
            }
        );
        assert_eq!(
            redis.password.as_ref().map(sandbox_core::Secret::expose),
            Some("hunter2")
        );
        assert_eq!(c.docker.idle_ttl, std::time::Duration::from_secs(90));
        assert_eq!(c.docker.sweep_interval, std::time::Duration::from_secs(7));
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("hunter2"),
            "a config dump must not hold the password: {debug}"
        );
        let err = ServiceConfig::load(None, &env(&[("SANDBOX_STORE", "redis")])).unwrap_err();
        assert!(err.0.contains("SANDBOX_REDIS_URL"), "{err}");
    }

    /// The fields a section's deserializer expects, read from its refusal of an unknown key.
    fn expected_keys(section: Option<&str>) -> Vec<String> {
        let mut probe = toml::Table::new();
        probe.insert("zz_probe".to_owned(), toml::Value::Integer(1));
        let table = match section {
            Some(name) => {
                // The Redis section checks its topology only after its keys.
                probe.insert(
                    "url".to_owned(),
                    toml::Value::String("redis://a:1".to_owned()),
                );
                toml::Table::from_iter([(name.to_owned(), toml::Value::Table(probe))])
            }
            None => probe,
        };
        let Err(err) = deserialize(table) else {
            panic!("{section:?} accepted an unknown key");
        };
        let Some((_, list)) = err.split_once("expected one of ") else {
            panic!("{err}");
        };
        list.split(", ")
            .filter_map(|k| k.split('`').nth(1))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_file_key_has_exactly_one_variable() {
        let mut names = std::collections::BTreeSet::new();
        let mut keys = std::collections::BTreeSet::new();
        for row in ENV_VARS {
            assert!(row.name.starts_with("SANDBOX_"), "{}", row.name);
            assert!(names.insert(row.name), "{} appears twice", row.name);
            assert!(keys.insert(row.key), "{} has two variables", row.key);
            assert!(
                !row.description.contains('|'),
                "{}: breaks the README table",
                row.name
            );
        }
        let mut sections = vec!["redis", "docker", "limits", "server", "quotas", "e2b"];
        if cfg!(feature = "e2b") {
            sections.push("e2b_provider");
        }
        for key in expected_keys(None) {
            if sections.contains(&key.as_str()) || key == "tenants" {
                continue;
            }
            assert!(
                keys.contains(key.as_str()),
                "file key {key} has no SANDBOX_* variable"
            );
        }
        for section in sections {
            for key in expected_keys(Some(section)) {
                let path = format!("{section}.{key}");
                if path == "e2b.templates" {
                    // A map of names: its one variable sets `base`, the SDKs' default.
                    assert!(keys.contains("e2b.templates.base"));
                    continue;
                }
                assert!(
                    keys.contains(path.as_str()),
                    "file key {path} has no SANDBOX_* variable"
                );
            }
        }
        // And the other way: every row names a key the file accepts.
        for row in ENV_VARS {
            let sample = match row.kind {
                EnvKind::Flag => "true",
                EnvKind::Count | EnvKind::Bytes | EnvKind::Seconds | EnvKind::Millis => "1",
                EnvKind::Text | EnvKind::List => "x",
            };
            let mut table = toml::Table::new();
            if let Err(e) = overlay(&mut table, &env(&[(row.name, sample)])) {
                panic!("{}: {e}", row.name);
            }
            if let Err(e) = deserialize(table) {
                assert!(
                    !e.contains("unknown field"),
                    "{} -> {}: {e}",
                    row.name,
                    row.key
                );
            }
        }
    }

    #[test]
    fn the_stated_defaults_are_the_real_ones() {
        // Setting a key to its default changes nothing. The Redis section exists only with a
        // topology, so both sides name one.
        let base = [("SANDBOX_REDIS_URL", "redis://127.0.0.1:1")];
        let baseline = format!("{:?}", ServiceConfig::load(None, &env(&base)).unwrap());
        let mut checked = 0;
        for row in ENV_VARS.iter().filter(|r| !r.default.is_empty()) {
            let with = ServiceConfig::load(None, &env(&[base[0], (row.name, row.default)]))
                .unwrap_or_else(|e| panic!("{}={}: {e}", row.name, row.default));
            assert_eq!(
                format!("{with:?}"),
                baseline,
                "{} is documented as defaulting to {:?}",
                row.name,
                row.default
            );
            checked += 1;
        }
        assert!(checked > 30, "{checked}");
    }

    const README_BEGIN: &str =
        "<!-- env-table: generated from ENV_VARS in crates/sandbox-app/src/config.rs -->\n";
    const README_END: &str = "<!-- env-table end -->";

    /// `UPDATE_README=1 cargo test -p sandbox-app --lib the_readme_lists_the_env_table`
    /// rewrites the block.
    #[test]
    fn the_readme_lists_the_env_table() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let begin = readme
            .find(README_BEGIN)
            .expect("the README has the env-table block")
            + README_BEGIN.len();
        let end = readme[begin..]
            .find(README_END)
            .expect("the block is closed")
            + begin;
        let expected = env_table_markdown();
        if readme[begin..end] == expected {
            return;
        }
        if std::env::var_os("UPDATE_README").is_some() {
            let updated = format!("{}{expected}{}", &readme[..begin], &readme[end..]);
            std::fs::write(&path, updated).unwrap();
            return;
        }
        panic!(
            "README.md's environment table differs from ENV_VARS; rerun with UPDATE_README=1, or paste:\n{expected}"
        );
    }
}

#[cfg(all(test, feature = "e2b"))]
mod e2b_backend_tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// `provider = "e2b"` needs its section complete, and the refusal names every missing key
    /// by its file key, so one start shows the whole fix.
    #[test]
    fn the_e2b_backend_names_every_missing_key() {
        let err = ServiceConfig::load(None, &env(&[("SANDBOX_PROVIDER", "e2b")])).unwrap_err();
        assert!(err.0.contains("e2b_provider.api_key"), "{err}");
        assert!(err.0.contains("e2b_provider.template"), "{err}");
        // The Docker default needs neither.
        let docker = ServiceConfig::load(None, &BTreeMap::new()).unwrap();
        assert_eq!(docker.provider, Backend::Docker);
    }

    /// Every `SANDBOX_E2B_PROVIDER_*` variable lands in the adapter's config; the key is a
    /// `Secret` that never shows in the config's debug form.
    #[test]
    fn the_e2b_section_comes_from_the_environment() {
        let config = ServiceConfig::load(
            None,
            &env(&[
                ("SANDBOX_PROVIDER", "e2b"),
                ("SANDBOX_E2B_PROVIDER_API_URL", "http://127.0.0.1:3000"),
                ("SANDBOX_E2B_PROVIDER_API_KEY", "e2b_secret_value_1234"),
                ("SANDBOX_E2B_PROVIDER_TEMPLATE", "base"),
                ("SANDBOX_E2B_PROVIDER_SANDBOX_DOMAIN", "localhost"),
                ("SANDBOX_E2B_PROVIDER_PROXY_URL", "http://127.0.0.1:3000"),
                ("SANDBOX_E2B_PROVIDER_ALLOW_PRIVATE_ENDPOINTS", "true"),
                ("SANDBOX_E2B_PROVIDER_TTL_SECONDS", "900"),
                ("SANDBOX_E2B_PROVIDER_CREATE_TIMEOUT_SECONDS", "5"),
            ]),
        )
        .unwrap();
        let e = &config.e2b_provider;
        assert_eq!(config.provider, Backend::E2b);
        assert_eq!(e.api_url, "http://127.0.0.1:3000");
        assert_eq!(e.api_key.expose(), "e2b_secret_value_1234");
        assert_eq!(e.template, "base");
        assert_eq!(e.sandbox_domain, "localhost");
        assert_eq!(e.proxy_url, "http://127.0.0.1:3000");
        assert!(e.allow_private_endpoints);
        assert_eq!(e.ttl_seconds, 900);
        assert_eq!(e.create_timeout_seconds, 5);
        assert!(!format!("{config:?}").contains("e2b_secret_value_1234"));
    }

    /// A backend name that is neither is refused at load, not taken for Docker.
    #[test]
    fn an_unknown_backend_is_refused() {
        let err =
            ServiceConfig::load(None, &env(&[("SANDBOX_PROVIDER", "firecracker")])).unwrap_err();
        assert!(err.0.contains("firecracker"), "{err}");
    }
}

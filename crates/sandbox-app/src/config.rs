//! Service configuration: a TOML file, then environment overrides, then validation.
//!
//! The `[docker]` section is the Docker adapter's own operator config
//! ([`sandbox_provider_docker::DockerConfig`]), embedded rather than copied.
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
    /// `memory` (one process) or `redis` (shared by every replica; see [`RedisSection`]).
    pub store: String,
    pub redis: RedisSection,
    /// The Docker backend's operator settings.
    #[cfg(feature = "docker")]
    pub docker: sandbox_provider_docker::DockerConfig,
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
}

/// The Redis binding store (`store = "redis"`).
#[derive(Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSection {
    /// A standalone server: `redis://[user:password@]host:port[/db]`.
    pub url: Option<String>,
    /// Redis Cluster seed nodes (`host:port`); cluster mode when non-empty.
    pub cluster_nodes: Vec<String>,
    /// Scopes every key, so deployments can share one Redis (default `default`).
    pub namespace: Option<String>,
    /// ACL user. The password is best given as `SANDBOX_REDIS_PASSWORD`, not in a file.
    pub username: Option<String>,
    pub password: Option<String>,
    /// The lifecycle lock's lease in milliseconds (default 60000; renewed at a third of it).
    pub lock_lease_ms: Option<u64>,
    /// Every Redis command's deadline in milliseconds (default 5000).
    pub command_timeout_ms: Option<u64>,
    /// TLS: the CA (PEM) that signed the server's certificate; setting it turns TLS on (so does
    /// a `rediss://` URL, which otherwise trusts the system's roots).
    pub tls_ca_file: Option<PathBuf>,
    /// TLS client certificate chain and key (PEM), for servers with `tls-auth-clients yes`.
    pub tls_client_cert_file: Option<PathBuf>,
    pub tls_client_key_file: Option<PathBuf>,
}

impl std::fmt::Debug for RedisSection {
    // The URL and the password may carry credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSection")
            .field("url", &self.url.as_ref().map(|_| "[set]"))
            .field("cluster_nodes", &self.cluster_nodes)
            .field("namespace", &self.namespace)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("lock_lease_ms", &self.lock_lease_ms)
            .field("command_timeout_ms", &self.command_timeout_ms)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client_cert_file", &self.tls_client_cert_file)
            .field("tls_client_key_file", &self.tls_client_key_file)
            .finish()
    }
}

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
    /// An interactive terminal idle this long is disconnected.
    pub terminal_idle_seconds: u64,
    /// Terminal tickets one tenant may hold unused at once.
    pub tickets_per_tenant: usize,
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
}

/// A tenant's overrides of [`Quotas`]; an absent field keeps the service-wide value.
#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct QuotaOverrides {
    pub max_sandboxes: Option<u32>,
    pub max_concurrent_execs: Option<u32>,
    pub max_terminals: Option<u32>,
    pub max_snapshots: Option<u32>,
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
            redis: RedisSection::default(),
            #[cfg(feature = "docker")]
            docker: sandbox_provider_docker::DockerConfig::default(),
            limits: Limits::default(),
            server: ServerSection::default(),
            quotas: Quotas::default(),
            tenants: Vec::new(),
            dev_token_file: None,
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
    /// Reads `path` (when given) and applies environment overrides from `env`.
    pub fn load(path: Option<&Path>, env: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read config {}: {e}", path.display()))
                })?;
                toml::from_str(&text)
                    .map_err(|e| ConfigError(format!("config {}: {e}", path.display())))?
            }
            None => ServiceConfig::default(),
        };
        config.apply_env(env)?;
        config.validate()?;
        Ok(config)
    }

    /// `SANDBOX_LISTEN`, `SANDBOX_STORE`, `SANDBOX_REDIS_URL`, `SANDBOX_REDIS_CLUSTER_NODES`,
    /// `SANDBOX_REDIS_NAMESPACE`, `SANDBOX_REDIS_USERNAME`, `SANDBOX_REDIS_PASSWORD`,
    /// `SANDBOX_REDIS_LOCK_LEASE_MS`, `SANDBOX_REDIS_COMMAND_TIMEOUT_MS`,
    /// `SANDBOX_REDIS_TLS_CA_FILE`, `SANDBOX_REDIS_TLS_CLIENT_CERT_FILE`,
    /// `SANDBOX_REDIS_TLS_CLIENT_KEY_FILE`, `SANDBOX_DOCKER_ENABLED`, `SANDBOX_DOCKER_HOST`,
    /// `SANDBOX_DOCKER_IMAGE`,
    /// `SANDBOX_DOCKER_NAMESPACE`, `SANDBOX_DOCKER_NETWORK`, `SANDBOX_DOCKER_PULL_POLICY`,
    /// `SANDBOX_DOCKER_BUILD_IMAGE`, `SANDBOX_DOCKER_BUSYBOX`, `SANDBOX_DOCKER_LOG_MAX_BYTES`,
    /// `SANDBOX_DOCKER_STORAGE_LIMIT_BYTES`, `SANDBOX_DOCKER_RUNTIME`,
    /// `SANDBOX_UPLOAD_MAX_BYTES`, `SANDBOX_DOWNLOAD_MAX_BYTES`, `SANDBOX_INFLIGHT_MAX_BYTES`,
    /// `SANDBOX_DEV_TOKEN_FILE`, `SANDBOX_SERVER_HEADER_READ_TIMEOUT_SECONDS`,
    /// `SANDBOX_SERVER_BODY_IDLE_TIMEOUT_SECONDS`, `SANDBOX_SERVER_BODY_READ_TIMEOUT_SECONDS`,
    /// `SANDBOX_SERVER_MAX_CONNECTIONS`, `SANDBOX_SERVER_MAX_REQUESTS_PER_CONNECTION`,
    /// `SANDBOX_SERVER_SHUTDOWN_GRACE_SECONDS`, `SANDBOX_QUOTA_MAX_SANDBOXES`,
    /// `SANDBOX_QUOTA_MAX_CONCURRENT_EXECS`, `SANDBOX_QUOTA_MAX_TERMINALS`,
    /// `SANDBOX_QUOTA_MAX_SNAPSHOTS`, `SANDBOX_TICKETS_PER_TENANT`.
    pub fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        let get = |k: &str| {
            env.get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if let Some(v) = get("SANDBOX_LISTEN") {
            self.listen = v
                .parse()
                .map_err(|_| ConfigError(format!("SANDBOX_LISTEN={v:?} is not an address:port")))?;
        }
        if let Some(v) = get("SANDBOX_STORE") {
            self.store = v;
        }
        if let Some(v) = get("SANDBOX_REDIS_URL") {
            self.redis.url = Some(v);
        }
        if let Some(v) = get("SANDBOX_REDIS_CLUSTER_NODES") {
            self.redis.cluster_nodes = v
                .split(',')
                .map(|n| n.trim().to_owned())
                .filter(|n| !n.is_empty())
                .collect();
        }
        if let Some(v) = get("SANDBOX_REDIS_NAMESPACE") {
            self.redis.namespace = Some(v);
        }
        if let Some(v) = get("SANDBOX_REDIS_USERNAME") {
            self.redis.username = Some(v);
        }
        if let Some(v) = get("SANDBOX_REDIS_PASSWORD") {
            self.redis.password = Some(v);
        }
        for (name, field) in [
            ("SANDBOX_REDIS_TLS_CA_FILE", &mut self.redis.tls_ca_file),
            (
                "SANDBOX_REDIS_TLS_CLIENT_CERT_FILE",
                &mut self.redis.tls_client_cert_file,
            ),
            (
                "SANDBOX_REDIS_TLS_CLIENT_KEY_FILE",
                &mut self.redis.tls_client_key_file,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = Some(PathBuf::from(v));
            }
        }
        for (name, field) in [
            ("SANDBOX_REDIS_LOCK_LEASE_MS", &mut self.redis.lock_lease_ms),
            (
                "SANDBOX_REDIS_COMMAND_TIMEOUT_MS",
                &mut self.redis.command_timeout_ms,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = Some(v.parse().map_err(|_| {
                    ConfigError(format!("{name}={v:?} is not a number of milliseconds"))
                })?);
            }
        }
        #[cfg(feature = "docker")]
        self.apply_docker_env(&get)?;
        if let Some(v) = get("SANDBOX_UPLOAD_MAX_BYTES") {
            self.limits.upload_max_bytes = v.parse().map_err(|_| {
                ConfigError(format!(
                    "SANDBOX_UPLOAD_MAX_BYTES={v:?} is not a byte count"
                ))
            })?;
        }
        if let Some(v) = get("SANDBOX_DEV_TOKEN_FILE") {
            self.dev_token_file = Some(PathBuf::from(v));
        }
        for (name, field) in [
            (
                "SANDBOX_DOWNLOAD_MAX_BYTES",
                &mut self.limits.download_max_bytes,
            ),
            (
                "SANDBOX_INFLIGHT_MAX_BYTES",
                &mut self.limits.inflight_max_bytes,
            ),
            (
                "SANDBOX_SERVER_HEADER_READ_TIMEOUT_SECONDS",
                &mut self.server.header_read_timeout_seconds,
            ),
            (
                "SANDBOX_SERVER_BODY_IDLE_TIMEOUT_SECONDS",
                &mut self.server.body_idle_timeout_seconds,
            ),
            (
                "SANDBOX_SERVER_BODY_READ_TIMEOUT_SECONDS",
                &mut self.server.body_read_timeout_seconds,
            ),
            (
                "SANDBOX_SERVER_MAX_REQUESTS_PER_CONNECTION",
                &mut self.server.max_requests_per_connection,
            ),
            (
                "SANDBOX_SERVER_SHUTDOWN_GRACE_SECONDS",
                &mut self.server.shutdown_grace_seconds,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = number(name, &v)?;
            }
        }
        for (name, field) in [
            (
                "SANDBOX_SERVER_MAX_CONNECTIONS",
                &mut self.server.max_connections,
            ),
            (
                "SANDBOX_TICKETS_PER_TENANT",
                &mut self.limits.tickets_per_tenant,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = number(name, &v)?;
            }
        }
        for (name, field) in [
            (
                "SANDBOX_QUOTA_MAX_SANDBOXES",
                &mut self.quotas.max_sandboxes,
            ),
            (
                "SANDBOX_QUOTA_MAX_CONCURRENT_EXECS",
                &mut self.quotas.max_concurrent_execs,
            ),
            (
                "SANDBOX_QUOTA_MAX_TERMINALS",
                &mut self.quotas.max_terminals,
            ),
            (
                "SANDBOX_QUOTA_MAX_SNAPSHOTS",
                &mut self.quotas.max_snapshots,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = number(name, &v)?;
            }
        }
        Ok(())
    }

    /// The `SANDBOX_DOCKER_*` variables.
    #[cfg(feature = "docker")]
    fn apply_docker_env(
        &mut self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        use sandbox_provider_docker::{NetworkMode, PullPolicy, config::ENABLED_ENV};
        let d = &mut self.docker;
        let bad =
            |name: &str, e: sandbox_core::Error| ConfigError(format!("{name}: {}", e.message()));
        if let Some(v) = get(ENABLED_ENV) {
            d.enabled = parse_flag(ENABLED_ENV, &v)?;
        }
        if let Some(v) = get("SANDBOX_DOCKER_BUILD_IMAGE") {
            d.build_missing_image = parse_flag("SANDBOX_DOCKER_BUILD_IMAGE", &v)?;
        }
        if let Some(v) = get("SANDBOX_DOCKER_BUSYBOX") {
            d.busybox_path = PathBuf::from(v);
        }
        if let Some(v) = get("SANDBOX_DOCKER_HOST") {
            d.host = Some(v);
        }
        if let Some(v) = get("SANDBOX_DOCKER_IMAGE") {
            d.image =
                sandbox_core::TemplateId::new(v).map_err(|e| bad("SANDBOX_DOCKER_IMAGE", e))?;
        }
        if let Some(v) = get("SANDBOX_DOCKER_NAMESPACE") {
            d.namespace = v;
        }
        if let Some(v) = get("SANDBOX_DOCKER_NETWORK") {
            d.network = NetworkMode::parse(&v).map_err(|e| bad("SANDBOX_DOCKER_NETWORK", e))?;
        }
        if let Some(v) = get("SANDBOX_DOCKER_PULL_POLICY") {
            d.pull_policy =
                PullPolicy::parse(&v).map_err(|e| bad("SANDBOX_DOCKER_PULL_POLICY", e))?;
        }
        for (name, field) in [
            ("SANDBOX_DOCKER_LOG_MAX_BYTES", &mut d.log_max_bytes),
            (
                "SANDBOX_DOCKER_STORAGE_LIMIT_BYTES",
                &mut d.storage_limit_bytes,
            ),
        ] {
            if let Some(v) = get(name) {
                *field = v
                    .parse()
                    .map_err(|_| ConfigError(format!("{name}={v:?} is not a byte count")))?;
            }
        }
        if let Some(v) = get("SANDBOX_DOCKER_RUNTIME") {
            d.runtime = Some(v);
        }
        Ok(())
    }

    /// Refuses configs that cannot work, with the field to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.store.as_str() {
            "memory" => {}
            "redis" => {
                let r = &self.redis;
                if r.url.is_some() != r.cluster_nodes.is_empty() {
                    return Err(ConfigError(
                        "store \"redis\" needs exactly one of redis.url (SANDBOX_REDIS_URL) and redis.cluster_nodes (SANDBOX_REDIS_CLUSTER_NODES)".to_owned(),
                    ));
                }
                if r.lock_lease_ms.is_some_and(|ms| ms < 30) || r.command_timeout_ms == Some(0) {
                    return Err(ConfigError(
                        "redis.lock_lease_ms must be at least 30 and redis.command_timeout_ms positive".to_owned(),
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
        if l.upload_max_bytes == 0
            || l.json_max_bytes == 0
            || l.download_max_bytes == 0
            || l.tickets_per_tenant == 0
        {
            return Err(ConfigError("limits must be positive".to_owned()));
        }
        if l.inflight_max_bytes < l.upload_max_bytes.max(l.json_max_bytes) {
            return Err(ConfigError(
                "limits.inflight_max_bytes must hold at least one maximal upload and one maximal JSON body".to_owned(),
            ));
        }
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

/// The most connections `server.max_connections` may name.
pub const MAX_CONNECTIONS: usize = 1_000_000;

/// A number from the environment, or an error naming the variable.
fn number<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, ConfigError> {
    v.parse()
        .map_err(|_| ConfigError(format!("{name}={v:?} is not a non-negative whole number")))
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

#[cfg(all(test, feature = "docker"))]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
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
        let err =
            ServiceConfig::load(None, &env(&[("SANDBOX_DOCKER_NETWORK", "host")])).unwrap_err();
        assert!(err.0.contains("SANDBOX_DOCKER_NETWORK"), "{err}");
        let file = std::env::temp_dir().join(format!("sbx-cfg-{:08x}.toml", fastrand::u32(..)));
        std::fs::write(
            &file,
            "[docker]\npull_policy = \"always\"\nidle_ttl_seconds = 90\n",
        )
        .unwrap();
        let c = ServiceConfig::load(Some(&file), &BTreeMap::new()).unwrap();
        assert_eq!(
            c.docker.pull_policy,
            sandbox_provider_docker::PullPolicy::Always
        );
        assert_eq!(c.docker.idle_ttl, std::time::Duration::from_secs(90));
        let _ = std::fs::remove_file(file);
    }
}

//! What the store connects to and the timings it runs with: the store's operator config, which
//! the service's `[redis]` TOML section deserializes into (the keys are those of `RedisFile`).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Builder, Client, Config, ReconnectPolicy, ServerConfig};
use sandbox_core::{Error, ErrorCode, Operation, Secret};
use serde::Deserialize;

use crate::stored;

/// Where Redis is.
#[derive(Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server: `redis://[user:password@]host:port[/db]`.
    Standalone { url: String },
    /// A Redis Cluster, reached through any of these `host:port` seed nodes; the client
    /// discovers the rest.
    Cluster { nodes: Vec<String> },
}

impl Topology {
    /// `standalone` or `cluster`.
    pub fn kind(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "standalone",
            Topology::Cluster { .. } => "cluster",
        }
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster { .. })
    }
}

impl fmt::Debug for Topology {
    // A URL may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::Standalone { .. } => f.write_str("Standalone"),
            Topology::Cluster { nodes } => f.debug_struct("Cluster").field("nodes", nodes).finish(),
        }
    }
}

/// TLS to Redis: the CA that signed the server's certificate and, for servers that require
/// it, a client certificate. (A `rediss://` URL without these trusts the system's roots.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of the CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain and its private key, for `tls-auth-clients yes`.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

/// The store's settings. Timings default to the Go implementation's, so both can share one Redis
/// during a migration without one's lease outliving the other's expectations.
#[derive(Clone, Deserialize)]
#[serde(try_from = "RedisFile")]
pub struct RedisStoreConfig {
    pub topology: Topology,
    /// Scopes every key, so deployments can share one Redis.
    pub namespace: String,
    /// ACL user and password (cluster mode; a standalone URL may carry them instead).
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// TLS (also implied by a `rediss://` URL).
    pub tls: Option<TlsSettings>,
    /// The lifecycle lock's lease; renewed at a third of it while held.
    pub lock_lease: Duration,
    /// A chat-turn lease's lifetime without being re-armed.
    pub turn_lease_ttl: Duration,
    /// The rewind lock's lease; renewed at a third of it while held.
    pub rewind_ttl: Duration,
    /// How long an invalidation waits for one session's lifecycle lock.
    pub invalidate_lock_wait: Duration,
    /// How long marking one session stale may take once its lock is held.
    pub invalidate_mark_budget: Duration,
    /// Every command's deadline: a Redis that does not answer is an error, never a hang.
    pub command_timeout: Duration,
    /// How long the first connection may take.
    pub connect_timeout: Duration,
}

impl fmt::Debug for RedisStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreConfig")
            .field("topology", &self.topology)
            .field("namespace", &self.namespace)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("tls", &self.tls)
            .field("lock_lease", &self.lock_lease)
            .field("turn_lease_ttl", &self.turn_lease_ttl)
            .field("rewind_ttl", &self.rewind_ttl)
            .field("invalidate_lock_wait", &self.invalidate_lock_wait)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

/// 60 s, renewed every 20 s (a third) while held.
pub const DEFAULT_LOCK_LEASE: Duration = Duration::from_secs(60);
/// 30 min, a turn lease's lifetime when nobody re-arms it.
pub const DEFAULT_TURN_LEASE_TTL: Duration = Duration::from_secs(30 * 60);
/// 2 min, renewed while the rewind runs.
pub const DEFAULT_REWIND_TTL: Duration = Duration::from_secs(2 * 60);
/// 2 s: an invalidation reports a busy session as an error instead of waiting on it.
pub const DEFAULT_INVALIDATE_LOCK_WAIT: Duration = Duration::from_secs(2);

impl RedisStoreConfig {
    /// The default timings for `topology` in `namespace`.
    pub fn new(topology: Topology, namespace: impl Into<String>) -> Self {
        RedisStoreConfig {
            topology,
            namespace: namespace.into(),
            username: None,
            password: None,
            tls: None,
            lock_lease: DEFAULT_LOCK_LEASE,
            turn_lease_ttl: DEFAULT_TURN_LEASE_TTL,
            rewind_ttl: DEFAULT_REWIND_TTL,
            invalidate_lock_wait: DEFAULT_INVALIDATE_LOCK_WAIT,
            invalidate_mark_budget: Duration::from_secs(3),
            command_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
        }
    }

    fn invalid(message: String) -> Error {
        stored(Error::invalid_request(Operation::VALIDATE, message))
            .with_code(ErrorCode::ConfigIncomplete)
    }

    /// A fred client for this config (not yet connected).
    pub(crate) fn client(&self) -> Result<Client, Error> {
        if self.lock_lease < Duration::from_millis(30)
            || self.rewind_ttl < Duration::from_millis(30)
        {
            return Err(Self::invalid(
                "redis store: lock_lease and rewind_ttl must be at least 30 ms".to_owned(),
            ));
        }
        let mut config = match &self.topology {
            Topology::Standalone { url } => Config::from_url(url)
                .map_err(|e| Self::invalid(format!("redis url: {}", e.details())))?,
            Topology::Cluster { nodes } => {
                if nodes.is_empty() {
                    return Err(Self::invalid("redis cluster: no seed nodes".to_owned()));
                }
                let mut hosts = Vec::with_capacity(nodes.len());
                for node in nodes {
                    let (host, port) = node
                        .rsplit_once(':')
                        .and_then(|(h, p)| {
                            Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?))
                        })
                        .ok_or_else(|| {
                            Self::invalid(format!("redis cluster node {node:?} is not host:port"))
                        })?;
                    hosts.push((host.to_owned(), port));
                }
                Config {
                    server: ServerConfig::new_clustered(hosts),
                    ..Config::default()
                }
            }
        };
        if self.username.is_some() {
            config.username.clone_from(&self.username);
        }
        if let Some(password) = &self.password {
            // The one place the password leaves its wrapper: the client sends it in AUTH.
            config.password = Some(password.expose().to_owned());
        }
        if let Some(tls) = &self.tls {
            config.tls = Some(tls_connector(tls)?.into());
        }
        // A command waits at most `command_timeout`, also while the client reconnects, so a
        // Redis outage surfaces as errors rather than hung requests.
        config.fail_fast = true;
        let timeout = self.command_timeout;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .with_connection_config(|c| {
                c.connection_timeout = timeout;
                c.internal_command_timeout = timeout;
                c.max_command_attempts = 2;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2))
            .build()
            .map_err(|e| Self::invalid(format!("redis client: {}", e.details())))?;
        Ok(client)
    }
}

/// The `[redis]` section as written: flat keys, times in milliseconds. Only the conversion
/// into [`RedisStoreConfig`] gives them meaning, so the file format and the store's own shape
/// can differ without a second config type anyone else sees.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RedisFile {
    /// A standalone server: `redis://[user:password@]host:port[/db]`.
    url: Option<String>,
    /// Redis Cluster seed nodes (`host:port`); cluster mode when non-empty.
    cluster_nodes: Vec<String>,
    /// Default `default`.
    namespace: Option<String>,
    username: Option<String>,
    password: Option<Secret>,
    lock_lease_ms: Option<u64>,
    command_timeout_ms: Option<u64>,
    /// Setting it (or the client certificate) turns TLS on.
    tls_ca_file: Option<PathBuf>,
    tls_client_cert_file: Option<PathBuf>,
    tls_client_key_file: Option<PathBuf>,
}

impl TryFrom<RedisFile> for RedisStoreConfig {
    type Error = String;

    fn try_from(file: RedisFile) -> Result<Self, String> {
        let url = file.url.filter(|u| !u.trim().is_empty());
        let nodes: Vec<String> = file
            .cluster_nodes
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        let topology = match (url, nodes.is_empty()) {
            (Some(url), true) => Topology::Standalone { url },
            (None, false) => Topology::Cluster { nodes },
            _ => {
                return Err(
                    "needs exactly one of url and cluster_nodes (SANDBOX_REDIS_URL, SANDBOX_REDIS_CLUSTER_NODES)"
                        .to_owned(),
                );
            }
        };
        if file.lock_lease_ms.is_some_and(|ms| ms < 30) || file.command_timeout_ms == Some(0) {
            return Err(
                "lock_lease_ms must be at least 30 and command_timeout_ms positive".to_owned(),
            );
        }
        let mut config = RedisStoreConfig::new(
            topology,
            file.namespace.unwrap_or_else(|| "default".to_owned()),
        );
        config.username = file.username;
        config.password = file.password.filter(|p| !p.is_empty());
        if file.tls_ca_file.is_some() || file.tls_client_cert_file.is_some() {
            config.tls = Some(TlsSettings {
                ca_file: file.tls_ca_file,
                client_cert_file: file.tls_client_cert_file,
                client_key_file: file.tls_client_key_file,
            });
        }
        if let Some(ms) = file.lock_lease_ms {
            config.lock_lease = Duration::from_millis(ms);
        }
        if let Some(ms) = file.command_timeout_ms {
            config.command_timeout = Duration::from_millis(ms);
        }
        Ok(config)
    }
}

/// A rustls client config (aws-lc-rs) trusting `tls.ca_file` (or the system roots) and
/// presenting the client certificate when one is configured.
fn tls_connector(tls: &TlsSettings) -> Result<fred::types::config::TlsConnector, Error> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: &dyn fmt::Display| {
        RedisStoreConfig::invalid(format!("redis tls: {what}: {e}"))
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", &e))?;
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(&format!("cannot read {}", path.display()), &e))?;
            for cert in certs {
                let cert = cert.map_err(|e| bad(&format!("{}", path.display()), &e))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(&format!("{}", path.display()), &e))?;
            }
            if roots.is_empty() {
                return Err(bad(
                    &format!("{}", path.display()),
                    &"holds no CA certificate",
                ));
            }
        }
        None => {
            let found = rustls_native_certs_roots();
            if found.is_empty() {
                return Err(bad("system roots", &"none found; set a CA file"));
            }
            roots.extend(found);
        }
    }
    let builder = builder.with_root_certificates(roots);
    let config = match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| bad(&format!("cannot read {}", cert.display()), &e))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| bad(&format!("cannot read {}", key.display()), &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad("client certificate", &e))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(RedisStoreConfig::invalid(
                "redis tls: a client certificate needs both the certificate and the key file"
                    .to_owned(),
            ));
        }
    };
    Ok(config.into())
}

/// The system's trust roots, as rustls wants them.
fn rustls_native_certs_roots() -> Vec<rustls::pki_types::TrustAnchor<'static>> {
    let mut out = Vec::new();
    let mut store = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = store.add(cert);
    }
    out.extend(store.roots);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: serde_json::Value) -> Result<RedisStoreConfig, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_deserializes_into_the_stores_shape() {
        let c = parse(serde_json::json!({
            "url": "redis://u:pw-in-url@10.0.0.5:6379",
            "password": "hunter2",
            "lock_lease_ms": 2000,
            "tls_ca_file": "/ca.pem",
        }))
        .unwrap();
        assert!(!c.topology.is_cluster());
        assert_eq!(c.namespace, "default");
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("hunter2"));
        assert_eq!(c.lock_lease, Duration::from_secs(2));
        assert_eq!(c.command_timeout, Duration::from_secs(5));
        assert_eq!(
            c.tls.as_ref().and_then(|t| t.ca_file.clone()),
            Some(PathBuf::from("/ca.pem"))
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("pw-in-url"),
            "{debug}"
        );
        let c = parse(serde_json::json!({"cluster_nodes": ["a:1", " ", "b:2"], "namespace": "x"}))
            .unwrap();
        assert_eq!(
            c.topology,
            Topology::Cluster {
                nodes: vec!["a:1".to_owned(), "b:2".to_owned()]
            }
        );
    }

    #[test]
    fn incomplete_or_contradictory_sections_are_refused() {
        for (bad, says) in [
            (
                serde_json::json!({}),
                "exactly one of url and cluster_nodes",
            ),
            (
                serde_json::json!({"url": "redis://a:1", "cluster_nodes": ["b:2"]}),
                "exactly one of url and cluster_nodes",
            ),
            (
                serde_json::json!({"url": "redis://a:1", "lock_lease_ms": 5}),
                "at least 30",
            ),
            (
                serde_json::json!({"url": "redis://a:1", "command_timeout_ms": 0}),
                "positive",
            ),
            (
                serde_json::json!({"url": "redis://a:1", "pasword": "x"}),
                "unknown field",
            ),
        ] {
            let err = parse(bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}

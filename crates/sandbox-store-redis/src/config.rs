//! What the store connects to and the timings it runs with.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Builder, Client, Config, ReconnectPolicy, ServerConfig};
use sandbox_core::{Error, ErrorCode, Operation};

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

/// The store's settings. Timings default to the reference's.
#[derive(Clone)]
pub struct RedisStoreConfig {
    pub topology: Topology,
    /// Scopes every key, so deployments can share one Redis.
    pub namespace: String,
    /// ACL user and password (cluster mode; a standalone URL may carry them instead).
    pub username: Option<String>,
    pub password: Option<String>,
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
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("tls", &self.tls)
            .field("lock_lease", &self.lock_lease)
            .field("turn_lease_ttl", &self.turn_lease_ttl)
            .field("rewind_ttl", &self.rewind_ttl)
            .field("invalidate_lock_wait", &self.invalidate_lock_wait)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

/// Reference: 60 s lease, renewed every 20 s.
pub const DEFAULT_LOCK_LEASE: Duration = Duration::from_secs(60);
/// Reference: 30 min.
pub const DEFAULT_TURN_LEASE_TTL: Duration = Duration::from_secs(30 * 60);
/// Reference: 2 min.
pub const DEFAULT_REWIND_TTL: Duration = Duration::from_secs(2 * 60);
/// Reference: 2 s.
pub const DEFAULT_INVALIDATE_LOCK_WAIT: Duration = Duration::from_secs(2);

impl RedisStoreConfig {
    /// The reference's timings for `topology` in `namespace`.
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
        if self.password.is_some() {
            config.password.clone_from(&self.password);
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

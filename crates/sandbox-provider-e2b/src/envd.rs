//! Each sandbox's envd: where it is, with which token, on which connections.
//!
//! - **Where.** envd of sandbox `<id>` is `https://49983-<id>.<sandbox_domain>`. With a
//!   gateway (`proxy_url`) every connection is dialled at the gateway whatever that host (the
//!   gateway routes by `Host`), in the gateway's scheme; without one the host is resolved and
//!   judged by the guard like any endpoint. The routing headers (`E2b-Sandbox-Id`,
//!   `E2b-Sandbox-Port`) go too, for planes that route by them.
//! - **Who.** The envd access token from create or connect (`X-Access-Token`), and the Unix
//!   user as envd's Basic credentials: root unless a call names another
//!   ([`SandboxEnvd::as_user`]).
//! - **Kept.** A bounded map ([`MAX_KEPT`], least recently used out) keeps each sandbox's
//!   client, so a handle that lost its state (a handle rebuilt from a binding) reuses the
//!   connections instead of opening new ones; delete and pause forget it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use sandbox_core::{Error, Provider, Secret};
use sandbox_transport::client::GatewayConnector;
use sandbox_transport::envd::ENVD_PORT;
use sandbox_transport::gateway::GatewayTarget;
use sandbox_transport::{EnvdClient, EnvdConfig, GatewayPool};

use crate::config::{DEFAULT_USER, E2bConfig};
use crate::errors::provider_error;

/// How many sandboxes' clients are kept.
pub const MAX_KEPT: usize = 1024;

/// The envd client of one sandbox.
pub type Envd = EnvdClient<HttpsConnector<GatewayConnector>>;

/// One sandbox's envd, as a handle carries it. Cheap to clone (the client is shared).
#[derive(Debug, Clone)]
pub struct SandboxEnvd {
    client: Envd,
    version: String,
}

impl SandboxEnvd {
    /// The client, acting as root.
    pub fn client(&self) -> &Envd {
        &self.client
    }

    /// The client acting as `user` (on the same connections).
    pub fn as_user(&self, user: &str) -> Result<Envd, Error> {
        if user == DEFAULT_USER {
            return Ok(self.client.clone());
        }
        self.client.as_user(user)
    }

    /// The envd version the plane reported.
    pub fn version(&self) -> &str {
        &self.version
    }
}

/// The kept clients. See the module docs.
pub(crate) struct Envds {
    domain: String,
    gateway: Option<GatewayTarget>,
    pool: Arc<GatewayPool<Full<Bytes>>>,
    kept: Mutex<HashMap<String, (u64, SandboxEnvd)>>,
    clock: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Envds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envds")
            .field("domain", &self.domain)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl Envds {
    pub(crate) fn new(
        config: &E2bConfig,
        gateway: Option<GatewayTarget>,
        pool: Arc<GatewayPool<Full<Bytes>>>,
    ) -> Self {
        Envds {
            domain: config.sandbox_domain.trim().to_owned(),
            gateway,
            pool,
            kept: Mutex::new(HashMap::new()),
            clock: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// envd's base URL for sandbox `id`.
    pub(crate) fn base(&self, id: &str) -> String {
        let scheme = self.gateway.as_ref().map_or("https", |g| g.scheme.as_str());
        format!("{scheme}://{ENVD_PORT}-{id}.{}", self.domain)
    }

    fn tick(&self) -> u64 {
        self.clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The kept client of `id`, if any.
    pub(crate) fn get(&self, id: &str) -> Option<SandboxEnvd> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let tick = self.tick();
        kept.get_mut(id).map(|(used, envd)| {
            *used = tick;
            envd.clone()
        })
    }

    /// A client of `id` with `token`, kept (replacing any earlier one: a resumed sandbox may
    /// have a new token).
    pub(crate) fn put(
        &self,
        id: &str,
        token: Option<Secret>,
        version: &str,
    ) -> Result<SandboxEnvd, Error> {
        let mut config = EnvdConfig::new(&self.base(id))
            .and_then(|c| c.with_sandbox_id(id))
            .and_then(|c| c.with_user(DEFAULT_USER))
            .map_err(provider_error)?
            .with_provider(Provider::E2b);
        if let Some(token) = token {
            config = config.with_access_token(token);
        }
        let connector = self.pool.envd_connector(self.gateway.as_ref());
        let client = EnvdClient::new(connector, config).map_err(provider_error)?;
        let envd = SandboxEnvd {
            client,
            version: version.chars().take(64).collect(),
        };
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let full = kept.len() >= MAX_KEPT && !kept.contains_key(id);
        let oldest = full
            .then(|| kept.iter().min_by_key(|(_, (used, _))| *used))
            .flatten()
            .map(|(k, _)| k.clone());
        if let Some(oldest) = oldest {
            kept.remove(&oldest);
        }
        kept.insert(id.to_owned(), (self.tick(), envd.clone()));
        Ok(envd)
    }

    /// Forgets `id`'s client.
    pub(crate) fn remove(&self, id: &str) {
        self.kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_transport::{GuardedConnector, OutboundPolicy};

    fn envds(proxy: Option<&str>) -> Envds {
        let tls = sandbox_transport::tls_config(true, &[]).unwrap();
        let pool = Arc::new(GatewayPool::new(
            GuardedConnector::new(OutboundPolicy::deny_private()),
            tls,
        ));
        let mut config = E2bConfig::new("https://api.example.com", Secret::new("k"), "base");
        config.sandbox_domain = "sbx.example.com".into();
        Envds::new(
            &config,
            proxy.map(|p| GatewayTarget::parse(p).unwrap()),
            pool,
        )
    }

    #[test]
    fn envd_lives_at_the_sandbox_host_in_the_gateways_scheme() {
        assert_eq!(envds(None).base("i1"), "https://49983-i1.sbx.example.com");
        assert_eq!(
            envds(Some("http://gw.example.com:3000")).base("i1"),
            "http://49983-i1.sbx.example.com"
        );
    }

    #[test]
    fn kept_clients_are_bounded_and_forgotten() {
        let e = envds(None);
        for n in 0..=MAX_KEPT {
            e.put(&format!("i{n}"), Some(Secret::new("t")), "0.2.0")
                .unwrap();
            if n == MAX_KEPT - 1 {
                // Used again just before the map overflows, so it is not the least recently
                // used then.
                assert!(e.get("i0").is_some());
            }
        }
        let kept = e.kept.lock().unwrap().len();
        assert_eq!(kept, MAX_KEPT);
        assert!(e.get("i0").is_some(), "recently used survives");
        assert!(e.get("i1").is_none(), "least recently used went");
        e.remove("i0");
        assert!(e.get("i0").is_none());
        // A sandbox ID that cannot be a host label is refused, not sent.
        assert!(e.put("a.b", None, "").is_err());
    }
}

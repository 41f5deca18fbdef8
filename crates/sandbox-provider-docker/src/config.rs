//! Configuration of the Docker backend, and the operator opt-in gate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{Clock, Error, ErrorCode, Operation, SystemClock, TemplateId};

/// The environment variable an operator sets to enable the backend when no config file says so
/// (read by the service's environment overlay; named here because the refusal cites it).
pub const ENABLED_ENV: &str = "SANDBOX_DOCKER_ENABLED";

/// Per-sandbox ceilings when a config names none: a session container hosts a whole turn's work
/// (package installs, data processing), not one short script.
pub const DEFAULT_CPU_LIMIT: f64 = 2.0;
pub const DEFAULT_MEMORY_BYTES: i64 = 2 * 1024 * 1024 * 1024;
pub const DEFAULT_PIDS_LIMIT: i64 = 512;
/// How long a container may go without activity before the idle sweep reclaims it. The daemon
/// has no TTL of its own, so this is all that stands between an abandoned session and a
/// container living until the host runs out of memory.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(30 * 60);
/// Bound on one short Engine API call (inspect, create, list). Streams (exec output, pulls,
/// commits) use their own deadlines.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// Exec timeout when a request names none.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a container's log (what PID 1 and its children write to stdout and stderr) may
/// take on the host's disk. Nothing reads it (exec output travels separately), so it only
/// needs to be large enough to hold an entrypoint's last words.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 1024 * 1024;
/// The most a container's writable layer may grow, where the engine's storage can enforce it.
pub const DEFAULT_STORAGE_LIMIT_BYTES: u64 = 10 * 1024 * 1024 * 1024;

/// When images are fetched from a registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PullPolicy {
    /// Never pull: a missing image is an `invalid_request`. What tests use.
    Never,
    /// Pull only when the image is not present.
    #[default]
    Missing,
    /// Pull on every create (snapshot images are never pulled).
    Always,
}

impl PullPolicy {
    /// Parses `never`, `missing` or `always`.
    pub fn parse(raw: &str) -> Result<Self, Error> {
        match raw.trim() {
            "never" => Ok(PullPolicy::Never),
            "missing" | "" => Ok(PullPolicy::Missing),
            "always" => Ok(PullPolicy::Always),
            other => Err(Error::invalid_request(
                Operation::VALIDATE,
                format!("unknown pull policy {other:?}: expected never, missing or always"),
            )),
        }
    }
}

/// The network sandboxes join.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkMode {
    /// The adapter's own bridge network, behind its egress rules (never `docker0`).
    #[default]
    Bridge,
    /// No network at all.
    None,
}

impl NetworkMode {
    /// Parses `bridge` (also the empty string) or `none`. `host`, `container:` and named
    /// networks are refused: they share another namespace or place sandboxes beside services
    /// only an operator can vouch for.
    pub fn parse(raw: &str) -> Result<Self, Error> {
        sandbox_core::config::validate_docker_network_mode(raw)?;
        Ok(if raw.trim() == "none" {
            NetworkMode::None
        } else {
            NetworkMode::Bridge
        })
    }
}

/// Everything the adapter needs.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The operator's opt-in. A Docker socket is host root, so the backend is off unless an
    /// operator enables it (config, or `SANDBOX_DOCKER_ENABLED=true`).
    pub enabled: bool,
    /// Daemon endpoint in `DOCKER_HOST` form; `None` uses `DOCKER_HOST`, then the default socket.
    pub host: Option<String>,
    /// Directory with `ca.pem`, `cert.pem`, `key.pem`; required for `tcp://` endpoints.
    pub tls_cert_path: Option<PathBuf>,
    /// The image sandboxes boot when a request names the default template.
    pub image: TemplateId,
    /// Scopes everything this adapter owns (labels, networks, snapshots): two deployments on one
    /// daemon never touch each other's containers. 1–24 of `[a-z0-9-]`.
    pub namespace: String,
    pub pull_policy: PullPolicy,
    pub network: NetworkMode,
    /// Let bridge-mode sandboxes reach private and loopback ranges (link-local stays blocked).
    pub allow_private_endpoints: bool,
    /// An alternative OCI runtime such as `runsc`.
    pub runtime: Option<String>,
    pub cpu_limit: f64,
    pub memory_bytes: i64,
    pub pids_limit: i64,
    pub idle_ttl: Duration,
    pub rpc_timeout: Duration,
    pub default_exec_timeout: Duration,
    /// The most output of one stream an exec keeps (the rest is dropped; the result says
    /// `truncated`).
    pub max_output_bytes: usize,
    /// Bound on each container's log file on the engine's disk (json-file, one file, rotated
    /// at this size); 0 turns container logging off (driver `none`).
    pub log_max_bytes: u64,
    /// Bound on each container's writable layer (`storage_opt size=`); 0 = none. Only some
    /// storage drivers honour it (overlay2 only on xfs mounted with `pquota`; btrfs, zfs,
    /// devicemapper): elsewhere creates go ahead without it, with one warning in the log, and
    /// [`crate::DockerProvider::isolation_report`] says it is not enforced.
    pub storage_limit_bytes: u64,
    /// Extra labels on every container (tests mark theirs `sandbox.test=1`).
    pub extra_labels: BTreeMap<String, String>,
    /// Run the idle sweeper. Off for connectivity checks: a half-finished config an admin is
    /// still editing must never delete containers a working config owns.
    pub idle_sweep: bool,
    /// How often at most the idle sweep runs against one daemon.
    pub sweep_interval: Duration,
    /// Shared by every provider of a process, so the interval holds per daemon, not per
    /// provider instance.
    pub sweep_throttle: Arc<crate::sweeper::SweepThrottle>,
    /// Time source of the idle sweep (injectable so tests need not wait for real TTLs).
    pub clock: Arc<dyn Clock>,
}

impl DockerConfig {
    /// A config for `image` in `namespace` with every other field at its default (and the
    /// backend *disabled*, as an operator must opt in).
    pub fn new(image: TemplateId, namespace: &str) -> Self {
        DockerConfig {
            enabled: false,
            host: None,
            tls_cert_path: None,
            image,
            namespace: namespace.to_owned(),
            pull_policy: PullPolicy::default(),
            network: NetworkMode::default(),
            allow_private_endpoints: false,
            runtime: None,
            cpu_limit: DEFAULT_CPU_LIMIT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            pids_limit: DEFAULT_PIDS_LIMIT,
            idle_ttl: DEFAULT_IDLE_TTL,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            default_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            max_output_bytes: crate::exec::DEFAULT_MAX_OUTPUT,
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            storage_limit_bytes: DEFAULT_STORAGE_LIMIT_BYTES,
            extra_labels: BTreeMap::new(),
            idle_sweep: true,
            sweep_interval: Duration::from_secs(60),
            sweep_throttle: Arc::new(crate::sweeper::SweepThrottle::default()),
            clock: Arc::new(SystemClock),
        }
    }

    /// Refuses configs that cannot work: backend not enabled, bad namespace, bad limits.
    pub fn validate(&self) -> Result<(), Error> {
        ensure_enabled(self.enabled)?;
        validate_namespace(&self.namespace)?;
        if !self.cpu_limit.is_finite() || self.cpu_limit <= 0.0 || self.cpu_limit > 1024.0 {
            return Err(invalid(format!(
                "cpu limit must be in (0, 1024], got {}",
                self.cpu_limit
            )));
        }
        if self.memory_bytes < 6 * 1024 * 1024 {
            return Err(invalid(format!(
                "memory limit must be at least 6 MiB, got {} bytes",
                self.memory_bytes
            )));
        }
        if self.pids_limit < 1 {
            return Err(invalid(format!(
                "pids limit must be positive, got {}",
                self.pids_limit
            )));
        }
        if self.default_exec_timeout.is_zero() || self.rpc_timeout.is_zero() {
            return Err(invalid("timeouts must be positive".to_owned()));
        }
        for key in self.extra_labels.keys() {
            crate::labels::validate_label_key(key)?;
        }
        Ok(())
    }
}

fn invalid(message: String) -> Error {
    Error::invalid_request(Operation::VALIDATE, message)
}

/// The choke point every path that would talk to a Docker daemon goes through.
pub fn ensure_enabled(enabled: bool) -> Result<(), Error> {
    if enabled {
        return Ok(());
    }
    Err(Error::new(
        sandbox_core::ErrorKind::Unsupported,
        Operation::VALIDATE,
        format!(
            "the Docker backend is disabled: a Docker socket is root on its host, so an operator must \
             enable it (docker.enabled = true in the service config, or {ENABLED_ENV}=true)"
        ),
    )
    .with_code(ErrorCode::BackendDisabled))
}

/// Namespaces name labels, networks, bridge interfaces and snapshot repositories, so they are
/// short and plain.
pub fn validate_namespace(namespace: &str) -> Result<(), Error> {
    let ok = !namespace.is_empty()
        && namespace.len() <= 24
        && namespace
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !namespace.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "invalid docker namespace {:?}: use 1-24 of [a-z0-9-], not starting with '-'",
            namespace.chars().take(40).collect::<String>()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::ErrorKind;

    fn config() -> DockerConfig {
        let mut c = DockerConfig::new(TemplateId::new("img").unwrap(), "test-ns");
        c.enabled = true;
        c
    }

    #[test]
    fn disabled_backend_is_refused_with_its_code_and_setting() {
        let err = DockerConfig::new(TemplateId::new("img").unwrap(), "ns")
            .validate()
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::BackendDisabled));
        assert!(
            err.to_string().contains("SANDBOX_DOCKER_ENABLED=true"),
            "{err}"
        );
        assert!(config().validate().is_ok());
    }

    #[test]
    fn network_modes_and_pull_policies() {
        assert_eq!(NetworkMode::parse("").unwrap(), NetworkMode::Bridge);
        assert_eq!(NetworkMode::parse("none").unwrap(), NetworkMode::None);
        for bad in ["host", "container:x", "my-net", "bridge2"] {
            assert_eq!(
                NetworkMode::parse(bad).unwrap_err().kind(),
                ErrorKind::InvalidRequest,
                "{bad}"
            );
        }
        assert_eq!(PullPolicy::parse("never").unwrap(), PullPolicy::Never);
        assert!(PullPolicy::parse("sometimes").is_err());
    }

    #[test]
    fn limits_and_namespaces() {
        let mut c = config();
        c.cpu_limit = 0.0;
        assert!(c.validate().is_err());
        let mut c = config();
        c.memory_bytes = 1;
        assert!(c.validate().is_err());
        let mut c = config();
        c.pids_limit = 0;
        assert!(c.validate().is_err());
        for bad in ["", "UPPER", "a_b", "-x", &"x".repeat(25)] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
    }
}

//! The Docker backend's operator config, the operator opt-in gate, and how a tenant's stored
//! `docker` section is combined with them ([`DockerConfig::from_tenant`]).
//!
//! [`DockerConfig`] is what the service's `[docker]` TOML section deserializes into: the keys
//! are its serde fields. Fields marked `#[serde(skip)]` are runtime wiring and tuning for
//! embedders and tests (clock, sweep throttle, labels), not operator settings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::config::TenantSandboxConfig;
use sandbox_core::{Clock, Error, ErrorCode, Operation, SandboxType, SystemClock, TemplateId};
use serde::{Deserialize, Deserializer};

/// The environment variable an operator sets to enable the backend when no config file says so
/// (read by the service's environment overlay; named here because the refusal cites it).
pub const ENABLED_ENV: &str = "SANDBOX_DOCKER_ENABLED";

/// The image sandboxes boot by default: the locally built `FROM scratch` + busybox-static
/// image `cargo xtask test` builds (never pulled from a registry).
pub const DEFAULT_IMAGE: &str = "sandbox-busybox:test";

/// Per-sandbox ceilings when a config names none: a session container hosts a whole turn's work
/// (package installs, data processing), not one short script.
pub const DEFAULT_CPU_LIMIT: f64 = 2.0;
pub const DEFAULT_MEMORY_BYTES: i64 = 2 * 1024 * 1024 * 1024;
pub const DEFAULT_PIDS_LIMIT: i64 = 512;
/// The default cap on the processes the agent runs at once in one sandbox: the agent's own
/// default, under the PIDs limit, and above a burst of 100 parallel commands (each one counts).
pub const DEFAULT_PROCESSES_PER_SANDBOX: usize = 256;
/// How long a container may go without activity before the idle sweep reclaims it. The daemon
/// has no TTL of its own, so this is all that stands between an abandoned session and a
/// container living until the host runs out of memory.
pub const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(30 * 60);
/// How often at most the idle sweep runs against one daemon when the config names no interval.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PullPolicy {
    /// Never pull: a missing image is an `invalid_request`. The default, so no image is ever
    /// fetched from a registry unless the operator asks for it.
    #[default]
    Never,
    /// Pull only when the image is not present.
    Missing,
    /// Pull on every create (snapshot images are never pulled).
    Always,
}

impl PullPolicy {
    /// Parses `never`, `missing` (also the empty string) or `always`.
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

impl std::fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PullPolicy::Never => "never",
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
        })
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

impl<'de> Deserialize<'de> for NetworkMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        NetworkMode::parse(&raw).map_err(|_| {
            serde::de::Error::custom(format!(
                "network {:?} is not allowed: use \"bridge\" or \"none\"",
                raw.chars().take(64).collect::<String>()
            ))
        })
    }
}

/// How commands, files and terminals reach a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPlane {
    /// Every command, file operation and terminal is a `docker exec`; the container's PID 1 is
    /// the engine's init running a shell that idles (`sleep infinity`). The declared fallback
    /// for engines or images where the agent cannot run.
    Exec,
    /// `sandbox-agent` is copied into every container at create and runs as its PID 1
    /// (`crate::agent`); commands, files and terminals travel over one kept exec channel to it
    /// (`crate::channel`) instead of an exec each.
    #[default]
    Agent,
}

impl DataPlane {
    /// Parses `exec` or `agent`.
    pub fn parse(raw: &str) -> Result<Self, Error> {
        match raw.trim() {
            "exec" => Ok(DataPlane::Exec),
            "agent" => Ok(DataPlane::Agent),
            other => Err(Error::invalid_request(
                Operation::VALIDATE,
                format!(
                    "unknown docker data plane {:?}: expected exec or agent",
                    other.chars().take(64).collect::<String>()
                ),
            )),
        }
    }
}

impl std::fmt::Display for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataPlane::Exec => "exec",
            DataPlane::Agent => "agent",
        })
    }
}

/// Everything the adapter needs: the operator's settings (the service's `[docker]` section)
/// and the runtime wiring an embedder injects.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
    /// `never` (default), `missing` or `always`.
    pub pull_policy: PullPolicy,
    /// `bridge` (default) or `none`.
    pub network: NetworkMode,
    /// Let bridge-mode sandboxes reach private and loopback ranges (link-local stays blocked).
    pub allow_private_endpoints: bool,
    /// An alternative OCI runtime such as `runsc`; the engine's default when unset.
    #[serde(deserialize_with = "non_blank")]
    pub runtime: Option<String>,
    /// A container idle this long is reclaimed by the idle sweep (file key `idle_ttl_seconds`).
    #[serde(rename = "idle_ttl_seconds", deserialize_with = "seconds")]
    pub idle_ttl: Duration,
    /// Bound on each container's log file on the engine's disk (json-file, one file, rotated
    /// at this size); 0 turns container logging off (driver `none`).
    pub log_max_bytes: u64,
    /// Bound on each container's writable layer (`storage_opt size=`); 0 = none. Only some
    /// storage drivers honour it (overlay2 only on xfs mounted with `pquota`; btrfs, zfs,
    /// devicemapper): elsewhere creates go ahead without it, with one warning in the log, and
    /// [`crate::DockerProvider::isolation_report`] says it is not enforced.
    pub storage_limit_bytes: u64,
    /// Build a missing `sandbox-busybox:<tag>` image when the service starts (from
    /// `busybox_path`), rather than failing every create with `image_not_present`. Other image
    /// names are never built. Read by the composition root, which calls
    /// [`crate::DockerProvider::build_busybox_image`].
    pub build_missing_image: bool,
    /// The statically linked busybox the local image is built from (Debian's busybox-static).
    pub busybox_path: PathBuf,
    /// `agent` (default) or `exec`. Agent mode never falls back to exec silently: a missing or
    /// unusable agent fails the adapter's start with the fix named.
    pub data_plane: DataPlane,
    /// The static `sandbox-agent` binary agent mode copies into every container; unset means
    /// `sandbox-agent` beside the running executable (`cargo xtask agent` builds it).
    #[serde(deserialize_with = "non_blank_path")]
    pub agent_path: Option<PathBuf>,
    /// Agent mode: the most processes the agent runs at once in one sandbox (background
    /// processes, commands and terminals together); a start past it is refused with
    /// `process_limit`. Set when the container is created.
    pub processes_per_sandbox: usize,
    #[serde(skip)]
    pub cpu_limit: f64,
    #[serde(skip)]
    pub memory_bytes: i64,
    #[serde(skip)]
    pub pids_limit: i64,
    #[serde(skip)]
    pub rpc_timeout: Duration,
    #[serde(skip)]
    pub default_exec_timeout: Duration,
    /// The most output of one stream an exec keeps (the rest is dropped; the result says
    /// `truncated`).
    #[serde(skip)]
    pub max_output_bytes: usize,
    /// Extra labels on every container (tests mark theirs `sandbox.test=1`).
    #[serde(skip)]
    pub extra_labels: BTreeMap<String, String>,
    /// Run the idle sweeper. Off for connectivity checks: a half-finished config an admin is
    /// still editing must never delete containers a working config owns.
    #[serde(skip)]
    pub idle_sweep: bool,
    /// How often at most the idle sweep runs against one daemon (file key
    /// `sweep_interval_seconds`). Each create or connect of a sandbox starts one when this long
    /// has passed since the last, so a sandbox is reclaimed within its idle TTL plus about this
    /// long (given some traffic to the service): an operator who shortens the TTL shortens this
    /// too.
    #[serde(rename = "sweep_interval_seconds", deserialize_with = "seconds")]
    pub sweep_interval: Duration,
    /// Shared by every provider of a process, so the interval holds per daemon, not per
    /// provider instance.
    #[serde(skip)]
    pub sweep_throttle: Arc<crate::sweeper::SweepThrottle>,
    /// Time source of the idle sweep (injectable so tests need not wait for real TTLs).
    #[serde(skip)]
    pub clock: Arc<dyn Clock>,
}

impl Default for DockerConfig {
    /// The operator defaults: [`DEFAULT_IMAGE`] in namespace `default`, never pulling, and the
    /// backend *disabled*, as an operator must opt in.
    fn default() -> Self {
        DockerConfig {
            enabled: false,
            host: None,
            tls_cert_path: None,
            image: default_image(),
            namespace: "default".to_owned(),
            pull_policy: PullPolicy::default(),
            network: NetworkMode::default(),
            allow_private_endpoints: false,
            runtime: None,
            idle_ttl: DEFAULT_IDLE_TTL,
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            storage_limit_bytes: DEFAULT_STORAGE_LIMIT_BYTES,
            build_missing_image: true,
            busybox_path: PathBuf::from(crate::image_build::DEFAULT_BUSYBOX),
            data_plane: DataPlane::default(),
            agent_path: None,
            processes_per_sandbox: DEFAULT_PROCESSES_PER_SANDBOX,
            cpu_limit: DEFAULT_CPU_LIMIT,
            memory_bytes: DEFAULT_MEMORY_BYTES,
            pids_limit: DEFAULT_PIDS_LIMIT,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            default_exec_timeout: DEFAULT_EXEC_TIMEOUT,
            max_output_bytes: crate::exec::DEFAULT_MAX_OUTPUT,
            extra_labels: BTreeMap::new(),
            idle_sweep: true,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            sweep_throttle: Arc::new(crate::sweeper::SweepThrottle::default()),
            clock: Arc::new(SystemClock),
        }
    }
}

#[expect(
    clippy::expect_used,
    reason = "a constant the unit test `the_default_image_is_a_valid_template_id` checks"
)]
fn default_image() -> TemplateId {
    TemplateId::new(DEFAULT_IMAGE).expect("DEFAULT_IMAGE is a valid template id")
}

/// A whole number of seconds; 0 is read as one second, as a sweep needs a positive TTL.
fn seconds<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    u64::deserialize(deserializer).map(|s| Duration::from_secs(s.max(1)))
}

/// An optional name where a blank value means unset.
fn non_blank<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let raw = Option::<String>::deserialize(deserializer)?;
    Ok(raw.map(|r| r.trim().to_owned()).filter(|r| !r.is_empty()))
}

/// An optional path where a blank value means unset.
fn non_blank_path<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<PathBuf>, D::Error> {
    Ok(non_blank(deserializer)?.map(PathBuf::from))
}

impl DockerConfig {
    /// A config for `image` in `namespace` with every other field at its default (and the
    /// backend *disabled*, as an operator must opt in).
    pub fn new(image: TemplateId, namespace: &str) -> Self {
        DockerConfig {
            image,
            namespace: namespace.to_owned(),
            ..DockerConfig::default()
        }
    }

    /// The config a tenant's stored Docker section runs with: `operator` (the service's
    /// settings) with what the tenant's record decides.
    ///
    /// The record is self-contained for where its sandboxes live ([`TenantSandboxConfig`]'s
    /// rule): its image, its daemon (`host`, empty = the local default, never the operator's
    /// daemon) and its TLS directory. Its resource limits, runtime and idle TTL apply when set,
    /// else the operator's. The operator keeps the ceilings a tenant must not lift: the
    /// opt-in, the namespace, the pull policy, the disk and log bounds, a network of `none`,
    /// and private endpoints, which need both the operator's and the record's permission.
    pub fn from_tenant(
        tenant: &TenantSandboxConfig,
        operator: &DockerConfig,
    ) -> Result<Self, Error> {
        if tenant.sandbox_type != SandboxType::Docker {
            return Err(invalid(format!(
                "a {} config cannot run on the Docker backend",
                tenant.sandbox_type
            )));
        }
        tenant.validate()?;
        let section = &tenant.docker;
        let mut config = operator.clone();
        config.image = TemplateId::new(section.image.trim())?;
        config.host = Some(section.host.trim())
            .filter(|h| !h.is_empty())
            .map(str::to_owned);
        config.tls_cert_path = Some(section.tls_cert_path.trim())
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        if let Some(cpu) = section.cpu_limit {
            config.cpu_limit = cpu;
        }
        if let Some(mb) = section.memory_mb {
            config.memory_bytes = i64::try_from(mb.saturating_mul(1024 * 1024))
                .map_err(|_| invalid(format!("docker.memory_mb {mb} is too large")))?;
        }
        if let Some(pids) = section.pids_limit {
            config.pids_limit = i64::try_from(pids)
                .map_err(|_| invalid(format!("docker.pids_limit {pids} is too large")))?;
        }
        if let Some(secs) = section.idle_ttl_seconds {
            config.idle_ttl = Duration::from_secs(secs.max(1));
        }
        let runtime = section.runtime.trim();
        if !runtime.is_empty() {
            config.runtime = Some(runtime.to_owned());
        }
        if operator.network == NetworkMode::Bridge {
            config.network = NetworkMode::parse(&section.network_mode)?;
        }
        config.allow_private_endpoints =
            operator.allow_private_endpoints && tenant.allow_private_endpoints;
        config.validate_settings()?;
        Ok(config)
    }

    /// Refuses configs that cannot work: backend not enabled, bad namespace, bad limits.
    pub fn validate(&self) -> Result<(), Error> {
        ensure_enabled(self.enabled)?;
        self.validate_settings()
    }

    /// [`validate`](Self::validate) without the opt-in: what a config file or a tenant record
    /// can get wrong.
    pub fn validate_settings(&self) -> Result<(), Error> {
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
        if self.processes_per_sandbox < 1 {
            return Err(invalid(
                "docker.processes_per_sandbox must be at least 1".to_owned(),
            ));
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
        let mut c = config();
        c.processes_per_sandbox = 0;
        assert!(c.validate().is_err());
        assert_eq!(
            DockerConfig::default().processes_per_sandbox,
            DEFAULT_PROCESSES_PER_SANDBOX
        );
        for bad in ["", "UPPER", "a_b", "-x", &"x".repeat(25)] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_image_is_a_valid_template_id() {
        assert_eq!(DockerConfig::default().image.as_str(), DEFAULT_IMAGE);
        assert!(!DockerConfig::default().enabled, "the backend is an opt-in");
        assert_eq!(DockerConfig::default().pull_policy, PullPolicy::Never);
    }

    #[test]
    fn the_operator_section_deserializes_with_enums_and_defaults() {
        let c: DockerConfig = serde_json::from_value(serde_json::json!({
            "enabled": true,
            "network": "none",
            "pull_policy": "always",
            "idle_ttl_seconds": 0,
            "sweep_interval_seconds": 5,
            "runtime": "  ",
            "tls_cert_path": "/etc/docker/certs",
        }))
        .unwrap();
        assert!(c.enabled);
        assert_eq!(c.network, NetworkMode::None);
        assert_eq!(c.pull_policy, PullPolicy::Always);
        assert_eq!(
            c.idle_ttl,
            Duration::from_secs(1),
            "a sweep needs a positive TTL"
        );
        assert_eq!(c.sweep_interval, Duration::from_secs(5));
        assert_eq!(
            DockerConfig::default().sweep_interval,
            DEFAULT_SWEEP_INTERVAL
        );
        assert_eq!(c.runtime, None, "blank means the engine's default");
        assert_eq!(c.namespace, "default");
        assert_eq!(c.cpu_limit, DEFAULT_CPU_LIMIT);
        for (bad, says) in [
            (serde_json::json!({"network": "host"}), "not allowed"),
            (
                serde_json::json!({"pull_policy": "sometimes"}),
                "unknown variant",
            ),
            (serde_json::json!({"cpu_limit": 4.0}), "unknown field"),
            (serde_json::json!({"image": ""}), "template"),
        ] {
            let err = serde_json::from_value::<DockerConfig>(bad.clone()).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_data_plane_is_agent_by_default_and_parses_both_modes() {
        assert_eq!(DockerConfig::default().data_plane, DataPlane::Agent);
        assert_eq!(DockerConfig::default().agent_path, None);
        assert_eq!(DataPlane::parse("agent").unwrap(), DataPlane::Agent);
        assert_eq!(DataPlane::parse(" exec ").unwrap(), DataPlane::Exec);
        let err = DataPlane::parse("channel").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("exec or agent"), "{err}");
        for mode in [DataPlane::Exec, DataPlane::Agent] {
            assert_eq!(DataPlane::parse(&mode.to_string()).unwrap(), mode);
        }
        let c: DockerConfig = serde_json::from_value(serde_json::json!({
            "data_plane": "agent",
            "agent_path": "/opt/sandbox/sandbox-agent",
        }))
        .unwrap();
        assert_eq!(c.data_plane, DataPlane::Agent);
        assert_eq!(
            c.agent_path.as_deref(),
            Some(std::path::Path::new("/opt/sandbox/sandbox-agent"))
        );
        let c: DockerConfig =
            serde_json::from_value(serde_json::json!({"agent_path": " "})).unwrap();
        assert_eq!(c.agent_path, None, "blank means beside the running binary");
        let err = serde_json::from_value::<DockerConfig>(serde_json::json!({"data_plane": "x"}))
            .unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }

    #[test]
    fn from_tenant_takes_the_records_location_and_keeps_the_operators_ceilings() {
        let mut operator = config();
        operator.host = Some("unix:///operator.sock".to_owned());
        operator.runtime = Some("runsc".to_owned());
        operator.allow_private_endpoints = true;
        operator.storage_limit_bytes = 7;
        let mut tenant = TenantSandboxConfig::new(SandboxType::Docker);
        tenant.docker.image = "tenant-image:1".to_owned();
        tenant.docker.memory_mb = Some(512);
        tenant.docker.network_mode = "none".to_owned();
        let c = DockerConfig::from_tenant(&tenant, &operator).unwrap();
        assert_eq!(c.image.as_str(), "tenant-image:1");
        assert_eq!(
            c.host, None,
            "an empty host is the local default, never the operator's"
        );
        assert_eq!(c.memory_bytes, 512 * 1024 * 1024);
        assert_eq!(c.cpu_limit, DEFAULT_CPU_LIMIT);
        assert_eq!(c.runtime.as_deref(), Some("runsc"));
        assert_eq!(c.network, NetworkMode::None);
        assert!(
            !c.allow_private_endpoints,
            "the record did not ask for private endpoints"
        );
        assert_eq!(c.storage_limit_bytes, 7);
        assert_eq!(c.namespace, operator.namespace);

        // A record cannot lift the operator's `none` network.
        operator.network = NetworkMode::None;
        tenant.docker.network_mode = "bridge".to_owned();
        tenant.allow_private_endpoints = true;
        let c = DockerConfig::from_tenant(&tenant, &operator).unwrap();
        assert_eq!(c.network, NetworkMode::None);
        assert!(c.allow_private_endpoints);

        let mut incomplete = TenantSandboxConfig::new(SandboxType::Docker);
        incomplete.docker.image = " ".to_owned();
        let err = DockerConfig::from_tenant(&incomplete, &operator).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::ConfigIncomplete));
        let err = DockerConfig::from_tenant(&TenantSandboxConfig::new(SandboxType::E2b), &operator)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        tenant.docker.cpu_limit = Some(0.0);
        assert!(DockerConfig::from_tenant(&tenant, &operator).is_err());
    }
}

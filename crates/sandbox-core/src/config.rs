//! Named sandbox configs of a tenant: what each provider requires, and which fields decide
//! whether existing sandboxes stay reachable.
//!
//! A named config is self-contained: provider fields are never inherited from the deployment,
//! so the stored config is the whole picture of where its sandboxes live. Everything a provider
//! client cannot synthesize must be present; its absence is reported by the JSON paths the API
//! uses, so a settings form can show the message as is.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorCode, Operation};
use crate::provider::SandboxType;
use crate::sandbox::NetworkPolicy;
use crate::secret::Secret;

/// Docker backend settings.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerSettings {
    /// The image every sandbox container boots (the Docker counterpart of a template).
    pub image: String,
    /// Daemon endpoint in `DOCKER_HOST` form; empty means the local default.
    pub host: String,
    /// Directory with `ca.pem`, `cert.pem`, `key.pem`; required for a `tcp://` daemon.
    pub tls_cert_path: String,
    pub cpu_limit: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids_limit: Option<u64>,
    /// `bridge` (default) or `none`.
    pub network_mode: String,
    /// An alternative OCI runtime such as `runsc`; empty uses the daemon default.
    pub runtime: String,
    pub idle_ttl_seconds: Option<u64>,
}

/// E2B (or E2B-compatible) settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct E2bSettings {
    pub api_key: Secret,
    /// Control plane; empty uses the SDK default.
    pub api_url: String,
    /// Data-plane routing domain; empty uses the SDK default.
    pub sandbox_domain: String,
    /// Gateway fronting envd for self-hosted control planes; empty resolves sandboxes by DNS.
    pub proxy_url: String,
    pub template_id: String,
    pub ttl_seconds: Option<u64>,
}

/// Tencent CubeSandbox settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CubeSettings {
    pub api_url: String,
    pub proxy_url: String,
    pub sandbox_domain: String,
    /// Optional: the common single-node deployment runs unauthenticated.
    pub api_key: Secret,
    pub template_id: String,
    pub ttl_seconds: Option<u64>,
    /// Nameserver IPs baked into the standard template.
    pub dns_servers: Vec<String>,
}

/// One stored, named sandbox config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSandboxConfig {
    #[serde(rename = "type")]
    pub sandbox_type: SandboxType,
    /// Lets tenant-supplied endpoints resolve to private and loopback addresses. Link-local
    /// (cloud metadata) stays refused regardless.
    #[serde(default)]
    pub allow_private_endpoints: bool,
    /// The config's template is a desktop image.
    #[serde(default)]
    pub desktop_enabled: bool,
    /// 0 means the default.
    #[serde(default)]
    pub terminal_idle_disconnect_seconds: u64,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub network: NetworkPolicy,
    #[serde(default)]
    pub docker: DockerSettings,
    #[serde(default)]
    pub e2b: E2bSettings,
    #[serde(default)]
    pub cube: CubeSettings,
}

impl TenantSandboxConfig {
    /// A config of `sandbox_type` with every other field empty.
    pub fn new(sandbox_type: SandboxType) -> Self {
        TenantSandboxConfig {
            sandbox_type,
            allow_private_endpoints: false,
            desktop_enabled: false,
            terminal_idle_disconnect_seconds: 0,
            env: BTreeMap::new(),
            network: NetworkPolicy::default(),
            docker: DockerSettings::default(),
            e2b: E2bSettings::default(),
            cube: CubeSettings::default(),
        }
    }

    /// The fields this config lacks for its own provider, by JSON path. Only the active
    /// provider's section is read: a section left over from an earlier provider says nothing.
    /// Credentials a self-hosted deployment does not use (Cube's API key) and values the
    /// provider SDK defaults (E2B's URL and domain) are not required.
    pub fn missing_required_fields(&self) -> Vec<&'static str> {
        let blank = |s: &str| s.trim().is_empty();
        let mut missing = Vec::new();
        match self.sandbox_type {
            SandboxType::Cube => {
                if blank(&self.cube.api_url) {
                    missing.push("cube.api_url");
                }
                if blank(&self.cube.proxy_url) {
                    missing.push("cube.proxy_url");
                }
                if blank(&self.cube.sandbox_domain) {
                    missing.push("cube.sandbox_domain");
                }
                if blank(&self.cube.template_id) {
                    missing.push("cube.template_id");
                }
            }
            SandboxType::E2b => {
                if blank(self.e2b.api_key.expose()) {
                    missing.push("e2b.api_key");
                }
                if blank(&self.e2b.template_id) {
                    missing.push("e2b.template_id");
                }
            }
            SandboxType::Docker => {
                if blank(&self.docker.image) {
                    missing.push("docker.image");
                }
            }
            SandboxType::Host | SandboxType::Disabled => {}
        }
        missing
    }

    /// [`missing_required_fields`](Self::missing_required_fields) as an error, shared by the
    /// save and resolve paths so both refuse the same configs with the same words.
    pub fn require_complete(&self) -> Result<(), Error> {
        let missing = self.missing_required_fields();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "{} backend requires {}",
                self.sandbox_type,
                missing.join(", ")
            ),
        )
        .with_code(ErrorCode::ConfigIncomplete))
    }

    /// Everything that can be checked without the network: required fields, the Docker network
    /// mode, resource limits, Cube DNS servers, env names. URL safety is the transport's job (it
    /// needs DNS) and runs in addition.
    pub fn validate(&self) -> Result<(), Error> {
        self.require_complete()?;
        for name in self.env.keys() {
            crate::exec::validate_env_name(name)?;
        }
        if self.sandbox_type == SandboxType::Docker {
            validate_docker_network_mode(&self.docker.network_mode)?;
            if let Some(cpu) = self.docker.cpu_limit
                && (!cpu.is_finite() || cpu <= 0.0 || cpu > 1024.0)
            {
                return Err(invalid_config(format!(
                    "docker.cpu_limit must be in (0, 1024], got {cpu}"
                )));
            }
            if self.docker.memory_mb == Some(0) {
                return Err(invalid_config(
                    "docker.memory_mb must be positive".to_owned(),
                ));
            }
            if self.docker.pids_limit == Some(0) {
                return Err(invalid_config(
                    "docker.pids_limit must be positive".to_owned(),
                ));
            }
        }
        if self.sandbox_type == SandboxType::Cube {
            normalize_dns_servers(&self.cube.dns_servers)?;
        }
        Ok(())
    }

    /// The identity projection: the fields that decide whether sandboxes created under this
    /// config remain reachable. No SSRF check and no error on purpose: it must answer "would
    /// this edit strand anything" even when the old endpoint no longer resolves.
    pub fn identity(&self) -> SandboxIdentity {
        let (api_url, api_key, sandbox_domain, proxy_url) = match self.sandbox_type {
            SandboxType::Cube => (
                self.cube.api_url.trim(),
                self.cube.api_key.clone(),
                self.cube.sandbox_domain.trim(),
                self.cube.proxy_url.trim(),
            ),
            SandboxType::E2b => (
                self.e2b.api_url.trim(),
                self.e2b.api_key.clone(),
                self.e2b.sandbox_domain.trim(),
                self.e2b.proxy_url.trim(),
            ),
            SandboxType::Docker => (self.docker.host.trim(), Secret::default(), "", ""),
            SandboxType::Host | SandboxType::Disabled => ("", Secret::default(), "", ""),
        };
        SandboxIdentity {
            sandbox_type: self.sandbox_type,
            allow_private_endpoints: self.allow_private_endpoints,
            api_url: api_url.to_owned(),
            api_key,
            sandbox_domain: sandbox_domain.to_owned(),
            proxy_url: proxy_url.to_owned(),
        }
    }
}

fn invalid_config(message: String) -> Error {
    Error::invalid_request(Operation::VALIDATE, message)
}

/// Only `bridge` (egress) and `none` (no egress) are allowed: `host` and `container:` modes share
/// another namespace outright, and a named network could place a sandbox beside the service's
/// own database — only an operator can judge that, and this value is set per tenant config.
pub fn validate_docker_network_mode(mode: &str) -> Result<(), Error> {
    match mode.trim() {
        "" | "bridge" | "none" => Ok(()),
        other => Err(invalid_config(format!(
            "docker.network_mode {:?} is not allowed: use \"bridge\" or \"none\"",
            other.chars().take(64).collect::<String>()
        ))),
    }
}

/// Trims, drops empties, refuses non-IP values and de-duplicates (order kept). Cube's template
/// `dns` field takes nameserver IPs only.
pub fn normalize_dns_servers(raw: &[String]) -> Result<Vec<String>, Error> {
    let mut out: Vec<String> = Vec::new();
    for entry in raw {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let ip: std::net::IpAddr = entry.parse().map_err(|_| {
            invalid_config(format!(
                "cube.dns_servers entry {:?} is not an IP address",
                entry.chars().take(64).collect::<String>()
            ))
        })?;
        let canonical = ip.to_string();
        if !out.contains(&canonical) {
            out.push(canonical);
        }
    }
    Ok(out)
}

/// The default idle disconnect of an interactive terminal.
pub const DEFAULT_TERMINAL_IDLE_DISCONNECT: Duration = Duration::from_secs(15 * 60);
/// The shortest idle disconnect honoured.
pub const MIN_TERMINAL_IDLE_DISCONNECT: Duration = Duration::from_secs(60);
/// The longest idle disconnect honoured.
pub const MAX_TERMINAL_IDLE_DISCONNECT: Duration = Duration::from_secs(24 * 3600);

/// Clamps a stored idle-disconnect value; 0 (unset) means the default, so configs stored before
/// the field existed still disconnect idle terminals.
pub fn effective_terminal_idle_disconnect(stored: Duration) -> Duration {
    if stored.is_zero() {
        return DEFAULT_TERMINAL_IDLE_DISCONNECT;
    }
    stored.clamp(MIN_TERMINAL_IDLE_DISCONNECT, MAX_TERMINAL_IDLE_DISCONNECT)
}

/// The comparable projection of a config: two configs with equal identities can operate each
/// other's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxIdentity {
    pub sandbox_type: SandboxType,
    pub allow_private_endpoints: bool,
    /// Control plane: lose it and existing sandboxes cannot be reclaimed at all.
    pub api_url: String,
    pub api_key: Secret,
    /// Data plane: lose it and existing sandboxes are still deletable but no longer usable.
    pub sandbox_domain: String,
    pub proxy_url: String,
}

impl SandboxIdentity {
    /// Whether switching from `self` to `next` leaves existing sandboxes unreclaimable.
    pub fn control_plane_changed(&self, next: &SandboxIdentity) -> bool {
        self.sandbox_type != next.sandbox_type
            || self.allow_private_endpoints != next.allow_private_endpoints
            || self.api_url != next.api_url
            || self.api_key != next.api_key
    }
    /// Whether switching from `self` to `next` leaves existing sandboxes unusable.
    pub fn data_plane_changed(&self, next: &SandboxIdentity) -> bool {
        self.sandbox_type != next.sandbox_type
            || self.sandbox_domain != next.sandbox_domain
            || self.proxy_url != next.proxy_url
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn required_fields_by_json_path() {
        let cube = TenantSandboxConfig::new(SandboxType::Cube);
        assert_eq!(
            cube.missing_required_fields(),
            [
                "cube.api_url",
                "cube.proxy_url",
                "cube.sandbox_domain",
                "cube.template_id"
            ]
        );
        let err = cube.require_complete().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.code(), Some(ErrorCode::ConfigIncomplete));
        assert!(
            err.to_string()
                .contains("cube backend requires cube.api_url, cube.proxy_url"),
            "{err}"
        );

        let mut e2b = TenantSandboxConfig::new(SandboxType::E2b);
        assert_eq!(
            e2b.missing_required_fields(),
            ["e2b.api_key", "e2b.template_id"]
        );
        e2b.e2b.api_key = Secret::new("k");
        e2b.e2b.template_id = "base".into();
        assert!(e2b.require_complete().is_ok());
        // A leftover cube section on an e2b config is ignored.
        e2b.cube.api_url = String::new();
        assert!(e2b.require_complete().is_ok());

        assert_eq!(
            TenantSandboxConfig::new(SandboxType::Docker).missing_required_fields(),
            ["docker.image"]
        );
        assert!(
            TenantSandboxConfig::new(SandboxType::Disabled)
                .require_complete()
                .is_ok()
        );
    }

    #[test]
    fn json_form_refuses_unknown_type_and_fields() {
        let ok: TenantSandboxConfig = serde_json::from_str(
            r#"{"type":"docker","docker":{"image":"img","network_mode":"none"}}"#,
        )
        .unwrap();
        assert!(ok.validate().is_ok());
        let err = serde_json::from_str::<TenantSandboxConfig>(r#"{"type":"k8s"}"#).unwrap_err();
        assert!(
            err.to_string().contains("unsupported sandbox type"),
            "{err}"
        );
        assert!(
            serde_json::from_str::<TenantSandboxConfig>(r#"{"type":"docker","dockr":{}}"#).is_err()
        );
    }

    #[test]
    fn docker_and_cube_validation() {
        for mode in ["", "bridge", "none"] {
            assert!(validate_docker_network_mode(mode).is_ok());
        }
        for mode in ["host", "container:abc", "my-compose-net"] {
            assert!(validate_docker_network_mode(mode).is_err(), "{mode}");
        }
        let mut c = TenantSandboxConfig::new(SandboxType::Docker);
        c.docker.image = "img".into();
        c.docker.cpu_limit = Some(0.0);
        assert!(c.validate().is_err());
        c.docker.cpu_limit = Some(f64::NAN);
        assert!(c.validate().is_err());
        c.docker.cpu_limit = Some(1.5);
        assert!(c.validate().is_ok());
        assert_eq!(
            normalize_dns_servers(&[
                " 8.8.8.8 ".into(),
                String::new(),
                "8.8.8.8".into(),
                "::1".into()
            ])
            .unwrap(),
            ["8.8.8.8", "::1"]
        );
        assert!(normalize_dns_servers(&["dns.google".into()]).is_err());
    }

    #[test]
    fn identity_reads_only_the_active_provider() {
        let mut a = TenantSandboxConfig::new(SandboxType::E2b);
        a.e2b.api_url = "https://api.e2b.dev".into();
        a.e2b.api_key = Secret::new("k1");
        a.cube.api_url = "http://ignored".into();
        let mut b = a.clone();
        b.cube.api_url = "http://also-ignored".into();
        assert_eq!(a.identity(), b.identity());
        b.e2b.api_key = Secret::new("k2");
        assert!(a.identity().control_plane_changed(&b.identity()));
        assert!(!a.identity().data_plane_changed(&b.identity()));
        let mut c = a.clone();
        c.e2b.proxy_url = "http://gw".into();
        assert!(a.identity().data_plane_changed(&c.identity()));
        assert!(!format!("{:?}", a.identity()).contains("k1"));
    }

    #[test]
    fn terminal_idle_disconnect_clamp() {
        assert_eq!(
            effective_terminal_idle_disconnect(Duration::ZERO),
            DEFAULT_TERMINAL_IDLE_DISCONNECT
        );
        assert_eq!(
            effective_terminal_idle_disconnect(Duration::from_secs(5)),
            MIN_TERMINAL_IDLE_DISCONNECT
        );
        assert_eq!(
            effective_terminal_idle_disconnect(Duration::from_secs(10 * 24 * 3600)),
            MAX_TERMINAL_IDLE_DISCONNECT
        );
        assert_eq!(
            effective_terminal_idle_disconnect(Duration::from_secs(600)),
            Duration::from_secs(600)
        );
    }
}

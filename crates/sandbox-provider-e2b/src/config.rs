//! The E2B backend's operator config, and how a tenant's stored `e2b` section is combined with
//! it ([`E2bConfig::from_tenant`]).
//!
//! [`E2bConfig`] is what the service's `[e2b_provider]` TOML section deserializes into (the
//! `[e2b]` section is the service's own E2B-compatible API, a different thing). The same type
//! is the adapter's whole configuration: which control plane, with which key, how sandboxes'
//! envd is reached, which template boots, and the per-route client deadlines.

use std::time::Duration;

use sandbox_core::config::TenantSandboxConfig;
use sandbox_core::{Error, Operation, SandboxType, Secret};
use serde::Deserialize;

/// E2B's own control plane, used when a config names none (the SDKs' default).
pub const DEFAULT_API_URL: &str = "https://api.e2b.app";
/// E2B's own sandbox domain: envd of sandbox `<id>` is `https://49983-<id>.<domain>`.
pub const DEFAULT_SANDBOX_DOMAIN: &str = "e2b.app";
/// A sandbox's lifetime when a create names none (E2B's own default).
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// Every control-plane call without a route deadline of its own.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// Create: the control plane boots the VM before it answers.
pub const DEFAULT_CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connect and resume: a resume restores a memory snapshot before it answers.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(130);
/// Snapshot: the control plane pauses, uploads and resumes before it answers.
pub const DEFAULT_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(250);
/// A build of the standard template, from its request until the plane calls it ready: an
/// image build on the plane takes minutes, not seconds.
pub const DEFAULT_TEMPLATE_BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// The Unix account commands and files act as when a call names none: root, as session
/// sandboxes on every backend run, and envd's own default.
pub const DEFAULT_USER: &str = "root";

/// The adapter's configuration. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct E2bConfig {
    /// The control plane (`https://api.e2b.app`, a self-hosted plane, or this service's own
    /// E2B-compatible API).
    pub api_url: String,
    /// Sent as `X-API-Key` on every control-plane call; never logged or serialized.
    pub api_key: Secret,
    /// The domain of sandbox hosts (`49983-<id>.<domain>`).
    pub sandbox_domain: String,
    /// A gateway every data-plane request is dialled at, whatever its sandbox host (self-hosted
    /// planes route by `Host`); empty resolves sandbox hosts by DNS.
    pub proxy_url: String,
    /// The template a create boots when the request names none... and the one
    /// `ensure_standard_template` keeps built.
    pub template: String,
    /// The build spec of the standard template: the image it is built from (E2B's
    /// `fromImage`). Empty: the adapter holds no build spec, so it only checks that the plane
    /// has the template ready and never builds it.
    pub template_from_image: String,
    /// The bound of one build of the standard template, from its request until it is ready,
    /// in seconds.
    pub template_build_timeout_seconds: u64,
    /// A sandbox's lifetime when a create asks for the server default, in seconds.
    pub ttl_seconds: u64,
    /// Lets the control plane, the gateway and envd resolve to private and loopback addresses
    /// (a self-hosted plane on the operator's network). Link-local and metadata addresses stay
    /// refused regardless.
    pub allow_private_endpoints: bool,
    /// The bound of a control-plane call without a route deadline of its own, in seconds.
    pub http_timeout_seconds: u64,
    /// The bound of a create, in seconds.
    pub create_timeout_seconds: u64,
    /// The bound of a connect or resume, in seconds.
    pub connect_timeout_seconds: u64,
    /// The bound of a snapshot, in seconds.
    pub snapshot_timeout_seconds: u64,
}

impl Default for E2bConfig {
    fn default() -> Self {
        E2bConfig {
            api_url: DEFAULT_API_URL.to_owned(),
            api_key: Secret::default(),
            sandbox_domain: DEFAULT_SANDBOX_DOMAIN.to_owned(),
            proxy_url: String::new(),
            template: String::new(),
            template_from_image: String::new(),
            template_build_timeout_seconds: DEFAULT_TEMPLATE_BUILD_TIMEOUT.as_secs(),
            ttl_seconds: DEFAULT_TTL.as_secs(),
            allow_private_endpoints: false,
            http_timeout_seconds: DEFAULT_HTTP_TIMEOUT.as_secs(),
            create_timeout_seconds: DEFAULT_CREATE_TIMEOUT.as_secs(),
            connect_timeout_seconds: DEFAULT_CONNECT_TIMEOUT.as_secs(),
            snapshot_timeout_seconds: DEFAULT_SNAPSHOT_TIMEOUT.as_secs(),
        }
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid_request(Operation::VALIDATE, message)
}

fn seconds(field: &str, value: u64) -> Result<Duration, Error> {
    if value == 0 {
        return Err(invalid(format!("e2b_provider.{field} must be at least 1")));
    }
    Ok(Duration::from_secs(value))
}

impl E2bConfig {
    /// A config for `api_url` with `api_key`, booting `template`; every other field at its
    /// default.
    pub fn new(api_url: impl Into<String>, api_key: Secret, template: impl Into<String>) -> Self {
        E2bConfig {
            api_url: api_url.into(),
            api_key,
            template: template.into(),
            ..E2bConfig::default()
        }
    }

    /// The fields this config lacks, by their key in the `[e2b_provider]` section.
    pub fn missing_required_fields(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.api_key.expose().trim().is_empty() {
            missing.push("e2b_provider.api_key");
        }
        if self.template.trim().is_empty() {
            missing.push("e2b_provider.template");
        }
        if self.api_url.trim().is_empty() {
            missing.push("e2b_provider.api_url");
        }
        if self.sandbox_domain.trim().is_empty() {
            missing.push("e2b_provider.sandbox_domain");
        }
        missing
    }

    /// Refuses an incomplete config (naming every missing key), a zero deadline, and a
    /// sandbox domain that is not a DNS name.
    pub fn validate(&self) -> Result<(), Error> {
        let missing = self.missing_required_fields();
        if !missing.is_empty() {
            return Err(invalid(format!(
                "the E2B backend needs {}",
                missing.join(", ")
            )));
        }
        for (field, value) in [
            ("ttl_seconds", self.ttl_seconds),
            ("http_timeout_seconds", self.http_timeout_seconds),
            ("create_timeout_seconds", self.create_timeout_seconds),
            ("connect_timeout_seconds", self.connect_timeout_seconds),
            ("snapshot_timeout_seconds", self.snapshot_timeout_seconds),
            (
                "template_build_timeout_seconds",
                self.template_build_timeout_seconds,
            ),
        ] {
            seconds(field, value)?;
        }
        let domain = self.sandbox_domain.trim();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if domain.len() > 200 || !domain.split('.').all(label_ok) {
            return Err(invalid(format!(
                "e2b_provider.sandbox_domain {domain:?} is not a DNS name"
            )));
        }
        Ok(())
    }

    /// The adapter's config for a tenant's stored record: the record decides where its
    /// sandboxes live (control plane, key, domain, gateway), what boots and for how long; the
    /// operator keeps the deadlines and the ceiling on private endpoints (a tenant's record may
    /// ask for them only where the operator allows them). No other code combines the two.
    pub fn from_tenant(tenant: &TenantSandboxConfig, operator: &E2bConfig) -> Result<Self, Error> {
        if tenant.sandbox_type != SandboxType::E2b {
            return Err(invalid(format!(
                "a {} config cannot run on the E2B backend",
                tenant.sandbox_type
            )));
        }
        tenant.require_complete()?;
        let section = &tenant.e2b;
        let mut config = operator.clone();
        let or_default = |value: &str, default: &str| {
            let value = value.trim();
            if value.is_empty() {
                default.to_owned()
            } else {
                value.to_owned()
            }
        };
        config.api_url = or_default(&section.api_url, DEFAULT_API_URL);
        config.sandbox_domain = or_default(&section.sandbox_domain, DEFAULT_SANDBOX_DOMAIN);
        config.proxy_url = section.proxy_url.trim().to_owned();
        config.api_key = section.api_key.clone();
        config.template = section.template_id.trim().to_owned();
        // The operator's build spec describes the operator's standard template; a record that
        // names its own plane and template decides what boots, so its template is checked,
        // never built from an image the operator chose for another template.
        config.template_from_image = String::new();
        if let Some(ttl) = section.ttl_seconds {
            config.ttl_seconds = ttl;
        }
        config.allow_private_endpoints =
            operator.allow_private_endpoints && tenant.allow_private_endpoints;
        config.validate()?;
        Ok(config)
    }

    /// A sandbox's lifetime when a create asks for the server default.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_seconds.max(1))
    }
    /// See [`E2bConfig::http_timeout_seconds`].
    pub fn http_timeout(&self) -> Duration {
        Duration::from_secs(self.http_timeout_seconds.max(1))
    }
    /// See [`E2bConfig::create_timeout_seconds`].
    pub fn create_timeout(&self) -> Duration {
        Duration::from_secs(self.create_timeout_seconds.max(1))
    }
    /// See [`E2bConfig::connect_timeout_seconds`].
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_seconds.max(1))
    }
    /// See [`E2bConfig::snapshot_timeout_seconds`].
    pub fn snapshot_timeout(&self) -> Duration {
        Duration::from_secs(self.snapshot_timeout_seconds.max(1))
    }
    /// See [`E2bConfig::template_build_timeout_seconds`].
    pub fn template_build_timeout(&self) -> Duration {
        Duration::from_secs(self.template_build_timeout_seconds.max(1))
    }
    /// The image the standard template is built from, when the config holds a build spec.
    pub fn template_build_image(&self) -> Option<&str> {
        Some(self.template_from_image.trim()).filter(|image| !image.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_fields_are_named_by_their_keys() {
        let empty = E2bConfig {
            api_url: String::new(),
            sandbox_domain: String::new(),
            ..E2bConfig::default()
        };
        assert_eq!(
            empty.missing_required_fields(),
            [
                "e2b_provider.api_key",
                "e2b_provider.template",
                "e2b_provider.api_url",
                "e2b_provider.sandbox_domain"
            ]
        );
        let err = empty.validate().unwrap_err();
        assert!(err.to_string().contains("e2b_provider.api_key"), "{err}");
        let ok = E2bConfig::new("http://127.0.0.1:1", Secret::new("k"), "base");
        ok.validate().unwrap();
        let zero = E2bConfig {
            create_timeout_seconds: 0,
            ..ok.clone()
        };
        assert!(
            zero.validate()
                .unwrap_err()
                .to_string()
                .contains("create_timeout_seconds")
        );
        let zero_build = E2bConfig {
            template_build_timeout_seconds: 0,
            ..ok.clone()
        };
        let err = zero_build.validate().unwrap_err().to_string();
        assert!(
            err.contains("e2b_provider.template_build_timeout_seconds"),
            "{err}"
        );
        let bad_domain = E2bConfig {
            sandbox_domain: "a/b".into(),
            ..ok
        };
        assert!(bad_domain.validate().is_err());
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let c = E2bConfig::new("http://h", Secret::new("e2b_hunter2"), "base");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn a_tenant_record_decides_where_and_the_operator_keeps_the_ceilings() {
        let mut tenant = TenantSandboxConfig::new(SandboxType::E2b);
        tenant.e2b.api_key = Secret::new("tenant-key");
        tenant.e2b.template_id = " base ".into();
        tenant.e2b.proxy_url = "http://gw:3000".into();
        tenant.e2b.ttl_seconds = Some(600);
        tenant.allow_private_endpoints = true;
        let operator = E2bConfig {
            create_timeout_seconds: 7,
            template_build_timeout_seconds: 9,
            template_from_image: "img:1".into(),
            ..E2bConfig::default()
        };
        let c = E2bConfig::from_tenant(&tenant, &operator).unwrap();
        assert_eq!(c.api_key.expose(), "tenant-key");
        assert_eq!(c.template, "base");
        assert_eq!(c.api_url, DEFAULT_API_URL);
        assert_eq!(c.sandbox_domain, DEFAULT_SANDBOX_DOMAIN);
        assert_eq!(c.proxy_url, "http://gw:3000");
        assert_eq!(c.ttl_seconds, 600);
        assert_eq!(c.create_timeout_seconds, 7);
        assert_eq!(c.template_build_timeout_seconds, 9);
        // The operator's build spec is the operator's template's, not the record's.
        assert_eq!(c.template_build_image(), None);
        // The operator did not allow private endpoints, so the tenant's ask is not enough.
        assert!(!c.allow_private_endpoints);
        let open = E2bConfig {
            allow_private_endpoints: true,
            ..operator.clone()
        };
        assert!(
            E2bConfig::from_tenant(&tenant, &open)
                .unwrap()
                .allow_private_endpoints
        );
        // An incomplete record names its missing JSON keys.
        tenant.e2b.api_key = Secret::default();
        let err = E2bConfig::from_tenant(&tenant, &operator).unwrap_err();
        assert!(err.to_string().contains("e2b.api_key"), "{err}");
        // Another backend's record is refused.
        let docker = TenantSandboxConfig::new(SandboxType::Docker);
        assert!(E2bConfig::from_tenant(&docker, &operator).is_err());
    }
}

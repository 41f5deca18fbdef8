//! The session → sandbox binding: its key, its JSON schema (version 1) and the ownership
//! metadata stamped on every sandbox a binding points at.
//!
//! The JSON field names are those the Go implementation of this design (WeKnora's sandbox
//! package) writes, so a Redis store can be shared with it during a migration: `version`,
//! `provider`, `tenant_id`, `session_id`, `sandbox_id`, `template_id`, `created_at`,
//! `config_id`, `stale_at`, `traffic_access_token`.
//! Unknown fields are ignored (a newer writer may add some); a binding that fails validation is
//! an error, never "unbound", because treating corrupt state as absent would create a second
//! sandbox for the session.
//!
//! This crate has no JSON library (its dependency allow-list is serde only): stores encode a
//! [`Binding`] through its `Serialize`/`Deserialize` impls with the JSON library of their
//! choice, then call [`Binding::validate`] against the key they read it under.

use std::fmt;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::error::{Error, ErrorCode, Operation};
use crate::ids::{ConfigId, SandboxId, SessionId, TemplateId, TenantId};
use crate::provider::Provider;
use crate::secret::Secret;
use crate::timefmt;

/// The schema version this crate reads and writes.
pub const BINDING_SCHEMA_VERSION: u32 = 1;

/// Addresses one session's sandbox state: `(tenant, session)`. Validation of its parts lives in
/// [`TenantId`] and [`SessionId`] (tenant not 0; session not blank, no braces, no control
/// characters).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BindingKey {
    pub tenant: TenantId,
    pub session: SessionId,
}

impl BindingKey {
    /// Builds a key from raw parts, validating both.
    pub fn new(tenant: u64, session: &str) -> Result<Self, Error> {
        Ok(BindingKey {
            tenant: TenantId::new(tenant)?,
            session: SessionId::new(session)?,
        })
    }
}

impl fmt::Display for BindingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.session)
    }
}

/// The sandbox assigned to a session.
#[derive(Clone, PartialEq, Eq)]
pub struct Binding {
    pub provider: Provider,
    pub tenant: TenantId,
    pub session: SessionId,
    pub sandbox_id: SandboxId,
    pub template: TemplateId,
    pub created_at: OffsetDateTime,
    /// The config the sandbox was created from. `None` on bindings written before configs were
    /// recorded; they stay valid and match no config until rebuilt.
    pub config_id: Option<ConfigId>,
    /// Set when the config's image changed; the next resolve rebuilds the sandbox.
    pub stale_at: Option<OffsetDateTime>,
    /// The per-sandbox inbound credential (E2B, Cube). The binding is the only place it survives
    /// a restart; never log a binding's JSON.
    pub traffic_token: Option<Secret>,
}

impl Binding {
    /// A fresh binding for `key`.
    pub fn new(
        key: &BindingKey,
        provider: Provider,
        sandbox_id: SandboxId,
        template: TemplateId,
        created_at: OffsetDateTime,
    ) -> Self {
        Binding {
            provider,
            tenant: key.tenant,
            session: key.session.clone(),
            sandbox_id,
            template,
            created_at,
            config_id: None,
            stale_at: None,
            traffic_token: None,
        }
    }

    /// The key this binding claims to belong to.
    pub fn key(&self) -> BindingKey {
        BindingKey {
            tenant: self.tenant,
            session: self.session.clone(),
        }
    }

    /// Checks the binding against its authoritative key: a store must never hand out (or
    /// accept) a binding whose identity differs from the key it is stored under.
    pub fn validate(&self, key: &BindingKey) -> Result<(), Error> {
        if self.tenant != key.tenant || self.session != key.session {
            return Err(invalid_binding(&format!(
                "binding identity {}/{} differs from its key {key}",
                self.tenant, self.session
            )));
        }
        Ok(())
    }

    /// What every store checks before it writes `self` under `key`: the identity check of
    /// [`Binding::validate`], a set `created_at` (the Unix epoch and year 1 are what an unset
    /// timestamp reads back as in some backends), and timestamps the wire schema can carry.
    /// Living here, every store refuses the same bindings with the same errors (`invalid_request`,
    /// code `invalid_binding`); a store only adds its origin.
    pub fn check_storable(&self, key: &BindingKey) -> Result<(), Error> {
        self.validate(key)?;
        let created = self.created_at;
        if created == OffsetDateTime::UNIX_EPOCH || (created.year() == 1 && created.ordinal() == 1)
        {
            return Err(invalid_binding("created_at must be set"));
        }
        for (field, at) in [("created_at", Some(created)), ("stale_at", self.stale_at)] {
            if let Some(at) = at {
                timefmt::format(at)
                    .map_err(|e| invalid_binding(&format!("{field}: {}", e.message())))?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Binding")
            .field("provider", &self.provider)
            .field("tenant", &self.tenant)
            .field("session", &self.session)
            .field("sandbox_id", &self.sandbox_id)
            .field("template", &self.template)
            .field("created_at", &self.created_at)
            .field("config_id", &self.config_id)
            .field("stale_at", &self.stale_at)
            .field(
                "traffic_token",
                &self.traffic_token.as_ref().map(|_| "[redacted]"),
            )
            .finish()
    }
}

fn invalid_binding(why: &str) -> Error {
    Error::invalid_request(Operation::VALIDATE, format!("invalid binding: {why}"))
        .with_code(ErrorCode::InvalidBinding)
}

/// The wire record, field for field. Kept separate from [`Binding`] so decoding can report
/// *which* rule a stored binding breaks instead of a generic serde message.
#[derive(Debug, Serialize, Deserialize)]
struct BindingRecord {
    version: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    provider: String,
    tenant_id: u64,
    session_id: String,
    sandbox_id: String,
    template_id: String,
    created_at: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    config_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stale_at: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    traffic_access_token: String,
}

impl TryFrom<&Binding> for BindingRecord {
    type Error = Error;
    fn try_from(b: &Binding) -> Result<Self, Error> {
        Ok(BindingRecord {
            version: i64::from(BINDING_SCHEMA_VERSION),
            provider: b.provider.as_str().to_owned(),
            tenant_id: b.tenant.get(),
            session_id: b.session.as_str().to_owned(),
            sandbox_id: b.sandbox_id.as_str().to_owned(),
            template_id: b.template.as_str().to_owned(),
            created_at: timefmt::format(b.created_at)?,
            config_id: b
                .config_id
                .as_ref()
                .map(|c| c.as_str().to_owned())
                .unwrap_or_default(),
            stale_at: b.stale_at.map(timefmt::format).transpose()?,
            traffic_access_token: b
                .traffic_token
                .as_ref()
                .map(|t| t.expose().to_owned())
                .unwrap_or_default(),
        })
    }
}

impl TryFrom<BindingRecord> for Binding {
    type Error = Error;
    fn try_from(r: BindingRecord) -> Result<Self, Error> {
        if r.version != i64::from(BINDING_SCHEMA_VERSION) {
            return Err(invalid_binding(&format!(
                "unsupported schema version {} (expected {BINDING_SCHEMA_VERSION})",
                r.version
            )));
        }
        if r.provider.is_empty() {
            return Err(invalid_binding("missing provider"));
        }
        let field = |name: &str, e: Error| invalid_binding(&format!("{name}: {}", e.message()));
        let provider = Provider::parse(&r.provider).map_err(|e| field("provider", e))?;
        let tenant = TenantId::new(r.tenant_id).map_err(|e| field("tenant_id", e))?;
        let session = SessionId::new(r.session_id).map_err(|e| field("session_id", e))?;
        let sandbox_id = SandboxId::new(r.sandbox_id).map_err(|e| field("sandbox_id", e))?;
        let template = TemplateId::new(r.template_id).map_err(|e| field("template_id", e))?;
        let created_at = timefmt::parse(&r.created_at).map_err(|e| field("created_at", e))?;
        if created_at == OffsetDateTime::UNIX_EPOCH || r.created_at.starts_with("0001-01-01") {
            return Err(invalid_binding("created_at must be set"));
        }
        let config_id = if r.config_id.trim().is_empty() {
            None
        } else {
            Some(ConfigId::new(r.config_id).map_err(|e| field("config_id", e))?)
        };
        let stale_at = r
            .stale_at
            .as_deref()
            .map(timefmt::parse)
            .transpose()
            .map_err(|e| field("stale_at", e))?;
        let traffic_token = Some(r.traffic_access_token)
            .filter(|t| !t.is_empty())
            .map(Secret::new);
        Ok(Binding {
            provider,
            tenant,
            session,
            sandbox_id,
            template,
            created_at,
            config_id,
            stale_at,
            traffic_token,
        })
    }
}

impl Serialize for Binding {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        BindingRecord::try_from(self)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Binding {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let record = BindingRecord::deserialize(deserializer)?;
        Binding::try_from(record).map_err(serde::de::Error::custom)
    }
}

/// The keys of the ownership metadata stamped on every sandbox created for a session, and used
/// as the listing filter when recovering sandboxes after a restart.
pub mod owner_metadata {
    use super::{BINDING_SCHEMA_VERSION, BindingKey};
    use crate::ids::ConfigId;
    use crate::provider::Provider;
    use crate::sandbox::Metadata;

    /// The owning tenant.
    pub const TENANT: &str = "sandbox_tenant_id";
    /// The owning session.
    pub const SESSION: &str = "sandbox_session_id";
    /// The binding schema the creator wrote.
    pub const BINDING_VERSION: &str = "sandbox_binding_version";
    /// The provider the creator used.
    pub const PROVIDER: &str = "sandbox_provider";
    /// The config (normalized; the default config is the sentinel `-`).
    pub const CONFIG: &str = "sandbox_config_id";

    /// Every ownership key.
    pub const ALL: [&str; 5] = [TENANT, SESSION, BINDING_VERSION, PROVIDER, CONFIG];

    /// The full ownership metadata of a session's sandbox.
    pub fn for_session(key: &BindingKey, provider: Provider, config: &ConfigId) -> Metadata {
        let mut m = for_config(key.tenant, config);
        m.insert(SESSION.to_owned(), key.session.as_str().to_owned());
        m.insert(
            BINDING_VERSION.to_owned(),
            BINDING_SCHEMA_VERSION.to_string(),
        );
        m.insert(PROVIDER.to_owned(), provider.as_str().to_owned());
        m
    }

    /// The metadata every sandbox of one config carries (the per-config inventory filter).
    pub fn for_config(tenant: crate::ids::TenantId, config: &ConfigId) -> Metadata {
        let mut m = Metadata::new();
        m.insert(TENANT.to_owned(), tenant.to_string());
        m.insert(CONFIG.to_owned(), config.as_str().to_owned());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn check_storable_refuses_what_no_store_can_hold() {
        assert!(sample().check_storable(&key()).is_ok());
        let mut stale = sample();
        stale.stale_at = Some(timefmt::parse("2026-11-30T00:00:00Z").unwrap());
        assert!(stale.check_storable(&key()).is_ok());

        let other = BindingKey::new(42, "chat-2").unwrap();
        let err = sample().check_storable(&other).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        assert_eq!(
            err.message(),
            "invalid binding: binding identity 42/chat-1 differs from its key 42/chat-2"
        );

        let year_one = OffsetDateTime::new_utc(
            time::Date::from_ordinal_date(1, 1).unwrap(),
            time::Time::MIDNIGHT,
        );
        for unset in [OffsetDateTime::UNIX_EPOCH, year_one] {
            let mut b = sample();
            b.created_at = unset;
            let err = b.check_storable(&key()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
            assert_eq!(err.message(), "invalid binding: created_at must be set");
        }

        // RFC 3339 has four year digits; a year outside them cannot be written down.
        let far = OffsetDateTime::new_utc(
            time::Date::from_calendar_date(-5, time::Month::January, 1).unwrap(),
            time::Time::MIDNIGHT,
        );
        let mut b = sample();
        b.created_at = far;
        let err = b.check_storable(&key()).unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
        assert_eq!(
            err.message(),
            "invalid binding: created_at: timestamp cannot be formatted as RFC 3339"
        );
        let mut b = sample();
        b.stale_at = Some(far);
        let err = b.check_storable(&key()).unwrap_err();
        assert_eq!(
            err.message(),
            "invalid binding: stale_at: timestamp cannot be formatted as RFC 3339"
        );
    }

    fn key() -> BindingKey {
        BindingKey::new(42, "chat-1").unwrap()
    }

    fn sample() -> Binding {
        let mut b = Binding::new(
            &key(),
            Provider::E2b,
            SandboxId::new("sbx-1").unwrap(),
            TemplateId::new("base").unwrap(),
            timefmt::parse("2026-11-29T09:50:21.123456789Z").unwrap(),
        );
        b.config_id = Some(ConfigId::new("cfg-1").unwrap());
        b
    }

    fn decode(json: &str) -> Result<Binding, String> {
        serde_json::from_str::<Binding>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn schema_v1_field_names_and_order() {
        let json = serde_json::to_string(&sample()).unwrap();
        assert_eq!(
            json,
            r#"{"version":1,"provider":"e2b","tenant_id":42,"session_id":"chat-1","sandbox_id":"sbx-1","template_id":"base","created_at":"2026-11-29T09:50:21.123456789Z","config_id":"cfg-1"}"#
        );
        let mut with_token = sample();
        with_token.traffic_token = Some(Secret::new("tok"));
        with_token.stale_at = Some(timefmt::parse("2026-11-30T00:00:00Z").unwrap());
        let json = serde_json::to_string(&with_token).unwrap();
        assert!(
            json.ends_with(r#","stale_at":"2026-11-30T00:00:00Z","traffic_access_token":"tok"}"#),
            "{json}"
        );
        assert_eq!(decode(&json).unwrap(), with_token);
        assert!(!format!("{with_token:?}").contains("tok\""));
    }

    #[test]
    fn accepts_go_written_forms() {
        // As the Go implementation writes it: offsets, nanoseconds, no config, unknown future fields.
        let go = r#"{"version":1,"provider":"cube","tenant_id":7,"session_id":"s","sandbox_id":"a1",
            "template_id":"t","created_at":"2026-08-21T17:04:05.999999999+08:00","owner_id":"",
            "stale_at":null}"#;
        let b = decode(go).unwrap();
        assert_eq!(b.provider, Provider::Cube);
        assert_eq!(b.config_id, None);
        assert_eq!(b.stale_at, None);
        assert_eq!(b.traffic_token, None);
        assert_eq!(
            timefmt::format(b.created_at).unwrap(),
            "2026-08-21T09:04:05.999999999Z"
        );
        let empty_cfg = go.replace(r#""owner_id":"""#, r#""config_id":"""#);
        assert_eq!(decode(&empty_cfg).unwrap().config_id, None);
    }

    #[test]
    fn refuses_invalid_bindings() {
        let good = serde_json::to_string(&sample()).unwrap();
        let cases = [
            (
                good.replace(r#""version":1"#, r#""version":2"#),
                "unsupported schema version",
            ),
            (good.replace(r#""provider":"e2b","#, ""), "missing provider"),
            (
                good.replace(r#""provider":"e2b""#, r#""provider":"host""#),
                "provider",
            ),
            (
                good.replace(r#""tenant_id":42"#, r#""tenant_id":0"#),
                "tenant_id",
            ),
            (
                good.replace(r#""session_id":"chat-1""#, r#""session_id":" ""#),
                "session_id",
            ),
            (
                good.replace(r#""session_id":"chat-1""#, r#""session_id":"a{b}""#),
                "session_id",
            ),
            (
                good.replace(r#""sandbox_id":"sbx-1""#, r#""sandbox_id":"""#),
                "sandbox_id",
            ),
            (
                good.replace(r#""template_id":"base""#, r#""template_id":"""#),
                "template_id",
            ),
            (
                good.replace("2026-11-29T09:50:21.123456789Z", "0001-01-01T00:00:00Z"),
                "created_at",
            ),
            (
                good.replace("2026-11-29T09:50:21.123456789Z", "not a time"),
                "created_at",
            ),
            ("{".to_owned(), "EOF"),
            ("[]".to_owned(), "invalid length"),
        ];
        for (json, needle) in cases {
            let err = decode(&json).unwrap_err();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }

    #[test]
    fn identity_must_match_key() {
        let b = sample();
        assert!(b.validate(&key()).is_ok());
        for other in [
            BindingKey::new(43, "chat-1").unwrap(),
            BindingKey::new(42, "chat-2").unwrap(),
        ] {
            let err = b.validate(&other).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert_eq!(err.code(), Some(ErrorCode::InvalidBinding));
            assert!(err.to_string().contains("differs from its key"));
        }
    }

    #[test]
    fn binding_keys_refuse_braces_control_and_zero() {
        for (tenant, session) in [
            (0, "s"),
            (1, ""),
            (1, " "),
            (1, "{x}"),
            (1, "a}"),
            (1, "a\u{1}b"),
            (1, "a\tb"),
        ] {
            let err = BindingKey::new(tenant, session).unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidRequest,
                "{tenant} {session:?}"
            );
            assert_eq!(
                err.code(),
                Some(ErrorCode::InvalidBindingKey),
                "{tenant} {session:?}"
            );
        }
    }

    #[test]
    fn owner_metadata_carries_config_sentinel() {
        let m = owner_metadata::for_session(&key(), Provider::Docker, &ConfigId::new("").unwrap());
        assert_eq!(m.get(owner_metadata::CONFIG).map(String::as_str), Some("-"));
        assert_eq!(
            m.get(owner_metadata::TENANT).map(String::as_str),
            Some("42")
        );
        assert_eq!(
            m.get(owner_metadata::SESSION).map(String::as_str),
            Some("chat-1")
        );
        assert_eq!(
            m.get(owner_metadata::BINDING_VERSION).map(String::as_str),
            Some("1")
        );
        assert_eq!(
            m.get(owner_metadata::PROVIDER).map(String::as_str),
            Some("docker")
        );
        assert_eq!(m.len(), owner_metadata::ALL.len());
    }
}

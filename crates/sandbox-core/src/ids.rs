//! Validated identifiers.
//!
//! Each ID is a newtype whose constructor refuses values that could not address anything (blank,
//! control characters, absurd lengths), so code that holds one never re-validates, and stores
//! can embed them in keys without escaping surprises.

use std::fmt;
use std::num::NonZeroU64;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, ErrorCode};

/// The longest identifier we accept, in bytes. Far above any real provider's IDs; it exists so
/// a hostile caller cannot make us store or log megabytes.
pub const MAX_ID_LEN: usize = 512;

fn invalid(what: &str, why: &str, code: Option<ErrorCode>) -> Error {
    let err = Error::invalid_input(format!("invalid {what}: {why}"));
    match code {
        Some(code) => err.with_code(code),
        None => err,
    }
}

/// Shared checks: not blank, bounded, no control characters.
fn check_text(what: &str, raw: &str, code: Option<ErrorCode>) -> Result<(), Error> {
    if raw.trim().is_empty() {
        return Err(invalid(what, "must not be blank", code));
    }
    if raw.len() > MAX_ID_LEN {
        return Err(invalid(
            what,
            &format!("longer than {MAX_ID_LEN} bytes"),
            code,
        ));
    }
    if raw.chars().any(char::is_control) {
        return Err(invalid(what, "contains a control character", code));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident, $what:literal, $check:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps `raw`.
            pub fn new(raw: impl Into<String>) -> Result<Self, Error> {
                let raw = raw.into();
                let check: fn(&str) -> Result<(), Error> = $check;
                check(&raw)?;
                Ok($name(raw))
            }
            /// The identifier.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(deserializer)?;
                $name::new(raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// A provider-scoped sandbox identifier (container ID, microVM ID).
    SandboxId,
    "sandbox id",
    |raw| {
        check_text("sandbox id", raw, None)?;
        if raw.chars().any(char::is_whitespace) {
            return Err(invalid("sandbox id", "contains whitespace", None));
        }
        Ok(())
    }
);

string_id!(
    /// A template (image, snapshot tag) a sandbox boots from.
    TemplateId,
    "template",
    |raw| {
        if raw.trim().is_empty() {
            return Err(invalid("template", "empty template", None));
        }
        check_text("template", raw, None)
    }
);

string_id!(
    /// A provider-side snapshot. Snapshot IDs double as template IDs on every provider.
    SnapshotId,
    "snapshot id",
    |raw| check_text("snapshot id", raw, None)
);

string_id!(
    /// A chat session, unique within its tenant.
    ///
    /// Braces are refused because session IDs become part of Redis hash tags (`{...}`), where a
    /// brace would move the key to another cluster slot and break multi-key scripts.
    SessionId,
    "session id",
    |raw| {
        check_text("session id", raw, Some(ErrorCode::InvalidBindingKey))?;
        if raw.contains(['{', '}']) {
            return Err(invalid(
                "session id",
                "must not contain '{' or '}'",
                Some(ErrorCode::InvalidBindingKey),
            ));
        }
        Ok(())
    }
);

/// A tenant (workspace). Zero is refused: it is what an unset numeric field decodes to, and a
/// binding under tenant 0 would be shared by every caller that forgot to set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(NonZeroU64);

impl TenantId {
    /// Validates and wraps `raw`.
    pub fn new(raw: u64) -> Result<Self, Error> {
        NonZeroU64::new(raw).map(TenantId).ok_or_else(|| {
            invalid(
                "tenant id",
                "must not be 0",
                Some(ErrorCode::InvalidBindingKey),
            )
        })
    }
    /// The numeric value.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for TenantId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0.get())
    }
}

impl<'de> Deserialize<'de> for TenantId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        TenantId::new(u64::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// A named sandbox config of a tenant.
///
/// The empty ID (the deployment default) is normalized to [`ConfigId::DEFAULT_SENTINEL`] so
/// "every sandbox of the default config" is addressable in provider metadata like any other
/// config, and legacy bindings without a config never match a real one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigId(String);

impl ConfigId {
    /// What the empty config ID is stored as.
    pub const DEFAULT_SENTINEL: &'static str = "-";

    /// Normalizes and validates `raw`: blank becomes the sentinel.
    pub fn new(raw: impl Into<String>) -> Result<Self, Error> {
        let raw = raw.into();
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Ok(ConfigId::default_config());
        }
        check_text("config id", trimmed, None)?;
        Ok(ConfigId(trimmed.to_owned()))
    }
    /// The deployment default config (the sentinel).
    pub fn default_config() -> Self {
        ConfigId(ConfigId::DEFAULT_SENTINEL.to_owned())
    }
    /// Whether this is the deployment default config.
    pub fn is_default(&self) -> bool {
        self.0 == ConfigId::DEFAULT_SENTINEL
    }
    /// The normalized identifier.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfigId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ConfigId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ConfigId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ConfigId::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn refused<T: fmt::Debug>(result: Result<T, Error>, needle: &str) {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(
            err.to_string().contains(needle),
            "{err} should mention {needle:?}"
        );
    }

    #[test]
    fn session_ids() {
        assert!(SessionId::new("chat-42").is_ok());
        assert!(SessionId::new("会话-1").is_ok());
        refused(SessionId::new(""), "blank");
        refused(SessionId::new("   "), "blank");
        refused(SessionId::new("a{b"), "'{'");
        refused(SessionId::new("a}b"), "'{'");
        refused(SessionId::new("a\nb"), "control");
        refused(SessionId::new("a\u{7f}b"), "control");
        refused(SessionId::new("x".repeat(MAX_ID_LEN + 1)), "longer");
        assert_eq!(
            SessionId::new("").unwrap_err().code(),
            Some(ErrorCode::InvalidBindingKey)
        );
    }

    #[test]
    fn tenant_ids() {
        refused(TenantId::new(0), "must not be 0");
        assert_eq!(TenantId::new(7).unwrap().get(), 7);
        assert!(serde_json::from_str::<TenantId>("0").is_err());
        assert_eq!(
            serde_json::from_str::<TenantId>("18446744073709551615")
                .unwrap()
                .get(),
            u64::MAX
        );
    }

    #[test]
    fn templates_and_sandboxes() {
        refused(TemplateId::new(""), "empty template");
        refused(TemplateId::new(" \t"), "empty template");
        refused(SandboxId::new("a b"), "whitespace");
        assert!(SandboxId::new("abc123").is_ok());
    }

    #[test]
    fn config_ids_normalize_blank_to_sentinel() {
        assert_eq!(ConfigId::new("").unwrap().as_str(), "-");
        assert_eq!(ConfigId::new("  ").unwrap().as_str(), "-");
        assert!(ConfigId::new("").unwrap().is_default());
        assert_eq!(ConfigId::new(" cfg-1 ").unwrap().as_str(), "cfg-1");
        refused(ConfigId::new("a\u{0}"), "control");
    }
}

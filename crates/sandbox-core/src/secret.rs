//! A string that must never reach a log.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A credential (API key, traffic token, password). `Debug` and `Display` print `[redacted]`;
/// the value is reachable only through [`Secret::expose`], so every place that sends it is
/// greppable. Serialization writes the raw value, deliberately: what holds one is a stored
/// record that must round-trip (a binding's traffic token, a tenant config's API key). Operator
/// configs only deserialize secrets (a config file or `SANDBOX_*` variable), so nothing writes
/// them back out; never serialize a structure holding a secret into a log.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The raw value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// Whether the value is empty (an absent credential).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(<empty>)")
        } else {
            f.write_str("Secret([redacted])")
        }
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret::new(value)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_do_not_print() {
        let s = Secret::new("tok-123");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(format!("{s:?}"), "Secret([redacted])");
        assert_eq!(s.expose(), "tok-123");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"tok-123\"");
        let read: Option<Secret> = serde_json::from_str("\"pw\"").unwrap();
        assert_eq!(read.as_ref().map(Secret::expose), Some("pw"));
        assert_eq!(format!("{read:?}"), "Some(Secret([redacted]))");
    }
}

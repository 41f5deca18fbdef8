//! Sandbox types (what a config selects) and providers (the backends that host session
//! sandboxes).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, ErrorCode, Operation};

/// What a stored sandbox config selects.
///
/// Unknown strings are refused ([`SandboxType::parse`]) so a typo surfaces when the admin saves
/// the config, not as a silently disabled sandbox at first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SandboxType {
    /// One long-lived container per session on a Docker engine.
    Docker,
    /// E2B's hosted (or an E2B-compatible) microVM service.
    E2b,
    /// Tencent CubeSandbox microVMs.
    Cube,
    /// Commands run on the operator's own machine under OS-enforced restrictions. It has no
    /// session-scoped instance, so it is not a [`Provider`].
    Host,
    /// Script execution is switched off.
    Disabled,
}

impl SandboxType {
    /// Every sandbox type.
    pub const ALL: [SandboxType; 5] = [
        SandboxType::Docker,
        SandboxType::E2b,
        SandboxType::Cube,
        SandboxType::Host,
        SandboxType::Disabled,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxType::Docker => "docker",
            SandboxType::E2b => "e2b",
            SandboxType::Cube => "cube",
            SandboxType::Host => "host",
            SandboxType::Disabled => "disabled",
        }
    }

    /// Parses a stored spelling. Exact, lower-case match: stored values are written by us, so
    /// anything else is a typo or a value from a newer version, and both must be refused.
    pub fn parse(raw: &str) -> Result<SandboxType, Error> {
        SandboxType::ALL.into_iter().find(|t| t.as_str() == raw).ok_or_else(|| {
            Error::invalid_request(
                Operation::VALIDATE,
                format!(
                    "unsupported sandbox type {:?}: expected one of docker, e2b, cube, host, disabled",
                    raw.chars().take(64).collect::<String>()
                ),
            )
            .with_code(ErrorCode::UnknownSandboxType)
        })
    }

    /// The provider hosting this type's session sandboxes, if it has one.
    pub fn provider(self) -> Option<Provider> {
        match self {
            SandboxType::Docker => Some(Provider::Docker),
            SandboxType::E2b => Some(Provider::E2b),
            SandboxType::Cube => Some(Provider::Cube),
            SandboxType::Host | SandboxType::Disabled => None,
        }
    }
}

impl fmt::Display for SandboxType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SandboxType::parse(s)
    }
}

impl Serialize for SandboxType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SandboxType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        SandboxType::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A backend that hosts persistent session sandboxes. Recorded in every binding so a provider
/// switch is detected instead of asking the new backend about the old backend's IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    /// A Docker engine.
    Docker,
    /// E2B or an E2B-compatible control plane.
    E2b,
    /// Tencent CubeSandbox.
    Cube,
}

impl Provider {
    /// Every provider.
    pub const ALL: [Provider; 3] = [Provider::Docker, Provider::E2b, Provider::Cube];

    /// The stored spelling (identical to the matching [`SandboxType`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Docker => "docker",
            Provider::E2b => "e2b",
            Provider::Cube => "cube",
        }
    }

    /// Parses a stored spelling; `host`, `disabled` and unknown strings are refused.
    pub fn parse(raw: &str) -> Result<Provider, Error> {
        Provider::ALL
            .into_iter()
            .find(|p| p.as_str() == raw)
            .ok_or_else(|| {
                Error::invalid_request(
                    Operation::VALIDATE,
                    format!(
                        "unknown provider {:?}: expected one of docker, e2b, cube",
                        raw.chars().take(64).collect::<String>()
                    ),
                )
                .with_code(ErrorCode::UnknownSandboxType)
            })
    }

    /// The sandbox type that selects this provider.
    pub fn sandbox_type(self) -> SandboxType {
        match self {
            Provider::Docker => SandboxType::Docker,
            Provider::E2b => SandboxType::E2b,
            Provider::Cube => SandboxType::Cube,
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Provider {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Provider::parse(s)
    }
}

impl Serialize for Provider {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Provider {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Provider::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn sandbox_types_round_trip_and_unknown_is_typed_error() {
        for t in SandboxType::ALL {
            assert_eq!(SandboxType::parse(t.as_str()).unwrap(), t);
        }
        for bad in ["", "Docker", "local", "kubernetes", " e2b"] {
            let err = SandboxType::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert_eq!(err.code(), Some(ErrorCode::UnknownSandboxType));
            assert!(
                err.to_string().contains("unsupported sandbox type"),
                "{err}"
            );
        }
        let err = serde_json::from_str::<SandboxType>("\"vmware\"").unwrap_err();
        assert!(err.to_string().contains("unsupported sandbox type"));
    }

    #[test]
    fn providers_are_the_remote_types() {
        assert_eq!(SandboxType::Host.provider(), None);
        assert_eq!(SandboxType::Disabled.provider(), None);
        for p in Provider::ALL {
            assert_eq!(p.sandbox_type().provider(), Some(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert!(Provider::parse("host").is_err());
    }
}

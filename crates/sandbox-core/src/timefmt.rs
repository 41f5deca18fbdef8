//! RFC 3339 timestamps on the wire.
//!
//! Bindings are read and written by every replica (and, during a migration, by the Go
//! implementation that shares the store), so parsing accepts the forms Go's `time.Time`
//! produces: nanosecond fractions and numeric offsets. Writing always emits UTC with the
//! fraction trimmed, which both sides parse.

use serde::{Deserialize, Deserializer, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::{Error, Operation};

/// Parses an RFC 3339 timestamp (any offset, optional fraction up to nanoseconds).
pub fn parse(raw: &str) -> Result<OffsetDateTime, Error> {
    OffsetDateTime::parse(raw, &Rfc3339).map_err(|e| {
        Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "invalid RFC 3339 timestamp {:?}",
                raw.chars().take(64).collect::<String>()
            ),
        )
        .with_source(e)
    })
}

/// Formats `at` as RFC 3339 in UTC.
pub fn format(at: OffsetDateTime) -> Result<String, Error> {
    at.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .map_err(|e| {
            Error::invalid_request(
                Operation::VALIDATE,
                "timestamp cannot be formatted as RFC 3339",
            )
            .with_source(e)
        })
}

/// `#[serde(with = "timefmt::rfc3339")]` for a required timestamp.
pub mod rfc3339 {
    use super::*;

    /// Serializes as RFC 3339 in UTC.
    pub fn serialize<S: Serializer>(at: &OffsetDateTime, serializer: S) -> Result<S::Ok, S::Error> {
        let text = super::format(*at).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&text)
    }

    /// Deserializes any RFC 3339 form.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<OffsetDateTime, D::Error> {
        let raw = String::deserialize(deserializer)?;
        super::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "timefmt::rfc3339_option")]` for an optional, nullable timestamp.
pub mod rfc3339_option {
    use super::*;

    /// Serializes `Some` as RFC 3339 in UTC and `None` as null.
    pub fn serialize<S: Serializer>(
        at: &Option<OffsetDateTime>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => super::rfc3339::serialize(at, serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Accepts null, a missing field (with `#[serde(default)]`) or any RFC 3339 form.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<OffsetDateTime>, D::Error> {
        match Option::<String>::deserialize(deserializer)? {
            Some(raw) => super::parse(&raw)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_go_forms_and_writes_utc() {
        let cases = [
            ("2026-11-29T09:50:21Z", "2026-11-29T09:50:21Z"),
            (
                "2026-11-29T09:50:21.123456789Z",
                "2026-11-29T09:50:21.123456789Z",
            ),
            ("2026-11-29T17:50:21.5+08:00", "2026-11-29T09:50:21.5Z"),
            ("2026-11-29T09:50:21.120000000Z", "2026-11-29T09:50:21.12Z"),
        ];
        for (input, output) in cases {
            let at = parse(input).unwrap();
            assert_eq!(format(at).unwrap(), output, "{input}");
        }
        for bad in ["", "2026-11-29", "yesterday", "2026-13-01T00:00:00Z"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

//! `google.protobuf.Timestamp` and its JSON form, an RFC 3339 string.
//!
//! Kept as the proto's `seconds` + `nanos` pair rather than a `time::OffsetDateTime` so that a
//! value read from the wire is written back exactly (the proto3 JSON rule: UTC with `Z`, and 0,
//! 3, 6 or 9 fractional digits, whichever is shortest without losing precision). Conversions to
//! `OffsetDateTime` and `SystemTime` are provided for callers.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A point in time with nanosecond precision, independent of any time zone.
///
/// The valid range is the proto's: `0001-01-01T00:00:00Z` to `9999-12-31T23:59:59.999999999Z`,
/// with `nanos` in `0..1_000_000_000` (negative instants have negative `seconds` and positive
/// `nanos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp {
    /// Seconds since the Unix epoch.
    pub seconds: i64,
    /// Nanoseconds within the second, `0..1_000_000_000`.
    pub nanos: i32,
}

/// `0001-01-01T00:00:00Z` in Unix seconds.
const MIN_SECONDS: i64 = -62_135_596_800;
/// `9999-12-31T23:59:59Z` in Unix seconds.
const MAX_SECONDS: i64 = 253_402_300_799;

/// Why a timestamp was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    /// The text is not RFC 3339.
    #[error("timestamp {text:?} is not RFC 3339: {reason}")]
    Syntax {
        /// The text as received.
        text: String,
        /// What the parser objected to.
        reason: String,
    },
    /// Outside year 1 to 9999, or `nanos` outside `0..1_000_000_000`.
    #[error("timestamp {seconds}s {nanos}ns is outside the range of google.protobuf.Timestamp")]
    OutOfRange {
        /// The seconds.
        seconds: i64,
        /// The nanoseconds.
        nanos: i32,
    },
}

impl Timestamp {
    /// A timestamp, checked against the proto's range.
    pub fn new(seconds: i64, nanos: i32) -> Result<Self, TimestampError> {
        let ts = Timestamp { seconds, nanos };
        ts.check()?;
        Ok(ts)
    }

    fn check(self) -> Result<(), TimestampError> {
        if (MIN_SECONDS..=MAX_SECONDS).contains(&self.seconds)
            && (0..1_000_000_000).contains(&self.nanos)
        {
            Ok(())
        } else {
            Err(TimestampError::OutOfRange {
                seconds: self.seconds,
                nanos: self.nanos,
            })
        }
    }

    /// Parses RFC 3339 text with any offset (the instant is kept, the offset is not).
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimestampError> {
        let dt = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| TimestampError::Syntax {
            text: text.to_owned(),
            reason: e.to_string(),
        })?;
        Timestamp::try_from(dt)
    }

    /// The canonical proto3 JSON text: UTC, `Z`, and 0, 3, 6 or 9 fractional digits.
    pub fn to_rfc3339(self) -> Result<String, TimestampError> {
        let dt = OffsetDateTime::try_from(self)?;
        let mut out = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            dt.year(),
            u8::from(dt.month()),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second()
        );
        let fraction = match self.nanos {
            0 => String::new(),
            n if n % 1_000_000 == 0 => format!(".{:03}", n / 1_000_000),
            n if n % 1_000 == 0 => format!(".{:06}", n / 1_000),
            n => format!(".{n:09}"),
        };
        out.push_str(&fraction);
        out.push('Z');
        Ok(out)
    }
}

impl TryFrom<OffsetDateTime> for Timestamp {
    type Error = TimestampError;

    fn try_from(dt: OffsetDateTime) -> Result<Self, TimestampError> {
        // `nanosecond()` is always below 10^9, so the cast is lossless.
        Timestamp::new(dt.unix_timestamp(), dt.nanosecond() as i32)
    }
}

impl TryFrom<Timestamp> for OffsetDateTime {
    type Error = TimestampError;

    fn try_from(ts: Timestamp) -> Result<Self, TimestampError> {
        ts.check()?;
        let out_of_range = TimestampError::OutOfRange {
            seconds: ts.seconds,
            nanos: ts.nanos,
        };
        let base = OffsetDateTime::from_unix_timestamp(ts.seconds).map_err(|_| out_of_range)?;
        Ok(base + time::Duration::nanoseconds(i64::from(ts.nanos)))
    }
}

impl TryFrom<SystemTime> for Timestamp {
    type Error = TimestampError;

    fn try_from(t: SystemTime) -> Result<Self, TimestampError> {
        let too_far = || TimestampError::OutOfRange {
            seconds: i64::MAX,
            nanos: 0,
        };
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp::new(
                i64::try_from(d.as_secs()).map_err(|_| too_far())?,
                d.subsec_nanos() as i32,
            ),
            Err(before) => {
                let d = before.duration();
                let secs = i64::try_from(d.as_secs()).map_err(|_| too_far())?;
                // Negative instants borrow a second so `nanos` stays non-negative.
                let (seconds, nanos) = match d.subsec_nanos() {
                    0 => (-secs, 0),
                    n => (-secs - 1, 1_000_000_000 - n as i32),
                };
                Timestamp::new(seconds, nanos)
            }
        }
    }
}

impl TryFrom<Timestamp> for SystemTime {
    type Error = TimestampError;

    fn try_from(ts: Timestamp) -> Result<Self, TimestampError> {
        ts.check()?;
        // `check` bounds both fields, so the conversions below cannot fail or overflow.
        let nanos = Duration::from_nanos(ts.nanos.unsigned_abs().into());
        let secs = Duration::from_secs(ts.seconds.unsigned_abs());
        let t = if ts.seconds >= 0 {
            UNIX_EPOCH + secs
        } else {
            UNIX_EPOCH - secs
        };
        Ok(t + nanos)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_rfc3339() {
            Ok(text) => f.write_str(&text),
            Err(_) => write!(f, "{}s{}ns", self.seconds, self.nanos),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.to_rfc3339().map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(s).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn check(text: &str, seconds: i64, nanos: i32, canonical: &str) {
        let ts = Timestamp::parse_rfc3339(text).unwrap();
        assert_eq!(ts, Timestamp { seconds, nanos }, "{text}");
        assert_eq!(ts.to_rfc3339().unwrap(), canonical, "{text}");
    }

    #[test]
    fn canonical_forms() {
        check(
            "2026-01-01T00:00:00Z",
            1_767_225_600,
            0,
            "2026-01-01T00:00:00Z",
        );
        check(
            "1970-01-01T00:00:00.5Z",
            0,
            500_000_000,
            "1970-01-01T00:00:00.500Z",
        );
        check(
            "1970-01-01T00:00:00.000001Z",
            0,
            1_000,
            "1970-01-01T00:00:00.000001Z",
        );
        check(
            "1970-01-01T00:00:00.0000001Z",
            0,
            100,
            "1970-01-01T00:00:00.000000100Z",
        );
        check("1970-01-01T01:00:00+01:00", 0, 0, "1970-01-01T00:00:00Z");
        check(
            "1969-12-31T23:59:59.25Z",
            -1,
            250_000_000,
            "1969-12-31T23:59:59.250Z",
        );
        check(
            "0001-01-01T00:00:00Z",
            MIN_SECONDS,
            0,
            "0001-01-01T00:00:00Z",
        );
        check(
            "9999-12-31T23:59:59.999999999Z",
            MAX_SECONDS,
            999_999_999,
            "9999-12-31T23:59:59.999999999Z",
        );
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            Timestamp::parse_rfc3339("2026-01-01"),
            Err(TimestampError::Syntax { .. })
        ));
        assert!(matches!(
            Timestamp::new(MAX_SECONDS + 1, 0),
            Err(TimestampError::OutOfRange { .. })
        ));
        assert!(matches!(
            Timestamp::new(0, 1_000_000_000),
            Err(TimestampError::OutOfRange { .. })
        ));
        assert!(
            Timestamp {
                seconds: 0,
                nanos: -1
            }
            .to_rfc3339()
            .is_err()
        );
    }

    #[test]
    fn system_time_round_trip() {
        for ts in [
            Timestamp {
                seconds: 0,
                nanos: 0,
            },
            Timestamp {
                seconds: 1_767_225_600,
                nanos: 7,
            },
            Timestamp {
                seconds: -1,
                nanos: 250_000_000,
            },
            Timestamp {
                seconds: -100,
                nanos: 0,
            },
        ] {
            let st = SystemTime::try_from(ts).unwrap();
            assert_eq!(Timestamp::try_from(st).unwrap(), ts);
            let dt = OffsetDateTime::try_from(ts).unwrap();
            assert_eq!(Timestamp::try_from(dt).unwrap(), ts);
        }
    }
}

//! The deadline store port: when each sandbox created through the E2B-compatible API must be
//! killed (issue 18). Keys are E2B sandbox IDs; the value is one instant per key.
//!
//! The service writes a sandbox's deadline before the API answers, and its timeout engine reads
//! the due ones back, so a deadline outlives the process that set it: a restarted service (or
//! another replica on the same store) still kills the sandbox on time, and an extended deadline
//! is never forgotten.
//!
//! Deadlines are kept at millisecond precision, rounded *up* ([`deadline_millis`]): a stored
//! deadline is never earlier than the one asked for, so no rounding can kill a sandbox early.
//! Keys and instants are validated here ([`check_deadline_key`], [`deadline_millis`]), once, so
//! every store refuses the same things with the same codes.
//!
//! Contract bullets the deadline conformance suite in `sandbox-testkit` checks carry a tag in
//! brackets, cited by its cases; `cargo xtask tidy` (rule `contract-tags`) keeps both in step.
//!
//! - `[deadlines.origin]` Every error a deadline store returns, from any method, has origin
//!   [`Origin::Store`], core's key and instant validation
//!   included: a store that cannot be reached must read as the store's fault, never as "no
//!   deadline".

use std::fmt;

use async_trait::async_trait;
use time::OffsetDateTime;

use crate::error::{Error, ErrorCode, Operation, Origin};

/// The longest key a deadline store accepts, in bytes. E2B sandbox IDs are 20 characters; the
/// bound keeps a key from growing a store's file or sorted set without limit.
pub const MAX_DEADLINE_KEY_BYTES: usize = 128;

/// The latest deadline a store accepts: the last millisecond of year 9999. Far beyond any
/// timeout, and well inside what every backing represents exactly (a Redis score is an `f64`,
/// exact for integers up to 2^53 ms, some 285,000 years).
pub const MAX_DEADLINE_MILLIS: i64 = 253_402_300_799_999;

/// Persists one deadline per key and answers which are due.
/// - `[deadlines.keys]` Keys are independent: setting, replacing or removing one key's deadline
///   never changes another's, and keys differing only in case are different keys.
/// - `[deadlines.key]` Every method refuses a key [`check_deadline_key`] refuses, with
///   `invalid_request` and code `invalid_deadline_key`, before touching the backing: nothing is
///   stored, read or removed for it.
#[async_trait]
pub trait DeadlineStore: Send + Sync + fmt::Debug {
    /// Sets `key`'s deadline to `at`, replacing any earlier one (earlier or later than `at`).
    /// - `[deadlines.set]` When the call returns `Ok` the deadline is stored: [`deadline`]
    ///   (through this instance or any other on the same backing) reads back `at` rounded up
    ///   to the whole millisecond.
    /// - `[deadlines.replace]` A second set replaces the first, whether it moves the deadline
    ///   later or earlier; only the last one is kept and reported by [`due`].
    /// - `[deadlines.range]` An `at` before the Unix epoch or after [`MAX_DEADLINE_MILLIS`] is
    ///   refused with `invalid_request` and code `invalid_timeout`, storing nothing.
    /// - `[deadlines.concurrent]` Concurrent sets of distinct keys, from many tasks, all land.
    /// - `[deadlines.durable]` Durable on return: a store opened afresh on the same backing
    ///   (after a restart of the service) reads what was set and does not read what was
    ///   removed.
    ///
    /// [`deadline`]: DeadlineStore::deadline
    /// [`due`]: DeadlineStore::due
    async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error>;

    /// `key`'s deadline, `None` when it has none.
    /// - `[deadlines.get]` `None` for a key never set or removed; otherwise the last deadline
    ///   set, at millisecond precision.
    async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error>;

    /// Removes `key`'s deadline.
    /// - `[deadlines.remove]` Afterwards the key has no deadline and is never due; removing a
    ///   key that has none is `Ok` and changes nothing.
    async fn remove_deadline(&self, key: &str) -> Result<(), Error>;

    /// The deadlines at or before `now`, earliest first (equal deadlines by key, byte-wise
    /// ascending), at most `limit` of them. Reading changes nothing: a due deadline stays until
    /// it is removed.
    /// - `[deadlines.due]` Exactly the keys whose deadline is at or before `now` (a deadline
    ///   equal to `now` is due, one a millisecond later is not), each with its stored deadline,
    ///   in that order; the first `limit` of them when there are more; none for `limit == 0`.
    /// - `[deadlines.far]` A deadline far in the future (years ahead, up to
    ///   [`MAX_DEADLINE_MILLIS`]) is never due before it.
    async fn due(
        &self,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Error>;
}

/// What every deadline store checks before it uses `key` in `operation`: not blank, at most
/// [`MAX_DEADLINE_KEY_BYTES`] bytes, no control characters (a key is a line of a file and a
/// member of a sorted set; a line break or NUL in one could corrupt the one or confuse the
/// other). A refusal is `invalid_request` with code
/// [`ErrorCode::InvalidDeadlineKey`] and origin [`Origin::Store`]; its message shows at most the
/// key's first 32 characters, escaped.
pub fn check_deadline_key(operation: Operation, key: &str) -> Result<(), Error> {
    let why = if key.trim().is_empty() {
        Some("is blank".to_owned())
    } else if key.len() > MAX_DEADLINE_KEY_BYTES {
        Some(format!(
            "is {} bytes long (at most {MAX_DEADLINE_KEY_BYTES})",
            key.len()
        ))
    } else if key.chars().any(char::is_control) {
        Some("contains a control character".to_owned())
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => {
            let shown: String = key.chars().take(32).collect();
            Err(
                Error::invalid_request(operation, format!("deadline key {shown:?} {why}"))
                    .with_code(ErrorCode::InvalidDeadlineKey)
                    .with_origin(Origin::Store),
            )
        }
    }
}

/// `at` as whole Unix milliseconds, rounded up (a stored deadline is never earlier than the one
/// asked for), for `operation`. Refuses (`invalid_request`, code [`ErrorCode::InvalidTimeout`],
/// origin [`Origin::Store`]) an instant before the Unix epoch or after
/// [`MAX_DEADLINE_MILLIS`].
pub fn deadline_millis(operation: Operation, at: OffsetDateTime) -> Result<i64, Error> {
    let nanos = at.unix_timestamp_nanos();
    // The range is judged on the instant itself, before rounding: a nanosecond before the
    // epoch is refused, not rounded up into the range.
    let millis = nanos.div_euclid(1_000_000) + i128::from(nanos.rem_euclid(1_000_000) != 0);
    match i64::try_from(millis) {
        Ok(ms) if nanos >= 0 && ms <= MAX_DEADLINE_MILLIS => Ok(ms),
        _ => Err(Error::invalid_request(
            operation,
            format!(
                "deadline {at} is outside what a deadline store keeps (the Unix epoch to the end of year 9999)"
            ),
        )
        .with_code(ErrorCode::InvalidTimeout)
        .with_origin(Origin::Store)),
    }
}

/// `now` as whole Unix milliseconds for a due query, rounded *down*: a deadline of `d` ms is due
/// at `now` exactly when `d <= due_cutoff_millis(now)`. Instants before the epoch give a
/// negative cutoff (nothing is due); instants past the range give [`MAX_DEADLINE_MILLIS`].
pub fn due_cutoff_millis(now: OffsetDateTime) -> i64 {
    let millis = now.unix_timestamp_nanos().div_euclid(1_000_000);
    i64::try_from(millis.min(i128::from(MAX_DEADLINE_MILLIS))).unwrap_or(MAX_DEADLINE_MILLIS)
}

/// The instant of a stored millisecond count, for `operation`. A count outside the range a
/// store writes means the backing holds something no store wrote: an `internal` error of the
/// store, never a guess.
pub fn deadline_from_millis(operation: Operation, millis: i64) -> Result<OffsetDateTime, Error> {
    if !(0..=MAX_DEADLINE_MILLIS).contains(&millis) {
        return Err(Error::internal(
            operation,
            format!("stored deadline {millis} ms is outside the range a deadline store writes"),
        )
        .with_origin(Origin::Store));
    }
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).map_err(|e| {
        Error::internal(operation, format!("stored deadline {millis} ms: {e}"))
            .with_origin(Origin::Store)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const OP: Operation = Operation::new("set_deadline");

    #[test]
    fn keys_are_checked_in_one_place() {
        for ok in [
            "i0123456789abcdefghi",
            "a",
            "with space",
            "ünïcode",
            &"k".repeat(128),
        ] {
            assert!(check_deadline_key(OP, ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "   ",
            "\t",
            "a\nb",
            "nul\0",
            "esc\u{1b}",
            &"k".repeat(129),
        ] {
            let err = check_deadline_key(OP, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad:?}");
            assert_eq!(err.code(), Some(ErrorCode::InvalidDeadlineKey), "{bad:?}");
            assert_eq!(err.origin(), Origin::Store, "{bad:?}");
            assert_eq!(err.operation(), OP);
            assert!(!err.message().contains('\n'), "{err}");
        }
        // The bound is in bytes: 43 three-byte characters are 129 bytes.
        assert!(check_deadline_key(OP, &"€".repeat(43)).is_err());
        assert!(check_deadline_key(OP, &"€".repeat(42)).is_ok());
    }

    #[test]
    fn millis_round_up_and_the_range_is_enforced() {
        let at = |nanos: i128| OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap();
        assert_eq!(deadline_millis(OP, at(0)).unwrap(), 0);
        assert_eq!(deadline_millis(OP, at(1)).unwrap(), 1);
        assert_eq!(deadline_millis(OP, at(1_000_000)).unwrap(), 1);
        assert_eq!(deadline_millis(OP, at(1_000_001)).unwrap(), 2);
        assert_eq!(due_cutoff_millis(at(1_999_999)), 1);
        assert_eq!(due_cutoff_millis(at(2_000_000)), 2);
        assert_eq!(due_cutoff_millis(at(-1)), -1);
        let max = i128::from(MAX_DEADLINE_MILLIS) * 1_000_000;
        assert_eq!(deadline_millis(OP, at(max)).unwrap(), MAX_DEADLINE_MILLIS);
        assert_eq!(
            deadline_from_millis(OP, MAX_DEADLINE_MILLIS).unwrap(),
            at(max)
        );
        // The constant is the last millisecond of year 9999.
        assert_eq!(at(max).year(), 9999);
        for bad in [at(-1), at(max + 1)] {
            let err = deadline_millis(OP, bad).unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::InvalidTimeout), "{bad}");
            assert_eq!(err.origin(), Origin::Store);
        }
        for bad in [-1, MAX_DEADLINE_MILLIS + 1, i64::MAX] {
            let err = deadline_from_millis(OP, bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Internal);
            assert_eq!(err.origin(), Origin::Store);
        }
        // Round trip of a rounded value is exact.
        let ms = deadline_millis(OP, at(1_764_633_600_123_456_789)).unwrap();
        assert_eq!(ms, 1_764_633_600_124);
        assert_eq!(
            deadline_from_millis(OP, ms).unwrap(),
            at(1_764_633_600_124_000_000)
        );
    }
}

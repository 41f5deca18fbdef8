//! Signed file URLs: how a `/files` request without the access token header proves it may read
//! or write one path.
//!
//! A signature is `v1_` followed by the standard base64 (no padding) of the SHA-256 of
//! `"<path>:<read|write>:<username or empty>:<access token>"`, with `":<expiration>"` appended
//! when the URL carries `signature_expiration` (Unix seconds, after which it is refused). The
//! path and username are the query's, as sent: a URL signed for one path opens no other.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use sha2::{Digest as _, Sha256};

use super::ACCESS_TOKEN_HEADER;
use super::query::FilesQuery;

/// What a signature allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl FileOperation {
    /// The word signed.
    pub const fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// Why a request was not authorized (each is a 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// An `X-Access-Token` header was sent and is not the token.
    WrongHeaderToken,
    /// Neither the header nor a signature was sent.
    Missing,
    /// The signature does not match.
    Invalid,
    /// The signature matched, but its expiry has passed.
    Expired,
}

impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SignatureError::WrongHeaderToken => "access token present in header but does not match",
            SignatureError::Missing => "missing signature query parameter",
            SignatureError::Invalid => "invalid signature",
            SignatureError::Expired => "signature is already expired",
        })
    }
}

impl std::error::Error for SignatureError {}

/// The signature of a URL for `path` (the query's value, empty when absent), `operation`,
/// `username` (`None` for the default user), with an optional expiry.
pub fn sign(
    path: &str,
    operation: FileOperation,
    username: Option<&str>,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let mut text = format!(
        "{path}:{}:{}:{access_token}",
        operation.as_str(),
        username.unwrap_or("")
    );
    if let Some(exp) = expiration {
        text.push(':');
        text.push_str(&exp.to_string());
    }
    let digest = Sha256::digest(text.as_bytes());
    format!("v1_{}", STANDARD_NO_PAD.encode(digest.as_slice()))
}

/// Checks a signed URL's `signature` against the access token, at `now` (Unix seconds).
pub fn check_signature(
    path: &str,
    operation: FileOperation,
    username: Option<&str>,
    access_token: &str,
    signature: &str,
    expiration: Option<i64>,
    now: i64,
) -> Result<(), SignatureError> {
    let expected = sign(path, operation, username, access_token, expiration);
    if !constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
        return Err(SignatureError::Invalid);
    }
    match expiration {
        Some(exp) if exp < now => Err(SignatureError::Expired),
        _ => Ok(()),
    }
}

/// A request carrying the header is judged by the header alone; one without it needs a
/// signature.
pub(crate) fn authorize(
    headers: &hyper::HeaderMap,
    query: &FilesQuery,
    operation: FileOperation,
    access_token: &str,
    now: i64,
) -> Result<(), SignatureError> {
    if let Some(sent) = headers.get(ACCESS_TOKEN_HEADER) {
        return if constant_time_eq(sent.as_bytes(), access_token.as_bytes()) {
            Ok(())
        } else {
            Err(SignatureError::WrongHeaderToken)
        };
    }
    let signature = query.signature.as_deref().ok_or(SignatureError::Missing)?;
    check_signature(
        query.path.as_deref().unwrap_or(""),
        operation,
        query.username.as_deref(),
        access_token,
        signature,
        query.signature_expiration,
        now,
    )
}

/// Compares without an early exit, so the time taken tells nothing about how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "secret-token";

    #[test]
    fn signatures_are_the_envd_form() {
        // Computed apart from this code (Python's hashlib and base64 over the same text).
        let s = sign("/home/user/a.txt", FileOperation::Read, None, TOKEN, None);
        assert_eq!(s, "v1_oG8MeWunkA0k+JA9ryHxVcTNtkXm7z9NuWgYBImd3sA");
        assert_eq!(
            sign(
                "/home/user/a.txt",
                FileOperation::Write,
                Some("user"),
                TOKEN,
                Some(1_700_000_000)
            ),
            "v1_7nOg9iklgnGo60+IOnph3ANWcLzFQ0GGVg4+khaiKrM"
        );
        assert_ne!(
            s,
            sign("/home/user/a.txt", FileOperation::Write, None, TOKEN, None)
        );
        assert_ne!(
            s,
            sign(
                "/home/user/a.txt",
                FileOperation::Read,
                Some("root"),
                TOKEN,
                None
            )
        );
        assert_ne!(
            s,
            sign(
                "/home/user/a.txt",
                FileOperation::Read,
                None,
                TOKEN,
                Some(1)
            )
        );
    }

    #[test]
    fn checks_accept_the_right_signature_only() {
        let now = 1_000;
        let good = sign("p", FileOperation::Write, Some("user"), TOKEN, Some(2_000));
        let check = |path: &str, op, user, sig: &str, exp| {
            check_signature(path, op, user, TOKEN, sig, exp, now)
        };
        assert_eq!(
            check("p", FileOperation::Write, Some("user"), &good, Some(2_000)),
            Ok(())
        );
        assert_eq!(
            check("q", FileOperation::Write, Some("user"), &good, Some(2_000)),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check("p", FileOperation::Read, Some("user"), &good, Some(2_000)),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check("p", FileOperation::Write, None, &good, Some(2_000)),
            Err(SignatureError::Invalid)
        );
        // Stretching the expiry breaks the signature.
        assert_eq!(
            check("p", FileOperation::Write, Some("user"), &good, Some(3_000)),
            Err(SignatureError::Invalid)
        );
        let old = sign("p", FileOperation::Write, Some("user"), TOKEN, Some(999));
        assert_eq!(
            check("p", FileOperation::Write, Some("user"), &old, Some(999)),
            Err(SignatureError::Expired)
        );
        let forever = sign("p", FileOperation::Read, None, TOKEN, None);
        assert_eq!(
            check("p", FileOperation::Read, None, &forever, None),
            Ok(())
        );
        assert_eq!(
            check_signature("p", FileOperation::Read, None, "other", &forever, None, now),
            Err(SignatureError::Invalid)
        );
    }

    #[test]
    fn the_header_decides_when_present() {
        let query = FilesQuery {
            path: Some("/f".into()),
            signature: Some(sign("/f", FileOperation::Read, None, TOKEN, None)),
            ..FilesQuery::default()
        };
        let mut headers = hyper::HeaderMap::new();
        assert_eq!(
            authorize(&headers, &query, FileOperation::Read, TOKEN, 0),
            Ok(())
        );
        assert_eq!(
            authorize(&headers, &query, FileOperation::Write, TOKEN, 0),
            Err(SignatureError::Invalid)
        );
        headers.insert(ACCESS_TOKEN_HEADER, TOKEN.parse().unwrap());
        assert_eq!(
            authorize(
                &headers,
                &FilesQuery::default(),
                FileOperation::Write,
                TOKEN,
                0
            ),
            Ok(())
        );
        headers.insert(ACCESS_TOKEN_HEADER, "nope".parse().unwrap());
        assert_eq!(
            authorize(&headers, &query, FileOperation::Read, TOKEN, 0),
            Err(SignatureError::WrongHeaderToken)
        );
        assert_eq!(
            authorize(
                &hyper::HeaderMap::new(),
                &FilesQuery::default(),
                FileOperation::Read,
                TOKEN,
                0
            ),
            Err(SignatureError::Missing)
        );
    }
}

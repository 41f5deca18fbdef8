//! The query string of a `/files` request (`application/x-www-form-urlencoded`: `+` is a
//! space, `%XX` a byte). Of a repeated parameter the first counts, as Go's `Query().Get`
//! answers.

use sandbox_envd::files::{QUERY_PATH, QUERY_USERNAME};

use super::FilesError;

/// Query parameter: a signed URL's signature.
pub(crate) const QUERY_SIGNATURE: &str = "signature";
/// Query parameter: a signed URL's expiry (Unix seconds).
pub(crate) const QUERY_SIGNATURE_EXPIRATION: &str = "signature_expiration";

/// The parameters the endpoints read; an absent one is `None`, a present empty one `Some("")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FilesQuery {
    pub(crate) path: Option<String>,
    pub(crate) username: Option<String>,
    pub(crate) signature: Option<String>,
    pub(crate) signature_expiration: Option<i64>,
}

impl FilesQuery {
    pub(crate) fn parse(query: Option<&str>) -> Result<FilesQuery, FilesError> {
        let mut out = FilesQuery::default();
        let mut expiration: Option<String> = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(key)?;
            let slot = match key.as_str() {
                QUERY_PATH => &mut out.path,
                QUERY_USERNAME => &mut out.username,
                QUERY_SIGNATURE => &mut out.signature,
                QUERY_SIGNATURE_EXPIRATION => &mut expiration,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(decode(value)?);
            }
        }
        if let Some(text) = expiration {
            out.signature_expiration = Some(text.parse().map_err(|_| {
                FilesError::bad_request(format!(
                    "invalid format for parameter {QUERY_SIGNATURE_EXPIRATION}: {text:?} is not an integer"
                ))
            })?);
        }
        Ok(out)
    }
}

/// One form-encoded component.
fn decode(text: &str) -> Result<String, FilesError> {
    let bad = || FilesError::bad_request(format!("invalid query string escape in {text:?}"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out)
        .map_err(|_| FilesError::bad_request(format!("query parameter {text:?} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_and_the_first_wins() {
        let q = FilesQuery::parse(Some(
            "path=%2Fhome%2Fuser%2Fa+b%C3%A9.txt&username=root&path=/other&x=1&signature=v1_x&signature_expiration=17",
        ))
        .unwrap();
        assert_eq!(q.path.as_deref(), Some("/home/user/a bé.txt"));
        assert_eq!(q.username.as_deref(), Some("root"));
        assert_eq!(q.signature.as_deref(), Some("v1_x"));
        assert_eq!(q.signature_expiration, Some(17));
        let empty = FilesQuery::parse(Some("username=&path")).unwrap();
        assert_eq!(empty.username.as_deref(), Some(""));
        assert_eq!(empty.path.as_deref(), Some(""));
        assert_eq!(FilesQuery::parse(None).unwrap(), FilesQuery::default());
        for bad in [
            "path=%zz",
            "path=%2",
            "path=%FF",
            "signature_expiration=soon",
        ] {
            let e = FilesQuery::parse(Some(bad)).unwrap_err();
            assert_eq!(e.status, hyper::StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}

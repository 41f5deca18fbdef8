//! The metadata an E2B-API sandbox carries through the provider port, and the SDK's encoding
//! of a metadata filter.
//!
//! Our own keys all start with `sandbox.`; a caller's key starting with `sandbox` (any case)
//! is refused, so a caller can neither forge them nor the session layer's ownership keys
//! (`sandbox_*`): an E2B sandbox is never mistaken for a session's, and recovery never adopts
//! one. Callers see their own keys only.

use sandbox_core::{Metadata, TenantId};

use super::ids::E2bId;

/// Marks a sandbox as the E2B API's (value [`API_VALUE`]).
pub const API: &str = "sandbox.api";
pub const API_VALUE: &str = "e2b";
/// The sandbox's E2B ID.
pub const ID: &str = "sandbox.e2b.id";
/// The tenant that created it (decimal).
pub const TENANT: &str = "sandbox.tenant";
/// The deadline set at create, Unix seconds: what a restart falls back on when the deadline
/// store has lost the sandbox's entry (never an earlier kill than the create promised).
pub const DEADLINE: &str = "sandbox.e2b.deadline";
/// The template as the caller named it.
pub const TEMPLATE: &str = "sandbox.e2b.template";
/// `false` when the create denied internet access (absent: allowed).
pub const INTERNET: &str = "sandbox.e2b.internet";
/// `false` when the create closed public traffic (`network.allowPublicTraffic: false`), so
/// its preview ports want the traffic token (absent: open).
pub const PUBLIC: &str = "sandbox.e2b.public";

/// What the timeout engine does at the deadline: [`ON_TIMEOUT_PAUSE`] (the create's
/// `autoPause: true`) or `kill` (absent: kill).
pub const ON_TIMEOUT: &str = "sandbox.e2b.on_timeout";
pub const ON_TIMEOUT_PAUSE: &str = "pause";
pub const ON_TIMEOUT_KILL: &str = "kill";

/// The reserved prefix of keys, compared without case.
const RESERVED_PREFIX: &str = "sandbox";

/// The most metadata pairs a create may carry, and the longest key and value.
pub const MAX_PAIRS: usize = 64;
pub const MAX_KEY_BYTES: usize = 128;
pub const MAX_VALUE_BYTES: usize = 1024;

/// Refuses caller metadata this API cannot store faithfully, naming the key.
pub fn check_caller_metadata(metadata: &Metadata) -> Result<(), String> {
    if metadata.len() > MAX_PAIRS {
        return Err(format!(
            "metadata has {} entries; at most {MAX_PAIRS} are accepted",
            metadata.len()
        ));
    }
    for (key, value) in metadata {
        let shown: String = key.chars().take(64).collect();
        if key
            .get(..RESERVED_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
        {
            return Err(format!(
                "metadata key {shown:?} is reserved: keys starting with \"sandbox\" are the service's own"
            ));
        }
        let key_ok = !key.is_empty()
            && key.len() <= MAX_KEY_BYTES
            && !key.contains('=')
            && !key.chars().any(|c| c.is_control() || c.is_whitespace());
        if !key_ok {
            return Err(format!(
                "metadata key {shown:?} must be 1 to {MAX_KEY_BYTES} bytes without spaces, '=' or control characters"
            ));
        }
        if value.len() > MAX_VALUE_BYTES || value.chars().any(char::is_control) {
            return Err(format!(
                "metadata value of {shown:?} must be at most {MAX_VALUE_BYTES} bytes without control characters"
            ));
        }
    }
    Ok(())
}

/// The metadata to stamp on a new sandbox: the caller's, and ours.
pub fn stamped(
    caller: &Metadata,
    id: &E2bId,
    tenant: TenantId,
    deadline_unix: i64,
    template: &str,
) -> Metadata {
    let mut out = caller.clone();
    out.insert(API.to_owned(), API_VALUE.to_owned());
    out.insert(ID.to_owned(), id.as_str().to_owned());
    out.insert(TENANT.to_owned(), tenant.get().to_string());
    out.insert(DEADLINE.to_owned(), deadline_unix.to_string());
    out.insert(TEMPLATE.to_owned(), template.to_owned());
    // The tenant under the ownership key as well: it is what a backend records on a snapshot
    // of the sandbox and checks on a restore (`[snapshot.tenant]`, `[create.snapshot_owner]`),
    // so snapshots stay their tenant's. No session key is written: no session owns it.
    out.insert(
        sandbox_core::owner_metadata::TENANT.to_owned(),
        tenant.get().to_string(),
    );
    out
}

/// The caller's own pairs of a sandbox's metadata (never a key of the reserved prefix: ours,
/// and the ownership tenant).
pub fn caller_view(metadata: &Metadata) -> Metadata {
    metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("sandbox.") && !k.starts_with("sandbox_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The filter every lookup of this API's sandboxes starts from.
pub fn api_filter() -> Metadata {
    Metadata::from([(API.to_owned(), API_VALUE.to_owned())])
}

/// The tenant a sandbox's metadata names, when it is one of this API's.
pub fn tenant_of(metadata: &Metadata) -> Option<TenantId> {
    if metadata.get(API).map(String::as_str) != Some(API_VALUE) {
        return None;
    }
    TenantId::new(metadata.get(TENANT)?.parse().ok()?).ok()
}

/// Whether the sandbox may reach the internet, as its create asked.
pub fn internet_of(metadata: &Metadata) -> bool {
    metadata.get(INTERNET).map(String::as_str) != Some("false")
}

/// Whether the sandbox is paused, not killed, at its timeout.
pub fn pauses_on_timeout(metadata: &Metadata) -> bool {
    metadata.get(ON_TIMEOUT).map(String::as_str) == Some(ON_TIMEOUT_PAUSE)
}

/// Whether the sandbox's preview ports are open to any request (no traffic token needed).
pub fn public_of(metadata: &Metadata) -> bool {
    metadata.get(PUBLIC).map(String::as_str) != Some("false")
}

/// The create-time deadline a sandbox's metadata names.
pub fn deadline_of(metadata: &Metadata) -> Option<time::OffsetDateTime> {
    let secs: i64 = metadata.get(DEADLINE)?.parse().ok()?;
    time::OffsetDateTime::from_unix_timestamp(secs).ok()
}

/// Decodes the `metadata` query parameter of a list as the SDK encodes it: the query value
/// (already decoded once by the query parser) is a form string whose keys and values were
/// percent-encoded before the form was: unescape it whole, split it into `key=value` pairs on
/// `&`, and unescape each key and value once more. A piece that is not exactly one `=` pair,
/// or a bad escape, is refused.
pub fn decode_filter(value: &str) -> Result<Metadata, String> {
    let bad = || "Error parsing metadata: expected key=value pairs joined with &".to_owned();
    let whole = unescape(value).ok_or_else(bad)?;
    let mut out = Metadata::new();
    for piece in whole.split('&').filter(|p| !p.is_empty()) {
        let mut parts = piece.split('=');
        let (Some(k), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let key = unescape(k).ok_or_else(bad)?;
        let value = unescape(v).ok_or_else(bad)?;
        if out.len() >= MAX_PAIRS {
            return Err(format!("metadata filter has more than {MAX_PAIRS} pairs"));
        }
        out.insert(key, value);
    }
    Ok(out)
}

/// Query unescaping as Go's `url.QueryUnescape` does it: `%XX` is a byte, `+` a space; the
/// result must be UTF-8.
fn unescape(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_metadata_filter_decodes() {
        // What the SDK sent for {"user": "a b&c=d"}, after the query parser's own decoding.
        let got = decode_filter("user=a%2520b%2526c%253Dd").unwrap();
        assert_eq!(
            got,
            Metadata::from([("user".to_owned(), "a b&c=d".to_owned())])
        );
        let two = decode_filter("app%3Dx%26user%3Dy").unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two["app"], "x");
        assert_eq!(decode_filter("").unwrap(), Metadata::new());
        for bad in ["novalue", "a=b=c", "a=%zz", "a=%2", "a=%ff"] {
            assert!(decode_filter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reserved_and_malformed_keys_are_refused_by_name() {
        let ok = Metadata::from([("app".to_owned(), "x y".to_owned())]);
        assert!(check_caller_metadata(&ok).is_ok());
        for key in [
            "sandbox.api",
            "Sandbox_session_id",
            "SANDBOX",
            "sandbox_tenant_id",
        ] {
            let m = Metadata::from([(key.to_owned(), "1".to_owned())]);
            let e = check_caller_metadata(&m).unwrap_err();
            assert!(e.contains(key) && e.contains("reserved"), "{e}");
        }
        for key in ["", "a=b", "a b", "x\n"] {
            let m = Metadata::from([(key.to_owned(), "1".to_owned())]);
            assert!(check_caller_metadata(&m).is_err(), "{key:?}");
        }
        let m = Metadata::from([("k".to_owned(), "v\u{0}".to_owned())]);
        assert!(check_caller_metadata(&m).is_err());
        let many: Metadata = (0..=MAX_PAIRS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(check_caller_metadata(&many).is_err());
    }

    #[test]
    fn stamped_metadata_round_trips_and_callers_see_their_own() {
        let id = E2bId::generate().unwrap();
        let tenant = TenantId::new(3).unwrap();
        let caller = Metadata::from([("app".to_owned(), "x".to_owned())]);
        let all = stamped(&caller, &id, tenant, 1_800_000_000, "base");
        assert_eq!(tenant_of(&all), Some(tenant));
        assert_eq!(
            deadline_of(&all).map(|d| d.unix_timestamp()),
            Some(1_800_000_000)
        );
        assert_eq!(caller_view(&all), caller);
        assert_eq!(tenant_of(&caller), None, "not one of this API's");
        assert!(api_filter().iter().all(|(k, v)| all.get(k) == Some(v)));
    }
}

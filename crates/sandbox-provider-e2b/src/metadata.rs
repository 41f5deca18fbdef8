//! How the port's metadata is stored on E2B sandboxes, how states read, and which one pair of
//! a list filter the control plane is asked to match.
//!
//! - **Keys are escaped, reversibly.** E2B-compatible planes may reserve keys: this service's
//!   own E2B API refuses any key starting with `sandbox` (any case), which every ownership key
//!   of the session layer does (`sandbox_session_id`...). So a key starting with `sandbox`, or
//!   with the escape itself, travels as [`ESCAPE`] + key, and a stored key starting with
//!   [`ESCAPE`] reads back without it. Every other key travels as it is. The mapping is a
//!   bijection, so a filter on any key still matches exactly what was stored under it.
//! - **States**: `running` and `paused` are what the plane reports; the others a plane may
//!   report are read by family ([`state_of`]).
//! - **The server-side pair** ([`server_pair`]): a list asks the plane to match one pair, the
//!   most selective the filter has (session, tenant, provider, binding version, config, then
//!   the lexicographically smallest key), and only a pair whose key and value need no query
//!   escaping; the whole filter is applied locally afterwards, so the answer is exact either
//!   way.

use sandbox_core::binding::owner_metadata;
use sandbox_core::{Metadata, SandboxState};

/// The prefix of an escaped key.
pub const ESCAPE: &str = "sbx.";

/// The prefix planes may reserve, compared without case.
const RESERVED: &str = "sandbox";

fn needs_escape(key: &str) -> bool {
    key.starts_with(ESCAPE)
        || key
            .get(..RESERVED.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED))
}

/// The stored form of a key.
pub fn wire_key(key: &str) -> String {
    if needs_escape(key) {
        format!("{ESCAPE}{key}")
    } else {
        key.to_owned()
    }
}

/// The port's form of a stored key.
pub fn port_key(stored: &str) -> &str {
    stored.strip_prefix(ESCAPE).unwrap_or(stored)
}

/// The stored form of `metadata`.
pub fn to_wire(metadata: &Metadata) -> Metadata {
    metadata
        .iter()
        .map(|(k, v)| (wire_key(k), v.clone()))
        .collect()
}

/// The port's form of stored metadata.
pub fn from_wire(stored: &Metadata) -> Metadata {
    stored
        .iter()
        .map(|(k, v)| (port_key(k).to_owned(), v.clone()))
        .collect()
}

/// A state the plane reports, in the port's terms.
pub fn state_of(raw: &str) -> SandboxState {
    match raw.trim().to_ascii_lowercase().as_str() {
        "running" => SandboxState::Running,
        "paused" => SandboxState::Paused,
        "pending" | "creating" | "provisioning" | "starting" | "pausing" | "resuming" => {
            SandboxState::Transitioning
        }
        "killed" | "stopped" | "terminated" | "deleted" | "failed" | "error" => {
            SandboxState::Terminal
        }
        _ => SandboxState::Unknown,
    }
}

/// The plane's name of a state a list may filter on: only `running` and `paused` exist there.
pub fn wire_state(state: SandboxState) -> Option<&'static str> {
    match state {
        SandboxState::Running => Some("running"),
        SandboxState::Paused => Some("paused"),
        _ => None,
    }
}

/// Whether `text` travels in a query unchanged (what Go's `QueryEscape(x) == x` accepts).
fn query_safe(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
}

/// The one pair of `filter` (port keys) the plane is asked to match, in its stored form.
pub fn server_pair(filter: &Metadata) -> Option<(String, String)> {
    let priority = [
        owner_metadata::SESSION,
        owner_metadata::TENANT,
        owner_metadata::PROVIDER,
        owner_metadata::BINDING_VERSION,
        owner_metadata::CONFIG,
    ];
    let chosen = priority
        .iter()
        .find_map(|key| filter.get_key_value(*key))
        .or_else(|| filter.iter().next())?;
    let (key, value) = (wire_key(chosen.0), chosen.1.clone());
    (query_safe(&key) && query_safe(&value)).then_some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_reversibly() {
        for key in [
            "sandbox_session_id",
            "Sandbox.x",
            "SANDBOX",
            "sbx.already",
            "sbx.sbx.twice",
            "plain",
            "sbx",
            "sand",
            "",
        ] {
            let stored = wire_key(key);
            assert_eq!(port_key(&stored), key, "{key}");
            assert!(
                !stored
                    .get(..RESERVED.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED)),
                "{stored} would be refused"
            );
        }
        assert_eq!(wire_key("plain"), "plain");
        assert_eq!(wire_key("sandbox_tenant_id"), "sbx.sandbox_tenant_id");
        let m = Metadata::from([
            ("sandbox_session_id".to_owned(), "s".to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]);
        assert_eq!(from_wire(&to_wire(&m)), m);
    }

    #[test]
    fn states_read_by_family() {
        use SandboxState::*;
        for (raw, want) in [
            ("running", Running),
            ("PAUSED", Paused),
            ("resuming", Transitioning),
            ("pending", Transitioning),
            ("killed", Terminal),
            ("error", Terminal),
            ("weird", Unknown),
        ] {
            assert_eq!(state_of(raw), want, "{raw}");
        }
        assert_eq!(wire_state(Running), Some("running"));
        assert_eq!(wire_state(Terminal), None);
    }

    #[test]
    fn the_server_side_pair_is_the_most_selective_safe_one() {
        let mut f = Metadata::from([
            ("b".to_owned(), "1".to_owned()),
            ("a".to_owned(), "2".to_owned()),
            (owner_metadata::TENANT.to_owned(), "7".to_owned()),
            (owner_metadata::SESSION.to_owned(), "chat-1".to_owned()),
        ]);
        assert_eq!(
            server_pair(&f),
            Some(("sbx.sandbox_session_id".to_owned(), "chat-1".to_owned()))
        );
        f.remove(owner_metadata::SESSION);
        assert_eq!(
            server_pair(&f),
            Some(("sbx.sandbox_tenant_id".to_owned(), "7".to_owned()))
        );
        let plain = Metadata::from([
            ("b".to_owned(), "1".to_owned()),
            ("a".to_owned(), "2".to_owned()),
        ]);
        assert_eq!(server_pair(&plain), Some(("a".to_owned(), "2".to_owned())));
        // A pair that would need escaping is matched locally only.
        let unsafe_value = Metadata::from([("a".to_owned(), "x y&z".to_owned())]);
        assert_eq!(server_pair(&unsafe_value), None);
        assert_eq!(server_pair(&Metadata::new()), None);
    }
}

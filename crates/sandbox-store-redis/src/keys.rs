//! The key layout. Every key of one session shares one hash tag, `{<ns>:<tenant>:<session>}`,
//! so the session's multi-key scripts stay on one Redis Cluster slot:
//!
//! ```text
//! sandbox:session:{<ns>:<tenant>:<session>}:binding    the binding JSON (no expiry)
//! sandbox:session:{<ns>:<tenant>:<session>}:lock       the lifecycle lock token (lease)
//! sandbox:session:{<ns>:<tenant>:<session>}:turn       turn lease: hash refs, rebuild (TTL)
//! sandbox:session:{<ns>:<tenant>:<session>}:rewind     the rewind lock token (lease)
//! sandbox:session:{<ns>:<tenant>:<session>}:activity   background activities: hash id → lease
//! ```
//!
//! The E2B-API sandboxes' deadlines (`crate::deadlines`) are one sorted set per namespace, with
//! a hash tag of its own (one key, so one slot):
//!
//! ```text
//! sandbox:e2b:{<ns>}:deadlines                          member = E2B sandbox ID, score = ms
//! ```
//!
//! The namespace lets deployments share one Redis. Key parts never contain braces (a brace
//! would move the hash tag) or control characters: tenant IDs are numbers, session IDs are
//! validated by `sandbox-core`, and the namespace is validated here.

use sandbox_core::{BindingKey, Error, ErrorCode, Operation, SessionId, TenantId};

use crate::stored;

const ROOT: &str = "sandbox:session:";

/// A validated key namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace(String);

impl Namespace {
    /// Trims and validates `raw`: 1–64 characters; no braces (they would move the hash tag), no
    /// `:` (namespace `a` must never match the keys of namespace `a:7`, whose tag begins the
    /// same way), no whitespace or control characters.
    pub fn new(raw: &str) -> Result<Self, Error> {
        let ns = raw.trim();
        let bad = ns.is_empty()
            || ns.chars().count() > 64
            || ns
                .chars()
                .any(|c| matches!(c, '{' | '}' | ':') || c.is_control() || c.is_whitespace());
        if bad {
            return Err(stored(Error::invalid_request(
                Operation::VALIDATE,
                format!(
                    "redis namespace {:?} must be 1-64 characters without braces, colons, whitespace or control characters",
                    ns.chars().take(64).collect::<String>()
                ),
            ))
            .with_code(ErrorCode::ConfigIncomplete));
        }
        Ok(Namespace(ns.to_owned()))
    }

    /// The namespace text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The keys of one session.
#[derive(Debug, Clone)]
pub struct SessionKeys {
    pub binding: String,
    pub lock: String,
    pub turn: String,
    pub rewind: String,
    pub activity: String,
}

impl SessionKeys {
    /// The keys of `key` in `ns`. `BindingKey`'s parts are already validated (no braces, no
    /// control characters), which is what keeps the hash tag intact.
    pub fn new(ns: &Namespace, key: &BindingKey) -> Self {
        let base = format!("{ROOT}{{{}:{}:{}}}", ns.0, key.tenant, key.session);
        SessionKeys {
            binding: format!("{base}:binding"),
            lock: format!("{base}:lock"),
            turn: format!("{base}:turn"),
            rewind: format!("{base}:rewind"),
            activity: format!("{base}:activity"),
        }
    }
}

/// The sorted set of the E2B-API sandboxes' deadlines in `ns`. A namespace has no braces or
/// colons, so the tag `{<ns>}` is never a session's.
pub fn deadlines_key(ns: &Namespace) -> String {
    format!("sandbox:e2b:{{{}}}:deadlines", ns.0)
}

/// The prefix every binding key of `tenant` in `ns` starts with.
fn tenant_prefix(ns: &Namespace, tenant: TenantId) -> String {
    format!("{ROOT}{{{}:{tenant}:", ns.0)
}

/// The `SCAN MATCH` pattern of every binding key of `tenant`: the literal prefix with glob
/// metacharacters escaped, then `*}:binding`.
pub fn binding_pattern(ns: &Namespace, tenant: TenantId) -> String {
    let mut pattern = String::new();
    for c in tenant_prefix(ns, tenant).chars() {
        if matches!(c, '\\' | '*' | '?' | '[' | ']' | '^') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str("*}:binding");
    pattern
}

/// The session a scanned binding key names, when it is one of `tenant`'s in `ns` and a valid
/// session ID (anything else is skipped, never guessed at).
pub fn session_of(ns: &Namespace, tenant: TenantId, key: &str) -> Option<SessionId> {
    let rest = key.strip_prefix(&tenant_prefix(ns, tenant))?;
    let session = rest.strip_suffix("}:binding")?;
    SessionId::new(session).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_key_of_a_session_shares_one_hash_tag() {
        let ns = Namespace::new(" prod ").unwrap();
        let k = BindingKey::new(42, "chat-1").unwrap();
        let keys = SessionKeys::new(&ns, &k);
        for key in [
            &keys.binding,
            &keys.lock,
            &keys.turn,
            &keys.rewind,
            &keys.activity,
        ] {
            let tag = &key[key.find('{').unwrap()..=key.find('}').unwrap()];
            assert_eq!(tag, "{prod:42:chat-1}", "{key}");
        }
        assert_eq!(keys.binding, "sandbox:session:{prod:42:chat-1}:binding");
    }

    #[test]
    fn the_deadline_set_has_its_own_tag_in_the_namespace() {
        let ns = Namespace::new("prod").unwrap();
        assert_eq!(deadlines_key(&ns), "sandbox:e2b:{prod}:deadlines");
        // Not a binding key of any session, so no binding SCAN ever meets it.
        assert!(!deadlines_key(&ns).starts_with(ROOT));
    }

    #[test]
    fn namespaces_are_validated() {
        for bad in [
            "",
            "  ",
            "a{b",
            "a}b",
            "a:b",
            "a b",
            "a\nb",
            &"x".repeat(65),
        ] {
            assert!(Namespace::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Namespace::new("team-a.eu").unwrap().as_str(), "team-a.eu");
    }

    #[test]
    fn scan_patterns_escape_glob_characters_and_sessions_round_trip() {
        let ns = Namespace::new("a*b?[c]^\\").unwrap();
        let tenant = TenantId::new(7).unwrap();
        assert_eq!(
            binding_pattern(&ns, tenant),
            "sandbox:session:{a\\*b\\?\\[c\\]\\^\\\\:7:*}:binding"
        );
        let key = BindingKey::new(7, "s-1").unwrap();
        let stored = SessionKeys::new(&ns, &key).binding;
        assert_eq!(session_of(&ns, tenant, &stored), Some(key.session));
        assert_eq!(
            session_of(&ns, TenantId::new(8).unwrap(), &stored),
            None,
            "another tenant's prefix"
        );
        assert_eq!(
            session_of(&ns, tenant, "sandbox:session:{x:7:s}:lock"),
            None
        );
    }
}

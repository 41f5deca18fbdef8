//! Bearer API tokens mapped to tenants. Tokens are configured as SHA-256 digests, so the config
//! file (and a leaked copy of it) never holds a usable credential.

use sandbox_core::TenantId;
use sha2::{Digest, Sha256};

/// The token → tenant table.
#[derive(Clone, Default)]
pub struct TenantAuth {
    entries: Vec<([u8; 32], TenantId)>,
}

impl std::fmt::Debug for TenantAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Digests are not secrets, but there is nothing useful to print either.
        f.debug_struct("TenantAuth")
            .field("tenants", &self.entries.len())
            .finish()
    }
}

/// The SHA-256 digest of `token`.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Lower-case hex of a digest (what the config stores).
pub fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0_u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Equality that takes the same time whatever the inputs, so response timing does not reveal
/// how much of a guessed token's digest matched.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl TenantAuth {
    /// Builds the table from `(tenant, hex digest)` pairs; malformed digests are refused.
    pub fn new<'a>(entries: impl IntoIterator<Item = (u64, &'a str)>) -> Result<Self, String> {
        let mut out = Vec::new();
        for (tenant, hex) in entries {
            let digest = parse_hex(hex)
                .ok_or_else(|| format!("tenant {tenant}: token_sha256 is not 64 hex digits"))?;
            let tenant = TenantId::new(tenant).map_err(|e| e.to_string())?;
            out.push((digest, tenant));
        }
        Ok(TenantAuth { entries: out })
    }

    /// The tenant a bearer token belongs to. Every entry is compared, match or not.
    pub fn tenant_of(&self, token: &str) -> Option<TenantId> {
        let d = digest(token);
        let mut found = None;
        for (entry, tenant) in &self.entries {
            if constant_time_eq(entry, &d) && found.is_none() {
                found = Some(*tenant);
            }
        }
        found
    }

    /// Whether any tenant is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_tenants_by_digest() {
        let auth = TenantAuth::new([
            (1, hex(&digest("alpha")).as_str()),
            (2, hex(&digest("beta")).as_str()),
        ])
        .unwrap();
        assert_eq!(auth.tenant_of("alpha").unwrap().get(), 1);
        assert_eq!(auth.tenant_of("beta").unwrap().get(), 2);
        assert!(auth.tenant_of("gamma").is_none());
        assert!(auth.tenant_of("").is_none());
        assert!(TenantAuth::new([(1, "zz")]).is_err());
        assert!(TenantAuth::new([(0, hex(&digest("x")).as_str())]).is_err());
        assert!(!format!("{auth:?}").contains("alpha"));
    }
}

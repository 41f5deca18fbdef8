//! Sandbox IDs, the tokens derived from the server secret, and signed file URLs.
//!
//! - **IDs** are ours: `i` and 19 characters of `[a-z0-9]` from the OS CSPRNG (about 98 bits),
//!   so `<port>-<id>` is one DNS label and the edge-style `Host` routing works. A string of
//!   another shape names no sandbox and is refused before any lookup.
//! - **Envd access tokens** are derived, never stored: `ea1.<tenant>.<id>.<mac>`, the MAC an
//!   HMAC-SHA256 under the server secret of the tenant and the ID. A token proves by itself
//!   which tenant's sandbox it was issued for, so the router tells "not your sandbox" (404,
//!   as the control plane answers) from "a wrong token for this sandbox" (401), and every
//!   replica holding the secret accepts the tokens of every other.
//! - **Traffic tokens** (`et1.<tenant>.<id>.<mac>`, the MAC under its own purpose string, so
//!   neither token can stand for the other) open the preview ports of a sandbox created with
//!   public traffic closed (`e2b::preview`).
//! - **Signed URLs** (`download_url`/`upload_url`) use envd's formula: `v1_` and the unpadded
//!   standard base64 of the SHA-256 of `<path>:<read|write>:<user>:<access token>`, with
//!   `:<expiration>` when one is given. The agent checks the same formula for its own token;
//!   both are pinned by the same test vectors.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use sandbox_core::{Secret, TenantId};
use sha2::{Digest as _, Sha256};

/// The prefix of every sandbox ID.
const ID_PREFIX: char = 'i';
/// Random characters after the prefix.
const ID_RANDOM_LEN: usize = 19;
const ID_ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// An E2B sandbox ID of this service's shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct E2bId(String);

impl E2bId {
    /// A fresh random ID.
    pub fn generate() -> Result<Self, String> {
        let mut raw = [0_u8; ID_RANDOM_LEN];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness for a sandbox id: {e}"))?;
        let mut id = String::with_capacity(ID_RANDOM_LEN + 1);
        id.push(ID_PREFIX);
        // 256 is not a multiple of 36: the first 252 values map evenly and the rest are
        // redrawn, so no character is likelier than another.
        for mut byte in raw {
            while byte >= 252 {
                let mut one = [0_u8; 1];
                getrandom::fill(&mut one)
                    .map_err(|e| format!("no randomness for a sandbox id: {e}"))?;
                byte = one[0];
            }
            id.push(char::from(ID_ALPHABET[usize::from(byte % 36)]));
        }
        Ok(E2bId(id))
    }

    /// `text` as an ID, when it has this service's shape.
    pub fn parse(text: &str) -> Option<Self> {
        let mut chars = text.chars();
        let ok = chars.next() == Some(ID_PREFIX)
            && text.len() == ID_RANDOM_LEN + 1
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        ok.then(|| E2bId(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for E2bId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an access token was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaim {
    pub tenant: TenantId,
    pub id: E2bId,
}

/// The server secret and everything derived from it.
#[derive(Clone)]
pub struct Keys {
    secret: Secret,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys([redacted])")
    }
}

const ACCESS_PREFIX: &str = "ea1";
const TRAFFIC_PREFIX: &str = "et1";

impl Keys {
    pub fn new(secret: Secret) -> Self {
        Keys { secret }
    }

    fn mac(&self, purpose: &str, tenant: TenantId, id: &E2bId) -> String {
        let message = format!("{purpose}\0{}\0{}", tenant.get(), id.as_str());
        URL_SAFE_NO_PAD.encode(hmac_sha256(
            self.secret.expose().as_bytes(),
            message.as_bytes(),
        ))
    }

    fn token(&self, prefix: &str, tenant: TenantId, id: &E2bId) -> String {
        format!(
            "{prefix}.{}.{}.{}",
            tenant.get(),
            id.as_str(),
            self.mac(prefix, tenant, id)
        )
    }

    /// The envd access token of sandbox `id` of `tenant`.
    pub fn access_token(&self, tenant: TenantId, id: &E2bId) -> String {
        self.token(ACCESS_PREFIX, tenant, id)
    }

    /// The token for the sandbox's other ports when public traffic is closed.
    pub fn traffic_token(&self, tenant: TenantId, id: &E2bId) -> String {
        self.token(TRAFFIC_PREFIX, tenant, id)
    }

    /// Whether `presented` is sandbox `id`'s traffic token (compared in constant time).
    pub fn verify_traffic(&self, tenant: TenantId, id: &E2bId, presented: &str) -> bool {
        constant_time_eq(
            self.traffic_token(tenant, id).as_bytes(),
            presented.as_bytes(),
        )
    }

    /// What a presented access token was issued for, when this secret issued it.
    pub fn verify_access(&self, token: &str) -> Option<TokenClaim> {
        let mut parts = token.split('.');
        let (prefix, tenant, id, mac) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if prefix != ACCESS_PREFIX || parts.next().is_some() {
            return None;
        }
        let tenant = TenantId::new(tenant.parse().ok()?).ok()?;
        let id = E2bId::parse(id)?;
        let expected = self.mac(ACCESS_PREFIX, tenant, &id);
        constant_time_eq(expected.as_bytes(), mac.as_bytes()).then_some(TokenClaim { tenant, id })
    }
}

/// HMAC-SHA256 (RFC 2104) over the `sha2` the service already has.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0_u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// What a signed file URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    Read,
    Write,
}

/// envd's file URL signature (module docs).
pub fn file_signature(
    path: &str,
    operation: FileOperation,
    username: Option<&str>,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let op = match operation {
        FileOperation::Read => "read",
        FileOperation::Write => "write",
    };
    let mut text = format!("{path}:{op}:{}:{access_token}", username.unwrap_or(""));
    if let Some(exp) = expiration {
        text.push(':');
        text.push_str(&exp.to_string());
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(text.as_bytes()))
    )
}

/// Equality whose time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &str) -> Keys {
        Keys::new(Secret::new(secret))
    }

    #[test]
    fn ids_have_one_shape_and_fit_a_dns_label_with_a_port() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let id = E2bId::generate().unwrap();
            assert_eq!(E2bId::parse(id.as_str()), Some(id.clone()));
            assert!(format!("65535-{id}").len() <= 63);
            seen.insert(id);
        }
        assert_eq!(seen.len(), 2_000, "random ids do not repeat");
        for bad in [
            "",
            "i",
            "I0123456789abcdefghi",
            "x0123456789abcdefghi",
            "i0123456789abcdefgh",
            "i0123456789abcdefghij",
            "i0123456789abcdefgh-",
            "i0123456789abcdefgh\u{e9}",
            "../etc/passwd",
        ] {
            assert_eq!(E2bId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn access_tokens_prove_their_tenant_and_sandbox_under_one_secret_only() {
        let k = keys("s3cret-s3cret-s3cret-s3cret-s3cret");
        let tenant = TenantId::new(7).unwrap();
        let id = E2bId::generate().unwrap();
        let token = k.access_token(tenant, &id);
        assert_eq!(
            k.verify_access(&token),
            Some(TokenClaim {
                tenant,
                id: id.clone()
            })
        );
        // The same secret elsewhere (another replica) agrees; another secret does not.
        assert!(
            keys("s3cret-s3cret-s3cret-s3cret-s3cret")
                .verify_access(&token)
                .is_some()
        );
        assert!(
            keys("other-other-other-other-other-other")
                .verify_access(&token)
                .is_none()
        );
        // Changing the claimed tenant or sandbox breaks the MAC.
        let other = TenantId::new(8).unwrap();
        let forged = token.replacen(".7.", ".8.", 1);
        assert!(k.verify_access(&forged).is_none());
        let id2 = E2bId::generate().unwrap();
        let forged = token.replace(id.as_str(), id2.as_str());
        assert!(k.verify_access(&forged).is_none());
        assert_ne!(k.access_token(other, &id), token);
        // A traffic token is not an access token, nor the reverse: separate HMAC domains.
        let traffic = k.traffic_token(tenant, &id);
        assert!(traffic.starts_with("et1.7."), "{traffic}");
        assert!(k.verify_access(&traffic).is_none());
        assert!(k.verify_traffic(tenant, &id, &traffic));
        assert!(!k.verify_traffic(tenant, &id, &token));
        assert!(!k.verify_traffic(other, &id, &traffic));
        assert!(!k.verify_traffic(tenant, &id2, &traffic));
        assert!(!k.verify_traffic(tenant, &id, ""));
        assert_ne!(traffic.rsplit('.').next(), token.rsplit('.').next());
        for junk in [
            "",
            "ea1",
            "ea1.7",
            "ea1.7.x.y",
            &format!("{token}.x"),
            "ea1.0.i.x",
        ] {
            assert!(k.verify_access(junk).is_none(), "{junk:?}");
        }
        assert!(!format!("{k:?}").contains("s3cret"));
    }

    #[test]
    fn file_signatures_are_envds() {
        // The agent's test vectors (`sandbox-agent`'s `files::signature`): one formula.
        let token = "secret-token";
        assert_eq!(
            file_signature("/home/user/a.txt", FileOperation::Read, None, token, None),
            "v1_oG8MeWunkA0k+JA9ryHxVcTNtkXm7z9NuWgYBImd3sA"
        );
        assert_eq!(
            file_signature(
                "/home/user/a.txt",
                FileOperation::Write,
                Some("user"),
                token,
                Some(1_700_000_000)
            ),
            "v1_7nOg9iklgnGo60+IOnph3ANWcLzFQ0GGVg4+khaiKrM"
        );
    }
}

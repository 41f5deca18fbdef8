//! What an envd client needs to know: where envd is, who it speaks as, and its limits.

use std::fmt;
use std::time::Duration;

use hyper::Uri;
use sandbox_core::{Error, Operation, Provider, Secret};

use crate::transported;

const OP_CONFIG: Operation = Operation::new("configure");

/// envd's port inside a sandbox (`docs/envd.md`, "Addressing"), sent in the edge routing header.
pub const ENVD_PORT: u16 = 49983;

/// Which HTTP the client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpVersion {
    /// HTTP/1.1; under TLS, HTTP/2 when the connector negotiates it by ALPN.
    #[default]
    Http1,
    /// HTTP/2 without negotiation: h2c (prior knowledge) on a plain connection, many calls
    /// multiplexed on one connection.
    Http2,
}

/// The client's settings. Build with [`EnvdConfig::new`] and the `with_*` methods.
#[derive(Clone)]
pub struct EnvdConfig {
    pub(crate) base: Uri,
    pub(crate) access_token: Option<Secret>,
    pub(crate) user: Option<String>,
    pub(crate) sandbox_id: Option<String>,
    pub(crate) http: HttpVersion,
    pub(crate) unary_timeout: Option<Duration>,
    pub(crate) keepalive_interval: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_message_size: usize,
    pub(crate) provider: Option<Provider>,
}

impl fmt::Debug for EnvdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: say only whether there is one.
        f.debug_struct("EnvdConfig")
            .field("base", &self.base)
            .field(
                "access_token",
                &self.access_token.as_ref().map(|_| "<redacted>"),
            )
            .field("user", &self.user)
            .field("sandbox_id", &self.sandbox_id)
            .field("http", &self.http)
            .field("unary_timeout", &self.unary_timeout)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("idle_timeout", &self.idle_timeout)
            .field("max_message_size", &self.max_message_size)
            .finish()
    }
}

impl EnvdConfig {
    /// envd at `base` (`http://host:port` or `https://host`; no path, query or credentials).
    ///
    /// Defaults: HTTP/1.1, no token, envd's default user, unary calls bounded by 60 s (the
    /// SDK's default), streams unbounded unless a call sets a deadline, keepalive pings every
    /// 50 s (what the SDK asks for), a stream declared dead after 2.5 ping intervals of
    /// silence, messages up to 4 MiB.
    pub fn new(base: &str) -> Result<Self, Error> {
        let bad = |why: &str| {
            transported(Error::invalid_request(
                OP_CONFIG,
                format!("envd base url {base:?}: {why}"),
            ))
        };
        let uri: Uri = base.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("the scheme must be http or https")),
        }
        let Some(authority) = uri.authority() else {
            return Err(bad("no host"));
        };
        if authority.as_str().contains('@') {
            return Err(bad("credentials belong in the access token, not the URL"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("a path or query is not allowed"));
        }
        let base = Uri::builder()
            .scheme(uri.scheme_str().unwrap_or("http"))
            .authority(authority.as_str())
            .path_and_query("/")
            .build()
            .map_err(|_| bad("not a URL"))?;
        let keepalive_interval = Duration::from_secs(50);
        Ok(EnvdConfig {
            base,
            access_token: None,
            user: None,
            sandbox_id: None,
            http: HttpVersion::Http1,
            unary_timeout: Some(Duration::from_secs(60)),
            keepalive_interval,
            idle_timeout: keepalive_interval.mul_f32(2.5),
            max_message_size: sandbox_envd::envelope::DEFAULT_MAX_MESSAGE_SIZE,
            provider: None,
        })
    }

    /// Sends `token` as `X-Access-Token` on every request (an empty token sends none).
    pub fn with_access_token(mut self, token: Secret) -> Self {
        self.access_token = (!token.is_empty()).then_some(token);
        self
    }

    /// Runs RPCs and file transfers as the Unix `user` (otherwise envd's default user).
    pub fn with_user(mut self, user: impl Into<String>) -> Result<Self, Error> {
        let user = user.into();
        // The user goes into a header and a query parameter; a colon would end the Basic
        // credentials' user part early, control characters would corrupt the header.
        if user.is_empty() || user.contains(':') || user.chars().any(char::is_control) {
            return Err(transported(Error::invalid_request(
                OP_CONFIG,
                format!("envd user {user:?}: must be a non-empty name without ':' or controls"),
            )));
        }
        self.user = Some(user);
        Ok(self)
    }

    /// Adds the edge routing headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983`) that a
    /// shared envd host (`sandbox.<domain>`) routes by.
    pub fn with_sandbox_id(mut self, id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(transported(Error::invalid_request(
                OP_CONFIG,
                format!("sandbox id {id:?}: letters, digits and '-' only"),
            )));
        }
        self.sandbox_id = Some(id);
        Ok(self)
    }

    /// Which HTTP to speak.
    pub fn with_http(mut self, http: HttpVersion) -> Self {
        self.http = http;
        self
    }

    /// The deadline of a unary call that sets none (`None`: unbounded).
    pub fn with_unary_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.unary_timeout = timeout.filter(|t| !t.is_zero());
        self
    }

    /// How often envd should ping an idle stream, and how long a stream may stay silent
    /// before it is declared dead (at least the interval).
    pub fn with_keepalive(mut self, interval: Duration, idle_timeout: Duration) -> Self {
        // The header is whole seconds; below one second envd would read 0 and use its default.
        self.keepalive_interval = interval.max(Duration::from_secs(1));
        self.idle_timeout = idle_timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest message accepted (a larger one fails the call rather than being buffered).
    pub fn with_max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Tags every error with the provider this envd belongs to.
    pub fn with_provider(mut self, provider: Provider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The base URL (`scheme://authority/`).
    pub fn base(&self) -> &Uri {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let ok = EnvdConfig::new("http://127.0.0.1:49983").unwrap();
        assert_eq!(ok.base().to_string(), "http://127.0.0.1:49983/");
        assert!(EnvdConfig::new("https://49983-abc.e2b.app/").is_ok());
        for bad in [
            "ftp://h",
            "127.0.0.1:49983",
            "http://u:p@h",
            "http://h/x",
            "http://h/?a=b",
            "",
        ] {
            let err = EnvdConfig::new(bad).unwrap_err();
            assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn users_and_ids_are_checked_and_tokens_hidden() {
        let c = EnvdConfig::new("http://h").unwrap();
        assert!(c.clone().with_user("a:b").is_err());
        assert!(c.clone().with_user("a\nb").is_err());
        assert!(c.clone().with_sandbox_id("a.b").is_err());
        let c = c.with_access_token(Secret::new("hunter2"));
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}

//! Reaching the Docker engine: endpoint resolution and Engine API version negotiation.
//!
//! Negotiation probes the *unversioned* `GET /version`. A versioned probe cannot work across
//! engines: Debian's Engine 20.10 refuses `/v1.53/...` as too new, and Engine 29 refuses
//! anything below 1.44 as too old — which is exactly what the probe is trying to find out.
//! bollard's own `negotiate_version` probes a versioned path, so it fails against 20.10 when
//! started from bollard's default (1.53).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::{API_DEFAULT_VERSION, ClientVersion, Docker};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyperlocal::{UnixClientExt, UnixConnector};
use sandbox_core::{Error, ErrorKind, Operation};
use serde_json::Value;

use crate::errors::provider_error;

/// The last resort when neither the config nor `DOCKER_HOST` names an endpoint.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// The oldest Engine API this adapter supports (Engine 20.10, what Debian 12 ships).
pub const MIN_API_VERSION: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A local unix socket (absolute path).
    Unix(PathBuf),
    /// A TCP daemon (`tcp://`, `http://`, `https://`), always with TLS client certificates.
    Tcp {
        authority: String,
        tls_cert_path: PathBuf,
    },
}

const OP: Operation = Operation::new("docker_engine");

/// Resolves the endpoint: the config's host, else `DOCKER_HOST`, else the default socket.
///
/// Unix paths must be absolute (a relative one would depend on the service's working
/// directory). A TCP daemon accepts container creation, which is a root shell on its host, so
/// it requires TLS client certificates — and it is dialled through the SSRF-guarded connector
/// of `sandbox-transport`, which is not built yet, so it is refused with `unsupported` until
/// then rather than dialled unguarded.
pub fn resolve_endpoint(
    configured: Option<&str>,
    docker_host_env: Option<&str>,
    tls_cert_path: Option<&Path>,
) -> Result<Endpoint, Error> {
    let raw = configured
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .or_else(|| docker_host_env.map(str::trim).filter(|s| !s.is_empty()));
    let Some(raw) = raw else {
        return Ok(Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET)));
    };
    if let Some(path) = raw.strip_prefix("unix://") {
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(Error::invalid_request(
                Operation::VALIDATE,
                format!("docker host {raw:?}: a unix socket path must be absolute"),
            ));
        }
        return Ok(Endpoint::Unix(path));
    }
    let authority = ["tcp://", "http://", "https://"]
        .iter()
        .find_map(|scheme| raw.strip_prefix(scheme));
    let Some(authority) = authority.filter(|a| !a.is_empty()) else {
        return Err(Error::invalid_request(
            Operation::VALIDATE,
            format!("docker host {raw:?}: use unix:///absolute/path or tcp://host:port"),
        ));
    };
    let Some(tls) = tls_cert_path.filter(|p| !p.as_os_str().is_empty()) else {
        return Err(Error::invalid_request(
            Operation::VALIDATE,
            format!(
                "docker host {raw:?}: a TCP daemon accepts container creation (root on its host), so it \
                 requires TLS client certificates (tls_cert_path with ca.pem, cert.pem, key.pem)"
            ),
        ));
    };
    let endpoint = Endpoint::Tcp {
        authority: authority.trim_end_matches('/').to_owned(),
        tls_cert_path: tls.to_path_buf(),
    };
    Err(Error::unsupported(
        Operation::VALIDATE,
        format!(
            "docker host {raw:?}: tcp:// daemon endpoints are dialled only through the SSRF-guarded connector of \
             sandbox-transport, which is not supported yet; use a unix socket ({endpoint:?} was not dialled)"
        ),
    ))
}

/// What `GET /version` says about the engine's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineVersion {
    /// The engine release, e.g. `20.10.24+dfsg1`.
    pub version: String,
    /// The newest API version it speaks.
    pub api_version: String,
    /// The oldest API version it accepts (absent on very old engines).
    pub min_api_version: Option<String>,
}

impl EngineVersion {
    /// Reads the fields out of a `/version` answer.
    pub fn from_json(body: &[u8]) -> Result<Self, Error> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            provider_error(
                ErrorKind::Internal,
                OP,
                format!("unreadable /version answer: {e}"),
            )
        })?;
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
        let api_version = field("ApiVersion").ok_or_else(|| {
            provider_error(
                ErrorKind::Internal,
                OP,
                "the /version answer has no ApiVersion",
            )
        })?;
        Ok(EngineVersion {
            version: field("Version").unwrap_or_default(),
            api_version,
            min_api_version: field("MinAPIVersion"),
        })
    }
}

fn parse_api(raw: &str) -> Option<ClientVersion> {
    let (major, minor) = raw.trim().split_once('.')?;
    Some(ClientVersion {
        major_version: major.parse().ok()?,
        minor_version: minor.parse().ok()?,
    })
}

fn show(v: &ClientVersion) -> String {
    format!("{}.{}", v.major_version, v.minor_version)
}

/// The API version to speak: the newest both sides know, refusing engines outside the range.
pub fn choose_api_version(engine: &EngineVersion) -> Result<ClientVersion, Error> {
    let ours = *API_DEFAULT_VERSION;
    let server = parse_api(&engine.api_version).ok_or_else(|| {
        provider_error(
            ErrorKind::Internal,
            OP,
            format!("unparsable engine ApiVersion {:?}", engine.api_version),
        )
    })?;
    let chosen = if server < ours { server } else { ours };
    if chosen < MIN_API_VERSION {
        return Err(provider_error(
            ErrorKind::Unsupported,
            OP,
            format!(
                "Docker engine {} speaks API {}, older than the oldest supported ({})",
                engine.version,
                show(&server),
                show(&MIN_API_VERSION)
            ),
        ));
    }
    if let Some(min) = engine.min_api_version.as_deref().and_then(parse_api)
        && chosen < min
    {
        return Err(provider_error(
            ErrorKind::Unsupported,
            OP,
            format!(
                "Docker engine {} requires API {} or newer; this build speaks up to {}",
                engine.version,
                show(&min),
                show(&ours)
            ),
        ));
    }
    Ok(chosen)
}

/// Asks the engine behind `socket` for its version (unversioned path, bounded body).
pub async fn probe_version(socket: &Path, timeout: Duration) -> Result<EngineVersion, Error> {
    if !socket.exists() {
        return Err(provider_error(
            ErrorKind::Unavailable,
            OP,
            format!(
                "the Docker socket {} does not exist (is dockerd running?)",
                socket.display()
            ),
        ));
    }
    let client: Client<UnixConnector, Empty<Bytes>> = Client::unix();
    let uri: hyper::Uri = hyperlocal::Uri::new(socket, "/version").into();
    let request = async {
        let response = client.get(uri).await.map_err(|e| {
            provider_error(
                ErrorKind::Unavailable,
                OP,
                format!("cannot reach the Docker engine: {e}"),
            )
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), 1 << 20)
            .collect()
            .await
            .map_err(|e| {
                provider_error(ErrorKind::Unavailable, OP, format!("reading /version: {e}"))
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(Error::from_http_status(
                sandbox_core::Provider::Docker,
                OP,
                status.as_u16(),
                format!("GET /version answered {status}"),
            ));
        }
        EngineVersion::from_json(&body)
    };
    tokio::time::timeout(timeout, request).await.map_err(|_| {
        provider_error(
            ErrorKind::Timeout,
            OP,
            "the Docker engine did not answer /version in time",
        )
    })?
}

/// Connects to the engine at `endpoint`, speaking the negotiated API version.
pub async fn connect(
    endpoint: &Endpoint,
    rpc_timeout: Duration,
) -> Result<(Docker, EngineVersion), Error> {
    let Endpoint::Unix(socket) = endpoint else {
        return Err(Error::unsupported(
            OP,
            "tcp:// daemon endpoints are not supported yet",
        ));
    };
    let version = probe_version(socket, rpc_timeout).await?;
    let api = choose_api_version(&version)?;
    let path = socket
        .to_str()
        .ok_or_else(|| Error::invalid_request(OP, "the socket path is not UTF-8"))?;
    let docker = Docker::connect_with_unix(path, rpc_timeout.as_secs().max(1), &api)
        .map_err(|e| crate::errors::map(OP, e))?;
    Ok((docker, version))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET /version` answers recorded from (or shaped exactly like) real engines.
    const ENGINE_20_10: &str = r#"{"Platform":{"Name":""},"Version":"20.10.24+dfsg1","ApiVersion":"1.41","MinAPIVersion":"1.12","Os":"linux","Arch":"amd64"}"#;
    const ENGINE_24: &str = r#"{"Version":"24.0.7","ApiVersion":"1.43","MinAPIVersion":"1.12"}"#;
    const ENGINE_27: &str = r#"{"Version":"27.3.1","ApiVersion":"1.47","MinAPIVersion":"1.24"}"#;
    const ENGINE_29: &str = r#"{"Version":"29.0.0","ApiVersion":"1.52","MinAPIVersion":"1.44"}"#;
    const ENGINE_FUTURE: &str =
        r#"{"Version":"31.0.0","ApiVersion":"1.57","MinAPIVersion":"1.44"}"#;
    const ENGINE_TOO_NEW: &str =
        r#"{"Version":"40.0.0","ApiVersion":"1.70","MinAPIVersion":"1.60"}"#;
    const ENGINE_19_03: &str =
        r#"{"Version":"19.03.15","ApiVersion":"1.40","MinAPIVersion":"1.12"}"#;

    fn chosen(json: &str) -> Result<String, Error> {
        choose_api_version(&EngineVersion::from_json(json.as_bytes()).unwrap()).map(|v| show(&v))
    }

    #[test]
    fn negotiation_on_recorded_answers() {
        assert_eq!(chosen(ENGINE_20_10).unwrap(), "1.41");
        assert_eq!(chosen(ENGINE_24).unwrap(), "1.43");
        assert_eq!(chosen(ENGINE_27).unwrap(), "1.47");
        assert_eq!(chosen(ENGINE_29).unwrap(), "1.52");
        assert_eq!(chosen(ENGINE_FUTURE).unwrap(), show(API_DEFAULT_VERSION));
        let err = chosen(ENGINE_TOO_NEW).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("requires API 1.60"), "{err}");
        let err = chosen(ENGINE_19_03).unwrap_err();
        assert!(
            err.to_string().contains("older than the oldest supported"),
            "{err}"
        );
        assert!(EngineVersion::from_json(b"{}").is_err());
        assert!(EngineVersion::from_json(b"not json").is_err());
    }

    #[test]
    fn endpoint_resolution() {
        assert_eq!(
            resolve_endpoint(None, None, None).unwrap(),
            Endpoint::Unix(PathBuf::from(DEFAULT_SOCKET))
        );
        assert_eq!(
            resolve_endpoint(None, Some("unix:///run/user/1000/docker.sock"), None).unwrap(),
            Endpoint::Unix(PathBuf::from("/run/user/1000/docker.sock"))
        );
        assert_eq!(
            resolve_endpoint(Some("unix:///a.sock"), Some("unix:///b.sock"), None).unwrap(),
            Endpoint::Unix(PathBuf::from("/a.sock")),
            "the config wins over DOCKER_HOST"
        );
        let err = resolve_endpoint(Some("unix://relative.sock"), None, None).unwrap_err();
        assert!(err.to_string().contains("must be absolute"), "{err}");
        let err = resolve_endpoint(Some("tcp://10.0.0.5:2375"), None, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(
            err.to_string().contains("requires TLS client certificates"),
            "{err}"
        );
        let err = resolve_endpoint(
            Some("tcp://10.0.0.5:2376"),
            None,
            Some(Path::new("/etc/docker/certs")),
        )
        .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("not supported yet"), "{err}");
        for bad in [
            "ssh://host",
            "npipe:////./pipe/docker",
            "tcp://",
            "/var/run/docker.sock",
        ] {
            assert!(resolve_endpoint(Some(bad), None, None).is_err(), "{bad}");
        }
    }
}

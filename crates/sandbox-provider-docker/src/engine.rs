//! Reaching the Docker engine: endpoint resolution, the connection (a unix socket, or a TCP
//! daemon over mutual TLS) and Engine API version negotiation.
//!
//! Negotiation probes the *unversioned* `GET /version`. A versioned probe cannot work across
//! engines: Debian's Engine 20.10 refuses `/v1.53/...` as too new, and Engine 29 refuses
//! anything below 1.44 as too old — which is exactly what the probe is trying to find out.
//! bollard's own `negotiate_version` probes a versioned path, so it fails against 20.10 when
//! started from bollard's default (1.53).
//!
//! A TCP daemon accepts container creation, which is a root shell on its host, so it is spoken
//! to only as `docker --tlsverify` does: HTTPS trusting nothing but the CA in `tls_cert_path`,
//! with the client certificate there. Every connection to it is dialled through
//! `sandbox-transport`'s guarded connector ([`daemon_policy`]), so a daemon name that resolves
//! (or is rebound) to a link-local or cloud-metadata address is refused before a socket is
//! opened. bollard's own TLS transport dials whatever the name resolves to and trusts the
//! system roots besides the CA, so the adapter hands bollard a client of its own
//! ([`Docker::connect_with_custom_transport`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::{API_DEFAULT_VERSION, BollardRequest, ClientVersion, Docker};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::{Body, Bytes};
use hyper::{Request, Uri};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::Connect;
use hyper_util::rt::TokioExecutor;
use hyperlocal::{UnixClientExt, UnixConnector};
use sandbox_core::{Error, ErrorCode, ErrorKind, Operation};
use sandbox_transport::{
    Dial, GuardedConnector, OutboundPolicy, Resolve, SystemResolver, TcpDialer,
    tls_client_auth_config,
};
use serde_json::Value;

use crate::errors::{connection_failure, provider_error};

/// The last resort when neither the config nor `DOCKER_HOST` names an endpoint.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// The port of a TCP daemon whose endpoint names none (Docker's TLS port).
pub const DEFAULT_TLS_PORT: u16 = 2376;

/// The files `tls_cert_path` must hold, named as `docker --tlsverify` names them.
pub const TLS_FILES: [&str; 3] = ["ca.pem", "cert.pem", "key.pem"];

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
    /// A TCP daemon, always over TLS with client certificates.
    Tcp(TcpEndpoint),
}

/// A TCP daemon: where it listens and the TLS material that authenticates both sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEndpoint {
    /// As in a URL: a name, an IPv4 literal or a bracketed IPv6 literal.
    pub host: String,
    pub port: u16,
    /// Directory with `ca.pem`, `cert.pem` and `key.pem` ([`TLS_FILES`]).
    pub tls_cert_path: PathBuf,
}

impl TcpEndpoint {
    /// `host:port`.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

impl Endpoint {
    /// Whether the daemon certainly runs on this host: a unix socket, or TCP to `localhost` or
    /// a loopback literal. Bridge networking needs it, since its egress rules are iptables
    /// chains installed where the adapter runs.
    pub fn is_on_this_host(&self) -> bool {
        match self {
            Endpoint::Unix(_) => true,
            Endpoint::Tcp(tcp) => {
                let host = tcp.host.trim_start_matches('[').trim_end_matches(']');
                host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| sandbox_transport::policy::unmap(ip).is_loopback())
            }
        }
    }
}

const OP: Operation = Operation::new("connect_engine");

/// Resolves the endpoint: the config's host, else `DOCKER_HOST`, else the default socket.
///
/// Unix paths must be absolute (a relative one would depend on the service's working
/// directory). A TCP daemon (`tcp://`, `http://` or `https://host[:port]`, port
/// [`DEFAULT_TLS_PORT`] when absent) requires TLS client certificates: the scheme only says
/// "TCP", the connection is always TLS.
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
    let invalid = |why: &str| {
        Error::invalid_request(Operation::VALIDATE, format!("docker host {raw:?}: {why}"))
    };
    if let Some(path) = raw.strip_prefix("unix://") {
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(invalid("a unix socket path must be absolute"));
        }
        return Ok(Endpoint::Unix(path));
    }
    let authority = ["tcp://", "http://", "https://"]
        .iter()
        .find_map(|scheme| raw.strip_prefix(scheme));
    let Some(authority) = authority.map(|a| a.strip_suffix('/').unwrap_or(a)) else {
        return Err(invalid("use unix:///absolute/path or tcp://host:port"));
    };
    let (host, port) = split_authority(authority)
        .ok_or_else(|| invalid("a TCP daemon is tcp://host[:port], with no path or user"))?;
    let Some(tls) = tls_cert_path.filter(|p| !p.as_os_str().is_empty()) else {
        return Err(invalid(
            "a TCP daemon accepts container creation (root on its host), so it requires TLS \
             client certificates (tls_cert_path with ca.pem, cert.pem, key.pem)",
        ));
    };
    Ok(Endpoint::Tcp(TcpEndpoint {
        host,
        port,
        tls_cert_path: tls.to_path_buf(),
    }))
}

/// `host[:port]` with a bracketed IPv6 literal allowed; anything a URL would read as more than
/// an authority (a path, a query, user information) is refused rather than guessed at.
///
/// The host comes back in its WHATWG form (`0xa9.0xfe.0xa9.0xfe` is `169.254.169.254`, names
/// are lowercased): what bollard's URLs and the guard make of it anyway, so the probe, the TLS
/// server name and every later request agree on one host.
fn split_authority(authority: &str) -> Option<(String, u16)> {
    if authority.is_empty()
        || authority
            .chars()
            .any(|c| matches!(c, '/' | '?' | '#' | '@' | '\\') || c.is_whitespace())
    {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let close = authority.find(']')?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => DEFAULT_TLS_PORT,
        Some(p) => p.parse().ok().filter(|p| *p != 0)?,
    };
    let host = url::Host::parse(host).ok()?.to_string();
    // The same check hyper makes of the URIs the requests will carry.
    format!("https://{host}:{port}/").parse::<Uri>().ok()?;
    Some((host, port))
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
    let uri: Uri = hyperlocal::Uri::new(socket, "/version").into();
    probe(&client, get_version(uri, Empty::new())?, timeout).await
}

fn get_version<B>(uri: Uri, body: B) -> Result<Request<B>, Error> {
    Request::get(uri)
        .body(body)
        .map_err(|e| provider_error(ErrorKind::Internal, OP, format!("GET /version: {e}")))
}

/// Sends the `/version` request on `client`, within `timeout`, reading at most 1 MiB.
async fn probe<C, B>(
    client: &Client<C, B>,
    request: Request<B>,
    timeout: Duration,
) -> Result<EngineVersion, Error>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let request = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| connection_failure(OP, e))?;
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

/// What a TCP daemon may be: private, loopback and CGNAT addresses are allowed (the endpoint
/// is the operator's own, usually on a private network), and the guard refuses link-local,
/// cloud-metadata and reserved addresses whatever this says.
pub fn daemon_policy() -> OutboundPolicy {
    OutboundPolicy::allow_private()
}

/// How a TCP daemon is reached: name resolution and TCP, both behind the guard (injectable so
/// the guard's verdicts are tested without DNS and without sockets).
#[derive(Debug, Clone)]
pub struct Dialing {
    pub resolver: Arc<dyn Resolve>,
    pub dialer: Arc<dyn Dial>,
}

impl Dialing {
    /// The system resolver and real TCP, each attempt bounded by `connect_timeout`.
    pub fn system(connect_timeout: Duration) -> Self {
        Dialing {
            resolver: Arc::new(SystemResolver),
            dialer: Arc::new(TcpDialer { connect_timeout }),
        }
    }
}

/// Connects to the engine at `endpoint`, speaking the negotiated API version.
pub async fn connect(
    endpoint: &Endpoint,
    rpc_timeout: Duration,
) -> Result<(Docker, EngineVersion), Error> {
    connect_with(endpoint, rpc_timeout, Dialing::system(rpc_timeout)).await
}

/// [`connect`], with a TCP daemon reached through `dialing` (a unix socket ignores it).
pub async fn connect_with(
    endpoint: &Endpoint,
    rpc_timeout: Duration,
    dialing: Dialing,
) -> Result<(Docker, EngineVersion), Error> {
    match endpoint {
        Endpoint::Unix(socket) => connect_unix(socket, rpc_timeout).await,
        Endpoint::Tcp(tcp) => connect_tcp(tcp, rpc_timeout, dialing).await,
    }
}

/// bollard's timeout is whole seconds.
fn timeout_secs(rpc_timeout: Duration) -> u64 {
    rpc_timeout.as_secs().max(1)
}

async fn connect_unix(
    socket: &Path,
    rpc_timeout: Duration,
) -> Result<(Docker, EngineVersion), Error> {
    let version = probe_version(socket, rpc_timeout).await?;
    let api = choose_api_version(&version)?;
    let path = socket
        .to_str()
        .ok_or_else(|| Error::invalid_request(OP, "the socket path is not UTF-8"))?;
    let docker = Docker::connect_with_unix(path, timeout_secs(rpc_timeout), &api)
        .map_err(|e| crate::errors::map(OP, e))?;
    Ok((docker, version))
}

async fn connect_tcp(
    tcp: &TcpEndpoint,
    rpc_timeout: Duration,
    dialing: Dialing,
) -> Result<(Docker, EngineVersion), Error> {
    let tls = read_tls_material(&tcp.tls_cert_path).await?;
    let guard = GuardedConnector::with(daemon_policy(), dialing.resolver, dialing.dialer);
    // HTTPS only: a daemon that answers in plain HTTP is refused, never spoken to.
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(guard);
    let mut builder = Client::builder(TokioExecutor::new());
    // No idle connections, as bollard's own transports: a connection the daemon closed while
    // idle would fail the next request (a create included) instead of a new one.
    builder.pool_max_idle_per_host(0);
    let client = builder.build(https.clone());
    let base = format!("https://{}", tcp.authority());
    let uri = format!("{base}/version")
        .parse::<Uri>()
        .map_err(|e| Error::invalid_request(OP, format!("docker host {base}: {e}")))?;
    let request = get_version(uri.clone(), bollard::body_full(Bytes::new()))?;
    let probed = match probe(&client, request, rpc_timeout).await {
        Err(e) if e.kind() == ErrorKind::Unavailable && connected(&e) => {
            match tls_refusal(https, uri).await {
                Some(refused) => Err(refused),
                None => Err(e),
            }
        }
        other => other,
    };
    let version = probed.map_err(|e| {
        // The guard names the address it refused; the operator needs the endpoint too.
        if e.code() == Some(ErrorCode::UnsafeOutboundUrl) {
            let message = format!("docker host {}: {}", tcp.authority(), e.message());
            provider_error(e.kind(), OP, message).with_code(ErrorCode::UnsafeOutboundUrl)
        } else {
            e
        }
    })?;
    let api = choose_api_version(&version)?;
    // bollard builds absolute `https://host:port/v1.xx/...` URIs from this address, which is
    // what the client needs; the same client carries the exec and attach upgrades.
    let transport = move |request: BollardRequest| {
        let client = client.clone();
        async move { client.request(request).await.map_err(BollardError::from) }
    };
    let docker = Docker::connect_with_custom_transport(
        transport,
        Some(base),
        timeout_secs(rpc_timeout),
        &api,
    )
    .map_err(|e| crate::errors::map(OP, e))?;
    Ok((docker, version))
}

/// Whether a failed probe got as far as a connection (and its handshake): a refused or
/// unreachable address is not worth a second dial.
fn connected(error: &Error) -> bool {
    use std::error::Error as _;
    error
        .source()
        .and_then(|s| s.downcast_ref::<hyper_util::client::legacy::Error>())
        .is_some_and(|e| !e.is_connect())
}

/// How long the diagnosis of a failed TLS probe waits for the daemon's refusal.
const TLS_DIAGNOSIS: Duration = Duration::from_secs(2);

/// The daemon's refusal of the client certificate, when that is why the probe failed.
///
/// Under TLS 1.3 the client's side of the handshake is over before the daemon has judged the
/// client's certificate, so a refusal arrives as an alert *after* the connection was handed to
/// the HTTP client, which then reports nothing but a request canceled on a closed connection.
/// Which of the two the client sees is a race. So a probe that failed on an unusable
/// connection makes one more handshake and a single bounded read on it: a daemon that refuses
/// the certificate answers with its alert at once, and one that accepts it sends nothing (it
/// waits for a request) until the bound, which leaves the first error standing.
async fn tls_refusal<C>(mut https: C, uri: Uri) -> Option<Error>
where
    C: tower_service::Service<Uri>,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use tokio::io::AsyncReadExt as _;
    let authentication = |e: Error| (e.kind() == ErrorKind::Authentication).then_some(e);
    let connect = async {
        std::future::poll_fn(|cx| https.poll_ready(cx)).await?;
        https.call(uri).await
    };
    let stream = match tokio::time::timeout(TLS_DIAGNOSIS, connect).await {
        Ok(Ok(stream)) => stream,
        // An io::Error carries the boxed cause where `connection_failure` looks for TLS errors.
        Ok(Err(e)) => return authentication(connection_failure(OP, std::io::Error::other(e))),
        Err(_) => return None,
    };
    let mut io = hyper_util::rt::TokioIo::new(stream);
    let mut byte = [0u8; 1];
    match tokio::time::timeout(TLS_DIAGNOSIS, io.read(&mut byte)).await {
        Ok(Err(e)) => authentication(connection_failure(OP, e)),
        _ => None,
    }
}

/// The client TLS settings from `dir`'s `ca.pem`, `cert.pem` and `key.pem`.
async fn read_tls_material(dir: &Path) -> Result<rustls::ClientConfig, Error> {
    let invalid = |why: String| {
        Error::invalid_request(
            Operation::VALIDATE,
            format!("docker TLS material in {}: {why}", dir.display()),
        )
    };
    let mut pems = Vec::with_capacity(TLS_FILES.len());
    for name in TLS_FILES {
        let path = dir.join(name);
        let pem = tokio::fs::read(&path).await.map_err(|e| {
            invalid(format!(
                "cannot read {name} ({e}); tls_cert_path must hold ca.pem, cert.pem and key.pem"
            ))
        })?;
        pems.push(pem);
    }
    tls_client_auth_config(&pems[0], &pems[1], &pems[2]).map_err(|e| invalid(e.message().into()))
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
        let certs = Some(Path::new("/etc/docker/certs"));
        let tcp = |host: &str, port| {
            Endpoint::Tcp(TcpEndpoint {
                host: host.to_owned(),
                port,
                tls_cert_path: PathBuf::from("/etc/docker/certs"),
            })
        };
        for (raw, want) in [
            ("tcp://10.0.0.5:2376", tcp("10.0.0.5", 2376)),
            (
                "https://docker.internal:12376/",
                tcp("docker.internal", 12376),
            ),
            (
                "http://docker.internal",
                tcp("docker.internal", DEFAULT_TLS_PORT),
            ),
            ("tcp://[fd00::5]:2376", tcp("[fd00::5]", 2376)),
            ("tcp://[fd00::5]", tcp("[fd00::5]", DEFAULT_TLS_PORT)),
            // One canonical host for the probe, the TLS name, bollard's URLs and the guard.
            ("tcp://Docker.Internal:2376", tcp("docker.internal", 2376)),
            (
                "tcp://0xa9.0xfe.0xa9.0xfe:2376",
                tcp("169.254.169.254", 2376),
            ),
            (
                "tcp://[::FFFF:169.254.169.254]",
                tcp("[::ffff:a9fe:a9fe]", 2376),
            ),
        ] {
            assert_eq!(
                resolve_endpoint(Some(raw), None, certs).unwrap(),
                want,
                "{raw}"
            );
        }
        assert_eq!(
            resolve_endpoint(None, Some("tcp://10.0.0.5:2376"), certs).unwrap(),
            tcp("10.0.0.5", 2376),
            "DOCKER_HOST names a TCP daemon too"
        );
        for bad in [
            "tcp://",
            "tcp://:2376",
            "tcp://host:",
            "tcp://host:0",
            "tcp://host:65536",
            "tcp://host:2376/api",
            "tcp://user@host:2376",
            "tcp://host:2376?x=1",
            "tcp://fd00::5:2376",
            "tcp://[fd00::5:2376",
            "tcp://[fd00::5]2376",
            "tcp://ho st:2376",
        ] {
            let err = resolve_endpoint(Some(bad), None, certs).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad}");
            assert!(
                err.to_string().contains("tcp://host[:port]"),
                "{bad}: {err}"
            );
        }
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

//! The envd router: requests addressed to a sandbox, relayed to its agent.
//!
//! - **Addressing.** `E2b-Sandbox-Id` with `E2b-Sandbox-Port` (both, the port decimal), as
//!   the SDKs send when `E2B_SANDBOX_URL` points here; else a `Host` of
//!   `<port>-<sandboxID>.<domain>` (the edge's form). Any other request is the control plane's.
//! - **Authorisation**, before anything is read or relayed: the sandbox's access token in
//!   `X-Access-Token`, or, for `GET`/`POST /files` only, a signed URL (`signature`, optional
//!   `signature_expiration`) made with that token; `GET /health` needs neither, as envd's.
//!   A token of another tenant's sandbox gets 404, as every control-plane route answers for
//!   a sandbox that is not the caller's; a wrong token for the addressed sandbox gets 401.
//! - **What is relayed.** The request without the routing and credential headers and without
//!   the signature parameters, to port 49983, over the [`EnvdPlane`](super::EnvdPlane),
//!   bodies streamed both ways. Any other port is a preview port (`super::preview`), with
//!   its own authorisation. A client that goes away
//!   mid-stream drops the relayed stream, which the agent takes as a disconnect, never as a
//!   kill (envd's semantics).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ids::{E2bId, FileOperation, constant_time_eq, file_signature};
use super::{ApiError, E2bApi, Inner, Located};

/// envd's port inside a sandbox.
pub const ENVD_PORT: u16 = 49983;

pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// The query parameters of a signed file URL, which the router consumes.
const SIGNATURE_PARAMS: [&str; 2] = ["signature", "signature_expiration"];

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Control,
    Sandbox { id: String, port: u16 },
    Bad(String),
}

pub(crate) fn route_of(domain: &str, headers: &HeaderMap) -> Route {
    let id = headers.get(SANDBOX_ID_HEADER);
    let port = headers.get(SANDBOX_PORT_HEADER);
    if id.is_some() || port.is_some() {
        let (Some(id), Some(port)) = (id, port) else {
            return Route::Bad(format!(
                "{SANDBOX_ID_HEADER} and {SANDBOX_PORT_HEADER} go together"
            ));
        };
        let Some(port) = port.to_str().ok().and_then(|p| p.trim().parse().ok()) else {
            return Route::Bad(format!("{SANDBOX_PORT_HEADER} is not a port number"));
        };
        let Ok(id) = id.to_str() else {
            return Route::Bad(format!("{SANDBOX_ID_HEADER} is not text"));
        };
        return Route::Sandbox {
            id: id.trim().to_owned(),
            port,
        };
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return Route::Control;
    };
    let host = host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    });
    let Some(label) = host
        .strip_suffix(domain)
        .and_then(|rest| rest.strip_suffix('.'))
    else {
        return Route::Control;
    };
    match label.split_once('-') {
        Some((port, id)) if !label.contains('.') => match port.parse() {
            Ok(port) => Route::Sandbox {
                id: id.to_owned(),
                port,
            },
            Err(_) => Route::Control,
        },
        _ => Route::Control,
    }
}

/// The layer in front of the control plane: a request addressed to a sandbox is relayed.
pub(crate) async fn dispatch(State(api): State<E2bApi>, request: Request, next: Next) -> Response {
    match route_of(&api.inner.settings.domain, request.headers()) {
        Route::Control => next.run(request).await,
        Route::Bad(message) => ApiError::bad_request(message).into_response(),
        Route::Sandbox { id, port } => relay(&api.inner, &id, port, request)
            .await
            .unwrap_or_else(IntoResponse::into_response),
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    )
}

/// The answer for a sandbox that does not exist or is not the caller's. `GET /health` says
/// 502, which the SDKs read as "not running"; everything else says 404.
fn absent(id: &str, health: bool) -> ApiError {
    let mut e = ApiError::sandbox_not_found(id);
    if health {
        e.status = StatusCode::BAD_GATEWAY;
    }
    e
}

async fn relay(inner: &Inner, id: &str, port: u16, request: Request) -> Result<Response, ApiError> {
    let health = request.method() == Method::GET && request.uri().path() == "/health";
    let e2b_id = E2bId::parse(id).ok_or_else(|| absent(id, health))?;
    if port != ENVD_PORT {
        // Preview ports have their own authorisation (the traffic token), not envd's.
        return super::preview::relay(inner, &e2b_id, port, request).await;
    }
    let asked = Asked {
        method: request.method().clone(),
        uri: request.uri().clone(),
        token: request
            .headers()
            .get(ACCESS_TOKEN_HEADER)
            .map(|t| t.to_str().unwrap_or("").trim().to_owned()),
    };
    let located = authorise(inner, &e2b_id, &asked, health).await?;
    let request = strip(request)?;
    Ok(inner.envd.forward(&located.sandbox, request).await)
}

/// What authorisation reads of a request (the body stays where it is).
struct Asked {
    method: Method,
    uri: Uri,
    /// `X-Access-Token`, when sent (an unreadable one as empty, which matches nothing).
    token: Option<String>,
}

/// Checks the request may reach sandbox `id`, and where that sandbox lives.
async fn authorise(
    inner: &Inner,
    id: &E2bId,
    request: &Asked,
    health: bool,
) -> Result<Located, ApiError> {
    let locate = || async {
        inner
            .locate(id)
            .await
            .map_err(ApiError::from_core)?
            .ok_or_else(|| absent(id.as_str(), health))
    };
    if let Some(sent) = &request.token {
        let claim = inner.keys.verify_access(sent).ok_or_else(unauthorized)?;
        // A genuine token, of whichever sandbox: an absent sandbox is absent either way.
        let located = locate().await?;
        if located.tenant != claim.tenant {
            return Err(absent(id.as_str(), health));
        }
        if claim.id != *id {
            return Err(unauthorized());
        }
        return Ok(located);
    }
    if health {
        return locate().await;
    }
    let path = request.uri.path();
    let operation = match request.method {
        Method::GET if path == "/files" => FileOperation::Read,
        Method::POST if path == "/files" => FileOperation::Write,
        _ => return Err(unauthorized()),
    };
    let query = FilesQuery::parse(request.uri.query().unwrap_or(""));
    let Some(signature) = &query.signature else {
        return Err(unauthorized());
    };
    let located = locate().await?;
    let token = inner.keys.access_token(located.tenant, id);
    let expected = file_signature(
        query.path.as_deref().unwrap_or(""),
        operation,
        query.username.as_deref(),
        &token,
        query.expiration,
    );
    if !constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid signature"));
    }
    if let Some(exp) = query.expiration
        && exp < time::OffsetDateTime::now_utc().unix_timestamp()
    {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "signature is already expired",
        ));
    }
    Ok(located)
}

/// What the router reads of a `/files` query.
#[derive(Debug, Default)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    expiration: Option<i64>,
}

impl FilesQuery {
    fn parse(query: &str) -> Self {
        let mut out = FilesQuery::default();
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "path" => out.path = Some(v.into_owned()),
                "username" => out.username = Some(v.into_owned()),
                "signature" => out.signature = Some(v.into_owned()),
                // An expiration that is not a number signs as nothing the service made.
                "signature_expiration" => out.expiration = Some(v.parse().unwrap_or(i64::MIN)),
                _ => {}
            }
        }
        out
    }
}

/// The request as relayed: without the routing and credential headers, and without the
/// signature parameters (the rest of the query exactly as sent).
fn strip(mut request: Request) -> Result<Request<Body>, ApiError> {
    for name in [
        ACCESS_TOKEN_HEADER,
        SANDBOX_ID_HEADER,
        SANDBOX_PORT_HEADER,
        TRAFFIC_TOKEN_HEADER,
    ] {
        request.headers_mut().remove(name);
    }
    if let Some(query) = request.uri().query() {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|piece| {
                let key = piece.split('=').next().unwrap_or("");
                !SIGNATURE_PARAMS.contains(&key)
            })
            .collect();
        let path = request.uri().path();
        let rebuilt = if kept.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", kept.join("&"))
        };
        *request.uri_mut() = rebuilt
            .parse::<Uri>()
            .map_err(|e| ApiError::bad_request(format!("the request target is not valid: {e}")))?;
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn requests_are_routed_by_header_then_host() {
        let d = "localhost";
        assert_eq!(
            route_of(
                d,
                &headers(&[("e2b-sandbox-id", "iabc"), ("e2b-sandbox-port", "49983")])
            ),
            Route::Sandbox {
                id: "iabc".into(),
                port: 49983
            }
        );
        assert!(matches!(
            route_of(d, &headers(&[("e2b-sandbox-id", "iabc")])),
            Route::Bad(_)
        ));
        assert!(matches!(
            route_of(
                d,
                &headers(&[("e2b-sandbox-id", "i"), ("e2b-sandbox-port", "x")])
            ),
            Route::Bad(_)
        ));
        assert_eq!(
            route_of(d, &headers(&[("host", "8080-iabc.localhost:3000")])),
            Route::Sandbox {
                id: "iabc".into(),
                port: 8080
            }
        );
        for control in [
            "localhost:3000",
            "127.0.0.1:3000",
            "api.localhost",
            "a.8080-iabc.localhost",
            "8080-iabc.localhostx",
            "x-iabc.localhost",
        ] {
            assert_eq!(
                route_of(d, &headers(&[("host", control)])),
                Route::Control,
                "{control}"
            );
        }
        assert_eq!(route_of(d, &HeaderMap::new()), Route::Control);
    }

    #[test]
    fn credentials_and_signature_parameters_are_not_relayed() {
        let request = Request::builder()
            .uri("/files?path=%2Fa%20b&signature=v1_x&username=user&signature_expiration=9")
            .header("x-access-token", "t")
            .header("e2b-sandbox-id", "i")
            .header("e2b-sandbox-port", "49983")
            .header("e2b-traffic-access-token", "u")
            .header("authorization", "Basic dXNlcjo=")
            .body(Body::empty())
            .unwrap();
        let out = strip(request).unwrap();
        assert_eq!(out.uri().to_string(), "/files?path=%2Fa%20b&username=user");
        for gone in [
            "x-access-token",
            "e2b-sandbox-id",
            "e2b-sandbox-port",
            "e2b-traffic-access-token",
        ] {
            assert!(out.headers().get(gone).is_none(), "{gone}");
        }
        assert!(
            out.headers().get("authorization").is_some(),
            "picks the user"
        );
        let plain = strip(
            Request::builder()
                .uri("/files?signature=s")
                .body(Body::empty())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(plain.uri().to_string(), "/files");
    }

    #[test]
    fn a_files_query_is_read_as_envd_reads_it() {
        let q = FilesQuery::parse(
            "path=%2Fhome%2Fuser%2Fa+b&username=user&signature=v1_x&signature_expiration=12",
        );
        assert_eq!(q.path.as_deref(), Some("/home/user/a b"));
        assert_eq!(q.username.as_deref(), Some("user"));
        assert_eq!(q.signature.as_deref(), Some("v1_x"));
        assert_eq!(q.expiration, Some(12));
        assert_eq!(
            FilesQuery::parse("signature_expiration=soon").expiration,
            Some(i64::MIN)
        );
    }
}

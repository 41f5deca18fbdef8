//! Routing and authentication (the order is in the module docs of `server`).

use std::sync::Arc;

use base64::Engine as _;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method as HttpMethod, Request, Response, StatusCode};
use sandbox_envd::{Code, ConnectError, Method, filesystem, method_by_path, process};

use super::Agent;
use super::services::{CallContext, FilesContext};
use crate::connect::{self, Body, RequestStream, ResponseStream};
use crate::log;
use crate::users::User;

/// envd's answer to a missing or wrong access token, word for word (SDKs show it).
pub const UNAUTHORIZED_MESSAGE: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

const HEADER_ACCESS_TOKEN: &str = "x-access-token";

pub(super) async fn route(agent: Arc<Agent>, request: Request<Body>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let token_ok = token_matches(agent.token.as_deref(), request.headers());
    let exempt = (method == HttpMethod::GET && (path == "/health" || path == "/files"))
        || (method == HttpMethod::POST && path == "/files");
    if !token_ok && !exempt {
        return connect::http_error(StatusCode::UNAUTHORIZED, UNAUTHORIZED_MESSAGE);
    }
    match path.as_str() {
        "/health" => {
            if method != HttpMethod::GET {
                return not_allowed(&method, &path, "GET");
            }
            let mut response = Response::new(connect::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        super::version::VERSION_PATH => super::version::answer(&method),
        "/files" => {
            if method != HttpMethod::GET && method != HttpMethod::POST {
                return not_allowed(&method, &path, "GET, POST");
            }
            match agent.services.files.clone() {
                Some(files) => {
                    let ctx = FilesContext {
                        token_ok,
                        access_token: agent.token.clone(),
                        config: Arc::clone(&agent.config),
                    };
                    files.handle(ctx, request).await
                }
                None => connect::http_error(
                    StatusCode::NOT_IMPLEMENTED,
                    "the /files endpoints are not built into this agent yet",
                ),
            }
        }
        _ => match method_by_path(&path) {
            Some(rpc) if method == HttpMethod::POST => call(agent, rpc, request).await,
            Some(_) => not_allowed(&method, &path, "POST"),
            None => {
                let error = ConnectError::new(Code::Unimplemented, format!("no method at {path}"));
                let mut response = connect::unary_error(&error);
                *response.status_mut() = StatusCode::NOT_FOUND;
                response
            }
        },
    }
}

fn not_allowed(method: &HttpMethod, path: &str, allow: &'static str) -> Response<Body> {
    let error = ConnectError::new(
        Code::Unimplemented,
        format!("method {method} is not allowed on {path}; use {allow}"),
    );
    let mut response = connect::unary_error(&error);
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// Whether the request may pass the token check: no token configured, or the right one sent.
fn token_matches(token: Option<&str>, headers: &HeaderMap) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(sent) = headers.get(HEADER_ACCESS_TOKEN) else {
        return false;
    };
    constant_time_eq(sent.as_bytes(), token.as_bytes())
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The user part of `Authorization: Basic base64("<user>:<password>")`. A header that is not
/// Basic, or not decodable, names nobody (as envd reads it: the default user then applies).
fn basic_user(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(credentials.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, _password) = text.split_once(':')?;
    Some(user.to_owned())
}

fn resolve_user(agent: &Agent, headers: &HeaderMap) -> Result<User, ConnectError> {
    let accounts = &agent.config.accounts;
    let (name, requested) = match basic_user(headers) {
        Some(name) => (name, true),
        None => (agent.config.default_user.clone(), false),
    };
    let refused = || {
        let what = if requested {
            "username"
        } else {
            "default user"
        };
        ConnectError::new(Code::Unauthenticated, format!("invalid {what}: '{name}'"))
    };
    match accounts.user_by_name(&name) {
        Ok(Some(user)) => Ok(user),
        Ok(None) => Err(refused()),
        Err(e) => {
            log::warning!(agent.config.log, "looking up user '{name}': {e}");
            Err(refused())
        }
    }
}

async fn call(agent: Arc<Agent>, method: Method, request: Request<Body>) -> Response<Body> {
    if let Err(response) = connect::check_headers(method, request.headers()) {
        return response;
    }
    let (parts, body) = request.into_parts();
    let user = match resolve_user(&agent, &parts.headers) {
        Ok(user) => user,
        Err(e) => return connect::error_for(method, e),
    };
    let timeout = match connect::timeout(&parts.headers) {
        Ok(t) => t,
        Err(e) => return connect::error_for(method, e),
    };
    let ctx = CallContext {
        user,
        timeout,
        keepalive: connect::keepalive_interval(&parts.headers),
        headers: parts.headers,
        config: Arc::clone(&agent.config),
    };
    match method.service {
        process::SERVICE => {
            let process = agent.process.clone();
            drop(agent);
            process.call(ctx, method, body).await
        }
        filesystem::SERVICE => filesystem_call(agent, ctx, method, body).await,
        _ => connect::error_for(
            method,
            ConnectError::new(
                Code::Unimplemented,
                format!("{} is not served", method.path),
            ),
        ),
    }
}

async fn filesystem_call(
    agent: Arc<Agent>,
    ctx: CallContext,
    method: Method,
    body: Body,
) -> Response<Body> {
    let Some(service) = agent.services.filesystem.clone() else {
        return connect::error_for(
            method,
            ConnectError::new(
                Code::Unimplemented,
                "the filesystem service is not built into this agent yet",
            ),
        );
    };
    let limit = agent.config.max_message_bytes;
    if method.server_streams() {
        let request = match RequestStream::new(body, limit).single_payload().await {
            Ok(request) => request,
            Err(e) => return connect::stream_error(e),
        };
        let (out, response) = ResponseStream::open();
        tokio::spawn(async move { service.server_stream(ctx, method, request, out).await });
        return response;
    }
    let request = match connect::read_bounded(body, limit).await {
        Ok(bytes) => bytes,
        Err(e) => return connect::unary_error(&e),
    };
    match service.unary(ctx, method, request).await {
        Ok(answer) => connect::unary_json(answer),
        Err(e) => connect::unary_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_name_the_user() {
        let check = |value: &'static str, want: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
            assert_eq!(basic_user(&h).as_deref(), want, "{value}");
        };
        check("Basic cm9vdDo=", Some("root"));
        check("basic dXNlcjpwYXNz", Some("user"));
        check("Bearer cm9vdDo=", None);
        check("Basic !!!", None);
        // No colon: not Basic credentials at all.
        check("Basic cm9vdA==", None);
        assert_eq!(basic_user(&HeaderMap::new()), None);
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        let mut h = HeaderMap::new();
        assert!(token_matches(None, &h));
        assert!(!token_matches(Some("t"), &h));
        h.insert(HEADER_ACCESS_TOKEN, HeaderValue::from_static("t"));
        assert!(token_matches(Some("t"), &h));
    }
}

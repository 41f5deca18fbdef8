//! The agent's own endpoints, under [`PREFIX`]; envd has nothing there, so a plain envd client
//! never meets them. The router sends every path under the prefix here after the access-token
//! check (they all need the token when one is configured).
//!
//! - `GET /sandbox-agent/version`: `{"agent": "<crate version>", "envd": "<ENVD_VERSION>"}`.
//! - `/sandbox-agent/tunnel/<port>`: [`crate::tunnel`].
//! - `GET /sandbox-agent/processes`: the live and recently ended processes
//!   ([`crate::process::Listing`]).

use std::sync::Arc;

use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use sandbox_envd::{Code, ConnectError};
use serde::Serialize;

use crate::connect::{self, Body};
use crate::server::Agent;
use crate::tunnel;
use crate::version::ENVD_VERSION;

/// Where the extensions live.
pub const PREFIX: &str = "/sandbox-agent/";

/// The answer of `GET /sandbox-agent/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    /// The agent's crate version.
    pub agent: &'static str,
    /// The envd version the agent reports ([`crate::version`]).
    pub envd: &'static str,
}

/// What this build reports.
pub const VERSION_INFO: VersionInfo = VersionInfo {
    agent: env!("CARGO_PKG_VERSION"),
    envd: ENVD_VERSION,
};

/// Answers a request whose path starts with [`PREFIX`].
pub async fn route(agent: Arc<Agent>, request: Request<Body>) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let rest = path.strip_prefix(PREFIX).unwrap_or_default();
    if rest == "version" {
        if request.method() != Method::GET {
            return not_allowed(request.method(), &path, "GET");
        }
        return connect::unary_ok(&VERSION_INFO);
    }
    if rest == "processes" {
        if request.method() != Method::GET {
            return not_allowed(request.method(), &path, "GET");
        }
        return connect::unary_ok(&agent.process().listing());
    }
    if let Some(port) = rest.strip_prefix("tunnel/") {
        let own_port = Some(agent.config().listen.port());
        return tunnel::handle(agent.tunnels(), own_port, port, request).await;
    }
    let error = ConnectError::new(Code::Unimplemented, format!("no extension at {path}"));
    let mut response = connect::unary_error(&error);
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

fn not_allowed(method: &Method, path: &str, allow: &'static str) -> Response<Body> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_answer_names_both_versions() {
        let json = serde_json::to_value(VERSION_INFO).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"agent": env!("CARGO_PKG_VERSION"), "envd": ENVD_VERSION})
        );
    }
}

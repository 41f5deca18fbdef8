//! `GET /sandbox-agent/version`: which agent answers, so the service refuses an agent built
//! from another version than its own (every workspace crate shares one version).
//!
//! An agent extension, under the `/sandbox-agent/` prefix plain envd clients never use; like
//! every path but envd's exempt ones, it needs the access token when one is configured.

use hyper::{Method as HttpMethod, Response, StatusCode};
use serde::Serialize;

use crate::connect::{self, Body};

/// The path of the version endpoint.
pub const VERSION_PATH: &str = "/sandbox-agent/version";

/// The answer's body.
#[derive(Debug, Serialize)]
struct Version {
    agent: &'static str,
}

/// The answer to `method` on [`VERSION_PATH`].
pub(super) fn answer(method: &HttpMethod) -> Response<Body> {
    if method != HttpMethod::GET {
        let mut response = connect::http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {method} is not allowed on {VERSION_PATH}; use GET"),
        );
        response.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET"),
        );
        return response;
    }
    let body = Version {
        agent: env!("CARGO_PKG_VERSION"),
    };
    match serde_json::to_vec(&body) {
        Ok(bytes) => {
            let mut response = Response::new(connect::full(bytes));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => connect::http_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

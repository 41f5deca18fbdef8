//! envd's plain HTTP file endpoints, `GET /files` (download) and `POST /files` (upload), as
//! hyper-1 handler functions generic over the request body. Both stream: a download is read
//! from disk chunk by chunk as the client takes it, an upload is written to disk as it
//! arrives, and neither ever holds a whole file in memory.
//!
//! The calls the router makes (`ctx` is one [`FilesContext`] shared by every request):
//!
//! ```text
//! GET  /files   files::get_files(request, &ctx).await  -> hyper::Response<files::FilesBody>
//! POST /files   files::post_files(request, &ctx).await -> hyper::Response<files::FilesBody>
//! ```
//!
//! with `request: hyper::Request<B>` for any `B: hyper::body::Body<Data = Bytes> + Send`
//! (`hyper::body::Incoming` in the server, test bodies in tests). Every outcome, success or
//! error, is a response: errors are `{"code": <status>, "message": "..."}` with
//! `Content-Type: application/json; charset=utf-8`, as envd answers them.
//!
//! Authorization is the handlers' own, as in envd: when [`FilesContext::access_token`] is set,
//! a request passes with the right `X-Access-Token` header or with a valid signed-URL
//! signature ([`check_signature`]), else it is a 401. So the server's generic token check must
//! let `GET /files` and `POST /files` through to these handlers.
//!
//! The user is the query's `username`, else [`FilesContext::default_user`]; an unknown user is
//! 401. Paths resolve as for the filesystem service ([`crate::fs::path::resolve`]).

mod body;
mod download;
mod mime;
mod query;
mod signature;
mod upload;

use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};

pub use self::signature::{FileOperation, SignatureError, check_signature, sign};
use crate::fs::reserved::{Refusal, Reserved};
use crate::users::{AccountFiles, User};

/// The body of every `/files` answer.
pub type FilesBody = BoxBody<Bytes, std::io::Error>;

/// Default for [`FilesLimits::max_upload_bytes`].
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// The header an access token travels in.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// The prefix of the request headers that carry a file's metadata.
pub const METADATA_HEADER_PREFIX: &str = "x-metadata-";

/// The bounds of the file endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilesLimits {
    /// The most bytes one upload may write, counted after decompression, over all its files
    /// (more is 413).
    pub max_upload_bytes: u64,
}

impl Default for FilesLimits {
    fn default() -> Self {
        FilesLimits {
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
        }
    }
}

/// What the file endpoints need to know about the agent.
#[derive(Debug, Clone)]
pub struct FilesContext {
    /// Where users come from.
    pub accounts: AccountFiles,
    /// The user of a request without `username`; without one such a request is a 400.
    pub default_user: Option<String>,
    /// Where an empty path points; the user's home without one.
    pub default_workdir: Option<PathBuf>,
    /// The envd access token, when the agent has one.
    pub access_token: Option<String>,
    pub limits: FilesLimits,
    /// Trees neither endpoint reads or writes, judged where a path resolves (403).
    pub reserved: Reserved,
}

/// A failed request: its status and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilesError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl FilesError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        FilesError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// A path in a reserved tree is 403; one whose real path cannot be read back, 500.
    pub(crate) fn refused(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Reserved(m) => Self::new(StatusCode::FORBIDDEN, m),
            Refusal::Unknown(m) => Self::internal(m),
        }
    }

    /// envd's error answer.
    pub(crate) fn into_response(self) -> Response<FilesBody> {
        let body = sandbox_envd::files::HttpError {
            code: self.status.as_u16(),
            message: self.message,
        };
        let mut text = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
        text.push(b'\n');
        let mut response = Response::new(body::full(text));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        response
    }
}

/// `GET /files`: the file's bytes (see the module docs).
///
/// 200 with the content (`Content-Type` by extension, `Content-Disposition: inline`), gzip
/// when the client accepts it and asks for no range, one byte range (206) when asked for;
/// 400 for a directory or anything but a regular file (a FIFO or a device is never read);
/// 401; 403 for a path in a reserved tree, judged where it resolves
/// ([`crate::fs::reserved`]); 404 `path '<p>' does not exist`; 406 when no acceptable encoding is left; 416 for a
/// range outside the file.
pub async fn get_files<B>(request: Request<B>, ctx: &FilesContext) -> Response<FilesBody> {
    match download::get(request.headers(), request.uri(), ctx).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// `POST /files`: writes the body's files (see the module docs).
///
/// `multipart/form-data` (one file per part named `file`, its target the query's `path`,
/// else the part's `filename`; two parts for one path are a 400) or
/// `application/octet-stream` (one file at the query's `path`), either optionally
/// `Content-Encoding: gzip`. Missing parents are created, an existing file is overwritten, and
/// what is created belongs to the user. `X-Metadata-<key>: <value>` headers replace the
/// files' metadata. 200 with `[{"path","name","type":"file","metadata"?}]`, one entry per
/// file; 400, 401, 403 for a target in a reserved tree (judged where it would land, and again
/// on the opened file before it is changed), 413 over [`FilesLimits::max_upload_bytes`], 507 when the disk is full.
pub async fn post_files<B>(request: Request<B>, ctx: &FilesContext) -> Response<FilesBody>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    match upload::post(request, ctx).await {
        Ok(written) => {
            let mut text = serde_json::to_vec(&written).unwrap_or_else(|_| b"[]".to_vec());
            text.push(b'\n');
            let mut response = Response::new(body::full(text));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => e.into_response(),
    }
}

/// The checks both endpoints make before touching the disk: authorization, then the user.
fn authorize_and_resolve_user(
    headers: &hyper::HeaderMap,
    query: &query::FilesQuery,
    operation: FileOperation,
    ctx: &FilesContext,
) -> Result<User, FilesError> {
    if let Some(token) = &ctx.access_token {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        signature::authorize(headers, query, operation, token, now)
            .map_err(|e| FilesError::new(StatusCode::UNAUTHORIZED, e.to_string()))?;
    }
    let name = match (&query.username, &ctx.default_user) {
        (Some(name), _) | (None, Some(name)) => name.clone(),
        (None, None) => return Err(FilesError::bad_request("username not provided")),
    };
    match ctx.accounts.user_by_name(&name) {
        Ok(Some(user)) => Ok(user),
        Ok(None) => Err(FilesError::new(
            StatusCode::UNAUTHORIZED,
            format!("error looking up user '{name}': unknown user"),
        )),
        Err(e) => Err(FilesError::internal(format!(
            "error looking up user '{name}': {e}"
        ))),
    }
}

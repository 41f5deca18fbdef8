//! envd's plain HTTP file endpoints (`GET /files`, `POST /files`; `docs/envd.md`, "HTTP
//! endpoints"): the query parameter names, the upload answer and the error body. The transfer
//! itself is raw bytes (download) or `multipart/form-data` (upload), which are HTTP matters for
//! the client and the server to handle.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The path of both file endpoints.
pub const PATH: &str = "/files";
/// Query parameter: the file's path (absolute, `~/…`, or relative to the user's home).
pub const QUERY_PATH: &str = "path";
/// Query parameter: the Unix user whose home and permissions apply.
pub const QUERY_USERNAME: &str = "username";
/// The name of each multipart part that carries a file.
pub const MULTIPART_FIELD: &str = "file";

/// One written file, as `POST /files` reports it (the answer is a JSON array of these).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteInfo {
    /// The absolute path written.
    pub path: String,
    /// The base name.
    pub name: String,
    /// `file` (envd writes files only; `directory` is reserved).
    #[serde(rename = "type")]
    pub kind: String,
    /// The metadata stored with the file (`X-Metadata-*` headers), when any was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// envd's HTTP error body (`{"code": 404, "message": "..."}`): the status again and a text.
/// The RPC paths answer Connect errors instead; [`crate::ConnectError::from_unary_response`]
/// reads both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpError {
    /// The HTTP status.
    pub code: u16,
    /// What went wrong.
    pub message: String,
}

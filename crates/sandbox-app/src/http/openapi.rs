//! The OpenAPI 3.1 document (`GET /v1/openapi.json`), built from [`ROUTES`]: ONE table of every
//! route the router serves — method, path, summary, auth, request body, and each documented
//! status with the error codes it can carry. The table is the single source of truth: a unit
//! test checks it against the router's registrations, and `tests/http_properties.rs` checks
//! that every answer of every route is a status (and error code) the table lists.

use axum::Json;
use serde_json::{Map, Value, json};

/// An HTTP method of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
    Patch,
}

impl Method {
    /// The upper-case method name (`GET`).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
        }
    }
    /// The lower-case key of an OpenAPI path item (`get`).
    pub fn key(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Put => "put",
            Method::Delete => "delete",
            Method::Patch => "patch",
        }
    }
}

/// One media type of a body, with the name of its schema in `components.schemas` (or none).
#[derive(Debug, Clone, Copy)]
pub struct Content {
    pub media: &'static str,
    pub schema: Option<&'static str>,
}

/// A request body.
#[derive(Debug, Clone, Copy)]
pub struct RequestBody {
    pub required: bool,
    pub description: &'static str,
    pub content: &'static [Content],
}

/// A query parameter (path parameters come from the `{name}` segments of the path).
#[derive(Debug, Clone, Copy)]
pub struct QueryParam {
    pub name: &'static str,
    /// JSON Schema type: `string`, `boolean`, `integer`.
    pub kind: &'static str,
    pub required: bool,
    pub description: &'static str,
}

/// One documented response. A response with `codes` carries the error shape
/// `{"error":{"code","message"}}` with one of those codes.
#[derive(Debug, Clone, Copy)]
pub struct ResponseDoc {
    pub status: u16,
    pub description: &'static str,
    pub content: &'static [Content],
    pub codes: &'static [&'static str],
}

impl ResponseDoc {
    /// Whether the body is the error shape.
    pub fn is_error(&self) -> bool {
        !self.codes.is_empty()
    }
}

/// One route of the API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: Method,
    /// The axum path (`{name}` parameters, also OpenAPI's syntax).
    pub path: &'static str,
    pub operation_id: &'static str,
    pub summary: &'static str,
    /// Whether a bearer token is required.
    pub auth: bool,
    pub query: &'static [QueryParam],
    pub request: Option<RequestBody>,
    pub responses: &'static [ResponseDoc],
}

impl Route {
    /// The documented response of `status`.
    pub fn response(&self, status: u16) -> Option<&ResponseDoc> {
        self.responses.iter().find(|r| r.status == status)
    }
    /// The path's `{name}` parameters.
    pub fn path_params(&self) -> impl Iterator<Item = &'static str> {
        self.path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }
}

// ---- building blocks --------------------------------------------------------------------------

const JSON: &str = "application/json";

const fn err(
    status: u16,
    description: &'static str,
    codes: &'static [&'static str],
) -> ResponseDoc {
    ResponseDoc {
        status,
        description,
        content: &[Content {
            media: JSON,
            schema: Some("Error"),
        }],
        codes,
    }
}

const fn ok(status: u16, description: &'static str, content: &'static [Content]) -> ResponseDoc {
    ResponseDoc {
        status,
        description,
        content,
        codes: &[],
    }
}

const JSON_BODY: &[Content] = &[Content {
    media: JSON,
    schema: None,
}];

macro_rules! schema {
    ($name:literal) => {
        &[Content {
            media: JSON,
            schema: Some($name),
        }]
    };
}

const E401: ResponseDoc = err(401, "Missing or unknown bearer token", &["unauthorized"]);
const E413: ResponseDoc = err(
    413,
    "The request body exceeds the JSON body limit",
    &["payload_too_large"],
);
const E429: ResponseDoc = err(
    429,
    "The backend is out of capacity, or one of the tenant's quotas is spent (the message names the limit; nothing was created)",
    &["capacity", "quota_exceeded"],
);
const E408: ResponseDoc = err(
    408,
    "The request body stalled, or was not complete within the body deadline",
    &["body_timeout"],
);
const E500: ResponseDoc = err(
    500,
    "An internal error (or a stored binding that fails validation)",
    &["internal", "invalid_binding"],
);
const E501: ResponseDoc = err(501, "The backend cannot do this", &["unsupported"]);
const E502: ResponseDoc = err(
    502,
    "The backend refused the service's credentials",
    &["provider_authentication"],
);
const E503: ResponseDoc = err(
    503,
    "The backend or the binding store is unavailable, the backend is not enabled, or the service holds its limit of in-flight request bodies (`server_busy`, with `Retry-After`)",
    &[
        "server_busy",
        "provider_unavailable",
        "store_unavailable",
        "backend_disabled",
        "egress_protection_unavailable",
        "lock_ownership_lost",
    ],
);
const E504: ResponseDoc = err(
    504,
    "The backend or the binding store timed out",
    &["provider_timeout", "store_timeout"],
);
const E404_SESSION: ResponseDoc = err(
    404,
    "The session was deleted, or its sandbox is gone or was not found",
    &[
        "session_deleted",
        "not_found",
        "sandbox_gone",
        "no_live_sandbox",
    ],
);
const E409: ResponseDoc = err(
    409,
    "The session's sandbox is paused, or the operation conflicts with its state",
    &["conflict", "session_sandbox_paused"],
);

const PATH_PARAM: QueryParam = QueryParam {
    name: "path",
    kind: "string",
    required: true,
    description: "Absolute, normalized sandbox path (relative, `..` or missing: 400 `invalid_path`)",
};
const OCTETS: &[Content] = &[Content {
    media: "application/octet-stream",
    schema: None,
}];
const FILE_400: &[&str] = &[
    "invalid_session",
    "invalid_query",
    "invalid_path",
    "invalid_request",
];
const PROVISION_FILE_400: &[&str] = &[
    "invalid_session",
    "invalid_query",
    "invalid_path",
    "invalid_request",
    "image_not_present",
];
const DOWNLOAD_400: &[&str] = &[
    "invalid_session",
    "invalid_query",
    "invalid_path",
    "invalid_request",
    "not_a_regular_file",
    "file_too_large",
];
const UPLOAD_400: &[&str] = &[
    "invalid_session",
    "invalid_query",
    "invalid_path",
    "invalid_body",
    "invalid_request",
    "image_not_present",
];
const UPLOAD_413: ResponseDoc = err(
    413,
    "The upload exceeds `limits.upload_max_bytes`",
    &["payload_too_large"],
);

// ---- the table ----------------------------------------------------------------------------

/// Every route of the router.
pub const ROUTES: &[Route] = &[
    Route {
        method: Method::Get,
        path: "/healthz",
        operation_id: "health",
        summary: "Backend health (no auth: load balancers probe it)",
        auth: false,
        query: &[],
        request: None,
        responses: &[
            ok(200, "The backend answers", schema!("Health")),
            ok(503, "The backend does not answer", schema!("Health")),
        ],
    },
    Route {
        method: Method::Get,
        path: "/metrics",
        operation_id: "metrics",
        summary: "Prometheus/OpenMetrics metrics (no auth)",
        auth: false,
        query: &[],
        request: None,
        responses: &[ok(
            200,
            "The metrics in the OpenMetrics text format",
            &[Content {
                media: "application/openmetrics-text",
                schema: None,
            }],
        )],
    },
    Route {
        method: Method::Get,
        path: "/v1/openapi.json",
        operation_id: "openapi",
        summary: "This document (no auth)",
        auth: false,
        query: &[],
        request: None,
        responses: &[ok(200, "The OpenAPI 3.1 document", JSON_BODY)],
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{session}",
        operation_id: "getSession",
        summary: "The session's binding and sandbox state, without connecting or provisioning",
        auth: true,
        query: &[],
        request: None,
        responses: &[
            ok(200, "The sandbox bound to the session", schema!("Session")),
            err(400, "The session ID is unusable", &["invalid_session"]),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Delete,
        path: "/v1/sessions/{session}",
        operation_id: "destroySession",
        summary: "Destroys the session's sandbox and binding (idempotent)",
        auth: true,
        query: &[],
        request: None,
        responses: &[
            ok(204, "Destroyed, or nothing was bound", &[]),
            err(400, "The session ID is unusable", &["invalid_session"]),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/exec",
        operation_id: "exec",
        summary: "Runs a command in the session's sandbox, created on first use",
        auth: true,
        query: &[QueryParam {
            name: "stream",
            kind: "boolean",
            required: false,
            description: "Answer NDJSON: one line per output chunk as it happens, then the result",
        }],
        request: Some(RequestBody {
            required: true,
            description: "An exec spec: argv form (`command` + `args`) or shell form (`shell: true`, no `args`), plus `stdin`, `env`, `cwd`, `user`, `timeout_ms`",
            content: schema!("ExecSpec"),
        }),
        responses: &[
            ok(
                200,
                "The result (buffered), or an NDJSON stream: `{\"stream\":\"stdout\"|\"stderr\",\"data\":\"...\"}` per output chunk (text cut at character boundaries; `data_b64` instead of `data` for bytes that are not UTF-8), then a final result or error line",
                &[
                    Content {
                        media: JSON,
                        schema: Some("ExecResult"),
                    },
                    Content {
                        media: "application/x-ndjson",
                        // The schema of ONE line (OpenAPI 3.1 has no item keyword).
                        schema: Some("ExecStreamLine"),
                    },
                ],
            ),
            err(
                400,
                "The body, query, session ID or command is unusable",
                &[
                    "invalid_json",
                    "invalid_body",
                    "invalid_command",
                    "invalid_path",
                    "invalid_timeout",
                    "invalid_query",
                    "invalid_session",
                    "invalid_request",
                    "image_not_present",
                    "security_violation",
                ],
            ),
            E401,
            E404_SESSION,
            E408,
            E409,
            E413,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/keepalive",
        operation_id: "keepAlive",
        summary: "Refreshes the bound sandbox's idle timer (lookup-only) and says when to call again",
        auth: true,
        query: &[],
        request: None,
        responses: &[
            ok(
                200,
                "Refreshed (or nothing to refresh)",
                schema!("KeepAlive"),
            ),
            err(400, "The session ID is unusable", &["invalid_session"]),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/snapshots",
        operation_id: "createSnapshot",
        summary: "Snapshots the session's bound sandbox (lookup-only: never provisions)",
        auth: true,
        query: &[],
        request: Some(RequestBody {
            required: false,
            description: "An optional snapshot name; an empty body means no name",
            content: schema!("SnapshotRequest"),
        }),
        responses: &[
            ok(201, "The snapshot", schema!("SnapshotCreated")),
            err(
                400,
                "The body or session ID is unusable",
                &[
                    "invalid_json",
                    "invalid_body",
                    "invalid_session",
                    "invalid_snapshot",
                    "invalid_request",
                ],
            ),
            E401,
            err(
                404,
                "No sandbox is bound to the session, or it is gone",
                &[
                    "no_live_sandbox",
                    "session_deleted",
                    "not_found",
                    "sandbox_gone",
                ],
            ),
            E408,
            E409,
            E413,
            E429,
            E500,
            err(501, "The backend cannot snapshot", &["unsupported"]),
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/restore",
        operation_id: "restoreSnapshot",
        summary: "Creates the session's sandbox from a snapshot; refused when one is bound",
        auth: true,
        query: &[],
        request: Some(RequestBody {
            required: true,
            description: "The snapshot to restore",
            content: schema!("RestoreRequest"),
        }),
        responses: &[
            ok(201, "The new sandbox", schema!("RestoreCreated")),
            err(
                400,
                "The body, session ID or snapshot ID is unusable",
                &[
                    "invalid_json",
                    "invalid_body",
                    "invalid_session",
                    "invalid_snapshot",
                    "invalid_request",
                ],
            ),
            E401,
            err(
                404,
                "The session was deleted, or the snapshot is not one of this tenant's snapshots in this deployment (a missing, a foreign and a non-snapshot image answer alike)",
                &[
                    "snapshot_not_found",
                    "session_deleted",
                    "not_found",
                    "sandbox_gone",
                ],
            ),
            E408,
            err(
                409,
                "The session already has a sandbox: destroy it first",
                &["conflict", "session_sandbox_paused"],
            ),
            E413,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/execute",
        operation_id: "execute",
        summary: "Runs a script in a fresh sandbox that is deleted afterwards",
        auth: true,
        query: &[],
        request: Some(RequestBody {
            required: true,
            description: "The script: its file name (the extension picks the interpreter), content, args, stdin, env, timeout_ms",
            content: schema!("ScriptRequest"),
        }),
        responses: &[
            ok(200, "The result", schema!("ExecResult")),
            err(
                400,
                "The body is unusable, or the script validator refused the script",
                &[
                    "invalid_json",
                    "invalid_body",
                    "invalid_command",
                    "invalid_path",
                    "invalid_timeout",
                    "invalid_request",
                    "image_not_present",
                    "security_violation",
                ],
            ),
            E401,
            err(404, "The sandbox went away", &["not_found", "sandbox_gone"]),
            E408,
            err(409, "A conflict with the sandbox's state", &["conflict"]),
            E413,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    // ---- files (crate::http::files) ----
    Route {
        method: Method::Get,
        path: "/v1/sessions/{session}/files",
        operation_id: "listFiles",
        summary: "Entries below `path`, `depth` levels deep, at most 10000 of them in one bounded walk (`truncated` says when the cap or the deadline cut it; lookup-only: an unbound session or a missing directory lists nothing)",
        auth: true,
        query: &[
            PATH_PARAM,
            QueryParam {
                name: "depth",
                kind: "integer",
                required: false,
                description: "1 (default) to 16",
            },
        ],
        request: None,
        responses: &[
            ok(200, "The entries", schema!("Listing")),
            err(
                400,
                "The session ID, query or path is unusable",
                &[
                    "invalid_session",
                    "invalid_query",
                    "invalid_path",
                    "invalid_depth",
                    "invalid_request",
                ],
            ),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Delete,
        path: "/v1/sessions/{session}/files",
        operation_id: "removeFile",
        summary: "Removes a path recursively (lookup-only; the model-write rule applies)",
        auth: true,
        query: &[PATH_PARAM],
        request: None,
        responses: &[
            ok(204, "Removed", &[]),
            err(
                400,
                "The session ID, query or path is unusable, or the write rule refuses the path",
                FILE_400,
            ),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{session}/files/content",
        operation_id: "downloadFile",
        summary: "A regular file's bytes, streamed (lookup-only; at most `limits.download_max_bytes`)",
        auth: true,
        query: &[PATH_PARAM],
        request: None,
        responses: &[
            ok(200, "The file's bytes", OCTETS),
            err(
                400,
                "The session ID, query or path is unusable, the path is not a regular file once resolved (a FIFO, a device, a directory), or the file is larger than the download limit",
                DOWNLOAD_400,
            ),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Put,
        path: "/v1/sessions/{session}/files/content",
        operation_id: "uploadFile",
        summary: "Writes a model-authored file anywhere but `/workspace/input` (provisions the sandbox)",
        auth: true,
        query: &[PATH_PARAM],
        request: Some(RequestBody {
            required: true,
            description: "The file's bytes, at most `limits.upload_max_bytes`",
            content: OCTETS,
        }),
        responses: &[
            ok(204, "Written", &[]),
            err(
                400,
                "The session ID, query, path or body is unusable, or the write rule refuses the path",
                UPLOAD_400,
            ),
            E401,
            E404_SESSION,
            E408,
            E409,
            UPLOAD_413,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{session}/files/stat",
        operation_id: "statFile",
        summary: "Kind, size and modification time of one path (lookup-only)",
        auth: true,
        query: &[PATH_PARAM],
        request: None,
        responses: &[
            ok(200, "The entry", schema!("StatEntry")),
            err(400, "The session ID, query or path is unusable", FILE_400),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/files/mkdir",
        operation_id: "makeDir",
        summary: "Creates a directory and its parents (provisions; the model-write rule applies)",
        auth: true,
        query: &[PATH_PARAM],
        request: None,
        responses: &[
            ok(204, "Created (or already there)", &[]),
            err(
                400,
                "The session ID, query or path is unusable, or the write rule refuses the path",
                PROVISION_FILE_400,
            ),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Put,
        path: "/v1/sessions/{session}/attachments",
        operation_id: "putAttachment",
        summary: "Writes an attachment below `/workspace/input` (provisions the sandbox)",
        auth: true,
        query: &[PATH_PARAM],
        request: Some(RequestBody {
            required: true,
            description: "The file's bytes, at most `limits.upload_max_bytes`",
            content: OCTETS,
        }),
        responses: &[
            ok(204, "Written", &[]),
            err(
                400,
                "The session ID, query, path or body is unusable, or the path is not below `/workspace/input`",
                UPLOAD_400,
            ),
            E401,
            E404_SESSION,
            E408,
            E409,
            UPLOAD_413,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    Route {
        method: Method::Delete,
        path: "/v1/sessions/{session}/attachments",
        operation_id: "deleteAttachment",
        summary: "Removes a staged attachment (lookup-only; idempotent)",
        auth: true,
        query: &[PATH_PARAM],
        request: None,
        responses: &[
            ok(204, "Removed, or nothing was there", &[]),
            err(400, "The session ID, query or path is unusable", FILE_400),
            E401,
            E404_SESSION,
            E409,
            E429,
            E500,
            E501,
            E502,
            E503,
            E504,
        ],
    },
    // ---- terminal (crate::http::terminal) ----
    Route {
        method: Method::Post,
        path: "/v1/sessions/{session}/terminal/ticket",
        operation_id: "issueTerminalTicket",
        summary: "A short-lived, single-use ticket that authorises one terminal WebSocket upgrade for the session",
        auth: true,
        query: &[],
        request: None,
        responses: &[
            ok(200, "The ticket", schema!("TerminalTicket")),
            err(400, "The session ID is unusable", &["invalid_session"]),
            E401,
            err(
                404,
                "No sandbox is bound to the session (tickets are issued only for a running one)",
                &[
                    "no_live_sandbox",
                    "session_deleted",
                    "not_found",
                    "sandbox_gone",
                ],
            ),
            E409,
            err(
                429,
                "The tenant holds its limit of unused tickets (`limits.tickets_per_tenant`)",
                &["quota_exceeded", "capacity"],
            ),
            E500,
            E501,
            E502,
            err(
                503,
                "Too many tickets outstanding in the service, or the backend or store is unavailable",
                &[
                    "too_many_tickets",
                    "server_busy",
                    "provider_unavailable",
                    "store_unavailable",
                    "backend_disabled",
                    "egress_protection_unavailable",
                    "lock_ownership_lost",
                ],
            ),
            E504,
        ],
    },
    Route {
        method: Method::Get,
        path: "/v1/sessions/{session}/terminal",
        operation_id: "openTerminal",
        summary: "The interactive terminal over a WebSocket, authorised by a ticket (no bearer header); lookup-only",
        auth: false,
        query: &[
            QueryParam {
                name: "ticket",
                kind: "string",
                required: true,
                description: "From POST …/terminal/ticket; used up by a successful upgrade",
            },
            QueryParam {
                name: "resume",
                kind: "boolean",
                required: false,
                description: "Let the open resume a paused sandbox",
            },
            QueryParam {
                name: "cols",
                kind: "integer",
                required: false,
                description: "Initial width (0 or absent: 80)",
            },
            QueryParam {
                name: "rows",
                kind: "integer",
                required: false,
                description: "Initial height (0 or absent: 24)",
            },
        ],
        request: None,
        responses: &[
            ok(
                101,
                "Switching to the WebSocket protocol: binary frames carry PTY bytes, text frames `{\"type\":\"resize\"|\"exit\"|\"error\",..}`",
                &[],
            ),
            err(
                400,
                "The session ID or query is unusable, or the request is not a valid WebSocket upgrade",
                &[
                    "invalid_session",
                    "invalid_query",
                    "websocket_upgrade_required",
                ],
            ),
            err(
                401,
                "No, a used, an expired or another session's ticket",
                &["invalid_ticket"],
            ),
            err(
                404,
                "Nothing is bound to the session, or its sandbox is gone",
                &[
                    "no_live_sandbox",
                    "session_deleted",
                    "not_found",
                    "sandbox_gone",
                ],
            ),
            E409,
            err(
                426,
                "The connection cannot be upgraded",
                &["websocket_upgrade_required"],
            ),
            E429,
            E500,
            err(
                501,
                "The backend cannot open terminals",
                &["terminal_unsupported", "unsupported"],
            ),
            E502,
            E503,
            E504,
        ],
    },
];

// ---- the document ------------------------------------------------------------------------

fn schemas() -> Value {
    json!({
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": { "type": "string", "description": "Machine-readable; the route lists the codes of each status" },
                        "message": { "type": "string", "description": "One line, scrubbed of credentials" }
                    }
                }
            }
        },
        "Health": {
            "type": "object",
            "required": ["status", "backend"],
            "properties": {
                "status": { "enum": ["ok", "unavailable"] },
                "backend": { "type": "string" },
                "store": { "type": "string" },
                "reason": { "enum": ["backend_unavailable", "store_unavailable"], "description": "A reason code only; the details are in the service's log" }
            }
        },
        "Session": {
            "type": "object",
            "required": ["session", "sandbox_id", "provider", "state"],
            "properties": {
                "session": { "type": "string" },
                "sandbox_id": { "type": "string" },
                "provider": { "type": "string" },
                "state": { "type": "string" }
            }
        },
        "KeepAlive": {
            "type": "object",
            "required": ["refreshed", "next_refresh_ms"],
            "properties": {
                "refreshed": { "type": "boolean" },
                "next_refresh_ms": { "type": "integer", "minimum": 0 }
            }
        },
        "ExecSpec": {
            "type": "object",
            "required": ["command"],
            "additionalProperties": false,
            "properties": {
                "command": { "type": "string" },
                "args": { "type": "array", "items": { "type": "string" } },
                "shell": { "type": "boolean", "default": false },
                "stdin": { "type": ["string", "null"] },
                "env": { "type": "object", "additionalProperties": { "type": "string" } },
                "cwd": { "type": ["string", "null"], "description": "Absolute, normalized sandbox path" },
                "user": { "type": ["string", "null"] },
                "timeout_ms": { "type": ["integer", "null"], "minimum": 1 }
            }
        },
        "ExecResult": {
            "type": "object",
            "required": ["exit_code", "killed", "duration_ms", "stdout", "stderr", "stdout_utf8", "stderr_utf8", "truncated"],
            "properties": {
                "exit_code": { "type": "integer" },
                "killed": { "type": "boolean" },
                "duration_ms": { "type": "integer", "minimum": 0 },
                "stdout": { "type": "string", "description": "Lossy UTF-8, for display" },
                "stderr": { "type": "string", "description": "Lossy UTF-8, for display" },
                "stdout_utf8": { "type": "boolean" },
                "stderr_utf8": { "type": "boolean" },
                "stdout_b64": { "type": "string", "contentEncoding": "base64", "description": "The exact bytes, present only when stdout is not UTF-8" },
                "stderr_b64": { "type": "string", "contentEncoding": "base64", "description": "The exact bytes, present only when stderr is not UTF-8" },
                "truncated": { "type": "boolean", "description": "Output past the capture limit was dropped" }
            }
        },
        "ExecStreamLine": {
            "description": "One line of an exec NDJSON stream: an output chunk, then one final result or error line",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["stream"],
                    "properties": {
                        "stream": { "enum": ["stdout", "stderr"] },
                        "data": { "type": "string", "description": "The chunk's text, cut at character boundaries" },
                        "data_b64": { "type": "string", "contentEncoding": "base64", "description": "The chunk's bytes, when they are not UTF-8" }
                    },
                    "oneOf": [{ "required": ["data"] }, { "required": ["data_b64"] }]
                },
                {
                    "type": "object",
                    "required": ["exit_code", "killed", "duration_ms", "truncated", "stream_overflow"],
                    "properties": {
                        "exit_code": { "type": "integer" },
                        "killed": { "type": "boolean" },
                        "duration_ms": { "type": "integer", "minimum": 0 },
                        "truncated": { "type": "boolean", "description": "Output past the capture limit was dropped" },
                        "stream_overflow": { "type": "boolean", "description": "The client read too slowly: output stopped being forwarded" }
                    }
                },
                { "$ref": "#/components/schemas/Error" }
            ]
        },
        "SnapshotRequest": {
            "type": "object",
            "additionalProperties": false,
            "properties": { "name": { "type": ["string", "null"], "maxLength": 512 } }
        },
        "SnapshotCreated": {
            "type": "object",
            "required": ["snapshot_id"],
            "properties": {
                "snapshot_id": { "type": "string" },
                "name": { "type": ["string", "null"] },
                "source": { "type": ["string", "null"], "description": "The sandbox it was taken from" }
            }
        },
        "RestoreRequest": {
            "type": "object",
            "required": ["snapshot_id"],
            "additionalProperties": false,
            "properties": { "snapshot_id": { "type": "string" } }
        },
        "RestoreCreated": {
            "type": "object",
            "required": ["session", "sandbox_id"],
            "properties": {
                "session": { "type": "string" },
                "sandbox_id": { "type": "string" }
            }
        },
        "StatEntry": {
            "type": "object",
            "required": ["path", "kind", "size"],
            "properties": {
                "path": { "type": "string" },
                "kind": { "enum": ["file", "dir", "other"] },
                "size": { "type": "integer", "minimum": 0 },
                "modified": { "type": "string", "format": "date-time" }
            }
        },
        "Listing": {
            "type": "object",
            "required": ["entries", "truncated"],
            "properties": {
                "truncated": { "type": "boolean", "description": "The entry cap or the walk's deadline cut the listing short" },
                "entries": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "path", "kind", "size"],
                        "properties": {
                            "name": { "type": "string" },
                            "path": { "type": "string" },
                            "kind": { "enum": ["file", "dir", "other"] },
                            "size": { "type": "integer", "minimum": 0 },
                            "modified": { "type": "string", "format": "date-time" }
                        }
                    }
                }
            }
        },
        "TerminalTicket": {
            "type": "object",
            "required": ["ticket", "expires_in_ms"],
            "properties": {
                "ticket": { "type": "string" },
                "expires_in_ms": { "type": "integer", "minimum": 0 }
            }
        },
        "ScriptRequest": {
            "type": "object",
            "required": ["file_name", "content"],
            "additionalProperties": false,
            "properties": {
                "file_name": { "type": "string", "description": "One path segment; its extension (.sh, .py, .js, ...) picks the interpreter" },
                "content": { "type": "string" },
                "args": { "type": "array", "items": { "type": "string" } },
                "stdin": { "type": ["string", "null"] },
                "env": { "type": "object", "additionalProperties": { "type": "string" } },
                "timeout_ms": { "type": ["integer", "null"], "minimum": 1 }
            }
        }
    })
}

fn content_json(content: &[Content], codes: &[&str]) -> Value {
    let mut out = Map::new();
    for c in content {
        let schema = match (c.schema, codes.is_empty()) {
            (Some("Error"), false) => json!({
                "allOf": [
                    { "$ref": "#/components/schemas/Error" },
                    { "properties": { "error": { "properties": { "code": { "enum": codes } } } } }
                ]
            }),
            (Some(name), _) => json!({ "$ref": format!("#/components/schemas/{name}") }),
            (None, _) if c.media == JSON => json!({ "type": "object" }),
            (None, _) => json!({ "type": "string" }),
        };
        out.insert(c.media.to_owned(), json!({ "schema": schema }));
    }
    Value::Object(out)
}

fn operation(route: &Route) -> Value {
    let mut parameters: Vec<Value> = route
        .path_params()
        .map(|name| {
            json!({
                "name": name, "in": "path", "required": true,
                "schema": { "type": "string" },
                "description": "Percent-encoded; tenant-scoped; no braces or control characters, at most 512 bytes",
            })
        })
        .collect();
    parameters.extend(route.query.iter().map(|q| {
        json!({
            "name": q.name, "in": "query", "required": q.required,
            "schema": { "type": q.kind }, "description": q.description,
        })
    }));
    let mut responses = Map::new();
    for r in route.responses {
        let mut response = Map::new();
        let description = if r.is_error() {
            format!("{} (codes: {})", r.description, r.codes.join(", "))
        } else {
            r.description.to_owned()
        };
        response.insert("description".to_owned(), Value::String(description));
        if !r.content.is_empty() {
            response.insert("content".to_owned(), content_json(r.content, r.codes));
        }
        if r.is_error() {
            response.insert("x-error-codes".to_owned(), json!(r.codes));
        }
        responses.insert(r.status.to_string(), Value::Object(response));
    }
    let mut op = Map::new();
    op.insert("operationId".to_owned(), json!(route.operation_id));
    op.insert("summary".to_owned(), json!(route.summary));
    op.insert(
        "security".to_owned(),
        if route.auth {
            json!([{ "bearer": [] }])
        } else {
            json!([])
        },
    );
    if !parameters.is_empty() {
        op.insert("parameters".to_owned(), Value::Array(parameters));
    }
    if let Some(body) = route.request {
        op.insert(
            "requestBody".to_owned(),
            json!({
                "required": body.required,
                "description": body.description,
                "content": content_json(body.content, &[]),
            }),
        );
    }
    op.insert("responses".to_owned(), Value::Object(responses));
    Value::Object(op)
}

/// The OpenAPI 3.1 document of [`ROUTES`].
pub fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let item = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(item) = item {
            item.insert(route.method.key().to_owned(), operation(route));
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "sandbox service",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "One persistent, isolated sandbox per (tenant, session). Every error is `{\"error\":{\"code\",\"message\"}}`; each response lists the codes it can carry. An unknown route is 404 `route_not_found`.",
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas(),
        },
        "security": [{ "bearer": [] }],
        "paths": Value::Object(paths),
    })
}

/// `GET /v1/openapi.json` (no auth).
pub async fn serve() -> Json<Value> {
    Json(document())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use sandbox_core::{ConfigId, CreateRequest, PermissiveSessionExistence, SandboxProvider};
    use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
    use sandbox_session::manager::SessionManager;
    use sandbox_session::memory_store::MemoryBindingStore;
    use sandbox_testkit::fake::FakeProvider;
    use tower::ServiceExt as _;

    use super::*;
    use crate::http::AppState;
    use crate::http::metrics::Metrics;

    /// `(METHOD, path)` of every `.route(...)` registered in `http/mod.rs`, read from its source
    /// (axum cannot list a router's routes).
    fn registered() -> BTreeSet<(String, String)> {
        let src = include_str!("mod.rs");
        let mut out = BTreeSet::new();
        let mut rest = src;
        while let Some(at) = rest.find(".route(") {
            let call = &rest[at + ".route(".len()..];
            // The call's text up to its closing parenthesis.
            let mut depth = 1_usize;
            let mut end = call.len();
            for (i, ch) in call.char_indices() {
                match ch {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let call = &call[..end];
            let path = call.split('"').nth(1).expect("a route path literal");
            for method in ["get", "post", "put", "delete", "patch"] {
                let needle = format!("{method}(");
                let found = call.match_indices(&needle).any(|(i, _)| {
                    !call[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                });
                if found {
                    out.insert((method.to_uppercase(), path.to_owned()));
                }
            }
            rest = &rest[at + 1..];
        }
        out
    }

    fn app() -> axum::Router {
        let provider: Arc<dyn SandboxProvider> = Arc::new(FakeProvider::new());
        let lifecycle = Lifecycle::new(
            provider.clone(),
            Arc::new(MemoryBindingStore::new()),
            Arc::new(PermissiveSessionExistence),
            LifecycleConfig {
                config_id: ConfigId::default_config(),
                create_request: CreateRequest::new(FakeProvider::template()),
                requires_inbound_token: false,
            },
        )
        .unwrap();
        crate::http::router(AppState {
            auth: Arc::new(crate::auth::TenantAuth::default()),
            manager: SessionManager::new(lifecycle),
            provider,
            metrics: Arc::new(Metrics::new()),
            limits: crate::config::Limits::default(),
            tickets: Arc::new(crate::tickets::TerminalTickets::default()),
            store: crate::http::StoreInfo::memory(),
            budget: crate::http::body::InflightBudget::new(1 << 30),
        })
    }

    #[test]
    fn the_table_is_the_router() {
        let table: BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|r| (r.method.as_str().to_owned(), r.path.to_owned()))
            .collect();
        assert_eq!(table.len(), ROUTES.len(), "a route is listed twice");
        let registered = registered();
        assert!(registered.len() >= 8, "the parser found {registered:?}");
        let missing: Vec<_> = registered.difference(&table).collect();
        let extra: Vec<_> = table.difference(&registered).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "registered but not in the table: {missing:?}; in the table but not registered: {extra:?}"
        );
    }

    #[tokio::test]
    async fn every_table_route_is_served() {
        let app = app();
        for route in ROUTES {
            let uri = route.path.replace("{session}", "probe");
            let request = axum::http::Request::builder()
                .method(route.method.as_str())
                .uri(&uri)
                .body(Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let code = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
            let body = String::from_utf8_lossy(&body);
            assert_ne!(status, 405, "{} {uri}: {body}", route.method.as_str());
            assert_ne!(
                code.as_deref(),
                Some("route_not_found"),
                "{} {uri}",
                route.method.as_str()
            );
            assert!(
                route.response(status).is_some(),
                "{} {uri} answered an undocumented {status}: {body}",
                route.method.as_str()
            );
        }
    }

    #[tokio::test]
    async fn the_document_has_one_operation_per_route() {
        let response = app()
            .oneshot(
                axum::http::Request::builder()
                    .uri("/v1/openapi.json")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let doc: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        let paths = doc["paths"].as_object().unwrap();
        let mut operations = 0;
        let mut ids = BTreeSet::new();
        for route in ROUTES {
            let op = &paths[route.path][route.method.key()];
            assert!(op.is_object(), "{} {}", route.method.as_str(), route.path);
            operations += 1;
            assert!(ids.insert(op["operationId"].as_str().unwrap().to_owned()));
            let responses = op["responses"].as_object().unwrap();
            assert_eq!(responses.len(), route.responses.len());
            for r in route.responses {
                assert!(
                    r.is_error() || (100..400).contains(&r.status) || route.path == "/healthz",
                    "{} {}: {} documents no error code",
                    route.method.as_str(),
                    route.path,
                    r.status
                );
            }
            for name in route.path_params() {
                assert!(
                    op["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == name && p["in"] == "path")
                );
            }
        }
        let total: usize = paths
            .values()
            .map(|item| item.as_object().unwrap().len())
            .sum();
        assert_eq!(total, operations);
        // Every schema reference resolves.
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for (i, _) in text.match_indices("#/components/schemas/") {
            let name: String = text[i + "#/components/schemas/".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect();
            assert!(schemas.contains_key(&name), "unresolved schema {name}");
        }
    }
}

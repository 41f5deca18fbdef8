//! The error answers of every route, as data: for each status a route can answer with the
//! error shape, the codes that status can carry. One list per route family below; each list
//! has a marker type the route's `#[utoipa::path(responses(..))]` names, which puts the list
//! into the document: per status a description ending in `(codes: ..)`, a schema that narrows
//! `error.code` to those codes, and the codes again as `x-error-codes`, the form
//! `tests/http_properties.rs` reads back from the served document.

use std::collections::BTreeMap;

use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};

/// One documented error answer: a status and the codes its body can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorDoc {
    pub status: u16,
    pub description: &'static str,
    pub codes: &'static [&'static str],
}

/// The document extension, per response, that lists its error codes.
pub const CODES_EXTENSION: &str = "x-error-codes";

const fn err(status: u16, description: &'static str, codes: &'static [&'static str]) -> ErrorDoc {
    ErrorDoc {
        status,
        description,
        codes,
    }
}

/// The responses of `docs`, for `utoipa::IntoResponses`.
pub fn responses(docs: &[ErrorDoc]) -> BTreeMap<String, RefOr<Response>> {
    docs.iter()
        .map(|doc| (doc.status.to_string(), RefOr::T(response(doc))))
        .collect()
}

fn response(doc: &ErrorDoc) -> Response {
    let code = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(doc.codes.iter().copied()));
    let narrowed =
        ObjectBuilder::new().property("error", ObjectBuilder::new().property("code", code));
    let schema = AllOfBuilder::new()
        .item(Ref::from_schema_name("Error"))
        .item(narrowed);
    ResponseBuilder::new()
        .description(format!(
            "{} (codes: {})",
            doc.description,
            doc.codes.join(", ")
        ))
        .content(
            "application/json",
            ContentBuilder::new().schema(Some(schema)).build(),
        )
        .extensions(Some(
            ExtensionsBuilder::new()
                .add(CODES_EXTENSION, serde_json::json!(doc.codes))
                .build(),
        ))
        .build()
}

/// A marker type whose `IntoResponses` is one of the lists.
macro_rules! family {
    ($(#[$doc:meta])* $name:ident = $list:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name;

        impl $name {
            /// The list, as data.
            pub const DOCS: &'static [ErrorDoc] = $list;
        }

        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                responses(Self::DOCS)
            }
        }
    };
}

// ---- shared answers ----------------------------------------------------------------------------

const E401: ErrorDoc = err(401, "Missing or unknown bearer token", &["unauthorized"]);
const E413: ErrorDoc = err(
    413,
    "The request body exceeds the JSON body limit",
    &["payload_too_large"],
);
const E429: ErrorDoc = err(
    429,
    "The backend is out of capacity, or one of the tenant's quotas is spent (the message names the limit; nothing was created)",
    &["capacity", "quota_exceeded"],
);
const E408: ErrorDoc = err(
    408,
    "The request body stalled, or was not complete within the body deadline",
    &["body_timeout"],
);
const E500: ErrorDoc = err(
    500,
    "An internal error (or a stored binding that fails validation)",
    &["internal", "invalid_binding"],
);
const E501: ErrorDoc = err(501, "The backend cannot do this", &["unsupported"]);
const E502: ErrorDoc = err(
    502,
    "The backend refused the service's credentials",
    &["provider_authentication"],
);
const E503: ErrorDoc = err(
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
const E504: ErrorDoc = err(
    504,
    "The backend or the binding store timed out",
    &["provider_timeout", "store_timeout"],
);
const E404_SESSION: ErrorDoc = err(
    404,
    "The session was deleted, or its sandbox is gone or was not found",
    &[
        "session_deleted",
        "not_found",
        "sandbox_gone",
        "no_live_sandbox",
    ],
);
const E409: ErrorDoc = err(
    409,
    "The session's sandbox is paused, or the operation conflicts with its state",
    &["conflict", "session_sandbox_paused"],
);
const E400_SESSION: ErrorDoc = err(400, "The session ID is unusable", &["invalid_session"]);
const E404_UNBOUND: ErrorDoc = err(
    404,
    "No sandbox is bound to the session, or it is gone",
    &[
        "no_live_sandbox",
        "session_deleted",
        "not_found",
        "sandbox_gone",
    ],
);

// ---- sessions ----------------------------------------------------------------------------------

family! {
    /// `GET`/`DELETE /v1/sessions/{session}`, `POST …/keepalive`.
    SessionErrors = &[
        E400_SESSION, E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

// ---- exec --------------------------------------------------------------------------------------

family! {
    /// `POST /v1/sessions/{session}/exec`.
    ExecErrors = &[
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
        E401, E404_SESSION, E408, E409, E413, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `POST /v1/execute`.
    ExecuteErrors = &[
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
        E413, E429, E500, E501, E502, E503, E504,
    ]
}

// ---- snapshots ---------------------------------------------------------------------------------

const SNAPSHOT_400: &[&str] = &[
    "invalid_json",
    "invalid_body",
    "invalid_session",
    "invalid_snapshot",
    "invalid_request",
];

family! {
    /// `POST /v1/sessions/{session}/snapshots`.
    SnapshotErrors = &[
        err(400, "The body or session ID is unusable", SNAPSHOT_400),
        E401, E404_UNBOUND, E408, E409, E413, E429, E500,
        err(501, "The backend cannot snapshot", &["unsupported"]),
        E502, E503, E504,
    ]
}

family! {
    /// `POST /v1/sessions/{session}/restore`.
    RestoreErrors = &[
        err(400, "The body, session ID or snapshot ID is unusable", SNAPSHOT_400),
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
        E413, E429, E500, E501, E502, E503, E504,
    ]
}

// ---- files -------------------------------------------------------------------------------------

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
const UPLOAD_400: &[&str] = &[
    "invalid_session",
    "invalid_query",
    "invalid_path",
    "invalid_body",
    "invalid_request",
    "image_not_present",
];
const UPLOAD_413: ErrorDoc = err(
    413,
    "The upload exceeds `limits.upload_max_bytes`",
    &["payload_too_large"],
);

family! {
    /// `GET /v1/sessions/{session}/files`.
    ListErrors = &[
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
        E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `GET …/files/stat`, `DELETE …/attachments`.
    PathErrors = &[
        err(400, "The session ID, query or path is unusable", FILE_400),
        E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `DELETE /v1/sessions/{session}/files`.
    RemoveErrors = &[
        err(
            400,
            "The session ID, query or path is unusable, or the write rule refuses the path",
            FILE_400,
        ),
        E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `POST …/files/mkdir`.
    MkdirErrors = &[
        err(
            400,
            "The session ID, query or path is unusable, or the write rule refuses the path",
            PROVISION_FILE_400,
        ),
        E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `GET …/files/content`.
    DownloadErrors = &[
        err(
            400,
            "The session ID, query or path is unusable, the path is not a regular file once resolved (a FIFO, a device, a directory), or the file is larger than the download limit",
            &[
                "invalid_session",
                "invalid_query",
                "invalid_path",
                "invalid_request",
                "not_a_regular_file",
                "file_too_large",
            ],
        ),
        E401, E404_SESSION, E409, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `PUT …/files/content`.
    UploadErrors = &[
        err(
            400,
            "The session ID, query, path or body is unusable, or the write rule refuses the path",
            UPLOAD_400,
        ),
        E401, E404_SESSION, E408, E409, UPLOAD_413, E429, E500, E501, E502, E503, E504,
    ]
}

family! {
    /// `PUT …/attachments`.
    AttachmentErrors = &[
        err(
            400,
            "The session ID, query, path or body is unusable, or the path is not below `/workspace/input`",
            UPLOAD_400,
        ),
        E401, E404_SESSION, E408, E409, UPLOAD_413, E429, E500, E501, E502, E503, E504,
    ]
}

// ---- terminal ----------------------------------------------------------------------------------

family! {
    /// `POST …/terminal/ticket`.
    TicketErrors = &[
        E400_SESSION,
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
        E500, E501, E502,
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
    ]
}

family! {
    /// `GET …/terminal` (the WebSocket upgrade): every refusal is an HTTP answer before it.
    TerminalErrors = &[
        err(
            400,
            "The session ID or query is unusable (a bad `cwd`, `env` or `user` included), or the request is not a valid WebSocket upgrade",
            &[
                "invalid_session",
                "invalid_query",
                "invalid_path",
                "invalid_command",
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
            "Nothing is bound to the session, its sandbox is gone, or `pid` names no running terminal of it",
            &[
                "no_live_sandbox",
                "session_deleted",
                "not_found",
                "sandbox_gone",
                "terminal_not_found",
            ],
        ),
        E409,
        err(
            426,
            "The connection cannot be upgraded",
            &["websocket_upgrade_required"],
        ),
        E429, E500,
        err(
            501,
            "The backend cannot open terminals, or cannot reattach to one (`pid`)",
            &[
                "terminal_unsupported",
                "terminal_reattach_unsupported",
                "unsupported",
            ],
        ),
        E502, E503, E504,
    ]
}

// ---- background processes, streamed files, watch (issue 17) ---------------------------------

const PROCESSES_501: ErrorDoc = err(
    501,
    "The backend cannot run background processes (or cannot send this signal)",
    &["processes_unsupported", "unsupported"],
);
const STREAMED_501: ErrorDoc = err(
    501,
    "The backend cannot stream files (the service never buffers them instead)",
    &["streamed_files_unsupported", "unsupported"],
);
const PROCESS_404: ErrorDoc = err(
    404,
    "No sandbox is bound to the session, it is gone, or no process has this pid or tag",
    &[
        "process_not_found",
        "no_live_sandbox",
        "session_deleted",
        "not_found",
        "sandbox_gone",
    ],
);
const STREAM_429: ErrorDoc = err(
    429,
    "The tenant holds its limit of open attach and watch streams (`quotas.max_streams`), or the backend is out of capacity",
    &["quota_exceeded", "capacity"],
);

family! {
    /// `POST /v1/sessions/{session}/processes`.
    ProcessStartErrors = &[
        err(
            400,
            "The body, session ID, command or tag is unusable",
            &[
                "invalid_json",
                "invalid_body",
                "invalid_command",
                "invalid_path",
                "invalid_session",
                "invalid_request",
                "image_not_present",
            ],
        ),
        E401, E404_SESSION, E408,
        err(
            409,
            "A running process holds the tag, or the sandbox's state conflicts",
            &["process_tag_in_use", "conflict", "session_sandbox_paused"],
        ),
        E413, E429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `GET /v1/sessions/{session}/processes`.
    ProcessListErrors = &[
        E400_SESSION, E401, E404_SESSION, E409, E429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `GET …/processes/{process}/attach`.
    AttachErrors = &[
        err(
            400,
            "The session ID, process name, query or offset is unusable (an offset past the output produced: `invalid_offset`)",
            &[
                "invalid_session",
                "invalid_process",
                "invalid_query",
                "invalid_offset",
                "invalid_request",
            ],
        ),
        E401, PROCESS_404, E409, STREAM_429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `POST …/processes/{process}/stdin`.
    StdinErrors = &[
        err(
            400,
            "The session ID, process name or body is unusable",
            &["invalid_session", "invalid_process", "invalid_body", "invalid_request"],
        ),
        E401, PROCESS_404, E408,
        err(
            409,
            "The process's stdin is closed (or was never kept open), or the process has exited",
            &["stdin_closed", "process_exited", "conflict", "session_sandbox_paused"],
        ),
        err(413, "The input exceeds `limits.json_max_bytes`", &["payload_too_large"]),
        E429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `DELETE …/processes/{process}/stdin`.
    CloseStdinErrors = &[
        err(
            400,
            "The session ID or process name is unusable",
            &["invalid_session", "invalid_process", "invalid_request"],
        ),
        E401, PROCESS_404,
        err(
            409,
            "The process has exited",
            &["process_exited", "conflict", "session_sandbox_paused"],
        ),
        E429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `POST …/processes/{process}/signal`.
    SignalErrors = &[
        err(
            400,
            "The session ID, process name, body or signal is unusable",
            &[
                "invalid_session",
                "invalid_process",
                "invalid_json",
                "invalid_body",
                "invalid_signal",
                "invalid_request",
            ],
        ),
        E401, PROCESS_404, E408,
        err(
            409,
            "The process has exited",
            &["process_exited", "conflict", "session_sandbox_paused"],
        ),
        E413, E429, E500, PROCESSES_501, E502, E503, E504,
    ]
}

family! {
    /// `GET …/files/stream`.
    StreamDownloadErrors = &[
        err(
            400,
            "The session ID, query or path is unusable, the path is not a regular file, or the file is larger than `limits.stream_file_max_bytes`",
            &[
                "invalid_session",
                "invalid_query",
                "invalid_path",
                "invalid_request",
                "not_a_regular_file",
                "file_too_large",
            ],
        ),
        E401, E404_SESSION, E409, E429, E500, STREAMED_501, E502, E503, E504,
    ]
}

family! {
    /// `PUT …/files/stream`.
    StreamUploadErrors = &[
        err(
            400,
            "The session ID, query, path or body is unusable, or the write rule refuses the path",
            &[
                "invalid_session",
                "invalid_query",
                "invalid_path",
                "invalid_body",
                "invalid_request",
                "image_not_present",
            ],
        ),
        E401, E404_SESSION, E408, E409,
        err(
            413,
            "The upload exceeds `limits.stream_file_max_bytes` (nothing was written)",
            &["payload_too_large"],
        ),
        E429, E500, STREAMED_501, E502, E503, E504,
    ]
}

family! {
    /// `POST …/files/rename`.
    RenameErrors = &[
        err(
            400,
            "The body, session ID or a path is unusable, the write rule refuses a path, or the target is an existing directory or inside the source",
            &[
                "invalid_json",
                "invalid_body",
                "invalid_session",
                "invalid_path",
                "invalid_request",
            ],
        ),
        E401, E404_SESSION, E408, E409, E413, E429, E500, STREAMED_501, E502, E503, E504,
    ]
}

family! {
    /// `GET /v1/sessions/{session}/watch`.
    WatchErrors = &[
        err(
            400,
            "The session ID, query or path is unusable, or the path is not a directory",
            &[
                "invalid_session",
                "invalid_query",
                "invalid_path",
                "not_a_directory",
                "invalid_request",
            ],
        ),
        E401, E404_SESSION, E409, STREAM_429, E500,
        err(
            501,
            "The backend cannot watch directories",
            &["watch_unsupported", "unsupported"],
        ),
        E502, E503, E504,
    ]
}

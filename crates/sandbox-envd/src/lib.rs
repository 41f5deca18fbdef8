//! envd wire types and the Connect envelope codec, without I/O.
//!
//! envd is the daemon inside E2B and Cube sandboxes; its process and filesystem services speak
//! Connect over HTTP with proto3-JSON messages (`docs/envd.md` states the services and the
//! codec). Three parts of this workspace need that wire format: the E2B and Cube adapters
//! (clients, through `sandbox-transport`) and `sandbox-agent` (a server inside our own
//! sandboxes). This crate is the one copy they share, and it is deliberately free of HTTP,
//! sockets and runtimes so each side brings its own I/O (ARCHITECTURE.md, invariant "envd
//! allow-list": it may add only serde_json, base64 and bytes to sandbox-core's dependencies).
//!
//! - [`process`] and [`filesystem`]: every message of the two services, with the proto3-JSON
//!   mapping written out by hand (no protobuf runtime, no code generation), plus each
//!   service's method table ([`Method`], [`Rpc`]).
//! - [`files`]: the plain HTTP file endpoints' parameters, upload answer and error body.
//! - [`status`]: how a process ended ([`ProcessStatus`]), as the `end` event words it (Go's
//!   `exit status 2`, `signal: killed`), produced by the agent and read back by clients.
//! - [`envelope`]: the streaming framing, an incremental decoder that takes chunks cut anywhere
//!   and an encoder.
//! - [`Code`], [`ConnectError`], [`EndStreamMessage`]: Connect's error model, its HTTP statuses,
//!   and its classification onto `sandbox_core::ErrorKind`.
//!
//! Reading JSON is lenient where the proto3 JSON specification demands it (numbers as strings,
//! either base64 alphabet, enum numbers, `null`, unknown fields); writing is canonical, so a
//! value read and written again comes out in one stable form. The golden files under
//! `tests/golden/` pin that form for every message.

mod code;
pub mod envelope;
mod error;
pub mod files;
pub mod filesystem;
mod json;
pub mod process;
mod service;
pub mod status;
mod timestamp;

pub use code::Code;
pub use envelope::{
    DecoderConfig, Envelope, EnvelopeDecoder, EnvelopeError, PayloadError, StreamItem,
};
pub use error::{ConnectError, EndStreamMessage, ErrorDetail};
pub use service::{
    CONTENT_TYPE_CONNECT_JSON, CONTENT_TYPE_JSON, HEADER_ACCEPT_ENCODING, HEADER_CONTENT_ENCODING,
    HEADER_KEEPALIVE_PING_INTERVAL, HEADER_PROTOCOL_VERSION, HEADER_TIMEOUT_MS, Method, MethodKind,
    PROTOCOL_VERSION, Rpc, all_methods, method_by_path,
};
pub use status::ProcessStatus;
pub use timestamp::{Timestamp, TimestampError};

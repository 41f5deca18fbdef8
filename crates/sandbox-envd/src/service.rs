//! What a Connect call looks like on HTTP, independent of any HTTP library: method paths, their
//! streaming shape, content types and the protocol's header names.
//!
//! Both sides of envd live in this workspace (the E2B/Cube adapters call it, `sandbox-agent`
//! serves it), so the method table is declared once, here, and each side routes by it.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The content type of a unary JSON request or response (also of every unary error body).
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// The content type of a streaming JSON request or response (enveloped messages).
pub const CONTENT_TYPE_CONNECT_JSON: &str = "application/connect+json";

/// Request header carrying the protocol version; always [`PROTOCOL_VERSION`].
pub const HEADER_PROTOCOL_VERSION: &str = "connect-protocol-version";
/// The only Connect protocol version.
pub const PROTOCOL_VERSION: &str = "1";
/// Request header carrying the call's deadline in milliseconds (envd also bounds a started
/// process's lifetime by it, `docs/envd.md`, "Process semantics").
pub const HEADER_TIMEOUT_MS: &str = "connect-timeout-ms";
/// Streaming request header naming the message compression the sender uses.
pub const HEADER_CONTENT_ENCODING: &str = "connect-content-encoding";
/// Streaming request header listing the message compressions the sender accepts.
pub const HEADER_ACCEPT_ENCODING: &str = "connect-accept-encoding";
/// envd's own header: seconds between keepalive events on an idle stream.
pub const HEADER_KEEPALIVE_PING_INTERVAL: &str = "keepalive-ping-interval";

/// How many messages flow each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodKind {
    /// One request, one response: plain JSON bodies, errors as HTTP statuses.
    Unary,
    /// One request, a stream of responses; both bodies enveloped, errors in the end-of-stream
    /// message.
    ServerStreaming,
    /// A stream of requests, one response (plus end-of-stream); both bodies enveloped.
    ClientStreaming,
}

/// One RPC of an envd service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Method {
    /// Fully qualified service name (`process.Process`).
    pub service: &'static str,
    /// Method name (`Start`).
    pub name: &'static str,
    /// HTTP path (`/process.Process/Start`); every call is a `POST` to it.
    pub path: &'static str,
    /// What an error of this call names as its operation (`start_process`): a snake_case
    /// verb phrase like every operation name (`sandbox_core::error`), not the path, which
    /// is not one.
    pub operation: sandbox_core::Operation,
    /// Streaming shape.
    pub kind: MethodKind,
}

impl Method {
    /// Whether both bodies are sequences of envelopes (`application/connect+json`) rather
    /// than one JSON document. True for every streaming kind, in both directions: even a
    /// server-streaming call sends its single request enveloped.
    pub const fn is_enveloped(self) -> bool {
        !matches!(self.kind, MethodKind::Unary)
    }

    /// Whether the client sends many messages.
    pub const fn client_streams(self) -> bool {
        matches!(self.kind, MethodKind::ClientStreaming)
    }

    /// Whether the server sends many messages.
    pub const fn server_streams(self) -> bool {
        matches!(self.kind, MethodKind::ServerStreaming)
    }

    /// The request and response content type for JSON.
    pub const fn content_type(self) -> &'static str {
        match self.kind {
            MethodKind::Unary => CONTENT_TYPE_JSON,
            MethodKind::ServerStreaming | MethodKind::ClientStreaming => CONTENT_TYPE_CONNECT_JSON,
        }
    }
}

/// Ties a method to its message types, so a typed client or server cannot pair them wrongly.
pub trait Rpc {
    /// The request message (each one of the stream, for client streaming).
    type Request: Serialize + DeserializeOwned;
    /// The response message (each one of the stream, for server streaming).
    type Response: Serialize + DeserializeOwned;
    /// Path and kind.
    const METHOD: Method;
}

/// Every method of both services, for routing.
pub fn all_methods() -> impl Iterator<Item = Method> {
    crate::process::METHODS
        .iter()
        .chain(crate::filesystem::METHODS.iter())
        .copied()
}

/// The method served at `path`, if envd has one.
pub fn method_by_path(path: &str) -> Option<Method> {
    all_methods().find(|m| m.path == path)
}

/// Declares a service's method table: a `Method` constant per RPC in `method`, a marker type
/// implementing [`Rpc`] per RPC in `rpc`, and the list `METHODS`.
macro_rules! service {
    (
        $service:literal;
        $(
            $(#[$doc:meta])*
            $konst:ident / $marker:ident = $name:literal as $operation:literal: $kind:ident($request:ty) -> $response:ty;
        )+
    ) => {
        /// The fully qualified service name.
        pub const SERVICE: &str = $service;

        /// One constant per RPC: path and streaming shape.
        pub mod method {
            $(
                $(#[$doc])*
                pub const $konst: $crate::Method = $crate::Method {
                    service: $service,
                    name: $name,
                    path: concat!("/", $service, "/", $name),
                    operation: sandbox_core::Operation::new($operation),
                    kind: $crate::MethodKind::$kind,
                };
            )+
        }

        /// One marker type per RPC, tying its [`Method`](crate::Method) to its messages.
        pub mod rpc {
            use super::*;
            $(
                $(#[$doc])*
                #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
                pub struct $marker;

                impl $crate::Rpc for $marker {
                    type Request = $request;
                    type Response = $response;
                    const METHOD: $crate::Method = super::method::$konst;
                }
            )+
        }

        /// Every method of the service, in declaration order.
        pub const METHODS: &[$crate::Method] = &[$(method::$konst),+];
    };
}
pub(crate) use service;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{filesystem, process};

    #[test]
    fn paths_are_service_and_name() {
        let mut seen = std::collections::BTreeSet::new();
        for m in all_methods() {
            assert_eq!(m.path, format!("/{}/{}", m.service, m.name));
            assert!(seen.insert(m.path), "duplicate path {}", m.path);
            assert_eq!(method_by_path(m.path), Some(m));
        }
        assert_eq!(seen.len(), 17);
        let operations: std::collections::BTreeSet<&str> =
            all_methods().map(|m| m.operation.as_str()).collect();
        assert_eq!(operations.len(), 17, "one operation name per method");
        for name in operations {
            assert!(sandbox_core::Operation::follows_scheme(name), "{name}");
        }
        assert_eq!(process::method::START.operation.as_str(), "start_process");
        assert_eq!(filesystem::method::LIST_DIR.operation.as_str(), "list_dir");
        assert_eq!(method_by_path("/process.Process/Nope"), None);
    }

    #[test]
    fn shapes_match_the_documented_services() {
        use MethodKind::*;
        let check = |m: Method, path: &str, kind: MethodKind| {
            assert_eq!((m.path, m.kind), (path, kind));
        };
        check(process::method::LIST, "/process.Process/List", Unary);
        check(
            process::method::CONNECT,
            "/process.Process/Connect",
            ServerStreaming,
        );
        check(
            process::method::START,
            "/process.Process/Start",
            ServerStreaming,
        );
        check(process::method::UPDATE, "/process.Process/Update", Unary);
        check(
            process::method::STREAM_INPUT,
            "/process.Process/StreamInput",
            ClientStreaming,
        );
        check(
            process::method::SEND_INPUT,
            "/process.Process/SendInput",
            Unary,
        );
        check(
            process::method::SEND_SIGNAL,
            "/process.Process/SendSignal",
            Unary,
        );
        check(
            process::method::CLOSE_STDIN,
            "/process.Process/CloseStdin",
            Unary,
        );
        check(
            filesystem::method::STAT,
            "/filesystem.Filesystem/Stat",
            Unary,
        );
        check(
            filesystem::method::MAKE_DIR,
            "/filesystem.Filesystem/MakeDir",
            Unary,
        );
        check(
            filesystem::method::MOVE,
            "/filesystem.Filesystem/Move",
            Unary,
        );
        check(
            filesystem::method::LIST_DIR,
            "/filesystem.Filesystem/ListDir",
            Unary,
        );
        check(
            filesystem::method::REMOVE,
            "/filesystem.Filesystem/Remove",
            Unary,
        );
        check(
            filesystem::method::WATCH_DIR,
            "/filesystem.Filesystem/WatchDir",
            ServerStreaming,
        );
        check(
            filesystem::method::CREATE_WATCHER,
            "/filesystem.Filesystem/CreateWatcher",
            Unary,
        );
        check(
            filesystem::method::GET_WATCHER_EVENTS,
            "/filesystem.Filesystem/GetWatcherEvents",
            Unary,
        );
        check(
            filesystem::method::REMOVE_WATCHER,
            "/filesystem.Filesystem/RemoveWatcher",
            Unary,
        );

        assert_eq!(
            process::method::START.content_type(),
            CONTENT_TYPE_CONNECT_JSON
        );
        assert_eq!(process::method::LIST.content_type(), CONTENT_TYPE_JSON);
        assert!(process::method::START.is_enveloped());
        assert!(process::method::STREAM_INPUT.is_enveloped());
        assert!(!process::method::LIST.is_enveloped());
        assert!(process::method::STREAM_INPUT.client_streams());
        assert!(!process::method::STREAM_INPUT.server_streams());
        assert!(!process::method::START.client_streams());
        assert!(process::method::START.server_streams());
    }

    #[test]
    fn markers_carry_their_methods() {
        fn path<R: Rpc>() -> &'static str {
            R::METHOD.path
        }
        assert_eq!(path::<process::rpc::Start>(), "/process.Process/Start");
        assert_eq!(
            path::<filesystem::rpc::WatchDir>(),
            "/filesystem.Filesystem/WatchDir"
        );
    }
}

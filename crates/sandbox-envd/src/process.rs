//! The messages and methods of envd's `process.Process` service (package `process`).
//!
//! Types follow the proto's names with the usual Rust casing (`PTY` is [`Pty`], nested messages
//! live in snake_case modules: `ProcessEvent.DataEvent` is [`process_event::DataEvent`]); each
//! field's doc says how it travels. Semantics envd gives the fields are in `docs/envd.md`,
//! "Process semantics".
//!
//! Field shapes: proto3 `optional` and message-typed fields are `Option` (present on the wire
//! exactly when `Some`, even when the inner value is a default); plain scalars are omitted when
//! they hold the default; a oneof is an `Option` of an enum.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::json::{self, oneof_message, proto_enum};
use crate::service::service;

service! {
    "process.Process";
    /// Lists the running processes. Unary.
    LIST / List = "List" as "list_processes": Unary(ListRequest) -> ListResponse;
    /// Attaches to a running process's events (no replay of earlier output). Server streaming.
    CONNECT / Connect = "Connect" as "connect_process": ServerStreaming(ConnectRequest) -> ConnectResponse;
    /// Starts a process and streams its events. Server streaming.
    START / Start = "Start" as "start_process": ServerStreaming(StartRequest) -> StartResponse;
    /// Resizes a process's PTY. Unary.
    UPDATE / Update = "Update" as "update_process": Unary(UpdateRequest) -> UpdateResponse;
    /// Feeds a process's input in order: `start`, then `data`. Client streaming.
    STREAM_INPUT / StreamInput = "StreamInput" as "stream_input": ClientStreaming(StreamInputRequest) -> StreamInputResponse;
    /// Sends one chunk of input. Unary.
    SEND_INPUT / SendInput = "SendInput" as "send_input": Unary(SendInputRequest) -> SendInputResponse;
    /// Sends SIGTERM or SIGKILL. Unary.
    SEND_SIGNAL / SendSignal = "SendSignal" as "send_signal": Unary(SendSignalRequest) -> SendSignalResponse;
    /// Closes a non-PTY process's stdin (EOF). Unary.
    CLOSE_STDIN / CloseStdin = "CloseStdin" as "close_stdin": Unary(CloseStdinRequest) -> CloseStdinResponse;
}

json::message! {
    /// A pseudo-terminal request (`process.PTY`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Pty {
        /// Window size. Message field: omitted when `None`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub size: Option<pty::Size>,
    }
}

/// Nested messages of [`Pty`].
pub mod pty {
    use super::*;

    json::message! {
        /// Terminal dimensions (`process.PTY.Size`).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct Size {
            /// Columns (`uint32`).
            #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
            pub cols: u32,
            /// Rows (`uint32`).
            #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
            pub rows: u32,
        }
    }
}

json::message! {
    /// What to run (`process.ProcessConfig`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ProcessConfig {
        /// The program (the SDK sends `/bin/bash` with `-l -c <cmd>`).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub cmd: String,
        /// Arguments after the program.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub args: Vec<String>,
        /// Environment additions (`map<string, string>`); a `BTreeMap` so output is deterministic.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "BTreeMap::is_empty"
        )]
        pub envs: BTreeMap<String, String>,
        /// Working directory (proto3 `optional`: sent when `Some`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cwd: Option<String>,
    }
}

json::message! {
    /// `process.ListRequest` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct ListRequest {}
}

json::message! {
    /// One running process (`process.ProcessInfo`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ProcessInfo {
        /// The configuration it was started with.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub config: Option<ProcessConfig>,
        /// Its pid (`uint32`).
        #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
        pub pid: u32,
        /// The tag it was started with (proto3 `optional`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tag: Option<String>,
    }
}

json::message! {
    /// `process.ListResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ListResponse {
        /// All live processes.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub processes: Vec<ProcessInfo>,
    }
}

json::message! {
    /// `process.StartRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StartRequest {
        /// What to run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessConfig>,
        /// Run in a pseudo-terminal (proto3 `optional` message).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pty: Option<Pty>,
        /// A tag to find the process by later (proto3 `optional`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tag: Option<String>,
        /// Keep a stdin pipe (proto3 `optional`; absent means `true` for compatibility, so
        /// `Some(false)` is sent as `"stdin":false`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub stdin: Option<bool>,
    }
}

json::message! {
    /// `process.UpdateRequest` (PTY resize).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct UpdateRequest {
        /// Which process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
        /// The new PTY settings (proto3 `optional` message).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pty: Option<Pty>,
    }
}

json::message! {
    /// `process.UpdateResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct UpdateResponse {}
}

/// One event of a started or connected process (`process.ProcessEvent`).
///
/// envd sends `start` first, then `data` and `keepalive` events, and exactly one `end` last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessEvent {
    /// The oneof `event`; `None` is an event with no member set (`{}`).
    pub event: Option<process_event::Event>,
}

oneof_message!(ProcessEvent { event: process_event::Event } as "process.ProcessEvent", oneof "event" {
    Start => "start": message,
    Data => "data": message,
    End => "end": message,
    Keepalive => "keepalive": message,
});

/// Nested messages and the oneof of [`ProcessEvent`].
pub mod process_event {
    use super::*;

    /// The oneof `event` of `process.ProcessEvent`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// `start`: the process is running.
        Start(StartEvent),
        /// `data`: a chunk of output.
        Data(DataEvent),
        /// `end`: the process has exited.
        End(EndEvent),
        /// `keepalive`: nothing happened for a ping interval.
        Keepalive(KeepAlive),
    }

    json::message! {
        /// `process.ProcessEvent.StartEvent`.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct StartEvent {
            /// The process's pid (`uint32`).
            #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
            pub pid: u32,
        }
    }

    /// `process.ProcessEvent.DataEvent`: one chunk of output.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct DataEvent {
        /// The oneof `output`.
        pub output: Option<data_event::Output>,
    }

    oneof_message!(DataEvent { output: data_event::Output } as "process.ProcessEvent.DataEvent", oneof "output" {
        Stdout => "stdout": bytes,
        Stderr => "stderr": bytes,
        Pty => "pty": bytes,
    });

    /// The oneof of [`DataEvent`].
    pub mod data_event {
        /// The oneof `output` of `process.ProcessEvent.DataEvent` (`bytes`, base64 on the wire).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Output {
            /// `stdout`: raw bytes from standard output (at most 32 KiB per event).
            Stdout(Vec<u8>),
            /// `stderr`: raw bytes from standard error (at most 32 KiB per event).
            Stderr(Vec<u8>),
            /// `pty`: raw bytes from the pseudo-terminal (at most 16 KiB per event).
            Pty(Vec<u8>),
        }
    }

    json::message! {
        /// `process.ProcessEvent.EndEvent`: how the process ended.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct EndEvent {
            /// Exit code (`sint32`, JSON `exitCode`); -1 when killed by a signal, omitted when 0.
            #[serde(
                default,
                alias = "exit_code",
                with = "json::sint32",
                skip_serializing_if = "json::is_default"
            )]
            pub exit_code: i32,
            /// Whether the process exited normally.
            #[serde(
                default,
                deserialize_with = "json::null_as_default",
                skip_serializing_if = "json::is_default"
            )]
            pub exited: bool,
            /// Go's `ProcessState.String()` (`"exit status 0"`, `"signal: killed"`).
            #[serde(
                default,
                deserialize_with = "json::null_as_default",
                skip_serializing_if = "String::is_empty"
            )]
            pub status: String,
            /// Why the wait failed, when it did (proto3 `optional`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub error: Option<String>,
        }
    }

    json::message! {
        /// `process.ProcessEvent.KeepAlive` (empty).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct KeepAlive {}
    }
}

json::message! {
    /// One message of the `Start` response stream (`process.StartResponse`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StartResponse {
        /// The event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub event: Option<ProcessEvent>,
    }
}

json::message! {
    /// One message of the `Connect` response stream (`process.ConnectResponse`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ConnectResponse {
        /// The event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub event: Option<ProcessEvent>,
    }
}

json::message! {
    /// `process.SendInputRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct SendInputRequest {
        /// Which process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
        /// The input.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub input: Option<ProcessInput>,
    }
}

json::message! {
    /// `process.SendInputResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct SendInputResponse {}
}

/// A chunk of input (`process.ProcessInput`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessInput {
    /// The oneof `input`.
    pub input: Option<process_input::Input>,
}

oneof_message!(ProcessInput { input: process_input::Input } as "process.ProcessInput", oneof "input" {
    Stdin => "stdin": bytes,
    Pty => "pty": bytes,
});

/// The oneof of [`ProcessInput`].
pub mod process_input {
    /// The oneof `input` of `process.ProcessInput` (`bytes`, base64 on the wire).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Input {
        /// `stdin`: bytes for a process's stdin pipe.
        Stdin(Vec<u8>),
        /// `pty`: bytes for a process's pseudo-terminal (a PTY process takes input only here).
        Pty(Vec<u8>),
    }
}

/// One message of the `StreamInput` request stream (`process.StreamInputRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamInputRequest {
    /// The oneof `event`.
    pub event: Option<stream_input_request::Event>,
}

oneof_message!(StreamInputRequest { event: stream_input_request::Event } as "process.StreamInputRequest", oneof "event" {
    Start => "start": message,
    Data => "data": message,
    Keepalive => "keepalive": message,
});

/// Nested messages and the oneof of [`StreamInputRequest`].
pub mod stream_input_request {
    use super::*;

    /// The oneof `event` of `process.StreamInputRequest`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// `start`: names the process; must come first.
        Start(StartEvent),
        /// `data`: one chunk of input.
        Data(DataEvent),
        /// `keepalive`: keeps an idle stream open.
        Keepalive(KeepAlive),
    }

    json::message! {
        /// `process.StreamInputRequest.StartEvent`.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct StartEvent {
            /// Which process.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub process: Option<ProcessSelector>,
        }
    }

    json::message! {
        /// `process.StreamInputRequest.DataEvent` (its one field is number 2 on the binary wire;
        /// JSON goes by name, so that does not show here).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "camelCase")]
        pub struct DataEvent {
            /// The input.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub input: Option<ProcessInput>,
        }
    }

    json::message! {
        /// `process.StreamInputRequest.KeepAlive` (empty).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct KeepAlive {}
    }
}

json::message! {
    /// `process.StreamInputResponse` (empty), sent once the client half-closes.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct StreamInputResponse {}
}

proto_enum! {
    /// `process.Signal`: the signals envd delivers (others are `unimplemented`).
    pub enum Signal as "process.Signal" {
        /// `SIGNAL_UNSPECIFIED` = 0.
        Unspecified = 0 => "SIGNAL_UNSPECIFIED",
        /// `SIGNAL_SIGTERM` = 15.
        Sigterm = 15 => "SIGNAL_SIGTERM",
        /// `SIGNAL_SIGKILL` = 9.
        Sigkill = 9 => "SIGNAL_SIGKILL",
    }
}

json::message! {
    /// `process.SendSignalRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct SendSignalRequest {
        /// Which process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
        /// The signal, by name on the wire (`"SIGNAL_SIGKILL"`).
        #[serde(default, skip_serializing_if = "Signal::is_default")]
        pub signal: Signal,
    }
}

json::message! {
    /// `process.SendSignalResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct SendSignalResponse {}
}

json::message! {
    /// `process.CloseStdinRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CloseStdinRequest {
        /// Which process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
    }
}

json::message! {
    /// `process.CloseStdinResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct CloseStdinResponse {}
}

json::message! {
    /// `process.ConnectRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ConnectRequest {
        /// Which process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub process: Option<ProcessSelector>,
    }
}

/// Names a process by pid or tag (`process.ProcessSelector`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessSelector {
    /// The oneof `selector`.
    pub selector: Option<process_selector::Selector>,
}

oneof_message!(ProcessSelector { selector: process_selector::Selector } as "process.ProcessSelector", oneof "selector" {
    Pid => "pid": uint32,
    Tag => "tag": string,
});

/// The oneof of [`ProcessSelector`].
pub mod process_selector {
    /// The oneof `selector` of `process.ProcessSelector`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Selector {
        /// `pid` (`uint32`).
        Pid(u32),
        /// `tag`, as given to `Start`.
        Tag(String),
    }
}

impl ProcessSelector {
    /// Selects by pid.
    pub fn pid(pid: u32) -> Self {
        ProcessSelector {
            selector: Some(process_selector::Selector::Pid(pid)),
        }
    }

    /// Selects by tag.
    pub fn tag(tag: impl Into<String>) -> Self {
        ProcessSelector {
            selector: Some(process_selector::Selector::Tag(tag.into())),
        }
    }
}

impl ProcessEvent {
    /// An event with `member` set.
    pub fn new(member: process_event::Event) -> Self {
        ProcessEvent {
            event: Some(member),
        }
    }
}

impl ProcessInput {
    /// Input for a stdin pipe.
    pub fn stdin(bytes: impl Into<Vec<u8>>) -> Self {
        ProcessInput {
            input: Some(process_input::Input::Stdin(bytes.into())),
        }
    }

    /// Input for a pseudo-terminal.
    pub fn pty(bytes: impl Into<Vec<u8>>) -> Self {
        ProcessInput {
            input: Some(process_input::Input::Pty(bytes.into())),
        }
    }
}

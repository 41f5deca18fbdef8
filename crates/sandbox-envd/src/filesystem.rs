//! The messages and methods of envd's `filesystem.Filesystem` service (package `filesystem`).
//!
//! Same conventions as [`crate::process`]. Semantics envd gives the fields (what `depth` 0
//! means, when `entry` is attached to a watch event) are in `docs/envd.md`, "Filesystem semantics".

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Timestamp;
use crate::json::{self, oneof_message, proto_enum};
use crate::service::service;

service! {
    "filesystem.Filesystem";
    /// Describes one path. Unary.
    STAT / Stat = "Stat" as "stat": Unary(StatRequest) -> StatResponse;
    /// Creates a directory and its parents. Unary.
    MAKE_DIR / MakeDir = "MakeDir" as "make_dir": Unary(MakeDirRequest) -> MakeDirResponse;
    /// Renames a path. Unary.
    MOVE / Move = "Move" as "move": Unary(MoveRequest) -> MoveResponse;
    /// Lists a directory's descendants up to a depth. Unary.
    LIST_DIR / ListDir = "ListDir" as "list_dir": Unary(ListDirRequest) -> ListDirResponse;
    /// Removes a path recursively. Unary.
    REMOVE / Remove = "Remove" as "remove": Unary(RemoveRequest) -> RemoveResponse;
    /// Streams a directory's change events. Server streaming.
    WATCH_DIR / WatchDir = "WatchDir" as "watch_dir": ServerStreaming(WatchDirRequest) -> WatchDirResponse;
    /// Starts a polled watcher. Unary.
    CREATE_WATCHER / CreateWatcher = "CreateWatcher" as "create_watcher": Unary(CreateWatcherRequest) -> CreateWatcherResponse;
    /// Drains a polled watcher's events. Unary.
    GET_WATCHER_EVENTS / GetWatcherEvents = "GetWatcherEvents" as "get_watcher_events": Unary(GetWatcherEventsRequest) -> GetWatcherEventsResponse;
    /// Stops a polled watcher. Unary.
    REMOVE_WATCHER / RemoveWatcher = "RemoveWatcher" as "remove_watcher": Unary(RemoveWatcherRequest) -> RemoveWatcherResponse;
}

json::message! {
    /// `filesystem.MoveRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MoveRequest {
        /// The path to rename.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub source: String,
        /// The new path (its parent is created).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub destination: String,
    }
}

json::message! {
    /// `filesystem.MoveResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MoveResponse {
        /// The entry at its new path.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub entry: Option<EntryInfo>,
    }
}

json::message! {
    /// `filesystem.MakeDirRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MakeDirRequest {
        /// The directory to create.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
    }
}

json::message! {
    /// `filesystem.MakeDirResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MakeDirResponse {
        /// The created directory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub entry: Option<EntryInfo>,
    }
}

json::message! {
    /// `filesystem.RemoveRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RemoveRequest {
        /// The path to remove (recursively; a missing path is not an error).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
    }
}

json::message! {
    /// `filesystem.RemoveResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct RemoveResponse {}
}

json::message! {
    /// `filesystem.StatRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StatRequest {
        /// The path to describe.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
    }
}

json::message! {
    /// `filesystem.StatResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct StatResponse {
        /// The entry.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub entry: Option<EntryInfo>,
    }
}

json::message! {
    /// What envd knows about one path (`filesystem.EntryInfo`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct EntryInfo {
        /// The base name.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub name: String,
        /// The kind; for a symlink, the *target's* kind (see `is_symlink`).
        #[serde(default, skip_serializing_if = "FileType::is_default")]
        pub r#type: FileType,
        /// The path, built from the path the caller asked about.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
        /// Size in bytes (`int64`: a JSON string).
        #[serde(default, with = "json::int64", skip_serializing_if = "json::is_default")]
        pub size: i64,
        /// Permission bits only (`uint32`, e.g. 420 for 0o644).
        #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
        pub mode: u32,
        /// Go's `FileMode.String()` (`-rw-r--r--`).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub permissions: String,
        /// Owner name (a numeric string when the uid has no name).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub owner: String,
        /// Group name (a numeric string when the gid has no name).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub group: String,
        /// Last modification (`google.protobuf.Timestamp`, RFC 3339; envd omits a zero time).
        #[serde(
            default,
            alias = "modified_time",
            skip_serializing_if = "Option::is_none"
        )]
        pub modified_time: Option<Timestamp>,
        /// The resolved target, for a symlink (proto3 `optional`).
        #[serde(
            default,
            alias = "symlink_target",
            skip_serializing_if = "Option::is_none"
        )]
        pub symlink_target: Option<String>,
        /// The file's `user.e2b.*` extended attributes, prefix stripped (`map<string, string>`).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "BTreeMap::is_empty"
        )]
        pub metadata: BTreeMap<String, String>,
        /// Whether the path itself is a symlink (field 12: newer envd and SDK 2.63 only; absent
        /// from older copies of envd's proto, which stop at field 11).
        #[serde(
            default,
            alias = "is_symlink",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub is_symlink: bool,
    }
}

proto_enum! {
    /// `filesystem.FileType`.
    pub enum FileType as "filesystem.FileType" {
        /// `FILE_TYPE_UNSPECIFIED` = 0.
        Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
        /// `FILE_TYPE_FILE` = 1.
        File = 1 => "FILE_TYPE_FILE",
        /// `FILE_TYPE_DIRECTORY` = 2.
        Directory = 2 => "FILE_TYPE_DIRECTORY",
        /// `FILE_TYPE_SYMLINK` = 3 (older envd; newer envd reports the target's type plus
        /// `is_symlink`).
        Symlink = 3 => "FILE_TYPE_SYMLINK",
    }
}

json::message! {
    /// `filesystem.ListDirRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ListDirRequest {
        /// The directory (a symlink to one is followed).
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
        /// Levels to descend (`uint32`; envd treats 0 as 1).
        #[serde(default, with = "json::uint32", skip_serializing_if = "json::is_default")]
        pub depth: u32,
    }
}

json::message! {
    /// `filesystem.ListDirResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ListDirResponse {
        /// The descendants, the directory itself excluded.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub entries: Vec<EntryInfo>,
    }
}

json::message! {
    /// `filesystem.WatchDirRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct WatchDirRequest {
        /// The directory to watch.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
        /// Watch subdirectories too.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub recursive: bool,
        /// Attach the entry to create, write and chmod events (JSON `includeEntry`).
        #[serde(
            default,
            alias = "include_entry",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub include_entry: bool,
        /// Allow network mounts, whose events may be unreliable (JSON `allowNetworkMounts`).
        #[serde(
            default,
            alias = "allow_network_mounts",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub allow_network_mounts: bool,
    }
}

json::message! {
    /// One change in a watched directory (`filesystem.FilesystemEvent`).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct FilesystemEvent {
        /// The path relative to the watched directory.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub name: String,
        /// What happened.
        #[serde(default, skip_serializing_if = "EventType::is_default")]
        pub r#type: EventType,
        /// The entry, when requested and still stat-able (proto3 `optional` message).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub entry: Option<EntryInfo>,
    }
}

/// One message of the `WatchDir` response stream (`filesystem.WatchDirResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchDirResponse {
    /// The oneof `event`.
    pub event: Option<watch_dir_response::Event>,
}

oneof_message!(WatchDirResponse { event: watch_dir_response::Event } as "filesystem.WatchDirResponse", oneof "event" {
    Start => "start": message,
    Filesystem => "filesystem": message,
    Keepalive => "keepalive": message,
});

/// Nested messages and the oneof of [`WatchDirResponse`].
pub mod watch_dir_response {
    use super::*;

    /// The oneof `event` of `filesystem.WatchDirResponse`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    #[allow(
        clippy::large_enum_variant,
        reason = "mirrors the proto; each event is built once and moved, so boxing buys nothing"
    )]
    pub enum Event {
        /// `start`: the watch is established (always first).
        Start(StartEvent),
        /// `filesystem`: a change.
        Filesystem(FilesystemEvent),
        /// `keepalive`: nothing happened for a ping interval.
        Keepalive(KeepAlive),
    }

    json::message! {
        /// `filesystem.WatchDirResponse.StartEvent` (empty).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct StartEvent {}
    }

    json::message! {
        /// `filesystem.WatchDirResponse.KeepAlive` (empty).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct KeepAlive {}
    }
}

json::message! {
    /// `filesystem.CreateWatcherRequest` (the same fields as [`WatchDirRequest`]).
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CreateWatcherRequest {
        /// The directory to watch.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub path: String,
        /// Watch subdirectories too.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub recursive: bool,
        /// Attach the entry to create, write and chmod events (JSON `includeEntry`).
        #[serde(
            default,
            alias = "include_entry",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub include_entry: bool,
        /// Allow network mounts, whose events may be unreliable (JSON `allowNetworkMounts`).
        #[serde(
            default,
            alias = "allow_network_mounts",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "json::is_default"
        )]
        pub allow_network_mounts: bool,
    }
}

json::message! {
    /// `filesystem.CreateWatcherResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CreateWatcherResponse {
        /// The new watcher's id (JSON `watcherId`).
        #[serde(
            default,
            alias = "watcher_id",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub watcher_id: String,
    }
}

json::message! {
    /// `filesystem.GetWatcherEventsRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct GetWatcherEventsRequest {
        /// The watcher (JSON `watcherId`).
        #[serde(
            default,
            alias = "watcher_id",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub watcher_id: String,
    }
}

json::message! {
    /// `filesystem.GetWatcherEventsResponse`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct GetWatcherEventsResponse {
        /// Events since the previous call.
        #[serde(
            default,
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "Vec::is_empty"
        )]
        pub events: Vec<FilesystemEvent>,
    }
}

json::message! {
    /// `filesystem.RemoveWatcherRequest`.
    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RemoveWatcherRequest {
        /// The watcher (JSON `watcherId`).
        #[serde(
            default,
            alias = "watcher_id",
            deserialize_with = "json::null_as_default",
            skip_serializing_if = "String::is_empty"
        )]
        pub watcher_id: String,
    }
}

json::message! {
    /// `filesystem.RemoveWatcherResponse` (empty).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
    pub struct RemoveWatcherResponse {}
}

proto_enum! {
    /// `filesystem.EventType`.
    pub enum EventType as "filesystem.EventType" {
        /// `EVENT_TYPE_UNSPECIFIED` = 0.
        Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
        /// `EVENT_TYPE_CREATE` = 1.
        Create = 1 => "EVENT_TYPE_CREATE",
        /// `EVENT_TYPE_WRITE` = 2.
        Write = 2 => "EVENT_TYPE_WRITE",
        /// `EVENT_TYPE_REMOVE` = 3.
        Remove = 3 => "EVENT_TYPE_REMOVE",
        /// `EVENT_TYPE_RENAME` = 4.
        Rename = 4 => "EVENT_TYPE_RENAME",
        /// `EVENT_TYPE_CHMOD` = 5.
        Chmod = 5 => "EVENT_TYPE_CHMOD",
    }
}

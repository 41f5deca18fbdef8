//! `sandbox-core`: the domain of session-bound sandboxes — types, the error taxonomy, the ports
//! adapters implement, and pure policy. No runtime and no I/O: other services depend on this
//! crate and only the adapters they need, so its dependency list is an allow-list enforced by
//! `cargo xtask tidy` (serde, async-trait, time, event-listener).
//!
//! Map:
//! - [`provider`]: [`SandboxType`] and [`Provider`].
//! - [`error`]: [`Error`], [`ErrorKind`], [`ErrorCode`], [`Origin`], [`Operation`]; [`diagnostics`] keeps
//!   secrets out of error text.
//! - [`ids`], [`path`], [`secret`]: validated identifiers, sandbox paths, credentials.
//! - [`sandbox`], [`exec`], [`fs`], [`terminal`], [`template`], [`process`], [`watch`]:
//!   provider DTOs (the last two with their stream traits).
//! - [`capabilities`]: the declared capability set.
//! - [`layers`]: decorators every adapter is wrapped in; [`layers::Checked`] refuses what the
//!   declarations do not allow.
//! - [`binding`]: binding key, binding schema v1, ownership metadata.
//! - [`ownership`]: the runtime-free ownership token of the lifecycle lock.
//! - [`ports`]: [`SandboxProvider`] and its capability traits, [`BindingStore`] and friends,
//!   [`SessionExistence`], [`Bootstrapper`], [`ConfigLoader`], [`DeadlineStore`].
//! - [`config`]: named tenant configs, required fields, identity projection.
//! - [`policy`]: shell quoting, workspace layout, skills (the script validator is in
//!   `sandbox-session::policy`).
//! - [`clock`]: injectable time.

pub mod binding;
pub mod capabilities;
pub mod clock;
pub mod config;
pub mod diagnostics;
pub mod error;
pub mod exec;
pub mod fs;
pub mod ids;
pub mod layers;
pub mod ownership;
pub mod path;
pub mod patterns;
pub mod policy;
pub mod ports;
pub mod process;
pub mod provider;
pub mod sandbox;
pub mod secret;
pub mod template;
pub mod terminal;
pub mod timefmt;
pub mod watch;

pub use binding::{BINDING_SCHEMA_VERSION, Binding, BindingKey, owner_metadata};
pub use capabilities::{Capabilities, Capability};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{SandboxIdentity, TenantSandboxConfig};
pub use error::{Error, ErrorCode, ErrorKind, Operation, Origin, Result, can_replace_binding};
pub use exec::{Command, ExecRequest, ExecResult, ExecSpec, ExecTimeout, OutputHook, OutputStream};
pub use fs::{
    BufferedStream, ByteStream, DirEntry, EntryKind, ReadStream, StatEntry, TreeLimits, TreeListing,
};
pub use ids::{ConfigId, SandboxId, SessionId, SnapshotId, TemplateId, TenantId};
pub use layers::Checked;
pub use ownership::{OwnershipSource, OwnershipToken};
pub use path::SandboxPath;
pub use ports::deadlines::{
    DeadlineStore, MAX_DEADLINE_KEY_BYTES, MAX_DEADLINE_MILLIS, check_deadline_key,
    deadline_from_millis, deadline_millis, due_cutoff_millis,
};
pub use ports::provider::{
    ConnectProbe, Desktop, KeepAlive, PauseResume, Processes, SandboxProvider, Snapshots,
    StreamedFiles, TemplateBuilds, TemplateCatalog, TerminalReattach, Terminals, Tunnel,
    TunnelSink, TunnelSource, Tunnels, Watch, narrow, tunnel_errors,
};
pub use ports::session::{
    Bootstrapper, ConfigLoader, LoadedConfig, PermissiveSessionExistence, SessionExistence,
};
pub use ports::store::{
    ActivityRegistry, BackgroundActivity, BindingStore, InvalidationReport, LifecycleLock,
    LockRelease, OptimisticReads, ResolveSnapshot, RewindLock, RewindLocks, TurnLeases, TurnState,
};
pub use process::{
    ProcessEvent, ProcessInfo, ProcessOutput, ProcessSelector, ProcessSpec, ProcessStatus,
    ProcessStream, ProcessTag, Signal,
};
pub use provider::{Provider, SandboxType};
pub use sandbox::{
    ConnectRequest, CreateRequest, E2bHostRule, IdleTimeout, ListCursor, ListFilter, ListOrder,
    ListPage, Metadata, NetworkField, NetworkFields, NetworkPolicy, SandboxHandle, SandboxPage,
    SandboxState, SandboxSummary, SandboxUser, TimeoutAction, TimeoutPolicy, VolumeMount,
};
pub use secret::Secret;
pub use template::{
    BuiltTemplate, MAX_TEMPLATE_NAME, MAX_TEMPLATE_WORD, SnapshotRef, TEMPLATE_TENANT, Template,
    TemplateBuildRequest, is_template_name, is_template_tag, is_template_word,
};
pub use terminal::{
    DesktopOptions, DesktopStream, Terminal, TerminalEvent, TerminalInput, TerminalOptions,
    TerminalOutput, TerminalSize,
};
pub use watch::{WatchEvent, WatchEventKind, WatchEvents, WatchStream};

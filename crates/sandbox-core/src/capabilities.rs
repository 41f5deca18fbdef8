//! What a backend declares it can do.
//!
//! Higher layers never branch on which provider is in use; they read these flags. The conformance
//! suite registers its cases from the same declaration, and each adapter's own test pins its
//! declared set, so a case cannot quietly disappear by declaring less.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One capability flag. The string names are used verbatim by every adapter, the test kit and
/// reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// `connect` recovers an operable handle from a sandbox ID after a process restart.
    Reconnect,
    /// `create` + `list` preserve the metadata bag (orphan recovery, per-config inventory).
    Metadata,
    /// `list` enumerates existing sandboxes.
    List,
    /// Sandboxes can be paused, keeping memory and files, and resumed ([`crate::PauseResume`]).
    PauseResume,
    /// The provider's idle timeout can be extended after creation.
    TimeoutRefresh,
    /// `list_dir`, `make_dir`, `stat` and `remove` are implemented.
    FsEnumeration,
    /// Sandboxes can be snapshotted into reusable templates ([`crate::Snapshots`]).
    Snapshots,
    /// Named volumes can be mounted at creation.
    Volumes,
    /// Templates can be listed and ensured ([`crate::TemplateCatalog`]).
    TemplateCatalog,
    /// A combined connect-and-probe exists ([`crate::ConnectProbe`]).
    ConnectProbe,
    /// The provider's idle timer can be refreshed explicitly ([`crate::KeepAlive`]).
    KeepAlive,
    /// Interactive PTYs ([`crate::Terminals`]).
    Pty,
    /// A WebSocket relay to the desktop port ([`crate::Desktop`]).
    Desktop,
    /// The sandbox has a POSIX shell and userland (`sh -c`, `ps`, `stty`, pipelines), so the
    /// shell form of exec works.
    PosixShell,
    /// Background processes with a tag, a replay ring, input and signals ([`crate::Processes`]).
    Processes,
    /// Files read and written as bounded byte streams, and renamed ([`crate::StreamedFiles`]).
    StreamedFiles,
    /// Directory event streams ([`crate::Watch`]).
    Watch,
    /// A terminal outlives its client: it keeps running detached, and is reattached by pid
    /// ([`crate::TerminalReattach`]).
    TerminalReattach,
    /// A create request's [`user`](crate::CreateRequest::user) is honoured: what names no user
    /// acts as it, and processes start in its workdir.
    DefaultUser,
    /// Byte tunnels reach TCP ports inside a sandbox over the backend's own channel
    /// ([`crate::Tunnels`]).
    Tunnels,
    /// Templates are built from images already on the backend, per tenant
    /// ([`crate::TemplateBuilds`]).
    TemplateBuilds,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 21] = [
        Capability::Reconnect,
        Capability::Metadata,
        Capability::List,
        Capability::PauseResume,
        Capability::TimeoutRefresh,
        Capability::FsEnumeration,
        Capability::Snapshots,
        Capability::Volumes,
        Capability::TemplateCatalog,
        Capability::ConnectProbe,
        Capability::KeepAlive,
        Capability::Pty,
        Capability::Desktop,
        Capability::PosixShell,
        Capability::Processes,
        Capability::StreamedFiles,
        Capability::Watch,
        Capability::TerminalReattach,
        Capability::DefaultUser,
        Capability::Tunnels,
        Capability::TemplateBuilds,
    ];

    /// The flag's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Reconnect => "reconnect",
            Capability::Metadata => "metadata",
            Capability::List => "list",
            Capability::PauseResume => "pause_resume",
            Capability::TimeoutRefresh => "timeout_refresh",
            Capability::FsEnumeration => "fs_enumeration",
            Capability::Snapshots => "snapshots",
            Capability::Volumes => "volumes",
            Capability::TemplateCatalog => "template_catalog",
            Capability::ConnectProbe => "connect_probe",
            Capability::KeepAlive => "keep_alive",
            Capability::Pty => "pty",
            Capability::Desktop => "desktop",
            Capability::PosixShell => "posix_shell",
            Capability::Processes => "processes",
            Capability::StreamedFiles => "streamed_files",
            Capability::Watch => "watch",
            Capability::TerminalReattach => "terminal_reattach",
            Capability::DefaultUser => "default_user",
            Capability::Tunnels => "tunnels",
            Capability::TemplateBuilds => "template_builds",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The static capability set of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools)] // One flag per capability is the point of the type.
pub struct Capabilities {
    pub reconnect: bool,
    pub metadata: bool,
    pub list: bool,
    pub pause_resume: bool,
    pub timeout_refresh: bool,
    pub fs_enumeration: bool,
    pub snapshots: bool,
    pub volumes: bool,
    pub template_catalog: bool,
    pub connect_probe: bool,
    pub keep_alive: bool,
    pub pty: bool,
    pub desktop: bool,
    pub posix_shell: bool,
    pub processes: bool,
    pub streamed_files: bool,
    pub watch: bool,
    pub terminal_reattach: bool,
    pub default_user: bool,
    pub tunnels: bool,
    pub template_builds: bool,
}

impl Capabilities {
    /// No capabilities.
    pub const NONE: Capabilities = Capabilities {
        reconnect: false,
        metadata: false,
        list: false,
        pause_resume: false,
        timeout_refresh: false,
        fs_enumeration: false,
        snapshots: false,
        volumes: false,
        template_catalog: false,
        connect_probe: false,
        keep_alive: false,
        pty: false,
        desktop: false,
        posix_shell: false,
        processes: false,
        streamed_files: false,
        watch: false,
        terminal_reattach: false,
        default_user: false,
        tunnels: false,
        template_builds: false,
    };

    /// A set holding exactly `caps`.
    pub fn from_slice(caps: &[Capability]) -> Self {
        caps.iter()
            .fold(Capabilities::NONE, |set, &c| set.with(c, true))
    }

    /// Whether `cap` is declared.
    pub fn has(&self, cap: Capability) -> bool {
        match cap {
            Capability::Reconnect => self.reconnect,
            Capability::Metadata => self.metadata,
            Capability::List => self.list,
            Capability::PauseResume => self.pause_resume,
            Capability::TimeoutRefresh => self.timeout_refresh,
            Capability::FsEnumeration => self.fs_enumeration,
            Capability::Snapshots => self.snapshots,
            Capability::Volumes => self.volumes,
            Capability::TemplateCatalog => self.template_catalog,
            Capability::ConnectProbe => self.connect_probe,
            Capability::KeepAlive => self.keep_alive,
            Capability::Pty => self.pty,
            Capability::Desktop => self.desktop,
            Capability::PosixShell => self.posix_shell,
            Capability::Processes => self.processes,
            Capability::StreamedFiles => self.streamed_files,
            Capability::Watch => self.watch,
            Capability::TerminalReattach => self.terminal_reattach,
            Capability::DefaultUser => self.default_user,
            Capability::Tunnels => self.tunnels,
            Capability::TemplateBuilds => self.template_builds,
        }
    }

    /// A copy with `cap` set to `on`.
    #[must_use]
    pub fn with(mut self, cap: Capability, on: bool) -> Self {
        let flag = match cap {
            Capability::Reconnect => &mut self.reconnect,
            Capability::Metadata => &mut self.metadata,
            Capability::List => &mut self.list,
            Capability::PauseResume => &mut self.pause_resume,
            Capability::TimeoutRefresh => &mut self.timeout_refresh,
            Capability::FsEnumeration => &mut self.fs_enumeration,
            Capability::Snapshots => &mut self.snapshots,
            Capability::Volumes => &mut self.volumes,
            Capability::TemplateCatalog => &mut self.template_catalog,
            Capability::ConnectProbe => &mut self.connect_probe,
            Capability::KeepAlive => &mut self.keep_alive,
            Capability::Pty => &mut self.pty,
            Capability::Desktop => &mut self.desktop,
            Capability::PosixShell => &mut self.posix_shell,
            Capability::Processes => &mut self.processes,
            Capability::StreamedFiles => &mut self.streamed_files,
            Capability::Watch => &mut self.watch,
            Capability::TerminalReattach => &mut self.terminal_reattach,
            Capability::DefaultUser => &mut self.default_user,
            Capability::Tunnels => &mut self.tunnels,
            Capability::TemplateBuilds => &mut self.template_builds,
        };
        *flag = on;
        self
    }

    /// The declared capabilities, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = Capability> + '_ {
        Capability::ALL.into_iter().filter(|&c| self.has(c))
    }

    /// Whether every capability of `other` is declared here too.
    pub fn contains_all(&self, other: &Capabilities) -> bool {
        other.iter().all(|c| self.has(c))
    }

    /// The capabilities of `self` that `other` also has (narrowing never widens).
    #[must_use]
    pub fn intersect(&self, other: &Capabilities) -> Capabilities {
        Capability::ALL
            .into_iter()
            .fold(Capabilities::NONE, |set, c| {
                set.with(c, self.has(c) && other.has(c))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_agreed_flag_names() {
        let names: Vec<&str> = Capability::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "reconnect",
                "metadata",
                "list",
                "pause_resume",
                "timeout_refresh",
                "fs_enumeration",
                "snapshots",
                "volumes",
                "template_catalog",
                "connect_probe",
                "keep_alive",
                "pty",
                "desktop",
                "posix_shell",
                "processes",
                "streamed_files",
                "watch",
                "terminal_reattach",
                "default_user",
                "tunnels",
                "template_builds"
            ]
        );
        // The serde name, the struct field name and as_str agree.
        let all = Capability::ALL
            .iter()
            .fold(Capabilities::NONE, |s, &c| s.with(c, true));
        let json = serde_json::to_value(all).unwrap();
        for c in Capability::ALL {
            assert_eq!(json[c.as_str()], serde_json::Value::Bool(true), "{c}");
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }

    #[test]
    fn with_has_and_intersect() {
        let a = Capabilities::from_slice(&[Capability::Pty, Capability::List]);
        assert!(a.has(Capability::Pty) && a.has(Capability::List) && !a.has(Capability::Desktop));
        let b = Capabilities::from_slice(&[Capability::List, Capability::Desktop]);
        assert_eq!(
            a.intersect(&b),
            Capabilities::from_slice(&[Capability::List])
        );
        assert!(a.contains_all(&Capabilities::from_slice(&[Capability::Pty])));
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![Capability::List, Capability::Pty]
        );
    }
}

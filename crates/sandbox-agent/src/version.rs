//! The envd version the agent reports, and the table of version gates it is derived from.
//!
//! Clients of envd do not probe for features: the official SDK compares the envd version the
//! control plane reports for a sandbox against fixed thresholds, and only then uses a feature
//! (or refuses, telling the user to rebuild the template). Reporting a version is therefore a
//! promise that every feature gated at or below it works. [`GATES`] lists every threshold the
//! SDK (e2b 2.63) has, with the feature and the test that proves it;
//! [`ENVD_VERSION`] is the highest version all of whose gates, and all lower ones, are
//! implemented. A unit test below fails when it claims more, and `tests/agent/gates.rs`
//! iterates this same table with one check per [`Feature`], so a row cannot be added without
//! a check.

use std::fmt;

/// What the agent reports as its envd version (`docs/envd.md`, "Version gates").
pub const ENVD_VERSION: &str = "0.6.4";

/// A feature the SDK gates on the envd version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// The SDK creates no sandbox below this: the process and filesystem services, `/files`
    /// and `/health` as a whole.
    Base,
    /// `watch_dir(recursive=True)`: `WatchDirRequest.recursive`.
    RecursiveWatch,
    /// `get_metrics()`: the control plane reads envd's `GET /metrics`.
    Metrics,
    /// Disk figures in the metrics: `disk_used`, `disk_total`.
    DiskMetrics,
    /// `commands.run(stdin=False)`: `ProcessConfig`'s explicit `stdin: false`.
    StdinFalse,
    /// The SDK stops sending `Authorization: Basic user:` when no user is named: envd applies
    /// its default user.
    DefaultUser,
    /// `commands.close_stdin(pid)`: `process.Process/CloseStdin`.
    CloseStdin,
    /// `files.write` as `application/octet-stream` (gzip-encoded, streamed) instead of
    /// multipart.
    OctetStreamUpload,
    /// `files.write(metadata=...)`: `X-Metadata-<key>` headers on `POST /files`.
    FileMetadata,
    /// `watch_dir(include_entry=True)`: `WatchDirRequest.includeEntry`, events carry `entry`.
    EventEntry,
    /// `watch_dir(allow_network_mounts=True)`: `WatchDirRequest.allowNetworkMounts` (field
    /// 4); without it a directory on NFS, CIFS, SMB or FUSE is refused.
    WatchNetworkMounts,
}

/// An envd version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u16, pub u16, pub u16);

impl Version {
    /// Parses `major.minor.patch` (digits only).
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.split('.');
        let mut next = || -> Option<u16> {
            let part = parts.next()?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        };
        let version = Version(next()?, next()?, next()?);
        parts.next().is_none().then_some(version)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// One threshold of the SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The lowest envd version at which the SDK uses the feature.
    pub version: Version,
    pub feature: Feature,
    /// What the SDK does differently at this version, on the wire.
    pub wire: &'static str,
    /// Whether the agent implements it.
    pub implemented: bool,
    /// The check in `tests/agent/gates.rs` that proves it.
    pub proof: &'static str,
}

/// Every version gate of the SDK, lowest first.
pub const GATES: &[Gate] = &[
    Gate {
        version: Version(0, 1, 0),
        feature: Feature::Base,
        wire: "sandbox creation: the SDK refuses a sandbox whose envd is older",
        implemented: true,
        proof: "GET /health is 204 and a started process's output and exit code arrive",
    },
    Gate {
        version: Version(0, 1, 4),
        feature: Feature::RecursiveWatch,
        wire: "WatchDirRequest {\"recursive\": true}",
        implemented: true,
        proof: "a recursive WatchDir reports a file created two directories down",
    },
    Gate {
        version: Version(0, 1, 5),
        feature: Feature::Metrics,
        wire: "GET /metrics (JSON: ts, cpu_count, cpu_used_pct, mem_total, mem_used, ...)",
        implemented: true,
        proof: "GET /metrics needs the token and answers plausible CPU, memory and time figures",
    },
    Gate {
        version: Version(0, 2, 4),
        feature: Feature::DiskMetrics,
        wire: "GET /metrics carries disk_used and disk_total (bytes, of /)",
        implemented: true,
        proof: "disk_total is the statvfs size of / and 0 < disk_used <= disk_total",
    },
    Gate {
        version: Version(0, 3, 0),
        feature: Feature::StdinFalse,
        wire: "StartRequest.process {\"stdin\": false}",
        implemented: true,
        proof: "cat started with stdin false reads EOF at once and exits 0",
    },
    Gate {
        version: Version(0, 4, 0),
        feature: Feature::DefaultUser,
        wire: "no Authorization header when the caller names no user",
        implemented: true,
        proof: "without Basic auth a process runs as --default-user, with it as the named user",
    },
    Gate {
        version: Version(0, 5, 2),
        feature: Feature::CloseStdin,
        wire: "POST /process.Process/CloseStdin",
        implemented: true,
        proof: "CloseStdin ends a running cat, which has echoed the input sent before",
    },
    Gate {
        version: Version(0, 5, 7),
        feature: Feature::OctetStreamUpload,
        wire: "POST /files Content-Type: application/octet-stream, Content-Encoding: gzip",
        implemented: true,
        proof: "a gzip octet-stream upload of 1 MiB reads back byte for byte",
    },
    Gate {
        version: Version(0, 6, 2),
        feature: Feature::FileMetadata,
        wire: "POST /files X-Metadata-<key>: <value>",
        implemented: true,
        proof: "uploaded metadata is in the answer's entry and in Stat's EntryInfo.metadata",
    },
    Gate {
        version: Version(0, 6, 3),
        feature: Feature::EventEntry,
        wire: "WatchDirRequest {\"includeEntry\": true}; events carry \"entry\"",
        implemented: true,
        proof: "the create event of a watched file carries its EntryInfo",
    },
    Gate {
        version: Version(0, 6, 4),
        feature: Feature::WatchNetworkMounts,
        wire: "WatchDirRequest {\"allowNetworkMounts\": true}",
        implemented: true,
        proof: "WatchDir and CreateWatcher accept allowNetworkMounts and report events",
    },
];

/// The highest version `gates` allow claiming: the version of the last gate such that it and
/// every lower gate are implemented (`0.0.0` when the first is not).
pub fn highest_claimable(gates: &[Gate]) -> Version {
    let mut sorted: Vec<&Gate> = gates.iter().collect();
    sorted.sort_by_key(|g| g.version);
    let mut claim = Version(0, 0, 0);
    for gate in sorted {
        if !gate.implemented {
            // A version between this gate and the last implemented one would still be
            // honest, but the SDK knows no feature there: claim the last one reached.
            break;
        }
        claim = gate.version;
    }
    claim
}

/// [`ENVD_VERSION`] as a [`Version`].
pub fn envd_version() -> Version {
    // A unit test proves the constant parses; the fallback only keeps this total.
    Version::parse(ENVD_VERSION).unwrap_or(Version(0, 0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reported_version_is_exactly_what_the_table_allows() {
        let claimed = Version::parse(ENVD_VERSION).expect("ENVD_VERSION parses");
        let allowed = highest_claimable(GATES);
        assert!(
            claimed <= allowed,
            "ENVD_VERSION {claimed} is higher than the gate table allows ({allowed})"
        );
        // Not claiming less than is built either: the SDK would refuse working features.
        assert_eq!(claimed, allowed);
        for gate in GATES.iter().filter(|g| g.version <= claimed) {
            assert!(gate.implemented, "{gate:?} is claimed but not implemented");
        }
    }

    #[test]
    fn the_table_is_sorted_and_names_each_feature_once() {
        for pair in GATES.windows(2) {
            assert!(pair[0].version < pair[1].version, "{pair:?}");
        }
        let mut seen = std::collections::HashSet::new();
        for gate in GATES {
            assert!(seen.insert(gate.feature), "{:?} twice", gate.feature);
            assert!(!gate.proof.is_empty() && !gate.wire.is_empty());
        }
    }

    #[test]
    fn an_unimplemented_gate_caps_the_claim() {
        let mut gates = GATES.to_vec();
        let at = gates
            .iter()
            .position(|g| g.feature == Feature::CloseStdin)
            .unwrap();
        gates[at].implemented = false;
        assert_eq!(highest_claimable(&gates), Version(0, 4, 0));
        gates[0].implemented = false;
        assert_eq!(highest_claimable(&gates), Version(0, 0, 0));
        assert_eq!(highest_claimable(GATES), Version(0, 6, 4));
    }

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(Version::parse("0.6.4"), Some(Version(0, 6, 4)));
        assert_eq!(Version::parse("10.0.12"), Some(Version(10, 0, 12)));
        for bad in ["", "0.6", "0.6.4.1", "0.6.x", "v0.6.4", "0..4", "0.6.-1"] {
            assert_eq!(Version::parse(bad), None, "{bad}");
        }
        assert_eq!(Version(0, 5, 7).to_string(), "0.5.7");
        assert!(Version(0, 10, 0) > Version(0, 9, 9));
        assert_eq!(envd_version().to_string(), ENVD_VERSION);
    }
}

//! Templates and snapshots.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ids::{SandboxId, SnapshotId, TenantId};
use crate::timefmt;

/// The provider-neutral view of a template, as a settings page lists it. IDs stay opaque.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Template {
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// This is the workspace's standard (command-line) template.
    #[serde(default)]
    pub standard: bool,
    /// This is the desktop sibling of the standard template.
    #[serde(default)]
    pub desktop: bool,
    /// The provider's own explanation of a failed build.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One provider-side snapshot. Its ID can be passed back as a create request's template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    pub id: SnapshotId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken from, when the provider records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SandboxId>,
    #[serde(
        default,
        with = "timefmt::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    pub created_at: Option<OffsetDateTime>,
    /// The tenant whose sandbox it was taken from, when the provider records it (per-tenant
    /// snapshot quotas count these). Not serialized: it is the provider's record, never input.
    #[serde(skip)]
    pub tenant: Option<TenantId>,
}

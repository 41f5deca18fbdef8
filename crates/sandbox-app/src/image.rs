//! The image `sandbox serve` boots by default.

/// A locally built image (never pulled from a registry by default): the same `FROM scratch` +
/// busybox-static image `cargo xtask test` builds, tagged for service use.
pub const DEFAULT_IMAGE: &str = "sandbox-busybox:test";

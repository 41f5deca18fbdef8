//! The image `sandbox serve` boots by default.

/// A locally built image (never pulled from a registry by default): the same `FROM scratch` +
/// busybox-static image `cargo xtask test` builds, tagged for service use. Defined by the
/// Docker adapter, whose config defaults to it.
#[cfg(feature = "docker")]
pub use sandbox_provider_docker::config::DEFAULT_IMAGE;

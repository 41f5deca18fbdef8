//! The static `sandbox-agent` the engine tests install in containers: one place for where it
//! comes from and how its absence is told, shared by the Docker adapter's and the service's
//! tests.

use std::path::PathBuf;

/// Names the static agent; the docker engine and e2b sdk stages of `cargo xtask test` set it
/// to the one their agent stage built.
pub const ENV_AGENT_BIN: &str = "SANDBOX_AGENT_BIN";

/// The static agent [`ENV_AGENT_BIN`] names, checked to be a file; a clear panic (the test
/// fails, it never skips) when it is unset or missing.
pub fn agent_bin() -> PathBuf {
    let path = PathBuf::from(std::env::var_os(ENV_AGENT_BIN).unwrap_or_else(|| {
        panic!(
            "{ENV_AGENT_BIN} must name a static build of sandbox-agent (`cargo xtask agent` prints it)"
        )
    }));
    assert!(
        path.is_file(),
        "{ENV_AGENT_BIN}={} is not a file",
        path.display()
    );
    path
}

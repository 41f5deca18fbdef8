//! `sandbox-agent` in every container, without it being in the image (agent mode,
//! `docker.data_plane = "agent"`).
//!
//! - `binary.rs`: finding the agent (`docker.agent_path`, default beside the running binary),
//!   checking it (a static ELF that answers `--version` with this adapter's version), and
//!   holding its bytes. Done once at the adapter's start: a missing, dynamic or mismatched agent
//!   fails the start with the fix named, never a silent switch to exec mode.
//! - `install.rs`: the tar stream that carries the agent into a created container through the
//!   engine's archive endpoint, before the container starts.
//!
//! In agent mode the container's entrypoint is the agent ([`entrypoint`]), so it is PID 1 and
//! the engine's init is off: the agent adopts and reaps orphans itself. It replaces the exec
//! mode's idling shell as the container's long-running process, as that shell replaced the
//! image's own entrypoint and command: neither mode runs what the image names.
//!
//! What this increment does not do yet: commands, files and terminals still go through
//! `docker exec` in agent mode. Routing them through the agent over a kept channel (and the
//! agent's version check on the channel's first exchange) is the next step of issue 16.

pub mod binary;
pub(crate) mod install;

pub use binary::{AgentBinary, VERSION, default_path};

/// The directory inside every agent-mode container that holds the agent; the file API refuses
/// it (`crate::files`).
pub const AGENT_DIR: &str = "/.sandbox";
/// Where the agent binary is installed inside the container.
pub const AGENT_PATH: &str = "/.sandbox/sandbox-agent";
/// The unix socket the agent will listen on once the channel reaches it there.
pub const AGENT_SOCKET: &str = "/.sandbox/agent.sock";

/// The flags the agent runs with as PID 1, after its path. One constant so the flag set can
/// change in one place.
///
/// Today the agent listens on loopback TCP only: inside the container, so no other sandbox on
/// a shared bridge can reach it, and nothing on the host uses it yet. When the agent gains
/// `--listen-unix` and `--activity-marker` (the channel's increment of issue 16), this becomes
/// `--listen-unix /.sandbox/agent.sock --activity-marker /var/lib/sandbox-activity`
/// ([`AGENT_SOCKET`], [`crate::exec::ACTIVITY_MARKER`]); an agent refuses flags it does not
/// know, so they are added together with the agent that takes them.
pub const AGENT_FLAGS: &[&str] = &["--listen", "127.0.0.1:49983"];

/// The container entrypoint of agent mode: the installed agent and [`AGENT_FLAGS`].
pub fn entrypoint() -> Vec<String> {
    std::iter::once(AGENT_PATH)
        .chain(AGENT_FLAGS.iter().copied())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrypoint_runs_the_installed_agent_with_its_flags() {
        let argv = entrypoint();
        assert_eq!(argv[0], AGENT_PATH);
        assert_eq!(&argv[1..], AGENT_FLAGS);
        assert!(AGENT_PATH.starts_with(&format!("{AGENT_DIR}/")));
        assert!(AGENT_SOCKET.starts_with(&format!("{AGENT_DIR}/")));
        // Never reachable from outside the container: loopback, or a unix socket.
        let listen = argv.iter().position(|a| a == "--listen");
        if let Some(at) = listen {
            assert!(argv[at + 1].starts_with("127.0.0.1:"), "{argv:?}");
        }
    }
}

//! `sandbox-agent` in every container, without it being in the image (agent mode,
//! `docker.data_plane = "agent"`).
//!
//! - `binary.rs`: finding the agent (`docker.agent_path`, default beside the running binary),
//!   checking it (a static ELF that answers `--version` with this adapter's version), and
//!   holding its bytes. Done once at the adapter's start: a missing, dynamic or mismatched agent
//!   fails the start with the fix named, never a silent switch to exec mode.
//! - `install.rs`: the tar stream that carries the agent into a created container through the
//!   engine's archive endpoint, before the container starts.
//! - `files.rs`: the file operations of agent mode, through the kept channel
//!   (`crate::channel`) to the agent instead of an exec each.
//!
//! In agent mode the container's entrypoint is the agent ([`entrypoint`]), so it is PID 1 and
//! the engine's init is off: the agent adopts and reaps orphans itself. It replaces the exec
//! mode's idling shell as the container's long-running process, as that shell replaced the
//! image's own entrypoint and command: neither mode runs what the image names.
//!
//! - `exec.rs`: commands through the agent, one `Start` on the kept channel (`crate::channel`)
//!   per command, with exec mode's semantics (shell, timeout, cancellation, output caps).
//! - `terminal.rs`: terminals through the agent, a PTY process with exec mode's hang-up on
//!   close.
//! - `process.rs`: background processes (the port's `Processes`) through the agent: start,
//!   the agent's listing of live and recently ended processes, attach with replay, input,
//!   signals, under the per-sandbox cap `docker.processes_per_sandbox`.
//!
//! Agent mode is the default data plane; exec mode (`docker.data_plane = "exec"`) is the
//! declared fallback, never switched to silently.

pub mod binary;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod install;
pub(crate) mod process;
pub(crate) mod terminal;

pub use binary::{AgentBinary, VERSION, default_path};

/// The directory inside every agent-mode container that holds the agent; the file API refuses
/// it (`crate::files`).
pub const AGENT_DIR: &str = "/.sandbox";
/// Where the agent binary is installed inside the container.
pub const AGENT_PATH: &str = "/.sandbox/sandbox-agent";
/// The unix socket the agent listens on; the channel's relay connects to it.
pub const AGENT_SOCKET: &str = "/.sandbox/agent.sock";

/// The flags the agent runs with as PID 1, after its path. One constant so the flag set can
/// change in one place.
///
/// The agent listens on the unix socket only ([`AGENT_SOCKET`], mode 0600): no TCP port, so no
/// other sandbox on a shared bridge, and nothing in network `none`, can reach it; the service
/// reaches it through the channel (`crate::channel`), whose exec runs `sandbox-agent relay`
/// against that socket. Every request it serves touches the activity marker the idle sweeper
/// reads ([`crate::exec::ACTIVITY_MARKER`]; the install carries it, so its directory exists).
pub const AGENT_FLAGS: &[&str] = &[
    "--listen-unix",
    AGENT_SOCKET,
    "--activity-marker",
    crate::exec::ACTIVITY_MARKER,
    // Every process's replay ring, named rather than left to the agent's default, because the
    // adapter reports it (`process::RING_BYTES`).
    "--output-ring-bytes",
    "1048576",
    // The tunnels it keeps open at once, named because the adapter reports the bound
    // (`channel::tunnel::TUNNELS_PER_SANDBOX`).
    "--max-tunnels",
    "32",
];

/// The flag that caps the processes the agent runs at once (`docker.processes_per_sandbox`).
pub const MAX_PROCESSES_FLAG: &str = "--max-processes";

/// The flag that names one reserved tree to the agent.
pub const RESERVED_PATH_FLAG: &str = "--reserved-path";

/// The flags that name the sandbox's default user and workdir to the agent
/// (`[create.user]`): what a request names no user for acts as it, in the agent's own router
/// too, which is what SDK clients relayed to the agent reach.
pub const DEFAULT_USER_FLAG: &str = "--default-user";
/// See [`DEFAULT_USER_FLAG`].
pub const DEFAULT_WORKDIR_FLAG: &str = "--default-workdir";

/// The container entrypoint of agent mode: the installed agent, [`AGENT_FLAGS`], then
/// [`RESERVED_PATH_FLAG`] for each tree the file API reserves (`crate::files::RESERVED`, the
/// same list exec mode refuses, so the two cannot drift): the agent judges every file
/// operation's path where it resolves inside the container, which the service cannot see.
pub fn entrypoint() -> Vec<String> {
    std::iter::once(AGENT_PATH)
        .chain(AGENT_FLAGS.iter().copied())
        .chain(
            crate::files::RESERVED
                .iter()
                .flat_map(|tree| [RESERVED_PATH_FLAG, tree]),
        )
        .map(str::to_owned)
        .collect()
}

/// [`entrypoint`], with `env` as the default environment of every process the agent starts
/// (`--env KEY=VALUE`): the sandbox's environment ([`sandbox_env`]), which the agent does not
/// pass on from its own; and `max_processes` as the cap on the processes it runs at once
/// ([`MAX_PROCESSES_FLAG`]; commands and terminals count too); and `user`, the create
/// request's default user, as [`DEFAULT_USER_FLAG`] and [`DEFAULT_WORKDIR_FLAG`] (without
/// one the agent's defaults hold: root, and the adapter names the workspace root as every
/// call's cwd).
///
/// A restart of the container runs this same argv again (it is the container's entrypoint),
/// so the user survives a stop; a restore builds it anew from its own create request.
pub fn entrypoint_with_env(
    env: &std::collections::BTreeMap<String, String>,
    max_processes: usize,
    user: Option<&sandbox_core::SandboxUser>,
) -> Vec<String> {
    let mut argv = entrypoint();
    argv.push(MAX_PROCESSES_FLAG.to_owned());
    argv.push(max_processes.to_string());
    if let Some(user) = user {
        argv.push(DEFAULT_USER_FLAG.to_owned());
        argv.push(user.name.clone());
        argv.push(DEFAULT_WORKDIR_FLAG.to_owned());
        argv.push(user.workdir.as_str().to_owned());
    }
    for (k, v) in env {
        argv.push("--env".to_owned());
        argv.push(format!("{k}={v}"));
    }
    argv
}

/// The environment every process of an agent-mode sandbox starts from, as exec mode's processes
/// get it from the engine: the image's `ENV` (`image`, the `KEY=VALUE` lines of its config),
/// overridden key by key by the create request's `request`. A command's own env overrides both,
/// in the agent.
///
/// Computed here, not taken from the agent's own environment: the engine gives PID 1 more than
/// the container's environment (its runtime sets `HOME` for PID 1's account, root, which must
/// not reach a process started as another user), and what it added cannot be told apart from
/// what the image set. The image is the one the container is created from, so a restore gets
/// its snapshot's environment, which is the source's image `ENV` and create env, committed; a
/// restart runs the same entrypoint again.
///
/// `PATH` is left out: the engine already gives the agent the image's (or the request's)
/// `PATH`, and the agent hands its own on. An entry without `=`, with an empty name, or with a
/// NUL (which no argument can carry) is left out, as the engine would not set it either.
pub fn sandbox_env(
    image: &[String],
    request: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let mut env = std::collections::BTreeMap::new();
    let image = image.iter().filter_map(|line| line.split_once('='));
    let request = request.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    for (k, v) in image.chain(request) {
        if k.is_empty() || k == "PATH" || k.contains('\0') || v.contains('\0') {
            continue;
        }
        env.insert(k.to_owned(), v.to_owned());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrypoint_runs_the_installed_agent_with_its_flags() {
        let argv = entrypoint();
        assert_eq!(argv[0], AGENT_PATH);
        assert_eq!(&argv[1..=AGENT_FLAGS.len()], AGENT_FLAGS);
        // Every reserved tree of the file API, and nothing else, follows as --reserved-path.
        let reserved: Vec<&str> = argv[AGENT_FLAGS.len() + 1..]
            .chunks(2)
            .map(|pair| {
                assert_eq!(pair[0], RESERVED_PATH_FLAG, "{argv:?}");
                pair[1].as_str()
            })
            .collect();
        assert_eq!(reserved, crate::files::RESERVED);
        assert!(reserved.contains(&AGENT_DIR) && reserved.contains(&"/proc"));
        assert!(AGENT_PATH.starts_with(&format!("{AGENT_DIR}/")));
        assert!(AGENT_SOCKET.starts_with(&format!("{AGENT_DIR}/")));
        // Never reachable from outside the container: a unix socket, no TCP listener.
        assert!(!argv.iter().any(|a| a == "--listen"), "{argv:?}");
        let at = argv.iter().position(|a| a == "--listen-unix");
        assert_eq!(at.map(|at| argv[at + 1].as_str()), Some(AGENT_SOCKET));
        let at = argv.iter().position(|a| a == "--activity-marker");
        assert_eq!(
            at.map(|at| argv[at + 1].as_str()),
            Some(crate::exec::ACTIVITY_MARKER)
        );
    }

    #[test]
    fn the_sandbox_environment_becomes_the_agents_defaults() {
        let env = std::collections::BTreeMap::from([
            ("A".to_owned(), "1=2".to_owned()),
            ("B".to_owned(), "x y".to_owned()),
        ]);
        let argv = entrypoint_with_env(&env, 7, None);
        assert_eq!(&argv[..entrypoint().len()], entrypoint().as_slice());
        assert_eq!(
            &argv[entrypoint().len()..],
            ["--max-processes", "7", "--env", "A=1=2", "--env", "B=x y"]
        );
        // A default user is named to the agent with its workdir, before the environment.
        let user = sandbox_core::SandboxUser::new(
            "user",
            sandbox_core::SandboxPath::new("/home/user").unwrap(),
        )
        .unwrap();
        let named = entrypoint_with_env(&env, 7, Some(&user));
        assert_eq!(
            &named[entrypoint().len()..],
            [
                "--max-processes",
                "7",
                "--default-user",
                "user",
                "--default-workdir",
                "/home/user",
                "--env",
                "A=1=2",
                "--env",
                "B=x y"
            ]
        );
        // The ring the adapter reports is the ring the agent is started with.
        let at = argv.iter().position(|a| a == "--output-ring-bytes");
        assert_eq!(
            at.map(|at| argv[at + 1].as_str()),
            Some(process::RING_BYTES.to_string().as_str())
        );
    }

    #[test]
    fn the_sandbox_environment_is_the_images_overridden_by_the_requests() {
        let image = [
            "PATH=/image/bin".to_owned(),
            "LANG=C.UTF-8".to_owned(),
            "SHARED=image".to_owned(),
            "EQ=a=b".to_owned(),
            "EMPTY=".to_owned(),
            "NOVALUE".to_owned(),
            "=nameless".to_owned(),
            "NUL=a\0b".to_owned(),
        ];
        let request = std::collections::BTreeMap::from([
            ("SHARED".to_owned(), "request".to_owned()),
            ("ONLY".to_owned(), "request".to_owned()),
        ]);
        let env = sandbox_env(&image, &request);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            env,
            [
                ("EMPTY", ""),
                ("EQ", "a=b"),
                ("LANG", "C.UTF-8"),
                ("ONLY", "request"),
                ("SHARED", "request"),
            ]
        );
        // Nothing from the image: the request's alone, as before.
        assert_eq!(sandbox_env(&[], &request), request);
    }
}

//! The Docker backend's agent mode for `sandbox serve` as a child process, set explicitly
//! (whatever the default is), and the engine's view of the agent channel's relay execs.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

/// The environment of a `sandbox serve` in agent mode: the static agent `SANDBOX_AGENT_BIN`
/// names (`cargo xtask agent` prints it; the docker engine stage of `cargo xtask test` sets it).
pub(crate) fn env() -> Vec<(&'static str, String)> {
    let agent = super::agent_bin().display().to_string();
    vec![
        ("SANDBOX_DOCKER_DATA_PLANE", "agent".to_owned()),
        ("SANDBOX_DOCKER_AGENT_PATH", agent),
    ]
}

/// The environment of a `sandbox serve` in exec mode, set explicitly too.
pub(crate) fn exec_env() -> Vec<(&'static str, String)> {
    vec![("SANDBOX_DOCKER_DATA_PLANE", "exec".to_owned())]
}

/// `env` as the borrowed pairs [`super::serve::Service::spawn`] takes.
pub(crate) fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The host PIDs of the agent channel's relays (`sandbox-agent relay <socket>`, one exec per
/// open channel) running in `container`, as the engine lists the container's processes.
pub(crate) fn relay_pids(container: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(["top", container, "-o", "pid,args"])
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    assert!(out.status.success(), "docker top {container}: {out:?}");
    let relay = sandbox_provider_docker::channel::RELAY_ARGV.join(" ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter(|line| line.contains(&relay))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

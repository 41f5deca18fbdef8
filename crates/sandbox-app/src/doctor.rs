//! `sandbox doctor`: checks what the service needs, explains each fix, and fails (non-zero
//! exit) when something is wrong. A warning is a weakness of a working setup (the engine cannot
//! bound a sandbox's disk, root in a sandbox is not remapped): shown with its fix, it does not
//! fail the exit code.

use std::fmt::Write as _;

use crate::config::ServiceConfig;

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    /// False for a failure, which makes the exit code non-zero.
    pub ok: bool,
    /// A warning: the setup works, with a weakness the operator should know of.
    pub warn: bool,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when fine).
    pub fix: String,
}

impl Check {
    fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Check {
            name,
            ok: true,
            warn: false,
            detail: detail.into(),
            fix: String::new(),
        }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name,
            ok: false,
            warn: false,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
    #[cfg_attr(not(any(feature = "docker", feature = "e2b")), allow(dead_code))]
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name,
            ok: true,
            warn: true,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

/// Runs every check against `config`.
pub async fn run(config: &ServiceConfig) -> Vec<Check> {
    let mut checks = vec![Check::pass(
        "config",
        format!("listen {}, store {}", config.listen, config.store),
    )];
    checks.push(store(config).await);
    checks.extend(backend(config).await);
    checks
}

async fn store(config: &ServiceConfig) -> Check {
    match config.store.as_str() {
        "memory" => Check::pass(
            "store",
            "memory store (single process; bindings do not survive a restart, sandboxes are re-adopted by metadata)",
        ),
        #[cfg(feature = "redis")]
        "redis" => match redis_section(config) {
            Ok(section) => redis_check(section).await,
            Err(e) => Check::fail(
                "store",
                e,
                "set redis.url or redis.cluster_nodes (SANDBOX_REDIS_URL, SANDBOX_REDIS_CLUSTER_NODES)",
            ),
        },
        other => Check::fail(
            "store",
            format!("store {other:?} is not available in this build"),
            "set store = \"memory\" or \"redis\" (SANDBOX_STORE)",
        ),
    }
}

#[cfg(feature = "redis")]
fn redis_section(config: &ServiceConfig) -> Result<&sandbox_store_redis::RedisStoreConfig, String> {
    config
        .redis
        .as_ref()
        .ok_or_else(|| "store \"redis\" has no [redis] section".to_owned())
}

#[cfg(feature = "redis")]
async fn redis_check(section: &sandbox_store_redis::RedisStoreConfig) -> Check {
    match crate::serve::redis_store(section).await {
        Ok(store) => match store.ping().await {
            Ok(()) => Check::pass("store", "redis answers"),
            Err(e) => Check::fail(
                "store",
                e.to_string(),
                "check that Redis is up and reachable from this host",
            ),
        },
        Err(e) => {
            let fix = if e.contains("auth") || e.contains("WRONGPASS") || e.contains("NOAUTH") {
                "set the ACL user and password (redis.username, SANDBOX_REDIS_PASSWORD)"
            } else {
                "start Redis or correct redis.url / redis.cluster_nodes (SANDBOX_REDIS_URL, SANDBOX_REDIS_CLUSTER_NODES)"
            };
            Check::fail("store", e, fix)
        }
    }
}

/// The chosen backend's checks.
async fn backend(config: &ServiceConfig) -> Vec<Check> {
    match config.provider {
        #[cfg(feature = "docker")]
        crate::config::Backend::Docker => docker_backend(config).await,
        #[cfg(feature = "e2b")]
        crate::config::Backend::E2b => e2b_backend(config).await,
        #[allow(unreachable_patterns, reason = "a build without every backend")]
        other => vec![Check::fail(
            "backend",
            format!(
                "this build has no backend for provider = \"{}\"",
                other.name()
            ),
            format!("build with the `{}` feature", other.name()),
        )],
    }
}

/// How long the doctor's probe sandbox may live if its delete is lost: the plane reclaims it.
#[cfg(feature = "e2b")]
const E2B_PROBE_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The E2B backend: the control plane answers and accepts the key (a one-item list), then one
/// envd round trip in a short-lived sandbox of the configured template (create, `true`,
/// delete), so a wrong sandbox domain, gateway or template shows here rather than at the first
/// session.
#[cfg(feature = "e2b")]
async fn e2b_backend(config: &ServiceConfig) -> Vec<Check> {
    use sandbox_core::{
        CreateRequest, ExecRequest, IdleTimeout, SandboxProvider as _, TimeoutAction, TimeoutPolicy,
    };
    let section = &config.e2b_provider;
    let mut out = Vec::new();
    let provider = match crate::serve::connect_e2b(config) {
        Ok(p) => p,
        Err(e) => {
            out.push(Check::fail(
                "e2b control plane",
                e,
                "complete the [e2b_provider] section (SANDBOX_E2B_PROVIDER_*)",
            ));
            return out;
        }
    };
    if let Err(e) = provider.health().await {
        let fix = match e.kind() {
            sandbox_core::ErrorKind::Authentication => {
                "set a valid key in e2b_provider.api_key (SANDBOX_E2B_PROVIDER_API_KEY)"
            }
            _ => {
                "check e2b_provider.api_url and that this host reaches it (a private address needs e2b_provider.allow_private_endpoints)"
            }
        };
        out.push(Check::fail("e2b control plane", e.to_string(), fix));
        return out;
    }
    out.push(Check::pass(
        "e2b control plane",
        format!("{} answers and accepts the key", section.api_url),
    ));
    let template = match sandbox_core::TemplateId::new(section.template.trim()) {
        Ok(t) => t,
        Err(e) => {
            out.push(Check::fail(
                "e2b envd",
                e.to_string(),
                "set e2b_provider.template",
            ));
            return out;
        }
    };
    let mut request = CreateRequest::new(template);
    if let Ok(idle) = IdleTimeout::after(E2B_PROBE_TTL) {
        request.timeout = TimeoutPolicy {
            idle,
            on_timeout: TimeoutAction::Kill,
            auto_resume: false,
        };
    }
    let handle = match provider.create(request).await {
        Ok(h) => h,
        Err(e) => {
            out.push(Check::fail(
                "e2b envd",
                format!("cannot create a sandbox of {}: {e}", section.template),
                "check that e2b_provider.template names a template the key may use",
            ));
            return out;
        }
    };
    let ran = provider
        .exec(&handle, ExecRequest::argv("true", Vec::<String>::new()))
        .await;
    let deleted = provider.delete(handle.id()).await;
    match ran {
        Ok(result) if result.success() => out.push(Check::pass(
            "e2b envd",
            format!("a command ran in sandbox {} through envd", handle.id()),
        )),
        Ok(result) => out.push(Check::fail(
            "e2b envd",
            format!("`true` exited {} in sandbox {}", result.exit_code, handle.id()),
            "the template's image lacks a working userland",
        )),
        Err(e) => out.push(Check::fail(
            "e2b envd",
            format!("envd of sandbox {} did not answer: {e}", handle.id()),
            "check e2b_provider.sandbox_domain and e2b_provider.proxy_url (a self-hosted plane routes by Host at its gateway)",
        )),
    }
    if let Err(e) = deleted {
        out.push(Check::warn(
            "e2b envd",
            format!("the probe sandbox {} was not deleted: {e}", handle.id()),
            "the plane reclaims it after its 60 s timeout",
        ));
    }
    out
}

#[cfg(feature = "docker")]
async fn docker_backend(config: &ServiceConfig) -> Vec<Check> {
    let section = &config.docker;
    if !section.enabled {
        return vec![Check::fail(
            "docker backend",
            "disabled: a Docker socket is root on its host, so the backend is off until an operator enables it",
            "enable it with docker.enabled = true in the config file, or SANDBOX_DOCKER_ENABLED=true in the environment",
        )];
    }
    use sandbox_core::SandboxProvider as _;
    let mut out = Vec::new();
    let (plane, agent_ok) = data_plane(section).await;
    out.push(plane);
    // An agent-mode config whose agent is unusable cannot connect at all (the start fails, as
    // it must); the engine is still checked, in exec mode, so one run shows every problem.
    let exec_fallback;
    let config = if agent_ok {
        config
    } else {
        let mut c = config.clone();
        c.docker.data_plane = sandbox_provider_docker::DataPlane::Exec;
        exec_fallback = c;
        &exec_fallback
    };
    // The backend alone: doctor must not create token files or anything else `serve` sets up.
    let provider = match crate::serve::connect_docker(config).await {
        Ok(p) => p,
        Err(e) => {
            let fix = if e.contains("does not exist") || e.contains("socket") {
                "start the Docker engine (`dockerd`, Debian package docker.io) or point docker.host / DOCKER_HOST at its socket"
            } else if e.contains("permission denied") {
                "run the service as a user allowed to use the Docker socket (root, or the docker group)"
            } else {
                "see the message above; `cargo xtask test` shows how the engine is started here"
            };
            out.push(Check::fail("docker engine", e, fix));
            return out;
        }
    };
    match provider.health().await {
        Ok(()) => out.push(Check::pass("docker engine", "the engine answers")),
        Err(e) => {
            out.push(Check::fail(
                "docker engine",
                e.to_string(),
                "start dockerd, or fix docker.host",
            ));
            return out;
        }
    }
    match sandbox_core::narrow::template_catalog(&provider) {
        Some(catalog) => match catalog.list_templates().await {
            Ok(list) if list.iter().any(|t| t.id == section.image.as_str()) => out.push(
                Check::pass("image", format!("{} is present", section.image)),
            ),
            Ok(_) => out.push(missing_image(section)),
            Err(e) => out.push(Check::fail("image", e.to_string(), "check the engine")),
        },
        None => out.push(Check::fail(
            "image",
            "the backend has no template catalog",
            "",
        )),
    }
    match provider.isolation_report().await {
        Ok(report) => out.extend(isolation(&report)),
        Err(e) => out.push(Check::fail(
            "docker isolation",
            e.to_string(),
            "check the engine",
        )),
    }
    out
}

/// The data plane (`docker.data_plane`) and, in agent mode, the agent binary: the same check
/// the adapter's start makes, so `doctor` fails where `serve` would. The flag says whether the
/// config can connect as it is.
#[cfg(feature = "docker")]
async fn data_plane(section: &sandbox_provider_docker::DockerConfig) -> (Check, bool) {
    use sandbox_provider_docker::DataPlane;
    use sandbox_provider_docker::agent::{AgentBinary, binary::FIX};
    const NAME: &str = "docker data plane";
    match section.data_plane {
        DataPlane::Exec => (
            Check::pass(
                NAME,
                "exec: every command, file operation and terminal is a docker exec (the declared \
                 fallback; the default, docker.data_plane = \"agent\", runs sandbox-agent as each \
                 sandbox's PID 1)",
            ),
            true,
        ),
        DataPlane::Agent => match AgentBinary::load(section.agent_path.as_deref()).await {
            Ok(agent) => (
                Check::pass(
                    NAME,
                    format!(
                        "agent: {} (version {}, statically linked, {} bytes) is copied into \
                         every sandbox at create and runs as its PID 1; commands, files and \
                         terminals go over one kept exec channel to it",
                        agent.path().display(),
                        agent.version(),
                        agent.bytes().len()
                    ),
                ),
                true,
            ),
            Err(e) => {
                let message = e.message();
                let detail = message.strip_suffix(&format!("; {FIX}")).unwrap_or(message);
                (Check::fail(NAME, detail, FIX), false)
            }
        },
    }
}

/// What the engine enforces for sandboxes: their log and disk bounds, the runtime, and whether
/// root in a sandbox is anything less than root on the host's kernel.
#[cfg(feature = "docker")]
fn isolation(report: &sandbox_provider_docker::IsolationReport) -> Vec<Check> {
    use sandbox_provider_docker::StorageLimit;
    let mut out = Vec::new();
    out.push(Check::pass(
        "docker logs",
        if report.log_max_bytes == 0 {
            "sandbox containers keep no log (driver none)".to_owned()
        } else {
            format!(
                "each sandbox's container log is capped at {} bytes (json-file, one file)",
                report.log_max_bytes
            )
        },
    ));
    let limit = report.storage_limit_bytes;
    let engine = match &report.backing_filesystem {
        Some(fs) => format!("{} on {fs}", report.storage_driver),
        None => report.storage_driver.clone(),
    };
    let storage_fix = "put the engine's data root on xfs mounted with pquota (overlay2), or use the btrfs or zfs storage driver; until then give the engine a disk of its own";
    out.push(match &report.storage {
        StorageLimit::Enforced(by) => Check::pass(
            "docker disk",
            format!("each sandbox's writable layer is limited to {limit} bytes ({by})"),
        ),
        StorageLimit::Untested(why) => Check::warn(
            "docker disk",
            format!("the {limit}-byte writable-layer limit may not be enforced on this engine ({engine}): {why}"),
            format!("{storage_fix}; if the engine refuses the limit, the service log says so on the first create"),
        ),
        StorageLimit::NotEnforced(why) => Check::warn(
            "docker disk",
            format!("the {limit}-byte writable-layer limit is not enforced on this engine ({why}): code in a sandbox can fill the engine's disk"),
            storage_fix,
        ),
        StorageLimit::Off => Check::warn(
            "docker disk",
            "no writable-layer limit is configured (docker.storage_limit_bytes = 0): code in a sandbox can fill the engine's disk",
            "set docker.storage_limit_bytes (SANDBOX_DOCKER_STORAGE_LIMIT_BYTES) on an engine whose storage enforces it",
        ),
    });
    if report.runtime_configured && !report.runtime_installed {
        out.push(Check::fail(
            "docker runtime",
            format!(
                "runtime {} is configured but the engine does not know it: every create fails",
                report.runtime
            ),
            "install it and list it under \"runtimes\" in the engine's daemon.json, or unset docker.runtime (SANDBOX_DOCKER_RUNTIME)",
        ));
    }
    let runsc = if report.runsc_available {
        "runsc (gVisor) is installed but not used"
    } else {
        "runsc (gVisor) is not installed"
    };
    out.push(if report.user_isolation_active() {
        let how = match (report.runsc_active, report.userns_remap, report.rootless) {
            (true, _, _) => format!("sandboxes run under gVisor (runtime {})", report.runtime),
            (_, true, _) => "the engine remaps users (userns-remap): root in a sandbox is not root on the host".to_owned(),
            _ => "the engine runs rootless: root in a sandbox is not root on the host".to_owned(),
        };
        Check::pass("docker isolation", how)
    } else {
        Check::warn(
            "docker isolation",
            format!(
                "root in a sandbox is root on the host's kernel, held only by dropped capabilities, seccomp and no-new-privileges: userns-remap is not active, runtime {} is not gVisor, and {runsc}",
                report.runtime
            ),
            "for untrusted tenants, enable userns-remap in the engine's daemon.json (\"userns-remap\": \"default\"), or install gVisor and set docker.runtime = \"runsc\" (SANDBOX_DOCKER_RUNTIME)",
        )
    });
    out
}

/// The image is missing: `serve` builds a `sandbox-busybox:<tag>` on start when it can, so the
/// check says whether it can; any other image must be provided.
#[cfg(feature = "docker")]
fn missing_image(section: &sandbox_provider_docker::DockerConfig) -> Check {
    use sandbox_provider_docker::image_build::is_recipe_image;
    let what = format!(
        "{} is not present on the engine (pull policy {})",
        section.image, section.pull_policy
    );
    let busybox = section.busybox_path.display();
    if section.build_missing_image && is_recipe_image(section.image.as_str()) {
        if section.busybox_path.is_file() {
            return Check::pass(
                "image",
                format!("{what}; `sandbox serve` builds it on start from {busybox}"),
            );
        }
        return Check::fail(
            "image",
            format!("{what}, and {busybox} (its build input) is missing"),
            "apt-get install busybox-static, then `sandbox serve` builds the image on start (or run `cargo xtask serve`, which installs it)",
        );
    }
    Check::fail(
        "image",
        what,
        "load or build that image, or set docker.image / SANDBOX_DOCKER_IMAGE to sandbox-busybox:<tag>, which `sandbox serve` builds locally from Debian's busybox-static",
    )
}

/// The report printed by `sandbox doctor`.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let label = match (c.ok, c.warn) {
            (false, _) => "FAIL",
            (true, true) => "warn",
            (true, false) => " ok ",
        };
        let _ = writeln!(out, "[{label}] {}: {}", c.name, c.detail);
        if (!c.ok || c.warn) && !c.fix.is_empty() {
            let _ = writeln!(out, "       fix: {}", c.fix);
        }
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    let warned = checks.iter().filter(|c| c.ok && c.warn).count();
    let summary = match (failed, warned) {
        (0, 0) => "all checks passed".to_owned(),
        (0, w) => format!("all checks passed, with {w} warning(s)"),
        (f, _) => format!("{f} check(s) failed"),
    };
    let _ = writeln!(out, "{summary}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_show_their_fix_and_do_not_fail_the_report() {
        let checks = [
            Check::pass("engine", "answers"),
            Check::warn("disk", "not enforced", "use xfs"),
        ];
        let text = render(&checks);
        assert!(text.contains("[ ok ] engine: answers"), "{text}");
        assert!(
            text.contains("[warn] disk: not enforced\n       fix: use xfs"),
            "{text}"
        );
        assert!(
            text.ends_with("all checks passed, with 1 warning(s)\n"),
            "{text}"
        );
        assert!(checks.iter().all(|c| c.ok), "a warning is not a failure");
        let failing = [checks[1].clone(), Check::fail("store", "down", "start it")];
        assert!(render(&failing).ends_with("1 check(s) failed\n"));
    }

    #[cfg(feature = "docker")]
    mod docker {
        use sandbox_provider_docker::{IsolationReport, StorageLimit};

        use super::super::*;

        fn report() -> IsolationReport {
            IsolationReport {
                storage_limit_bytes: 10,
                storage: StorageLimit::NotEnforced("overlay2 on extfs: no pquota".to_owned()),
                storage_driver: "overlay2".to_owned(),
                backing_filesystem: Some("extfs".to_owned()),
                log_max_bytes: 1024,
                userns_remap: false,
                rootless: false,
                runtime: "runc".to_owned(),
                runtime_configured: false,
                runtime_installed: true,
                runsc_available: false,
                runsc_active: false,
            }
        }

        fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
            checks.iter().find(|c| c.name == name).unwrap()
        }

        fn agent_mode(path: &str) -> sandbox_provider_docker::DockerConfig {
            sandbox_provider_docker::DockerConfig {
                enabled: true,
                data_plane: sandbox_provider_docker::DataPlane::Agent,
                agent_path: Some(path.into()),
                ..Default::default()
            }
        }

        #[tokio::test]
        async fn the_data_plane_is_reported_and_an_unusable_agent_fails_with_the_fix() {
            let exec = sandbox_provider_docker::DockerConfig {
                data_plane: sandbox_provider_docker::DataPlane::Exec,
                ..Default::default()
            };
            let (check, ok) = data_plane(&exec).await;
            assert!(
                ok && check.ok && check.detail.starts_with("exec:"),
                "{check:?}"
            );
            assert!(!check.detail.contains("  "), "one line of prose: {check:?}");
            // The default is agent mode: with no agent beside the test binary, it fails.
            let (check, ok) = data_plane(&sandbox_provider_docker::DockerConfig::default()).await;
            assert!(
                !ok && !check.ok && check.detail.contains("there is no agent at"),
                "{check:?}"
            );
            let (check, ok) = data_plane(&agent_mode("/nonexistent/sandbox-agent")).await;
            assert!(!ok && !check.ok, "{check:?}");
            assert!(
                check
                    .detail
                    .contains("there is no agent at /nonexistent/sandbox-agent"),
                "{check:?}"
            );
            assert!(!check.detail.contains("cargo xtask agent"), "{check:?}");
            assert!(
                check.fix.contains("cargo xtask agent") && check.fix.contains("docker.agent_path"),
                "{check:?}"
            );
            // The host's /bin/true is dynamic.
            let (check, ok) = data_plane(&agent_mode("/bin/true")).await;
            assert!(
                !ok && check.detail.contains("dynamically linked"),
                "{check:?}"
            );
        }

        #[test]
        fn an_unenforced_disk_limit_and_plain_root_are_warnings() {
            let checks = isolation(&report());
            let disk = find(&checks, "docker disk");
            assert!(disk.ok && disk.warn, "{disk:?}");
            assert!(disk.detail.contains("overlay2 on extfs"), "{disk:?}");
            let iso = find(&checks, "docker isolation");
            assert!(iso.ok && iso.warn, "{iso:?}");
            assert!(
                iso.detail.contains("userns-remap is not active")
                    && iso.detail.contains("runsc (gVisor) is not installed"),
                "{iso:?}"
            );
            assert!(iso.fix.contains("userns-remap") && iso.fix.contains("runsc"));
            assert!(find(&checks, "docker logs").detail.contains("1024 bytes"));
            assert!(checks.iter().all(|c| c.ok));
        }

        #[test]
        fn enforced_limits_and_remapped_users_pass_and_a_missing_runtime_fails() {
            let mut r = report();
            r.storage = StorageLimit::Enforced("btrfs subvolume quotas".to_owned());
            r.userns_remap = true;
            let checks = isolation(&r);
            assert!(checks.iter().all(|c| c.ok && !c.warn), "{checks:?}");
            let mut r = report();
            r.runsc_available = true;
            let iso = isolation(&r);
            assert!(
                find(&iso, "docker isolation")
                    .detail
                    .contains("installed but not used")
            );
            r.runtime = "runsc".to_owned();
            r.runtime_configured = true;
            r.runtime_installed = false;
            let checks = isolation(&r);
            assert!(!find(&checks, "docker runtime").ok);
            r.runtime_installed = true;
            r.runsc_active = true;
            let checks = isolation(&r);
            let iso = find(&checks, "docker isolation");
            assert!(
                iso.ok && !iso.warn && iso.detail.contains("gVisor"),
                "{iso:?}"
            );
            let mut r = report();
            r.storage = StorageLimit::Off;
            assert!(find(&isolation(&r), "docker disk").warn);
        }
    }
}

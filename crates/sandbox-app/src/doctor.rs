//! `sandbox doctor`: checks what the service needs, explains each fix, and fails (non-zero
//! exit) when something is wrong.

use std::fmt::Write as _;

use crate::config::ServiceConfig;

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
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
            detail: detail.into(),
            fix: String::new(),
        }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name,
            ok: false,
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
        "redis" => match crate::serve::redis_store(&config.redis).await {
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
        },
        other => Check::fail(
            "store",
            format!("store {other:?} is not available in this build"),
            "set store = \"memory\" or \"redis\" (SANDBOX_STORE)",
        ),
    }
}

#[cfg(feature = "docker")]
async fn backend(config: &ServiceConfig) -> Vec<Check> {
    let section = &config.docker;
    if !section.enabled {
        return vec![Check::fail(
            "docker backend",
            "disabled: a Docker socket is root on its host, so the backend is off until an operator enables it",
            "enable it with docker.enabled = true in the config file, or SANDBOX_DOCKER_ENABLED=true in the environment",
        )];
    }
    let mut out = Vec::new();
    // The backend alone: doctor must not create token files or anything else `serve` sets up.
    let provider = match crate::serve::backend(config).await {
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
    match sandbox_core::narrow::template_catalog(&*provider) {
        Some(catalog) => match catalog.list_templates().await {
            Ok(list) if list.iter().any(|t| t.id == section.image) => out.push(Check::pass(
                "image",
                format!("{} is present", section.image),
            )),
            Ok(_) => out.push(missing_image(section)),
            Err(e) => out.push(Check::fail("image", e.to_string(), "check the engine")),
        },
        None => out.push(Check::fail(
            "image",
            "the backend has no template catalog",
            "",
        )),
    }
    out
}

/// The image is missing: `serve` builds a `sandbox-busybox:<tag>` on start when it can, so the
/// check says whether it can; any other image must be provided.
#[cfg(feature = "docker")]
fn missing_image(section: &crate::config::DockerSection) -> Check {
    use sandbox_provider_docker::image_build::is_recipe_image;
    let what = format!(
        "{} is not present on the engine (pull policy {})",
        section.image, section.pull_policy
    );
    let busybox = section.busybox_path.display();
    if section.build_missing_image && is_recipe_image(&section.image) {
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

#[cfg(not(feature = "docker"))]
async fn backend(_config: &ServiceConfig) -> Vec<Check> {
    vec![Check::fail(
        "backend",
        "this build has no backend",
        "build with the `docker` feature",
    )]
}

/// The report printed by `sandbox doctor`.
pub fn render(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(
            out,
            "[{}] {}: {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
        if !c.ok && !c.fix.is_empty() {
            let _ = writeln!(out, "       fix: {}", c.fix);
        }
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    let _ = writeln!(
        out,
        "{}",
        if failed == 0 {
            "all checks passed".to_owned()
        } else {
            format!("{failed} check(s) failed")
        }
    );
    out
}

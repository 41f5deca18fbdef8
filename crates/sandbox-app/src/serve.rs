//! Wiring the service from its config, and running it.

use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{
    ConfigId, CreateRequest, IdleTimeout, PermissiveSessionExistence, TemplateId, TimeoutAction,
    TimeoutPolicy,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::manager::SessionManager;
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_session::quota::{QuotaGate, Quotas, TenantQuota};

use crate::auth::{TenantAuth, digest, hex};
use crate::config::{Backend, ServiceConfig};
use crate::http::body::InflightBudget;
use crate::http::metrics::Metrics;
use crate::http::{AppState, StoreInfo};

/// The tenant ID of the development token created when no tenant is configured.
pub const DEV_TENANT: u64 = 1;

/// Builds the application state: tenants, the backend, the store, the session manager.
pub async fn build_state(config: &ServiceConfig) -> Result<AppState, String> {
    Ok(build(config).await?.state)
}

/// What [`build`] makes: the API's state, and what the E2B API needs of the backend.
#[derive(Debug)]
pub struct Built {
    pub state: AppState,
    /// The backend's envd relay (the Docker adapter's agent channels; `None` in exec mode).
    #[cfg(feature = "e2b-api")]
    pub envd: Option<Arc<dyn crate::e2b::EnvdPlane>>,
}

/// Builds the application state and the backend's envd plane.
pub async fn build(config: &ServiceConfig) -> Result<Built, String> {
    let auth = tenants(config)?;
    let metrics = Arc::new(Metrics::with_data_plane(data_plane_label(config)));
    #[cfg(feature = "e2b-api")]
    let (provider, envd) = serving_backend(config, &metrics).await?;
    #[cfg(not(feature = "e2b-api"))]
    let (provider, ()) = serving_backend(config, &metrics).await?;
    let (store, store_info) = binding_store(config).await?;
    // The production stack: Metered(Checked(adapter)), the adapter's constructor having
    // applied the checking layer.
    let (provider, store) = crate::metered::stack(provider, store, &metrics);
    let (image, idle_ttl) = default_template(config)?;
    let mut request = CreateRequest::new(image);
    let idle =
        IdleTimeout::after(idle_ttl.max(Duration::from_secs(1))).map_err(|e| e.to_string())?;
    // Docker reclaims idle containers itself (the sweeper) rather than pausing them.
    request.timeout = TimeoutPolicy {
        idle,
        on_timeout: TimeoutAction::Kill,
        auto_resume: false,
    };
    let lifecycle_config = LifecycleConfig {
        config_id: ConfigId::default_config(),
        create_request: request,
        requires_inbound_token: false,
    };
    // With the memory store this process is the only writer, so its own destroy is the only way
    // a session ends; a shared store must consult real session records.
    let lifecycle = Lifecycle::new(
        provider.clone(),
        store,
        Arc::new(PermissiveSessionExistence),
        lifecycle_config,
    )
    .map_err(|e| e.to_string())?
    .with_observer(metrics.clone())
    .with_quotas(QuotaGate::new(quotas(config)?));
    let state = AppState {
        auth: Arc::new(auth),
        manager: SessionManager::new(lifecycle),
        provider,
        metrics,
        limits: config.limits.clone(),
        tickets: Arc::new(
            crate::tickets::TerminalTickets::default()
                .with_per_tenant(config.limits.tickets_per_tenant),
        ),
        store: store_info,
        budget: InflightBudget::new(config.limits.inflight_max_bytes),
    };
    Ok(Built {
        state,
        #[cfg(feature = "e2b-api")]
        envd,
    })
}

/// The backend's envd plane, as [`serving_backend`] hands it over.
#[cfg(feature = "e2b-api")]
type EnvdPlaneOf = Option<Arc<dyn crate::e2b::EnvdPlane>>;
#[cfg(not(feature = "e2b-api"))]
type EnvdPlaneOf = ();

/// The template the default config's sandboxes boot, and their idle TTL: the chosen
/// backend's.
fn default_template(config: &ServiceConfig) -> Result<(TemplateId, Duration), String> {
    match config.provider {
        #[cfg(feature = "docker")]
        Backend::Docker => Ok((config.docker.image.clone(), config.docker.idle_ttl)),
        #[cfg(feature = "e2b")]
        Backend::E2b => {
            let section = &config.e2b_provider;
            let template = TemplateId::new(section.template.trim())
                .map_err(|e| format!("e2b_provider.template: {}", e.message()))?;
            Ok((template, Duration::from_secs(section.ttl_seconds)))
        }
        #[allow(unreachable_patterns, reason = "a build without every backend")]
        other => Err(not_built(other)),
    }
}

/// Why a backend the config names cannot run (validation refuses it earlier; this is the
/// wiring's own guard).
fn not_built(backend: Backend) -> String {
    format!(
        "this build has no {0} backend: rebuild with the `{0}` feature",
        backend.name()
    )
}

/// The config's quotas in the session layer's terms: `[quotas]` for every tenant, each
/// tenant entry's overrides on top (0 = unlimited).
pub fn quotas(config: &ServiceConfig) -> Result<Quotas, String> {
    let limit = |n: u32| (n > 0).then_some(n);
    let session_quota = |q: crate::config::Quotas| TenantQuota {
        max_sandboxes: limit(q.max_sandboxes),
        max_concurrent_execs: limit(q.max_concurrent_execs),
        max_terminals: limit(q.max_terminals),
        max_snapshots: limit(q.max_snapshots),
        max_streams: limit(q.max_streams),
    };
    let mut out = Quotas {
        default: session_quota(config.quotas),
        tenants: Default::default(),
    };
    for t in &config.tenants {
        let tenant = sandbox_core::TenantId::new(t.id).map_err(|e| e.to_string())?;
        out.tenants
            .insert(tenant, session_quota(config.quotas.with(&t.quotas)));
    }
    Ok(out)
}

/// The configured binding store. A Redis store that cannot be reached fails the start with
/// the reason: a replica must not serve without the shared truth.
pub async fn binding_store(
    config: &ServiceConfig,
) -> Result<(Arc<dyn sandbox_core::BindingStore>, StoreInfo), String> {
    match config.store.as_str() {
        "memory" => Ok((Arc::new(MemoryBindingStore::new()), StoreInfo::memory())),
        #[cfg(feature = "redis")]
        "redis" => {
            let section = config
                .redis
                .as_ref()
                .ok_or("store \"redis\" has no [redis] section")?;
            let store = redis_store(section).await?;
            let info = StoreInfo {
                kind: "redis",
                health: Some(Arc::new(RedisHealth(store.clone()))),
            };
            Ok((Arc::new(store), info))
        }
        other => Err(format!(
            "store {other:?} is not available in this build (features: memory{})",
            if cfg!(feature = "redis") {
                ", redis"
            } else {
                ""
            }
        )),
    }
}

/// Connects the Redis store the section describes.
#[cfg(feature = "redis")]
pub async fn redis_store(
    section: &sandbox_store_redis::RedisStoreConfig,
) -> Result<sandbox_store_redis::RedisBindingStore, String> {
    sandbox_store_redis::RedisBindingStore::connect(section.clone())
        .await
        .map_err(|e| format!("redis store: {e}"))
}

#[cfg(feature = "redis")]
struct RedisHealth(sandbox_store_redis::RedisBindingStore);

#[cfg(feature = "redis")]
#[async_trait::async_trait]
impl crate::http::StoreHealth for RedisHealth {
    async fn check(&self) -> Result<(), sandbox_core::Error> {
        self.0.ping().await
    }
}

fn tenants(config: &ServiceConfig) -> Result<TenantAuth, String> {
    if !config.tenants.is_empty() {
        return TenantAuth::new(
            config
                .tenants
                .iter()
                .map(|t| (t.id, t.token_sha256.as_str())),
        );
    }
    let path = config
        .dev_token_file
        .clone()
        .unwrap_or_else(default_dev_token_file);
    let token = private_random_file(&path, "the development token")?;
    tracing::info!(token_file = %path.display(), tenant = DEV_TENANT, "no tenants configured: the development tenant's token is in the token file");
    TenantAuth::new([(DEV_TENANT, hex(&digest(&token)).as_str())])
}

/// The value kept in `path`, or, when the file is missing or blank, a fresh one (32 bytes
/// from the OS CSPRNG, hex) written there first: the file 0600, a directory made for it 0700.
/// An existing file others could read is narrowed to 0600 and still used. `what` names the
/// value in errors.
pub(crate) fn private_random_file(path: &std::path::Path, what: &str) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(existing) if !existing.trim().is_empty() => {
            keep_private(path)?;
            Ok(existing.trim().to_owned())
        }
        _ => {
            // A credential: from the OS CSPRNG, never a fast PRNG.
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).map_err(|e| format!("no randomness for {what}: {e}"))?;
            let value = hex(&raw);
            if let Some(dir) = path.parent() {
                create_private_dir(dir)?;
            }
            write_private(path, &value)?;
            Ok(value)
        }
    }
}

/// `$XDG_CONFIG_HOME/sandbox/dev-token`, else `~/.config/sandbox/dev-token`.
pub fn default_dev_token_file() -> std::path::PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".config")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("sandbox").join("dev-token")
}

/// Creates `dir` (and its parents) when missing; the directory the token is created in is
/// made owner-only (0700), so no other account can even list it.
fn create_private_dir(dir: &std::path::Path) -> Result<(), String> {
    let existed = dir.is_dir();
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    #[cfg(unix)]
    if !existed {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot restrict {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// An existing token file readable or writable by anyone but its owner is a leaked
/// credential waiting to happen: it is narrowed to 0600 (with a warning), never used as is.
fn keep_private(path: &std::path::Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let meta =
            std::fs::metadata(path).map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(token_file = %path.display(), mode = format!("{mode:o}"), "the development token file was readable by other accounts; narrowing it to 0600");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn write_private(path: &std::path::Path, token: &str) -> Result<(), String> {
    use std::io::Write as _;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.write_all(token.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The configured backend provider, connected and checked, with nothing set up (what `doctor`
/// inspects).
pub async fn backend(
    config: &ServiceConfig,
) -> Result<Arc<dyn sandbox_core::SandboxProvider>, String> {
    match config.provider {
        #[cfg(feature = "docker")]
        Backend::Docker => Ok(Arc::new(connect_docker(config).await?)),
        #[cfg(feature = "e2b")]
        Backend::E2b => Ok(Arc::new(connect_e2b(config)?)),
        #[allow(unreachable_patterns, reason = "a build without every backend")]
        other => Err(not_built(other)),
    }
}

/// The backend the service runs on, and its envd plane for the E2B API's router.
async fn serving_backend(
    config: &ServiceConfig,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<dyn sandbox_core::SandboxProvider>, EnvdPlaneOf), String> {
    match config.provider {
        #[cfg(feature = "docker")]
        Backend::Docker => serving_docker(config, metrics).await,
        // The E2B API's router relays to an agent this process reaches itself; an E2B backend's
        // envd belongs to its own plane, so this service's `[e2b]` listener serves the control
        // plane only.
        #[cfg(feature = "e2b")]
        Backend::E2b => Ok((backend(config).await?, no_envd_plane())),
        #[allow(unreachable_patterns, reason = "a build without every backend")]
        other => {
            let _ = metrics;
            Err(not_built(other))
        }
    }
}

/// A backend without an envd plane of this process's own.
#[cfg(feature = "e2b")]
fn no_envd_plane() -> EnvdPlaneOf {
    // `None` with the E2B API built in, `()` without it.
    EnvdPlaneOf::default()
}

/// The E2B provider the config describes (`[e2b_provider]`), checked: nothing is dialled
/// until the first call.
#[cfg(feature = "e2b")]
pub(crate) fn connect_e2b(
    config: &ServiceConfig,
) -> Result<sandbox_core::Checked<sandbox_provider_e2b::E2bProvider>, String> {
    sandbox_provider_e2b::E2bProvider::new(config.e2b_provider.clone()).map_err(|e| e.to_string())
}

/// The Docker backend: [`backend`], its agent channels reporting to `metrics`, plus the image
/// made present; and its envd plane (agent mode's channels).
#[cfg(feature = "docker")]
async fn serving_docker(
    config: &ServiceConfig,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<dyn sandbox_core::SandboxProvider>, EnvdPlaneOf), String> {
    let observer: Arc<dyn sandbox_provider_docker::channel::ChannelObserver> = metrics.clone();
    let provider =
        sandbox_provider_docker::DockerProvider::connect_observed(config.docker.clone(), observer)
            .await
            .map_err(|e| e.to_string())?;
    prepare_image(&provider, &config.docker).await?;
    #[cfg(feature = "e2b-api")]
    let envd: EnvdPlaneOf = (config.docker.data_plane == sandbox_provider_docker::DataPlane::Agent)
        .then(|| {
            Arc::new(crate::e2b_docker::DockerEnvd((*provider).clone()))
                as Arc<dyn crate::e2b::EnvdPlane>
        });
    #[cfg(not(feature = "e2b-api"))]
    let envd: EnvdPlaneOf = ();
    Ok((Arc::new(provider), envd))
}

/// The `data_plane` label of the configured backend's calls: Docker's plane, `envd` for E2B.
fn data_plane_label(config: &ServiceConfig) -> &'static str {
    match config.provider {
        #[cfg(feature = "docker")]
        Backend::Docker => match config.docker.data_plane {
            sandbox_provider_docker::DataPlane::Agent => "agent",
            sandbox_provider_docker::DataPlane::Exec => "exec",
        },
        #[cfg(feature = "e2b")]
        Backend::E2b => "envd",
        #[allow(unreachable_patterns, reason = "a build without every backend")]
        _ => crate::http::metrics::NO_DATA_PLANE,
    }
}

/// The Docker provider the config describes, connected (what `doctor` also inspects).
#[cfg(feature = "docker")]
pub(crate) async fn connect_docker(
    config: &ServiceConfig,
) -> Result<sandbox_core::Checked<sandbox_provider_docker::DockerProvider>, String> {
    sandbox_provider_docker::DockerProvider::connect(config.docker.clone())
        .await
        .map_err(|e| e.to_string())
}

/// Makes the configured image present before the first request needs it: a missing
/// `sandbox-busybox:<tag>` is built from the host's busybox-static (with progress in the log);
/// any other missing image is left to the pull policy, with a warning naming the fix.
#[cfg(feature = "docker")]
async fn prepare_image(
    provider: &sandbox_provider_docker::DockerProvider,
    section: &sandbox_provider_docker::DockerConfig,
) -> Result<(), String> {
    use sandbox_provider_docker::image_build::is_recipe_image;
    let image = section.image.as_str();
    if provider
        .image_present(image)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(());
    }
    if !(section.build_missing_image && is_recipe_image(image)) {
        tracing::warn!(
            image,
            pull_policy = %section.pull_policy,
            "the sandbox image is not present: creates fail with image_not_present unless the pull policy fetches it; build or load it, or set docker.image"
        );
        return Ok(());
    }
    let busybox = section.busybox_path.as_path();
    tracing::info!(image, busybox = %busybox.display(), "the sandbox image is missing: building it locally (first start)");
    let started = std::time::Instant::now();
    let mut progress = |line: &str| tracing::info!(image, "build | {line}");
    provider
        .build_busybox_image(image, busybox, &mut progress)
        .await
        .map_err(|e| format!("cannot build the sandbox image: {}", e.message()))?;
    tracing::info!(
        image,
        seconds = started.elapsed().as_secs_f64(),
        "the sandbox image is built"
    );
    Ok(())
}

/// Serves until SIGINT/SIGTERM, then drains in-flight requests for at most the configured
/// grace period.
pub async fn serve(config: ServiceConfig) -> Result<(), String> {
    let built = build(&config).await?;
    let state = built.state;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    // One signal, heard by every listener and background task.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let when_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    #[cfg(feature = "e2b-api")]
    let e2b = if config.e2b.enabled {
        Some(crate::e2b::serve::start(&config, &state, built.envd, &when_stopped).await?)
    } else {
        None
    };
    tracing::info!(listen = %local, backend = %state.provider.provider(), "sandbox service listening");
    tokio::spawn(async move {
        shutdown().await;
        let _ = stop.send(true);
    });
    crate::server::serve(
        listener,
        crate::http::router(state),
        crate::server::ServerLimits::from_config(&config.server),
        when_stopped(),
    )
    .await;
    #[cfg(feature = "e2b-api")]
    if let Some(e2b) = e2b {
        e2b.stopped().await;
    }
    Ok(())
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
    tracing::info!("shutting down");
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_dev_token_and_its_directory_are_private() {
        let mode =
            |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let root = std::env::temp_dir().join(format!("sbx-token-{:08x}", fastrand::u32(..)));
        let file = root.join("sandbox").join("dev-token");
        let config = ServiceConfig {
            dev_token_file: Some(file.clone()),
            ..ServiceConfig::default()
        };
        tenants(&config).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(
            mode(file.parent().unwrap()),
            0o700,
            "a directory we create is ours alone"
        );

        // An existing token someone made world-readable is narrowed, and still used.
        let token = std::fs::read_to_string(&file).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let auth = tenants(&config).unwrap();
        assert_eq!(mode(&file), 0o600);
        assert_eq!(
            auth.tenant_of(token.trim()).map(|t| t.get()),
            Some(DEV_TENANT)
        );
        let _ = std::fs::remove_dir_all(root);
    }
}

//! Starting the E2B API beside the service's own: its secret, its deadline store, its
//! timeout engine and its listener.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{DeadlineStore, Secret, TemplateId};
use tokio::task::JoinHandle;

use super::expiry::Expiry;
use super::ids::Keys;
use super::{E2bApi, EnvdPlane, Settings};
use crate::config::ServiceConfig;
use crate::http::AppState;

/// The file under the data directory the generated secret is kept in.
pub const SECRET_FILE: &str = "e2b-secret";

/// The running API: its listener and its timeout engine, both ending on the service's stop.
#[derive(Debug)]
pub struct Running {
    server: JoinHandle<()>,
    expiry: JoinHandle<()>,
}

impl Running {
    /// Waits until the listener has drained and the timeout engine has stopped.
    pub async fn stopped(self) {
        let _ = self.server.await;
        let _ = self.expiry.await;
    }
}

/// Starts the API on `e2b.listen`, over `state`'s provider and tenants. `stopped` makes a
/// future that resolves when the service stops.
pub async fn start<F, Fut>(
    config: &ServiceConfig,
    state: &AppState,
    envd: Option<Arc<dyn EnvdPlane>>,
    stopped: &F,
) -> Result<Running, String>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let envd = envd.ok_or(
        "the E2B API (e2b.enabled) relays envd requests to each sandbox's agent: it needs docker.data_plane = \"agent\" (the default)",
    )?;
    let keys = Keys::new(secret(config)?);
    let deadlines = deadline_store(config).await?;
    let settings = settings(config)?;
    let default_timeout = settings.default_timeout;
    let api = E2bApi::new(
        Arc::clone(&state.provider),
        envd,
        Arc::clone(&state.auth),
        keys,
        Arc::clone(&deadlines),
        settings,
    );
    let expiry =
        Arc::new(Expiry::new(deadlines, api.expiry_target(), default_timeout)).spawn(stopped());
    let listener = tokio::net::TcpListener::bind(config.e2b.listen)
        .await
        .map_err(|e| format!("e2b.listen: cannot listen on {}: {e}", config.e2b.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %local, store = %config.store, "e2b api listening (E2B_API_URL and E2B_SANDBOX_URL: http://{local})");
    let server = tokio::spawn(crate::server::serve(
        listener,
        super::router(api, Arc::clone(&state.metrics)),
        crate::server::ServerLimits::from_config(&config.server),
        stopped(),
    ));
    Ok(Running { server, expiry })
}

/// `e2b.secret`, else the one generated into the data directory on first start.
fn secret(config: &ServiceConfig) -> Result<Secret, String> {
    if let Some(secret) = &config.e2b.secret {
        return Ok(secret.clone());
    }
    let path = config.data_dir().join(SECRET_FILE);
    let existed = path.exists();
    let secret = crate::serve::private_random_file(&path, "the E2B API's secret")?;
    if !existed {
        tracing::info!(secret_file = %path.display(), "e2b api: generated its secret");
    }
    Ok(Secret::new(secret))
}

/// Where deadlines live: the Redis store's, else a file under the data directory.
async fn deadline_store(config: &ServiceConfig) -> Result<Arc<dyn DeadlineStore>, String> {
    match config.store.as_str() {
        #[cfg(feature = "redis")]
        "redis" => {
            let section = config
                .redis
                .as_ref()
                .ok_or("store \"redis\" has no [redis] section")?;
            let store = sandbox_store_redis::RedisDeadlines::connect(section.clone())
                .await
                .map_err(|e| format!("e2b api: the Redis deadline store: {e}"))?;
            Ok(Arc::new(store))
        }
        _ => file_deadlines(&config.data_dir()).await,
    }
}

async fn file_deadlines(dir: &Path) -> Result<Arc<dyn DeadlineStore>, String> {
    let store = super::deadlines::FileDeadlines::open(dir)
        .await
        .map_err(|e| format!("e2b api: the deadline file in {}: {e}", dir.display()))?;
    Ok(Arc::new(store))
}

fn settings(config: &ServiceConfig) -> Result<Settings, String> {
    let e = &config.e2b;
    let mut templates = HashMap::new();
    for (name, image) in &e.templates {
        let image = TemplateId::new(image).map_err(|e| e.to_string())?;
        templates.insert(name.clone(), image);
    }
    if !templates.contains_key("base") {
        let base =
            TemplateId::new(crate::config::DEFAULT_E2B_BASE_IMAGE).map_err(|e| e.to_string())?;
        templates.insert("base".to_owned(), base);
    }
    // Unset, builds may start from the images the operator already lets sandboxes boot.
    let build_images = match &e.build_images {
        Some(images) => images.clone(),
        None => {
            let mut images: Vec<String> =
                templates.values().map(|t| t.as_str().to_owned()).collect();
            images.sort();
            images.dedup();
            images
        }
    };
    #[cfg(feature = "docker")]
    let (cpu_count, memory_mb, disk_size_mb) = {
        let d = &config.docker;
        let mib = 1024 * 1024;
        (
            // The listing's field is whole CPUs, at least one.
            (d.cpu_limit.ceil() as u32).max(1),
            u64::try_from(d.memory_bytes).unwrap_or(0) / mib,
            d.storage_limit_bytes / mib,
        )
    };
    #[cfg(not(feature = "docker"))]
    let (cpu_count, memory_mb, disk_size_mb) = (1, 512, 0);
    Ok(Settings {
        domain: e.domain.clone(),
        default_timeout: Duration::from_secs(e.default_timeout_seconds),
        max_timeout: Duration::from_secs(e.max_timeout_seconds),
        templates,
        cpu_count,
        memory_mb: memory_mb.max(128),
        disk_size_mb,
        quotas: crate::serve::quotas(config)?,
        build_images,
        max_tunnels_per_sandbox: e.max_tunnels_per_sandbox,
    })
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_generated_secret_is_private_kept_and_a_configured_one_wins() {
        let root = std::env::temp_dir().join(format!("sbx-e2b-secret-{:08x}", fastrand::u32(..)));
        let config = ServiceConfig {
            data_dir: Some(root.join("data")),
            ..ServiceConfig::default()
        };
        let first = secret(&config).unwrap();
        let file = root.join("data").join(SECRET_FILE);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        assert!(first.expose().len() >= crate::config::E2B_SECRET_MIN_BYTES);
        // A restart reads the same secret, so the tokens it issued stay valid.
        assert_eq!(secret(&config).unwrap().expose(), first.expose());
        // A file others could read is narrowed, still used.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(secret(&config).unwrap().expose(), first.expose());
        assert_eq!(mode(&file), 0o600);
        let mut configured = config.clone();
        configured.e2b.secret = Some(Secret::new("x".repeat(40)));
        assert_eq!(secret(&configured).unwrap().expose(), "x".repeat(40));
        let _ = std::fs::remove_dir_all(root);
    }
}

//! The idle sweeper: Docker has no provider TTL, so the adapter reclaims containers nobody has
//! used for their idle TTL.
//!
//! Activity is the mtime of [`ACTIVITY_MARKER`] inside the container, touched when an exec
//! starts (and by open terminals). A marker dated more than [`CLOCK_SKEW`] into the future is
//! not trusted — code inside the sandbox can set any mtime — and the container's creation time
//! is used instead, so forging a date cannot keep a container alive past its TTL.
//!
//! The marker says when work last *started*, not whether it is still going, so the sweeper
//! skips containers with running execs: a container idle by its marker is kept while the
//! engine reports any of its execs `Running` (a command longer than the TTL keeps its
//! sandbox). That signal is the engine's own: code inside the sandbox cannot create Docker
//! execs, so unlike the marker's mtime it cannot be forged from inside. Execs end — every
//! command carries its timeout — and terminals, which are execs too, have their own idle
//! disconnect, so a running exec holds a container only as long as someone's work does. In
//! agent mode the channel to the agent is an exec too, open while calls use it and closed
//! within a quarter of the idle TTL after the last ([`crate::channel::idle_timeout_for`]): it
//! holds a container a little past its work, never a whole TTL.
//!
//! Idleness (marker and execs) is checked again right before each delete, because an exec may
//! have arrived while the sweep ran. The sweep only ever lists containers labelled with this
//! adapter's namespace.
//!
//! A container created with `on_timeout = pause` (label [`labels::ON_IDLE`]) is paused instead
//! of deleted, and a paused or stopped one of that policy is left alone: keeping it is what its
//! policy asked for, and a connect resumes it. A paused container of the delete policy is judged
//! by its marker alone: its execs are frozen, so one the engine still lists as running is no
//! work in progress.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{
    ContainerArchiveInfoOptions, InspectContainerOptions, ListContainersOptions,
    RemoveContainerOptions,
};
use sandbox_core::{Error, Operation, SandboxId};
use time::OffsetDateTime;

use crate::errors;
use crate::exec::ACTIVITY_MARKER;
use crate::labels;
use crate::provider::DockerProvider;

/// How far in the future a marker may be and still count (clock skew between engine and us).
pub const CLOCK_SKEW: Duration = Duration::from_secs(120);
/// Budget of one sweep.
pub const SWEEP_BUDGET: Duration = Duration::from_secs(120);

const OP: Operation = Operation::new("sweep_idle");

/// What one sweep did.
#[derive(Debug, Default)]
pub struct SweepReport {
    pub reaped: Vec<SandboxId>,
    /// Containers of the pause policy the sweep paused.
    pub paused: Vec<SandboxId>,
    pub kept: usize,
    /// Containers whose check or delete failed; the sweep went on with the rest.
    pub failures: Vec<(String, Error)>,
}

/// Whether a container is idle. `ttl_secs == 0` means never idle.
pub fn is_idle(
    now: OffsetDateTime,
    ttl_secs: u64,
    marker: Option<OffsetDateTime>,
    created: Option<OffsetDateTime>,
) -> bool {
    if ttl_secs == 0 {
        return false;
    }
    let skew = time::Duration::try_from(CLOCK_SKEW).unwrap_or(time::Duration::ZERO);
    let trusted_marker = marker.filter(|m| *m <= now + skew);
    let Some(last) = trusted_marker.or(created) else {
        // Nothing to judge by: keeping a container costs memory, deleting one costs a workspace.
        return false;
    };
    let ttl = time::Duration::seconds(i64::try_from(ttl_secs).unwrap_or(i64::MAX));
    now - last > ttl
}

/// Remembers when each daemon was last swept, so many providers built against one daemon (one
/// per tenant config, say) sweep it at most once per interval between them. Passed in through
/// [`crate::DockerConfig::sweep_throttle`] rather than kept in a global: the composition root
/// shares one per process, and tests get their own.
#[derive(Debug, Default)]
pub struct SweepThrottle {
    last: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
}

impl SweepThrottle {
    /// Whether a sweep of `daemon` may start now (and if so, records that it did).
    pub fn admit(&self, daemon: &str, interval: Duration) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.get(daemon).is_some_and(|t| t.elapsed() < interval) {
            return false;
        }
        last.insert(daemon.to_owned(), Instant::now());
        true
    }
}

/// Starts a sweep in the background, at most once per `sweep_interval` per daemon (across every
/// provider sharing the config's throttle), and never for providers built for connectivity
/// checks.
pub fn trigger(provider: &DockerProvider) {
    let config = &provider.inner.config;
    if !config.idle_sweep {
        return;
    }
    let daemon = format!("{}|{}", provider.inner.endpoint, config.namespace);
    if !config.sweep_throttle.admit(&daemon, config.sweep_interval) {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let provider = provider.clone();
        runtime.spawn(async move {
            let _ = tokio::time::timeout(SWEEP_BUDGET, sweep(&provider)).await;
        });
    }
}

/// One pass over this namespace's containers.
pub async fn sweep(provider: &DockerProvider) -> Result<SweepReport, Error> {
    let config = &provider.inner.config;
    let filters = vec![
        format!("{}=true", labels::MANAGED),
        format!("{}={}", labels::NAMESPACE, config.namespace),
    ];
    let options = ListContainersOptions {
        all: true,
        filters: Some(std::collections::HashMap::from([(
            "label".to_owned(),
            filters,
        )])),
        ..Default::default()
    };
    let containers = provider
        .docker()
        .list_containers(Some(options))
        .await
        .map_err(|e| errors::map(OP, e))?;
    let mut report = SweepReport::default();
    for c in containers {
        let Some(id) = c.id.clone() else { continue };
        if !labels::owned_by(c.labels.as_ref(), &config.namespace) {
            continue;
        }
        let ttl = c
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::IDLE_TTL))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(config.idle_ttl.as_secs());
        let created = c
            .created
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok());
        let pauses = c
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::ON_IDLE))
            .is_some_and(|v| v == labels::ON_IDLE_PAUSE);
        let running = c.state == Some(ContainerSummaryStateEnum::RUNNING);
        if pauses {
            if !running {
                report.kept += 1;
                continue;
            }
            match idle_now(provider, &id, ttl, created).await {
                Ok(false) => report.kept += 1,
                Err(e) => report.failures.push((id, e)),
                Ok(true) => match provider.pause_container(OP, &id).await {
                    Ok(()) => {
                        tracing::info!(sandbox = %id, ttl_secs = ttl, "idle sweep paused a container (its policy pauses)");
                        if let Ok(sid) = SandboxId::new(id) {
                            report.paused.push(sid);
                        }
                    }
                    // Paused by someone else meanwhile: as the policy wants.
                    Err(e) if e.code() == Some(sandbox_core::ErrorCode::SandboxPaused) => {
                        report.kept += 1;
                    }
                    Err(e) => report.failures.push((id, e)),
                },
            }
            continue;
        }
        match idle_now(provider, &id, ttl, created).await {
            Ok(false) => report.kept += 1,
            Err(e) => report.failures.push((id, e)),
            Ok(true) => {
                // Re-check right before deleting: an exec may have touched the marker, or
                // started, since.
                match idle_now(provider, &id, ttl, created).await {
                    Ok(true) => {}
                    Ok(false) => {
                        report.kept += 1;
                        continue;
                    }
                    Err(e) => {
                        report.failures.push((id, e));
                        continue;
                    }
                }
                let removed = provider
                    .docker()
                    .remove_container(
                        &id,
                        Some(RemoveContainerOptions {
                            force: true,
                            v: true,
                            ..Default::default()
                        }),
                    )
                    .await;
                match removed {
                    Ok(()) => {
                        tracing::info!(sandbox = %id, ttl_secs = ttl, "idle sweep reclaimed a container");
                        if let Ok(sid) = SandboxId::new(id) {
                            report.reaped.push(sid);
                        }
                    }
                    Err(e) => report.failures.push((id, errors::map(OP, e))),
                }
            }
        }
    }
    Ok(report)
}

async fn idle_now(
    provider: &DockerProvider,
    id: &str,
    ttl: u64,
    created: Option<OffsetDateTime>,
) -> Result<bool, Error> {
    let marker = marker_mtime(provider, id).await?;
    let idle = is_idle(provider.inner.config.clock.now(), ttl, marker, created);
    // Only a container idle by its marker is worth the exec inspections.
    Ok(idle && !has_running_exec(provider, id).await?)
}

/// Whether any exec in the container is still running, by the engine's account. A container
/// or exec that is gone is not running.
async fn has_running_exec(provider: &DockerProvider, id: &str) -> Result<bool, Error> {
    let inspect = match provider
        .docker()
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
    {
        Ok(inspect) => inspect,
        Err(e) => {
            let mapped = errors::map(OP, e);
            return if mapped.http_status() == Some(404) {
                Ok(false)
            } else {
                Err(mapped)
            };
        }
    };
    // A container that is not running runs no exec, and a frozen one's execs do no work.
    let state = inspect.state.as_ref();
    if !state.and_then(|s| s.running).unwrap_or(false)
        || state.and_then(|s| s.paused).unwrap_or(false)
    {
        return Ok(false);
    }
    for exec_id in inspect.exec_ids.iter().flatten() {
        match provider.docker().inspect_exec(exec_id).await {
            Ok(exec) if exec.running == Some(true) => return Ok(true),
            Ok(_) => {}
            Err(e) => {
                let mapped = errors::map(OP, e);
                if mapped.http_status() != Some(404) {
                    return Err(mapped);
                }
            }
        }
    }
    Ok(false)
}

/// The marker's mtime through the archive-stat endpoint (works on stopped containers too, and
/// starts nothing inside the container). A missing marker is `None`.
async fn marker_mtime(
    provider: &DockerProvider,
    id: &str,
) -> Result<Option<OffsetDateTime>, Error> {
    let options = ContainerArchiveInfoOptions {
        path: ACTIVITY_MARKER.to_owned(),
    };
    match provider
        .docker()
        .get_container_archive_info(id, Some(options))
        .await
    {
        Ok(stat) => Ok(stat
            .modification_time
            .as_deref()
            .and_then(|t| sandbox_core::timefmt::parse(t).ok())),
        Err(e) => {
            let mapped = errors::map(OP, e);
            if mapped.http_status() == Some(404) {
                Ok(None)
            } else {
                Err(mapped)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_admits_once_per_interval_per_daemon() {
        let t = SweepThrottle::default();
        assert!(t.admit("a", Duration::from_secs(60)));
        assert!(!t.admit("a", Duration::from_secs(60)));
        assert!(
            t.admit("b", Duration::from_secs(60)),
            "another daemon is not throttled by a"
        );
        assert!(t.admit("a", Duration::ZERO));
    }

    #[test]
    fn idleness_rules() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let ago = |s: i64| Some(now - time::Duration::seconds(s));
        let ahead = |s: i64| Some(now + time::Duration::seconds(s));
        assert!(is_idle(now, 60, ago(61), ago(3600)), "old marker is idle");
        assert!(!is_idle(now, 60, ago(59), ago(3600)), "fresh marker is not");
        assert!(
            !is_idle(now, 0, ago(1_000_000), ago(1_000_000)),
            "ttl 0 is never idle"
        );
        assert!(
            !is_idle(now, 60, ahead(60), ago(3600)),
            "small skew counts as recent activity"
        );
        assert!(
            is_idle(now, 60, ahead(86_400), ago(3600)),
            "a forged far-future marker falls back to creation"
        );
        assert!(
            !is_idle(now, 60, ahead(86_400), ago(10)),
            "... which is recent here"
        );
        assert!(
            is_idle(now, 60, None, ago(61)),
            "no marker falls back to creation"
        );
        assert!(
            !is_idle(now, 60, None, None),
            "nothing to judge by keeps the container"
        );
    }
}

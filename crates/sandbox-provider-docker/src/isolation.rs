//! What the engine enforces around a sandbox beyond what a create body can ask for, and what
//! the adapter learns about it: whether the writable layer's size limit holds, whether user
//! namespaces are remapped, and which OCI runtime sandboxes run under.
//!
//! The size limit (`storage_opt size=`) is honoured only by some storage drivers: overlay2 only
//! on xfs mounted with `pquota`, btrfs, zfs, devicemapper. The first create asks `docker info`
//! for the driver and its backing filesystem ([`storage_support`]); where the answer is not
//! conclusive (overlay2 on xfs: the mount options are not reported) the create carries the
//! limit, and the engine's refusal ([`is_storage_refusal`]) turns it off for this provider. A
//! create never fails because the engine cannot enforce the limit; the log says so once, and
//! [`IsolationReport`] (what `sandbox doctor` shows) says why.

use std::sync::{Mutex, PoisonError};

use bollard::models::SystemInfo;
use sandbox_core::{Error, Operation};

use crate::errors;
use crate::provider::DockerProvider;

/// Whether the engine holds each container's writable layer to the configured size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageLimit {
    /// No limit is configured (`storage_limit_bytes = 0`).
    Off,
    /// Enforced, and by what.
    Enforced(String),
    /// Not known until a create tries it (the reason says what decides).
    Untested(String),
    /// This engine cannot enforce it, and why; creates go ahead without it.
    NotEnforced(String),
}

impl StorageLimit {
    /// Whether a create body should carry the limit.
    fn applies(&self) -> bool {
        matches!(self, StorageLimit::Enforced(_) | StorageLimit::Untested(_))
    }
}

/// What the storage driver `driver` on the backing filesystem `backing_fs` (`docker info`'s
/// `Driver` and `DriverStatus` "Backing Filesystem") makes of a size limit.
pub fn storage_support(driver: &str, backing_fs: Option<&str>) -> StorageLimit {
    let on = |fs: Option<&str>| fs.unwrap_or("an unreported filesystem").to_owned();
    match driver {
        "btrfs" => StorageLimit::Enforced("btrfs subvolume quotas".to_owned()),
        "zfs" => StorageLimit::Enforced("zfs dataset quotas".to_owned()),
        "devicemapper" => StorageLimit::Enforced("devicemapper device sizes".to_owned()),
        "overlay2" | "vfs" if backing_fs == Some("xfs") => StorageLimit::Untested(format!(
            "{driver} on xfs enforces it only when the filesystem is mounted with pquota, which \
             the engine does not report: the first create tries it"
        )),
        "overlay2" | "vfs" => StorageLimit::NotEnforced(format!(
            "{driver} on {}: Docker enforces a container size only on xfs mounted with pquota",
            on(backing_fs)
        )),
        "overlay" | "aufs" | "fuse-overlayfs" => StorageLimit::NotEnforced(format!(
            "the {driver} storage driver cannot limit a container's size"
        )),
        "" => StorageLimit::Untested(
            "the engine did not name its storage driver: the first create tries it".to_owned(),
        ),
        other => StorageLimit::Untested(format!(
            "the {other} storage driver may enforce it: the first create tries it"
        )),
    }
}

/// Whether a refused create was refused for its size limit. The engines' words for it:
/// "--storage-opt is supported only for overlay over xfs with 'pquota' mount option",
/// "--storage-opt is not supported for `<driver>`", quota errors of the drivers that have them,
/// devicemapper's "base device size cannot be smaller".
pub fn is_storage_refusal(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "storage-opt",
        "storage opt",
        "storageopt",
        "quota",
        "base device size",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// The backing filesystem in `docker info`'s driver status (e.g. `extfs`, `xfs`).
pub fn backing_filesystem(info: &SystemInfo) -> Option<&str> {
    info.driver_status
        .iter()
        .flatten()
        .find_map(|pair| match pair.as_slice() {
            [key, value] if key == "Backing Filesystem" => Some(value.as_str()),
            _ => None,
        })
}

/// What the engine enforces for this adapter's sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationReport {
    /// The configured writable-layer limit in bytes (0 = none).
    pub storage_limit_bytes: u64,
    pub storage: StorageLimit,
    pub storage_driver: String,
    pub backing_filesystem: Option<String>,
    /// The configured bound on each container's log (0 = logging off); always enforced.
    pub log_max_bytes: u64,
    /// The engine remaps container users into a subordinate range (`userns-remap`): root in a
    /// sandbox is not root on the host.
    pub userns_remap: bool,
    /// The engine itself runs unprivileged (rootless mode), with the same effect.
    pub rootless: bool,
    /// The OCI runtime sandboxes run under: the configured one, else the engine's default.
    pub runtime: String,
    pub runtime_configured: bool,
    /// Whether the engine knows that runtime (a create under an unknown one fails).
    pub runtime_installed: bool,
    /// gVisor (`runsc`) is installed on the engine.
    pub runsc_available: bool,
    /// Sandboxes run under gVisor.
    pub runsc_active: bool,
}

impl IsolationReport {
    /// Whether anything stands between root in a sandbox and root on the host besides
    /// capabilities, seccomp and `no-new-privileges`: a user namespace, or gVisor's kernel.
    pub fn user_isolation_active(&self) -> bool {
        self.userns_remap || self.rootless || self.runsc_active
    }
}

/// The report from a `docker info` answer, the adapter's settings, and what creates learnt
/// about the size limit (`learnt`, which wins over the driver table).
pub fn assess(
    info: &SystemInfo,
    runtime: Option<&str>,
    storage_limit_bytes: u64,
    log_max_bytes: u64,
    learnt: Option<&StorageLimit>,
) -> IsolationReport {
    let driver = info.driver.clone().unwrap_or_default();
    let backing = backing_filesystem(info).map(str::to_owned);
    let storage = match (storage_limit_bytes, learnt) {
        (0, _) => StorageLimit::Off,
        (_, Some(known)) => known.clone(),
        (_, None) => storage_support(&driver, backing.as_deref()),
    };
    let options = info.security_options.iter().flatten();
    let has_option = |name: &str| {
        options
            .clone()
            .any(|o| o.split(',').any(|part| part == format!("name={name}")))
    };
    let runtimes = info.runtimes.clone().unwrap_or_default();
    let is_runsc = |name: &str| {
        name == "runsc"
            || runtimes
                .get(name)
                .and_then(|r| r.path.as_deref())
                .is_some_and(|p| p.rsplit('/').next() == Some("runsc"))
    };
    let effective = runtime
        .map(str::to_owned)
        .or_else(|| info.default_runtime.clone())
        .unwrap_or_else(|| "runc".to_owned());
    IsolationReport {
        storage_limit_bytes,
        storage,
        storage_driver: driver,
        backing_filesystem: backing,
        log_max_bytes,
        userns_remap: has_option("userns"),
        rootless: has_option("rootless"),
        runtime_configured: runtime.is_some(),
        runtime_installed: runtimes.contains_key(&effective),
        runsc_available: runtimes.keys().any(|name| is_runsc(name)),
        runsc_active: is_runsc(&effective) && runtimes.contains_key(&effective),
        runtime: effective,
    }
}

/// What one provider learnt about the size limit on its engine.
#[derive(Debug, Default)]
pub(crate) struct StorageState {
    known: Mutex<Option<StorageLimit>>,
}

impl StorageState {
    fn get(&self) -> Option<StorageLimit> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records `verdict` unless something is known already (`replace` also overrides an
    /// `Untested`), warning when it is the moment the limit turns out not to hold. Returns what
    /// is known afterwards.
    fn learn(&self, verdict: StorageLimit, replace_untested: bool, limit: u64) -> StorageLimit {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = match known.as_ref() {
            None => false,
            Some(StorageLimit::Untested(_)) => !replace_untested,
            Some(_) => true,
        };
        if !keep {
            if let StorageLimit::NotEnforced(why) = &verdict {
                tracing::warn!(
                    limit_bytes = limit,
                    reason = %why,
                    "this Docker engine cannot limit a sandbox's writable layer: sandboxes are created without a disk limit (see `sandbox doctor`)"
                );
            }
            *known = Some(verdict);
        }
        known.clone().unwrap_or(StorageLimit::Off)
    }
}

impl DockerProvider {
    /// What the engine enforces for this adapter's sandboxes: a fresh `docker info`, with what
    /// creates have learnt about the size limit.
    pub async fn isolation_report(&self) -> Result<IsolationReport, Error> {
        let info = self
            .docker()
            .info()
            .await
            .map_err(|e| errors::map(Operation::HEALTH, e))?;
        let config = &self.inner.config;
        Ok(assess(
            &info,
            config.runtime.as_deref(),
            config.storage_limit_bytes,
            config.log_max_bytes,
            self.inner.storage.get().as_ref(),
        ))
    }

    /// The size limit a create body carries: `None` when none is configured or this engine is
    /// known not to enforce one.
    pub(crate) async fn storage_limit_for_create(&self) -> Option<u64> {
        let limit = self.inner.config.storage_limit_bytes;
        if limit == 0 {
            return None;
        }
        let verdict = match self.inner.storage.get() {
            Some(known) => known,
            None => match self.docker().info().await {
                Ok(info) => {
                    let driver = info.driver.clone().unwrap_or_default();
                    let verdict = storage_support(&driver, backing_filesystem(&info));
                    self.inner.storage.learn(verdict, false, limit)
                }
                // Not remembered: the next create asks again. This one tries the limit, and a
                // refusal is handled like any other.
                Err(_) => StorageLimit::Untested("docker info failed".to_owned()),
            },
        };
        verdict.applies().then_some(limit)
    }

    /// A create carrying the limit was refused for it (`engine_message`): not again.
    pub(crate) fn storage_refused(&self, engine_message: &str) {
        let why = format!(
            "the engine refused it: {}",
            sandbox_core::diagnostics::scrub(engine_message)
        );
        self.inner.storage.learn(
            StorageLimit::NotEnforced(why),
            true,
            self.inner.config.storage_limit_bytes,
        );
    }

    /// A create carrying the limit succeeded: an untested engine enforces it.
    pub(crate) fn storage_accepted(&self) {
        if let Some(StorageLimit::Untested(_)) = self.inner.storage.get() {
            self.inner.storage.learn(
                StorageLimit::Enforced("the engine accepted it on a create".to_owned()),
                true,
                self.inner.config.storage_limit_bytes,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use bollard::models::Runtime;

    use super::*;

    /// A `docker info` answer with the fields the assessment reads.
    fn info(driver: &str, backing: Option<&str>, security: &[&str]) -> SystemInfo {
        SystemInfo {
            driver: Some(driver.to_owned()),
            driver_status: Some(
                backing
                    .map(|fs| vec![vec!["Backing Filesystem".to_owned(), fs.to_owned()]])
                    .unwrap_or_default(),
            ),
            security_options: Some(security.iter().map(|s| (*s).to_owned()).collect()),
            runtimes: Some(HashMap::from([("runc".to_owned(), Runtime::default())])),
            default_runtime: Some("runc".to_owned()),
            ..Default::default()
        }
    }

    fn kind(limit: &StorageLimit) -> &'static str {
        match limit {
            StorageLimit::Off => "off",
            StorageLimit::Enforced(_) => "enforced",
            StorageLimit::Untested(_) => "untested",
            StorageLimit::NotEnforced(_) => "not enforced",
        }
    }

    fn check(driver: &str, backing: Option<&str>, expected: &str) {
        let report = assess(&info(driver, backing, &[]), None, 1 << 30, 1 << 20, None);
        assert_eq!(
            kind(&report.storage),
            expected,
            "{driver} on {backing:?}: {:?}",
            report.storage
        );
    }

    #[test]
    fn storage_drivers_and_backing_filesystems_decide_the_size_limit() {
        check("overlay2", Some("extfs"), "not enforced");
        check("overlay2", Some("xfs"), "untested");
        check("overlay2", None, "not enforced");
        check("vfs", Some("extfs"), "not enforced");
        check("vfs", Some("xfs"), "untested");
        check("btrfs", Some("btrfs"), "enforced");
        check("zfs", Some("zfs"), "enforced");
        check("devicemapper", Some("xfs"), "enforced");
        check("overlay", Some("xfs"), "not enforced");
        check("aufs", Some("extfs"), "not enforced");
        check("fuse-overlayfs", Some("extfs"), "not enforced");
        check("", None, "untested");
        check("some-new-driver", None, "untested");
        let here = assess(&info("overlay2", Some("extfs"), &[]), None, 1, 1, None);
        match here.storage {
            StorageLimit::NotEnforced(why) => {
                assert!(why.contains("overlay2 on extfs"), "{why}");
                assert!(why.contains("pquota"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_zero_limit_is_off_and_what_creates_learnt_wins() {
        let xfs = info("overlay2", Some("xfs"), &[]);
        assert_eq!(assess(&xfs, None, 0, 1, None).storage, StorageLimit::Off);
        let refused = StorageLimit::NotEnforced("the engine refused it".to_owned());
        assert_eq!(assess(&xfs, None, 1, 1, Some(&refused)).storage, refused);
        assert_eq!(
            assess(&xfs, None, 0, 1, Some(&refused)).storage,
            StorageLimit::Off
        );
    }

    #[test]
    fn the_engines_refusals_of_a_size_are_recognised() {
        for refusal in [
            "--storage-opt is supported only for overlay over xfs with 'pquota' mount option",
            "--storage-opt is not supported for aufs",
            "Storage Opt size not supported",
            "devmapper: Base device size cannot be smaller than 10.74GB",
            "Failed to set quota limit for projid 3 on /var/lib/docker",
        ] {
            assert!(is_storage_refusal(refusal), "{refusal}");
        }
        for other in [
            "No such image: sandbox-busybox:test",
            "Conflict. The container name \"/x\" is already in use",
            "unknown or invalid runtime name: runsc",
        ] {
            assert!(!is_storage_refusal(other), "{other}");
        }
    }

    #[test]
    fn user_namespaces_and_runtimes_are_read_from_the_engine() {
        let plain = assess(
            &info("overlay2", Some("extfs"), &["name=seccomp,profile=default"]),
            None,
            1,
            1,
            None,
        );
        assert!(!plain.userns_remap && !plain.rootless && !plain.runsc_available);
        assert_eq!(
            (plain.runtime.as_str(), plain.runtime_installed),
            ("runc", true)
        );
        assert!(!plain.user_isolation_active());

        let remapped = assess(
            &info(
                "overlay2",
                Some("extfs"),
                &["name=seccomp,profile=default", "name=userns"],
            ),
            None,
            1,
            1,
            None,
        );
        assert!(remapped.userns_remap && remapped.user_isolation_active());
        let rootless = assess(
            &info("overlay2", None, &["name=rootless"]),
            None,
            1,
            1,
            None,
        );
        assert!(rootless.rootless && rootless.user_isolation_active());

        let mut gvisor = info("overlay2", Some("extfs"), &[]);
        gvisor.runtimes.as_mut().unwrap().insert(
            "gvisor".to_owned(),
            Runtime {
                path: Some("/usr/local/bin/runsc".to_owned()),
                ..Default::default()
            },
        );
        let installed = assess(&gvisor, None, 1, 1, None);
        assert!(installed.runsc_available && !installed.runsc_active);
        let configured = assess(&gvisor, Some("gvisor"), 1, 1, None);
        assert!(configured.runsc_active && configured.runtime_configured);
        assert!(configured.user_isolation_active());
        gvisor.default_runtime = Some("gvisor".to_owned());
        assert!(assess(&gvisor, None, 1, 1, None).runsc_active);
        // Configured but not on the engine: not active, and creates would fail.
        let missing = assess(&info("overlay2", None, &[]), Some("runsc"), 1, 1, None);
        assert!(!missing.runtime_installed && !missing.runsc_active);
    }

    #[test]
    fn what_is_learnt_sticks_and_an_untested_verdict_gives_way() {
        let state = StorageState::default();
        let untested = StorageLimit::Untested("xfs".to_owned());
        assert_eq!(state.learn(untested.clone(), false, 1), untested);
        // A second driver-table answer does not override the first.
        assert_eq!(
            state.learn(StorageLimit::Enforced("x".to_owned()), false, 1),
            untested
        );
        let refused = StorageLimit::NotEnforced("refused".to_owned());
        assert_eq!(state.learn(refused.clone(), true, 1), refused);
        // Known not to hold: an acceptance cannot bring it back.
        assert_eq!(
            state.learn(StorageLimit::Enforced("x".to_owned()), true, 1),
            refused
        );
        assert!(!refused.applies() && untested.applies());
    }
}

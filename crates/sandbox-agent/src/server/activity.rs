//! The activity marker: a file whose mtime the agent sets when it serves a request, so the
//! service's idle sweep (which reads the mtime) sees a sandbox used only through the agent.
//!
//! Touches are throttled to one per [`ACTIVITY_TOUCH_INTERVAL`]: a burst of requests costs one
//! file system call. The touch runs off the request's path (on the blocking pool) and its
//! errors are logged, never returned: a read-only or full disk must not fail a request.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use crate::config::ACTIVITY_TOUCH_INTERVAL;
use crate::log::{self, Log};

/// The marker and when it was last touched.
#[derive(Debug)]
pub(super) struct Activity {
    path: Arc<PathBuf>,
    last: Mutex<Option<Instant>>,
    log: Log,
}

impl Activity {
    pub(super) fn new(path: PathBuf, log: Log) -> Activity {
        Activity {
            path: Arc::new(path),
            last: Mutex::new(None),
            log,
        }
    }

    /// Records a request: touches the marker unless it was touched within the interval.
    pub(super) fn served(&self) {
        let now = Instant::now();
        {
            let Ok(mut last) = self.last.lock() else {
                return;
            };
            if last.is_some_and(|t| now.duration_since(t) < ACTIVITY_TOUCH_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        let path = Arc::clone(&self.path);
        let log = self.log.clone();
        let touch = move || {
            if let Err(e) = touch(&path) {
                log::warning!(log, "touching the activity marker {}: {e}", path.display());
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(touch)),
            Err(_) => touch(),
        }
    }
}

/// Sets `path`'s mtime to now, creating the file (empty) if it is missing. Its content is
/// never read or changed.
fn touch(path: &std::path::Path) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.set_modified(SystemTime::now())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::time::Duration;

    fn mtime(path: &std::path::Path) -> SystemTime {
        std::fs::metadata(path).unwrap().modified().unwrap()
    }

    #[test]
    fn the_marker_is_created_then_touched_at_most_once_an_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("activity");
        let activity = Activity::new(path.clone(), Log::stderr());
        activity.served();
        assert!(path.is_file(), "a missing marker is created");
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .append(true)
            .open(&path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        // Within the interval: throttled, the mtime stays.
        activity.served();
        assert_eq!(mtime(&path), old);
        // Past it: touched again.
        *activity.last.lock().unwrap() = Some(Instant::now() - ACTIVITY_TOUCH_INTERVAL);
        activity.served();
        assert!(mtime(&path) > old + Duration::from_secs(3000));
    }

    #[test]
    fn an_untouchable_marker_is_logged_not_fatal() {
        let activity = Activity::new(PathBuf::from("/nonexistent-dir/activity"), Log::stderr());
        // Must not panic; nothing else to observe but that the call returns.
        activity.served();
        assert!(!std::path::Path::new("/nonexistent-dir/activity").exists());
    }
}

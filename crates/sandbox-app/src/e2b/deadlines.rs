//! [`FileDeadlines`]: the deadline store of a service on the memory binding store, one JSON file
//! under the service's data directory (`<data_dir>/e2b-deadlines.json`).
//!
//! Every change is on disk before the call returns, so an E2B create or set-timeout that was
//! answered survives a crash of the service: the new content goes to a temporary file in the
//! same directory, which is fsynced, renamed over the file, and the directory fsynced (so the
//! rename itself is durable). A crash at any point leaves either the old file or the new one,
//! never a mix; the in-memory copy changes only after the rename succeeded, so a failed write
//! changes nothing anyone can read.
//!
//! One process owns the file: a mutex serialises the writers of this instance, and nothing
//! guards against a second process writing the same file (a deployment with replicas uses the
//! Redis store, whose deadlines every replica shares).
//!
//! A file that does not parse, or holds a key or an instant no store writes, fails the open
//! with an error naming the file. It is never read as empty: an empty store would let the
//! restarted service forget every deadline, and its reconcile would then give each sandbox a
//! fresh default timeout instead of the one it was given.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::{
    DeadlineStore, Error, ErrorCode, ErrorKind, Operation, Origin, check_deadline_key,
    deadline_from_millis, deadline_millis, due_cutoff_millis,
};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::Mutex;

/// The file's name under the data directory.
pub const DEADLINES_FILE: &str = "e2b-deadlines.json";

/// The most deadlines the file holds. Every change rewrites the whole file, so the bound keeps
/// one write (and the file) to a few megabytes; past it a new key is refused with
/// `capacity`/`deadline_limit`, while existing keys can still be changed and removed.
pub const MAX_DEADLINES: usize = 100_000;

/// The file format's version; another one is refused at open.
const FORMAT_VERSION: u32 = 1;

/// The prefix of the temporary files a write goes through. Leftovers of a crash are removed at
/// open.
const TEMP_PREFIX: &str = ".e2b-deadlines.json.tmp-";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    version: u32,
    /// Key → deadline, whole Unix milliseconds.
    deadlines: BTreeMap<String, i64>,
}

/// The file-backed deadline store.
#[derive(Debug)]
pub struct FileDeadlines {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    path: PathBuf,
    max_entries: usize,
    /// The file's content as last written; the lock also serialises writers.
    state: Arc<Mutex<BTreeMap<String, i64>>>,
}

fn stored(e: Error) -> Error {
    e.with_origin(Origin::Store)
}

/// An I/O failure on `path` during `operation`, as the store's error.
fn io_error(operation: Operation, what: &str, path: &Path, e: io::Error) -> Error {
    let kind = match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => ErrorKind::Capacity,
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => ErrorKind::Internal,
        _ => ErrorKind::Unavailable,
    };
    stored(Error::new(
        kind,
        operation,
        format!("deadline file: cannot {what} {}: {e}", path.display()),
    ))
    .with_source(e)
}

impl FileDeadlines {
    /// Opens the store in `dir` (created with mode 0700 when missing), reading
    /// [`DEADLINES_FILE`] when it exists, bounded to [`MAX_DEADLINES`].
    pub async fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        FileDeadlines::open_bounded(dir, MAX_DEADLINES).await
    }

    /// [`FileDeadlines::open`] bounded to `max_entries` deadlines instead.
    pub async fn open_bounded(dir: impl Into<PathBuf>, max_entries: usize) -> Result<Self, Error> {
        let dir = dir.into();
        let path = dir.join(DEADLINES_FILE);
        let (dir, path, state) = tokio::task::spawn_blocking(move || {
            let state = load(&dir, &path)?;
            Ok::<_, Error>((dir, path, state))
        })
        .await
        .map_err(|e| {
            stored(Error::internal(
                Operation::new("open_deadlines"),
                format!("the deadline file's loader did not finish: {e}"),
            ))
        })??;
        Ok(FileDeadlines {
            inner: Arc::new(Inner {
                dir,
                path,
                max_entries,
                state: Arc::new(Mutex::new(state)),
            }),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Applies `change` to a copy of the state, writes the copy durably, and only then makes it
    /// the state. `change` refuses by returning an error.
    ///
    /// Cancel-safe: once the write has started it runs to its end in a task of its own, which
    /// holds the lock and updates the state, so a caller that goes away mid-write leaves the
    /// file and what this instance reads in agreement (both changed, or neither).
    async fn write(
        &self,
        operation: Operation,
        change: impl FnOnce(&mut BTreeMap<String, i64>) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        let mut state = self.inner.state.clone().lock_owned().await;
        let mut next = state.clone();
        if !change(&mut next)? {
            return Ok(());
        }
        let bytes = encode(operation, &next)?;
        let inner = self.inner.clone();
        let writer = tokio::spawn(async move {
            let (dir, path) = (inner.dir.clone(), inner.path.clone());
            tokio::task::spawn_blocking(move || {
                let temp = write_temp(operation, &dir, &bytes)?;
                commit(operation, &temp, &path, &dir)
            })
            .await
            .map_err(|e| {
                stored(Error::internal(
                    operation,
                    format!("the deadline file's writer did not finish: {e}"),
                ))
            })??;
            *state = next;
            Ok(())
        });
        writer.await.map_err(|e| {
            stored(Error::internal(
                operation,
                format!("the deadline file's writer did not finish: {e}"),
            ))
        })?
    }
}

fn encode(operation: Operation, deadlines: &BTreeMap<String, i64>) -> Result<Vec<u8>, Error> {
    let form = FileForm {
        version: FORMAT_VERSION,
        deadlines: deadlines.clone(),
    };
    serde_json::to_vec(&form).map_err(|e| {
        stored(Error::internal(
            operation,
            format!("cannot encode the deadlines: {e}"),
        ))
    })
}

/// Creates `dir` (0700) when missing, removes temporary files a crash left, and reads the file.
fn load(dir: &Path, path: &Path) -> Result<BTreeMap<String, i64>, Error> {
    let operation = Operation::new("open_deadlines");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error(operation, "create the directory", dir, e))?;
    let entries = fs::read_dir(dir).map_err(|e| io_error(operation, "list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(operation, "list", dir, e))?;
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let leftover = entry.path();
            fs::remove_file(&leftover)
                .map_err(|e| io_error(operation, "remove the leftover", &leftover, e))?;
        }
    }
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(io_error(operation, "read", path, e)),
    };
    let corrupt = |why: String| {
        stored(Error::internal(
            operation,
            format!(
                "deadline file {} is corrupt ({why}); it was left as it is: restore or move it \
                 away (deadlines are never read as absent)",
                path.display()
            ),
        ))
    };
    let form: FileForm = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    if form.version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {}, this service reads {FORMAT_VERSION}",
            form.version
        )));
    }
    for (key, ms) in &form.deadlines {
        check_deadline_key(operation, key).map_err(|e| corrupt(e.message().to_owned()))?;
        deadline_from_millis(operation, *ms).map_err(|e| corrupt(e.message().to_owned()))?;
    }
    Ok(form.deadlines)
}

/// Writes `bytes` to a new temporary file in `dir` (mode 0600) and fsyncs it; returns its path.
fn write_temp(operation: Operation, dir: &Path, bytes: &[u8]) -> Result<PathBuf, Error> {
    let temp = dir.join(format!("{TEMP_PREFIX}{:016x}", fastrand::u64(..)));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .map_err(|e| io_error(operation, "create", &temp, e))?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(io_error(operation, "write", &temp, e));
    }
    Ok(temp)
}

/// Renames `temp` over `path` and fsyncs `dir`, so the rename survives a crash.
fn commit(operation: Operation, temp: &Path, path: &Path, dir: &Path) -> Result<(), Error> {
    if let Err(e) = fs::rename(temp, path) {
        let _ = fs::remove_file(temp);
        return Err(io_error(operation, "replace", path, e));
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(operation, "sync the directory", dir, e))
}

#[async_trait]
impl DeadlineStore for FileDeadlines {
    async fn set_deadline(&self, key: &str, at: OffsetDateTime) -> Result<(), Error> {
        let operation = Operation::new("set_deadline");
        check_deadline_key(operation, key)?;
        let ms = deadline_millis(operation, at)?;
        let max = self.inner.max_entries;
        self.write(operation, |deadlines| {
            if deadlines.get(key) == Some(&ms) {
                return Ok(false);
            }
            if !deadlines.contains_key(key) && deadlines.len() >= max {
                return Err(stored(Error::new(
                    ErrorKind::Capacity,
                    operation,
                    format!(
                        "the deadline file holds {max} deadlines, its bound; {key} was not stored"
                    ),
                ))
                .with_code(ErrorCode::DeadlineLimit));
            }
            deadlines.insert(key.to_owned(), ms);
            Ok(true)
        })
        .await
    }

    async fn deadline(&self, key: &str) -> Result<Option<OffsetDateTime>, Error> {
        let operation = Operation::new("deadline");
        check_deadline_key(operation, key)?;
        let ms = self.inner.state.lock().await.get(key).copied();
        ms.map(|ms| deadline_from_millis(operation, ms)).transpose()
    }

    async fn remove_deadline(&self, key: &str) -> Result<(), Error> {
        let operation = Operation::new("remove_deadline");
        check_deadline_key(operation, key)?;
        self.write(operation, |deadlines| Ok(deadlines.remove(key).is_some()))
            .await
    }

    async fn due(
        &self,
        now: OffsetDateTime,
        limit: usize,
    ) -> Result<Vec<(String, OffsetDateTime)>, Error> {
        let operation = Operation::new("due");
        let cutoff = due_cutoff_millis(now);
        let mut due: Vec<(i64, String)> = {
            let state = self.inner.state.lock().await;
            state
                .iter()
                .filter(|(_, ms)| **ms <= cutoff)
                .map(|(key, ms)| (*ms, key.clone()))
                .collect()
        };
        due.sort_unstable();
        due.into_iter()
            .take(limit)
            .map(|(ms, key)| Ok((key, deadline_from_millis(operation, ms)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use sandbox_testkit::conformance::deadlines::{
        DeadlineFeatures, DeadlineTarget, check_deadline_store,
    };

    use super::*;

    fn at(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(secs).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_deadline_suite_passes() {
        // Each target gets its own directory, kept until the test ends.
        let dirs = Arc::new(std::sync::Mutex::new(Vec::<tempfile::TempDir>::new()));
        let keep = dirs.clone();
        check_deadline_store(
            DeadlineFeatures {
                peer: false,
                reopen: true,
            },
            Arc::new(move |_ns| {
                let keep = keep.clone();
                Box::pin(async move {
                    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
                    let path = dir.path().join("data");
                    keep.lock().unwrap().push(dir);
                    let store = FileDeadlines::open(&path)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(
                        DeadlineTarget::new(Arc::new(store)).with_reopen(Arc::new(move || {
                            let path = path.clone();
                            Box::pin(async move {
                                let reopened = FileDeadlines::open(&path)
                                    .await
                                    .map_err(|e| e.to_string())?;
                                Ok(Arc::new(reopened) as Arc<dyn DeadlineStore>)
                            })
                        })),
                    )
                })
            }),
        )
        .await
        .unwrap();
        drop(dirs);
    }

    #[tokio::test]
    async fn a_reopened_store_sees_what_was_written_and_the_modes_are_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state").join("sandbox");
        let store = FileDeadlines::open(&dir).await.unwrap();
        // Created 0700, and no file until the first write.
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(!store.path().exists());
        store.set_deadline("ia", at(1_900_000_000)).await.unwrap();
        store.set_deadline("ib", at(1_800_000_000)).await.unwrap();
        store.set_deadline("ic", at(1_700_000_000)).await.unwrap();
        store.remove_deadline("ic").await.unwrap();
        let mode = fs::metadata(store.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(store.path(), dir.join(DEADLINES_FILE));
        drop(store);
        let reopened = FileDeadlines::open(&dir).await.unwrap();
        assert_eq!(
            reopened.due(at(2_000_000_000), 10).await.unwrap(),
            vec![
                ("ib".to_owned(), at(1_800_000_000)),
                ("ia".to_owned(), at(1_900_000_000))
            ]
        );
        assert_eq!(reopened.deadline("ic").await.unwrap(), None);
        // The file is the documented JSON form.
        let text = fs::read_to_string(dir.join(DEADLINES_FILE)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": 1, "deadlines": {"ia": 1_900_000_000_000_i64, "ib": 1_800_000_000_000_i64}})
        );
    }

    #[tokio::test]
    async fn a_corrupt_file_is_refused_at_open_naming_it_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(DEADLINES_FILE);
        for (content, says) in [
            (&b"{\"version\":1,\"deadlines\":{\"ia\":17"[..], "EOF"),
            (b"", "EOF"),
            (b"not json", "expected"),
            (b"{\"version\":2,\"deadlines\":{}}", "format version 2"),
            (
                b"{\"version\":1,\"deadlines\":{\"a\\nb\":1}}",
                "control character",
            ),
            (
                b"{\"version\":1,\"deadlines\":{\"ia\":-5}}",
                "outside the range",
            ),
            (
                b"{\"version\":1,\"deadlines\":{},\"extra\":1}",
                "unknown field",
            ),
        ] {
            fs::write(&path, content).unwrap();
            let err = FileDeadlines::open(tmp.path()).await.unwrap_err();
            assert_eq!(err.origin(), Origin::Store, "{err}");
            assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
            assert!(err.message().contains(&path.display().to_string()), "{err}");
            assert!(err.message().contains(says), "{says}: {err}");
            assert_eq!(fs::read(&path).unwrap(), content, "the file was changed");
        }
    }

    #[tokio::test]
    async fn a_crash_between_temp_write_and_rename_leaves_the_old_file() {
        let tmp = tempfile::tempdir().unwrap();
        let store = FileDeadlines::open(tmp.path()).await.unwrap();
        store.set_deadline("iold", at(1_800_000_000)).await.unwrap();
        let before = fs::read(store.path()).unwrap();
        // What a set of `inew` writes, stopped where a crash would stop it: the temporary file
        // complete and synced, the rename not done.
        let mut next = store.inner.state.lock().await.clone();
        next.insert("inew".to_owned(), 1_900_000_000_000);
        let op = Operation::new("set_deadline");
        let temp = write_temp(op, tmp.path(), &encode(op, &next).unwrap()).unwrap();
        assert!(temp.exists());
        drop(store);
        assert_eq!(fs::read(tmp.path().join(DEADLINES_FILE)).unwrap(), before);
        let reopened = FileDeadlines::open(tmp.path()).await.unwrap();
        assert_eq!(
            reopened.deadline("iold").await.unwrap(),
            Some(at(1_800_000_000))
        );
        assert_eq!(reopened.deadline("inew").await.unwrap(), None);
        // The leftover is cleaned up at open.
        assert!(!temp.exists());
    }

    #[tokio::test]
    async fn a_failed_write_changes_nothing_readable() {
        let tmp = tempfile::tempdir().unwrap();
        let store = FileDeadlines::open(tmp.path()).await.unwrap();
        store.set_deadline("ia", at(1_800_000_000)).await.unwrap();
        // The file's place taken by a non-empty directory: the rename over it fails.
        fs::remove_file(store.path()).unwrap();
        fs::create_dir(store.path()).unwrap();
        fs::write(store.path().join("x"), b"x").unwrap();
        let err = store
            .set_deadline("ia", at(1_900_000_000))
            .await
            .unwrap_err();
        assert_eq!(err.origin(), Origin::Store);
        assert!(err.message().contains("cannot replace"), "{err}");
        assert_eq!(store.deadline("ia").await.unwrap(), Some(at(1_800_000_000)));
        assert!(store.remove_deadline("ia").await.is_err());
        assert_eq!(store.deadline("ia").await.unwrap(), Some(at(1_800_000_000)));
        // No temporary file is left behind by the failed writes.
        let leftovers: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(TEMP_PREFIX))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    /// A call dropped after its first poll (its write under way: the lock was free, so the
    /// writer started) still lands whole: what this instance reads and what the file holds
    /// agree, and both have the deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_write_lands_whole() {
        use futures_util::FutureExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let store = FileDeadlines::open(tmp.path()).await.unwrap();
        for n in 0..10_i64 {
            let key = format!("i{n:03}");
            // Polled once, then dropped (unless a write with its fsync finished within one
            // poll, which changes nothing here).
            let _ = store
                .set_deadline(&key, at(1_800_000_000 + n))
                .now_or_never();
            // The read waits for the lock, so for a writer that holds it.
            let read = store.deadline(&key).await.unwrap();
            assert_eq!(read, Some(at(1_800_000_000 + n)), "{key}");
        }
        let reopened = FileDeadlines::open(tmp.path()).await.unwrap();
        assert_eq!(
            reopened.due(at(2_000_000_000), 100).await.unwrap(),
            store.due(at(2_000_000_000), 100).await.unwrap()
        );
    }

    #[tokio::test]
    async fn the_number_of_deadlines_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let store = FileDeadlines::open_bounded(tmp.path(), 3).await.unwrap();
        for key in ["i1", "i2", "i3"] {
            store.set_deadline(key, at(1_800_000_000)).await.unwrap();
        }
        let err = store
            .set_deadline("i4", at(1_800_000_000))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Capacity);
        assert_eq!(err.code(), Some(ErrorCode::DeadlineLimit));
        assert_eq!(err.origin(), Origin::Store);
        assert_eq!(err.status_and_code(), (429, "deadline_limit"));
        assert_eq!(store.deadline("i4").await.unwrap(), None);
        // At the bound, existing keys still change and go; a freed slot takes a new key.
        store.set_deadline("i1", at(1_900_000_000)).await.unwrap();
        store.remove_deadline("i2").await.unwrap();
        store.set_deadline("i4", at(1_800_000_000)).await.unwrap();
        let reopened = FileDeadlines::open_bounded(tmp.path(), 3).await.unwrap();
        assert_eq!(reopened.due(at(2_000_000_000), 10).await.unwrap().len(), 3);
        assert_eq!(MAX_DEADLINES, 100_000);
    }
}

//! Directory watches (`Watch`) through envd's `Filesystem/WatchDir` server stream.
//!
//! - **What may be watched.** The path is stat'ed first, its own entry judged: a missing one is
//!   `not_found`, anything but a directory (a file, a symlink, a FIFO) `not_a_directory`.
//! - **Armed on return.** The call returns only once envd's `start` event said its watcher is
//!   in place ([`WATCH_ARM_TIMEOUT`] at most), so a change made right after the return is seen.
//! - **Recursive.** The request's `recursive` flag is envd's.
//! - **Events.** envd names each change relative to the watched directory; it is reported at
//!   its absolute path below the directory, with envd's kind (create, write, remove, rename,
//!   chmod). A name no path below the directory can hold ends the stream with an error rather
//!   than reporting a change somewhere else; a kind this adapter does not know is skipped.
//! - **Bounded.** The stream is pulled by the caller, so envd's own queue (and inotify's) is
//!   the only buffer; envd ends a watch whose inotify queue overflowed with an error, which is
//!   `watch_overflow` here. The stream has no deadline: its liveness is the envd client's idle
//!   limit over envd's keep-alives. Dropping it closes the stream, which stops envd's watcher.

use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    EntryKind, Error, ErrorCode, Operation, SandboxHandle, SandboxPath, Watch, WatchEvent,
    WatchEventKind, WatchEvents, WatchStream,
};
use sandbox_envd::filesystem::watch_dir_response::Event;
use sandbox_envd::filesystem::{EventType, FilesystemEvent, WatchDirRequest, WatchDirResponse};
use sandbox_transport::envd::{CallOptions, ServerStream};

use crate::errors::provider_error;
use crate::provider::E2bProvider;

/// How long envd may take to arm a watch (its `start` event).
pub(crate) const WATCH_ARM_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a watch of `dir` (see the module docs).
pub(crate) async fn watch_dir(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    dir: &SandboxPath,
    recursive: bool,
) -> Result<E2bWatch, Error> {
    let op = Operation::WATCH_DIR;
    let entry = crate::files::stat(provider, sandbox, dir)
        .await
        .map_err(|e| e.with_operation(op))?;
    if entry.kind != EntryKind::Dir {
        return Err(provider_error(
            Error::invalid_request(op, format!("{dir}: not a directory"))
                .with_code(ErrorCode::NotADirectory),
        ));
    }
    let envd = provider.envd(sandbox).await?;
    let request = WatchDirRequest {
        path: dir.as_str().to_owned(),
        recursive,
        ..Default::default()
    };
    let armed = async {
        let mut stream = envd
            .client()
            .watch_dir(&request, CallOptions::new().no_timeout())
            .await?;
        let first = tokio::time::timeout(WATCH_ARM_TIMEOUT, stream.message())
            .await
            .map_err(|_| {
                Error::timeout(op, format!("envd did not arm the watch on {dir} in time"))
            })??;
        Ok::<_, Error>((stream, first))
    };
    let (stream, first) = match armed.await {
        Ok(opened) => opened,
        Err(e) => {
            return Err(provider
                .explain(sandbox.id(), provider_error(e).with_operation(op))
                .await);
        }
    };
    match first.and_then(|m| m.event) {
        Some(Event::Start(_)) => {}
        other => {
            return Err(provider_error(Error::internal(
                op,
                format!("envd's watch on {dir} began with {other:?}, not start"),
            )));
        }
    }
    Ok(E2bWatch {
        stream,
        dir: dir.clone(),
        done: false,
    })
}

/// See [`watch_dir`].
pub(crate) struct E2bWatch {
    stream: ServerStream<WatchDirResponse>,
    dir: SandboxPath,
    done: bool,
}

impl std::fmt::Debug for E2bWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bWatch")
            .field("dir", &self.dir)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

/// The port's event for envd's `change` below `dir`: `None` for a kind this adapter does not
/// know, an error for a name no path below `dir` can hold.
pub(crate) fn event_of(
    dir: &SandboxPath,
    change: &FilesystemEvent,
) -> Option<Result<WatchEvent, Error>> {
    let kind = match change.r#type {
        EventType::Create => WatchEventKind::Create,
        EventType::Write => WatchEventKind::Write,
        EventType::Remove => WatchEventKind::Remove,
        EventType::Rename => WatchEventKind::Rename,
        EventType::Chmod => WatchEventKind::Chmod,
        EventType::Unspecified | EventType::Unrecognized(_) => return None,
    };
    let path = if change.name.is_empty() {
        Ok(dir.clone())
    } else {
        dir.join(&change.name)
            .ok()
            .filter(|p| p.is_strictly_under(dir))
            .ok_or_else(|| {
                provider_error(Error::internal(
                    Operation::WATCH_DIR,
                    format!(
                        "envd reported a change outside {dir}: {:?}",
                        change.name.chars().take(200).collect::<String>()
                    ),
                ))
            })
    };
    Some(path.map(|path| WatchEvent { kind, path }))
}

#[async_trait]
impl WatchEvents for E2bWatch {
    async fn next_event(&mut self) -> Option<Result<WatchEvent, Error>> {
        if self.done {
            return None;
        }
        loop {
            match self.stream.message().await {
                Ok(Some(message)) => match message.event {
                    Some(Event::Filesystem(change)) => {
                        if let Some(event) = event_of(&self.dir, &change) {
                            self.done = event.is_err();
                            return Some(event);
                        }
                    }
                    Some(Event::Start(_) | Event::Keepalive(_)) | None => {}
                },
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    // envd ends a watch whose inotify queue overflowed with an error naming it.
                    if e.message().to_ascii_lowercase().contains("overflow") {
                        return Some(Err(provider_error(sandbox_core::watch::watch_overflow(
                            &self.dir,
                        ))));
                    }
                    return Some(Err(provider_error(e).with_operation(Operation::WATCH_DIR)));
                }
            }
        }
    }
}

/// Directory watches through envd. See the module docs.
#[async_trait]
impl Watch for E2bProvider {
    async fn watch_dir(
        &self,
        sandbox: &SandboxHandle,
        dir: &SandboxPath,
        recursive: bool,
    ) -> Result<WatchStream, Error> {
        Ok(Box::new(watch_dir(self, sandbox, dir, recursive).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, r#type: EventType) -> FilesystemEvent {
        FilesystemEvent {
            name: name.to_owned(),
            r#type,
            ..FilesystemEvent::default()
        }
    }

    #[test]
    fn events_are_placed_below_the_directory_with_their_kind() {
        let dir = SandboxPath::new("/w").unwrap();
        let rows = [
            (EventType::Create, WatchEventKind::Create),
            (EventType::Write, WatchEventKind::Write),
            (EventType::Remove, WatchEventKind::Remove),
            (EventType::Rename, WatchEventKind::Rename),
            (EventType::Chmod, WatchEventKind::Chmod),
        ];
        for (wire, kind) in rows {
            let event = event_of(&dir, &change("a/b.txt", wire)).unwrap().unwrap();
            assert_eq!(event.kind, kind);
            assert_eq!(event.path.as_str(), "/w/a/b.txt");
        }
        // The directory itself (envd names it with an empty name).
        let own = event_of(&dir, &change("", EventType::Remove))
            .unwrap()
            .unwrap();
        assert_eq!(own.path, dir);
        assert!(event_of(&dir, &change("x", EventType::Unspecified)).is_none());
        // A name that would land elsewhere is refused, not reported there.
        for outside in ["../etc/passwd", "/etc/passwd", "a/../../x"] {
            let refused = event_of(&dir, &change(outside, EventType::Create)).unwrap();
            assert!(refused.is_err(), "{outside}: {refused:?}");
        }
    }
}

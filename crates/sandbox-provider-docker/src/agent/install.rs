//! Copying the agent into a created container: one tar stream through the engine's archive
//! endpoint (`PUT /containers/{id}/archive?path=/`), before the container starts.
//!
//! Pure Engine API, so it works with a remote `tcp://` daemon and with network `none`, and
//! nothing runs inside the container to do it. The archive carries:
//!
//! - the directory entry `.sandbox/` (mode 0755, root), so the directory exists whatever the
//!   image holds, and a snapshot's own `/.sandbox` (a symlink, a file) is replaced rather than
//!   followed;
//! - `.sandbox/sandbox-agent` (mode 0755, root): the checked bytes, written over any agent a
//!   snapshot image carried in (the engine replaces what is at a path, a directory included);
//! - `var/lib/sandbox-activity`, empty, mode 0666, dated now: the idle marker exec mode's
//!   entrypoint creates. Commands under other accounts can then still touch it, and a restored
//!   snapshot starts with a fresh marker rather than its source's last activity.
//!
//! Ownership is the container's root: the engine ignores the headers' owners unless asked to
//! copy them, and the headers say root anyway.

use std::time::{SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::query_parameters::UploadToContainerOptions;
use bytes::Bytes;
use sandbox_core::{Error, ErrorKind, Operation};

use super::{AGENT_DIR, AGENT_PATH, AgentBinary};
use crate::errors::{self, provider_error};
use crate::exec::ACTIVITY_MARKER;

/// The archive's entries: path inside the container (relative to `/`), mode, contents (`None`
/// for a directory).
fn entries(agent: &[u8]) -> [(&'static str, u32, Option<&[u8]>); 3] {
    [
        (AGENT_DIR, 0o755, None),
        (AGENT_PATH, 0o755, Some(agent)),
        (ACTIVITY_MARKER, 0o666, Some(&[])),
    ]
}

/// The tar stream of [`install`], uncompressed, dated `now`.
pub(crate) fn archive(agent: &[u8], now: SystemTime) -> std::io::Result<Vec<u8>> {
    let mtime = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut builder = tar::Builder::new(Vec::with_capacity(agent.len() + 4 * 512 + 1024));
    for (path, mode, contents) in entries(agent) {
        let relative = path.trim_start_matches('/');
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        match contents {
            None => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, format!("{relative}/"), std::io::empty())?;
            }
            Some(bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, relative, bytes)?;
            }
        }
    }
    builder.into_inner()
}

/// Copies `agent` into the created (not yet started) container `id`.
pub(crate) async fn install(
    docker: &Docker,
    op: Operation,
    id: &str,
    agent: &AgentBinary,
) -> Result<(), Error> {
    let tar = archive(agent.bytes(), SystemTime::now()).map_err(|e| {
        provider_error(
            ErrorKind::Internal,
            op,
            format!("building the agent's archive: {e}"),
        )
    })?;
    let options = UploadToContainerOptions {
        path: "/".to_owned(),
        ..Default::default()
    };
    docker
        .upload_to_container(id, Some(options), bollard::body_full(Bytes::from(tar)))
        .await
        .map_err(|e| errors::map(op, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::time::Duration;

    #[test]
    fn the_archive_holds_the_directory_the_agent_and_a_fresh_marker() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let tar_bytes = archive(b"\x7fELF-agent", now).unwrap();
        assert_eq!(tar_bytes.len() % 512, 0, "whole tar blocks");
        let mut archive = tar::Archive::new(tar_bytes.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let header = entry.header().clone();
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            seen.push((
                entry.path().unwrap().display().to_string(),
                header.entry_type(),
                header.mode().unwrap(),
                (header.uid().unwrap(), header.gid().unwrap()),
                header.mtime().unwrap(),
                body,
            ));
        }
        let when = 1_800_000_000;
        assert_eq!(
            seen,
            [
                (
                    ".sandbox/".to_owned(),
                    tar::EntryType::Directory,
                    0o755,
                    (0, 0),
                    when,
                    vec![]
                ),
                (
                    ".sandbox/sandbox-agent".to_owned(),
                    tar::EntryType::Regular,
                    0o755,
                    (0, 0),
                    when,
                    b"\x7fELF-agent".to_vec()
                ),
                (
                    "var/lib/sandbox-activity".to_owned(),
                    tar::EntryType::Regular,
                    0o666,
                    (0, 0),
                    when,
                    vec![]
                ),
            ]
        );
    }
}

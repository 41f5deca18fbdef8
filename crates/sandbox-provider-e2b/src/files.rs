//! File operations through envd's `/files` and filesystem service.

use std::time::Duration;

use sandbox_core::{
    DirEntry, EntryKind, Error, ErrorCode, Operation, SandboxHandle, SandboxPath, StatEntry,
};
use sandbox_envd::filesystem::{EntryInfo, FileType};
use sandbox_transport::envd::CallOptions;

use crate::errors::{is_dir_exists, provider_error};
use crate::provider::E2bProvider;

/// The largest file a read returns.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024 * 1024;
/// The bound of one file call.
pub(crate) const FILE_TIMEOUT: Duration = Duration::from_secs(120);

fn options() -> CallOptions {
    CallOptions::new().timeout(FILE_TIMEOUT)
}

/// An envd entry's own kind: a symlink is `Other` whatever it points at (newer envd reports
/// the target's type with `is_symlink`, older envd a symlink type, and a target either way),
/// so a read never follows a link the sandbox planted.
pub(crate) fn kind_of(entry: &EntryInfo) -> EntryKind {
    if entry.is_symlink || entry.symlink_target.is_some() {
        return EntryKind::Other;
    }
    match entry.r#type {
        FileType::File => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        _ => EntryKind::Other,
    }
}

/// An entry's modification time, to the nanosecond envd reports (none when it reports none).
fn modified_of(entry: &EntryInfo) -> Option<time::OffsetDateTime> {
    let t = entry.modified_time?;
    let nanos = i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

fn size_of(entry: &EntryInfo) -> u64 {
    u64::try_from(entry.size).unwrap_or(0)
}

fn dir_entry(op: Operation, entry: &EntryInfo) -> Result<DirEntry, Error> {
    let path = SandboxPath::new(&entry.path).map_err(|e| provider_error(e.with_operation(op)))?;
    Ok(DirEntry {
        name: entry.name.clone(),
        path,
        kind: kind_of(entry),
        size: size_of(entry),
        modified: modified_of(entry),
    })
}

async fn fail(provider: &E2bProvider, sandbox: &SandboxHandle, op: Operation, e: Error) -> Error {
    provider.explain(sandbox.id(), e.with_operation(op)).await
}

pub(crate) async fn write(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
    content: &[u8],
) -> Result<(), Error> {
    let op = Operation::WRITE_FILE;
    let envd = provider.envd(sandbox).await?;
    match envd
        .client()
        .write_file(path.as_str(), content.to_vec(), options())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

pub(crate) async fn read(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
) -> Result<Vec<u8>, Error> {
    let op = Operation::READ_FILE;
    let entry = stat(provider, sandbox, path)
        .await
        .map_err(|e| e.with_operation(op))?;
    if entry.kind != EntryKind::File {
        return Err(provider_error(
            Error::invalid_request(op, format!("{path} is not a regular file"))
                .with_code(ErrorCode::NotARegularFile),
        ));
    }
    if entry.size > MAX_FILE_BYTES {
        return Err(provider_error(
            sandbox_core::ports::provider::file_too_large(path, MAX_FILE_BYTES),
        ));
    }
    let envd = provider.envd(sandbox).await?;
    match envd
        .client()
        .read_file(path.as_str(), MAX_FILE_BYTES, options())
        .await
    {
        Ok(bytes) => Ok(bytes.to_vec()),
        Err(e) if e.code() == Some(ErrorCode::FileTooLarge) => Err(provider_error(e)),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

pub(crate) async fn list_dir(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
) -> Result<Vec<DirEntry>, Error> {
    let op = Operation::LIST_DIR;
    let envd = provider.envd(sandbox).await?;
    match envd.client().list_dir(path.as_str(), 1, options()).await {
        Ok(entries) => entries.iter().map(|e| dir_entry(op, e)).collect(),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

pub(crate) async fn make_dir(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
) -> Result<(), Error> {
    let op = Operation::MAKE_DIR;
    let envd = provider.envd(sandbox).await?;
    match envd.client().make_dir(path.as_str(), options()).await {
        Ok(_) => Ok(()),
        Err(e) if is_dir_exists(&e) => {
            // Existing is success only when it is a directory.
            let entry = stat(provider, sandbox, path)
                .await
                .map_err(|e| e.with_operation(op))?;
            if entry.kind == EntryKind::Dir {
                Ok(())
            } else {
                Err(provider_error(Error::conflict(
                    op,
                    format!("{path} exists and is not a directory"),
                )))
            }
        }
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

pub(crate) async fn remove(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
) -> Result<(), Error> {
    let op = Operation::REMOVE;
    if path.is_root() {
        return Err(provider_error(Error::invalid_request(
            op,
            "refusing to remove /",
        )));
    }
    let envd = provider.envd(sandbox).await?;
    match envd.client().remove(path.as_str(), options()).await {
        Ok(()) => Ok(()),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

pub(crate) async fn stat(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
) -> Result<StatEntry, Error> {
    let op = Operation::STAT;
    let envd = provider.envd(sandbox).await?;
    match envd.client().stat(path.as_str(), options()).await {
        Ok(entry) => Ok(StatEntry {
            path: path.clone(),
            kind: kind_of(&entry),
            size: size_of(&entry),
            modified: modified_of(&entry),
        }),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_and_symlinks_are_other() {
        let mut e = EntryInfo {
            r#type: FileType::File,
            ..EntryInfo::default()
        };
        assert_eq!(kind_of(&e), EntryKind::File);
        e.r#type = FileType::Directory;
        assert_eq!(kind_of(&e), EntryKind::Dir);
        e.r#type = FileType::Symlink;
        assert_eq!(kind_of(&e), EntryKind::Other);
        e.r#type = FileType::Unspecified;
        assert_eq!(kind_of(&e), EntryKind::Other);
        // Newer envd: the target's type, flagged as a link.
        e.r#type = FileType::File;
        e.is_symlink = true;
        assert_eq!(kind_of(&e), EntryKind::Other);
        e.is_symlink = false;
        e.symlink_target = Some("/etc/shadow".to_owned());
        assert_eq!(kind_of(&e), EntryKind::Other);
        e.size = -5;
        assert_eq!(size_of(&e), 0);
        assert_eq!(modified_of(&e), None);
        e.modified_time = Some(sandbox_envd::Timestamp::new(1_700_000_000, 5).unwrap());
        let t = modified_of(&e).unwrap();
        assert_eq!(t.unix_timestamp(), 1_700_000_000);
        assert_eq!(t.nanosecond(), 5);
    }
}

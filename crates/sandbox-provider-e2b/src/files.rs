//! File operations through envd's `/files` and filesystem service.
//!
//! - **Whole files.** A write is one multipart upload; a read stats the path first and reads
//!   only a regular file, bounded by [`MAX_FILE_BYTES`].
//! - **Streamed files** (`StreamedFiles`, and the provider's `read_file_stream`). Every path
//!   in a sandbox may be a symlink, a FIFO or `/dev/zero`, and envd's `GET /files` follows
//!   links and opens what it finds. So a read stats the path first (a link is never
//!   followed: it is `not_a_regular_file`, as a FIFO or a device is), refuses a file already
//!   over the cap, then pulls the download chunk by chunk, and ends the stream with
//!   `file_too_large` the moment the bytes pass the cap (a file swapped after the stat is
//!   still bounded by the cap and [`STREAM_TIMEOUT`]). A write is the envd client's staged
//!   upload (`EnvdClient::upload_atomic`): the source, pulled as the body is sent, to a hidden
//!   sibling, then envd's `Move` over the target, the sibling removed on any failure; it needs
//!   envd's octet-stream uploads ([`STREAMED_UPLOAD_ENVD`]). A rename is envd's `Move`, after
//!   the port's rules are checked here (envd's `Move` is a plain `rename(2)`, which would move
//!   a directory onto an empty one).
//! - **Who.** Files act as root ([`crate::config::DEFAULT_USER`], the `username` of `/files`
//!   and the Basic credentials of the filesystem service).

use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    ByteStream, DirEntry, EntryKind, Error, ErrorCode, ErrorKind, Operation, ReadStream,
    SandboxHandle, SandboxPath, StatEntry, StreamedFiles,
};
use sandbox_envd::filesystem::{EntryInfo, FileType};
use sandbox_transport::envd::{CallOptions, Download, StagedUploadError};

use crate::errors::{is_dir_exists, provider_error};
use crate::provider::E2bProvider;

/// The largest file a read returns.
pub(crate) const MAX_FILE_BYTES: u64 = 1024 * 1024 * 1024;
/// The bound of one file call.
pub(crate) const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound of a whole streamed read or write (a gigabyte at a slow client's pace).
pub(crate) const STREAM_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The first envd version that takes `POST /files` as `application/octet-stream`, which a
/// streamed write sends; below it envd takes multipart only.
pub(crate) const STREAMED_UPLOAD_ENVD: (u64, u64, u64) = (0, 5, 7);

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
    provider
        .explain(sandbox.id(), refused_path(e.with_operation(op)))
        .await
}

/// envd's `permission_denied` (403) on a file operation: the path is one the caller may not
/// use (a file root cannot open, or, from the sandbox agent, a path resolving into a tree it
/// reserves such as `/dev` through a planted symlink). That is the caller's path, so
/// `invalid_request` with code `invalid_path`, not a failed credential: envd refuses a token
/// with 401, which stays `authentication`.
fn refused_path(e: Error) -> Error {
    if e.http_status() == Some(403) {
        return provider_error(
            Error::invalid_request(e.operation(), e.message().to_owned())
                .with_code(ErrorCode::InvalidPath)
                .with_http_status(403),
        );
    }
    e
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
    // envd's remove succeeds on a missing path, where the port says `not_found` (as every
    // backend answers): the path is looked at first.
    if let Err(e) = envd.client().stat(path.as_str(), options()).await {
        return Err(fail(provider, sandbox, op, e).await);
    }
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

fn invalid_path(op: Operation, why: String) -> Error {
    provider_error(Error::invalid_request(op, why).with_code(ErrorCode::InvalidPath))
}

/// The version envd reported as `(major, minor, patch)`, when it reads as one (`0.5.7`,
/// `v0.6.4`, `0.6.4-rc1`).
fn parse_version(raw: &str) -> Option<(u64, u64, u64)> {
    let raw = raw.trim().trim_start_matches('v');
    let core = raw.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().unwrap_or(Some(0))?;
    Some((major, minor, patch))
}

/// Opens a streamed read of `path` (see the module docs): answers once the path was judged
/// and the download opened, so a missing or irregular file is an error here, before any
/// chunk.
pub(crate) async fn read_stream(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
    max_bytes: u64,
) -> Result<E2bFileStream, Error> {
    let op = Operation::READ_FILE_STREAM;
    let entry = stat(provider, sandbox, path)
        .await
        .map_err(|e| e.with_operation(op))?;
    if entry.kind != EntryKind::File {
        return Err(provider_error(
            Error::invalid_request(op, format!("{path} is not a regular file"))
                .with_code(ErrorCode::NotARegularFile),
        ));
    }
    let too_large = || {
        provider_error(
            sandbox_core::ports::provider::file_too_large(path, max_bytes).with_operation(op),
        )
    };
    if entry.size > max_bytes {
        return Err(too_large());
    }
    let envd = provider.envd(sandbox).await?;
    let download = match envd
        .client()
        .download(path.as_str(), CallOptions::new().timeout(STREAM_TIMEOUT))
        .await
    {
        Ok(download) => download,
        Err(e) => return Err(fail(provider, sandbox, op, e).await),
    };
    if download.content_length().is_some_and(|n| n > max_bytes) {
        return Err(too_large());
    }
    Ok(E2bFileStream {
        download: Some(download),
        path: path.clone(),
        max_bytes,
        delivered: 0,
    })
}

/// A file's bytes as envd sends them, pulled chunk by chunk (see [`read_stream`]). Dropping it
/// drops the download, which closes its connection.
pub(crate) struct E2bFileStream {
    /// `None` once the stream ended.
    download: Option<Download>,
    path: SandboxPath,
    max_bytes: u64,
    delivered: u64,
}

impl std::fmt::Debug for E2bFileStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bFileStream")
            .field("path", &self.path)
            .field("delivered", &self.delivered)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ByteStream for E2bFileStream {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        let download = self.download.as_mut()?;
        match download.chunk().await {
            Ok(Some(bytes)) => {
                let total = self
                    .delivered
                    .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
                if total > self.max_bytes {
                    self.download = None;
                    return Some(Err(provider_error(
                        sandbox_core::ports::provider::file_too_large(&self.path, self.max_bytes)
                            .with_operation(Operation::READ_FILE_STREAM),
                    )));
                }
                self.delivered = total;
                Some(Ok(bytes.to_vec()))
            }
            Ok(None) => {
                self.download = None;
                None
            }
            Err(e) => {
                self.download = None;
                Some(Err(
                    provider_error(e).with_operation(Operation::READ_FILE_STREAM)
                ))
            }
        }
    }
}

/// A streamed write (see the module docs); returns the bytes written.
pub(crate) async fn write_stream(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    path: &SandboxPath,
    source: ReadStream,
    max_bytes: u64,
) -> Result<u64, Error> {
    let op = Operation::WRITE_FILE_STREAM;
    if path.is_root() {
        return Err(provider_error(Error::invalid_request(
            op,
            "/: is a directory",
        )));
    }
    let envd = provider.envd(sandbox).await?;
    if let Some(version) = parse_version(envd.version())
        && version < STREAMED_UPLOAD_ENVD
    {
        let (a, b, c) = STREAMED_UPLOAD_ENVD;
        return Err(provider_error(Error::unsupported(
            op,
            format!(
                "this sandbox's envd {} takes no streamed uploads ({a}.{b}.{c} and later do); \
                 rebuild its template on a newer envd",
                envd.version()
            ),
        )));
    }
    let uploaded = envd
        .client()
        .upload_atomic(
            path,
            source,
            max_bytes,
            CallOptions::new().timeout(STREAM_TIMEOUT),
            options(),
        )
        .await;
    match uploaded {
        Ok(written) => Ok(written),
        Err(StagedUploadError::Envd(e)) => Err(fail(provider, sandbox, op, e).await),
        // The source's own failure (or the bound) is the caller's error as it is.
        Err(other) => Err(other.into_error().with_operation(op)),
    }
}

/// A rename, with the port's rules checked before envd's `Move`: `/`, a target inside the
/// source and an existing directory as the target are `invalid_path`; a missing source is
/// `not_found` (envd's answer).
pub(crate) async fn rename(
    provider: &E2bProvider,
    sandbox: &SandboxHandle,
    from: &SandboxPath,
    to: &SandboxPath,
) -> Result<(), Error> {
    let op = Operation::RENAME_PATH;
    if from.is_root() || to.is_root() {
        return Err(invalid_path(
            op,
            "/ cannot be renamed, nor be a rename's target".to_owned(),
        ));
    }
    if to.is_strictly_under(from) {
        return Err(invalid_path(op, format!("{to} is inside {from}")));
    }
    // The target's own entry: a symlink to a directory is replaced, as `rename(2)` replaces
    // the link, so only a real directory is refused.
    match stat(provider, sandbox, to).await {
        Ok(entry) if entry.kind == EntryKind::Dir && from != to => {
            return Err(invalid_path(op, format!("{to} is an existing directory")));
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound && e.code().is_none() => {}
        Err(e) => return Err(e.with_operation(op)),
    }
    let envd = provider.envd(sandbox).await?;
    match envd
        .client()
        .rename(from.as_str(), to.as_str(), options())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(fail(provider, sandbox, op, e).await),
    }
}

/// Streamed files through envd. See the module docs.
#[async_trait]
impl StreamedFiles for E2bProvider {
    async fn read_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<ReadStream, Error> {
        Ok(Box::new(read_stream(self, sandbox, path, max_bytes).await?))
    }

    async fn write_stream(
        &self,
        sandbox: &SandboxHandle,
        path: &SandboxPath,
        source: ReadStream,
        max_bytes: u64,
    ) -> Result<u64, Error> {
        write_stream(self, sandbox, path, source, max_bytes).await
    }

    async fn rename_path(
        &self,
        sandbox: &SandboxHandle,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> Result<(), Error> {
        rename(self, sandbox, from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_path_is_the_callers_and_a_refused_token_stays_authentication() {
        let denied = Error::new(
            ErrorKind::Authentication,
            Operation::STAT,
            "permission_denied: /w/zero resolves to /dev/zero, in the reserved tree /dev",
        )
        .with_http_status(403);
        let e = refused_path(denied);
        assert_eq!(
            (e.kind(), e.code(), e.operation()),
            (
                ErrorKind::InvalidRequest,
                Some(ErrorCode::InvalidPath),
                Operation::STAT
            )
        );
        assert!(e.message().contains("reserved tree"), "{e}");
        let token = Error::new(ErrorKind::Authentication, Operation::STAT, "bad token")
            .with_http_status(401);
        assert_eq!(refused_path(token).kind(), ErrorKind::Authentication);
    }

    #[test]
    fn envd_versions_read_and_compare() {
        assert_eq!(parse_version("0.5.7"), Some((0, 5, 7)));
        assert_eq!(parse_version(" v0.6.4-rc1 "), Some((0, 6, 4)));
        assert_eq!(parse_version("1.2"), Some((1, 2, 0)));
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("dev"), None);
        assert!(parse_version("0.2.0").unwrap() < STREAMED_UPLOAD_ENVD);
        assert!(parse_version("0.5.6").unwrap() < STREAMED_UPLOAD_ENVD);
        assert!(parse_version("0.5.7").unwrap() >= STREAMED_UPLOAD_ENVD);
        assert!(parse_version("0.10.0").unwrap() >= STREAMED_UPLOAD_ENVD);
    }

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

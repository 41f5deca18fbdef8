//! File operations, all through exec.
//!
//! Exec rather than the archive endpoints: exec runs as an explicit user inside the container,
//! is bounded by the same in-container timeout, and touches the activity marker; the archive
//! endpoints run in the daemon and honour none of that. Paths reach the scripts as positional
//! arguments, never spliced into script text.

use std::time::Duration;

use bollard::Docker;
use sandbox_core::{
    DirEntry, EntryKind, Error, ErrorKind, ExecRequest, ExecResult, ExecTimeout, Operation,
    Provider, SandboxPath, StatEntry,
};
use time::OffsetDateTime;

use crate::exec::{self, ACTIVITY_MARKER};

/// The largest file `read_file` returns. A larger one is an error, never a silently shorter
/// file: reads are whole-buffer, and an unbounded one would let a sandbox exhaust the service's
/// memory.
pub const MAX_FILE_BYTES: usize = 1024 * 1024 * 1024;

/// Bound on one file operation (10 MiB through exec takes well under a second).
pub const FILE_TIMEOUT: Duration = Duration::from_secs(120);

/// Paths no file operation may touch: kernel interfaces, and the activity marker whose mtime the
/// idle sweeper trusts. A lexical guard: intermediate symlinks are resolved by the kernel as for
/// any process in the container, which runs as the same account anyway.
const RESERVED: &[&str] = &["/proc", "/sys", "/dev", ACTIVITY_MARKER];

fn check_path(op: Operation, path: &SandboxPath) -> Result<(), Error> {
    for reserved in RESERVED {
        let reserved = SandboxPath::new(reserved)?;
        if path.starts_with(&reserved) {
            return Err(Error::invalid_request(
                op,
                format!("{path} is reserved and cannot be used by file operations"),
            )
            .with_code(sandbox_core::ErrorCode::InvalidPath)
            .with_provider(Provider::Docker));
        }
    }
    Ok(())
}

async fn script(
    docker: &Docker,
    container: &str,
    op: Operation,
    body: &str,
    path: &SandboxPath,
    stdin: Option<&[u8]>,
) -> Result<ExecResult, Error> {
    let request = ExecRequest::argv(
        "sh",
        [
            "-c".to_owned(),
            body.to_owned(),
            "sandbox-file".to_owned(),
            path.as_str().to_owned(),
        ],
    )
    .timeout(ExecTimeout::new(FILE_TIMEOUT)?);
    // The content is written from the caller's buffer: an upload is never copied on its way.
    let result = exec::run_with_stdin(
        docker,
        container,
        &request,
        stdin,
        FILE_TIMEOUT,
        MAX_FILE_BYTES,
    )
    .await
    .map_err(|e| e.with_operation(op))?;
    if result.truncated {
        return Err(Error::invalid_request(
            op,
            format!(
                "{path}: larger than the {} MiB a file operation may return",
                MAX_FILE_BYTES / (1024 * 1024)
            ),
        )
        .with_provider(Provider::Docker));
    }
    if result.killed {
        return Err(Error::timeout(
            op,
            format!(
                "{op} of {path} did not finish within {}s",
                FILE_TIMEOUT.as_secs()
            ),
        )
        .with_provider(Provider::Docker));
    }
    if result.exit_code != 0 {
        return Err(classify(op, path, &result));
    }
    Ok(result)
}

/// Turns a failed file command into the core taxonomy by what it said on stderr.
fn classify(op: Operation, path: &SandboxPath, result: &ExecResult) -> Error {
    let stderr = result.stderr_lossy();
    let first = stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned();
    let lower = stderr.to_ascii_lowercase();
    let kind = if lower.contains("no such file or directory") {
        ErrorKind::NotFound
    } else if [
        "is a directory",
        "not a directory",
        "file exists",
        "permission denied",
        "read-only file system",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
    {
        // The caller named something that cannot be used this way.
        ErrorKind::InvalidRequest
    } else {
        ErrorKind::Internal
    };
    Error::new(
        kind,
        op,
        format!(
            "{path}: {}",
            if first.is_empty() {
                format!("exit {}", result.exit_code)
            } else {
                first
            }
        ),
    )
    .with_provider(Provider::Docker)
}

/// Writes a whole file, creating its parents.
pub async fn write(
    docker: &Docker,
    container: &str,
    path: &SandboxPath,
    content: &[u8],
) -> Result<(), Error> {
    check_path(Operation::WRITE_FILE, path)?;
    if path.is_root() {
        return Err(
            Error::invalid_request(Operation::WRITE_FILE, "/: is a directory")
                .with_provider(Provider::Docker),
        );
    }
    script(
        docker,
        container,
        Operation::WRITE_FILE,
        "[ -d \"$1\" ] && { echo \"$1: Is a directory\" >&2; exit 21; }; mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"",
        path,
        Some(content),
    )
    .await
    .map(drop)
}

/// Reads a whole file.
pub async fn read(docker: &Docker, container: &str, path: &SandboxPath) -> Result<Vec<u8>, Error> {
    check_path(Operation::READ_FILE, path)?;
    let result = script(
        docker,
        container,
        Operation::READ_FILE,
        "[ -d \"$1\" ] && { echo \"$1: Is a directory\" >&2; exit 21; }; cat -- \"$1\"",
        path,
        None,
    )
    .await?;
    Ok(result.stdout)
}

/// Creates a directory and its parents; an existing directory is success.
pub async fn make_dir(docker: &Docker, container: &str, path: &SandboxPath) -> Result<(), Error> {
    check_path(Operation::MAKE_DIR, path)?;
    script(
        docker,
        container,
        Operation::MAKE_DIR,
        "mkdir -p -- \"$1\"",
        path,
        None,
    )
    .await
    .map(drop)
}

/// Removes a path recursively; `/` is refused and a missing path is `not_found`.
pub async fn remove(docker: &Docker, container: &str, path: &SandboxPath) -> Result<(), Error> {
    if path.is_root() {
        return Err(
            Error::invalid_request(Operation::REMOVE, "refusing to remove /")
                .with_provider(Provider::Docker),
        );
    }
    check_path(Operation::REMOVE, path)?;
    script(
        docker,
        container,
        Operation::REMOVE,
        "{ [ -e \"$1\" ] || [ -L \"$1\" ]; } || { echo \"$1: No such file or directory\" >&2; exit 2; }; rm -rf -- \"$1\"",
        path,
        None,
    )
    .await
    .map(drop)
}

/// `stat -c` prints the final component's own type (it does not follow a final symlink, which
/// therefore reports as `Other`), size and mtime.
const STAT_FORMAT: &str = "%F|%s|%Y";

fn kind_of(file_type: &str) -> EntryKind {
    if file_type.contains("regular") {
        EntryKind::File
    } else if file_type == "directory" {
        EntryKind::Dir
    } else {
        EntryKind::Other
    }
}

fn parse_stat_line(line: &str) -> Option<(EntryKind, u64, Option<OffsetDateTime>)> {
    let mut parts = line.trim_end_matches(['\n', '\r']).splitn(3, '|');
    let kind = kind_of(parts.next()?);
    let size = parts.next()?.parse().ok()?;
    let modified = parts
        .next()
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok());
    Some((kind, size, modified))
}

/// Metadata of one path.
pub async fn stat(
    docker: &Docker,
    container: &str,
    path: &SandboxPath,
) -> Result<StatEntry, Error> {
    check_path(Operation::STAT, path)?;
    let body = format!("stat -c '{STAT_FORMAT}' -- \"$1\"");
    let result = script(docker, container, Operation::STAT, &body, path, None).await?;
    let (kind, size, modified) = parse_stat_line(&result.stdout_lossy()).ok_or_else(|| {
        Error::internal(Operation::STAT, format!("{path}: unreadable stat output"))
            .with_provider(Provider::Docker)
    })?;
    Ok(StatEntry {
        path: path.clone(),
        kind,
        size,
        modified,
    })
}

/// One directory level. Each entry is printed as `<stat line>` NUL `<name>` NUL, so names with
/// newlines or `|` survive; hidden entries are included, `.` and `..` are not.
pub async fn list(
    docker: &Docker,
    container: &str,
    path: &SandboxPath,
) -> Result<Vec<DirEntry>, Error> {
    check_path(Operation::LIST_DIR, path)?;
    let body = format!(
        "[ -e \"$1\" ] || {{ echo \"$1: No such file or directory\" >&2; exit 2; }}; \
         [ -d \"$1\" ] || {{ echo \"$1: Not a directory\" >&2; exit 20; }}; \
         for f in \"$1\"/* \"$1\"/.[!.]* \"$1\"/..?*; do {{ [ -e \"$f\" ] || [ -L \"$f\" ]; }} || continue; \
         printf '%s\\0%s\\0' \"$(stat -c '{STAT_FORMAT}' -- \"$f\")\" \"${{f##*/}}\"; done"
    );
    let result = script(docker, container, Operation::LIST_DIR, &body, path, None).await?;
    parse_listing(path, &result.stdout)
}

fn parse_listing(dir: &SandboxPath, raw: &[u8]) -> Result<Vec<DirEntry>, Error> {
    let mut fields = raw.split(|b| *b == 0);
    let mut entries = Vec::new();
    while let (Some(stat_line), Some(name)) = (fields.next(), fields.next()) {
        if stat_line.is_empty() && name.is_empty() {
            break;
        }
        let name = String::from_utf8_lossy(name).into_owned();
        let bad = || {
            Error::internal(
                Operation::LIST_DIR,
                format!("{dir}: unreadable listing entry {name:?}"),
            )
            .with_provider(Provider::Docker)
        };
        let (kind, size, modified) =
            parse_stat_line(&String::from_utf8_lossy(stat_line)).ok_or_else(bad)?;
        let path = dir.join(&name).map_err(|_| bad())?;
        entries.push(DirEntry {
            name,
            path,
            kind,
            size,
            modified,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_and_kinds() {
        assert_eq!(
            parse_stat_line("regular file|12|1700000000\n").unwrap().0,
            EntryKind::File
        );
        assert_eq!(
            parse_stat_line("regular empty file|0|1700000000")
                .unwrap()
                .1,
            0
        );
        assert_eq!(
            parse_stat_line("directory|4096|1700000000").unwrap().0,
            EntryKind::Dir
        );
        assert_eq!(
            parse_stat_line("symbolic link|7|1700000000").unwrap().0,
            EntryKind::Other
        );
        assert_eq!(parse_stat_line("fifo|0|1").unwrap().0, EntryKind::Other);
        assert!(parse_stat_line("garbage").is_none());
    }

    #[test]
    fn listings_keep_odd_names() {
        let dir = SandboxPath::new("/w").unwrap();
        let raw =
            b"regular file|3|1700000000\0a b|c \xe6\x8a\xa5\0directory|4096|1700000000\0.hidden\0";
        let entries = parse_listing(&dir, raw).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "a b|c \u{62a5}");
        assert_eq!(entries[0].size, 3);
        assert_eq!(entries[1].kind, EntryKind::Dir);
        assert_eq!(entries[1].path.as_str(), "/w/.hidden");
        assert!(parse_listing(&dir, b"").unwrap().is_empty());
        // A name no SandboxPath can hold (a newline) is a clear error, not a silently shorter
        // listing.
        let err = parse_listing(&dir, b"regular file|1|1\0bad\nname\0").unwrap_err();
        assert!(
            err.to_string().contains("unreadable listing entry"),
            "{err}"
        );
    }

    #[test]
    fn reserved_paths_are_refused() {
        for p in ["/proc/1/environ", "/sys", "/dev/sda", ACTIVITY_MARKER] {
            let err = check_path(Operation::READ_FILE, &SandboxPath::new(p).unwrap()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{p}");
        }
        assert!(
            check_path(
                Operation::READ_FILE,
                &SandboxPath::new("/devices/x").unwrap()
            )
            .is_ok()
        );
    }

    #[test]
    fn failures_classify_by_stderr() {
        let p = SandboxPath::new("/x").unwrap();
        let result = |stderr: &str| ExecResult {
            stderr: stderr.as_bytes().to_vec(),
            exit_code: 1,
            ..ExecResult::default()
        };
        assert_eq!(
            classify(
                Operation::READ_FILE,
                &p,
                &result("cat: can't open '/x': No such file or directory")
            )
            .kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            classify(
                Operation::MAKE_DIR,
                &p,
                &result("mkdir: can't create directory '/x': File exists")
            )
            .kind(),
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            classify(Operation::READ_FILE, &p, &result("weird")).kind(),
            ErrorKind::Internal
        );
    }
}

//! File operations, all through exec.
//!
//! Exec rather than the archive endpoints: exec runs as an explicit user inside the container,
//! is bounded by the same in-container timeout, and touches the activity marker; the archive
//! endpoints run in the daemon and honour none of that. Paths reach the scripts as positional
//! arguments, never spliced into script text.
//!
//! Reads stream. [`read_stream`] hands out the reading command's output frames as the caller
//! pulls them, so the service holds a frame or two of a file, never the file; passing the cap
//! ends the stream with `file_too_large` and kills the reader, and so does dropping the stream.
//! The buffered [`read`] is that stream drained, under [`MAX_FILE_BYTES`].
//!
//! Reads take only regular files, judged on what the path resolves to inside the container: the
//! reading script resolves the path (`readlink -f`), refuses a resolved path in a reserved tree
//! (`invalid_path`) and anything but a regular file (`not_a_regular_file`) by `test` alone,
//! without opening it (so a FIFO never blocks a read), then opens it and judges the opened
//! descriptor again through `/proc/$$/fd`, so a symlink swapped between the check and the open
//! cannot redirect the read to a device or a kernel file. The container's binaries are the
//! tenant's to replace, so these checks serve honest callers; what bounds a hostile sandbox is on
//! this side of the exec: backpressure, the cap, and the in-container timeout.
//!
//! A tree listing is one `find` with a `stat` per entry, read as it is printed and stopped
//! (the command killed) once the entry cap or the deadline is reached.

use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use sandbox_core::fs::{ByteStream, TreeLimits, TreeListing};
use sandbox_core::{
    DirEntry, EntryKind, Error, ErrorCode, ErrorKind, ExecRequest, ExecResult, ExecTimeout,
    Operation, OutputStream, Provider, SandboxPath, StatEntry,
};
use time::OffsetDateTime;

use crate::agent::AGENT_DIR;
use crate::exec::{self, ACTIVITY_MARKER, CLIENT_GRACE, Running};

/// The largest file `read_file` returns. A larger one is `file_too_large`, never a silently
/// shorter file: the buffered read holds the whole file, so it must stop somewhere.
pub const MAX_FILE_BYTES: usize = 1024 * 1024 * 1024;

/// Bound on one file operation (10 MiB through exec takes well under a second).
pub const FILE_TIMEOUT: Duration = Duration::from_secs(120);

/// Bound on the reading command of a streamed read. The caller paces the stream and dropping it
/// kills the reader, so this only ends a stream its caller neither pulls nor drops.
pub const STREAM_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Time the reading script may take to judge a file and open it. It only resolves, stats and
/// opens, so a reader that has not answered by then is stuck on the open (a FIFO swapped in
/// between the check and the open blocks it until a writer comes).
const VERDICT_TIMEOUT: Duration = Duration::from_secs(30);

/// The most output the small file commands (stat, listings, writes) may print per stream.
const MAX_SCRIPT_OUTPUT: usize = 64 * 1024 * 1024;

/// Stderr a reading command may leave for its error message; the rest is not needed.
const MAX_STDERR: usize = 4096;

/// Levels a tree listing descends at most, whatever the caller asks (`find -maxdepth` takes an
/// `int`, and a path has at most a few thousand components anyway).
pub(crate) const MAX_TREE_DEPTH: usize = 4096;

/// The longest partial record of a tree listing kept while waiting for its end: a stat line and
/// a path the kernel can open are far shorter.
const MAX_TREE_RECORD: usize = 64 * 1024;

/// Exit statuses of the read and tree scripts' own refusals (no `cat`, `find` or shell error
/// uses them).
const EXIT_RESERVED: i32 = 90;
const EXIT_NOT_REGULAR: i32 = 91;

/// The byte the read script prints before the file's content: the checks passed.
const READY: u8 = b'R';

/// Paths no file operation may touch: kernel interfaces, the activity marker whose mtime the
/// idle sweeper trusts, and the agent's directory (agent mode installs it there at every create;
/// reserved in both modes, so a snapshot taken in one mode restores cleanly in the other).
/// Checked on the path as given here, and for reads and tree listings again on what it resolves
/// to inside the container. Agent mode passes each to the agent as `--reserved-path`
/// (`crate::agent::entrypoint`), and the agent judges every path where it resolves.
pub(crate) const RESERVED: &[&str] = &["/proc", "/sys", "/dev", ACTIVITY_MARKER, AGENT_DIR];

/// The reserved trees as one `case` pattern. Constants only, so splicing them into script text
/// is safe.
fn reserved_pattern() -> String {
    RESERVED
        .iter()
        .map(|r| format!("{r}|{r}/*"))
        .collect::<Vec<_>>()
        .join("|")
}

pub(crate) fn check_path(op: Operation, path: &SandboxPath) -> Result<(), Error> {
    for reserved in RESERVED {
        let reserved = SandboxPath::new(reserved)?;
        if path.starts_with(&reserved) {
            return Err(reserved_path(op, path));
        }
    }
    Ok(())
}

fn reserved_path(op: Operation, path: &SandboxPath) -> Error {
    Error::invalid_request(
        op,
        format!("{path} is reserved and cannot be used by file operations"),
    )
    .with_code(ErrorCode::InvalidPath)
    .with_provider(Provider::Docker)
}

/// `sh -c <body> sandbox-file <path> <args...>`, bounded by `timeout`.
fn script_request(
    body: &str,
    path: &SandboxPath,
    args: &[String],
    timeout: Duration,
) -> Result<ExecRequest, Error> {
    let argv = ["-c", body, "sandbox-file", path.as_str()]
        .into_iter()
        .map(str::to_owned)
        .chain(args.iter().cloned());
    Ok(ExecRequest::argv("sh", argv).timeout(ExecTimeout::new(timeout)?))
}

async fn script(
    docker: &Docker,
    container: &str,
    op: Operation,
    body: &str,
    path: &SandboxPath,
    stdin: Option<&[u8]>,
) -> Result<ExecResult, Error> {
    let request = script_request(body, path, &[], FILE_TIMEOUT)?;
    // The content is written from the caller's buffer: an upload is never copied on its way.
    let result = exec::run_with_stdin(
        docker,
        container,
        &request,
        stdin,
        FILE_TIMEOUT,
        MAX_SCRIPT_OUTPUT,
    )
    .await
    .map_err(|e| e.with_operation(op))?;
    if result.truncated {
        return Err(Error::invalid_request(
            op,
            format!(
                "{path}: more than the {} MiB of output a file operation may print",
                MAX_SCRIPT_OUTPUT / (1024 * 1024)
            ),
        )
        .with_provider(Provider::Docker));
    }
    if result.killed {
        return Err(timed_out(op, path, FILE_TIMEOUT));
    }
    if result.exit_code != 0 {
        return Err(classify(op, path, result.exit_code, &result.stderr));
    }
    Ok(result)
}

fn timed_out(op: Operation, path: &SandboxPath, timeout: Duration) -> Error {
    Error::timeout(
        op,
        format!(
            "{op} of {path} did not finish within {}s",
            timeout.as_secs()
        ),
    )
    .with_provider(Provider::Docker)
}

/// Turns a failed file command into the core taxonomy: the scripts' own refusals by their exit
/// status, everything else by what it said on stderr.
fn classify(op: Operation, path: &SandboxPath, exit_code: i32, stderr: &[u8]) -> Error {
    let stderr = String::from_utf8_lossy(stderr);
    let first = stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned();
    let message = format!(
        "{path}: {}",
        if first.is_empty() {
            format!("exit {exit_code}")
        } else {
            first
        }
    );
    match exit_code {
        EXIT_RESERVED => {
            return Error::invalid_request(op, message)
                .with_code(ErrorCode::InvalidPath)
                .with_provider(Provider::Docker);
        }
        EXIT_NOT_REGULAR => {
            return Error::invalid_request(op, message)
                .with_code(ErrorCode::NotARegularFile)
                .with_provider(Provider::Docker);
        }
        _ => {}
    }
    let lower = stderr.to_ascii_lowercase();
    // "No such file or directory" (coreutils), "no such file" (busybox's shell).
    let kind = if lower.contains("no such file") {
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
    Error::new(kind, op, message).with_provider(Provider::Docker)
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

/// The read script: resolve, judge without opening, open, judge the opened descriptor, then
/// print [`READY`] and the file.
fn read_script() -> String {
    let reserved = reserved_pattern();
    format!(
        "r=$(readlink -f -- \"$1\") && [ -e \"$r\" ] || {{ echo \"$1: No such file or directory\" >&2; exit 2; }}; \
         case \"$r\" in {reserved}) echo \"resolves to $r, which is reserved\" >&2; exit {EXIT_RESERVED};; esac; \
         [ -d \"$r\" ] && {{ echo \"Is a directory, not a regular file\" >&2; exit {EXIT_NOT_REGULAR}; }}; \
         [ -f \"$r\" ] || {{ echo \"resolves to $r, which is not a regular file\" >&2; exit {EXIT_NOT_REGULAR}; }}; \
         exec 3< \"$r\"; \
         o=$(readlink /proc/$$/fd/3); \
         case \"$o\" in {reserved}) echo \"opened $o, which is reserved\" >&2; exit {EXIT_RESERVED};; esac; \
         [ -f /proc/$$/fd/3 ] || {{ echo \"opened $o, which is not a regular file\" >&2; exit {EXIT_NOT_REGULAR}; }}; \
         printf {ready}; exec cat <&3",
        ready = char::from(READY),
    )
}

/// A file's bytes as the reading command prints them, pulled frame by frame: nothing is read
/// from the engine before the caller asks for it.
pub struct FileStream {
    /// `None` once the stream ended (dropping the exec kills a reader still running).
    running: Option<Running>,
    path: SandboxPath,
    max_bytes: u64,
    delivered: u64,
    /// Content that arrived with the ready byte, handed out first.
    pending: Option<Vec<u8>>,
    stderr: Vec<u8>,
    timeout: Duration,
    deadline: tokio::time::Instant,
}

impl std::fmt::Debug for FileStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStream")
            .field("path", &self.path)
            .field("delivered", &self.delivered)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// Opens a streamed read of `path`: answers once the reading script has judged the file, so a
/// missing, reserved or irregular file is an error here, before any chunk.
pub async fn read_stream(
    docker: &Docker,
    container: &str,
    path: &SandboxPath,
    max_bytes: u64,
    timeout: Duration,
) -> Result<FileStream, Error> {
    let op = Operation::READ_FILE;
    check_path(op, path)?;
    let request = script_request(&read_script(), path, &[], timeout)?;
    let running = exec::start(docker, container, &request, false, timeout)
        .await
        .map_err(|e| e.with_operation(op))?;
    let mut stream = FileStream {
        running: Some(running),
        path: path.clone(),
        max_bytes,
        delivered: 0,
        pending: None,
        stderr: Vec::new(),
        timeout,
        deadline: tokio::time::Instant::now() + timeout + CLIENT_GRACE,
    };
    let verdict = tokio::time::Instant::now() + VERDICT_TIMEOUT.min(timeout);
    loop {
        let Ok(frame) = tokio::time::timeout_at(verdict, stream.frame()).await else {
            // Dropping the stream kills the reader.
            return Err(Error::timeout(
                op,
                format!(
                    "the reading command did not judge {path} within {}s",
                    VERDICT_TIMEOUT.min(timeout).as_secs()
                ),
            )
            .with_provider(Provider::Docker));
        };
        match frame {
            Some(Ok((OutputStream::Stdout, mut bytes))) => {
                if bytes.is_empty() {
                    continue;
                }
                if bytes[0] != READY {
                    return Err(Error::internal(
                        op,
                        format!("{path}: the reading command printed no verdict"),
                    )
                    .with_provider(Provider::Docker));
                }
                bytes.remove(0);
                stream.pending = (!bytes.is_empty()).then_some(bytes);
                return Ok(stream);
            }
            Some(Ok((OutputStream::Stderr, bytes))) => stream.keep_stderr(&bytes),
            Some(Err(e)) => return Err(e),
            None => {
                return Err(stream.ended().await.err().unwrap_or_else(|| {
                    Error::internal(
                        op,
                        format!("{path}: the reading command ended without a verdict"),
                    )
                    .with_provider(Provider::Docker)
                }));
            }
        }
    }
}

impl FileStream {
    /// The next frame of the reading command, bounded by the stream's deadline. An error or a
    /// missed deadline ends the stream (and kills the reader).
    async fn frame(&mut self) -> Option<Result<(OutputStream, Vec<u8>), Error>> {
        let running = self.running.as_mut()?;
        let frame = match tokio::time::timeout_at(self.deadline, running.next_frame()).await {
            Ok(Some(Ok(frame))) => return Some(Ok(frame)),
            Ok(None) => return None,
            Ok(Some(Err(e))) => Err(e.with_operation(Operation::READ_FILE)),
            Err(_) => Err(timed_out(Operation::READ_FILE, &self.path, self.timeout)),
        };
        self.running = None;
        Some(frame)
    }

    fn keep_stderr(&mut self, bytes: &[u8]) {
        let room = MAX_STDERR.saturating_sub(self.stderr.len());
        self.stderr
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The reader's output is closed: `Ok` when it read the whole file, else why not.
    async fn ended(&mut self) -> Result<(), Error> {
        let Some(running) = self.running.take() else {
            return Ok(());
        };
        let op = Operation::READ_FILE;
        let exit = running.finish().await.map_err(|e| e.with_operation(op))?;
        if exit.killed {
            return Err(timed_out(op, &self.path, self.timeout));
        }
        if exit.code != 0 {
            return Err(classify(op, &self.path, exit.code, &self.stderr));
        }
        Ok(())
    }

    /// Hands out `bytes`, unless they pass the cap: then the stream ends in `file_too_large`
    /// and the reader is killed at once.
    fn deliver(&mut self, bytes: Vec<u8>) -> Result<Vec<u8>, Error> {
        let total = self
            .delivered
            .saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        if total > self.max_bytes {
            self.running = None;
            return Err(
                sandbox_core::ports::provider::file_too_large(&self.path, self.max_bytes)
                    .with_provider(Provider::Docker),
            );
        }
        self.delivered = total;
        Ok(bytes)
    }
}

#[async_trait]
impl ByteStream for FileStream {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        if let Some(bytes) = self.pending.take() {
            return Some(self.deliver(bytes));
        }
        loop {
            self.running.as_ref()?;
            match self.frame().await {
                Some(Ok((OutputStream::Stdout, bytes))) if bytes.is_empty() => {}
                Some(Ok((OutputStream::Stdout, bytes))) => return Some(self.deliver(bytes)),
                Some(Ok((OutputStream::Stderr, bytes))) => self.keep_stderr(&bytes),
                Some(Err(e)) => return Some(Err(e)),
                None => return self.ended().await.err().map(Err),
            }
        }
    }
}

/// Reads a whole file: the stream, drained, under [`MAX_FILE_BYTES`].
pub async fn read(docker: &Docker, container: &str, path: &SandboxPath) -> Result<Vec<u8>, Error> {
    let max = u64::try_from(MAX_FILE_BYTES).unwrap_or(u64::MAX);
    let mut stream = read_stream(docker, container, path, max, FILE_TIMEOUT).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next_chunk().await {
        let chunk = chunk?;
        if out.is_empty() {
            out = chunk;
        } else {
            out.extend_from_slice(&chunk);
        }
    }
    Ok(out)
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

/// The tree script: resolve the root and judge it like a read does, print the resolved root
/// (NUL-terminated), then one record per entry: its stat line, a newline, its path, a NUL. A
/// stat line holds no name, so a name with a newline cannot shift the records; an entry that
/// vanishes before its `stat` is skipped whole (`-exec` fails, so `-print0` does not run). The
/// kernel trees are listed but never descended into.
fn tree_script() -> String {
    let reserved = reserved_pattern();
    format!(
        "r=$(readlink -f -- \"$1\") && [ -e \"$r\" ] || {{ echo \"$1: No such file or directory\" >&2; exit 2; }}; \
         case \"$r\" in {reserved}) echo \"resolves to $r, which is reserved\" >&2; exit {EXIT_RESERVED};; esac; \
         [ -d \"$r\" ] || {{ echo \"$1: Not a directory\" >&2; exit 20; }}; \
         printf '%s\\0' \"$r\"; \
         find \"$r\" -mindepth 1 -maxdepth \"$2\" \\( ! \\( -path /proc -o -path /sys -o -path /dev \\) -o -prune \\) \
         -exec stat -c '{STAT_FORMAT}' -- {{}} \\; -print0; \
         rc=$?; [ \"$rc\" -le 1 ] || exit \"$rc\""
    )
}

/// Lists `dir` down to `limits.depth` levels with one command, stopped (and killed) once
/// `limits.max_entries` entries are in or `limits.deadline` has passed. `find` exits 1 when a
/// part of the tree could not be read (removed while it walked, say): the rest is the listing.
pub async fn tree(
    docker: &Docker,
    container: &str,
    dir: &SandboxPath,
    limits: TreeLimits,
) -> Result<TreeListing, Error> {
    let op = Operation::LIST_DIR;
    check_path(op, dir)?;
    // Depth 0 lists the root's entries, as the port's walking default does.
    let depth = limits.depth.clamp(1, MAX_TREE_DEPTH);
    // The client stops at the deadline; the in-container budget is a backstop a little later.
    let backstop = limits
        .deadline
        .min(sandbox_core::exec::MAX_EXEC_TIMEOUT / 2)
        + Duration::from_secs(5);
    let request = script_request(&tree_script(), dir, &[depth.to_string()], backstop)?;
    let mut running = exec::start(docker, container, &request, false, backstop)
        .await
        .map_err(|e| e.with_operation(op))?;
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let mut parser = TreeParser::new(dir, limits.max_entries);
    let mut stderr = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, running.next_frame()).await {
            Ok(frame) => frame,
            // Dropping `running` kills the walk.
            Err(_) => return Ok(parser.into_listing(true)),
        };
        match frame {
            Some(Ok((OutputStream::Stdout, bytes))) => {
                parser.feed(&bytes)?;
                if parser.full {
                    return Ok(parser.into_listing(true));
                }
            }
            Some(Ok((OutputStream::Stderr, bytes))) => {
                let room = MAX_STDERR.saturating_sub(stderr.len());
                stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Some(Err(e)) => return Err(e.with_operation(op)),
            None => break,
        }
    }
    let exit = running.finish().await.map_err(|e| e.with_operation(op))?;
    if exit.killed {
        return Ok(parser.into_listing(true));
    }
    if exit.code != 0 {
        return Err(classify(op, dir, exit.code, &stderr));
    }
    parser.finish()?;
    Ok(parser.into_listing(false))
}

/// Parses the tree script's output as it arrives, keeping at most `max_entries` entries and
/// one partial record.
struct TreeParser<'a> {
    dir: &'a SandboxPath,
    /// The root as the container resolved it, once printed.
    root: Option<Vec<u8>>,
    buffer: Vec<u8>,
    entries: Vec<DirEntry>,
    max_entries: usize,
    /// An entry beyond `max_entries` arrived.
    full: bool,
}

impl<'a> TreeParser<'a> {
    fn new(dir: &'a SandboxPath, max_entries: usize) -> Self {
        TreeParser {
            dir,
            root: None,
            buffer: Vec::new(),
            entries: Vec::new(),
            max_entries,
            full: false,
        }
    }

    fn bad(&self, what: &str) -> Error {
        Error::internal(
            Operation::LIST_DIR,
            format!("{}: unreadable listing entry {what:?}", self.dir),
        )
        .with_provider(Provider::Docker)
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.buffer.extend_from_slice(bytes);
        let mut at = 0;
        while !self.full {
            let rest = &self.buffer[at..];
            if self.root.is_none() {
                let Some(nul) = rest.iter().position(|b| *b == 0) else {
                    break;
                };
                self.root = Some(rest[..nul].to_vec());
                at += nul + 1;
                continue;
            }
            let Some(newline) = rest.iter().position(|b| *b == b'\n') else {
                break;
            };
            let Some(nul) = rest[newline + 1..].iter().position(|b| *b == 0) else {
                break;
            };
            let (stat_line, raw_path) = (&rest[..newline], &rest[newline + 1..newline + 1 + nul]);
            if self.entries.len() >= self.max_entries {
                self.full = true;
                break;
            }
            let entry = self.entry(stat_line, raw_path)?;
            self.entries.push(entry);
            at += newline + 1 + nul + 1;
        }
        self.buffer.drain(..at);
        if self.buffer.len() > MAX_TREE_RECORD {
            return Err(self.bad("(longer than any path)"));
        }
        Ok(())
    }

    fn entry(&self, stat_line: &[u8], raw_path: &[u8]) -> Result<DirEntry, Error> {
        let shown = String::from_utf8_lossy(raw_path).into_owned();
        let (kind, size, modified) =
            parse_stat_line(&String::from_utf8_lossy(stat_line)).ok_or_else(|| self.bad(&shown))?;
        // Paths are printed under the resolved root; the entry's path is under `dir` as the
        // caller named it.
        let root = self.root.as_deref().unwrap_or_default();
        let relative = raw_path
            .strip_prefix(root)
            .and_then(|r| {
                if root.ends_with(b"/") {
                    Some(r)
                } else {
                    r.strip_prefix(b"/")
                }
            })
            .filter(|r| !r.is_empty())
            .ok_or_else(|| self.bad(&shown))?;
        let path = self
            .dir
            .join(&String::from_utf8_lossy(relative))
            .map_err(|_| self.bad(&shown))?;
        let name = path.file_name().unwrap_or_default().to_owned();
        Ok(DirEntry {
            name,
            path,
            kind,
            size,
            modified,
        })
    }

    /// The output ended: nothing may be left half-printed.
    fn finish(&self) -> Result<(), Error> {
        if self.buffer.is_empty() && self.root.is_some() {
            Ok(())
        } else {
            Err(self.bad(&String::from_utf8_lossy(&self.buffer)))
        }
    }

    fn into_listing(self, truncated: bool) -> TreeListing {
        let mut entries = self.entries;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        TreeListing { entries, truncated }
    }
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
        for p in [
            "/proc/1/environ",
            "/sys",
            "/dev/sda",
            ACTIVITY_MARKER,
            "/.sandbox",
            "/.sandbox/sandbox-agent",
            "/.sandbox/agent.sock",
        ] {
            for op in [Operation::READ_FILE, Operation::WRITE_FILE] {
                let err = check_path(op, &SandboxPath::new(p).unwrap()).unwrap_err();
                assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{p}");
                assert_eq!(err.code(), Some(ErrorCode::InvalidPath), "{p}");
            }
        }
        for fine in ["/devices/x", "/.sandboxes", "/workspace/.sandbox"] {
            assert!(
                check_path(Operation::READ_FILE, &SandboxPath::new(fine).unwrap()).is_ok(),
                "{fine}"
            );
        }
    }

    /// The tree script's output for `entries` under the resolved root `root`.
    fn tree_output(root: &str, entries: &[(&str, &str)]) -> Vec<u8> {
        let mut out = format!("{root}\0").into_bytes();
        for (stat, path) in entries {
            out.extend_from_slice(format!("{stat}\n{path}\0").as_bytes());
        }
        out
    }

    fn parse_in_pieces<'a>(
        dir: &'a SandboxPath,
        raw: &[u8],
        piece: usize,
        max: usize,
    ) -> Result<TreeParser<'a>, Error> {
        let mut parser = TreeParser::new(dir, max);
        for chunk in raw.chunks(piece) {
            parser.feed(chunk)?;
        }
        Ok(parser)
    }

    #[test]
    fn tree_records_parse_at_every_chunk_boundary() {
        // The caller named a symlink; the container walked what it resolves to.
        let dir = SandboxPath::new("/w/link").unwrap();
        let raw = tree_output(
            "/data/real",
            &[
                ("directory|4096|1700000000", "/data/real/b"),
                ("regular file|3|1700000000", "/data/real/b/x|y z"),
                ("symbolic link|9|1700000000", "/data/real/a"),
            ],
        );
        for piece in 1..=raw.len() {
            let parser = parse_in_pieces(&dir, &raw, piece, 100).unwrap();
            parser.finish().unwrap();
            let listing = parser.into_listing(false);
            let paths: Vec<&str> = listing.entries.iter().map(|e| e.path.as_str()).collect();
            assert_eq!(
                paths,
                ["/w/link/a", "/w/link/b", "/w/link/b/x|y z"],
                "{piece}"
            );
            assert_eq!(listing.entries[2].name, "x|y z");
            assert_eq!(listing.entries[2].size, 3);
            assert_eq!(listing.entries[0].kind, EntryKind::Other);
        }
        // The root itself: paths come back as "/bin", not "//bin".
        let root = SandboxPath::root();
        let raw = tree_output("/", &[("directory|4096|1", "/bin")]);
        let parser = parse_in_pieces(&root, &raw, 4, 10).unwrap();
        assert_eq!(parser.entries[0].path.as_str(), "/bin");
    }

    #[test]
    fn tree_parsing_stops_at_the_cap_and_refuses_garbage() {
        let dir = SandboxPath::new("/w").unwrap();
        let entries: Vec<(String, String)> = (0..5)
            .map(|i| ("regular file|1|1".to_owned(), format!("/w/f{i}")))
            .collect();
        let borrowed: Vec<(&str, &str)> = entries
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let raw = tree_output("/w", &borrowed);
        let capped = parse_in_pieces(&dir, &raw, 7, 3).unwrap();
        assert!(capped.full);
        assert_eq!(capped.entries.len(), 3);
        // Exactly the cap, and nothing more: complete.
        let exact = parse_in_pieces(&dir, &raw, 7, 5).unwrap();
        assert!(!exact.full);
        exact.finish().unwrap();

        // A name with a newline cannot be a path: a clear error, not a shifted listing.
        let raw = tree_output("/w", &[("regular file|1|1", "/w/bad\nname")]);
        let err = parse_in_pieces(&dir, &raw, 64, 10).err().unwrap();
        assert!(
            err.to_string().contains("unreadable listing entry"),
            "{err}"
        );
        // A path outside the root, or output cut off mid-record.
        for outside in ["/elsewhere/x", "/wx/y"] {
            let raw = tree_output("/w", &[("regular file|1|1", outside)]);
            assert!(parse_in_pieces(&dir, &raw, 64, 10).is_err(), "{outside}");
        }
        let mut raw = tree_output("/w", &[("regular file|1|1", "/w/x")]);
        raw.extend_from_slice(b"directory|4096|1\n/w/y");
        let cut = parse_in_pieces(&dir, &raw, 64, 10).unwrap();
        assert!(cut.finish().is_err());
        // No root printed at all (the script never got that far).
        assert!(TreeParser::new(&dir, 1).finish().is_err());
        // A record that never ends is not buffered without bound.
        let endless = vec![b'x'; MAX_TREE_RECORD + 1];
        let mut parser = TreeParser::new(&dir, 10);
        parser.feed(b"/w\0").unwrap();
        assert!(parser.feed(&endless).is_err());
    }

    #[test]
    fn read_and_tree_scripts_take_the_path_as_an_argument() {
        for script in [read_script(), tree_script()] {
            assert!(script.contains("readlink -f -- \"$1\""));
            // Every reserved tree is judged after resolution.
            for reserved in RESERVED {
                assert!(
                    script.contains(&format!("{reserved}|{reserved}/*")),
                    "{reserved}"
                );
            }
        }
        let read = read_script();
        // Judged without opening, then the opened descriptor judged again.
        let test_at = read.find("[ -f \"$r\" ]").unwrap();
        let open_at = read.find("exec 3< \"$r\"").unwrap();
        let recheck_at = read.find("[ -f /proc/$$/fd/3 ]").unwrap();
        assert!(test_at < open_at && open_at < recheck_at);
        assert!(read.ends_with("printf R; exec cat <&3"));
        let request = script_request(
            &read,
            &SandboxPath::new("/w/$(id)").unwrap(),
            &[],
            FILE_TIMEOUT,
        )
        .unwrap();
        let sandbox_core::Command::Argv { program, args } = &request.command else {
            panic!("argv form expected");
        };
        assert_eq!(program, "sh");
        assert_eq!(&args[2..], ["sandbox-file", "/w/$(id)"]);
    }

    #[test]
    fn failures_classify_by_status_then_stderr() {
        let p = SandboxPath::new("/x").unwrap();
        let check = |code: i32, stderr: &str, kind: ErrorKind, error_code: Option<ErrorCode>| {
            let e = classify(Operation::READ_FILE, &p, code, stderr.as_bytes());
            assert_eq!(
                (e.kind(), e.code()),
                (kind, error_code),
                "{code} {stderr}: {e}"
            );
        };
        check(
            1,
            "cat: can't open '/x': No such file or directory",
            ErrorKind::NotFound,
            None,
        );
        // Busybox's shell, failing to open a redirection.
        check(
            2,
            "sh: can't open /x: no such file",
            ErrorKind::NotFound,
            None,
        );
        check(
            1,
            "mkdir: can't create directory '/x': File exists",
            ErrorKind::InvalidRequest,
            None,
        );
        check(1, "weird", ErrorKind::Internal, None);
        check(
            EXIT_RESERVED,
            "resolves to /dev/zero, which is reserved",
            ErrorKind::InvalidRequest,
            Some(ErrorCode::InvalidPath),
        );
        check(
            EXIT_NOT_REGULAR,
            "resolves to /w/fifo, which is not a regular file",
            ErrorKind::InvalidRequest,
            Some(ErrorCode::NotARegularFile),
        );
        let e = classify(Operation::READ_FILE, &p, 3, b"");
        assert!(e.to_string().contains("exit 3"), "{e}");
    }
}

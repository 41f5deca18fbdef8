//! Streamed files: reads and writes as bounded byte streams, atomic writes, renames.

use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::{
    ByteStream, Error, ErrorCode, ErrorKind, Operation, ReadStream, StreamedFiles, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, expect_kind, within};
use super::scratch;

const CALL_LIMIT: Duration = Duration::from_secs(120);

fn streamed(ctx: &Ctx) -> Result<&dyn StreamedFiles, Failure> {
    narrow::streamed_files(ctx.provider())
        .ok_or_else(|| Failure("streamed_files declared but not callable".to_owned()))
}

/// A source handing out `bytes` in chunks of the given sizes (cycled), then, when `fail` is
/// set, an error instead of the end.
struct Source {
    bytes: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
    fail: bool,
}

impl Source {
    fn new(bytes: Vec<u8>, sizes: Vec<usize>) -> Self {
        Source {
            bytes,
            at: 0,
            sizes,
            turn: 0,
            fail: false,
        }
    }
    fn failing(mut self) -> Self {
        self.fail = true;
        self
    }
    fn boxed(self) -> ReadStream {
        Box::new(self)
    }
}

#[async_trait]
impl ByteStream for Source {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, Error>> {
        if self.at >= self.bytes.len() {
            if self.fail {
                self.fail = false;
                return Some(Err(Error::unavailable(
                    Operation::new("upload"),
                    "the client went away mid-upload",
                )));
            }
            return None;
        }
        let size = self.sizes[self.turn % self.sizes.len()].max(1);
        self.turn += 1;
        let end = (self.at + size).min(self.bytes.len());
        let chunk = self.bytes[self.at..end].to_vec();
        self.at = end;
        Some(Ok(chunk))
    }
}

fn chunk_sizes(ctx: &Ctx) -> Vec<usize> {
    (0..8).map(|_| ctx.int(1..=256 * 1024) as usize).collect()
}

/// Drains a read stream: what it yielded, and the error that ended it.
async fn drain(mut stream: ReadStream) -> Result<(Vec<u8>, Option<Error>), Failure> {
    let mut out = Vec::new();
    let pull = async {
        while let Some(chunk) = stream.next_chunk().await {
            match chunk {
                Ok(bytes) => out.extend_from_slice(&bytes),
                Err(e) => return Some(e),
            }
        }
        None
    };
    let ended = within(CALL_LIMIT, "read_stream", pull).await?;
    Ok((out, ended))
}

/// Over 10 MiB in random chunks round-trip exactly; a read past its cap ends in
/// `file_too_large`; a missing file is `not_found`.
pub(super) async fn streamed_round_trip(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let s = streamed(ctx)?;
    let file = scratch(ctx, &format!("deep/{}/up.bin", ctx.token()))?;
    let payload = ctx.bytes((10 << 20) + ctx.int(1..=65_536) as usize);
    let len = payload.len() as u64;
    let source = Source::new(payload.clone(), chunk_sizes(ctx)).boxed();
    let written = within(
        CALL_LIMIT,
        "write_stream",
        s.write_stream(&h, &file, source, len),
    )
    .await??;
    ensure_eq("bytes written", written, len)?;
    let whole = ctx.provider().read_file(&h, &file).await?;
    ensure(whole == payload, || {
        format!("read back {} bytes, not the {len} streamed", whole.len())
    })?;
    let (back, ended) = drain(s.read_stream(&h, &file, len).await?).await?;
    if let Some(e) = ended {
        return Err(Failure(format!(
            "a read capped at the file's size failed: {e}"
        )));
    }
    ensure(back == payload, || {
        format!("streamed back {} bytes, not the {len} written", back.len())
    })?;
    let capped = match s.read_stream(&h, &file, len - 1).await {
        Err(e) => Some(e),
        Ok(stream) => {
            let (got, ended) = drain(stream).await?;
            ensure((got.len() as u64) < len, || {
                format!("a read capped at {} bytes yielded {}", len - 1, got.len())
            })?;
            ended
        }
    };
    match capped {
        Some(e) if e.code() == Some(ErrorCode::FileTooLarge) => {}
        other => {
            return Err(Failure(format!(
                "a read over its cap: expected file_too_large, got {other:?}"
            )));
        }
    }
    let missing = scratch(ctx, "nope.bin")?;
    expect_kind(
        "a streamed read of a missing file",
        s.read_stream(&h, &missing, len).await.map(drop),
        ErrorKind::NotFound,
    )
}

/// A source that fails, or passes the cap, leaves the target as it was.
pub(super) async fn streamed_write_is_atomic(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let s = streamed(ctx)?;
    let file = scratch(ctx, "kept.bin")?;
    let old = ctx.bytes(ctx.int(1..=65_536) as usize);
    ctx.provider().write_file(&h, &file, &old).await?;
    let new = ctx.bytes(ctx.int(65_536..=(1 << 20)) as usize);
    let failing = Source::new(new.clone(), chunk_sizes(ctx)).failing().boxed();
    let result = within(
        CALL_LIMIT,
        "write_stream",
        s.write_stream(&h, &file, failing, 1 << 30),
    )
    .await?;
    ensure(result.is_err(), || {
        "a write whose source failed succeeded".to_owned()
    })?;
    ensure(ctx.provider().read_file(&h, &file).await? == old, || {
        "a failed streamed write changed the file".to_owned()
    })?;
    let over = Source::new(new.clone(), chunk_sizes(ctx)).boxed();
    let cap = new.len() as u64 - 1;
    match within(
        CALL_LIMIT,
        "write_stream",
        s.write_stream(&h, &file, over, cap),
    )
    .await?
    {
        Err(e) if e.code() == Some(ErrorCode::FileTooLarge) => {}
        other => {
            return Err(Failure(format!(
                "a write over its cap: expected file_too_large, got {other:?}"
            )));
        }
    }
    ensure(ctx.provider().read_file(&h, &file).await? == old, || {
        "a write over its cap changed the file".to_owned()
    })?;
    // A failed write of a new file leaves no file.
    let fresh = scratch(ctx, "never.bin")?;
    let failing = Source::new(new, chunk_sizes(ctx)).failing().boxed();
    let result = s.write_stream(&h, &fresh, failing, 1 << 30).await;
    ensure(result.is_err(), || {
        "a write whose source failed succeeded".to_owned()
    })?;
    expect_kind(
        "the target of a failed write",
        ctx.provider().read_file(&h, &fresh).await.map(drop),
        ErrorKind::NotFound,
    )
}

/// Files and directories move; a file target is replaced; bad targets are `invalid_path`.
pub(super) async fn streamed_rename(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let s = streamed(ctx)?;
    let p = ctx.provider();
    let (a, b) = (
        scratch(ctx, "a.txt")?,
        scratch(ctx, &format!("new/{}/b.txt", ctx.token()))?,
    );
    let content = ctx.bytes(ctx.int(1..=4096) as usize);
    p.write_file(&h, &a, &content).await?;
    s.rename_path(&h, &a, &b).await?;
    ensure(p.read_file(&h, &b).await? == content, || {
        "the renamed file does not hold the original's bytes".to_owned()
    })?;
    expect_kind(
        "the old name after a rename",
        p.read_file(&h, &a).await.map(drop),
        ErrorKind::NotFound,
    )?;
    // Onto an existing file: replaced.
    let other = scratch(ctx, "other.txt")?;
    p.write_file(&h, &other, b"old").await?;
    s.rename_path(&h, &b, &other).await?;
    ensure(p.read_file(&h, &other).await? == content, || {
        "a rename onto a file did not replace it".to_owned()
    })?;
    // A directory moves with its contents.
    let dir = scratch(ctx, "tree")?;
    let leaf = dir.join("inner/leaf.txt")?;
    p.write_file(&h, &leaf, &content).await?;
    let moved = scratch(ctx, "moved-tree")?;
    s.rename_path(&h, &dir, &moved).await?;
    ensure(
        p.read_file(&h, &moved.join("inner/leaf.txt")?).await? == content,
        || "a moved directory lost its contents".to_owned(),
    )?;
    expect_kind(
        "a file under a moved directory's old name",
        p.read_file(&h, &leaf).await.map(drop),
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "renaming a missing path",
        s.rename_path(&h, &a, &b).await,
        ErrorKind::NotFound,
    )?;
    let code = |r: Result<(), Error>| r.err().and_then(|e| e.code());
    let onto_dir = scratch(ctx, "dir-target")?;
    p.write_file(&h, &onto_dir.join("x")?, b"x").await?;
    ensure_eq(
        "renaming onto an existing directory",
        code(s.rename_path(&h, &other, &onto_dir).await),
        Some(ErrorCode::InvalidPath),
    )?;
    ensure_eq(
        "renaming a directory into itself",
        code(s.rename_path(&h, &moved, &moved.join("inside")?).await),
        Some(ErrorCode::InvalidPath),
    )
}

//! Files: binary round trips, directories, stat, removal, missing paths, streamed reads (their
//! cap, and regular files only), bounded trees and the path type's refusals.

use std::time::{Duration, Instant};

use sandbox_core::{
    EntryKind, Error, ErrorCode, ErrorKind, ExecRequest, ReadStream, SandboxPath, TreeLimits,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, expect_kind, within};
use super::{exec, path, scratch};

pub(super) async fn files_binary_round_trip(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let all_bytes: Vec<u8> = (0..=255).collect();
    let big = ctx.bytes(10 << 20);
    for (name, content) in [
        ("all-bytes.bin", all_bytes),
        ("ten-mib.bin", big),
        ("empty.bin", Vec::new()),
    ] {
        let file = scratch(ctx, name)?;
        within(
            Duration::from_secs(120),
            "write_file",
            ctx.provider().write_file(&h, &file, &content),
        )
        .await??;
        let back = within(
            Duration::from_secs(120),
            "read_file",
            ctx.provider().read_file(&h, &file),
        )
        .await??;
        ensure_eq(&format!("{name} length"), back.len(), content.len())?;
        ensure(back == content, || format!("{name} came back altered"))?;
    }
    Ok(())
}

pub(super) async fn files_write_creates_parents(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "a/b/c/deep.txt")?;
    let content = ctx.token();
    ctx.provider()
        .write_file(&h, &file, content.as_bytes())
        .await?;
    ensure_eq(
        "read back",
        ctx.provider().read_file(&h, &file).await?,
        content.into_bytes(),
    )
}

pub(super) async fn files_list_dir(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "listing")?;
    let content = ctx.bytes(ctx.int(1..=4096) as usize);
    let file_name = format!("f-{}.bin", ctx.token());
    let sub_name = format!("d-{}", ctx.token());
    ctx.provider()
        .write_file(&h, &dir.join(&file_name)?, &content)
        .await?;
    ctx.provider().make_dir(&h, &dir.join(&sub_name)?).await?;
    let mut entries = ctx.provider().list_dir(&h, &dir).await?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let mut want = vec![file_name.as_str(), sub_name.as_str()];
    want.sort_unstable();
    ensure_eq("entry names", names, want)?;
    for e in &entries {
        ensure_eq(
            &format!("{} path", e.name),
            e.path.clone(),
            dir.join(&e.name)?,
        )?;
        if e.name == file_name {
            ensure_eq("file kind", e.kind, EntryKind::File)?;
            ensure_eq("file size", e.size, content.len() as u64)?;
        } else {
            ensure_eq("dir kind", e.kind, EntryKind::Dir)?;
        }
    }
    Ok(())
}

pub(super) async fn files_stat_kinds(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "stat/file.bin")?;
    let content = ctx.bytes(ctx.int(1..=2048) as usize);
    ctx.provider().write_file(&h, &file, &content).await?;
    let st = ctx.provider().stat(&h, &file).await?;
    ensure_eq("file kind", st.kind, EntryKind::File)?;
    ensure_eq("file size", st.size, content.len() as u64)?;
    ensure_eq("file path", st.path, file.clone())?;
    let dir = file
        .parent()
        .ok_or_else(|| Failure("no parent".to_owned()))?;
    ensure_eq(
        "dir kind",
        ctx.provider().stat(&h, &dir).await?.kind,
        EntryKind::Dir,
    )
}

pub(super) async fn files_make_dir_parents_and_existing(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "x/y/z")?;
    ctx.provider().make_dir(&h, &dir).await?;
    ensure_eq(
        "new dir kind",
        ctx.provider().stat(&h, &dir).await?.kind,
        EntryKind::Dir,
    )?;
    ctx.provider()
        .make_dir(&h, &dir)
        .await
        .map_err(|e| Failure(format!("mkdir of an existing directory failed: {e}")))?;
    let parent = dir
        .parent()
        .ok_or_else(|| Failure("no parent".to_owned()))?;
    ctx.provider()
        .make_dir(&h, &parent)
        .await
        .map_err(|e| Failure(format!("mkdir of an existing parent failed: {e}")))
}

pub(super) async fn files_remove_recursive(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "tree")?;
    let inner = dir.join("sub/inner.txt")?;
    ctx.provider()
        .write_file(&h, &inner, ctx.token().as_bytes())
        .await?;
    ctx.provider().remove(&h, &dir).await?;
    expect_kind(
        "stat after remove",
        ctx.provider().stat(&h, &dir).await,
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "read inside removed dir",
        ctx.provider().read_file(&h, &inner).await,
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "second remove",
        ctx.provider().remove(&h, &dir).await,
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "remove /",
        ctx.provider().remove(&h, &SandboxPath::root()).await,
        ErrorKind::InvalidRequest,
    )
}

pub(super) async fn files_missing_is_not_found(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let missing = scratch(ctx, "nope")?;
    expect_kind(
        "read missing",
        ctx.provider().read_file(&h, &missing).await,
        ErrorKind::NotFound,
    )?;
    if ctx.caps().fs_enumeration {
        expect_kind(
            "stat missing",
            ctx.provider().stat(&h, &missing).await,
            ErrorKind::NotFound,
        )?;
        expect_kind(
            "list missing",
            ctx.provider().list_dir(&h, &missing).await,
            ErrorKind::NotFound,
        )?;
    }
    Ok(())
}

/// Drains a read stream, bounded in time: what it yielded, and the error that ended it.
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
    let ended = within(Duration::from_secs(60), "read_file_stream", pull).await?;
    Ok((out, ended))
}

pub(super) async fn files_stream_round_trip(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "stream.bin")?;
    let payload = ctx.bytes(ctx.int(65_536..=(1 << 20)) as usize);
    ctx.provider().write_file(&h, &file, &payload).await?;
    let len = payload.len() as u64;
    let stream = ctx.provider().read_file_stream(&h, &file, len).await?;
    let (back, ended) = drain(stream).await?;
    if let Some(e) = ended {
        return Err(Failure(format!(
            "a stream capped at the file's size failed: {e}"
        )));
    }
    ensure(back == payload, || {
        format!(
            "streamed {} bytes, not the {} written",
            back.len(),
            payload.len()
        )
    })?;
    // One byte under the size: the stream (or the call) ends in file_too_large, never a
    // silently shorter file.
    let capped = match ctx.provider().read_file_stream(&h, &file, len - 1).await {
        Err(e) => Some(e),
        Ok(stream) => {
            let (got, ended) = drain(stream).await?;
            ensure((got.len() as u64) < len, || {
                format!("a stream capped at {} bytes yielded {}", len - 1, got.len())
            })?;
            ended
        }
    };
    match capped {
        Some(e) if e.code() == Some(ErrorCode::FileTooLarge) => {}
        Some(e) => {
            return Err(Failure(format!(
                "over the cap: expected file_too_large, got {e}"
            )));
        }
        None => {
            return Err(Failure(
                "a stream over its cap ended without an error".to_owned(),
            ));
        }
    }
    let missing = scratch(ctx, "nope")?;
    expect_kind(
        "stream of a missing file",
        ctx.provider()
            .read_file_stream(&h, &missing, len)
            .await
            .map(drop),
        ErrorKind::NotFound,
    )
}

/// A FIFO and a symlink to `/dev/zero` are refused at once, by the buffered and the streamed
/// read alike; so is a directory.
pub(super) async fn files_reads_take_only_regular_files(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "odd")?;
    let script = format!(
        "mkdir -p {dir} && mkfifo {dir}/fifo && ln -s /dev/zero {dir}/zero && ln -s fifo {dir}/to-fifo"
    );
    let r = exec(ctx, &h, ExecRequest::shell(script)).await?;
    ensure_eq("exit code of the set-up", r.exit_code, 0)?;
    for leaf in ["fifo", "zero", "to-fifo"] {
        let p = path(&format!("{dir}/{leaf}"))?;
        let started = Instant::now();
        let streamed = match ctx.provider().read_file_stream(&h, &p, 1 << 30).await {
            Err(e) => Some(e),
            Ok(stream) => drain(stream).await?.1,
        };
        let refused = |e: &Option<Error>| {
            e.as_ref().is_some_and(|e| {
                e.kind() == ErrorKind::InvalidRequest
                    && matches!(
                        e.code(),
                        Some(ErrorCode::NotARegularFile | ErrorCode::InvalidPath)
                    )
            })
        };
        ensure(refused(&streamed), || {
            format!("streaming {leaf}: expected not_a_regular_file, got {streamed:?}")
        })?;
        let buffered = ctx.provider().read_file(&h, &p).await.err();
        ensure(refused(&buffered), || {
            format!("reading {leaf}: expected not_a_regular_file, got {buffered:?}")
        })?;
        ensure(started.elapsed() < Duration::from_secs(10), || {
            format!(
                "refusing {leaf} took {:?}: it waited on the file",
                started.elapsed()
            )
        })?;
    }
    expect_kind(
        "read of a directory",
        ctx.provider().read_file(&h, &dir).await,
        ErrorKind::InvalidRequest,
    )
}

pub(super) async fn files_tree_is_bounded(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let root = scratch(ctx, "tree")?;
    for leaf in ["a/x.txt", "a/b/y.txt", "a/b/c/z.txt", "top.txt"] {
        let p = path(&format!("{root}/{leaf}"))?;
        ctx.provider().write_file(&h, &p, leaf.as_bytes()).await?;
    }
    let names = |listing: &sandbox_core::TreeListing| -> Vec<String> {
        listing
            .entries
            .iter()
            .map(|e| e.path.as_str().trim_start_matches(root.as_str()).to_owned())
            .collect()
    };
    let two = ctx
        .provider()
        .list_tree(&h, &root, TreeLimits::depth(2))
        .await?;
    ensure_eq(
        "two levels, sorted",
        names(&two),
        ["/a", "/a/b", "/a/x.txt", "/top.txt"]
            .map(str::to_owned)
            .to_vec(),
    )?;
    ensure(!two.truncated, || {
        "an uncapped listing says truncated".to_owned()
    })?;
    let kinds: Vec<EntryKind> = two.entries.iter().map(|e| e.kind).collect();
    ensure_eq(
        "kinds",
        kinds,
        vec![
            EntryKind::Dir,
            EntryKind::Dir,
            EntryKind::File,
            EntryKind::File,
        ],
    )?;
    let mut capped = TreeLimits::depth(8);
    capped.max_entries = 3;
    let cut = ctx.provider().list_tree(&h, &root, capped).await?;
    ensure(cut.truncated && cut.entries.len() == 3, || {
        format!(
            "capped at 3: expected 3 entries and truncated, got {} (truncated {})",
            cut.entries.len(),
            cut.truncated
        )
    })?;
    let all = ctx
        .provider()
        .list_tree(&h, &root, TreeLimits::depth(8))
        .await?;
    ensure_eq("every level", all.entries.len(), 7)?;
    expect_kind(
        "tree of a missing directory",
        ctx.provider()
            .list_tree(&h, &scratch(ctx, "nope")?, TreeLimits::depth(2))
            .await,
        ErrorKind::NotFound,
    )
}

pub(super) async fn files_bad_paths_are_invalid_request(_ctx: &Ctx) -> CaseResult {
    // Adapters take `SandboxPath`, so a relative or traversing path cannot reach them: the
    // refusal happens where callers build the path. This case pins that entry point.
    for raw in [
        "relative/file",
        "./x",
        "",
        "/workspace/../etc/passwd",
        "/a/\0b",
    ] {
        expect_kind(
            &format!("path {raw:?}"),
            SandboxPath::new(raw),
            ErrorKind::InvalidRequest,
        )?;
    }
    Ok(())
}

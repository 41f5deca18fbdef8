//! The cases. Each is a plain async function over the context; the table at the bottom
//! registers them with their requirements and the contract bullets they cite.

use std::time::{Duration, Instant};

use sandbox_core::{
    Capability, ConnectRequest, CreateRequest, EntryKind, Error, ErrorCode, ErrorKind, ExecRequest,
    ExecResult, ExecTimeout, ListFilter, OutputHook, OutputStream, ReadStream, SandboxHandle,
    SandboxId, SandboxPath, SandboxState, Secret, TemplateId, TerminalEvent, TerminalOptions,
    TerminalSize, TreeLimits, VolumeMount, narrow, owner_metadata,
};
use tokio::sync::mpsc;

use super::{
    Case, CaseResult, Ctx, Failure, NAMESPACE_KEY, ensure, ensure_eq, expect_kind, preview, within,
};

const EXEC_LIMIT: Duration = Duration::from_secs(90);

async fn exec(
    ctx: &Ctx,
    sandbox: &SandboxHandle,
    request: ExecRequest,
) -> Result<ExecResult, Failure> {
    let label = request.command.label().to_owned();
    within(EXEC_LIMIT, "exec", ctx.provider().exec(sandbox, request))
        .await?
        .map_err(|e| Failure(format!("exec {label}: {e}")))
}

fn path(raw: &str) -> Result<SandboxPath, Failure> {
    SandboxPath::new(raw).map_err(|e| Failure(format!("bad test path {raw}: {e}")))
}

/// A scratch directory unique to this case.
fn scratch(ctx: &Ctx, leaf: &str) -> Result<SandboxPath, Failure> {
    path(&format!("/tmp/{}-{}/{leaf}", ctx.namespace(), ctx.token()))
}

fn timeout(secs: u64) -> Result<ExecTimeout, Failure> {
    ExecTimeout::new(Duration::from_secs(secs)).map_err(Failure::from)
}

// ---- health, create, get, list --------------------------------------------------------------

async fn health_ok(ctx: &Ctx) -> CaseResult {
    within(Duration::from_secs(60), "health", ctx.provider().health()).await??;
    Ok(())
}

async fn create_then_get(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    ensure_eq("handle provider", h.provider(), ctx.provider().provider())?;
    let summary = ctx.provider().get(h.id()).await?;
    ensure_eq("summary id", &summary.id, h.id())?;
    ensure_eq("state after create", summary.state, SandboxState::Running)
}

async fn metadata_round_trips(ctx: &Ctx) -> CaseResult {
    let token = ctx.token();
    let mut request = ctx.create_request();
    request
        .metadata
        .insert("sandbox_conformance_token".to_owned(), token.clone());
    let h = ctx.create_with(request.clone()).await?;
    let summary = ctx.provider().get(h.id()).await?;
    for (k, v) in &request.metadata {
        ensure_eq(
            &format!("get metadata[{k}]"),
            summary.metadata.get(k),
            Some(v),
        )?;
        ensure_eq(
            &format!("handle metadata[{k}]"),
            h.metadata().get(k),
            Some(v),
        )?;
    }
    Ok(())
}

async fn list_filters_by_metadata_and_state(ctx: &Ctx) -> CaseResult {
    let (t1, t2) = (ctx.token(), ctx.token());
    let mut r1 = ctx.create_request();
    r1.metadata
        .insert("sandbox_conformance_token".to_owned(), t1.clone());
    let mut r2 = ctx.create_request();
    r2.metadata
        .insert("sandbox_conformance_token".to_owned(), t2);
    let a = ctx.create_with(r1).await?;
    let b = ctx.create_with(r2).await?;
    let p = ctx.provider();
    let ids = |list: Vec<sandbox_core::SandboxSummary>| {
        let mut ids: Vec<SandboxId> = list.into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    let mut by_token = ListFilter::default();
    by_token
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    by_token
        .metadata
        .insert("sandbox_conformance_token".to_owned(), t1);
    ensure_eq(
        "list by metadata",
        ids(p.list(&by_token).await?),
        vec![a.id().clone()],
    )?;

    let mut by_ns = ListFilter::default();
    by_ns
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    let listed = ids(p.list(&by_ns).await?);
    ensure(listed.contains(a.id()) && listed.contains(b.id()), || {
        format!("list by namespace missed a sandbox: {listed:?}")
    })?;

    let running = ListFilter {
        states: vec![SandboxState::Running, SandboxState::Paused],
        ..by_token.clone()
    };
    ensure_eq(
        "list by metadata and live states",
        ids(p.list(&running).await?),
        vec![a.id().clone()],
    )?;
    let terminal = ListFilter {
        states: vec![SandboxState::Terminal],
        ..by_token
    };
    ensure_eq(
        "list by metadata and terminal state",
        ids(p.list(&terminal).await?),
        vec![],
    )
}

async fn create_unknown_template_is_invalid_request(ctx: &Ctx) -> CaseResult {
    let template = TemplateId::new(format!("sandbox-conformance-missing-{}", ctx.token()))?;
    let mut request = ctx.create_request();
    request.template = template;
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind(
        "create from an unknown template",
        result,
        ErrorKind::InvalidRequest,
    )
}

async fn create_with_volumes_is_unsupported(ctx: &Ctx) -> CaseResult {
    let mut request = ctx.create_request();
    request
        .volumes
        .push(VolumeMount::new("conformance-vol", path("/mnt/vol")?)?);
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind("create with volumes", result, ErrorKind::Unsupported)
}

async fn create_with_metadata_is_unsupported(ctx: &Ctx) -> CaseResult {
    let mut request = ctx.create_request();
    request
        .metadata
        .insert(NAMESPACE_KEY.to_owned(), ctx.namespace().to_owned());
    let result = ctx.provider().create(request).await;
    if let Ok(h) = &result {
        ctx.track(h.id().clone());
    }
    expect_kind("create with metadata", result, ErrorKind::Unsupported)
}

async fn list_is_unsupported(ctx: &Ctx) -> CaseResult {
    expect_kind(
        "list",
        ctx.provider().list(&ListFilter::default()).await,
        ErrorKind::Unsupported,
    )
}

// ---- exec ---------------------------------------------------------------------------------

async fn exec_argv_echo(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let token = ctx.token();
    let r = exec(ctx, &h, ExecRequest::argv("echo", [token.as_str()])).await?;
    ensure_eq("exit code", r.exit_code, 0)?;
    ensure_eq("killed", r.killed, false)?;
    ensure_eq("stdout", r.stdout_lossy(), format!("{token}\n"))?;
    ensure_eq("stderr", r.stderr_lossy(), String::new())
}

async fn exec_exit_codes(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let code = ctx.exit_code();
    let r = exec(ctx, &h, ctx.exit_request(code)).await?;
    ensure_eq("exit code", r.exit_code, code)?;
    ensure_eq("killed", r.killed, false)?;
    let r = exec(ctx, &h, ExecRequest::argv("true", Vec::<String>::new())).await?;
    ensure_eq("true exits 0", r.exit_code, 0)?;
    let r = exec(ctx, &h, ExecRequest::argv("false", Vec::<String>::new())).await?;
    ensure_eq("false exits 1", r.exit_code, 1)
}

async fn exec_exit_124_and_137_are_not_timeouts(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    for code in [124, 137] {
        let r = exec(ctx, &h, ctx.exit_request(code)).await?;
        ensure_eq(&format!("exit {code} status"), r.exit_code, code)?;
        ensure(!r.killed, || {
            format!("a command exiting {code} by itself was reported as killed")
        })?;
    }
    Ok(())
}

async fn exec_stdin_is_delivered(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let payload: String = (0..64).map(|_| ctx.token()).collect::<Vec<_>>().join("\n") + "\n";
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("cat", Vec::<String>::new()).stdin(payload.clone()),
    )
    .await?;
    ensure_eq("exit code", r.exit_code, 0)?;
    ensure(r.stdout == payload.as_bytes(), || {
        format!("cat echoed {} instead of the stdin", preview(&r.stdout))
    })
}

async fn exec_env_applies(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let value = ctx.token();
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("env", Vec::<String>::new())
            .env("SANDBOX_CONFORMANCE_VAR", value.clone()),
    )
    .await?;
    let line = format!("SANDBOX_CONFORMANCE_VAR={value}");
    ensure(r.stdout_lossy().lines().any(|l| l == line), || {
        format!("env output lacks {line}: {}", preview(&r.stdout))
    })
}

async fn exec_cwd_applies(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "cwd")?;
    ctx.provider()
        .write_file(&h, &dir.join("marker")?, b"x")
        .await?;
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("pwd", Vec::<String>::new()).cwd(dir.clone()),
    )
    .await?;
    ensure_eq("pwd", r.stdout_lossy(), format!("{dir}\n"))
}

async fn exec_streams_are_kept_apart(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let dir = scratch(ctx, "streams")?;
    let content = format!("{}\n", ctx.token());
    let present = dir.join("present.txt")?;
    ctx.provider()
        .write_file(&h, &present, content.as_bytes())
        .await?;
    let missing = dir.join(&format!("missing-{}", ctx.token()))?;
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("cat", [present.as_str(), missing.as_str()]),
    )
    .await?;
    ensure_eq("stdout", r.stdout_lossy(), content)?;
    let missing_name = missing.file_name().unwrap_or_default().to_owned();
    ensure(r.stderr_lossy().contains(&missing_name), || {
        format!(
            "stderr does not name the missing file: {}",
            preview(&r.stderr)
        )
    })?;
    ensure(!r.stdout_lossy().contains(&missing_name), || {
        "the error message leaked into stdout".to_owned()
    })?;
    ensure(r.exit_code != 0, || {
        "cat of a missing file exited 0".to_owned()
    })
}

async fn exec_large_stdout_is_intact(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "big.bin")?;
    let payload = ctx.bytes(1 << 20);
    ctx.provider().write_file(&h, &file, &payload).await?;
    let r = exec(ctx, &h, ExecRequest::argv("cat", [file.as_str()])).await?;
    ensure_eq("exit code", r.exit_code, 0)?;
    ensure_eq("stdout length", r.stdout.len(), payload.len())?;
    ensure(r.stdout == payload, || {
        "1 MiB of stdout came back altered".to_owned()
    })
}

async fn exec_output_streams_while_running(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let token = ctx.token();
    let gate = scratch(ctx, "gate")?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let hook = OutputHook::new(move |stream, chunk| {
        if stream == OutputStream::Stdout {
            let _ = tx.send(chunk.to_vec());
        }
    });
    // The command prints the token, then blocks until the gate file exists. The gate is created
    // only after the token has arrived through the hook, so a provider that buffers output
    // until the command ends can never pass: its command never ends.
    let script = format!(
        "echo {token}; i=0; while [ ! -e {gate} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo done-{token}"
    );
    let provider = ctx.provider_arc();
    let handle = h.clone();
    let request = ExecRequest::shell(script)
        .timeout(timeout(75)?)
        .on_output(hook);
    let running = tokio::spawn(async move { provider.exec(&handle, request).await });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&seen).contains(&token) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(chunk)) => seen.extend_from_slice(&chunk),
            Ok(None) => {
                return Err(Failure(
                    "output hook closed before the token arrived".to_owned(),
                ));
            }
            Err(_) => {
                running.abort();
                return Err(Failure(
                    "the token printed before the command blocked never reached on_output within 30s: output is buffered, not streamed".to_owned(),
                ));
            }
        }
    }
    ctx.provider().write_file(&h, &gate, b"go").await?;
    let result = within(
        Duration::from_secs(60),
        "exec after the gate opened",
        running,
    )
    .await?
    .map_err(|e| Failure(format!("exec task failed: {e}")))??;
    ensure_eq("exit code", result.exit_code, 0)?;
    // Everything the command printed reached the hook, and the result kept none of it.
    while let Ok(chunk) = rx.try_recv() {
        seen.extend_from_slice(&chunk);
    }
    ensure_eq(
        "stdout seen by the hook",
        String::from_utf8_lossy(&seen).into_owned(),
        format!("{token}\ndone-{token}\n"),
    )?;
    ensure(result.stdout.is_empty() && result.stderr.is_empty(), || {
        format!(
            "with a hook attached the result must carry no output, got {} + {} bytes",
            result.stdout.len(),
            result.stderr.len()
        )
    })
}

async fn exec_shell_form(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let (a, b) = (ctx.int(2..=999), ctx.int(2..=999));
    let r = exec(
        ctx,
        &h,
        ExecRequest::shell(format!("echo $(( {a} * {b} )) | cat")),
    )
    .await?;
    ensure_eq(
        "shell arithmetic through a pipe",
        r.stdout_lossy(),
        format!("{}\n", a * b),
    )
}

async fn exec_shell_form_is_unsupported(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    expect_kind(
        "shell form without posix_shell",
        ctx.provider().exec(&h, ExecRequest::shell("echo hi")).await,
        ErrorKind::Unsupported,
    )
}

async fn exec_timeout_kills(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let started = Instant::now();
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("sleep", ["30"]).timeout(timeout(2)?),
    )
    .await?;
    let elapsed = started.elapsed();
    ensure(r.killed, || {
        format!("a 30 s sleep with a 2 s timeout was not reported killed: {r:?}")
    })?;
    // Generous bound: the point is "long before 30 s", not a latency figure.
    ensure(elapsed < Duration::from_secs(25), || {
        format!("the timed-out exec took {elapsed:?}")
    })
}

/// Counts processes whose command line contains `needle`, from inside the sandbox.
async fn count_processes(ctx: &Ctx, h: &SandboxHandle, needle: &str) -> Result<usize, Failure> {
    // `[s]leep` style: the pattern's first character in brackets keeps the scanning shell's own
    // command line (which holds the pattern, not the needle) from matching.
    let (first, rest) = needle.split_at(1);
    let script = format!(
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < \"$f\" 2>/dev/null; echo; done | grep -c '[{first}]{rest}' || true"
    );
    let r = exec(ctx, h, ExecRequest::shell(script)).await?;
    r.stdout_lossy()
        .trim()
        .parse::<usize>()
        .map_err(|_| Failure(format!("cannot count processes: {}", preview(&r.stdout))))
}

async fn wait_for_no_process(ctx: &Ctx, h: &SandboxHandle, needle: &str, what: &str) -> CaseResult {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = count_processes(ctx, h, needle).await?;
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure(format!(
                "{what}: {n} process(es) matching {needle:?} still running after 15s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn exec_timeout_leaves_no_process(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let secs = 3000 + ctx.int(0..=999);
    let r = exec(
        ctx,
        &h,
        ExecRequest::argv("sleep", [secs.to_string()]).timeout(timeout(2)?),
    )
    .await?;
    ensure(r.killed, || {
        "the sleep was not killed by its timeout".to_owned()
    })?;
    wait_for_no_process(ctx, &h, &format!("sleep {secs}"), "after the exec timeout").await
}

async fn exec_cancel_kills_process(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let secs = 4000 + ctx.int(0..=999);
    let needle = format!("sleep {secs}");
    let dropped = tokio::time::timeout(
        Duration::from_secs(3),
        ctx.provider()
            .exec(&h, ExecRequest::argv("sleep", [secs.to_string()])),
    );
    ensure(dropped.await.is_err(), || {
        "the sleep returned before the caller went away".to_owned()
    })?;
    wait_for_no_process(ctx, &h, &needle, "after the caller dropped the exec").await
}

async fn exec_concurrent_calls(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let token = format!("{i}-{}", ctx.token());
        let provider = ctx.provider_arc();
        let handle = h.clone();
        tasks.spawn(async move {
            let r = provider
                .exec(&handle, ExecRequest::argv("echo", [token.as_str()]))
                .await;
            (token, r)
        });
    }
    let mut done = 0;
    while let Some(joined) = within(EXEC_LIMIT, "20 concurrent execs", tasks.join_next()).await? {
        let (token, r) = joined.map_err(|e| Failure(format!("exec task failed: {e}")))?;
        let r = r?;
        ensure_eq(
            "concurrent exec stdout",
            r.stdout_lossy(),
            format!("{token}\n"),
        )?;
        done += 1;
    }
    ensure_eq("completed execs", done, 20)
}

// ---- files --------------------------------------------------------------------------------

async fn files_binary_round_trip(ctx: &Ctx) -> CaseResult {
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

async fn files_write_creates_parents(ctx: &Ctx) -> CaseResult {
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

async fn files_list_dir(ctx: &Ctx) -> CaseResult {
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

async fn files_stat_kinds(ctx: &Ctx) -> CaseResult {
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

async fn files_make_dir_parents_and_existing(ctx: &Ctx) -> CaseResult {
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

async fn files_remove_recursive(ctx: &Ctx) -> CaseResult {
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

async fn files_missing_is_not_found(ctx: &Ctx) -> CaseResult {
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

async fn files_stream_round_trip(ctx: &Ctx) -> CaseResult {
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
async fn files_reads_take_only_regular_files(ctx: &Ctx) -> CaseResult {
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

async fn files_tree_is_bounded(ctx: &Ctx) -> CaseResult {
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

async fn files_bad_paths_are_invalid_request(_ctx: &Ctx) -> CaseResult {
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

// ---- lifecycle ----------------------------------------------------------------------------

async fn delete_then_get_is_not_found(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    ctx.provider().delete(h.id()).await?;
    ctx.untrack(h.id());
    expect_kind(
        "get after delete",
        ctx.provider().get(h.id()).await,
        ErrorKind::NotFound,
    )?;
    expect_kind(
        "second delete",
        ctx.provider().delete(h.id()).await,
        ErrorKind::NotFound,
    )
}

async fn connect_running_sandbox(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let token = Secret::new(format!("tok-{}", ctx.token()));
    let request = ConnectRequest {
        sandbox_id: h.id().clone(),
        traffic_token: Some(token),
    };
    let c = ctx.provider().connect(request).await?;
    ensure_eq("connected id", c.id(), h.id())?;
    ensure(c.traffic_token().is_some(), || {
        "the connected handle dropped the stored traffic token".to_owned()
    })?;
    let word = ctx.token();
    let r = exec(ctx, &c, ExecRequest::argv("echo", [word.as_str()])).await?;
    ensure_eq(
        "exec through the connected handle",
        r.stdout_lossy(),
        format!("{word}\n"),
    )
}

async fn connect_deleted_is_replaceable(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    ctx.provider().delete(h.id()).await?;
    ctx.untrack(h.id());
    replaceable(
        "connect after delete",
        ctx.provider()
            .connect(ConnectRequest::new(h.id().clone()))
            .await,
    )
}

async fn connect_unknown_is_replaceable(ctx: &Ctx) -> CaseResult {
    let id = SandboxId::new(format!("conformance-unknown-{}", ctx.token()))?;
    replaceable(
        "connect to an unknown sandbox",
        ctx.provider().connect(ConnectRequest::new(id)).await,
    )
}

fn replaceable(what: &str, result: Result<SandboxHandle, Error>) -> CaseResult {
    match result {
        Err(e) if e.can_replace_binding() => Ok(()),
        Err(e) => Err(Failure(format!(
            "{what}: expected not_found or terminal, got {e}"
        ))),
        Ok(h) => Err(Failure(format!(
            "{what}: unexpectedly connected to {}",
            h.id()
        ))),
    }
}

async fn connect_probe_running_and_deleted(ctx: &Ctx) -> CaseResult {
    let probe = narrow::connect_probe(ctx.provider())
        .ok_or_else(|| Failure("connect_probe declared but not callable".to_owned()))?;
    let h = ctx.create().await?;
    let c = probe
        .connect_session(ConnectRequest::new(h.id().clone()))
        .await?;
    ensure_eq("probed id", c.id(), h.id())?;
    ctx.provider().delete(h.id()).await?;
    ctx.untrack(h.id());
    replaceable(
        "connect_session after delete",
        probe
            .connect_session(ConnectRequest::new(h.id().clone()))
            .await,
    )
}

async fn keep_alive_running(ctx: &Ctx) -> CaseResult {
    let keep = narrow::keep_alive(ctx.provider())
        .ok_or_else(|| Failure("keep_alive declared but not callable".to_owned()))?;
    let h = ctx.create().await?;
    keep.keep_alive(&h, Duration::from_secs(300)).await?;
    let r = exec(ctx, &h, ExecRequest::argv("true", Vec::<String>::new())).await?;
    ensure_eq("exec after keep-alive", r.exit_code, 0)
}

// ---- terminals ----------------------------------------------------------------------------

struct OpenTerminal {
    terminal: sandbox_core::Terminal,
    seen: Vec<u8>,
}

async fn open_terminal(
    ctx: &Ctx,
    h: &SandboxHandle,
    options: TerminalOptions,
) -> Result<OpenTerminal, Failure> {
    let terminals = narrow::terminals(ctx.provider())
        .ok_or_else(|| Failure("pty declared but not callable".to_owned()))?;
    let terminal = within(
        Duration::from_secs(60),
        "open_terminal",
        terminals.open_terminal(h, options),
    )
    .await??;
    Ok(OpenTerminal {
        terminal,
        seen: Vec::new(),
    })
}

impl OpenTerminal {
    async fn type_line(&self, line: &str) -> CaseResult {
        self.terminal
            .input
            .write(format!("{line}\n").as_bytes())
            .await
            .map_err(Failure::from)
    }

    /// Reads output until `needle` appears (or the terminal ends, or 30 s pass).
    async fn read_until(&mut self, needle: &str) -> Result<(), Failure> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.terminal.output.next_event()).await {
                Ok(Some(TerminalEvent::Data(bytes))) => self.seen.extend_from_slice(&bytes),
                Ok(Some(other)) => {
                    return Err(Failure(format!(
                        "terminal ended before {needle:?}: {other:?}"
                    )));
                }
                Ok(None) => return Err(Failure(format!("terminal closed before {needle:?}"))),
                Err(_) => {
                    return Err(Failure(format!(
                        "{needle:?} not seen within 30s; got {}",
                        preview(&self.seen)
                    )));
                }
            }
        }
        Ok(())
    }
}

async fn terminal_echo_round_trip(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let (a, b) = (ctx.token(), ctx.token());
    // Typed as `a""b`, printed as `ab`: the terminal's echo of the typed line cannot match.
    t.type_line(&format!("echo {a}\"\"{b}")).await?;
    t.read_until(&format!("{a}{b}")).await?;
    t.terminal.input.close().await.map_err(Failure::from)
}

async fn terminal_resize_is_visible(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let size = TerminalSize {
        cols: u16::try_from(ctx.int(60..=200)).unwrap_or(100),
        rows: u16::try_from(ctx.int(20..=60)).unwrap_or(40),
    };
    t.terminal.input.resize(size).await.map_err(Failure::from)?;
    t.type_line("stty size").await?;
    t.read_until(&format!("{} {}", size.rows, size.cols))
        .await?;
    t.terminal.input.close().await.map_err(Failure::from)
}

async fn terminal_exit_code(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let mut t = open_terminal(ctx, &h, TerminalOptions::default()).await?;
    let code = ctx.exit_code();
    t.type_line(&format!("exit {code}")).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t.terminal.output.next_event()).await {
            Ok(Some(TerminalEvent::Data(_))) => {}
            Ok(Some(TerminalEvent::Exited(status))) => {
                return ensure_eq("terminal exit status", status, Some(code));
            }
            Ok(Some(TerminalEvent::Failed(e))) => {
                return Err(Failure(format!("terminal failed instead of exiting: {e}")));
            }
            Ok(None) => return Err(Failure("terminal ended without an exit event".to_owned())),
            Err(_) => return Err(Failure("no exit event within 30s".to_owned())),
        }
    }
}

async fn terminal_close_leaves_no_shell(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let marker = ctx.token();
    let mut options = TerminalOptions::default();
    options
        .env
        .insert("SANDBOX_CONFORMANCE_TERM".to_owned(), marker.clone());
    let mut t = open_terminal(ctx, &h, options).await?;
    let (a, b) = (ctx.token(), ctx.token());
    // A child process in the session too: closing must hang up the whole session.
    t.type_line(&format!("sleep 4321 & echo {a}\"\"{b}"))
        .await?;
    t.read_until(&format!("{a}{b}")).await?;
    t.terminal.input.close().await.map_err(Failure::from)?;
    let script = format!(
        "grep -l 'SANDBOX_CONFORMANCE_TERM={marker}' /proc/[0-9]*/environ 2>/dev/null | grep -vc self || true"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = exec(ctx, &h, ExecRequest::shell(script.clone())).await?;
        // The scanning shell itself does not carry the marker (it is not in the terminal's env).
        let n: usize = r.stdout_lossy().trim().parse().unwrap_or(usize::MAX);
        if n == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Failure(format!(
                "{n} process(es) of the closed terminal still running after 15s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---- snapshots and templates --------------------------------------------------------------

async fn snapshot_round_trip(ctx: &Ctx) -> CaseResult {
    let snapshots = narrow::snapshots(ctx.provider())
        .ok_or_else(|| Failure("snapshots declared but not callable".to_owned()))?;
    let h = ctx.create().await?;
    let file = path(&format!("/workspace/snapshot-{}.bin", ctx.token()))?;
    let content = ctx.bytes(ctx.int(1..=65536) as usize);
    ctx.provider().write_file(&h, &file, &content).await?;
    let snap = within(
        Duration::from_secs(180),
        "create_snapshot",
        snapshots.create_snapshot(h.id(), Some(&format!("conf-{}", ctx.token()))),
    )
    .await??;
    ctx.track_snapshot(snap.id.clone());
    let listed = snapshots.list_snapshots(Some(h.id())).await?;
    ensure(listed.iter().any(|s| s.id == snap.id), || {
        format!("list_snapshots does not show {}", snap.id)
    })?;
    let mut request: CreateRequest = ctx.create_request();
    request.template = TemplateId::new(snap.id.as_str())?;
    request.from_snapshot = true;
    let restored = ctx.create_with(request).await?;
    let back = ctx.provider().read_file(&restored, &file).await?;
    ensure(back == content, || {
        "the sandbox created from the snapshot lacks the file".to_owned()
    })?;
    ctx.provider().delete(restored.id()).await?;
    ctx.untrack(restored.id());
    snapshots
        .delete_snapshot(&snap.id)
        .await
        .map_err(|e| Failure(format!("delete snapshot: {e}")))?;
    snapshots
        .delete_snapshot(&snap.id)
        .await
        .map_err(|e| Failure(format!("second delete of a snapshot must succeed: {e}")))
}

/// Restores name only this tenant's snapshots: another tenant's, the standard template and an
/// invented name are one and the same `snapshot_not_found`, and none of them creates anything.
async fn snapshot_restore_is_owner_only(ctx: &Ctx) -> CaseResult {
    let snapshots = narrow::snapshots(ctx.provider())
        .ok_or_else(|| Failure("snapshots declared but not callable".to_owned()))?;
    let (owner, other) = (ctx.int(1..=1_000_000), ctx.int(1_000_001..=2_000_000));
    let as_tenant = |tenant: u32, template: &str| -> Result<CreateRequest, Failure> {
        let mut request = ctx.create_request();
        request
            .metadata
            .insert(owner_metadata::TENANT.to_owned(), tenant.to_string());
        request.template = TemplateId::new(template)?;
        request.from_snapshot = true;
        Ok(request)
    };
    let mut source = ctx.create_request();
    source
        .metadata
        .insert(owner_metadata::TENANT.to_owned(), owner.to_string());
    let h = ctx.create_with(source).await?;
    let snap = within(
        Duration::from_secs(180),
        "create_snapshot",
        snapshots.create_snapshot(h.id(), Some(&format!("own-{}", ctx.token()))),
    )
    .await??;
    ctx.track_snapshot(snap.id.clone());
    let listed = snapshots.list_snapshots(Some(h.id())).await?;
    let tenant = listed
        .iter()
        .find(|s| s.id == snap.id)
        .and_then(|s| s.tenant);
    ensure_eq(
        "the listed snapshot's tenant",
        tenant.map(|t| t.get()),
        Some(u64::from(owner)),
    )?;
    let before = ctx
        .provider()
        .list(&ListFilter {
            metadata: ctx.metadata(),
            states: Vec::new(),
        })
        .await?
        .len();
    let mut bodies = Vec::new();
    for (what, request) in [
        (
            "another tenant's snapshot",
            as_tenant(other, snap.id.as_str())?,
        ),
        (
            "the standard template",
            as_tenant(owner, ctx.create_request().template.as_str())?,
        ),
        (
            "an invented snapshot",
            as_tenant(owner, &format!("{}-{}", snap.id.as_str(), ctx.token()))?,
        ),
    ] {
        match ctx.provider().create(request).await {
            Ok(handle) => {
                ctx.track(handle.id().clone());
                return Err(Failure(format!("restoring {what} created {}", handle.id())));
            }
            Err(e) => {
                ensure(
                    e.kind() == ErrorKind::NotFound
                        && e.code() == Some(ErrorCode::SnapshotNotFound),
                    || format!("restoring {what}: expected snapshot_not_found, got {e}"),
                )?;
                bodies.push(e.message().to_owned());
            }
        }
    }
    ensure(bodies.windows(2).all(|w| w[0] == w[1]), || {
        format!("the refusals differ, which tells a caller what exists: {bodies:?}")
    })?;
    let after = ctx
        .provider()
        .list(&ListFilter {
            metadata: ctx.metadata(),
            states: Vec::new(),
        })
        .await?
        .len();
    ensure_eq("sandboxes after the refused restores", after, before)?;
    let restored = ctx.create_with(as_tenant(owner, snap.id.as_str())?).await?;
    ctx.provider().delete(restored.id()).await?;
    ctx.untrack(restored.id());
    Ok(())
}

async fn template_catalog_has_standard(ctx: &Ctx) -> CaseResult {
    let catalog = narrow::template_catalog(ctx.provider())
        .ok_or_else(|| Failure("template_catalog declared but not callable".to_owned()))?;
    let standard = catalog.ensure_standard_template().await?;
    let listed = catalog.list_templates().await?;
    ensure(listed.iter().any(|t| t.id == standard.id), || {
        format!("list_templates lacks the standard template {}", standard.id)
    })
}

// ---- registry -----------------------------------------------------------------------------

macro_rules! case {
    ($name:ident, [$($req:ident),*], [$($forbid:ident),*], [$($cite:literal),*]) => {
        Case {
            name: stringify!($name),
            requires: &[$(Capability::$req),*],
            forbids: &[$(Capability::$forbid),*],
            cites: &[$($cite),*],
            run: |ctx| Box::pin($name(ctx)),
        }
    };
}

/// Every provider case. (The harness adds the declaration cases.)
pub fn all_cases() -> Vec<Case> {
    vec![
        case!(health_ok, [], [], ["health.ok"]),
        case!(create_then_get, [], [], ["create.running", "get.absent"]),
        case!(
            metadata_round_trips,
            [Metadata],
            [],
            ["create.metadata", "get.metadata"]
        ),
        case!(
            list_filters_by_metadata_and_state,
            [Metadata, List],
            [],
            ["list.filter"]
        ),
        case!(
            create_unknown_template_is_invalid_request,
            [],
            [],
            ["create.unknown_template"]
        ),
        case!(
            create_with_volumes_is_unsupported,
            [],
            [Volumes],
            ["create.volumes"]
        ),
        case!(
            create_with_metadata_is_unsupported,
            [],
            [Metadata],
            ["create.metadata"]
        ),
        case!(list_is_unsupported, [], [List], ["list.filter"]),
        case!(exec_argv_echo, [], [], ["exec.argv", "exec.io"]),
        case!(exec_exit_codes, [], [], ["exec.io"]),
        case!(
            exec_exit_124_and_137_are_not_timeouts,
            [],
            [],
            ["exec.timeout"]
        ),
        case!(exec_stdin_is_delivered, [], [], ["exec.io"]),
        case!(exec_env_applies, [], [], ["exec.io"]),
        case!(exec_cwd_applies, [], [], ["exec.io"]),
        case!(exec_streams_are_kept_apart, [], [], ["exec.io"]),
        case!(exec_large_stdout_is_intact, [], [], ["exec.io"]),
        case!(
            exec_output_streams_while_running,
            [PosixShell],
            [],
            ["exec.stream"]
        ),
        case!(exec_shell_form, [PosixShell], [], ["exec.shell"]),
        case!(
            exec_shell_form_is_unsupported,
            [],
            [PosixShell],
            ["exec.shell"]
        ),
        case!(exec_timeout_kills, [], [], ["exec.timeout"]),
        case!(
            exec_timeout_leaves_no_process,
            [PosixShell],
            [],
            ["exec.timeout.reaped"]
        ),
        case!(
            exec_cancel_kills_process,
            [PosixShell],
            [],
            ["exec.cancel", "general.cancel"]
        ),
        case!(
            exec_concurrent_calls,
            [],
            [],
            ["exec.concurrent", "general.concurrency"]
        ),
        case!(files_binary_round_trip, [], [], ["files.binary"]),
        case!(files_write_creates_parents, [], [], ["files.binary"]),
        case!(files_list_dir, [FsEnumeration], [], ["files.list"]),
        case!(files_stat_kinds, [FsEnumeration], [], ["files.stat"]),
        case!(
            files_make_dir_parents_and_existing,
            [FsEnumeration],
            [],
            ["files.mkdir"]
        ),
        case!(
            files_remove_recursive,
            [FsEnumeration],
            [],
            ["files.remove"]
        ),
        case!(
            files_missing_is_not_found,
            [],
            [],
            ["files.missing", "files.stat", "files.list"]
        ),
        case!(files_bad_paths_are_invalid_request, [], [], ["path"]),
        case!(
            files_stream_round_trip,
            [],
            [],
            ["files.stream", "files.stream.cap"]
        ),
        case!(
            files_reads_take_only_regular_files,
            [PosixShell],
            [],
            ["files.stream.regular"]
        ),
        case!(
            files_tree_is_bounded,
            [FsEnumeration],
            [],
            ["files.tree", "files.tree.caps"]
        ),
        case!(
            delete_then_get_is_not_found,
            [],
            [],
            ["delete.gone", "delete.absent", "get.absent"]
        ),
        case!(connect_running_sandbox, [Reconnect], [], ["connect.token"]),
        case!(
            connect_deleted_is_replaceable,
            [Reconnect],
            [],
            ["connect.gone", "delete.gone"]
        ),
        case!(
            connect_unknown_is_replaceable,
            [Reconnect],
            [],
            ["connect.gone"]
        ),
        case!(
            connect_probe_running_and_deleted,
            [ConnectProbe],
            [],
            ["connect_probe.gone"]
        ),
        case!(keep_alive_running, [KeepAlive], [], ["keep_alive"]),
        case!(terminal_echo_round_trip, [Pty], [], ["terminal.echo"]),
        case!(terminal_resize_is_visible, [Pty], [], ["terminal.resize"]),
        case!(terminal_exit_code, [Pty], [], ["terminal.exit"]),
        case!(
            terminal_close_leaves_no_shell,
            [Pty, PosixShell],
            [],
            ["terminal.close"]
        ),
        case!(
            snapshot_round_trip,
            [Snapshots],
            [],
            ["snapshot.boot", "snapshot.delete_idempotent"]
        ),
        case!(
            snapshot_restore_is_owner_only,
            [Snapshots, Metadata, List],
            [],
            ["create.snapshot_owner", "snapshot.tenant"]
        ),
        case!(
            template_catalog_has_standard,
            [TemplateCatalog],
            [],
            ["template_catalog"]
        ),
    ]
}

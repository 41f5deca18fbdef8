//! Exec: the argv and shell forms, exit codes, stdin, env, cwd, separate and streamed output,
//! timeouts and cancellation (leaving no process behind), and concurrent calls.

use std::time::{Duration, Instant};

use sandbox_core::{ErrorKind, ExecRequest, OutputHook, OutputStream, SandboxHandle};
use tokio::sync::mpsc;

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, expect_kind, preview, within};
use super::{EXEC_LIMIT, exec, scratch, timeout};

pub(super) async fn exec_argv_echo(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let token = ctx.token();
    let r = exec(ctx, &h, ExecRequest::argv("echo", [token.as_str()])).await?;
    ensure_eq("exit code", r.exit_code, 0)?;
    ensure_eq("killed", r.killed, false)?;
    ensure_eq("stdout", r.stdout_lossy(), format!("{token}\n"))?;
    ensure_eq("stderr", r.stderr_lossy(), String::new())
}

pub(super) async fn exec_exit_codes(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_exit_124_and_137_are_not_timeouts(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_stdin_is_delivered(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_env_applies(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_cwd_applies(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_streams_are_kept_apart(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_large_stdout_is_intact(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_output_streams_while_running(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_shell_form(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_shell_form_is_unsupported(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    expect_kind(
        "shell form without posix_shell",
        ctx.provider().exec(&h, ExecRequest::shell("echo hi")).await,
        ErrorKind::Unsupported,
    )
}

pub(super) async fn exec_timeout_kills(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_timeout_leaves_no_process(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_cancel_kills_process(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn exec_concurrent_calls(ctx: &Ctx) -> CaseResult {
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

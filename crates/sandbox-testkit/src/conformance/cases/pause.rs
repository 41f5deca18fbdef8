//! Pausing and resuming (`pause_resume`): a pause keeps the files and the processes, a paused
//! sandbox refuses calls at once with the paused code, a second pause is a conflict, and both
//! a resume and a connect bring it back.

use std::time::Duration;

use sandbox_core::{
    ConnectRequest, Error, ErrorCode, ErrorKind, ExecRequest, PauseResume, ProcessSpec,
    ProcessStatus, SandboxHandle, SandboxId, SandboxState, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, within};
use super::{exec, scratch};

/// A paused sandbox must refuse a call well within this: it never waits for a resume.
const REFUSAL_LIMIT: Duration = Duration::from_secs(30);
const CALL_LIMIT: Duration = Duration::from_secs(60);

fn pauser(ctx: &Ctx) -> Result<&dyn PauseResume, Failure> {
    narrow::pause_resume(ctx.provider())
        .ok_or_else(|| Failure("pause_resume declared but not callable".to_owned()))
}

async fn pause(ctx: &Ctx, h: &SandboxHandle) -> CaseResult {
    Ok(within(CALL_LIMIT, "pause", pauser(ctx)?.pause(h.id())).await??)
}

async fn resume(ctx: &Ctx, h: &SandboxHandle) -> CaseResult {
    Ok(within(CALL_LIMIT, "resume", pauser(ctx)?.resume(h.id())).await??)
}

async fn state(ctx: &Ctx, id: &SandboxId) -> Result<SandboxState, Failure> {
    Ok(ctx.provider().get(id).await?.state)
}

/// An echo of a fresh word through `h` answers it.
async fn echoes(ctx: &Ctx, h: &SandboxHandle, what: &str) -> CaseResult {
    let word = ctx.token();
    let r = exec(ctx, h, ExecRequest::argv("echo", [word.as_str()])).await?;
    ensure_eq(what, r.stdout_lossy(), format!("{word}\n"))
}

fn paused_refusal<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> CaseResult {
    match result {
        Err(e) if e.code() == Some(ErrorCode::SandboxPaused) => Ok(()),
        Err(e) => Err(Failure(format!(
            "{what} on a paused sandbox: expected code session_sandbox_paused, got {e}"
        ))),
        Ok(v) => Err(Failure(format!(
            "{what} on a paused sandbox unexpectedly worked: {v:?}"
        ))),
    }
}

/// `[pause.keeps]`: paused, then running again with the same file bytes and (with
/// `processes`) the same process still running.
pub(super) async fn pause_keeps_files_and_processes(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "kept.bin")?;
    let payload = ctx.bytes(ctx.int(64..=4096) as usize);
    ctx.provider().write_file(&h, &file, &payload).await?;
    let processes = narrow::processes(ctx.provider());
    let pid = match processes {
        Some(p) => {
            let spec = ProcessSpec::argv("sleep", ["300"]);
            Some(
                within(CALL_LIMIT, "start_process", p.start_process(&h, spec))
                    .await??
                    .pid,
            )
        }
        None => None,
    };
    pause(ctx, &h).await?;
    ensure_eq(
        "state after pause",
        state(ctx, h.id()).await?,
        SandboxState::Paused,
    )?;
    resume(ctx, &h).await?;
    ensure_eq(
        "state after resume",
        state(ctx, h.id()).await?,
        SandboxState::Running,
    )?;
    let read = ctx.provider().read_file(&h, &file).await?;
    ensure(read == payload, || {
        format!(
            "the file written before the pause has {} bytes after the resume, not the {} written",
            read.len(),
            payload.len()
        )
    })?;
    if let (Some(p), Some(pid)) = (processes, pid) {
        let all = within(CALL_LIMIT, "list_processes", p.list_processes(&h)).await??;
        let status = all
            .iter()
            .find(|info| info.pid == pid)
            .map(|info| info.status)
            .ok_or_else(|| Failure(format!("pid {pid}, started before the pause, is gone")))?;
        ensure_eq(
            "the process started before the pause",
            status,
            ProcessStatus::Running,
        )?;
    }
    echoes(ctx, &h, "exec after the resume").await
}

/// `[pause.refused]`: exec and file calls on a paused sandbox fail at once with the paused code.
pub(super) async fn paused_sandbox_refuses_calls(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "refused.txt")?;
    ctx.provider().write_file(&h, &file, b"before").await?;
    pause(ctx, &h).await?;
    let ran = within(
        REFUSAL_LIMIT,
        "exec on a paused sandbox",
        ctx.provider()
            .exec(&h, ExecRequest::argv("true", Vec::<String>::new())),
    )
    .await?;
    paused_refusal("exec", ran)?;
    let read = within(
        REFUSAL_LIMIT,
        "read_file on a paused sandbox",
        ctx.provider().read_file(&h, &file),
    )
    .await?;
    paused_refusal("read_file", read)?;
    ensure_eq(
        "state after the refusals",
        state(ctx, h.id()).await?,
        SandboxState::Paused,
    )
}

/// `[pause.twice]`: a second pause is `conflict` with the paused code and the API's message;
/// the sandbox stays paused.
pub(super) async fn pause_twice_is_conflict(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    pause(ctx, &h).await?;
    let second = within(CALL_LIMIT, "second pause", pauser(ctx)?.pause(h.id())).await?;
    match second {
        Err(e) if e.kind() == ErrorKind::Conflict && e.code() == Some(ErrorCode::SandboxPaused) => {
            let expected = format!("sandbox '{}' is already paused", h.id());
            ensure(e.message().contains(&expected), || {
                format!(
                    "the second pause's message {:?} does not say {expected:?}",
                    e.message()
                )
            })?;
        }
        other => {
            return Err(Failure(format!(
                "a second pause: expected conflict with code session_sandbox_paused, got {other:?}"
            )));
        }
    }
    ensure_eq(
        "state after two pauses",
        state(ctx, h.id()).await?,
        SandboxState::Paused,
    )
}

/// `[pause.absent]`: pausing or resuming an unknown or deleted sandbox is `not_found`.
pub(super) async fn pause_absent_is_not_found(ctx: &Ctx) -> CaseResult {
    let p = pauser(ctx)?;
    let unknown = SandboxId::new(format!("conformance-unknown-{}", ctx.token()))?;
    let h = ctx.create().await?;
    ctx.provider().delete(h.id()).await?;
    ctx.untrack(h.id());
    for (what, id) in [("unknown", &unknown), ("deleted", h.id())] {
        for (call, result) in [
            ("pause", within(CALL_LIMIT, "pause", p.pause(id)).await?),
            ("resume", within(CALL_LIMIT, "resume", p.resume(id)).await?),
        ] {
            match result {
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                other => {
                    return Err(Failure(format!(
                        "{call} of an {what} sandbox: expected not_found, got {other:?}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `[resume.running]`: resuming a running sandbox is `Ok` and changes nothing.
pub(super) async fn resume_running_changes_nothing(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "same.bin")?;
    let payload = ctx.bytes(ctx.int(16..=1024) as usize);
    ctx.provider().write_file(&h, &file, &payload).await?;
    resume(ctx, &h).await?;
    ensure_eq(
        "state after resuming a running sandbox",
        state(ctx, h.id()).await?,
        SandboxState::Running,
    )?;
    let read = ctx.provider().read_file(&h, &file).await?;
    ensure(read == payload, || {
        "resuming a running sandbox changed its file".to_owned()
    })?;
    echoes(ctx, &h, "exec after resuming a running sandbox").await
}

/// `[pause.connect]`: a connect resumes a paused sandbox, and its calls work again.
pub(super) async fn connect_resumes_a_paused_sandbox(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    pause(ctx, &h).await?;
    let c = within(
        CALL_LIMIT,
        "connect",
        ctx.provider().connect(ConnectRequest::new(h.id().clone())),
    )
    .await??;
    ensure_eq("connected id", c.id(), h.id())?;
    ensure_eq(
        "state after the connect",
        state(ctx, h.id()).await?,
        SandboxState::Running,
    )?;
    echoes(ctx, &c, "exec after the connect resumed the sandbox").await
}

//! Reconnecting to a sandbox, the combined connect-and-probe, and keep-alive: a sandbox that
//! is gone must be reported as replaceable (`not_found` or `terminal`), never as a transient
//! failure.

use std::time::Duration;

use sandbox_core::{ConnectRequest, Error, ExecRequest, SandboxHandle, SandboxId, Secret, narrow};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq};
use super::exec;

pub(super) async fn connect_running_sandbox(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn connect_deleted_is_replaceable(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn connect_unknown_is_replaceable(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn connect_probe_running_and_deleted(ctx: &Ctx) -> CaseResult {
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

pub(super) async fn keep_alive_running(ctx: &Ctx) -> CaseResult {
    let keep = narrow::keep_alive(ctx.provider())
        .ok_or_else(|| Failure("keep_alive declared but not callable".to_owned()))?;
    let h = ctx.create().await?;
    keep.keep_alive(&h, Duration::from_secs(300)).await?;
    let r = exec(ctx, &h, ExecRequest::argv("true", Vec::<String>::new())).await?;
    ensure_eq("exec after keep-alive", r.exit_code, 0)
}

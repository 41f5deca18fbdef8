//! The cases every adapter runs about its declaration itself: the capability set is the one
//! the adapter's test pins, and each declared capability can be narrowed to and called.

use sandbox_core::narrow;

use super::super::{CaseResult, Ctx, ensure, ensure_eq};

pub(super) async fn declared_capabilities_match(ctx: &Ctx) -> CaseResult {
    ensure_eq("declared capabilities", ctx.caps(), ctx.pinned())
}

pub(super) async fn declared_capabilities_are_callable(ctx: &Ctx) -> CaseResult {
    let p = ctx.provider();
    let caps = ctx.caps();
    let pairs = [
        ("snapshots", caps.snapshots, narrow::snapshots(p).is_some()),
        (
            "template_catalog",
            caps.template_catalog,
            narrow::template_catalog(p).is_some(),
        ),
        ("pty", caps.pty, narrow::terminals(p).is_some()),
        ("desktop", caps.desktop, narrow::desktop(p).is_some()),
        (
            "keep_alive",
            caps.keep_alive,
            narrow::keep_alive(p).is_some(),
        ),
        (
            "connect_probe",
            caps.connect_probe,
            narrow::connect_probe(p).is_some(),
        ),
        ("processes", caps.processes, narrow::processes(p).is_some()),
        (
            "streamed_files",
            caps.streamed_files,
            narrow::streamed_files(p).is_some(),
        ),
        ("watch", caps.watch, narrow::watch(p).is_some()),
        (
            "pause_resume",
            caps.pause_resume,
            narrow::pause_resume(p).is_some(),
        ),
        (
            "template_builds",
            caps.template_builds,
            narrow::template_builds(p).is_some(),
        ),
        (
            "terminal_reattach",
            caps.terminal_reattach,
            narrow::terminal_reattach(p).is_some(),
        ),
    ];
    for (name, declared, callable) in pairs {
        ensure(declared == callable, || {
            format!(
                "capability {name}: declared={declared} but narrowing gives callable={callable}"
            )
        })?;
    }
    Ok(())
}

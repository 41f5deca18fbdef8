//! The provider cases, one file per topic; the table below registers each with the
//! capabilities it needs (or must lack) and the contract tags of the provider port it cites.
//! Each case is a plain async function over the context.

mod connect;
mod declared;
mod exec;
mod files;
mod lifecycle;
mod pause;
mod processes;
mod snapshots;
mod streamed;
mod template_builds;
mod templates;
mod terminal;
mod tunnels;
mod user;
mod watch;

use std::time::Duration;

use sandbox_core::{Capability, ExecRequest, ExecResult, ExecTimeout, SandboxHandle, SandboxPath};

use super::{Case, Ctx, Failure, within};

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

macro_rules! case {
    ($module:ident :: $name:ident, [$($req:ident),*], [$($forbid:ident),*], [$($cite:literal),*]) => {
        Case {
            name: stringify!($name),
            requires: &[$(Capability::$req),*],
            forbids: &[$(Capability::$forbid),*],
            cites: &[$($cite),*],
            run: |ctx| Box::pin($module::$name(ctx)),
        }
    };
}

/// The cases about the declaration itself, which every adapter runs before the others.
pub(super) fn declaration_cases() -> Vec<Case> {
    vec![
        case!(
            declared::declared_capabilities_match,
            [],
            [],
            ["capabilities.static"]
        ),
        case!(
            declared::declared_capabilities_are_callable,
            [],
            [],
            ["capabilities.callable"]
        ),
    ]
}

/// Every provider case but the declaration cases.
pub fn all_cases() -> Vec<Case> {
    vec![
        case!(lifecycle::health_ok, [], [], ["health.ok"]),
        case!(
            lifecycle::create_then_get,
            [],
            [],
            ["create.running", "get.absent"]
        ),
        case!(
            lifecycle::metadata_round_trips,
            [Metadata],
            [],
            ["create.metadata", "get.metadata"]
        ),
        case!(
            lifecycle::list_filters_by_metadata_and_state,
            [Metadata, List],
            [],
            ["list.filter"]
        ),
        case!(
            lifecycle::create_unknown_template_is_invalid_request,
            [],
            [],
            ["create.unknown_template"]
        ),
        case!(
            lifecycle::create_with_volumes_is_unsupported,
            [],
            [Volumes],
            ["create.volumes"]
        ),
        case!(
            lifecycle::create_with_metadata_is_unsupported,
            [],
            [Metadata],
            ["create.metadata"]
        ),
        case!(lifecycle::list_is_unsupported, [], [List], ["list.filter"]),
        case!(
            lifecycle::list_pages_through_a_filter,
            [Metadata, List],
            [],
            ["list.page", "list.page.cursor"]
        ),
        case!(
            user::create_user_runs_what_names_none,
            [DefaultUser],
            [],
            ["create.user"]
        ),
        case!(
            user::create_with_user_is_unsupported,
            [],
            [DefaultUser],
            ["create.user"]
        ),
        case!(
            pause::pause_keeps_files_and_processes,
            [PauseResume],
            [],
            ["pause.keeps"]
        ),
        case!(
            pause::paused_sandbox_refuses_calls,
            [PauseResume],
            [],
            ["pause.refused"]
        ),
        case!(
            pause::pause_twice_is_conflict,
            [PauseResume],
            [],
            ["pause.twice"]
        ),
        case!(
            pause::pause_absent_is_not_found,
            [PauseResume],
            [],
            ["pause.absent"]
        ),
        case!(
            pause::resume_running_changes_nothing,
            [PauseResume],
            [],
            ["resume.running"]
        ),
        case!(
            pause::connect_resumes_a_paused_sandbox,
            [PauseResume, Reconnect],
            [],
            ["pause.connect"]
        ),
        case!(exec::exec_argv_echo, [], [], ["exec.argv", "exec.io"]),
        case!(exec::exec_exit_codes, [], [], ["exec.io"]),
        case!(
            exec::exec_exit_124_and_137_are_not_timeouts,
            [],
            [],
            ["exec.timeout"]
        ),
        case!(exec::exec_stdin_is_delivered, [], [], ["exec.io"]),
        case!(exec::exec_env_applies, [], [], ["exec.io"]),
        case!(exec::exec_cwd_applies, [], [], ["exec.io"]),
        case!(exec::exec_streams_are_kept_apart, [], [], ["exec.io"]),
        case!(exec::exec_large_stdout_is_intact, [], [], ["exec.io"]),
        case!(
            exec::exec_output_streams_while_running,
            [PosixShell],
            [],
            ["exec.stream"]
        ),
        case!(exec::exec_shell_form, [PosixShell], [], ["exec.shell"]),
        case!(
            exec::exec_shell_form_is_unsupported,
            [],
            [PosixShell],
            ["exec.shell"]
        ),
        case!(exec::exec_timeout_kills, [], [], ["exec.timeout"]),
        case!(
            exec::exec_timeout_leaves_no_process,
            [PosixShell],
            [],
            ["exec.timeout.reaped"]
        ),
        case!(
            exec::exec_cancel_kills_process,
            [PosixShell],
            [],
            ["exec.cancel", "general.cancel"]
        ),
        case!(
            exec::exec_concurrent_calls,
            [],
            [],
            ["exec.concurrent", "general.concurrency"]
        ),
        case!(files::files_binary_round_trip, [], [], ["files.binary"]),
        case!(files::files_write_creates_parents, [], [], ["files.binary"]),
        case!(files::files_list_dir, [FsEnumeration], [], ["files.list"]),
        case!(files::files_stat_kinds, [FsEnumeration], [], ["files.stat"]),
        case!(
            files::files_make_dir_parents_and_existing,
            [FsEnumeration],
            [],
            ["files.mkdir"]
        ),
        case!(
            files::files_remove_recursive,
            [FsEnumeration],
            [],
            ["files.remove"]
        ),
        case!(
            files::files_missing_is_not_found,
            [],
            [],
            ["files.missing", "files.stat", "files.list"]
        ),
        case!(
            files::files_bad_paths_are_invalid_request,
            [],
            [],
            ["files.path"]
        ),
        case!(
            files::files_stream_round_trip,
            [],
            [],
            ["files.stream", "files.stream.cap"]
        ),
        case!(
            files::files_reads_take_only_regular_files,
            [PosixShell],
            [],
            ["files.stream.regular"]
        ),
        case!(
            files::files_tree_is_bounded,
            [FsEnumeration],
            [],
            ["files.tree", "files.tree.caps"]
        ),
        case!(
            lifecycle::delete_then_get_is_not_found,
            [],
            [],
            ["delete.gone", "delete.absent", "get.absent"]
        ),
        case!(
            connect::connect_running_sandbox,
            [Reconnect],
            [],
            ["connect.token"]
        ),
        case!(
            connect::connect_deleted_is_replaceable,
            [Reconnect],
            [],
            ["connect.gone", "delete.gone"]
        ),
        case!(
            connect::connect_unknown_is_replaceable,
            [Reconnect],
            [],
            ["connect.gone"]
        ),
        case!(
            connect::connect_probe_running_and_deleted,
            [ConnectProbe],
            [],
            ["connect_probe.gone"]
        ),
        case!(
            connect::keep_alive_running,
            [KeepAlive],
            [],
            ["keep_alive.running"]
        ),
        case!(
            terminal::terminal_echo_round_trip,
            [Pty],
            [],
            ["terminal.echo"]
        ),
        case!(
            terminal::terminal_resize_is_visible,
            [Pty],
            [],
            ["terminal.resize"]
        ),
        case!(terminal::terminal_exit_code, [Pty], [], ["terminal.exit"]),
        case!(
            terminal::terminal_close_leaves_no_shell,
            [Pty, PosixShell],
            [],
            ["terminal.close"]
        ),
        case!(
            terminal::terminal_options_are_honoured,
            [Pty, PosixShell],
            [],
            ["terminal.options"]
        ),
        case!(
            terminal::terminal_reattach_keeps_the_shell,
            [Pty, PosixShell, TerminalReattach],
            [],
            ["terminal.reattach"]
        ),
        case!(
            terminal::terminal_reattach_unknown_pid,
            [Pty, PosixShell, TerminalReattach],
            [],
            ["terminal.reattach.unknown"]
        ),
        case!(
            terminal::terminal_detach_timeout_kills,
            [Pty, PosixShell, TerminalReattach],
            [],
            ["terminal.detach_timeout"]
        ),
        case!(
            snapshots::snapshot_round_trip,
            [Snapshots],
            [],
            ["snapshot.boot", "snapshot.delete_idempotent"]
        ),
        case!(
            snapshots::snapshot_restore_is_owner_only,
            [Snapshots, Metadata, List],
            [],
            ["create.snapshot_owner", "snapshot.tenant"]
        ),
        case!(
            template_builds::template_build_boots_for_its_tenant_only,
            [TemplateBuilds, Metadata, List],
            [],
            ["template_builds.boot", "template_builds.owner"]
        ),
        case!(
            template_builds::template_tags_move_and_deletes_are_idempotent,
            [TemplateBuilds],
            [],
            [
                "template_builds.local",
                "template_builds.tags",
                "template_builds.delete_idempotent"
            ]
        ),
        case!(
            templates::template_catalog_has_standard,
            [TemplateCatalog],
            [],
            ["template_catalog.standard"]
        ),
        case!(
            processes::process_output_replays_exactly,
            [Processes],
            [],
            ["process.start", "process.attach", "process.list"]
        ),
        case!(
            processes::process_tag_and_signal,
            [Processes],
            [],
            ["process.tag", "process.signal", "process.list"]
        ),
        case!(
            processes::process_replay_marks_the_gap,
            [Processes],
            [],
            ["process.replay"]
        ),
        case!(
            processes::process_input_and_close_stdin,
            [Processes],
            [],
            ["process.input"]
        ),
        case!(
            processes::process_cap_is_enforced,
            [Processes],
            [],
            ["process.cap"]
        ),
        case!(
            streamed::streamed_round_trip,
            [StreamedFiles],
            [],
            ["streamed.read", "streamed.write"]
        ),
        case!(
            streamed::streamed_write_is_atomic,
            [StreamedFiles],
            [],
            ["streamed.write.atomic"]
        ),
        case!(
            streamed::streamed_rename,
            [StreamedFiles],
            [],
            ["streamed.rename"]
        ),
        case!(
            watch::watch_sees_changes_after_return,
            [Watch, FsEnumeration],
            [],
            ["watch.armed"]
        ),
        case!(
            watch::watch_recursive_flag,
            [Watch, FsEnumeration],
            [],
            ["watch.recursive"]
        ),
        case!(watch::watch_needs_a_directory, [Watch], [], ["watch.dir"]),
        case!(
            tunnels::tunnel_carries_bytes_both_ways,
            [Tunnels, Processes],
            [],
            ["tunnel.bytes"]
        ),
        case!(
            tunnels::tunnel_to_a_closed_port_is_refused,
            [Tunnels],
            [],
            ["tunnel.closed"]
        ),
        case!(
            tunnels::tunnel_to_port_zero_is_invalid,
            [Tunnels],
            [],
            ["tunnel.port"]
        ),
        case!(
            tunnels::tunnel_cap_is_enforced,
            [Tunnels, Processes],
            [],
            ["tunnel.cap"]
        ),
    ]
}

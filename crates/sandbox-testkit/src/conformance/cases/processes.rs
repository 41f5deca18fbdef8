//! Background processes: start with a tag, list, attach with replay, input, signals. Every
//! program is in the portable argv vocabulary (`cat`, `env`, `pwd`, `sleep`), so the cases run
//! on the fake and on real userlands alike.

use std::time::{Duration, Instant};

use sandbox_core::{
    ErrorCode, ErrorKind, ProcessEvent, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStatus,
    ProcessStream, ProcessTag, Processes, SandboxHandle, Signal, narrow,
};

use super::super::{CaseResult, Ctx, Failure, ensure, ensure_eq, preview, within};
use super::scratch;

const CALL_LIMIT: Duration = Duration::from_secs(60);

fn processes(ctx: &Ctx) -> Result<&dyn Processes, Failure> {
    narrow::processes(ctx.provider())
        .ok_or_else(|| Failure("processes declared but not callable".to_owned()))
}

fn tag(ctx: &Ctx) -> Result<ProcessTag, Failure> {
    ProcessTag::new(format!("job-{}", ctx.token())).map_err(Failure::from)
}

async fn start(ctx: &Ctx, h: &SandboxHandle, spec: ProcessSpec) -> Result<ProcessInfo, Failure> {
    let p = processes(ctx)?;
    Ok(within(CALL_LIMIT, "start_process", p.start_process(h, spec)).await??)
}

async fn attach(
    ctx: &Ctx,
    h: &SandboxHandle,
    target: &ProcessSelector,
    from: Option<u64>,
) -> Result<ProcessStream, Failure> {
    let p = processes(ctx)?;
    Ok(within(
        CALL_LIMIT,
        "attach_process",
        p.attach_process(h, target, from),
    )
    .await??)
}

/// What an attach yielded until it ended: the bytes, the gaps, the final status.
#[derive(Debug, Default)]
struct Drained {
    bytes: Vec<u8>,
    /// Where the first `Data` started.
    first_offset: Option<u64>,
    gaps: Vec<(u64, u64)>,
    exited: Option<ProcessStatus>,
}

/// Reads an attach to its end (at most 60 s), checking that `Data` offsets are contiguous.
async fn drain(mut stream: ProcessStream) -> Result<Drained, Failure> {
    let mut out = Drained::default();
    let mut next: Option<u64> = None;
    let deadline = Instant::now() + CALL_LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, stream.next_event())
            .await
            .map_err(|_| {
                Failure(format!(
                    "the attach did not end within 60s; got {}",
                    preview(&out.bytes)
                ))
            })?;
        match event {
            Some(ProcessEvent::Data { offset, data, .. }) => {
                ensure(!data.is_empty(), || "an empty Data event".to_owned())?;
                if let Some(expected) = next {
                    ensure_eq("offset of the next Data", offset, expected)?;
                }
                out.first_offset.get_or_insert(offset);
                next = Some(offset + data.len() as u64);
                out.bytes.extend_from_slice(&data);
            }
            Some(ProcessEvent::Gap { from, to }) => {
                ensure(from < to, || format!("an empty gap {from}..{to}"))?;
                if let Some(expected) = next {
                    ensure_eq("start of the gap", from, expected)?;
                }
                out.gaps.push((from, to));
                next = Some(to);
            }
            Some(ProcessEvent::Exited(status)) => {
                out.exited = Some(status);
                ensure(stream.next_event().await.is_none(), || {
                    "the attach went on after Exited".to_owned()
                })?;
                return Ok(out);
            }
            Some(ProcessEvent::Failed(e)) => {
                return Err(Failure(format!("the attach failed: {e}")));
            }
            None => return Err(Failure("the attach ended without Exited".to_owned())),
        }
    }
}

/// Reads an attach until `needle` appears in its output.
async fn read_until(stream: &mut ProcessStream, needle: &[u8]) -> Result<(), Failure> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.windows(needle.len()).any(|w| w == needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next_event()).await {
            Ok(Some(ProcessEvent::Data { data, .. })) => seen.extend_from_slice(&data),
            Ok(Some(ProcessEvent::Gap { .. })) => {}
            Ok(other) => {
                return Err(Failure(format!(
                    "the attach ended before {}: {other:?}",
                    preview(needle)
                )));
            }
            Err(_) => {
                return Err(Failure(format!(
                    "{} not seen within 30s; got {}",
                    preview(needle),
                    preview(&seen)
                )));
            }
        }
    }
    Ok(())
}

/// The listed entry of `pid`.
async fn listed(ctx: &Ctx, h: &SandboxHandle, pid: u32) -> Result<ProcessInfo, Failure> {
    let p = processes(ctx)?;
    let all = within(CALL_LIMIT, "list_processes", p.list_processes(h)).await??;
    all.into_iter()
        .find(|info| info.pid == pid)
        .ok_or_else(|| Failure(format!("pid {pid} is not listed")))
}

fn expect_code<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, sandbox_core::Error>,
    kind: ErrorKind,
    code: ErrorCode,
) -> CaseResult {
    match result {
        Err(e) if e.kind() == kind && e.code() == Some(code) => Ok(()),
        Err(e) => Err(Failure(format!(
            "{what}: expected {kind} with code {code}, got {e}"
        ))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected {kind} with code {code}, got success: {v:?}"
        ))),
    }
}

/// A process's whole output replays exactly from offset 0, before and after it ended; env and
/// cwd apply; the listing shows the exit status.
pub(super) async fn process_output_replays_exactly(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let file = scratch(ctx, "out.bin")?;
    let payload = ctx.bytes(ctx.int(4096..=32_768) as usize);
    ctx.provider().write_file(&h, &file, &payload).await?;
    let tag = tag(ctx)?;
    let info = start(
        ctx,
        &h,
        ProcessSpec::argv("cat", [file.as_str()]).tagged(tag.clone()),
    )
    .await?;
    ensure_eq("tag of the started process", info.tag.as_ref(), Some(&tag))?;
    ensure_eq(
        "argv of the started process",
        info.argv.clone(),
        vec!["cat".to_owned(), file.as_str().to_owned()],
    )?;
    ensure(info.ring_bytes >= 64 * 1024, || {
        format!("a replay ring of {} bytes, under 64 KiB", info.ring_bytes)
    })?;
    let out = drain(attach(ctx, &h, &ProcessSelector::Pid(info.pid), Some(0)).await?).await?;
    ensure(out.gaps.is_empty(), || format!("gaps {:?}", out.gaps))?;
    ensure_eq("first offset", out.first_offset, Some(0))?;
    ensure(out.bytes == payload, || {
        format!(
            "replayed {} bytes, not the {} the process wrote",
            out.bytes.len(),
            payload.len()
        )
    })?;
    let exit_code = match out.exited {
        Some(ProcessStatus::Exited { exit_code, .. }) => exit_code,
        other => return Err(Failure(format!("the attach ended with {other:?}"))),
    };
    ensure_eq("exit code of cat", exit_code, Some(0))?;
    // Ended: listed with its status, and still replayable, by its tag too.
    let listed = listed(ctx, &h, info.pid).await?;
    ensure_eq(
        "listed status",
        listed.status,
        ProcessStatus::Exited {
            exit_code: Some(0),
            signal: None,
        },
    )?;
    ensure_eq(
        "listed output bytes",
        listed.output_bytes,
        payload.len() as u64,
    )?;
    let again = drain(attach(ctx, &h, &ProcessSelector::Tag(tag), Some(0)).await?).await?;
    ensure(again.bytes == payload, || {
        format!("the second replay gave {} bytes", again.bytes.len())
    })?;

    // env and cwd apply.
    let (key, value) = (format!("K_{}", ctx.token()), ctx.token());
    let mut env_spec = ProcessSpec::argv("env", Vec::<String>::new());
    env_spec.env.insert(key.clone(), value.clone());
    let env_pid = start(ctx, &h, env_spec).await?.pid;
    let env_out = drain(attach(ctx, &h, &ProcessSelector::Pid(env_pid), Some(0)).await?).await?;
    let needle = format!("{key}={value}\n");
    ensure(
        String::from_utf8_lossy(&env_out.bytes).contains(&needle),
        || format!("{needle:?} not in {}", preview(&env_out.bytes)),
    )?;
    let dir = file
        .parent()
        .ok_or_else(|| Failure("scratch file has no parent".to_owned()))?;
    let mut pwd_spec = ProcessSpec::argv("pwd", Vec::<String>::new());
    pwd_spec.cwd = Some(dir.clone());
    let pwd_pid = start(ctx, &h, pwd_spec).await?.pid;
    let pwd_out = drain(attach(ctx, &h, &ProcessSelector::Pid(pwd_pid), Some(0)).await?).await?;
    ensure_eq(
        "pwd in the requested cwd",
        String::from_utf8_lossy(&pwd_out.bytes).into_owned(),
        format!("{dir}\n"),
    )
}

/// A tag is unique among running processes and selects like the pid; KILL ends a process,
/// which is then listed without an exit code; unknown pids and tags are `process_not_found`.
pub(super) async fn process_tag_and_signal(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let p = processes(ctx)?;
    let tag = tag(ctx)?;
    let info = start(
        ctx,
        &h,
        ProcessSpec::argv("sleep", ["300"]).tagged(tag.clone()),
    )
    .await?;
    ensure(info.pid > 0, || "pid 0".to_owned())?;
    ensure_eq("status at start", info.status, ProcessStatus::Running)?;
    expect_code(
        "a second start with a running process's tag",
        p.start_process(&h, ProcessSpec::argv("sleep", ["300"]).tagged(tag.clone()))
            .await,
        ErrorKind::Conflict,
        ErrorCode::ProcessTagInUse,
    )?;
    ensure_eq(
        "listed while running",
        listed(ctx, &h, info.pid).await?.status,
        ProcessStatus::Running,
    )?;
    let by_tag = ProcessSelector::Tag(tag.clone());
    within(
        CALL_LIMIT,
        "signal_process",
        p.signal_process(&h, &by_tag, Signal::Kill),
    )
    .await??;
    // The kill is asynchronous on a real backend: wait for the listing to say so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = listed(ctx, &h, info.pid).await?.status;
        if !status.is_running() || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    match status {
        ProcessStatus::Exited {
            exit_code: None, ..
        } => {}
        other => {
            return Err(Failure(format!(
                "after KILL the process is listed as {other:?}"
            )));
        }
    }
    expect_code(
        "a signal for an ended process",
        p.signal_process(&h, &ProcessSelector::Pid(info.pid), Signal::Term)
            .await,
        ErrorKind::Conflict,
        ErrorCode::ProcessExited,
    )?;
    // The tag is free once its holder ended.
    let second = start(
        ctx,
        &h,
        ProcessSpec::argv("sleep", ["300"]).tagged(tag.clone()),
    )
    .await?;
    ensure(second.pid != info.pid, || "the pid was reused".to_owned())?;
    within(
        CALL_LIMIT,
        "signal_process",
        p.signal_process(&h, &by_tag, Signal::Kill),
    )
    .await??;
    let unknown_tag = ProcessSelector::Tag(ProcessTag::new(format!("nope-{}", ctx.token()))?);
    expect_code(
        "attach to an unknown tag",
        p.attach_process(&h, &unknown_tag, None).await,
        ErrorKind::NotFound,
        ErrorCode::ProcessNotFound,
    )?;
    expect_code(
        "a signal for an unknown pid",
        p.signal_process(&h, &ProcessSelector::Pid(3_999_999), Signal::Term)
            .await,
        ErrorKind::NotFound,
        ErrorCode::ProcessNotFound,
    )
}

/// Output older than the ring is a marked gap, then the ring's bytes exactly; an offset past
/// the output is `invalid_offset`.
pub(super) async fn process_replay_marks_the_gap(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let probe = start(ctx, &h, ProcessSpec::argv("sleep", ["300"])).await?;
    let p = processes(ctx)?;
    p.signal_process(&h, &ProcessSelector::Pid(probe.pid), Signal::Kill)
        .await?;
    let ring = probe.ring_bytes;
    ensure(ring <= 16 << 20, || {
        format!("a replay ring of {ring} bytes is too large for this case to overflow")
    })?;
    let file = scratch(ctx, "big.bin")?;
    let extra = u64::from(ctx.int(10_000..=50_000));
    let payload = ctx.bytes(usize::try_from(ring + extra).unwrap_or(usize::MAX));
    ctx.provider().write_file(&h, &file, &payload).await?;
    let info = start(ctx, &h, ProcessSpec::argv("cat", [file.as_str()])).await?;
    let target = ProcessSelector::Pid(info.pid);
    // Wait for the end (attached from now, so nothing is replayed on the way).
    drain(attach(ctx, &h, &target, None).await?).await?;
    let out = drain(attach(ctx, &h, &target, Some(0)).await?).await?;
    let Some(&(from, to)) = out.gaps.first() else {
        return Err(Failure(format!(
            "replaying {} bytes through a {ring}-byte ring from 0 gave no gap",
            payload.len()
        )));
    };
    ensure_eq("gaps", out.gaps.len(), 1)?;
    ensure_eq("gap start", from, 0)?;
    ensure(to >= extra, || {
        format!("the gap ends at {to}, but {extra} bytes cannot be in the ring")
    })?;
    let rest = &payload[usize::try_from(to).unwrap_or(usize::MAX).min(payload.len())..];
    ensure(out.bytes == rest, || {
        format!(
            "after the gap to {to}: {} bytes, not the {} that followed",
            out.bytes.len(),
            rest.len()
        )
    })?;
    expect_code(
        "an offset past the output",
        p.attach_process(&h, &target, Some(payload.len() as u64 + 1))
            .await,
        ErrorKind::InvalidRequest,
        ErrorCode::InvalidOffset,
    )
}

/// The most starts this case tries before it calls the cap missing (an adapter's test config
/// sets a small cap, so the case stays cheap).
const CAP_SEARCH: usize = 512;

/// Starts are refused with `process_limit` once the sandbox runs its cap, starting nothing;
/// after one of them is killed a start succeeds again.
pub(super) async fn process_cap_is_enforced(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let p = processes(ctx)?;
    let sleeper = || ProcessSpec::argv("sleep", ["300"]);
    let mut started: Vec<u32> = Vec::new();
    let refusal = loop {
        ensure(started.len() < CAP_SEARCH, || {
            format!("{CAP_SEARCH} processes started and no start was refused")
        })?;
        match within(CALL_LIMIT, "start_process", p.start_process(&h, sleeper())).await? {
            Ok(info) => started.push(info.pid),
            Err(e) => break e,
        }
    };
    ensure(!started.is_empty(), || {
        format!("the first start was refused: {refusal}")
    })?;
    expect_code(
        "a start past the cap",
        Err::<(), _>(refusal),
        ErrorKind::Capacity,
        ErrorCode::ProcessLimit,
    )?;
    // The refused start started nothing: exactly the ones that were started run.
    let running: Vec<u32> = within(CALL_LIMIT, "list_processes", p.list_processes(&h))
        .await??
        .into_iter()
        .filter(|info| info.status.is_running())
        .map(|info| info.pid)
        .collect();
    ensure_eq("running processes at the cap", running.len(), started.len())?;
    ensure(started.iter().all(|pid| running.contains(pid)), || {
        format!("started {started:?}, running {running:?}")
    })?;
    // Once one ended (a kill is asynchronous on a real backend), a start succeeds again.
    let first = ProcessSelector::Pid(started[0]);
    within(
        CALL_LIMIT,
        "signal_process",
        p.signal_process(&h, &first, Signal::Kill),
    )
    .await??;
    let deadline = Instant::now() + Duration::from_secs(30);
    let replacement = loop {
        match within(CALL_LIMIT, "start_process", p.start_process(&h, sleeper())).await? {
            Ok(info) => break info,
            Err(e) if e.code() == Some(ErrorCode::ProcessLimit) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                return Err(Failure(format!(
                    "a start after one of the {} processes was killed: {e}",
                    started.len()
                )));
            }
        }
    };
    ensure_eq(
        "status of the new start",
        replacement.status,
        ProcessStatus::Running,
    )?;
    started.push(replacement.pid);
    for pid in started.into_iter().skip(1) {
        let _ = p
            .signal_process(&h, &ProcessSelector::Pid(pid), Signal::Kill)
            .await;
    }
    Ok(())
}

/// Input reaches stdin in order; closing stdin ends `cat`; input then is refused with a code.
pub(super) async fn process_input_and_close_stdin(ctx: &Ctx) -> CaseResult {
    let h = ctx.create().await?;
    let p = processes(ctx)?;
    let info = start(
        ctx,
        &h,
        ProcessSpec::argv("cat", Vec::<String>::new()).with_stdin(),
    )
    .await?;
    let target = ProcessSelector::Pid(info.pid);
    let mut stream = attach(ctx, &h, &target, Some(0)).await?;
    let (a, b) = (ctx.token(), ctx.token());
    p.send_input(&h, &target, format!("{a}\n").as_bytes())
        .await?;
    read_until(&mut stream, a.as_bytes()).await?;
    p.send_input(&h, &target, format!("{b}\n").as_bytes())
        .await?;
    read_until(&mut stream, b.as_bytes()).await?;
    p.close_stdin(&h, &target).await?;
    let rest = drain(stream).await?;
    match rest.exited {
        Some(ProcessStatus::Exited {
            exit_code: Some(0), ..
        }) => {}
        other => {
            return Err(Failure(format!(
                "cat after its stdin closed ended with {other:?}"
            )));
        }
    }
    expect_code(
        "input for an ended process",
        p.send_input(&h, &target, b"late\n").await,
        ErrorKind::Conflict,
        ErrorCode::ProcessExited,
    )?;
    // Started without stdin: input is refused while it runs.
    let sleeper = start(ctx, &h, ProcessSpec::argv("sleep", ["300"])).await?;
    let sleeper = ProcessSelector::Pid(sleeper.pid);
    expect_code(
        "input for a process without stdin",
        p.send_input(&h, &sleeper, b"x\n").await,
        ErrorKind::Conflict,
        ErrorCode::StdinClosed,
    )?;
    p.signal_process(&h, &sleeper, Signal::Kill).await?;
    Ok(())
}

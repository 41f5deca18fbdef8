//! Agent mode's commands and terminals through the kept channel, on the real engine: the
//! provider's `exec` and `open_terminal` reach the agent as `Start` calls, with exec mode's
//! semantics (timeout, cancellation, stdin, env, cwd, user, exit statuses), and no exec-create
//! per command: the provider's engine client talks through the counting proxy of
//! `channel.rs`, so every `POST /containers/{id}/exec` is seen.
//!
//! They need the engine, the `sandbox-busybox:test` image (no bash, no `/etc/passwd`: the
//! agent's built-in root serves it) and the static agent (`SANDBOX_AGENT_BIN`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::time::{Duration, Instant};

use bollard::query_parameters::RemoveContainerOptions;
use sandbox_core::{
    ConnectRequest, CreateRequest, ErrorCode, ErrorKind, ExecRequest, ExecTimeout, ListFilter,
    SandboxHandle, SandboxPath, SandboxProvider, Secret, TemplateId, TerminalEvent,
    TerminalOptions, TerminalSize, Terminals,
};
use sandbox_provider_docker::{DataPlane, DockerConfig, DockerProvider};

use crate::channel::{CountingProxy, agent_binary};
use crate::support::{IMAGE, config, namespace};

fn agent_config(ns: &str, proxy: &CountingProxy) -> DockerConfig {
    let mut c = config(ns);
    c.data_plane = DataPlane::Agent;
    c.agent_path = Some(agent_binary());
    c.host = Some(format!("unix://{}", proxy.path.display()));
    c
}

/// A provider in agent mode whose engine client goes through a fresh counting proxy, and a
/// sandbox it created.
async fn agent_sandbox(
    tag: &str,
) -> (
    CountingProxy,
    sandbox_core::Checked<DockerProvider>,
    SandboxHandle,
) {
    let proxy = CountingProxy::start().await;
    let p = DockerProvider::connect(agent_config(&namespace(tag), &proxy))
        .await
        .expect("connect in agent mode");
    let mut create = CreateRequest::new(TemplateId::new(IMAGE).unwrap());
    create
        .env
        .insert("SBX_SANDBOX_ENV".to_owned(), "from create".to_owned());
    let h = p.create(create).await.unwrap();
    (proxy, p, h)
}

async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

fn secs(n: u64) -> ExecTimeout {
    ExecTimeout::new(Duration::from_secs(n)).unwrap()
}

async fn sh(p: &DockerProvider, h: &SandboxHandle, script: &str) -> String {
    let r = p.exec(h, ExecRequest::shell(script)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{script}: {}", r.stderr_lossy());
    r.stdout_lossy().trim().to_owned()
}

/// How many processes have `needle` in their command line (the pattern's first character in
/// brackets keeps the scanning shell from matching itself).
async fn processes(p: &DockerProvider, h: &SandboxHandle, needle: &str) -> usize {
    let (first, rest) = needle.split_at(1);
    let script = format!(
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < \"$f\" 2>/dev/null; echo; done | grep -c '[{first}]{rest}' || true"
    );
    sh(p, h, &script).await.parse().unwrap()
}

async fn wait_gone(p: &DockerProvider, h: &SandboxHandle, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = processes(p, h, needle).await;
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{n} {needle:?} still running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_hundred_execs_make_one_exec_create_the_channels() {
    let (proxy, p, h) = agent_sandbox("axc").await;
    // The first command opens the channel: its exec (another one if the agent had not bound
    // its socket yet), and nothing else.
    let r = p
        .exec(&h, ExecRequest::argv("true", Vec::<String>::new()))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    let channel = p.channel(h.id().as_str()).unwrap();
    let opened = proxy.exec_creates();
    assert!(opened >= 1, "the channel is an exec");
    for i in 0..100 {
        let r = p
            .exec(&h, ExecRequest::argv("echo", [format!("n{i}")]))
            .await
            .unwrap();
        assert_eq!(
            (r.stdout_lossy().as_str(), r.exit_code),
            (&*format!("n{i}\n"), 0)
        );
    }
    // Concurrent ones share it too.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (p, h) = (p.clone(), h.clone());
        tasks.spawn(async move {
            let r = p
                .exec(&h, ExecRequest::shell(format!("echo c{i} | cat")))
                .await;
            (i, r.unwrap())
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, r) = done.unwrap();
        assert_eq!(r.stdout_lossy(), format!("c{i}\n"));
    }
    assert_eq!(
        proxy.exec_creates(),
        opened,
        "120 commands made no exec-create: only the channel's"
    );
    assert!(channel.is_open().await);
    assert_eq!(
        channel.execs_opened(),
        opened as u64,
        "every exec-create was the channel's"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn stdin_env_cwd_user_and_exit_statuses_are_exec_modes() {
    let (proxy, p, h) = agent_sandbox("axs").await;
    // Stdin, larger than one input message, comes back whole; an empty one is end of file.
    let payload: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 251) as u8).collect();
    let r = p
        .exec(
            &h,
            ExecRequest::argv("cat", Vec::<String>::new()).stdin(payload.clone()),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0);
    assert!(r.stdout == payload, "3 MiB of stdin came back altered");
    // A reader that starts late: the agent's stdin buffer (1 MiB) fills and refuses more until
    // the process reads; that is back-pressure, and every byte still arrives, then end of file.
    let r = p
        .exec(
            &h,
            ExecRequest::argv("sh", ["-c", "sleep 1; cat"]).stdin(payload.clone()),
        )
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.killed), (0, false), "{}", r.stderr_lossy());
    assert!(r.stdout == payload, "late-read stdin came back altered");
    let r = p
        .exec(&h, ExecRequest::argv("wc", ["-c"]).stdin(Vec::new()))
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy().trim(), "0");
    // Without stdin, a reader sees end of file at once.
    let r = p
        .exec(&h, ExecRequest::argv("cat", Vec::<String>::new()))
        .await
        .unwrap();
    assert_eq!((r.stdout.len(), r.exit_code), (0, 0));
    // Env additions; the default directory is the workspace root, as in exec mode.
    let r = p
        .exec(
            &h,
            ExecRequest::shell("echo \"$SBX_A|$HOME|$SBX_SANDBOX_ENV\"; pwd").env("SBX_A", "x y"),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy(), "x y|/|from create\n/workspace\n");
    let r = p
        .exec(
            &h,
            ExecRequest::argv("pwd", Vec::<String>::new()).cwd(SandboxPath::new("/proc").unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(r.stdout_lossy(), "/proc\n");
    // Another account, once the image has one.
    sh(
        &p,
        &h,
        "printf 'root:x:0:0:root:/root:/bin/sh\\nsbx:x:1234:1234:sbx:/workspace:/bin/sh\\n' > /etc/passwd; \
         printf 'root:x:0:\\nsbx:x:1234:\\n' > /etc/group",
    )
    .await;
    let mut as_sbx = ExecRequest::shell("id -u; echo $HOME");
    as_sbx.user = Some("sbx".to_owned());
    let r = p.exec(&h, as_sbx).await.unwrap();
    assert_eq!(r.stdout_lossy(), "1234\n/workspace\n");
    assert_eq!(sh(&p, &h, "id -u").await, "0");
    // Streams kept apart; exit statuses as exec mode reports them.
    let r = p
        .exec(&h, ExecRequest::shell("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(
        (r.stdout_lossy().as_str(), r.stderr_lossy().as_str()),
        ("out\n", "err\n")
    );
    assert_eq!((r.exit_code, r.killed), (3, false));
    let r = p.exec(&h, ExecRequest::shell("exit 137")).await.unwrap();
    assert_eq!((r.exit_code, r.killed), (137, false));
    let r = p.exec(&h, ExecRequest::shell("kill -9 $$")).await.unwrap();
    assert_eq!((r.exit_code, r.killed), (137, false), "a signal is 128 + n");
    // A program that cannot be started is the shell's 127, with its words on stderr.
    let r = p
        .exec(&h, ExecRequest::argv("no-such-program-x", ["a"]))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 127, "{r:?}");
    assert!(r.stderr_lossy().contains("no-such-program-x"), "{r:?}");
    // A missing working directory is an error, as the engine's is in exec mode.
    let missing = p
        .exec(
            &h,
            ExecRequest::argv("pwd", Vec::<String>::new())
                .cwd(SandboxPath::new("/no/such/dir").unwrap()),
        )
        .await;
    assert!(missing.is_err(), "{missing:?}");
    // Output past the cap is dropped and flagged.
    let mut small = agent_config(&namespace("axo"), &proxy);
    small.max_output_bytes = 1000;
    let capped = DockerProvider::connect(small).await.unwrap();
    let r = capped
        .exec(&h, ExecRequest::shell("head -c 5000 /dev/zero"))
        .await
        .unwrap();
    assert_eq!((r.stdout.len(), r.truncated, r.exit_code), (1000, true, 0));
    // One channel per provider (each holds its own), nothing per command.
    assert_eq!(
        p.channel(h.id().as_str()).unwrap().execs_opened()
            + capped.channel(h.id().as_str()).unwrap().execs_opened(),
        proxy.exec_creates() as u64
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_timeout_kills_and_a_dropped_exec_kills_its_process() {
    let (_proxy, p, h) = agent_sandbox("axt").await;
    // The timeout: exec mode's result, with the output seen before it.
    let started = Instant::now();
    let r = p
        .exec(
            &h,
            ExecRequest::shell("echo before; sleep 3131 & sleep 3132").timeout(secs(1)),
        )
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(r.killed, "{r:?}");
    assert_eq!((r.exit_code, r.stdout_lossy().as_str()), (-1, "before\n"));
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The whole group went: the command and its background job.
    wait_gone(&p, &h, "sleep 3131").await;
    wait_gone(&p, &h, "sleep 3132").await;
    // A caller that goes away takes its process with it.
    let dropped = tokio::time::timeout(
        Duration::from_secs(1),
        p.exec(&h, ExecRequest::argv("sleep", ["4242"])),
    )
    .await;
    assert!(
        dropped.is_err(),
        "the sleep returned before the caller went away"
    );
    wait_gone(&p, &h, "sleep 4242").await;
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_paused_sandbox_is_reported_paused_and_a_removed_one_gone() {
    let (_proxy, p, h) = agent_sandbox("axg").await;
    let id = h.id().as_str().to_owned();
    assert_eq!(sh(&p, &h, "echo up").await, "up");
    // Paused with the channel open and fresh: the agent cannot answer, and the call says why
    // instead of waiting out its budget.
    p.docker().pause_container(&id).await.unwrap();
    let started = Instant::now();
    let err = p
        .exec(
            &h,
            ExecRequest::argv("true", Vec::<String>::new()).timeout(secs(60)),
        )
        .await
        .expect_err("an exec in a paused sandbox");
    assert_eq!(err.code(), Some(ErrorCode::SandboxPaused), "{err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    p.docker().unpause_container(&id).await.unwrap();
    assert_eq!(sh(&p, &h, "echo again").await, "again");
    // Removed while a command runs: the sandbox, not the command, ended.
    let (provider, handle) = (p.clone(), h.clone());
    let running = tokio::spawn(async move {
        provider
            .exec(
                &handle,
                ExecRequest::argv("sleep", ["30"]).timeout(secs(60)),
            )
            .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.docker()
        .remove_container(
            &id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the exec outlived its container by 20 s")
        .unwrap();
    let err = outcome.expect_err("an exec whose container was removed returned a result");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(err.code(), Some(ErrorCode::SandboxGone), "{err}");
    cleanup(&p).await;
}

/// A resolve (the session layer's connect-and-probe) of a container connected once before is
/// one health call on the channel, not a container inspect; whatever the health call cannot
/// prove (a pause, a stop, a removal made behind the service's back) still goes the full way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_resolve_is_a_health_call_on_the_channel_not_an_inspect() {
    let (proxy, p, h) = agent_sandbox("arh").await;
    let id = h.id().as_str().to_owned();
    let probe = p.as_connect_probe().expect("docker probes connects");
    let request = |token: &str| ConnectRequest {
        sandbox_id: h.id().clone(),
        traffic_token: Some(Secret::new(token)),
    };
    // The first connect is the full one: the engine is asked about the container.
    let before = proxy.inspects();
    let first = probe.connect_session(request("t1")).await.unwrap();
    assert!(
        proxy.inspects() > before,
        "the first connect inspected nothing"
    );
    assert_eq!(first.id(), h.id());
    assert_eq!(sh(&p, &h, "echo up").await, "up");
    // From then on: no inspect, no exec create, the caller's token carried, the same handle.
    let (inspects, execs) = (proxy.inspects(), proxy.exec_creates());
    for i in 0..20 {
        let token = format!("t{i}");
        let again = probe.connect_session(request(&token)).await.unwrap();
        assert_eq!(again.id(), h.id());
        assert_eq!(again.metadata(), first.metadata());
        assert_eq!(
            again.traffic_token().map(|t| t.expose()),
            Some(token.as_str())
        );
    }
    assert_eq!(
        proxy.inspects(),
        inspects,
        "a resolve inspected the container"
    );
    assert_eq!(proxy.exec_creates(), execs, "a resolve created an exec");

    // Paused behind the service's back: the health call gets no answer, and the full connect
    // unpauses it, as in exec mode.
    p.docker().pause_container(&id).await.unwrap();
    let resumed = probe.connect_session(request("p")).await.unwrap();
    assert_eq!(resumed.id(), h.id());
    assert!(
        proxy.inspects() > inspects,
        "a paused sandbox was not inspected"
    );
    assert_eq!(sh(&p, &h, "echo unpaused").await, "unpaused");
    // Stopped: the full connect starts it again (its channel's exec ended with it).
    p.docker()
        .stop_container(&id, None::<bollard::query_parameters::StopContainerOptions>)
        .await
        .unwrap();
    probe.connect_session(request("s")).await.unwrap();
    assert_eq!(sh(&p, &h, "echo restarted").await, "restarted");
    // Removed: gone, not a remembered handle.
    p.docker()
        .remove_container(
            &id,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let err = probe
        .connect_session(request("r"))
        .await
        .expect_err("a removed sandbox connected");
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    cleanup(&p).await;
}

/// Reads terminal output into `seen` until it holds `needle`.
async fn read_until(t: &mut sandbox_core::Terminal, seen: &mut Vec<u8>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(seen).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t.output.next_event()).await {
            Ok(Some(TerminalEvent::Data(b))) => seen.extend(b),
            other => panic!(
                "{needle:?} not seen ({other:?}): {}",
                String::from_utf8_lossy(seen)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_terminal_round_trips_resizes_and_closes_through_the_agent() {
    let (proxy, p, h) = agent_sandbox("axp").await;
    let mut options = TerminalOptions::default();
    options
        .env
        .insert("SBX_TERM_T".to_owned(), "yes".to_owned());
    let mut t = p.open_terminal(&h, options).await.unwrap();
    let mut seen = Vec::new();
    t.input.write(b"echo hi\n").await.unwrap();
    // The typed line's echo is `echo hi`; only the command's output starts a line with it.
    read_until(&mut t, &mut seen, "\nhi\r").await;
    t.input
        .resize(TerminalSize { cols: 91, rows: 27 })
        .await
        .unwrap();
    t.input.write(b"stty size; sleep 5151 &\n").await.unwrap();
    read_until(&mut t, &mut seen, "27 91").await;
    assert!(processes(&p, &h, "sleep 5151").await >= 1);
    t.input.close().await.unwrap();
    // The whole session is hung up: the shell and its background job.
    wait_gone(&p, &h, "sleep 5151").await;
    let left = sh(
        &p,
        &h,
        "grep -l 'SBX_TERM_T=yes' /proc/[0-9]*/environ 2>/dev/null | grep -vc self || true",
    )
    .await;
    assert_eq!(left, "0");
    assert!(
        t.input.write(b"x").await.is_err(),
        "a closed terminal refuses input"
    );
    // A shell's exit status arrives as its exit event.
    let mut t = p
        .open_terminal(&h, TerminalOptions::default())
        .await
        .unwrap();
    t.input.write(b"exit 7\n").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t.output.next_event()).await {
            Ok(Some(TerminalEvent::Data(_))) => {}
            Ok(Some(TerminalEvent::Exited(code))) => {
                assert_eq!(code, Some(7));
                break;
            }
            other => panic!("no exit event: {other:?}"),
        }
    }
    let channel = p.channel(h.id().as_str()).unwrap();
    assert_eq!(
        proxy.exec_creates() as u64,
        channel.execs_opened(),
        "terminals and commands make no exec-create: only the channel's"
    );
    cleanup(&p).await;
}

fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

/// The p50 of `n` `true` round trips through `p.exec`, after a warm-up.
async fn true_p50(p: &DockerProvider, h: &SandboxHandle, n: usize) -> f64 {
    let truth = || ExecRequest::argv("true", Vec::<String>::new());
    for _ in 0..5 {
        assert_eq!(p.exec(h, truth()).await.unwrap().exit_code, 0);
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        assert_eq!(p.exec(h, truth()).await.unwrap().exit_code, 0);
        samples.push(started.elapsed());
    }
    p50(samples)
}

/// `true` through `provider.exec` in both data planes, in the same run. Prints `BENCH` lines;
/// asserts outcomes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn bench_true_through_provider_exec_in_both_modes() {
    let (_proxy, agent, h) = agent_sandbox("axb").await;
    let exec_mode = DockerProvider::connect(config(&namespace("axe")))
        .await
        .unwrap();
    let he = exec_mode
        .create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap();
    let through_agent = true_p50(&agent, &h, 200).await;
    let through_exec = true_p50(&exec_mode, &he, 50).await;
    println!("BENCH docker agent_exec_p50_ms={through_agent:.3}");
    println!("BENCH docker exec_mode_exec_p50_ms={through_exec:.3}");
    cleanup(&agent).await;
    cleanup(&exec_mode).await;
}

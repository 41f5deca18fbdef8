//! Agent mode's file operations on the real engine: they go through the kept channel to the
//! agent, not through an exec each (a counting proxy in front of the engine's socket sees every
//! exec creation); large files round-trip whole; the reserved trees hold where a path resolves
//! (symlinks into `/proc`, the agent's directory and the activity marker are refused by every
//! operation); a FIFO or a device never hangs a read; and listings and metadata read exactly as
//! exec mode reads them, compared on one container through both data planes.
//!
//! They need the engine, the `sandbox-busybox:test` image and the static agent
//! (`SANDBOX_AGENT_BIN`, which `cargo xtask test`'s docker engine stage passes); without the
//! variable they fail, naming it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test module: a failed unwrap is a failed test.

use std::time::{Duration, Instant};

use sandbox_core::{
    Checked, CreateRequest, ErrorCode, ErrorKind, ExecRequest, ListFilter, SandboxHandle,
    SandboxPath, SandboxProvider, TemplateId, TreeLimits,
};
use sandbox_provider_docker::{DataPlane, DockerConfig, DockerProvider};

use crate::channel::CountingProxy;
use crate::support::{IMAGE, agent_bin, config, exec_config, namespace};

fn agent_config(ns: &str) -> DockerConfig {
    let mut c = config(ns);
    c.data_plane = DataPlane::Agent;
    c.agent_path = Some(agent_bin());
    c
}

/// An agent-mode provider whose engine client goes through `proxy`.
async fn agent_provider(ns: &str, proxy: &CountingProxy) -> Checked<DockerProvider> {
    let mut c = agent_config(ns);
    c.host = Some(format!("unix://{}", proxy.path().display()));
    DockerProvider::connect(c)
        .await
        .expect("connect in agent mode")
}

/// An exec-mode provider on the same namespace: it reaches the same containers by exec.
async fn exec_provider(ns: &str) -> Checked<DockerProvider> {
    let c = exec_config(ns);
    DockerProvider::connect(c)
        .await
        .expect("connect in exec mode")
}

async fn create(p: &DockerProvider) -> SandboxHandle {
    p.create(CreateRequest::new(TemplateId::new(IMAGE).unwrap()))
        .await
        .unwrap()
}

async fn cleanup(p: &DockerProvider) {
    for s in p.list(&ListFilter::default()).await.unwrap_or_default() {
        let _ = p.delete(&s.id).await;
    }
}

async fn sh(p: &DockerProvider, h: &SandboxHandle, script: &str) -> String {
    let r = p.exec(h, ExecRequest::shell(script)).await.unwrap();
    assert_eq!(r.exit_code, 0, "{script}: {}", r.stderr_lossy());
    r.stdout_lossy().trim().to_owned()
}

fn path(p: &str) -> SandboxPath {
    SandboxPath::new(p).unwrap()
}

/// Bytes no two offsets of a 64 MiB file share by accident (a shifted or repeated chunk shows).
fn pattern(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_u32;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state.to_le_bytes()[0]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn files_go_through_the_channel_and_64_mib_round_trips_whole() {
    let ns = namespace("afl");
    let proxy = CountingProxy::start().await;
    let p = agent_provider(&ns, &proxy).await;
    let h = create(&p).await;
    let channel = p.channel(h.id().as_str()).unwrap();
    let (creates, opened) = (proxy.exec_creates(), channel.execs_opened());

    let big = pattern(64 * 1024 * 1024);
    let target = path("/tmp/deep/er/big.bin");
    p.write_file(&h, &target, &big).await.unwrap();
    let back = p.read_file(&h, &target).await.unwrap();
    assert!(
        back == big,
        "64 MiB came back as {} different bytes",
        back.len()
    );
    let mut stream = p.read_file_stream(&h, &target, u64::MAX).await.unwrap();
    let mut streamed = 0usize;
    let mut same = true;
    while let Some(chunk) = stream.next_chunk().await {
        let chunk = chunk.unwrap();
        same &= big.get(streamed..streamed + chunk.len()) == Some(&chunk[..]);
        streamed += chunk.len();
    }
    assert!(same && streamed == big.len(), "streamed {streamed} bytes");
    // Past a cap, a stream ends in file_too_large.
    let mut capped = p.read_file_stream(&h, &target, 1000).await.unwrap();
    let mut err = None;
    while let Some(chunk) = capped.next_chunk().await {
        if let Err(e) = chunk {
            err = Some(e);
            break;
        }
    }
    assert_eq!(err.unwrap().code(), Some(ErrorCode::FileTooLarge));

    let stat = p.stat(&h, &target).await.unwrap();
    assert_eq!(stat.size, big.len() as u64);
    p.make_dir(&h, &path("/tmp/made/here")).await.unwrap();
    p.make_dir(&h, &path("/tmp/made/here")).await.unwrap();
    let names: Vec<String> = p
        .list_dir(&h, &path("/tmp"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(
        names.contains(&"deep".to_owned()) && names.contains(&"made".to_owned()),
        "{names:?}"
    );
    let tree = p
        .list_tree(&h, &path("/tmp"), TreeLimits::depth(8))
        .await
        .unwrap();
    assert!(tree.entries.iter().any(|e| e.path == target), "{tree:?}");
    p.remove(&h, &path("/tmp/deep")).await.unwrap();
    let gone = p.stat(&h, &target).await.unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    let missing = p.remove(&h, &path("/tmp/deep")).await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");

    // Every operation above went over the channel: the only exec created is the channel's own.
    let channel_execs = channel.execs_opened() - opened;
    assert_eq!(
        channel_execs, 1,
        "one channel exec, opened by the first file operation"
    );
    assert_eq!(
        proxy.exec_creates() - creates,
        1,
        "file operations made exec-create calls of their own"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn symlinks_into_reserved_trees_are_refused_by_every_operation() {
    let ns = namespace("afr");
    let proxy = CountingProxy::start().await;
    let p = agent_provider(&ns, &proxy).await;
    let h = create(&p).await;
    const SUMS: &str = "md5sum /.sandbox/sandbox-agent /var/lib/sandbox-activity";
    let sums = sh(&p, &h, SUMS).await;
    sh(
        &p,
        &h,
        "mkdir -p /tmp/l && ln -s /proc/1/environ /tmp/l/environ && ln -s /proc /tmp/l/proc \
         && ln -s /.sandbox /tmp/l/sb && ln -s /.sandbox/sandbox-agent /tmp/l/agent \
         && ln -s /var/lib/sandbox-activity /tmp/l/marker && ln -s ../../.sandbox/new /tmp/l/dangling",
    )
    .await;
    let refused = |what: &str, r: Result<(), sandbox_core::Error>| {
        let e = r.expect_err(what);
        assert_eq!(
            (e.kind(), e.code()),
            (ErrorKind::InvalidRequest, Some(ErrorCode::InvalidPath)),
            "{what}: {e}"
        );
        assert!(e.to_string().contains("reserved"), "{what}: {e}");
    };
    for link in [
        "/tmp/l/environ",
        "/tmp/l/agent",
        "/tmp/l/marker",
        "/tmp/l/proc/1/environ",
        "/tmp/l/sb/sandbox-agent",
        "/tmp/l/dangling",
    ] {
        let at = path(link);
        refused(
            &format!("read {link}"),
            p.read_file(&h, &at).await.map(drop),
        );
        refused(
            &format!("stream {link}"),
            p.read_file_stream(&h, &at, 1 << 20).await.map(drop),
        );
        refused(
            &format!("write {link}"),
            p.write_file(&h, &at, b"replaced").await,
        );
        refused(&format!("stat {link}"), p.stat(&h, &at).await.map(drop));
        refused(&format!("remove {link}"), p.remove(&h, &at).await);
    }
    for dir in ["/tmp/l/sb", "/tmp/l/proc", "/tmp/l/proc/self"] {
        let at = path(dir);
        refused(&format!("list {dir}"), p.list_dir(&h, &at).await.map(drop));
        refused(
            &format!("tree {dir}"),
            p.list_tree(&h, &at, TreeLimits::depth(8)).await.map(drop),
        );
        refused(
            &format!("make_dir under {dir}"),
            p.make_dir(&h, &path(&format!("{dir}/new"))).await,
        );
        refused(
            &format!("write under {dir}"),
            p.write_file(&h, &path(&format!("{dir}/new/f")), b"x").await,
        );
    }
    // Nothing changed in the reserved trees, and the refused links are still there.
    assert_eq!(sh(&p, &h, SUMS).await, sums);
    assert_eq!(
        sh(
            &p,
            &h,
            "test ! -e /.sandbox/new && test ! -e /proc/new && echo none"
        )
        .await,
        "none"
    );
    assert_eq!(sh(&p, &h, "ls /tmp/l | wc -l").await, "6");
    // A listing shows the reserved trees without walking them.
    let root = p
        .list_tree(&h, &SandboxPath::root(), TreeLimits::depth(2))
        .await
        .unwrap();
    let paths: Vec<&str> = root.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(
        paths.contains(&"/proc") && paths.contains(&"/.sandbox"),
        "{paths:?}"
    );
    assert!(
        !paths
            .iter()
            .any(|p| p.starts_with("/proc/") || p.starts_with("/.sandbox/")),
        "{paths:?}"
    );
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_fifo_or_a_device_never_hangs_a_read() {
    let ns = namespace("aff");
    let proxy = CountingProxy::start().await;
    let p = agent_provider(&ns, &proxy).await;
    let h = create(&p).await;
    sh(
        &p,
        &h,
        "mkdir -p /tmp && mkfifo /tmp/fifo && ln -s /dev/zero /tmp/zero",
    )
    .await;
    let bound = Duration::from_secs(20);
    let fifo = tokio::time::timeout(bound, p.read_file(&h, &path("/tmp/fifo")))
        .await
        .expect("a read of a FIFO hung")
        .unwrap_err();
    assert_eq!(fifo.code(), Some(ErrorCode::NotARegularFile), "{fifo}");
    let stream = tokio::time::timeout(bound, p.read_file_stream(&h, &path("/tmp/fifo"), 10))
        .await
        .expect("a streamed read of a FIFO hung");
    assert_eq!(
        stream.err().unwrap().code(),
        Some(ErrorCode::NotARegularFile)
    );
    for device in ["/tmp/zero", "/dev/zero"] {
        let e = tokio::time::timeout(bound, p.read_file(&h, &path(device)))
            .await
            .expect("a read of /dev/zero hung")
            .unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidPath), "{device}: {e}");
    }
    let dir = p.read_file(&h, &path("/tmp")).await.unwrap_err();
    assert_eq!(dir.code(), Some(ErrorCode::NotARegularFile), "{dir}");
    cleanup(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn listings_and_metadata_read_as_exec_mode_reads_them() {
    let ns = namespace("afm");
    let proxy = CountingProxy::start().await;
    let agent = agent_provider(&ns, &proxy).await;
    let exec = exec_provider(&ns).await;
    let h = create(&agent).await;
    sh(
        &agent,
        &h,
        "mkdir -p /tmp/t/sub/deeper && cd /tmp/t && printf 12345 > f && printf x > .hidden \
         && printf abc > sub/g && ln -s f link && ln -s /nowhere dangling && ln -s sub dirlink \
         && mkfifo fifo && touch -d @1700000000 f && chmod 600 f",
    )
    .await;
    let dir = path("/tmp/t");
    let through_agent = agent.list_dir(&h, &dir).await.unwrap();
    let through_exec = exec.list_dir(&h, &dir).await.unwrap();
    assert_eq!(through_agent, through_exec);
    assert_eq!(through_agent.len(), 7, "{through_agent:?}");
    for name in [
        "f",
        ".hidden",
        "link",
        "dangling",
        "dirlink",
        "fifo",
        "sub",
        "sub/g",
        "sub/deeper",
    ] {
        let at = dir.join(name).unwrap();
        assert_eq!(
            agent.stat(&h, &at).await.unwrap(),
            exec.stat(&h, &at).await.unwrap(),
            "{name}"
        );
    }
    // Through a symlinked directory, as exec mode lists it.
    let linked = dir.join("dirlink").unwrap();
    assert_eq!(
        agent.list_dir(&h, &linked).await.unwrap(),
        exec.list_dir(&h, &linked).await.unwrap()
    );
    for depth in [1, 2, 5] {
        let limits = TreeLimits::depth(depth);
        assert_eq!(
            agent.list_tree(&h, &dir, limits).await.unwrap(),
            exec.list_tree(&h, &dir, limits).await.unwrap(),
            "depth {depth}"
        );
    }
    let capped = TreeLimits {
        max_entries: 3,
        ..TreeLimits::depth(5)
    };
    let (a, e) = (
        agent.list_tree(&h, &dir, capped).await.unwrap(),
        exec.list_tree(&h, &dir, capped).await.unwrap(),
    );
    assert!(a.truncated && e.truncated);
    assert_eq!(a.entries.len(), 3);
    // The same errors, by kind and code.
    for (what, a, e) in [
        (
            "missing",
            agent.stat(&h, &path("/tmp/t/none")).await.unwrap_err(),
            exec.stat(&h, &path("/tmp/t/none")).await.unwrap_err(),
        ),
        (
            "list a file",
            agent.list_dir(&h, &path("/tmp/t/f")).await.unwrap_err(),
            exec.list_dir(&h, &path("/tmp/t/f")).await.unwrap_err(),
        ),
        (
            "read a directory",
            agent.read_file(&h, &path("/tmp/t/sub")).await.unwrap_err(),
            exec.read_file(&h, &path("/tmp/t/sub")).await.unwrap_err(),
        ),
        (
            "write over a directory",
            agent
                .write_file(&h, &path("/tmp/t/sub"), b"x")
                .await
                .unwrap_err(),
            exec.write_file(&h, &path("/tmp/t/sub"), b"x")
                .await
                .unwrap_err(),
        ),
        (
            "make_dir over a file",
            agent.make_dir(&h, &path("/tmp/t/f")).await.unwrap_err(),
            exec.make_dir(&h, &path("/tmp/t/f")).await.unwrap_err(),
        ),
        (
            "write under a file",
            agent
                .write_file(&h, &path("/tmp/t/f/x"), b"x")
                .await
                .unwrap_err(),
            exec.write_file(&h, &path("/tmp/t/f/x"), b"x")
                .await
                .unwrap_err(),
        ),
    ] {
        assert_eq!(
            (a.kind(), a.code()),
            (e.kind(), e.code()),
            "{what}: {a} / {e}"
        );
    }
    // A file written through one plane reads the same through the other, mode and owner too.
    agent
        .write_file(&h, &path("/tmp/t/new/a.txt"), b"via agent")
        .await
        .unwrap();
    exec.write_file(&h, &path("/tmp/t/new2/b.txt"), b"via exec")
        .await
        .unwrap();
    assert_eq!(
        exec.read_file(&h, &path("/tmp/t/new/a.txt")).await.unwrap(),
        b"via agent"
    );
    assert_eq!(
        agent
            .read_file(&h, &path("/tmp/t/new2/b.txt"))
            .await
            .unwrap(),
        b"via exec"
    );
    assert_eq!(
        sh(
            &agent,
            &h,
            "stat -c '%a %u %g' /tmp/t/new /tmp/t/new/a.txt | tr '\\n' ' '"
        )
        .await,
        sh(
            &agent,
            &h,
            "stat -c '%a %u %g' /tmp/t/new2 /tmp/t/new2/b.txt | tr '\\n' ' '"
        )
        .await,
    );
    cleanup(&agent).await;
}

/// Median of `runs` write+read round trips of 1 MiB, in milliseconds.
async fn file_round_trip_ms(p: &DockerProvider, h: &SandboxHandle, runs: usize) -> f64 {
    let data = pattern(1024 * 1024);
    let at = path("/tmp/bench.bin");
    // Warm: the agent's channel opens on first use.
    p.write_file(h, &at, &data).await.unwrap();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        p.write_file(h, &at, &data).await.unwrap();
        let back = p.read_file(h, &at).await.unwrap();
        samples.push(started.elapsed());
        assert!(back == data, "the 1 MiB file came back different");
    }
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn bench_a_1_mib_file_round_trip_agent_vs_exec() {
    let ns = namespace("afb");
    let agent = DockerProvider::connect(agent_config(&ns)).await.unwrap();
    let exec = exec_provider(&ns).await;
    let h = create(&agent).await;
    let through_agent = file_round_trip_ms(&agent, &h, 15).await;
    let through_exec = file_round_trip_ms(&exec, &h, 15).await;
    println!("BENCH docker agent_file_1mib_ms={through_agent:.2}");
    println!("BENCH docker exec_mode_file_1mib_ms={through_exec:.2}");
    cleanup(&agent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn a_tree_too_long_for_one_answer_is_walked_and_cut_at_its_cap() {
    // More entries than one ListDir answer of the agent may carry: the listing falls back to a
    // walk of one-level calls and stops at the caller's cap, marked truncated.
    let ns = namespace("aft");
    let proxy = CountingProxy::start().await;
    let p = agent_provider(&ns, &proxy).await;
    let h = create(&p).await;
    sh(
        &p,
        &h,
        "mkdir -p /tmp/many/a /tmp/many/b && cd /tmp/many/a && seq 1 12000 | xargs touch \
         && cd /tmp/many/b && seq 1 12000 | xargs touch",
    )
    .await;
    let dir = path("/tmp/many");
    let listing = p.list_tree(&h, &dir, TreeLimits::depth(3)).await.unwrap();
    assert!(listing.truncated);
    assert_eq!(listing.entries.len(), TreeLimits::DEFAULT_MAX_ENTRIES);
    assert!(
        listing
            .entries
            .iter()
            .all(|e| e.path.is_strictly_under(&dir))
    );
    assert!(listing.entries.windows(2).all(|w| w[0].path < w[1].path));
    // Under the cap, the whole tree.
    let all = p
        .list_tree(
            &h,
            &dir,
            TreeLimits {
                max_entries: 30_000,
                ..TreeLimits::depth(3)
            },
        )
        .await
        .unwrap();
    assert!(!all.truncated);
    assert_eq!(all.entries.len(), 24_002);
    cleanup(&p).await;
}

/// A source that yields `chunks` copies of `chunk`, then fails when `fail` is set.
struct Chunks {
    chunk: Vec<u8>,
    left: usize,
    fail: bool,
}

#[async_trait::async_trait]
impl sandbox_core::ByteStream for Chunks {
    async fn next_chunk(&mut self) -> Option<Result<Vec<u8>, sandbox_core::Error>> {
        if self.left == 0 {
            return std::mem::take(&mut self.fail).then(|| {
                Err(sandbox_core::Error::unavailable(
                    sandbox_core::Operation::new("upload"),
                    "the client went away",
                ))
            });
        }
        self.left -= 1;
        Some(Ok(self.chunk.clone()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the sandbox-busybox:test image and SANDBOX_AGENT_BIN: cargo xtask test runs it"]
async fn streamed_writes_go_through_the_channel_and_leave_no_staging_file() {
    let ns = namespace("afs");
    let proxy = CountingProxy::start().await;
    let p = agent_provider(&ns, &proxy).await;
    let h = create(&p).await;
    let streamed = sandbox_core::narrow::streamed_files(&p).expect("the agent plane streams");
    let channel = p.channel(h.id().as_str()).unwrap();
    // The first file operation opens the channel's exec; count from after it.
    p.make_dir(&h, &path("/tmp/up")).await.unwrap();
    let (creates, opened) = (proxy.exec_creates(), channel.execs_opened());
    let target = path("/tmp/up/file.bin");
    let chunk = pattern(1 << 20);
    let ok = Chunks {
        chunk: chunk.clone(),
        left: 8,
        fail: false,
    };
    let written = streamed
        .write_stream(&h, &target, Box::new(ok), 8 << 20)
        .await
        .unwrap();
    assert_eq!(written, 8 << 20);
    assert_eq!(p.read_file(&h, &target).await.unwrap(), chunk.repeat(8));
    // A failing source and an over-cap source: the target keeps its bytes, and the staging
    // sibling is gone.
    let failing = Chunks {
        chunk: vec![1; 4096],
        left: 3,
        fail: true,
    };
    let err = streamed
        .write_stream(&h, &target, Box::new(failing), 8 << 20)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let over = Chunks {
        chunk: vec![2; 4096],
        left: 4,
        fail: false,
    };
    let err = streamed
        .write_stream(&h, &target, Box::new(over), 10_000)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::FileTooLarge), "{err}");
    assert_eq!(p.read_file(&h, &target).await.unwrap(), chunk.repeat(8));
    let names: Vec<String> = p
        .list_dir(&h, &path("/tmp/up"))
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["file.bin"]);
    // All of it over the kept channel: no exec was created or opened for it.
    assert_eq!(proxy.exec_creates(), creates);
    assert_eq!(channel.execs_opened(), opened);
    cleanup(&p).await;
}

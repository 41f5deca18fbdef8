//! `cargo xtask bench store`: what a resolve of an already-bound session costs through the Redis
//! binding store, against the memory store measured in the same run, on a 2-worker
//! multi-thread tokio runtime over the fake provider.
//!
//! The binary starts its own `redis-server` on a free 127.0.0.1 port (`--save ""
//! --appendonly no`, so no disk I/O), talks to nobody else's, and kills it at the end. Redis,
//! the bench and the fake share the machine's cores.
//!
//! - Bound resolves: sessions bound by a first resolve, then tight loops of
//!   [`Lifecycle::resolve`] on them, in one task and in 8 concurrent tasks on 8 *different*
//!   bound sessions. Variants, each with its own fake provider and sessions: Redis with the
//!   resolve fast path (one lock-free `EVALSHA` read, then the connect), Redis with the fast
//!   path hidden (`FaultyStore::without_optimistic_reads`: the lifecycle lock around every
//!   resolve, as before the fast path), the memory store as the service ships it (locked; a lock costs no round
//!   trip in one process) — the baseline — and the memory store with its fast path on. Two
//!   floors put the Redis figures in proportion: `read_for_resolve` alone (the fast path's one
//!   round trip, no coordinator, no provider) and `PING` (one round trip that does nothing).
//!   Every round runs every variant back to back, rotating which goes first, so drift on a
//!   shared machine hits all of them; a ratio is the median over rounds of the two variants'
//!   time per op in the same round.
//! - Redis commands per resolve, counted by Redis itself: the `total_commands_processed` delta
//!   of `INFO stats` (which also counts the commands a script runs) around each timed run,
//!   minus the first `INFO` itself, over the resolves of the run; summed over every round. The
//!   CPU time `redis-server` and this process spent (from `/proc/<pid>/stat`) is divided by
//!   the same resolves, to show where a resolve's time goes.
//! - One hot session: 32 tasks released together by a barrier, each resolving the *same*
//!   bound session a fixed number of times in a loop. Latency is each resolve call's own time;
//!   nearest-rank p50/p99 over every resolve of every round. On the fast path the reads run
//!   side by side (pipelined on the store's one connection); on the locked path the lifecycle
//!   lock serialises them and a waiter sleeps 25–74 ms between attempts, so the locked
//!   figures are dominated by that jitter; the per-task count is kept small so the run stays
//!   short. The memory store (locked, waiters woken on release) is printed for comparison.
//!
//! Throughput rounds are sized by a warm-up to about 0.25 s each; the best of 9 rounds is the
//! headline (the least-disturbed run), the median is printed as a raw line. Prints raw lines,
//! then one `BENCH store <key>=<value>` line per headline figure. Asserts only correctness:
//! every resolve returns the session's sandbox, nothing is created after the first resolves,
//! and Redis counted commands. `--smoke` runs tiny versions (CI only checks that the bench
//! works).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used
)] // A bench binary reports on stdout and fails loudly.

use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::{
    BindingKey, BindingStore, ConfigId, CreateRequest, PermissiveSessionExistence, SandboxId,
    SandboxProvider,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, Topology};
use sandbox_testkit::{FakeOp, FakeProvider, FaultyStore};
use tokio::runtime::Runtime;

/// Goal from the issue: Redis commands per resolve of a bound session.
const GOAL_COMMANDS: f64 = 3.0;
const TENANT: u64 = 42;
/// Concurrent tasks on different sessions in the spread throughput figure.
const SPREAD: usize = 8;
/// Concurrent tasks on one session in the hot-session figure.
const HOT_TASKS: usize = 32;
const MISSING: &str = "apt-get install redis-server; `cargo xtask test` installs it";

struct Plan {
    /// Throughput rounds per figure.
    rounds: usize,
    /// Target duration of one throughput run.
    round_target: Duration,
    /// A warm-up grows until one run takes at least this long.
    warm_min: Duration,
    /// Hot-session rounds, and resolves per task in each, per path.
    hot_rounds: usize,
    hot_fast: u64,
    hot_locked: u64,
}

impl Plan {
    fn new(smoke: bool) -> Self {
        if smoke {
            Plan {
                rounds: 2,
                round_target: Duration::from_millis(10),
                warm_min: Duration::from_millis(5),
                hot_rounds: 1,
                hot_fast: 10,
                hot_locked: 2,
            }
        } else {
            Plan {
                rounds: 9,
                round_target: Duration::from_millis(250),
                warm_min: Duration::from_millis(60),
                hot_rounds: 7,
                hot_fast: 200,
                hot_locked: 10,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The private redis-server.

/// A `redis-server` child on a free loopback port; killed on drop (also when a panic unwinds).
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn require(program: &str) {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        eprintln!("error: bench store needs `{program}` on PATH: {MISSING}");
        std::process::exit(1);
    }
}

impl Server {
    fn start() -> Server {
        require("redis-server");
        require("redis-cli");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server ({MISSING}): {e}"));
        let mut s = Server { child, port };
        let start = Instant::now();
        while s.cli(&["ping"]) != "PONG" {
            if let Some(status) = s.child.try_wait().unwrap() {
                panic!("redis-server exited at start ({status}); port {port} taken?");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not answer PING within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `total_commands_processed`: what this INFO reports excludes itself, so the delta between
    /// two reads counts the first INFO once.
    fn processed(&self) -> u64 {
        let info = self.cli(&["info", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .unwrap_or_else(|| panic!("no total_commands_processed in INFO stats: {info:?}"))
            .trim()
            .parse()
            .unwrap()
    }

    fn cpu(&self) -> Duration {
        proc_cpu(&format!("/proc/{}/stat", self.child.id()))
    }
}

/// Clock ticks per second of `/proc/*/stat` times.
fn clk_tck() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// User + system CPU time of a process, in clock ticks turned into time.
fn proc_cpu(path: &str) -> Duration {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let tck = *TCK.get_or_init(clk_tck);
    let Ok(stat) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may hold spaces) start at field 3; utime and stime
    // are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / tck)
}

fn self_cpu() -> Duration {
    proc_cpu("/proc/self/stat")
}

// ---------------------------------------------------------------------------------------------
// Stores and coordinators.

/// A coordinator over its own fake provider and `store`.
fn lifecycle(store: Arc<dyn BindingStore>) -> (sandbox_core::Checked<FakeProvider>, Lifecycle) {
    let fake = FakeProvider::new();
    let provider: Arc<dyn SandboxProvider> = Arc::new(fake.clone());
    let lc = Lifecycle::new(
        provider,
        store,
        Arc::new(PermissiveSessionExistence),
        LifecycleConfig {
            config_id: ConfigId::new("cfg-bench").unwrap(),
            create_request: CreateRequest::new(FakeProvider::template()),
            requires_inbound_token: true,
        },
    )
    .unwrap();
    (fake, lc)
}

/// A bound session and the sandbox every resolve of it must return.
#[derive(Clone)]
struct Target {
    key: BindingKey,
    id: SandboxId,
}

/// Binds `count` sessions named `<prefix>-<i>` through `lc` (one first resolve each).
fn bind(rt: &Runtime, lc: &Lifecycle, prefix: &str, count: usize) -> Vec<Target> {
    rt.block_on(async {
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let key = BindingKey::new(TENANT, &format!("{prefix}-{i}")).unwrap();
            let id = lc.resolve(&key).await.unwrap().id().clone();
            out.push(Target { key, id });
        }
        out
    })
}

/// A loop body: `n` sequential operations on one target, in a new task.
type Loop = Arc<dyn Fn(Target, u64) -> tokio::task::JoinHandle<()> + Send + Sync>;

fn resolve_loop(lc: &Lifecycle) -> Loop {
    let lc = lc.clone();
    Arc::new(move |t, n| {
        let lc = lc.clone();
        tokio::spawn(async move {
            for _ in 0..n {
                let handle = lc
                    .resolve(black_box(&t.key))
                    .await
                    .unwrap_or_else(|e| panic!("resolve of {}: {e}", t.key));
                assert_eq!(handle.id(), &t.id, "resolve of {} changed sandbox", t.key);
                black_box(handle);
            }
        })
    })
}

/// The fast path's one round trip alone: `read_for_resolve`, no coordinator, no provider.
fn read_loop(store: &RedisBindingStore) -> Loop {
    let store = store.clone();
    Arc::new(move |t, n| {
        let store = store.clone();
        tokio::spawn(async move {
            let reads = store.optimistic_reads().unwrap();
            for _ in 0..n {
                let snap = reads.read_for_resolve(black_box(&t.key)).await.unwrap();
                assert_eq!(snap.binding.map(|b| b.sandbox_id).as_ref(), Some(&t.id));
            }
        })
    })
}

/// One Redis round trip that does nothing.
fn ping_loop(store: &RedisBindingStore) -> Loop {
    let store = store.clone();
    Arc::new(move |_, n| {
        let store = store.clone();
        tokio::spawn(async move {
            for _ in 0..n {
                store.ping().await.unwrap();
            }
        })
    })
}

struct Variant {
    label: &'static str,
    body: Loop,
    targets: Vec<Target>,
    /// Talks to Redis: count its commands and the server's CPU.
    redis: bool,
}

// ---------------------------------------------------------------------------------------------
// Throughput.

/// Runs `body` on every target at once, `n` iterations each; the wall time.
fn run_once(rt: &Runtime, body: &Loop, targets: &[Target], n: u64) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = targets.iter().map(|t| body(t.clone(), n)).collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// What one variant did over every timed run of a figure.
#[derive(Default)]
struct Tally {
    rates: Vec<f64>,
    ops: u64,
    commands: u64,
    server_cpu: Duration,
    client_cpu: Duration,
}

impl Tally {
    fn best(&self) -> f64 {
        sorted(self.rates.clone())[self.rates.len() - 1]
    }
    fn median(&self) -> f64 {
        sorted(self.rates.clone())[self.rates.len() / 2]
    }
    fn commands_per_op(&self) -> f64 {
        self.commands as f64 / self.ops as f64
    }
    fn us_per_op(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.ops as f64
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Every variant's tally for one figure, and the per-round rates for ratios.
struct Figure {
    tasks: usize,
    tallies: Vec<Tally>,
    /// `rounds[r][v]`: variant `v`'s rate in round `r`.
    rounds: Vec<Vec<f64>>,
}

impl Figure {
    /// Median over rounds of `a`'s time per op over `b`'s, from runs in the same round.
    fn ratio(&self, a: usize, b: usize) -> f64 {
        let r: Vec<f64> = self.rounds.iter().map(|r| r[b] / r[a]).collect();
        sorted(r)[self.rounds.len() / 2]
    }
}

/// Iterations per task for a run of about `plan.round_target`, from a warm-up that grows until
/// it takes `plan.warm_min`.
fn size(plan: &Plan, rt: &Runtime, v: &Variant, targets: &[Target]) -> u64 {
    let mut n = 8;
    loop {
        let took = run_once(rt, &v.body, targets, n);
        if took >= plan.warm_min || n >= 1 << 24 {
            let per_op = took.as_secs_f64() / n as f64;
            return ((plan.round_target.as_secs_f64() / per_op) as u64).max(10);
        }
        n *= 4;
    }
}

fn throughput(
    rt: &Runtime,
    server: &Server,
    plan: &Plan,
    variants: &[Variant],
    tasks: usize,
) -> Figure {
    let targets = |v: &Variant| v.targets[..tasks].to_vec();
    let sizes: Vec<u64> = variants
        .iter()
        .map(|v| size(plan, rt, v, &targets(v)))
        .collect();
    let mut tallies: Vec<Tally> = variants.iter().map(|_| Tally::default()).collect();
    let mut rounds = Vec::with_capacity(plan.rounds);
    for round in 0..plan.rounds {
        let mut rates = vec![0.0; variants.len()];
        for i in 0..variants.len() {
            let vi = (round + i) % variants.len();
            let (v, n, t) = (&variants[vi], sizes[vi], &mut tallies[vi]);
            let before = v.redis.then(|| server.processed());
            let (s0, c0) = (server.cpu(), self_cpu());
            let wall = run_once(rt, &v.body, &targets(v), n);
            let (c1, s1) = (self_cpu(), server.cpu());
            let ops = n * tasks as u64;
            if let Some(before) = before {
                t.commands += server.processed() - before - 1;
                t.server_cpu += s1.saturating_sub(s0);
            }
            t.client_cpu += c1.saturating_sub(c0);
            t.ops += ops;
            let rate = ops as f64 / wall.as_secs_f64();
            t.rates.push(rate);
            rates[vi] = rate;
        }
        rounds.push(rates);
    }
    Figure {
        tasks,
        tallies,
        rounds,
    }
}

// ---------------------------------------------------------------------------------------------
// One hot session.

/// Every resolve's latency, and Redis's count, over the rounds of one path.
#[derive(Default)]
struct Hot {
    latencies: Vec<Duration>,
    walls: Vec<Duration>,
    commands: u64,
}

impl Hot {
    fn p(&self, p: f64) -> Duration {
        let mut v = self.latencies.clone();
        v.sort();
        percentile(&v, p)
    }
    fn commands_per_resolve(&self) -> f64 {
        self.commands as f64 / self.latencies.len() as f64
    }
    fn rate(&self) -> f64 {
        let wall: Duration = self.walls.iter().sum();
        self.latencies.len() as f64 / wall.as_secs_f64()
    }
}

/// One round: `HOT_TASKS` tasks released together, each resolving `target` `per_task` times.
fn hot_round(
    rt: &Runtime,
    server: &Server,
    lc: &Lifecycle,
    target: &Target,
    per_task: u64,
    redis: bool,
    into: &mut Hot,
) {
    let before = redis.then(|| server.processed());
    let (wall, spans) = rt.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(HOT_TASKS + 1));
        let tasks: Vec<_> = (0..HOT_TASKS)
            .map(|_| {
                let (lc, barrier, t) = (lc.clone(), barrier.clone(), target.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut spans = Vec::with_capacity(per_task as usize);
                    for _ in 0..per_task {
                        let start = Instant::now();
                        let handle = lc.resolve(&t.key).await.unwrap();
                        spans.push(start.elapsed());
                        assert_eq!(handle.id(), &t.id, "resolve of {} changed sandbox", t.key);
                    }
                    spans
                })
            })
            .collect();
        barrier.wait().await;
        let released = Instant::now();
        let mut spans = Vec::new();
        for t in tasks {
            spans.extend(t.await.unwrap());
        }
        (released.elapsed(), spans)
    });
    if let Some(before) = before {
        into.commands += server.processed() - before - 1;
    }
    into.latencies.extend(spans);
    into.walls.push(wall);
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------------

/// Variant indices.
const REDIS: usize = 0;
const LOCKED: usize = 1;
const MEMORY: usize = 2;
const MEMORY_FAST: usize = 3;

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let plan = Plan::new(smoke);
    let started = Instant::now();
    let server = Server::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let redis = rt
        .block_on(RedisBindingStore::connect(RedisStoreConfig::new(
            Topology::Standalone { url: server.url() },
            "bench",
        )))
        .unwrap_or_else(|e| panic!("cannot connect to the bench's redis-server: {e}"));
    let (fake_fast, lc_fast) = lifecycle(Arc::new(redis.clone()));
    let (fake_locked, lc_locked) = lifecycle(Arc::new(
        FaultyStore::new(Arc::new(redis.clone())).without_optimistic_reads(),
    ));
    let (fake_mem, lc_mem) = lifecycle(Arc::new(MemoryBindingStore::new()));
    let (fake_mem_fast, lc_mem_fast) = lifecycle(Arc::new(
        MemoryBindingStore::builder().optimistic_reads(true).build(),
    ));
    let spread = |lc: &Lifecycle, prefix: &str| bind(&rt, lc, prefix, SPREAD);
    let fast_targets = spread(&lc_fast, "fast");
    let variants = [
        Variant {
            label: "redis, fast path",
            body: resolve_loop(&lc_fast),
            targets: fast_targets.clone(),
            redis: true,
        },
        Variant {
            label: "redis, locked path (fast path hidden)",
            body: resolve_loop(&lc_locked),
            targets: spread(&lc_locked, "locked"),
            redis: true,
        },
        Variant {
            label: "memory (as shipped: locked)",
            body: resolve_loop(&lc_mem),
            targets: spread(&lc_mem, "mem"),
            redis: false,
        },
        Variant {
            label: "memory, fast path on",
            body: resolve_loop(&lc_mem_fast),
            targets: spread(&lc_mem_fast, "memfast"),
            redis: false,
        },
        Variant {
            label: "floor: redis read_for_resolve alone",
            body: read_loop(&redis),
            targets: fast_targets.clone(),
            redis: true,
        },
        Variant {
            label: "floor: redis PING",
            body: ping_loop(&redis),
            targets: fast_targets.clone(),
            redis: true,
        },
    ];
    let hot_fast_target = bind(&rt, &lc_fast, "hot-fast", 1).remove(0);
    let hot_locked_target = bind(&rt, &lc_locked, "hot-locked", 1).remove(0);
    let hot_mem_target = bind(&rt, &lc_mem, "hot-mem", 1).remove(0);

    // 1 + 2. Bound-resolve throughput and commands per resolve.
    let single = throughput(&rt, &server, &plan, &variants, 1);
    let many = throughput(&rt, &server, &plan, &variants, SPREAD);

    // 3. One hot session, the paths interleaved round by round.
    let (mut hot_fast, mut hot_locked, mut hot_mem) =
        (Hot::default(), Hot::default(), Hot::default());
    for _ in 0..plan.hot_rounds {
        hot_round(
            &rt,
            &server,
            &lc_fast,
            &hot_fast_target,
            plan.hot_fast,
            true,
            &mut hot_fast,
        );
        hot_round(
            &rt,
            &server,
            &lc_locked,
            &hot_locked_target,
            plan.hot_locked,
            true,
            &mut hot_locked,
        );
        hot_round(
            &rt,
            &server,
            &lc_mem,
            &hot_mem_target,
            plan.hot_fast,
            false,
            &mut hot_mem,
        );
    }

    // Correctness: the loops created nothing (every resolve found its binding and reconnected),
    // and Redis saw the resolves.
    for (label, fake, bound) in [
        ("redis fast", &fake_fast, SPREAD + 1),
        ("redis locked", &fake_locked, SPREAD + 1),
        ("memory", &fake_mem, SPREAD + 1),
        ("memory fast", &fake_mem_fast, SPREAD),
    ] {
        assert_eq!(
            fake.calls(FakeOp::Create),
            bound,
            "{label}: a bound resolve created a sandbox"
        );
        assert_eq!(fake.sandbox_ids().len(), bound, "{label}: sandboxes");
    }
    let per_resolve = |i: usize| {
        let (cmds, ops) = [&single, &many].iter().fold((0, 0), |(c, o), f| {
            (c + f.tallies[i].commands, o + f.tallies[i].ops)
        });
        cmds as f64 / ops as f64
    };
    let (cpr, cpr_locked) = (per_resolve(REDIS), per_resolve(LOCKED));
    assert!(
        cpr > 0.0,
        "Redis counted no commands for fast-path resolves"
    );
    assert!(
        cpr_locked > 0.0,
        "Redis counted no commands for locked-path resolves"
    );
    assert!(
        hot_fast.commands > 0 && hot_locked.commands > 0,
        "Redis counted no commands for the hot session"
    );

    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "runtime: tokio multi-thread, 2 workers; fake provider (connect_probe), \
         PermissiveSessionExistence, requires_inbound_token = true; redis-server {} on \
         127.0.0.1 (own child, no persistence), one fred connection shared by the Redis \
         variants; redis-server and the bench share the machine's cores",
        server
            .cli(&["info", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
    );
    println!(
        "throughput: {} rounds of ~{} ms per variant and figure after a warm-up, variants back \
         to back in rotating order; best round reported",
        plan.rounds,
        plan.round_target.as_millis()
    );
    for f in [&single, &many] {
        let label = if f.tasks == 1 {
            "1 task".to_owned()
        } else {
            format!("{} tasks on {} sessions", f.tasks, f.tasks)
        };
        for (v, t) in variants.iter().zip(&f.tallies) {
            let mut line = format!(
                "{label}, {}: best {:.0}/s ({:.2} us/op per task), median {:.0}/s; \
                 client CPU {:.2} us/op",
                v.label,
                t.best(),
                1e6 * f.tasks as f64 / t.best(),
                t.median(),
                t.us_per_op(t.client_cpu),
            );
            if v.redis {
                line += &format!(
                    "; redis-server CPU {:.2} us/op; {:.2} Redis commands/op",
                    t.us_per_op(t.server_cpu),
                    t.commands_per_op()
                );
            }
            println!("{line}");
        }
        println!(
            "{label}: time per op redis fast / memory {:.2}, redis locked / memory {:.2}, \
             redis locked / redis fast {:.2}, redis fast / read_for_resolve alone {:.2}, \
             read_for_resolve / PING {:.2} (medians of same-round pairs)",
            f.ratio(REDIS, MEMORY),
            f.ratio(LOCKED, MEMORY),
            f.ratio(LOCKED, REDIS),
            f.ratio(REDIS, 4),
            f.ratio(4, 5),
        );
    }
    println!(
        "{SPREAD} tasks vs 1 (best rounds): redis fast {:.2}x, redis locked {:.2}x, memory {:.2}x, \
         PING {:.2}x",
        many.tallies[REDIS].best() / single.tallies[REDIS].best(),
        many.tallies[LOCKED].best() / single.tallies[LOCKED].best(),
        many.tallies[MEMORY].best() / single.tallies[MEMORY].best(),
        many.tallies[5].best() / single.tallies[5].best(),
    );
    println!(
        "Redis commands per bound resolve (INFO stats total_commands_processed, script-internal \
         commands included, over every timed run): fast path {cpr:.2}, locked path \
         {cpr_locked:.2}; goal <= {GOAL_COMMANDS:.0}: {}",
        if cpr <= GOAL_COMMANDS {
            "met"
        } else {
            "MISSED"
        }
    );
    for (label, h, per_task) in [
        ("redis, fast path", &hot_fast, plan.hot_fast),
        ("redis, locked path", &hot_locked, plan.hot_locked),
        ("memory (as shipped: locked)", &hot_mem, plan.hot_fast),
    ] {
        let mut line = format!(
            "hot session, {HOT_TASKS} tasks x {per_task} resolves, {} rounds, {label}: \
             p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms; {:.0} resolves/s",
            plan.hot_rounds,
            ms(h.p(50.0)),
            ms(h.p(90.0)),
            ms(h.p(99.0)),
            ms(h.p(100.0)),
            h.rate(),
        );
        if h.commands > 0 {
            line += &format!("; {:.2} Redis commands/resolve", h.commands_per_resolve());
        }
        println!("{line}");
    }
    println!(
        "hot locked path: a waiter sleeps 25-74 ms between SET NX attempts, so its latency is \
         the jitter, and each failed attempt is one more command"
    );
    println!(
        "elapsed: {:.1?}",
        started.elapsed().max(Duration::from_millis(1))
    );

    let bench = |key: &str, value: String| println!("BENCH store {key}={value}");
    for (f, suffix) in [(&single, ""), (&many, "_8tasks")] {
        let t = &f.tallies;
        bench(
            &format!("bound_resolves_per_s_redis{suffix}"),
            format!("{:.0}", t[REDIS].best()),
        );
        bench(
            &format!("bound_resolves_per_s_memory{suffix}"),
            format!("{:.0}", t[MEMORY].best()),
        );
        bench(
            &format!("bound_resolve_ratio_redis{suffix}"),
            format!("{:.2}", f.ratio(REDIS, MEMORY)),
        );
        bench(
            &format!("bound_resolves_per_s_redis_locked{suffix}"),
            format!("{:.0}", t[LOCKED].best()),
        );
        bench(
            &format!("bound_resolve_ratio_redis_locked{suffix}"),
            format!("{:.2}", f.ratio(LOCKED, MEMORY)),
        );
        bench(
            &format!("fast_path_gain{suffix}"),
            format!("{:.2}", f.ratio(LOCKED, REDIS)),
        );
        bench(
            &format!("bound_resolves_per_s_memory_fast{suffix}"),
            format!("{:.0}", t[MEMORY_FAST].best()),
        );
    }
    bench("commands_per_resolve", format!("{cpr:.2}"));
    bench("commands_per_resolve_locked", format!("{cpr_locked:.2}"));
    bench(
        "commands_per_resolve_locked_hot",
        format!("{:.2}", hot_locked.commands_per_resolve()),
    );
    bench("hot_tasks", HOT_TASKS.to_string());
    bench("hot_p50_ms", format!("{:.3}", ms(hot_fast.p(50.0))));
    bench("hot_p99_ms", format!("{:.3}", ms(hot_fast.p(99.0))));
    bench(
        "hot_p50_ms_locked",
        format!("{:.3}", ms(hot_locked.p(50.0))),
    );
    bench(
        "hot_p99_ms_locked",
        format!("{:.3}", ms(hot_locked.p(99.0))),
    );

    drop(rt);
    drop(server);
}

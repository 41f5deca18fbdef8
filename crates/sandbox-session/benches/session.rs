//! `cargo xtask bench session`: what the lifecycle coordinator costs on the hot path, on the
//! fake provider and the memory store (hermetic: no Docker, no Redis), on a 2-worker
//! multi-thread tokio runtime.
//!
//! - Bound resolves: one session resolved once (which creates its sandbox), then a tight loop
//!   of [`Lifecycle::resolve`] on it, in one task, and in 2 concurrent tasks on 2 *different*
//!   bound sessions. The raw baseline, measured in the same run, is the least a resolve of a
//!   bound session must do without a coordinator: the memory store's `get` plus the fake's
//!   `connect_session` (through [`narrow::connect_probe`]) with the binding's ID and token,
//!   through the same dyn ports the coordinator calls. The coordinator adds the lifecycle lock
//!   (acquire + release), the session-existence check, the turn-rebuild bookkeeping and the
//!   handle checks. `bound_resolve_ratio` is coordinator time per op over baseline time per op
//!   (single task): the median over rounds in which the two run back to back (alternating which
//!   goes first), so drift on a shared machine hits both.
//! - First resolves: 500 tasks, each resolving a distinct new session, released together by a
//!   barrier. Each resolve lists the fake's sandboxes (recovery), creates one and binds it.
//!   Latency is issue to answer: from the barrier's release (when every resolve is issued) to
//!   that resolve's answer, so it includes waiting for one of the 2 workers, as a caller would;
//!   nearest-rank p50/p99 over every resolve of every round. The resolve call alone (from its
//!   task's first poll) is printed as a raw line. Wall: from the release to the last answer
//!   (median over rounds). Once with a 5 ms create latency on the fake (a stand-in for a
//!   provider's API round trip, far below a real boot) and once with none (the CPU cost of the
//!   coordinator and the fake alone). Each round starts from a fresh provider and store.
//!
//! - Layered exec: the per-call cost of the checking layer every adapter's constructor applies
//!   (`sandbox_core::Checked`): a tight loop of `exec` of `true` on one fake sandbox, through
//!   the checked fake and through the bare fake (`Checked::inner`), both as the same
//!   `Arc<dyn SandboxProvider>`, in alternating rounds. `layered_exec_ns` is the median over
//!   rounds of (checked − bare) nanoseconds per call. The service's full stack also has the
//!   metrics layer, which lives in `sandbox-app` (the composition root, which nothing may depend
//!   on), so it is not in this figure; `cargo xtask bench layers` measures the whole
//!   `Metered(Checked(fake))` stack the same way.
//!
//! Throughput rounds are sized to about 0.3 s each after a warm-up; the best of 9 rounds is the
//! headline (the least-disturbed run, as in the `core` suite), the median is printed as a raw
//! line. Prints raw lines, then one `BENCH session <key>=<value>` line per headline figure.
//! `--smoke` runs tiny versions (CI only checks that the bench works).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A bench binary reports on stdout.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::{
    BindingKey, BindingStore, ConfigId, ConnectRequest, CreateRequest, ExecRequest, ListFilter,
    PermissiveSessionExistence, SandboxProvider, narrow, owner_metadata,
};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::{FakeOp, FakeProvider};
use tokio::runtime::Runtime;

/// Goal from the issue: resolves per second of an already-bound session.
const GOAL_BOUND_PER_S: f64 = 20_000.0;
/// The fake's create latency in the "realistic" first-resolve run.
const CREATE_LATENCY: Duration = Duration::from_millis(5);
const TENANT: u64 = 42;

struct Plan {
    smoke: bool,
    /// Throughput rounds per figure.
    rounds: usize,
    /// Target duration of one throughput round.
    round_target: Duration,
    /// Concurrent first resolves.
    sessions: usize,
    /// First-resolve rounds with and without create latency.
    first_rounds: usize,
    first_rounds_nolatency: usize,
}

impl Plan {
    fn new(smoke: bool) -> Self {
        if smoke {
            Plan {
                smoke,
                rounds: 2,
                round_target: Duration::from_millis(10),
                sessions: 500,
                first_rounds: 1,
                first_rounds_nolatency: 1,
            }
        } else {
            Plan {
                smoke,
                rounds: 9,
                round_target: Duration::from_millis(300),
                sessions: 500,
                first_rounds: 60,
                first_rounds_nolatency: 60,
            }
        }
    }
}

/// One coordinator over a fresh fake and a fresh memory store.
struct Env {
    fake: sandbox_core::Checked<FakeProvider>,
    provider: Arc<dyn SandboxProvider>,
    store: Arc<dyn BindingStore>,
    memory: MemoryBindingStore,
    lifecycle: Lifecycle,
}

fn env() -> Env {
    let fake = FakeProvider::new();
    let memory = MemoryBindingStore::new();
    let provider: Arc<dyn SandboxProvider> = Arc::new(fake.clone());
    let store: Arc<dyn BindingStore> = Arc::new(memory.clone());
    let config = LifecycleConfig {
        config_id: ConfigId::new("cfg-bench").unwrap(),
        create_request: CreateRequest::new(FakeProvider::template()),
        requires_inbound_token: true,
    };
    let lifecycle = Lifecycle::new(
        provider.clone(),
        store.clone(),
        Arc::new(PermissiveSessionExistence),
        config,
    )
    .unwrap();
    Env {
        fake,
        provider,
        store,
        memory,
        lifecycle,
    }
}

fn key(name: &str) -> BindingKey {
    BindingKey::new(TENANT, name).unwrap()
}

/// A loop body: `n` sequential resolves (or baseline equivalents) of one session.
type Loop = Arc<dyn Fn(BindingKey, u64) -> tokio::task::JoinHandle<()> + Send + Sync>;

fn resolve_loop(lifecycle: &Lifecycle) -> Loop {
    let lifecycle = lifecycle.clone();
    Arc::new(move |key, n| {
        let lifecycle = lifecycle.clone();
        tokio::spawn(async move {
            for _ in 0..n {
                black_box(lifecycle.resolve(black_box(&key)).await.unwrap());
            }
        })
    })
}

/// The baseline: the binding read and the combined connect-and-probe, nothing else.
fn raw_loop(provider: &Arc<dyn SandboxProvider>, store: &Arc<dyn BindingStore>) -> Loop {
    let (provider, store) = (provider.clone(), store.clone());
    Arc::new(move |key, n| {
        let (provider, store) = (provider.clone(), store.clone());
        tokio::spawn(async move {
            for _ in 0..n {
                let binding = store.get(black_box(&key)).await.unwrap().unwrap();
                let probe = narrow::connect_probe(&*provider).unwrap();
                let handle = probe
                    .connect_session(ConnectRequest {
                        sandbox_id: binding.sandbox_id.clone(),
                        traffic_token: binding.traffic_token.clone(),
                    })
                    .await
                    .unwrap();
                black_box(handle);
            }
        })
    })
}

/// Runs `body` on every key at once, `n` iterations each; the wall time.
fn run_once(rt: &Runtime, body: &Loop, keys: &[BindingKey], n: u64) -> Duration {
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = keys.iter().map(|k| body(k.clone(), n)).collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// Operations per second summed over `keys` (one task per key), for the coordinator and the
/// baseline.
struct Pair {
    ours_best: f64,
    ours_median: f64,
    raw_best: f64,
    raw_median: f64,
    /// Median over rounds of coordinator time per op / baseline time per op, each round's two
    /// runs back to back so that drift on a shared machine hits both.
    ratio: f64,
}

fn rounds_of(plan: &Plan, rt: &Runtime, body: &Loop, keys: &[BindingKey]) -> u64 {
    let warm = if plan.smoke { 200 } else { 20_000 };
    let took = run_once(rt, body, keys, warm);
    let per_op = took.as_secs_f64() / warm as f64;
    ((plan.round_target.as_secs_f64() / per_op) as u64).max(100)
}

fn best_and_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

/// The plan's rounds of coordinator and baseline, alternating (and alternating which goes
/// first), each run sized by a warm-up to about `round_target`.
fn throughput(rt: &Runtime, plan: &Plan, ours: &Loop, raw: &Loop, keys: &[BindingKey]) -> Pair {
    let n_ours = rounds_of(plan, rt, ours, keys);
    let n_raw = rounds_of(plan, rt, raw, keys);
    let rate = |n: u64, wall: Duration| (n as f64 * keys.len() as f64) / wall.as_secs_f64();
    let (mut ours_rates, mut raw_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let (o, r) = if round % 2 == 0 {
            let o = run_once(rt, ours, keys, n_ours);
            (o, run_once(rt, raw, keys, n_raw))
        } else {
            let r = run_once(rt, raw, keys, n_raw);
            (run_once(rt, ours, keys, n_ours), r)
        };
        let (o, r) = (rate(n_ours, o), rate(n_raw, r));
        ours_rates.push(o);
        raw_rates.push(r);
        ratios.push(r / o);
    }
    let (ours_best, ours_median) = best_and_median(ours_rates);
    let (raw_best, raw_median) = best_and_median(raw_rates);
    Pair {
        ours_best,
        ours_median,
        raw_best,
        raw_median,
        ratio: best_and_median(ratios).1,
    }
}

/// Per-call nanoseconds of `exec` of `true` through `layered` and `bare` on `sandbox`, in
/// alternating rounds of `calls` each: (median layered, median bare, median of the per-round
/// differences).
fn exec_overhead(
    rt: &Runtime,
    layered: &Arc<dyn SandboxProvider>,
    bare: &Arc<dyn SandboxProvider>,
    sandbox: &sandbox_core::SandboxHandle,
    rounds: usize,
    calls: u32,
) -> (f64, f64, f64) {
    let per_call = |provider: &Arc<dyn SandboxProvider>| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..calls {
                let r = provider
                    .exec(sandbox, ExecRequest::argv("true", Vec::<String>::new()))
                    .await
                    .unwrap();
                black_box(r);
            }
            start.elapsed().as_secs_f64() * 1e9 / f64::from(calls)
        })
    };
    // Warm both paths once.
    per_call(layered);
    per_call(bare);
    let (mut l, mut b, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let (x, y) = if round % 2 == 0 {
            let x = per_call(layered);
            (x, per_call(bare))
        } else {
            let y = per_call(bare);
            (per_call(layered), y)
        };
        l.push(x);
        b.push(y);
        diff.push(x - y);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(l), median(b), median(diff))
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct FirstResolves {
    /// From the barrier's release (when every resolve was issued) to each answer, sorted.
    latencies: Vec<Duration>,
    /// The resolve call alone (from the task's first poll after the barrier), sorted.
    calls: Vec<Duration>,
    /// From the barrier's release to the last answer, one per round, sorted.
    walls: Vec<Duration>,
}

impl FirstResolves {
    fn p(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }
    fn call_p(&self, p: f64) -> Duration {
        percentile(&self.calls, p)
    }
    fn wall_median(&self) -> Duration {
        self.walls[self.walls.len() / 2]
    }
}

/// `rounds` rounds of `sessions` concurrent first resolves, each round on a fresh environment.
fn first_resolves(
    rt: &Runtime,
    sessions: usize,
    rounds: usize,
    latency: Option<Duration>,
) -> FirstResolves {
    let mut r = FirstResolves {
        latencies: Vec::with_capacity(sessions * rounds),
        calls: Vec::with_capacity(sessions * rounds),
        walls: Vec::with_capacity(rounds),
    };
    for round in 0..rounds {
        let e = env();
        if let Some(latency) = latency {
            e.fake.set_latency(FakeOp::Create, latency);
        }
        let keys: Vec<BindingKey> = (0..sessions)
            .map(|i| key(&format!("first-{round}-{i}")))
            .collect();
        let (released, spans) = rt.block_on(async {
            // Every task waits at the barrier, so all resolves are issued at once.
            let barrier = Arc::new(tokio::sync::Barrier::new(keys.len() + 1));
            let tasks: Vec<_> = keys
                .iter()
                .map(|k| {
                    let (lifecycle, barrier, k) = (e.lifecycle.clone(), barrier.clone(), k.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let start = Instant::now();
                        black_box(lifecycle.resolve(&k).await.unwrap());
                        (start, Instant::now())
                    })
                })
                .collect();
            barrier.wait().await;
            let released = Instant::now();
            let mut spans = Vec::with_capacity(tasks.len());
            for t in tasks {
                spans.push(t.await.unwrap());
            }
            (released, spans)
        });
        assert_eq!(
            e.fake.sandbox_ids().len(),
            sessions,
            "one sandbox a session"
        );
        assert_eq!(e.memory.binding_count(), sessions, "one binding a session");
        // The release is the earliest moment anyone saw the barrier open.
        let released = spans.iter().map(|s| s.0).fold(released, Instant::min);
        let last = spans.iter().map(|s| s.1).fold(released, Instant::max);
        for (start, end) in spans {
            r.latencies.push(end - released);
            r.calls.push(end - start);
        }
        r.walls.push(last - released);
    }
    r.latencies.sort();
    r.calls.sort();
    r.walls.sort();
    r
}

/// What one first resolve's recovery step costs on the fake once `sessions` sandboxes exist:
/// the best time of a `list` with a new session's ownership filter (it matches nothing).
fn fake_list_cost(rt: &Runtime, sessions: usize, tries: usize) -> Duration {
    let e = env();
    rt.block_on(async {
        for i in 0..sessions {
            e.lifecycle
                .resolve(&key(&format!("list-{i}")))
                .await
                .unwrap();
        }
        let filter = ListFilter {
            metadata: owner_metadata::for_session(
                &key("list-new"),
                e.provider.provider(),
                &e.lifecycle.config().config_id,
            ),
            states: Vec::new(),
        };
        let mut best = Duration::MAX;
        for _ in 0..tries {
            let start = Instant::now();
            let found = e.provider.list(black_box(&filter)).await.unwrap();
            best = best.min(start.elapsed());
            assert!(found.is_empty());
        }
        best
    })
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let plan = Plan::new(smoke);
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // 1. Bound resolves. Three sessions bound by a first resolve; the loops only reconnect.
    let e = env();
    let bound: Vec<BindingKey> = ["bound-a", "bound-b", "bound-c"].map(key).into();
    rt.block_on(async {
        for k in &bound {
            e.lifecycle.resolve(k).await.unwrap();
        }
    });
    assert_eq!(e.fake.sandbox_ids().len(), bound.len());
    let one = &bound[..1];
    let two = &bound[1..];
    let coordinator = resolve_loop(&e.lifecycle);
    let raw = raw_loop(&e.provider, &e.store);

    let single = throughput(&rt, &plan, &coordinator, &raw, one);
    let double = throughput(&rt, &plan, &coordinator, &raw, two);
    // Nothing was created by the loops: every resolve found its binding and reconnected.
    assert_eq!(e.fake.sandbox_ids().len(), bound.len());
    assert_eq!(e.fake.calls(FakeOp::Create), bound.len());
    assert_eq!(
        e.memory.lock_entries(),
        0,
        "idle lifecycle locks are retired"
    );

    // 2. Layered exec: the checked fake against the bare one, on one sandbox.
    let checked = FakeProvider::new();
    let layered: Arc<dyn SandboxProvider> = Arc::new(checked.clone());
    let bare: Arc<dyn SandboxProvider> = Arc::new(checked.inner().clone());
    let sandbox = rt
        .block_on(layered.create(CreateRequest::new(FakeProvider::template())))
        .unwrap();
    let (exec_rounds, exec_calls) = if smoke { (3, 200) } else { (31, 20_000) };
    let (layered_ns, bare_ns, added_ns) =
        exec_overhead(&rt, &layered, &bare, &sandbox, exec_rounds, exec_calls);

    // 3. First resolves.
    let with_latency = first_resolves(&rt, plan.sessions, plan.first_rounds, Some(CREATE_LATENCY));
    let without = first_resolves(&rt, plan.sessions, plan.first_rounds_nolatency, None);
    let list_cost = fake_list_cost(&rt, plan.sessions, if smoke { 3 } else { 50 });

    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "runtime: tokio multi-thread, 2 workers; fake provider (connect_probe), memory store, \
         PermissiveSessionExistence, requires_inbound_token = true"
    );
    println!(
        "throughput: {} rounds of ~{} ms per figure after a warm-up, best round reported",
        plan.rounds,
        plan.round_target.as_millis()
    );
    for (label, p, tasks) in [
        ("1 task", &single, 1.0),
        ("2 tasks on 2 sessions", &double, 2.0),
    ] {
        println!(
            "bound resolve, {label}: best {:.0}/s ({:.2} us/op per task), median {:.0}/s",
            p.ours_best,
            1e6 * tasks / p.ours_best,
            p.ours_median,
        );
        println!(
            "bound raw get + connect_session (baseline), {label}: best {:.0}/s ({:.2} us/op per task), median {:.0}/s",
            p.raw_best,
            1e6 * tasks / p.raw_best,
            p.raw_median,
        );
        println!(
            "coordinator / baseline time per op, {label}: {:.2} (median of back-to-back round pairs)",
            p.ratio
        );
    }
    println!(
        "2 tasks vs 1: coordinator {:.2}x, baseline {:.2}x (best rounds)",
        double.ours_best / single.ours_best,
        double.raw_best / single.raw_best
    );
    println!(
        "coordinator overhead per bound resolve (best rounds): {:.2} us over the baseline",
        1e6 / single.ours_best - 1e6 / single.raw_best
    );
    println!(
        "goal: >= {GOAL_BOUND_PER_S:.0} bound resolves/s (1 task): {}",
        if single.ours_best >= GOAL_BOUND_PER_S {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "headline bound_resolves_per_s is the 1-task figure: one session's resolves are \
         serialised by its lifecycle lock, so per-session throughput is what a caller sees; \
         the 2-task figure shows how the shared store and fake scale across cores"
    );
    for (label, r, rounds, lat) in [
        (
            format!("create latency {} ms", CREATE_LATENCY.as_millis()),
            &with_latency,
            plan.first_rounds,
            "5 ms",
        ),
        (
            "no create latency".to_owned(),
            &without,
            plan.first_rounds_nolatency,
            "0 ms",
        ),
    ] {
        println!(
            "first resolves, {} concurrent, {label} (fake create sleeps {lat}), {rounds} rounds: \
             issue-to-answer p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
             wall median {:.2} ms (min {:.2}, max {:.2})",
            plan.sessions,
            ms(r.p(50.0)),
            ms(r.p(90.0)),
            ms(r.p(99.0)),
            ms(r.p(100.0)),
            ms(r.wall_median()),
            ms(r.walls[0]),
            ms(r.walls[r.walls.len() - 1]),
        );
        println!(
            "  the resolve call alone (from its task's first poll, without the wait for a \
             worker): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(r.call_p(50.0)),
            ms(r.call_p(99.0)),
            ms(r.call_p(100.0)),
        );
    }
    println!(
        "fake list with {} sandboxes (the recovery step of a first resolve when they exist; \
         the fake clones every summary, metadata included, before filtering): {:.1} us; \
         without create latency the creates land one after another, so a burst pays about \
         {}/2 x that = {:.1} ms of CPU in lists",
        plan.sessions,
        list_cost.as_secs_f64() * 1e6,
        plan.sessions,
        ms(list_cost) * plan.sessions as f64 / 2.0,
    );
    println!(
        "exec of `true` on the fake, {exec_rounds} alternating rounds of {exec_calls} calls: \
         through the checking layer {layered_ns:.0} ns/call, bare {bare_ns:.0} ns/call (medians); \
         added by the layer {added_ns:.0} ns/call (median of the per-round differences; the \
         metrics layer is measured by `cargo xtask bench layers`)"
    );
    println!(
        "elapsed: {:.1?}",
        started.elapsed().max(Duration::from_millis(1))
    );
    println!("BENCH session bound_resolves_per_s={:.0}", single.ours_best);
    println!("BENCH session layered_exec_ns={added_ns:.0}");
    println!(
        "BENCH session bound_resolves_per_s_2tasks={:.0}",
        double.ours_best
    );
    println!("BENCH session bound_raw_per_s={:.0}", single.raw_best);
    println!(
        "BENCH session bound_raw_per_s_2tasks={:.0}",
        double.raw_best
    );
    println!("BENCH session bound_resolve_ratio={:.2}", single.ratio);
    println!(
        "BENCH session bound_resolve_ratio_2tasks={:.2}",
        double.ratio
    );
    println!(
        "BENCH session first_resolve_create_latency_ms={}",
        CREATE_LATENCY.as_millis()
    );
    println!(
        "BENCH session first_resolve_p50_ms={:.2}",
        ms(with_latency.p(50.0))
    );
    println!(
        "BENCH session first_resolve_p99_ms={:.2}",
        ms(with_latency.p(99.0))
    );
    println!(
        "BENCH session first_resolve_wall_ms={:.2}",
        ms(with_latency.wall_median())
    );
    println!(
        "BENCH session first_resolve_p50_ms_nolatency={:.2}",
        ms(without.p(50.0))
    );
    println!(
        "BENCH session first_resolve_p99_ms_nolatency={:.2}",
        ms(without.p(99.0))
    );
    println!(
        "BENCH session first_resolve_wall_ms_nolatency={:.2}",
        ms(without.wall_median())
    );
}

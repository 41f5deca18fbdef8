//! `cargo xtask bench transport`: what the guarded client costs per request, against a plain
//! hyper client on the same loopback server in the same run, on a 2-worker multi-thread tokio
//! runtime.
//!
//! The binary runs its own HTTP/1.1 server (hyper's `http1` server) on two free 127.0.0.1
//! ports; both answer every `GET` with `200` and a 2-byte body. One keeps connections alive;
//! the other answers with `Connection: close`, so neither client's pool can reuse a connection
//! and every request opens a new TCP connection.
//!
//! - Plain: hyper-util's pooled legacy `Client` over `HttpConnector` (with `TCP_NODELAY`, as the
//!   guarded dialer sets it), one request built per call.
//! - Guarded: [`GuardedClient`] (control-plane requests to `http://127.0.0.1:<port>/`, the
//!   allow-private policy, a resolver that panics if called — a literal is never resolved — the
//!   real [`TcpDialer`], and a TLS config with one test-made CA that plain HTTP never uses). Per
//!   request it routes (copies the request), and per connection it parses and judges the host
//!   and dials through the injected dialer, inside the HTTPS-or-HTTP wrapper.
//!
//! - envd: [`EnvdClient`] over the guarded connector calling `process.Process/List` (a unary
//!   Connect call: JSON request, protocol headers, deadline, JSON answer parsed), against the
//!   plain pooled hyper client posting the same bytes with the same headers and parsing the same
//!   answer. Report only: the issue sets no goal for it; it shows what the envd layer costs.
//!
//! Each request is a `GET` plus collecting the body, one in flight, in one spawned task. A round
//! runs a fixed number of requests with each client back to back, alternating which goes
//! first, so drift on a shared machine hits both. Per request latency is timed; per round, p50
//! and requests/s (requests over the run's wall time). The ratio is the median over rounds of
//! guarded p50 over plain p50 in the same round (the ratio of means is printed as a raw line).
//! The headline p50 and requests/s are the best round (the least-disturbed run). Asserts only
//! correctness: every status is 200, every body is `ok`, the keep-alive port saw few
//! connections and the close port one per request. Prints raw lines, then one
//! `BENCH transport <key>=<value>` line per headline figure. `--smoke` runs tiny versions (CI
//! only checks that the bench works).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A bench binary reports on stdout and fails loudly.

use std::convert::Infallible;
use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sandbox_envd::process::ListResponse;
use sandbox_transport::envd::{CallOptions, EnvdClient, EnvdConfig};
use sandbox_transport::gateway::{Gateway, InboundTokens};
use sandbox_transport::{
    GuardedClient, GuardedConnector, OutboundPolicy, Resolve, TcpDialer, tls_config,
};
use tokio::runtime::Runtime;

/// Goals from the issue: guarded time per request over plain.
const GOAL_POOLED: f64 = 1.05;
const GOAL_NEW_CONN: f64 = 1.10;
const BODY: &[u8] = b"ok";
const ENVD_PATH: &str = "/process.Process/List";
const ENVD_ANSWER: &[u8] = b"{\"processes\":[{\"pid\":7,\"config\":{\"cmd\":\"sh\"}}]}";

struct Plan {
    smoke: bool,
    rounds: usize,
    /// Requests per client per round, pooled and new-connection.
    pooled_n: usize,
    new_conn_n: usize,
    warm: usize,
}

impl Plan {
    fn new(smoke: bool) -> Self {
        if smoke {
            Plan {
                smoke,
                rounds: 2,
                pooled_n: 50,
                new_conn_n: 20,
                warm: 20,
            }
        } else {
            Plan {
                smoke,
                rounds: 21,
                pooled_n: 3000,
                new_conn_n: 400,
                warm: 2000,
            }
        }
    }
}

/// Any DNS lookup is a bug: every host here is a literal.
#[derive(Debug)]
struct NoDns;

#[async_trait]
impl Resolve for NoDns {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        panic!("unexpected DNS lookup of {host}")
    }
}

/// A loopback HTTP/1.1 server on a free port answering `200 ok`; keep-alive or
/// `Connection: close`. Counts the connections it accepts.
async fn server(keep_alive: bool) -> (u16, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            stream.set_nodelay(true).unwrap();
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let envd = req.uri().path() == ENVD_PATH;
                    let (body, media) = if envd {
                        (ENVD_ANSWER, "application/json")
                    } else {
                        (BODY, "text/plain")
                    };
                    let mut resp = Response::new(Full::new(Bytes::from_static(body)));
                    resp.headers_mut().insert(
                        "content-type",
                        hyper::header::HeaderValue::from_static(media),
                    );
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(keep_alive)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, accepted)
}

/// A client under test: one sequential run of `n` requests to `uri`, each request's latency.
type Run = Arc<dyn Fn(String, usize) -> tokio::task::JoinHandle<Vec<Duration>> + Send + Sync>;

async fn check(resp: Response<Incoming>) {
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], BODY);
}

fn plain_run() -> Run {
    #[expect(
        clippy::disallowed_methods,
        reason = "the unguarded baseline the guarded client is measured against, on loopback"
    )]
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(http);
    Arc::new(move |uri, n| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                let req = Request::builder()
                    .uri(black_box(uri.as_str()))
                    .body(Empty::new())
                    .unwrap();
                check(client.request(req).await.unwrap()).await;
                lat.push(start.elapsed());
            }
            lat
        })
    })
}

/// A CA nobody signs anything with: `tls_config` wants a root, plain HTTP never uses it.
fn unused_ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

fn guarded_client() -> GuardedClient<Empty<Bytes>> {
    let guard = GuardedConnector::with(
        OutboundPolicy::allow_private(),
        Arc::new(NoDns),
        Arc::new(TcpDialer::default()),
    );
    let gateway = Gateway::new(None, None, InboundTokens::default());
    let tls = tls_config(false, &[unused_ca_pem().as_bytes()]).unwrap();
    GuardedClient::new(guard, gateway, None, tls)
}

fn guarded_run() -> Run {
    let client = guarded_client();
    Arc::new(move |uri, n| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                let req = Request::builder()
                    .uri(black_box(uri.as_str()))
                    .body(Empty::new())
                    .unwrap();
                check(client.request(&req).await.unwrap()).await;
                lat.push(start.elapsed());
            }
            lat
        })
    })
}

/// The envd baseline: a plain pooled hyper client posting the call's exact bytes and headers and
/// parsing the answer into the same message type.
fn plain_envd_run() -> Run {
    #[expect(
        clippy::disallowed_methods,
        reason = "the unguarded baseline the guarded client is measured against, on loopback"
    )]
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(http);
    Arc::new(move |base, n| {
        let client = client.clone();
        let uri = format!("{}{}", base.trim_end_matches('/'), ENVD_PATH);
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                let req = Request::post(black_box(uri.as_str()))
                    .header("content-type", "application/json")
                    .header("connect-protocol-version", "1")
                    .header("connect-timeout-ms", "60000")
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                let resp = client.request(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                let body = resp.into_body().collect().await.unwrap().to_bytes();
                let answer: ListResponse = serde_json::from_slice(&body).unwrap();
                assert_eq!(answer.processes.len(), 1);
                lat.push(start.elapsed());
            }
            lat
        })
    })
}

/// The envd client over the guarded connector, built once for `base`.
fn envd_run(base: &str) -> Run {
    let guard = GuardedConnector::with(
        OutboundPolicy::allow_private(),
        Arc::new(NoDns),
        Arc::new(TcpDialer::default()),
    );
    let client = EnvdClient::new(guard, EnvdConfig::new(base).unwrap()).unwrap();
    Arc::new(move |_base, n| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let start = Instant::now();
                let processes = client.list(CallOptions::new()).await.unwrap();
                assert_eq!(black_box(processes).len(), 1);
                lat.push(start.elapsed());
            }
            lat
        })
    })
}

/// One run: its per-request latencies (sorted) and its wall time.
fn run_once(rt: &Runtime, run: &Run, uri: &str, n: usize) -> (Vec<Duration>, Duration) {
    rt.block_on(async {
        let start = Instant::now();
        let mut lat = run(uri.to_owned(), n).await.unwrap();
        let wall = start.elapsed();
        lat.sort();
        (lat, wall)
    })
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// One client's rounds of one figure.
#[derive(Default)]
struct Tally {
    p50_us: Vec<f64>,
    p99_us: Vec<f64>,
    mean_us: Vec<f64>,
    per_s: Vec<f64>,
}

impl Tally {
    fn push(&mut self, lat: &[Duration], wall: Duration) {
        self.p50_us.push(us(percentile(lat, 50.0)));
        self.p99_us.push(us(percentile(lat, 99.0)));
        self.mean_us
            .push(us(lat.iter().sum::<Duration>()) / lat.len() as f64);
        self.per_s.push(lat.len() as f64 / wall.as_secs_f64());
    }
    fn best_p50(&self) -> f64 {
        sorted(self.p50_us.clone())[0]
    }
    fn median_p50(&self) -> f64 {
        sorted(self.p50_us.clone())[self.p50_us.len() / 2]
    }
    fn median_p99(&self) -> f64 {
        sorted(self.p99_us.clone())[self.p99_us.len() / 2]
    }
    fn best_per_s(&self) -> f64 {
        sorted(self.per_s.clone())[self.per_s.len() - 1]
    }
    fn median_per_s(&self) -> f64 {
        sorted(self.per_s.clone())[self.per_s.len() / 2]
    }
}

struct Figure {
    plain: Tally,
    guarded: Tally,
}

impl Figure {
    /// Median over rounds of guarded over plain, from the same round.
    fn ratio(a: &[f64], b: &[f64]) -> f64 {
        let r: Vec<f64> = a.iter().zip(b).map(|(g, p)| g / p).collect();
        sorted(r)[a.len() / 2]
    }
    fn p50_ratio(&self) -> f64 {
        Self::ratio(&self.guarded.p50_us, &self.plain.p50_us)
    }
    fn mean_ratio(&self) -> f64 {
        Self::ratio(&self.guarded.mean_us, &self.plain.mean_us)
    }
}

/// Warm-up, then `plan.rounds` rounds of both clients back to back, alternating the order.
fn figure(rt: &Runtime, plan: &Plan, plain: &Run, guarded: &Run, uri: &str, n: usize) -> Figure {
    let warm = plan.warm.min(n * 2);
    run_once(rt, plain, uri, warm);
    run_once(rt, guarded, uri, warm);
    let mut f = Figure {
        plain: Tally::default(),
        guarded: Tally::default(),
    };
    for round in 0..plan.rounds {
        let (p, g) = if round % 2 == 0 {
            let p = run_once(rt, plain, uri, n);
            (p, run_once(rt, guarded, uri, n))
        } else {
            let g = run_once(rt, guarded, uri, n);
            (run_once(rt, plain, uri, n), g)
        };
        f.plain.push(&p.0, p.1);
        f.guarded.push(&g.0, g.1);
    }
    f
}

/// The routing step alone (what the guarded client does before hyper sees the request): best
/// ns per call over a few batches.
fn route_cost(uri: &str, smoke: bool) -> f64 {
    let gateway = Gateway::new(None, None, InboundTokens::default());
    let req = Request::builder()
        .uri(uri)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let n = if smoke { 1_000 } else { 200_000 };
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            black_box(gateway.route(black_box(&req)).unwrap());
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    best
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

    let ((keep_port, keep_accepted), (close_port, close_accepted)) =
        rt.block_on(async { (server(true).await, server(false).await) });
    let keep_uri = format!("http://127.0.0.1:{keep_port}/");
    let close_uri = format!("http://127.0.0.1:{close_port}/");
    let (plain, guarded) = (plain_run(), guarded_run());

    let pooled = figure(&rt, &plan, &plain, &guarded, &keep_uri, plan.pooled_n);
    let pooled_conns = keep_accepted.load(Ordering::Relaxed);
    // Two pools, one request in flight each: a handful of connections at most (a pooled
    // connection the server or the pool dropped is replaced, nothing more).
    assert!(
        pooled_conns <= 8,
        "the keep-alive port accepted {pooled_conns} connections"
    );

    let new_conn = figure(&rt, &plan, &plain, &guarded, &close_uri, plan.new_conn_n);
    let close_conns = close_accepted.load(Ordering::Relaxed);
    let close_requests = 2 * (plan.rounds * plan.new_conn_n + plan.warm.min(plan.new_conn_n * 2));
    assert_eq!(
        close_conns, close_requests as u64,
        "one connection per request on the close port"
    );
    let envd = figure(
        &rt,
        &plan,
        &plain_envd_run(),
        &envd_run(&keep_uri),
        &keep_uri,
        plan.pooled_n,
    );
    let route_ns = route_cost(&keep_uri, smoke);

    println!("mode: {}", if plan.smoke { "smoke" } else { "full" });
    println!(
        "runtime: tokio multi-thread, 2 workers; loopback hyper http1 server in the same \
         runtime, 200 with a {}-byte body; GET + body collect, 1 request in flight",
        BODY.len()
    );
    println!(
        "rounds: {} per figure, {} (pooled) / {} (new connection) requests per client per \
         round, clients back to back alternating which goes first",
        plan.rounds, plan.pooled_n, plan.new_conn_n
    );
    println!(
        "connections accepted: keep-alive port {pooled_conns} (over {} requests), close port \
         {close_conns} (one per request)",
        2 * (plan.rounds * plan.pooled_n + plan.warm.min(plan.pooled_n * 2))
    );
    for (label, f) in [
        ("pooled", &pooled),
        ("new connection", &new_conn),
        ("envd unary (plain = raw hyper POST)", &envd),
    ] {
        for (name, t) in [("plain", &f.plain), ("guarded", &f.guarded)] {
            println!(
                "{label}, {name}: p50 best {:.1} us, median {:.1} us; p99 median {:.1} us; \
                 {:.0} req/s best, {:.0} req/s median",
                t.best_p50(),
                t.median_p50(),
                t.median_p99(),
                t.best_per_s(),
                t.median_per_s(),
            );
        }
        println!(
            "{label}, guarded / plain: p50 {:.3}, mean {:.3} (median of per-round ratios); \
             extra p50 {:.1} us (best rounds)",
            f.p50_ratio(),
            f.mean_ratio(),
            f.guarded.best_p50() - f.plain.best_p50(),
        );
    }
    println!("Gateway::route alone (a control-plane GET, best batch): {route_ns:.0} ns per call");
    for (label, ratio, goal) in [
        ("pooled_ratio", pooled.p50_ratio(), GOAL_POOLED),
        ("new_conn_ratio", new_conn.p50_ratio(), GOAL_NEW_CONN),
    ] {
        println!(
            "goal: {label} <= {goal:.2}: {}",
            if ratio <= goal { "met" } else { "MISSED" }
        );
    }
    println!(
        "elapsed: {:.1?}",
        started.elapsed().max(Duration::from_millis(1))
    );
    println!("envd_unary_ratio: report only (no goal in the issue)");
    println!("BENCH transport pooled_ratio={:.3}", pooled.p50_ratio());
    println!("BENCH transport envd_unary_ratio={:.3}", envd.p50_ratio());
    println!(
        "BENCH transport envd_unary_p50_us={:.1}",
        envd.guarded.best_p50()
    );
    println!("BENCH transport new_conn_ratio={:.3}", new_conn.p50_ratio());
    println!(
        "BENCH transport pooled_plain_p50_us={:.1}",
        pooled.plain.best_p50()
    );
    println!(
        "BENCH transport pooled_guarded_p50_us={:.1}",
        pooled.guarded.best_p50()
    );
    println!(
        "BENCH transport new_conn_plain_p50_us={:.1}",
        new_conn.plain.best_p50()
    );
    println!(
        "BENCH transport new_conn_guarded_p50_us={:.1}",
        new_conn.guarded.best_p50()
    );
    println!(
        "BENCH transport pooled_plain_per_s={:.0}",
        pooled.plain.best_per_s()
    );
    println!(
        "BENCH transport pooled_guarded_per_s={:.0}",
        pooled.guarded.best_per_s()
    );
    println!(
        "BENCH transport new_conn_plain_per_s={:.0}",
        new_conn.plain.best_per_s()
    );
    println!(
        "BENCH transport new_conn_guarded_per_s={:.0}",
        new_conn.guarded.best_per_s()
    );
}

//! Faults of the E2B control plane under sessions, through two real processes: A is `sandbox
//! serve` with `provider = "e2b"`, B the E2B-compatible API over the Docker engine, and
//! between them, on the control plane only, a fault-injecting proxy this test scripts
//! ([`FaultProxy`]). envd traffic goes to B directly (`proxy_url`), so a fault here is one of
//! the plane, never of a sandbox.
//!
//! - Once a session is bound, a 500, a hang past A's deadline and a reset connection each make
//!   the session's next call fail with a provider error, and leave the binding alone: once the
//!   fault clears the same sandbox answers, B still holds the one container, and A never
//!   recovered or created another (its resolve metrics say so).
//! - A create answered 503 twice and then passed makes exactly one sandbox on B (the adapter
//!   sends a create again only after a list by its create marker found nothing).
//! - A call whose caller hangs up while A waits on the plane is dropped as a whole: A abandons
//!   its request to the plane, records no provider error for it, and keeps the binding.
//!
//! Needs the engine, the Debian image (`SANDBOX_TEST_DEBIAN_IMAGE`, `cargo xtask debian-image`)
//! and the static agent (`SANDBOX_AGENT_BIN`, `cargo xtask agent`).

// Needs the Docker backend (B), the E2B backend (A) and the E2B API (B) compiled in.
#![cfg(all(feature = "docker", feature = "e2b", feature = "e2b-api"))]
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::support::container_ids;
use crate::support::e2b::E2bServe;
use crate::support::e2b_backend::{E2bBacked, metric_sum, metric_with};

/// The session every case binds first.
const SESSION: &str = "steady";
/// The largest request head the proxy reads.
const HEAD_LIMIT: usize = 64 * 1024;
/// Generous: how long the proxy's own observations (a request arriving, a connection
/// abandoned) may take on a busy machine.
const SEEN_DEADLINE: Duration = Duration::from_secs(60);
/// A's deadline for control-plane calls in the hang case: short, so the case does not wait
/// long, and far above what B needs for a connect or a read.
const SHORT_DEADLINE: &str = "5";
/// A's deadlines when nothing in the case should time out on its own.
const LONG_DEADLINE: &str = "600";

/// What the proxy does with a request a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Answers this status with an E2B error body (`Retry-After: 1` on 429 and 503).
    Status(u16),
    /// Reads the request and never answers, until the rules are cleared (then it closes).
    Hang,
    /// Reads the request head, then resets the connection (RST, no answer).
    Reset,
}

/// A scripted fault: requests whose method and path (without the query) match get `fault`,
/// `times` times (`None`: until cleared).
#[derive(Debug, Clone)]
struct Rule {
    method: Option<&'static str>,
    path: Option<String>,
    fault: Fault,
    times: Option<usize>,
}

impl Rule {
    /// Every request.
    fn all(fault: Fault) -> Rule {
        Rule {
            method: None,
            path: None,
            fault,
            times: None,
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method.is_none_or(|m| m == method) && self.path.as_deref().is_none_or(|p| p == path)
    }
}

/// One request the proxy saw, and what it did with it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    fault: Option<Fault>,
}

#[derive(Debug, Default)]
struct Table {
    rules: Vec<Rule>,
    seen: Vec<Seen>,
    /// Hung requests whose client closed its connection while waiting.
    abandoned: usize,
}

/// A proxy in front of B's E2B listener. Each connection carries one request: the proxy
/// reads its head, decides by the rules, and either applies the fault or passes the request
/// on with `Connection: close` (so B closes after answering and A opens a new connection for
/// its next call, which the proxy then judges afresh).
struct FaultProxy {
    addr: SocketAddr,
    table: Arc<Mutex<Table>>,
    /// Bumped when the rules are cleared: hung requests let go.
    release: watch::Sender<u64>,
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FaultProxy {
    async fn start(upstream: &str) -> FaultProxy {
        let upstream: SocketAddr = upstream
            .strip_prefix("http://")
            .expect("B's listener is plain HTTP")
            .parse()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let table = Arc::new(Mutex::new(Table::default()));
        let (release, _) = watch::channel(0u64);
        let (t, r) = (table.clone(), release.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (t, r) = (t.clone(), r.subscribe());
                tokio::spawn(async move {
                    // A failed forward is the test's to notice through A's answers.
                    let _ = one_request(client, upstream, t, r).await;
                });
            }
        });
        FaultProxy {
            addr,
            table,
            release,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn push(&self, rule: Rule) {
        lock(&self.table).rules.push(rule);
    }

    /// Removes every rule and lets hung requests go.
    fn clear(&self) {
        lock(&self.table).rules.clear();
        self.release.send_modify(|n| *n += 1);
    }

    fn seen(&self) -> Vec<Seen> {
        lock(&self.table).seen.clone()
    }

    fn faulted(&self) -> usize {
        self.seen().iter().filter(|s| s.fault.is_some()).count()
    }

    fn abandoned(&self) -> usize {
        lock(&self.table).abandoned
    }

    /// Waits until `done` holds of the table; panics with what was seen after
    /// [`SEEN_DEADLINE`].
    async fn wait_for(&self, what: &str, done: impl Fn(&Table) -> bool) {
        let start = Instant::now();
        loop {
            if done(&lock(&self.table)) {
                return;
            }
            assert!(
                start.elapsed() < SEEN_DEADLINE,
                "the proxy did not see {what} within {SEEN_DEADLINE:?}: {:?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Where the head ends (the index after its blank line).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

async fn one_request(
    mut client: TcpStream,
    upstream: SocketAddr,
    table: Arc<Mutex<Table>>,
    mut release: watch::Receiver<u64>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let end = loop {
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if buf.len() > HEAD_LIMIT {
            return Ok(());
        }
        let mut chunk = [0u8; 8192];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_owned();
    let target = request_line.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    let length: usize = headers
        .iter()
        .find_map(|h| {
            let (name, value) = h.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);

    let fault = {
        let mut t = lock(&table);
        let found = t.rules.iter().position(|r| r.matches(&method, &path));
        let fault = found.map(|i| {
            let fault = t.rules[i].fault;
            if let Some(left) = t.rules[i].times.as_mut() {
                *left -= 1;
                if *left == 0 {
                    t.rules.remove(i);
                }
            }
            fault
        });
        t.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            fault,
        });
        fault
    };

    match fault {
        None => {
            #[expect(
                clippy::disallowed_methods,
                reason = "a test's proxy in front of the loopback service it spawned, not a tenant-supplied endpoint"
            )]
            let mut server = TcpStream::connect(upstream).await?;
            // The head again, with this hop's connection handling: one request per connection.
            let mut out = String::new();
            out.push_str(head.split("\r\n").next().unwrap_or_default());
            out.push_str("\r\n");
            for h in &headers {
                let name = h.split(':').next().unwrap_or_default().trim();
                if name.eq_ignore_ascii_case("connection")
                    || name.eq_ignore_ascii_case("keep-alive")
                {
                    continue;
                }
                out.push_str(h);
                out.push_str("\r\n");
            }
            out.push_str("connection: close\r\n\r\n");
            server.write_all(out.as_bytes()).await?;
            server.write_all(&buf[end..]).await?;
            tokio::io::copy_bidirectional(&mut client, &mut server).await?;
        }
        Some(Fault::Status(status)) => {
            // The body first, so the client is never cut off mid-send.
            let mut left = length.saturating_sub(buf.len() - end);
            let mut sink = [0u8; 8192];
            while left > 0 {
                let n = client.read(&mut sink).await?;
                if n == 0 {
                    break;
                }
                left = left.saturating_sub(n);
            }
            let body = format!(r#"{{"code":{status},"message":"injected by the test's proxy"}}"#);
            let retry = if matches!(status, 429 | 503) {
                "retry-after: 1\r\n"
            } else {
                ""
            };
            let answer = format!(
                "HTTP/1.1 {status} Injected\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n{body}",
                body.len()
            );
            client.write_all(answer.as_bytes()).await?;
            client.shutdown().await?;
        }
        Some(Fault::Hang) => {
            // Holds the request unanswered: ends when the client gives up (counted) or the
            // rules are cleared.
            let mut sink = [0u8; 8192];
            loop {
                tokio::select! {
                    read = client.read(&mut sink) => {
                        if matches!(read, Ok(0) | Err(_)) {
                            lock(&table).abandoned += 1;
                            return Ok(());
                        }
                    }
                    _ = release.changed() => return Ok(()),
                }
            }
        }
        Some(Fault::Reset) => {
            client.set_zero_linger()?;
            drop(client);
        }
    }
    Ok(())
}

/// B, the proxy in front of its control plane, A behind the proxy with `env`, and
/// [`SESSION`] bound to one sandbox on B.
struct Rig {
    b: E2bServe,
    proxy: FaultProxy,
    a: E2bBacked,
    /// The E2B sandbox ID A bound the session to.
    sandbox: String,
    /// B's one container (short ID, as `container_ids` lists it).
    container: String,
}

impl Rig {
    async fn bound(prefix: &str, env: &[(&str, &str)]) -> Rig {
        let b = E2bServe::start(prefix).await;
        let proxy = FaultProxy::start(&b.e2b).await;
        let a = E2bBacked::start(&b, &proxy.url(), env, "").await;
        assert_eq!(a.exec_ok(SESSION, "echo", &["hi"]).await, "hi\n");
        let containers = container_ids(&b.namespace).await;
        assert_eq!(containers.len(), 1, "one sandbox on B: {containers:?}");
        let sandbox = a.bound_sandbox(SESSION).await;
        Rig {
            b,
            proxy,
            a,
            sandbox,
            container: containers[0].clone(),
        }
    }

    /// An exec on the session while the plane is faulted: a provider error (5xx, a
    /// `provider_*` code), never a new sandbox. Its status and code.
    async fn exec_fails(&self, what: &str) -> (u16, String) {
        let (status, out) = self
            .a
            .call(
                "POST",
                &format!("/v1/sessions/{SESSION}/exec"),
                r#"{"command":"echo","args":["hi"]}"#,
            )
            .await;
        let code = out["error"]["code"].as_str().unwrap_or_default().to_owned();
        assert!(
            (500..600).contains(&status) && status != 501 && code.starts_with("provider_"),
            "{what}: the exec answered {status} {out}, expected a provider error\n{}",
            self.a.context()
        );
        assert_eq!(
            container_ids(&self.b.namespace).await,
            std::slice::from_ref(&self.container),
            "{what}: B still holds exactly the one sandbox"
        );
        (status, code)
    }

    /// Clears the faults; then the session answers from the same sandbox, B holds only it,
    /// and A never recovered or created another.
    async fn kept(&self, what: &str) {
        self.proxy.clear();
        assert_eq!(
            self.a.exec_ok(SESSION, "echo", &["again"]).await,
            "again\n",
            "{what}: the session answers once the fault clears"
        );
        assert_eq!(
            self.a.bound_sandbox(SESSION).await,
            self.sandbox,
            "{what}: the binding names the same sandbox"
        );
        assert_eq!(
            container_ids(&self.b.namespace).await,
            std::slice::from_ref(&self.container),
            "{what}: B holds the same single container"
        );
        let labelled = self.b.e2b_containers(&self.sandbox).await;
        assert!(
            labelled.len() == 1 && labelled[0].starts_with(&self.container),
            "{what}: B's container is still sandbox {}: {labelled:?}",
            self.sandbox
        );
        let metrics = self.a.metrics().await;
        let outcome =
            |o: &str| metric_with(&metrics, "sandbox_session_resolves_total", "outcome", o);
        assert_eq!(
            (outcome("created"), outcome("recovered")),
            (1.0, 0.0),
            "{what}: A created one sandbox and never had to recover the binding: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn a_control_plane_answering_500_keeps_the_binding() {
    let rig = Rig::bound("te2bf500", &[]).await;
    let errors_before = metric_sum(&rig.a.metrics().await, "sandbox_provider_errors_total");
    rig.proxy.push(Rule::all(Fault::Status(500)));
    let (status, code) = rig.exec_fails("500").await;
    assert_eq!(
        (status, code.as_str()),
        (503, "provider_unavailable"),
        "a 5xx of the plane is unavailable"
    );
    assert!(rig.proxy.faulted() >= 1, "{:?}", rig.proxy.seen());
    // A failed call is counted, on the counter the dropped-call case finds unmoved.
    let metrics = rig.a.metrics().await;
    assert!(
        metric_with(
            &metrics,
            "sandbox_provider_errors_total",
            "kind",
            "unavailable"
        ) >= 1.0
            && metric_sum(&metrics, "sandbox_provider_errors_total") > errors_before,
        "the plane's 500 is a counted provider error: {metrics}"
    );
    rig.kept("500").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn a_control_plane_hanging_past_the_deadline_keeps_the_binding() {
    let rig = Rig::bound(
        "te2bfhang",
        &[
            ("SANDBOX_E2B_PROVIDER_HTTP_TIMEOUT_SECONDS", SHORT_DEADLINE),
            (
                "SANDBOX_E2B_PROVIDER_CONNECT_TIMEOUT_SECONDS",
                SHORT_DEADLINE,
            ),
        ],
    )
    .await;
    rig.proxy.push(Rule::all(Fault::Hang));
    let (_, code) = rig.exec_fails("hang").await;
    assert_eq!(code, "provider_timeout", "a passed deadline is a timeout");
    // A gave up on each hung request itself (its deadline dropped the connection).
    assert!(
        rig.proxy.abandoned() >= 1,
        "A abandoned its hung requests: {:?}",
        rig.proxy.seen()
    );
    rig.kept("hang").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn a_control_plane_resetting_connections_keeps_the_binding() {
    let rig = Rig::bound("te2bfrst", &[]).await;
    rig.proxy.push(Rule::all(Fault::Reset));
    let (status, code) = rig.exec_fails("reset").await;
    assert_eq!(
        (status, code.as_str()),
        (503, "provider_unavailable"),
        "a reset connection is unavailable"
    );
    assert!(rig.proxy.faulted() >= 1, "{:?}", rig.proxy.seen());
    rig.kept("reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn a_create_refused_503_twice_makes_one_sandbox() {
    let b = E2bServe::start("te2bf503").await;
    let proxy = FaultProxy::start(&b.e2b).await;
    let a = E2bBacked::start(&b, &proxy.url(), &[], "").await;
    proxy.push(Rule {
        method: Some("POST"),
        path: Some("/sandboxes".to_owned()),
        fault: Fault::Status(503),
        times: Some(2),
    });
    assert_eq!(a.exec_ok("fresh", "echo", &["hi"]).await, "hi\n");
    let containers = container_ids(&b.namespace).await;
    assert_eq!(
        containers.len(),
        1,
        "two refused creates and one passed made one sandbox: {containers:?}"
    );
    let seen = proxy.seen();
    let creates: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.method == "POST" && s.path == "/sandboxes")
        .collect();
    assert_eq!(
        creates.iter().map(|s| s.fault).collect::<Vec<_>>(),
        [Some(Fault::Status(503)), Some(Fault::Status(503)), None],
        "the create was sent three times, the last one passed: {seen:?}"
    );
    // Each resend came after a list (by the create marker) that found nothing.
    let create_at: Vec<usize> = seen
        .iter()
        .enumerate()
        .filter(|(_, s)| s.method == "POST" && s.path == "/sandboxes")
        .map(|(i, _)| i)
        .collect();
    for pair in create_at.windows(2) {
        assert!(
            seen[pair[0]..pair[1]]
                .iter()
                .any(|s| s.method == "GET" && s.path == "/v2/sandboxes"),
            "a list between two creates: {seen:?}"
        );
    }
    let listed = b.cp("GET", "/v2/sandboxes", &b.key_a, "").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert_eq!(
        listed.json().as_array().map(Vec::len),
        Some(1),
        "B's own listing holds one sandbox: {}",
        listed.text()
    );
    let metrics = a.metrics().await;
    assert_eq!(
        metric_with(
            &metrics,
            "sandbox_session_resolves_total",
            "outcome",
            "created"
        ),
        1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Docker engine, the Debian image and the static agent: cargo xtask test runs it"]
async fn a_call_dropped_mid_request_keeps_the_binding_and_counts_no_error() {
    // A's own deadlines far away: only the caller's hang-up may end the call.
    let rig = Rig::bound(
        "te2bfdrop",
        &[
            ("SANDBOX_E2B_PROVIDER_HTTP_TIMEOUT_SECONDS", LONG_DEADLINE),
            (
                "SANDBOX_E2B_PROVIDER_CONNECT_TIMEOUT_SECONDS",
                LONG_DEADLINE,
            ),
        ],
    )
    .await;
    let errors_before = metric_sum(&rig.a.metrics().await, "sandbox_provider_errors_total");
    // Only the bound sandbox's connect hangs, so nothing else A might do meanwhile (a health
    // check, a listing) is held or counted.
    let connect = format!("/sandboxes/{}/connect", rig.sandbox);
    rig.proxy.push(Rule {
        method: Some("POST"),
        path: Some(connect.clone()),
        fault: Fault::Hang,
        times: None,
    });

    // The caller: one raw connection to A, so hanging up is closing exactly that socket.
    #[expect(
        clippy::disallowed_methods,
        reason = "a test dialling the loopback service it spawned, not a tenant-supplied endpoint"
    )]
    let mut caller = TcpStream::connect(rig.a.addr).await.unwrap();
    let body = r#"{"command":"echo","args":["never"]}"#;
    let request = format!(
        "POST /v1/sessions/{SESSION}/exec HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        rig.a.addr,
        rig.a.token,
        body.len()
    );
    caller.write_all(request.as_bytes()).await.unwrap();
    let proxy = &rig.proxy;
    proxy
        .wait_for("the exec's connect held", |t| {
            t.seen
                .iter()
                .any(|s| s.path == connect && s.fault.is_some())
        })
        .await;
    // Nothing answered the caller meanwhile: the call is mid-request.
    let mut early = [0u8; 1];
    let answered = caller.try_read(&mut early);
    assert!(
        answered
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "A answered the exec while the plane hung: {answered:?}"
    );
    // The caller hangs up.
    drop(caller);
    proxy
        .wait_for("A abandon the held connect", |t| t.abandoned >= 1)
        .await;
    let metrics = rig.a.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "sandbox_provider_errors_total"),
        errors_before,
        "a dropped call records no provider error: {metrics}"
    );
    rig.kept("a dropped call").await;
    let metrics = rig.a.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "sandbox_provider_errors_total"),
        errors_before,
        "nor did the calls after it: {metrics}"
    );
}

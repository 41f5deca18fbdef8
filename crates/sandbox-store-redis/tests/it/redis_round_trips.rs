//! Redis commands per resolve of an already-bound session, counted by Redis itself
//! (`total_commands_processed` of `INFO stats`, which also counts the commands a script runs),
//! on a `redis-server` this test owns so no other test's traffic is in the count. The fast path
//! (one `EVALSHA` running `GET` + `HGET`) must hold it at 3, against 7 on the locked path
//! (`SET NX PX`, `GET`, `EVALSHA` + `EXISTS` for the turn, `EVALSHA` + `GET` + `DEL` to
//! release); and `read_for_resolve` must write nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::{BindingKey, BindingStore, ConfigId, CreateRequest, PermissiveSessionExistence};
use sandbox_session::lifecycle::{Lifecycle, LifecycleConfig};
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, Topology};
use sandbox_testkit::FaultyStore;
use sandbox_testkit::fake::FakeProvider;

const RESOLVES: u64 = 200;

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

fn server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    let s = Server { child, port };
    let start = Instant::now();
    while cli(&s, &["ping"]) != "PONG" {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

fn cli(s: &Server, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &s.port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `total_commands_processed` (the INFO call that reads it counts itself too).
fn processed(s: &Server) -> u64 {
    cli(s, &["info", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn lifecycle(s: &Server, store: Arc<dyn BindingStore>) -> Lifecycle {
    let _ = s;
    Lifecycle::new(
        Arc::new(FakeProvider::new()),
        store,
        Arc::new(PermissiveSessionExistence),
        LifecycleConfig {
            config_id: ConfigId::new("cfg").unwrap(),
            create_request: CreateRequest::new(FakeProvider::template()),
            requires_inbound_token: false,
        },
    )
    .unwrap()
}

/// Commands per resolve of a bound session through `store`.
async fn per_resolve(s: &Server, store: Arc<dyn BindingStore>, key: &BindingKey) -> f64 {
    let lc = lifecycle(s, store).await;
    let first = lc.resolve(key).await.unwrap();
    let before = processed(s);
    for _ in 0..RESOLVES {
        assert_eq!(lc.resolve(key).await.unwrap().id(), first.id());
    }
    let after = processed(s);
    // Minus the second INFO itself.
    (after - before - 1) as f64 / RESOLVES as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: cargo xtask test runs it"]
async fn a_bound_resolve_costs_three_redis_commands_and_the_fast_read_writes_nothing() {
    let s = server();
    let store = RedisBindingStore::connect(RedisStoreConfig::new(
        Topology::Standalone {
            url: format!("redis://127.0.0.1:{}", s.port),
        },
        "trt",
    ))
    .await
    .unwrap();

    let fast = per_resolve(
        &s,
        Arc::new(store.clone()),
        &BindingKey::new(1, "fast").unwrap(),
    )
    .await;
    let locked = per_resolve(
        &s,
        Arc::new(FaultyStore::new(Arc::new(store.clone())).without_optimistic_reads()),
        &BindingKey::new(1, "locked").unwrap(),
    )
    .await;
    println!("BENCH store commands_per_resolve={fast:.2}");
    println!("BENCH store commands_per_resolve_locked={locked:.2}");
    assert!(fast <= 3.0, "fast path: {fast} commands per resolve");
    assert!(locked > fast, "locked {locked} vs fast {fast}");

    // read_for_resolve writes nothing: the write counters of INFO commandstats stay put.
    let key = BindingKey::new(1, "fast").unwrap();
    store.turn_leases().unwrap().begin_turn(&key).await.unwrap();
    let ttl_before: i64 = cli(&s, &["pttl", "sandbox:session:{trt:1:fast}:turn"])
        .parse()
        .unwrap();
    let writes = || {
        cli(&s, &["info", "commandstats"])
            .lines()
            .filter(|l| {
                ["set", "hset", "pexpire", "del", "hincrby", "hdel"]
                    .iter()
                    .any(|c| l.starts_with(&format!("cmdstat_{c}:")))
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = writes();
    let snap = store
        .optimistic_reads()
        .unwrap()
        .read_for_resolve(&key)
        .await
        .unwrap();
    assert!(snap.binding.is_some());
    assert!(snap.turn_needs_write, "the new turn's rebuild is unspent");
    assert_eq!(writes(), before, "no write command ran");
    let ttl_after: i64 = cli(&s, &["pttl", "sandbox:session:{trt:1:fast}:turn"])
        .parse()
        .unwrap();
    assert!(
        ttl_after <= ttl_before,
        "the lease was not re-armed: {ttl_before} -> {ttl_after}"
    );
}

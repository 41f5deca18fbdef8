//! The binding-store conformance suite against real Redis (adapter `redis`): a standalone
//! `redis-server` and a local 3-primary Redis Cluster, both started by `cargo xtask` on
//! loopback ports (`SANDBOX_TEST_REDIS_URL`, `SANDBOX_TEST_REDIS_CLUSTER_NODES`), selected by
//! `SANDBOX_REDIS_TOPOLOGY=standalone|cluster`. `cargo xtask conformance redis` runs both.
//!
//! Each run scopes its keys by the run's namespace. The store and its peer are two clients of
//! the same Redis. Raw values are planted with a plain `SET` on the binding key. On the
//! standalone topology the outage hook cuts a TCP proxy this binary owns in front of the
//! server (the shared server itself is never stopped); a cluster client learns the nodes'
//! real addresses from the cluster, so a proxy cannot stand in front of it and the cluster run
//! declares no outage.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::KeysInterface;
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, Topology};
use sandbox_testkit::conformance::store::{
    StoreFeature, StoreFeatures, StoreTarget, StoreTiming, run_store_main_when_selected,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const ADAPTER: &str = "redis";

/// Short leases: no clock hook, so cases wait in real time.
const TIMING: StoreTiming = StoreTiming {
    turn_lease_ttl: Duration::from_secs(3),
    rewind_ttl: Duration::from_secs(2),
    invalidate_lock_wait: Duration::from_secs(1),
};

fn cluster() -> bool {
    std::env::var("SANDBOX_REDIS_TOPOLOGY").is_ok_and(|t| t == "cluster")
}

/// What this topology must declare, written out independently of the store.
fn required() -> StoreFeatures {
    let mut features = vec![
        StoreFeature::TurnLeases,
        StoreFeature::RewindLock,
        StoreFeature::Activities,
        StoreFeature::RawValues,
    ];
    if !cluster() {
        features.push(StoreFeature::Outage);
    }
    StoreFeatures::of(&features)
}

fn env(name: &str) -> Result<String, String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set: run through `cargo xtask conformance redis`"))
}

fn config(topology: Topology, namespace: &str) -> RedisStoreConfig {
    let mut c = RedisStoreConfig::new(topology, namespace);
    c.turn_lease_ttl = TIMING.turn_lease_ttl;
    c.rewind_ttl = TIMING.rewind_ttl;
    c.invalidate_lock_wait = TIMING.invalidate_lock_wait;
    c.lock_lease = Duration::from_secs(5);
    c.command_timeout = Duration::from_secs(2);
    c
}

/// A loopback TCP proxy in front of one server, which the test can cut (closing every
/// connection and the listener) and restore on the same port.
struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Arc<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = Arc::new(Proxy {
            addr: listener.local_addr().unwrap(),
            upstream,
            tasks: Mutex::new(Vec::new()),
        });
        proxy.serve(listener);
        proxy
    }

    fn serve(self: &Arc<Self>, listener: TcpListener) {
        let me = self.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = me.upstream;
                let conn = tokio::spawn(async move {
                    if let Ok(mut server) = dial(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                me.tasks.lock().unwrap().push(conn);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }

    fn cut(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    async fn restore(self: &Arc<Self>) -> Result<(), String> {
        // The aborted listener's socket closes asynchronously: retry the bind briefly.
        for _ in 0..100 {
            if let Ok(listener) = TcpListener::bind(self.addr).await {
                self.serve(listener);
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("could not re-listen on {}", self.addr))
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the test's own proxy dials the loopback redis-server xtask started"
)]
async fn dial(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    tokio::net::TcpStream::connect(addr).await
}

async fn target(namespace: String) -> Result<StoreTarget, String> {
    // The harness's namespace may hold characters a Redis namespace refuses.
    let namespace: String = namespace
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    let (topology, proxy) = if cluster() {
        let nodes = env("SANDBOX_TEST_REDIS_CLUSTER_NODES")?
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        (Topology::Cluster { nodes }, None)
    } else {
        let url = env("SANDBOX_TEST_REDIS_URL")?;
        let upstream: SocketAddr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .parse()
            .map_err(|e| format!("SANDBOX_TEST_REDIS_URL={url:?}: {e}"))?;
        let proxy = Proxy::start(upstream).await;
        (
            Topology::Standalone {
                url: format!("redis://{}", proxy.addr),
            },
            Some(proxy),
        )
    };
    let store = RedisBindingStore::connect(config(topology.clone(), &namespace))
        .await
        .map_err(|e| e.to_string())?;
    let peer = RedisBindingStore::connect(config(topology, &namespace))
        .await
        .map_err(|e| e.to_string())?;
    let planter = store.clone();
    let mut target = StoreTarget::new(Arc::new(store), Arc::new(peer), required(), TIMING)
        .with_plant_raw(Arc::new(move |key, bytes| {
            let planter = planter.clone();
            Box::pin(async move {
                let redis_key = planter.keys_of(&key).binding;
                planter
                    .client()
                    .set::<(), _, _>(redis_key, bytes, None, None, false)
                    .await
                    .map_err(|e| format!("plant: {e}"))
            })
        }));
    if let Some(proxy) = proxy {
        let (down, up) = (proxy.clone(), proxy);
        target = target.with_outage(
            Arc::new(move || {
                down.cut();
                Box::pin(async { Ok(()) })
            }),
            Arc::new(move || {
                let up = up.clone();
                Box::pin(async move { up.restore().await })
            }),
        );
    }
    Ok(target)
}

fn main() -> ExitCode {
    run_store_main_when_selected(
        ADAPTER,
        required(),
        Arc::new(|namespace| Box::pin(target(namespace))),
    )
}

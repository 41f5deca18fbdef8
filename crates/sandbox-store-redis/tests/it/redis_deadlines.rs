//! The deadline-store suite on real Redis, standalone and cluster (`SANDBOX_TEST_REDIS_URL`,
//! `SANDBOX_TEST_REDIS_CLUSTER_NODES`, set by `cargo xtask test`'s redis stage): the store and a
//! peer are two clients of one server, and a reopen is a third client connected afresh. Each
//! case gets a namespace of its own (`due` answers about the whole sorted set). Plus what the
//! suite cannot plant: a score no store writes is an error, and an outage fails closed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::SortedSetsInterface;
use sandbox_core::{DeadlineStore, ErrorKind, Origin};
use sandbox_store_redis::{RedisBindingStore, RedisDeadlines, RedisStoreConfig, Topology};
use sandbox_testkit::conformance::deadlines::{
    DeadlineFeatures, DeadlineTarget, check_deadline_store,
};

fn standalone() -> Topology {
    Topology::Standalone {
        url: std::env::var("SANDBOX_TEST_REDIS_URL")
            .expect("SANDBOX_TEST_REDIS_URL: run through `cargo xtask test`"),
    }
}

fn cluster() -> Topology {
    Topology::Cluster {
        nodes: std::env::var("SANDBOX_TEST_REDIS_CLUSTER_NODES")
            .expect("SANDBOX_TEST_REDIS_CLUSTER_NODES: run through `cargo xtask test`")
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
    }
}

fn config(topology: Topology, namespace: &str) -> RedisStoreConfig {
    let mut c = RedisStoreConfig::new(topology, namespace);
    c.command_timeout = Duration::from_secs(5);
    c
}

async fn suite(topology: Topology) {
    check_deadline_store(
        DeadlineFeatures {
            peer: true,
            reopen: true,
        },
        Arc::new(move |namespace| {
            let topology = topology.clone();
            Box::pin(async move {
                // A namespace of the case's own: the run's, made Redis-safe, and a random tail.
                let namespace: String = format!("{namespace}-{:08x}", fastrand::u32(..))
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect();
                let connect = |topology: Topology, namespace: String| async move {
                    RedisDeadlines::connect(config(topology, &namespace))
                        .await
                        .map_err(|e| e.to_string())
                };
                // The store shares the client of a binding store, as the service builds it.
                let bindings = RedisBindingStore::connect(config(topology.clone(), &namespace))
                    .await
                    .map_err(|e| e.to_string())?;
                let store = RedisDeadlines::from_store(&bindings);
                let peer = connect(topology.clone(), namespace.clone()).await?;
                Ok(DeadlineTarget::new(Arc::new(store))
                    .with_peer(Arc::new(peer))
                    .with_reopen(Arc::new(move || {
                        let (topology, namespace) = (topology.clone(), namespace.clone());
                        Box::pin(async move {
                            Ok(Arc::new(connect(topology, namespace).await?)
                                as Arc<dyn DeadlineStore>)
                        })
                    })))
            })
        }),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: cargo xtask test runs it"]
async fn the_deadline_suite_passes_on_standalone_redis() {
    suite(standalone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local Redis Cluster: cargo xtask test runs it"]
async fn the_deadline_suite_passes_on_a_redis_cluster() {
    suite(cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: cargo xtask test runs it"]
async fn a_score_no_store_writes_is_an_error_not_an_absent_deadline() {
    let namespace = format!("tdeadline-{:08x}", fastrand::u32(..));
    let store = RedisDeadlines::connect(config(standalone(), &namespace))
        .await
        .unwrap();
    assert_eq!(
        store.key(),
        format!("sandbox:e2b:{{{namespace}}}:deadlines")
    );
    let planter = RedisBindingStore::connect(config(standalone(), &namespace))
        .await
        .unwrap();
    for (member, score) in [("ifraction", 1_800_000_000_000.5), ("inegative", -1.0)] {
        let _: i64 = planter
            .client()
            .zadd(store.key(), None, None, false, false, (score, member))
            .await
            .unwrap();
        let err = store.deadline(member).await.unwrap_err();
        assert_eq!(err.origin(), Origin::Store, "{err}");
        assert_eq!(err.kind(), ErrorKind::Internal, "{err}");
        assert!(err.message().contains(member), "{err}");
    }
    // `due` meets the fractional one (the negative one sorts first and fails first).
    let err = store
        .due(time::OffsetDateTime::now_utc(), 10)
        .await
        .unwrap_err();
    assert_eq!(err.origin(), Origin::Store, "{err}");
    let _: i64 = planter
        .client()
        .zrem(store.key(), vec!["ifraction", "inegative"])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server: cargo xtask test runs it"]
async fn an_unreachable_redis_fails_closed() {
    // A port nothing listens on: connect fails as the store's outage.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = config(
        Topology::Standalone {
            url: format!("redis://127.0.0.1:{port}"),
        },
        "tdown",
    );
    c.connect_timeout = Duration::from_secs(2);
    let err = RedisDeadlines::connect(c).await.unwrap_err();
    assert_eq!(err.origin(), Origin::Store, "{err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

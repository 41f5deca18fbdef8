//! The store on a real 3-primary Redis Cluster (started by `cargo xtask`,
//! `SANDBOX_TEST_REDIS_CLUSTER_NODES`): sessions' keys spread over more than one primary, each
//! session's keys stay on one slot, and invalidate-by-config finds bindings on every primary —
//! a plain SCAN reaches one node only and would miss most of them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::collections::BTreeMap;

use fred::interfaces::ClientLike;
use fred::prelude::{Client, Config};
use futures_util::StreamExt as _;
use sandbox_core::{
    Binding, BindingKey, BindingStore, ConfigId, Provider, SandboxId, TemplateId, TenantId,
};
use sandbox_store_redis::{RedisBindingStore, RedisStoreConfig, Topology};

const SESSIONS: usize = 60;

fn nodes() -> Vec<String> {
    std::env::var("SANDBOX_TEST_REDIS_CLUSTER_NODES")
        .expect("SANDBOX_TEST_REDIS_CLUSTER_NODES: run through `cargo xtask test`")
        .split(',')
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// How many keys matching `pattern` each node holds, asked of each node directly.
async fn keys_per_node(pattern: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for node in nodes() {
        let client = Client::new(
            Config::from_url(&format!("redis://{node}")).unwrap(),
            None,
            None,
            None,
        );
        client.init().await.unwrap();
        let mut count = 0;
        let mut pages = client.scan(pattern.to_owned(), Some(500), None);
        while let Some(page) = pages.next().await {
            let mut page = page.unwrap();
            count += fred::types::scan::Scanner::take_results(&mut page)
                .unwrap_or_default()
                .len();
        }
        client.quit().await.unwrap();
        out.insert(node, count);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local Redis Cluster: cargo xtask test runs it"]
async fn sessions_spread_over_primaries_and_invalidation_reaches_every_one() {
    let namespace = format!("tcluster-{:08x}", fastrand::u32(..));
    let store = RedisBindingStore::connect(RedisStoreConfig::new(
        Topology::Cluster { nodes: nodes() },
        &namespace,
    ))
    .await
    .unwrap();
    let tenant = TenantId::new(fastrand::u64(1..1_000_000)).unwrap();
    let config = ConfigId::new("cfg-cluster").unwrap();
    let mut keys = Vec::new();
    for n in 0..SESSIONS {
        let key = BindingKey {
            tenant,
            session: sandbox_core::SessionId::new(format!("s-{n}")).unwrap(),
        };
        let mut b = Binding::new(
            &key,
            Provider::Docker,
            SandboxId::new(format!("sbx-{n}")).unwrap(),
            TemplateId::new("tpl").unwrap(),
            time::OffsetDateTime::now_utc(),
        );
        b.config_id = Some(config.clone());
        assert!(store.create(&key, &b).await.unwrap());
        // A session's other keys land on the binding's slot: a multi-key script works.
        store.turn_leases().unwrap().begin_turn(&key).await.unwrap();
        store.turn_leases().unwrap().end_turn(&key).await.unwrap();
        keys.push(key);
    }

    let spread = keys_per_node(&format!("sandbox:session:{{{namespace}:*")).await;
    let holding = spread.values().filter(|&&n| n > 0).count();
    assert_eq!(spread.values().sum::<usize>(), SESSIONS, "{spread:?}");
    assert!(holding >= 2, "keys on more than one primary: {spread:?}");

    let report = store.invalidate_by_config(tenant, &config).await.unwrap();
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        report.marked, SESSIONS,
        "every primary's bindings were marked"
    );
    for key in &keys {
        let b = store.get(key).await.unwrap().unwrap();
        assert!(b.stale_at.is_some(), "{key} not marked");
        assert!(
            store
                .delete_if_match(key, b.provider, &b.sandbox_id)
                .await
                .unwrap()
        );
    }
    let left = keys_per_node(&format!("sandbox:session:{{{namespace}:*")).await;
    assert_eq!(left.values().sum::<usize>(), 0, "{left:?}");
}

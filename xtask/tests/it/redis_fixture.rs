//! The Redis fixtures the pipeline gives the Redis store's tests: a standalone server that stores
//! and returns a value, a cluster whose every node reports `cluster_state:ok` with all three
//! nodes known, and after stop no process, port or directory left behind.
//!
//! Needs `redis-server` and `redis-cli` (Debian's `redis-server`): ignored in a plain `cargo
//! test`, run by the redis stage of `cargo xtask test`, which installs them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use xtask::redis::{self, CLUSTER_PRIMARIES, Cluster, Standalone, cli_query, info_field};

/// A logs directory of this test's own, so a concurrent `cargo xtask` run keeps its logs.
fn logs_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Nothing answers on `port` any more and it can be bound again: the server released it.
fn assert_closed(port: u16) {
    assert!(
        cli_query(port, &["ping"]).is_err(),
        "something still answers on {port}"
    );
    TcpListener::bind((redis::LOOPBACK, port))
        .unwrap_or_else(|e| panic!("port {port} is still taken: {e}"));
}

fn assert_gone(pid: u32) {
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "redis-server pid {pid} is still there"
    );
}

#[test]
#[ignore = "needs redis-server and redis-cli: cargo xtask test runs it"]
fn standalone_server_stores_and_goes_away() {
    let logs = logs_dir("redis-fixture-standalone");
    let mut server = Standalone::start(&logs).unwrap();
    let (port, pid, dir) = (
        server.node().port(),
        server.node().pid(),
        server.dir().to_path_buf(),
    );
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));

    assert_eq!(
        cli_query(port, &["set", "xtask:fixture", "kept"])
            .unwrap()
            .trim(),
        "OK"
    );
    assert_eq!(
        cli_query(port, &["get", "xtask:fixture"]).unwrap().trim(),
        "kept"
    );
    // No persistence: nothing may outlive the process.
    let config = cli_query(port, &["config", "get", "save"]).unwrap();
    assert_eq!(config.lines().nth(1).map(str::trim), Some(""), "{config}");
    let bind = cli_query(port, &["config", "get", "bind"]).unwrap();
    assert_eq!(
        bind.lines().nth(1).map(str::trim),
        Some("127.0.0.1"),
        "{bind}"
    );

    assert_eq!(server.stop(), Vec::<String>::new());
    assert_gone(pid);
    assert_closed(port);
    assert!(!dir.exists(), "{} was not removed", dir.display());
    // The log outlives the server, for the failure report.
    assert!(Standalone::log(&logs).is_file());
    std::fs::remove_dir_all(&logs).unwrap();
}

#[test]
#[ignore = "needs redis-server and redis-cli: cargo xtask test runs it"]
fn cluster_is_ok_with_three_primaries_and_goes_away() {
    let logs = logs_dir("redis-fixture-cluster");
    let mut cluster = Cluster::start(&logs).unwrap();
    let dir = cluster.dir().to_path_buf();
    let nodes: Vec<(u16, u16, u32)> = cluster
        .nodes()
        .iter()
        .map(|n| (n.port(), n.bus_port().unwrap(), n.pid()))
        .collect();
    assert_eq!(nodes.len(), CLUSTER_PRIMARIES);
    let seeds: Vec<String> = nodes
        .iter()
        .map(|(p, _, _)| format!("127.0.0.1:{p}"))
        .collect();
    assert_eq!(cluster.seeds(), seeds.join(","));

    for &(port, _, _) in &nodes {
        let info = cli_query(port, &["cluster", "info"]).unwrap();
        assert_eq!(info_field(&info, "cluster_state"), Some("ok"), "{info}");
        assert_eq!(
            info_field(&info, "cluster_known_nodes"),
            Some("3"),
            "{info}"
        );
        assert_eq!(info_field(&info, "cluster_size"), Some("3"), "{info}");
        assert_eq!(
            info_field(&info, "cluster_slots_assigned"),
            Some("16384"),
            "{info}"
        );
    }
    // Keys land on different primaries; `-c` follows the MOVED redirections.
    let first = nodes[0].0;
    for key in ["a", "b", "c", "d", "e", "f"] {
        let key = format!("xtask:fixture:{key}");
        assert_eq!(
            cli_query(first, &["-c", "set", &key, "kept"])
                .unwrap()
                .trim(),
            "OK"
        );
        assert_eq!(
            cli_query(first, &["-c", "get", &key]).unwrap().trim(),
            "kept"
        );
    }

    assert_eq!(cluster.stop(), Vec::<String>::new());
    for &(port, bus, pid) in &nodes {
        assert_gone(pid);
        assert_closed(port);
        TcpListener::bind((redis::LOOPBACK, bus))
            .unwrap_or_else(|e| panic!("cluster bus port {bus} is still taken: {e}"));
    }
    assert!(!dir.exists(), "{} was not removed", dir.display());
    std::fs::remove_dir_all(&logs).unwrap();
}

#[test]
#[ignore = "needs redis-server and redis-cli: cargo xtask test runs it"]
fn a_dropped_fixture_stops_its_servers() {
    // A panic between start and stop drops the fixture: its servers must not outlive it.
    let logs = logs_dir("redis-fixture-drop");
    let server = Standalone::start(&logs).unwrap();
    let (port, pid) = (server.node().port(), server.node().pid());
    drop(server);
    assert_gone(pid);
    assert_closed(port);
    std::fs::remove_dir_all(&logs).unwrap();
}

//! The Redis store's tests that need real Redis servers (the conformance suite is a binary of
//! its own, with its own harness): one test binary with a module per topic, so they link once.
//! `#[ignore]`d without the servers; `cargo xtask test` runs them in its redis stage, given
//! `SANDBOX_TEST_REDIS_URL` and `SANDBOX_TEST_REDIS_CLUSTER_NODES`.

mod redis_cluster;
mod redis_deadlines;
mod redis_model;
mod redis_round_trips;
mod redis_tls;

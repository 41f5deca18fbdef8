//! xtask's tests that need a service, one test binary with a module per service so it links
//! once: `redis_fixture` (the Redis fixtures, run by the redis stage) and `serve_docker` (the
//! README's run command against the Docker engine, last in the docker engine stage). Both are
//! `#[ignore]`d in a plain `cargo test`.

mod redis_fixture;
mod serve_docker;

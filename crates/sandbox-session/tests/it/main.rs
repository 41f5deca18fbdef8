//! The session manager's tests that need the Docker engine, in one test binary (a module per
//! topic as they grow, one link). `#[ignore]`d without the engine; `cargo xtask test` runs them
//! in its docker engine stage.

mod docker;

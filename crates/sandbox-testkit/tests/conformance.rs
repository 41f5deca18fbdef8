//! The conformance suite against the in-memory fake (adapter `fake`).
//!
//! Runs in plain `cargo test`, and through `cargo xtask conformance fake`.

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_testkit::conformance::Target;
use sandbox_testkit::conformance::harness::run_main;
use sandbox_testkit::{FakeProvider, fake_capabilities};

fn main() -> ExitCode {
    run_main(
        "fake",
        fake_capabilities(),
        Arc::new(|_namespace| {
            Box::pin(async {
                Ok(Target {
                    provider: Arc::new(FakeProvider::new()),
                    template: FakeProvider::template(),
                    declared: fake_capabilities(),
                })
            })
        }),
    )
}

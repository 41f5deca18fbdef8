//! The conformance suite against the in-memory fake (adapter `fake`).
//!
//! Runs in plain `cargo test`, and through `cargo xtask conformance fake`.

use std::process::ExitCode;
use std::sync::Arc;

use sandbox_core::{Capabilities, Capability};
use sandbox_testkit::FakeProvider;
use sandbox_testkit::conformance::Target;
use sandbox_testkit::conformance::harness::run_main;

/// The set the fake must declare, written out independently of the fake: every flag except
/// `posix_shell`, `pty`, `desktop` and `volumes`, and `terminal_reattach` (which needs `pty`).
fn required() -> Capabilities {
    Capability::ALL
        .into_iter()
        .filter(|c| {
            !matches!(
                c,
                Capability::PosixShell
                    | Capability::Pty
                    | Capability::Desktop
                    | Capability::Volumes
                    | Capability::TerminalReattach
            )
        })
        .fold(Capabilities::NONE, |set, c| set.with(c, true))
}

fn main() -> ExitCode {
    run_main(
        "fake",
        required(),
        Arc::new(|_namespace| {
            Box::pin(async {
                Ok(Target {
                    // A small process cap, so `process_cap_is_enforced` reaches it cheaply.
                    provider: Arc::new(FakeProvider::builder().process_cap(4).build()),
                    template: FakeProvider::template(),
                    declared: required(),
                })
            })
        }),
    )
}

//! The conformance suite against the E2B adapter (adapter `e2b`), over this service's own
//! E2B-compatible API on the real Docker engine.
//!
//! E2B's cloud cannot run here, so the control plane and envd the adapter speaks to are
//! `sandbox serve`'s `[e2b]` listener: each case starts one (`support::e2b::E2bServe`, agent
//! mode, network `none`, the Debian image as template `base`) and points an [`E2bProvider`] at
//! it, in gateway mode: every data-plane request is dialled at the listener, which routes it by
//! `Host: 49983-<id>.localhost`, as a self-hosted plane's edge does. The adapter sees exactly
//! the wire protocol a real plane speaks; nothing in it knows the server is ours.
//!
//! The suite lives in this package rather than the adapter's because the stand-in server is
//! this package's binary (`CARGO_BIN_EXE_sandbox`), and the adapter crate cannot depend on it.
//!
//! `cargo xtask conformance e2b` (and `cargo xtask test`) start the engine, build the Debian
//! image and the static agent, and select this adapter with `SANDBOX_CONFORMANCE_ADAPTER=e2b`.
//! Without that selection every case is listed as ignored with the command that runs it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

#[path = "it/support/mod.rs"]
mod support;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use sandbox_core::{Capabilities, Capability, Secret, TemplateId};
use sandbox_provider_e2b::{E2bConfig, E2bProvider};
use sandbox_testkit::conformance::Target;
use sandbox_testkit::conformance::harness::run_main_when_selected;
use support::e2b::{DOMAIN, E2bServe};

/// The template the server's `[e2b.templates]` names for the Debian image.
const TEMPLATE: &str = "base";

/// The server of this process's case: kept until the case has run, then stopped (its
/// namespace's containers removed) before the process exits.
static SERVER: Mutex<Option<E2bServe>> = Mutex::new(None);

/// The capability set the adapter must declare, written out here rather than read from it:
/// every flag except
/// - `volumes` (E2B's volumes are a product of their own, not driven by the adapter),
/// - `desktop` (no desktop image exists for it yet),
/// - `default_user` (E2B's create has no field for a default user),
/// - `tunnels` (E2B reaches ports through public URLs, not byte tunnels),
/// - `template_builds` (E2B builds templates with its own build system).
///
/// Cases are registered from this set, so an adapter declaring less fails
/// `declared_capabilities_match` instead of quietly dropping cases.
fn required() -> Capabilities {
    Capability::ALL
        .into_iter()
        .filter(|c| {
            !matches!(
                c,
                Capability::Volumes
                    | Capability::Desktop
                    | Capability::DefaultUser
                    | Capability::Tunnels
                    | Capability::TemplateBuilds
            )
        })
        .fold(Capabilities::NONE, |set, c| set.with(c, true))
}

fn main() -> ExitCode {
    let code = run_main_when_selected(
        "e2b",
        required(),
        Arc::new(|_namespace: String| {
            Box::pin(async move {
                // One server per case (nextest runs each case in its own process); its own
                // namespace keeps cases running side by side apart on the engine.
                let serve = E2bServe::start("tce2b").await;
                let mut config = E2bConfig::new(
                    serve.e2b.clone(),
                    Secret::new(serve.key_a.clone()),
                    TEMPLATE,
                );
                config.proxy_url = serve.e2b.clone();
                config.sandbox_domain = DOMAIN.to_owned();
                // The stand-in listens on loopback; the test is the operator who allows it.
                config.allow_private_endpoints = true;
                let provider = E2bProvider::new(config).map_err(|e| e.to_string())?;
                *SERVER.lock().unwrap_or_else(|p| p.into_inner()) = Some(serve);
                Ok(Target {
                    provider: Arc::new(provider),
                    template: TemplateId::new(TEMPLATE).map_err(|e| e.to_string())?,
                    declared: required(),
                })
            })
        }),
    );
    drop(SERVER.lock().unwrap_or_else(|p| p.into_inner()).take());
    code
}

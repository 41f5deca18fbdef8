//! `sandbox-testkit`: what every adapter is judged by.
//!
//! - [`conformance`]: the provider conformance suite — plain async cases over
//!   `&dyn SandboxProvider`, registered per declared capability, with random payloads, and a
//!   libtest harness ([`conformance::harness::run_main`]) each adapter's `tests/conformance.rs`
//!   calls.
//! - [`fake`]: the in-memory fake provider (conformance adapter `fake`) with failure injection.
//! - [`conformance::deadlines`]: the deadline-store suite and [`MemoryDeadlines`], the
//!   in-memory deadline store it is proven on.
//! - [`faults`]: a fault-injecting wrapper for any `BindingStore`.
//! - [`forward`]: the forwarding helper test doubles change a few methods through.
//! - [`e2b_sdk`]: the driver of the official E2B Python SDK's scenario against an agent.
//!
//! This crate is a dev-dependency only; `cargo xtask tidy` refuses it as a normal dependency.

pub mod conformance;
pub mod e2b_sdk;
pub mod fake;
pub mod faults;
pub mod forward;
pub mod static_agent;

pub use conformance::deadlines::MemoryDeadlines;
pub use fake::{FakeOp, FakeProvider, fake_capabilities};
pub use faults::{FaultyStore, StoreOp};
pub use forward::{Forward, ForwardStore, ProviderHooks, StoreHooks};

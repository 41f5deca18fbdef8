//! Decorators of the provider port, written once instead of once per adapter.
//!
//! A layer wraps a [`SandboxProvider`](crate::SandboxProvider) and is one itself. Two rules hold
//! for every layer, here and in the composition root:
//! - it forwards every method of the port and of each capability trait, which the impl block
//!   enforces with `#[deny(clippy::missing_trait_methods)]` (a provided method left to its
//!   default would silently bypass the inner provider's override), and `cargo xtask tidy`
//!   checks that the attribute is there;
//! - its `as_*` accessors hand out the layer's own wrapper of the capability, so snapshot,
//!   terminal and keep-alive calls pass through the layer too, and only when the inner
//!   provider implements the capability (the two-signal rule of [`crate::narrow`]).
//!
//! - [`checking`]: [`Checked`], the policy every adapter's public constructor applies.

pub mod checking;

pub use checking::Checked;

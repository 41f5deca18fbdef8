//! The library half of xtask: everything that can be decided without printing (the tidy rules,
//! the JUnit reader, the conformance and bench registries and reports, process deadlines), kept
//! here so unit tests and `tests/tidy_live.rs` can reach it. `main.rs` is the command line.

pub mod agent_build;
pub mod bench;
pub mod conformance;
pub mod debian_image;
pub mod e2b_sdk;
pub mod js_sdk;
/// The ELF linking reader, shared with the Docker adapter (crate `sandbox-elf`).
pub use sandbox_elf as elf;
pub mod junit;
pub mod netclean;
pub mod prereq;
pub mod process;
pub mod redis;
pub mod tidy;
pub mod tidy_citations;
pub mod tidy_decorators;
pub mod tidy_source;
pub mod tidy_tags;
pub mod tidy_tests;
pub mod tidy_unsafe;
pub mod workspace;

//! The adapter's own tests, one binary: `wire` pins the exact requests it sends to a
//! recording control plane and how it reads the answers, including the failures;
//! `envd_wire` the envd requests behind the data plane.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod envd_wire;
mod recorder;
mod wire;

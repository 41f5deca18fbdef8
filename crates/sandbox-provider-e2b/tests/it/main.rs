//! The adapter's own tests, one binary: `wire` pins the exact requests it sends to a
//! recording control plane and how it reads the answers, including the failures;
//! `envd_wire` the envd requests behind the data plane; `snapshots_wire` the snapshot and
//! template-catalog requests; `catalog_wire` the standard template's builds;
//! `processes_wire` those of background processes and terminals; `streamed_wire` those of
//! streamed files, renames and watches; `declared` the capability set; `live` runs against
//! E2B's cloud, opt-in only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

mod catalog_wire;
mod declared;
mod envd_wire;
mod live;
mod processes_wire;
mod recorder;
mod snapshots_wire;
mod streamed_wire;
mod wire;

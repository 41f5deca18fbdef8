//! `cargo xtask bench core`: the cost of sandbox-core's validation on hot paths, as ratios
//! against a raw baseline measured in the same run.
//!
//! - Binding decode: `serde_json` into [`Binding`] (every field validated, then checked against
//!   its key) vs `serde_json` into a plain struct with the same fields and no validation. Every
//!   resolve of a bound session decodes one binding, so this is the store-side tax of
//!   fail-closed validation.
//! - Path validation: [`SandboxPath::new`] vs a bare `split('/')` walk over the same strings.
//!
//! Prints raw timings, then one `BENCH core <key>=<value>` line per headline figure.
//! `--smoke` runs few iterations (CI only checks that the bench works).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A bench binary reports on stdout.

use std::hint::black_box;
use std::time::{Duration, Instant};

use sandbox_core::{Binding, BindingKey, SandboxPath};
use serde::Deserialize;

const BINDING: &str = r#"{"version":1,"provider":"e2b","tenant_id":42,"session_id":"chat-1","sandbox_id":"sbx-9f8e7d6c5b4a","template_id":"base","created_at":"2026-11-29T09:50:21.123456789Z","config_id":"cfg-1","traffic_access_token":"tok-0123456789abcdef"}"#;

/// The baseline: the same fields, decoded without any validation.
#[derive(Deserialize)]
#[allow(dead_code)] // Fields exist to be decoded, not read.
struct RawBinding {
    version: i64,
    provider: String,
    tenant_id: u64,
    session_id: String,
    sandbox_id: String,
    template_id: String,
    created_at: String,
    config_id: Option<String>,
    stale_at: Option<String>,
    traffic_access_token: Option<String>,
}

const PATHS: [&str; 6] = [
    "/workspace/output/report.csv",
    "/workspace/input/attachments/2026/11/invoice-0001.pdf",
    "/tmp//scratch/./a/b/c",
    "/opt/sandbox/skills/pdf/scripts/run.py",
    "/",
    "/workspace/报告/数据.xlsx",
];

/// Best (lowest) nanoseconds per iteration over `rounds` rounds: the least-disturbed run is the
/// closest to the code's own cost on a noisy machine.
fn measure(rounds: usize, iters: u64, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        let per = start.elapsed().as_nanos() as f64 / iters as f64;
        best = best.min(per);
    }
    best
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let (rounds, iters) = if smoke { (2, 2_000) } else { (9, 200_000) };
    let key = BindingKey::new(42, "chat-1").unwrap();
    let started = Instant::now();

    let validated = measure(rounds, iters, || {
        let b: Binding = serde_json::from_str(black_box(BINDING)).unwrap();
        b.validate(&key).unwrap();
        black_box(b);
    });
    let raw = measure(rounds, iters, || {
        let b: RawBinding = serde_json::from_str(black_box(BINDING)).unwrap();
        black_box(b);
    });

    let path_validated = measure(rounds, iters, || {
        for p in PATHS {
            black_box(SandboxPath::new(black_box(p)).unwrap());
        }
    });
    let path_raw = measure(rounds, iters, || {
        for p in PATHS {
            let n = black_box(p)
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .count();
            black_box(n);
        }
    });

    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!("rounds: {rounds}, iterations per round: {iters}, best round reported");
    println!("binding decode + validate: {validated:.1} ns/op");
    println!("binding decode, no validation (baseline): {raw:.1} ns/op");
    println!(
        "path validate ({} paths): {path_validated:.1} ns/op",
        PATHS.len()
    );
    println!("path split walk (baseline): {path_raw:.1} ns/op");
    println!(
        "elapsed: {:.1?}",
        started.elapsed().max(Duration::from_millis(1))
    );
    println!("BENCH core binding_decode_ns={validated:.1}");
    println!("BENCH core binding_decode_raw_ns={raw:.1}");
    println!("BENCH core binding_decode_ratio={:.2}", validated / raw);
    println!("BENCH core path_validate_ns={path_validated:.1}");
    println!(
        "BENCH core path_validate_ratio={:.2}",
        path_validated / path_raw
    );
}

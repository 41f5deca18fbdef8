//! `cargo xtask api-golden [--bless]`: checks the API's golden corpus
//! (`crates/sandbox-app/tests/golden/api.jsonl`) against the router, or rewrites it from the
//! router's answers with `--bless`. The corpus changes only this way, so its diff is the
//! review of an API change.

use std::process::{ExitCode, Stdio};

use crate::Ctx;

/// The test binary that replays (or, with [`BLESS`] set, rewrites) the corpus.
const TEST: &[&str] = &["test", "-p", "sandbox-app", "--test", "api_golden"];

/// Read by `tests/api_golden.rs`.
const BLESS: &str = "SANDBOX_API_GOLDEN_BLESS";

pub(crate) fn run(ctx: &Ctx, bless: bool) -> ExitCode {
    let mut cmd = ctx.cargo_cmd(TEST);
    cmd.stdin(Stdio::null());
    if bless {
        println!("xtask api-golden: rewriting the corpus from the router's answers");
        cmd.env(BLESS, "1");
    } else {
        println!("xtask api-golden: checking the corpus against the router");
        cmd.env_remove(BLESS);
    }
    match cmd.status() {
        Ok(status) if status.success() => {
            if bless {
                println!(
                    "xtask api-golden: blessed; review `git diff crates/sandbox-app/tests/golden/`"
                );
            } else {
                println!("xtask api-golden: ok");
            }
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("xtask api-golden: the golden test ended with {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("xtask api-golden: cannot run cargo: {e}");
            ExitCode::FAILURE
        }
    }
}

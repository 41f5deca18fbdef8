//! `cargo xtask bench layers`: what the production stack `Metered(Checked(adapter))` adds to a
//! provider call, on the fake (hermetic), on a 2-worker multi-thread tokio runtime.
//!
//! A tight loop of `exec` of `true` on one fake sandbox through three providers, each an
//! `Arc<dyn SandboxProvider>`: the stack as `serve` builds it (`metered::stack` over the fake
//! as its constructor returns it), the checked fake alone, and the bare fake
//! (`Checked::inner`), in rotating rounds so drift on a shared machine hits all three. The
//! headline `stack_exec_ns` is the median over rounds of (stack − bare) nanoseconds per call;
//! `checked_exec_ns` the same for the checking layer alone (the session bench's
//! `layered_exec_ns`). `--smoke` runs a tiny version.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A bench binary reports on stdout.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use sandbox_app::http::metrics::Metrics;
use sandbox_core::{CreateRequest, ExecRequest, SandboxHandle, SandboxProvider};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::FakeProvider;
use tokio::runtime::Runtime;

fn per_call(
    rt: &Runtime,
    provider: &Arc<dyn SandboxProvider>,
    sandbox: &SandboxHandle,
    calls: u32,
) -> f64 {
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..calls {
            let r = provider
                .exec(sandbox, ExecRequest::argv("true", Vec::<String>::new()))
                .await
                .unwrap();
            black_box(r);
        }
        start.elapsed().as_secs_f64() * 1e9 / f64::from(calls)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let (rounds, calls) = if smoke { (3, 200) } else { (31, 20_000) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let checked_fake = FakeProvider::new();
    let bare: Arc<dyn SandboxProvider> = Arc::new(checked_fake.inner().clone());
    let checked: Arc<dyn SandboxProvider> = Arc::new(checked_fake.clone());
    let metrics = Arc::new(Metrics::new());
    let (stack, _) = sandbox_app::metered::stack(
        checked.clone(),
        Arc::new(MemoryBindingStore::new()),
        &metrics,
    );
    let sandbox = rt
        .block_on(stack.create(CreateRequest::new(FakeProvider::template())))
        .unwrap();
    let paths = [&stack, &checked, &bare];
    for p in paths {
        per_call(&rt, p, &sandbox, calls);
    }
    let mut ns: [Vec<f64>; 3] = Default::default();
    let (mut stack_added, mut checked_added) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut this = [0.0; 3];
        for i in 0..3 {
            let which = (round + i) % 3;
            this[which] = per_call(&rt, paths[which], &sandbox, calls);
        }
        for (all, x) in ns.iter_mut().zip(this) {
            all.push(x);
        }
        stack_added.push(this[0] - this[2]);
        checked_added.push(this[1] - this[2]);
    }
    let [stack_ns, checked_ns, bare_ns] = ns.map(median);
    let (stack_added, checked_added) = (median(stack_added), median(checked_added));
    println!("mode: {}", if smoke { "smoke" } else { "full" });
    println!(
        "exec of `true` on the fake, {rounds} rotating rounds of {calls} calls (medians): \
         Metered(Checked(fake)) {stack_ns:.0} ns/call, Checked(fake) {checked_ns:.0} ns/call, \
         bare fake {bare_ns:.0} ns/call"
    );
    println!(
        "added per call (median of per-round differences): stack {stack_added:.0} ns, checking \
         layer alone {checked_added:.0} ns"
    );
    println!("BENCH layers stack_exec_ns={stack_added:.0}");
    println!("BENCH layers checked_exec_ns={checked_added:.0}");
    println!("BENCH layers bare_exec_ns={bare_ns:.0}");
}

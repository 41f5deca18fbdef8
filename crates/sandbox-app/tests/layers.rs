//! The production stack over the fake, built by the same wiring function as `serve`
//! (`metered::stack` over an adapter as its constructor returns it): the layers change nothing
//! the conformance suite can see, and the metrics layer times and counts what passes through.

#![allow(clippy::unwrap_used, clippy::expect_used)] // Test binary: a failed unwrap is a failed test.

use std::sync::Arc;

use sandbox_app::http::metrics::Metrics;
use sandbox_core::{BindingStore, CreateRequest, ErrorKind, ExecRequest, SandboxProvider, narrow};
use sandbox_session::memory_store::MemoryBindingStore;
use sandbox_testkit::conformance::{Target, all_cases, describe, find_case, run_case};
use sandbox_testkit::{FakeProvider, fake_capabilities};

fn stack(metrics: &Arc<Metrics>) -> (Arc<dyn SandboxProvider>, Arc<dyn BindingStore>) {
    sandbox_app::metered::stack(
        Arc::new(FakeProvider::new()),
        Arc::new(MemoryBindingStore::new()),
        metrics,
    )
}

/// The sample `series` (name and labels exactly) of the exposition, 0 when absent.
fn sample(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn timed(metrics: &Metrics, operation: &str) -> f64 {
    sample(
        metrics,
        &format!("sandbox_provider_operation_duration_seconds_count{{operation=\"{operation}\"}}"),
    )
}

#[test]
fn the_describe_document_of_the_stack_is_the_bare_fakes() {
    let metrics = Arc::new(Metrics::new());
    let (stacked, _) = stack(&metrics);
    let bare = FakeProvider::new().into_inner();
    let stacked_doc = describe("fake", &stacked.capabilities());
    assert_eq!(stacked_doc, describe("fake", &bare.capabilities()));
    assert_eq!(stacked_doc, describe("fake", &fake_capabilities()));
    assert_eq!(stacked.network_fields(), bare.network_fields());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_applicable_case_passes_through_the_stack() {
    let declared = fake_capabilities();
    let mut ran = 0;
    for case in all_cases() {
        if case.not_applicable(&declared).is_some() {
            continue;
        }
        let metrics = Arc::new(Metrics::new());
        let (provider, _) = stack(&metrics);
        let target = Target {
            provider,
            template: FakeProvider::template(),
            declared,
        };
        let result = run_case(&case, target, 7).await;
        assert!(result.is_ok(), "{}: {:?}", case.name, result.err());
        ran += 1;
    }
    assert!(ran >= 30, "only {ran} cases applied");
    let declared_case = find_case("declared_capabilities_match").unwrap();
    let metrics = Arc::new(Metrics::new());
    let (provider, _) = stack(&metrics);
    run_case(
        &declared_case,
        Target {
            provider,
            template: FakeProvider::template(),
            declared,
        },
        7,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn snapshot_create_and_errors_are_recorded_at_the_port() {
    let metrics = Arc::new(Metrics::new());
    let (provider, store) = stack(&metrics);
    let handle = provider
        .create(CreateRequest::new(FakeProvider::template()))
        .await
        .unwrap();
    assert_eq!(timed(&metrics, "create"), 1.0);
    assert_eq!(timed(&metrics, "create_snapshot"), 0.0);
    // Through the accessor, as the session manager calls it.
    narrow::snapshots(&*provider)
        .unwrap()
        .create_snapshot(handle.id(), None)
        .await
        .unwrap();
    assert_eq!(timed(&metrics, "create_snapshot"), 1.0);
    narrow::keep_alive(&*provider)
        .unwrap()
        .keep_alive(&handle, std::time::Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(timed(&metrics, "keep_alive"), 1.0);

    // A refusal of the checking layer inside is a provider error, counted once, by kind.
    let err = provider
        .exec(&handle, ExecRequest::shell("echo hi"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert_eq!(
        sample(
            &metrics,
            "sandbox_provider_errors_total{kind=\"unsupported\"}"
        ),
        1.0
    );
    assert_eq!(timed(&metrics, "exec"), 1.0);

    // Store calls are timed under their method names; a store error is a store error.
    let key = sandbox_core::BindingKey::new(3, "s").unwrap();
    assert!(store.get(&key).await.unwrap().is_none());
    assert_eq!(
        sample(
            &metrics,
            "sandbox_store_operation_duration_seconds_count{operation=\"get\"}"
        ),
        1.0
    );
}

//! Prometheus metrics: requests by route and status, latency histograms, provider and store
//! errors by kind and their calls' latency by operation (both fed by the metrics layer at the
//! ports, [`crate::metered`]), resolves by outcome, sandboxes created and destroyed (the last
//! two fed by the lifecycle coordinator through [`LifecycleObserver`]), backend calls by data
//! plane, and the agent channel's opens and round trips (fed by the Docker adapter's channel
//! observer). Rendered at `GET /metrics` in the text exposition format.

use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use sandbox_session::observer::{LifecycleObserver, ResolveOutcome};

use super::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: &'static str,
    method: &'static str,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    api: &'static str,
    route: String,
}

/// The `api` label of the service's own HTTP API.
pub const API_SANDBOX: &str = "sandbox";
/// The `api` label of the E2B-compatible API.
pub const API_E2B: &str = "e2b";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

/// Which port a timed call went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Provider,
    Store,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlaneLabels {
    operation: &'static str,
    data_plane: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpenLabels {
    reason: &'static str,
    outcome: &'static str,
}

/// The `data_plane` label of a backend that has none to choose (every call goes one way).
pub const NO_DATA_PLANE: &str = "none";

/// The service's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    provider_errors: Family<KindLabels, Counter>,
    store_errors: Family<KindLabels, Counter>,
    provider_operations: Family<OperationLabels, Histogram>,
    store_operations: Family<OperationLabels, Histogram>,
    resolves: Family<OutcomeLabels, Counter>,
    created: Counter,
    destroyed: Counter,
    provider_calls: Family<PlaneLabels, Counter>,
    data_plane: &'static str,
    // Fed only by the Docker adapter's channel observer; registered (and empty) without it.
    #[cfg_attr(not(feature = "docker"), expect(dead_code))]
    channel_opens: Family<OpenLabels, Counter>,
    #[cfg_attr(not(feature = "docker"), expect(dead_code))]
    agent_round_trip: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with every metric registered, for a backend without a data plane to choose.
    pub fn new() -> Self {
        Metrics::with_data_plane(NO_DATA_PLANE)
    }

    /// [`Metrics::new`], labelling every backend call with `data_plane` (Docker's `agent` or
    /// `exec`), so a dashboard tells the two planes' traffic apart.
    pub fn with_data_plane(data_plane: &'static str) -> Self {
        let mut registry = Registry::with_prefix("sandbox");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        let provider_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by API, method, route and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by API and route",
            latency.clone(),
        );
        registry.register(
            "provider_errors",
            "Backend errors, by error kind",
            provider_errors.clone(),
        );
        let store_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "store_errors",
            "Binding-store errors, by error kind",
            store_errors.clone(),
        );
        // From 100 µs (a memory store's call) to about 54 min (an image build).
        let operation_histogram = || Histogram::new(exponential_buckets(0.0001, 2.0, 25));
        let provider_operations =
            Family::<OperationLabels, Histogram>::new_with_constructor(operation_histogram);
        registry.register(
            "provider_operation_duration_seconds",
            "Backend call latency by operation",
            provider_operations.clone(),
        );
        let store_operations =
            Family::<OperationLabels, Histogram>::new_with_constructor(operation_histogram);
        registry.register(
            "store_operation_duration_seconds",
            "Binding-store call latency by operation",
            store_operations.clone(),
        );
        let resolves = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "session_resolves",
            "Session resolves by outcome (bound, recovered, created, failed)",
            resolves.clone(),
        );
        let created = Counter::default();
        registry.register(
            "sandboxes_created",
            "Sandboxes this process created",
            created.clone(),
        );
        let destroyed = Counter::default();
        registry.register(
            "sandboxes_destroyed",
            "Sandboxes this process deleted (or found already gone when deleting)",
            destroyed.clone(),
        );
        let provider_calls = Family::<PlaneLabels, Counter>::default();
        registry.register(
            "provider_calls",
            "Backend calls by operation and data plane (how commands and files reach sandboxes)",
            provider_calls.clone(),
        );
        let channel_opens = Family::<OpenLabels, Counter>::default();
        registry.register(
            "agent_channel_opens",
            "Agent channel opens (an exec each) by reason (first, exec_ended, health_failed, \
             closed) and outcome (ok, error)",
            channel_opens.clone(),
        );
        // From 50 µs (a local round trip) to about 1.6 s (a stalled engine).
        let agent_round_trip = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register(
            "agent_round_trip_seconds",
            "Round trips to sandbox agents over their channels (the health calls)",
            agent_round_trip.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            provider_errors,
            store_errors,
            provider_operations,
            store_operations,
            resolves,
            created,
            destroyed,
            provider_calls,
            data_plane,
            channel_opens,
            agent_round_trip,
        }
    }

    /// Records one finished request of `api` ([`API_SANDBOX`] or [`API_E2B`]). `route` must
    /// come from a bounded set (a matched route's template, never a raw path), so no caller
    /// can grow the series without limit.
    pub fn observe_request(
        &self,
        api: &'static str,
        method: &'static str,
        route: &str,
        status: u16,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                api,
                method,
                route: route.to_owned(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels {
                api,
                route: route.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records one call of a port's `operation`.
    pub fn observe_operation(
        &self,
        component: Component,
        operation: &'static str,
        elapsed: Duration,
    ) {
        let family = match component {
            Component::Provider => {
                self.provider_calls
                    .get_or_create(&PlaneLabels {
                        operation,
                        data_plane: self.data_plane,
                    })
                    .inc();
                &self.provider_operations
            }
            Component::Store => &self.store_operations,
        };
        family
            .get_or_create(&OperationLabels { operation })
            .observe(elapsed.as_secs_f64());
    }

    /// Records an error a port returned, as a store error when its origin is the binding
    /// store, else as a provider error (the same split as the `store_*`/`provider_*` codes,
    /// `super::error::from_store`).
    pub fn observe_error(&self, error: &sandbox_core::Error) {
        let family = if super::error::from_store(error) {
            &self.store_errors
        } else {
            &self.provider_errors
        };
        family
            .get_or_create(&KindLabels {
                kind: error.kind().as_str().to_owned(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        let registry = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

impl LifecycleObserver for Metrics {
    fn resolved(&self, outcome: ResolveOutcome) {
        self.resolves
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }
    fn sandbox_created(&self) {
        self.created.inc();
    }
    fn sandbox_destroyed(&self) {
        self.destroyed.inc();
    }
}

#[cfg(feature = "docker")]
impl sandbox_provider_docker::channel::ChannelObserver for Metrics {
    fn channel_opened(&self, reason: sandbox_provider_docker::channel::OpenReason, opened: bool) {
        self.channel_opens
            .get_or_create(&OpenLabels {
                reason: reason.as_str(),
                outcome: if opened { "ok" } else { "error" },
            })
            .inc();
    }
    fn agent_round_trip(&self, elapsed: Duration) {
        self.agent_round_trip.observe(elapsed.as_secs_f64());
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "service",
    summary = "Prometheus/OpenMetrics metrics (no auth)",
    responses((status = 200, description = "The metrics in the OpenMetrics text format", body = String, content_type = "application/openmetrics-text")),
)]
/// `GET /metrics`.
pub async fn render(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::{Error, Operation, Origin, Provider};

    /// The counter line of `family` for `kind`, from the exposition.
    fn count(metrics: &Metrics, family: &str, kind: &str) -> Option<String> {
        let text = metrics.encode().unwrap();
        let prefix = format!("sandbox_{family}_total{{kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
    }

    /// The form the old rule read ("store." prefix), kept out of the code by the operation
    /// scheme; needed here on purpose.
    const STORE_PREFIXED: &str = "store.get";

    /// The family follows the origin; an operation named like a store's does not move a
    /// provider error, nor does a store error need one.
    #[test]
    fn the_error_family_follows_the_origin() {
        let metrics = Metrics::new();
        metrics.observe_error(
            &Error::unavailable(Operation::EXEC, "redis down").with_origin(Origin::Store),
        );
        metrics.observe_error(
            &Error::timeout(Operation::new(STORE_PREFIXED), "engine slow")
                .with_provider(Provider::Docker),
        );
        metrics.observe_error(
            &Error::internal(Operation::new("dial"), "x").with_origin(Origin::Transport),
        );
        assert_eq!(
            count(&metrics, "store_errors", "unavailable").as_deref(),
            Some("1")
        );
        assert_eq!(count(&metrics, "store_errors", "timeout"), None);
        assert_eq!(
            count(&metrics, "provider_errors", "timeout").as_deref(),
            Some("1")
        );
        assert_eq!(
            count(&metrics, "provider_errors", "internal").as_deref(),
            Some("1")
        );
        assert_eq!(count(&metrics, "provider_errors", "unavailable"), None);
    }

    /// Every backend call counts under the plane the metrics were made for; store calls do not.
    #[test]
    fn backend_calls_are_counted_by_data_plane() {
        let metrics = Metrics::with_data_plane("agent");
        metrics.observe_operation(Component::Provider, "exec", Duration::from_millis(2));
        metrics.observe_operation(Component::Provider, "exec", Duration::from_millis(3));
        metrics.observe_operation(Component::Store, "get", Duration::from_millis(1));
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(
                "sandbox_provider_calls_total{operation=\"exec\",data_plane=\"agent\"} 2"
            ),
            "{text}"
        );
        assert!(!text.contains("operation=\"get\",data_plane"), "{text}");
        let plain = Metrics::new();
        plain.observe_operation(Component::Provider, "exec", Duration::from_millis(2));
        let plain = plain.encode().unwrap();
        assert!(
            plain
                .contains("sandbox_provider_calls_total{operation=\"exec\",data_plane=\"none\"} 1"),
            "{plain}"
        );
    }

    /// The channel observer's reports land in their families.
    #[cfg(feature = "docker")]
    #[test]
    fn channel_opens_and_round_trips_are_exposed() {
        use sandbox_provider_docker::channel::{ChannelObserver, OpenReason};
        let metrics = Metrics::with_data_plane("agent");
        metrics.channel_opened(OpenReason::First, true);
        metrics.channel_opened(OpenReason::ExecEnded, false);
        metrics.agent_round_trip(Duration::from_micros(300));
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("sandbox_agent_channel_opens_total{reason=\"first\",outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "sandbox_agent_channel_opens_total{reason=\"exec_ended\",outcome=\"error\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("sandbox_agent_round_trip_seconds_count 1"),
            "{text}"
        );
    }
}

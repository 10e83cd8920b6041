//! `/metrics`, in Prometheus' text format: the API's requests and latencies, workflows by
//! state and tenant, and the scheduler's and the journal's counters, read when scraped.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Service;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Ended {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OfTenant {
    tenant: String,
}

/// The service's metrics.
pub(super) struct Metrics {
    registry: Registry,
    requests: Family<Route, Counter>,
    latency: Family<Route, Histogram>,
    started: Counter,
    ended: Family<Ended, Counter>,
    running: Family<OfTenant, Gauge>,
    live: Gauge,
    suspended: Gauge,
    hibernated: Gauge,
    steps: Gauge,
    messages: Gauge,
    commits: Gauge,
    journal_bytes: Gauge,
}

impl Metrics {
    pub(super) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("wasmproc");
        let requests = Family::<Route, Counter>::default();
        let latency = Family::<Route, Histogram>::new_with_constructor(|| {
            // 100 µs to about 3.3 s.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        });
        let (started, ended, running) = (Counter::default(), Family::default(), Family::default());
        let (live, steps, messages, commits, journal_bytes) =
            (Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default());
        registry.register("http_requests", "API requests answered, by route and status", requests.clone());
        registry.register("http_request_seconds", "API latency, by route and status", latency.clone());
        registry.register("workflows_started", "Workflows started through the API", started.clone());
        registry.register("workflows_ended", "Workflows ended, by final state", ended.clone());
        registry.register("workflows_running", "Workflows running now, by tenant", running.clone());
        registry.register("processes_live", "Processes alive now, workflows' children included", live.clone());
        let suspended = Gauge::default();
        registry.register(
            "processes_suspended",
            "Processes alive now that are suspended: out of memory until their next event (counted in live)",
            suspended.clone(),
        );
        let hibernated = Gauge::default();
        registry.register(
            "processes_hibernated",
            "Processes alive now that gave back their whole instance while they wait, kept as the pages \
             that differ from their component's image (counted in live)",
            hibernated.clone(),
        );
        registry.register("steps", "Steps the scheduler has run since the server started", steps.clone());
        registry.register("messages", "Messages delivered since the server started", messages.clone());
        registry.register("journal_commits", "Commits of the journal since the server started", commits.clone());
        registry.register(
            "journal_bytes",
            "Bytes the journal has committed since the server started",
            journal_bytes.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            started,
            ended,
            running,
            live,
            suspended,
            hibernated,
            steps,
            messages,
            commits,
            journal_bytes,
        }
    }

    pub(super) fn started(&self) {
        self.started.inc();
    }

    pub(super) fn ended(&self, state: &str) {
        self.ended.get_or_create(&Ended { state: state.to_owned() }).inc();
    }

    /// The text of a scrape: the figures read now, then every metric.
    fn scrape(&self, service: &Service) -> String {
        let stats = service.inner.handle.stats();
        self.live.set(stats.live as i64);
        self.suspended.set(stats.suspended as i64);
        self.hibernated.set(service.inner.code.runtime().hibernation_stats().hibernated as i64);
        self.steps.set(stats.workers.iter().map(|w| w.executed).sum::<u64>() as i64);
        self.messages.set(stats.messages as i64);
        if let Some(journal) = service.inner.handle.journal_stats() {
            self.commits.set(journal.commits as i64);
            self.journal_bytes.set(journal.bytes as i64);
        }
        self.running.clear();
        for (tenant, running) in &service.inner.live.lock().running {
            self.running.get_or_create(&OfTenant { tenant: tenant.clone() }).set(*running as i64);
        }
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!("cannot encode the metrics: {error}");
        }
        text
    }
}

/// `GET /metrics`.
pub(super) async fn scrape(State(service): State<Service>) -> Response {
    let text = service.inner.metrics.scrape(&service);
    ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response()
}

/// Counts and times every request, by its route (the path's pattern, not the path, so
/// ids make no new series).
pub(super) async fn measure(State(service): State<Service>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_owned();
    let began = Instant::now();
    let response = next.run(request).await;
    let labels = Route { method, route, status: response.status().as_u16() };
    let metrics = &service.inner.metrics;
    metrics.requests.get_or_create(&labels).inc();
    metrics.latency.get_or_create(&labels).observe(began.elapsed().as_secs_f64());
    response
}

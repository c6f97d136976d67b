//! The HTTP surface: routes, shared state, the latency fault applied to every `/v1` call; what
//! a payment's change does besides the books is in `changes`.

mod action;
mod admin;
mod capture;
mod changes;
mod disputes;
mod listing;
mod ops;
mod payments;
mod refunds;
mod reply;
mod request;

pub(crate) use changes::run_job;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;

use crate::counters::Counters;
use crate::faults::FaultSwitch;
use crate::ledger::Ledger;
use crate::problem::ApiError;
use crate::settlement::SettlementQueue;
use crate::webhook::WebhookQueue;

/// What every handler shares.
pub(crate) struct AppState {
    ledger: Mutex<Ledger>,
    faults: Arc<FaultSwitch>,
    counters: Arc<Counters>,
    webhooks: WebhookQueue,
    settlements: SettlementQueue,
    /// The W3C trace each payment was created under, until its outcome is
    /// announced: its webhooks continue that trace. Kept in memory only; a
    /// payment settled after a restart starts a new trace.
    traces: Mutex<HashMap<String, crate::webhook::Trace>>,
    /// Turns true when the application stops, releasing replies held by `lose_reply_rate`.
    stop: watch::Receiver<bool>,
}

impl AppState {
    pub(crate) fn new(
        ledger: Ledger,
        faults: Arc<FaultSwitch>,
        counters: Arc<Counters>,
        webhooks: WebhookQueue,
        settlements: SettlementQueue,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            ledger: Mutex::new(ledger),
            faults,
            counters,
            webhooks,
            settlements,
            traces: Mutex::new(HashMap::new()),
            stop,
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Ledger methods check before they write, so a panicking holder leaves it consistent.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

type SharedState = State<Arc<AppState>>;

/// The start every money-moving POST shares: the `fail_first` fault, then
/// the required `Idempotency-Key` (recorded on the current span).
fn admit_keyed(
    state: &AppState,
    headers: &axum::http::HeaderMap,
) -> Result<(crate::faults::Faults, String), crate::problem::ApiError> {
    let crate::faults::Admission::Admitted(faults) = state.faults.admit() else {
        state
            .counters
            .fault_injected(crate::counters::Fault::FailFirst, 1);
        return Err(crate::problem::ApiError::InjectedFailure);
    };
    let key = request::idempotency_key(headers)?;
    tracing::Span::current().record("idempotency_key", key.as_str());
    Ok((faults, key))
}

/// The caller's trace, continued by a money-moving POST (an absent or invalid header starts
/// a new one), its id recorded as the current span's `trace_id`: the webhook the change
/// sends carries it.
fn continuing(headers: &axum::http::HeaderMap, route: &'static str) -> platform::otel::Hop {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut hop =
        platform::otel::Hop::continuing(platform::otel::Kind::Server, route, header("traceparent"))
            .with_tracestate(platform::trace::tracestate(header("tracestate")));
    hop.attribute("http.request.method", "POST");
    hop.attribute("http.route", route.trim_start_matches("POST "));
    tracing::Span::current().record("trace_id", hop.traceparent().trace_id().as_str());
    hop
}

/// Every route of the simulator.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/payments", post(payments::create).get(payments::find))
        .route("/v1/payments/{id}", get(payments::show))
        .route("/v1/payments/{id}/refunds", post(refunds::create))
        .route("/v1/payments/{id}/capture", post(capture::capture))
        .route("/v1/payments/{id}/cancel", post(capture::cancel))
        .route("/v1/payments/{id}/action", post(action::complete))
        .route("/v1/refunds", get(listing::refunds))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            inject_latency,
        ));
    Router::new()
        .route("/healthz", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .route("/admin/faults", get(admin::show).put(admin::replace))
        .route("/admin/payments/{id}/dispute", post(disputes::create))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn inject_latency(State(state): SharedState, request: Request, next: Next) -> Response {
    let latency_ms = state.faults.current().latency_ms;
    if latency_ms > 0 {
        // Counted as it starts, so a test sees a request is being held.
        state
            .counters
            .fault_injected(crate::counters::Fault::Latency, 1);
        tokio::time::sleep(Duration::from_millis(latency_ms)).await;
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

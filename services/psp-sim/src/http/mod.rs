//! The HTTP surface: routes, shared state, the latency fault applied to every `/v1` call, and
//! what settling a `processing` payment does besides changing the books (counting and
//! announcing it).

mod admin;
mod listing;
mod ops;
mod payments;
mod refunds;
mod reply;
mod request;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;

use crate::counters::{Counters, Fault};
use crate::faults::FaultSwitch;
use crate::ledger::Ledger;
use crate::model::{Payment, PaymentStatus};
use crate::problem::ApiError;
use crate::settlement::{Settled, SettlementQueue};
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

/// Counts and announces a payment's outcome, if it has one yet.
fn payment_outcome(state: &AppState, payment: &Payment) {
    state.counters.payment_outcome(payment.status);
    if payment.status == PaymentStatus::Failed {
        state.counters.fault_injected(Fault::Decline, 1);
    }
    let trace = state
        .traces
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&payment.id);
    state.webhooks.payment_outcome(payment, trace);
}

/// Remembers the trace a payment still `processing` was created under.
fn remember_trace(state: &AppState, payment_id: &str, trace: crate::webhook::Trace) {
    state
        .traces
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(payment_id.to_owned(), trace);
}

/// Settles a `processing` payment that fell due: journaled and applied, then counted and
/// announced. Called by the settlement timer.
pub(crate) fn settle(state: &AppState, payment_id: &str) -> Settled {
    let settled = state.ledger().settle(payment_id, chrono::Utc::now());
    match settled {
        Ok(Some(payment)) => {
            tracing::info!(payment_id, order_id = %payment.reference, status = ?payment.status, "payment settled");
            payment_outcome(state, &payment);
            Settled::Done
        }
        Ok(None) => Settled::Done,
        Err(error) => {
            tracing::error!(%error, payment_id, "could not settle the payment; will try again");
            Settled::Retry
        }
    }
}

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

/// Every route of the simulator.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/payments", post(payments::create).get(payments::find))
        .route("/v1/payments/{id}", get(payments::show))
        .route("/v1/payments/{id}/refunds", post(refunds::create))
        .route("/v1/refunds", get(listing::refunds))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            inject_latency,
        ));
    Router::new()
        .route("/healthz", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .route("/admin/faults", get(admin::show).put(admin::replace))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn inject_latency(State(state): SharedState, request: Request, next: Next) -> Response {
    let latency_ms = state.faults.current().latency_ms;
    if latency_ms > 0 {
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

//! The merchant's changes to an authorized payment, once per `Idempotency-Key`:
//! `POST /v1/payments/{id}/capture` (take all or part of the money) and
//! `POST /v1/payments/{id}/cancel` (void it). Both answer 200 with the payment, new or
//! replayed, like Stripe.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::Utc;

use super::request::optional_json_body;
use super::{changes, reply, SharedState};
use crate::counters::Change;
use crate::ledger::Recorded;
use crate::model::{CancelRequest, CaptureRequest};
use crate::problem::ApiError;

/// Captures a `requires_capture` payment; an empty body captures all that was authorized,
/// a smaller amount releases the rest.
#[tracing::instrument(skip_all, fields(payment_id = %payment_id, idempotency_key, trace_id))]
pub(super) async fn capture(
    State(state): SharedState,
    Path(payment_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let hop = super::continuing(&headers, "POST /v1/payments/{id}/capture");
    let (faults, key) = super::admit_keyed(&state, &headers)?;
    let request: CaptureRequest = optional_json_body(&body)?;
    request.validate()?;
    let recorded = state
        .ledger()
        .capture(&payment_id, &key, request, Utc::now())?;
    match &recorded {
        Recorded::Created(payment) => {
            let partial = payment.amount_captured < payment.amount_minor;
            tracing::info!(order_id = %payment.reference, trace_id = %hop.traceparent().trace_id(), amount_captured = payment.amount_captured, "payment captured");
            state.counters.payment_captured(partial);
            changes::remember_trace(&state, &payment.id, &hop);
            changes::payment_changed(&state, payment);
        }
        Recorded::Replayed(_) => state.counters.change_replayed(Change::Capture),
    }
    Ok(reply::changed(&state, &faults, recorded).await)
}

/// Cancels a payment awaiting the buyer or its capture (`cancellation_reason: requested`).
/// Canceling it again with a new key is refused; with the same key, the first answer repeats.
#[tracing::instrument(skip_all, fields(payment_id = %payment_id, idempotency_key, trace_id))]
pub(super) async fn cancel(
    State(state): SharedState,
    Path(payment_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let hop = super::continuing(&headers, "POST /v1/payments/{id}/cancel");
    let (faults, key) = super::admit_keyed(&state, &headers)?;
    let CancelRequest {} = optional_json_body(&body)?;
    let recorded = state.ledger().cancel(&payment_id, &key, Utc::now())?;
    match &recorded {
        Recorded::Created(payment) => {
            tracing::info!(order_id = %payment.reference, "payment canceled");
            changes::remember_trace(&state, &payment.id, &hop);
            changes::payment_changed(&state, payment);
        }
        Recorded::Replayed(_) => state.counters.change_replayed(Change::Cancel),
    }
    Ok(reply::changed(&state, &faults, recorded).await)
}

//! `POST /v1/payments/{id}/refunds`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::Utc;

use super::request::optional_json_body;
use super::{reply, SharedState};
use crate::ledger::Recorded;
use crate::model::RefundRequest;
use crate::problem::ApiError;

/// Refunds once per `Idempotency-Key`; an empty body refunds everything left.
#[tracing::instrument(skip_all, fields(payment_id = %payment_id, idempotency_key))]
pub(super) async fn create(
    State(state): SharedState,
    Path(payment_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (faults, key) = super::admit_keyed(&state, &headers)?;
    let request: RefundRequest = optional_json_body(&body)?;
    request.validate()?;
    let recorded = state
        .ledger()
        .refund(&payment_id, &key, request, Utc::now())?;
    match &recorded {
        Recorded::Created(refund) => {
            state.counters.refund_created();
            tracing::info!(refund_id = %refund.id, amount_minor = refund.amount_minor, "refund created");
            state.webhooks.refund_created(refund);
        }
        Recorded::Replayed(_) => state.counters.refund_replayed(),
    }
    Ok(reply::recorded(&state, &faults, recorded).await)
}

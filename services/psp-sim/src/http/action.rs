//! `POST /v1/payments/{id}/action`: the simulated buyer ending a 3-D Secure step (where a
//! `requires_action` payment's `next_action.url` points). No idempotency key and no faults:
//! it is the buyer, not the merchant, calling.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use chrono::Utc;

use super::request::json_body;
use super::{changes, SharedState};
use crate::model::{ActionRequest, Payment};
use crate::problem::ApiError;

/// `{"outcome": "succeeded" | "failed" | "abandoned"}`: authorized (held, or captured at
/// once), failed (`authentication_failed`) or canceled (`abandoned`).
#[tracing::instrument(skip_all, fields(payment_id = %payment_id))]
pub(super) async fn complete(
    State(state): SharedState,
    Path(payment_id): Path<String>,
    body: Bytes,
) -> Result<Json<Payment>, ApiError> {
    let ActionRequest { outcome } = json_body(&body)?;
    let payment = state.ledger().act(&payment_id, outcome, Utc::now())?;
    tracing::info!(order_id = %payment.reference, ?outcome, status = %payment.status, "buyer's action completed");
    changes::payment_changed(&state, &payment);
    Ok(Json(payment))
}

//! `POST /admin/payments/{id}/dispute`: the buyer's bank takes captured money back. Admin,
//! like `/admin/faults`: no key, no faults, no authentication.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;

use super::request::optional_json_body;
use super::SharedState;
use crate::model::{Dispute, DisputeRequest};
use crate::problem::ApiError;

/// Opens a dispute; an empty body disputes everything captured, not refunded and not yet
/// disputed, for reason `general`.
#[tracing::instrument(skip_all, fields(payment_id = %payment_id))]
pub(super) async fn create(
    State(state): SharedState,
    Path(payment_id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<Dispute>), ApiError> {
    let request: DisputeRequest = optional_json_body(&body)?;
    request.validate()?;
    let dispute = state.ledger().dispute(&payment_id, request, Utc::now())?;
    tracing::info!(dispute_id = %dispute.id, amount_minor = dispute.amount_minor, "dispute opened");
    state.counters.dispute_created();
    state.webhooks.dispute_created(&dispute);
    Ok((StatusCode::CREATED, Json(dispute)))
}

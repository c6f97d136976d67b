//! `POST /v1/payments`, `GET /v1/payments/{id}` and `GET /v1/payments?…`.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::request::json_body;
use super::{reply, SharedState};
use crate::counters::Fault;
use crate::faults::roll;
use crate::ledger::Recorded;
use crate::model::{Payment, PaymentRequest, PaymentStatus};
use crate::problem::ApiError;

/// `POST /v1/payments`: charges once per `Idempotency-Key`.
#[tracing::instrument(skip_all, fields(idempotency_key))]
pub(super) async fn create(
    State(state): SharedState,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (faults, key) = super::admit_keyed(&state, &headers)?;
    let request: PaymentRequest = json_body(&body)?;
    request.validate()?;
    let declined = roll(faults.decline_rate);
    let recorded = state.ledger().charge(&key, request, declined, Utc::now())?;
    match &recorded {
        Recorded::Created(payment) => {
            state.counters.payment_created(payment.status);
            if payment.status == PaymentStatus::Failed {
                state.counters.fault_injected(Fault::Decline, 1);
            }
            tracing::info!(payment_id = %payment.id, status = ?payment.status, "payment created");
            state.webhooks.payment_created(payment);
        }
        Recorded::Replayed(_) => state.counters.payment_replayed(),
    }
    Ok(reply::recorded(&state, &faults, recorded).await)
}

/// `GET /v1/payments/{id}`.
pub(super) async fn show(
    State(state): SharedState,
    Path(id): Path<String>,
) -> Result<Json<Payment>, ApiError> {
    state
        .ledger()
        .payment(&id)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no payment has id {id}")))
}

/// The query of `GET /v1/payments`: exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Lookup {
    idempotency_key: Option<String>,
    reference: Option<String>,
}

/// Body of `GET /v1/payments?reference=`.
#[derive(Debug, Serialize)]
struct PaymentList {
    payments: Vec<Payment>,
}

/// `GET /v1/payments?idempotency_key=K` (one payment or 404) or `?reference=R` (a list).
pub(super) async fn find(
    State(state): SharedState,
    query: Result<Query<Lookup>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(lookup) = query.map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))?;
    match (lookup.idempotency_key, lookup.reference) {
        (Some(key), None) => state
            .ledger()
            .payment_by_key(&key)
            .map(|payment| Json(payment).into_response())
            .ok_or_else(|| ApiError::NotFound(format!("no payment has idempotency key {key:?}"))),
        (None, Some(reference)) => {
            let payments = state.ledger().payments_for_reference(&reference);
            Ok(Json(PaymentList { payments }).into_response())
        }
        _ => Err(ApiError::InvalidQuery(
            "give exactly one of idempotency_key or reference".to_owned(),
        )),
    }
}

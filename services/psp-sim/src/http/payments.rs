//! `POST /v1/payments`, `GET /v1/payments/{id}` and `GET /v1/payments?…` (a lookup by key or
//! reference, or else a paged listing).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};

use super::listing::ListQuery;
use super::request::json_body;
use super::{changes, reply, SharedState};
use crate::counters::Fault;
use crate::faults::roll;
use crate::ledger::{Outcome, Recorded, Roll};
use crate::model::{Payment, PaymentRequest, PaymentStatus};
use crate::problem::ApiError;
use crate::settlement::Job;

/// `POST /v1/payments`: charges once per `Idempotency-Key`.
#[tracing::instrument(skip_all, fields(idempotency_key, order_id, trace_id))]
pub(super) async fn create(
    State(state): SharedState,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let hop = super::continuing(&headers, "POST /v1/payments");
    let trace = hop.traceparent();
    let span = tracing::Span::current();
    let (faults, key) = super::admit_keyed(&state, &headers)?;
    let request: PaymentRequest = json_body(&body)?;
    request.validate()?;
    span.record("order_id", request.reference.as_str());
    let rolled = Roll {
        outcome: Outcome::declined_if(roll(faults.decline_rate)),
        processing: roll(faults.processing_rate),
        action_required: roll(faults.action_required_rate),
    };
    let recorded = state.ledger().charge(&key, request, rolled, Utc::now())?;
    match &recorded {
        Recorded::Created(payment) => {
            tracing::info!(
                payment_id = %payment.id,
                order_id = %payment.reference,
                trace_id = %trace.trace_id(),
                status = ?payment.status,
                "payment created"
            );
            changes::remember_trace(&state, &payment.id, &hop);
            if payment.status == PaymentStatus::Processing {
                state.counters.fault_injected(Fault::Processing, 1);
                let after = Duration::from_millis(faults.processing_ms);
                let job = Job::Settle(payment.id.clone());
                state.settlements.schedule(job, after);
            } else {
                if payment.status == PaymentStatus::RequiresAction {
                    state.counters.fault_injected(Fault::ActionRequired, 1);
                }
                changes::payment_changed(&state, payment);
            }
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

/// The query of `GET /v1/payments`: one of `idempotency_key` or `reference`, or else (with
/// neither) the listing parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Lookup {
    idempotency_key: Option<String>,
    reference: Option<String>,
    created_gte: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// Body of `GET /v1/payments?reference=`.
#[derive(Debug, Serialize)]
struct PaymentList {
    payments: Vec<Payment>,
}

/// `GET /v1/payments?idempotency_key=K` (one payment or 404), `?reference=R` (a list), or
/// with neither a page of every payment (`created_gte`, `limit`, `cursor`).
pub(super) async fn find(
    State(state): SharedState,
    query: Result<Query<Lookup>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(lookup) = query.map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))?;
    let list = ListQuery {
        created_gte: lookup.created_gte,
        limit: lookup.limit,
        cursor: lookup.cursor,
    };
    let lookup_given = lookup.idempotency_key.is_some() || lookup.reference.is_some();
    if lookup_given && !list.is_empty() {
        return Err(ApiError::InvalidQuery(
            "created_gte, limit and cursor list payments; they cannot be combined with \
             idempotency_key or reference"
                .to_owned(),
        ));
    }
    match (lookup.idempotency_key, lookup.reference) {
        (None, None) => super::listing::payments(&state, list),
        (Some(key), None) => state
            .ledger()
            .payment_by_key(&key)
            .map(|payment| Json(payment).into_response())
            .ok_or_else(|| ApiError::NotFound(format!("no payment has idempotency key {key:?}"))),
        (None, Some(reference)) => {
            let payments = state.ledger().payments_for_reference(&reference);
            Ok(Json(PaymentList { payments }).into_response())
        }
        (Some(_), Some(_)) => Err(ApiError::InvalidQuery(
            "give exactly one of idempotency_key or reference".to_owned(),
        )),
    }
}

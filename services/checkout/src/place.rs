//! `POST /v1/orders`: validate, price from the catalogue, then one
//! transaction claims the idempotency key, records the order and reserves
//! its units. Out of stock is a stored answer too, so a retry hears it again.

use crate::auth::Account;
use crate::error::ApiError;
use crate::logging::RequestTrace;
use crate::request;
use crate::view::OrderView;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::{Command, Money, PlaceOrder};
use events::Metadata;
use store::idempotency::{Claim, KeyedRequest, StoredResponse};
use store::orders::{HoldLimits, LimitReached, PlaceOutcome};
use uuid::Uuid;

/// Places an order.
#[tracing::instrument(skip_all, fields(account_id = %account))]
pub(crate) async fn place_order(
    State(state): State<AppState>,
    Account(account): Account,
    trace: RequestTrace,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let outcome = place(&state, account, &trace, &headers, body).await;
    let label = match &outcome {
        Ok((_, label)) => *label,
        Err(
            ApiError::Invalid(_)
            | ApiError::Malformed(_)
            | ApiError::TooLarge
            | ApiError::UnsupportedMediaType,
        ) => "invalid",
        Err(ApiError::OutOfStock(_)) => "out_of_stock",
        Err(ApiError::OverOrderLimit { .. } | ApiError::LimitReached(_)) => "limit",
        Err(ApiError::KeyInFlight) => "key_in_flight",
        Err(ApiError::KeyReused) => "key_mismatch",
        Err(ApiError::Unavailable(_)) => "unavailable",
        Err(_) => "error",
    };
    metrics::counter!("soldonce_checkout_requests_total", "outcome" => label).increment(1);
    outcome.map(|(response, _)| response)
}

async fn place(
    state: &AppState,
    account_id: Uuid,
    trace: &RequestTrace,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Response, &'static str), ApiError> {
    let body = body?;
    request::check_content_type(headers)?;
    let key = request::idempotency_key(headers)?;
    let req = request::parse(&body)?;

    let skus: Vec<&str> = req.lines.iter().map(|(s, _)| s.as_str()).collect();
    let prices = store::catalog::prices(&state.pool, &skus).await?;
    let mut lines = Vec::with_capacity(req.lines.len());
    let mut holds = HoldLimits {
        max_reserved_units: state.limiter.limits().max_reserved_units,
        per_account: vec![],
    };
    for (sku, quantity) in &req.lines {
        let price = prices
            .get(sku.as_str())
            .ok_or_else(|| ApiError::Invalid(format!("unknown sku {sku}")))?;
        if let Some(max) = price.max_per_order.filter(|max| quantity.get() > *max) {
            metrics::counter!("soldonce_limit_refusals_total", "limit" => "max_per_order")
                .increment(1);
            return Err(ApiError::OverOrderLimit {
                sku: sku.clone(),
                max,
            });
        }
        if let Some(limit) = price.per_account_limit {
            holds.per_account.push((sku.clone(), limit));
        }
        let money = Money::new(price.minor, price.currency)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        lines.push((sku.clone(), *quantity, money));
    }

    let now = store::now();
    let order_id = Uuid::now_v7();
    let command = Command::Place(PlaceOrder {
        order_id,
        account_id,
        lines,
        shipping: req.shipping,
        placed_at: now,
        expires_at: now + state.ttl,
    });
    let events = domain::decide(None, command).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let order = domain::fold(&events)
        .ok_or_else(|| ApiError::Internal("placing produced no order".into()))?;
    let accepted = StoredResponse {
        status: 202,
        body: serde_json::to_value(OrderView::from(&order))
            .map_err(|e| ApiError::Internal(e.to_string()))?,
        order_id: Some(order_id),
    };
    let keyed = KeyedRequest {
        account_id,
        key: &key,
        fingerprint: req.fingerprint,
    };
    let meta = Metadata::from_request("checkout", order_id, Some(trace.to_string()));

    match store::orders::place(
        &state.pool,
        &keyed,
        &accepted,
        &order,
        &events,
        &meta,
        &holds,
    )
    .await?
    {
        PlaceOutcome::Placed => Ok((stored_response(&accepted, false), "placed")),
        PlaceOutcome::Claim(claim) => claim_response(claim),
        PlaceOutcome::LimitReached(reached) => {
            count_limit_refusal(&reached);
            remember(state, &keyed, ApiError::LimitReached(reached)).await
        }
        PlaceOutcome::OutOfStock(sku) => remember(state, &keyed, ApiError::OutOfStock(sku)).await,
    }
}

fn count_limit_refusal(reached: &LimitReached) {
    let name = match reached {
        LimitReached::ReservedUnits { .. } => "reserved_units",
        LimitReached::PerAccount { .. } => "per_account",
    };
    metrics::counter!("soldonce_limit_refusals_total", "limit" => name).increment(1);
}

/// Stores a refusal under the key, so a retry hears it again, and answers
/// it; or answers what the key already holds.
async fn remember(
    state: &AppState,
    keyed: &KeyedRequest<'_>,
    refusal: ApiError,
) -> Result<(Response, &'static str), ApiError> {
    match store::idempotency::record(&state.pool, keyed, &refusal.to_stored()).await? {
        Claim::Claimed => Err(refusal),
        other => claim_response(other),
    }
}

fn claim_response(claim: Claim) -> Result<(Response, &'static str), ApiError> {
    match claim {
        Claim::Replay(stored) => Ok((stored_response(&stored, true), "replayed")),
        Claim::Claimed => Err(ApiError::Internal("claim reported after the fact".into())),
        Claim::InFlight => Err(ApiError::KeyInFlight),
        Claim::Mismatch => Err(ApiError::KeyReused),
    }
}

/// Renders a stored answer: its status, body and, for an order, Location.
pub(crate) fn stored_response(stored: &StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        "application/problem+json"
    };
    let mut response =
        (status, serde_json::to_vec(&stored.body).unwrap_or_default()).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(id) = stored.order_id.filter(|_| status.is_success()) {
        if let Ok(location) = HeaderValue::from_str(&format!("/v1/orders/{id}")) {
            h.insert(header::LOCATION, location);
        }
    }
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

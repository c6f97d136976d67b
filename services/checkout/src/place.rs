//! `POST /v1/orders`: validate the request on its own, then place it with
//! the group it joins (`coalesce`): price the group's SKUs in one query,
//! decide each order, and commit the whole group in one transaction
//! (`store::placing`) — each request still gets its own answer. Out of
//! stock is a stored answer too, so a retry hears it again.

use crate::auth::Account;
use crate::error::ApiError;
use crate::logging::RequestTrace;
use crate::reply::stored_response;
use crate::request::{self, OrderRequest};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use domain::{Command, Money, PlaceOrder};
use events::Metadata;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::sync::Arc;
use store::idempotency::{Claim, KeyedRequest, StoredBody, StoredResponse};
use store::placing::{HoldLimits, LimitReached, PlaceOutcome, Placement};
use uuid::Uuid;

/// A request's answer and the outcome label its metric counts.
pub(crate) type Answer = Result<(Response, &'static str), ApiError>;

/// Places an order.
#[tracing::instrument(skip_all, fields(account_id = %account))]
pub(crate) async fn place_order(
    State(state): State<AppState>,
    Account(account): Account,
    trace: RequestTrace,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let outcome = match draft(account, &trace, &headers, body) {
        Ok(draft) => state.placer.place(draft).await,
        Err(e) => Err(e),
    };
    let label = match &outcome {
        Ok((_, label)) => *label,
        Err(
            ApiError::Invalid(_)
            | ApiError::InvalidField { .. }
            | ApiError::Malformed(_)
            | ApiError::TooLarge
            | ApiError::UnsupportedMediaType,
        ) => "invalid",
        Err(ApiError::OutOfStock(_)) => "out_of_stock",
        Err(ApiError::Inactive(_)) => "inactive",
        Err(ApiError::OverOrderLimit { .. } | ApiError::LimitReached(_)) => "limit",
        Err(ApiError::KeyInFlight) => "key_in_flight",
        Err(ApiError::KeyReused) => "key_mismatch",
        Err(ApiError::Unavailable(_)) => "unavailable",
        Err(ApiError::Overloaded(_)) => "overloaded",
        Err(_) => "error",
    };
    metrics::counter!("soldonce_checkout_requests_total", "outcome" => label).increment(1);
    outcome.map(|(response, _)| response)
}

/// A request checked on its own, waiting for its group.
pub(crate) struct Draft {
    account_id: Uuid,
    key: String,
    request: OrderRequest,
    traceparent: String,
    tracestate: Option<String>,
}

fn draft(
    account_id: Uuid,
    trace: &RequestTrace,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Draft, ApiError> {
    let body = body?;
    request::check_content_type(headers)?;
    let key = request::idempotency_key(headers)?;
    let request = request::parse(&body)?;
    Ok(Draft {
        account_id,
        key,
        request,
        traceparent: trace.to_string(),
        tracestate: trace.tracestate(),
    })
}

/// What placing a group needs.
pub(crate) struct Context {
    pub pool: PgPool,
    pub ttl: chrono::Duration,
    pub limiter: Arc<crate::limits::Limiter>,
}

/// Places a group of drafts (in arrival order): one answer per draft, in
/// the same order.
pub(crate) async fn place_group(ctx: &Context, drafts: &[Draft]) -> Vec<Answer> {
    let skus: BTreeSet<&str> = drafts
        .iter()
        .flat_map(|d| d.request.lines.iter().map(|(s, _)| s.as_str()))
        .collect();
    let skus: Vec<&str> = skus.into_iter().collect();
    let prices = match store::catalog::prices(&ctx.pool, &skus).await {
        Ok(prices) => prices,
        Err(e) => return drafts.iter().map(|_| Err(failed(&e))).collect(),
    };
    let mut answers: Vec<Option<Answer>> = drafts.iter().map(|_| None).collect();
    let mut placements = Vec::with_capacity(drafts.len());
    let mut placed_from = Vec::with_capacity(drafts.len());
    for (i, d) in drafts.iter().enumerate() {
        match placement(ctx, d, &prices) {
            Ok(p) => {
                placements.push(p);
                placed_from.push(i);
            }
            Err(e) => answers[i] = Some(Err(e)),
        }
    }
    if !placements.is_empty() {
        let started = std::time::Instant::now();
        let refusal = |o: &PlaceOutcome| match o {
            PlaceOutcome::OutOfStock(sku) => ApiError::OutOfStock(sku.clone()).to_stored(),
            PlaceOutcome::LimitReached(r) => ApiError::LimitReached(r.clone()).to_stored(),
            other => ApiError::Internal(format!("no stored refusal for {other:?}")).to_stored(),
        };
        let placed = store::placing::place(&ctx.pool, &placements, refusal).await;
        metrics::histogram!("soldonce_checkout_group_size").record(placements.len() as f64);
        metrics::histogram!("soldonce_checkout_group_seconds")
            .record(started.elapsed().as_secs_f64());
        match placed {
            Ok((outcomes, report)) => {
                if report.relocked {
                    metrics::counter!("soldonce_checkout_group_retries_total", "reason" => "stale_stock")
                        .increment(1);
                }
                if report.bisected {
                    metrics::counter!("soldonce_checkout_group_retries_total", "reason" => "bisected")
                        .increment(1);
                }
                if report.isolated {
                    metrics::counter!("soldonce_checkout_group_retries_total", "reason" => "isolated")
                        .increment(1);
                }
                metrics::counter!("soldonce_checkout_isolated_placements_total")
                    .increment(report.failed_alone as u64);
                if report.transient_retries > 0 {
                    metrics::counter!("soldonce_checkout_group_retries_total", "reason" => "deadlock")
                        .increment(u64::from(report.transient_retries));
                }
                for ((i, p), outcome) in placed_from.iter().zip(&placements).zip(outcomes) {
                    if matches!(outcome, Ok(PlaceOutcome::Placed)) {
                        tracing::debug!(
                            order_id = %p.order.id,
                            trace_id = platform::trace::TraceParent::parse(&drafts[*i].traceparent).map(|t| t.trace_id()),
                            "order placed"
                        );
                    }
                    answers[*i] = Some(match outcome {
                        Ok(outcome) => answer(p, outcome),
                        Err(e) => Err(ApiError::from(e)),
                    });
                }
            }
            Err(e) => {
                for i in &placed_from {
                    answers[*i] = Some(Err(failed(&e)));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(ApiError::Internal("a placement went unanswered".into()))))
        .collect()
}

/// Prices and decides one draft's order.
fn placement<'a>(
    ctx: &Context,
    d: &'a Draft,
    prices: &std::collections::HashMap<String, store::catalog::Price>,
) -> Result<Placement<'a>, ApiError> {
    let mut lines = Vec::with_capacity(d.request.lines.len());
    let mut limits = HoldLimits {
        max_reserved_units: ctx.limiter.limits().max_reserved_units,
        per_account: vec![],
    };
    for (sku, quantity) in &d.request.lines {
        let price = prices
            .get(sku.as_str())
            .ok_or_else(|| ApiError::Invalid(format!("unknown sku {sku}")))?;
        if !price.active {
            return Err(ApiError::Inactive(sku.clone()));
        }
        if let Some(max) = price.max_per_order.filter(|max| quantity.get() > *max) {
            metrics::counter!("soldonce_limit_refusals_total", "limit" => "max_per_order")
                .increment(1);
            return Err(ApiError::OverOrderLimit {
                sku: sku.clone(),
                max,
            });
        }
        if let Some(limit) = price.per_account_limit {
            limits.per_account.push((sku.clone(), limit));
        }
        let money = Money::new(price.minor, price.currency)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        lines.push((sku.clone(), *quantity, money));
    }

    let now = store::now();
    let order_id = Uuid::now_v7();
    let command = Command::Place(PlaceOrder {
        order_id,
        account_id: d.account_id,
        lines,
        shipping: d.request.shipping.clone(),
        placed_at: now,
        expires_at: now + ctx.ttl,
    });
    let events = domain::decide(None, command).map_err(|e| ApiError::Invalid(e.to_string()))?;
    let order = domain::fold(&events)
        .ok_or_else(|| ApiError::Internal("placing produced no order".into()))?;
    let accepted = StoredResponse {
        status: 202,
        body: StoredBody::Placed(Box::new(order.clone())),
        order_id: Some(order_id),
    };
    Ok(Placement {
        key: KeyedRequest {
            account_id: d.account_id,
            key: &d.key,
            fingerprint: d.request.fingerprint,
        },
        accepted,
        order,
        events,
        meta: Metadata::from_request("checkout", order_id, Some(d.traceparent.clone()))
            .with_tracestate(d.tracestate.clone()),
        limits,
    })
}

/// A store failure every placement of the group hears.
fn failed(e: &store::StoreError) -> ApiError {
    if e.is_unavailable() {
        ApiError::Unavailable(e.to_string())
    } else {
        ApiError::Internal(e.to_string())
    }
}

fn answer(p: &Placement<'_>, outcome: PlaceOutcome) -> Answer {
    match outcome {
        PlaceOutcome::Placed => Ok((stored_response(&p.accepted, false), "placed")),
        PlaceOutcome::Claim(claim) => claim_response(claim),
        PlaceOutcome::LimitReached(reached) => {
            count_limit_refusal(&reached);
            Err(ApiError::LimitReached(reached))
        }
        PlaceOutcome::OutOfStock(sku) => Err(ApiError::OutOfStock(sku)),
    }
}

fn count_limit_refusal(reached: &LimitReached) {
    let name = match reached {
        LimitReached::ReservedUnits { .. } => "reserved_units",
        LimitReached::PerAccount { .. } => "per_account",
    };
    metrics::counter!("soldonce_limit_refusals_total", "limit" => name).increment(1);
}

fn claim_response(claim: Claim) -> Answer {
    match claim {
        Claim::Replay(stored) => Ok((stored_response(&stored, true), "replayed")),
        Claim::Claimed => Err(ApiError::Internal("claim reported after the fact".into())),
        Claim::InFlight => Err(ApiError::KeyInFlight),
        Claim::Mismatch => Err(ApiError::KeyReused),
    }
}

//! Reading and cancelling orders. Another account's order is a 404, never a 403.

use crate::auth::Account;
use crate::error::ApiError;
use crate::logging::RequestTrace;
use crate::view::OrderView;
use crate::AppState;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use domain::Command;
use store::orders::{RecordedEvent, Transition};
use uuid::Uuid;

fn order_id(path: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    let Path(raw) = path.map_err(|_| ApiError::NotFound)?;
    Uuid::parse_str(&raw).map_err(|_| ApiError::NotFound)
}

/// `GET /v1/orders/{id}`.
pub(crate) async fn get_order(
    State(state): State<AppState>,
    Account(account): Account,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    let id = order_id(path)?;
    let order = store::orders::load(&state.pool, id, Some(account))
        .await?
        .ok_or(ApiError::NotFound)?;
    let mut view = OrderView::from(&order);
    view.shipment = store::shipments::for_order(&state.pool, id)
        .await?
        .map(Into::into);
    Ok(Json(view))
}

/// Orders per page of `GET /v1/orders` unless `limit` says otherwise, and at most.
const PAGE_DEFAULT: i64 = 50;
const PAGE_MAX: i64 = 200;

/// The query of `GET /v1/orders`.
#[derive(serde::Deserialize)]
pub(crate) struct ListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// The body of `GET /v1/orders`.
#[derive(serde::Serialize)]
pub(crate) struct OrdersPage {
    orders: Vec<OrderView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    next_cursor: Option<String>,
}

/// A cursor: the page's last order, opaque to clients.
fn encode_cursor(end: store::orders::PageEnd) -> String {
    use base64::Engine;
    let raw = format!("{}|{}", end.created_at.timestamp_micros(), end.id);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_cursor(cursor: &str) -> Option<store::orders::PageEnd> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    let (micros, id) = std::str::from_utf8(&raw).ok()?.split_once('|')?;
    Some(store::orders::PageEnd {
        created_at: chrono::DateTime::from_timestamp_micros(micros.parse().ok()?)?,
        id: id.parse().ok()?,
    })
}

/// `GET /v1/orders?limit=&cursor=`: the account's orders, newest first, a
/// page at a time (each order on exactly one page, however many are placed
/// meanwhile).
pub(crate) async fn list_orders(
    State(state): State<AppState>,
    Account(account): Account,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OrdersPage>, ApiError> {
    let axum::extract::Query(query) =
        query.map_err(|e| ApiError::Invalid(format!("query: {e}")))?;
    let limit = match query.limit.as_deref() {
        None => PAGE_DEFAULT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::Invalid(format!(
                    "limit: {text:?} is not a whole number from 1 to {PAGE_MAX}"
                ))
            })?,
    };
    let after = match query.cursor.as_deref() {
        None | Some("") => None,
        Some(text) => Some(decode_cursor(text).ok_or_else(|| {
            ApiError::Invalid(
                "cursor: not a cursor this API gave (pass next_cursor as it came)".into(),
            )
        })?),
    };
    let (orders, end) = store::orders::list_for_account(&state.pool, account, after, limit).await?;
    Ok(Json(OrdersPage {
        orders: orders.iter().map(OrderView::from).collect(),
        next_cursor: end.map(encode_cursor),
    }))
}

/// The body of `GET /v1/orders/{id}/events`.
#[derive(serde::Serialize)]
pub(crate) struct EventsView {
    order_id: Uuid,
    events: Vec<RecordedEvent>,
}

/// `GET /v1/orders/{id}/events`: the order's history in recorded order.
pub(crate) async fn get_events(
    State(state): State<AppState>,
    Account(account): Account,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<EventsView>, ApiError> {
    let id = order_id(path)?;
    let events = store::orders::history(&state.pool, id, Some(account))
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(EventsView {
        order_id: id,
        events,
    }))
}

/// `POST /v1/orders/{id}/cancel`: releases the reservation while payment is pending.
pub(crate) async fn cancel_order(
    State(state): State<AppState>,
    Account(account): Account,
    trace: RequestTrace,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<OrderView>, ApiError> {
    let id = order_id(path)?;
    let meta = trace.meta(id);
    let now = store::now();
    match store::orders::transition(&state.pool, id, Some(account), &meta, |_| Command::Cancel {
        at: now,
    })
    .await?
    {
        Transition::Applied(order) => {
            metrics::counter!("soldonce_cancellations_total").increment(1);
            Ok(Json(OrderView::from(&order)))
        }
        Transition::NotFound => Err(ApiError::NotFound),
        Transition::Refused(e) => Err(ApiError::Conflict(e)),
        Transition::Unchanged(order) => Ok(Json(OrderView::from(&order))),
        Transition::StockShort(sku) => Err(ApiError::Internal(format!(
            "cancel moved no stock for {sku}"
        ))),
    }
}

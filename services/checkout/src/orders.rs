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
use events::Metadata;
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
    let meta = Metadata::from_request("checkout", id, Some(trace.to_string()));
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

//! A stored answer rendered as the response it stands for: what a placement,
//! its replays and a stored refusal all send.

use crate::view::OrderView;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use store::idempotency::{StoredBody, StoredResponse};

/// Renders a stored answer: its status, body and, for an order, Location.
pub(crate) fn stored_response(stored: &StoredResponse, replayed: bool) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        "application/problem+json"
    };
    let body = match &stored.body {
        StoredBody::Json(body) => serde_json::to_vec(body),
        // Through a `Value`, as a body stored as JSON is rendered: its keys
        // in the same order, whether it is sent first or replayed.
        StoredBody::Placed(order) => {
            serde_json::to_value(OrderView::from(&**order)).and_then(|v| serde_json::to_vec(&v))
        }
    };
    let mut response = (status, body.unwrap_or_default()).into_response();
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

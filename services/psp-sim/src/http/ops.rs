//! Health and metrics.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::SharedState;

/// `GET /healthz`: the process is up.
pub(super) async fn health() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// `GET /metrics`: Prometheus text.
pub(super) async fn metrics(State(state): SharedState) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.counters.render(),
    )
}

//! `GET` / `PUT /admin/faults`: read and replace the faults in force.

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;

use super::SharedState;
use crate::faults::Faults;
use crate::problem::ApiError;

/// `GET /admin/faults`: the faults in force, as last set.
pub(super) async fn show(State(state): SharedState) -> Json<Faults> {
    Json(state.faults.current())
}

/// `PUT /admin/faults`: replaces every fault (absent fields reset to their defaults) and
/// re-arms `fail_first`.
#[tracing::instrument(skip_all)]
pub(super) async fn replace(
    State(state): SharedState,
    body: Bytes,
) -> Result<Json<Faults>, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::MalformedBody("the body is not UTF-8".to_owned()))?;
    let faults = Faults::from_json(text)?;
    state.faults.replace(faults.clone());
    tracing::info!(?faults, "faults replaced");
    Ok(Json(faults))
}

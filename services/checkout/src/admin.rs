//! The operators' API, on its own token (`CHECKOUT_ADMIN_TOKEN`, never a
//! buyer's): `POST /admin/v1/orders/{id}/refunds` refunds part or all of
//! what a confirmed order's payment took, once per key — the same decision
//! as `soldonce order refund`. Without the setting the routes answer `503`
//! (not configured).

use crate::error::ApiError;
use crate::AppState;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use domain::DomainError;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use store::operator_refunds::{Asked, OperatorRefund};
use uuid::Uuid;

/// The body of `POST /admin/v1/orders/{id}/refunds`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RefundBody {
    /// The operator's idempotency key: asking again with it refunds nothing more.
    key: String,
    /// In minor units, at least 1; never more than the payment took, all such refunds together.
    amount_minor: i64,
    /// Who asks (recorded with the refund).
    #[serde(default)]
    by: Option<String>,
}

/// The digest of the admin token, compared instead of the token itself.
pub(crate) fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = state.admin_token.as_ref() else {
        return Err(ApiError::NotConfigured(
            "the admin API is not configured (set CHECKOUT_ADMIN_TOKEN)",
        ));
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized("an admin bearer token is required"))?;
    if digest(given) != **expected {
        return Err(ApiError::Unauthorized("the admin token is not valid"));
    }
    Ok(())
}

/// `POST /admin/v1/orders/{id}/refunds`: `201` decided now, `200` asked
/// before with this key and amount; `422` more than is left or a bad key,
/// `409` nothing taken yet (an authorization) or the order not confirmed.
pub(crate) async fn refund(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<RefundBody>, JsonRejection>,
) -> Result<(StatusCode, Json<OperatorRefund>), ApiError> {
    authorize(&state, &headers)?;
    let Path(raw) = path.map_err(|_| ApiError::NotFound)?;
    let id = Uuid::parse_str(&raw).map_err(|_| ApiError::NotFound)?;
    let Json(body) = body.map_err(|e| ApiError::Invalid(e.body_text()))?;
    let by = body.by.as_deref().unwrap_or("admin-api");
    match store::operator_refunds::ask(
        &state.pool,
        id,
        &body.key,
        body.amount_minor,
        by,
        "checkout",
    )
    .await?
    {
        Asked::Decided(row) => {
            metrics::counter!("soldonce_operator_refunds_decided_total").increment(1);
            Ok((StatusCode::CREATED, Json(row)))
        }
        Asked::Again(row) => Ok((StatusCode::OK, Json(row))),
        Asked::NotFound => Err(ApiError::NotFound),
        Asked::Refused(e @ DomainError::RefundExceedsCaptured { .. }) => {
            Err(ApiError::InvalidField {
                field: "amount_minor".into(),
                why: e.to_string(),
            })
        }
        Asked::Refused(DomainError::InvalidRefund(why)) => {
            let field = if why.contains("amount") {
                "amount_minor"
            } else {
                "key"
            };
            Err(ApiError::InvalidField {
                field: field.into(),
                why,
            })
        }
        Asked::Refused(e) => Err(ApiError::Conflict(e)),
    }
}

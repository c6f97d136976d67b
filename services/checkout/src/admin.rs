//! The operators' API, on its own token (`CHECKOUT_ADMIN_TOKEN`, never a
//! buyer's): `POST /admin/v1/orders/{id}/refunds` refunds part or all of
//! what a confirmed order's payment took, once per key — the same decision
//! as `soldonce order refund`; `POST /admin/v1/orders/{id}/cancel` cancels
//! an order before its goods leave, as `soldonce order cancel` does.
//! Without the setting the routes answer `404` (not configured).

use crate::error::ApiError;
use crate::AppState;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use domain::DomainError;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use store::operator_cancels::Cancelled;
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

/// The body of `POST /admin/v1/orders/{id}/cancel`; it may be left out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelBody {
    /// Why (recorded on the order's event), at most 200 characters.
    #[serde(default)]
    reason: String,
    /// Who asks (recorded with the refund or void).
    #[serde(default)]
    by: Option<String>,
}

/// What `POST /admin/v1/orders/{id}/cancel` answers.
#[derive(Debug, serde::Serialize)]
pub(crate) struct CancelReply {
    order_id: Uuid,
    /// `cancelled` now, or `already_cancelled` (nothing new).
    outcome: &'static str,
    state: domain::OrderState,
    /// The void or refund decided with the cancel, if any (`null` on a
    /// repeat, or when nothing was taken or left to give back).
    money: Option<OperatorRefund>,
}

/// `POST /admin/v1/orders/{id}/cancel`: `200` cancelled (or cancelled
/// before); `409` its goods have left, a dispute stands, or it ended
/// otherwise; `422` a bad reason.
pub(crate) async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<Json<CancelReply>, ApiError> {
    authorize(&state, &headers)?;
    let Path(raw) = path.map_err(|_| ApiError::NotFound)?;
    let id = Uuid::parse_str(&raw).map_err(|_| ApiError::NotFound)?;
    let body: CancelBody = if body.iter().all(u8::is_ascii_whitespace) {
        CancelBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::Invalid(e.to_string()))?
    };
    let by = body.by.as_deref().unwrap_or("admin-api");
    let outcome = |o: &'static str| {
        metrics::counter!("soldonce_operator_cancels_total", "outcome" => o).increment(1)
    };
    let (order, money, label) =
        match store::operator_cancels::cancel(&state.pool, id, &body.reason, by, "checkout").await?
        {
            Cancelled::Now { order, money } => (order, money, "cancelled"),
            Cancelled::Already(order) => (order, None, "already_cancelled"),
            Cancelled::NotFound => return Err(ApiError::NotFound),
            Cancelled::Refused(DomainError::InvalidCancel(why)) => {
                outcome("refused");
                return Err(ApiError::InvalidField {
                    field: "reason".into(),
                    why,
                });
            }
            Cancelled::Refused(e) => {
                outcome("refused");
                return Err(ApiError::Conflict(e));
            }
        };
    outcome(if label == "cancelled" {
        "cancelled"
    } else {
        "already"
    });
    Ok(Json(CancelReply {
        order_id: order.id,
        outcome: label,
        state: order.state,
        money,
    }))
}

//! An orders projection row with its lines, as one query, read back into
//! the domain's `Order`.

use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Order, OrderLine, OrderState};
use uuid::Uuid;

/// The projection row with its lines, as one query: the view `order_rows`
/// (migration 33), which holds the column list, aliased `o`.
macro_rules! select_orders {
    () => {
        "SELECT o.* FROM order_rows o"
    };
}
pub(crate) use select_orders;

#[derive(sqlx::FromRow)]
pub(crate) struct OrderRow {
    pub(crate) id: Uuid,
    account_id: Uuid,
    state: String,
    currency: String,
    total_minor: i64,
    shipping: Option<serde_json::Value>,
    payment_id: Option<String>,
    paid_minor: Option<i64>,
    version: i32,
    expires_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    refunds: serde_json::Value,
    capture: Option<String>,
    operator_refunds: serde_json::Value,
    next_action: Option<serde_json::Value>,
    disputes: serde_json::Value,
    lines: serde_json::Value,
}

/// An order's `state` column as the domain's state.
pub(crate) fn parse_state(order_id: Uuid, state: &str) -> Result<OrderState, StoreError> {
    serde_json::from_value(serde_json::Value::String(state.to_owned()))
        .map_err(|_| StoreError::Corrupt(format!("order {order_id}: state")))
}

impl TryFrom<OrderRow> for Order {
    type Error = StoreError;
    fn try_from(r: OrderRow) -> Result<Order, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("order {}: {what}", r.id));
        let state = parse_state(r.id, &r.state)?;
        let lines: Vec<OrderLine> =
            serde_json::from_value(r.lines.clone()).map_err(|_| corrupt("lines"))?;
        let shipping = r
            .shipping
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| corrupt("shipping"))?;
        let refunds = serde_json::from_value(r.refunds.clone()).map_err(|_| corrupt("refunds"))?;
        let disputes =
            serde_json::from_value(r.disputes.clone()).map_err(|_| corrupt("disputes"))?;
        let capture =
            domain::Capture::from_column(r.capture.as_deref()).ok_or_else(|| corrupt("capture"))?;
        let operator_refunds = serde_json::from_value(r.operator_refunds.clone())
            .map_err(|_| corrupt("operator_refunds"))?;
        let next_action = r
            .next_action
            .clone()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|_| corrupt("next_action"))?;
        Ok(Order {
            id: r.id,
            account_id: r.account_id,
            state,
            lines,
            currency: r.currency.parse().map_err(|_| corrupt("currency"))?,
            total_minor: r.total_minor,
            shipping,
            expires_at: r.expires_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            payment: r.payment_id.map(|payment_id| domain::order::PaymentRef {
                payment_id,
                amount_minor: r.paid_minor.unwrap_or_default(),
                capture,
            }),
            refunds,
            operator_refunds,
            next_action,
            disputes,
            version: r.version,
        })
    }
}

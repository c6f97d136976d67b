//! Applying a payment provider's verdict to an order, from whichever of the
//! synchronous reply and the webhook arrives first; the other is a no-op.

use crate::envelope::Metadata;
use crate::orders::{self, Transition};
use crate::StoreError;
use domain::{Command, OrderState};
use sqlx::PgConnection;
use uuid::Uuid;

/// What the PSP said about a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded { payment_id: String, amount_minor: i64 },
    Failed { payment_id: String, reason: String },
}

/// Applies `verdict` inside the caller's transaction. A success on an order
/// that already ended (expired, cancelled) reclaims its units if they are
/// still there (`Transition::StockShort` otherwise: the caller rolls back
/// and refunds).
pub async fn settle(conn: &mut PgConnection, order_id: Uuid, verdict: &Verdict, meta: &Metadata) -> Result<Transition, StoreError> {
    let at = crate::now();
    let verdict = verdict.clone();
    orders::transition_in(conn, order_id, None, meta, move |order| match verdict {
        Verdict::Succeeded { payment_id, amount_minor } => match order.state {
            OrderState::Expired | OrderState::Cancelled => Command::Reactivate { payment_id, amount_minor, at },
            _ => Command::Confirm { payment_id, amount_minor, at },
        },
        Verdict::Failed { payment_id, reason } => Command::FailPayment { payment_id: Some(payment_id), reason, at },
    })
    .await
}

/// Records a webhook id; `false` if it was seen before (then do nothing).
pub async fn record_webhook(conn: &mut PgConnection, webhook_id: &str, event_type: &str, order_id: Option<Uuid>) -> Result<bool, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO webhook_receipts (webhook_id, event_type, order_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(webhook_id)
    .bind(event_type)
    .bind(order_id)
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

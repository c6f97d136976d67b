//! What the webhook path asks before it decides anything: which payments
//! are already recorded (a plain read) and whether a webhook id was seen
//! before (its receipt recorded in the caller's transaction).

use crate::StoreError;
use sqlx::{PgConnection, PgPool};
use std::collections::HashSet;
use uuid::Uuid;

/// Which of `payment_ids` are already recorded (attached to their order, or
/// owed a refund). A recorded payment's disposition is final, so every later
/// report of its success is already known; a plain read, no lock. One
/// statement answers the webhooks of many payments at once (checkout's
/// look-up gathers them); a function plans it at every call on the table as
/// it is, for the reason given at [`LOCK_KNOWN_SQL`](super::LOCK_KNOWN_SQL).
pub async fn known_among(
    pool: &PgPool,
    payment_ids: &[&str],
) -> Result<HashSet<String>, StoreError> {
    let known: Vec<String> = sqlx::query_scalar("SELECT * FROM payments_recorded($1)")
        .bind(payment_ids)
        .fetch_all(pool)
        .await?;
    Ok(known.into_iter().collect())
}

/// Records a webhook id; `false` if it was seen before (then do nothing).
pub async fn record_webhook(
    conn: &mut PgConnection,
    webhook_id: &str,
    event_type: &str,
    order_id: Option<Uuid>,
) -> Result<bool, StoreError> {
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

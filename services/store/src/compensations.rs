//! Compensations: payments whose refund is decided (`payments` rows with
//! disposition `refund`), carried out by one owner until the PSP confirms.
//! An uncaptured authorization is voided instead (`refund_method` `void`,
//! key `void:<payment_id>`): no money moved, none is given back.
//! Claims are leases, so N owners share the work and a crashed owner's
//! claims come back when their lease runs out; the refund's key is stable
//! (`refund:<payment_id>`), so calling twice refunds once.

use crate::orders::{self, Transition};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::Command;
use events::Metadata;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// One refund to carry out.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Compensation {
    pub payment_id: String,
    pub order_id: Option<Uuid>,
    pub amount_minor: i64,
    pub currency: String,
    pub reason: Option<String>,
    /// Attempts so far, this one included.
    pub attempts: i32,
    /// `refund`, or `void` for an authorization never captured.
    pub refund_method: String,
}

impl Compensation {
    /// Whether the payment is voided rather than refunded.
    pub fn is_void(&self) -> bool {
        self.refund_method == "void"
    }

    /// The PSP idempotency key of this refund (or void): one per payment, ever.
    pub fn refund_key(&self) -> String {
        let kind = if self.is_void() { "void" } else { "refund" };
        format!("{kind}:{}", self.payment_id)
    }
}

/// Claims up to `limit` due compensations for `lease`; other owners skip them meanwhile.
pub async fn claim_due(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
) -> Result<Vec<Compensation>, StoreError> {
    Ok(sqlx::query_as(
        "UPDATE payments p SET next_attempt_at = now() + make_interval(secs => $2), attempts = p.attempts + 1 \
         FROM (SELECT payment_id FROM payments WHERE refund_state = 'pending' AND next_attempt_at <= now() \
               ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
         WHERE p.payment_id = due.payment_id \
         RETURNING p.payment_id, p.order_id, p.amount_minor, p.currency, p.reason, p.attempts, p.refund_method",
    )
    .bind(limit)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// Records that the PSP confirmed the refund, with the order's
/// `order.refunded` event, in one transaction. `false` if it was recorded
/// before, or if `amount_minor` is given and is not the compensation's whole
/// amount (a partial refund made elsewhere never closes what soldonce still
/// owes). `None`: soldonce's own refund of everything the payment still
/// held, which leaves the buyer nothing owed whatever was refunded before.
pub async fn complete(
    pool: &PgPool,
    payment_id: &str,
    refund_id: &str,
    amount_minor: Option<i64>,
    source: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let order_id: Option<Option<Uuid>> = sqlx::query_scalar(
        "SELECT order_id FROM payments WHERE payment_id = $1 AND disposition = 'refund'",
    )
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(order_id) = order_id else {
        return Ok(false);
    };
    if let Some(order_id) = order_id {
        // The order row first, as every path locks it.
        orders::load_locked(&mut tx, order_id, None).await?;
    }
    let done = sqlx::query(
        "UPDATE payments SET refund_state = 'succeeded', refund_id = $2, refunded_at = now(), last_error = NULL, next_attempt_at = NULL \
         WHERE payment_id = $1 AND refund_state = 'pending' AND ($3::bigint IS NULL OR amount_minor = $3)",
    )
    .bind(payment_id)
    .bind(refund_id)
    .bind(amount_minor)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    if let Some(order_id) = order_id {
        let meta = Metadata::spontaneous(source, order_id);
        let (payment_id, at) = (payment_id.to_owned(), crate::now());
        match orders::transition_in(&mut tx, order_id, None, &meta, |_| Command::RecordRefund {
            payment_id,
            at,
        })
        .await?
        {
            Transition::Applied(_) | Transition::Unchanged(_) | Transition::NotFound => {}
            other => {
                return Err(StoreError::Corrupt(format!(
                    "order {order_id}: recording a refund: {other:?}"
                )))
            }
        }
    }
    tx.commit().await?;
    Ok(true)
}

/// Leaves a compensation for another attempt after `delay`.
pub async fn postpone(
    pool: &PgPool,
    payment_id: &str,
    delay: Duration,
    error: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payments SET next_attempt_at = now() + make_interval(secs => $2), last_error = left($3, 500) \
         WHERE payment_id = $1 AND refund_state = 'pending'",
    )
    .bind(payment_id)
    .bind(delay.as_secs_f64())
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// The PSP refused the refund for good: it stays outstanding for a person.
pub async fn refuse(pool: &PgPool, payment_id: &str, error: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE payments SET refund_state = 'refused', next_attempt_at = NULL, last_error = left($2, 500) WHERE payment_id = $1 AND refund_state = 'pending'")
        .bind(payment_id)
        .bind(error)
        .execute(pool)
        .await?;
    Ok(())
}

/// How many compensations are outstanding, and since when the oldest.
pub async fn outstanding(pool: &PgPool) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    Ok(sqlx::query_as("SELECT count(*), min(recorded_at) FROM payments WHERE refund_state IN ('pending', 'refused')")
        .fetch_one(pool)
        .await?)
}

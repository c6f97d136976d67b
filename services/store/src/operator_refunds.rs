//! Refunds an operator asks for: part or all of what a confirmed order's
//! payment took, once per key (`soldonce order refund`, checkout's admin
//! API). [`ask`] decides it with the order's `order.operator_refund_decided`
//! event and a row of durable work, in one transaction; the payment worker
//! carries it out like a compensation — claimed under a lease, asked with
//! the stable key `refund:<payment_id>:<key>` until the PSP confirms — and
//! [`complete`] records `order.operator_refunded`. An operator's cancel
//! (`operator_cancels`) decides one too, under the key `soldonce:cancel`:
//! a void (`void`, asked with `void:<payment_id>`) when nothing was taken.

use crate::orders::{self, Transition};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::{Command, DomainError};
use events::Metadata;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// One operator refund, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct OperatorRefund {
    pub order_id: Uuid,
    pub key: String,
    pub payment_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub requested_by: String,
    /// `pending` until the PSP confirms it, then `succeeded`; `refused` needs a person.
    pub state: String,
    pub refund_id: Option<String>,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// An uncaptured authorization to void (a cancel), not money to refund.
    pub void: bool,
}

impl OperatorRefund {
    /// The PSP idempotency key of this refund: one per order and operator
    /// key, ever; a void's is the payment's one void key.
    pub fn psp_key(&self) -> String {
        if self.void {
            format!("void:{}", self.payment_id)
        } else {
            format!("refund:{}:{}", self.payment_id, self.key)
        }
    }
}

/// What became of an operator's ask.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    /// Decided now: the payment worker carries it out.
    Decided(OperatorRefund),
    /// Asked before with the same key and amount: nothing new.
    Again(OperatorRefund),
    /// Refused: more than the payment took, nothing taken yet, a key reused
    /// for another amount, or the order is not confirmed.
    Refused(DomainError),
    NotFound,
}

const COLUMNS: &str = "order_id, key, payment_id, amount_minor, currency, requested_by, state, refund_id, attempts, last_error, void";

/// Decides an operator's refund of `amount_minor` of `order_id`'s payment under `key`.
pub async fn ask(
    pool: &PgPool,
    order_id: Uuid,
    key: &str,
    amount_minor: i64,
    requested_by: &str,
    source: &str,
) -> Result<Asked, StoreError> {
    let mut tx = pool.begin().await?;
    let meta = Metadata::spontaneous(source, order_id);
    let at = crate::now();
    let command = |_: &domain::Order| Command::RefundByOperator {
        key: key.to_owned(),
        amount_minor,
        at,
    };
    let order = match orders::transition_in(&mut tx, order_id, None, &meta, command).await? {
        Transition::Applied(order) => order,
        Transition::Unchanged(_) => {
            return Ok(Asked::Again(find(pool, order_id, key).await?.ok_or_else(
                || StoreError::Corrupt(format!("order {order_id}: refund {key:?} has no row")),
            )?))
        }
        Transition::Refused(e) => return Ok(Asked::Refused(e)),
        Transition::NotFound => return Ok(Asked::NotFound),
        Transition::StockShort(sku) => {
            return Err(StoreError::Corrupt(format!(
                "order {order_id}: a refund moved stock of {sku}"
            )))
        }
    };
    let row = insert(&mut tx, &order, key, requested_by).await?;
    tx.commit().await?;
    Ok(Asked::Decided(row))
}

/// The row of durable work for the operator refund `order` decided under
/// `key`, in the caller's transaction.
pub(crate) async fn insert(
    conn: &mut sqlx::PgConnection,
    order: &domain::Order,
    key: &str,
    requested_by: &str,
) -> Result<OperatorRefund, StoreError> {
    let decided = order
        .operator_refunds
        .iter()
        .find(|r| r.key == key)
        .ok_or_else(|| {
            StoreError::Corrupt(format!("order {}: no refund {key:?} decided", order.id))
        })?;
    Ok(sqlx::query_as(&format!(
        "INSERT INTO operator_refunds (order_id, key, payment_id, amount_minor, currency, requested_by, void, next_attempt_at) \
         VALUES ($1, $2, $3, $4, $5, left($6, 200), $7, now()) RETURNING {COLUMNS}"
    ))
    .bind(order.id)
    .bind(key)
    .bind(&decided.payment_id)
    .bind(decided.amount_minor)
    .bind(order.currency.as_str())
    .bind(requested_by)
    .bind(decided.void)
    .fetch_one(&mut *conn)
    .await?)
}

/// The operator refund of `order_id` under `key`, if any.
pub async fn find(
    pool: &PgPool,
    order_id: Uuid,
    key: &str,
) -> Result<Option<OperatorRefund>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM operator_refunds WHERE order_id = $1 AND key = $2"
    ))
    .bind(order_id)
    .bind(key)
    .fetch_optional(pool)
    .await?)
}

/// Claims up to `limit` due operator refunds for `lease`.
pub async fn claim_due(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
) -> Result<Vec<OperatorRefund>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "UPDATE operator_refunds r SET next_attempt_at = now() + make_interval(secs => $2), attempts = r.attempts + 1 \
         FROM (SELECT order_id, key FROM operator_refunds WHERE state = 'pending' AND next_attempt_at <= now() \
               ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
         WHERE r.order_id = due.order_id AND r.key = due.key RETURNING {}",
        COLUMNS
            .split(", ")
            .map(|c| format!("r.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .bind(limit)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// Records that the PSP made the refund, with the order's
/// `order.operator_refunded` event; `false` if it was recorded before.
pub async fn complete(
    pool: &PgPool,
    refund: &OperatorRefund,
    refund_id: &str,
    source: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let meta = Metadata::spontaneous(source, refund.order_id);
    let (key, at) = (refund.key.clone(), crate::now());
    // The order row first, as every path locks it.
    match orders::transition_in(&mut tx, refund.order_id, None, &meta, |_| {
        Command::RecordOperatorRefund { key, at }
    })
    .await?
    {
        Transition::Applied(_) | Transition::Unchanged(_) => {}
        other => {
            return Err(StoreError::Corrupt(format!(
                "order {}: recording a refund: {other:?}",
                refund.order_id
            )))
        }
    }
    let done = sqlx::query(
        "UPDATE operator_refunds SET state = 'succeeded', refund_id = $3, refunded_at = now(), last_error = NULL, next_attempt_at = NULL \
         WHERE order_id = $1 AND key = $2 AND state = 'pending'",
    )
    .bind(refund.order_id)
    .bind(&refund.key)
    .bind(refund_id)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// Leaves a refund for another attempt after `delay` (`refuse`: for good,
/// for a person).
pub async fn set_aside(
    pool: &PgPool,
    refund: &OperatorRefund,
    delay: Option<Duration>,
    error: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE operator_refunds SET \
           state = CASE WHEN $3::float8 IS NULL THEN 'refused' ELSE state END, \
           next_attempt_at = now() + make_interval(secs => $3), last_error = left($4, 500) \
         WHERE order_id = $1 AND key = $2 AND state = 'pending'",
    )
    .bind(refund.order_id)
    .bind(&refund.key)
    .bind(delay.map(|d| d.as_secs_f64()))
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// How many operator refunds are outstanding, and since when the oldest.
pub async fn outstanding(pool: &PgPool) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    Ok(sqlx::query_as(
        "SELECT count(*), min(requested_at) FROM operator_refunds WHERE state IN ('pending', 'refused')",
    )
    .fetch_one(pool)
    .await?)
}

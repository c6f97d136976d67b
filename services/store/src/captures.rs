//! Captures: with `CAPTURE_AT=shipment` an order confirms on an
//! authorization, and its money is taken only when its shipment ships.
//! Fulfillment's sweep ([`decide_shipped`]) decides each capture once: the
//! order's `order.capture_decided` event and the payment row's
//! `capture_state = 'pending'` commit together. The payment worker then
//! carries it out like a compensation — claimed under a lease, asked with
//! the stable key `capture:<payment_id>` until the PSP confirms — and
//! [`complete`] records `order.captured`. A captured payment is never
//! voided: a void is only decided for a payment not attached to its order,
//! and a capture only for one attached.

use crate::orders::{self, Transition, Waiting};
use crate::write::{self, Changes};
use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::Command;
use events::Metadata;
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// Metadata for what `source` records on these orders of its own accord:
/// the saga's correlation, on each order's own trace (that of its first
/// event), so a capture shows in the buyer's trace like every other step.
async fn on_order_traces(
    conn: &mut sqlx::PgConnection,
    source: &str,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, Metadata>, StoreError> {
    let rows: Vec<(Uuid, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT stream_id, metadata->>'traceparent', metadata->>'tracestate' FROM events WHERE stream_id = ANY($1) AND version = 1",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, parent, state)| {
            let meta = Metadata::from_request(source, id, parent).with_tracestate(state);
            (id, meta)
        })
        .collect())
}

/// One capture to carry out.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Capture {
    pub payment_id: String,
    pub order_id: Uuid,
    /// The authorized amount: all of it is captured.
    pub amount_minor: i64,
    pub currency: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
}

impl Capture {
    /// The PSP idempotency key of this capture: one per payment, ever.
    pub fn key(&self) -> String {
        format!("capture:{}", self.payment_id)
    }
}

/// Decides the capture of up to `limit` orders whose payment is only
/// authorized and whose shipment has shipped, oldest authorization first,
/// in one transaction; returns how many were decided. Orders another sweep
/// holds are skipped.
pub async fn decide_shipped(pool: &PgPool, limit: i64, source: &str) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT o.id FROM orders o WHERE o.capture = 'authorized' \
         AND EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id AND s.state IN ('shipped', 'delivered')) \
         ORDER BY o.updated_at, o.id LIMIT $1 FOR UPDATE OF o SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let found = orders::load_many_locking(&mut tx, &ids, Waiting::Wait).await?;
    let metas = on_order_traces(&mut tx, source, &ids).await?;
    let at = crate::now();
    let mut changes = Changes::new();
    let mut payments: Vec<String> = Vec::with_capacity(found.len());
    for order in &found {
        let events = domain::decide(Some(order), Command::DecideCapture { at })
            .map_err(|e| StoreError::Corrupt(format!("order {}: {e}", order.id)))?;
        if events.is_empty() {
            continue;
        }
        let meta = metas
            .get(&order.id)
            .cloned()
            .unwrap_or_else(|| Metadata::spontaneous(source, order.id));
        changes.order(Some(order), &events, &meta)?;
        if let Some(payment) = &order.payment {
            payments.push(payment.payment_id.clone());
        }
    }
    write::commit(&mut tx, &changes).await?;
    let owed = sqlx::query(
        "UPDATE payments SET capture_state = 'pending', capture_decided_at = now(), capture_next_attempt_at = now() \
         WHERE payment_id = ANY($1) AND disposition = 'attached' AND capture_state IS NULL",
    )
    .bind(&payments)
    .execute(&mut *tx)
    .await?;
    if owed.rows_affected() != payments.len() as u64 {
        return Err(StoreError::Corrupt(format!(
            "deciding {} captures found {} payments to capture",
            payments.len(),
            owed.rows_affected()
        )));
    }
    tx.commit().await?;
    Ok(payments.len())
}

/// Claims up to `limit` due captures for `lease`; other owners skip them meanwhile.
pub async fn claim_due(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
) -> Result<Vec<Capture>, StoreError> {
    Ok(sqlx::query_as(
        "UPDATE payments p SET capture_next_attempt_at = now() + make_interval(secs => $2), capture_attempts = p.capture_attempts + 1 \
         FROM (SELECT payment_id FROM payments WHERE capture_state = 'pending' AND capture_next_attempt_at <= now() \
               ORDER BY capture_next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) due \
         WHERE p.payment_id = due.payment_id \
         RETURNING p.payment_id, p.order_id, p.amount_minor, p.currency, p.capture_attempts AS attempts",
    )
    .bind(limit)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// Records that the PSP captured `captured_minor` of the payment, with the
/// order's `order.captured` event, in one transaction; `false` if it was
/// recorded before.
pub async fn complete(
    pool: &PgPool,
    payment_id: &str,
    captured_minor: i64,
    source: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let order_id: Option<Uuid> = sqlx::query_scalar(
        "SELECT order_id FROM payments WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .fetch_optional(&mut *tx)
    .await?
    .flatten();
    let Some(order_id) = order_id else {
        return Ok(false);
    };
    let meta = on_order_traces(&mut tx, source, &[order_id])
        .await?
        .remove(&order_id)
        .unwrap_or_else(|| Metadata::spontaneous(source, order_id));
    let at = crate::now();
    // The order row first, as every path locks it.
    match orders::transition_in(&mut tx, order_id, None, &meta, |_| Command::RecordCapture {
        payment_id: payment_id.to_owned(),
        amount_minor: captured_minor,
        at,
    })
    .await?
    {
        Transition::Applied(_) | Transition::Unchanged(_) => {}
        other => {
            return Err(StoreError::Corrupt(format!(
                "order {order_id}: recording a capture: {other:?}"
            )))
        }
    }
    let done = sqlx::query(
        "UPDATE payments SET capture_state = 'captured', captured_at = now(), captured_minor = $2, capture_error = NULL, capture_next_attempt_at = NULL \
         WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .bind(captured_minor)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// Leaves a capture for another attempt after `delay`.
pub async fn postpone(
    pool: &PgPool,
    payment_id: &str,
    delay: Duration,
    error: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payments SET capture_next_attempt_at = now() + make_interval(secs => $2), capture_error = left($3, 500) \
         WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .bind(delay.as_secs_f64())
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// The PSP cannot capture the payment (its authorization lapsed or was
/// voided elsewhere): the goods left unpaid, and a person must act. It
/// stays outstanding, and fails the audit, until then.
pub async fn refuse(pool: &PgPool, payment_id: &str, error: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE payments SET capture_state = 'refused', capture_next_attempt_at = NULL, capture_error = left($2, 500) \
         WHERE payment_id = $1 AND capture_state = 'pending'",
    )
    .bind(payment_id)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// How many captures are owed (pending or refused), and since when the oldest.
pub async fn outstanding(pool: &PgPool) -> Result<(i64, Option<DateTime<Utc>>), StoreError> {
    Ok(sqlx::query_as(
        "SELECT count(*), min(capture_decided_at) FROM payments WHERE capture_state IN ('pending', 'refused')",
    )
    .fetch_one(pool)
    .await?)
}

/// Age in seconds of the oldest authorization not captured yet: an order
/// confirmed on it that has not shipped (0 when there is none).
pub async fn oldest_authorization_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(updated_at)), 0)::float8 FROM orders WHERE capture = 'authorized'",
    )
    .fetch_one(pool)
    .await?)
}

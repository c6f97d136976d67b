//! What reconciliation against the PSP's books needs from the database: the
//! cursor of the periodic walk, each payment's recorded disposition, the
//! confirmed orders to check, the last run's findings (which the audit
//! reports) and the foreign payments it left alone.

use crate::StoreError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashMap;
use uuid::Uuid;

/// Something the books disagree on, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Finding {
    pub kind: String,
    pub subject: String,
    pub detail: String,
    /// A compensation was recorded for it; it ends when the refund does.
    pub repaired: bool,
}

/// A payment as soldonce recorded it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Recorded {
    pub payment_id: String,
    pub order_id: Option<Uuid>,
    pub disposition: String,
    pub refund_state: Option<String>,
    /// What operators decided to refund of it (an attached payment's
    /// partial refunds, a cancelled order's refund): the PSP showing that
    /// much refunded is expected.
    pub operator_refunds_minor: i64,
}

/// Where the periodic walk resumes.
pub async fn cursor(pool: &PgPool) -> Result<Option<DateTime<Utc>>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT cursor_time FROM reconcile_state")
            .fetch_optional(pool)
            .await?
            .flatten(),
    )
}

/// The recorded dispositions of these payments.
pub async fn recorded(
    pool: &PgPool,
    payment_ids: &[String],
) -> Result<HashMap<String, Recorded>, StoreError> {
    let rows: Vec<Recorded> =
        sqlx::query_as(
            "SELECT p.payment_id, p.order_id, p.disposition, p.refund_state, \
                    (SELECT coalesce(sum(r.amount_minor), 0) FROM operator_refunds r WHERE r.order_id = p.order_id AND r.payment_id = p.payment_id AND NOT r.void)::bigint AS operator_refunds_minor \
             FROM payments p WHERE p.payment_id = ANY($1)",
        )
            .bind(payment_ids)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.payment_id.clone(), r))
        .collect())
}

/// The states of those of these orders that exist.
pub async fn order_states(
    pool: &PgPool,
    order_ids: &[Uuid],
) -> Result<HashMap<Uuid, String>, StoreError> {
    let rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT id, state FROM orders WHERE id = ANY($1)")
            .bind(order_ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// A PSP payment soldonce did not make, as reconciliation saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForeignPayment {
    pub payment_id: String,
    pub reference: Option<String>,
    pub idempotency_key: Option<String>,
    pub status: String,
    pub amount_minor: i64,
    pub currency: String,
}

/// Lists foreign payments (first and last seen); they are never touched.
pub async fn record_foreign(pool: &PgPool, found: &[ForeignPayment]) -> Result<(), StoreError> {
    if found.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&ForeignPayment) -> Option<&str>| found.iter().map(f).collect::<Vec<_>>();
    let amounts: Vec<i64> = found.iter().map(|f| f.amount_minor).collect();
    sqlx::query(
        "INSERT INTO foreign_payments (payment_id, reference, idempotency_key, status, amount_minor, currency) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[]) \
         ON CONFLICT (payment_id) DO UPDATE SET status = EXCLUDED.status, last_seen_at = now()",
    )
    .bind(col(|f| Some(f.payment_id.as_str())))
    .bind(col(|f| f.reference.as_deref()))
    .bind(col(|f| f.idempotency_key.as_deref()))
    .bind(col(|f| Some(f.status.as_str())))
    .bind(amounts)
    .bind(col(|f| Some(f.currency.as_str())))
    .execute(pool)
    .await?;
    Ok(())
}

/// The subjects of the last run's findings of `kind`.
pub async fn last_findings(pool: &PgPool, kind: &str) -> Result<Vec<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT subject FROM reconcile_findings WHERE kind = $1 ORDER BY id")
            .bind(kind)
            .fetch_all(pool)
            .await?,
    )
}

/// One confirmed order and the payment it is confirmed on.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ConfirmedOrder {
    pub id: Uuid,
    pub payment_id: Option<String>,
    pub total_minor: i64,
    pub currency: String,
}

/// Orders placed at or after `since` (all without it) and confirmed no later than `until`, streamed.
pub fn confirmed_since(
    pool: &PgPool,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> impl futures::Stream<Item = Result<ConfirmedOrder, StoreError>> + '_ {
    use futures::StreamExt;
    sqlx::query_as(
        "SELECT id, payment_id, total_minor, currency FROM orders WHERE state = 'confirmed' AND total_minor > 0 AND ($1::timestamptz IS NULL OR created_at >= $1) AND updated_at <= $2",
    )
        .bind(since)
        .bind(until)
        .fetch(pool)
        .map(|r| r.map_err(StoreError::from))
}

/// Records a finished run: its findings replace the last run's.
pub async fn save_run(
    pool: &PgPool,
    cursor: Option<DateTime<Utc>>,
    seconds: f64,
    seen: i64,
    findings: &[Finding],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO reconcile_state (id, cursor_time, last_run_at, last_run_seconds, payments_seen) VALUES (true, $1, now(), $2, $3) \
         ON CONFLICT (id) DO UPDATE SET cursor_time = coalesce($1, reconcile_state.cursor_time), last_run_at = now(), \
         last_run_seconds = $2, payments_seen = $3",
    )
    .bind(cursor)
    .bind(seconds)
    .bind(seen)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM reconcile_findings")
        .execute(&mut *tx)
        .await?;
    let kinds: Vec<&str> = findings.iter().map(|f| f.kind.as_str()).collect();
    let subjects: Vec<&str> = findings.iter().map(|f| f.subject.as_str()).collect();
    let details: Vec<&str> = findings.iter().map(|f| f.detail.as_str()).collect();
    let repaired: Vec<bool> = findings.iter().map(|f| f.repaired).collect();
    sqlx::query(
        "INSERT INTO reconcile_findings (kind, subject, detail, repaired) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[])",
    )
    .bind(&kinds)
    .bind(&subjects)
    .bind(&details)
    .bind(&repaired)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

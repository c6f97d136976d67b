//! Releasing reservations whose payment window has passed, in batches that
//! N expiry processes can share (`FOR UPDATE SKIP LOCKED`). Each order is
//! expired exactly once, with its event, outbox row and ledger rows; the
//! bucket updates of a batch are summed per SKU and applied in SKU order, so
//! a batch never deadlocks with checkouts.

use crate::StoreError;
use chrono::{DateTime, Utc};
use domain::Command;
use events::Metadata;
use sqlx::PgPool;
use std::collections::BTreeMap;
use uuid::Uuid;

/// Expires up to `limit` overdue orders in one transaction; returns how many.
pub async fn release_batch(
    pool: &PgPool,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let mut tx = pool.begin().await?;
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM orders WHERE state = 'payment_pending' AND expires_at <= $1 \
         ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(now)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let orders = crate::orders::load_many_locked(&mut tx, &ids).await?;
    let mut per_sku: BTreeMap<String, i64> = BTreeMap::new();
    let (mut skus, mut quantities, mut order_ids) = (vec![], vec![], vec![]);
    let mut released = vec![];
    for order in orders {
        let Ok(events) = domain::decide(Some(&order), Command::Expire { at: now }) else {
            continue;
        };
        let Some(next) = events
            .iter()
            .try_fold(order.clone(), |o, e| domain::evolve(Some(o), e))
        else {
            continue;
        };
        for line in &order.lines {
            *per_sku.entry(line.sku.to_string()).or_default() += line.quantity.get();
            skus.push(line.sku.to_string());
            quantities.push(line.quantity.get());
            order_ids.push(order.id);
        }
        released.push((order, next, events));
    }
    for (sku, q) in &per_sku {
        let moved = sqlx::query("UPDATE stock SET available = available + $2, reserved = reserved - $2 WHERE sku = $1 AND reserved >= $2")
            .bind(sku)
            .bind(q)
            .execute(&mut *tx)
            .await?;
        if moved.rows_affected() != 1 {
            return Err(StoreError::Corrupt(format!(
                "{sku}: fewer than {q} units reserved to release"
            )));
        }
    }
    sqlx::query(
        "INSERT INTO stock_ledger (sku, movement, d_available, d_reserved, d_sold, order_id) \
         SELECT s, 'release', q, -q, 0, o FROM unnest($1::text[], $2::bigint[], $3::uuid[]) AS x(s, q, o)",
    )
    .bind(&skus)
    .bind(&quantities)
    .bind(&order_ids)
    .execute(&mut *tx)
    .await?;
    // Every order's event and outbox row in one statement, every projection row in another.
    let metas: Vec<Metadata> = released
        .iter()
        .map(|(o, _, _)| Metadata {
            correlation_id: o.id,
            causation_id: Uuid::now_v7(),
            source: "expiry".into(),
            traceparent: None,
        })
        .collect();
    let mut records = Vec::with_capacity(released.len());
    for ((order, _, events), meta) in released.iter().zip(&metas) {
        for (event, version) in events.iter().zip(order.version + 1..) {
            records.push(crate::orders::Record::order(order.id, version, event, meta));
        }
    }
    crate::orders::append_records(&mut tx, &records).await?;
    let ids: Vec<Uuid> = released.iter().map(|(_, next, _)| next.id).collect();
    let states: Vec<&str> = released
        .iter()
        .map(|(_, next, _)| next.state.as_str())
        .collect();
    let versions: Vec<i32> = released.iter().map(|(_, next, _)| next.version).collect();
    let times: Vec<DateTime<Utc>> = released
        .iter()
        .map(|(_, next, _)| next.updated_at)
        .collect();
    let updated = sqlx::query(
        "UPDATE orders o SET state = x.state, version = x.version, updated_at = x.at \
         FROM unnest($1::uuid[], $2::text[], $3::int[], $4::timestamptz[]) AS x(id, state, version, at) \
         WHERE o.id = x.id AND o.version = x.version - 1",
    )
    .bind(&ids)
    .bind(&states)
    .bind(&versions)
    .bind(&times)
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != ids.len() as u64 {
        return Err(StoreError::Conflict(ids[0]));
    }
    tx.commit().await?;
    Ok(released.len() as u64)
}

/// Age in seconds of the oldest reservation still waiting for payment.
pub async fn oldest_pending_seconds(pool: &PgPool) -> Result<f64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM orders WHERE state = 'payment_pending'",
    )
    .fetch_one(pool)
    .await?)
}

/// Deletes idempotency keys, inbox rows and webhook receipts older than `retention`.
pub async fn purge(pool: &PgPool, retention: std::time::Duration) -> Result<u64, StoreError> {
    let mut purged = crate::idempotency::purge(pool, retention).await?;
    let secs = retention.as_secs_f64();
    for sql in [
        "DELETE FROM inbox WHERE processed_at < now() - make_interval(secs => $1)",
        "DELETE FROM webhook_receipts WHERE received_at < now() - make_interval(secs => $1)",
    ] {
        purged += sqlx::query(sql)
            .bind(secs)
            .execute(pool)
            .await?
            .rows_affected();
    }
    Ok(purged)
}

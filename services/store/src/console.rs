//! What the operator's console shows, read in one REPEATABLE READ snapshot
//! so its figures agree with each other: orders by state, the hottest SKUs'
//! buckets, reservations by age, the outbox, dead letters, refunds owed and
//! the last reconciliation.

use crate::StoreError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;

/// How many SKUs the console lists.
pub const HOT_SKUS: i64 = 8;

/// One SKU's buckets.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SkuBuckets {
    pub sku: String,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// The last reconciliation with the PSP.
#[derive(Debug, Clone, Serialize)]
pub struct LastReconciliation {
    pub at: Option<DateTime<Utc>>,
    pub seconds: Option<f64>,
    pub payments_seen: i64,
    /// Findings it could not repair, by kind.
    pub unresolved: BTreeMap<String, i64>,
}

/// The figures of one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    pub at: DateTime<Utc>,
    /// Every state, zero included.
    pub orders: BTreeMap<String, i64>,
    pub hot_skus: Vec<SkuBuckets>,
    /// `payment_pending` orders by age band (`<5s`, `5-30s`, `30s-2m`, `2-15m`, `>15m`).
    pub reservations_by_age: Vec<(String, i64)>,
    pub outbox_rows: i64,
    pub outbox_oldest_seconds: f64,
    pub outbox_parked: i64,
    /// Dead letters by consumer.
    pub dead_letters: BTreeMap<String, i64>,
    pub refunds_owed: i64,
    pub refunds_oldest_seconds: f64,
    pub reconciliation: LastReconciliation,
}

const STATES: [&str; 6] = [
    "payment_pending",
    "confirmed",
    "payment_failed",
    "cancelled",
    "expired",
    "refunded",
];

const AGE_BANDS: [&str; 5] = ["<5s", "5-30s", "30s-2m", "2-15m", ">15m"];

/// Reads the console's figures.
pub async fn figures(pool: &PgPool) -> Result<Figures, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let (at,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()").fetch_one(&mut *tx).await?;
    let orders = orders_by_state(&mut tx).await?;
    let hot_skus: Vec<SkuBuckets> = sqlx::query_as(
        "SELECT sku, available, reserved, sold FROM stock_buckets \
         ORDER BY reserved DESC, sold DESC, sku LIMIT $1",
    )
    .bind(HOT_SKUS)
    .fetch_all(&mut *tx)
    .await?;
    let reservations_by_age = reservations_by_age(&mut tx).await?;
    let (outbox_rows, outbox_oldest_seconds, outbox_parked): (i64, f64, i64) =
        sqlx::query_as(&format!(
            "SELECT {}, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8, \
                    (SELECT count(*) FROM outbox_parked) FROM outbox",
            crate::outbox::EVENTS_WAITING
        ))
        .fetch_one(&mut *tx)
        .await?;
    let dead_letters: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT consumer, count(*) FROM dead_letters WHERE redriven_at IS NULL GROUP BY consumer",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let (refunds_owed, refunds_oldest_seconds): (i64, f64) = sqlx::query_as(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(recorded_at)), 0)::float8 \
         FROM payments WHERE refund_state IN ('pending', 'refused')",
    )
    .fetch_one(&mut *tx)
    .await?;
    let reconciliation = last_reconciliation(&mut tx).await?;
    tx.commit().await?;
    Ok(Figures {
        at,
        orders,
        hot_skus,
        reservations_by_age,
        outbox_rows,
        outbox_oldest_seconds,
        outbox_parked,
        dead_letters,
        refunds_owed,
        refunds_oldest_seconds,
        reconciliation,
    })
}

/// Orders counted by state, every state present (zero included).
async fn orders_by_state(conn: &mut PgConnection) -> Result<BTreeMap<String, i64>, StoreError> {
    let mut orders: BTreeMap<String, i64> = STATES.iter().map(|s| ((*s).to_owned(), 0)).collect();
    let counted: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM orders GROUP BY state")
            .fetch_all(&mut *conn)
            .await?;
    orders.extend(counted);
    Ok(orders)
}

/// `payment_pending` orders counted by age band, every band present.
async fn reservations_by_age(conn: &mut PgConnection) -> Result<Vec<(String, i64)>, StoreError> {
    let bands: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT CASE WHEN age < 5 THEN 0 WHEN age < 30 THEN 1 WHEN age < 120 THEN 2 \
                     WHEN age < 900 THEN 3 ELSE 4 END AS band, count(*) \
         FROM (SELECT extract(epoch FROM now() - created_at) AS age FROM orders \
               WHERE state = 'payment_pending') p GROUP BY band",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(AGE_BANDS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let n = bands
                .iter()
                .find(|(b, _)| usize::try_from(*b).ok() == Some(i))
                .map_or(0, |(_, n)| *n);
            ((*name).to_owned(), n)
        })
        .collect())
}

/// The last reconciliation's run and the findings it left unrepaired.
async fn last_reconciliation(conn: &mut PgConnection) -> Result<LastReconciliation, StoreError> {
    let state: Option<(Option<DateTime<Utc>>, Option<f64>, i64)> =
        sqlx::query_as("SELECT last_run_at, last_run_seconds, payments_seen FROM reconcile_state")
            .fetch_optional(&mut *conn)
            .await?;
    let unresolved: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT kind, count(*) FROM reconcile_findings WHERE NOT repaired GROUP BY kind",
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .collect();
    let (last_at, last_seconds, payments_seen) = state.unwrap_or((None, None, 0));
    Ok(LastReconciliation {
        at: last_at,
        seconds: last_seconds,
        payments_seen,
        unresolved,
    })
}

/// Events recorded after `after` (an `events.position`), counted by type,
/// with the last position seen; with no `after`, only the last position
/// (the count starts now). A transaction that commits after a later
/// position was read is not counted: right for a rate chart, not for books.
pub async fn events_since(
    pool: &PgPool,
    after: Option<i64>,
) -> Result<(i64, BTreeMap<String, i64>), StoreError> {
    let Some(after) = after else {
        let (last,): (Option<i64>,) = sqlx::query_as("SELECT max(position) FROM events")
            .fetch_one(pool)
            .await?;
        return Ok((last.unwrap_or(0), BTreeMap::new()));
    };
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT type, count(*), max(position) FROM events WHERE position > $1 GROUP BY type",
    )
    .bind(after)
    .fetch_all(pool)
    .await?;
    let last = rows.iter().map(|r| r.2).max().unwrap_or(after);
    Ok((last, rows.into_iter().map(|(t, n, _)| (t, n)).collect()))
}

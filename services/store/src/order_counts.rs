//! Counts over the orders for the load generator, the demo and the
//! benchmarks: how many of the accepted orders exist, what became of the
//! orders of one SKU, what the services have still to do, and the orders
//! by state. Reads only.

use crate::StoreError;
use sqlx::PgPool;
use uuid::Uuid;

/// How many of `ids` are orders in the database.
pub async fn existing(pool: &PgPool, ids: &[Uuid]) -> Result<u64, StoreError> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE id = ANY($1)")
        .bind(ids)
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The orders with a line of one SKU, by state, and their delivered shipments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkuOrders {
    pub payment_pending: i64,
    pub confirmed: i64,
    pub payment_failed: i64,
    pub expired: i64,
    /// Shipments of those orders that reached `delivered`.
    pub delivered: i64,
}

/// What became of the orders with a line of `sku`.
pub async fn of_sku(pool: &PgPool, sku: &str) -> Result<SkuOrders, StoreError> {
    let (payment_pending, confirmed, payment_failed, expired, delivered) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE o.state = 'payment_pending'), count(*) FILTER (WHERE o.state = 'confirmed'), \
                count(*) FILTER (WHERE o.state = 'payment_failed'), count(*) FILTER (WHERE o.state = 'expired'), \
                count(s.id) FILTER (WHERE s.state = 'delivered') \
         FROM orders o JOIN order_lines l ON l.order_id = o.id LEFT JOIN shipments s ON s.order_id = o.id WHERE l.sku = $1",
    )
    .bind(sku)
    .fetch_one(pool)
    .await?;
    Ok(SkuOrders {
        payment_pending,
        confirmed,
        payment_failed,
        expired,
        delivered,
    })
}

/// What the services still have to do with the orders in the database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unfinished {
    /// Orders waiting for their payment.
    pub payment_pending: i64,
    /// Confirmed orders whose shipment has not been delivered (or does not exist yet).
    pub undelivered: i64,
    /// Confirmed orders whose authorization is not captured yet (`authorized` or `decided`).
    pub uncaptured: i64,
    /// Events waiting in the outbox, not yet published.
    pub outbox: i64,
}

impl Unfinished {
    /// Whether nothing is left to do.
    pub fn is_none(&self) -> bool {
        *self == Unfinished::default()
    }
}

/// What is left to do, in one snapshot.
pub async fn unfinished(pool: &PgPool) -> Result<Unfinished, StoreError> {
    let (payment_pending, undelivered, uncaptured, outbox) = sqlx::query_as(&format!(
        "SELECT (SELECT count(*) FROM orders WHERE state = 'payment_pending'), \
                (SELECT count(*) FROM orders o LEFT JOIN shipments s ON s.order_id = o.id \
                  WHERE o.state = 'confirmed' AND s.state IS DISTINCT FROM 'delivered'), \
                (SELECT count(*) FROM orders WHERE state = 'confirmed' AND capture IN ('authorized', 'decided')), \
                (SELECT {} FROM outbox)",
        crate::outbox::EVENTS_WAITING
    ))
    .fetch_one(pool)
    .await?;
    Ok(Unfinished {
        payment_pending,
        undelivered,
        uncaptured,
        outbox,
    })
}

/// Every order by state, and the events recorded, in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    pub by_state: std::collections::BTreeMap<String, i64>,
    pub events: i64,
}

impl Totals {
    /// Orders in `state`.
    pub fn state(&self, state: &str) -> i64 {
        self.by_state.get(state).copied().unwrap_or(0)
    }

    /// Orders in any state.
    pub fn orders(&self) -> i64 {
        self.by_state.values().sum()
    }
}

/// The orders by state and the events, counted in one snapshot.
pub async fn totals(pool: &PgPool) -> Result<Totals, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM orders GROUP BY state")
            .fetch_all(&mut *tx)
            .await?;
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Totals {
        by_state: rows.into_iter().collect(),
        events,
    })
}

/// Orders whose payment window has not passed yet, on the database's clock.
pub async fn unexpired(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE expires_at > now()")
            .fetch_one(pool)
            .await?,
    )
}

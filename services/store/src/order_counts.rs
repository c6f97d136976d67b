//! Counts over the orders for the load generator and the demo: how many of
//! the accepted orders exist, and what became of the orders of one SKU.
//! Reads only.

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

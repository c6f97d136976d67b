//! How long orders took from their placement (`202`) to each milestone,
//! read from each order's own events and its shipment, for the
//! benchmarks: confirmed (its `order.confirmed` event: a later capture
//! moves `orders.updated_at` on), delivered and captured. Reads only.

use crate::StoreError;
use sqlx::PgPool;

/// The median and the 99th percentile of one milestone, in milliseconds
/// (interpolated, as `percentile_cont` does), and how many orders reached it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub orders: i64,
}

/// Placement to each milestone, over every order that reached it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SincePlaced {
    pub confirmed: Option<Percentiles>,
    pub delivered: Option<Percentiles>,
    pub captured: Option<Percentiles>,
}

const CONFIRMED: &str =
    "SELECT extract(epoch FROM e.recorded_at - o.created_at)::float8 * 1000 AS ms \
     FROM orders o JOIN events e ON e.stream_id = o.id AND e.type = 'order.confirmed.v1' \
     WHERE o.state = 'confirmed'";
const DELIVERED: &str =
    "SELECT extract(epoch FROM s.updated_at - o.created_at)::float8 * 1000 AS ms \
     FROM orders o JOIN shipments s ON s.order_id = o.id WHERE s.state = 'delivered'";
const CAPTURED: &str =
    "SELECT extract(epoch FROM e.recorded_at - o.created_at)::float8 * 1000 AS ms \
     FROM orders o JOIN events e ON e.stream_id = o.id AND e.type = 'order.captured.v1'";

/// Placement to confirmation, delivery and capture: each order's own times.
pub async fn since_placed(pool: &PgPool) -> Result<SincePlaced, StoreError> {
    Ok(SincePlaced {
        confirmed: percentiles(pool, CONFIRMED).await?,
        delivered: percentiles(pool, DELIVERED).await?,
        captured: percentiles(pool, CAPTURED).await?,
    })
}

async fn percentiles(pool: &PgPool, milliseconds: &str) -> Result<Option<Percentiles>, StoreError> {
    let (p50, p99, orders): (Option<f64>, Option<f64>, i64) = sqlx::query_as(&format!(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), \
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), count(*) FROM ({milliseconds}) x"
    ))
    .fetch_one(pool)
    .await?;
    Ok(match (p50, p99) {
        (Some(p50_ms), Some(p99_ms)) if orders > 0 => Some(Percentiles {
            p50_ms,
            p99_ms,
            orders,
        }),
        _ => None,
    })
}

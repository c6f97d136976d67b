//! Rebuilding the orders projection from the event store. The projection is
//! a cache of each order's fold; rebuilding must reproduce it exactly.

use crate::orders::write_projection;
use crate::StoreError;
use domain::Event;
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use uuid::Uuid;

/// What a rebuild found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildReport {
    /// Orders folded from their events.
    pub orders: u64,
    /// Orders whose projection row differed from their fold before the rebuild.
    pub corrected: u64,
    /// Projection rows with no events, removed.
    pub orphans_removed: u64,
}

/// Every projection row with its lines, as JSON, by order id.
pub async fn snapshot(conn: &mut PgConnection) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    let rows: Vec<(Uuid, serde_json::Value)> = sqlx::query_as(
        "SELECT o.id, to_jsonb(o.*) || jsonb_build_object('lines', \
            (SELECT coalesce(jsonb_agg(to_jsonb(l.*) ORDER BY l.sku COLLATE \"C\"), '[]') FROM order_lines l WHERE l.order_id = o.id)) \
         FROM orders o",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Replaces the projection with the fold of the event store, in one
/// transaction that blocks writers of the projection meanwhile.
pub async fn rebuild(pool: &PgPool) -> Result<RebuildReport, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE orders, order_lines IN EXCLUSIVE MODE").execute(&mut *tx).await?;
    let before = snapshot(&mut tx).await?;
    sqlx::query("DELETE FROM order_lines").execute(&mut *tx).await?;
    sqlx::query("DELETE FROM orders").execute(&mut *tx).await?;
    let rows: Vec<(Uuid, String, serde_json::Value)> =
        sqlx::query_as("SELECT stream_id, type, data FROM events WHERE type LIKE 'order.%' ORDER BY stream_id, version")
            .fetch_all(&mut *tx)
            .await?;
    let mut report = RebuildReport::default();
    let mut i = 0;
    while i < rows.len() {
        let stream = rows[i].0;
        let mut events = Vec::new();
        while i < rows.len() && rows[i].0 == stream {
            let e = Event::from_parts(&rows[i].1, rows[i].2.clone())
                .map_err(|e| StoreError::Corrupt(format!("event of order {stream}: {e}")))?;
            events.push(e);
            i += 1;
        }
        let order = domain::fold(&events).ok_or_else(|| StoreError::Corrupt(format!("order {stream} has no order.placed")))?;
        write_projection(&mut tx, None, &order).await?;
        report.orders += 1;
    }
    let after = snapshot(&mut tx).await?;
    report.corrected = after.iter().filter(|(id, row)| before.get(id) != Some(row)).count() as u64;
    report.orphans_removed = before.keys().filter(|id| !after.contains_key(id)).count() as u64;
    tx.commit().await?;
    Ok(report)
}

/// Writes one order's projection row and lines (into whatever `orders` the
/// connection's search path names: the live one, or a replay's scratch schema).
pub async fn write(conn: &mut PgConnection, order: &domain::Order) -> Result<(), StoreError> {
    write_projection(conn, None, order).await
}

//! The projections the events define — `orders` (with `order_lines`) and
//! `shipments` — read whole for comparison, written one order at a time for
//! a replay, and rebuilt from the event store (the batches live in
//! `rebuild`). A projection is a cache of each stream's fold; rebuilding
//! must reproduce it exactly.

use crate::StoreError;
use futures::TryStreamExt;
use sqlx::{PgConnection, PgPool};
use std::collections::BTreeMap;
use uuid::Uuid;

pub use crate::rebuild::{RebuildReport, TableReport};

/// Every projection row with its lines, as JSON, by order id.
pub async fn snapshot(
    conn: &mut PgConnection,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    rows(
        conn,
        "SELECT o.id, to_jsonb(o.*) || jsonb_build_object('lines', \
            (SELECT coalesce(jsonb_agg(to_jsonb(l.*) ORDER BY l.sku COLLATE \"C\"), '[]') FROM order_lines l WHERE l.order_id = o.id)) \
         FROM orders o",
    )
    .await
}

/// Every shipment row, as JSON, by shipment id.
pub async fn snapshot_shipments(
    conn: &mut PgConnection,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    rows(conn, "SELECT s.id, to_jsonb(s.*) FROM shipments s").await
}

async fn rows(
    conn: &mut PgConnection,
    sql: &str,
) -> Result<BTreeMap<Uuid, serde_json::Value>, StoreError> {
    Ok(sqlx::query_as::<_, (Uuid, serde_json::Value)>(sql)
        .fetch(&mut *conn)
        .try_collect()
        .await?)
}

/// Makes every projection the fold of the event store, in batches of
/// [`crate::rebuild::DEFAULT_BATCH`] streams beside live traffic (see
/// [`crate::rebuild`]).
pub async fn rebuild(pool: &PgPool) -> Result<RebuildReport, StoreError> {
    crate::rebuild::run(pool, crate::rebuild::DEFAULT_BATCH).await
}

/// [`rebuild`] with `batch` streams per transaction.
pub async fn rebuild_in_batches(pool: &PgPool, batch: i64) -> Result<RebuildReport, StoreError> {
    crate::rebuild::run(pool, batch).await
}

/// Writes one order's projection row and lines (into whatever `orders` the
/// connection's search path names: the live one, or a replay's scratch schema).
pub async fn write(conn: &mut PgConnection, order: &domain::Order) -> Result<(), StoreError> {
    crate::orders::insert_projections(conn, std::slice::from_ref(order)).await
}
